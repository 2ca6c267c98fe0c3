"""`flashd bench --tuning FIELD=N,...`: the option's parsing, and that it is refused off the CUDA backend
(the library's own checks of field names and ranges run in tests/gpu/test_tuning.py)."""
import click
import pytest

from flashd.daemon.bench_cli import apply_tuning, parse_tuning


def test_tuning_overrides_parse_to_integers():
    assert parse_tuning("") == {}
    assert parse_tuning("gemv_rounds=0, pdl=0") == {"gemv_rounds": 0, "pdl": 0}
    assert parse_tuning("gemv_stage_bytes=3072,") == {"gemv_stage_bytes": 3072}


@pytest.mark.parametrize("bad", ["pdl", "pdl=", "=1", "pdl=on", "gemv_rounds=2.5"])
def test_a_malformed_override_is_a_usage_error(bad):
    with pytest.raises(click.BadParameter):
        parse_tuning(bad)


class _CpuBackend:
    name = "reference"


def test_tuning_is_refused_off_the_cuda_backend():
    assert apply_tuning(_CpuBackend(), {}) is None
    with pytest.raises(click.UsageError, match="CUDA backend only"):
        apply_tuning(_CpuBackend(), {"pdl": 0})
