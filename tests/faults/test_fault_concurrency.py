"""Many requests queued at once from several ZeroMQ clients (and stdin): every accepted request
gets exactly one terminal event, each client sees only its own requests, and the outputs equal the
same requests run one at a time. A full queue answers `overloaded` at once, exactly once.
"""
from __future__ import annotations

import pytest

from tests.daemon.daemon_harness import LONG_GENERATE_TOKENS, LONG_MAX_CTX, ServeDaemon, ZmqPeer, generated
from tests.faults.fault_io import ZMQ_ANY_PORT

N_PEERS = 4
PER_PEER = 5
PROMPTS = ["The quick brown fox", "def fib(n):", "Once upon a time", "import numpy as np", "SELECT * FROM"]


def _request(peer: int, n: int) -> dict:
    """Greedy and seeded sampled generates, streamed and not, of several lengths."""
    fields = {"cmd": "generate", "id": f"p{peer}-{n}", "text": PROMPTS[(peer + n) % len(PROMPTS)],
              "max_tokens": 8 + 4 * ((peer * PER_PEER + n) % 5), "ignore_eos": True}
    if (peer + n) % 2:
        fields.update(temperature=0.8, top_k=40, seed=peer * 100 + n)
    if n % 3 == 2:
        fields["stream"] = False
    return fields


def _output(events: list[dict]) -> tuple[list[int], str]:
    ids, text, _ = generated(events)
    return ids, text


@pytest.fixture(scope="module")
def daemon(fault_model, tmp_path_factory):
    d = ServeDaemon(fault_model, tmp_path_factory.mktemp("concurrency"), "--zmq", ZMQ_ANY_PORT,
                    max_ctx=LONG_MAX_CTX)
    yield d
    d.kill()


@pytest.fixture
def connect(zmq_ctx):
    """connect(daemon, n) -> n ZmqPeers (closed after the test)."""
    made: list[ZmqPeer] = []

    def make(daemon: ServeDaemon, n: int) -> list[ZmqPeer]:
        made.extend(ZmqPeer(zmq_ctx, daemon.ready["zmq"], daemon) for _ in range(n))
        return made[-n:]

    yield make
    for peer in made:
        peer.close()


def _check_all(case, peer: ZmqPeer, requests: list[dict], where: str) -> dict[str, list[dict]]:
    """Every request of `peer` ends exactly once; then nothing else is waiting for this peer."""
    out = {}
    for request in requests:
        out[request["id"]] = events = peer.events_for(request["id"])
        case.no_traceback(events, where)
        case.one_terminal(events, request["id"], where)
    case.sent()
    sync = peer.ask({"cmd": "status", "id": f"sync-{where}"})
    case.check(len(sync) == 1, f"{where}: events of no request of this peer: {sync[:-1]}")
    return out


def test_many_clients_queue_at_once(faults, daemon, connect, fresh_probe):
    peers = connect(daemon, N_PEERS)
    requests = [[_request(p, n) for n in range(PER_PEER)] for p in range(N_PEERS)]
    with faults.case("many queued requests") as case:
        # the sequential reference: one request at a time on one peer
        reference = {}
        for request in (r for per_peer in requests for r in per_peer):
            case.sent()
            reference[request["id"]] = _output(peers[0].ask(request))
        # all at once (20 requests, within the default queue of 64), the peers interleaved
        for n in range(PER_PEER):
            for p, peer in enumerate(peers):
                case.sent()
                peer.send(requests[p][n])
        for p, peer in enumerate(peers):
            got = _check_all(case, peer, requests[p], f"peer {p}")
            for request_id, events in got.items():
                case.check(events[-1]["event"] == "done" and _output(events) == reference[request_id],
                           f"{request_id}: {events[-1]} differs from the sequential run")
        case.probe(daemon, fresh_probe, "many queued requests")


def test_a_full_queue_answers_overloaded_once(faults, spawn, connect, fresh_probe):
    """A long request runs; 3 peers then send 3 requests each into a queue of 4: the ones that do
    not fit are refused at once, the ones that do run after it, each ends exactly once."""
    daemon = spawn("--zmq", ZMQ_ANY_PORT, "--max-queue", "4", max_ctx=LONG_MAX_CTX)
    peers = connect(daemon, 4)
    head = {"cmd": "generate", "id": "head", "text": "count", "max_tokens": LONG_GENERATE_TOKENS, "ignore_eos": True}
    extra = [[_request(p, n) for n in range(3)] for p in range(3)]
    with faults.case("many queued requests") as case:
        reference = {r["id"]: _output(peers[3].ask(r)) for per_peer in extra for r in per_peer}
        case.sent(len(reference) + 1)
        peers[3].send(head)
        first = peers[3].first_event_for("head")
        case.check(first.get("event") == "token", f"head did not start: {first}")
        statuses = []
        for p in range(3):
            for request in extra[p]:
                case.sent()
                peers[p].send(request)
            case.sent()
            statuses.append(peers[p].ask({"cmd": "status", "id": f"queue-{p}"})[-1])
        case.sent()
        peers[3].ask({"cmd": "cancel", "id": "stop-head", "target": "head"})
        head_events = peers[3].events_for("head")
        case.one_terminal(head_events, "head", "head")
        n_overloaded = 0
        for p in range(3):
            got = _check_all(case, peers[p], extra[p], f"overload peer {p}")
            for request_id, events in got.items():
                terminal = events[-1]
                if terminal.get("code") == "overloaded":
                    n_overloaded += 1
                    case.check(len(events) == 1, f"{request_id}: events before overloaded: {events}")
                else:
                    case.check(terminal["event"] == "done" and _output(events) == reference[request_id],
                               f"{request_id}: {terminal}")
        if all(s["running"] == "head" for s in statuses):     # head ran through every submission
            case.check(n_overloaded == 9 - 4, f"{n_overloaded} of 9 overloaded with a queue of 4")
        daemon.wait_idle()
        case.probe(daemon, fresh_probe, "overloaded queue")
