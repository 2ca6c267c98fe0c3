"""Resident daemons: the CLI's model stays loaded between commands.

`flashd generate` and `flashd chat` (without --daemon) look for a daemon of this user already
serving the same model with the same settings, start one in the background when there is none,
and leave it running: it exits by itself once it has been idle for its keep-alive (`--keep-alive`,
default 5 minutes; `flashd ps` shows it, `flashd stop` ends it). Like Ollama's server, except that
each (model, device, max_ctx, drafters) is its own process.

Everything lives in one per-user runtime directory (mode 0700, owned by the user; refused
otherwise), `$FLASHD_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/flashd`, else `/tmp/flashd-<uid>`:

  <key>.sock   the daemon's ZeroMQ ipc socket (reachable by this user only: the directory's mode)
  <key>.json   its ready event plus pid and keep-alive, written by the daemon once it serves
               (`flashd serve --ready-file`) and removed by it when it exits
  <key>.log    its stderr: load progress, warnings, why it stopped
  <key>.lock   held while one CLI finds or starts the daemon, so two CLIs started at once share one

<key> is a digest of the resolved model path and the settings, so two different models (or one
model at two context sizes) never share a daemon.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .client import Client, ClientTimeout, DaemonError, DaemonGone
from .spawn import MAX_IPC_PATH_BYTES, DaemonOptions, DaemonStartError

__all__ = ["DEFAULT_KEEP_ALIVE_S", "parse_keep_alive", "format_keep_alive", "runtime_dir", "ResidentKey",
           "ResidentDaemon", "find_or_start", "list_resident", "stop_resident"]

DEFAULT_KEEP_ALIVE_S = 300.0   # Ollama's default: 5 minutes
PING_TIMEOUT_S = 5.0           # a live daemon answers `status` at once, even while generating
LOCK_TIMEOUT_S = 900.0         # another CLI may be loading the same model (a large one on a CPU)
STOP_WAIT_S = 15.0             # after `quit`, how long the process gets before SIGTERM, then SIGKILL
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_keep_alive(text: str) -> float | None:
    """'300', '30s', '5m', '1.5h', '0' -> seconds; '-1', 'forever', 'inf' -> None (no timeout).
    0 means: no resident daemon (a private one for the command, stopped after it)."""
    value = text.strip().lower()
    if value in ("-1", "forever", "inf", "infinite", "never"):
        return None
    scale = 1.0
    if value[-1:] in _UNITS:
        value, scale = value[:-1], _UNITS[value[-1]]
    try:
        seconds = float(value) * scale
    except ValueError:
        raise ValueError(f"keep-alive {text!r}: expected seconds or a duration like 30s, 5m, 2h "
                         f"(0: exit after the command; -1: until `flashd stop`)") from None
    if not (seconds >= 0 and seconds != float("inf")):
        raise ValueError(f"keep-alive {text!r}: must be >= 0 (or -1 for no timeout)")
    return seconds


def format_keep_alive(seconds: float | None) -> str:
    if seconds is None:
        return "forever"
    for unit, scale in (("h", 3600.0), ("m", 60.0)):
        if seconds >= scale and seconds % scale == 0:
            return f"{seconds / scale:g}{unit}"
    return f"{seconds:g}s"


def runtime_dir() -> Path:
    """The user's private runtime directory, created 0700; an existing one must be the user's
    own and not writable or readable by others (it holds sockets that accept requests)."""
    explicit = os.environ.get("FLASHD_RUNTIME_DIR")
    if explicit:
        path = Path(explicit)
    elif os.environ.get("XDG_RUNTIME_DIR") and Path(os.environ["XDG_RUNTIME_DIR"]).is_dir():
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "flashd"
    else:
        path = Path("/tmp") / f"flashd-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError as exc:
        raise DaemonStartError(f"cannot use the runtime directory {path}: {exc}") from None
    if not path.is_dir() or path.is_symlink():
        raise DaemonStartError(f"the runtime directory {path} is not a directory")
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise DaemonStartError(f"the runtime directory {path} must belong to you and have mode 0700 "
                               f"(it has uid {info.st_uid}, mode {info.st_mode & 0o777:o})")
    return path


@dataclass(slots=True, frozen=True)
class ResidentKey:
    """What must match for a command to use a running daemon."""

    model: str                   # resolved absolute path of the GGUF
    device: str = "auto"
    max_ctx: int | None = None   # None: the daemon's default
    drafts: tuple[str, ...] = ()

    def digest(self) -> str:
        text = json.dumps([self.model, self.device, self.max_ctx, sorted(self.drafts)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def options(self, log_level: str, keep_alive_s: float | None, ready_file: Path) -> DaemonOptions:
        extra = [a for d in self.drafts for a in ("--draft", d)]
        extra += ["--keep-alive", "-1" if keep_alive_s is None else f"{keep_alive_s:g}",
                  "--ready-file", str(ready_file)]
        return DaemonOptions(model=self.model, device=None if self.device == "auto" else self.device,
                             max_ctx=self.max_ctx, log_level=log_level, extra_args=tuple(extra))


@dataclass(slots=True)
class ResidentDaemon:
    """A resident daemon as its ready file describes it."""

    key: str
    pid: int
    address: str
    ready: dict           # the daemon's ready event (model, backend, max_ctx, drafts, ...)
    keep_alive_s: float | None
    log_path: Path

    def alive(self) -> bool:
        return _pid_alive(self.pid)

    def connect(self, **client_kwargs) -> Client:
        client_kwargs.setdefault("daemon_alive", self.alive)
        return Client(self.address, **client_kwargs)


def _paths(directory: Path, key: str) -> dict[str, Path]:
    return {ext: directory / f"{key}.{ext}" for ext in ("sock", "json", "log", "lock")}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:       # someone else's process: not ours, so not our daemon
        return False
    return True


def _read_ready_file(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int) or not isinstance(
            record.get("ready"), dict):
        return None
    return record


def _describe(directory: Path, key: str, record: dict) -> ResidentDaemon:
    ready = record["ready"]
    return ResidentDaemon(key=key, pid=record["pid"], address=ready.get("zmq") or "", ready=ready,
                          keep_alive_s=record.get("keep_alive_s"), log_path=_paths(directory, key)["log"])


def _answers(daemon: ResidentDaemon) -> dict | None:
    """Its status, or None if it does not answer."""
    if not daemon.address or not daemon.alive():
        return None
    try:
        with daemon.connect(timeout_s=PING_TIMEOUT_S) as client:
            return client.status(timeout_s=PING_TIMEOUT_S)
    except (ClientTimeout, DaemonGone, DaemonError, ValueError, OSError):
        return None


def _remove(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _serves_socket(pid: int, socket_path: Path) -> bool:
    """Whether process `pid` was started to serve `socket_path` (a reused pid was not)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return sys.platform != "linux"    # no /proc: trust the pid
    return str(socket_path).encode() in cmdline


@contextlib.contextmanager
def _locked(path: Path, timeout_s: float) -> Iterator[None]:
    with open(path, "a") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DaemonStartError(f"another flashd command held {path} for {timeout_s:g} s") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _running(directory: Path, key: str) -> ResidentDaemon | None:
    """The daemon for `key` if one serves; stale files of a dead one are removed."""
    paths = _paths(directory, key)
    record = _read_ready_file(paths["json"])
    if record is None:
        return None
    daemon = _describe(directory, key, record)
    if _answers(daemon) is not None:
        return daemon
    if daemon.alive() and _serves_socket(daemon.pid, paths["sock"]):
        raise DaemonStartError(f"the resident daemon (pid {daemon.pid}) for {record['ready'].get('model')} does "
                               f"not answer; `flashd stop` ends it (its log: {paths['log']})")
    _remove(paths["json"], paths["sock"])    # it died without cleaning up (kill -9, a crash)
    return None


def _start(directory: Path, key: ResidentKey, log_level: str, keep_alive_s: float | None,
           echo: Callable[[bytes], None], ready_timeout_s: float) -> ResidentDaemon:
    digest = key.digest()
    paths = _paths(directory, digest)
    address = f"ipc://{paths['sock']}"
    if len(str(paths["sock"]).encode()) > MAX_IPC_PATH_BYTES:
        raise DaemonStartError(f"the runtime directory {directory} is too long a path for a socket; "
                               f"set FLASHD_RUNTIME_DIR to a shorter one")
    argv = key.options(log_level, keep_alive_s, paths["json"]).argv(address)
    _remove(paths["json"])
    with open(paths["log"], "wb") as log:
        try:
            # Its own session (a Ctrl-C or a closed terminal does not reach it), cwd / (it holds no
            # directory), stdout unused (--ready-file says when it serves), stderr to its log.
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                       cwd="/", start_new_session=True)
        except OSError as exc:
            raise DaemonStartError(f"cannot start the daemon ({argv[0]}): {exc}") from None
    deadline = time.monotonic() + ready_timeout_s
    with open(paths["log"], "rb") as tail:
        def forward() -> None:
            chunk = tail.read()
            if chunk:
                echo(chunk)

        try:
            while True:
                forward()
                record = _read_ready_file(paths["json"])
                if record is not None and record["pid"] == process.pid:
                    return _describe(directory, digest, record)
                status = process.poll()
                if status is not None:
                    forward()
                    raise DaemonStartError(f"the daemon exited with status {status} before it was ready "
                                           f"(its messages are above; log: {paths['log']})")
                if time.monotonic() > deadline:
                    raise DaemonStartError(f"the daemon was not ready after {ready_timeout_s:g} s "
                                           f"(log: {paths['log']})")
                time.sleep(0.05)
        except BaseException:        # also KeyboardInterrupt while loading: no half-started daemon
            _terminate(process.pid)
            process.wait()
            _remove(paths["json"], paths["sock"])
            raise


def find_or_start(key: ResidentKey, *, keep_alive_s: float | None = DEFAULT_KEEP_ALIVE_S,
                  log_level: str = "warning", echo: Callable[[bytes], None] | None = None,
                  ready_timeout_s: float = 900.0) -> tuple[ResidentDaemon, bool]:
    """The resident daemon for `key`, started if none serves; (daemon, started_now). `echo`
    receives the starting daemon's stderr (load progress, errors) until it is ready."""
    if keep_alive_s is not None and keep_alive_s <= 0:
        raise ValueError("keep_alive_s must be > 0 or None for a resident daemon")
    directory = runtime_dir()
    paths = _paths(directory, key.digest())
    with _locked(paths["lock"], LOCK_TIMEOUT_S):
        daemon = _running(directory, key.digest())
        if daemon is not None:
            return daemon, False
        return _start(directory, key, log_level, keep_alive_s, echo or (lambda chunk: None), ready_timeout_s), True


def list_resident() -> list[tuple[ResidentDaemon, dict | None]]:
    """Every resident daemon of this user with its status (None: it does not answer). Files
    left by dead daemons are removed."""
    directory = runtime_dir()
    found = []
    for path in sorted(directory.glob("*.json")):
        key = path.stem
        record = _read_ready_file(path)
        if record is None:
            continue
        daemon = _describe(directory, key, record)
        status = _answers(daemon)
        if status is None and not daemon.alive():
            _remove(path, _paths(directory, key)["sock"])
            continue
        found.append((daemon, status))
    return found


def _terminate(pid: int, signum: int = signal.SIGTERM) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        with contextlib.suppress(ChildProcessError):    # our own child (a test): reap it
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        time.sleep(0.05)
    return True


def stop_resident(daemon: ResidentDaemon, timeout_s: float = STOP_WAIT_S) -> str:
    """End a resident daemon: `quit` (it cancels what runs and exits), then SIGTERM, then
    SIGKILL. Returns how it ended."""
    how = "quit"
    try:
        with daemon.connect(timeout_s=PING_TIMEOUT_S) as client:
            client.quit(timeout_s=PING_TIMEOUT_S)
    except (ClientTimeout, DaemonGone, DaemonError, ValueError, OSError):
        how = "SIGTERM"
        _terminate(daemon.pid)
    if not _wait_gone(daemon.pid, timeout_s):
        how = "SIGKILL"
        _terminate(daemon.pid, signal.SIGKILL)
        _wait_gone(daemon.pid, 5.0)
    directory = daemon.log_path.parent
    paths = _paths(directory, daemon.key)
    record = _read_ready_file(paths["json"])
    if record is not None and record["pid"] == daemon.pid:
        _remove(paths["json"], paths["sock"])
    return how
