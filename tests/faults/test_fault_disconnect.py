"""Clients that go away in the middle of a stream: a ZeroMQ peer that closes its socket, an HTTP
client that drops its connection to `flashd http` while reading server-sent events. The daemon
cancels the orphaned request and keeps serving everyone else with a fresh daemon's outputs.
"""
from __future__ import annotations

import json

import httpx
import pytest

from tests.daemon.daemon_harness import LONG_MAX_CTX, READ_TIMEOUT_S, ZmqPeer, generated
from tests.faults.fault_io import ZMQ_ANY_PORT
from tests.faults.gateway_process import GatewayProcess, completion

SHORT = {"cmd": "generate", "text": "The quick brown fox", "max_tokens": 24, "ignore_eos": True}
ENDLESS = LONG_MAX_CTX - 16     # long enough that only a cancel ends it before the test's deadlines


@pytest.fixture(scope="module")
def daemon(fault_model, tmp_path_factory):
    from tests.daemon.daemon_harness import ServeDaemon

    d = ServeDaemon(fault_model, tmp_path_factory.mktemp("disconnect"), "--zmq", ZMQ_ANY_PORT, max_ctx=LONG_MAX_CTX)
    yield d
    d.kill()


def test_zmq_peer_closes_its_socket_mid_stream(faults, daemon, zmq_ctx, fresh_probe):
    gone = ZmqPeer(zmq_ctx, daemon.ready["zmq"], daemon)
    other = ZmqPeer(zmq_ctx, daemon.ready["zmq"], daemon)
    try:
        with faults.case("client disconnects mid-stream") as case:
            case.sent(2)
            gone.send({"cmd": "generate", "id": "orphan", "text": "count", "max_tokens": ENDLESS, "ignore_eos": True})
            first = gone.first_event_for("orphan")
            case.check(first.get("event") == "token", f"the orphan did not start: {first}")
            other.send({**SHORT, "id": "queued"})              # waits behind the orphan
            gone.close()
            events = other.events_for("queued")
            case.no_traceback(events, "the other peer")
            ids, _, done = generated(events)
            case.check(done["event"] == "done" and ids == fresh_probe["greedy"], f"the other peer: {done}")
            daemon.wait_idle()
            # the daemon's own account: the peer was found gone at its next token and its request cancelled
            case.check("went away: cancelled 1 request(s)" in daemon.stderr_tail(100_000),
                       "the daemon did not cancel the closed peer's request")
            case.probe(daemon, fresh_probe, "zmq peer gone")
    finally:
        other.close()


@pytest.fixture(scope="module")
def gateway(daemon, tmp_path_factory):
    g = GatewayProcess(daemon.ready["zmq"], tmp_path_factory.mktemp("gateway"))
    yield g
    g.kill()


def _sse_payloads(lines) -> list[str]:
    return [line[len("data: "):] for line in lines if line.startswith("data: ")]


def test_http_client_drops_an_sse_stream(faults, daemon, gateway, fresh_probe):
    with faults.case("client disconnects mid-stream") as case:
        case.sent()
        reference = completion(gateway.url, prompt="x", max_tokens=16)
        case.check(reference.status_code == 200, f"reference completion: {reference.status_code} {reference.text}")
        case.no_traceback([reference.text], "reference completion")
        for path, body in [
            ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": ENDLESS, "ignore_eos": True, "stream": True}),
            ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Count."}],
                                      "max_tokens": ENDLESS, "ignore_eos": True, "stream": True}),
        ]:
            case.sent()
            with httpx.stream("POST", gateway.url + path, json=body, timeout=READ_TIMEOUT_S) as reply:
                case.check(reply.status_code == 200, f"{path}: status {reply.status_code}")
                lines = reply.iter_lines()
                seen = [next(lines) for _ in range(6)]          # the stream is running
                case.no_traceback(seen, path)
            # the connection is closed: the gateway cancels the daemon request, the daemon goes idle
            daemon.wait_idle(timeout=READ_TIMEOUT_S)
            case.sent()
            again = completion(gateway.url, prompt="x", max_tokens=16)
            case.no_traceback([again.text], f"after dropping {path}")
            case.check(again.status_code == 200 and again.json()["choices"][0]["text"]
                       == reference.json()["choices"][0]["text"], f"after dropping {path}: {again.text[:300]}")
        case.sent()
        health = httpx.get(gateway.url + "/health", timeout=READ_TIMEOUT_S)
        case.check(health.status_code == 200 and json.loads(health.text)["status"] == "ok", f"health: {health.text}")
        case.probe(daemon, fresh_probe, "http client gone")
