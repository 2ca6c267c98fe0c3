"""The hybrid's fused kernels (ABI 15, through CudaOps' fused_ops.py): fd_gated_delta_rule_fused / _fused_tree
(native/cuda/gated_delta_rule_fused.cu), fd_causal_conv1d_silu / _silu_tree (causal_conv1d.cu), fd_gated_qk_norm
(gated_qk_norm.cu), against float64 oracles of what backends/base.py HybridFusedDefaults composes, and GPU against GPU.

Tolerances, and why:
  - the fused delta rule: the delta rule's arithmetic is gated_delta_rule.cu's (tests/gpu/test_gated_delta_rule.py:
    states within TOL_STATE = 1e-5 of max |ref|); the prologue adds correctly rounded float32 L2 norms (a few
    eps32 on q, k), the decay / sigmoid steps of fd_delta_decay / fd_sigmoid (an ulp or two); the epilogue divides
    o by its head's rms and multiplies by silu(z) (__expf: ~2 ulp), which keeps o's relative error where a head's
    rms is comparable to the array's max |o| (these inputs: O(1) everywhere), hence TOL_OUT = 2e-4 of max |ref|:
    an indexing, stride or head-mapping mistake gives O(1) errors.
  - GPU against GPU, bitwise: every token's fused arithmetic is the same in every form, so a prefill == its
    decode steps (and two calls == one), and a tree node's output and state == the decode steps along its path;
    the conv's SiLU == fd_causal_conv1d then fd_silu; a q/k norm row does not depend on the other rows.
Outputs come from an arena poisoned with NaN bytes first: an element a kernel does not write fails.

Shapes: Qwen3.5 0.8B (16 key and 16 value heads of 128) and 27B (16 key heads, 48 value heads of 128: value head
h reads key head h % 16), prefill lengths around the reference's 64-token chunks (63, 64, 65, 128, 130), head
sizes below a warp, not a multiple of 32 (the last column tile partial), and 1.
"""
import numpy as np
import pytest

from flashd.daemon.backends.base import HybridFusedDefaults
from flashd.daemon.backends.cuda.recurrent_ops import delta_scale
from flashd.daemon.backends.reference_recurrent import delta_rule_recurrent
from flashd.daemon.backends.reference_recurrent_tree import delta_rule_tree
from tests.gpu.recurrent_oracle import TREES, path_to, poisoned_ops

EPS = 1e-6
TOL_STATE = 1e-5
TOL_OUT = 2e-4
KEYS = ("qkv", "alpha", "beta", "z", "dt_bias", "a", "norm", "state")
ROWS = ("qkv", "alpha", "beta", "z")         # per token; the rest are per layer


@pytest.fixture
def ops(dev):
    o = poisoned_ops(dev)
    o.fused_delta_prefill = True      # this file tests the fused kernel itself, at every n (off by default: prefill composes)
    return o


def fused_inputs(rng, n, hk, hv, S):
    """Raw projections in the model's ranges: qkv (n, (2 Hk + Hv) S) (a conv + SiLU output: O(1)), alpha, beta
    (n, Hv), z (n, Hv S), dt_bias, a = -exp(.) (Hv,), norm weight (S,) near 1, state (Hv, S, S) O(1)."""
    f = np.float32
    return dict(qkv=rng.standard_normal((n, (2 * hk + hv) * S)).astype(f),
                alpha=(rng.standard_normal((n, hv)) * 2).astype(f), beta=(rng.standard_normal((n, hv)) * 2).astype(f),
                z=rng.standard_normal((n, hv * S)).astype(f), dt_bias=rng.standard_normal(hv).astype(f),
                a=(-np.exp(rng.standard_normal(hv) * 0.5)).astype(f),
                norm=(1 + 0.1 * rng.standard_normal(S)).astype(f),
                state=(rng.standard_normal((hv, S, S)) * 0.5).astype(f))


def oracle64(host, hk, S, parents=None):
    """(out, state after, node states or None) of HybridFusedDefaults' composition in float64 (the recurrent form;
    a tree: delta_rule_tree)."""
    h = {k: v.astype(np.float64) for k, v in host.items()}
    n, hv = h["alpha"].shape
    kd = hk * S
    q, k = (h["qkv"][:, o:o + kd].reshape(n, hk, S) for o in (0, kd))
    q, k = (x / np.sqrt((x * x).sum(-1, keepdims=True) + EPS) for x in (q, k))
    v = h["qkv"][:, 2 * kd:].reshape(n, hv, S)
    zz = h["alpha"] + h["dt_bias"]
    g = np.where(zz > 20, zz, np.log1p(np.exp(np.minimum(zz, 20)))) * h["a"]
    beta = 1 / (1 + np.exp(-h["beta"]))
    state, nodes = h["state"].copy(), None
    if parents is None:
        o = delta_rule_recurrent(q, k, v, g, beta, state)
    else:
        nodes = np.zeros((n, hv, S, S))
        o = delta_rule_tree(q, k, v, g, beta, state, parents, nodes)
    y = o / np.sqrt((o * o).mean(-1, keepdims=True) + EPS) * h["norm"]
    z = h["z"].reshape(n, hv, S)
    return y * z / (1 + np.exp(-z)), state, nodes


def assert_close(gpu, ref, tol, what):
    err = np.abs(gpu.astype(np.float64) - ref).max()
    assert err <= tol * np.abs(ref).max(), f"{what}: max error {err}, max |ref| {np.abs(ref).max()}"


def run_fused(ops, dev, host, hk, S, split=None):
    """gated_delta_rule_fused over the rows in calls of `split` rows (None: one call): (out, state) on the host."""
    d = {k: dev.upload(host[k]) for k in KEYS if k not in ROWS}
    n = host["qkv"].shape[0]
    outs = []
    for s in range(0, n, split or n):
        rows = [dev.upload(host[k][s:s + (split or n)]) for k in ROWS]
        outs.append(ops.to_numpy(ops.gated_delta_rule_fused(*rows, d["dt_bias"], d["a"], d["norm"], d["state"], hk,
                                                            S, EPS)))
    return np.concatenate(outs), dev.download(d["state"])


# (n, Hk, Hv, S)
SHAPES = [(1, 16, 16, 128), (1, 16, 48, 128), (128, 16, 48, 128), (130, 16, 16, 128), (65, 2, 4, 64),
          (64, 1, 1, 128), (63, 3, 6, 32), (37, 4, 8, 100), (7, 1, 2, 17), (5, 1, 1, 1)]


@pytest.mark.parametrize("n,hk,hv,S", SHAPES)
def test_fused_delta_rule_matches_the_composition(ops, dev, rng, n, hk, hv, S):
    host = fused_inputs(rng, n, hk, hv, S)
    out, state = run_fused(ops, dev, host, hk, S)
    ref_out, ref_state, _ = oracle64(host, hk, S)
    assert_close(out, ref_out, TOL_OUT, "out")
    assert_close(state, ref_state, TOL_STATE, "state")


@pytest.mark.parametrize("n,hk,hv,S", [(33, 16, 48, 128), (9, 2, 2, 40)])
def test_fused_is_the_unfused_gpu_chain_within_rounding(ops, dev, rng, n, hk, hv, S):
    """The same map as the primitive kernels' chain (fd_rmsnorm l2 norms, fd_delta_decay, fd_sigmoid,
    fd_gated_delta_rule_*, fd_rmsnorm, fd_swiglu) on the GPU."""
    host = fused_inputs(rng, n, hk, hv, S)
    fused, fused_state = run_fused(ops, dev, host, hk, S)
    ops.prepare_capture(type("Cfg", (), {"linear": type("Lin", (), {"head_dim": S})})())    # l2_norm's weight
    d = {k: dev.upload(v) for k, v in host.items()}
    chain = HybridFusedDefaults.gated_delta_rule_fused(ops, *(d[k] for k in KEYS), hk, S, EPS)
    ref = ops.to_numpy(ops.materialize(chain))
    assert_close(fused, ref.astype(np.float64), TOL_OUT, "fused vs chain")
    assert_close(fused_state, dev.download(d["state"]).astype(np.float64), TOL_STATE, "state")


@pytest.mark.parametrize("n,split,hk,hv,S", [(20, 1, 16, 48, 128), (100, 37, 2, 4, 64), (66, 65, 3, 6, 40),
                                             (130, 64, 16, 16, 128)])
def test_prefill_is_decode_steps_bitwise(ops, dev, rng, n, split, hk, hv, S):
    """Calls of `split` rows (1: decode steps; a last call of one row: decode after prefill) == one call over all
    rows, outputs and final state bit for bit."""
    host = fused_inputs(rng, n, hk, hv, S)
    whole_out, whole_state = run_fused(ops, dev, host, hk, S)
    split_out, split_state = run_fused(ops, dev, host, hk, S, split)
    np.testing.assert_array_equal(split_out, whole_out)
    np.testing.assert_array_equal(split_state, whole_state)


def run_fused_tree(ops, dev, host, hk, S, parents):
    d = {k: dev.upload(v) for k, v in host.items()}
    n = len(parents)
    node_state = dev.empty((n + 1, *host["state"].shape))          # one spare node: larger buffers are allowed
    out = ops.gated_delta_rule_fused_tree(*(d[k] for k in KEYS), dev.upload(np.asarray(parents, np.int32)),
                                          node_state, hk, S, EPS)
    np.testing.assert_array_equal(dev.download(d["state"]), host["state"])    # the committed state: read only
    return ops.to_numpy(out), dev.download(node_state)[:n]


@pytest.mark.parametrize("parents", TREES)
@pytest.mark.parametrize("hk,hv,S", [(16, 48, 128), (2, 6, 40), (1, 1, 128)])
def test_tree_rows_are_decode_steps_bitwise(ops, dev, rng, parents, hk, hv, S):
    parents = np.array(parents, np.int32)
    n = len(parents)
    host = fused_inputs(rng, n, hk, hv, S)
    out, nodes = run_fused_tree(ops, dev, host, hk, S, parents)
    ref_out, _, ref_nodes = oracle64(host, hk, S, parents)
    assert_close(out, ref_out, TOL_OUT, "out")
    assert_close(nodes, ref_nodes, TOL_STATE, "node states")
    for i in sorted({0, n // 2, n - 1}):                           # bitwise: decode steps along the path
        path = path_to(parents, i)
        walk = {k: (host[k][path] if k in ROWS else host[k]) for k in KEYS}
        step_out, step_state = run_fused(ops, dev, walk, hk, S, 1)
        np.testing.assert_array_equal(out[i], step_out[-1])
        np.testing.assert_array_equal(nodes[i], step_state)


@pytest.mark.parametrize("n,hk,hv,S", [(1, 16, 48, 128), (1, 16, 16, 128), (20, 16, 48, 128), (3, 2, 6, 96),
                                       (9, 2, 2, 40), (5, 3, 6, 64), (2, 1, 3, 33), (4, 1, 1, 32), (6, 4, 8, 100)])
def test_cluster_form_is_the_one_block_form_bitwise(ops, dev, rng, native, n, hk, hv, S):
    """On sm_90 a head of d_v > 32 runs as a thread-block cluster of its ceil(d_v / 32) column tiles, one block
    each (gated_delta_rule_fused.cu); the tuning's delta_cluster = 0 (read at each launch) forces the one-block
    form. Decode, prefill and tree: outputs, final state and node states bit for bit (2, 3 and 4 tiles, a
    partial last tile, one tile). Before sm_90 both runs take the one-block form and this is trivially true."""
    host = fused_inputs(rng, n, hk, hv, S)
    parents = np.array([-1] + [(i - 1) // 2 for i in range(1, n)], np.int32)     # a binary tree over the rows
    got, before = {}, native.tuning()
    try:
        for flag in ("1", "0"):
            native.set_tuning(delta_cluster=int(flag))
            got[flag] = (*run_fused(ops, dev, host, hk, S), *run_fused(ops, dev, host, hk, S, 1),
                         *run_fused_tree(ops, dev, host, hk, S, parents))
    finally:
        native.set_tuning(**before)
    for a, b in zip(got["1"], got["0"]):
        np.testing.assert_array_equal(a, b)


def test_fused_status_codes(native, dev):
    lib, f, null, s = native.lib, dev.p(dev.empty((64,))), dev.ffi.NULL, dev.stream
    sc = delta_scale(128)

    def call(n=1, hk=1, hv=1, dk=8, dv=8, stride=24, q=f, scale=sc):
        return lib.fd_gated_delta_rule_fused(f, q, f, f, stride, f, f, f, f, f, f, f, n, hk, hv, dk, dv, scale,
                                             EPS, EPS, s)

    assert call(dk=129, stride=1000) == lib.FD_E_SHAPE            # past FD_DELTA_FUSED_MAX_DK
    assert call(dv=129, stride=1000) == lib.FD_E_SHAPE
    assert call(hk=2, hv=3, stride=100) == lib.FD_E_ARG           # Hv % Hk
    assert call(stride=7) == lib.FD_E_ARG                         # shorter than a head's row
    assert call(q=null) == lib.FD_E_ARG
    assert call(scale=0.0) == lib.FD_E_ARG
    assert call(n=0) == 0                                         # no tokens
    ids = dev.p(dev.empty((1,), np.int32))
    assert lib.fd_gated_delta_rule_fused_tree(f, f, f, f, 24, f, f, f, f, f, f, f, ids, null, 1, 1, 1, 8, 8, sc,
                                              EPS, EPS, s) == lib.FD_E_ARG


# -- conv + SiLU ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,C,K", [(1, 10240, 4), (37, 10240, 4), (9, 100, 3), (1, 6144, 4)])
def test_conv_silu_is_conv_then_silu_bitwise(ops, dev, rng, n, C, K):
    """fd_causal_conv1d_silu == fd_causal_conv1d then fd_silu, outputs and state; the tree form likewise (10240:
    the 27B's conv channels, 2 * 16 * 128 + 48 * 128; 6144: the 0.8B's)."""
    x = (rng.standard_normal((n, C)) * 2).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    st = (rng.standard_normal((K - 1, C)) * 2).astype(np.float32)
    dx, dw = dev.upload(x), dev.upload(w)
    s1, s2 = dev.upload(st), dev.upload(st)
    fused = ops.to_numpy(ops.causal_conv1d_silu(dx, dw, s1))
    plain = ops.to_numpy(ops.materialize(ops.silu(ops.causal_conv1d(dx, dw, s2))))
    np.testing.assert_array_equal(fused, plain)
    np.testing.assert_array_equal(dev.download(s1), dev.download(s2))
    parents = dev.upload(np.arange(-1, n - 1, dtype=np.int32))     # a chain: the sequence's rows
    nodes = dev.empty((n, K - 1, C))
    tree = ops.to_numpy(ops.causal_conv1d_silu_tree(dx, dw, dev.upload(st), parents, nodes))
    np.testing.assert_array_equal(tree, fused)
    np.testing.assert_array_equal(dev.download(nodes)[-1], dev.download(s1))


# -- the gated attention's q/k norms ---------------------------------------------------------------------------

@pytest.mark.parametrize("n,H,hkv,d", [(1, 8, 2, 256), (5, 8, 2, 256), (3, 24, 4, 256), (1, 24, 4, 256),
                                       (2, 4, 1, 64), (4, 3, 3, 40), (2, 4, 2, 128), (3, 2, 1, 300), (2, 3, 1, 17)])
def test_gated_qk_norm(ops, dev, rng, n, H, hkv, d):
    """Against float64 (correctly rounded sqrt and division: a few eps32), the gate bit copies, and each row's
    bits independent of the others (row t of an n-row call == a one-row call of row t). d <= 128 and <= 256 take
    the kernel's register forms, 300 its loop form."""
    qg = (rng.standard_normal((n, H, 2 * d)) * 3).astype(np.float32)
    k = (rng.standard_normal((n, hkv, d)) * 3).astype(np.float32)
    wq, wk = (1 + 0.1 * rng.standard_normal((2, d))).astype(np.float32)
    got = [ops.to_numpy(t) for t in ops.gated_qk_norm(*(dev.upload(a) for a in (qg, k, wq, wk)), EPS)]

    def rms64(x, w):
        x = x.astype(np.float64)
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w

    assert_close(got[0], rms64(qg[..., :d], wq), 1e-6, "q")
    np.testing.assert_array_equal(got[1], qg[..., d:])
    assert_close(got[2], rms64(k, wk), 1e-6, "k")
    t = n - 1
    one = [ops.to_numpy(x) for x in ops.gated_qk_norm(*(dev.upload(a) for a in (qg[t:], k[t:], wq, wk)), EPS)]
    for a, b in zip(one, got):
        np.testing.assert_array_equal(a[0], b[t])
