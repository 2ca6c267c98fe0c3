"""The ZeroMQ msgpack dialect: request frames, packed ids, bad frames, event frames."""

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashd.protocol.errors import ProtocolError
from flashd.protocol.events import done_event, error_event, ready_event, result_event, token_event
from flashd.protocol.ids import IdsFile, pack_ids
from flashd.protocol.messages import Generate, Score, request_to_fields, resolve_ids_files, verb_of
from flashd.protocol.wire import (
    MAX_FRAME_BYTES, decode_event, decode_request, encode_event, encode_request,
)


def frame_error(frame, default_id="d0", **kwargs):
    with pytest.raises(ProtocolError) as info:
        decode_request(frame, default_id, **kwargs)
    return info.value


def test_every_verb_round_trips(sample_request):
    # msgpack has no @file: a request that names one is sent with the ids the file holds.
    if isinstance(getattr(sample_request, "ids", None), IdsFile):
        sample_request = resolve_ids_files(sample_request, lambda path: pack_ids([5, 6]))
    fields = {"cmd": verb_of(sample_request), **request_to_fields(sample_request)}
    for pack in (False, True):
        assert decode_request(encode_request(fields, pack_ids=pack), "other") == sample_request


def test_packed_ids_are_little_endian_int32():
    frame = msgpack.packb({"cmd": "score", "id": "s", "ids": b"\x01\x00\x00\x00\x00\x01\x00\x00"})
    assert decode_request(frame, "d0") == Score("s", ids=[1, 256])
    packed = msgpack.unpackb(encode_request({"cmd": "score", "ids": [1, 256]}, pack_ids=True))
    assert packed["ids"] == b"\x01\x00\x00\x00\x00\x01\x00\x00"


def test_fields_and_defaults():
    frame = encode_request({"cmd": "generate", "text": "hi", "temperature": 1, "stop": ["\n"],
                            "stop_ids": [2], "budget": None, "stream": False})
    request = decode_request(frame, "d5")
    assert request == Generate("d5", text="hi", stop=("\n",), stop_ids=(2,), stream=False,
                               sampling=request.sampling)
    assert request.sampling.temperature == 1.0 and request.budget is None
    assert decode_request(encode_request({"cmd": "status", "id": 3}), "d").id == "3"


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 2**31 - 1), min_size=2, max_size=300))
def test_any_id_list_survives_packed_ids(ids):
    request = decode_request(encode_request({"cmd": "score", "id": "s", "ids": ids}, pack_ids=True), "d0")
    assert request.ids == ids
    event = decode_event(encode_event(token_event("s", ids, "t"), pack_ids=True))
    assert event["ids"] == ids


# The same property as test_protocol_lines' arbitrary-lines test, over this codec's input (bytes): one per
# codec test file, each beside the parse cases it generalises.
@settings(max_examples=300, deadline=None)
@given(frame=st.binary(max_size=200))
def test_arbitrary_bytes_only_raise_protocol_errors(frame):
    try:
        decode_request(frame, "d0")
    except ProtocolError as exc:
        assert exc.code in ("bad_request", "unknown_command")


@pytest.mark.parametrize(
    "frame, code, request_id, match",
    [
        (b"\xc1garbage", "bad_request", "d0", "not valid msgpack"),
        (b"", "bad_request", "d0", "not valid msgpack"),
        (b"\x92\x01", "bad_request", "d0", "not valid msgpack"),  # truncated array
        (msgpack.packb({"cmd": "status"}) + b"\x01", "bad_request", "d0", "not valid msgpack"),
        (b"\x81\xa1a\xa4\xff\xfe\xfd\xfc", "bad_request", "d0", "not valid msgpack"),  # bad UTF-8
        (msgpack.packb([1, 2]), "bad_request", "d0", "must be a msgpack map, got list"),
        (msgpack.packb("generate"), "bad_request", "d0", "must be a msgpack map, got str"),
        (msgpack.packb(7), "bad_request", "d0", "must be a msgpack map, got int"),
        (msgpack.packb({1: "x", "id": "a"}), "bad_request", "a", "map keys must be strings"),
        (msgpack.packb({"id": "a"}), "bad_request", "a", 'missing "cmd"'),
        (msgpack.packb({"cmd": 3, "id": "a"}), "bad_request", "a", '"cmd" must be a string'),
        (msgpack.packb({"cmd": "frob", "id": "a"}), "unknown_command", "a", "unknown command 'frob'"),
        (msgpack.packb({"cmd": "generate", "id": "a", "text": "x", "bogus": 1}), "bad_request", "a",
         "bogus: unknown field"),
        (msgpack.packb({"cmd": "generate", "id": "a", "text": "x", "ids": [1]}), "bad_request", "a",
         "not both"),
        (msgpack.packb({"cmd": "generate", "id": "a", "text": "x", "sampling": {"temperature": 1}}),
         "bad_request", "a", "sampling: unknown field"),
        (msgpack.packb({"cmd": "generate", "id": "a", "text": b"x"}), "bad_request", "a",
         "text: expected a string, got bytes"),
        (msgpack.packb({"cmd": "generate", "id": "a", "text": "x", "top_p": 2.0}), "bad_request", "a",
         "top_p: must be <= 1"),
        (msgpack.packb({"cmd": "generate", "id": "a", "text": "x", "max_tokens": "9"}), "bad_request",
         "a", "max_tokens: expected an integer, got str"),
        (msgpack.packb({"cmd": "score", "id": "a", "ids": b"\x01\x00\x00"}), "bad_request", "a",
         "3 bytes is not a whole number of int32 ids"),
        (msgpack.packb({"cmd": "score", "id": "a", "ids": pack_ids([1, -5])}), "bad_request", "a",
         "element 1 is -5"),
        (msgpack.packb({"cmd": "score", "id": "a", "ids": "1,2"}), "bad_request", "a",
         "expected a list of token ids"),
        (msgpack.packb({"cmd": "status", "id": 1.5}), "bad_request", None, "id: expected a string"),
        (msgpack.packb({"cmd": "status", "id": None}), "bad_request", None, "id: expected a string"),
    ],
)
def test_bad_frames(frame, code, request_id, match):
    error = frame_error(frame)
    assert error.code == code, error
    assert error.request_id == request_id
    assert match in error.message, error.message


def test_oversized_and_non_bytes_frames():
    frame = encode_request({"cmd": "generate", "id": "a", "text": "x" * 100})
    error = frame_error(frame, max_frame_bytes=64)
    assert error.code == "bad_request" and f"frame of {len(frame)} bytes exceeds the limit of 64" in error.message
    assert decode_request(frame, "d0", max_frame_bytes=len(frame)).text == "x" * 100
    assert MAX_FRAME_BYTES == 64 * 1024 * 1024
    assert frame_error("status").code == "bad_request"


def test_event_frames_round_trip():
    for event in (
        token_event("a", [198, 2], "\n"),
        done_event("a", "stop", 5, 2, {"decode_ms": 1.5}, {"steps": 1, "accepted_per_step": 2.0}),
        result_event("t", ids=[1, 2], n_in=3),
        error_event(None, "overloaded", "queue full"),
        ready_event(model="m"),
    ):
        assert decode_event(encode_event(event)) == event
        assert decode_event(encode_event(event, pack_ids=True)) == event
    packed = msgpack.unpackb(encode_event(token_event("a", [1], "x"), pack_ids=True))
    assert packed["ids"] == b"\x01\x00\x00\x00"


def test_decode_event_rejects_garbage():
    for frame in (b"\xc1", msgpack.packb([1]), msgpack.packb({"id": "a"}),
                  msgpack.packb({"event": "token", "ids": b"\x01"})):
        with pytest.raises(ValueError):
            decode_event(frame)


def test_encode_request_needs_cmd():
    with pytest.raises(ValueError, match="cmd"):
        encode_request({"id": "a"})
