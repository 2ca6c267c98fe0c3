"""CudaRunner's verify with device-resident features (forward_tree(capture=...) -> _tree_body) over the host
stand-in of the native library, with a stand-in persistent forward: which layers each launch captures, and
which rows of runner.tree_features each group's captured rows land in (a tree larger than a launch goes
through in groups of max_rows rows at row0 = 0, max_rows, ...); a sink that names its layers still gets its
own layers only. The kernels themselves are the GPU's: tests/gpu/test_tree_capture_gpu.py."""
from __future__ import annotations

import types
from collections import OrderedDict

import numpy as np
import pytest

from flashd.daemon.backends.cuda.runner import CudaRunner
from flashd.daemon.backends.cuda.tree_inputs import tree_input_words
from flashd.daemon.backends.cuda.tensor import Arena, Device
from tests.cuda_on_host.test_cuda_kv_prefix_on_host import HostMemoryLib, HostNative

HIDDEN, VOCAB, N_LAYERS, MAX_ROWS = 8, 16, 4, 4


class CopyingLib(HostMemoryLib):
    """HostMemoryLib plus device-to-device copies and graph calls (a "graph" runs nothing: the launches
    are counted; capture just returns a new handle)."""

    def __init__(self, ffi):
        super().__init__(ffi)
        self.graphs, self.launched = 0, []

    def fd_memcpy_d2d(self, dst, src, n_bytes, stream):
        return self.fd_memcpy_h2d(dst, src, n_bytes, stream)

    def fd_graph_begin_capture(self, stream):
        return 0

    def fd_graph_end_capture(self, stream, out):
        self.graphs += 1
        out[0] = self.ffi.cast("void*", self.graphs)
        return 0

    def fd_graph_launch(self, graph, stream):
        self.launched.append(int(self.ffi.cast("uintptr_t", graph)))
        return 0


class CopyingNative(HostNative):
    def __init__(self):
        super().__init__()
        self.lib = CopyingLib(self.ffi)


class FakePersistent:
    """PersistentForward's interface: each launch writes value 1000 * layer + (row0 + r) into row r of each
    captured layer's rows and records (row0, n, captured layers)."""

    max_rows = MAX_ROWS

    def __init__(self, dev):
        self.dev, self.launches = dev, []
        self.capture = dev.empty((N_LAYERS * MAX_ROWS, HIDDEN), np.float32)
        self.logits = dev.empty((MAX_ROWS, VOCAB), np.float32)

    def forward(self, ids, positions, n_past, *, mask=None, mask_n=0, row0=0, argmax=None, capture=None):
        n = ids.shape[0]
        self.launches.append((row0, n, frozenset(capture or ())))
        for layer in capture or ():
            rows = np.repeat(1000.0 * layer + row0 + np.arange(n, dtype=np.float32)[:, None], HIDDEN, 1)
            self.dev.upload(rows.astype(np.float32), out=self.captured(layer, n))
        self.dev.upload(np.full((n, VOCAB), row0, np.float32), out=self.logits[:n])
        return self.logits[:n]

    def captured(self, layer, n):
        return self.capture[layer * MAX_ROWS:layer * MAX_ROWS + n]


def host_runner() -> CudaRunner:
    dev = Device(CopyingNative())
    arena = Arena(dev, 1 << 16)
    ops = types.SimpleNamespace(begin_forward=lambda row_invariant=False: arena.reset(),
                                materialize=lambda t: t, take=lambda shape: arena.take(tuple(shape)))
    run = CudaRunner.__new__(CudaRunner)         # the attributes _tree_body reads, no native forward
    run.ops, run.dev, run.persistent = ops, dev, FakePersistent(dev)
    run.cfg = types.SimpleNamespace(hidden=HIDDEN, vocab_size=VOCAB, n_layers=N_LAYERS)
    run.prefill_chunk, run._tree_features, run.tree_graphs = 64, {}, OrderedDict()
    run.tree_nodes_cap, run._tree_slots = None, 64      # max_tree_nodes: the chunk's 64 (no configured cap)
    run.n_past, run.max_ctx, run._prefix, run._state_prefix = 5, 256, [], False
    run._t_inputs = dev.empty((tree_input_words(64),), np.int32)
    t = dev.empty((64,), np.int32)
    run.t_ids, run.t_pos, run.t_n_past, run.t_mask = t, t, t[:1], dev.empty((64 * 64,), np.uint8)
    return run


def expected(layer: int, n: int) -> np.ndarray:
    return np.repeat(1000.0 * layer + np.arange(n, dtype=np.float32)[:, None], HIDDEN, 1)


def test_groups_land_at_their_rows_of_the_feature_buffers():
    run = host_runner()
    capture = (3, 1)
    logits = run._tree_body(10, None, capture)
    assert [(r0, n) for r0, n, _ in run.persistent.launches] == [(0, 4), (4, 4), (8, 2)]
    assert all(layers == {1, 3} for _, _, layers in run.persistent.launches)
    bufs = run.tree_features(capture)
    assert len(bufs) == 2 and bufs[0].shape == (run.max_tree_nodes, HIDDEN)
    for j, layer in enumerate(capture):
        np.testing.assert_array_equal(run.dev.download(bufs[j])[:10], expected(layer, 10))
    np.testing.assert_array_equal(run.dev.download(logits)[:, 0], [0] * 4 + [4] * 4 + [8] * 2)


def test_a_sink_gets_its_own_layers_and_the_capture_the_others():
    run = host_runner()
    seen: dict[int, list] = {}

    def sink(layer, h):
        seen.setdefault(layer, []).append(run.dev.download(h))
    sink.layers = frozenset({2})
    run._tree_body(6, sink, (0,))
    assert all(layers == {0, 2} for _, _, layers in run.persistent.launches)
    assert sorted(seen) == [2]
    np.testing.assert_array_equal(np.concatenate(seen[2]), expected(2, 6))
    np.testing.assert_array_equal(run.dev.download(run.tree_features((0,))[0])[:6], expected(0, 6))


def test_no_capture_no_copies():
    run = host_runner()
    run._tree_body(3)
    assert run.persistent.launches == [(0, 3, frozenset())] and run._tree_features == {}


def test_forward_tree_replays_one_graph_per_size_and_layers():
    run = host_runner()
    lib = run.dev.lib
    chain = (np.arange(5), np.arange(5, 10), np.tril(np.ones((5, 5), np.uint8)))
    run.forward_tree(*chain, capture=(3, 1))              # captured (an eager run first), then launched
    run.forward_tree(*chain, capture=(3, 1))              # replayed
    run.forward_tree(*chain)                              # another graph: no capture
    assert list(run.tree_graphs) == [(5, (3, 1), 0), (5, (), 0)] and lib.graphs == 2   # max_keys 0: persistent
    assert lib.launched == [1, 1, 2]
    def sink(layer, h):
        pass
    sink.layers = frozenset({0})
    run.forward_tree(*chain, hidden_sink=sink, capture=(3, 1))    # a host sink: eager
    assert lib.launched == [1, 1, 2] and lib.graphs == 2
    with pytest.raises(ValueError, match="capture layers"):
        run.forward_tree(*chain, capture=(4,))
    assert run.n_past == 5
