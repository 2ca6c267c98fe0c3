"""The runner's max_tree_nodes argument on the CUDA backend (runner.py, backends/cuda/runner.py, hybrid_runner.py,
hybrid_plan.py): a hybrid target made with a small count plans and verifies at most that many node states and stays
token for token its plain greedy output; a model made as a draft model (max_tree_nodes 0, speculative/loader.py)
keeps one-node verify buffers, drafts, and never allocates a node state."""
import numpy as np
import pytest
from tests.gpu.test_cuda_qwen35 import VOCAB, cuda_backend, ids_of, model   # noqa: F401 (a fixture)
from tests.speculative.spec_drafters import OracleDrafter, plain, spec

from flashd.daemon.backends.cuda.hybrid_plan import hybrid_state_bytes
from flashd.daemon.models import load_model, open_model
from flashd.daemon.models.weights import total_weight_bytes
from flashd.daemon.speculative.draft_model import DRAFT_TREE_NODES, DraftModelDrafter


def runner_of(backend, path, max_tree_nodes, max_ctx=256, chunk=64):
    f, cfg = open_model(path)
    plan = backend.plan(cfg, total_weight_bytes(f, cfg), max_ctx, chunk, max_tree_nodes=max_tree_nodes)
    backend.check_fits(plan)
    lm = load_model((f, cfg), backend.ops.load_weight)
    return backend.make_runner(cfg, lm.weights, max_ctx, chunk, plan, max_tree_nodes=max_tree_nodes), plan


def test_a_small_count_is_planned_verified_and_exact(cuda_backend, synthetic_model):
    path = model(synthetic_model, "gqa_partial_rope")
    runner, plan = runner_of(cuda_backend, path, 5)
    _, default = runner_of(cuda_backend, path, None)
    assert runner.max_tree_nodes == runner.cache.max_tree_nodes == 5
    assert default.kv_bytes - plan.kv_bytes == (64 - 5) * hybrid_state_bytes(runner.cfg)    # the chunk: 64 nodes
    with pytest.raises(ValueError, match="6 nodes"):
        runner.forward_tree(list(range(6)), np.arange(6), np.tril(np.ones((6, 6), bool)))
    accepted = 0
    for i, prompt in enumerate([[5, 9, 77, 12, 5, 9, 77, 12, 100, 200], ids_of(70, seed=6)]):
        want = [s.token for s in plain(runner, prompt, 24)]
        got, stats = spec(runner, OracleDrafter(want, VOCAB, seed=i), "ddtree", 12, prompt, 24)
        assert [s.token for s in got] == want, stats
        accepted += stats.accepted
        assert runner.cache.state.node_conv.shape[1] <= 5
    assert accepted > 0


@pytest.mark.parametrize("draft_shape", ["gqa_partial_rope", None])
def test_a_draft_model_runner_holds_no_node_state(cuda_backend, synthetic_model, draft_shape):
    target, _ = runner_of(cuda_backend, model(synthetic_model, "gqa_partial_rope"), None)
    path = (model(synthetic_model, draft_shape) if draft_shape else
            synthetic_model(arch="qwen2", n_layers=1, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab_size=VOCAB))
    draft, plan = runner_of(cuda_backend, path, DRAFT_TREE_NODES)
    assert draft.max_tree_nodes == 0
    if draft_shape:
        assert plan.kv_bytes - draft.cache.kv.n_bytes == hybrid_state_bytes(draft.cfg)   # the live state alone
    drafter = DraftModelDrafter(draft, "d")
    for mode in ("chain", "ddtree"):
        prompt = [5, 9, 77, 12, 5, 9, 77, 12, 100, 200]
        want = [s.token for s in plain(target, prompt, 16)]
        got, _ = spec(target, drafter, mode, 6, prompt, 16)
        assert [s.token for s in got] == want
    if draft_shape:
        assert draft.cache.state.node_conv is None                   # never allocated
