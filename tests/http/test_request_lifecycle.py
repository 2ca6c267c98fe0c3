"""Requests over their lifetime against a real daemon: a client that disconnects mid-stream (or
mid-request) cancels the daemon request; concurrent requests queue in the daemon and all complete
with the same outputs as alone; the gateway keeps answering while generations run.

No test here reads a clock: what is checked is the order of events (the daemon's own account that a
request ended `cancelled`, answers that arrive while a generation is still running), with
generations as long as the context allows, so that only the test ends them; deadlines only turn a
hang into a failure."""
from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from flashd.clients.client import Client
from flashd.protocol import wire
from tests.http.conftest import TINY_MAX_CTX
from tests.http.gateway_harness import wait_idle

HANG_GUARD_S = 60.0   # waits end when their condition holds; this only turns a hang into a failure
MESSAGES = [{"role": "user", "content": "Count."}]
# As long as the context allows (the prompts are a few tokens): ~4000 tokens, seconds of decoding
# even at the tiny model's best speed, so a request ends before its end only if it is cancelled.
ENDLESS = TINY_MAX_CTX - 64
LONG = {"model": "m", "messages": MESSAGES, "max_tokens": ENDLESS, "ignore_eos": True, "temperature": 0}


def _served(client) -> int:
    return client.status()["served"]


def _wait_running(client) -> None:
    """Until the daemon runs a request (the one the test just sent: it was idle before)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while client.status()["running"] is None:
        assert time.monotonic() < deadline, "the request never started on the daemon"
        time.sleep(0.01)


@pytest.fixture
def daemon_endings(monkeypatch) -> Iterator[list[dict]]:
    """The terminal events (done, error) of generate requests that every Client in this process
    receives from now on -- the gateway's included, also for a request it has abandoned (whose
    last event it otherwise drops unseen): the daemon's own account of how a request ended."""
    seen: list[dict] = []
    dispatch = Client._dispatch

    def recording(self, frame: bytes) -> None:
        try:
            event = wire.decode_event(frame)
        except ValueError:
            event = None
        if isinstance(event, dict) and event.get("event") in ("done", "error"):
            seen.append(event)
        dispatch(self, frame)

    monkeypatch.setattr(Client, "_dispatch", recording)
    yield seen


def _ended_cancelled(gateway, endings: list[dict]) -> None:
    """The one request the test sent ended with the daemon's `cancelled` error, not `done`."""
    # /health asks the daemon for status through the gateway's client, which reads on the way
    # whatever the daemon sent it before (the abandoned request's last event among it).
    assert httpx.get(gateway.url + "/health", timeout=HANG_GUARD_S).status_code == 200
    assert [(e["event"], e.get("code")) for e in endings] == [("error", "cancelled")], endings


def _send_raw_request(gateway, path: str, body: dict) -> socket.socket:
    """A POST sent on a plain socket whose reply is never read: closing the socket is the
    client going away, at a moment the test chooses."""
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=HANG_GUARD_S)
    data = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {**LONG, "stream": True}),
    ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": ENDLESS, "ignore_eos": True, "stream": True}),
    ("/v1/messages", {"model": "m", "messages": MESSAGES, "max_tokens": ENDLESS, "stream": True, "temperature": 0}),
])
def test_disconnect_mid_stream_cancels_the_daemon_request(gateway, daemon_client, daemon_endings, path, body):
    wait_idle(daemon_client, HANG_GUARD_S)
    served = _served(daemon_client)
    with httpx.stream("POST", gateway.url + path, json=body, timeout=HANG_GUARD_S) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines()
        for _ in range(6):
            next(lines)
        assert daemon_client.status()["running"] is not None
    wait_idle(daemon_client, HANG_GUARD_S)
    assert _served(daemon_client) == served + 1
    _ended_cancelled(gateway, daemon_endings)      # stopped by the disconnect, thousands of tokens early


def test_disconnect_during_a_non_streamed_request_cancels_it(gateway, daemon_client, daemon_endings):
    wait_idle(daemon_client, HANG_GUARD_S)
    served = _served(daemon_client)
    with _send_raw_request(gateway, "/v1/chat/completions", LONG):
        _wait_running(daemon_client)
    # the socket is closed: the client went away before any reply
    wait_idle(daemon_client, HANG_GUARD_S)
    assert _served(daemon_client) == served + 1
    _ended_cancelled(gateway, daemon_endings)


def test_concurrent_requests_all_complete(gateway, daemon_client):
    wait_idle(daemon_client, HANG_GUARD_S)
    oai = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=60)
    prompts = [f"Tell me about {word}." for word in ("cats", "dogs", "owls", "bees", "eels", "ants")]

    def ask(prompt: str, stream: bool) -> str:
        messages = [{"role": "user", "content": prompt}]
        if stream:
            chunks = oai.chat.completions.create(model="m", messages=messages, max_tokens=40, temperature=0, stream=True)
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return oai.chat.completions.create(model="m", messages=messages, max_tokens=40, temperature=0).choices[0].message.content

    alone = [ask(p, False) for p in prompts]
    with ThreadPoolExecutor(len(prompts) * 2) as pool:
        together = list(pool.map(lambda a: ask(*a), [(p, s) for s in (False, True) for p in prompts]))
    assert together == alone + alone


def test_the_event_loop_is_free_while_generating(gateway, daemon_client):
    """/v1/models answers while a generation runs: all five answers come back while the daemon is
    still generating, which a gateway whose event loop waited on the daemon could not do (they
    would come after the generation). The generation ends only when the test drops it."""
    wait_idle(daemon_client, HANG_GUARD_S)
    served = _served(daemon_client)
    with _send_raw_request(gateway, "/v1/chat/completions", LONG) as sock:
        _wait_running(daemon_client)
        for _ in range(5):
            assert httpx.get(gateway.url + "/v1/models", timeout=HANG_GUARD_S).status_code == 200
        status = daemon_client.status()
        assert status["running"] is not None and status["served"] == served, \
            f"the generation ended before the answers: {status}"
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):       # and its reply has not come
            sock.recv(1)
    wait_idle(daemon_client, HANG_GUARD_S)         # dropped: the gateway cancels it


def test_health(gateway):
    reply = httpx.get(gateway.url + "/health", timeout=HANG_GUARD_S).json()
    assert reply["status"] == "ok" and reply["daemon"]["backend"] == "reference"
