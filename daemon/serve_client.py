"""What `flashd serve`'s front ends share: a *client* (one source of requests and the place its
events go) and the `emit` callback the engine calls for one request's events.

A client counts its requests in flight (`pending`), so stdin at its end can finish them before the
daemon exits, and tells the server when one ends: --keep-alive's idle timer and `quit` hang on that.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..protocol.events import TERMINAL_EVENTS
from ..protocol.messages import Quit, Request, Status

if TYPE_CHECKING:
    from .server import Server

__all__ = ["Client", "Reply", "UNTIMED"]

UNTIMED = (Status, Quit)   # requests that are not activity for --keep-alive (`flashd ps` asks status)


class Client:
    """A source of requests and the sink of their events. `pending` counts the client's
    requests handed to the engine whose terminal event has not been delivered yet."""

    def __init__(self, server: Server, name: str):
        self.server, self.name = server, name
        self.pending = 0
        self.gone = False             # its reader went away: events are dropped, requests cancelled
        self._idle = threading.Condition()

    def send(self, event: dict, finished: Request | None = None) -> None:
        """Deliver `event`; `finished` is the request a terminal event ends (None otherwise)."""
        raise NotImplementedError

    def started(self) -> None:
        with self._idle:
            self.pending += 1

    def request_ended(self, request: Request) -> None:
        with self._idle:
            self.pending -= 1
            self._idle.notify_all()
        if not isinstance(request, UNTIMED):
            self.server.idle.end()
        if isinstance(request, Quit):
            self.server.request_stop(f"quit from {self.name}")

    def wait_idle(self, stop: threading.Event) -> None:
        """Block until every pending request has ended (or the daemon stops)."""
        with self._idle:
            while self.pending and not stop.is_set():
                self._idle.wait(0.1)


class Reply:
    """The `emit` callback of one request. The engine calls it from its thread with every
    event; Server.cancel predicates read `.client` to find a client's requests."""

    __slots__ = ("client", "request")

    def __init__(self, client: Client, request: Request):
        self.client, self.request = client, request

    def __call__(self, event: dict) -> None:
        self.client.send(event, self.request if event.get("event") in TERMINAL_EVENTS else None)

