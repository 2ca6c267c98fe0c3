"""Request ids that collide or name nothing: duplicate ids (from one client and across clients),
cancels of unknown, finished, already cancelled and other clients' requests. Every request still
gets exactly one terminal event, and a cancel touches only the sender's own pending request.
"""
from __future__ import annotations

import pytest

from tests.daemon.daemon_harness import LONG_GENERATE_TOKENS, LONG_MAX_CTX, ServeDaemon, ZmqPeer, generated
from tests.faults.fault_io import ZMQ_ANY_PORT

SHORT = 'generate id={id} text="The quick brown fox" max_tokens=24 ignore_eos=true'
LONG = f'generate id={{id}} text="count" max_tokens={LONG_GENERATE_TOKENS} ignore_eos=true'


@pytest.fixture(scope="module")
def daemon(fault_model, tmp_path_factory):
    d = ServeDaemon(fault_model, tmp_path_factory.mktemp("ids"), "--zmq", ZMQ_ANY_PORT, max_ctx=LONG_MAX_CTX)
    yield d
    d.kill()


@pytest.fixture
def peers(daemon, zmq_ctx):
    made = [ZmqPeer(zmq_ctx, daemon.ready["zmq"], daemon) for _ in range(2)]
    yield made
    for peer in made:
        peer.close()


def _zmq_short(request_id: str) -> dict:
    return {"cmd": "generate", "id": request_id, "text": "The quick brown fox", "max_tokens": 24, "ignore_eos": True}


def test_duplicate_ids(faults, daemon, peers, fresh_probe):
    """The daemon does not reject a reused id: each request runs, in order, and ends once."""
    a, b = peers
    with faults.case("duplicate and unknown ids") as case:
        case.sent(3)
        for _ in range(3):
            daemon.send(SHORT.format(id="dup"))
        for n in range(3):
            events = daemon.events_for("dup")
            case.no_traceback(events, "duplicate stdin id")
            ids, _, done = generated(events)
            case.check(done["event"] == "done" and ids == fresh_probe["greedy"], f"duplicate #{n}: {done}")
        # two peers using the same id: each sees only its own request's events
        case.sent(2)
        a.send(_zmq_short("same"))
        b.send(_zmq_short("same"))
        for name, peer in (("a", a), ("b", b)):
            events = peer.events_for("same")
            case.no_traceback(events, f"peer {name}")
            ids, _, done = generated(events)
            case.check(done["event"] == "done" and ids == fresh_probe["greedy"], f"peer {name}: {done}")
        for name, peer in (("a", a), ("b", b)):
            case.sent()
            status = peer.ask({"cmd": "status", "id": f"st-{name}"})
            case.check(status[-1]["event"] == "result" and len(status) == 1,
                       f"peer {name} got more events than its own: {status}")
        case.probe(daemon, fresh_probe, "duplicate ids")


def test_cancels_of_unknown_finished_and_foreign_requests(faults, daemon, peers, fresh_probe):
    a, b = peers
    with faults.case("duplicate and unknown ids") as case:
        for line, request_id in [("cancel id=k1 target=nosuch", "k1"), ("cancel id=k2 target=7", "k2")]:
            case.sent()
            events = daemon.ask(line, request_id)
            case.check(events == [{"id": request_id, "event": "result", "cancelled": False}], f"{line}: {events}")
        # a finished request cannot be cancelled
        case.sent(2)
        generated(daemon.ask(SHORT.format(id="finished"), "finished"))
        events = daemon.ask("cancel id=k3 target=finished", "k3")
        case.check(events[-1].get("cancelled") is False, f"cancel of a finished request: {events}")

        # b runs a long request; a cannot cancel it (cancels are per client), b can, once
        case.sent(4)
        b.send({"cmd": "generate", "id": "long", "text": "count", "max_tokens": LONG_GENERATE_TOKENS,
                "ignore_eos": True})
        first = b.first_event_for("long")
        case.check(first.get("event") == "token", f"the long request did not start: {first}")
        foreign = a.ask({"cmd": "cancel", "id": "k4", "target": "long"})
        case.check(foreign[-1].get("cancelled") is False, f"a cancelled b's request: {foreign}")
        own = b.ask({"cmd": "cancel", "id": "k5", "target": "long"})
        case.check(own[-1].get("cancelled") is True, f"b's own cancel: {own}")
        again = b.ask({"cmd": "cancel", "id": "k6", "target": "long"})
        case.check(again[-1].get("cancelled") is False, f"a second cancel of the same request: {again}")
        events = b.events_for("long")
        case.no_traceback(events, "cancelled long request")
        case.error_code(case.one_terminal(events, "long", "the cancelled long request"), "cancelled",
                        "the cancelled long request")

        # a queued request cancelled before it starts ends at once, exactly once
        case.sent(4)
        daemon.send(LONG.format(id="head"))
        daemon.send(SHORT.format(id="queued"))
        first = daemon.first_event_for("head")
        case.check(first.get("event") == "token", f"head did not start: {first}")
        cancel = daemon.ask("cancel id=k7 target=queued", "k7")
        case.check(cancel[-1].get("cancelled") is True, f"cancel of a queued request: {cancel}")
        queued = daemon.events_for("queued")
        case.error_code(queued[-1] if len(queued) == 1 else None, "cancelled", "the queued request")
        daemon.ask("cancel id=k8 target=head", "k8")
        head = daemon.events_for("head")
        case.error_code(head[-1], "cancelled", "head")
        case.no_traceback(queued + head, "queued and head")
        daemon.wait_idle()
        case.probe(daemon, fresh_probe, "cancels")
