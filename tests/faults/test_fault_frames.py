"""Bad input on `flashd serve`'s ZeroMQ socket: bytes that are not one msgpack map, maps the
schema refuses (no or bad `cmd`, unknown commands and fields, wrong types, huge / negative /
non-finite numbers), multipart messages and frames around the size limit. Each gets exactly one
error, to the peer that sent it; afterwards the same peer, and stdin, are served as on a fresh
daemon.
"""
from __future__ import annotations

import msgpack
import pytest

from tests.daemon.daemon_harness import ServeDaemon, ZmqPeer, generated
from tests.faults.fault_io import ASSIGNED, ZMQ_ANY_PORT, frame_error, frames_error

LIMIT = 100_000            # --max-request-bytes: the largest frame the daemon reads


def pack(fields) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


# This module's daemon (its own frame limit) and a peer of it per test: the same two fixtures, with another
# model, limit and context, as tests/daemon/test_serve_zmq.py's frame_daemon/frame_peer -- pytest's way of
# saying "a process for the module, a socket per test", kept beside the tests that use it.
@pytest.fixture(scope="module")
def daemon(fault_model, tmp_path_factory):
    d = ServeDaemon(fault_model, tmp_path_factory.mktemp("frames"), "--zmq", ZMQ_ANY_PORT,
                    "--max-request-bytes", str(LIMIT))
    yield d
    d.kill()


@pytest.fixture
def peer(daemon, zmq_ctx):
    p = ZmqPeer(zmq_ctx, daemon.ready["zmq"], daemon)
    yield p
    p.close()


def _still_served(case, daemon, peer, fresh_probe, where: str) -> None:
    """The peer that sent the bad frames gets a fresh daemon's tokens, and so does stdin."""
    case.sent()
    request = {"cmd": "generate", "id": "after", "text": "The quick brown fox", "max_tokens": 24, "ignore_eos": True}
    events = peer.ask(request)
    case.no_traceback(events, where)
    ids, _, done = generated(events)
    case.check(done["event"] == "done" and ids == fresh_probe["greedy"],
               f"{where}: the peer's generate after the faults: {done}, {ids}")
    case.probe(daemon, fresh_probe, where)


MALFORMED = [
    (b"", "bad_request", ASSIGNED),
    (b"\xc1", "bad_request", ASSIGNED),                        # a byte msgpack never uses
    (b"not msgpack at all", "bad_request", ASSIGNED),
    (pack({"cmd": "status", "id": "x"})[:-3], "bad_request", ASSIGNED),   # truncated
    (pack({"cmd": "status", "id": "x"}) + b"junk", "bad_request", ASSIGNED),
    (b"\x91" * 20_000 + b"\xc0", "bad_request", ASSIGNED),     # nested 20000 deep
    (pack([1, 2]), "bad_request", ASSIGNED),
    (pack(7), "bad_request", ASSIGNED),
    (pack("generate"), "bad_request", ASSIGNED),
    (pack(None), "bad_request", ASSIGNED),
    (pack(msgpack.ExtType(1, b"x")), "bad_request", ASSIGNED),
    (pack({1: 2}), "bad_request", ASSIGNED),
    (pack({b"cmd": b"status"}), "bad_request", ASSIGNED),      # bin keys are not strings
    (pack({"id": "f1"}), "bad_request", "f1"),                  # no cmd
    (pack({"cmd": 5, "id": "f2"}), "bad_request", "f2"),
    (pack({"cmd": None, "id": "f3"}), "bad_request", "f3"),
    (pack({"cmd": "generate", "id": [1], "text": "a"}), "bad_request", None),
    (pack({"cmd": "generate", "id": 1.5, "text": "a"}), "bad_request", None),
    (pack({"cmd": "generate", "id": "", "text": "a"}), "bad_request", None),
    (pack({"cmd": "generate", "id": "f4", "ids": b"\x01\x02\x03"}), "bad_request", "f4"),
    (pack({"cmd": "generate", "id": "f5", "text": "a", "x": msgpack.ExtType(5, b"abc")}), "bad_request", "f5"),
]


def test_malformed_frames(faults, daemon, peer, fresh_probe):
    with faults.case("malformed ZeroMQ frames") as case:
        for frame, code, request_id in MALFORMED:
            frame_error(case, peer, frame, code, request_id, f"frame {frame[:40]!r}")
        frames_error(case, peer, [b"a", b"b"], "bad_request", "two frames in one message")
        frames_error(case, peer, [pack({"cmd": "status", "id": "x"})] * 3, "bad_request", "three frames")
        _still_served(case, daemon, peer, fresh_probe, "malformed ZeroMQ frames")


def _frame_of_exactly(n_bytes: int) -> bytes:
    """A generate whose packed prompt fills a frame of exactly n_bytes (far over the context)."""
    n_ids = (n_bytes - 64) // 4
    for pad in range(64):
        frame = pack({"cmd": "generate", "id": "x" * pad, "ids": b"\x05\x00\x00\x00" * n_ids})
        if len(frame) == n_bytes:
            return frame
    raise AssertionError(f"no frame of exactly {n_bytes} bytes")


def test_frames_around_the_size_limit(faults, daemon, peer, fresh_probe):
    """A frame of LIMIT bytes is read (here: a prompt over the context); one byte more is refused
    before it is decoded (so under an assigned id)."""
    with faults.case("oversized ZeroMQ frames") as case:
        at_limit = _frame_of_exactly(LIMIT)
        frame_error(case, peer, at_limit, "ctx_overflow", msgpack.unpackb(at_limit)["id"], f"{LIMIT} bytes")
        frame_error(case, peer, _frame_of_exactly(LIMIT + 4), "bad_request", ASSIGNED, f"{LIMIT + 4} bytes")
        frame_error(case, peer, b"\x00" * (20 * LIMIT), "bad_request", ASSIGNED, f"{20 * LIMIT} bytes")
        _still_served(case, daemon, peer, fresh_probe, "oversized ZeroMQ frames")


def _generate(**fields) -> dict:
    return {"cmd": "generate", "text": "a", **fields}


BAD_VALUES = [
    _generate(id="b1", max_tokens=-1),
    _generate(id="b2", max_tokens=2**64 - 1),
    _generate(id="b3", max_tokens=-2**63),
    _generate(id="b4", max_tokens=float("nan")),
    _generate(id="b5", max_tokens=1.0),
    _generate(id="b6", max_tokens=True),
    _generate(id="b7", temperature=float("inf")),
    _generate(id="b8", temperature=float("-inf")),
    _generate(id="b9", temperature=float("nan")),
    _generate(id="b10", temperature="0.5"),
    _generate(id="b11", top_p=-0.0),
    _generate(id="b12", seed=-1),
    _generate(id="b13", stop={"a": 1}),
    _generate(id="b14", stop=[None]),
    _generate(id="b15", stream=None),                  # nil only where the default is null
    _generate(id="b16", text=b"\xff\xfe"),             # bytes are not text
    _generate(id="b17", bogus=1),
    _generate(id="b18", logprobs=21),
    {"cmd": "generate", "id": "b19", "ids": [1.5]},
    {"cmd": "generate", "id": "b20", "ids": [True]},
    {"cmd": "generate", "id": "b21", "ids": [2**63]},
    {"cmd": "generate", "id": "b22", "ids": b"\xff\xff\xff\xff"},     # packed -1
    {"cmd": "generate", "id": "b23", "ids": []},
    {"cmd": "score", "id": "b24", "ids": [1]},
    {"cmd": "status", "id": "b25", "verbose": True},
]


def test_wrong_types_and_numbers_in_frames(faults, daemon, peer, fresh_probe):
    with faults.case("ZeroMQ wrong types and numbers") as case:
        for fields in BAD_VALUES:
            frame_error(case, peer, fields, "bad_request", fields["id"], f"{fields}"[:80])
        for verb in ("frobnicate", "", "GENERATE"):
            frame_error(case, peer, {"cmd": verb, "id": f"verb-{verb}"}, "unknown_command", f"verb-{verb}",
                        f"cmd {verb!r}")
        _still_served(case, daemon, peer, fresh_probe, "ZeroMQ wrong types and numbers")
