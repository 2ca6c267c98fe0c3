"""Process plumbing shared by the daemon's front ends (`flashd serve`, `flashd-lucebox-daemon`).

Both are long-running processes whose stdout is a protocol channel and whose stdin is a stream
of commands. What they share lives here:

  claim_stdout       stdout for protocol output only: fd 1 is pointed at stderr, so a stray
                     print() or a C library's printf can never corrupt the protocol stream
  LineReader         lines from stdin's fd with a length bound, interruptible, without Python's
                     buffered sys.stdin (a thread blocked in its readline holds a lock that
                     interpreter shutdown then waits on)
  read_ids_file      bounded, non-blocking read of an `@path` ids file
  check_gguf         "is this a readable GGUF file" with a message that names the path
  resolve_model      model name or path -> path (through the registry once it exists)
  load_engine        Engine construction and loading with a progress bar on stderr
  StopSignals        SIGINT/SIGTERM -> a callback (a second signal exits at once)
"""
from __future__ import annotations

import errno
import logging
import os
import select
import signal
import stat
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from .config import EngineConfig

__all__ = [
    "setup_logging", "claim_stdout", "LineReader", "OverlongLine", "read_ids_file", "check_gguf",
    "resolve_model", "load_engine", "StopSignals", "StartupError", "GGUF_MAGIC",
]

log = logging.getLogger("flashd.daemon")

GGUF_MAGIC = b"GGUF"
LOG_LEVELS = ("debug", "info", "warning", "error")


class StartupError(Exception):
    """The daemon cannot start (bad model path, unusable device, bad address): the message is
    printed on stderr and the process exits with status 1."""


def setup_logging(level: str) -> None:
    """Logs go to stderr only; stdout is the protocol channel."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)


def claim_stdout() -> BinaryIO:
    """Return a private binary stream on the original stdout and point fd 1 at stderr.

    Standard fds that are closed are first opened on /dev/null (a closed stdin reads as empty).

    After this, only the returned stream reaches the process that reads our stdout; anything
    else that writes to fd 1 or sys.stdout (a library's progress print, a C printf) lands on
    stderr instead of corrupting protocol lines.
    """
    for fd in (0, 1, 2):          # a closed standard fd would be reused by the next open/dup
        try:
            os.fstat(fd)
        except OSError:
            null_fd = os.open(os.devnull, os.O_RDWR)
            if null_fd != fd:
                os.dup2(null_fd, fd)
                os.close(null_fd)
    sys.stdout.flush()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(protocol_fd, "wb")


@dataclass(slots=True, frozen=True)
class OverlongLine:
    """A line longer than the reader's bound; its bytes were discarded."""

    n_bytes: int


class LineReader:
    """Lines (bytes, without the newline) from a file descriptor.

    Polls with a short timeout so that `stop` ends iteration within `poll_s` even while no
    input arrives. A line longer than max_line_bytes is discarded as it streams in (memory stays
    bounded) and yielded as OverlongLine. A last line without a newline is yielded at EOF.
    """

    def __init__(self, fd: int, max_line_bytes: int, stop: threading.Event, poll_s: float = 0.1):
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be >= 1, got {max_line_bytes}")
        self.fd, self.max_line_bytes, self.stop, self.poll_ms = fd, max_line_bytes, stop, int(poll_s * 1000)

    def _chunks(self) -> Iterator[bytes]:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while not self.stop.is_set():
            if not poller.poll(self.poll_ms):
                continue
            try:
                chunk = os.read(self.fd, 1 << 16)
            except (BlockingIOError, InterruptedError):
                continue
            if not chunk:
                return
            yield chunk

    def __iter__(self) -> Iterator[bytes | OverlongLine]:
        line = bytearray()
        n_discarded = -1          # >= 0 while discarding an overlong line: bytes dropped so far
        for chunk in self._chunks():
            start = 0
            while True:
                newline = chunk.find(b"\n", start)
                piece = chunk[start:] if newline < 0 else chunk[start:newline]
                if n_discarded >= 0:
                    n_discarded += len(piece)
                else:
                    line += piece
                    if len(line) > self.max_line_bytes:
                        n_discarded = len(line)
                        line.clear()
                if newline < 0:
                    break
                if n_discarded >= 0:
                    yield OverlongLine(n_discarded)
                    n_discarded = -1
                else:
                    yield bytes(line)
                    line.clear()
                start = newline + 1
        if self.stop.is_set():
            return
        if n_discarded >= 0:
            yield OverlongLine(n_discarded)
        elif line:
            yield bytes(line)


def read_ids_file(path: str, max_bytes: int) -> bytes:
    """The bytes of a prompt file (raw little-endian int32 ids), read by the daemon.

    Only regular files, at most max_bytes: a FIFO or a device (/dev/zero) would otherwise hang
    or exhaust the daemon. Raises OSError with a strerror that says what is wrong.
    """
    # O_NONBLOCK: opening a FIFO with no writer would block forever; regular files ignore it.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes exceeds the limit of {max_bytes} bytes")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:      # grew while we read it
        raise OSError(errno.EFBIG, f"more than the limit of {max_bytes} bytes")
    return data


def check_gguf(path: str | Path, what: str) -> Path:
    """`path` names a readable GGUF file (checked by its magic); StartupError otherwise."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise StartupError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    if magic != GGUF_MAGIC:
        raise StartupError(f"{what} {path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    return path


def resolve_model(name_or_path: str, what: str) -> Path:
    """A model name known to `flashd pull`, or a path -> a local GGUF path (checked readable).

    Names go through flashd.clients.registry.resolve_model (which downloads on demand) when that
    module exists; until then the value is taken as a path.
    """
    try:
        from ..clients.registry import resolve_model as registry_resolve
    except ModuleNotFoundError as exc:
        if exc.name not in ("flashd.clients.registry",):
            raise
        return check_gguf(name_or_path, what)
    try:
        path = registry_resolve(name_or_path)
    except Exception as exc:  # the registry's own errors (unknown name, download failed)
        raise StartupError(f"{what} {name_or_path!r}: {exc}") from None
    return check_gguf(path, what)


def _check_rope(engine, config: EngineConfig) -> None:
    """--rope-scaling must have reached the loaded model (Engine.load opens it with
    open_model(path, config.rope_override)); a max_ctx past the positions the model is meant to see
    (ModelConfig.max_context: the trained context, or orig_ctx * factor when scaled) is logged."""
    cfg = engine.model.config
    if config.rope_override is not None:
        want = type(cfg).from_gguf(engine.model.file).with_rope_override(*config.rope_override).rope_scaling
        if cfg.rope_scaling != want:
            raise StartupError(f"--rope-scaling {config.rope_override[0]} was not applied to the model (the engine "
                               "must open it with open_model(path, EngineConfig.rope_override))")
    if config.max_ctx > cfg.max_context:
        log.warning("max_ctx %d is past the %d positions %s was trained for%s; quality degrades beyond them",
                    config.max_ctx, cfg.max_context, cfg.name,
                    "" if cfg.rope_scaling else " (a model card's YaRN setting: --rope-scaling yarn --rope-factor F)")


def load_engine(config: EngineConfig):
    """Build the Engine and load the target: a tqdm bar on stderr while loading (only when
    stderr is a terminal), then one log line. StartupError on any failure."""
    from tqdm import tqdm

    from .backends import BackendUnavailable
    from .engine import Engine
    from .models import ModelLoadError

    try:
        engine = Engine(config)
    except BackendUnavailable as exc:
        raise StartupError(str(exc)) from None
    bar = tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024, desc="loading weights",
               file=sys.stderr, disable=not sys.stderr.isatty(), leave=False)

    def progress(done_bytes: int, total_bytes: int) -> None:
        bar.total = total_bytes
        bar.update(done_bytes - bar.n)

    t_start = time.perf_counter()
    try:
        engine.load(progress)
    except (ModelLoadError, OSError, ValueError) as exc:
        raise StartupError(f"cannot load model {config.model}: {exc}") from None
    finally:
        bar.close()
    _check_rope(engine, config)
    info = engine.ready_info()
    log.info("loaded %s (%s, %s, vocab %d) on %s in %.2f s; max_ctx %d", info["model"], info["arch"],
             info["name"], info["vocab_size"], info["backend"], time.perf_counter() - t_start, info["max_ctx"])
    return engine


class StopSignals:
    """SIGINT and SIGTERM call `on_stop(signal_name)` once; a second signal exits at once
    (status 1), for when a clean stop is stuck behind a long forward pass. Main thread only."""

    def __init__(self, on_stop: Callable[[str], None]):
        self._on_stop = on_stop
        self._received = False
        self._previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self._received:
            log.error("%s again: exiting without a clean stop", name)
            os._exit(1)
        self._received = True
        log.info("%s: stopping", name)
        self._on_stop(name)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
