"""Fixtures of the HTTP gateway tests: a real daemon on a tiny synthetic model, the gateway as a
real uvicorn server on a free loopback port (in a thread), and a scripted fake daemon (a ZeroMQ
ROUTER) for outputs a random model cannot be made to produce on cue (tool calls)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flashd.clients.client import Client
from flashd.clients.spawn import DaemonOptions, LocalDaemon
from flashd.clients.tokenizer import read_gguf_metadata
from flashd.scripts.gguf_out import new_gguf
from tests.clients.loopback_router import LoopbackRouter
from tests.http.gateway_harness import TIMEOUT_S, GatewayServer, serve_gateway

# A qwen2-shaped model that loads in well under a second and decodes ~1000 tokens/s on the
# reference backend; its random weights rarely produce the end token, so outputs run to max_tokens.
TINY = dict(arch="qwen2", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=512,
            weight_type="Q8_0", seed=11, name="http-test")
TINY_MAX_CTX = 4096
QWEN_TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "tokenizer" / "qwen2.5_chat_template.jinja"


@pytest.fixture(scope="session")
def tiny_model(synthetic_model) -> Path:
    return synthetic_model(**TINY)


@pytest.fixture(scope="session")
def daemon(tiny_model) -> Iterator[LocalDaemon]:
    # --draft ngram: the speculative-decoding extensions have a drafter to name
    with LocalDaemon.start(DaemonOptions(model=str(tiny_model), device="cpu", max_ctx=TINY_MAX_CTX,
                                         ready_timeout_s=60, extra_args=("--draft", "ngram"))) as running:
        yield running


@pytest.fixture(scope="session")
def daemon_client(daemon) -> Iterator[Client]:
    """A client of the daemon for the tests' own oracle requests."""
    with daemon.connect(timeout_s=TIMEOUT_S) as client:
        yield client


@pytest.fixture(scope="session")
def gateway(daemon) -> Iterator[GatewayServer]:
    with daemon.connect(timeout_s=TIMEOUT_S) as client, serve_gateway(client) as server:
        yield server


@pytest.fixture(scope="session")
def tool_model(tiny_model, tmp_path_factory) -> Path:
    """A GGUF holding only the tiny model's tokenizer and Qwen2.5's chat template (which shows
    tools to the model): all the gateway reads from a model file."""
    path = tmp_path_factory.mktemp("tool-model") / "qwen-template.gguf"
    metadata = read_gguf_metadata(tiny_model, prefix="tokenizer.")
    with new_gguf(path, "qwen2") as writer:
        writer.add_tokenizer_model(metadata["tokenizer.ggml.model"])
        writer.add_tokenizer_pre(metadata["tokenizer.ggml.pre"])
        writer.add_token_list(list(metadata["tokenizer.ggml.tokens"]))
        writer.add_token_types([int(t) for t in metadata["tokenizer.ggml.token_type"]])
        writer.add_token_merges(list(metadata["tokenizer.ggml.merges"]))
        writer.add_bos_token_id(int(metadata["tokenizer.ggml.bos_token_id"]))
        writer.add_eos_token_id(int(metadata["tokenizer.ggml.eos_token_id"]))
        writer.add_add_bos_token(False)
        writer.add_chat_template(QWEN_TEMPLATE.read_text())
    return path


class FakeDaemon(LoopbackRouter):
    """A ROUTER on a loopback port that answers like a daemon: `status` names `model_path`;
    `generate` streams `reply` (a list of text chunks, one token event each, then the EOS token and
    `done`), or, with `endless`, one token every 10 ms until cancelled. Every request received is
    kept in `received`, every cancel target in `cancelled`. (Its socket, thread and close() are
    tests/clients/loopback_router.py's, as for tests/clients/test_client.py's FakeRouter.)"""

    def __init__(self, model_path: Path, eos_id: int):
        self.model_path = model_path
        self.eos_id = eos_id
        self.reply: list[str] = []
        self.reason = "stop"
        self.endless = False
        self.cancelled: list[str] = []
        self._streams: dict[str, bytes] = {}  # endless request id -> client identity
        super().__init__("fake-daemon")

    def requests(self, cmd: str) -> list[dict]:
        return [r for r in self.received if r.get("cmd") == cmd]

    def _answer(self, identity: bytes, fields: dict) -> None:
        cmd, request_id = fields.get("cmd"), fields.get("id")
        if cmd == "status":
            self._send(identity, {"id": request_id, "event": "result", "model": str(self.model_path),
                                  "max_ctx": 4096, "running": None, "queued": 0, "served": 0, "backend": "fake"})
        elif cmd == "cancel":
            self.cancelled.append(fields["target"])
            found = self._streams.pop(fields["target"], None)
            self._send(identity, {"id": request_id, "event": "result", "cancelled": found is not None})
            if found is not None:
                self._send(found, {"id": fields["target"], "event": "error", "code": "cancelled",
                                   "message": "cancelled"})
        elif cmd == "generate":
            if self.endless:
                self._streams[request_id] = identity
                return
            n_prompt = len(fields["ids"]) // 4 if isinstance(fields["ids"], bytes) else len(fields["ids"])
            for n, text in enumerate(self.reply):
                self._send(identity, {"id": request_id, "event": "token", "ids": [10 + n % 200], "text": text})
            ids = [] if self.reason == "length" else [self.eos_id]
            if ids:
                self._send(identity, {"id": request_id, "event": "token", "ids": ids, "text": ""})
            self._send(identity, {"id": request_id, "event": "done", "reason": self.reason, "n_prompt": n_prompt,
                                  "n_gen": len(self.reply) + len(ids), "timings": {}})
        else:
            self._send(identity, {"id": request_id, "event": "error", "code": "unknown_command", "message": cmd})

    def _run(self) -> None:
        while not self._stop.is_set():
            if (got := self._poll(10)) is not None:
                self._answer(*got)
            for request_id, identity in list(self._streams.items()):
                self._send(identity, {"id": request_id, "event": "token", "ids": [33], "text": "a"})


@pytest.fixture
def fake_gateway(tool_model) -> Iterator[tuple[FakeDaemon, GatewayServer]]:
    from flashd.clients.tokenizer import Tokenizer

    fake = FakeDaemon(tool_model, eos_id=Tokenizer.from_gguf(tool_model).eos_id)
    try:
        with Client(fake.address, timeout_s=TIMEOUT_S) as client, serve_gateway(client) as server:
            yield fake, server
    finally:
        fake.close()


@pytest.fixture
def make_gateway() -> Iterator[Callable[..., GatewayServer]]:
    """Start extra gateways (e.g. with an API key) on a client; stopped after the test."""
    stack = contextlib.ExitStack()

    def make(client: Client, **config) -> GatewayServer:
        return stack.enter_context(serve_gateway(client, **config))

    with stack:
        yield make
