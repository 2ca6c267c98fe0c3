"""Request bodies of the OpenAI-compatible endpoints, as pydantic models.

These models are the contract: FastAPI validates every request against them and publishes them
in /openapi.json, so the schema says exactly what the server accepts. Every model forbids unknown
fields (a 400 naming the field), types are strict (no "0.7" for 0.7, no true for 1), and a
parameter flashd cannot honour is either absent (unknown -> 400) or typed so that only the
values it can honour validate (`n` must be 1, `logit_bias` must be empty, `response_format` must
be text, ...); `UNSUPPORTED_HINTS` adds the reason to the error message.

Parameters accepted and ignored by design (harmless, documented in the README): `user`,
`metadata`, `service_tier`, `prompt_cache_key`, `safety_identifier`,
`stream_options.include_obfuscation`.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from ...protocol.messages import MAX_BUDGET

__all__ = [
    "ChatCompletionRequest", "ChatMessage", "CompletionRequest", "FunctionDefinition",
    "UNSUPPORTED_HINTS", "Tool",
]

INT32_MAX = 2**31 - 1
MAX_STOP = 15  # the daemon takes 16 stop strings; one is kept for parallel_tool_calls=false
# Counts per request: far above any real conversation or tool set (a long agent session is a few thousand
# messages; OpenAI caps tools at 128), so they only bound the work a hostile body can cause before its
# prompt is found too long for the context.
MAX_MESSAGES = 10_000
MAX_TOOLS = 1_024
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_.\-]{1,64}$"

# Why a rejected parameter is rejected; appended to the 400's message.
UNSUPPORTED_HINTS = {
    "n": "flashd returns one choice per request; send n=1 or leave it out",
    "best_of": "flashd returns one choice per request",
    "logit_bias": "logit biases are not supported",
    "response_format": "structured output (json_object / json_schema) is not supported: flashd "
                       "cannot constrain the output to a schema",
    "tool_choice": "flashd cannot force a tool call: 'required' and a named function are not "
                   "supported; use 'auto' or 'none'",
    "audio": "flashd serves text models only",
    "modalities": "flashd serves text models only",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the deprecated `functions` API is not supported; use `tools`",
    "function_call": "the deprecated `function_call` API is not supported; use `tool_choice`",
    "reasoning_effort": "the served models do not reason; leave reasoning_effort out",
    "verbosity": "verbosity is not supported",
    "store": "flashd does not store completions",
    "echo": "echo is not supported",
    "suffix": "fill-in-the-middle suffixes are not supported on /v1/completions",
}


# Speculative decoding (request extensions, both APIs): the daemon's `generate spec= budget= draft=`.
# Left out: the gateway's --spec / --spec-budget / --spec-draft. Exact at temperature 0 (the output
# equals plain greedy decoding); with sampling the output distribution is the target's.
SpecMode = Annotated[Literal["off", "chain", "ddtree", "auto"] | None, Field(
    description="Extension: speculative decoding (default: the gateway's --spec, normally off).")]
SpecBudget = Annotated[int | None, Field(ge=1, le=MAX_BUDGET, description=(
    "Extension: chain length (spec=chain) or drafted tree nodes (spec=ddtree); default: the daemon's."))]
SpecDraft = Annotated[str | None, Field(min_length=1, max_length=4096, description=(
    "Extension: the drafter (a --draft of the daemon, e.g. 'ngram'); default: its first."))]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool | None = Field(None, description="Send a last chunk with `usage` (and `usage: null` on the others).")
    include_obfuscation: bool | None = Field(None, description="Accepted and ignored: flashd never pads chunks.")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str = Field(description="The arguments as a JSON string.")


class AssistantToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class _MessageBase(_Strict):
    name: str | None = Field(None, description="Passed to the chat template.")

    def text(self) -> str:
        """The content as one string (text parts joined by newlines)."""
        content = getattr(self, "content", None)
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        return "\n".join(part.text for part in content)


class SystemMessage(_MessageBase):
    """A system message; `developer` is treated as `system`."""

    role: Literal["system", "developer"]
    content: str | list[TextPart]


class UserMessage(_MessageBase):
    role: Literal["user"]
    content: str | list[TextPart]


class AssistantMessage(_MessageBase):
    role: Literal["assistant"]
    content: str | list[TextPart] | None = None
    tool_calls: list[AssistantToolCall] | None = None
    refusal: None = None
    function_call: None = None
    audio: None = None

    @model_validator(mode="after")
    def _check_content(self) -> "AssistantMessage":
        if self.content is None and not self.tool_calls:
            raise ValueError("content: an assistant message needs content or tool_calls")
        return self


class ToolMessage(_MessageBase):
    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: str = Field(description="The id of the call this message answers.")


_MESSAGE_TAGS = {"system": "SystemMessage", "developer": "SystemMessage", "user": "UserMessage",
                 "assistant": "AssistantMessage", "tool": "ToolMessage"}


def _message_tag(value) -> str | None:
    role = value.get("role") if isinstance(value, dict) else getattr(value, "role", None)
    return _MESSAGE_TAGS.get(role) if isinstance(role, str) else None


ChatMessage = Annotated[
    Annotated[SystemMessage, Tag("SystemMessage")] | Annotated[UserMessage, Tag("UserMessage")]
    | Annotated[AssistantMessage, Tag("AssistantMessage")] | Annotated[ToolMessage, Tag("ToolMessage")],
    Discriminator(_message_tag, custom_error_type="invalid_role",
                  custom_error_message="role must be one of system, developer, user, assistant, tool",
                  custom_error_context={})]


class FunctionDefinition(_Strict):
    name: Annotated[str, Field(pattern=TOOL_NAME_PATTERN)]
    description: str | None = None
    parameters: dict | None = Field(None, description="JSON Schema of the arguments (shown to the model).")
    strict: Literal[False] | None = Field(None, description="Strict schema adherence cannot be guaranteed: only false.")


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class ResponseFormatText(_Strict):
    type: Literal["text"]


class _Sampling(_Strict):
    """Sampling and stopping parameters shared by both OpenAI endpoints."""

    model: str = Field(description="Any name: flashd serves one model, named in the response.")
    temperature: float | None = Field(None, ge=0, le=2, description="Default: the gateway's --default-temperature (1.0). 0 = greedy.")
    top_p: float | None = Field(None, ge=0, le=1, description="0 means greedy.")
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX, description="Extension: keep the k most likely tokens; 0 or -1 = off.")
    min_p: float | None = Field(None, ge=0, lt=1, description="Extension: drop tokens below min_p * p_max.")
    repetition_penalty: float | None = Field(None, gt=0, le=10, description="Extension (llama.cpp semantics): > 1 discourages repeats.")
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1, description="Same seed, same request: same output. Negative seeds wrap to uint64.")
    stop: Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = Field(None, description="Extension: keep generating past the end-of-sequence token.")
    spec: SpecMode = None
    spec_budget: SpecBudget = None
    spec_draft: SpecDraft = None
    n: Literal[1] | None = None
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = None
    user: str | None = Field(None, description="Accepted and ignored.")
    metadata: dict[str, str] | None = Field(None, description="Accepted and ignored.")
    service_tier: str | None = Field(None, description="Accepted and ignored (one tier).")
    store: Literal[False] | None = None

    @model_validator(mode="after")
    def _check_stop(self) -> "_Sampling":
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed with stream=true")
        return self

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="Default: the rest of the context.")
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="Same as max_tokens.")
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto"] | None = None
    parallel_tool_calls: bool | None = Field(None, description="false: generation stops after the first call.")
    response_format: ResponseFormatText | None = None
    modalities: list[Literal["text"]] | None = None
    prompt_cache_key: str | None = Field(None, description="Accepted and ignored.")
    safety_identifier: str | None = Field(None, description="Accepted and ignored.")
    audio: None = None
    prediction: None = None
    web_search_options: None = None
    functions: None = None
    function_call: None = None
    reasoning_effort: None = None
    verbosity: None = None

    @model_validator(mode="after")
    def _check_chat(self) -> "ChatCompletionRequest":
        if (self.max_tokens is not None and self.max_completion_tokens is not None
                and self.max_tokens != self.max_completion_tokens):
            raise ValueError(f"max_tokens ({self.max_tokens}) and max_completion_tokens "
                             f"({self.max_completion_tokens}) disagree; send one of them")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs=true")
        if self.tools is not None:
            names = [tool.function.name for tool in self.tools]
            duplicates = sorted({name for name in names if names.count(name) > 1})
            if duplicates:
                raise ValueError(f"tools: function names must be unique, {duplicates[0]!r} repeats")
        return self

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[list[Annotated[int, Field(ge=0, le=INT32_MAX)]], Field(min_length=1)] = Field(
        description="A string, a list of one string, or a list of token ids.")
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="Default 16, as in OpenAI's API.")
    logprobs: int | None = Field(None, ge=0, le=20, description="Report the n most likely tokens at each step (0: the chosen token's logprob only).")
    echo: Literal[False] | None = None
    best_of: Literal[1] | None = None
    suffix: None = None
