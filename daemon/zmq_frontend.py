"""The ZeroMQ front end of `flashd serve`: a ROUTER socket owned by one thread (zmq sockets are
not thread-safe). Events for ZeroMQ peers are encoded on the emitting thread, queued, and the
ZeroMQ thread is woken through an inproc PAIR socket to send them.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING

import zmq

from ..protocol import wire
from ..protocol.errors import ProtocolError
from ..protocol.events import error_event
from ..protocol.messages import Request
from .process import StartupError
from .serve_client import Client

if TYPE_CHECKING:
    from .server import Server

__all__ = ["ZmqClient", "ZmqFrontend"]

log = logging.getLogger("flashd.server")

ZMQ_LINGER_MS = 2000           # at exit, undelivered frames get this long to reach their peers


class ZmqClient(Client):
    """One ZeroMQ peer. Events are encoded on the emitting thread and queued for the ZeroMQ
    thread, which sends them to this identity."""

    def __init__(self, server: Server, frontend: ZmqFrontend, identity: bytes):
        super().__init__(server, f"zmq peer {identity.hex()}")
        self.frontend, self.identity = frontend, identity

    def send(self, event: dict, finished: Request | None = None) -> None:
        self.frontend.post(self, wire.encode_event(event), finished)



class ZmqFrontend:
    """A ROUTER socket served by one thread. Peers are DEALERs: each message is one msgpack
    request frame; each event goes back as one frame to the identity that asked.

    ROUTER_MANDATORY makes a send to a peer that has disconnected fail (EHOSTUNREACH) instead
    of vanishing silently: that is how a client that went away is noticed, and its pending
    requests are then cancelled. SNDHWM is unlimited so that a send never blocks the thread:
    a peer that reads slowly has its events buffered in the daemon.
    """

    def __init__(self, address: str, max_frame_bytes: int):
        self.max_frame_bytes = max_frame_bytes
        self._ctx = zmq.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._router.setsockopt(zmq.SNDHWM, 0)
        self._router.setsockopt(zmq.LINGER, ZMQ_LINGER_MS)
        try:
            self._router.bind(address)
        except zmq.ZMQError as exc:
            self._router.close(0)
            self._ctx.term()
            raise StartupError(f"--zmq {address}: cannot bind: {exc}") from None
        self.endpoint: str = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        wake_address = f"inproc://flashd-wake-{id(self):x}"
        self._wake_in = self._ctx.socket(zmq.PAIR)
        self._wake_in.bind(wake_address)
        self._wake_out = self._ctx.socket(zmq.PAIR)
        self._wake_out.connect(wake_address)
        self._wake_lock = threading.Lock()    # _wake_out is used by any emitting thread
        self._outbox: queue.SimpleQueue[tuple[ZmqClient, bytes, Request | None]] = queue.SimpleQueue()
        self._clients: dict[bytes, ZmqClient] = {}   # peers with pending requests (ZeroMQ thread only)
        self._closing = False
        self._closed = False
        self._server: Server | None = None
        self._thread: threading.Thread | None = None

    def start(self, server: Server) -> None:
        self._server = server
        self._thread = threading.Thread(target=self._run, name="flashd-zmq", daemon=True)
        self._thread.start()

    def post(self, client: ZmqClient, frame: bytes, finished: Request | None) -> None:
        """Queue a frame for `client` (any thread) and wake the ZeroMQ thread."""
        self._outbox.put((client, frame, finished))
        if threading.current_thread() is self._thread:
            return                            # the loop drains the outbox before it polls again
        self._wake()

    def _wake(self) -> None:
        with self._wake_lock:
            if not self._closed:
                try:
                    self._wake_out.send(b"", zmq.NOBLOCK)
                except zmq.Again:             # wake-ups already pending: the thread will run
                    pass

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued, then close (call after the engine has stopped emitting)."""
        self._closing = True
        if self._thread is not None and self._thread.is_alive():
            self._wake()
            self._thread.join(timeout)
        else:
            self._close_sockets()

    # -- the ZeroMQ thread -------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_in, zmq.POLLIN)
        try:
            while not self._closing:
                ready = dict(poller.poll())
                if self._wake_in in ready:
                    self._drain_wake()
                if self._router in ready:
                    self._receive_some()
                self._send_outbox()
            self._send_outbox()
        except Exception:
            log.exception("ZeroMQ front end failed")
            self._server.request_stop("ZeroMQ front end failed")
        finally:
            self._close_sockets()

    def _close_sockets(self) -> None:
        with self._wake_lock:
            self._closed = True
            self._wake_out.close(0)
        self._wake_in.close(0)
        self._router.close()                  # keeps LINGER: queued frames still go out
        self._ctx.term()

    def _drain_wake(self) -> None:
        while True:
            try:
                self._wake_in.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def _receive_some(self, max_messages: int = 64) -> None:
        """Up to max_messages requests, then back to sending (so events keep flowing)."""
        for _ in range(max_messages):
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._on_message(frames)

    def _on_message(self, frames: list[bytes]) -> None:
        server = self._server
        identity = frames[0]
        client = self._clients.get(identity)
        if client is None:
            client = self._clients[identity] = ZmqClient(server, self, identity)
        default_id = server.next_id()
        if len(frames) != 2:
            client.send(error_event(default_id, "bad_request", f"expected one msgpack frame per message, "
                                                               f"got {len(frames) - 1} frames"))
            return
        try:
            request = server.files.check(wire.decode_request(frames[1], default_id, self.max_frame_bytes))
        except ProtocolError as exc:
            client.send(error_event(exc.request_id, exc.code, exc.message))   # None: id given but unreadable
            return
        server.dispatch(request, client)

    def _send_outbox(self) -> None:
        while True:
            try:
                client, frame, finished = self._outbox.get_nowait()
            except queue.Empty:
                return
            if not client.gone:
                try:
                    self._router.send_multipart([client.identity, frame], zmq.NOBLOCK)
                except zmq.ZMQError as exc:
                    if exc.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                        raise
                    client.gone = True
                    log.info("%s is unreachable (%s)", client.name, exc)
                    self._server.client_gone(client)
            if finished is not None:
                client.request_ended(finished)
            if client.pending == 0 and self._clients.get(client.identity) is client:
                del self._clients[client.identity]

