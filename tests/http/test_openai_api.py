"""The OpenAI-compatible endpoints against a real daemon (tiny synthetic model, CPU reference
backend), driven by the official `openai` client.

Oracle: the daemon itself, asked directly over ZeroMQ with the token ids of the same prompt
(the model's chat template rendered and tokenized here) and the parameters the gateway should
send: a parameter is honoured when the gateway's output equals the daemon's for the mapped
parameters (and, where the parameter changes anything, differs from the output without it).
"""
from __future__ import annotations

import math

import openai
import pytest

from flashd.clients.chat_template import ChatTemplate
from flashd.clients.tokenizer import Tokenizer

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]
# Sampled requests that check a length limit: the random model may sample EOS before it.
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def oai(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer(tiny_model) -> Tokenizer:
    return Tokenizer.from_gguf(tiny_model)


@pytest.fixture(scope="module")
def chat_ids(tiny_model, tokenizer):
    template = ChatTemplate.from_gguf(tiny_model)

    def ids(messages) -> list[int]:
        return tokenizer.encode(template.render(messages, add_generation_prompt=True))

    return ids


def daemon_text(daemon_client, ids, **fields) -> str:
    return daemon_client.complete(ids=ids, **fields).text


def test_models_lists_the_served_model(oai, gateway):
    models = oai.models.list().data
    assert [m.id for m in models] == ["tiny"] or len(models) == 1
    model = models[0]
    assert oai.models.retrieve(model.id).id == model.id
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        oai.models.retrieve("no-such-model")


def test_chat_greedy_equals_the_daemon(oai, daemon_client, chat_ids):
    reply = oai.chat.completions.create(model="anything", messages=MESSAGES, max_tokens=12, temperature=0)
    expected = daemon_text(daemon_client, chat_ids(MESSAGES), max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == expected
    assert choice.finish_reason == "length"
    assert reply.usage.prompt_tokens == len(chat_ids(MESSAGES))
    assert reply.usage.completion_tokens == 12 and reply.usage.total_tokens == reply.usage.prompt_tokens + 12
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")


def test_chat_stream_matches_non_stream_and_reports_usage(oai):
    whole = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10, temperature=0)
    chunks = list(oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10, temperature=0,
                                               stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_chat_stream_without_usage_has_no_usage_chunk(oai):
    chunks = list(oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3, stream=True,
                                               extra_body=NO_EOS))
    assert all(c.choices for c in chunks) and chunks[-1].choices[0].finish_reason == "length"


def test_max_completion_tokens(oai):
    reply = oai.chat.completions.create(model="m", messages=MESSAGES, max_completion_tokens=5,
                                          extra_body=NO_EOS)
    assert reply.usage.completion_tokens == 5 and reply.choices[0].finish_reason == "length"


def test_max_tokens_defaults_to_the_rest_of_the_context(gateway, daemon_client, chat_ids):
    import httpx

    n_prompt = len(chat_ids(MESSAGES))
    # ignore_eos so the random model fills the context: the default leaves exactly that room.
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=120, json={
        "model": "m", "messages": MESSAGES, "ignore_eos": True, "temperature": 0})
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    assert usage["completion_tokens"] == daemon_client.status()["max_ctx"] - n_prompt


def test_context_overflow_is_a_400(oai):
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10**6)
    assert info.value.code == "context_length_exceeded" and "context size" in info.value.message


def test_stop_strings(oai, daemon_client, chat_ids):
    full = daemon_text(daemon_client, chat_ids(MESSAGES), max_tokens=30, temperature=0)
    stop = full[8:11]
    assert stop.strip(), "the model produced too little text for this test"
    expected = full[:full.index(stop)]
    for stop_param in (stop, [stop, "never-appears"]):
        reply = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=30, temperature=0, stop=stop_param)
        assert reply.choices[0].message.content == expected
        assert reply.choices[0].finish_reason == "stop"
    chunks = list(oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=30, temperature=0,
                                               stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_sampling_parameters_reach_the_daemon(oai, daemon_client, chat_ids):
    ids = chat_ids(MESSAGES)
    cases = [  # (request parameters, the daemon fields they mean)
        (dict(temperature=0.9, seed=5), dict(temperature=0.9, seed=5)),
        (dict(temperature=1.3, top_p=0.5, seed=6), dict(temperature=1.3, top_p=0.5, seed=6)),
        (dict(temperature=1.0, seed=-1), dict(temperature=1.0, seed=2**64 - 1)),
        (dict(temperature=0, frequency_penalty=1.5), dict(temperature=0, frequency_penalty=1.5)),
        (dict(temperature=0, presence_penalty=-1.0), dict(temperature=0, presence_penalty=-1.0)),
        (dict(temperature=1.0, seed=9, extra_body={"top_k": 3}), dict(temperature=1.0, seed=9, top_k=3)),
        (dict(temperature=1.0, seed=9, extra_body={"min_p": 0.2}), dict(temperature=1.0, seed=9, min_p=0.2)),
        (dict(temperature=0, extra_body={"repetition_penalty": 1.8}), dict(temperature=0, repeat_penalty=1.8)),
        (dict(temperature=1.0, top_p=0), dict(temperature=0)),  # top_p 0 keeps only the best token
    ]
    baseline = daemon_text(daemon_client, ids, max_tokens=24, temperature=0)
    for params, fields in cases:
        got = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=24, **params)
        expected = daemon_text(daemon_client, ids, max_tokens=24, **fields)
        assert got.choices[0].message.content == expected, params
        if fields != {"temperature": 0}:
            assert expected != baseline, f"{params} changed nothing: the test cannot tell"


def test_unseeded_sampling_differs_between_requests(oai):
    replies = {oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=20, temperature=1.0)
               .choices[0].message.content for _ in range(3)}
    assert len(replies) == 3


def test_default_temperature_is_one(oai, daemon_client, chat_ids):
    got = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=20, seed=77)
    expected = daemon_text(daemon_client, chat_ids(MESSAGES), max_tokens=20, temperature=1.0, seed=77)
    assert got.choices[0].message.content == expected


def test_chat_logprobs_match_the_daemons_scores(oai, daemon_client, chat_ids):
    reply = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8, temperature=0,
                                        logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == 8 and "".join(e.token for e in content) == reply.choices[0].message.content
    ids = chat_ids(MESSAGES)
    out_ids = daemon_client.complete(ids=ids, max_tokens=8, temperature=0).ids
    scored = daemon_client.score(ids + out_ids)["logprobs"][len(ids) - 1:]
    for entry, expected in zip(content, scored):
        # Incremental decode vs one teacher-forced forward: float32 rounding differs slightly.
        assert math.isclose(entry.logprob, expected, abs_tol=1e-3)
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        assert entry.top_logprobs[0].token == entry.token  # greedy: the chosen token is the best
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token
    plain = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True)
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)
    assert oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2).choices[0].logprobs is None


def test_chat_logprobs_stream(oai):
    chunks = list(oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=6, temperature=0,
                                               logprobs=True, top_logprobs=2, stream=True))
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(entries) == 6 and all(len(e.top_logprobs) == 2 for e in entries)


def test_completions(oai, daemon_client, tokenizer):
    reply = oai.completions.create(model="m", prompt="def fib(n):", max_tokens=10, temperature=0)
    expected = daemon_text(daemon_client, tokenizer.encode("def fib(n):"), max_tokens=10, temperature=0)
    assert reply.choices[0].text == expected and reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == len(tokenizer.encode("def fib(n):"))
    by_ids = oai.completions.create(model="m", prompt=tokenizer.encode("def fib(n):"), max_tokens=10, temperature=0)
    assert by_ids.choices[0].text == expected
    as_list = oai.completions.create(model="m", prompt=["def fib(n):"], max_tokens=10, temperature=0)
    assert as_list.choices[0].text == expected
    default = oai.completions.create(model="m", prompt="x", temperature=0)
    assert default.usage.completion_tokens == 16  # OpenAI's default max_tokens for completions


def test_completions_stream_and_logprobs(oai):
    whole = oai.completions.create(model="m", prompt="import os", max_tokens=8, temperature=0, logprobs=2)
    logprobs = whole.choices[0].logprobs
    def ascii_only(text: str) -> str:  # a character split across tokens shows as U+FFFD per token
        return "".join(c for c in text if c.isascii())

    assert len(logprobs.tokens) == 8
    assert ascii_only("".join(logprobs.tokens)) == ascii_only(whole.choices[0].text)
    assert all(len(top) <= 2 for top in logprobs.top_logprobs) and logprobs.text_offset[0] == 0
    chunks = list(oai.completions.create(model="m", prompt="import os", max_tokens=8, temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == 8
    zero = oai.completions.create(model="m", prompt="import os", max_tokens=3, temperature=0, logprobs=0)
    assert zero.choices[0].logprobs.top_logprobs is None and len(zero.choices[0].logprobs.token_logprobs) == 3


def test_ignore_eos_extension(oai, daemon_client, chat_ids):
    got = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=40, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert got.usage.completion_tokens == 40


def test_ignored_parameters_are_accepted(oai):
    reply = oai.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=2, user="me", metadata={"k": "v"}, service_tier="auto",
        store=False, n=1, logit_bias={}, response_format={"type": "text"}, modalities=["text"],
        extra_body={"prompt_cache_key": "abc", "safety_identifier": "x"})
    assert reply.usage.completion_tokens == 2
    stream = list(oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2, stream=True,
                                               stream_options={"include_usage": True, "include_obfuscation": False}))
    assert stream[-1].usage.completion_tokens == 2


def test_message_shapes(oai):
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again."},
    ]
    reply = oai.chat.completions.create(model="m", messages=messages, max_tokens=3, extra_body=NO_EOS)
    assert reply.usage.completion_tokens == 3


def test_tools_on_a_model_whose_template_cannot_show_them(oai):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError, match="tools: the chat template"):
        oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3, tools=tools)
    # tool_choice="none" does not show the tools, so it works on any model
    reply = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3, tools=tools, tool_choice="none",
                                        extra_body=NO_EOS)
    assert reply.choices[0].finish_reason == "length"


def test_speculative_decoding_extensions(oai, daemon, make_gateway):
    """spec / spec_budget / spec_draft reach the daemon's `generate spec= budget= draft=`: greedy
    speculative output equals plain greedy output (exact); a drafter the daemon does not have and
    a budget no verify forward holds come back as the daemon's errors. The gateway's --spec
    defaults apply to requests that do not choose, and spec="off" overrides them."""
    plain = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=24, temperature=0, extra_body=NO_EOS)
    text = plain.choices[0].message.content
    for extra in ({"spec": "chain"}, {"spec": "ddtree", "spec_budget": 5, "spec_draft": "ngram"}, {"spec": "off"}):
        reply = oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=24, temperature=0,
                                            extra_body={**NO_EOS, **extra})
        assert reply.choices[0].message.content == text, extra
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4, extra_body={"spec": "chain",
                                                                                              "spec_draft": "nope"})
    assert "no such drafter" in info.value.message and info.value.code == "drafter_not_loaded"
    with pytest.raises(openai.BadRequestError, match="budget=1000"):
        oai.completions.create(model="m", prompt="x", max_tokens=4, extra_body={"spec": "ddtree", "spec_budget": 1000})
    with pytest.raises(openai.BadRequestError, match="spec"):
        oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4, extra_body={"spec": "tree"})
    with daemon.connect(timeout_s=60) as client:
        server = make_gateway(client, spec="chain", spec_draft="nope")
        default_on = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="no such drafter"):
            default_on.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        reply = default_on.chat.completions.create(model="m", messages=MESSAGES, max_tokens=24, temperature=0,
                                                   extra_body={**NO_EOS, "spec": "off"})
        assert reply.choices[0].message.content == text


def test_a_repeated_prefix_is_reported_as_cached_tokens(oai, chat_ids):
    """The daemon keeps the K/V of the last prompt's common prefix in whole 512-token chunks
    (protocol/SPEC.md, prefix reuse): the next turn's usage counts them as cached_tokens."""
    system = " ".join(f"rule{i}" for i in range(400))      # a long system prompt, as agents send
    turns = [[{"role": "system", "content": system}, {"role": "user", "content": q}] for q in ("first?", "second?")]
    usage = [oai.chat.completions.create(model="m", messages=m, max_tokens=2, temperature=0).usage for m in turns]
    a, b = (chat_ids(m) for m in turns)
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert common >= 1024
    assert usage[1].prompt_tokens == len(b)
    assert usage[1].prompt_tokens_details.cached_tokens == common - common % 512
