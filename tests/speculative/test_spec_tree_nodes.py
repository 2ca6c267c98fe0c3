"""The target's tree node count as configuration (runner.py max_tree_nodes, EngineConfig.max_tree_nodes), on the
reference backend with the tiny synthetic qwen35 of the spec tests: the runner and its hybrid cache follow the
argument, a verify forward never takes more nodes, DDTree budgets are clamped to it (drafter_set.py), speculative
decoding stays token for token plain greedy decoding with a small count, and a model loaded only as a draft model
(max_tree_nodes 0: speculative/draft_model.py DRAFT_TREE_NODES) drafts without ever holding a node state."""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends import ReferenceBackend
from flashd.daemon.drafter_set import DrafterSet
from flashd.daemon.runner import ModelRunner
from flashd.daemon.speculative.draft_model import DRAFT_TREE_NODES, DraftModelDrafter
from flashd.daemon.speculative.ngram import NgramConfig, NgramDrafter
from flashd.protocol import messages as m
from flashd.protocol.errors import ProtocolError

from tests.speculative.spec_drafters import OracleDrafter, plain, spec
from tests.speculative.spec_models import DRAFT, HYBRID_DRAFT, HYBRID_TARGET, TARGET

N_GEN = 24
PROMPTS = [[5, 9, 77, 12, 5, 9, 77, 12, 100, 200], list(range(260, 300))]


@pytest.fixture(scope="module")
def runner_with(make_runner, synthetic_model):
    """A runner of `fields` made as make_runner's, with a max_tree_nodes argument."""
    def make(fields, max_tree_nodes, prefill_chunk=16):
        base = make_runner(fields, prefill_chunk=prefill_chunk)        # loads (and caches) the weights
        return ModelRunner(base.ops, base.cfg, base.weights, 256, prefill_chunk, max_tree_nodes=max_tree_nodes)
    return make


def test_the_runner_and_the_hybrid_cache_follow_the_argument(runner_with):
    assert runner_with(HYBRID_TARGET, None).max_tree_nodes == 16              # the chunk bounds it
    assert runner_with(HYBRID_TARGET, None, prefill_chunk=512).max_tree_nodes == 65   # MAX_TREE_NODES
    assert runner_with(HYBRID_TARGET, 100, prefill_chunk=512).max_tree_nodes == 100   # the reference's only bound
    small = runner_with(HYBRID_TARGET, 5)
    assert small.max_tree_nodes == small.cache.max_tree_nodes == 5
    assert runner_with(TARGET, 7).max_tree_nodes == 7 and runner_with(TARGET, None).max_tree_nodes == 16
    with pytest.raises(ValueError, match="max_tree_nodes"):
        runner_with(HYBRID_TARGET, -1)


def test_a_verify_forward_past_the_count_is_refused(runner_with):
    runner = runner_with(HYBRID_TARGET, 5)
    runner.start([1, 2, 3])
    n = 6
    with pytest.raises(ValueError, match="6 nodes"):
        runner.forward_tree(list(range(n)), runner.n_past + np.arange(n), np.tril(np.ones((n, n), bool)))
    runner.forward_tree(list(range(5)), runner.n_past + np.arange(5), np.tril(np.ones((5, 5), bool)))
    assert runner.cache.state.node_conv.shape[1] == 5          # the node buffers: 5 states, no more


def test_ddtree_budgets_are_clamped_to_the_count(runner_with):
    runner = runner_with(HYBRID_TARGET, 5)
    drafters = DrafterSet(ReferenceBackend())
    drafter = NgramDrafter(NgramConfig(min_ngram=1))
    dec = drafters.spec_decoder(m.Generate(id="g", ids=[1, 2], spec="ddtree"), runner, drafter)
    assert dec.config.budget == 4                                # the default (22) clamped to 5 - 1
    assert drafters.spec_decoder(m.Generate(id="g", ids=[1, 2], spec="ddtree", budget=3), runner,
                                 drafter).config.budget == 3
    with pytest.raises(ProtocolError, match="max_tree_nodes is 5"):
        drafters.spec_decoder(m.Generate(id="g", ids=[1, 2], spec="ddtree", budget=5), runner, drafter)


@pytest.mark.parametrize("mode,budget", [("chain", 6), ("ddtree", 12)])
def test_spec_equals_plain_with_a_small_count(runner_with, mode, budget):
    """A budget larger than the count: the decoder's trees stay within max_tree_nodes, the output is plain's."""
    target = runner_with(HYBRID_TARGET, 4)
    accepted = 0
    for i, prompt in enumerate(PROMPTS):
        want = [s.token for s in plain(target, prompt, N_GEN)]
        got, stats = spec(target, OracleDrafter(want, HYBRID_TARGET["vocab_size"], seed=i), mode, budget, prompt,
                          N_GEN)
        assert [s.token for s in got] == want
        assert max(i for i, n in enumerate(stats.histogram) if n) <= 3       # at most 3 drafted nodes accepted
        assert stats.drafted_nodes <= 3 * stats.steps
        assert target.cache.state.node_conv.shape[1] <= 4
        accepted += stats.accepted
    assert accepted > 0, "nothing accepted: no path was committed"


@pytest.mark.parametrize("draft", [HYBRID_DRAFT, DRAFT])
def test_a_draft_model_runner_verifies_nothing_and_holds_no_node_state(runner_with, draft):
    target = runner_with(HYBRID_TARGET, None)
    drafter_runner = runner_with(draft, DRAFT_TREE_NODES)
    assert drafter_runner.max_tree_nodes == 0
    with pytest.raises(ValueError, match="1 nodes"):
        drafter_runner.forward_tree([1], [0], np.ones((1, 1), bool))
    drafter = DraftModelDrafter(drafter_runner, "d")
    for mode in ("chain", "ddtree"):
        for prompt in PROMPTS:
            want = [s.token for s in plain(target, prompt, N_GEN)]
            got, _ = spec(target, drafter, mode, 8, prompt, N_GEN)
            assert [s.token for s in got] == want
    if draft is HYBRID_DRAFT:
        state = drafter_runner.cache.state
        assert state.node_conv.nbytes == state.node_ssm.nbytes == 0     # no node state was ever allocated
