"""CudaOps.prefetch and the Device's concurrent branch (backends/cuda/ops.py, tensor.py, graphs.py) on a host stand-in
of the native library that logs the stream / event / prefetch calls: with the tuning's l2_prefetch_mlp on, a captured
forward forks a branch after the work queued so far (an event recorded on the main stream, the branch stream waiting
on it), asks fd_prefetch_l2 for the chosen MLP weights on the branch stream only, and graphs.capture joins the branch
before it ends the capture (also when the body fails); with the field 0, or outside a capture, nothing is queued.
The GPU side (the same tokens with and without the branch): tests/gpu/test_l2_prefetch.py."""
from __future__ import annotations

import types

import numpy as np
import pytest

from flashd.daemon.backends.cuda.graphs import capture
from flashd.daemon.backends.cuda.ops import CudaOps
from flashd.daemon.backends.cuda.tensor import Device
from tests.cuda_on_host.test_tree_capture_on_host import CopyingLib, CopyingNative

MAIN, BRANCH = 0x1000, 0x2000     # the two streams' handles
FORK_EVENT, JOIN_EVENT = 0x3000, 0x3001


class BranchLib(CopyingLib):
    """CopyingLib that hands out distinct stream / event handles, reports l2_prefetch_mlp = `mode` and logs the
    calls that build a branch."""

    def __init__(self, ffi, mode: int):
        super().__init__(ffi)
        self.mode, self.log = mode, []
        self._streams, self._events = [MAIN, BRANCH], [FORK_EVENT, JOIN_EVENT]

    def _h(self, p) -> int:
        return int(self.ffi.cast("uintptr_t", p))

    def fd_stream_create(self, out):
        out[0] = self.ffi.cast("void*", self._streams.pop(0))
        return 0

    def fd_event_create(self, out, with_timing):
        out[0] = self.ffi.cast("void*", self._events.pop(0))
        return 0

    def fd_tuning_get(self, out):
        out.l2_prefetch_mlp = self.mode
        return 0

    def fd_event_record(self, event, stream):
        self.log.append(("record", self._h(event), self._h(stream)))
        return 0

    def fd_stream_wait_event(self, stream, event):
        self.log.append(("wait", self._h(stream), self._h(event)))
        return 0

    def fd_prefetch_l2(self, ptr, n_bytes, stream):
        self.log.append(("prefetch", self._h(ptr), int(n_bytes), self._h(stream)))
        return 0

    def fd_graph_end_capture(self, stream, out):
        self.log.append(("end",))
        return super().fd_graph_end_capture(stream, out)


class BranchNative(CopyingNative):
    def __init__(self, mode: int):
        super().__init__()
        self.lib = BranchLib(self.ffi, mode)


def setup(mode: int):
    dev = Device(BranchNative(mode))
    ops = CudaOps(dev)
    ops.reserve_arena(1 << 12)
    mlp = tuple(types.SimpleNamespace(data=dev.empty((n,), np.uint8)) for n in (96, 96, 160))   # gate, up, down
    ops.begin_forward()                  # the eager run before a capture: the branch's stream and events are made here
    return dev, ops, mlp, dev.lib


def addr(w) -> int:
    return int(w.data.ptr)


@pytest.mark.parametrize("mode, chosen", [(1, (0, 1)), (2, (2,)), (3, (0, 1, 2))])
def test_a_captured_forward_forks_a_branch_that_prefetches_and_rejoins(mode, chosen):
    dev, ops, mlp, lib = setup(mode)

    def body():
        ops.begin_forward()
        ops.prefetch(mlp)
        return "logits"

    graph, result = capture(dev, body)
    assert result == "logits"
    want = [("record", FORK_EVENT, MAIN), ("wait", BRANCH, FORK_EVENT)]
    want += [("prefetch", addr(mlp[i]), mlp[i].data.nbytes, BRANCH) for i in chosen]
    want += [("record", JOIN_EVENT, BRANCH), ("wait", MAIN, JOIN_EVENT), ("end",)]
    assert lib.log == want


def test_two_layers_fork_twice_and_join_once():
    dev, ops, mlp, lib = setup(1)

    def body():
        ops.begin_forward()
        ops.prefetch(mlp)
        ops.prefetch(mlp)

    capture(dev, body)
    assert [e[0] for e in lib.log] == ["record", "wait", "prefetch", "prefetch", "record", "wait", "prefetch",
                                       "prefetch", "record", "wait", "end"]
    assert lib.log[-3:-1] == [("record", JOIN_EVENT, BRANCH), ("wait", MAIN, JOIN_EVENT)]


def test_no_branch_without_the_tuning_or_outside_a_capture():
    dev, ops, mlp, lib = setup(0)
    capture(dev, lambda: (ops.begin_forward(), ops.prefetch(mlp)))
    assert lib.log == [("end",)]
    dev, ops, mlp, lib = setup(3)
    ops.prefetch(mlp)                    # eager: nothing queued (no join would follow it)
    assert lib.log == []


def test_a_failing_body_still_joins_before_the_capture_ends():
    dev, ops, mlp, lib = setup(1)

    def body():
        ops.begin_forward()
        ops.prefetch(mlp)
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError, match="launch failed"):
        capture(dev, body)
    assert lib.log[-3:] == [("record", JOIN_EVENT, BRANCH), ("wait", MAIN, JOIN_EVENT), ("end",)]
    assert not dev.capturing


def test_a_capture_before_any_eager_forward_makes_no_branch():
    """The branch's stream is made outside a capture only; a capture that comes first runs without it."""
    dev = Device(BranchNative(1))
    ops = CudaOps(dev)
    ops.reserve_arena(1 << 12)
    mlp = tuple(types.SimpleNamespace(data=dev.empty((64,), np.uint8)) for _ in range(3))
    capture(dev, lambda: (ops.begin_forward(), ops.prefetch(mlp)))
    assert dev.lib.log == [("end",)]
