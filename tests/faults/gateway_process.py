"""`flashd http --daemon ADDR` as a real process (the console script's module), for the fault
tests that drop HTTP connections or kill the daemon behind the gateway.

The gateway is a ZeroMQ client of a daemon it did not start (--daemon): ZeroMQ reconnects to the
address by itself, so a daemon that comes back at the same address is served again. (Without
--daemon the gateway starts a private daemon and stops with it; nothing restarts that one.)
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.daemon.daemon_harness import READ_TIMEOUT_S, _Process
from tests.http.gateway_harness import free_port


class GatewayProcess(_Process):
    def __init__(self, daemon_address: str, workdir: Path, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "flashd.clients.cli", "http", "--daemon", daemon_address,
                "--port", str(self.port), *extra]
        super().__init__(argv, workdir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        self.wait_status(200)

    def wait_status(self, status: int, path: str = "/health", timeout: float = READ_TIMEOUT_S) -> httpx.Response:
        """Poll `path` until it answers `status` (the gateway starting, a daemon coming back)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise self.fail(f"the gateway exited with status {self.proc.returncode}")
            try:
                reply = httpx.get(self.url + path, timeout=10)
                if reply.status_code == status:
                    return reply
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise self.fail(f"{path} did not answer {status} within {timeout} s")
            time.sleep(0.05)


def completion(url: str, **body) -> httpx.Response:
    """A non-streamed /v1/completions request (greedy unless the body says otherwise)."""
    return httpx.post(url + "/v1/completions", json={"model": "m", "temperature": 0, **body}, timeout=READ_TIMEOUT_S)
