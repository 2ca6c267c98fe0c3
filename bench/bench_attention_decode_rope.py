"""The one-row decode step's attention with its RoPE and K/V write: fd_attention_decode_rope (one op) against
fd_rope_kv_write + fd_attention_decode (two kernels), each captured once in a CUDA graph and replayed, at
the runner's chunk (64 slots) and the grid the runner captures (sized for max_ctx):
`python bench/bench_attention_decode_rope.py [--max-ctx 32768] [--depths 128,8192,32768] [--kv-types f16,q8_0]`.
With --kv-types, each type runs as its own case (K and V both of that type; a quantized K with a random key
offset, as the model's layers pass theirs).

One line per (shape, depth, path) from bench/timing.py (median of CUDA-event times, L2 flushed before
every repetition, then after a read-only flush, "clean-L2", closer to the decode step), then the saving
(two kernels - fused) in us. Also the graph floor (a graph of one 1-thread kernel), which every line
includes once. Bytes = the K and V rows read, 2 * n_kv_heads * depth * row bytes (head_dim * 2 in float16).
"""
from __future__ import annotations

import argparse

import numpy as np

from flashd.bench.bench_attention_decode import cache_of, graph_floor_ms, graphed, read_flush
from flashd.bench.timing import KernelTimer, device_line, open_gpu, report
from flashd.daemon.backends.kv_types import row_bytes
from flashd.daemon.backends.cuda.ops import DECODE_CHUNK_SLOTS, attention_shape, rope_struct

MODELS = {
    # name: (n_heads, n_kv_heads, head_dim, rope_dim, theta, neox)
    "qwen2.5-1.5b": (12, 2, 128, 128, 1e6, 1),
    "qwen2.5-0.5b": (14, 2, 64, 64, 1e6, 1),
}


def bench(dev, timer, name, shape, max_ctx, depths, reps, kv_type="f16"):
    lib, p = dev.lib, dev.p
    n_heads, n_kv_heads, head_dim, rope_dim, theta, neox = shape
    chunk = DECODE_CHUNK_SLOTS
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((n_kv_heads, max_ctx, head_dim)).astype(np.float16)
    kc, vc = dev.upload(cache_of(cache, kv_type)), dev.upload(cache_of(cache[:, ::-1].copy(), kv_type))
    k_off = dev.upload(rng.standard_normal(n_kv_heads * head_dim).astype(np.float32)) if kv_type != "f16" else None
    if kv_type != "f16":
        name = f"{name} {kv_type}"
    q = dev.upload(rng.standard_normal(n_heads * head_dim).astype(np.float32))
    k = dev.upload(rng.standard_normal(n_kv_heads * head_dim).astype(np.float32))
    v = dev.upload(rng.standard_normal(n_kv_heads * head_dim).astype(np.float32))
    o = dev.empty((n_heads * head_dim,))
    n_past, pos = dev.empty((1,), np.int32), dev.empty((1,), np.int32)
    attn = attention_shape(dev.ffi, n_heads, n_kv_heads, head_dim, max_ctx, k_type=kv_type,
                           v_type=kv_type)                                           # scale 1 / sqrt(head_dim)
    rope = rope_struct(dev.ffi, rope_dim, float(np.float32(theta)), neox)            # no scaling
    ws = dev.empty((max(int(lib.fd_attention_decode_workspace_bytes(attn, chunk)), 16),), np.uint8)

    def fused():
        dev.native.check(lib.fd_attention_decode_rope(p(o, "float*"), p(q, "float*"), p(k, "float*"), p(v, "float*"),
                                                      p(kc), p(vc), p(k_off, "float*"), p(pos, "int32_t*"),
                                                      p(n_past, "int32_t*"), attn, rope, chunk, p(ws), dev.stream),
                         "fd_attention_decode_rope")

    def two_kernels():   # rotates q and k in place every replay: the timing does not depend on the values
        dev.native.check(lib.fd_rope_kv_write(p(q, "float*"), p(k, "float*"), p(v, "float*"), p(kc), p(vc),
                                              p(k_off, "float*"), p(pos, "int32_t*"), p(n_past, "int32_t*"), 1, attn, rope, dev.stream),
                         "fd_rope_kv_write")
        dev.native.check(lib.fd_attention_decode(p(o, "float*"), p(q, "float*"), p(kc), p(vc), p(n_past, "int32_t*"),
                                                 attn, chunk, p(ws), dev.stream), "fd_attention_decode")

    graphs = {"fused": graphed(dev, fused), "rope_kv_write + decode": graphed(dev, two_kernels)}
    for depth in depths:
        dev.upload(np.array([depth - 1], np.int32), out=n_past)     # the new token is key number depth
        dev.upload(np.array([depth - 1], np.int32), out=pos)
        n_bytes = 2 * n_kv_heads * depth * row_bytes(kv_type, head_dim)
        for flush_name, flush in (("", timer.flush_l2), (" clean-L2", read_flush(dev))):
            timer.flush_l2 = flush
            us = {}
            for path, call in graphs.items():
                ms = timer.time(call, reps=reps)
                us[path] = ms * 1e3
                print(report(f"{name} depth {depth}{flush_name}: {path}", ms, n_bytes=n_bytes,
                             peak_gbs=timer.peak_gbs), flush=True)
            saved = us["rope_kv_write + decode"] - us["fused"]
            print(f"  {name} depth {depth}{flush_name}: saving {saved:.2f} us per layer "
                  f"({100 * saved / us['rope_kv_write + decode']:.0f}%)", flush=True)
        timer.flush_l2 = KernelTimer.flush_l2.__get__(timer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-ctx", type=int, default=32768)
    ap.add_argument("--depths", default="128,8192,32768")
    ap.add_argument("--models", default="qwen2.5-1.5b", help=f"comma-separated, of {sorted(MODELS)}")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--kv-types", default="f16", help="comma-separated, of f16, q8_0, q4_0")
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",") if 0 < int(d) <= args.max_ctx]
    dev, timer = open_gpu()
    print(device_line(timer))
    print(report("floor: graph of one 1-thread kernel", graph_floor_ms(dev, timer)), flush=True)
    for name in args.models.split(","):
        for kv_type in args.kv_types.split(","):
            bench(dev, timer, name, MODELS[name], args.max_ctx, depths, args.reps, kv_type)


if __name__ == "__main__":
    main()
