"""Prompts: a conversation rendered with the model's chat template, or a raw completion prompt,
tokenized here with the model's tokenizer (the daemon receives token ids).

Messages reach the template in Hugging Face's shape, whatever the API they came from:
{"role": "system"|"user"|"assistant"|"tool", "content": str, "tool_calls": [{"id", "type":
"function", "function": {"name", "arguments": dict}}], "tool_call_id": str, "name": str}, and
tools as OpenAI function tools ({"type": "function", "function": {"name", "description",
"parameters"}}), which is what HF templates expect.
"""
from __future__ import annotations

from .daemon_link import ModelFiles
from .errors import ApiError

__all__ = ["chat_prompt_ids", "completion_prompt_ids"]


def chat_prompt_ids(model: ModelFiles, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """Token ids of `messages` (and `tools`) in the model's chat template, ending with the header
    of the assistant's turn."""
    if model.template is None:
        raise ApiError(400, f"the model file {model.path.name} has no chat template; use /v1/completions "
                            f"with a raw prompt", param="messages")
    if tools and not model.template_renders_tools:
        raise ApiError(400, f"tools: the chat template of {model.path.name} does not show tools to the "
                            f"model, so this model cannot call them", param="tools")
    try:
        text = model.template.render(messages, tools=tools or None, add_generation_prompt=True)
    except ValueError as exc:  # the template's own raise_exception, or a Jinja error
        raise ApiError(400, f"messages: the model's chat template rejected the conversation: {exc}",
                       param="messages") from None
    except (TypeError, AttributeError) as exc:  # e.g. a template that concatenates a None
        raise ApiError(400, f"messages: the model's chat template cannot render this conversation: {exc}",
                       param="messages") from None
    return _encode(model, text, template_has_bos=True)


def completion_prompt_ids(model: ModelFiles, prompt: str | list) -> list[int]:
    """Token ids of a /v1/completions prompt: a string (tokenized, BOS added where the model
    wants one), a one-string list, or token ids (sent as they are)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        bad = [t for t in prompt if not 0 <= t < model.tokenizer.vocab_size]
        if bad:
            raise ApiError(400, f"prompt: token id {bad[0]} is outside the vocabulary "
                                f"[0, {model.tokenizer.vocab_size})", param="prompt")
        return list(prompt)
    text = prompt[0] if isinstance(prompt, list) else prompt
    return _encode(model, text, template_has_bos=False)


def _encode(model: ModelFiles, text: str, *, template_has_bos: bool) -> list[int]:
    tokenizer = model.tokenizer
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # JSON can carry lone surrogates ("\ud800"); text cannot
        raise ApiError(400, f"the prompt is not valid Unicode: {exc.reason} "
                            f"({text[exc.start:exc.end].encode('unicode_escape').decode()})") from None
    ids = tokenizer.encode(text, add_special=False)
    # A BOS where the model wants one, unless the chat template already wrote it (as llama.cpp does).
    if tokenizer.add_bos and tokenizer.bos_id is not None and not (template_has_bos and ids[:1] == [tokenizer.bos_id]):
        ids.insert(0, tokenizer.bos_id)
    if not ids:
        raise ApiError(400, "the prompt is empty (it tokenizes to no tokens)", param="prompt")
    return ids
