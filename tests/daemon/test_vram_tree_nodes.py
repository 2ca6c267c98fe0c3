"""The draft tree's node count in the VRAM plan (daemon/vram_ledger.py, vram_sizes.py): a hybrid (qwen35) target
plans a whole recurrent state per node of the largest tree it verifies, a model loaded only as a draft model plans
none (speculative/draft_model.py DRAFT_TREE_NODES), and under --vram-budget the check at start lowers the target's
count to the largest that fits (not below TREE_NODES_FLOOR) unless --max-tree-nodes gave one.

The models are configs with the shapes of `make_synthetic_gguf --preset qwen3.5-27b-q4_k_m` (target) and
`qwen3.5-0.8b` (draft; Q4_K) -- no files: a 27B file is 14 GiB -- with the weights as one tensor of the size the
H200 run's refusal printed (14.40 GiB, 405.2 MiB). The native workspace counts are test_vram_sizes.py's stubs."""
import pytest

from flashd.daemon.models.config import ModelConfig
from flashd.daemon.models.qwen35_config import LinearAttentionConfig
from flashd.daemon.vram_budget import GiB, MiB, BudgetExceeded, kv_cache_bytes
from flashd.daemon.vram_ledger import TREE_NODES_FLOOR, LedgerState, VramLedger
from flashd.daemon.vram_sizes import CudaSizes, HostSizes, ModelDesc
from flashd.daemon.pflash.config import PFlashConfig
from tests.daemon.test_vram_sizes import attention_ws, sample_ws

CTX, CHUNK = 32768, 512


def hybrid(name: str, n_layers: int, hidden: int, n_heads: int, n_kv_heads: int, ffn: int, v_heads: int,
           weight_bytes: int) -> ModelDesc:
    """A qwen35 shape: 3 Gated DeltaNet layers then one gated attention layer, head_dim 256 (64 rotated), DeltaNet
    heads of 128 (16 key heads), conv kernel 4, vocab 248320; the weights one matrix of weight_bytes."""
    lin = LinearAttentionConfig(recurrent=tuple(i % 4 != 3 for i in range(n_layers)), conv_kernel=4, head_dim=128,
                                n_k_heads=16, n_v_heads=v_heads)
    cfg = ModelConfig(arch="qwen35", n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv_heads,
                      head_dim=256, ffn=ffn, vocab_size=248320, context_length=262144, rope_theta=1e7, rope_dim=64,
                      rope_neox=True, rms_eps=1e-6, qkv_bias=False, qk_norm=True, tie_embeddings=False, name=name,
                      linear=lin)
    return ModelDesc(name, f"/models/{name}.gguf", cfg, (((1, weight_bytes), weight_bytes),))


TARGET = hybrid("q35-27b", 64, 5120, 24, 4, 17408, 48, int(14.40 * GiB))
DRAFT = hybrid("q35-0.8b", 24, 1024, 8, 2, 3584, 16, int(405.2 * MiB))
# by hand: per linear layer conv (K - 1) x C floats, C = 2 x 16 x 128 + Hv x 128, and memory Hv x 128 x 128 floats
TARGET_STATE = 48 * 4 * (3 * (4096 + 48 * 128) + 48 * 128 * 128)      # 48 linear layers: 149.6 MiB
DRAFT_STATE = 18 * 4 * (3 * (4096 + 16 * 128) + 16 * 128 * 128)       # 18 linear layers: 19.3 MiB


def ledger(budget, tree_nodes=None, drafts=True, sizes=None) -> VramLedger:
    return VramLedger(sizes or CudaSizes(attention_ws, sample_ws), TARGET, {"q35-0.8b": DRAFT} if drafts else {},
                      max_ctx=CTX, prefill_chunk=CHUNK, pflash=PFlashConfig(), budget=budget, margin=512 * MiB,
                      tree_nodes=tree_nodes)


def parts(plan, role):
    return dict(next(c for c in plan.components if c.role == role).parts)


def test_hand_computed_states_of_a_hybrid_target_and_a_hybrid_draft_model():
    assert TARGET_STATE == 156_893_184 and DRAFT_STATE == 20_201_472
    plan = ledger(None).plan()
    target, draft = parts(plan, "target"), parts(plan, "draft")
    assert target["recurrent_state"] == TARGET_STATE and draft["recurrent_state"] == DRAFT_STATE
    assert target["kv_cache"] == kv_cache_bytes(16, 4, 256, CTX) == 2 * GiB     # 16 attention layers
    assert draft["kv_cache"] == kv_cache_bytes(6, 2, 256, CTX) == 384 * MiB
    assert target["tree_states"] == 65 * TARGET_STATE                           # the default tree: 9.50 GiB
    assert draft["tree_states"] == 0                                            # drafts only: no node states
    # a draft model's runner keeps one-node verify buffers: tree inputs of 1 node (2 + 1 + 1 words), commit 2, argmax 1
    sizes = CudaSizes(attention_ws, sample_ws)
    words = 2 * CHUNK + 1 + 5 + (CTX + 1) + 4 + 2 + 1
    assert draft["runner"] == sizes.runner_bytes(DRAFT.cfg, CTX, CHUNK, 0) == 4 * words + sample_ws(248320)
    assert dict(plan.settings)["max_tree_nodes"] == 65 and dict(plan.settings)["max_tree_nodes_from"] == "default"


def test_the_host_backend_plans_the_same_node_states():
    plan = ledger(None, sizes=HostSizes()).plan()
    assert parts(plan, "target")["tree_states"] == 65 * TARGET_STATE
    assert parts(plan, "draft")["tree_states"] == 0
    assert parts(ledger(None, 12, sizes=HostSizes()).plan(), "target")["tree_states"] == 12 * TARGET_STATE


def test_a_24gib_budget_lowers_the_target_tree_to_the_largest_count_that_fits():
    led = ledger(24 * GiB)
    assert not led.plan().fits                                       # 65 nodes: over
    plan = led.check("the configuration", LedgerState(), runtime=False)
    n = led.tree_nodes
    assert plan.fits and TREE_NODES_FLOOR <= n < 65
    assert parts(plan, "target")["tree_states"] == n * TARGET_STATE
    assert not led.plan(tree_nodes=n + 1).fits                       # the largest that fits
    # by hand: what the budget leaves after everything but the node states, in whole states (the runner's tree
    # buffers change by bytes per node, far below a state)
    rest = plan.peak_bytes - n * TARGET_STATE
    assert n == (24 * GiB - rest) // TARGET_STATE
    settings = dict(plan.settings)
    assert settings["max_tree_nodes"] == n and settings["max_tree_nodes_from"] == "lowered to fit --vram-budget"
    assert f"target draft tree {n} nodes (lowered to fit --vram-budget)" in plan.lines()[0]
    # runtime checks keep what the runner was made with
    assert led.check("unparking the target", LedgerState(), runtime=True).fits and led.tree_nodes == n


def test_below_the_floor_the_start_is_refused_naming_max_tree_nodes():
    led = ledger(None)
    budget = led.plan(tree_nodes=5).peak_bytes + MiB                # fits 5 nodes, not 9
    led = ledger(budget)
    with pytest.raises(BudgetExceeded) as exc:
        led.check("the configuration", LedgerState(), runtime=False)
    text = str(exc.value)
    assert f"with a draft tree of {TREE_NODES_FLOOR} nodes (lowered to the floor of {TREE_NODES_FLOOR}" in text
    assert "What would fit: " in text and "--max-tree-nodes 5 (a draft tree of 5 nodes, a DDTree budget of 4)" in text
    assert f"tree_states {TREE_NODES_FLOOR * TARGET_STATE / GiB:.2f} GiB" in text    # the plan at the floor


def test_a_budget_no_tree_count_meets_still_mentions_the_option_and_the_other_fixes():
    with pytest.raises(BudgetExceeded) as exc:
        ledger(18 * GiB).check("the configuration", LedgerState(), runtime=False)
    text = str(exc.value)
    assert "fewer only with --max-tree-nodes" in text and "--max-ctx " in text and "--vram-budget " in text


def test_an_explicit_count_is_kept_and_refused_when_over_saying_what_would_fit():
    led = ledger(24 * GiB, tree_nodes=30)
    plan = led.check("the configuration", LedgerState(), runtime=False)        # 30 nodes fit 24 GiB
    assert led.tree_nodes == 30 and parts(plan, "target")["tree_states"] == 30 * TARGET_STATE
    assert dict(plan.settings)["max_tree_nodes_from"] == "--max-tree-nodes"
    led = ledger(24 * GiB, tree_nodes=64)
    with pytest.raises(BudgetExceeded) as exc:
        led.check("the configuration", LedgerState(), runtime=False)
    assert led.tree_nodes == 64                                               # not lowered
    auto = ledger(24 * GiB)
    auto.check("x", LedgerState(), runtime=False)
    assert f"--max-tree-nodes {auto.tree_nodes} (" in str(exc.value)           # the largest that fits
    assert "with a draft tree of 64 nodes (--max-tree-nodes)" in str(exc.value)


def test_the_count_is_capped_by_the_prefill_chunk_and_the_masked_attention():
    sizes = CudaSizes(attention_ws, sample_ws)
    assert sizes.tree_nodes(TARGET.cfg, 16, None) == 16 and sizes.tree_nodes(TARGET.cfg, 512, 100) == 65
    assert sizes.tree_nodes(TARGET.cfg, 512, 0) == 0
    host = HostSizes()
    assert host.tree_nodes(TARGET.cfg, 512, 100) == 100 and host.tree_nodes(TARGET.cfg, 512, None) == 65
