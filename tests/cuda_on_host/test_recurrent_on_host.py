"""CudaOps' recurrent ops (cuda/recurrent_ops.py) without a GPU: the Python side of fd_causal_conv1d(_tree) and
fd_gated_delta_rule_decode / _prefill / _tree over a stand-in library whose "device memory" is host memory and
whose fd_* calls run the numpy definitions (reference_recurrent.py, reference_recurrent_tree.py) on the buffers
they are handed. Checked here: which entry point runs (decode for one token, prefill for more), that pointers,
sizes and the scale reach it in the header's order (a swapped argument gives another result than the
reference's), and that every bad shape or dtype is refused before any fd_* call. The kernels themselves:
tests/gpu/test_causal_conv1d.py, tests/gpu/test_gated_delta_rule.py."""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.cuda.ops import CudaOps, QuantWeight
from flashd.daemon.backends.cuda.recurrent_ops import delta_scale
from flashd.daemon.backends.cuda.tensor import Device
from flashd.daemon.backends.reference_recurrent import causal_conv1d, delta_rule_recurrent
from flashd.daemon.backends.reference_recurrent_tree import causal_conv1d_tree, delta_rule_tree
from tests.cuda_on_host.test_cuda_kv_prefix_on_host import HostMemoryLib, HostNative


class RecurrentLib(HostMemoryLib):
    """fd_causal_conv1d* and fd_gated_delta_rule_* on host buffers, by the numpy definitions; `calls` records
    (name, scalar arguments) of every call."""

    def __init__(self, ffi):
        super().__init__(ffi)
        self.calls: list[tuple[str, tuple]] = []

    def _a(self, p, shape, dtype=np.float32) -> np.ndarray:
        n = int(np.prod(shape))
        return np.frombuffer(self.ffi.buffer(self.ffi.cast("char*", p), n * np.dtype(dtype).itemsize),
                             dtype).reshape(shape)

    def fd_causal_conv1d(self, y, x, weight, state, n, c, k, stream):
        self.calls.append(("fd_causal_conv1d", (n, c, k)))
        st = self._a(state, (k - 1, c))
        self._a(y, (n, c))[...] = causal_conv1d(self._a(x, (n, c)).copy(), self._a(weight, (c, k)), st)
        return 0

    def fd_causal_conv1d_tree(self, y, x, weight, state, parents, node_conv, n, c, k, stream):
        self.calls.append(("fd_causal_conv1d_tree", (n, c, k)))
        self._a(y, (n, c))[...] = causal_conv1d_tree(self._a(x, (n, c)), self._a(weight, (c, k)),
                                                     self._a(state, (k - 1, c)), self._a(parents, (n,), np.int32),
                                                     self._a(node_conv, (n, k - 1, c)))
        return 0

    def _qkvgb(self, q, k, v, g, beta, n, hk, hv, dk, dv):
        return (self._a(q, (n, hk, dk)), self._a(k, (n, hk, dk)), self._a(v, (n, hv, dv)), self._a(g, (n, hv)),
                self._a(beta, (n, hv)))

    def fd_gated_delta_rule_decode(self, out, q, k, v, g, beta, state, hk, hv, dk, dv, scale, stream):
        self.calls.append(("fd_gated_delta_rule_decode", (hk, hv, dk, dv, scale)))
        return self._prefill(out, q, k, v, g, beta, state, 1, hk, hv, dk, dv)

    def fd_gated_delta_rule_prefill(self, out, q, k, v, g, beta, state, n, hk, hv, dk, dv, scale, stream):
        self.calls.append(("fd_gated_delta_rule_prefill", (n, hk, hv, dk, dv, scale)))
        return self._prefill(out, q, k, v, g, beta, state, n, hk, hv, dk, dv)

    def _prefill(self, out, q, k, v, g, beta, state, n, hk, hv, dk, dv):
        memory = self._a(state, (hv, dk, dv))
        self._a(out, (n, hv, dv))[...] = delta_rule_recurrent(*self._qkvgb(q, k, v, g, beta, n, hk, hv, dk, dv),
                                                              memory)
        return 0

    def fd_gated_delta_rule_tree(self, out, q, k, v, g, beta, state, parents, node_state, n, hk, hv, dk, dv, scale,
                                 stream):
        self.calls.append(("fd_gated_delta_rule_tree", (n, hk, hv, dk, dv, scale)))
        self._a(out, (n, hv, dv))[...] = delta_rule_tree(*self._qkvgb(q, k, v, g, beta, n, hk, hv, dk, dv),
                                                         self._a(state, (hv, dk, dv)),
                                                         self._a(parents, (n,), np.int32),
                                                         self._a(node_state, (n, hv, dk, dv)))
        return 0


class RecurrentNative(HostNative):
    def __init__(self):
        super().__init__()
        self.lib = RecurrentLib(self.ffi)


@pytest.fixture
def ops():
    o = CudaOps(Device(RecurrentNative()))
    o.reserve_arena(1 << 20)
    o.begin_forward()
    return o


def delta_inputs(rng, n, hk, hv, dk, dv):
    q = rng.standard_normal((n, hk, dk)).astype(np.float32)
    k = rng.standard_normal((n, hk, dk)).astype(np.float32)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((n, hv, dv)).astype(np.float32)
    g = -rng.uniform(0.01, 0.5, (n, hv)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (n, hv)).astype(np.float32)
    state = (rng.standard_normal((hv, dk, dv)) * 0.1).astype(np.float32)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("n", [1, 5])
def test_gated_delta_rule_runs_decode_for_one_token_and_prefill_for_more(ops, n):
    host = delta_inputs(np.random.default_rng(n), n, 2, 6, 12, 20)      # d_k != d_v: swapped sizes would show
    dev = [ops.dev.upload(a) for a in host]
    out = ops.to_numpy(ops.gated_delta_rule(*dev))
    ref_state = host[5].copy()
    ref = delta_rule_recurrent(*host[:5], ref_state)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(ops.dev.download(dev[5]), ref_state)
    name, args = ops.dev.lib.calls[-1]
    assert name == ("fd_gated_delta_rule_decode" if n == 1 else "fd_gated_delta_rule_prefill")
    assert args[-5:] == (2, 6, 12, 20, delta_scale(20)) and delta_scale(20) == float(np.float32(1 / np.sqrt(20)))


def test_trees_reach_their_entry_points_with_the_header_order(ops):
    rng = np.random.default_rng(3)
    parents = np.array([-1, 0, 0, 1, -1, 3], np.int32)
    n, c, taps = 6, 10, 4
    x = rng.standard_normal((n, c)).astype(np.float32)
    w = rng.standard_normal((c, taps)).astype(np.float32)
    conv = rng.standard_normal((taps - 1, c)).astype(np.float32)
    node_conv = ops.dev.upload(np.zeros((n + 2, taps - 1, c), np.float32))      # larger than the tree: allowed
    y = ops.causal_conv1d_tree(ops.dev.upload(x), ops.dev.upload(w), ops.dev.upload(conv), ops.dev.upload(parents),
                               node_conv)
    ref_nodes = np.zeros((n, taps - 1, c), np.float32)
    np.testing.assert_array_equal(ops.to_numpy(y), causal_conv1d_tree(x, w, conv, parents, ref_nodes))
    np.testing.assert_array_equal(ops.dev.download(node_conv)[:n], ref_nodes)
    host = delta_inputs(rng, n, 1, 3, 8, 8)
    node_state = ops.dev.upload(np.zeros((n, 3, 8, 8), np.float32))
    out = ops.gated_delta_rule_tree(*[ops.dev.upload(a) for a in host], ops.dev.upload(parents), node_state)
    ref_states = np.zeros((n, 3, 8, 8), np.float32)
    np.testing.assert_array_equal(ops.to_numpy(out), delta_rule_tree(*host, parents, ref_states))
    np.testing.assert_array_equal(ops.dev.download(node_state), ref_states)


def test_causal_conv1d_takes_a_gguf_f32_weight_and_updates_the_state(ops):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 9)).astype(np.float32)      # n < K - 1: part of the old state stays, shifted
    w = rng.standard_normal((9, 4)).astype(np.float32)
    conv = rng.standard_normal((3, 9)).astype(np.float32)
    qw = QuantWeight(data=ops.dev.upload(w.view(np.uint8).reshape(-1)), qtype=0, rows=9, cols=4)
    d_conv = ops.dev.upload(conv)
    y = ops.causal_conv1d(ops.dev.upload(x), qw, d_conv)
    ref_conv = conv.copy()
    np.testing.assert_array_equal(ops.to_numpy(y), causal_conv1d(x, w, ref_conv))
    np.testing.assert_array_equal(ops.dev.download(d_conv), ref_conv)
    assert ops.dev.lib.calls == [("fd_causal_conv1d", (2, 9, 4))]


def _bad_delta_cases():
    """(what to change, exception) over the good inputs (n 3, Hk 2, Hv 4, d_k 8, d_v 6)."""
    return [
        ({"state": ((4, 6, 8), np.float32)}, ValueError),             # state transposed
        ({"v": ((3, 3, 6), np.float32), "g": ((3, 3), np.float32), "beta": ((3, 3), np.float32),
          "state": ((3, 8, 6), np.float32)}, ValueError),            # Hv 3 not a multiple of Hk 2
        ({"k": ((3, 2, 7), np.float32)}, ValueError),                 # k's head size differs from q's
        ({"g": ((2, 4), np.float32)}, ValueError),                    # fewer g rows than tokens
        ({"beta": ((3, 4), np.float64)}, TypeError),
        ({"q": ((3, 2, 300), np.float32), "k": ((3, 2, 300), np.float32),
          "state": ((4, 300, 6), np.float32)}, ValueError),          # d_k over FD_DELTA_MAX_DK
    ]


@pytest.mark.parametrize("change,error", _bad_delta_cases())
def test_bad_delta_rule_shapes_are_refused_before_the_abi(ops, change, error):
    shapes = {"q": (3, 2, 8), "k": (3, 2, 8), "v": (3, 4, 6), "g": (3, 4), "beta": (3, 4), "state": (4, 8, 6)}
    args = {name: ops.dev.empty(*change.get(name, (shape, np.float32))) for name, shape in shapes.items()}
    with pytest.raises(error):
        ops.gated_delta_rule(**args)
    parents = ops.dev.empty((3,), np.int32)
    with pytest.raises(error):
        ops.gated_delta_rule_tree(**args, parents=parents, node_state=ops.dev.empty((3, 4, 8, 6)))
    assert ops.dev.lib.calls == []


def test_bad_tree_buffers_and_decode_rows_are_refused_before_the_abi(ops):
    e = ops.dev.empty
    good = dict(q=e((3, 1, 8)), k=e((3, 1, 8)), v=e((3, 2, 8)), g=e((3, 2)), beta=e((3, 2)), state=e((2, 8, 8)))
    with pytest.raises(ValueError, match="node_state"):
        ops.gated_delta_rule_tree(**good, parents=e((3,), np.int32), node_state=e((2, 2, 8, 8)))   # one node short
    with pytest.raises(TypeError, match="int32"):
        ops.gated_delta_rule_tree(**good, parents=e((3,), np.float32), node_state=e((3, 2, 8, 8)))
    with pytest.raises(ValueError, match="parents"):
        ops.gated_delta_rule_tree(**good, parents=e((4,), np.int32), node_state=e((3, 2, 8, 8)))
    with pytest.raises(ValueError, match="one token"):
        ops.gated_delta_rule_decode(**good)
    assert ops.dev.lib.calls == []


def test_bad_conv_shapes_are_refused_before_the_abi(ops):
    e = ops.dev.empty
    x = e((5, 12))
    with pytest.raises(ValueError, match="taps"):
        ops.causal_conv1d(x, e((12, 9)), e((8, 12)))                  # K over FD_CONV_MAX_K
    with pytest.raises(ValueError, match="taps"):
        ops.causal_conv1d(x, e((12, 1)), e((0, 12)))                  # K 1: no state, not a short conv
    with pytest.raises(ValueError, match="channels"):
        ops.causal_conv1d(x, e((10, 4)), e((3, 12)))
    with pytest.raises(ValueError, match="conv_state"):
        ops.causal_conv1d(x, e((12, 4)), e((4, 12)))
    with pytest.raises(TypeError, match="GGML type"):
        ops.causal_conv1d(x, QuantWeight(data=e((34,), np.uint8), qtype=8, rows=12, cols=4), e((3, 12)))
    with pytest.raises(ValueError, match="node_conv"):
        ops.causal_conv1d_tree(x, e((12, 4)), e((3, 12)), e((5,), np.int32), e((5, 12, 3)))   # (n, C, K-1): transposed
    assert ops.dev.lib.calls == []
