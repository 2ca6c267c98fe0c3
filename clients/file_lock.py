"""An exclusive lock file, so that one process does a job (a model download) while others wait."""
from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from .registry import ModelFetchError

__all__ = ["FileLock"]


class FileLock:
    """An exclusive flock on `path` (created if missing), so one process downloads a model while
    others wait. flock locks belong to the open file, so two FileLocks on one path exclude each
    other within one process too. `timeout_s` None waits forever; on_wait() is called once if
    the lock is busy."""

    def __init__(self, path: Path, timeout_s: float | None = None, on_wait=None):
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.on_wait = on_wait
        self._file = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        told = False
        try:
            while True:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        raise
                if not told and self.on_wait is not None:
                    self.on_wait()
                    told = True
                if deadline is not None and time.monotonic() >= deadline:
                    raise ModelFetchError(
                        f"timed out after {self.timeout_s:g} s waiting for the lock {self.path} "
                        f"(another process is downloading this model)")
                time.sleep(0.1)
        except BaseException:
            handle.close()
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")  # who holds it, for a human looking at a stuck pull
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
