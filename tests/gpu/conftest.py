"""GPU tests: marked `gpu`, skipped cleanly where no GPU or no native library can be had.

Fixtures:
  native -- the loaded NativeLib (FLASHD_NATIVE_LIB, else built for the local GPU; cached), with the tuning
            overrides of `--cuda-tuning` (tests/conftest.py) applied
  dev    -- a Device on GPU 0 with its own stream
  rng    -- a numpy Generator per test, seeded by its id (the same inputs every run)
"""
import shutil
import zlib

import numpy as np
import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)


def _gpu_reason() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU here (nvidia-smi not found)"
    return None


@pytest.fixture(scope="session")
def native(request):
    reason = _gpu_reason()
    if reason:
        pytest.skip(reason)
    from flashd.daemon.backends.cuda.build import BuildError
    from flashd.daemon.backends.cuda.lib import load

    try:
        lib = load()
    except BuildError as exc:
        pytest.fail(f"the native library does not build: {exc}")
    n = lib.ffi.new("int*")
    if lib.lib.fd_device_count(n) != 0 or n[0] < 1:
        pytest.skip("the CUDA runtime sees no device")
    overrides = request.config.getoption("--cuda-tuning")
    if overrides:                   # tests/conftest.py: the whole run on these launch tunings
        from flashd.daemon.serve_command import parse_tuning
        lib.set_tuning(**parse_tuning(overrides))
    return lib


@pytest.fixture(scope="session")
def dev(native):
    from flashd.daemon.backends.cuda.tensor import Device

    return Device(native)


@pytest.fixture
def rng(request):
    """Seeded by the test's id: every run of a test sees the same inputs (a tolerance is checked on known data,
    and a failure reproduces), while different tests and parameter sets draw different ones."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


POISON_BYTE = 0xFF   # float32 0xFFFFFFFF is a NaN: an output element a kernel forgot to write stays NaN


@pytest.fixture
def poisoned(dev):
    """poisoned(shape, dtype) -> a device tensor filled with NaN bytes."""
    def make(shape, dtype=np.float32):
        t = dev.empty(shape, dtype)
        dev.fill_bytes(t, POISON_BYTE)
        return t
    return make
