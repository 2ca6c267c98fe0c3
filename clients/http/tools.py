"""Finding tool calls in a model's streamed output.

Models trained on the Hermes/Qwen format answer a tool request with

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(one block per call, several blocks for parallel calls). Some answer with the bare JSON object
instead, alone or as a list, sometimes inside a ```json fence. `ToolCallParser` is fed the text as
it is generated and returns, in order, `TextPiece`s (ordinary content, safe to stream now) and
`ToolCall`s (complete, validated calls):

- text that might be the start of a `<tool_call>` tag is held back until it is known not to be;
- a tag's body is held until `</tool_call>` (or the end of the output) and then parsed; a body
  that is not a valid call of a declared tool comes back as text, verbatim, so a failed parse
  never swallows the reply;
- an output that starts with `{`, `[` or a ```json fence is held to the end and parsed as bare
  calls; if it is not one, it comes back as text.
"""
from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass

__all__ = ["TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "TextPiece", "ToolCall", "ToolCallParser", "parse_call"]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_FENCE = re.compile(r"```(?:json)?[ \t]*\n?")  # an opening ```json fence (the language is optional)
_WHITESPACE = " \t\r\n"


@dataclass(slots=True, frozen=True)
class TextPiece:
    text: str


@dataclass(slots=True, frozen=True)
class ToolCall:
    name: str
    arguments: dict  # the decoded arguments object (OpenAI sends it on as a JSON string)

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


def parse_call(value: object, tool_names: Collection[str] | None) -> ToolCall | None:
    """A ToolCall from one decoded JSON value {"name": str, "arguments": object or JSON string}
    ("parameters" is accepted for "arguments"), or None when it is not a call of a known tool."""
    if not isinstance(value, dict) or set(value) - {"name", "arguments", "parameters"}:
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name or (tool_names is not None and name not in tool_names):
        return None
    if "arguments" in value and "parameters" in value:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models encode the object as a string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(name, arguments)


def _decode_all(text: str) -> list[object] | None:
    """All JSON values in `text`, separated by whitespace only; None if it is anything else."""
    decoder = json.JSONDecoder()
    values = []
    position = 0
    text = text.strip()
    while position < len(text):
        try:
            value, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return None
        values.append(value)
        while position < len(text) and text[position] in _WHITESPACE:
            position += 1
    return values


def _bare_calls(text: str, tool_names: Collection[str] | None) -> list[ToolCall] | None:
    """The calls in an output made only of bare JSON calls (objects, or lists of objects),
    optionally in one ``` fence; None if the output is anything else."""
    body = text.strip()
    fence = _FENCE.match(body)
    if fence:
        if not body.endswith("```") or len(body) < fence.end() + 3:
            return None
        body = body[fence.end():-3]
    values = _decode_all(body)
    if not values:
        return None
    calls = []
    for value in values:
        for item in (value if isinstance(value, list) else [value]):
            call = parse_call(item, tool_names)
            if call is None:
                return None
            calls.append(call)
    return calls or None


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ToolCallParser:
    """Feed the output text as it comes (`feed`), then `finish` once; both return the pieces
    that became known, in output order. tool_names: the declared tools (a call of any other
    name is not a call); None accepts any name."""

    _START, _TEXT, _CALL, _BARE = "start", "text", "call", "bare"

    def __init__(self, tool_names: Collection[str] | None):
        self.tool_names = None if tool_names is None else frozenset(tool_names)
        self._mode = self._START
        self._buffer = ""    # text not yet returned
        self.n_calls = 0     # calls returned so far

    def feed(self, text: str) -> list[TextPiece | ToolCall]:
        self._buffer += text
        out: list[TextPiece | ToolCall] = []
        while True:
            before = (self._mode, len(self._buffer))
            if self._mode == self._START:
                self._step_start()
            elif self._mode == self._TEXT:
                self._step_text(out)
            elif self._mode == self._CALL:
                self._step_call(out)
            if (self._mode, len(self._buffer)) == before:
                return out

    def finish(self) -> list[TextPiece | ToolCall]:
        """The end of the output: whatever is held back is decided now."""
        out: list[TextPiece | ToolCall] = []
        buffer, self._buffer = self._buffer, ""
        if self._mode == self._CALL:
            # An unclosed block: the output was cut (a stop string, max_tokens) after the body.
            body = buffer[len(TOOL_CALL_OPEN):]
            call = self._parse_body(body)
            if call is not None:
                out.append(call)
            else:
                out.append(TextPiece(buffer))
        elif self._mode in (self._BARE, self._START) and buffer.strip():
            calls = _bare_calls(buffer, self.tool_names)
            if calls:
                self.n_calls += len(calls)
                out.extend(calls)
            else:
                out.append(TextPiece(buffer))
        elif buffer and not (self.n_calls and not buffer.strip()):  # whitespace after calls: dropped
            out.append(TextPiece(buffer))
        self._mode = self._TEXT
        return [piece for piece in out if not (isinstance(piece, TextPiece) and not piece.text)]

    # -- modes -----------------------------------------------------------------------------------
    def _step_start(self) -> None:
        """Before any content: decide between a tagged call, bare JSON and plain text."""
        head = self._buffer.lstrip(_WHITESPACE)
        if not head:
            return
        if head.startswith(("{", "[")):
            self._mode = self._BARE
        elif len(head) < 3 and "```".startswith(head):
            return  # maybe a fence
        elif head.startswith("```"):
            newline = head.find("\n")
            if newline < 0:
                # "```", "```js", "```json" so far: wait while it may still be a ```json line.
                if not (head.rstrip(" \t") in ("```", "```json") or "```json".startswith(head)):
                    self._mode = self._TEXT
                return
            if head[3:newline].strip() not in ("", "json"):
                self._mode = self._TEXT
                return
            rest = head[newline + 1:].lstrip(_WHITESPACE)
            if rest:
                self._mode = self._BARE if rest.startswith(("{", "[")) else self._TEXT
        elif TOOL_CALL_OPEN.startswith(head[:len(TOOL_CALL_OPEN)]) and len(head) < len(TOOL_CALL_OPEN):
            return  # maybe the start of the tag
        else:
            self._mode = self._TEXT

    def _step_text(self, out: list) -> None:
        at = self._buffer.find(TOOL_CALL_OPEN)
        if at >= 0:
            before = self._buffer[:at]
            if before and not (self.n_calls and not before.strip()):  # whitespace between calls: drop
                out.append(TextPiece(before))
            self._buffer = self._buffer[at:]
            self._mode = self._CALL
            return
        keep = _partial_suffix(self._buffer, TOOL_CALL_OPEN)
        ready = self._buffer[:len(self._buffer) - keep]
        if ready and self.n_calls and not ready.strip():
            # Whitespace right after a call: hold it; it is dropped if another call follows.
            return
        if ready:
            out.append(TextPiece(ready))
            self._buffer = self._buffer[len(ready):]

    def _step_call(self, out: list) -> None:
        end = self._buffer.find(TOOL_CALL_CLOSE)
        if end < 0:
            return
        block = self._buffer[:end + len(TOOL_CALL_CLOSE)]
        self._buffer = self._buffer[len(block):]
        self._mode = self._TEXT
        call = self._parse_body(block[len(TOOL_CALL_OPEN):-len(TOOL_CALL_CLOSE)])
        out.append(call if call is not None else TextPiece(block))

    def _parse_body(self, body: str) -> ToolCall | None:
        values = _decode_all(body)
        if values is None or len(values) != 1:
            return None
        call = parse_call(values[0], self.tool_names)
        if call is not None:
            self.n_calls += 1
        return call
