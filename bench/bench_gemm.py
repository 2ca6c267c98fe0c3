"""Prefill projections on tensor cores: fd_gemm_f16 / fd_gemm_swiglu_f16 at the model shapes.

    python bench/bench_gemm.py [--reps 30]

One line per (model, projection, m): median time (L2 flushed before every repetition), TFLOP/s
and % of the nominal H100 SXM dense f16 tensor-core peak (989 TFLOP/s). Then, per model and m, the
sum over one layer's projections and the prefill rate those GEMMs alone would allow
(tokens/s = m / (n_layers * layer time)); the lm_head is left out (prefill needs only the last
token's logits).
"""
from __future__ import annotations

import argparse

import numpy as np

from flashd.bench.timing import open_gpu, report

PEAK_TFLOPS = 989.0   # H100 SXM, dense f16 with f32 accumulate (nominal)

# (name, n, k, epilogue) per layer, as a qwen2 layer runs them: qkv adds its bias, o and down add
# the residual stream in place (y aliases residual), gate/up is the fused SwiGLU
MODELS = {
    "qwen2.5-1.5b": dict(n_layers=28, projections=[
        ("qkv", 1536 + 256 + 256, 1536, "bias"), ("o", 1536, 1536, "residual"),
        ("gate_up", 8960, 1536, "swiglu"), ("down", 1536, 8960, "residual")]),
    "qwen2.5-0.5b": dict(n_layers=24, projections=[
        ("qkv", 896 + 128 + 128, 896, "bias"), ("o", 896, 896, "residual"),
        ("gate_up", 4864, 896, "swiglu"), ("down", 896, 4864, "residual")]),
}
EXTRA = [("qwen2.5-0.5b", "q_896", 896, 896, "bias"), ("qwen2.5-0.5b", "k_or_v_128", 128, 896, "bias")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--m", type=int, nargs="*", default=[512, 2048])
    args = ap.parse_args()

    dev, timer = open_gpu()
    native, lib = dev.native, dev.lib
    rng = np.random.default_rng(0)
    print(f"# {timer.info['name']}  ({timer.info['n_sms']} SMs)  peak {PEAK_TFLOPS:.0f} TFLOP/s nominal")

    def bench(name, m, n, k, epilogue):
        swiglu = epilogue == "swiglu"
        x = dev.upload(rng.standard_normal((m, k)).astype(np.float32))
        wg = dev.upload((rng.standard_normal((n, k)) * 0.05).astype(np.float16))
        wu = dev.upload((rng.standard_normal((n, k)) * 0.05).astype(np.float16)) if swiglu else None
        y = dev.upload(rng.standard_normal((m, n)).astype(np.float32))     # also the residual stream
        bias = dev.upload(rng.standard_normal(n).astype(np.float32))
        null = dev.ffi.NULL
        if swiglu:
            fn = lambda: lib.fd_gemm_swiglu_f16(dev.p(y, "float*"), dev.p(x, "float*"), dev.p(wg), dev.p(wu),  # noqa: E731
                                                m, n, k, dev.stream)
        elif epilogue == "bias":
            fn = lambda: lib.fd_gemm_f16(dev.p(y, "float*"), dev.p(x, "float*"), dev.p(wg), m, n, k,  # noqa: E731
                                         dev.p(bias, "float*"), null, dev.stream)
        else:
            fn = lambda: lib.fd_gemm_f16(dev.p(y, "float*"), dev.p(x, "float*"), dev.p(wg), m, n, k,  # noqa: E731
                                         null, dev.p(y, "float*"), dev.stream)
        native.check(fn(), name)
        dev.synchronize()
        ms = timer.time(fn, reps=args.reps)
        flops = 2.0 * m * n * k * (2 if swiglu else 1)
        print(report(f"{name} m={m} n={n} k={k}", ms, flops=flops, peak_tflops=PEAK_TFLOPS))
        return ms

    for model, spec in MODELS.items():
        for m in args.m:
            layer_ms = sum(bench(f"{model} {p}", m, n, k, sw) for p, n, k, sw in spec["projections"])
            total_ms = layer_ms * spec["n_layers"]
            print(f"# {model} m={m}: one layer's projections {layer_ms * 1e3:.1f} us, x{spec['n_layers']} layers "
                  f"{total_ms:.2f} ms -> GEMM-only prefill bound {m / (total_ms * 1e-3):,.0f} tokens/s")
    for model, p, n, k, sw in EXTRA:
        for m in args.m:
            bench(f"{model} {p}", m, n, k, sw)


if __name__ == "__main__":
    main()
