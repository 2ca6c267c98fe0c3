"""fd_gated_delta_rule_decode / _prefill / _tree (native/cuda/gated_delta_rule.cu, through CudaOps'
gated_delta_rule_*) against the numpy definitions: reference_recurrent.py delta_rule_recurrent (and, for a prefill,
the reference backend's chunked form) and reference_recurrent_tree.py delta_rule_tree, run in float64 on the same
float32 inputs.

Tolerances, and why: the kernel is the recurrent form in float32 -- per token two d_k-term dot products (8 warp
partials of fmaf chains, added in warp order), a rank-1 update with fmaf, the decay exp(g) rounded from double.
Each token's rounding is ~d_k eps32 of the terms' magnitude at worst, and the delta rule with ||k|| = 1,
0 < beta < 1 and exp(g) <= 1 does not amplify earlier errors (I - beta k k^T has norm 1), so errors add up over
the tokens the memory still holds. Outputs and states are checked against float64 with
|gpu - ref| <= TOL * max |ref| over the array, TOL = 1e-5: numpy's own float32 recurrent form is within ~1.3e-7
of that on every shape here (measured; the test re-checks it as a calibration), which leaves ~100x for
the kernel's summation order and its fmaf roundings, while an indexing or ordering mistake gives O(1) errors.
GPU against GPU is bitwise: every token's arithmetic is the same whatever the entry point, so a prefill == its
decode steps, two prefill calls == one, and a tree node == the decode steps along its root-to-node path.
Outputs come from an arena poisoned with NaN bytes first: an element the kernel does not write fails.
"""
import numpy as np
import pytest

from flashd.daemon.backends.cuda.recurrent_ops import delta_scale
from flashd.daemon.backends.reference_recurrent import delta_rule_chunked, delta_rule_recurrent
from flashd.daemon.backends.reference_recurrent_tree import delta_rule_tree
from tests.gpu.recurrent_oracle import TREES, path_to, poisoned_ops

TOL = 1e-5


@pytest.fixture
def ops(dev):
    return poisoned_ops(dev)


def delta_inputs(rng, n, hk, hv, dk, dv):
    """The model's ranges: q, k L2-normalized; g = -softplus(.) * exp(A) in (-4, 0], some exactly 0 (no decay);
    beta = sigmoid(.) in (0, 1); v and the state O(1)."""
    q = rng.standard_normal((n, hk, dk))
    k = rng.standard_normal((n, hk, dk))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((n, hv, dv)) * 2
    g = -np.log1p(np.exp(rng.standard_normal((n, hv)))) * rng.uniform(0.01, 1.5, (n, hv))
    g[rng.random((n, hv)) < 0.1] = 0.0
    beta = 1 / (1 + np.exp(-rng.standard_normal((n, hv)) * 2))
    state = rng.standard_normal((hv, dk, dv)) * 0.5
    return [a.astype(np.float32) for a in (q, k, v, g, beta, state)]


def reference64(q, k, v, g, beta, state):
    """(out, state after) of the recurrent form in float64 on the float32 inputs."""
    s64 = state.astype(np.float64)
    out = delta_rule_recurrent(*(a.astype(np.float64) for a in (q, k, v, g, beta)), s64)
    return out, s64


def assert_close(gpu, ref, what):
    err = np.abs(gpu.astype(np.float64) - ref).max()
    assert err <= TOL * np.abs(ref).max(), f"{what}: max error {err}, max |ref| {np.abs(ref).max()}"


def run(ops, dev, host, split=None):
    """Upload, run gated_delta_rule (decode for one token, prefill for more) over the rows, in calls of
    `split` rows if given; returns (out, state after) on the host."""
    q, k, v, g, beta, state = host
    d_state = dev.upload(state)
    n = q.shape[0]
    outs = []
    for s in range(0, n, split or n):
        rows = [dev.upload(a[s:s + (split or n)]) for a in (q, k, v, g, beta)]
        outs.append(ops.to_numpy(ops.gated_delta_rule(*rows, d_state)))
    return np.concatenate(outs), dev.download(d_state)


# (n, Hk, Hv, d_k, d_v): the 0.8B and 27B shapes (decode and a prefill chunk), GQA ratios 1..4, head sizes below,
# at and above a warp's 32 columns and the 8 warps' rows, d_k != d_v, the largest d_k, one-element heads.
SHAPES = [(1, 16, 16, 128, 128), (1, 16, 48, 128, 128), (257, 16, 16, 128, 128), (37, 2, 6, 64, 64),
          (130, 3, 3, 96, 40), (65, 1, 4, 256, 256), (200, 4, 8, 17, 33), (3, 5, 5, 1, 1), (70, 2, 4, 128, 100),
          (9, 1, 1, 7, 31)]


@pytest.mark.parametrize("n,hk,hv,dk,dv", SHAPES)
def test_gated_delta_rule_matches_the_recurrent_form(ops, dev, rng, n, hk, hv, dk, dv):
    host = delta_inputs(rng, n, hk, hv, dk, dv)
    out, state = run(ops, dev, host)
    ref_out, ref_state = reference64(*host)
    assert_close(out, ref_out, "out")
    assert_close(state, ref_state, "state")
    f32_state = host[5].copy()                     # calibration: numpy's own float32 error is within TOL too
    assert_close(delta_rule_recurrent(*host[:5], f32_state), ref_out, "numpy float32 out")


@pytest.mark.parametrize("n,hk,hv,dk,dv", [(257, 16, 16, 128, 128), (130, 2, 4, 64, 64)])
def test_prefill_matches_the_reference_backends_chunked_form(ops, dev, rng, n, hk, hv, dk, dv):
    """The reference backend prefills with the chunked form (64-token chunks): the GPU's sequential prefill
    agrees with it to the same tolerance (they are the same map; only the rounding differs)."""
    host = delta_inputs(rng, n, hk, hv, dk, dv)
    out, state = run(ops, dev, host)
    s64 = host[5].astype(np.float64)
    ref_out = delta_rule_chunked(*(a.astype(np.float64) for a in host[:5]), s64)
    assert_close(out, ref_out, "out")
    assert_close(state, s64, "state")


@pytest.mark.parametrize("n,split,hk,hv,dk,dv", [(100, 37, 2, 4, 64, 64), (20, 1, 16, 48, 128, 128),
                                                 (66, 65, 3, 6, 40, 24), (5, 2, 1, 2, 256, 16)])
def test_state_carried_across_calls_is_bitwise(ops, dev, rng, n, split, hk, hv, dk, dv):
    """Prefills of `split` rows (split 1: decode steps; a last call of one row: decode after prefill) == one
    prefill over all rows, outputs and final state bit for bit."""
    host = delta_inputs(rng, n, hk, hv, dk, dv)
    whole_out, whole_state = run(ops, dev, host)
    split_out, split_state = run(ops, dev, host, split)
    np.testing.assert_array_equal(split_out, whole_out)
    np.testing.assert_array_equal(split_state, whole_state)


def run_tree(ops, dev, host, parents):
    q, k, v, g, beta, state = host
    d_state = dev.upload(state)
    node_state = dev.empty((len(parents) + 1, *state.shape))       # one spare node: larger buffers are allowed
    out = ops.gated_delta_rule_tree(*(dev.upload(a) for a in (q, k, v, g, beta)), d_state,
                                    dev.upload(np.asarray(parents, np.int32)), node_state)
    np.testing.assert_array_equal(dev.download(d_state), state)    # the committed state is read only
    return ops.to_numpy(out), dev.download(node_state)[:len(parents)]


@pytest.mark.parametrize("parents", TREES)
@pytest.mark.parametrize("hk,hv,dk,dv", [(16, 48, 128, 128), (2, 6, 40, 33), (1, 1, 256, 8)])
def test_tree_nodes_are_decode_steps_along_their_paths(ops, dev, rng, parents, hk, hv, dk, dv):
    parents = np.array(parents, np.int32)
    n = len(parents)
    host = delta_inputs(rng, n, hk, hv, dk, dv)
    out, nodes = run_tree(ops, dev, host, parents)
    node64 = np.zeros((n, hv, dk, dv))
    ref_out = delta_rule_tree(*(a.astype(np.float64) for a in host), parents, node64)
    assert_close(out, ref_out, "out")
    assert_close(nodes, node64, "node states")
    for i in sorted({0, n // 2, n - 1}):                           # bitwise: decode steps along the path
        path = path_to(parents, i)
        walk = [a[path] for a in host[:5]] + [host[5]]
        step_out, step_state = run(ops, dev, walk, 1)
        np.testing.assert_array_equal(out[i], step_out[-1])
        np.testing.assert_array_equal(nodes[i], step_state)


def test_a_node_with_an_invalid_parent_is_nan(ops, dev, rng):
    host = delta_inputs(rng, 3, 1, 2, 16, 16)
    out, nodes = run_tree(ops, dev, host, [-1, 5, 0])             # node 1's parent comes after it
    assert np.isfinite(out[0]).all() and np.isfinite(out[2]).all() and np.isnan(out[1]).all()
    assert np.isnan(nodes[1]).all() and np.isfinite(nodes[2]).all()


def test_status_codes(native, dev):
    lib, f, null = native.lib, dev.p(dev.empty((64,))), dev.ffi.NULL
    s = dev.stream
    scale = delta_scale(128)
    assert lib.fd_gated_delta_rule_decode(f, f, f, f, f, f, f, 1, 1, 257, 8, scale, s) == lib.FD_E_SHAPE
    assert lib.fd_gated_delta_rule_decode(f, f, f, f, f, f, f, 2, 3, 8, 8, scale, s) == lib.FD_E_ARG     # Hv % Hk
    assert lib.fd_gated_delta_rule_decode(f, f, f, f, f, f, f, 1, 1, 8, 0, scale, s) == lib.FD_E_ARG
    assert lib.fd_gated_delta_rule_decode(f, f, f, f, f, f, f, 1, 1, 8, 8, 0.0, s) == lib.FD_E_ARG
    assert lib.fd_gated_delta_rule_decode(f, f, f, f, f, null, f, 1, 1, 8, 8, scale, s) == lib.FD_E_ARG
    assert lib.fd_gated_delta_rule_prefill(f, f, f, f, f, f, f, -1, 1, 1, 8, 8, scale, s) == lib.FD_E_ARG
    assert lib.fd_gated_delta_rule_prefill(f, f, f, f, f, f, f, 0, 1, 1, 8, 8, scale, s) == 0           # no tokens
    ids = dev.p(dev.empty((1,), np.int32))
    assert lib.fd_gated_delta_rule_tree(f, f, f, f, f, f, f, ids, null, 1, 1, 1, 8, 8, scale, s) == lib.FD_E_ARG
    assert lib.fd_gated_delta_rule_tree(f, f, f, f, f, f, f, null, f, 1, 1, 1, 8, 8, scale, s) == lib.FD_E_ARG
