"""The target's tree node count through the engine on the CPU reference backend (daemon/engine.py, config.py,
serve_command.py): --max-tree-nodes reaches the runner, the runner's cache and the plan; under --vram-budget a hybrid
target's count is lowered to the largest that fits (reported in status and the log), or the start is refused naming
--max-tree-nodes; a hybrid loaded as a --draft model plans and holds no node state."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from click.testing import CliRunner

import flashd.daemon.serve_command as serve_module
from flashd.daemon.config import EngineConfig
from flashd.daemon.engine import Engine
from flashd.daemon.models.gguf_file import ModelLoadError
from flashd.daemon.serve_command import serve_command
from flashd.daemon.vram_budget import MiB
from flashd.daemon.vram_ledger import TREE_NODES_FLOOR, VramLedger
from flashd.scripts.synthetic_spec import SyntheticSpec
from flashd.scripts.make_synthetic_gguf import write_synthetic_model

# a hybrid target and a hybrid draft of its vocabulary (test_vram_engine.py's hybrid shape)
HYB = dict(arch="qwen35", hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=16, ffn=128, ssm_state=16,
           ssm_k_heads=1, ssm_v_heads=2, full_attn_interval=2, weight_type="Q8_0", vocab_size=320)
TARGET = SyntheticSpec(n_layers=4, seed=7, name="hyb", **HYB)
DRAFT = SyntheticSpec(n_layers=2, seed=7, name="hybdrf", **HYB)
MAX_CTX, CHUNK = 256, 128          # the chunk lets the default tree be 65 nodes


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tree-engine")
    return {"target": str(write_synthetic_model(d / "hyb.gguf", TARGET)),
            "draft": str(write_synthetic_model(d / "hybdrf.gguf", DRAFT))}


def config(models, **kw) -> EngineConfig:
    return EngineConfig(model=models["target"], device="cpu", max_ctx=MAX_CTX, prefill_chunk=CHUNK,
                        drafts=(models["draft"],), vram_margin=MiB, **kw)


def plan_at(models, n):
    """The unbudgeted plan's peak with the target's tree at n nodes (as the engine's ledger computes it)."""
    from flashd.daemon.backends import ReferenceBackend
    from flashd.daemon.models import open_model
    led = VramLedger.for_engine(ReferenceBackend(), config(models), *open_model(models["target"]))
    return led.plan(tree_nodes=n)


def test_the_default_tree_and_a_draft_model_without_node_states(models):
    engine = Engine(config(models))
    engine.load()
    assert engine.runner.max_tree_nodes == engine.runner.cache.max_tree_nodes == 65
    draft = engine.drafters.runners()[0]
    assert draft.max_tree_nodes == 0 and draft.cache.max_tree_nodes == 0
    vram = engine.status()["memory"]["vram"]
    comps = {c["role"]: c for c in vram["components"]}
    state = comps["target"]["parts"]["recurrent_state"]
    assert comps["target"]["parts"]["tree_states"] == 65 * state
    assert comps["draft"]["parts"]["tree_states"] == 0
    assert vram["settings"]["max_tree_nodes"] == 65 and engine.status()["max_tree_nodes"] == 65


def test_an_explicit_count_reaches_the_runner_and_the_plan(models):
    engine = Engine(config(models, max_tree_nodes=12))
    engine.load()
    assert engine.runner.max_tree_nodes == engine.runner.cache.max_tree_nodes == 12
    parts = engine.vram_plan().components[0].parts
    assert dict(parts)["tree_states"] == 12 * dict(parts)["recurrent_state"]
    assert dict(engine.vram_plan().settings)["max_tree_nodes_from"] == "--max-tree-nodes"


def test_a_budget_lowers_the_hybrid_targets_tree_to_fit(models, caplog):
    budget = plan_at(models, 30).peak_bytes + 1000           # 30 nodes fit, 31 do not (a state is ~10 KB)
    assert plan_at(models, 31).peak_bytes > budget
    engine = Engine(config(models, vram_budget=budget))
    with caplog.at_level(logging.INFO, logger="flashd.engine"):
        engine.load()
    assert engine.runner.max_tree_nodes == engine.runner.cache.max_tree_nodes == 30
    vram = engine.status()["memory"]["vram"]
    assert vram["fits"] and vram["settings"]["max_tree_nodes"] == 30
    assert vram["settings"]["max_tree_nodes_from"] == "lowered to fit --vram-budget"
    assert "draft tree lowered to 30 nodes" in caplog.text
    assert "target draft tree: 30 nodes (lowered to fit --vram-budget)" in caplog.text
    # a verify of the whole tree holds what the plan says
    runner = engine.runner
    runner.start([1, 2, 3])
    n = runner.max_tree_nodes
    runner.forward_tree(list(range(n)), runner.n_past + np.arange(n), np.tril(np.ones((n, n), bool)))
    state = runner.cache.state
    tree = dict(engine.vram_plan().components[0].parts)["tree_states"]
    assert tree == state.node_conv.nbytes + state.node_ssm.nbytes == 30 * state.n_bytes


def test_below_the_floor_the_start_is_refused_naming_the_option(models):
    budget = plan_at(models, 4).peak_bytes + 1000
    with pytest.raises(ModelLoadError) as exc:
        Engine(config(models, vram_budget=budget)).load()
    text = str(exc.value)
    assert f"with a draft tree of {TREE_NODES_FLOOR} nodes" in text and "--max-tree-nodes 4 (" in text
    engine = Engine(config(models, vram_budget=budget, max_tree_nodes=4))   # the advice, taken, fits
    engine.load()
    assert engine.runner.max_tree_nodes == 4


def test_an_explicit_count_over_budget_is_refused_not_lowered(models):
    budget = plan_at(models, 30).peak_bytes + 1000
    with pytest.raises(ModelLoadError, match="with a draft tree of 40 nodes .--max-tree-nodes.") as exc:
        Engine(config(models, vram_budget=budget, max_tree_nodes=40)).load()
    assert "--max-tree-nodes 30 (" in str(exc.value)


@pytest.mark.parametrize("args,want", [([], None), (["--max-tree-nodes", "9"], 9)])
def test_serve_flag(monkeypatch, models, args, want):
    seen = []
    monkeypatch.setattr(serve_module, "serve", lambda cfg: seen.append(cfg) or 0)
    result = CliRunner().invoke(serve_command, ["--model", models["target"], *args])
    assert result.exit_code == 0, result.output
    assert seen[0].max_tree_nodes == want


def test_serve_refuses_fewer_than_two_nodes_and_the_config_checks(models):
    result = CliRunner().invoke(serve_command, ["--model", models["target"], "--max-tree-nodes", "1"])
    assert result.exit_code == 2 and "--max-tree-nodes" in result.output
    for bad in (1, 0, "9", 2.0):
        with pytest.raises(ValueError, match="max_tree_nodes"):
            EngineConfig(model="m.gguf", max_tree_nodes=bad)
