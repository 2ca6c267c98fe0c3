"""Causal flash attention of a prefill chunk over the KV cache: fd_attention_prefill.

    python bench/bench_attention_prefill.py [--reps 20]

One line per (model, n new tokens, n_past): median time of one layer's attention (L2 flushed before
every repetition), TFLOP/s and % of the nominal H100 SXM dense f16 peak (989 TFLOP/s).
FLOPs count only the visible (causal) part: 4 * head_dim * n_heads * sum_i (n_past + i + 1)
(QK^T and PV, 2 FLOPs per multiply-add); the kernel's masked work on diagonal tiles is overhead.
"""
from __future__ import annotations

import argparse

import numpy as np

from flashd.bench.timing import open_gpu, report

PEAK_TFLOPS = 989.0

MODELS = {   # n_heads, n_kv_heads, head_dim
    "qwen2.5-1.5b": (12, 2, 128),
    "qwen2.5-0.5b": (14, 2, 64),
}
CASES = [(512, 0), (2048, 0), (8192, 0), (512, 8192), (512, 32768 - 512)]   # (n, n_past)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    from flashd.daemon.backends.cuda.ops import attention_shape

    dev, timer = open_gpu()
    native, lib = dev.native, dev.lib
    rng = np.random.default_rng(0)
    print(f"# {timer.info['name']}  ({timer.info['n_sms']} SMs)  peak {PEAK_TFLOPS:.0f} TFLOP/s nominal")
    for model, (n_heads, n_kv, hd) in MODELS.items():
        for n, p0 in CASES:
            max_ctx = p0 + n
            q = dev.upload(rng.standard_normal((n, n_heads, hd)).astype(np.float32))
            k = dev.upload(rng.standard_normal((n_kv, max_ctx, hd)).astype(np.float16))
            v = dev.upload(rng.standard_normal((n_kv, max_ctx, hd)).astype(np.float16))
            n_past = dev.upload(np.array([p0], np.int32))
            o = dev.empty((n, n_heads * hd))
            shape = attention_shape(native.ffi, n_heads, n_kv, hd, max_ctx)      # scale 1 / sqrt(hd)
            fn = lambda: lib.fd_attention_prefill(  # noqa: E731
                dev.p(o, "float*"), dev.p(q, "float*"), dev.p(k), dev.p(v), dev.p(n_past, "int32_t*"), n, shape,
                dev.stream)
            native.check(fn(), "fd_attention_prefill")
            dev.synchronize()
            ms = timer.time(fn, reps=args.reps)
            visible = n * p0 + n * (n + 1) / 2
            flops = 4.0 * hd * n_heads * visible
            print(report(f"{model} n={n} n_past={p0}", ms, flops=flops, peak_tflops=PEAK_TFLOPS))


if __name__ == "__main__":
    main()
