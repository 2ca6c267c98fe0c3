"""CPU tests of the per-op benchmarks (bench/). bench/ is a folder of scripts, not a package: run as
`python bench/x.py`, Python puts bench/ on sys.path and the scripts import their helpers (timing,
op_harness) by their bare names. `bench_module(name)` does the same for a test: bench/ on sys.path for
the test's duration (no sys.path edits in the sources), then the import."""
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench_module(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module
