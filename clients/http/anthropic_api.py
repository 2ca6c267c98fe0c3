"""Anthropic-compatible endpoints: POST /v1/messages and POST /v1/messages/count_tokens.

Responses follow Anthropic's Messages API: a `message` object with `text` and `tool_use` content
blocks and a `stop_reason` (end_turn, max_tokens, stop_sequence, tool_use); with `stream: true`
the events message_start, ping, content_block_start / content_block_delta (text_delta,
input_json_delta) / content_block_stop per block, message_delta (stop_reason, usage) and
message_stop. A failure after the stream started is sent as an `error` event.
"""
from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from .anthropic_schemas import CountTokensRequest, Message, MessagesRequest
from .errors import ApiError, anthropic_error_body
from .generation import Finish, GenerationSettings, Step, collect, generate, spec_settings
from .prompts import chat_prompt_ids
from .sse import sse_event
from .streaming import DisconnectWatch, stream_after_first
from .tools import TextPiece

__all__ = ["router"]

STOP_REASONS = {"eos": "end_turn", "stop_sequence": "stop_sequence", "length": "max_tokens",
                "tool_calls": "tool_use"}
TEXT_JOINER = "\n"  # between consecutive text blocks of one message

router = APIRouter()


def _new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def _template_messages(body: MessagesRequest | CountTokensRequest) -> list[dict]:
    """Anthropic's conversation in the HF chat-template shape: tool_use blocks become the
    assistant's tool_calls, tool_result blocks become `tool` messages."""
    out: list[dict] = []
    system = body.system_text()
    if system is not None:
        out.append({"role": "system", "content": system})
    for message in body.messages:
        out.extend(_convert(message))
    return out


def _convert(message: Message) -> list[dict]:
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts = [block.text for block in message.content if block.type == "text"]
    if message.role == "assistant":
        converted = {"role": "assistant", "content": TEXT_JOINER.join(texts)}
        calls = [{"id": block.id, "type": "function", "function": {"name": block.name, "arguments": block.input}}
                 for block in message.content if block.type == "tool_use"]
        if calls:
            converted["tool_calls"] = calls
        return [converted]
    out = [{"role": "tool", "tool_call_id": block.tool_use_id,
            "content": ("Error: " if block.is_error else "") + block.result_text()}
           for block in message.content if block.type == "tool_result"]
    if texts or not out:
        out.append({"role": "user", "content": TEXT_JOINER.join(texts)})
    return out


def _tools(body: MessagesRequest | CountTokensRequest) -> list[dict] | None:
    if not body.tools or (body.tool_choice is not None and body.tool_choice.type == "none"):
        return None
    return [{"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                              "parameters": tool.input_schema}}
            for tool in body.tools]


@router.post("/v1/messages/count_tokens", summary="Count the prompt tokens of a conversation (Anthropic)")
async def count_tokens(body: CountTokensRequest, request: Request) -> dict:
    link = request.app.state.link
    return {"input_tokens": len(chat_prompt_ids(link.model, _template_messages(body), _tools(body)))}


@router.post("/v1/messages", summary="Create a message (Anthropic)")
async def messages(body: MessagesRequest, request: Request):
    link = request.app.state.link
    tools = _tools(body)
    prompt_ids = chat_prompt_ids(link.model, _template_messages(body), tools)
    tool_choice = body.tool_choice
    settings = GenerationSettings(
        prompt_ids=tuple(prompt_ids), max_tokens=body.max_tokens,
        temperature=request.app.state.config.default_temperature if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
        stop=tuple(body.stop_sequences or ()),
        tool_names=frozenset(t["function"]["name"] for t in tools) if tools else None,
        stop_after_first_call=bool(tools) and bool(tool_choice and tool_choice.disable_parallel_tool_use),
        **spec_settings(body, request.app.state.config))
    message_id = _new_id("msg_")
    watch = DisconnectWatch(request)
    items = generate(link, settings, watch.check)
    if body.stream:
        return await stream_after_first(items, watch, _MessageStream(message_id, link.model_id, len(prompt_ids)))

    pieces, _, finish = await collect(items)
    content: list[dict] = []
    for piece in pieces:
        if isinstance(piece, TextPiece):
            if content and content[-1]["type"] == "text":
                content[-1]["text"] += piece.text
            else:
                content.append({"type": "text", "text": piece.text})
        else:
            content.append({"type": "tool_use", "id": _new_id("toolu_"), "name": piece.name,
                            "input": piece.arguments})
    return {"id": message_id, "type": "message", "role": "assistant", "model": link.model_id,
            "content": content, "stop_reason": STOP_REASONS[finish.reason], "stop_sequence": finish.stop_sequence,
            "usage": _usage(finish)}


def _usage(finish: Finish) -> dict:
    """Anthropic's usage: input_tokens counts the prompt tokens computed, cache_read_input_tokens
    those whose K/V the daemon kept from the previous prompt (its prefix reuse); their sum is the
    prompt. (message_start, sent before the daemon answers, gives the whole prompt as input_tokens;
    message_delta carries these final counts.)"""
    return {"input_tokens": finish.n_prompt - finish.n_cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": finish.n_cached, "output_tokens": finish.n_gen}


class _MessageStream:
    """Renders a generation as Anthropic's streaming events."""

    def __init__(self, message_id: str, model: str, n_prompt: int):
        self.message = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
                        "stop_reason": None, "stop_sequence": None,
                        "usage": {"input_tokens": n_prompt, "output_tokens": 0}}
        self.index = -1          # index of the current content block
        self.text_open = False   # whether the current block is an open text block

    @staticmethod
    def event(name: str, data: dict) -> bytes:
        return sse_event({"type": name, **data}, event=name)

    def _close_text(self) -> list[bytes]:
        if not self.text_open:
            return []
        self.text_open = False
        return [self.event("content_block_stop", {"index": self.index})]

    def _step(self, step: Step) -> list[bytes]:
        out = []
        for piece in step.pieces:
            if isinstance(piece, TextPiece):
                if not piece.text:
                    continue
                if not self.text_open:
                    self.index += 1
                    self.text_open = True
                    out.append(self.event("content_block_start", {"index": self.index,
                                                                  "content_block": {"type": "text", "text": ""}}))
                out.append(self.event("content_block_delta", {"index": self.index,
                                                              "delta": {"type": "text_delta", "text": piece.text}}))
            else:
                out.extend(self._close_text())
                self.index += 1
                out.append(self.event("content_block_start", {
                    "index": self.index,
                    "content_block": {"type": "tool_use", "id": _new_id("toolu_"), "name": piece.name, "input": {}}}))
                out.append(self.event("content_block_delta", {
                    "index": self.index, "delta": {"type": "input_json_delta", "partial_json": piece.arguments_json}}))
                out.append(self.event("content_block_stop", {"index": self.index}))
        return out

    # The loop of openai_api.py's streams (first item, then the rest; an ApiError becomes an error event) in
    # this dialect's events: the start, finish and error events differ, only the loop's shape is shared.
    async def __call__(self, first, rest: AsyncIterator) -> AsyncIterator[bytes]:
        yield self.event("message_start", {"message": self.message})
        yield self.event("ping", {})
        try:
            item = first
            while item is not None:
                if isinstance(item, Step):
                    for chunk in self._step(item):
                        yield chunk
                elif isinstance(item, Finish):
                    for chunk in self._close_text():
                        yield chunk
                    yield self.event("message_delta", {
                        "delta": {"stop_reason": STOP_REASONS[item.reason], "stop_sequence": item.stop_sequence},
                        "usage": _usage(item)})
                    yield self.event("message_stop", {})
                item = await anext(rest, None)
        except ApiError as exc:
            yield sse_event(anthropic_error_body(exc), event="error")
