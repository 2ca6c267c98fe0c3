"""Decode attention (fd_attention_decode) at depth, plus tree-verification attention and token
selection for context: `python bench/bench_attention_decode.py [--max-ctx 32768] [--kv-types f16,q8_0,q4_0]`.

Bytes per decode-attention call = the K and V rows read: 2 * n_kv_heads * (n_past + 1) * row bytes (float16:
2 * head_dim; q8_0 / q4_0: 34 / 18 per 32 values, --kv-types, the cache in the device planes of
backends/cuda/kv_planes.py). The grid is sized for max_ctx (fixed when the decode step is captured), so shallow depths
also show the cost of the splits that exit at once. Every call is captured once in a CUDA graph
and replayed, as in the captured decode step. One line per case (bench/timing.py: L2 flushed before
every repetition, median of CUDA-event times); decode cases are also timed after a read-only
flush ("clean-L2"), closer to the decode step, where the weights just streamed through L2.
"""
from __future__ import annotations

import argparse

import numpy as np

from flashd.bench.timing import KernelTimer, device_line, open_gpu, report
from flashd.daemon.backends.cuda.kv_planes import planes_from_blocks
from flashd.daemon.backends.cuda.ops import attention_shape
from flashd.daemon.backends.kv_quant import encode_rows
from flashd.daemon.backends.kv_types import row_bytes

MODELS = {
    # name: (n_heads, n_kv_heads, head_dim)
    "qwen2.5-1.5b": (12, 2, 128),
    "qwen2.5-0.5b": (14, 2, 64),
}


_READ_FLUSH = {}


def graphed(dev, fn):
    """fn captured once into a CUDA graph; returns the replay (how every kernel here runs inside the
    captured decode step: no per-call host work in the timing)."""
    lib, ffi = dev.lib, dev.ffi
    dev.native.check(lib.fd_graph_begin_capture(dev.stream), "fd_graph_begin_capture")
    fn()
    out = ffi.new("void**")
    dev.native.check(lib.fd_graph_end_capture(dev.stream, out), "fd_graph_end_capture")
    exe = out[0]
    return lambda: dev.native.check(lib.fd_graph_launch(exe, dev.stream), "fd_graph_launch")


def read_flush(dev):
    """An L2 flush that leaves clean lines, as the decode step's weight reads do: read 256 MB
    (fd_argmax over 256 rows). bench/timing.py's memset flush leaves the L2 full of dirty lines,
    which adds write-backs to every miss of the next kernel -- pessimistic for latency-bound
    kernels."""
    if "fn" not in _READ_FLUSH:
        rows, cols = 256, (256 << 20) // 4 // 256
        buf = dev.empty((rows * cols,))
        dev.fill_bytes(buf, 0)
        out = dev.empty((rows,), np.int32)
        _READ_FLUSH["keep"] = (buf, out)
        _READ_FLUSH["fn"] = lambda: dev.native.check(
            dev.lib.fd_argmax(dev.p(out, "int32_t*"), dev.p(buf, "float*"), rows, cols, dev.stream), "flush")
    return _READ_FLUSH["fn"]


def cache_of(cache: np.ndarray, kind: str) -> np.ndarray:
    """The cache (Hkv, max_ctx, d) float16 as the kernels store it in `kind`: float16, or the quantized planes."""
    return cache if kind == "f16" else planes_from_blocks(encode_rows(cache.astype(np.float32), kind), kind)


def bench_decode(dev, timer, max_ctx, depths, chunk_lens, kv_type="f16"):
    lib, p = dev.lib, dev.p
    rng = np.random.default_rng(0)
    for name, (n_heads, n_kv_heads, head_dim) in MODELS.items():
        cache = rng.standard_normal((n_kv_heads, max_ctx, head_dim)).astype(np.float16)
        kc, vc = dev.upload(cache_of(cache, kv_type)), dev.upload(cache_of(cache[:, ::-1].copy(), kv_type))
        q = dev.upload(rng.standard_normal(n_heads * head_dim).astype(np.float32))
        o = dev.empty((n_heads * head_dim,))
        n_past = dev.empty((1,), np.int32)
        shape = attention_shape(dev.ffi, n_heads, n_kv_heads, head_dim, max_ctx, k_type=kv_type,
                                v_type=kv_type)                                       # scale 1 / sqrt(head_dim)
        if kv_type != "f16":
            name = f"{name} {kv_type}"
        for chunk_len in chunk_lens:
            ws = dev.empty((lib.fd_attention_decode_workspace_bytes(shape, chunk_len),), np.uint8)
            for depth in depths:
                dev.upload(np.array([depth - 1], np.int32), out=n_past)

                def call():
                    dev.native.check(lib.fd_attention_decode(p(o, "float*"), p(q, "float*"), p(kc), p(vc),
                                                             p(n_past, "int32_t*"), shape, chunk_len, p(ws),
                                                             dev.stream), "fd_attention_decode")
                n_bytes = 2 * n_kv_heads * depth * row_bytes(kv_type, head_dim)
                call = graphed(dev, call)
                for flush_name, flush in (("", timer.flush_l2), (" clean-L2", read_flush(dev))):
                    timer.flush_l2 = flush
                    ms = timer.time(call, reps=50)
                    print(report(f"decode attn {name} depth {depth} chunk {chunk_len}{flush_name}", ms,
                                 n_bytes=n_bytes, peak_gbs=timer.peak_gbs), flush=True)
                timer.flush_l2 = KernelTimer.flush_l2.__get__(timer)


def bench_masked(dev, timer, n_pasts, ns):
    lib, p = dev.lib, dev.p
    rng = np.random.default_rng(1)
    n_heads, n_kv_heads, head_dim = MODELS["qwen2.5-1.5b"]
    max_ctx = max(n_pasts) + max(ns)
    cache = rng.standard_normal((n_kv_heads, max_ctx, head_dim)).astype(np.float16)
    kc, vc = dev.upload(cache), dev.upload(cache)
    n_past = dev.empty((1,), np.int32)
    for n in ns:
        q = dev.upload(rng.standard_normal(n * n_heads * head_dim).astype(np.float32))
        o = dev.empty((n * n_heads * head_dim,))
        mask = dev.upload(np.tril(np.ones((n, n), np.uint8)))
        shape = attention_shape(dev.ffi, n_heads, n_kv_heads, head_dim, max_ctx)     # scale 1 / sqrt(head_dim)
        ws_bytes = lib.fd_attention_workspace_bytes(n, shape, 64)
        ws = dev.empty((max(ws_bytes, 16),), np.uint8)
        for past in n_pasts:
            dev.upload(np.array([past], np.int32), out=n_past)

            def call():
                dev.native.check(lib.fd_attention_masked(p(o, "float*"), p(q, "float*"), p(kc), p(vc),
                                                         p(mask, "uint8_t*"), p(n_past, "int32_t*"), n, shape, 64,
                                                         p(ws), ws_bytes, dev.stream), "fd_attention_masked")
            ms = timer.time(graphed(dev, call), reps=20)
            n_bytes = 2 * n_kv_heads * (past + n) * head_dim * 2
            flops = 4 * n * n_heads * (past + n) * head_dim
            print(report(f"masked attn qwen2.5-1.5b n {n} n_past {past}", ms, n_bytes=n_bytes, flops=flops,
                         peak_gbs=timer.peak_gbs), flush=True)


def bench_selection(dev, timer, n_vocab=151936):
    lib, p = dev.lib, dev.p
    rng = np.random.default_rng(2)
    x = rng.standard_normal(n_vocab).astype(np.float32) * 2
    x[rng.choice(n_vocab, 20, replace=False)] += 8
    logits = dev.upload(x)
    out = dev.empty((1,), np.int32)
    step = dev.upload(np.zeros(1, np.int32))
    history = dev.upload(rng.integers(0, n_vocab, 256).astype(np.int32))
    n_history = dev.upload(np.array([256], np.int32))
    ws = dev.empty((lib.fd_sample_workspace_bytes(n_vocab),), np.uint8)
    ms = timer.time(graphed(dev, lambda: lib.fd_argmax(p(out, "int32_t*"), p(logits, "float*"), 1, n_vocab,
                                                       dev.stream)))
    print(report(f"argmax vocab {n_vocab}", ms, n_bytes=4 * n_vocab, peak_gbs=timer.peak_gbs), flush=True)
    cases = {
        "T=0.8": (64, 1.0, 0, 1.0, 0.0),
        "T=0.8 top_k 40 top_p 0.95 rep 1.1": (64, 1.1, 40, 0.95, 0.0),
        "T=0.8 top_p 0.9 min_p 0.05": (64, 1.0, 0, 0.9, 0.05),
    }
    for name, (last_n, rep, top_k, top_p, min_p) in cases.items():
        def call():
            dev.native.check(lib.fd_sample(p(out, "int32_t*"), p(logits, "float*"), n_vocab, p(history, "int32_t*"),
                                           p(n_history, "int32_t*"), last_n, rep, 0.0, 0.0, 0.8, top_k, top_p,
                                           min_p, 7, p(step, "int32_t*"), p(ws), dev.stream), "fd_sample")
        ms = timer.time(graphed(dev, call))
        print(report(f"sample vocab {n_vocab} {name}", ms, n_bytes=4 * n_vocab, peak_gbs=timer.peak_gbs), flush=True)


def graph_floor_ms(dev, timer) -> float:
    """The timing floor every graphed line includes once: a graph holding one single-thread kernel
    (fd_decode_advance), in ms."""
    one = [dev.upload(np.zeros(1, np.int32)) for _ in range(6)]
    ring = dev.empty((4,), np.int32)
    return timer.time(graphed(dev, lambda: dev.lib.fd_decode_advance(*[dev.p(t, "int32_t*") for t in one[:3]],
                                                                     dev.p(ring, "int32_t*"), 4,
                                                                     *[dev.p(t, "int32_t*") for t in one[3:]],
                                                                     dev.stream)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-ctx", type=int, default=32768)
    ap.add_argument("--kv-types", default="f16", help="decode cases per KV cache type, e.g. f16,q8_0,q4_0")
    args = ap.parse_args()
    dev, timer = open_gpu()
    print(device_line(timer))
    print(report("floor: graph of one 1-thread kernel", graph_floor_ms(dev, timer)), flush=True)
    depths = [d for d in (256, 1024, 8192, 32768) if d <= args.max_ctx]
    for kv_type in [t.strip() for t in args.kv_types.split(",") if t.strip()]:
        bench_decode(dev, timer, args.max_ctx, depths, chunk_lens=(64, 256), kv_type=kv_type)
    bench_masked(dev, timer, n_pasts=(1024, 8192, 32768), ns=(16, 64))
    bench_selection(dev, timer)


if __name__ == "__main__":
    main()
