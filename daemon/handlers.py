"""The queued commands, one handler each (`_do_<verb>`), run on the engine thread.

`execute` turns whatever a handler raises into the request's one error event -- a ProtocolError
into its code, MemoryError into `oom`, NonFiniteLogits (a model whose logits are NaN) into `model_output`,
anything else (a bug) into `internal` -- so a failing request never takes the engine down, and resets
the runner so the next request starts clean.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from ..protocol import messages as m
from ..protocol.errors import ProtocolError
from ..protocol.messages import error_event, result_event
from .generation import generate
from .sampling import NonFiniteLogits
from .pflash.service import compressed_fields
from .request_queue import Job

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Handlers"]

log = logging.getLogger("flashd.engine")


class Handlers:
    def __init__(self, engine: Engine):
        self.engine = engine

    def execute(self, job: Job) -> None:
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
        except NonFiniteLogits as exc:
            log.error("request %s: %s", req.id, exc)
            job.send(error_event(req.id, "model_output", str(exc)))
        except Exception as exc:  # a bug: report it, keep serving
            log.exception("request %s failed", req.id)
            job.send(error_event(req.id, "internal", f"{type(exc).__name__}: {exc}"))
        finally:
            if self.engine.runner is not None:
                self.engine.runner.reset()

    def _do_generate(self, req: m.Generate, job: Job) -> None:
        generate(self.engine, req, job)

    def _do_tokenize(self, req: m.Tokenize, job: Job) -> None:
        job.send(result_event(req.id, ids=self.engine.tokenizer.encode(req.text, add_special=req.add_special)))

    def _do_detokenize(self, req: m.Detokenize, job: Job) -> None:
        engine = self.engine
        job.send(result_event(req.id, text=engine.tokenizer.decode(engine.check_ids(req.ids))))

    def _do_score(self, req: m.Score, job: Job) -> None:
        engine = self.engine
        runner = engine.require_target()
        ids = engine.check_ids(req.ids)
        if len(ids) > engine.config.max_ctx:
            raise ProtocolError("ctx_overflow", f"{len(ids)} ids > max_ctx {engine.config.max_ctx}")
        logits = runner.score(ids).astype(np.float64)           # (n, vocab)
        lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        nxt = np.asarray(ids[1:])
        logprobs = logits[np.arange(len(nxt)), nxt] - lse[:-1]
        job.send(result_event(req.id, argmax=[int(t) for t in logits.argmax(-1)],
                              logprobs=[round(float(x), 6) for x in logprobs]))

    def _do_compress(self, req: m.Compress, job: Job) -> None:
        engine = self.engine
        c = engine.compress(engine.prompt_ids(req), req.keep, req.drafter, req.alpha, req.layers, req.first_layer)
        job.send(result_event(req.id, ids=c.ids, **compressed_fields(c)))

    def _do_park(self, req: m.Park, job: Job) -> None:
        engine = self.engine
        if req.what in ("target", "all") and engine.model.weights is not None:
            engine.park_target()
        if req.what in ("draft", "all"):
            engine.compressor.park()
            engine.drafters.park()
        job.send(result_event(req.id, parked=engine.status()["parked"]))

    def _do_unpark(self, req: m.Unpark, job: Job) -> None:
        engine = self.engine
        if req.what in ("target", "all") and engine.model.weights is None:
            engine.unpark_target()
        if req.what in ("draft", "all"):
            engine.compressor.unpark()
            engine.unpark_spec_drafters()
        job.send(result_event(req.id, parked=engine.status()["parked"]))

    def _do_free(self, req: m.Free, job: Job) -> None:
        if not self.engine.compressor.free():
            raise ProtocolError("not_loaded", "free drafter: no prefill drafter is loaded")
        job.send(result_event(req.id, freed="drafter"))

    def _do_quit(self, req: m.Quit, job: Job) -> None:
        job.send(result_event(req.id, quitting=True))
        # this job is finished (its result went out), so closing cancels only what is queued
        self.engine.queue.close()
