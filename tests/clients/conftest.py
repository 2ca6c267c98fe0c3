"""Fixtures of the client tests: one tiny synthetic model and one real daemon on it per module.

A qwen2-shaped model small enough to load in well under a second and decode thousands of tokens
per second on the reference backend. Each module gets its own daemon (module scope) so the
modules' tests cannot disturb each other's state. The fake model sources of test_pull*.py (fake_index,
fake_hub, silent_server) come from fake_model_sources.py."""
from __future__ import annotations

import pytest

from flashd.clients.spawn import DaemonOptions, LocalDaemon
from tests.clients.fake_model_sources import fake_hub, fake_index, silent_server  # noqa: F401 -- test_pull*.py's fixtures

TINY = dict(arch="qwen2", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=512,
            weight_type="Q8_0", seed=7, name="client-test")
CONNECT_TIMEOUT_S = 60.0  # the longest any answer to the `client` fixture may take


@pytest.fixture(scope="module")
def tiny_spec() -> dict:
    return dict(TINY)


@pytest.fixture(scope="module")
def tiny_model(synthetic_model, tiny_spec):
    return synthetic_model(**tiny_spec)


@pytest.fixture(scope="module")
def daemon(tiny_model):
    with LocalDaemon.start(DaemonOptions(model=str(tiny_model), device="cpu", max_ctx=4096,
                                         ready_timeout_s=60)) as running:
        yield running


@pytest.fixture
def client(daemon):
    with daemon.connect(timeout_s=CONNECT_TIMEOUT_S) as connected:
        yield connected
