"""Starting a private local daemon for one CLI command (or a test) and stopping it afterwards.

    with LocalDaemon.start(DaemonOptions(model=path)) as daemon:
        with daemon.connect() as client:
            ...

The daemon is `python -m flashd.daemon --model PATH --zmq ipc://<private dir>/flashd-<pid>.sock
--no-stdin`: an ipc socket in a fresh 0700 directory, so no other user can reach it and no port
is taken. Its stdout carries the `ready` event (read here); its stderr is ours, so load progress
and errors reach the user directly. It runs in its own session, so a Ctrl-C at the terminal
reaches only the CLI (which turns it into a `cancel`), and on Linux it is sent SIGTERM if the
process that started it dies, so it never outlives its CLI.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .client import Client

__all__ = ["DaemonOptions", "DaemonStartError", "LocalDaemon"]

STOP_TIMEOUT_S = 15.0  # after SIGTERM, how long the daemon gets to finish before SIGKILL


class DaemonStartError(RuntimeError):
    """The daemon exited (or hung) before printing its ready event."""


@dataclass(slots=True, frozen=True)
class DaemonOptions:
    model: str                      # GGUF path (or a registry name: the daemon resolves it)
    device: str | None = None       # None: the daemon's default (auto)
    max_ctx: int | None = None      # None: the daemon's default
    log_level: str = "warning"      # the daemon's --log-level (its stderr is the CLI's)
    extra_args: tuple[str, ...] = ()
    ready_timeout_s: float = 900.0  # loading a large model on a CPU is slow

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("DaemonOptions.model must be a path or a model name")
        if self.max_ctx is not None and self.max_ctx < 1:
            raise ValueError(f"max_ctx must be >= 1, got {self.max_ctx}")
        if not self.ready_timeout_s > 0:
            raise ValueError(f"ready_timeout_s must be > 0, got {self.ready_timeout_s}")

    def argv(self, address: str) -> list[str]:
        args = [sys.executable, "-m", "flashd.daemon", "--model", str(self.model), "--zmq", address,
                "--no-stdin", "--log-level", self.log_level]
        if self.device is not None:
            args += ["--device", self.device]
        if self.max_ctx is not None:
            args += ["--max-ctx", str(self.max_ctx)]
        return args + list(self.extra_args)


MAX_IPC_PATH_BYTES = 100  # sun_path holds 108 bytes on Linux (104 on macOS)


def _private_address(workdir: Path) -> str:
    """An ipc socket in the private directory; where ipc is unavailable or the path too long,
    a free loopback port (the daemon picks it; its ready event says which)."""
    socket_path = f"{workdir}/flashd-{os.getpid()}.sock"
    if os.name == "posix" and len(socket_path.encode()) <= MAX_IPC_PATH_BYTES:
        return f"ipc://{socket_path}"
    return "tcp://127.0.0.1:*"


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to send SIGTERM when the parent goes away."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class LocalDaemon:
    """A running daemon process started by this one."""

    def __init__(self, process: subprocess.Popen, address: str, ready: dict, workdir: Path):
        self.process = process
        self.address = address   # what to connect to (the endpoint the daemon reports)
        self.ready = ready       # its ready event: model, arch, backend, max_ctx, ...
        self._workdir = workdir
        self._stdout_thread: threading.Thread | None = None

    @classmethod
    def start(cls, options: DaemonOptions, *, env: dict | None = None) -> "LocalDaemon":
        """Start the daemon and wait for its ready event (DaemonStartError if it never comes)."""
        workdir = Path(tempfile.mkdtemp(prefix="flashd-"))  # mode 0700
        address = _private_address(workdir)
        try:
            process = subprocess.Popen(
                options.argv(address), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None,
                env=env, start_new_session=True, preexec_fn=_die_with_parent)
        except OSError as exc:
            shutil.rmtree(workdir, ignore_errors=True)
            raise DaemonStartError(f"cannot start the daemon ({options.argv(address)[0]}): {exc}") from None
        ready_box: list[dict] = []
        got_ready = threading.Event()

        def read_stdout() -> None:
            # The ready event, then drain whatever else comes so the daemon never blocks on us.
            for raw in process.stdout:
                if not got_ready.is_set():
                    with contextlib.suppress(ValueError):
                        event = json.loads(raw)
                        if isinstance(event, dict) and event.get("event") == "ready":
                            ready_box.append(event)
                            got_ready.set()

        reader = threading.Thread(target=read_stdout, name="flashd-daemon-stdout", daemon=True)
        reader.start()
        deadline = time.monotonic() + options.ready_timeout_s
        try:
            while not got_ready.wait(0.1):
                status = process.poll()
                if status is not None:
                    reader.join(1.0)
                    if got_ready.is_set():
                        break
                    raise DaemonStartError(f"the daemon exited with status {status} before it was ready "
                                           f"(its messages are above, on stderr)")
                if time.monotonic() > deadline:
                    raise DaemonStartError(f"the daemon was not ready after {options.ready_timeout_s:g} s")
        except BaseException:  # also KeyboardInterrupt while loading
            _terminate(process)
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        ready = ready_box[0]
        daemon = cls(process, ready.get("zmq") or address, ready, workdir)
        daemon._stdout_thread = reader
        return daemon

    @property
    def model_path(self) -> str | None:
        return self.ready.get("model")

    def alive(self) -> bool:
        return self.process.poll() is None

    def connect(self, **client_kwargs) -> Client:
        """A Client for this daemon that fails fast (DaemonGone) if the process dies."""
        client_kwargs.setdefault("daemon_alive", self.alive)
        return Client(self.address, **client_kwargs)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (the daemon cancels what is running and exits), SIGKILL after timeout_s.
        Returns the exit status."""
        status = _terminate(self.process, timeout_s)
        if self._stdout_thread is not None:
            self._stdout_thread.join(2.0)  # ends at EOF, now that the process is gone
        if self.process.stdout is not None and (self._stdout_thread is None or not self._stdout_thread.is_alive()):
            self.process.stdout.close()
        shutil.rmtree(self._workdir, ignore_errors=True)
        return status

    def __enter__(self) -> "LocalDaemon":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _terminate(process: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(5.0)
    return process.returncode
