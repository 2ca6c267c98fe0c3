"""--vram-budget through the engine on the CPU reference backend (where the plan bounds the float32 weights
and KV caches in host RAM, sized as the reference backend allocates them): the plan in `status`, a
configuration refused before anything loads, and later loads -- another prefill drafter, unparking the
target or the --draft drafters -- refused with `oom` while the daemon keeps serving (the same tokens
after as before). Also the command line: the size parser's errors and a refused start."""
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from flashd.daemon.config import EngineConfig
from flashd.daemon.engine import Engine
from flashd.daemon.models.gguf_file import ModelLoadError
from flashd.daemon.pflash.config import PFlashConfig
from flashd.daemon.serve_command import serve_command
from flashd.daemon.vram_budget import MiB
from flashd.protocol import messages as m
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model
from tests.daemon.engine_client import EngineClient

# This file's models (hidden 64: small enough for the engine to load and run); test_vram_sizes.py's have the
# same shape but hidden 256 and the sizes it computes by hand, so each file keeps its own.
TARGET = SyntheticSpec(arch="qwen2", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=512,
                       seed=31, name="tgt")
DRAFT = SyntheticSpec(arch="qwen2", n_layers=1, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=512,
                      seed=32, name="drf")
PFLASH = SyntheticSpec(arch="qwen3", n_layers=2, hidden=64, n_heads=4, n_kv_heads=1, ffn=96, vocab_size=512,
                       context_length=1024, seed=33, name="pfl")
BIG = SyntheticSpec(arch="qwen3", n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn=96, vocab_size=512,
                    context_length=768, seed=34, name="big")
MAX_CTX = 512


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("vram-engine")
    return {name: str(write_synthetic_model(d / f"{spec.name}.gguf", spec))     # a drafter is named by its file
            for name, spec in (("target", TARGET), ("draft", DRAFT), ("pflash", PFLASH), ("big", BIG))}


class Client(EngineClient):
    def greedy(self) -> list[int]:
        return super().greedy([5, 6, 7, 8], 6)


@pytest.fixture
def start(models):
    engines = []

    def make(budget=None, *, drafts=("draft",), policy="resident", prefill="pflash"):
        cfg = EngineConfig(model=models["target"], device="cpu", max_ctx=MAX_CTX,
                           drafts=tuple(models[d] for d in drafts),
                           prefill_drafter=models[prefill] if prefill else None,
                           pflash=PFlashConfig(forward_chunk=256, drafter_policy=policy),
                           vram_budget=budget, vram_margin=MiB)
        engine = Engine(cfg)
        engines.append(engine)
        engine.load()
        engine.start()
        return engine, Client(engine)
    yield make
    for e in engines:
        e.stop(10)


def peak(start, **kw) -> int:
    """The plan's peak for this configuration, from a daemon without a budget."""
    engine, client = start(None, **kw)
    return client.ask(m.Status)["memory"]["vram"]["peak_bytes"]


def component_bytes(start, **kw) -> dict[str, int]:
    """Each component's bytes (by role) in this configuration, from a daemon without a budget."""
    engine, client = start(None, **kw)
    return {c["role"]: c["bytes"] for c in client.ask(m.Status)["memory"]["vram"]["components"]}


def test_status_reports_the_plan_per_component_against_the_budget(start):
    engine, client = start(64 * MiB)
    vram = client.ask(m.Status)["memory"]["vram"]
    assert vram["where"] == "host RAM (reference backend)" and vram["budget_bytes"] == 64 * MiB
    assert vram["headroom_bytes"] == 64 * MiB - vram["peak_bytes"] and vram["fits"] is True
    comps = {(c["role"], c["name"]): c for c in vram["components"]}
    assert set(comps) == {("target", "tgt"), ("draft", "drf"), ("prefill_drafter", "pfl")}
    target = comps[("target", "tgt")]
    # float32: embedding + output 2 x 512 x 64, per layer q/o 64x64, k/v 32x64, gate/up/down 3 x 128x64, norms and
    # biases; the KV cache 2 x layers x 512 slots x 2 heads x 16 values
    layer = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64 + 64 + 64 + 64 + 32 + 32
    assert target["parts"] == {"weights": 4 * (2 * 512 * 64 + 2 * layer + 64), "kv_cache": 2 * 2 * MAX_CTX * 32 * 4}
    assert target["parts"]["weights"] == engine._weight_bytes()          # what the reference backend holds
    assert target["parts"]["kv_cache"] == engine.runner.cache.n_bytes
    pf = comps[("prefill_drafter", "pfl")]
    assert pf["parts"]["kv_cache"] == 2 * 2 * 1024 * 16 * 4 and pf["parts"]["scores"] == 4 * 8 * 1024
    assert vram["peak_bytes"] == sum(c["bytes"] for c in vram["components"]) + MiB
    assert vram["settings"] == {"max_ctx": MAX_CTX, "prefill_chunk": 512, "kv_type": "f32",
                                "drafter_policy": "resident", "prefill_drafter_tokens": 1024,
                                "max_tree_nodes": 512, "max_tree_nodes_from": "default"}


def test_without_a_budget_the_plan_is_only_reported(start):
    _, client = start(None)
    vram = client.ask(m.Status)["memory"]["vram"]
    assert vram["budget_bytes"] is None and vram["headroom_bytes"] is None and vram["fits"] is True


def test_a_configuration_over_budget_is_refused_before_anything_loads(models, start):
    need = peak(start)
    engine = Engine(EngineConfig(model=models["target"], device="cpu", max_ctx=MAX_CTX, drafts=(models["draft"],),
                                 prefill_drafter=models["pflash"], pflash=PFlashConfig(forward_chunk=256),
                                 vram_budget=need - 1, vram_margin=MiB))
    with pytest.raises(ModelLoadError) as exc:
        engine.load()
    text = str(exc.value)
    assert engine.model is None and engine.runner is None                  # nothing was loaded
    assert "does not fit --vram-budget" in text and "while serving" in text
    for name in ("target tgt", "draft drf", "prefill_drafter pfl", "weights", "kv_cache", "safety margin"):
        assert name in text
    assert "--max-ctx " in text and "without --draft drf" in text and "--drafter-policy park" in text
    assert "q8_0" not in text          # the reference backend's float32 cache: no quantized KV offered
    start(need)                        # exactly the peak fits


def test_another_prefill_drafter_over_budget_is_refused_and_the_daemon_keeps_serving(models, start):
    engine, client = start(peak(start))
    before = client.greedy()
    r = client.ask(m.Compress, ids=list(range(300)), keep=0.3, drafter=models["big"])
    assert r["event"] == "error" and r["code"] == "oom", r
    assert r["message"].startswith("loading the prefill drafter big does not fit --vram-budget")
    assert "prefill_drafter big" in r["message"] and "restart with --vram-budget" in r["message"]
    assert "`park what=target` first" in r["message"]
    status = client.ask(m.Status)
    assert status["prefill_drafter"]["loaded"] and status["prefill_drafter"]["path"] == models["pflash"]
    assert client.ask(m.Compress, ids=list(range(300)), keep=0.3)["event"] == "result"
    assert client.greedy() == before


def test_unparking_the_target_is_checked_against_what_filled_its_room(models, start):
    engine, client = start(peak(start))            # the big drafter fits only while the target is parked
    before = client.greedy()
    assert client.ask(m.Park, what="target")["event"] == "result"
    r = client.ask(m.Compress, ids=list(range(300)), keep=0.3, drafter=models["big"])    # fits while parked
    assert r["event"] == "result", r
    r = client.ask(m.Unpark, what="target")
    assert r["event"] == "error" and r["code"] == "oom", r
    assert r["message"].startswith("unparking the target does not fit") and "`free drafter` first" in r["message"]
    assert client.ask(m.Status)["parked"]["target"] is True
    assert client.ask(m.Free)["event"] == "result"
    assert client.ask(m.Unpark, what="target")["parked"] == {"target": False}
    assert client.greedy() == before


def test_unparking_a_draft_model_is_checked_too(models, start):
    need = peak(start, prefill=None)
    sizes = component_bytes(start)
    assert sizes["prefill_drafter"] > sizes["draft"]
    # the prefill drafter fits in place of the parked draft model, not beside it
    engine, client = start(need + sizes["prefill_drafter"] - sizes["draft"], prefill=None)
    assert client.ask(m.Park, what="draft")["event"] == "result"
    r = client.ask(m.Compress, ids=list(range(300)), keep=0.3, drafter=models["pflash"])    # the draft model's room
    assert r["event"] == "result", r
    r = client.ask(m.Unpark, what="draft")
    assert r["event"] == "error" and r["code"] == "oom", r
    assert r["message"].startswith("unparking the --draft drafters drf does not fit")
    assert client.ask(m.Status)["parked"]["spec_drafters"] == ["drf"]
    client.ask(m.Free)
    assert client.ask(m.Unpark, what="draft")["event"] == "result"
    assert "spec_drafters" not in client.ask(m.Status)["parked"]


def test_park_policy_refuses_before_parking_the_target(models, start):
    engine, client = start(peak(start, policy="park"), policy="park")
    runner = engine.runner
    r = client.ask(m.Compress, ids=list(range(300)), keep=0.3, drafter=models["big"])
    assert r["event"] == "error" and r["code"] == "oom", r
    assert "while the target is parked" in r["message"]
    assert engine.runner is runner                 # never parked: the same runner and KV cache
    assert client.ask(m.Compress, ids=list(range(300)), keep=0.3)["event"] == "result"
    vram = client.ask(m.Status)["memory"]["vram"]
    pf = next(c for c in vram["components"] if c["role"] == "prefill_drafter")
    assert pf["phases"] == ["target parked"]


# -- the command line ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["24", "lots", "-1G", "0MiB", "24 gigs"])
def test_serve_refuses_a_bad_size(models, value):
    result = CliRunner().invoke(serve_command, ["--model", models["target"], "--vram-budget", value])
    assert result.exit_code == 2 and "--vram-budget" in result.output, result.output
    assert "e.g. 24GiB" in result.output or "more than 0 bytes" in result.output


def test_serve_refuses_a_margin_that_leaves_nothing(models):
    result = CliRunner().invoke(serve_command, ["--model", models["target"], "--vram-budget", "256MiB",
                                                "--vram-margin", "256MiB"])
    assert result.exit_code == 2 and "leaves nothing" in result.output


def test_serve_over_budget_exits_with_the_plan(models):
    result = subprocess.run([sys.executable, "-m", "flashd.daemon", "--model", models["target"], "--device", "cpu",
                             "--max-ctx", "512", "--vram-budget", "1MiB", "--vram-margin", "512KiB"],
                            stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    assert result.returncode == 1 and result.stdout == b""
    err = result.stderr.decode()
    assert "does not fit --vram-budget 1.0 MiB" in err and "target tgt" in err and "--max-ctx " in err


def test_a_served_daemon_reports_the_plan_and_refuses_over_budget_loads(spawn_serve, models):
    from pathlib import Path
    # target + prefill drafter peak at ~2.5 MiB with a 1 MiB margin; the big drafter instead would take ~3.0 MiB
    daemon = spawn_serve("--vram-budget", "2.75MiB", "--vram-margin", "1MiB", "--prefill-drafter", models["pflash"],
                         "--allow-models", str(Path(models["big"]).parent), model=Path(models["target"]))
    vram = daemon.ask("status id=s", "s")[-1]["memory"]["vram"]
    assert vram["budget_bytes"] == 2816 * 1024 and vram["headroom_bytes"] == 2816 * 1024 - vram["peak_bytes"] > 0
    assert {c["role"] for c in vram["components"]} == {"target", "prefill_drafter"}
    assert "VRAM plan (host RAM (reference backend)): peak" in daemon.stderr_tail()
    refused = daemon.ask(f"compress id=c ids=[1,2,3,4,5,6,7,8,9] keep=0.5 drafter={models['big']}", "c")[-1]
    assert refused["event"] == "error" and refused["code"] == "oom", refused
    assert "loading the prefill drafter big does not fit --vram-budget 2.8 MiB" in refused["message"]
    assert daemon.ask("compress id=k ids=[1,2,3,4,5,6,7,8,9] keep=0.5", "k")[-1]["event"] == "result"
    daemon.ask("quit id=q", "q")
    assert daemon.wait() == 0


def test_park_policy_opens_the_drafter_file_once_per_compression(models, start, monkeypatch):
    """The budget's check before parking keeps the opened file for the load that follows."""
    import flashd.daemon.pflash.service as service
    engine, client = start(peak(start, policy="park"), policy="park")
    opened, real = [], service.open_model
    monkeypatch.setattr(service, "open_model", lambda path, *a: opened.append(path) or real(path, *a))
    assert client.ask(m.Compress, ids=list(range(300)), keep=0.3)["event"] == "result"
    assert opened == [models["pflash"]]


def test_a_hybrid_target_plans_its_attention_kv_and_recurrent_state(tmp_path):
    """qwen35 (CPU only): K/V for the full-attention layers, the linear layers' recurrent state, and that state
    once per node of the largest draft tree (the node buffers after a verify of max_tree_nodes nodes)."""
    from flashd.scripts.synthetic_spec import SyntheticSpec as Spec
    spec = Spec(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=16, ffn=128,
                ssm_state=16, ssm_k_heads=1, ssm_v_heads=2, full_attn_interval=2, weight_type="Q8_0", seed=7,
                name="hyb")
    path = write_synthetic_model(tmp_path / "hyb.gguf", spec)
    engine = Engine(EngineConfig(model=str(path), device="cpu", max_ctx=256, vram_budget=64 * MiB, vram_margin=MiB))
    engine.load()
    target = engine.vram_plan().components[0]
    parts = dict(target.parts)
    cache = engine.runner.cache
    assert parts["kv_cache"] == cache.kv.n_bytes and parts["recurrent_state"] == cache.state.n_bytes
    runner = engine.runner
    n = runner.max_tree_nodes
    runner.start([1, 2, 3])
    runner.forward_tree(list(range(n)), runner.n_past + np.arange(n), np.tril(np.ones((n, n), bool)))
    assert parts["tree_states"] == cache.state.node_conv.nbytes + cache.state.node_ssm.nbytes == n * cache.state.n_bytes
    assert parts["weights"] == engine._weight_bytes()
