"""Property test of the generation path: random *valid* requests (any mix of the supported
parameters, streamed or not) against a real daemon must all succeed with well-formed answers.
(The schemathesis run in test_schema_fuzz.py mostly produces requests the server rightly
refuses; this one makes sure the accepted space works.)"""
from __future__ import annotations

import json

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)
stops = st.lists(st.text(st.sampled_from("abcdefghij .,\n"), min_size=1, max_size=3), min_size=1, max_size=4)
sampling = st.fixed_dictionaries({}, optional={
    "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "top_k": st.integers(-1, 50),
    "min_p": st.floats(0, 0.99), "repetition_penalty": st.floats(0.5, 2),
    "frequency_penalty": st.floats(-2, 2), "presence_penalty": st.floats(-2, 2),
    "seed": st.integers(-(2**63), 2**64 - 1), "stop": st.one_of(stops, st.sampled_from(["a", "\n"])),
    "ignore_eos": st.booleans(), "user": words,
})
openai_messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]),
                                                  "content": words}), min_size=1, max_size=4)


@st.composite
def chat_requests(draw) -> dict:
    body = {"model": draw(words), "messages": draw(openai_messages), "max_tokens": draw(st.integers(1, 8)),
            **draw(sampling)}
    if draw(st.booleans()):
        body["logprobs"] = True
        if draw(st.booleans()):
            body["top_logprobs"] = draw(st.integers(0, 20))
    if draw(st.booleans()):
        body["stream"] = True
        if draw(st.booleans()):
            body["stream_options"] = {"include_usage": draw(st.booleans())}
    return body


@st.composite
def message_requests(draw) -> dict:
    roles = draw(st.lists(st.sampled_from(["user", "assistant"]), min_size=1, max_size=4))
    body = {"model": draw(words), "max_tokens": draw(st.integers(1, 8)),
            "messages": [{"role": role, "content": draw(words)} for role in roles]}
    for key, strategy in (("temperature", st.floats(0, 1)), ("top_p", st.floats(0, 1)), ("top_k", st.integers(0, 50)),
                          ("stop_sequences", stops), ("system", words), ("stream", st.booleans())):
        if draw(st.booleans()):
            body[key] = draw(strategy)
    return body


def _sse_data(reply: httpx.Response) -> list:
    return [line[len("data: "):] for line in reply.iter_lines() if line.startswith("data: ")]


def _post_ok(gateway, path: str, body: dict) -> httpx.Response:
    """POST body to the gateway, the reply read whole (streamed or not) and checked 200."""
    with httpx.stream("POST", f"{gateway.url}{path}", json=body, timeout=30) as reply:
        reply.read()
    assert reply.status_code == 200, reply.text
    return reply


# Two tests of the same shape, one per dialect (OpenAI chat here, Anthropic messages below): kept apart so a
# failure names its API, and their checks are each API's own fields.
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=chat_requests())
def test_valid_chat_requests_succeed(gateway, body):
    reply = _post_ok(gateway, "/v1/chat/completions", body)
    if not body.get("stream"):
        answer = reply.json()
        choice = answer["choices"][0]
        assert isinstance(choice["message"]["content"], str) and choice["finish_reason"] in ("stop", "length")
        assert 1 <= answer["usage"]["completion_tokens"] <= body["max_tokens"]
        if body.get("logprobs"):
            assert len(choice["logprobs"]["content"]) <= answer["usage"]["completion_tokens"]
        return
    data = _sse_data(reply)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finishes) == 1 and finishes[0] in ("stop", "length")
    if body.get("stream_options", {}).get("include_usage"):
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] <= body["max_tokens"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=message_requests())
def test_valid_anthropic_requests_succeed(gateway, body):
    reply = _post_ok(gateway, "/v1/messages", body)
    if not body.get("stream"):
        answer = reply.json()
        assert answer["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence")
        assert all(block["type"] == "text" and block["text"] for block in answer["content"])
        assert 1 <= answer["usage"]["output_tokens"] <= body["max_tokens"]
        return
    events = [json.loads(d) for d in _sse_data(reply)]
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    assert events[-2]["type"] == "message_delta" and events[-2]["usage"]["output_tokens"] <= body["max_tokens"]
