"""kill -9 of the daemon behind `flashd http --daemon ADDR`: a stream in flight ends with an error
event (not a hang), requests while the daemon is gone are answered 503, and once a daemon serves
ADDR again the gateway serves it (ZeroMQ reconnects) with a fresh daemon's outputs.
"""
from __future__ import annotations

import httpx

from tests.daemon.daemon_harness import LONG_MAX_CTX, READ_TIMEOUT_S, ServeDaemon
from tests.http.gateway_harness import free_port
from tests.faults.gateway_process import GatewayProcess, completion

ENDLESS = LONG_MAX_CTX - 16


def test_daemon_killed_under_the_gateway(faults, fault_model, tmp_path, fresh_probe):
    address = f"tcp://127.0.0.1:{free_port()}"     # fixed: the next daemon comes back at the same address
    started: list = []

    def start_daemon() -> ServeDaemon:
        started.append(ServeDaemon(fault_model, tmp_path, "--zmq", address, max_ctx=LONG_MAX_CTX))
        return started[-1]

    try:
        first = start_daemon()
        gateway = GatewayProcess(address, tmp_path)
        started.append(gateway)
        with faults.case("daemon killed under the gateway") as case:
            case.sent()
            reference = completion(gateway.url, prompt="x", max_tokens=16)
            case.check(reference.status_code == 200, f"before the kill: {reference.status_code} {reference.text}")

            # a stream in flight when the daemon dies ends (with an error event), it does not hang
            case.sent()
            body = {"model": "m", "prompt": "x", "max_tokens": ENDLESS, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", gateway.url + "/v1/completions", json=body, timeout=READ_TIMEOUT_S) as reply:
                lines = reply.iter_lines()
                seen = [next(lines) for _ in range(4)]
                first.proc.kill()                             # SIGKILL: no goodbye on the socket
                first.proc.wait(READ_TIMEOUT_S)
                seen += list(lines)                           # to the end of the stream
            case.no_traceback(seen, "the stream cut by the kill")
            case.check(any('"error"' in line for line in seen) and "data: [DONE]" not in seen,
                       f"the stream cut by the kill does not end with an error: {seen[-3:]}")

            # while no daemon serves the address: 503, for generation and health alike
            for name, request in [
                ("completion", lambda: completion(gateway.url, prompt="x", max_tokens=16)),
                ("chat", lambda: httpx.post(gateway.url + "/v1/chat/completions", timeout=READ_TIMEOUT_S,
                                            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})),
                ("health", lambda: httpx.get(gateway.url + "/health", timeout=READ_TIMEOUT_S)),
            ]:
                case.sent()
                reply = request()
                case.no_traceback([reply.text], f"{name} without a daemon")
                case.check(reply.status_code == 503, f"{name} without a daemon: {reply.status_code} {reply.text[:200]}")

            # a daemon at the same address again: served as before
            second = start_daemon()
            case.sent()
            gateway.wait_status(200)
            case.sent()
            again = completion(gateway.url, prompt="x", max_tokens=16)
            case.no_traceback([again.text], "after the restart")
            case.check(again.status_code == 200 and again.json()["choices"][0]["text"]
                       == reference.json()["choices"][0]["text"], f"after the restart: {again.text[:300]}")
            case.probe(second, fresh_probe, "the restarted daemon")
    finally:
        for process in started:
            process.kill()
