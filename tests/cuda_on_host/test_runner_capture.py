"""CudaRunner._capture (backends/cuda/runner.py): the body runs between begin and end capture with Python's cyclic
garbage collector off -- a collection there could run an unreachable runner's or allocation's __del__, whose
cudaFree / synchronize invalidates the capture (seen on the GPU as status 901 at the next launch) -- and the
collector's state is restored afterwards, also when the body raises (end capture is still called)."""
import gc
import types

import pytest

from flashd.daemon.backends.cuda.runner import CudaRunner


class FakeLib:
    def __init__(self):
        self.calls = []

    def fd_graph_begin_capture(self, stream):
        self.calls.append(("begin", gc.isenabled()))
        return 0

    def fd_graph_end_capture(self, stream, out):
        self.calls.append(("end", gc.isenabled()))
        out[0] = 1234
        return 0


class FakeFfi:
    @staticmethod
    def new(ctype):
        return [None]


def fake_runner():
    lib = FakeLib()
    native = types.SimpleNamespace(check=lambda status, what: None)
    dev = types.SimpleNamespace(lib=lib, ffi=FakeFfi(), native=native, stream=None)
    return types.SimpleNamespace(dev=dev), lib


@pytest.mark.parametrize("enabled_before", [True, False])
def test_the_body_runs_with_the_collector_off_and_its_state_comes_back(enabled_before):
    was = gc.isenabled()
    (gc.enable if enabled_before else gc.disable)()
    try:
        runner, lib = fake_runner()
        seen = []
        graph, result = CudaRunner._capture(runner, lambda: seen.append(gc.isenabled()) or "logits")
        assert (graph, result) == (1234, "logits")
        assert seen == [False] and lib.calls == [("begin", False), ("end", False)]
        assert gc.isenabled() == enabled_before
    finally:
        (gc.enable if was else gc.disable)()


def test_a_failing_body_still_ends_the_capture_and_restores_the_collector():
    assert gc.isenabled()
    runner, lib = fake_runner()

    def body():
        raise RuntimeError("kernel launch failed")
    with pytest.raises(RuntimeError, match="kernel launch failed"):
        CudaRunner._capture(runner, body)
    assert [c[0] for c in lib.calls] == ["begin", "end"] and gc.isenabled()
