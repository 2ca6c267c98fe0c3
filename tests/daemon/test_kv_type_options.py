"""--kv-type / --kv-type-k / --kv-type-v on `flashd serve` and `flashd bench`, and the VRAM plan's KV sizes
per type (the target's cache only: drafters keep the backend's unquantized cache)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

import flashd.daemon.serve_command as serve_module
from flashd.daemon.backends.kv_types import KVTypes
from flashd.daemon.bench_cli import bench_command
from flashd.daemon.config import EngineConfig
from flashd.daemon.models import open_model
from flashd.daemon.pflash.config import PFlashConfig
from flashd.daemon.serve_command import serve_command
from flashd.daemon.vram_budget import MiB, kv_cache_bytes
from flashd.daemon.vram_ledger import LedgerState, VramLedger
from flashd.daemon.vram_sizes import HostSizes, describe_model
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model

TARGET = SyntheticSpec(arch="qwen2", n_layers=2, hidden=128, n_heads=2, n_kv_heads=1, ffn=128, vocab_size=300,
                       seed=51, name="kvt")                 # head_dim 64


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return str(write_synthetic_model(tmp_path_factory.mktemp("kvt") / "kvt.gguf", TARGET))


@pytest.mark.parametrize("args,want", [([], KVTypes()), (["--kv-type", "q8_0"], KVTypes("q8_0", "q8_0")),
                                       (["--kv-type", "q8_0", "--kv-type-v", "q4_0"], KVTypes("q8_0", "q4_0", 512)),
                                       (["--kv-type-k", "q4_0"], KVTypes("q4_0", "f16", 512)),
                                       (["--kv-type", "q4_0", "--kv-window", "0"], KVTypes("q4_0", "q4_0")),
                                       (["--kv-type", "q8_0", "--kv-window", "128"], KVTypes("q8_0", "q8_0", 128))])
def test_serve_flags_give_the_kv_types(monkeypatch, target, args, want):
    seen = []
    monkeypatch.setattr(serve_module, "serve", lambda config: seen.append(config) or 0)
    result = CliRunner().invoke(serve_command, ["--model", target, *args])
    assert result.exit_code == 0, result.output
    assert seen[0].kv_types == want


def test_serve_and_bench_refuse_an_unknown_type(target):
    for command in (serve_command, bench_command):
        result = CliRunner().invoke(command, ["--model", target, "--kv-type", "q5_1"])
        assert result.exit_code == 2 and "q5_1" in result.output


@pytest.mark.parametrize("args,why", [(["--kv-type", "q4_0", "--kv-window", "100"], "multiple of 64"),
                                      (["--kv-window", "64"], "quantized")])
def test_serve_and_bench_refuse_a_window_they_cannot_keep(target, args, why):
    for command in (serve_command, bench_command):
        result = CliRunner().invoke(command, ["--model", target, *args])
        assert result.exit_code == 2 and "--kv-window" in result.output and why in result.output, result.output


def test_engine_config_checks_kv_types():
    with pytest.raises(ValueError, match="KVTypes"):
        EngineConfig(model="m.gguf", kv_types="q8_0")
    with pytest.raises(ValueError, match="multiple of the KV window 512"):
        EngineConfig(model="m.gguf", kv_types=KVTypes("q4_0", "q4_0", 512), prefill_chunk=256)
    EngineConfig(model="m.gguf", kv_types=KVTypes("q4_0", "q4_0", 256), prefill_chunk=512)


def test_serve_refuses_a_chunk_the_window_does_not_divide(target):
    result = CliRunner().invoke(serve_command, ["--model", target, "--kv-type", "q4_0", "--prefill-chunk", "256"])
    assert result.exit_code == 2 and "multiple of the KV window 512" in result.output, result.output


def test_bench_runs_with_a_quantized_kv_on_the_cpu(target):
    result = CliRunner().invoke(bench_command, ["--model", target, "--device", "cpu", "-p", "", "-n", "4", "-d", "0",
                                                "-r", "1", "--kv-type", "q4_0"])
    assert result.exit_code == 0, result.output
    assert "KV cache: q4_0" in result.output


def test_the_plan_sizes_the_targets_k_and_v_per_type(target):
    desc = describe_model("kvt", *open_model(target))

    def ledger(types, budget=None):
        return VramLedger(HostSizes(), desc, {}, max_ctx=1024, prefill_chunk=512, pflash=PFlashConfig(),
                          budget=budget, margin=MiB, kv_types=types)
    plan = ledger(KVTypes("q8_0", "q4_0")).plan(LedgerState())
    parts = dict(next(c for c in plan.components if c.role == "target").parts)
    assert parts["kv_cache"] == kv_cache_bytes(2, 1, 64, 1024, "q8_0", "q4_0") == 2 * 1024 * (2 * 34 + 2 * 18)
    assert dict(plan.settings)["kv_type"] == "k=q8_0,v=q4_0"
    f32 = ledger(None).plan(LedgerState())                 # f16 on the reference backend: float32 rows
    assert dict(next(c for c in f32.components if c.role == "target").parts)["kv_cache"] == 2 * 2 * 1024 * 64 * 4
    # a budget the f16 cache misses by a little: the refusal offers the quantized caches
    led = ledger(KVTypes(), budget=f32.peak_bytes - 1024)
    fixes = led.fixes(LedgerState(), runtime=False)
    assert any(f.startswith("--kv-type q8_0") for f in fixes) and any(f.startswith("--kv-type q4_0") for f in fixes)
    assert not any("--kv-type q8_0" in f for f in ledger(KVTypes("q8_0", "q8_0"), budget=1).fixes(
        LedgerState(), runtime=False))             # only smaller than what is configured
    # a window: its rings are a part of the target (float16 [Hkv][window + max(chunk, 256)][d], K and V, per layer)
    win = ledger(KVTypes("q4_0", "q4_0", 512)).plan(LedgerState())
    parts = dict(next(c for c in win.components if c.role == "target").parts)
    assert parts["kv_window"] == 2 * 2 * 1 * (512 + 512) * 64 * 2
    assert "kv_window" not in dict(next(c for c in plan.components if c.role == "target").parts)
