"""Bad requests get a 400 in the endpoint's API shape, with a message naming the parameter:
malformed JSON, wrong types, unknown parameters, and every parameter value flashd cannot honour.
Also: every request parameter in /openapi.json is covered by a test (this file's table or a
behaviour test), the API key, and unknown routes."""
from __future__ import annotations

import json

import httpx
import pytest

OPENAI_BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
ANTHROPIC_BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION_BASE = {"model": "m", "prompt": "hi", "max_tokens": 2}

# (endpoint, extra fields, text the message must contain)
REJECTED = [
    # parameters flashd cannot honour
    ("/v1/chat/completions", {"n": 2}, "n: "),
    ("/v1/chat/completions", {"logit_bias": {"15": 5}}, "logit_bias"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "structured output"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"tool_choice": {"type": "function", "function": {"name": "f"}}}, "cannot force a tool call"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "strict": True}}]}, "tools[0].function.strict"),
    ("/v1/chat/completions", {"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}] * 2}, "unique"),
    ("/v1/chat/completions", {"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
    ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "modalities"),
    ("/v1/chat/completions", {"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ("/v1/chat/completions", {"web_search_options": {}}, "web_search_options"),
    ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions", {"function_call": "auto"}, "function_call"),
    ("/v1/chat/completions", {"reasoning_effort": "low"}, "reasoning_effort"),
    ("/v1/chat/completions", {"verbosity": "low"}, "verbosity"),
    ("/v1/chat/completions", {"store": True}, "store"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs: needs logprobs=true"),
    ("/v1/chat/completions", {"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ("/v1/chat/completions", {"max_tokens": 3, "max_completion_tokens": 4}, "disagree"),
    ("/v1/chat/completions", {"stream_options": {"include_usage": True}}, "stream_options: only allowed with stream=true"),
    ("/v1/chat/completions", {"stop": ""}, "stop: String should have at least 1 character"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant"}]}, "content or tool_calls"),
    ("/v1/chat/completions", {"stop": ["a", ""]}, "stop"),
    ("/v1/chat/completions", {"stop": [str(i) for i in range(16)]}, "stop"),
    ("/v1/chat/completions", {"temperature": 2.5}, "temperature"),
    ("/v1/chat/completions", {"top_p": 1.5}, "top_p"),
    ("/v1/chat/completions", {"top_k": -2}, "top_k"),
    ("/v1/chat/completions", {"min_p": 1.0}, "min_p"),
    ("/v1/chat/completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/chat/completions", {"frequency_penalty": 3}, "frequency_penalty"),
    ("/v1/chat/completions", {"presence_penalty": -3}, "presence_penalty"),
    ("/v1/chat/completions", {"seed": 2**64}, "seed"),
    ("/v1/chat/completions", {"max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": 0}, "max_completion_tokens"),
    ("/v1/chat/completions", {"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ("/v1/chat/completions", {"ignore_eos": 1}, "ignore_eos"),
    ("/v1/chat/completions", {"user": 5}, "user"),
    ("/v1/chat/completions", {"metadata": {"k": 1}}, "metadata.k"),
    ("/v1/chat/completions", {"service_tier": 1}, "service_tier"),
    ("/v1/chat/completions", {"prompt_cache_key": 1}, "prompt_cache_key"),
    ("/v1/chat/completions", {"safety_identifier": 1}, "safety_identifier"),
    ("/v1/chat/completions", {"stream": "true"}, "stream"),
    ("/v1/chat/completions", {"stream": True, "stream_options": {"include_usage": True, "x": 1}}, "stream_options.x: unknown parameter"),
    ("/v1/chat/completions", {"model": 3}, "model"),
    # messages
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content[0].type"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "messages[0].content[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]: role must be one of"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content: required parameter is missing"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "tool_call_id": "a"}]}, "tool_call_id"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "tool_calls"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "refusal": "no"}]}, "refusal"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "function_call": {}}]}, "function_call"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "audio": {"id": "a"}}]}, "audio"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "mood": "happy"}]}, "messages[0].mood: unknown parameter"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}]}, "arguments"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    # /v1/completions
    ("/v1/completions", {"echo": True}, "echo"),
    ("/v1/completions", {"logit_bias": {"1": -100}}, "logit_bias"),
    ("/v1/completions", {"best_of": 2}, "best_of"),
    ("/v1/completions", {"suffix": "}"}, "suffix"),
    ("/v1/completions", {"n": 3}, "n: "),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": [1, -1]}, "prompt"),
    ("/v1/completions", {"prompt": [10**6]}, "outside the vocabulary"),
    ("/v1/completions", {"prompt": ""}, "empty"),
    ("/v1/completions", {"max_tokens": 1.5}, "max_tokens"),
    ("/v1/completions", {"messages": []}, "messages: unknown parameter"),
    # Anthropic
    ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ("/v1/messages", {"tool_choice": {"type": "any"}}, "cannot force a tool call"),
    ("/v1/messages", {"tool_choice": {"type": "tool", "name": "f"}}, "tool_choice"),
    ("/v1/messages", {"tools": [{"name": "web_search", "type": "web_search_20250305"}]}, "tools[0]"),
    ("/v1/messages", {"tools": [{"name": "f"}]}, "tools[0].input_schema: required parameter is missing"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]: type must be one of"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0].content[0]"),
    ("/v1/messages", {"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]}, "tool_use blocks belong to assistant"),
    ("/v1/messages", {"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]}, "tool_result blocks belong to user"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text: required parameter is missing"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "input": {}}]}]}, "messages[0].content[0].input: unknown parameter"),
    ("/v1/messages", {"max_tokens": None}, "max_tokens"),
    ("/v1/messages", {"max_tokens": 0}, "max_tokens"),
    ("/v1/messages", {"temperature": 1.5}, "temperature"),
    ("/v1/messages", {"top_p": -0.1}, "top_p"),
    ("/v1/messages", {"top_k": -1}, "top_k"),
    ("/v1/messages", {"stop_sequences": [""]}, "stop_sequences"),
    ("/v1/messages", {"stop_sequences": "x"}, "stop_sequences"),
    ("/v1/messages", {"stream": 1}, "stream"),
    ("/v1/messages", {"metadata": {"user_id": "u", "team": "t"}}, "metadata.team: unknown parameter"),
    ("/v1/messages", {"service_tier": "priority"}, "service_tier"),
    ("/v1/messages", {"system": [{"type": "image"}]}, "system"),
    ("/v1/messages", {"container": "c"}, "container: unknown parameter"),
    ("/v1/messages", {"mcp_servers": []}, "mcp_servers: unknown parameter"),
    ("/v1/messages/count_tokens", {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "max_tokens: unknown parameter"),
]


def _post(url: str, path: str, body, **kwargs) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30, **kwargs)


def _body(path: str, extra: dict) -> dict:
    base = {"/v1/chat/completions": OPENAI_BASE, "/v1/completions": COMPLETION_BASE,
            "/v1/messages": ANTHROPIC_BASE,
            "/v1/messages/count_tokens": {"model": "m", "messages": ANTHROPIC_BASE["messages"]}}[path]
    body = {**base, **extra}
    return {k: v for k, v in body.items() if not (k == "max_tokens" and v is None)}


def _error_message(path: str, reply: httpx.Response) -> str:
    body = reply.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        return body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error", body
    return body["error"]["message"]


@pytest.mark.parametrize("path, extra, needle", REJECTED, ids=[f"{p}-{'-'.join(e)}" for p, e, _ in REJECTED])
def test_unsupported_or_invalid_values_are_400s(gateway, path, extra, needle):
    reply = _post(gateway.url, path, _body(path, extra))
    assert reply.status_code == 400, reply.text
    message = _error_message(path, reply)
    assert needle in message, message


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens"])
def test_malformed_json_and_non_objects(gateway, path):
    for raw in (b'{"model": "m", "messages": [', b"not json", b"", b"[1, 2]", b'"text"', b"{\"a\": NaN}"):
        reply = httpx.post(gateway.url + path, content=raw, headers={"content-type": "application/json"}, timeout=30)
        assert reply.status_code == 400, (raw, reply.text)
        message = _error_message(path, reply)
        assert "JSON" in message or "unknown parameter" in message or "required" in message, (raw, message)
    # a body sent without a JSON content type (curl -d) is still read as JSON
    reply = httpx.post(gateway.url + path, content=b'{"model": 1}', timeout=30)
    assert reply.status_code == 400 and "model" in _error_message(path, reply)


def test_lone_surrogates_are_400s(gateway):
    cases = [("/v1/chat/completions", {**OPENAI_BASE, "messages": [{"role": "user", "content": "a\ud800"}]}),
             ("/v1/chat/completions", {**OPENAI_BASE, "stop": ["\udfff"]}),
             ("/v1/completions", {**COMPLETION_BASE, "prompt": "\ud800"}),
             ("/v1/messages", {**ANTHROPIC_BASE, "stop_sequences": ["\ud800"]}),
             ("/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "\udc00"}]})]
    for path, body in cases:
        raw = json.dumps(body).encode()  # ensure_ascii: the surrogate travels as a \u escape
        reply = httpx.post(gateway.url + path, content=raw, headers={"content-type": "application/json"}, timeout=30)
        assert reply.status_code == 400 and "nicode" in _error_message(path, reply), reply.text


def test_wrong_types_name_the_parameter(gateway):
    cases = [({"temperature": "hot"}, "temperature: Input should be a valid number"),
             ({"max_tokens": 1.5}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
             ({"seed": "1"}, "seed"), ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
             ({"logprobs": 1}, "logprobs")]
    for extra, needle in cases:
        reply = _post(gateway.url, "/v1/chat/completions", {**OPENAI_BASE, **extra})
        assert reply.status_code == 400 and needle in reply.json()["error"]["message"], reply.text
        assert reply.json()["error"]["param"] is not None


def test_unknown_parameters_are_named(gateway):
    reply = _post(gateway.url, "/v1/chat/completions", {**OPENAI_BASE, "frobnicate": True})
    assert reply.status_code == 400
    assert reply.json()["error"] == {"message": "frobnicate: unknown parameter (flashd does not accept it; see the "
                                                "README's list)", "type": "invalid_request_error",
                                     "param": "frobnicate", "code": None}


def test_unknown_routes_in_each_api_shape(gateway):
    reply = httpx.get(gateway.url + "/v1/nothing", timeout=30)
    assert reply.status_code == 404 and "no route" in reply.json()["error"]["message"]
    reply = httpx.get(gateway.url + "/v1/messages", timeout=30)
    assert reply.status_code == 405 and reply.json()["type"] == "error"


def test_api_key(daemon, make_gateway):
    import anthropic
    import openai

    with daemon.connect(timeout_s=30) as client:
        server = make_gateway(client, api_key="s3cret")
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200  # health needs no key
        for path, body in (("/v1/chat/completions", OPENAI_BASE), ("/v1/messages", ANTHROPIC_BASE)):
            for headers in ({}, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
                reply = _post(server.url, path, body, headers=headers)
                assert reply.status_code == 401, reply.text
                assert "API key" in (reply.json().get("error") or {}).get("message", "")
        assert httpx.get(server.url + "/v1/models", timeout=30).status_code == 401
        good = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
        assert good.chat.completions.create(model="m", messages=OPENAI_BASE["messages"], max_tokens=1).usage
        bad = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        claude = anthropic.Anthropic(base_url=server.url, api_key="s3cret", max_retries=0)
        assert claude.messages.create(model="m", max_tokens=1, messages=ANTHROPIC_BASE["messages"]).usage
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=server.url, api_key="nope", max_retries=0).messages.create(
                model="m", max_tokens=1, messages=ANTHROPIC_BASE["messages"])


# Every request parameter the schema publishes, and the test(s) showing it is honoured (or
# rejected where it cannot be). test_every_schema_parameter_has_a_test checks this table
# against /openapi.json, so a parameter added to the schema without a test fails CI.
HONOURED_BY = {
    "ChatCompletionRequest": {
        "model": "test_openai_api::test_chat_greedy_equals_the_daemon (any name is served)",
        "messages": "test_openai_api::test_message_shapes, test_tool_calls::test_tool_results_render_in_the_prompt",
        "max_tokens": "test_openai_api::test_chat_greedy_equals_the_daemon",
        "max_completion_tokens": "test_openai_api::test_max_completion_tokens",
        "temperature": "test_openai_api::test_sampling_parameters_reach_the_daemon",
        "top_p": "test_openai_api::test_sampling_parameters_reach_the_daemon",
        "top_k": "test_openai_api::test_sampling_parameters_reach_the_daemon",
        "min_p": "test_openai_api::test_sampling_parameters_reach_the_daemon",
        "repetition_penalty": "test_openai_api::test_sampling_parameters_reach_the_daemon",
        "frequency_penalty": "test_openai_api::test_sampling_parameters_reach_the_daemon",
        "presence_penalty": "test_openai_api::test_sampling_parameters_reach_the_daemon",
        "seed": "test_openai_api::test_sampling_parameters_reach_the_daemon",
        "stop": "test_openai_api::test_stop_strings",
        "stream": "test_openai_api::test_chat_stream_matches_non_stream_and_reports_usage",
        "stream_options": "test_openai_api::test_chat_stream_matches_non_stream_and_reports_usage",
        "ignore_eos": "test_openai_api::test_ignore_eos_extension",
        "spec": "test_openai_api::test_speculative_decoding_extensions",
        "spec_budget": "test_openai_api::test_speculative_decoding_extensions",
        "spec_draft": "test_openai_api::test_speculative_decoding_extensions",
        "n": "REJECTED (n=2)", "logit_bias": "REJECTED", "store": "REJECTED",
        "user": "test_openai_api::test_ignored_parameters_are_accepted (ignored)",
        "metadata": "test_openai_api::test_ignored_parameters_are_accepted (ignored)",
        "service_tier": "test_openai_api::test_ignored_parameters_are_accepted (ignored)",
        "prompt_cache_key": "test_openai_api::test_ignored_parameters_are_accepted (ignored)",
        "safety_identifier": "test_openai_api::test_ignored_parameters_are_accepted (ignored)",
        "logprobs": "test_openai_api::test_chat_logprobs_match_the_daemons_scores",
        "top_logprobs": "test_openai_api::test_chat_logprobs_match_the_daemons_scores",
        "tools": "test_tool_calls::test_openai_tool_call_non_stream",
        "tool_choice": "test_tool_calls::test_tool_choice_none_hides_tools_and_parses_nothing, REJECTED (required)",
        "parallel_tool_calls": "test_tool_calls::test_parallel_tool_calls_false_stops_after_the_first_call",
        "response_format": "REJECTED (json_object, json_schema)", "modalities": "REJECTED (audio)",
        "audio": "REJECTED", "prediction": "REJECTED", "web_search_options": "REJECTED", "functions": "REJECTED",
        "function_call": "REJECTED", "reasoning_effort": "REJECTED", "verbosity": "REJECTED",
    },
    "CompletionRequest": {
        "model": "test_openai_api::test_completions", "prompt": "test_openai_api::test_completions",
        "max_tokens": "test_openai_api::test_completions", "temperature": "shared with chat (_Sampling)",
        "top_p": "shared with chat", "top_k": "shared with chat", "min_p": "shared with chat",
        "repetition_penalty": "shared with chat", "frequency_penalty": "shared with chat",
        "presence_penalty": "shared with chat", "seed": "shared with chat", "stop": "shared with chat",
        "stream": "test_openai_api::test_completions_stream_and_logprobs",
        "stream_options": "test_openai_api::test_completions_stream_and_logprobs",
        "logprobs": "test_openai_api::test_completions_stream_and_logprobs", "ignore_eos": "shared with chat",
        "spec": "shared with chat", "spec_draft": "shared with chat",
        "spec_budget": "test_openai_api::test_speculative_decoding_extensions",
        "n": "REJECTED", "logit_bias": "REJECTED", "store": "shared with chat", "user": "shared with chat",
        "metadata": "shared with chat", "service_tier": "shared with chat", "echo": "REJECTED",
        "best_of": "REJECTED", "suffix": "REJECTED",
    },
    "MessagesRequest": {
        "model": "test_anthropic_api::test_messages_greedy_equals_the_daemon",
        "messages": "test_anthropic_api::test_block_shapes, test_tool_calls::test_anthropic_tool_result_round_trip",
        "max_tokens": "test_anthropic_api::test_messages_greedy_equals_the_daemon",
        "system": "test_anthropic_api::test_messages_greedy_equals_the_daemon",
        "stop_sequences": "test_anthropic_api::test_stop_sequences",
        "stream": "test_anthropic_api::test_messages_stream",
        "temperature": "test_anthropic_api::test_sampling_parameters_reach_the_daemon",
        "top_p": "test_anthropic_api::test_sampling_parameters_reach_the_daemon",
        "top_k": "test_anthropic_api::test_sampling_parameters_reach_the_daemon",
        "tools": "test_tool_calls::test_anthropic_tool_use_non_stream",
        "tool_choice": "test_tool_calls::test_anthropic_tool_choice_none_and_disable_parallel, REJECTED (any, tool)",
        "metadata": "test_anthropic_api::test_ignored_fields_are_accepted (ignored)",
        "service_tier": "test_anthropic_api::test_ignored_fields_are_accepted (ignored)",
        "cache_control": "test_anthropic_api::test_ignored_fields_are_accepted (ignored)",
        "thinking": "test_anthropic_api::test_ignored_fields_are_accepted (disabled), REJECTED (enabled)",
        "spec": "test_anthropic_api::test_speculative_decoding_extensions",
        "spec_budget": "test_anthropic_api::test_speculative_decoding_extensions",
        "spec_draft": "test_anthropic_api::test_speculative_decoding_extensions",
    },
    "CountTokensRequest": {
        "model": "test_anthropic_api::test_count_tokens", "messages": "test_anthropic_api::test_count_tokens",
        "system": "test_anthropic_api::test_count_tokens", "tools": "test_tool_calls::test_anthropic_count_tokens_with_tools",
        "tool_choice": "test_tool_calls::test_anthropic_count_tokens_with_tools",
        "thinking": "test_anthropic_api::test_count_tokens",
    },
}


def test_every_schema_parameter_has_a_test(gateway):
    schema = httpx.get(gateway.url + "/openapi.json", timeout=30).json()
    components = schema["components"]["schemas"]
    paths = {"ChatCompletionRequest": "/v1/chat/completions", "CompletionRequest": "/v1/completions",
             "MessagesRequest": "/v1/messages", "CountTokensRequest": "/v1/messages/count_tokens"}
    for model, tested in HONOURED_BY.items():
        published = set(components[model]["properties"])
        assert published == set(tested), (model, published ^ set(tested))
        for name, where in tested.items():
            if "REJECTED" in where:  # a case of REJECTED sends this parameter to this endpoint
                assert any(p == paths[model] and name in extra for p, extra, _ in REJECTED), (model, name)
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens"):
        responses = schema["paths"][path]["post"]["responses"]
        assert "422" not in responses and "400" in responses, (path, responses)
