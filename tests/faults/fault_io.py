"""Sending one bad request to a daemon and checking its one answer, for both dialects of
`flashd serve` (a stdin line, a ZeroMQ frame).

"Exactly one terminal event" is checked by ordering, not by waiting: after the bad request the
client sends a `status` and the very next event it reads must be the bad request's error, the one
after it the status result. A second answer (or a stray event) to the bad request would sit
between them; a missing answer would make the status result come first.
"""
from __future__ import annotations

import itertools
import re

from tests.daemon.daemon_harness import ServeDaemon, ZmqPeer

ZMQ_ANY_PORT = "tcp://127.0.0.1:*"   # --zmq: a free loopback port, reported in the ready event
ASSIGNED = object()        # the daemon assigns the id (the request has no readable id=)
ASSIGNED_ID = re.compile(r"r[0-9]+")
_sync_ids = itertools.count(1)


def _check_answer(case, event: dict, code: str, request_id, where: str) -> None:
    case.no_traceback([event], where)
    case.check(event.get("event") == "error" and event.get("code") == code,
               f"{where}: expected error {code}, got {event}")
    if request_id is ASSIGNED:
        case.check(isinstance(event.get("id"), str) and ASSIGNED_ID.fullmatch(event["id"]) is not None,
                   f"{where}: expected a daemon-assigned id, got {event.get('id')!r}")
    else:
        case.check(event.get("id") == request_id, f"{where}: the error answers id {event.get('id')!r}, "
                                                  f"expected {request_id!r}")


def _check_sync(case, event: dict, sync_id: str, where: str) -> None:
    case.check(event.get("id") == sync_id and event.get("event") == "result",
               f"{where}: expected only the status {sync_id} after the error, got {event}")


def _one_answer(case, send, next_event, send_status, code: str, request_id, where: str) -> dict:
    """send() the bad request, check the next event is its one error, then send_status(sync_id) and
    check the event after it is that status' result (nothing in between); the error event."""
    case.sent()
    send()
    event = next_event()
    _check_answer(case, event, code, request_id, where)
    sync_id = f"sync-{next(_sync_ids)}"
    send_status(sync_id)
    _check_sync(case, next_event(), sync_id, where)
    return event


def line_error(case, daemon: ServeDaemon, line: str | bytes, code: str, request_id, where: str) -> dict:
    """Send one stdin line that must fail with `code`; its error event."""
    return _one_answer(case, lambda: daemon.send(line), daemon.next_event,
                       lambda sync_id: daemon.send(f"status id={sync_id}"), code, request_id, where)


def _zmq_status(peer: ZmqPeer):
    return lambda sync_id: peer.send({"cmd": "status", "id": sync_id})


def frame_error(case, peer: ZmqPeer, frame: bytes | dict, code: str, request_id, where: str) -> dict:
    """Send one ZeroMQ request frame that must fail with `code`; its error event."""
    return _one_answer(case, lambda: peer.send(frame), peer.next_event, _zmq_status(peer), code, request_id, where)


def frames_error(case, peer: ZmqPeer, frames: list[bytes], code: str, where: str) -> dict:
    """A multipart message (not one frame): one error under a daemon-assigned id."""
    return _one_answer(case, lambda: peer.send_frames(frames), peer.next_event, _zmq_status(peer), code, ASSIGNED,
                       where)
