"""Handles on the real daemon processes for the tests in this folder: `flashd serve` (through
`python -m flashd.daemon`), its ZeroMQ peers, and `flashd-lucebox-daemon`.

Every read from a daemon is a poll with a deadline, so a daemon that hangs fails its test
(with the daemon's stderr in the message) instead of hanging CI.
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import zmq

from flashd.scripts.make_synthetic_gguf import SyntheticSpec

# A qwen2-shaped model small enough that a daemon starts in well under a second and decodes
# thousands of tokens per second on the reference backend.
SYNTHETIC_SPEC = SyntheticSpec(arch="qwen2", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128,
                               vocab_size=512, weight_type="Q8_0", seed=20240611, name="daemon-test")
READ_TIMEOUT_S = 30.0    # the longest any single answer may take before the test fails
# The prompts every "does the daemon still behave like a fresh one" check generates.
PROBES = {
    "greedy": 'generate id={id} text="The quick brown fox" max_tokens=24 ignore_eos=true',
    "sampled": 'generate id={id} text="def fib(n):" max_tokens=24 ignore_eos=true temperature=0.9 '
               'top_k=50 top_p=0.95 seed=7',
}
LONG_MAX_CTX = 8192       # daemons that run a generate long enough to be cancelled mid-way
LONG_GENERATE_TOKENS = 8000


class DaemonFailed(AssertionError):
    pass


class _Process:
    """A child process with stderr in a file (shown when a test fails)."""

    def __init__(self, argv: list[str], workdir: Path, **popen):
        self.stderr_path = workdir / f"stderr-{time.monotonic_ns()}.log"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(argv, stderr=self._stderr, **popen)

    def stderr_tail(self, n_chars: int = 4000) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")[-n_chars:]

    def fail(self, message: str) -> DaemonFailed:
        return DaemonFailed(f"{message}\n--- daemon stderr (tail) ---\n{self.stderr_tail()}")

    def wait(self, timeout: float = READ_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise self.fail(f"the daemon did not exit within {timeout} s") from None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._stderr.close()


class _LineBuffer:
    """Lines from a pipe read with poll + os.read and a deadline."""

    def __init__(self, fd: int, owner: _Process):
        self.fd, self.owner, self._buf = fd, owner, b""

    def readline(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.owner.fail(f"no output line within {timeout} s (partial: {self._buf[:200]!r})")
            if not select.select([self.fd], [], [], left)[0]:
                continue
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise self.owner.fail(f"stdout closed (exit status {self.owner.proc.poll()}); "
                                      f"partial line {self._buf[:200]!r}")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def at_eof(self, timeout: float) -> bytes:
        """Everything left until EOF (the process exiting)."""
        deadline = time.monotonic() + timeout
        data, self._buf = self._buf, b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.owner.fail(f"stdout not closed within {timeout} s")
            if select.select([self.fd], [], [], left)[0]:
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    return data
                data += chunk


class _EventStream:
    """Events with a stash: reading for one request id keeps other requests' events."""

    def __init__(self):
        self._stash: list[dict] = []

    def _read_event(self, timeout: float) -> dict:
        raise NotImplementedError

    def next_event(self, timeout: float = READ_TIMEOUT_S) -> dict:
        if self._stash:
            return self._stash.pop(0)
        return self._read_event(timeout)

    def events_for(self, request_id: str, timeout: float = READ_TIMEOUT_S) -> list[dict]:
        """Every event of `request_id` up to and including its terminal event."""
        deadline = time.monotonic() + timeout
        out: list[dict] = []
        kept = []
        for event in self._stash:
            (out if event.get("id") == request_id and not _has_terminal(out) else kept).append(event)
        self._stash = kept
        while not _has_terminal(out):
            event = self._read_event(max(0.0, deadline - time.monotonic()))
            (out if event.get("id") == request_id else self._stash).append(event)
        return out

    def first_event_for(self, request_id: str, timeout: float = READ_TIMEOUT_S) -> dict:
        """The next event of `request_id` (left out of later events_for calls)."""
        for index, event in enumerate(self._stash):
            if event.get("id") == request_id:
                return self._stash.pop(index)
        deadline = time.monotonic() + timeout
        while True:
            event = self._read_event(max(0.0, deadline - time.monotonic()))
            if event.get("id") == request_id:
                return event
            self._stash.append(event)


def _has_terminal(events: list[dict]) -> bool:
    return bool(events) and events[-1].get("event") in ("done", "result", "error")


def generated(events: list[dict]) -> tuple[list[int], str, dict]:
    """(ids, text, terminal event) of one generate's events; checks their shape."""
    assert events, "no events"
    terminal = events[-1]
    assert all(e["event"] == "token" for e in events[:-1]), events
    assert terminal["event"] in ("done", "error"), terminal
    ids = [t for e in events[:-1] for t in e["ids"]]
    text = "".join(e["text"] for e in events[:-1])
    if "ids" in terminal:                 # stream=false
        ids, text = terminal["ids"], terminal["text"]
    return ids, text, terminal


class ServeDaemon(_Process, _EventStream):
    """`python -m flashd.daemon ...` with pipes on stdin and stdout."""

    def __init__(self, model: Path, workdir: Path, *extra: str, max_ctx: int = 512):
        argv = [sys.executable, "-m", "flashd.daemon", "--model", str(model), "--device", "cpu",
                "--max-ctx", str(max_ctx), "--log-level", "info", *extra]
        _Process.__init__(self, argv, workdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        _EventStream.__init__(self)
        self.out = _LineBuffer(self.proc.stdout.fileno(), self)
        self.ready = self._read_event(READ_TIMEOUT_S)
        if self.ready.get("event") != "ready":
            raise self.fail(f"first stdout line is not the ready event: {self.ready}")
        self._n_probe = 0

    def _read_event(self, timeout: float) -> dict:
        line = self.out.readline(timeout)
        try:
            return json.loads(line)
        except ValueError:
            raise self.fail(f"stdout line is not JSON: {line[:200]!r}") from None

    def send(self, line: str | bytes) -> None:
        data = line if isinstance(line, bytes) else line.encode("utf-8")
        self.proc.stdin.write(data if data.endswith(b"\n") else data + b"\n")
        self.proc.stdin.flush()

    def ask(self, line: str, request_id: str, timeout: float = READ_TIMEOUT_S) -> list[dict]:
        self.send(line)
        return self.events_for(request_id, timeout)

    def probe(self) -> dict[str, list[int]]:
        """The probe generations' ids (compare with the `reference_outputs` fixture)."""
        out = {}
        for name, template in PROBES.items():
            self._n_probe += 1
            request_id = f"probe-{name}-{self._n_probe}"
            ids, _, done = generated(self.ask(template.format(id=request_id), request_id))
            assert done["event"] == "done", done
            out[name] = ids
        return out

    def wait_idle(self, timeout: float = READ_TIMEOUT_S) -> dict:
        """Poll `status` until nothing runs or waits (a terminal event can reach the client a
        moment before the engine has put the request down); the last status."""
        deadline = time.monotonic() + timeout
        while True:
            self._n_probe += 1
            status = self.ask(f"status id=idle-{self._n_probe}", f"idle-{self._n_probe}")[-1]
            if status["running"] is None and status["queued"] == 0:
                return status
            if time.monotonic() > deadline:
                raise self.fail(f"still busy after {timeout} s: {status}")
            time.sleep(0.02)

    def close_stdin(self) -> None:
        self.proc.stdin.close()


# ------------------------------------------------------------------------------------- zeromq


class ZmqPeer(_EventStream):
    """A DEALER connected to a daemon's ROUTER."""

    def __init__(self, ctx: zmq.Context, endpoint: str, owner: _Process):
        super().__init__()
        self.owner = owner
        self.socket = ctx.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)

    def send(self, fields: dict | bytes) -> None:
        self.socket.send(fields if isinstance(fields, bytes) else msgpack.packb(fields, use_bin_type=True))

    def send_frames(self, frames: list[bytes]) -> None:
        self.socket.send_multipart(frames)

    def _read_event(self, timeout: float) -> dict:
        if not self.socket.poll(int(timeout * 1000)):
            raise self.owner.fail(f"no ZeroMQ event within {timeout:.1f} s")
        frame = self.socket.recv()
        event = msgpack.unpackb(frame, raw=False)
        assert isinstance(event, dict), event
        return event

    def ask(self, fields: dict, timeout: float = READ_TIMEOUT_S) -> list[dict]:
        self.send(fields)
        return self.events_for(str(fields["id"]), timeout)

    def close(self) -> None:
        self.socket.close(0)


# ------------------------------------------------------------------------------------ lucebox

SENTINEL = -1


class LuceboxDaemon(_Process):
    """flashd-lucebox-daemon with stdin/stdout pipes and a stream pipe passed as --stream-fd."""

    def __init__(self, argv_head: list[str], target: Path, draft: Path, workdir: Path, *extra: str,
                 env: dict[str, str] | None = None):
        self.stream_r, stream_w = os.pipe()
        argv = [*argv_head, str(target), str(draft), "--daemon", f"--stream-fd={stream_w}", *extra]
        try:
            _Process.__init__(self, argv, workdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              pass_fds=(stream_w,), env=env)
        finally:
            os.close(stream_w)                # only the daemon holds the write end: EOF when it exits
        self.out = _LineBuffer(self.proc.stdout.fileno(), self)
        self._stream_buf = b""

    def status_line(self, timeout: float = READ_TIMEOUT_S) -> str:
        return self.out.readline(timeout).decode("utf-8")

    def send(self, line: str) -> None:
        self.proc.stdin.write((line + "\n").encode("utf-8"))
        self.proc.stdin.flush()

    def _read_stream(self, timeout: float, closed: str) -> None:
        """Append what the stream holds within `timeout` s to the buffer; fails with `closed` at its end."""
        if select.select([self.stream_r], [], [], timeout)[0]:
            chunk = os.read(self.stream_r, 1 << 16)
            if not chunk:
                raise self.fail(closed)
            self._stream_buf += chunk

    def stream_until_sentinel(self, timeout: float = READ_TIMEOUT_S) -> list[int]:
        """int32 ids from the stream fd up to (not including) the next -1."""
        deadline = time.monotonic() + timeout
        ids: list[int] = []
        while True:
            while len(self._stream_buf) >= 4:
                (value,), self._stream_buf = struct.unpack("<i", self._stream_buf[:4]), self._stream_buf[4:]
                if value == SENTINEL:
                    return ids
                ids.append(value)
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.fail(f"no -1 on the stream within {timeout} s (ids so far {ids[:20]})")
            self._read_stream(left, f"stream closed before -1 (ids so far {ids[:20]})")

    def stream_buffered_ids(self, n: int, timeout: float = READ_TIMEOUT_S) -> list[int]:
        """The next n ids from the stream (fails on a -1 among them)."""
        deadline = time.monotonic() + timeout
        while len(self._stream_buf) < 4 * n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.fail(f"fewer than {n} ids on the stream within {timeout} s")
            self._read_stream(left, "stream closed")
        ids = list(struct.unpack(f"<{n}i", self._stream_buf[:4 * n]))
        self._stream_buf = self._stream_buf[4 * n:]
        assert SENTINEL not in ids, ids
        return ids

    def close_stream(self) -> None:
        """Close our read end, as a client that goes away does."""
        os.close(self.stream_r)
        self.stream_r = -1

    def command(self, line: str, timeout: float = READ_TIMEOUT_S) -> tuple[str, list[int]]:
        """Send one command: (its status line, the ids it streamed before its -1)."""
        self.send(line)
        return self.status_line(timeout), self.stream_until_sentinel(timeout)

    def stream_rest(self, timeout: float = READ_TIMEOUT_S) -> bytes:
        """What remains on the stream until the daemon closes it (by exiting)."""
        deadline = time.monotonic() + timeout
        data, self._stream_buf = self._stream_buf, b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.fail("stream fd not closed")
            if select.select([self.stream_r], [], [], left)[0]:
                chunk = os.read(self.stream_r, 1 << 16)
                if not chunk:
                    return data
                data += chunk

    def kill(self) -> None:
        super().kill()
        if self.stream_r >= 0:
            os.close(self.stream_r)
            self.stream_r = -1


LUCEBOX_MODULE = [sys.executable, "-m", "flashd.daemon.lucebox"]


def check_speculative_equals_greedy(daemon: ServeDaemon, prompts: list[str], n_tokens: int,
                                    configs: list[tuple[str, int, str]]) -> None:
    """Per prompt, n_tokens of plain greedy decoding; then every (spec mode, budget, drafter name) of `configs`
    must stream exactly those tokens, its `done` naming the drafter and mode with 1..n_tokens-1 steps."""
    n = 0
    for prompt in prompts:
        n += 1
        plain, _, done = generated(daemon.ask(
            f'generate id=p{n} text="{prompt}" max_tokens={n_tokens} ignore_eos=true', f"p{n}"))
        assert done["event"] == "done" and len(plain) == n_tokens
        for mode, budget, draft in configs:
            n += 1
            ids, _, done = generated(daemon.ask(
                f'generate id=s{n} text="{prompt}" max_tokens={n_tokens} ignore_eos=true spec={mode} budget={budget} '
                f'draft={draft}', f"s{n}"))
            assert done["event"] == "done", done
            assert ids == plain, f"{draft} {mode} budget {budget} on {prompt!r}: differs from greedy"
            stats = done["spec"]
            assert stats["draft"] == draft and stats["mode"] == mode and 1 <= stats["steps"] <= n_tokens - 1


def probe_fresh_daemon(model: Path, workdir: Path) -> dict[str, list[int]]:
    """The probe generations of a daemon on `model` that has served nothing else (killed after)."""
    daemon = ServeDaemon(model, workdir)
    try:
        return daemon.probe()
    finally:
        daemon.kill()


@contextlib.contextmanager
def serve_factory(default_model: Path, workdir: Path):
    """Yields start(*extra_args, max_ctx=512, model=default_model) -> a ready ServeDaemon; every daemon it
    started is killed at the end (the spawn fixtures of tests/daemon and tests/faults)."""
    started: list[ServeDaemon] = []

    def start(*extra: str, max_ctx: int = 512, model: Path | None = None) -> ServeDaemon:
        daemon = ServeDaemon(model or default_model, workdir, *extra, max_ctx=max_ctx)
        started.append(daemon)
        return daemon

    try:
        yield start
    finally:
        for daemon in started:
            daemon.kill()


def write_ids(path: Path, ids: list[int]) -> Path:
    path.write_bytes(struct.pack(f"<{len(ids)}i", *ids))
    return path
