"""Security defaults of `flashd http`: loopback unless an API key is set, a bound on request bodies
(413 in each API's error shape, before the body is held in memory), and bounded message/tool counts."""
from __future__ import annotations

import httpx
import pytest
from click.testing import CliRunner

from flashd.clients.http.config import DEFAULT_MAX_BODY_BYTES, GatewayConfig
from flashd.clients.http.openai_schemas import MAX_MESSAGES
from flashd.clients.http.server import http_command
from flashd.daemon.loopback import check_zmq_address, is_loopback_host

OPENAI_BODY = {"model": "m", "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC_BODY = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
LIMIT = 4096   # bytes: the test gateway's --max-body-bytes


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "localhost", "::1", "[::1]"])
def test_loopback_hosts_need_no_key(host):
    assert is_loopback_host(host)
    assert GatewayConfig(host=host).api_key is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.7", "example.com", "*"])
def test_other_hosts_need_an_api_key(host):
    assert not is_loopback_host(host)
    with pytest.raises(ValueError, match="not a loopback address.*--api-key"):
        GatewayConfig(host=host)
    assert GatewayConfig(host=host, api_key="k").host == host


def test_the_command_refuses_a_public_host_without_a_key_before_starting_anything():
    # --daemon names a port nothing listens on: the refusal must come before any connection
    result = CliRunner().invoke(http_command, ["--daemon", "tcp://127.0.0.1:9", "--host", "0.0.0.0"],
                                env={"FLASHD_API_KEY": None})
    assert result.exit_code == 2 and "not a loopback address" in result.output and "--api-key" in result.output


@pytest.mark.parametrize("address", ["tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://192.168.1.7:1", "tcp://[::]:1"])
def test_zmq_non_loopback_needs_the_opt_in(address):
    with pytest.raises(ValueError, match="no authentication.*--zmq-allow-remote"):
        check_zmq_address(address, allow_remote=False)
    assert check_zmq_address(address, allow_remote=True) == address
    for local in ("tcp://127.0.0.1:*", "tcp://localhost:5", "tcp://[::1]:5", "ipc:///tmp/x.sock"):
        assert check_zmq_address(local, allow_remote=False) == local


def test_body_limit_default_and_check():
    assert GatewayConfig().max_body_bytes == DEFAULT_MAX_BODY_BYTES == 16 * 1024 * 1024
    with pytest.raises(ValueError, match="max_body_bytes"):
        GatewayConfig(max_body_bytes=0)


@pytest.fixture(scope="module")
def small_gateway(daemon):
    from tests.http.gateway_harness import serve_gateway
    with daemon.connect(timeout_s=30) as client, serve_gateway(client, max_body_bytes=LIMIT) as server:
        yield server


def _padded(body: dict, n_bytes: int) -> dict:
    return {**body, "messages": [{"role": "user", "content": "x" * n_bytes}]}


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", OPENAI_BODY), ("/v1/messages", ANTHROPIC_BODY)])
def test_bodies_over_the_limit_are_413s_in_the_api_shape(small_gateway, path, body):
    under = httpx.post(small_gateway.url + path, json=_padded(body, LIMIT // 2), timeout=30)
    assert under.status_code == 200, under.text
    over = httpx.post(small_gateway.url + path, json=_padded(body, LIMIT), timeout=30)     # Content-Length
    assert over.status_code == 413, over.text
    chunks = [b'{"model": "m", "messages": [{"role": "user", "content": "', b"x" * LIMIT, b'"}]}']
    chunked = httpx.post(small_gateway.url + path, content=iter(chunks), timeout=30,
                         headers={"content-type": "application/json"})                     # no Content-Length
    assert chunked.status_code == 413, chunked.text
    for reply in (over, chunked):
        message = (reply.json()["error"]["message"])
        assert f"exceeds the limit of {LIMIT} bytes" in message and "--max-body-bytes" in message
        if path == "/v1/messages":
            assert reply.json()["type"] == "error" and reply.json()["error"]["type"] == "request_too_large"
        else:
            assert reply.json()["error"]["type"] == "invalid_request_error"
    assert httpx.post(small_gateway.url + path, json=body, timeout=30).status_code == 200   # serves on


def test_message_count_is_bounded(gateway):
    messages = [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)
    for path, body in (("/v1/chat/completions", OPENAI_BODY), ("/v1/messages", ANTHROPIC_BODY)):
        reply = httpx.post(gateway.url + path, json={**body, "messages": messages}, timeout=60)
        assert reply.status_code == 400, reply.text
        assert "messages" in reply.text and str(MAX_MESSAGES) in reply.text, reply.text
