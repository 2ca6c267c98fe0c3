"""SIGTERM while a generation runs and others wait, from stdin and from a ZeroMQ peer: the daemon
exits with status 0, and every request it had accepted ends with exactly one terminal event (the
running one cancelled or done, the queued ones cancelled) -- nothing is lost, nothing doubled.
"""
from __future__ import annotations

import json
import signal

from tests.daemon.daemon_harness import LONG_GENERATE_TOKENS, LONG_MAX_CTX, READ_TIMEOUT_S, ZmqPeer
from tests.faults.fault_io import ZMQ_ANY_PORT

SHORT = 'generate id={id} text="The quick brown fox" max_tokens=24 ignore_eos=true'
LONG = f'generate id={{id}} text="count" max_tokens={LONG_GENERATE_TOKENS} ignore_eos=true'


def test_sigterm_during_a_generation(faults, spawn, zmq_ctx):
    daemon = spawn("--zmq", ZMQ_ANY_PORT, max_ctx=LONG_MAX_CTX)
    peer = ZmqPeer(zmq_ctx, daemon.ready["zmq"], daemon)
    try:
        with faults.case("SIGTERM during generation") as case:
            case.sent()
            daemon.send(LONG.format(id="long"))
            first = daemon.first_event_for("long")      # it runs: there is something to interrupt
            case.check(first.get("event") == "token", f"the long request did not start: {first}")
            stdin_ids, zmq_ids = ["q1", "q2"], ["z1", "z2"]
            for request_id in stdin_ids:
                case.sent()
                daemon.send(SHORT.format(id=request_id))
            for request_id in zmq_ids:
                case.sent()
                peer.send({"cmd": "generate", "id": request_id, "text": "hi", "max_tokens": 24, "ignore_eos": True})
            # a status from each client is answered after that client's requests were accepted
            case.sent(2)
            for status in (daemon.ask("status id=st", "st")[-1], peer.ask({"cmd": "status", "id": "st"})[-1]):
                case.check(status.get("running") == "long", f"long is not running: {status}")
            daemon.signal(signal.SIGTERM)

            stdin_events = {rid: daemon.events_for(rid) for rid in ["long", *stdin_ids]}
            rest = [json.loads(line) for line in daemon.out.at_eof(READ_TIMEOUT_S).splitlines() if line.strip()]
            zmq_events = {rid: peer.events_for(rid) for rid in zmq_ids}
            case.check(daemon.wait() == 0, f"exit status {daemon.proc.returncode} after SIGTERM")

            everything = [e for events in [*stdin_events.values(), *zmq_events.values()] for e in events] + rest
            case.no_traceback(everything, "after SIGTERM")
            for request_id, events in [*stdin_events.items(), *zmq_events.items()]:
                pool = events + (rest if request_id in stdin_events else [])
                terminal = case.one_terminal(pool, request_id, "after SIGTERM")
                if request_id == "long":
                    case.check(terminal is not None and (terminal["event"] == "done" or terminal.get("code") == "cancelled"),
                               f"long ended with {terminal}")
                else:
                    case.error_code(terminal, "cancelled", f"queued {request_id}")
            case.check("Traceback" not in daemon.stderr_tail(100_000), "a traceback on the daemon's stderr")
    finally:
        peer.close()
