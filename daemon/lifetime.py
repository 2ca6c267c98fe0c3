"""How long a daemon lives: the keep-alive idle timer and the ready file.

A resident daemon (the CLI's, clients/resident.py) is started with `--keep-alive SECONDS` and
`--ready-file PATH`:

  IdleTimer   counts the requests in flight; once none has been in flight for keep_alive_s, the
              daemon stops by itself. `status` and `quit` do not count as activity (`flashd ps`
              asks every daemon's status and must not keep them alive).
  ReadyFile   once the daemon serves, its ready event, pid and keep-alive are written to PATH
              atomically (write a temporary file, rename), so whoever waits for it never reads a
              half-written file; at exit the file is removed if it is still this process's.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["IdleTimer", "ReadyFile"]


class IdleTimer:
    """Requests in flight and the time since the last one ended (any thread)."""

    def __init__(self, keep_alive_s: float | None, clock: Callable[[], float] = time.monotonic):
        if keep_alive_s is not None and not keep_alive_s >= 0:
            raise ValueError(f"keep_alive_s must be >= 0 or None, got {keep_alive_s}")
        self.keep_alive_s = keep_alive_s      # None: never stop for idleness
        self._clock = clock
        self._lock = threading.Lock()
        self._in_flight = 0
        self._idle_since = clock()

    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1

    def end(self) -> None:
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            self._idle_since = self._clock()

    def idle_s(self) -> float | None:
        """Seconds with nothing in flight; None while a request is in flight."""
        with self._lock:
            return None if self._in_flight else self._clock() - self._idle_since

    def expired(self) -> bool:
        idle = self.idle_s()
        return self.keep_alive_s is not None and idle is not None and idle >= self.keep_alive_s

    def info(self) -> dict:
        """For `status`: keep_alive_s (null: no timeout), idle_s (null: busy)."""
        idle = self.idle_s()
        return {"keep_alive_s": self.keep_alive_s, "idle_s": None if idle is None else round(idle, 3)}


class ReadyFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def write(self, ready: dict, keep_alive_s: float | None) -> None:
        record = {"pid": os.getpid(), "ready": ready, "keep_alive_s": keep_alive_s, "started": time.time()}
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(record))
        os.replace(temporary, self.path)

    def remove(self, endpoint: str | None = None) -> None:
        """Remove the file if it still describes this process (a newer daemon may own it), and
        before it the ipc socket file of `endpoint` (libzmq leaves it behind). The socket goes
        first: once the ready file is gone a new daemon may bind the same path."""
        try:
            record = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if not (isinstance(record, dict) and record.get("pid") == os.getpid()):
            return
        if endpoint is not None and endpoint.startswith("ipc://"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(endpoint[len("ipc://"):])
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
