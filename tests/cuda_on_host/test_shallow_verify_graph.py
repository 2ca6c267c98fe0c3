"""CudaRunner's shallow verify graphs (runner.py _tree_graph): a tree whose rows all see at most shallow_keys() keys
-- the committed n_past plus the tree's n rows -- replays a graph captured with the attention shapes' max_keys bound
(one split, no combine: the same bits only while the bound holds, flashd_attention.h); any other tree the deep one.
Checked on a fake device: the graph chosen for every (n_past, n) against the keys the rows can see, the bound the
captured body's forward ran under, and that the bound is lifted after the body (the next decode or prefill forward
plans for max_ctx). One key past the bound on a shallow graph would silently leave the verify's reduction order."""
import types
from collections import OrderedDict

import pytest

from flashd.daemon.backends.cuda.attention_ops import DECODE_CHUNK_SLOTS
from flashd.daemon.backends.cuda.runner import CudaRunner

SINGLE_CHUNKS = 4
BOUND = DECODE_CHUNK_SLOTS * SINGLE_CHUNKS


class FakeRunner(CudaRunner):
    """Only the host side of _tree_graph: a capture records the bound its body's forward ran under."""

    def __init__(self, persistent=None):   # noqa: the GPU state is not built
        self.ops = types.SimpleNamespace(attention_max_keys=0, begin_forward=lambda row_invariant=False: None)
        lib = types.SimpleNamespace(fd_graph_destroy=lambda g: None)
        native = types.SimpleNamespace(tuning=lambda: {"attn_single_chunks": SINGLE_CHUNKS})
        self.dev = types.SimpleNamespace(lib=lib, native=native, synchronize=lambda: None)
        self.persistent = persistent
        self.tree_graphs = OrderedDict()
        self.n_past = 0
        self.bodies = []      # ops.attention_max_keys during each body's forward (eager and captured)

    def _tree_rows(self, n, hidden_sink, capture):
        self.bodies.append(self.ops.attention_max_keys)
        return f"logits{n}"

    def _capture(self, body):
        return f"graph{len(self.tree_graphs)}", body()


@pytest.mark.parametrize("n_past,n", [(0, 1), (0, 8), (200, 56), (200, 57), (BOUND - 1, 1), (BOUND, 1), (BOUND - 7, 8),
                                      (BOUND - 6, 8), (5000, 23)])
def test_a_tree_replays_the_shallow_graph_only_while_every_row_fits_the_bound(n_past, n):
    run = FakeRunner()
    run.n_past = n_past
    run._tree_graph(n)
    ((key_n, capture, max_keys),) = run.tree_graphs
    assert (key_n, capture) == (n, ())
    assert max_keys == (BOUND if n_past + n <= BOUND else 0)
    assert run.bodies == [max_keys, max_keys]         # the eager first use and the capture ran under the same bound
    assert run.ops.attention_max_keys == 0             # lifted after the body


def test_shallow_and_deep_graphs_of_one_size_are_kept_apart_and_reused():
    run = FakeRunner()
    run.n_past = 10
    shallow = run._tree_graph(8)
    run.n_past = BOUND
    deep = run._tree_graph(8)
    run.n_past = 20
    again = run._tree_graph(8)
    assert shallow != deep and again == shallow
    assert list(run.tree_graphs) == [(8, (), 0), (8, (), BOUND)]   # the shallow one most recently used
    assert run.bodies == [BOUND, BOUND, 0, 0]           # two captures, the replay ran no body


def test_the_persistent_forward_plans_its_own_attention():
    run = FakeRunner(persistent=object())
    run._tree_graph(8)
    assert list(run.tree_graphs) == [(8, (), 0)] and run.bodies == [0, 0]


def test_the_bound_is_lifted_when_the_forward_raises():
    run = FakeRunner()

    def boom(n, hidden_sink, capture):
        assert run.ops.attention_max_keys == BOUND
        raise RuntimeError("forward failed")
    run._tree_rows = boom
    with pytest.raises(RuntimeError):
        run._tree_body(4, None, (), BOUND)
    assert run.ops.attention_max_keys == 0
