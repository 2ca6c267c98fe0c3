"""flashd.clients.chat_template: HF-transformers-style Jinja rendering.

The expected strings for Qwen2.5 and SmolLM2 were written by hand from the templates' logic
(tests/data/tokenizer/*_chat_template.jinja, copied verbatim from the GGUFs; a real-model test
checks the copies still equal the files' templates), not produced by this code.
"""
from __future__ import annotations

import datetime
from pathlib import Path

import gguf
import pytest

from flashd.clients.chat_template import ChatTemplate
from flashd.scripts.gguf_out import new_gguf

DATA = Path(__file__).resolve().parent.parent / "data" / "tokenizer"
QWEN_SOURCE = (DATA / "qwen2.5_chat_template.jinja").read_text(encoding="utf-8")
SMOL_SOURCE = (DATA / "smollm2_chat_template.jinja").read_text(encoding="utf-8")
QWEN_DEFAULT_SYSTEM = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. "
                       "You are a helpful assistant.<|im_end|>\n")

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather & temperature in °C for <city>",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}


@pytest.fixture
def qwen():
    return ChatTemplate(QWEN_SOURCE, bos_token="<|endoftext|>", eos_token="<|im_end|>")


def test_qwen_default_system_prompt_and_generation_prompt(qwen):
    messages = [{"role": "user", "content": "Hello"}]
    assert qwen.render(messages) == (
        QWEN_DEFAULT_SYSTEM + "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
    assert qwen.render(messages, add_generation_prompt=False) == (
        QWEN_DEFAULT_SYSTEM + "<|im_start|>user\nHello<|im_end|>\n")


def test_qwen_system_user_assistant_turns(qwen):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye\n"},
    ]
    # The leading system message replaces the default and is not repeated by the loop.
    assert qwen.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye\n<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_qwen_later_system_message_is_rendered_in_place(qwen):
    messages = [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]
    assert qwen.render(messages, add_generation_prompt=False) == (
        QWEN_DEFAULT_SYSTEM + "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n")


def test_qwen_tools_use_hf_tojson(qwen):
    messages = [{"role": "user", "content": "Weather in Zürich?"}]
    # HF's tojson: keys in insertion order, ", " / ": " separators, no HTML escaping, no \\u.
    tool_json = ('{"type": "function", "function": {"name": "get_weather", "description": '
                 '"Weather & temperature in °C for <city>", "parameters": {"type": "object", '
                 '"properties": {"city": {"type": "string"}}, "required": ["city"]}}}')
    assert qwen.render(messages, tools=[WEATHER_TOOL]) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + tool_json +
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Zürich?<|im_end|>\n<|im_start|>assistant\n")


def test_qwen_tools_with_own_system_prompt(qwen):
    messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "x"}]
    text = qwen.render(messages, tools=[WEATHER_TOOL, {"name": "noop"}],
                       add_generation_prompt=False)
    assert text.startswith("<|im_start|>system\nUse tools.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", ' in text and '}}}\n{"name": "noop"}\n</tools>' in text
    assert text.endswith("</tool_call><|im_end|>\n<|im_start|>user\nx<|im_end|>\n")


def test_qwen_tool_calls_and_consecutive_tool_responses(qwen):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "tool", "content": "sunny"},
    ]
    # Empty content: no "\n" after the assistant header; the function's "arguments" go through
    # tojson; consecutive tool messages share one user turn.
    assert qwen.render(messages) == (
        QWEN_DEFAULT_SYSTEM
        + "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n"
        '{"temp": 21}'
        "\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")


def test_qwen_tool_call_without_function_wrapper_and_with_content(qwen):
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Checking.",
         "tool_calls": [{"name": "f", "arguments": {"x": [1, 2]}},
                        {"name": "g", "arguments": {}}]},
    ]
    assert qwen.render(messages, add_generation_prompt=False) == (
        QWEN_DEFAULT_SYSTEM + "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nChecking.\n<tool_call>\n"
        '{"name": "f", "arguments": {"x": [1, 2]}}\n</tool_call>\n<tool_call>\n'
        '{"name": "g", "arguments": {}}\n</tool_call><|im_end|>\n')


def test_qwen_continue_final_message(qwen):
    messages = [{"role": "user", "content": "Write a haiku"},
                {"role": "assistant", "content": "Autumn moonlight  "}]
    text = qwen.render(messages, add_generation_prompt=False, continue_final_message=True)
    assert text == (QWEN_DEFAULT_SYSTEM + "<|im_start|>user\nWrite a haiku<|im_end|>\n"
                    "<|im_start|>assistant\nAutumn moonlight  ")
    with pytest.raises(ValueError, match="exclude each other"):
        qwen.render(messages, continue_final_message=True)


def test_smollm2_template():
    smol = ChatTemplate(SMOL_SOURCE, bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert smol.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert smol.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                       add_generation_prompt=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n")


def test_templates_in_the_real_files(real_model):
    qwen_path = real_model("qwen2.5-coder-0.5b")
    qwen = ChatTemplate.from_gguf(qwen_path)
    assert qwen.source == QWEN_SOURCE
    assert (qwen.bos_token, qwen.eos_token) == ("<|endoftext|>", "<|im_end|>")
    smol = ChatTemplate.from_gguf(real_model("smollm2-135m"))
    assert smol.source == SMOL_SOURCE
    assert (smol.bos_token, smol.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert ChatTemplate.from_gguf(qwen_path, name="tool_use") is None  # no such variant there


# ---- HF environment semantics ---------------------------------------------------------------------

def test_trim_blocks_and_lstrip_blocks():
    template = ChatTemplate("{% for m in messages %}\n    {% if m.role %}\n  {{ m.content }}\n"
                            "    {% endif %}\n{% endfor %}")
    # Block tags vanish with their indentation and newline; the "  " before {{ }} stays.
    assert template.render([{"role": "u", "content": "a"}, {"role": "v", "content": "b"}]) == "  a\n  b\n"


def test_tojson_options():
    template = ChatTemplate("{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(sort_keys=true) }}")
    x = {"b": "<é>", "a": [1]}
    assert template.render([], x=x) == (
        '{"b": "<é>", "a": [1]}|{\n  "b": "<é>",\n  "a": [\n    1\n  ]\n}|{"a": [1], "b": "<é>"}')


def test_raise_exception_becomes_value_error():
    template = ChatTemplate("{% if messages[0].role != 'user' %}"
                            "{{ raise_exception('Conversation must start with a user turn') }}"
                            "{% endif %}ok")
    assert template.render([{"role": "user", "content": ""}]) == "ok"
    with pytest.raises(ValueError, match="Conversation must start with a user turn"):
        template.render([{"role": "assistant", "content": ""}])


def test_strftime_now_and_loop_controls():
    today = ChatTemplate("{{ strftime_now('%Y-%m-%d') }}").render([])
    assert today in {datetime.date.today().isoformat(),
                     (datetime.date.today() - datetime.timedelta(days=1)).isoformat()}
    loop = ChatTemplate("{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}"
                        "{% if loop.index0 == 3 %}{% break %}{% endif %}{{ m.content }}{% endfor %}")
    assert loop.render([{"content": c} for c in "abcde"]) == "ac"


def test_variables_and_kwargs():
    template = ChatTemplate(
        "{{ bos_token }}{% if tools is none %}no-tools{% endif %}|{{ add_generation_prompt }}|"
        "{{ enable_thinking | default('unset') }}|{% if documents is none %}no-docs{% endif %}"
        "{{ eos_token }}", bos_token="<s>", eos_token="</s>")
    assert template.render([]) == "<s>no-tools|True|unset|no-docs</s>"
    assert template.render([], add_generation_prompt=False, enable_thinking=False,
                           bos_token="[B]") == "[B]no-tools|False|False|no-docs</s>"


def test_generation_block_renders_its_body():
    template = ChatTemplate("{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}"
                            "{% endfor %}")
    assert template.render([{"content": "x"}, {"content": "y"}]) == "xy"


def test_sandbox_and_errors_are_value_errors():
    with pytest.raises(ValueError, match="syntax error"):
        ChatTemplate("{% for m in messages %}")
    mutate = ChatTemplate("{{ messages.append(1) }}")  # the environment is immutable
    with pytest.raises(ValueError, match="chat template error"):
        mutate.render([])
    dunder = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ValueError, match="chat template error"):
        dunder.render([])
    with pytest.raises(ValueError, match="list of dicts"):
        ChatTemplate("x").render(["not a dict"])
    with pytest.raises(TypeError):
        ChatTemplate(None)


def test_from_gguf_without_template_is_none(tmp_path):
    path = tmp_path / "no_template.gguf"
    _write_gguf(path, chat_template=None)
    assert ChatTemplate.from_gguf(path) is None
    path = tmp_path / "with_template.gguf"
    _write_gguf(path, chat_template="{{ bos_token }}{{ messages[0].content }}{{ eos_token }}")
    template = ChatTemplate.from_gguf(path)
    assert template.render([{"role": "user", "content": "hi"}]) == "<s>hi</s>"
    assert ChatTemplate.from_gguf(gguf.GGUFReader(path)).source == template.source


def _write_gguf(path: Path, *, chat_template: str | None) -> None:
    with new_gguf(path, "llama") as writer:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(["<unk>", "<s>", "</s>", "a"])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        if chat_template is not None:
            writer.add_chat_template(chat_template)
