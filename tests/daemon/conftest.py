"""Fixtures for the daemon tests: a tiny synthetic model, and factories that start the real
daemon processes (see daemon_harness.py) and kill them at teardown if still running.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import zmq

from tests.daemon.daemon_harness import LUCEBOX_MODULE, SYNTHETIC_SPEC, LuceboxDaemon, probe_fresh_daemon, serve_factory
from flashd.scripts.make_synthetic_gguf import write_synthetic_model


@pytest.fixture(scope="session")
def synthetic_model(tmp_path_factory) -> Path:
    return write_synthetic_model(tmp_path_factory.mktemp("daemon-model") / "tiny-qwen2.gguf", SYNTHETIC_SPEC)


@pytest.fixture
def spawn_serve(synthetic_model, tmp_path):
    """spawn_serve(*extra_args, max_ctx=512, model=None) -> a ready ServeDaemon (killed at teardown)."""
    with serve_factory(synthetic_model, tmp_path) as spawn:
        yield spawn


@pytest.fixture(scope="session")
def reference_outputs(synthetic_model, tmp_path_factory) -> dict[str, list[int]]:
    """The probes' output on a fresh daemon that has served nothing else."""
    return probe_fresh_daemon(synthetic_model, tmp_path_factory.mktemp("reference"))


@pytest.fixture
def zmq_context():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(0)


@pytest.fixture
def spawn_lucebox(synthetic_model, tmp_path):
    """spawn_lucebox(*extra_args, argv_head=LUCEBOX_MODULE, draft=model, env=None) -> LuceboxDaemon
    (not yet read: call .status_line() for `[daemon] ready`); env: extra environment variables."""
    started: list[LuceboxDaemon] = []

    def spawn(*extra: str, argv_head: list[str] = LUCEBOX_MODULE, target: Path | None = None,
              draft: Path | None = None, env: dict[str, str] | None = None) -> LuceboxDaemon:
        daemon = LuceboxDaemon(argv_head, target or synthetic_model, draft or synthetic_model, tmp_path, *extra,
                               env={**os.environ, **env} if env else None)
        started.append(daemon)
        return daemon

    yield spawn
    for daemon in started:
        daemon.kill()
