"""The engine: the one thread that owns the model and executes requests in order (batch 1).

Front ends (stdin, ZeroMQ, the Lucebox dialect) call `submit(request, emit)` from their own
threads; the engine queues the request (bounded: overflow is an `overloaded` error), runs it, and
calls `emit(event)` from the engine thread for every event, ending with exactly one terminal event
(done / result / error). `emit` must not block for long: a front end buffers per client.

`cancel` and `status` are answered at once on the caller's thread so they never wait behind a
long generation. A failing request never takes the engine down: its exception becomes an error
event and the next request starts from a clean state.
"""
from __future__ import annotations

import collections
import contextlib
import gc
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..protocol import messages as m
from ..protocol.errors import ProtocolError
from ..protocol.messages import TERMINAL_EVENTS, done_event, error_event, result_event, token_event
from .backends import select_backend
from .config import EngineConfig
from .models import LoadedModel, ModelLoadError, load_model, open_model
from .models.weights import total_weight_bytes
from .pflash.service import PrefillCompressor, compressed_fields
from .prefix_cache import PrefixStore
from .runner import ModelRunner
from .spec.decoder import DEFAULT_DDTREE_BUDGET, SpecConfig, SpecDecoder, SpecStats
from .spec.policy import DepthPolicy
from .spec.drafter import Drafter, DrafterLoadError
from .spec.loader import NGRAM, DrafterContext, borrows_target_weights, drafter_name, find_drafter, load_drafter
from .spec.ngram import NgramConfig, NgramDrafter
from .stops import StopMatcher

__all__ = ["Engine", "Emit"]

log = logging.getLogger("flashd.engine")

Emit = Callable[[dict], None]


@dataclass(slots=True)
class _Job:
    request: object
    emit: Emit                 # the front end's sink (front ends may tag it, e.g. emit.client)
    cancelled: threading.Event = field(default_factory=threading.Event)
    engine: "Engine | None" = None

    def send(self, event: dict) -> None:
        """Emit an event; before a terminal one the engine marks itself idle, so a `status`
        sent right after "done" never still shows this request running."""
        if event.get("event") in TERMINAL_EVENTS and self.engine is not None:
            self.engine._finish(self)
        self.emit(event)


@dataclass(slots=True)
class _ParkedDrafter:
    """A --draft drafter whose memory `park what=draft` released; `unpark` loads it again."""

    name: str
    borrows_target: bool          # DFlash: reloading needs the target's weights resident

    def info(self) -> dict:
        return {"name": self.name, "kind": "parked", "parked": True}


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.backend = select_backend(config.device)
        if hasattr(self.backend, "forward_path"):      # cuda: persistent or per-op graph forwards
            self.backend.forward_path = config.forward
        self.ops = self.backend.ops
        self.plan = None
        self._opened = None                     # (GGUFFile, ModelConfig) of the target
        self.model: LoadedModel | None = None
        self.runner: ModelRunner | None = None
        self.tokenizer = None
        self.compressor: PrefillCompressor | None = None   # PFlash (daemon/pflash)
        self.drafters: dict[str, Drafter] = {}      # name -> drafter (--draft), first = default
        self._ngram: NgramDrafter | None = None       # the built-in n-gram drafter when no --draft ngram
        self._policies: dict[tuple[str, int], DepthPolicy] = {}   # spec=auto: (drafter, budget) -> what it measured
        # host copies of prompt prefixes, kept across requests and park/unpark (the same model)
        self.prefix_store = (PrefixStore(config.prefix_cache_ram_mb << 20, config.prefill_chunk)
                             if config.prefix_cache and config.prefix_cache_ram_mb > 0 else None)
        self._drafter_sources: dict[str, str] = {}  # name -> the --draft argument it came from
        self._queue: collections.deque[_Job] = collections.deque()
        self._cv = threading.Condition()
        self._running: _Job | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.n_served = 0

    # -- lifecycle -------------------------------------------------------------------------------
    def load(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Check the memory plan, then load the target model and its tokenizer;
        `progress(done_bytes, total_bytes)` follows the weight upload."""
        from ..clients.tokenizer import Tokenizer

        f, cfg = open_model(self.config.model)
        self.tokenizer = Tokenizer.from_gguf(f.metadata_dict)
        self.plan = self.backend.plan(cfg, total_weight_bytes(f, cfg), self.config.max_ctx,
                                      self.config.prefill_chunk)
        self.backend.check_fits(self.plan)       # before anything is allocated
        self._opened = (f, cfg)
        self._load_weights(progress)
        self.compressor = PrefillCompressor(self.backend, self.config.pflash, self.config.prefill_drafter,
                                            self.tokenizer)
        if self.config.prefill_drafter is not None and self.config.pflash.drafter_policy == "resident":
            try:
                self.compressor.load()
            except ProtocolError as exc:
                raise ModelLoadError(f"--prefill-drafter: {exc.message}") from None
        self._load_drafters()

    def _drafter_context(self) -> DrafterContext:
        return DrafterContext(backend=self.backend, target_file=self._opened[0], target_model=self.model,
                              max_ctx=self.config.max_ctx, prefill_chunk=self.config.prefill_chunk)

    def _load_drafters(self) -> None:
        """Every --draft, checked against the target; DrafterLoadError stops the daemon's start."""
        ctx = self._drafter_context()
        for spec in self.config.drafts:
            name = drafter_name(spec)
            if name in self.drafters:
                raise DrafterLoadError(f"--draft {spec}: a drafter named {name!r} is already loaded")
            drafter = load_drafter(spec, ctx)
            drafter.check_target(self.model.config)
            self.drafters[name] = drafter
            self._drafter_sources[name] = spec
            log.info("drafter %s loaded from %s", name, spec)
        if self.drafters:
            self._drop_graphs()

    def _drop_graphs(self) -> None:
        """A drafter's model shares the backend's scratch arena and workspaces, which loading it
        may have grown: graphs captured before then could point at freed memory."""
        for runner in [self.runner] + [getattr(d, "runner", None) for d in self.drafters.values()]:
            if hasattr(runner, "drop_graphs"):
                runner.drop_graphs()

    def _load_weights(self, progress=None) -> None:
        done = [0]
        total = self.plan.weights_bytes

        def step(n_bytes: int) -> None:
            done[0] += n_bytes
            if progress is not None:
                progress(done[0], total)

        self.model = load_model(self._opened, self.ops.load_weight, step)
        self.runner = self.backend.make_runner(self.model.config, self.model.weights, self.config.max_ctx,
                                               self.config.prefill_chunk, self.plan)
        self.runner.reuse_prefix = self.config.prefix_cache
        self.runner.prefix_store = self.prefix_store

    def start(self) -> None:
        if self.model is None:
            raise RuntimeError("Engine.load() must run before start()")
        self._thread = threading.Thread(target=self._loop, name="flashd-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Cancel everything queued or running and join the engine thread."""
        with self._cv:
            self._stopping = True
            for job in self._queue:
                job.cancelled.set()
            if self._running is not None:
                self._running.cancelled.set()
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def ready_info(self) -> dict:
        cfg = self.model.config
        return {"model": str(self.model.path), "arch": cfg.arch, "name": cfg.name,
                "backend": self.backend.name, "device": self.backend.info(), "max_ctx": self.config.max_ctx,
                "vocab_size": cfg.vocab_size, "pid": os.getpid(), "forward": self._forward_info()}

    def _forward_info(self) -> dict:
        """Which forward runs decode steps and verification: persistent (one launch) or the per-op graph."""
        runner = self.runner
        info = {"path": getattr(runner, "forward_path", "reference"), "note": getattr(runner, "forward_note", "")}
        pf = getattr(runner, "persistent", None)
        if pf is not None:
            info["plan"] = pf.info()
        return info

    # -- submission (any thread) -----------------------------------------------------------------
    def submit(self, request, emit: Emit) -> None:
        if isinstance(request, m.Cancel):
            emit(result_event(request.id, cancelled=self.cancel(request.target)))
            return
        if isinstance(request, m.Status):
            emit(result_event(request.id, **self.status()))
            return
        with self._cv:
            if self._stopping:
                emit(error_event(request.id, "cancelled", "the daemon is shutting down"))
                return
            if len(self._queue) >= self.config.max_queue:
                emit(error_event(request.id, "overloaded",
                                 f"request queue is full ({self.config.max_queue} waiting); retry later"))
                return
            self._queue.append(_Job(request, emit, engine=self))
            self._cv.notify()

    def cancel(self, request_id: str) -> bool:
        """Cancel a queued or running request; False when no such request is pending."""
        return self.cancel_where(lambda job: job.request.id == request_id) > 0

    def cancel_where(self, predicate: Callable[[object], bool]) -> int:
        """Cancel every pending request the predicate selects (e.g. a disconnected client's).

        A queued request leaves the queue and gets its `cancelled` error at once, on the
        caller's thread (not after the running request ends); the running one stops at its
        next step and its error comes from the engine thread.
        """
        with self._cv:
            jobs = list(self._queue) + ([self._running] if self._running else [])
            hit = [j for j in jobs if predicate(j) and not j.cancelled.is_set()]
            for job in hit:
                job.cancelled.set()
            queued = [j for j in hit if j is not self._running]
            for job in queued:
                self._queue.remove(job)
        for job in queued:
            job.emit(error_event(job.request.id, "cancelled", "cancelled before it started"))
        return len(hit)

    def status(self) -> dict:
        model = self.model
        cfg = model.config
        with self._cv:
            running = self._running.request.id if self._running else None
            queued = len(self._queue)
        kv_bytes = self.runner.cache.n_bytes if self.runner is not None else 0
        resident = model.weights is not None
        memory = {"plan": self.plan.as_dict(), "resident_weights_bytes": self._weight_bytes() if resident else 0,
                  "resident_kv_bytes": kv_bytes}
        device = getattr(self.backend, "device", None)
        if device is not None:                 # what park/unpark release and take, as the driver sees it
            memory["device_free_bytes"], memory["device_total_bytes"] = device.mem_info()
        return {
            "model": str(model.path), "name": cfg.name, "arch": cfg.arch, "backend": self.backend.name,
            "forward": self._forward_info() if self.runner is not None else None,
            "max_ctx": self.config.max_ctx, "parked": self._parked(),
            "drafters": [d.info() for d in self.drafters.values()],
            "prefill_drafter": self.compressor.status() if self.compressor else None,
            "running": running, "queued": queued, "served": self.n_served,
            "prefix_cache": {"enabled": self.config.prefix_cache,
                             "tokens": self.runner.cached_prefix_tokens if self.runner is not None else 0,
                             "ram": self.prefix_store.info() if self.prefix_store is not None else None},
            "memory": memory,
        }

    def _parked(self) -> dict:
        parked = {"target": self.model.weights is None}
        if self.compressor is not None and self.compressor.parked_path is not None:
            parked["drafter"] = True
        spec = [name for name, d in self.drafters.items() if isinstance(d, _ParkedDrafter)]
        if spec:
            parked["spec_drafters"] = spec
        return parked

    def _weight_bytes(self) -> int:
        w = self.model.weights
        tensors = [w.token_embd, w.output_norm] + ([w.output] if w.output is not w.token_embd else [])
        tensors += [getattr(layer, name) for layer in w.layers for name in layer.__slots__]
        return int(sum(getattr(t, "nbytes", 0) for t in tensors if t is not None))

    # -- the engine thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stopping:
                    self._cv.wait()
                if self._stopping and not self._queue:
                    return
                job = self._queue.popleft()
                self._running = job
            try:
                self._execute(job)
            finally:
                self._finish(job)

    def _finish(self, job: _Job) -> None:
        with self._cv:
            if self._running is job:
                self._running = None
                self.n_served += 1

    def _execute(self, job: _Job) -> None:
        req = job.request
        try:
            if job.cancelled.is_set():
                raise ProtocolError("cancelled", "cancelled before it started")
            handler = getattr(self, "_do_" + type(req).__name__.lower(), None)
            if handler is None:
                raise ProtocolError("unknown_command", f"{type(req).__name__.lower()} is not handled")
            handler(req, job)
        except ProtocolError as exc:
            job.send(error_event(req.id, exc.code, exc.message))
        except MemoryError as exc:
            log.exception("out of memory in %s", req.id)
            job.send(error_event(req.id, "oom", f"out of memory: {exc}"))
        except Exception as exc:  # a bug: report it, keep serving
            log.exception("request %s failed", req.id)
            job.send(error_event(req.id, "internal", f"{type(exc).__name__}: {exc}"))
        finally:
            if self.runner is not None:
                self.runner.reset()

    # -- request handlers ------------------------------------------------------------------------
    def _require_target(self) -> ModelRunner:
        if self.model.weights is None:
            raise ProtocolError("parked", "the target model is parked; send `unpark what=target` first")
        return self.runner

    def _check_ids(self, ids) -> list[int]:
        vocab = self.model.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ProtocolError("bad_request", f"ids: token id {bad[0]} is outside the vocabulary [0, {vocab})")
        return list(ids)

    def _prompt_ids(self, req) -> list[int]:
        if req.text is not None:
            ids = self.tokenizer.encode(req.text, add_special=getattr(req, "add_special", False))
            if not ids:
                raise ProtocolError("bad_request", "text: the prompt tokenizes to no tokens")
            return ids
        return self._check_ids(req.ids)

    def _do_generate(self, req: m.Generate, job: _Job) -> None:
        drafter = self._drafter(req.draft) if (req.spec != "off" or req.draft is not None) else None
        self._require_target()
        prompt = self._prompt_ids(req)
        compressed = None
        mode = req.compress if req.compress is not None else self.config.pflash.mode
        if self.compressor.wants(mode, len(prompt), req.threshold):
            compressed = self._compress(prompt, req.keep if req.keep is not None else self.config.pflash.keep)
            prompt = compressed.ids
        runner = self._require_target()
        if len(prompt) + req.max_tokens > self.config.max_ctx:
            raise ProtocolError("ctx_overflow", f"prompt {len(prompt)} + max_tokens {req.max_tokens} "
                                                f"> max_ctx {self.config.max_ctx}")
        stop_ids = set(req.stop_ids) | (set() if req.ignore_eos else set(self.tokenizer.stop_ids))
        decoder = self.tokenizer.stream_decoder()
        stops = StopMatcher(req.stop)
        out_ids: list[int] = []
        out_text: list[str] = []
        out_logprobs: list[dict] = []
        reason = "length"
        t_start = time.perf_counter()
        t_first = None
        # a parked drafter means plain decoding (speculative decoding never changes the output)
        spec = (self._spec_decoder(req, runner, drafter)
                if req.spec != "off" and not isinstance(drafter, _ParkedDrafter) else None)
        tokens = (spec or runner).generate(prompt, req.sampling, req.max_tokens, logprobs=req.logprobs)
        try:
            for sampled in tokens:
                if t_first is None:
                    t_first = time.perf_counter()
                if job.cancelled.is_set():
                    raise ProtocolError("cancelled", f"cancelled after {len(out_ids)} tokens")
                tok = sampled.token
                out_ids.append(tok)
                if tok in stop_ids:
                    reason = "stop"
                    text = stops.flush()
                else:
                    text = stops.feed(decoder.feed([tok]))
                    if stops.stopped:
                        reason = "stop"
                lp = None
                if req.logprobs:
                    lp = [{"id": tok, "logprob": sampled.logprob,
                           "top": [[t, v] for t, v in sampled.top]}]
                    out_logprobs.extend(lp)
                out_text.append(text)
                if req.stream:
                    job.send(token_event(req.id, [tok], text, lp))
                if reason == "stop":
                    break
        finally:
            tokens.close()
        if reason == "length":
            tail = stops.feed(decoder.flush()) + stops.flush()
            if tail:
                out_text.append(tail)
                if req.stream:
                    job.send(token_event(req.id, [], tail))
        t_end = time.perf_counter()
        t_first = t_first or t_end
        n_gen = len(out_ids)
        prefill_s, decode_s = t_first - t_start, t_end - t_first
        timings = {"prefill_ms": round(prefill_s * 1e3, 3), "decode_ms": round(decode_s * 1e3, 3),
                   "ttft_ms": round(prefill_s * 1e3, 3),
                   "prefill_tok_s": round((len(prompt) - runner.n_reused) / prefill_s, 2) if prefill_s > 0 else None,
                   "decode_tok_s": round((n_gen - 1) / decode_s, 2) if n_gen > 1 and decode_s > 0 else None}
        done = done_event(req.id, reason, len(prompt), n_gen, timings, n_cached=runner.n_reused)
        if compressed is not None:     # n_prompt above counts the compressed prompt
            done["compress"] = compressed_fields(compressed)
        if spec is not None:
            done["spec"] = spec.stats.as_dict(spec.config.mode, spec.config.budget, drafter.name)
        elif isinstance(drafter, _ParkedDrafter):      # decoded plainly: same tokens, no drafting
            done["spec"] = {**SpecStats().as_dict(req.spec, req.budget, drafter.name), "parked": True}
        if not req.stream:
            done["ids"] = out_ids
            done["text"] = "".join(out_text)
            if req.logprobs:
                done["logprobs"] = out_logprobs
        job.send(done)

    def _drafter(self, name: str | None) -> Drafter | _ParkedDrafter:
        """The drafter a request names, or the daemon's default (the first --draft; without any, the
        built-in n-gram drafter, which needs no weights and is always there). A parked drafter is
        returned as such: the request then decodes plainly."""
        if name is None:
            return next(iter(self.drafters.values())) if self.drafters else self._builtin_ngram()
        drafter = find_drafter(self.drafters, self._drafter_sources, name)
        if drafter is None and name == NGRAM:
            return self._builtin_ngram()
        if drafter is None:
            loaded = ", ".join([*self.drafters, *([] if NGRAM in self.drafters else [NGRAM])])
            raise ProtocolError("not_loaded", f"draft={name}: no such drafter; loaded: {loaded}")
        return drafter

    def _builtin_ngram(self) -> NgramDrafter:
        if self._ngram is None:
            self._ngram = NgramDrafter(NgramConfig(), name=NGRAM)
        return self._ngram

    def _spec_decoder(self, req: m.Generate, runner, drafter: Drafter) -> SpecDecoder:
        """spec=chain: budget = chain length (default: the drafter's max_depth); spec=auto: the
        deepest chain, each step's depth chosen by the drafter's DepthPolicy (kept per drafter and
        budget across requests, so what it measured carries over); spec=ddtree:
        budget = drafted tree nodes (default DEFAULT_DDTREE_BUDGET). A tree, root included, must
        fit the runner's verify forward (runner.max_tree_nodes: prefill_chunk on the CPU, 65 on the
        GPU, whose masked attention workspace is sized for it)."""
        if req.budget is not None:
            budget = req.budget
        else:
            budget = DEFAULT_DDTREE_BUDGET if req.spec == "ddtree" else drafter.max_depth
        max_budget = runner.max_tree_nodes - 1
        if budget > max_budget:
            if req.budget is not None:
                raise ProtocolError("bad_request", f"budget={budget}: at most {max_budget} drafted nodes fit one "
                                                   f"verify forward on this backend")
            budget = max_budget
        self._check_graph_memory(runner, drafter)
        config = SpecConfig(req.spec, max(budget, 1), chain_seed=self.config.ddtree_chain_seed)
        policy = None
        if req.spec == "auto":
            policy = self._policies.setdefault((drafter.name, config.budget), DepthPolicy(config.budget))
        return SpecDecoder(runner, drafter, config, policy)

    def _check_graph_memory(self, runner, drafter: Drafter) -> None:
        """Captured CUDA graphs (the target's tree verify graphs, a draft model's decode graph)
        bake in the shared arena and workspace addresses; when anything (a drafter load, park,
        PFlash) reallocated them since the last speculative request, drop those graphs."""
        ops = self.ops
        token = (id(getattr(ops, "arena", None)), id(getattr(ops, "attn_workspace", None)),
                 tuple(id(t) for t in getattr(ops, "scratch", ())))
        if token != getattr(self, "_graph_memory_token", None):
            for r in (runner, getattr(drafter, "runner", None)):
                if hasattr(r, "drop_graphs"):
                    r.drop_graphs()
            self._graph_memory_token = token

    def _do_tokenize(self, req: m.Tokenize, job: _Job) -> None:
        job.send(result_event(req.id, ids=self.tokenizer.encode(req.text, add_special=req.add_special)))

    def _do_detokenize(self, req: m.Detokenize, job: _Job) -> None:
        job.send(result_event(req.id, text=self.tokenizer.decode(self._check_ids(req.ids))))

    def _do_score(self, req: m.Score, job: _Job) -> None:
        runner = self._require_target()
        ids = self._check_ids(req.ids)
        if len(ids) > self.config.max_ctx:
            raise ProtocolError("ctx_overflow", f"{len(ids)} ids > max_ctx {self.config.max_ctx}")
        logits = runner.score(ids).astype(np.float64)           # (n, vocab)
        lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        nxt = np.asarray(ids[1:])
        logprobs = logits[np.arange(len(nxt)), nxt] - lse[:-1]
        job.send(result_event(req.id, argmax=[int(t) for t in logits.argmax(-1)],
                              logprobs=[round(float(x), 6) for x in logprobs]))

    def _do_compress(self, req: m.Compress, job: _Job) -> None:
        c = self._compress(self._prompt_ids(req), req.keep, req.drafter, req.alpha, req.layers, req.first_layer)
        job.send(result_event(req.id, ids=c.ids, **compressed_fields(c)))

    def _compress(self, prompt: list[int], keep: float, drafter: str | None = None, alpha: float | None = None,
                  layers: int | None = None, first_layer: int | None = None):
        """PFlash; with the `park` drafter policy, the 24 GB choreography around it: park the
        target, load the drafter, compress, free the drafter, unpark the target."""
        if self.config.pflash.drafter_policy != "park":
            return self.compressor.compress(prompt, keep, drafter, alpha, layers, first_layer)
        with self._target_parked():
            try:
                return self.compressor.compress(prompt, keep, drafter, alpha, layers, first_layer)
            finally:
                self.compressor.free()

    @contextlib.contextmanager
    def _target_parked(self):
        was_resident = self.model.weights is not None
        if was_resident:
            self._park_target()
        try:
            yield
        finally:
            if was_resident:
                self._unpark_target()

    def _park_target(self) -> None:
        if self.prefix_store is not None:
            self.runner.keep_prefix()     # the cached prompt prefix outlives the cache, in host RAM
        if hasattr(self.runner, "close"):
            self.runner.close()
        self.model.weights = None
        self.runner = None                # releases the KV cache and the weights' memory
        if hasattr(self.ops, "release"):
            self.ops.release()            # and the activation arena and scratch (CUDA)
        gc.collect()

    def _unpark_target(self) -> None:
        try:
            self._load_weights()
            self._reload_target_borrowers()
        except (ModelLoadError, DrafterLoadError) as exc:
            raise ProtocolError("internal", f"unpark failed: {exc}") from exc

    def _do_park(self, req: m.Park, job: _Job) -> None:
        if req.what in ("target", "all") and self.model.weights is not None:
            self._park_target()
        if req.what in ("draft", "all"):
            self.compressor.park()
            self._park_spec_drafters()
        job.send(result_event(req.id, parked=self.status()["parked"]))

    def _do_unpark(self, req: m.Unpark, job: _Job) -> None:
        if req.what in ("target", "all") and self.model.weights is None:
            self._unpark_target()
        if req.what in ("draft", "all"):
            self.compressor.unpark()
            self._unpark_spec_drafters()
        job.send(result_event(req.id, parked=self.status()["parked"]))

    def _park_spec_drafters(self) -> None:
        """Release every --draft drafter that holds memory (a draft model, DFlash); n-grams stay."""
        for name, drafter in list(self.drafters.items()):
            if not isinstance(drafter, (_ParkedDrafter, NgramDrafter)):
                borrows = borrows_target_weights(drafter)
                drafter.close()
                self.drafters[name] = _ParkedDrafter(name, borrows)
        gc.collect()

    def _unpark_spec_drafters(self) -> None:
        """Load the parked drafters again from their --draft sources (the same files: the same
        drafts, so output after a round trip equals output before)."""
        ctx = self._drafter_context()
        for name, drafter in list(self.drafters.items()):
            if not isinstance(drafter, _ParkedDrafter):
                continue
            if drafter.borrows_target and self.model.weights is None:
                raise ProtocolError("parked", f"the drafter {name} runs on the target's weights: "
                                              f"send `unpark what=target` first")
            try:
                loaded = load_drafter(self._drafter_sources[name], ctx)
                loaded.check_target(self.model.config)
            except DrafterLoadError as exc:
                raise ProtocolError("internal", f"unpark of drafter {name} failed: {exc}") from exc
            self.drafters[name] = loaded
        self._drop_graphs()

    def _reload_target_borrowers(self) -> None:
        """Drafters that use the target's own weights (DFlash: embedding and lm_head) held the
        parked copy: load them again against the unparked target."""
        ctx = self._drafter_context()
        for name, drafter in list(self.drafters.items()):
            if borrows_target_weights(drafter):
                drafter.close()
                self.drafters[name] = load_drafter(self._drafter_sources[name], ctx)
            elif hasattr(getattr(drafter, "runner", None), "drop_graphs"):
                drafter.runner.drop_graphs()    # parking released the shared arena its graphs used

    def _do_free(self, req: m.Free, job: _Job) -> None:
        if not self.compressor.free():
            raise ProtocolError("not_loaded", "free drafter: no prefill drafter is loaded")
        job.send(result_event(req.id, freed="drafter"))

    def _do_quit(self, req: m.Quit, job: _Job) -> None:
        job.send(result_event(req.id, quitting=True))
        with self._cv:
            self._stopping = True
            for queued in self._queue:
                queued.cancelled.set()
            self._cv.notify_all()
