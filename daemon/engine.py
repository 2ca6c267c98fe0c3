"""The engine: what the daemon holds (the target model, its runner and tokenizer, the drafters, the
PFlash compressor) and the one thread that executes requests against it, in order (batch 1).

Front ends (stdin, ZeroMQ, the Lucebox dialect) call `submit(request, emit)` from their own
threads; the engine queues the request (request_queue.py: bounded, overflow is an `overloaded`
error), runs it (handlers.py, generation.py), and calls `emit(event)` from the engine thread for
every event, ending with exactly one terminal event (done / result / error). `emit` must not block
for long: a front end buffers per client.

`cancel` and `status` are answered at once on the caller's thread so they never wait behind a
long generation. A failing request never takes the engine down: its exception becomes an error
event and the next request starts from a clean state.

Parking releases the target's memory (weights, KV cache, the backend's shared buffers) and keeps
what is cheap to keep: the model file's parsed header, the tokenizer and the prompt prefixes in
host RAM; unparking loads the weights again and reloads the drafters that borrowed them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
from typing import Callable

from ..protocol import messages as m
from ..protocol.errors import ProtocolError
from ..protocol.messages import result_event
from .backends import ReferenceBackend, select_backend
from .config import EngineConfig
from .drafter_set import DrafterSet
from .handlers import Handlers
from .models import LoadedModel, ModelLoadError, load_model, open_model
from .models.gguf_file import ModelUnsupported
from .models.weights import total_weight_bytes
from .pflash.service import PrefillCompressor
from .prefix_cache import PrefixStore
from .request_queue import Emit, Job, RequestQueue
from .runner import ModelRunner
from .speculative.drafter import DrafterLoadError
from .speculative.loader import DrafterContext
from .vram_budget import BudgetExceeded, format_size
from .vram_ledger import LedgerState, VramLedger

__all__ = ["Engine", "Emit"]

log = logging.getLogger("flashd.engine")


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
        self.vram: VramLedger | None = None     # the VRAM plan (vram_ledger.py); checks loads with --vram-budget
        # the target runner's max_tree_nodes argument: --max-tree-nodes, or None (the default bound) until the
        # budget check at start lowers it for a hybrid that would not fit otherwise
        self.tree_nodes: int | None = config.max_tree_nodes
        self.drafters = DrafterSet(self.backend, config.ddtree_chain_seed)   # --draft
        # host copies of prompt prefixes, kept across requests and park/unpark (the same model)
        self.prefix_store = (PrefixStore(config.prefix_cache_ram_mb << 20, config.prefill_chunk)
                             if config.prefix_cache and config.prefix_cache_ram_mb > 0 else None)
        self.queue = RequestQueue(config.max_queue, Handlers(self).execute)

    # -- lifecycle -------------------------------------------------------------------------------
    def load(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Check the memory plan (with --vram-budget: of everything configured), then load the target model
        and its tokenizer, the PFlash drafter and the --draft drafters; `progress(done_bytes, total_bytes)`
        follows the target's weight upload."""
        from ..clients.tokenizer import Tokenizer

        self._apply_tuning()
        f, cfg = open_model(self.config.model, self.config.rope_override)   # --rope-scaling over the GGUF's
        try:
            self.config.kv_types.check_head_dim(cfg.head_dim)      # q8_0 / q4_0 rows are whole 32-value blocks
        except ValueError as exc:
            raise ModelLoadError(f"--kv-type {self.config.kv_types}: {exc}") from None
        self.tokenizer = Tokenizer.from_gguf(f.metadata_dict)
        self.plan = self._plan_target(f, cfg)
        if self.config.vram_budget is not None:
            self.vram = VramLedger.for_engine(self.backend, self.config, f, cfg)
            self._check_budget_at_start()
            if self.vram.tree_nodes != self.tree_nodes:     # lowered to fit: the runner and its plan take it
                log.info("--vram-budget: the target's draft tree lowered to %d nodes (a recurrent state each) to fit; "
                         "speculative budgets are clamped to %d drafted nodes", self.vram.target_tree_nodes(),
                         self.vram.target_tree_nodes() - 1)
                self.tree_nodes = self.vram.tree_nodes
                self.plan = self._plan_target(f, cfg)
        self.backend.check_fits(self.plan)       # before anything is allocated
        self._opened = (f, cfg)
        self._load_weights(progress)
        self.compressor = PrefillCompressor(self.backend, self.config.pflash, self.config.prefill_drafter,
                                            self.tokenizer, rope_override=self.config.rope_override)
        self.compressor.admit = self._admit_prefill_drafter
        if self.config.prefill_drafter is not None and self.config.pflash.drafter_policy == "resident":
            try:
                self.compressor.load()
            except ProtocolError as exc:
                raise ModelLoadError(f"--prefill-drafter: {exc.message}") from None
        self.drafters.load(self.config.drafts, self._drafter_context())
        if self.drafters.by_name:
            self.drop_graphs()
        if self.vram is None:
            self.vram = self._ledger_for_status()
        plan = self.vram_plan()
        if plan is not None:
            settings = dict(plan.settings)
            log.info("VRAM plan (%s): peak %s (%s)%s; target draft tree: %d nodes (%s)", plan.where,
                     format_size(plan.peak_bytes), plan.peak_phase,
                     "" if plan.budget_bytes is None else f" of --vram-budget {format_size(plan.budget_bytes)}",
                     settings["max_tree_nodes"], settings["max_tree_nodes_from"])

    # -- the VRAM plan (vram_ledger.py) ------------------------------------------------------------
    def _check_budget_at_start(self) -> None:
        """Everything configured must fit --vram-budget (and the device's free memory) before anything loads."""
        parts = [f"target {self.vram.target.name} at --max-ctx {self.config.max_ctx}"]
        parts += [f"--draft {d}" for d in self.config.drafts]
        parts += [f"--prefill-drafter {self.config.prefill_drafter} ({self.config.pflash.drafter_policy})"
                  ] if self.config.prefill_drafter else []
        try:
            plan = self.vram.check(f"the configuration ({', '.join(parts)})",
                                   LedgerState(pflash=self.config.prefill_drafter), runtime=False)
        except BudgetExceeded as exc:
            raise ModelLoadError(str(exc)) from None
        device = getattr(self.backend, "device", None)
        if device is not None:
            free, total = device.mem_info()
            need = plan.peak_bytes - plan.margin_bytes      # the margin's CUDA context exists already
            if need > free:
                raise ModelLoadError(f"--vram-budget {format_size(plan.budget_bytes)}: the plan needs "
                                     f"{format_size(need)} of device memory at its peak ({plan.peak_phase}) but "
                                     f"{format_size(free)} of {format_size(total)} are free")

    def _ledger_for_status(self) -> VramLedger | None:
        """Without --vram-budget the plan is only reported (status, flashd bench): built after loading,
        and a failure to build it is logged, never fatal."""
        try:
            return VramLedger.for_engine(self.backend, self.config, *self._opened)
        except Exception as exc:  # reporting only: the daemon runs as it did without the plan
            log.warning("no VRAM plan to report: %s: %s", type(exc).__name__, exc)
            return None

    def vram_plan(self):
        """The VRAM plan of what is resident now (vram_budget.VramPlan), None when there is none to report."""
        return self.vram.plan(self._vram_state()) if self.vram is not None else None

    def _vram_report(self) -> dict | None:
        """status.memory.vram: the plan as a dict; a failure to compute it is logged, and status still answers."""
        try:
            plan = self.vram_plan()
        except Exception:  # reporting only: status must answer
            log.exception("the VRAM plan could not be computed")
            return None
        return plan.as_dict() if plan is not None else None

    def _vram_state(self, **change) -> LedgerState:
        """What is resident now (LedgerState), with `change` applied (what a load would make of it)."""
        c = self.compressor
        slot = self.config.prefill_drafter if c is None else (
            str(c.drafter.path) if c.drafter is not None else c.parked_path or c.default_path)
        target = self.model is not None and self.model.weights is not None
        state = LedgerState(target=target, parked=frozenset(self.drafters.parked_names()), pflash=slot,
                            shared_parked=not target and getattr(self.ops, "arena", None) is not None)
        return dataclasses.replace(state, **change)

    def _check_vram(self, action: str, loading, **change) -> None:
        """ProtocolError `oom` (nothing loaded, the daemon keeps serving) when `action` would take the plan
        over --vram-budget."""
        if self.vram is None or self.config.vram_budget is None:
            return
        try:
            self.vram.check(action, self._vram_state(**change), runtime=True, loading=frozenset(loading))
        except BudgetExceeded as exc:
            raise ProtocolError("oom", str(exc)) from None

    def _admit_prefill_drafter(self, path: str, f, cfg) -> None:
        """PrefillCompressor's check before it loads a drafter (the ledger also learns its sizes)."""
        if self.vram is not None:
            desc = self.vram.describe_pflash(path, (f, cfg))
            self._check_vram(f"loading the prefill drafter {desc.name}", {"pflash"}, pflash=path)

    def _drafter_context(self) -> DrafterContext:
        return DrafterContext(backend=self.backend, target_file=self._opened[0], target_model=self.model,
                              max_ctx=self.config.max_ctx, prefill_chunk=self.config.prefill_chunk)

    def drop_graphs(self) -> None:
        """A drafter's model shares the backend's scratch arena and workspaces, which loading it
        may have grown: graphs captured before then could point at freed memory."""
        self.backend.drop_graphs([self.runner, *self.drafters.runners()])

    def _load_weights(self, progress=None) -> None:
        done = [0]
        total = self.plan.weights_bytes

        def step(n_bytes: int) -> None:
            done[0] += n_bytes
            if progress is not None:
                progress(done[0], total)

        self.model = load_model(self._opened, self.ops.load_weight, step)
        self.runner = self.backend.make_runner(self.model.config, self.model.weights, self.config.max_ctx,
                                               self.config.prefill_chunk, self.plan, kv_types=self.config.kv_types,
                                               max_tree_nodes=self.tree_nodes)
        self.runner.reuse_prefix = self.config.prefix_cache
        self.runner.prefix_store = self.prefix_store

    def start(self) -> None:
        if self.model is None:
            raise RuntimeError("Engine.load() must run before start()")
        self.queue.start()

    def _plan_target(self, f, cfg):
        """The target's memory plan on this backend. With --device auto, a model the CUDA kernels do not cover
        (ModelUnsupported: an unsupported head_dim -- e.g. a real qwen35's 256 --, a hybrid's conv / delta head size) runs on the CPU reference backend
        instead -- said in the log, and status reports the backend; --device cuda keeps the refusal."""
        def plan():
            return self.backend.plan(cfg, total_weight_bytes(f, cfg), self.config.max_ctx, self.config.prefill_chunk,
                                     kv_types=self.config.kv_types, max_tree_nodes=self.tree_nodes)
        try:
            return plan()
        except ModelUnsupported as exc:
            if self.config.device != "auto" or self.backend.name == ReferenceBackend.name:
                raise
            log.warning("--device auto: %s -- this model runs on the CPU reference backend", exc)
            self.backend = ReferenceBackend()
            self.ops = self.backend.ops
            self.drafters = DrafterSet(self.backend, self.config.ddtree_chain_seed)
            return plan()

    def stop(self, timeout: float | None = None) -> None:
        """Cancel everything queued or running and join the engine thread."""
        self.queue.close()
        self.queue.join(timeout)

    def ready_info(self) -> dict:
        cfg = self.model.config
        return {"model": str(self.model.path), "arch": cfg.arch, "name": cfg.name,
                "backend": self.backend.name, "device": self.backend.info(), "max_ctx": self.config.max_ctx,
                "vocab_size": cfg.vocab_size, "pid": os.getpid(), "forward": self._forward_info(),
                "kv_types": self.config.kv_types.as_dict()}

    def _apply_tuning(self) -> None:
        """--tuning: the CUDA launch tuning overrides, set before the runner captures its graphs (ModelLoadError on
        another backend, an unknown field or a value the library refuses)."""
        if not self.config.tuning:
            return
        if self.backend.name != "cuda":
            raise ModelLoadError(f"--tuning applies to the CUDA backend only; this daemon runs on {self.backend.name}")
        try:
            self.backend.device.native.set_tuning(**dict(self.config.tuning))
        except (KeyError, RuntimeError) as exc:
            raise ModelLoadError(f"--tuning: {exc}") from None

    def _forward_info(self) -> dict:
        """Which forward runs decode steps and verification: persistent (one launch) or the per-op graph, and (CUDA)
        the launch tuning in effect."""
        runner = self.runner
        info = {"path": getattr(runner, "forward_path", "reference"), "note": getattr(runner, "forward_note", "")}
        native = getattr(getattr(self.backend, "device", None), "native", None)
        if native is not None:
            info["tuning"] = native.tuning()
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
        self.queue.put(request, emit)

    def cancel(self, request_id: str) -> bool:
        """Cancel a queued or running request; False when no such request is pending."""
        return self.cancel_where(lambda job: job.request.id == request_id) > 0

    def cancel_where(self, predicate: Callable[[Job], bool]) -> int:
        """Cancel every pending request the predicate selects (e.g. a disconnected client's).

        A queued request leaves the queue and gets its `cancelled` error at once, on the
        caller's thread (not after the running request ends); the running one stops at its
        next step and its error comes from the engine thread.
        """
        return self.queue.cancel_where(predicate)

    @property
    def n_served(self) -> int:
        return self.queue.n_served

    def status(self) -> dict:
        model = self.model
        cfg = model.config
        running, queued = self.queue.snapshot()
        return {
            "model": str(model.path), "name": cfg.name, "arch": cfg.arch, "backend": self.backend.name,
            "forward": self._forward_info() if self.runner is not None else None,
            "max_ctx": self.config.max_ctx, "kv_types": self.config.kv_types.as_dict(), "parked": self._parked(),
            "max_tree_nodes": self.runner.max_tree_nodes if self.runner is not None else None,
            "drafters": self.drafters.info(),
            "prefill_drafter": self.compressor.status() if self.compressor else None,
            "running": running, "queued": queued, "served": self.n_served,
            "prefix_cache": {"enabled": self.config.prefix_cache,
                             "tokens": self.runner.cached_prefix_tokens if self.runner is not None else 0,
                             "ram": self.prefix_store.info() if self.prefix_store is not None else None},
            "memory": self._memory(),
        }

    def _memory(self) -> dict:
        kv_bytes = self.runner.cache.n_bytes if self.runner is not None else 0
        resident = self.model.weights is not None
        memory = {"plan": self.plan.as_dict(), "resident_weights_bytes": self._weight_bytes() if resident else 0,
                  "resident_kv_bytes": kv_bytes,
                  "vram": self._vram_report()}
        device = getattr(self.backend, "device", None)
        if device is not None:                 # what park/unpark release and take, as the driver sees it
            memory["device_free_bytes"], memory["device_total_bytes"] = device.mem_info()
        return memory

    def _parked(self) -> dict:
        parked = {"target": self.model.weights is None}
        if self.compressor is not None and self.compressor.parked_path is not None:
            parked["drafter"] = True
        spec = self.drafters.parked_names()
        if spec:
            parked["spec_drafters"] = spec
        return parked

    def _weight_bytes(self) -> int:
        w = self.model.weights
        tensors = [w.token_embd, w.output_norm] + ([w.output] if w.output is not w.token_embd else [])
        tensors += [getattr(layer, name) for layer in w.layers for name in layer.__slots__]
        return int(sum(getattr(t, "nbytes", 0) for t in tensors if t is not None))

    # -- what requests read (the engine thread) --------------------------------------------------
    def require_target(self) -> ModelRunner:
        if self.model.weights is None:
            raise ProtocolError("parked", "the target model is parked; send `unpark what=target` first")
        return self.runner

    def check_ids(self, ids) -> list[int]:
        vocab = self.model.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ProtocolError("bad_request", f"ids: token id {bad[0]} is outside the vocabulary [0, {vocab})")
        return list(ids)

    def prompt_ids(self, req) -> list[int]:
        if req.text is not None:
            ids = self.tokenizer.encode(req.text, add_special=getattr(req, "add_special", False))
            if not ids:
                raise ProtocolError("bad_request", "text: the prompt tokenizes to no tokens")
            return ids
        return self.check_ids(req.ids)

    # -- PFlash and parking (the engine thread) --------------------------------------------------
    def compress(self, prompt: list[int], keep: float | None, drafter: str | None = None, alpha: float | None = None,
                 layers: int | None = None, first_layer: int | None = None):
        """PFlash; with the `park` drafter policy, the 24 GB choreography around it: park the
        target, load the drafter, compress, free the drafter, unpark the target."""
        if self.config.pflash.drafter_policy != "park":
            return self.compressor.compress(prompt, keep, drafter, alpha, layers, first_layer)
        if self.config.vram_budget is not None:     # refused over budget before the target is parked
            self.compressor.check(drafter, keep_open=True)
        with self._target_parked():
            try:
                return self.compressor.compress(prompt, keep, drafter, alpha, layers, first_layer)
            finally:
                self.compressor.free()

    @contextlib.contextmanager
    def _target_parked(self):
        was_resident = self.model.weights is not None
        if was_resident:
            self.park_target()
        try:
            yield
        finally:
            if was_resident:
                self.unpark_target()

    def park_target(self) -> None:
        if self.prefix_store is not None:
            self.runner.keep_prefix()     # the cached prompt prefix outlives the cache, in host RAM
        if hasattr(self.runner, "close"):
            self.runner.close()
        self.model.weights = None
        self.runner = None                # releases the KV cache and the weights' memory
        if hasattr(self.ops, "release"):
            self.ops.release()            # and the activation arena and scratch (CUDA)
        gc.collect()

    def unpark_target(self) -> None:
        self._check_vram("unparking the target", {"target"}, target=True)
        try:
            self._load_weights()
            self.drafters.reload_target_borrowers(self._drafter_context())
        except (ModelLoadError, DrafterLoadError) as exc:
            raise ProtocolError("internal", f"unpark failed: {exc}") from exc

    def unpark_spec_drafters(self) -> None:
        parked = self.drafters.parked_names()
        if parked:
            self._check_vram(f"unparking the --draft drafters {', '.join(parked)}", parked, parked=frozenset(),
                             shared_parked=self.model.weights is None)
        self.drafters.unpark(self._drafter_context())
        self.drop_graphs()
