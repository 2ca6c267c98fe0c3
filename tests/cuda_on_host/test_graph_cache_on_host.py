"""GraphCache (backends/cuda/graphs.py) over the host stand-in of the native library: the first call with a key
runs the body eagerly, then captures it (with the garbage collector off) and launches the graph; later calls
launch only and return the same result; the least recently used graph is destroyed past the capacity; and a
moved arena, weight scratch or attention workspace drops every graph (the next call captures again).
forward_replay picks GraphCache for CudaOps and EagerReplay for the reference backend. The graphs' kernels are
the GPU's: tests/gpu/test_dflash_replay_gpu.py."""
from __future__ import annotations

import gc

import pytest

from flashd.daemon.backends.cuda.graphs import GraphCache, memory_token
from flashd.daemon.backends.cuda.ops import CudaOps
from flashd.daemon.backends.cuda.tensor import Device
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.speculative.replay import EagerReplay, forward_replay
from tests.cuda_on_host.test_tree_capture_on_host import CopyingLib, CopyingNative


class GraphLib(CopyingLib):
    """CopyingLib plus fd_graph_destroy (recorded) and a log of capture begin / end."""

    def __init__(self, ffi):
        super().__init__(ffi)
        self.destroyed, self.log = [], []

    def fd_graph_begin_capture(self, stream):
        self.log.append(("begin", gc.isenabled()))
        return 0

    def fd_graph_end_capture(self, stream, out):
        self.log.append(("end", gc.isenabled()))
        return super().fd_graph_end_capture(stream, out)

    def fd_graph_destroy(self, graph):
        self.destroyed.append(int(self.ffi.cast("uintptr_t", graph)))
        return 0


class GraphNative(CopyingNative):
    def __init__(self):
        super().__init__()
        self.lib = GraphLib(self.ffi)


def make_ops() -> CudaOps:
    ops = CudaOps(Device(GraphNative()))
    ops.reserve_arena(1 << 12)
    return ops


def test_captured_once_then_replayed():
    ops = make_ops()
    lib = ops.dev.lib
    cache = GraphCache(ops)
    runs = []

    def body():
        runs.append(gc.isenabled())
        return "logits"
    assert cache.run("block", body) == "logits"
    assert runs == [True, False]                       # eager first, then inside the capture (collector off)
    assert [c[0] for c in lib.log] == ["begin", "end"] and lib.launched == [1]
    assert cache.run("block", body) == "logits"
    assert len(runs) == 2 and lib.launched == [1, 1]   # replayed: the body's host code does not run again
    assert (cache.captures, cache.replays, len(cache)) == (1, 2, 1)


def test_least_recently_used_graph_is_destroyed_past_capacity():
    ops = make_ops()
    lib = ops.dev.lib
    cache = GraphCache(ops, capacity=2)
    for key in ("a", "b", "a", "c"):                    # "b" is the least recently used when "c" comes
        cache.run(key, lambda: None)
    assert lib.destroyed == [2] and len(cache) == 2
    cache.run("a", lambda: None)
    assert cache.captures == 3                          # "a" stayed
    cache.clear()
    assert sorted(lib.destroyed) == [1, 2, 3] and len(cache) == 0
    with pytest.raises(ValueError):
        GraphCache(ops, capacity=0)


def test_moved_shared_buffers_drop_every_graph():
    ops = make_ops()
    lib = ops.dev.lib
    cache = GraphCache(ops)
    cache.run("block", lambda: None)
    token = memory_token(ops)
    ops.reserve_arena(1 << 10)                          # no larger: the same arena, the graph stays
    assert memory_token(ops) == token
    cache.run("block", lambda: None)
    assert cache.captures == 1
    ops.reserve_arena(1 << 14)                          # a new arena: the graph pointed into the old one
    assert memory_token(ops) != token
    cache.run("block", lambda: None)
    assert cache.captures == 2 and lib.destroyed == [1]
    ops.reserve_scratch(64)                             # so does new weight scratch
    cache.run("block", lambda: None)
    assert cache.captures == 3 and lib.destroyed == [1, 2]


def test_a_failing_body_leaves_no_graph():
    ops = make_ops()
    cache = GraphCache(ops)

    def body():
        raise RuntimeError("kernel launch failed")
    with pytest.raises(RuntimeError, match="kernel launch failed"):
        cache.run("block", body)
    assert len(cache) == 0 and ops.dev.lib.launched == [] and gc.isenabled()


def test_forward_replay_per_backend():
    assert isinstance(forward_replay(make_ops()), GraphCache)
    eager = forward_replay(ReferenceOps())
    assert isinstance(eager, EagerReplay)
    assert eager.run("block", lambda: 7) == 7 and len(eager) == 0
