"""fd_causal_conv1d / fd_causal_conv1d_tree (native/cuda/causal_conv1d.cu, through CudaOps.causal_conv1d and
causal_conv1d_tree) against the numpy definitions, reference_recurrent.py causal_conv1d and
reference_recurrent_tree.py causal_conv1d_tree, run in float64 on the same float32 inputs.

Tolerances, and why:
  - outputs: each is one float32 fmaf chain of K products; its error is at most K roundings of the running sum,
    so |y - y64| <= 2 K eps32 sum_k |u_k w_k| per element (eps32 = 2^-24), checked element by element.
  - states (conv_state after a call, node_conv of a tree): copies of inputs, no arithmetic: equal.
  - GPU against GPU: every output is the same fmaf chain over the same window whatever the launch (decode,
    prefill, tree, one call or two), so prefill == decode steps, two calls == one call and a tree node == the
    decode steps along its root-to-node path hold bit for bit.
Outputs come from an arena poisoned with NaN bytes first: an element the kernel does not write fails.
"""
import numpy as np
import pytest

from flashd.daemon.backends.reference_recurrent import causal_conv1d
from flashd.daemon.backends.reference_recurrent_tree import causal_conv1d_tree
from tests.gpu.recurrent_oracle import TREES, path_to, poisoned_ops

EPS32 = 2.0 ** -24


@pytest.fixture
def ops(dev):
    return poisoned_ops(dev)


def conv_inputs(rng, n: int, channels: int, taps: int):
    x = (rng.standard_normal((n, channels)) * 2).astype(np.float32)
    w = rng.standard_normal((channels, taps)).astype(np.float32)
    state = (rng.standard_normal((taps - 1, channels)) * 2).astype(np.float32)
    return x, w, state


def assert_conv_close(y, x, w, state, y64=None):
    """|y - y64| within 2 K eps32 sum_k |u_k w_k| (module docstring), y64 the float64 definition."""
    u = np.abs(np.concatenate([state, x]).astype(np.float64))
    bound = causal_conv1d(u[state.shape[0]:], np.abs(w.astype(np.float64)), u[:state.shape[0]].copy())
    if y64 is None:
        y64 = causal_conv1d(x.astype(np.float64), w.astype(np.float64), state.astype(np.float64))
    err = np.abs(y.astype(np.float64) - y64)
    assert np.all(err <= 2 * w.shape[1] * EPS32 * bound + 1e-30), f"max error {err.max()}"


# (n, C, K): a decode step at the 0.8B / 27B widths, prefills of awkward lengths and widths, n < K - 1 (the new
# state keeps part of the old one, shifted), the widest kernel (K = 8), one channel; decode steps at K = 2 and 8
# (n = 1 runs the kernel's register-window path).
SHAPES = [(1, 6144, 4), (1, 10240, 4), (7, 10240, 4), (133, 37, 4), (2, 100, 4), (1, 5, 4), (300, 33, 3),
          (5, 70, 8), (64, 1, 2), (513, 2049, 4), (1, 37, 2), (1, 70, 8)]


@pytest.mark.parametrize("n,channels,taps", SHAPES)
def test_causal_conv1d_matches_the_definition(ops, dev, rng, n, channels, taps):
    x, w, state = conv_inputs(rng, n, channels, taps)
    d_state = dev.upload(state)
    y = ops.to_numpy(ops.causal_conv1d(dev.upload(x), dev.upload(w), d_state))
    ref_state = state.copy()
    causal_conv1d(x, w, ref_state)
    assert_conv_close(y, x, w, state)
    np.testing.assert_array_equal(dev.download(d_state), ref_state)


@pytest.mark.parametrize("n1,n2,channels,taps", [(1, 1, 300, 4), (2, 9, 257, 4), (64, 65, 1000, 4), (3, 1, 31, 8)])
def test_state_carried_across_calls_and_decode_after_prefill_are_bitwise(ops, dev, rng, n1, n2, channels, taps):
    """Two calls (a prefill then a prefill or a decode step) == one call over both, bit for bit; and a
    prefill == n decode steps, bit for bit."""
    x, w, state = conv_inputs(rng, n1 + n2, channels, taps)
    dw = dev.upload(w)
    whole_state = dev.upload(state)
    whole = ops.to_numpy(ops.causal_conv1d(dev.upload(x), dw, whole_state))
    split_state = dev.upload(state)
    first = ops.to_numpy(ops.causal_conv1d(dev.upload(x[:n1]), dw, split_state))
    second = ops.to_numpy(ops.causal_conv1d(dev.upload(x[n1:]), dw, split_state))
    np.testing.assert_array_equal(np.concatenate([first, second]), whole)
    np.testing.assert_array_equal(dev.download(split_state), dev.download(whole_state))
    step_state = dev.upload(state)
    steps = [ops.to_numpy(ops.causal_conv1d(dev.upload(x[t:t + 1]), dw, step_state)) for t in range(n1 + n2)]
    np.testing.assert_array_equal(np.concatenate(steps), whole)
    np.testing.assert_array_equal(dev.download(step_state), dev.download(whole_state))


@pytest.mark.parametrize("parents", TREES)
@pytest.mark.parametrize("channels,taps", [(10240, 4), (37, 4), (70, 8)])
def test_tree_nodes_are_decode_steps_along_their_paths(ops, dev, rng, parents, channels, taps):
    parents = np.array(parents, np.int32)
    n = len(parents)
    x, w, state = conv_inputs(rng, n, channels, taps)
    dw, d_state = dev.upload(w), dev.upload(state)
    node_conv = dev.empty((n + 1, taps - 1, channels))            # one spare node: larger buffers are allowed
    y = ops.to_numpy(ops.causal_conv1d_tree(dev.upload(x), dw, d_state, dev.upload(parents), node_conv))
    nodes = dev.download(node_conv)[:n]
    np.testing.assert_array_equal(dev.download(d_state), state)   # the committed state is read only
    ref_nodes = np.zeros((n, taps - 1, channels))
    y64 = causal_conv1d_tree(x.astype(np.float64), w.astype(np.float64), state.astype(np.float64), parents,
                             ref_nodes)
    np.testing.assert_array_equal(nodes, ref_nodes.astype(np.float32))
    for i in (0, n // 2, n - 1):                                    # bitwise: decode steps along the path
        walk = dev.upload(state)
        for j in path_to(parents, i):
            step = ops.to_numpy(ops.causal_conv1d(dev.upload(x[j:j + 1]), dw, walk))
        np.testing.assert_array_equal(y[i], step[0])
        np.testing.assert_array_equal(nodes[i], dev.download(walk))
    # every window value is a state, node or x value of its channel: |u_k| <= their largest magnitude
    mags = np.abs(np.concatenate([state, nodes.reshape(-1, channels), x])).max(axis=0).astype(np.float64)
    err = np.abs(y.astype(np.float64) - y64)
    assert np.all(err <= 2 * taps * EPS32 * (mags * np.abs(w).sum(axis=1)) + 1e-30), f"max error {err.max()}"


def test_a_node_with_an_invalid_parent_is_nan(ops, dev, rng):
    x, w, state = conv_inputs(rng, 3, 40, 4)
    parents = np.array([-1, 1, 0], np.int32)                        # node 1 names itself
    node_conv = dev.empty((3, 3, 40))
    y = ops.to_numpy(ops.causal_conv1d_tree(dev.upload(x), dev.upload(w), dev.upload(state), dev.upload(parents),
                                            node_conv))
    assert np.isfinite(y[0]).all() and np.isfinite(y[2]).all() and np.isnan(y[1]).all()


def test_status_codes(native, dev):
    lib, f = native.lib, dev.empty((64,))
    p = dev.p(f)
    assert lib.fd_causal_conv1d(p, p, p, p, 1, 4, 9, dev.stream) == lib.FD_E_SHAPE       # K > FD_CONV_MAX_K
    assert lib.fd_causal_conv1d(p, p, p, p, 1, 4, 1, dev.stream) == lib.FD_E_ARG
    assert lib.fd_causal_conv1d(p, p, p, p, 1, 0, 4, dev.stream) == lib.FD_E_ARG
    assert lib.fd_causal_conv1d(dev.ffi.NULL, p, p, p, 1, 4, 4, dev.stream) == lib.FD_E_ARG
    assert lib.fd_causal_conv1d(p, p, p, p, 0, 4, 4, dev.stream) == 0                     # nothing to do
    ids = dev.p(dev.empty((1,), np.int32))
    assert lib.fd_causal_conv1d_tree(p, p, p, p, ids, dev.ffi.NULL, 1, 4, 4, dev.stream) == lib.FD_E_ARG
    assert lib.fd_causal_conv1d_tree(p, p, p, p, ids, p, 1, 4, 9, dev.stream) == lib.FD_E_SHAPE
