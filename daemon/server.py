"""`flashd serve`: one engine behind two front ends at once, stdin/stdout and ZeroMQ.

  stdin line ─ StdinFrontend (thread) ──┐                    ┌─ StdioClient: JSON line on stdout
                                        ├─ Server.dispatch ──┤
  zmq frame ── ZmqFrontend (thread) ────┘   engine.submit    └─ ZmqClient: msgpack frame, routed
                                                                to the peer that asked

A *client* is one source of requests and the place its events go: stdin/stdout is one client,
every ZeroMQ peer (by its routing identity) is another. Request ids are per client, so two peers
may both use id "a"; `cancel target=a` reaches only the sender's own request. Ids the client
does not give are assigned by the server: "r1", "r2", ..., unique for the daemon's lifetime.

Life cycle: load the model (progress bar on stderr), print the `ready` event on stdout, serve.
The daemon stops, cancelling what is queued or running and exiting 0, on `quit` (from either
front end), SIGINT/SIGTERM, or end of stdin. At end of stdin without --zmq it first finishes the
requests already sent; with --zmq it keeps serving ZeroMQ (stdin closing is then not a stop
signal, so a daemon started with `< /dev/null` serves ZeroMQ until `quit` or a signal).

Threads: the engine thread emits events; the stdin thread reads lines; the ZeroMQ thread owns
the ROUTER socket (zmq sockets are not thread-safe), so events for ZeroMQ peers are encoded on
the emitting thread, queued, and the ZeroMQ thread is woken through an inproc PAIR socket.
stdout lines are written by the emitting thread under a lock: a stdin client that stops reading
its stdout stalls the engine (back-pressure), which is what a pipe to a single parent wants.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..protocol import lines, wire
from ..protocol.errors import ProtocolError
from ..protocol.events import error_event, ready_event, result_event
from ..protocol.messages import Cancel, Request, Status
from .backends.kv_types import KVTypes
from .config import EngineConfig
from .file_access import NO_FILES, FileAccess, resolve_dirs
from .lifetime import IdleTimer, ReadyFile
from .loopback import check_zmq_address
from .pflash.config import PFlashConfig
from .process import (
    LOG_LEVELS, LineReader, OverlongLine, StartupError, StopSignals, claim_stdout, load_engine,
    resolve_model, setup_logging,
)
from .serve_client import UNTIMED, Client, Reply
from .vram_budget import DEFAULT_MARGIN
from .zmq_frontend import ZmqFrontend

__all__ = ["ServeConfig", "serve", "check_zmq_address"]

log = logging.getLogger("flashd.server")

ENGINE_STOP_TIMEOUT_S = 60.0   # a stop waits this long for a forward pass in flight to finish
BUILTIN_DRAFTS = ("ngram", "mtp")    # drafters that need no file of their own (speculative/loader.py)


@dataclass(slots=True, frozen=True)
class ServeConfig:
    """The `flashd serve` command line."""

    model: str                          # path, or a name the model registry knows
    drafts: tuple[str, ...] = ()        # speculative-decoding drafters: paths, names, "ngram" or "mtp"
    prefill_drafter: str | None = None  # PFlash scoring model
    device: str = "auto"
    max_ctx: int = 4096
    zmq: str | None = None              # ROUTER address; None: no ZeroMQ front end
    zmq_allow_remote: bool = False
    stdin: bool = True                  # read requests from stdin (events always go to stdout)
    max_queue: int = 64
    prefix_cache: bool = True           # keep the K/V of the last prompt's common prefix (SPEC.md)
    prefix_cache_ram_mb: int = 4096     # host copies of earlier prompts' prefixes
    prefill_chunk: int = 512            # prompt tokens per prefill forward (EngineConfig); also prefix reuse's unit
    forward: str = "graph"              # cuda decode / verify forward: graph or persistent
    rope_override: tuple | None = None  # --rope-scaling / --rope-factor / --rope-orig-ctx (EngineConfig)
    max_request_bytes: int = wire.MAX_FRAME_BYTES  # a stdin line, a zmq frame, an @file
    allow_files: tuple[str, ...] | None = None   # dirs @file prompts may be read from; None: the temp dir,
                                                 # ("none",): no @file reads (daemon/file_access.py)
    allow_models: tuple[str, ...] = ()  # dirs a request's drafter=PATH may load from, beyond the models' own
    keep_alive_s: float | None = None   # stop after this long with no request in flight; None: never
    ready_file: str | None = None       # write the ready event (+ pid) here once serving (lifetime.py)
    log_level: str = "info"
    pflash: PFlashConfig = field(default_factory=PFlashConfig)   # --compress*, --drafter-policy
    pflash_given: frozenset[str] = frozenset()   # PFlash fields the command line set; the others may come from
                                                 # the prefill drafter's calibration (pflash/calibrate.py)
    vram_budget: int | None = None      # --vram-budget, bytes (EngineConfig)
    vram_margin: int = DEFAULT_MARGIN   # --vram-margin, bytes
    kv_types: KVTypes = KVTypes()       # --kv-type / --kv-type-k / --kv-type-v (EngineConfig)
    max_tree_nodes: int | None = None   # --max-tree-nodes (EngineConfig; None: the default, which --vram-budget may
                                        # lower for a hybrid target)
    tuning: tuple[tuple[str, int], ...] = ()   # --tuning FIELD=N,... (EngineConfig)

    def __post_init__(self):
        if not self.stdin and self.zmq is None:
            raise ValueError("--no-stdin needs --zmq ADDR: otherwise nothing would be served")
        if self.zmq is not None:
            check_zmq_address(self.zmq, self.zmq_allow_remote)
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
        if self.prefill_chunk < 1:
            raise ValueError(f"--prefill-chunk must be >= 1, got {self.prefill_chunk}")
        window = getattr(self.kv_types, "window", 0)          # (EngineConfig's check, before anything loads)
        if window and self.prefill_chunk % window:
            raise ValueError(f"--prefill-chunk {self.prefill_chunk} must be a multiple of the KV window {window} "
                             f"(--kv-window; 0: none)")
        if self.max_request_bytes < 1:
            raise ValueError(f"--max-request-bytes must be >= 1, got {self.max_request_bytes}")
        if self.allow_files is not None and tuple(self.allow_files) != (NO_FILES,):
            resolve_dirs(self.allow_files, "--allow-files")
        resolve_dirs(self.allow_models, "--allow-models")
        if self.keep_alive_s is not None and not self.keep_alive_s > 0:
            raise ValueError(f"--keep-alive must be > 0 seconds (or negative: no timeout), got {self.keep_alive_s}")
        if self.vram_budget is not None and self.vram_margin >= self.vram_budget:
            raise ValueError(f"--vram-margin {self.vram_margin} bytes leaves nothing of --vram-budget "
                             f"{self.vram_budget} bytes")


# ---------------------------------------------------------------------------------- server


class Server:
    """Request ids, dispatch to the engine, per-client cancel, the idle timer and the stop signal."""

    def __init__(self, engine, config: ServeConfig, files: FileAccess):
        self.engine, self.config, self.files = engine, config, files
        self.idle = IdleTimer(config.keep_alive_s)
        self.zmq: ZmqFrontend | None = None
        self.stopped = threading.Event()
        self.stop_reason = ""
        self._id_lock = threading.Lock()
        self._n_ids = 0

    def next_id(self) -> str:
        with self._id_lock:
            self._n_ids += 1
            return f"r{self._n_ids}"

    def dispatch(self, request: Request, client: Client) -> None:
        """Hand a parsed request to the engine; its events go back to `client`."""
        if isinstance(request, Cancel):       # scoped to the client's own requests
            target = request.target
            n_cancelled = self.engine.cancel_where(
                lambda job: getattr(job.emit, "client", None) is client and job.request.id == target)
            client.send(result_event(request.id, cancelled=n_cancelled > 0))
            return
        if isinstance(request, Status):       # the engine's status plus the daemon's lifetime
            client.started()
            Reply(client, request)(result_event(request.id, **self.engine.status(), **self.idle.info()))
            return
        if not isinstance(request, UNTIMED):
            self.idle.begin()
        client.started()
        self.engine.submit(request, Reply(client, request))

    def client_gone(self, client: Client) -> None:
        """The client can no longer receive events: cancel everything it still has pending."""
        n = self.engine.cancel_where(lambda job: getattr(job.emit, "client", None) is client)
        if n:
            log.info("%s went away: cancelled %d request(s)", client.name, n)
        if isinstance(client, StdioClient) and self.zmq is None:
            self.request_stop("stdout closed")

    def request_stop(self, reason: str) -> None:
        if not self.stopped.is_set():
            self.stop_reason = reason
            self.stopped.set()


# ---------------------------------------------------------------------------------- stdin


class StdioClient(Client):
    """Events as JSON lines on the claimed stdout: one write + flush per event, under a lock."""

    def __init__(self, server: Server, out: BinaryIO):
        super().__init__(server, "stdin")
        self._out = out
        self._out_lock = threading.Lock()

    def send(self, event: dict, finished: Request | None = None) -> None:
        data = (lines.encode_event(event) + "\n").encode("utf-8")
        broke = False
        with self._out_lock:
            if not self.gone:
                try:
                    self._out.write(data)
                    self._out.flush()
                except (OSError, ValueError) as exc:   # BrokenPipeError: stdout's reader is gone
                    self.gone = broke = True
                    log.warning("stdout is closed (%s): stdin's requests are cancelled", exc)
        if broke:
            self.server.client_gone(self)
        if finished is not None:
            self.request_ended(finished)


class StdinFrontend:
    """Reads request lines from fd 0 on its own thread: parse, read @files, dispatch."""

    def __init__(self, server: Server, client: StdioClient, fd: int = 0):
        self.server, self.client, self.fd = server, client, fd
        self._thread = threading.Thread(target=self._run, name="flashd-stdin", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        server = self.server
        try:
            for line in LineReader(self.fd, server.config.max_request_bytes, server.stopped):
                self.handle(line)
        except OSError as exc:                # e.g. started with stdin closed: as if at its end
            log.warning("stdin is unreadable (%s): treated as closed", exc)
        except Exception:
            log.exception("stdin reader failed")
            server.request_stop("stdin reader failed")
            return
        if server.stopped.is_set():
            return
        if server.zmq is not None:
            log.info("stdin closed: still serving ZeroMQ at %s (stop with quit or SIGTERM)", server.zmq.endpoint)
            return
        log.info("stdin closed: finishing %d pending request(s), then exiting", self.client.pending)
        self.client.wait_idle(server.stopped)
        server.request_stop("stdin closed")

    def handle(self, line: bytes | OverlongLine) -> None:
        server, client = self.server, self.client
        default_id = server.next_id()
        limit = server.config.max_request_bytes
        if isinstance(line, OverlongLine):
            client.send(error_event(default_id, "bad_request",
                                    f"line of {line.n_bytes} bytes exceeds the limit of {limit} bytes"))
            return
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            client.send(error_event(lines.undecodable_line_id(line, default_id), "bad_request",
                                    f"line is not valid UTF-8: byte "
                                    f"{line[exc.start:exc.start + 1]!r} at offset {exc.start} ({exc.reason})"))
            return
        try:
            request = lines.parse_line(text, default_id, limit)
            if request is None:
                return
            request = server.files.check(request)     # @file and model paths confined (file_access.py)
        except ProtocolError as exc:
            client.send(error_event(exc.request_id, exc.code, exc.message))   # None: id given but unreadable
            return
        server.dispatch(request, client)


# ---------------------------------------------------------------------------------- process


def _resolve_drafts(config: ServeConfig) -> tuple[tuple[str, ...], str | None]:
    drafts = tuple(d if d in BUILTIN_DRAFTS else str(resolve_model(d, "--draft")) for d in config.drafts)
    prefill = (str(resolve_model(config.prefill_drafter, "--prefill-drafter"))
               if config.prefill_drafter is not None else None)
    return drafts, prefill


def _calibrated(config: ServeConfig, prefill: str | None) -> tuple[PFlashConfig, dict | None]:
    """config.pflash with the prefill drafter's stored calibration (under the drafter's RoPE scaling: --rope-scaling
    reaches it) for what the command line left unset, by prompt length (pflash/calibration_store.py)."""
    from .models import ModelLoadError, open_model
    from .pflash.calibration_store import SHIPPED_DIR, calibrated_pflash, describe_bands, find_calibration, rope_tag

    if prefill is None:
        return config.pflash, None
    try:
        rope = rope_tag(open_model(prefill, config.rope_override)[1].rope_scaling)
    except (ModelLoadError, OSError):
        return config.pflash, None          # the engine's load says what is wrong with the file
    found = find_calibration(prefill, rope)
    if found is None:
        log.info("no PFlash calibration stored for %s%s (`flashd pflash-calibrate --drafter ...`%s)",
                 Path(prefill).name, f" under {rope}" if rope else "", " with the same --rope-* options" if rope else "")
        return config.pflash, None
    calibration, path = found
    pflash = calibrated_pflash(config.pflash, calibration, config.pflash_given)
    if pflash.bands:
        log.info("PFlash settings from %s's calibration (%s, %s) by prompt length: %s", calibration.drafter,
                 calibration.date, "shipped with flashd" if path.parent == SHIPPED_DIR else path,
                 describe_bands(pflash.bands))
    return pflash, calibration.as_dict()


def _file_access(config: ServeConfig, model, drafts: tuple[str, ...], prefill: str | None) -> FileAccess:
    """Where requests may read @file prompts and load drafters from: the configured directories,
    and the models' own for drafters."""
    try:
        files = FileAccess.build(config.allow_files, config.allow_models,
                                 [str(model), *(d for d in drafts if d not in BUILTIN_DRAFTS), prefill],
                                 config.max_request_bytes)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    log.info("requests may read @file prompts from %s and load drafters from %s",
             ", ".join(files.ids_dirs) or "nowhere (--allow-files none)", ", ".join(files.model_dirs))
    return files


def _ready_event(engine, config: ServeConfig, endpoint: str | None, drafts: tuple[str, ...], prefill: str | None,
                 pflash: PFlashConfig, calibration: dict | None) -> dict:
    return ready_event(**{**engine.ready_info(), "zmq": endpoint, "stdin": config.stdin,
                          "drafts": list(drafts), "prefill_drafter": prefill,
                          "pflash": {"keep": pflash.keep, "score_layers": pflash.score_layers,
                                     "score_from": pflash.score_from, "calibration": calibration,
                                     "bands": [dataclasses.asdict(b) for b in pflash.bands]},
                          "keep_alive_s": config.keep_alive_s})


def serve(config: ServeConfig) -> int:
    """Run the daemon until it is told to stop; the process exit status."""
    setup_logging(config.log_level)
    out = claim_stdout()
    zmq_frontend = None
    try:
        model = resolve_model(config.model, "--model")
        drafts, prefill = _resolve_drafts(config)
        pflash, calibration = _calibrated(config, prefill)
        files = _file_access(config, model, drafts, prefill)
        if config.zmq is not None:            # bind before the (long) load: a bad address fails fast
            zmq_frontend = ZmqFrontend(config.zmq, config.max_request_bytes)
            if config.zmq_allow_remote:
                log.warning("--zmq %s with --zmq-allow-remote: ZeroMQ has no authentication; anyone who can "
                            "reach this address can use the model", zmq_frontend.endpoint)
        engine = load_engine(EngineConfig(model=str(model), device=config.device, max_ctx=config.max_ctx,
                                          drafts=drafts, prefill_drafter=prefill, max_queue=config.max_queue,
                                          pflash=pflash, prefix_cache=config.prefix_cache,
                                          prefix_cache_ram_mb=config.prefix_cache_ram_mb,
                                          prefill_chunk=config.prefill_chunk, forward=config.forward,
                                          rope_override=config.rope_override,
                                          vram_budget=config.vram_budget, vram_margin=config.vram_margin,
                                          kv_types=config.kv_types, max_tree_nodes=config.max_tree_nodes,
                                          tuning=config.tuning))
    except StartupError as exc:
        log.error("%s", exc)
        if zmq_frontend is not None:
            zmq_frontend.close()
        return 1
    except KeyboardInterrupt:
        log.info("interrupted while loading")
        if zmq_frontend is not None:
            zmq_frontend.close()
        return 130

    server = Server(engine, config, files)
    server.zmq = zmq_frontend
    stdio = StdioClient(server, out)
    signals = StopSignals(server.request_stop)
    engine.start()
    endpoint = zmq_frontend.endpoint if zmq_frontend is not None else None
    ready = _ready_event(engine, config, endpoint, drafts, prefill, pflash, calibration)
    stdio.send(ready)
    ready_file = ReadyFile(config.ready_file) if config.ready_file is not None else None
    log.info("ready: serving %s", " and ".join(
        (["stdin"] if config.stdin else []) + ([f"ZeroMQ at {endpoint}"] if endpoint else [])))
    if zmq_frontend is not None:
        zmq_frontend.start(server)
    stdin = StdinFrontend(server, stdio) if config.stdin else None
    if stdin is not None:
        stdin.start()

    if ready_file is not None:                # after the front ends started: whoever reads it can connect
        try:
            ready_file.write(ready, config.keep_alive_s)
        except OSError as exc:
            log.error("cannot write the ready file %s: %s", config.ready_file, exc)
            server.request_stop("no ready file")
    while not server.stopped.wait(0.5):       # a timed wait keeps signal handlers running promptly
        if server.idle.expired():
            server.request_stop(f"idle for {config.keep_alive_s:g} s (--keep-alive)")
    log.info("stopping: %s", server.stop_reason)
    if ready_file is not None:                # first, so no new client picks a stopping daemon
        ready_file.remove(endpoint)
    engine.stop(ENGINE_STOP_TIMEOUT_S)       # cancels queued and running requests
    if zmq_frontend is not None:
        zmq_frontend.close()
    if stdin is not None:
        stdin.join(1.0)
    signals.restore()
    try:
        out.close()
    except OSError:                           # stdout's reader is gone: nothing left to tell it
        pass
    log.info("stopped")
    return 0
