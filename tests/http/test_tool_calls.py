"""Tool calls end to end, with a scripted fake daemon that "emits" chosen text (a random model
cannot be made to call a tool), behind the real gateway, driven by the openai and anthropic
clients. The fake daemon's model file carries Qwen2.5's chat template, which shows tools to the
model; what the gateway sent (prompt ids, stop strings) is checked from the fake's record."""
from __future__ import annotations

import json
import time

import anthropic
import httpx
import openai
import pytest

from flashd.clients.tokenizer import Tokenizer

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TWO_CALLS = CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def chunks(text: str, size: int = 3) -> list[str]:
    """The reply split into small token-sized pieces (tags and JSON cut mid-way)."""
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.fixture
def clients(fake_gateway):
    fake, server = fake_gateway
    return (fake, openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30),
            anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=30))


def sent_prompt(fake, tool_model) -> str:
    """The text of the last prompt the gateway sent to the daemon."""
    ids = fake.requests("generate")[-1]["ids"]
    if isinstance(ids, bytes):
        import struct

        ids = list(struct.unpack(f"<{len(ids) // 4}i", ids))
    return Tokenizer.from_gguf(tool_model).decode(ids)


def merge_stream_tool_calls(stream) -> tuple[str, list[dict], str]:
    """(content, tool calls merged by index as an OpenAI client does, finish_reason)."""
    content, calls, finish = [], {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content.append(delta.content or "")
        for call in delta.tool_calls or ():
            merged = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
            merged["id"] = call.id or merged["id"]
            if call.function and call.function.name:
                merged["name"] += call.function.name
            if call.function and call.function.arguments:
                merged["arguments"] += call.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    return "".join(content), [calls[i] for i in sorted(calls)], finish


def test_openai_tool_call_non_stream(clients, tool_model):
    fake, oai, _ = clients
    fake.reply = chunks(CALL)
    reply = oai.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=100)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    prompt = sent_prompt(fake, tool_model)
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt  # the tools reached the template


def test_openai_tool_calls_stream_with_text_before(clients):
    fake, oai, _ = clients
    fake.reply = chunks("Let me check.\n" + TWO_CALLS, size=2)
    content, calls, finish = merge_stream_tool_calls(
        oai.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=200, stream=True))
    assert content == "Let me check.\n" and finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                          ("get_time", {})]
    assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]
    # the non-streamed answer holds the same
    reply = oai.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=200)
    assert reply.choices[0].message.content == "Let me check.\n" and len(reply.choices[0].message.tool_calls) == 2


def test_tags_never_leak_into_streamed_text(clients):
    fake, oai, _ = clients
    fake.reply = list(CALL)  # one character per token: every partial tag is seen
    content, calls, finish = merge_stream_tool_calls(
        oai.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=200, stream=True))
    assert content == "" and len(calls) == 1 and finish == "tool_calls"


@pytest.mark.parametrize("reply", [
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
    '[{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}]',
])
def test_bare_json_tool_calls(clients, reply):
    fake, oai, _ = clients
    fake.reply = chunks(reply)
    for stream in (False, True):
        if stream:
            content, calls, finish = merge_stream_tool_calls(oai.chat.completions.create(
                model="m", messages=MESSAGES, tools=TOOLS, max_tokens=100, stream=True))
        else:
            choice = oai.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=100).choices[0]
            content, finish = choice.message.content or "", choice.finish_reason
            calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls]
        assert content == "" and finish == "tool_calls"
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("reply", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>',   # broken JSON
    '<tool_call>\n{"name": "launch_missiles", "arguments": {}}\n</tool_call>',       # undeclared tool
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}',            # cut off, broken
    '{"answer": 42}',                                                                 # JSON, not a call
    'Use <tool_call> tags like <tool_call>this</tool_call>.',
])
def test_a_failed_parse_returns_the_text(clients, reply):
    fake, oai, _ = clients
    fake.reply = chunks(reply)
    choice = oai.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=100).choices[0]
    assert choice.message.content == reply and not choice.message.tool_calls and choice.finish_reason == "stop"
    content, calls, finish = merge_stream_tool_calls(
        oai.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=100, stream=True))
    assert content == reply and calls == [] and finish == "stop"


def test_parallel_tool_calls_false_stops_after_the_first_call(clients):
    fake, oai, _ = clients
    # The daemon stops at the stop string "</tool_call>" and leaves it out of the text.
    fake.reply = chunks('<tool_call>\n{"name": "get_time", "arguments": {}}\n')
    reply = oai.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=100,
                                        parallel_tool_calls=False, stop=["END"])
    assert fake.requests("generate")[-1]["stop"] == ["END", "</tool_call>"]
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["get_time"]
    assert reply.choices[0].finish_reason == "tool_calls"
    oai.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=100, parallel_tool_calls=True)
    assert "stop" not in fake.requests("generate")[-1]


def test_tool_choice_none_hides_tools_and_parses_nothing(clients, tool_model):
    fake, oai, _ = clients
    fake.reply = chunks(CALL)
    reply = oai.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=100)
    assert reply.choices[0].message.content == CALL and reply.choices[0].finish_reason == "stop"
    assert "<tools>" not in sent_prompt(fake, tool_model)
    # without tools, tool-call text is plain text too
    reply = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=100)
    assert reply.choices[0].message.content == CALL and not reply.choices[0].message.tool_calls


def test_tool_results_render_in_the_prompt(clients, tool_model):
    fake, oai, _ = clients
    fake.reply = ["It is sunny."]
    messages = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    reply = oai.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="auto", max_tokens=50)
    assert reply.choices[0].message.content == "It is sunny." and reply.choices[0].finish_reason == "stop"
    prompt = sent_prompt(fake, tool_model)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt


def test_anthropic_tool_use_non_stream(clients):
    fake, _, claude = clients
    fake.reply = chunks("Checking.\n" + TWO_CALLS)
    reply = claude.messages.create(model="m", max_tokens=200, messages=MESSAGES, tools=ANTHROPIC_TOOLS)
    assert reply.stop_reason == "tool_use"
    assert [b.type for b in reply.content] == ["text", "tool_use", "tool_use"]
    assert reply.content[0].text == "Checking.\n"
    assert (reply.content[1].name, reply.content[1].input) == ("get_weather", {"city": "Paris"})
    assert (reply.content[2].name, reply.content[2].input) == ("get_time", {})
    assert reply.content[1].id.startswith("toolu_") and reply.content[1].id != reply.content[2].id


def test_anthropic_tool_use_stream(clients):
    fake, _, claude = clients
    fake.reply = chunks("Checking.\n" + CALL + "\nDone.", size=2)
    with claude.messages.stream(model="m", max_tokens=200, messages=MESSAGES, tools=ANTHROPIC_TOOLS) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use", "text"]
    assert final.content[1].input == {"city": "Paris"} and final.content[2].text == "\nDone."


def test_anthropic_failed_parse_returns_the_text(clients):
    fake, _, claude = clients
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    fake.reply = chunks(broken)
    reply = claude.messages.create(model="m", max_tokens=100, messages=MESSAGES, tools=ANTHROPIC_TOOLS)
    assert reply.stop_reason == "end_turn" and [b.text for b in reply.content] == [broken]


def test_anthropic_tool_result_round_trip(clients, tool_model):
    fake, _, claude = clients
    fake.reply = ["Sunny."]
    messages = MESSAGES + [
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "sunny"}]},
                                     {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such city",
                                      "is_error": True},
                                     {"type": "text", "text": "Thanks"}]},
    ]
    reply = claude.messages.create(model="m", max_tokens=50, messages=messages, tools=ANTHROPIC_TOOLS)
    assert reply.content[0].text == "Sunny." and reply.stop_reason == "end_turn"
    prompt = sent_prompt(fake, tool_model)
    assert 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    assert "<tool_response>\nError: no such city\n</tool_response>" in prompt
    assert prompt.rstrip().endswith("<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant")


def test_anthropic_tool_choice_none_and_disable_parallel(clients, tool_model):
    fake, _, claude = clients
    fake.reply = chunks(CALL)
    reply = claude.messages.create(model="m", max_tokens=100, messages=MESSAGES, tools=ANTHROPIC_TOOLS,
                                   tool_choice={"type": "none"})
    assert reply.stop_reason == "end_turn" and reply.content[0].text == CALL
    assert "<tools>" not in sent_prompt(fake, tool_model)
    fake.reply = chunks('<tool_call>\n{"name": "get_time", "arguments": {}}\n')
    reply = claude.messages.create(model="m", max_tokens=100, messages=MESSAGES, tools=ANTHROPIC_TOOLS,
                                   tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert fake.requests("generate")[-1]["stop"] == ["</tool_call>"]
    assert reply.stop_reason == "tool_use" and reply.content[0].name == "get_time"


def test_anthropic_count_tokens_with_tools(clients):
    fake, _, claude = clients
    plain = claude.messages.count_tokens(model="m", messages=MESSAGES).input_tokens
    with_tools = claude.messages.count_tokens(model="m", messages=MESSAGES, tools=ANTHROPIC_TOOLS).input_tokens
    hidden = claude.messages.count_tokens(model="m", messages=MESSAGES, tools=ANTHROPIC_TOOLS,
                                          tool_choice={"type": "none"}).input_tokens
    assert with_tools > plain == hidden
    assert fake.requests("generate") == []  # counting runs no generation


def test_a_disconnect_sends_cancel_to_the_daemon(fake_gateway):
    fake, server = fake_gateway
    fake.endless = True
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=30, json={
            "model": "m", "messages": MESSAGES, "max_tokens": 1000, "stream": True}) as reply:
        lines = reply.iter_lines()
        assert next(lines).startswith("data: ")
        next(lines)
        next(lines)
    deadline = time.monotonic() + 60          # only detects a hang: the loop ends when the cancel arrives
    while not fake.cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.cancelled == [fake.requests("generate")[-1]["id"]]
