"""The generate command: prompt (compressed by PFlash when asked) -> tokens from the runner or a
speculative decoder -> text cut at stop ids and stop strings, streamed as token events or
collected, ending in one `done` event with the timings.

Speculative decoding never changes the output, so a request whose drafter is parked decodes plainly
and says so in its `spec` field.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..protocol import messages as m
from ..protocol.errors import ProtocolError
from ..protocol.messages import done_event, token_event
from .drafter_set import ParkedDrafter
from .pflash.service import compressed_fields
from .request_queue import Job
from .speculative.decoder import SpecStats
from .stops import StopMatcher

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["generate"]


@dataclass(slots=True)
class _Output:
    """What a generation produced so far."""

    ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)
    reason: str = "length"
    t_first: float | None = None      # when the first token arrived (the end of the prefill)


def generate(engine: Engine, req: m.Generate, job: Job) -> None:
    drafter = engine.drafters.pick(req.draft) if (req.spec != "off" or req.draft is not None) else None
    engine.require_target()
    prompt, compressed = _prompt(engine, req)
    runner = engine.require_target()
    if len(prompt) + req.max_tokens > engine.config.max_ctx:
        raise ProtocolError("ctx_overflow", f"prompt {len(prompt)} + max_tokens {req.max_tokens} "
                                            f"> max_ctx {engine.config.max_ctx}")
    t_start = time.perf_counter()
    spec = (engine.drafters.spec_decoder(req, runner, drafter)
            if req.spec != "off" and not isinstance(drafter, ParkedDrafter) else None)
    tokens = (spec or runner).generate(prompt, req.sampling, req.max_tokens, logprobs=req.logprobs)
    out = _decode(job, req, tokens, engine.tokenizer)
    t_end = time.perf_counter()
    done = done_event(req.id, out.reason, len(prompt), len(out.ids),
                      _timings(t_start, out.t_first or t_end, t_end, len(prompt) - runner.n_reused, len(out.ids)),
                      n_cached=runner.n_reused)
    if compressed is not None:     # n_prompt above counts the compressed prompt
        done["compress"] = compressed_fields(compressed)
    if spec is not None:
        done["spec"] = spec.stats.as_dict(spec.config.mode, spec.config.budget, drafter.name)
    elif isinstance(drafter, ParkedDrafter):      # decoded plainly: same tokens, no drafting
        done["spec"] = {**SpecStats().as_dict(req.spec, req.budget, drafter.name), "parked": True}
    if not req.stream:
        done["ids"] = out.ids
        done["text"] = "".join(out.text)
        if req.logprobs:
            done["logprobs"] = out.logprobs
    job.send(done)


def _prompt(engine: Engine, req: m.Generate):
    """The prompt's ids, compressed when the request (or the daemon's --compress) asks and the
    prompt is long enough; (ids, the compression's result or None)."""
    prompt = engine.prompt_ids(req)
    mode = req.compress if req.compress is not None else engine.config.pflash.mode
    if not engine.compressor.wants(mode, len(prompt), req.threshold):
        return prompt, None
    compressed = engine.compress(prompt, req.keep)       # keep None: the prompt length's band (PFlashConfig.setting)
    return compressed.ids, compressed


def _decode(job: Job, req: m.Generate, tokens, tokenizer) -> _Output:
    """Run the token iterator to a stop id, a stop string, max_tokens or a cancel; stream what the
    request asks for."""
    stop_ids = set(req.stop_ids) | (set() if req.ignore_eos else set(tokenizer.stop_ids))
    decoder = tokenizer.stream_decoder()
    stops = StopMatcher(req.stop)
    out = _Output()
    try:
        for sampled in tokens:
            if out.t_first is None:
                out.t_first = time.perf_counter()
            if job.cancelled.is_set():
                raise ProtocolError("cancelled", f"cancelled after {len(out.ids)} tokens")
            tok = sampled.token
            out.ids.append(tok)
            if tok in stop_ids:
                out.reason = "stop"
                text = stops.flush()
            else:
                text = stops.feed(decoder.feed([tok]))
                if stops.stopped:
                    out.reason = "stop"
            lp = None
            if req.logprobs:
                lp = [{"id": tok, "logprob": sampled.logprob, "top": [[t, v] for t, v in sampled.top]}]
                out.logprobs.extend(lp)
            out.text.append(text)
            if req.stream:
                job.send(token_event(req.id, [tok], text, lp))
            if out.reason == "stop":
                break
    finally:
        tokens.close()
    if out.reason == "length":        # what the stream decoder and the stop matcher still hold
        tail = stops.feed(decoder.flush()) + stops.flush()
        if tail:
            out.text.append(tail)
            if req.stream:
                job.send(token_event(req.id, [], tail))
    return out


def _timings(t_start: float, t_first: float, t_end: float, n_prefilled: int, n_gen: int) -> dict:
    prefill_s, decode_s = t_first - t_start, t_end - t_first
    return {"prefill_ms": round(prefill_s * 1e3, 3), "decode_ms": round(decode_s * 1e3, 3),
            "ttft_ms": round(prefill_s * 1e3, 3),
            "prefill_tok_s": round(n_prefilled / prefill_s, 2) if prefill_s > 0 else None,
            "decode_tok_s": round((n_gen - 1) / decode_s, 2) if n_gen > 1 and decode_s > 0 else None}
