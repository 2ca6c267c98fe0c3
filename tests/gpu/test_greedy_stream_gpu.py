"""CudaRunner.greedy_stream (spec=auto's plain steps, streamed with steps in flight as plain decoding streams) gives
greedy_continue's tokens and leaves its context, across the ring's wrap (64 entries) and with a fed chain whose
replays' ring entries are skipped; a consumer that stops early leaves the context holding exactly what was forwarded
(the read tokens and the steps already in flight), from which decoding goes on as if nothing had been cut."""
import pytest

from flashd.daemon.backends.cuda.runner import PIPELINE_DEPTH, RING_LEN
from flashd.protocol.messages import SamplingParams
from tests.gpu.test_forward import cuda_runner

MODEL = dict(arch="qwen2", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab_size=500, seed=11,
             weight_type="Q8_0", name="greedy-stream")
PROMPT = [3, 17, 42, 7, 99, 5, 250, 31]


@pytest.fixture(scope="module")
def run(native, synthetic_model):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    return cuda_runner(CudaBackend(), synthetic_model(**MODEL), "graph", max_ctx=512, chunk=64)


def continue_in_parts(run, feed, n_new, part=30):
    """greedy_continue's tokens for any n_new (it holds at most one ring of them): parts chained on their last token,
    as spec=auto's bursts were."""
    out = run.greedy_continue(feed, min(part, n_new))
    while len(out) < n_new:
        out += run.greedy_continue([out[-1]], min(part, n_new - len(out)))
    return out


def _fresh(run):
    run.reset()
    run.prefill(PROMPT)
    return run.n_past


@pytest.mark.parametrize("feed, n_new", [([5], 1), ([5], 100), ([5, 6, 7], 70)], ids=["one", "wrap", "feed3"])
def test_stream_equals_continue(run, feed, n_new):
    assert n_new < 8 or len(feed) - 1 + n_new > RING_LEN          # the long cases wrap the ring
    _fresh(run)
    want = continue_in_parts(run, feed, n_new)
    n_after = run.n_past
    _fresh(run)
    got = list(run.greedy_stream(feed, n_new))
    assert got == want and run.n_past == n_after
    # the context is the same too: the next token is the same
    assert run.greedy_continue([got[-1]], 3) == run_continue_from(run, feed, want, 3)


def run_continue_from(run, feed, want, k):
    _fresh(run)
    continue_in_parts(run, feed, len(want))
    return run.greedy_continue([want[-1]], k)


def test_early_stop_leaves_what_was_forwarded(run):
    n0 = _fresh(run)
    want = run.greedy_continue([5], 40)
    _fresh(run)
    it = run.greedy_stream([5], 40)
    got = [next(it) for _ in range(10)]
    it.close()
    assert got == want[:10]
    # reading token 9 had replays 0 .. 9 + PIPELINE_DEPTH - 1 launched: the root and tokens 0 .. 10 - 2 + depth
    launched = min(40, 9 + PIPELINE_DEPTH)
    assert run.n_past == n0 + launched
    # decoding goes on from the first token not yet forwarded
    assert run.greedy_continue([want[launched - 1]], 5) == want[launched:launched + 5]
    # and a plain request after it is unaffected
    a = [s.token for s in run.generate(PROMPT, SamplingParams(), 12)]
    _fresh(run)
    assert a == [s.token for s in run.generate(PROMPT, SamplingParams(), 12)]


def test_the_shallow_graph_gives_the_deep_graphs_tokens(run, monkeypatch):
    """The decode graph for a context's first keys (runner.py: attention bounded by max_keys, one split and no
    combine) and the deep one agree token for token across the switch: greedy_stream and generate from a short
    prompt past shallow_keys (256 of the 512 slots), then the same with the shallow graph off."""
    bound = run.shallow_keys()
    assert 0 < bound < run.max_ctx - 64
    n_new = bound + 40 - len(PROMPT)
    _fresh(run)
    got = list(run.greedy_stream([5], n_new))
    gen = [s.token for s in run.generate(PROMPT, SamplingParams(), n_new)]
    assert (None, bound) in run.graphs
    monkeypatch.setattr(run, "shallow_keys", lambda: 0)
    _fresh(run)
    assert list(run.greedy_stream([5], n_new)) == got
    assert [s.token for s in run.generate(PROMPT, SamplingParams(), n_new)] == gen
