"""Request bodies of the Anthropic-compatible endpoints (/v1/messages, /v1/messages/count_tokens),
as pydantic models (see openai_schemas.py for the rules: unknown fields and wrong types are a 400
naming them; values flashd cannot honour do not validate).

Accepted and ignored by design (harmless, documented in the README): `metadata.user_id`,
`service_tier`, `cache_control` (top level) and on blocks, system blocks and tools (a caching hint).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .openai_schemas import INT32_MAX, MAX_STOP, TOOL_NAME_PATTERN

__all__ = ["Block", "CountTokensRequest", "MessagesRequest", "Message", "ToolDefinition", "UNSUPPORTED_HINTS"]

UNSUPPORTED_HINTS = {
    "tool_choice": "flashd cannot force a tool call: 'any' and 'tool' are not supported; use "
                   "'auto' or 'none'",
    "thinking": "the served models do not think; only {\"type\": \"disabled\"} is accepted",
    "messages": "flashd serves text models: content blocks may be text, tool_use and tool_result",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class CacheControl(_Strict):
    type: Literal["ephemeral"]
    ttl: str | None = None


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = Field(None, description="Accepted and ignored.")
    citations: None = None


class Block(_Strict):
    """A content block: `text`, `tool_use` (assistant) or `tool_result` (user)."""

    type: Literal["text", "tool_use", "tool_result"]
    text: str | None = Field(None, description="text blocks")
    id: str | None = Field(None, description="tool_use blocks")
    name: str | None = Field(None, description="tool_use blocks")
    input: dict | None = Field(None, description="tool_use blocks")
    tool_use_id: str | None = Field(None, description="tool_result blocks")
    content: str | list[TextBlock] | None = Field(None, description="tool_result blocks")
    is_error: bool | None = Field(None, description="tool_result blocks")
    cache_control: CacheControl | None = Field(None, description="Accepted and ignored.")
    citations: None = None

    @model_validator(mode="after")
    def _check_type_fields(self) -> "Block":
        allowed = {"text": {"text"}, "tool_use": {"id", "name", "input"},
                   "tool_result": {"tool_use_id", "content", "is_error"}}[self.type]
        required = {"text": ("text",), "tool_use": ("id", "name", "input"), "tool_result": ("tool_use_id",)}[self.type]
        for field in ("text", "id", "name", "input", "tool_use_id", "content", "is_error"):
            if field not in allowed and getattr(self, field) is not None:
                raise ValueError(f"{field}: not a field of a {self.type} block")
        for field in required:
            if getattr(self, field) is None:
                raise ValueError(f"{field}: a {self.type} block needs it")
        return self

    def result_text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(block.text for block in self.content)


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]

    @model_validator(mode="after")
    def _check_blocks(self) -> "Message":
        if isinstance(self.content, list):
            for n, block in enumerate(self.content):
                if block.type == "tool_use" and self.role != "assistant":
                    raise ValueError(f"content[{n}]: tool_use blocks belong to assistant messages")
                if block.type == "tool_result" and self.role != "user":
                    raise ValueError(f"content[{n}]: tool_result blocks belong to user messages")
        return self


class ToolDefinition(_Strict):
    name: Annotated[str, Field(pattern=TOOL_NAME_PATTERN)]
    description: str | None = None
    input_schema: dict = Field(description="JSON Schema of the input (shown to the model).")
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = Field(None, description="Accepted and ignored.")


class ToolChoice(_Strict):
    type: Literal["auto", "none"]
    disable_parallel_tool_use: bool | None = Field(None, description="true: generation stops after the first call.")


class Metadata(_Strict):
    user_id: str | None = Field(None, description="Accepted and ignored.")


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


class _Conversation(_Strict):
    model: str = Field(description="Any name: flashd serves one model, named in the response.")
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingDisabled | None = None

    @model_validator(mode="after")
    def _check_tools(self) -> "_Conversation":
        if self.tools is not None:
            names = [tool.name for tool in self.tools]
            duplicates = sorted({name for name in names if names.count(name) > 1})
            if duplicates:
                raise ValueError(f"tools: tool names must be unique, {duplicates[0]!r} repeats")
        return self

    def system_text(self) -> str | None:
        if self.system is None:
            return None
        if isinstance(self.system, str):
            return self.system
        return "\n".join(block.text for block in self.system)


class MessagesRequest(_Conversation):
    max_tokens: int = Field(ge=1, le=INT32_MAX)
    stop_sequences: Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP)] | None = None
    stream: bool | None = None
    temperature: float | None = Field(None, ge=0, le=1, description="Default: the gateway's --default-temperature (1.0). 0 = greedy.")
    top_p: float | None = Field(None, ge=0, le=1, description="0 means greedy.")
    top_k: int | None = Field(None, ge=0, le=INT32_MAX, description="0 = off.")
    metadata: Metadata | None = None
    cache_control: CacheControl | None = Field(None, description="Accepted and ignored (a caching hint).")
    service_tier: Literal["auto", "standard_only"] | None = Field(None, description="Accepted and ignored (one tier).")


class CountTokensRequest(_Conversation):
    pass
