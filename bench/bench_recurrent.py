"""A hybrid (qwen35) model's recurrent-layer kernels: fd_gated_delta_rule_decode / _prefill / _tree
(native/cuda/gated_delta_rule.cu), fd_causal_conv1d (native/cuda/causal_conv1d.cu) and the fused
fd_gated_delta_rule_fused (native/cuda/gated_delta_rule_fused.cu: L2 norms, decay, sigmoid, delta rule and the gated
output norm in one launch; compare its decode time with fd_gated_delta_rule_decode's plus the ~6 small launches it
replaces), each checked against its numpy definition (daemon/backends/reference_recurrent.py,
reference_recurrent_tree.py, in float64; the fused one: backends/base.py HybridFusedDefaults' composition in float64)
before it is timed.

    python bench/bench_recurrent.py [--seed N] [--reps 30] [--quick]

Shapes: the Gated DeltaNet layers of Qwen3.5-0.8B (Hk = Hv = 16 heads of 128; conv channels 6144) and of the
27B (Hk 16, Hv 48, heads of 128; conv channels 10240): a decode step, a 512-token prefill chunk, and (27B) a
tree verify of 16 nodes. --quick: the 0.8B decode and prefill only. Each launch is captured once in a CUDA
graph and replayed (the state keeps evolving from replay to replay: the work is the same), L2 flushed before
every repetition (bench/timing.py).

Tolerance: tests/gpu/test_gated_delta_rule.py's (the fused kernel: tests/gpu/test_hybrid_fused.py's 2e-4), |got - want| <= 1e-5 max |want| (numpy's own float32 recurrent
form is within ~1.3e-7 of max |want|); the conv: 2 K eps32 sum_k |u_k w_k| per element
(tests/gpu/test_causal_conv1d.py).
GB/s counts one read and one write of the state (the delta rule is bound by it in a decode step: Hv x 128 x 128
float32 per layer) plus the inputs and outputs once; a tree also writes every node's state.
"""
from __future__ import annotations

import numpy as np

from flashd.bench.op_harness import OpHarness, Tolerance, op_parser
from flashd.daemon.backends.cuda.recurrent_ops import delta_scale
from flashd.daemon.backends.reference_recurrent import causal_conv1d, delta_rule_recurrent
from flashd.daemon.backends.reference_recurrent_tree import delta_rule_tree

TOL = 1e-5
SHAPES = {"0.8B": (16, 16, 128, 128), "27B": (16, 48, 128, 128)}      # (Hk, Hv, d_k, d_v)
CONV = {"0.8B": 6144, "27B": 10240}                                   # channels 2 Hk S + Hv S; K = 4
PREFILL = 512
TREE_NODES = 16
FUSED_EPS = 1e-6                                                      # the models' rms_eps


def delta_inputs(rng, n, hk, hv, dk, dv):
    """As tests/gpu/test_gated_delta_rule.py: q, k L2-normed, g <= 0, beta in (0, 1)."""
    q, k = rng.standard_normal((2, n, hk, dk))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((n, hv, dv)) * 2
    g = -np.log1p(np.exp(rng.standard_normal((n, hv)))) * rng.uniform(0.01, 1.5, (n, hv))
    beta = 1 / (1 + np.exp(-rng.standard_normal((n, hv)) * 2))
    state = rng.standard_normal((hv, dk, dv)) * 0.5
    return [a.astype(np.float32) for a in (q, k, v, g, beta, state)]


def state_bound(want) -> Tolerance:
    return Tolerance("float32 recurrent form: 1e-5 of max |want| (tests/gpu/test_gated_delta_rule.py)",
                     atol=TOL * float(np.abs(want).max()))


def bench_delta(h: OpHarness, name: str, n: int, tree: bool) -> None:
    hk, hv, dk, dv = SHAPES[name]
    kind = "tree" if tree else "decode" if n == 1 else "prefill"
    case = f"fd_gated_delta_rule_{kind} {name} n={n} Hk={hk} Hv={hv} d={dk}"
    dev, lib = h.dev, h.dev.lib
    p = lambda t: dev.p(t, "float*")                                  # noqa: E731
    host = delta_inputs(h.rng(case), n, hk, hv, dk, dv)
    q, k, v, g, beta, state = (dev.upload(a) for a in host)
    out = dev.empty((n, hv, dv))
    dev.fill_bytes(out, 0xFF)                                         # NaN: an unwritten output fails the check
    scale = delta_scale(dv)
    s64 = host[5].astype(np.float64)
    args64 = [a.astype(np.float64) for a in host[:5]]
    if tree:
        parents = np.array([-1] + [int(x) for x in h.rng(case + " parents").integers(0, np.arange(1, n))], np.int32)
        d_parents, nodes = dev.upload(parents), dev.empty((n, hv, dk, dv))
        want = delta_rule_tree(*args64, s64, parents, np.zeros((n, hv, dk, dv)))
        launch = lambda: lib.fd_gated_delta_rule_tree(p(out), p(q), p(k), p(v), p(g), p(beta), p(state),  # noqa
                                                      dev.p(d_parents, "int32_t*"), p(nodes), n, hk, hv, dk, dv,
                                                      scale, dev.stream)
    elif n == 1:
        want = delta_rule_recurrent(*args64, s64)
        launch = lambda: lib.fd_gated_delta_rule_decode(p(out), p(q), p(k), p(v), p(g), p(beta), p(state),  # noqa
                                                        hk, hv, dk, dv, scale, dev.stream)
    else:
        want = delta_rule_recurrent(*args64, s64)
        launch = lambda: lib.fd_gated_delta_rule_prefill(p(out), p(q), p(k), p(v), p(g), p(beta), p(state), n,  # noqa
                                                         hk, hv, dk, dv, scale, dev.stream)
    state_bytes = hv * dk * dv * 4 * (2 + (n if tree else 0))
    io_bytes = n * (2 * hk * dk + 2 * hv * dv + 2 * hv) * 4
    h.run(case, launch, lambda: dev.download(out), lambda: want, state_bound(want), n_bytes=state_bytes + io_bytes,
          graph=True)


def fused_want(host, hk: int, S: int):
    """HybridFusedDefaults.gated_delta_rule_fused in float64 (the recurrent form): out (n, Hv, S)."""
    qkv, alpha, beta, z, dt, a, w, state = (x.astype(np.float64) for x in host)
    n, hv = alpha.shape
    kd = hk * S
    q, k = (qkv[:, o:o + kd].reshape(n, hk, S) for o in (0, kd))
    q, k = (x / np.sqrt((x * x).sum(-1, keepdims=True) + FUSED_EPS) for x in (q, k))
    zz = alpha + dt
    g = np.where(zz > 20, zz, np.log1p(np.exp(np.minimum(zz, 20)))) * a
    o = delta_rule_recurrent(q, k, qkv[:, 2 * kd:].reshape(n, hv, S), g, 1 / (1 + np.exp(-beta)), state)
    zr = z.reshape(n, hv, S)
    return o / np.sqrt((o * o).mean(-1, keepdims=True) + FUSED_EPS) * w * zr / (1 + np.exp(-zr))


def bench_fused(h: OpHarness, name: str, n: int) -> None:
    hk, hv, S, _ = SHAPES[name]
    case = f"fd_gated_delta_rule_fused {name} n={n} Hk={hk} Hv={hv} d={S}"
    dev, lib = h.dev, h.dev.lib
    p = lambda t: dev.p(t, "float*")                                  # noqa: E731
    rng = h.rng(case)
    f = np.float32
    host = [rng.standard_normal((n, (2 * hk + hv) * S)).astype(f), (rng.standard_normal((n, hv)) * 2).astype(f),
            (rng.standard_normal((n, hv)) * 2).astype(f), rng.standard_normal((n, hv * S)).astype(f),
            rng.standard_normal(hv).astype(f), (-np.exp(rng.standard_normal(hv) * 0.5)).astype(f),
            (1 + 0.1 * rng.standard_normal(S)).astype(f), (rng.standard_normal((hv, S, S)) * 0.5).astype(f)]
    want = fused_want(host, hk, S)
    qkv, alpha, beta, z, dt, a, w, state = (dev.upload(x) for x in host)
    out = dev.empty((n, hv, S))
    dev.fill_bytes(out, 0xFF)
    width, kd = (2 * hk + hv) * S, hk * S
    flat = qkv.reshape(qkv.size)
    launch = lambda: lib.fd_gated_delta_rule_fused(  # noqa: E731
        p(out), p(flat), p(flat[kd:]), p(flat[2 * kd:]), width, p(alpha), p(beta), p(z), p(dt), p(a), p(w), p(state),
        n, hk, hv, S, S, delta_scale(S), FUSED_EPS, FUSED_EPS, dev.stream)
    state_bytes = hv * S * S * 4 * 2
    io_bytes = n * (width + 2 * hv + 2 * hv * S) * 4
    h.run(case, launch, lambda: dev.download(out), lambda: want,
          Tolerance("the fused kernel: 2e-4 of max |want| (tests/gpu/test_hybrid_fused.py)",
                    atol=2e-4 * float(np.abs(want).max())), n_bytes=state_bytes + io_bytes, graph=True)


def bench_conv(h: OpHarness, name: str, n: int, taps: int = 4) -> None:
    channels = CONV[name]
    case = f"fd_causal_conv1d {name} n={n} C={channels} K={taps}"
    dev, lib = h.dev, h.dev.lib
    rng = h.rng(case)
    x = rng.standard_normal((n, channels)).astype(np.float32)
    w = rng.standard_normal((channels, taps)).astype(np.float32)
    st = rng.standard_normal((taps - 1, channels)).astype(np.float32)
    want = causal_conv1d(x.astype(np.float64), w.astype(np.float64), st.astype(np.float64))
    u = np.abs(np.concatenate([st, x]).astype(np.float64))
    bound = 2 * taps * 2.0 ** -24 * causal_conv1d(u[taps - 1:], np.abs(w.astype(np.float64)), u[:taps - 1].copy())
    dx, dw, ds, y = dev.upload(x), dev.upload(w), dev.upload(st), dev.empty((n, channels))
    dev.fill_bytes(y, 0xFF)
    p = lambda t: dev.p(t, "float*")                                  # noqa: E731
    h.run(case, lambda: lib.fd_causal_conv1d(p(y), p(dx), p(dw), p(ds), n, channels, taps, dev.stream),
          lambda: dev.download(y), lambda: want,
          Tolerance("K fmaf roundings: 2 K eps32 sum |u w| (tests/gpu/test_causal_conv1d.py)", atol=bound),
          n_bytes=(2 * n + 2 * (taps - 1) + taps) * channels * 4, graph=True)


def build_parser():
    return op_parser(__doc__, "the 0.8B decode and prefill only")


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    h = OpHarness.on_gpu(args)
    for name in (["0.8B"] if args.quick else list(SHAPES)):
        bench_delta(h, name, 1, False)
        bench_fused(h, name, 1)
        bench_delta(h, name, PREFILL, False)
        bench_fused(h, name, PREFILL)
        bench_conv(h, name, 1)
        bench_conv(h, name, PREFILL)
    if not args.quick:
        bench_delta(h, "27B", TREE_NODES, True)


if __name__ == "__main__":
    main()
