"""Fixtures of the fault and bad-input suite: the real daemon processes (tests/daemon's harness,
reused), a fresh daemon's probe outputs to compare against, and the per-class fault table printed
at the end of every run (also with -q).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from tests.daemon.daemon_harness import SYNTHETIC_SPEC, probe_fresh_daemon, serve_factory
from tests.faults.fault_registry import REGISTRY, FaultRegistry


@pytest.fixture(scope="session")
def faults() -> FaultRegistry:
    return REGISTRY


@pytest.fixture(scope="session")
def fault_model(tmp_path_factory) -> Path:
    return write_synthetic_model(tmp_path_factory.mktemp("fault-model") / "tiny-qwen2.gguf", SYNTHETIC_SPEC)


@pytest.fixture(scope="session")
def fresh_probe(fault_model, tmp_path_factory) -> dict[str, list[int]]:
    """The probe generations of a daemon that has served nothing else: what every daemon must
    still produce after a fault."""
    return probe_fresh_daemon(fault_model, tmp_path_factory.mktemp("fresh"))


# tests/daemon's zmq_context with another scope: one context serves a module's tests here (the peers made
# from it are per test and closed by their fixtures), one per test there; a fixture shared by both folders
# would force one scope on both.
@pytest.fixture(scope="module")
def zmq_ctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(0)


@pytest.fixture
def spawn(fault_model, tmp_path):
    """spawn(*serve_args, max_ctx=512) -> a ready ServeDaemon on the fault model (killed at teardown)."""
    with serve_factory(fault_model, tmp_path) as start:
        yield start


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rows = REGISTRY.table()
    if not rows:
        return
    terminalreporter.write_sep("=", "fault suite: requests sent and invariant failures per class")
    for row in rows:
        terminalreporter.write_line(row)
