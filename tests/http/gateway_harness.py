"""The HTTP tests' harness: the gateway served by uvicorn in a thread, and small helpers. Imported
as tests.http.gateway_harness by conftest.py (fixtures), by test modules directly and by tests/faults."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn

from flashd.clients.client import Client
from flashd.clients.http.app import create_app
from flashd.clients.http.config import GatewayConfig
from flashd.clients.http.daemon_link import DaemonLink

TIMEOUT_S = 30.0   # the longest the gateway waits for the daemon's next event in these tests

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GatewayServer:
    """`create_app` served by uvicorn in a thread on a free loopback port."""

    def __init__(self, link: DaemonLink, config: GatewayConfig):
        self.app = create_app(link, config)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                     log_level="warning", timeout_graceful_shutdown=2))
        self._thread = threading.Thread(target=self._server.run, name="gateway", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60     # only detects a hang: the loop ends once uvicorn serves
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)


@contextlib.contextmanager
def serve_gateway(client: Client, **config) -> Iterator[GatewayServer]:
    link = DaemonLink.open(client, inactivity_timeout_s=TIMEOUT_S)
    server = GatewayServer(link, GatewayConfig(port=0, **config))
    try:
        yield server
    finally:
        server.stop()


def wait_idle(client: Client, timeout_s: float) -> None:
    """Until the daemon runs nothing and queues nothing; fails after timeout_s (a hang guard: give a
    generous one, the wait ends as soon as the daemon is idle)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.status()
        if status["running"] is None and status["queued"] == 0:
            return
        assert time.monotonic() < deadline, f"the daemon is still busy after {timeout_s:g} s: {status}"
        time.sleep(0.05)


# ----------------------------------------------------------------------------------------------
# A scripted fake daemon
# ----------------------------------------------------------------------------------------------
