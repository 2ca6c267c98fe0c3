"""`flashd serve --tuning FIELD=N,...`: the overrides reach the engine (ServeConfig -> EngineConfig.tuning), a
malformed one is a usage error, the engine refuses them off the CUDA backend and hands them to the library before the
runner exists on it (a stand-in backend records the call; the library's own checks of names and ranges run in
tests/gpu/test_tuning.py), and `status` / ready report the CUDA tuning in effect under `forward.tuning`."""
from __future__ import annotations

import types

import pytest
from click.testing import CliRunner

from flashd.daemon.config import EngineConfig
from flashd.daemon.engine import Engine
from flashd.daemon.models import ModelLoadError
from flashd.daemon.serve_command import serve_command
from flashd.daemon.server import ServeConfig
from tests.daemon.test_prefill_chunk_option import engine_config_of, serve_config_of
from tests.daemon.test_prefill_chunk_option import target  # noqa: F401  (the fixture)


@pytest.mark.parametrize("args,want", [([], ()), (["--tuning", "gemv_rows=1"], (("gemv_rows", 1),)),
                                       (["--tuning", "gemv_rows=1, pdl=0"], (("gemv_rows", 1), ("pdl", 0)))])
def test_serve_flag_sets_the_tuning(monkeypatch, target, args, want):  # noqa: F811
    assert serve_config_of(monkeypatch, target, args).tuning == want


@pytest.mark.parametrize("bad", ["gemv_rows", "gemv_rows=on", "=1"])
def test_a_malformed_tuning_is_a_usage_error(target, bad):  # noqa: F811
    result = CliRunner().invoke(serve_command, ["--model", target, "--tuning", bad])
    assert result.exit_code == 2 and "FIELD=INTEGER" in result.output


def test_serve_hands_the_tuning_to_the_engine(monkeypatch, target):  # noqa: F811
    config = ServeConfig(model=target, device="cpu", tuning=(("gemv_rows", 1),), stdin=True)
    assert engine_config_of(monkeypatch, config).tuning == (("gemv_rows", 1),)


def test_engine_config_checks_the_pairs():
    with pytest.raises(ValueError, match="tuning"):
        EngineConfig(model="m.gguf", tuning=(("gemv_rows", "1"),))
    with pytest.raises(ValueError, match="tuning"):
        EngineConfig(model="m.gguf", tuning=(("", 1),))


def test_the_reference_backend_refuses_tuning_and_reports_none(target):  # noqa: F811
    engine = Engine(EngineConfig(model=target, device="cpu", tuning=(("gemv_rows", 1),)))
    with pytest.raises(ModelLoadError, match="CUDA backend only"):
        engine.load()
    plain = Engine(EngineConfig(model=target, device="cpu"))
    plain.load()
    assert "tuning" not in plain.status()["forward"]


class _Native:
    def __init__(self):
        self.table = {"gemv_rows": 0, "pdl": 1}
        self.calls = []

    def tuning(self):
        return dict(self.table)

    def set_tuning(self, **changes):
        self.calls.append(changes)
        unknown = set(changes) - set(self.table)
        if unknown:
            raise KeyError(f"unknown tuning field(s) {', '.join(sorted(unknown))}")
        self.table.update(changes)
        return self.tuning()


def test_a_cuda_engine_sets_the_tuning_first_and_reports_it(target):  # noqa: F811
    engine = Engine(EngineConfig(model=target, device="cpu", tuning=(("gemv_rows", 1),)))
    native = _Native()
    engine.backend = types.SimpleNamespace(name="cuda", device=types.SimpleNamespace(native=native))
    engine._apply_tuning()
    assert native.calls == [{"gemv_rows": 1}]
    assert engine._forward_info()["tuning"] == {"gemv_rows": 1, "pdl": 1}
    bad = Engine(EngineConfig(model=target, device="cpu", tuning=(("gemv_rowz", 1),)))
    bad.backend = engine.backend
    with pytest.raises(ModelLoadError, match="--tuning: .*gemv_rowz"):
        bad._apply_tuning()
