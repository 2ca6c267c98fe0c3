"""Request bodies of the Anthropic-compatible endpoints (/v1/messages, /v1/messages/count_tokens),
as pydantic models (see openai_schemas.py for the rules: unknown fields and wrong types are a 400
naming them; values flashd cannot honour do not validate).

Accepted and ignored by design (harmless, documented in the README): `metadata.user_id`,
`service_tier`, `cache_control` (top level) and on blocks, system blocks and tools (a caching hint).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from .openai_schemas import INT32_MAX, MAX_MESSAGES, MAX_STOP, MAX_TOOLS, TOOL_NAME_PATTERN, SpecBudget, SpecDraft, SpecMode

__all__ = ["Block", "ToolResultBlock", "ToolUseBlock", "CountTokensRequest", "MessagesRequest", "Message", "ToolDefinition", "UNSUPPORTED_HINTS"]

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


class ToolUseBlock(_Strict):
    """A tool call the assistant made (in the conversation so far)."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict
    cache_control: CacheControl | None = Field(None, description="Accepted and ignored.")


class ToolResultBlock(_Strict):
    """The result of a tool call, sent by the user."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = Field(None, description="Accepted and ignored.")

    def result_text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(block.text for block in self.content)


_BLOCK_TAGS = {"text": "TextBlock", "tool_use": "ToolUseBlock", "tool_result": "ToolResultBlock"}


def _block_tag(value) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return _BLOCK_TAGS.get(kind) if isinstance(kind, str) else None


Block = Annotated[
    Annotated[TextBlock, Tag("TextBlock")] | Annotated[ToolUseBlock, Tag("ToolUseBlock")]
    | Annotated[ToolResultBlock, Tag("ToolResultBlock")],
    Discriminator(_block_tag, custom_error_type="invalid_block_type",
                  custom_error_message="type must be one of text, tool_use, tool_result (flashd serves text "
                                       "models: no images or documents)",
                  custom_error_context={})]


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
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    system: str | list[TextBlock] | None = None
    tools: Annotated[list[ToolDefinition], Field(max_length=MAX_TOOLS)] | None = None
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
    spec: SpecMode = None
    spec_budget: SpecBudget = None
    spec_draft: SpecDraft = None


class CountTokensRequest(_Conversation):
    pass
