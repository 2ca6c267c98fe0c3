"""CPU tests of the per-op benchmarks (bench/, the package flashd.bench). `bench_module(name)` is the
benchmark bench/<name>.py, imported as flashd.bench.<name>."""
import importlib

import pytest


@pytest.fixture
def bench_module():
    return lambda name: importlib.import_module(f"flashd.bench.{name}")
