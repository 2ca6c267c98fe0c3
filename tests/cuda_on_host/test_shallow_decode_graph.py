"""CudaRunner's two decode graphs (backends/cuda/runner.py): a replay whose row sees at most `shallow_keys` keys
runs the shallow graph (captured with the attention shapes' max_keys bound: one split, no combine -- the same bits
only while the bound holds, flashd_attention.h), every other replay the deep one. The host picks per replay from
the position it knows, so these tests replay greedy_stream, greedy_continue and generate on fakes that track the
device's position as the graph would (forward at pos, then advance) and check every replay's graph against the
keys its row really sees (pos + 1): one key past the bound on the shallow graph would silently leave decode's
reduction order."""
import types
from collections import OrderedDict

import numpy as np
import pytest

from flashd.daemon.backends.cuda import runner as runner_mod
from flashd.daemon.backends.cuda.attention_ops import DECODE_CHUNK_SLOTS
from flashd.daemon.backends.cuda.decode_step import MAX_CACHED_GRAPHS
from flashd.daemon.backends.cuda.runner import CudaRunner
from flashd.protocol.messages import SamplingParams

SINGLE_CHUNKS = 4
BOUND = DECODE_CHUNK_SLOTS * SINGLE_CHUNKS


class FakeRunner(CudaRunner):
    """Only the host-side decode loop: the graph is a name, a replay forwards the device position and advances."""

    def __init__(self, max_ctx: int = 4096, persistent=None):   # noqa: the GPU state is not built
        self.launches = []                 # (graph name, position forwarded)
        self.pos = 0
        self.bodies = []                   # ops.attention_max_keys seen while each captured body's forward ran
        self.ops = types.SimpleNamespace(attention_max_keys=0, begin_forward=lambda: None)
        lib = types.SimpleNamespace(fd_graph_launch=self._launch, fd_event_record=lambda e, s: 0,
                                    fd_event_synchronize=lambda e: 0, fd_graph_destroy=lambda g: None)
        native = types.SimpleNamespace(check=lambda status, what: None,
                                       tuning=lambda: {"attn_single_chunks": SINGLE_CHUNKS})
        self.dev = types.SimpleNamespace(lib=lib, native=native, stream=None, synchronize=lambda: None,
                                         upload_staged=lambda a, t: None, upload=lambda a, out=None: None)
        self.persistent = persistent
        self.graphs = OrderedDict()
        self.events = list(range(runner_mod.RING_LEN))
        self.ring = np.ones(runner_mod.RING_LEN, np.int32)
        self.n_past, self.max_ctx, self.prefill_chunk = 0, max_ctx, 512
        self.history = np.zeros(max_ctx, np.int32)
        self.tok = self.n_past_dev = None

    # the device, faked
    def _launch(self, graph, stream):
        self.launches.append((graph, self.pos))
        self.pos += 1
        return 0

    def _capture(self, body):   # a capture records the launches, it runs nothing: the position stays
        pos = self.pos
        body()
        self.pos = pos
        return f"graph{len(self.graphs)}", None

    def _step_forward(self, batch):
        self.bodies.append(self.ops.attention_max_keys)
        return None

    def _select(self, logits, params):
        pass

    def _advance(self):
        self.pos += 1

    def _set_state(self, n_past, n_history, tok=0):
        self.pos = n_past

    def _overwrite_from(self, n):
        pass

    def _forward_device(self, ids, all_logits=False):
        return None

    def _prefill_prompt(self, prompt):
        return None

    # what the test checks
    def kinds(self):
        """Per replay: (keys its row saw, whether it ran the shallow graph)."""
        shallow = self.graphs.get((None, BOUND))
        return [(pos + 1, graph == shallow) for graph, pos in self.launches]


def test_shallow_keys_follow_the_tuning_and_the_persistent_forward_has_none():
    assert FakeRunner().shallow_keys() == BOUND
    assert FakeRunner(persistent=object()).shallow_keys() == 0


def test_each_graph_body_runs_with_its_bound_and_the_ops_are_left_unbounded():
    r = FakeRunner()
    choose = r._decode_graphs(None, 1)
    assert r.bodies == [0, BOUND] and r.ops.attention_max_keys == 0
    assert choose(BOUND) == r.graphs[(None, BOUND)] and choose(BOUND + 1) == r.graphs[(None, 0)]
    assert r.graphs[(None, BOUND)] != r.graphs[(None, 0)]


def test_a_failing_body_still_unbinds_the_ops():
    r = FakeRunner()

    def fail(batch):
        raise RuntimeError("launch failed")
    r._step_forward = fail
    with pytest.raises(RuntimeError):
        r._graph(None, BOUND)
    assert r.ops.attention_max_keys == 0


def test_a_run_that_starts_past_the_bound_captures_no_shallow_graph():
    r = FakeRunner()
    r._decode_graphs(None, BOUND + 1)
    assert list(r.graphs) == [(None, 0)]


@pytest.mark.parametrize("n0, feed", [(0, [5]), (250, [5, 6, 7]), (BOUND - 1, [5]), (BOUND, [5, 6]), (700, [5])])
def test_greedy_stream_runs_each_replay_on_the_graph_its_keys_allow(n0, feed):
    r = FakeRunner()
    r.n_past = n0
    assert len(list(r.greedy_stream(feed, 20))) == 20
    kinds = r.kinds()
    assert len(kinds) == len(feed) - 1 + 20 and kinds[0][0] == n0 + 1
    assert all(shallow == (keys <= BOUND) for keys, shallow in kinds), kinds


@pytest.mark.parametrize("n0, feed_len", [(0, 3), (240, 8), (100, 150), (BOUND - 20, 9)])
def test_greedy_continue_short_and_long_feeds(n0, feed_len):
    r = FakeRunner()
    r.n_past = n0
    r.greedy_continue(list(range(1, feed_len + 1)), 30)
    kinds = r.kinds()
    assert kinds and all(shallow == (keys <= BOUND) for keys, shallow in kinds), kinds
    assert any(shallow for _, shallow in kinds) == (kinds[0][0] <= BOUND)


@pytest.mark.parametrize("n_prompt", [1, 200, BOUND, BOUND + 5])
def test_generate_replays_from_the_prompts_end(n_prompt):
    r = FakeRunner()
    out = list(r.generate(list(range(1, n_prompt + 1)), SamplingParams(), 60))
    assert len(out) == 60
    kinds = r.kinds()
    assert kinds[0][0] == n_prompt + 1            # the first replay forwards the prefill's token at slot n_prompt
    assert all(shallow == (keys <= BOUND) for keys, shallow in kinds), kinds


def test_the_graph_cache_evicts_past_its_size_even_with_greedy_graphs_only():
    """Greedy graphs of many bounds (the tuning's attn_single_chunks changed between runs) past MAX_CACHED_GRAPHS:
    the least recently used one goes, never the deep greedy graph (a cache of greedy keys alone once had nothing it
    would evict)."""
    r = FakeRunner()
    deep = r._graph(None)
    for bound in range(64, 64 * (MAX_CACHED_GRAPHS + 3), 64):
        r._graph(None, bound)
    assert len(r.graphs) == MAX_CACHED_GRAPHS and r.graphs[(None, 0)] == deep
