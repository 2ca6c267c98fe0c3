"""The ZeroMQ client library: against a real daemon process on a tiny synthetic model (every verb,
streaming, errors, cancel, requests in flight together), and against a scripted fake ROUTER for
what a real daemon cannot be made to do on cue (silence, out-of-order events, unreadable ids).

Oracles: the daemon's own `score` argmax for greedy generation (an independent forward over the
whole sequence), detokenize for streamed text, and sequential runs for concurrent ones.
"""
from __future__ import annotations

import time

import pytest

from flashd.clients.client import Client, ClientTimeout, DaemonError, DaemonGone
from flashd.clients.spawn import DaemonOptions, DaemonStartError, LocalDaemon
from flashd.clients.tokenizer import Tokenizer
from tests.clients.loopback_router import LoopbackRouter

TIMEOUT_S = 30.0  # the longest any answer may take before a test fails
HANG_GUARD_S = 60.0  # waits for a condition end when it holds; this only turns a hang into a failure


# ----------------------------------------------------------------------------------------------
# A real daemon
# ----------------------------------------------------------------------------------------------


def test_ready_and_status_describe_the_model(daemon, client, tiny_model, tiny_spec):
    assert daemon.ready["model"] == str(tiny_model)
    assert daemon.ready["vocab_size"] == tiny_spec["vocab_size"]
    status = client.status()
    assert status["model"] == str(tiny_model) and status["max_ctx"] == 4096
    assert status["running"] is None


def test_tokenize_detokenize_round_trip(client, tiny_spec):
    text = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # é"
    ids = client.tokenize(text)
    assert ids and all(0 <= t < tiny_spec["vocab_size"] for t in ids)
    assert client.detokenize(ids) == text


def test_streamed_generation(client):
    events = list(client.generate("The quick brown fox", max_tokens=12, ignore_eos=True))
    tokens, done = events[:-1], events[-1]
    assert all(e["event"] == "token" for e in tokens) and done["event"] == "done"
    ids = [t for e in tokens for t in e["ids"]]
    assert len(ids) == done["n_gen"] == 12 and done["reason"] == "length"
    assert done["n_prompt"] == len(client.tokenize("The quick brown fox"))
    assert "".join(e["text"] for e in tokens) == client.detokenize(ids)


def test_greedy_generation_follows_score_argmax(client):
    prompt_ids = client.tokenize("import numpy as np\n")
    completion = client.complete(ids=prompt_ids, max_tokens=10, temperature=0, ignore_eos=True)
    assert len(completion.ids) == 10
    # Teacher-forced argmax over prompt + output: position i predicts token i+1.
    argmax = client.score(prompt_ids + completion.ids)["argmax"]
    n_prompt = len(prompt_ids)
    assert completion.ids == argmax[n_prompt - 1:n_prompt - 1 + 10]


def test_complete_streamed_equals_unstreamed(client):
    kwargs = dict(max_tokens=16, temperature=0.8, top_k=40, seed=1234, ignore_eos=True)
    streamed = client.complete("hello world", **kwargs)
    whole = client.complete("hello world", stream=False, **kwargs)
    assert (streamed.ids, streamed.text, streamed.reason) == (whole.ids, whole.text, whole.reason)
    assert streamed.n_gen == 16 and streamed.timings.get("decode_ms") is not None


def test_client_side_tokenizer_sends_the_same_ids(daemon, client, tiny_model):
    with daemon.connect(timeout_s=TIMEOUT_S, tokenizer=Tokenizer.from_gguf(tiny_model)) as local:
        mine = local.complete("x = [1, 2, 3]", max_tokens=8, ignore_eos=True)
    theirs = client.complete("x = [1, 2, 3]", max_tokens=8, ignore_eos=True)
    assert (mine.ids, mine.n_prompt) == (theirs.ids, theirs.n_prompt)


def test_stop_strings_and_logprobs(client):
    full = client.complete("abc", max_tokens=20, ignore_eos=True)
    stop = full.text[5:8]
    assert stop, "the synthetic model produced too little text for this test"
    cut = client.complete("abc", max_tokens=20, ignore_eos=True, stop=stop)
    assert cut.reason == "stop" and cut.text == full.text[:full.text.index(stop)]
    with_lp = client.complete("abc", max_tokens=4, ignore_eos=True, logprobs=3)
    assert len(with_lp.logprobs) == 4 and all(len(lp["top"]) == 3 for lp in with_lp.logprobs)


def test_daemon_errors_raise_and_the_daemon_keeps_serving(client):
    before = client.complete("ok", max_tokens=4, ignore_eos=True)
    with pytest.raises(DaemonError) as info:
        list(client.generate("x", max_tokens=10, temperature=-1.0))
    assert info.value.code == "bad_request" and "temperature" in info.value.message
    with pytest.raises(DaemonError) as info:
        client.complete("x", max_tokens=5000)
    assert info.value.code == "ctx_overflow"
    with pytest.raises(DaemonError) as info:
        client.request("no_such_verb")
    assert info.value.code == "unknown_command"
    with pytest.raises(ValueError, match="exactly one"):
        client.generate()
    assert client.complete("ok", max_tokens=4, ignore_eos=True).ids == before.ids


def test_park_and_unpark(client):
    before = client.complete("park me", max_tokens=6, ignore_eos=True)
    assert client.park()["parked"]["target"] is True
    with pytest.raises(DaemonError) as info:
        client.complete("park me", max_tokens=6)
    assert info.value.code == "parked"
    assert client.unpark()["parked"]["target"] is False
    assert client.complete("park me", max_tokens=6, ignore_eos=True).ids == before.ids


def test_requests_in_flight_together_are_routed_by_id(client):
    prompts = ["alpha", "beta beta", "gamma gamma gamma"]
    expected = [client.complete(p, max_tokens=8, ignore_eos=True).ids for p in prompts]
    streams = [client.generate(p, max_tokens=8, ignore_eos=True) for p in prompts]  # all sent now
    got = {}
    for index in reversed(range(len(prompts))):  # read them in the opposite order
        got[index] = [t for e in streams[index] if e["event"] == "token" for t in e["ids"]]
    assert [got[i] for i in range(len(prompts))] == expected


def _wait_idle(client: Client, timeout_s: float = HANG_GUARD_S) -> None:
    """Until status shows no running request (the engine clears it just after the terminal
    event, so right after a cancel it may still be set for a moment)."""
    deadline = time.monotonic() + timeout_s
    while client.status()["running"] is not None:
        assert time.monotonic() < deadline, "the daemon is still running a cancelled request"
        time.sleep(0.02)


def test_cancel_a_running_generation(client):
    stream = client.generate("cancel me", max_tokens=4000, ignore_eos=True)
    first = next(stream)
    assert first["event"] == "token"
    terminal = stream.cancel(wait_s=HANG_GUARD_S)
    assert terminal is not None and terminal["event"] == "error" and terminal["code"] == "cancelled"
    _wait_idle(client)
    assert client.complete("after", max_tokens=3, ignore_eos=True).n_gen == 3


def test_cancel_by_id_from_the_client(client):
    stream = client.generate("cancel me too", max_tokens=4000, ignore_eos=True)
    next(stream)
    assert client.cancel(stream.id) == {"cancelled": True}
    with pytest.raises(DaemonError) as info:
        for _ in stream:
            pass
    assert info.value.code == "cancelled"
    assert client.cancel("no-such-request") == {"cancelled": False}


def test_leaving_a_stream_early_cancels_it(client):
    with client.generate("stop early", max_tokens=4000, ignore_eos=True) as stream:
        next(stream)
    _wait_idle(client)
    assert client.complete("next", max_tokens=3, ignore_eos=True).n_gen == 3


def test_spawn_reports_a_daemon_that_cannot_start(tmp_path):
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"this is not a GGUF file")
    # "exited ... before it was ready": noticed when the process ended, not after the 60 s ready
    # timeout (that one says "was not ready after 60 s"), so no clock is needed to tell them apart.
    with pytest.raises(DaemonStartError, match="exited with status 1 before it was ready"):
        LocalDaemon.start(DaemonOptions(model=str(bad), ready_timeout_s=60))


def test_a_dead_daemon_is_noticed(tiny_model):
    running = LocalDaemon.start(DaemonOptions(model=str(tiny_model), device="cpu", ready_timeout_s=60))
    client = running.connect(timeout_s=60)
    try:
        assert client.status()["model"] == str(tiny_model)
        running.process.kill()
        running.process.wait(HANG_GUARD_S)
        # DaemonGone, not ClientTimeout: the lost connection (or the dead process) was noticed;
        # the 60 s timeout would have raised ClientTimeout instead.
        with pytest.raises(DaemonGone):
            client.status()
    finally:
        client.close()
        running.stop()


def test_spawn_over_a_free_loopback_port(tiny_model, monkeypatch):
    # Where ipc:// is not usable the daemon binds tcp://127.0.0.1:* and reports the port it got.
    from flashd.clients import spawn

    monkeypatch.setattr(spawn, "_private_address", lambda workdir: "tcp://127.0.0.1:*")
    with LocalDaemon.start(DaemonOptions(model=str(tiny_model), device="cpu", ready_timeout_s=60)) as running:
        assert running.address.startswith("tcp://127.0.0.1:") and not running.address.endswith("*")
        with running.connect(timeout_s=TIMEOUT_S) as client:
            assert client.complete("port", max_tokens=3, ignore_eos=True).n_gen == 3


def test_stop_ends_the_daemon_cleanly(tiny_model):
    running = LocalDaemon.start(DaemonOptions(model=str(tiny_model), device="cpu", ready_timeout_s=60))
    assert running.alive()
    assert running.stop() == 0
    assert not running.alive()


# ----------------------------------------------------------------------------------------------
# A scripted fake daemon (ROUTER)
# ----------------------------------------------------------------------------------------------


class FakeRouter(LoopbackRouter):
    """A ROUTER on a loopback port whose answers are scripted: handler(fields) -> list of events,
    sent back in order (after `delay_s`). Every request received is kept in `received`."""

    def __init__(self, handler):
        self.handler = handler
        super().__init__()

    def _run(self) -> None:
        while not self._stop.is_set():
            if (got := self._poll(20)) is None:
                continue
            identity, fields = got
            for event in self.handler(fields) or ():
                self._send(identity, event)


@pytest.fixture
def fake_router():
    routers: list[FakeRouter] = []

    def make(handler) -> FakeRouter:
        routers.append(FakeRouter(handler))
        return routers[-1]

    yield make
    for router in routers:
        router.close()


def test_timeout_raises_and_cancels(fake_router):
    router = fake_router(lambda fields: [])  # never answers
    with Client(router.address, timeout_s=0.3) as client:
        stream = client.generate("hi", max_tokens=4)
        # The fake never answers: only the client's own 0.3 s timeout (named in the message) ends the wait.
        with pytest.raises(ClientTimeout, match=r"in 0\.3 s; the request was cancelled"):
            next(stream)
        with pytest.raises(ClientTimeout):
            client.status()
    deadline = time.monotonic() + HANG_GUARD_S
    while len(router.received) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    generate, cancel = router.received[0], router.received[1]
    assert generate["cmd"] == "generate" and generate["text"] == "hi"
    assert cancel == {"cmd": "cancel", "id": cancel["id"], "target": generate["id"]}


def test_closing_a_stream_early_sends_a_cancel(fake_router):
    def handler(fields):
        if fields["cmd"] == "generate":
            return [{"id": fields["id"], "event": "token", "ids": [1], "text": "x"}]
        return [{"id": fields["id"], "event": "result", "cancelled": True}]

    router = fake_router(handler)
    with Client(router.address, timeout_s=TIMEOUT_S) as client:
        for event in client.generate("go", max_tokens=100):
            assert event["event"] == "token"
            break  # the generator is dropped here
        assert client.status() == {"cancelled": True}  # the fake answers everything like this
    commands = [(f["cmd"], f.get("target")) for f in router.received]
    assert commands[:2] == [("generate", None), ("cancel", router.received[0]["id"])]


def test_out_of_order_events_reach_their_requests(fake_router):
    pending: list[dict] = []

    def handler(fields):
        # Hold the first generate; answer the second one, then the first, interleaved.
        if fields["cmd"] != "generate":
            return []
        pending.append(fields)
        if len(pending) < 2:
            return []
        a, b = pending
        return [
            {"id": b["id"], "event": "token", "ids": [2], "text": "B"},
            {"id": a["id"], "event": "token", "ids": [1], "text": "A"},
            {"id": b["id"], "event": "done", "reason": "length", "n_prompt": 1, "n_gen": 1, "timings": {}},
            {"id": "someone-else", "event": "token", "ids": [9], "text": "?"},
            {"id": a["id"], "event": "done", "reason": "stop", "n_prompt": 1, "n_gen": 1, "timings": {}},
        ]

    router = fake_router(handler)
    with Client(router.address, timeout_s=TIMEOUT_S) as client:
        first = client.generate("a")
        second = client.generate("b")
        assert [e.get("text") for e in first] == ["A", None]
        assert [e.get("text") for e in second] == ["B", None]
        assert first.done["reason"] == "stop" and second.done["reason"] == "length"


def test_packed_ids_and_unreadable_request_ids(fake_router):
    def handler(fields):
        if fields["cmd"] == "detokenize":
            # ids arrive packed (int32 little-endian); the error answers with no id.
            assert isinstance(fields["ids"], bytes) and len(fields["ids"]) == 12
            return [{"id": None, "event": "error", "code": "bad_request", "message": "bad id"}]
        return [{"id": fields["id"], "event": "result", "ids": [5, 6, 7]}]

    router = fake_router(handler)
    with Client(router.address, timeout_s=TIMEOUT_S) as client:
        assert client.tokenize("x") == [5, 6, 7]
        with pytest.raises(DaemonError, match="bad_request: bad id"):
            client.detokenize([1, 2, 3])


def test_bad_addresses_are_refused():
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        Client("127.0.0.1:5555")
    with pytest.raises(ValueError, match="timeout_s"):
        Client("tcp://127.0.0.1:5555", timeout_s=0)
