"""Requests over their lifetime against a real daemon: a client that disconnects mid-stream (or
mid-request) cancels the daemon request; concurrent requests queue in the daemon and all complete
with the same outputs as alone; the gateway keeps answering while generations run."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.http.gateway_harness import wait_idle

MESSAGES = [{"role": "user", "content": "Count."}]
# ~3500 tokens at ~1000 tokens/s: a request that ends on its own only after seconds.
LONG = {"model": "m", "messages": MESSAGES, "max_tokens": 3500, "ignore_eos": True, "temperature": 0}


def _served(client) -> int:
    return client.status()["served"]


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {**LONG, "stream": True}),
    ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 3500, "ignore_eos": True, "stream": True}),
    ("/v1/messages", {"model": "m", "messages": MESSAGES, "max_tokens": 3500, "stream": True, "temperature": 0}),
])
def test_disconnect_mid_stream_cancels_the_daemon_request(gateway, daemon_client, path, body):
    wait_idle(daemon_client, 10)
    served = _served(daemon_client)
    t_start = time.monotonic()
    with httpx.stream("POST", gateway.url + path, json=body, timeout=30) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines()
        for _ in range(6):
            next(lines)
        assert daemon_client.status()["running"] is not None
    idle_after_s = wait_idle(daemon_client, 5)
    # The full request would have run ~3.5 s more; it stopped within a poll or two.
    assert time.monotonic() - t_start < 3.0, f"idle {idle_after_s:.2f} s after the disconnect"
    assert _served(daemon_client) == served + 1


def test_disconnect_during_a_non_streamed_request_cancels_it(gateway, daemon_client):
    wait_idle(daemon_client, 10)
    t_start = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gateway.url + "/v1/chat/completions", json=LONG, timeout=0.5)
    wait_idle(daemon_client, 3)
    assert time.monotonic() - t_start < 3.0


def test_concurrent_requests_all_complete(gateway, daemon_client):
    wait_idle(daemon_client, 10)
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
    wait_idle(daemon_client, 10)
    done = threading.Event()

    def long_request() -> None:
        httpx.post(gateway.url + "/v1/chat/completions", json={**LONG, "max_tokens": 1500}, timeout=60)
        done.set()

    worker = threading.Thread(target=long_request)
    worker.start()
    try:
        while daemon_client.status()["running"] is None:
            time.sleep(0.01)
        latencies = []
        for _ in range(5):
            t_start = time.monotonic()
            assert httpx.get(gateway.url + "/v1/models", timeout=5).status_code == 200
            latencies.append(time.monotonic() - t_start)
        assert not done.is_set(), "the generation ended before the checks: make it longer"
        assert max(latencies) < 0.5, latencies
    finally:
        worker.join(60)


def test_health(gateway):
    reply = httpx.get(gateway.url + "/health", timeout=5).json()
    assert reply["status"] == "ok" and reply["daemon"]["backend"] == "reference"
