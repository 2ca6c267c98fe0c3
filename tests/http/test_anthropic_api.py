"""The Anthropic-compatible endpoints against a real daemon (tiny synthetic model), driven by the
official `anthropic` client. Oracle: the daemon asked directly with the same prompt ids."""
from __future__ import annotations

import anthropic
import pytest

from flashd.clients.chat_template import ChatTemplate
from flashd.clients.tokenizer import Tokenizer

SYSTEM = "You are terse."
MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def claude(gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def prompt_ids(tiny_model):
    tokenizer = Tokenizer.from_gguf(tiny_model)
    template = ChatTemplate.from_gguf(tiny_model)
    return tokenizer.encode(template.render([{"role": "system", "content": SYSTEM}, *MESSAGES]))


def test_messages_greedy_equals_the_daemon(claude, daemon_client, prompt_ids):
    reply = claude.messages.create(model="claude-whatever", system=SYSTEM, messages=MESSAGES, max_tokens=12,
                                   extra_body={"temperature": 0})
    expected = daemon_client.complete(ids=prompt_ids, max_tokens=12, temperature=0).text
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert [block.type for block in reply.content] == ["text"] and reply.content[0].text == expected
    assert reply.stop_reason == "max_tokens" and reply.stop_sequence is None
    assert reply.usage.input_tokens == len(prompt_ids) and reply.usage.output_tokens == 12


def test_messages_stream(claude):
    whole = claude.messages.create(model="m", system=SYSTEM, messages=MESSAGES, max_tokens=10, extra_body={"temperature": 0})
    with claude.messages.stream(model="m", system=SYSTEM, messages=MESSAGES, max_tokens=10, extra_body={"temperature": 0}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 10
    assert final.usage.input_tokens == whole.usage.input_tokens


def test_stream_event_sequence(claude, gateway):
    events = list(claude.messages.create(model="m", messages=MESSAGES, max_tokens=4, extra_body={"temperature": 0},
                                         stream=True))
    kinds = [event.type for event in events]  # the SDK drops pings
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop"
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[-2].delta.stop_reason == "max_tokens" and events[-2].usage.output_tokens == 4
    import httpx

    with httpx.stream("POST", f"{gateway.url}/v1/messages", timeout=30, json={
            "model": "m", "messages": MESSAGES, "max_tokens": 2, "stream": True}) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        names = [line[len("event: "):] for line in reply.iter_lines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-1] == "message_stop"


def test_stop_sequences(claude, daemon_client, prompt_ids):
    full = daemon_client.complete(ids=prompt_ids, max_tokens=30, temperature=0).text
    stop = full[8:11]
    assert stop.strip(), "the model produced too little text for this test"
    reply = claude.messages.create(model="m", system=SYSTEM, messages=MESSAGES, max_tokens=30,
                                   extra_body={"temperature": 0}, stop_sequences=["never-appears", stop])
    assert reply.content[0].text == full[:full.index(stop)]
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == stop
    with claude.messages.stream(model="m", system=SYSTEM, messages=MESSAGES, max_tokens=30,
                                extra_body={"temperature": 0}, stop_sequences=[stop]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


def test_sampling_parameters_reach_the_daemon(claude, daemon_client, prompt_ids):
    baseline = daemon_client.complete(ids=prompt_ids, max_tokens=20, temperature=0).text
    # Unseeded sampling cannot be compared token for token; top_k=1 and top_p=0 must be greedy.
    for params in (dict(temperature=1.0, top_k=1), dict(temperature=0.8, top_p=0.0)):
        reply = claude.messages.create(model="m", system=SYSTEM, messages=MESSAGES, max_tokens=20, extra_body=params)
        assert reply.content[0].text == baseline, params
    sampled = {claude.messages.create(model="m", system=SYSTEM, messages=MESSAGES, max_tokens=20,
                                      extra_body={"temperature": 1.0, "top_p": 0.95, "top_k": 50}).content[0].text for _ in range(3)}
    assert len(sampled) == 3  # sampling is on (random seeds): three different replies


def test_count_tokens(claude, prompt_ids):
    counted = claude.messages.count_tokens(model="m", system=SYSTEM, messages=MESSAGES,
                                           thinking={"type": "disabled"})
    assert counted.input_tokens == len(prompt_ids)


def test_block_shapes(claude):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}},
                                     {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
        {"role": "user", "content": "Again."},
    ]
    reply = claude.messages.create(model="m", max_tokens=3, messages=messages,
                                   system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
                                   extra_body={"temperature": 0})  # greedy: a sampled EOS would end it early
    assert reply.usage.output_tokens == 3


def test_ignored_fields_are_accepted(claude):
    reply = claude.messages.create(model="m", max_tokens=2, messages=MESSAGES, metadata={"user_id": "u1"},
                                   service_tier="auto", thinking={"type": "disabled"},
                                   cache_control={"type": "ephemeral"}, extra_body={"temperature": 0})
    assert reply.usage.output_tokens == 2


def test_errors_in_anthropic_shape(claude):
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="m", max_tokens=10**6, messages=MESSAGES)
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "context size" in info.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="tools: the chat template"):
        claude.messages.create(model="m", max_tokens=2, messages=MESSAGES,
                               tools=[{"name": "f", "input_schema": {"type": "object"}}])


def test_speculative_decoding_extensions(claude, daemon_client, prompt_ids):
    """The spec extensions on /v1/messages: n-gram speculation at temperature 0 gives the daemon's
    plain greedy text; an unknown drafter is the daemon's error."""
    want = daemon_client.complete(ids=prompt_ids, max_tokens=16, temperature=0).text
    reply = claude.messages.create(model="m", system=SYSTEM, messages=MESSAGES, max_tokens=16,
                                   extra_body={"temperature": 0, "spec": "ddtree", "spec_budget": 4,
                                               "spec_draft": "ngram"})
    assert reply.content[0].text == want
    with pytest.raises(anthropic.BadRequestError, match="no such drafter"):
        claude.messages.create(model="m", system=SYSTEM, messages=MESSAGES, max_tokens=4,
                               extra_body={"spec": "chain", "spec_draft": "nope"})


def test_a_repeated_prefix_is_reported_as_cache_reads(claude, tiny_model):
    """Prefix reuse in Anthropic's terms: cache_read_input_tokens are the prompt tokens whose K/V
    the daemon kept (whole 512-token chunks), input_tokens the rest; together the prompt."""
    system = " ".join(f"clause{i}" for i in range(400))
    turns = [[{"role": "user", "content": q}] for q in ("one?", "two?")]
    usage = [claude.messages.create(model="m", system=system, messages=m, max_tokens=2,
                                    extra_body={"temperature": 0}).usage for m in turns]
    tokenizer, template = Tokenizer.from_gguf(tiny_model), ChatTemplate.from_gguf(tiny_model)
    ids = tokenizer.encode(template.render([{"role": "system", "content": system}, *turns[1]]))
    assert usage[1].cache_read_input_tokens >= 1024 and usage[1].cache_read_input_tokens % 512 == 0
    assert usage[1].input_tokens + usage[1].cache_read_input_tokens == len(ids)
    assert usage[1].cache_creation_input_tokens == 0
