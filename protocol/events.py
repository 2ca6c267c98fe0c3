"""Events the daemon sends back: plain dicts shaped like the JSON in SPEC.md.

Every request ends with exactly one terminal event (done, result or error); `token` events come
before a generate's `done`; `ready` is sent once at startup and answers no request.
Constructors check their arguments (ValueError/TypeError: these are the daemon's own bugs,
not a client's bad input).
"""

from __future__ import annotations

from typing import Any

from .errors import ERROR_CODES

PROTOCOL_VERSION = 1  # reported in the ready event; bumped on incompatible changes

TERMINAL_EVENTS = frozenset({"done", "result", "error"})
EVENT_NAMES = frozenset({"token", "ready"}) | TERMINAL_EVENTS
DONE_REASONS = frozenset({"stop", "length"})  # stop: EOS, a stop id or a stop string
# Keys the engine reports in done.timings: milliseconds, and tokens/second (null when undefined).
TIMING_KEYS = ("prefill_ms", "decode_ms", "ttft_ms", "prefill_tok_s", "decode_tok_s")


def _check_ids(ids: Any) -> None:
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in ids
    ):
        raise TypeError(f"ids must be a list of ints, got {ids!r:.80}")


def _check_logprobs(logprobs: Any, n_ids: int) -> None:
    if not isinstance(logprobs, list) or len(logprobs) != n_ids:
        raise ValueError(f"logprobs must be a list with one entry per token ({n_ids}), got {logprobs!r:.80}")


def token_event(id: str, ids: list[int], text: str, logprobs: list | None = None) -> dict:
    """Newly generated tokens and the text they complete.

    `text` is the UTF-8 text these ids add to the output; it may be "" while a multi-byte
    character is incomplete. `logprobs`, when the request asked for it, has one entry per id:
    {"id": token_id, "logprob": float, "top": [[token_id, logprob], ...]} (top alternatives,
    best first).
    """
    _check_ids(ids)
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    event = {"id": id, "event": "token", "ids": ids, "text": text}
    if logprobs is not None:
        _check_logprobs(logprobs, len(ids))
        event["logprobs"] = logprobs
    return event


def done_event(
    id: str,
    reason: str,
    n_prompt: int,
    n_gen: int,
    timings: dict,
    spec: dict | None = None,
    *,
    n_cached: int = 0,
    ids: list[int] | None = None,
    text: str | None = None,
    logprobs: list | None = None,
) -> dict:
    """The end of a generate. With stream=false the whole output rides here as ids/text
    (and logprobs); streamed requests leave them out. n_cached: the prompt tokens (of n_prompt)
    whose K/V the daemon kept from the previous prompt instead of recomputing them.
    """
    if reason not in DONE_REASONS:
        raise ValueError(f"reason must be one of {sorted(DONE_REASONS)}, got {reason!r}")
    for name, count in (("n_prompt", n_prompt), ("n_gen", n_gen), ("n_cached", n_cached)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"{name} must be an int >= 0, got {count!r}")
    if n_cached > n_prompt:
        raise ValueError(f"n_cached {n_cached} > n_prompt {n_prompt}")
    if not isinstance(timings, dict):
        raise TypeError(f"timings must be a dict, got {type(timings).__name__}")
    event: dict[str, Any] = {
        "id": id, "event": "done", "reason": reason,
        "n_prompt": n_prompt, "n_cached": n_cached, "n_gen": n_gen, "timings": timings,
    }
    if spec is not None:
        if not isinstance(spec, dict):
            raise TypeError(f"spec must be a dict, got {type(spec).__name__}")
        event["spec"] = spec
    if ids is not None:
        _check_ids(ids)
        event["ids"] = ids
    if text is not None:
        event["text"] = text
    if logprobs is not None:
        _check_logprobs(logprobs, n_gen if ids is None else len(ids))
        event["logprobs"] = logprobs
    return event


def result_event(id: str, **fields: Any) -> dict:
    """The answer to every verb except generate (and cancel's own acknowledgement)."""
    if "event" in fields:
        raise ValueError("result fields may not be named 'event'")
    return {"id": id, "event": "result", **fields}


def error_event(id: str | None, code: str, message: str) -> dict:
    """A failed request. `id` is None only when the request's id could not be read."""
    if code not in ERROR_CODES:
        raise ValueError(f"unknown error code {code!r}")
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, got {type(message).__name__}")
    return {"id": id, "event": "error", "code": code, "message": message}


def ready_event(**fields: Any) -> dict:
    """Sent once when the models are resident; carries no request id."""
    if "event" in fields or "id" in fields:
        raise ValueError("ready fields may not be named 'event' or 'id'")
    return {"event": "ready", "protocol": PROTOCOL_VERSION, **fields}
