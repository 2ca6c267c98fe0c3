"""One generation as the HTTP dialects see it, independent of their wire formats.

`GenerationSettings` is what a request asks for (already mapped from OpenAI's or Anthropic's
names); `generate` runs it on the daemon and yields `Step`s, each the content that became final
with one daemon event (text pieces and complete tool calls, in output order, plus the logprobs of
the tokens whose text was released), then one `Finish` that says why generation ended.

Why it ended, as both APIs need it: `eos` (the model's end-of-turn token), `stop_sequence` (a
requested stop string matched; `stop_sequence` names it), `length` (max_tokens) or `tool_calls`
(the output held at least one tool call and ended on its own).
"""
from __future__ import annotations

import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from .daemon_link import DaemonLink
from .errors import ApiError
from .tools import TOOL_CALL_CLOSE, TextPiece, ToolCall, ToolCallParser

__all__ = ["Finish", "GenerationSettings", "Step", "TokenLogprob", "collect", "generate", "spec_settings",
           "UNLIKELY_LOGPROB"]

# OpenAI reports log p = -inf as -9999.0; the daemon sends null for it.
UNLIKELY_LOGPROB = -9999.0
SEED_LIMIT = 2**64


@dataclass(slots=True, frozen=True)
class GenerationSettings:
    prompt_ids: tuple[int, ...]
    max_tokens: int | None           # None: the rest of the context
    temperature: float = 1.0         # 0 = greedy
    top_p: float = 1.0               # 0 is accepted and means greedy
    top_k: int = 0                   # 0 (or -1) = off
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None          # None: a fresh random seed (sampling), any int wraps to uint64
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0            # alternatives per token, 0..20
    ignore_eos: bool = False
    tool_names: frozenset[str] | None = None  # None: no tool-call parsing
    stop_after_first_call: bool = False       # parallel tool calls off
    spec: str = "off"                # speculative decoding: off | chain | ddtree (daemon `spec=`)
    spec_budget: int | None = None   # daemon `budget=`; None: its default
    spec_draft: str | None = None    # daemon `draft=`; None: its first drafter

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ApiError(400, "the prompt is empty (it tokenizes to no tokens)")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens}")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_p == 0

    def all_stops(self) -> tuple[str, ...]:
        extra = (TOOL_CALL_CLOSE,) if self.stop_after_first_call and self.tool_names else ()
        return self.stop + tuple(s for s in extra if s not in self.stop)

    def daemon_fields(self, max_ctx: int) -> dict:
        """Client.generate's keyword arguments for this request on a daemon with `max_ctx`."""
        n_prompt = len(self.prompt_ids)
        if self.max_tokens is None:
            max_tokens = max_ctx - n_prompt
            if max_tokens < 1:
                raise ApiError(400, f"the prompt has {n_prompt} tokens, which leaves no room in the "
                                    f"context of {max_ctx} tokens", param="messages",
                               code="context_length_exceeded")
        else:
            max_tokens = self.max_tokens
            if n_prompt + max_tokens > max_ctx:
                raise ApiError(400, f"the prompt has {n_prompt} tokens and max_tokens is {max_tokens}: "
                                    f"{n_prompt + max_tokens} > the context size {max_ctx}",
                               param="max_tokens", code="context_length_exceeded")
        if self.greedy:
            sampling = {"temperature": 0.0, "seed": 0}
        else:
            seed = secrets.randbits(64) if self.seed is None else self.seed % SEED_LIMIT
            sampling = {"temperature": self.temperature, "top_p": self.top_p,
                        "top_k": max(self.top_k, 0), "min_p": self.min_p, "seed": seed}
        fields = {"ids": list(self.prompt_ids), "max_tokens": max_tokens, **sampling,
                  "repeat_penalty": self.repeat_penalty, "frequency_penalty": self.frequency_penalty,
                  "presence_penalty": self.presence_penalty}
        stops = self.all_stops()
        if stops:
            fields["stop"] = list(stops)
        if self.logprobs:
            fields["logprobs"] = max(self.top_logprobs, 1)
        if self.ignore_eos:
            fields["ignore_eos"] = True
        if self.spec != "off":
            fields["spec"] = self.spec
            if self.spec_budget is not None:
                fields["budget"] = self.spec_budget
            if self.spec_draft is not None:
                fields["draft"] = self.spec_draft
        return fields


def spec_settings(body, config) -> dict:
    """GenerationSettings' spec fields: the request's `spec*` extensions, else the gateway's
    --spec defaults (a request's spec="off" turns a default off)."""
    spec = body.spec if body.spec is not None else config.spec
    return {"spec": spec,
            "spec_budget": body.spec_budget if body.spec_budget is not None else config.spec_budget,
            "spec_draft": body.spec_draft if body.spec_draft is not None else config.spec_draft}


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    token: str                    # the token's text (U+FFFD where it is part of a character)
    token_bytes: bytes
    logprob: float
    top: tuple[tuple[str, bytes, float], ...]  # best first; empty unless top_logprobs > 0


@dataclass(slots=True)
class Step:
    pieces: list[TextPiece | ToolCall]
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class Finish:
    reason: str                   # "eos" | "stop_sequence" | "length" | "tool_calls"
    stop_sequence: str | None
    n_prompt: int
    n_gen: int
    n_cached: int = 0             # prompt tokens whose K/V the daemon kept from the last prompt


class _LogprobAligner:
    """Releases each token's logprob once the text it produced has been released by the daemon
    (text held back as a possible stop string is not, and the tokens of a matched stop string or
    the end-of-turn token never are)."""

    def __init__(self, link: DaemonLink, top_n: int):
        self._tokenizer = link.model.tokenizer
        self._top_n = top_n
        self._queue: deque[tuple[int, TokenLogprob]] = deque()  # (n_bytes, entry)
        self._released_bytes = 0
        self._taken_bytes = 0

    def _entry(self, raw: dict) -> TokenLogprob:
        tok = self._tokenizer

        def text_of(token_id: int) -> tuple[str, bytes]:
            data = tok.token_bytes(token_id) if 0 <= token_id < tok.vocab_size else b""
            return data.decode("utf-8", errors="replace"), data

        token, data = text_of(int(raw["id"]))
        top = []
        for alt_id, alt_lp in (raw.get("top") or [])[:self._top_n]:
            alt_text, alt_bytes = text_of(int(alt_id))
            top.append((alt_text, alt_bytes, UNLIKELY_LOGPROB if alt_lp is None else float(alt_lp)))
        logprob = raw.get("logprob")
        return TokenLogprob(token, data, UNLIKELY_LOGPROB if logprob is None else float(logprob), tuple(top))

    def feed(self, raw_entries: list[dict], released_text: str) -> list[TokenLogprob]:
        for raw in raw_entries:
            entry = self._entry(raw)
            self._queue.append((len(entry.token_bytes), entry))
        self._released_bytes += len(released_text.encode("utf-8"))
        out = []
        while self._queue and self._taken_bytes + self._queue[0][0] <= self._released_bytes:
            n_bytes, entry = self._queue.popleft()
            self._taken_bytes += n_bytes
            out.append(entry)
        return out


def _stop_reason(settings: GenerationSettings, link: DaemonLink, out_ids: list[int], text: str,
                 n_calls: int) -> tuple[str, str | None]:
    """(reason, stop_sequence) of a generation the daemon ended with reason "stop"."""
    tokenizer = link.model.tokenizer
    if n_calls:
        return "tool_calls", None
    if out_ids and not settings.ignore_eos and out_ids[-1] in tokenizer.stop_ids:
        return "eos", None
    stops = settings.all_stops()
    if stops:
        # The daemon reports the ids that produced a matched stop string, so the decoded output
        # continues, after the released text, with the stop string it matched.
        tail = tokenizer.decode(out_ids)[len(text):]
        matches = [(tail.find(s), n, s) for n, s in enumerate(stops) if s in tail]
        if matches:
            stop = min(matches)[2]
            if stop in settings.stop:
                return "stop_sequence", stop
    return "eos", None


async def _spec_errors(events: AsyncIterator[dict], settings: GenerationSettings) -> AsyncIterator[dict]:
    """The daemon answers `not_loaded` to a speculative request whose drafter it does not have:
    for the HTTP client that is a bad request (the target model is being served), not a 503."""
    try:
        async with aclosing(events) as inner:
            async for event in inner:
                yield event
    except ApiError as exc:
        if settings.spec != "off" and exc.code == "model_not_loaded":
            raise ApiError(400, exc.message, param="spec_draft", code="drafter_not_loaded") from None
        raise


async def generate(link: DaemonLink, settings: GenerationSettings,
                   is_disconnected: Callable[[], Awaitable[bool]] | None = None
                   ) -> AsyncIterator[Step | Finish]:
    """Run `settings` on the daemon: Steps as output becomes final, then one Finish."""
    fields = settings.daemon_fields(link.max_ctx)
    parser = ToolCallParser(settings.tool_names) if settings.tool_names is not None else None
    aligner = _LogprobAligner(link, settings.top_logprobs) if settings.logprobs else None
    out_ids: list[int] = []
    text_parts: list[str] = []
    async with aclosing(_spec_errors(link.generate(fields, is_disconnected), settings)) as events:
        async for event in events:
            if event["event"] == "token":
                ids = [int(t) for t in event.get("ids") or ()]
                text = event.get("text") or ""
                out_ids.extend(ids)
                text_parts.append(text)
                logprobs = aligner.feed(list(event.get("logprobs") or ()), text) if aligner else []
                pieces = parser.feed(text) if parser is not None else ([TextPiece(text)] if text else [])
                if pieces or logprobs:
                    yield Step(pieces, logprobs)
            elif event["event"] == "done":
                pieces = parser.finish() if parser is not None else []
                if pieces:
                    yield Step(pieces)
                n_calls = parser.n_calls if parser is not None else 0
                if event.get("reason") == "length":
                    reason, stop = ("tool_calls" if n_calls else "length"), None
                else:
                    reason, stop = _stop_reason(settings, link, out_ids, "".join(text_parts), n_calls)
                yield Finish(reason, stop, int(event.get("n_prompt", len(settings.prompt_ids))),
                             int(event.get("n_gen", len(out_ids))), int(event.get("n_cached", 0)))
                return


async def collect(items: AsyncIterator[Step | Finish]
                  ) -> tuple[list[TextPiece | ToolCall], list[TokenLogprob], Finish | None]:
    """A whole generation, for a response that is not streamed: its pieces in output order, the
    logprobs of its tokens and its Finish (`items` is closed however this ends)."""
    pieces: list[TextPiece | ToolCall] = []
    logprobs: list[TokenLogprob] = []
    finish = None
    async with aclosing(items):
        async for item in items:
            if isinstance(item, Step):
                pieces.extend(item.pieces)
                logprobs.extend(item.logprobs)
            else:
                finish = item
    return pieces, logprobs, finish
