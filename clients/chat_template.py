"""A model's chat template (`tokenizer.chat_template`, Jinja), rendered the way HF transformers
renders it (`transformers.utils.chat_template_utils._compile_jinja_template`):

- `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the `loopcontrols`
  extension (`{% break %}`, `{% continue %}`) and a `{% generation %}` block tag (HF uses it to
  mark assistant tokens; here it just renders its body);
- `raise_exception(msg)` and `strftime_now(fmt)` globals;
- a `tojson` filter with HF's semantics: `json.dumps(x, ensure_ascii=False, indent=None,
  separators=None, sort_keys=False)` (Jinja's own filter HTML-escapes and sorts keys);
- variables `messages`, `tools`, `documents`, `add_generation_prompt`, `bos_token`, `eos_token`,
  plus any keyword arguments of `render` (which override the token variables).
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from gguf import GGUFReader
from jinja2.sandbox import ImmutableSandboxedEnvironment

from flashd.clients.tokenizer import tokenizer_metadata

__all__ = ["ChatTemplate"]


class _TemplateRaised(Exception):
    """Raised by the template's own `raise_exception`; the message is the template's."""


def _raise_exception(message):
    raise _TemplateRaised(str(message))


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: renders the body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template. Rendering is pure (no state kept between calls)."""

    __slots__ = ("source", "bos_token", "eos_token", "_template")

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = ""):
        if not isinstance(source, str):
            raise TypeError(f"chat template source must be str, got {type(source).__name__}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template syntax error at line {exc.lineno}: {exc.message}") from exc

    @classmethod
    def from_gguf(cls, source: str | Path | GGUFReader, *, name: str | None = None) -> "ChatTemplate | None":
        """The GGUF's `tokenizer.chat_template` (or the named variant
        `tokenizer.chat_template.<name>`, e.g. "tool_use"); None when the file has none.
        `bos_token`/`eos_token` are the texts of the file's BOS/EOS ids."""
        metadata = tokenizer_metadata(source)
        key = "tokenizer.chat_template" + (f".{name}" if name else "")
        template = metadata.get(key)
        if template is None:
            return None
        tokens = metadata.get("tokenizer.ggml.tokens") or []

        def token_text(key: str) -> str:
            token_id = metadata.get(key)
            if token_id is None or not 0 <= int(token_id) < len(tokens):
                return ""
            return tokens[int(token_id)]

        return cls(str(template), bos_token=token_text("tokenizer.ggml.bos_token_id"),
                   eos_token=token_text("tokenizer.ggml.eos_token_id"))

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True,
               tools: list | None = None, continue_final_message: bool = False, **kwargs) -> str:
        """The prompt text for `messages` (dicts with at least "role" and usually "content").

        add_generation_prompt: end with the header of an assistant turn (template-defined).
        tools: JSON-schema tool descriptions, passed to the template as `tools`.
        continue_final_message: cut the text right after the last message's content, so the
          model continues that (assistant) message instead of starting a new turn (as HF does);
          excludes add_generation_prompt.
        kwargs: extra template variables (e.g. documents, enable_thinking, date_string).
        """
        if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages must be a list of dicts")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt exclude each other")
        if continue_final_message and not messages:
            raise ValueError("continue_final_message needs at least one message")
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token,
                     "documents": None, **kwargs}
        try:
            text = self._template.render(messages=messages, tools=tools,
                                         add_generation_prompt=add_generation_prompt, **variables)
        except _TemplateRaised as exc:
            raise ValueError(f"chat template error: {exc}") from None
        except jinja2.TemplateError as exc:  # undefined operations, sandbox violations, ...
            raise ValueError(f"chat template error: {exc}") from exc
        if continue_final_message:
            text = self._cut_after_final_content(text, messages[-1])
        return text

    @staticmethod
    def _cut_after_final_content(text: str, final: dict) -> str:
        content = final.get("content")
        if not isinstance(content, str) or not content.strip():
            raise ValueError("continue_final_message needs a final message with text content")
        # HF's rule: find the last occurrence of the stripped content; keep the content's trailing
        # whitespace only if the template kept it.
        loc = text.rfind(content.strip())
        if loc < 0:
            raise ValueError("continue_final_message: the final message's content does not "
                             "appear in the rendered template")
        if text[loc:loc + len(content.lstrip())] == content:
            return text[:loc + len(content.lstrip())]
        return text[:loc + len(content.strip())]
