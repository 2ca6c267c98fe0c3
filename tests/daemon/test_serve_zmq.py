"""`flashd serve --zmq`: DEALER peers talking msgpack to the daemon's ROUTER, next to stdin.

Outputs are compared with the same requests over stdin (or with `reference_outputs`, the probes
on a fresh daemon): equality is exact, the engine does not care which front end asked.
"""
from __future__ import annotations

import signal
import struct
import time

import msgpack
import pytest

from tests.daemon.daemon_harness import (
    LONG_GENERATE_TOKENS, LONG_MAX_CTX, PROBES, ServeDaemon, ZmqPeer, generated,
)

LOOPBACK_ANY_PORT = "tcp://127.0.0.1:*"
HANG_GUARD_S = 60.0   # waits end when their condition holds; this only turns a hang into a failure
# The probes of daemon_harness.PROBES as msgpack fields.
PROBE_FIELDS = {
    "greedy": {"cmd": "generate", "text": "The quick brown fox", "max_tokens": 24, "ignore_eos": True},
    "sampled": {"cmd": "generate", "text": "def fib(n):", "max_tokens": 24, "ignore_eos": True,
                "temperature": 0.9, "top_k": 50, "top_p": 0.95, "seed": 7},
}
assert set(PROBE_FIELDS) == set(PROBES)


def zmq_probe(peer: ZmqPeer, tag: str = "p") -> dict[str, list[int]]:
    out = {}
    for name, fields in PROBE_FIELDS.items():
        ids, _, done = generated(peer.ask({**fields, "id": f"{tag}-{name}"}))
        assert done["event"] == "done", done
        out[name] = ids
    return out


def long_generate(peer: ZmqPeer, request_id: str, text: str = "count") -> dict:
    peer.send({"cmd": "generate", "id": request_id, "text": text, "max_tokens": LONG_GENERATE_TOKENS,
               "ignore_eos": True})
    first = peer.first_event_for(request_id)
    assert first["event"] == "token", first
    return first


def wait_idle(peer: ZmqPeer, timeout: float = HANG_GUARD_S) -> dict:
    deadline = time.monotonic() + timeout
    n = 0
    while True:
        n += 1
        status = peer.ask({"cmd": "status", "id": f"idle-{n}"})[-1]
        if status["running"] is None and status["queued"] == 0:
            return status
        assert time.monotonic() < deadline, f"daemon still busy after {timeout} s: {status}"
        time.sleep(0.02)


@pytest.fixture
def zmq_daemon(spawn_serve):
    return spawn_serve("--zmq", LOOPBACK_ANY_PORT, max_ctx=LONG_MAX_CTX)


@pytest.fixture
def peer_factory(zmq_context, zmq_daemon):
    peers = []

    def make() -> ZmqPeer:
        peer = ZmqPeer(zmq_context, zmq_daemon.ready["zmq"], zmq_daemon)
        peers.append(peer)
        return peer

    yield make
    for peer in peers:
        peer.close()


def test_ready_reports_the_bound_endpoint(zmq_daemon):
    endpoint = zmq_daemon.ready["zmq"]
    assert endpoint.startswith("tcp://127.0.0.1:") and int(endpoint.rsplit(":", 1)[1]) > 0


def test_generate_over_zmq_equals_a_fresh_daemon(peer_factory, reference_outputs):
    assert zmq_probe(peer_factory()) == reference_outputs


def test_packed_ids_equal_a_list_of_ids(peer_factory):
    peer = peer_factory()
    prompt = [11, 200, 3, 499, 42]
    listed, _, _ = generated(peer.ask({"cmd": "generate", "id": "l", "ids": prompt, "max_tokens": 10,
                                       "ignore_eos": True}))
    packed_ids = struct.pack(f"<{len(prompt)}i", *prompt)
    packed, _, done = generated(peer.ask({"cmd": "generate", "id": "p", "ids": packed_ids, "max_tokens": 10,
                                          "ignore_eos": True}))
    assert packed == listed and done["n_prompt"] == len(prompt)


def test_two_clients_at_once_with_clashing_ids(peer_factory, zmq_daemon):
    """Both peers use id "a" at the same time: each gets exactly its own request's events."""
    first, second = peer_factory(), peer_factory()
    request = {"cmd": "generate", "id": "a", "max_tokens": 30, "ignore_eos": True}
    first.send({**request, "text": "alpha beta gamma"})
    second.send({**request, "text": "one two three four"})
    got_first, _, done_first = generated(first.events_for("a"))
    got_second, _, done_second = generated(second.events_for("a"))
    assert done_first["event"] == done_second["event"] == "done"
    # The same requests over stdin, one at a time.
    want_first, _, _ = generated(zmq_daemon.ask('generate id=s1 text="alpha beta gamma" max_tokens=30 '
                                                'ignore_eos=true', "s1"))
    want_second, _, _ = generated(zmq_daemon.ask('generate id=s2 text="one two three four" max_tokens=30 '
                                                 'ignore_eos=true', "s2"))
    assert got_first == want_first and got_second == want_second
    assert want_first != want_second                     # else the test could not tell them apart
    for peer in (first, second):                         # nothing else arrived for either peer
        assert not peer.socket.poll(100)


def test_cancel_reaches_only_the_senders_request(peer_factory, reference_outputs):
    owner, other = peer_factory(), peer_factory()
    long_generate(owner, "x")
    assert other.ask({"cmd": "cancel", "id": "c", "target": "x"}) == [
        {"id": "c", "event": "result", "cancelled": False}]
    assert owner.first_event_for("x")["event"] == "token"            # still running
    assert owner.ask({"cmd": "cancel", "id": "c", "target": "x"})[-1]["cancelled"] is True
    events = owner.events_for("x")
    assert events[-1]["event"] == "error" and events[-1]["code"] == "cancelled"
    assert zmq_probe(other) == reference_outputs


def test_stdin_cancel_does_not_touch_zmq_requests(peer_factory, zmq_daemon):
    peer = peer_factory()
    long_generate(peer, "shared")
    assert zmq_daemon.ask("cancel id=c target=shared", "c")[-1]["cancelled"] is False
    assert peer.ask({"cmd": "cancel", "id": "c", "target": "shared"})[-1]["cancelled"] is True
    assert peer.events_for("shared")[-1]["code"] == "cancelled"


def test_a_client_that_disconnects_has_its_request_cancelled(peer_factory, zmq_daemon, reference_outputs):
    leaver, watcher = peer_factory(), peer_factory()
    long_generate(leaver, "abandoned")
    leaver.close()
    status = wait_idle(watcher)
    assert status["served"] >= 1
    # The daemon's own account, not a clock: it found the peer gone while the request was still
    # pending (LONG_GENERATE_TOKENS, thousands of tokens) and cancelled it.
    assert "went away: cancelled 1 request(s)" in zmq_daemon.stderr_tail(100_000), zmq_daemon.stderr_tail()
    assert zmq_probe(watcher) == reference_outputs


def test_queue_overflow_over_zmq(spawn_serve, zmq_context, reference_outputs):
    daemon = spawn_serve("--zmq", LOOPBACK_ANY_PORT, "--max-queue", "1", max_ctx=LONG_MAX_CTX)
    busy, crowd = (ZmqPeer(zmq_context, daemon.ready["zmq"], daemon) for _ in range(2))
    long_generate(busy, "long")
    for i in range(4):
        crowd.send({"cmd": "generate", "id": f"q{i}", "text": "hi", "max_tokens": 2, "ignore_eos": True})
    for i in range(1, 4):
        event = crowd.first_event_for(f"q{i}")
        assert event["event"] == "error" and event["code"] == "overloaded", event
    assert busy.ask({"cmd": "cancel", "id": "c", "target": "long"})[-1]["cancelled"] is True
    assert crowd.events_for("q0")[-1]["event"] == "done"
    assert zmq_probe(crowd) == reference_outputs


def test_stdin_and_zmq_are_served_together(peer_factory, zmq_daemon):
    peer = peer_factory()
    zmq_daemon.send('generate id=from-stdin text="same prompt" max_tokens=12 ignore_eos=true')
    peer.send({"cmd": "generate", "id": "from-zmq", "text": "same prompt", "max_tokens": 12, "ignore_eos": True})
    over_stdin, _, _ = generated(zmq_daemon.events_for("from-stdin"))
    over_zmq, _, _ = generated(peer.events_for("from-zmq"))
    assert over_stdin == over_zmq and len(over_zmq) == 12


def test_end_of_stdin_keeps_serving_zmq(peer_factory, zmq_daemon, reference_outputs):
    zmq_daemon.close_stdin()
    peer = peer_factory()
    deadline = time.monotonic() + HANG_GUARD_S
    while "stdin closed: still serving ZeroMQ" not in zmq_daemon.stderr_tail():
        assert time.monotonic() < deadline and zmq_daemon.proc.poll() is None, zmq_daemon.stderr_tail()
        time.sleep(0.02)
    assert zmq_probe(peer) == reference_outputs
    assert peer.ask({"cmd": "quit", "id": "q"}) == [{"id": "q", "event": "result", "quitting": True}]
    assert zmq_daemon.wait() == 0


def test_quit_over_zmq_cancels_what_is_queued_behind_it(peer_factory, zmq_daemon):
    runner, quitter = peer_factory(), peer_factory()
    long_generate(runner, "long")
    quitter.send({"cmd": "quit", "id": "q"})
    deadline = time.monotonic() + HANG_GUARD_S   # the quit must be queued first: FIFO across peers
    while runner.ask({"cmd": "status", "id": "s"})[-1]["queued"] < 1:
        assert time.monotonic() < deadline, "the quit never reached the queue"
        time.sleep(0.01)
    runner.send({"cmd": "generate", "id": "waiting", "text": "hi", "max_tokens": 3})
    assert runner.ask({"cmd": "cancel", "id": "c", "target": "long"})[-1]["cancelled"] is True
    assert runner.events_for("long")[-1]["code"] == "cancelled"
    assert quitter.events_for("q") == [{"id": "q", "event": "result", "quitting": True}]
    assert runner.events_for("waiting")[-1]["code"] == "cancelled"
    assert zmq_daemon.wait() == 0


def test_sigterm_delivers_the_cancellation_to_zmq_clients(peer_factory, zmq_daemon):
    peer = peer_factory()
    long_generate(peer, "long")
    zmq_daemon.signal(signal.SIGTERM)
    assert peer.events_for("long")[-1]["code"] == "cancelled"
    assert zmq_daemon.wait() == 0


def test_ipc_endpoint_and_no_stdin(spawn_serve, zmq_context, tmp_path, reference_outputs):
    address = f"ipc://{tmp_path}/flashd.sock"
    daemon = spawn_serve("--zmq", address, "--no-stdin")
    assert daemon.ready["zmq"] == address and daemon.ready["stdin"] is False
    daemon.send('generate id=ignored text="hi" max_tokens=2')   # nobody reads stdin
    peer = ZmqPeer(zmq_context, address, daemon)
    assert zmq_probe(peer) == reference_outputs
    assert peer.ask({"cmd": "quit", "id": "q"})[-1]["quitting"] is True
    assert daemon.wait() == 0
    assert daemon.out.at_eof(10.0) == b""                 # the stdin line was never answered


# ------------------------------------------------------------------------------- bad frames

@pytest.fixture(scope="module")
def frame_daemon(synthetic_model, tmp_path_factory):
    daemon = ServeDaemon(synthetic_model, tmp_path_factory.mktemp("bad-frames"), "--zmq", LOOPBACK_ANY_PORT,
                         "--max-request-bytes", "4096", max_ctx=256)
    yield daemon
    daemon.kill()


@pytest.fixture
def frame_peer(zmq_context, frame_daemon):
    peer = ZmqPeer(zmq_context, frame_daemon.ready["zmq"], frame_daemon)
    yield peer
    peer.close()


def _pack(value) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


# (name, frames, expected code, expected id: None for "an assigned id", "null" for null)
BAD_FRAMES = [
    ("garbage", [b"\xc1\xc1 not msgpack"], "bad_request", None),
    ("truncated", [_pack({"cmd": "generate", "id": "t", "text": "hello"})[:-3]], "bad_request", None),
    ("not-a-map", [_pack([1, 2, 3])], "bad_request", None),
    ("empty-frame", [b""], "bad_request", None),
    ("missing-cmd", [_pack({"id": "mc", "text": "hi"})], "bad_request", "mc"),
    ("cmd-not-a-string", [_pack({"cmd": 7, "id": "cs"})], "bad_request", "cs"),
    ("unknown-cmd", [_pack({"cmd": "frobnicate", "id": "uc"})], "unknown_command", "uc"),
    ("non-string-key", [_pack({"cmd": "status", 5: "x"})], "bad_request", None),
    ("unknown-field", [_pack({"cmd": "generate", "id": "uf", "text": "hi", "frob": 1})], "bad_request", "uf"),
    ("wrong-type", [_pack({"cmd": "generate", "id": "wt", "text": "hi", "max_tokens": "many"})], "bad_request", "wt"),
    ("bool-for-int", [_pack({"cmd": "generate", "id": "bi", "text": "hi", "max_tokens": True})], "bad_request", "bi"),
    ("out-of-range", [_pack({"cmd": "generate", "id": "or", "text": "hi", "top_p": 0.0})], "bad_request", "or"),
    ("bad-id", [_pack({"cmd": "status", "id": [1]})], "bad_request", "null"),
    ("ids-out-of-vocab", [_pack({"cmd": "generate", "id": "ov", "ids": [1, 9999]})], "bad_request", "ov"),
    ("packed-ids-odd-bytes", [_pack({"cmd": "generate", "id": "pb", "ids": b"\x01\x00\x00"})], "bad_request", "pb"),
    ("ids-file-over-zmq", [_pack({"cmd": "generate", "id": "if", "ids": "@/etc/passwd"})], "bad_request", "if"),
    ("ctx-overflow", [_pack({"cmd": "generate", "id": "co", "text": "hi", "max_tokens": 1000})], "ctx_overflow", "co"),
    ("oversized", [_pack({"cmd": "generate", "id": "big", "text": "x" * 5000})], "bad_request", None),
    ("two-frames", [_pack({"cmd": "status", "id": "2f"}), b"extra"], "bad_request", None),
    ("compress", [_pack({"cmd": "compress", "id": "cp", "ids": [1, 2, 3]})], "not_loaded", "cp"),
    ("unknown-drafter", [_pack({"cmd": "generate", "id": "dd", "text": "hi", "spec": "ddtree", "draft": "nope"})],
     "not_loaded", "dd"),
]


@pytest.mark.parametrize("name,frames,code,request_id", BAD_FRAMES, ids=[b[0] for b in BAD_FRAMES])
def test_bad_frame_is_an_error_and_the_daemon_stays_fresh(frame_peer, reference_outputs, name, frames, code,
                                                          request_id):
    frame_peer.send_frames(frames)
    event = frame_peer.next_event()
    assert event["event"] == "error", event
    assert event["code"] == code, event
    if request_id == "null":
        assert event["id"] is None
    elif request_id is not None:
        assert event["id"] == request_id
    else:
        assert isinstance(event["id"], str) and event["id"]
    if name == "oversized":
        assert "4096" in event["message"]
    assert zmq_probe(frame_peer) == reference_outputs
