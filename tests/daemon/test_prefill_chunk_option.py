"""`flashd serve --prefill-chunk`: the prompt tokens per prefill forward reach the engine (EngineConfig.prefill_chunk,
also the unit of prefix reuse), with 512 as before when not given; out-of-range values are refused by the command
line, and the engine prefills in chunks of that size (the runner's forwards, on the CPU)."""
from __future__ import annotations

import io

import pytest
from click.testing import CliRunner

import flashd.daemon.serve_command as serve_module
import flashd.daemon.server as server_module
from flashd.daemon.config import EngineConfig
from flashd.daemon.engine import Engine
from flashd.daemon.process import StartupError
from flashd.daemon.serve_command import serve_command
from flashd.daemon.server import ServeConfig, serve
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model

TARGET = SyntheticSpec(arch="qwen2", n_layers=2, hidden=64, n_heads=2, n_kv_heads=1, ffn=96, vocab_size=300,
                       seed=23, name="chunk")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return str(write_synthetic_model(tmp_path_factory.mktemp("chunk") / "chunk.gguf", TARGET))


def serve_config_of(monkeypatch, target: str, args: list[str]) -> ServeConfig:
    """The ServeConfig `flashd serve --model target *args` builds (serve itself stubbed out)."""
    seen = []
    monkeypatch.setattr(serve_module, "serve", lambda config: seen.append(config) or 0)
    result = CliRunner().invoke(serve_command, ["--model", target, *args])
    assert result.exit_code == 0, result.output
    return seen[0]


def engine_config_of(monkeypatch, config: ServeConfig) -> EngineConfig:
    """The EngineConfig serve(config) hands to load_engine (stopped there)."""
    seen = []

    def fake_load(engine_config):
        seen.append(engine_config)
        raise StartupError("stop here")

    monkeypatch.setattr(server_module, "load_engine", fake_load)
    monkeypatch.setattr(server_module, "claim_stdout", io.BytesIO)      # (the real one repoints fd 1 for good)
    monkeypatch.setattr(server_module, "setup_logging", lambda level: None)
    assert serve(config) == 1
    assert isinstance(seen[0], EngineConfig)
    return seen[0]


@pytest.mark.parametrize("args,want", [([], 512), (["--prefill-chunk", "4096"], 4096), (["--prefill-chunk", "16"], 16)])
def test_serve_flag_sets_the_prefill_chunk(monkeypatch, target, args, want):
    assert serve_config_of(monkeypatch, target, args).prefill_chunk == want


@pytest.mark.parametrize("value", ["8", "0", "20000"])
def test_serve_refuses_a_prefill_chunk_out_of_range(target, value):
    result = CliRunner().invoke(serve_command, ["--model", target, "--prefill-chunk", value])
    assert result.exit_code == 2 and "--prefill-chunk" in result.output


def test_serve_config_checks_the_prefill_chunk():
    with pytest.raises(ValueError, match="prefill-chunk"):
        ServeConfig(model="m.gguf", prefill_chunk=0)


def test_serve_hands_the_prefill_chunk_to_the_engine(monkeypatch, target):
    config = ServeConfig(model=target, device="cpu", prefill_chunk=96, stdin=True)
    assert engine_config_of(monkeypatch, config).prefill_chunk == 96


def test_the_engine_prefills_in_chunks_of_that_size(target):
    engine = Engine(EngineConfig(model=target, device="cpu", max_ctx=256, prefill_chunk=48))
    engine.load()
    runner = engine.runner
    sizes = []
    forward = runner._forward

    def spy(ids, *a, **k):
        sizes.append(len(ids))
        return forward(ids, *a, **k)

    runner._forward = spy
    runner.start(list(range(1, 131)))
    assert sizes == [48, 48, 34]
