"""`flashd-lucebox-daemon`: the daemon behind the command line and pipes of Lucebox's daemon
binary, so a Lucebox client can be pointed at flashd unchanged.

    flashd-lucebox-daemon TARGET DRAFT --daemon --stream-fd=FD [--max-ctx=N] [--ddtree]
        [--ddtree-budget=N] [--fast-rollback] [--ddtree-temp=T] [--ddtree-no-chain-seed]

stdin    one command per line, run one at a time in order (protocol/lucebox.py has the grammar):
         `<ids_path> <n_gen> [samp=...]`, `compress ...`, `park|unpark [all|target|draft]`,
         `free drafter`, `quit` / `exit`; end of stdin stops the daemon.
FD       generated token ids as little-endian int32, written as they are produced; every
         command ends with exactly one -1, failed and unknown commands included (Lucebox omits
         it for some failures and desyncs its client; flashd never does).
stdout   `[daemon] ready` once the target is resident, then exactly one `ok ...` or
         `err CODE message` line per command. Logs go to stderr.

Choices that differ from Lucebox, on purpose:
- DRAFT is loaded as flashd's drafter (a DFlash GGUF, or a draft model sharing the target's
  vocabulary: a mismatch is a startup error) and every generate decodes speculatively with it:
  spec=chain, or spec=ddtree with --ddtree (budget --ddtree-budget, default 22;
  --ddtree-no-chain-seed turns the chain seed off). Unlike Lucebox's served path, sampled
  generates stay speculative too (tree rejection sampling keeps the target's distribution).
  --ddtree-temp is accepted and logged: flashd's drafters rank candidates at their own
  temperature; it changes the tree's shape only, never the output.
- `quit`/`exit` are commands too: they answer `ok quit` and one -1 before the daemon exits,
  so a client that reads every command's reply up to its -1 does not wait forever.
- Overlong prompts (prompt + n_gen > max_ctx) are `err ctx_overflow ...` + -1, not an abort.
- Error codes are flashd's closed set (`err parked`, `err bad_request`, ...).
- Paths in commands are confined (daemon/file_access.py): prompt ids files to the system temp dir
  (where Lucebox's DflashClient writes them) or to $FLASHD_ALLOW_FILES (directories separated by
  `:`; `none`: no files), compress's drafter_gguf to the directories of TARGET and DRAFT, the
  flashd model cache and $FLASHD_ALLOW_MODELS. Lucebox's argv has no room for flags of our own,
  hence environment variables (like FLASHD_LOG_LEVEL, and $FLASHD_VRAM_BUDGET: `flashd serve --vram-budget`).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from typing import BinaryIO

from ..protocol import lucebox as lb
from ..protocol.errors import ProtocolError
from ..protocol.events import error_event
from ..protocol.messages import Compress, Generate, Park, Quit, Request, Unpark, verb_of
from ..protocol.wire import MAX_FRAME_BYTES
from .config import EngineConfig
from .file_access import FileAccess
from .vram_budget import parse_size
from .process import (
    LineReader, OverlongLine, StartupError, StopSignals, check_gguf, claim_stdout, load_engine, setup_logging,
)

__all__ = ["LuceboxDaemon", "main"]

log = logging.getLogger("flashd.lucebox")

DEFAULT_MAX_CTX = 4096             # Lucebox clients normally pass --max-ctx
MAX_LINE_BYTES = MAX_FRAME_BYTES   # a command line, and an ids file
ENGINE_STOP_TIMEOUT_S = 60.0
ALLOW_FILES_ENV = "FLASHD_ALLOW_FILES"     # os.pathsep-separated dirs for ids files (default: the temp dir)
ALLOW_MODELS_ENV = "FLASHD_ALLOW_MODELS"   # os.pathsep-separated dirs for compress's drafter_gguf, added
VRAM_BUDGET_ENV = "FLASHD_VRAM_BUDGET"     # a size like 24GiB: flashd serve's --vram-budget


class StreamClosed(Exception):
    """The client closed its end of the stream fd."""


class LuceboxDaemon:
    """Runs Lucebox commands one at a time through the engine."""

    def __init__(self, engine, args: lb.LuceboxArgs, status_out: BinaryIO, files: FileAccess):
        self.engine, self.args, self._status_out, self.files = engine, args, status_out, files
        self.stopping = threading.Event()
        self.stream_broken = False
        self._n_commands = 0

    # -- output --------------------------------------------------------------------------------
    def _status(self, line: str) -> None:
        self._status_out.write((line + "\n").encode("utf-8"))
        self._status_out.flush()

    def _stream(self, data: bytes) -> None:
        """Write all of `data` to the stream fd (engine thread or main thread)."""
        if self.stream_broken:
            raise StreamClosed
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.args.stream_fd, view)
            except InterruptedError:
                continue
            except OSError as exc:   # EPIPE: the client closed its read end
                self.stream_broken = True
                log.error("--stream-fd=%d is closed (%s)", self.args.stream_fd, exc)
                raise StreamClosed from None
            view = view[n:]

    def _finish(self, status_line: str) -> None:
        """Every command ends here: one status line, then one -1 on the stream."""
        self._status(status_line)
        try:
            self._stream(lb.encode_sentinel())
        except StreamClosed:
            pass

    # -- commands ------------------------------------------------------------------------------
    def run(self, reader) -> int:
        self._status(lb.READY_LINE)
        for line in reader:
            if isinstance(line, OverlongLine):
                self._finish(lb.err_line("bad_request", f"line of {line.n_bytes} bytes exceeds the limit "
                                                        f"of {MAX_LINE_BYTES} bytes"))
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                self._finish(lb.err_line("bad_request", f"line is not valid UTF-8 at offset {exc.start}"))
                continue
            quit_now = self.run_command(text)
            if quit_now or self.stopping.is_set() or self.stream_broken:
                break
        if self.stream_broken:
            log.error("the client closed the stream fd: exiting")
            return 1
        return 0

    def run_command(self, text: str) -> bool:
        """Run one command line and answer it; True when the daemon should exit."""
        try:
            command = lb.parse_command(text)
        except ProtocolError as exc:
            self._finish(lb.err_line(exc.code, exc.message))
            return False
        if command is None:
            return False
        self._n_commands += 1
        request_id = f"l{self._n_commands}"
        try:
            request = lb.to_request(command, request_id)
            request = self.files.check(request)     # ids file and drafter path confined (file_access.py)
            if isinstance(request, Generate):
                request = dataclasses.replace(request, spec="ddtree" if self.args.ddtree else "chain",
                                              budget=self.args.ddtree_budget if self.args.ddtree else None)
        except ProtocolError as exc:
            self._finish(lb.err_line(exc.code, exc.message))
            return False
        terminal = self._submit_and_wait(request)
        if terminal["event"] == "error":
            self._finish(lb.err_line(terminal["code"], terminal["message"]))
        else:
            self._finish(self._ok_line(request, terminal))
        return isinstance(request, Quit)

    def _submit_and_wait(self, request: Request) -> dict:
        """Submit to the engine, stream token ids to FD as they come; the terminal event."""
        finished = threading.Event()
        terminal: list[dict] = []

        def emit(event: dict) -> None:          # engine thread
            ids = event.get("ids")
            wants_stream = event["event"] == "token" or (event["event"] == "result" and isinstance(request, Compress))
            if wants_stream and ids:
                try:
                    self._stream(lb.encode_ids(ids))
                except StreamClosed:
                    self.engine.cancel(request.id)
            if event["event"] in ("done", "result", "error"):
                terminal.append(event)
                finished.set()

        self.engine.submit(request, emit)
        cancel_sent = False
        while not finished.wait(0.2):             # timed: signal handlers run in this thread
            if self.stopping.is_set() and not cancel_sent:
                self.engine.cancel(request.id)
                cancel_sent = True
        if not terminal:                          # cannot happen: the engine always answers
            return error_event(request.id, "internal", "no answer from the engine")
        return terminal[0]

    def _ok_line(self, request: Request, event: dict) -> str:
        if isinstance(request, Generate):
            timings = event.get("timings", {})
            return lb.generate_ok_line(event["n_prompt"], event["n_gen"], (timings.get("prefill_ms") or 0) / 1e3,
                                       (timings.get("decode_ms") or 0) / 1e3, self.args.stream_fd)
        if isinstance(request, (Park, Unpark)):
            return lb.ok_line(verb_of(request), what=request.what)
        if isinstance(request, Compress):
            return lb.ok_line("compress", **{k: event[k] for k in ("n_in", "n_out", "ms") if k in event})
        return lb.ok_line(verb_of(request))


def _check_stream_fd(fd: int) -> None:
    if fd in (0, 1):
        raise StartupError(f"--stream-fd={fd}: that is std{'in' if fd == 0 else 'out'}; the ids need a "
                           f"descriptor of their own (a pipe)")
    try:
        os.fstat(fd)
    except OSError as exc:
        raise StartupError(f"--stream-fd={fd}: not an open file descriptor ({exc.strerror})") from None


def file_access(args: lb.LuceboxArgs, environ=os.environ) -> FileAccess:
    """What commands may open: $FLASHD_ALLOW_FILES / $FLASHD_ALLOW_MODELS (ValueError naming a bad one)."""
    files = environ.get(ALLOW_FILES_ENV)
    models = environ.get(ALLOW_MODELS_ENV)
    return FileAccess.build(tuple(d for d in files.split(os.pathsep) if d) if files else None,
                            tuple(d for d in models.split(os.pathsep) if d) if models else (),
                            [args.target, args.draft], MAX_LINE_BYTES,
                            ids_option=f"${ALLOW_FILES_ENV}", models_option=f"${ALLOW_MODELS_ENV}")


def main(argv: list[str] | None = None) -> int:
    """Console script entry point; returns (and exits with) the process status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = lb.parse_argv(argv)
        budget = os.environ.get(VRAM_BUDGET_ENV)
        try:
            budget = parse_size(budget) if budget else None
        except ValueError as exc:
            raise ValueError(f"${VRAM_BUDGET_ENV}: {exc}") from None
        config = EngineConfig(model=args.target, device="auto",
                              max_ctx=args.max_ctx if args.max_ctx is not None else DEFAULT_MAX_CTX,
                              drafts=(args.draft,), ddtree_chain_seed=args.ddtree_chain_seed, vram_budget=budget)
        setup_logging(os.environ.get("FLASHD_LOG_LEVEL", "info"))   # Lucebox's argv has no log flag
    except ValueError as exc:
        print(f"flashd-lucebox-daemon: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    status_out = claim_stdout()
    try:
        _check_stream_fd(args.stream_fd)
        check_gguf(args.target, "TARGET")
        check_gguf(args.draft, "DRAFT")
        try:
            files = file_access(args)
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        if args.ddtree_temp is not None:
            log.warning("--ddtree-temp %s is accepted but not used: flashd's drafters rank tree candidates at "
                        "their own temperature (tree shape only; the output is the same)", args.ddtree_temp)
        engine = load_engine(config)
    except StartupError as exc:
        log.error("%s", exc)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None

    daemon = LuceboxDaemon(engine, args, status_out, files)
    signals = StopSignals(lambda name: daemon.stopping.set())
    engine.start()
    try:
        status = daemon.run(LineReader(0, MAX_LINE_BYTES, daemon.stopping))
    except OSError as exc:                    # stdout closed, or stdin unreadable: the client is gone
        log.error("lost the client's pipes: %s", exc)
        status = 1
    finally:
        engine.stop(ENGINE_STOP_TIMEOUT_S)
        signals.restore()
    log.info("stopped")
    raise SystemExit(status)


if __name__ == "__main__":
    main()
