"""A fake daemon's socket: a ZeroMQ ROUTER bound to a random loopback port, served by a thread that runs the
subclass's _run until close(). Shared by tests/clients/test_client.py's FakeRouter (answers from a script)
and tests/http/conftest.py's FakeDaemon (answers like a daemon)."""
from __future__ import annotations

import threading

import msgpack
import zmq

from flashd.protocol import wire


class LoopbackRouter:
    """Subclasses set their own state first, then call LoopbackRouter.__init__ (it starts the thread), and
    implement _run: a loop while not self._stop.is_set(), reading requests with _poll and answering with _send.
    Every request received is kept in `received`."""

    def __init__(self, thread_name: str | None = None):
        self.received: list[dict] = []
        self._context = zmq.Context()
        self._router = self._context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://127.0.0.1:{self._router.bind_to_random_port('tcp://127.0.0.1')}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    def _poll(self, timeout_ms: int) -> tuple[bytes, dict] | None:
        """The next request, (client identity, its fields), kept in `received`; None if none came in time."""
        if not self._router.poll(timeout_ms):
            return None
        identity, frame = self._router.recv_multipart()
        fields = msgpack.unpackb(frame, raw=False)
        self.received.append(fields)
        return identity, fields

    def _send(self, identity: bytes, event: dict) -> None:
        self._router.send_multipart([identity, wire.encode_event(event)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._router.close()
        self._context.term()
