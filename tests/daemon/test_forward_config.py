"""Choosing the CUDA decode / verify forward (`--forward graph|persistent`) and the persistent forward's
tuning table, checked without a GPU."""
import dataclasses

import pytest
from click.testing import CliRunner

from flashd.daemon.backends.cuda.persistent import TUNING, ForwardTuning, tuning_for
from flashd.daemon.config import FORWARDS, EngineConfig


def test_engine_config_checks_the_forward():
    assert EngineConfig(model="m.gguf").forward == "graph"
    assert EngineConfig(model="m.gguf", forward="persistent").forward == "persistent"
    with pytest.raises(ValueError, match="forward must be one of"):
        EngineConfig(model="m.gguf", forward="megakernel")
    assert set(FORWARDS) == {"graph", "persistent"}


@pytest.mark.parametrize("command", ["serve", "bench"])
def test_cli_rejects_an_unknown_forward(command):
    from flashd.clients.cli import main
    args = [command, "--model", "m.gguf", "--forward", "megakernel"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and "megakernel" in res.output


def test_tuning_table_is_checked_data():
    for arch, tun in TUNING.items():
        assert isinstance(tun, ForwardTuning), arch
    assert tuning_for("9.0") is TUNING["sm_90"] and tuning_for("sm_89") is TUNING["sm_89"]
    assert tuning_for("12.0") is TUNING["default"]
    for bad in (dict(max_rows=0), dict(max_rows=9), dict(step_bytes=100), dict(ring_min_steps=0),
                dict(attn_splits=0), dict(n_ctas=-1)):
        with pytest.raises(ValueError):
            dataclasses.replace(TUNING["sm_90"], **bad)
