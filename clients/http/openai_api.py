"""OpenAI-compatible endpoints: GET /v1/models, POST /v1/chat/completions, POST /v1/completions.

Responses follow OpenAI's API reference: `chat.completion` / `text_completion` objects, and with
`stream: true` server-sent events of `chat.completion.chunk` / `text_completion` objects ending
with `data: [DONE]` (with `stream_options.include_usage`, a last chunk with empty `choices` and
the `usage`, and `usage: null` on every other chunk). A failure after the stream started is sent
as `data: {"error": {...}}` (the openai SDK raises it).
"""
from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from .errors import ApiError, openai_error_body
from .generation import Finish, GenerationSettings, Step, TokenLogprob, collect, generate, spec_settings
from .openai_schemas import ChatCompletionRequest, CompletionRequest
from .prompts import chat_prompt_ids, completion_prompt_ids
from .sse import sse_event
from .streaming import DisconnectWatch, stream_after_first
from .tools import TextPiece, ToolCall

__all__ = ["router"]

SYSTEM_FINGERPRINT = "fp_flashd"
FINISH_REASONS = {"eos": "stop", "stop_sequence": "stop", "length": "length", "tool_calls": "tool_calls"}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions

router = APIRouter()


def _link(request: Request):
    return request.app.state.link


def _new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def _usage(finish: Finish) -> dict:
    """OpenAI's usage; prompt_tokens_details.cached_tokens: the part of prompt_tokens whose K/V the
    daemon kept from the previous prompt (its prefix reuse)."""
    return {"prompt_tokens": finish.n_prompt, "completion_tokens": finish.n_gen,
            "total_tokens": finish.n_prompt + finish.n_gen,
            "prompt_tokens_details": {"cached_tokens": finish.n_cached}}


# ----------------------------------------------------------------------------------------------
# /v1/models
# ----------------------------------------------------------------------------------------------

def _model_object(link) -> dict:
    return {"id": link.model_id, "object": "model", "created": link.created, "owned_by": "flashd",
            "max_model_len": link.max_ctx}


@router.get("/v1/models", summary="The served model")
async def list_models(request: Request) -> dict:
    return {"object": "list", "data": [_model_object(_link(request))]}


@router.get("/v1/models/{model_id}", summary="One model")
async def get_model(model_id: str, request: Request) -> dict:
    link = _link(request)
    if model_id != link.model_id:
        raise ApiError(404, f"the model {model_id!r} does not exist; this server serves {link.model_id!r}",
                       param="model", code="model_not_found")
    return _model_object(link)


# ----------------------------------------------------------------------------------------------
# request -> GenerationSettings
# ----------------------------------------------------------------------------------------------

def _settings(body, prompt_ids: list[int], *, max_tokens: int | None, config, logprobs: bool, top_logprobs: int,
              tool_names=None, stop_after_first_call=False) -> GenerationSettings:
    return GenerationSettings(
        prompt_ids=tuple(prompt_ids), max_tokens=max_tokens,
        temperature=config.default_temperature if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0, min_p=body.min_p or 0.0,
        repeat_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        frequency_penalty=body.frequency_penalty or 0.0, presence_penalty=body.presence_penalty or 0.0,
        seed=body.seed, stop=tuple(body.stop_list()), logprobs=logprobs, top_logprobs=top_logprobs,
        ignore_eos=bool(body.ignore_eos), tool_names=tool_names, stop_after_first_call=stop_after_first_call,
        **spec_settings(body, config))


def _arguments_for_template(arguments: str):
    """OpenAI sends a call's arguments as a JSON string; HF chat templates expect the object."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return value


def _template_message(message) -> dict:
    """One validated message (SystemMessage, UserMessage, AssistantMessage or ToolMessage) in the
    HF chat-template shape."""
    out = {"role": "system" if message.role == "developer" else message.role, "content": message.text()}
    if message.name is not None:
        out["name"] = message.name
    if getattr(message, "tool_calls", None):
        out["tool_calls"] = [{"id": call.id, "type": "function",
                              "function": {"name": call.function.name,
                                           "arguments": _arguments_for_template(call.function.arguments)}}
                             for call in message.tool_calls]
    if getattr(message, "tool_call_id", None) is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


# ----------------------------------------------------------------------------------------------
# /v1/chat/completions
# ----------------------------------------------------------------------------------------------

def _chat_logprobs(entries: list[TokenLogprob]) -> dict:
    return {"content": [{"token": e.token, "logprob": e.logprob, "bytes": list(e.token_bytes),
                         "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(b)} for t, b, lp in e.top]}
                        for e in entries],
            "refusal": None}


def _tool_call_object(call: ToolCall, call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json}}


@router.post("/v1/chat/completions", summary="Chat completion (OpenAI)")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    link = _link(request)
    use_tools = bool(body.tools) and body.tool_choice != "none"
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if use_tools else None
    prompt_ids = chat_prompt_ids(link.model, [_template_message(m) for m in body.messages], tools)
    settings = _settings(
        body, prompt_ids, max_tokens=body.max_new_tokens(), config=request.app.state.config,
        logprobs=bool(body.logprobs), top_logprobs=body.top_logprobs or 0,
        tool_names=frozenset(t.function.name for t in body.tools) if use_tools else None,
        stop_after_first_call=use_tools and body.parallel_tool_calls is False)
    completion_id, created = _new_id("chatcmpl-"), int(time.time())
    watch = DisconnectWatch(request)
    items = generate(link, settings, watch.check)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        render = _ChatStream(completion_id, created, link.model_id, include_usage, bool(body.logprobs))
        return await stream_after_first(items, watch, render)

    pieces, logprobs, finish = await collect(items)
    content = "".join(p.text for p in pieces if isinstance(p, TextPiece))
    calls = [_tool_call_object(p, _new_id("call_")) for p in pieces if not isinstance(p, TextPiece)]
    message = {"role": "assistant", "content": content if content or not calls else None, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    return {"id": completion_id, "object": "chat.completion", "created": created, "model": link.model_id,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [{"index": 0, "message": message,
                         "logprobs": _chat_logprobs(logprobs) if body.logprobs else None,
                         "finish_reason": FINISH_REASONS[finish.reason]}],
            "usage": _usage(finish)}


class _ChatStream:
    """Renders a chat generation as chat.completion.chunk events."""

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool, logprobs: bool):
        self.base = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                     "model": model, "system_fingerprint": SYSTEM_FINGERPRINT}
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.n_calls = 0

    def chunk(self, delta: dict, *, finish: str | None = None, logprobs: dict | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        data = {**self.base, "choices": [choice]}
        if self.include_usage:
            data["usage"] = None
        return sse_event(data)

    async def __call__(self, first, rest: AsyncIterator) -> AsyncIterator[bytes]:
        yield self.chunk({"role": "assistant", "content": ""})
        try:
            item = first
            while item is not None:
                if isinstance(item, Step):
                    for event in self._step(item):
                        yield event
                elif isinstance(item, Finish):
                    yield self.chunk({}, finish=FINISH_REASONS[item.reason])
                    if self.include_usage:
                        yield sse_event({**self.base, "choices": [], "usage": _usage(item)})
                item = await anext(rest, None)
        except ApiError as exc:
            yield sse_event(openai_error_body(exc))
            return
        yield sse_event("[DONE]")

    def _step(self, step: Step) -> list[bytes]:
        out = []
        pending_logprobs = _chat_logprobs(step.logprobs) if self.logprobs and step.logprobs else None
        for piece in step.pieces:
            if isinstance(piece, TextPiece):
                out.append(self.chunk({"content": piece.text}, logprobs=pending_logprobs))
                pending_logprobs = None
            else:
                index = self.n_calls
                self.n_calls += 1
                out.append(self.chunk({"tool_calls": [{"index": index, "id": _new_id("call_"), "type": "function",
                                                       "function": {"name": piece.name, "arguments": ""}}]}))
                out.append(self.chunk({"tool_calls": [{"index": index, "function": {"arguments": piece.arguments_json}}]}))
        if pending_logprobs is not None:
            out.append(self.chunk({}, logprobs=pending_logprobs))
        return out


# ----------------------------------------------------------------------------------------------
# /v1/completions
# ----------------------------------------------------------------------------------------------

class _CompletionLogprobs:
    """The legacy logprobs object: parallel lists over the generated tokens."""

    def __init__(self, top_n: int):
        self.top_n = top_n
        self.offset = 0  # characters of text before the next token

    def render(self, entries: list[TokenLogprob]) -> dict:
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [] if self.top_n else None, "text_offset": []}
        for entry in entries:
            out["tokens"].append(entry.token)
            out["token_logprobs"].append(entry.logprob)
            if self.top_n:
                out["top_logprobs"].append({t: lp for t, _, lp in entry.top})
            out["text_offset"].append(self.offset)
            self.offset += len(entry.token)
        return out


@router.post("/v1/completions", summary="Text completion (OpenAI, legacy)")
async def completions(body: CompletionRequest, request: Request):
    link = _link(request)
    prompt_ids = completion_prompt_ids(link.model, body.prompt)
    want_logprobs = body.logprobs is not None
    settings = _settings(body, prompt_ids,
                         max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens,
                         config=request.app.state.config, logprobs=want_logprobs, top_logprobs=body.logprobs or 0)
    completion_id, created = _new_id("cmpl-"), int(time.time())
    base = {"id": completion_id, "object": "text_completion", "created": created, "model": link.model_id,
            "system_fingerprint": SYSTEM_FINGERPRINT}
    watch = DisconnectWatch(request)
    items = generate(link, settings, watch.check)
    logprob_renderer = _CompletionLogprobs(body.logprobs or 0)

    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def chunk(text: str, finish: str | None = None, logprobs: dict | None = None) -> bytes:
            data = {**base, "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]}
            if include_usage:
                data["usage"] = None
            return sse_event(data)

        async def render(first, rest: AsyncIterator) -> AsyncIterator[bytes]:
            try:
                item = first
                while item is not None:
                    if isinstance(item, Step):
                        text = "".join(p.text for p in item.pieces if isinstance(p, TextPiece))
                        logprobs = logprob_renderer.render(item.logprobs) if want_logprobs else None
                        yield chunk(text, logprobs=logprobs)
                    elif isinstance(item, Finish):
                        yield chunk("", finish=FINISH_REASONS[item.reason])
                        if include_usage:
                            yield sse_event({**base, "choices": [], "usage": _usage(item)})
                    item = await anext(rest, None)
            except ApiError as exc:
                yield sse_event(openai_error_body(exc))
                return
            yield sse_event("[DONE]")

        return await stream_after_first(items, watch, render)

    pieces, entries, finish = await collect(items)
    text = "".join(p.text for p in pieces if isinstance(p, TextPiece))
    return {**base, "choices": [{"index": 0, "text": text,
                                 "logprobs": logprob_renderer.render(entries) if want_logprobs else None,
                                 "finish_reason": FINISH_REASONS[finish.reason]}],
            "usage": _usage(finish)}
