"""The ZeroMQ dialect: one msgpack map per frame, each way.

Request frame: {"cmd": VERB, "id": ..., <the line dialect's fields>}; "ids" may be a list of
ints or bytes (packed little-endian int32). Event frames are the JSON events as msgpack maps;
with pack_ids the "ids" list travels as packed int32 bytes (4 bytes per token, no header).
"""

from __future__ import annotations

from typing import Any

import msgpack

from .checks import check_request_id
from .errors import ProtocolError
from .ids import pack_ids, unpack_ids
from .messages import Request, request_from_fields

MAX_FRAME_BYTES: int = 64 * 1024 * 1024


def _id_for_errors(payload: dict, default_id: str) -> str | None:
    try:
        return check_request_id(payload.get("id", default_id))
    except ProtocolError:
        return None


def decode_request(frame: bytes, default_id: str, max_frame_bytes: int = MAX_FRAME_BYTES) -> Request:
    """One request frame -> a Request; raises ProtocolError (bad_request, unknown_command)."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise ProtocolError("bad_request", f"frame must be bytes, got {type(frame).__name__}", default_id)
    n_bytes = len(frame)
    if n_bytes > max_frame_bytes:
        raise ProtocolError(
            "bad_request", f"frame of {n_bytes} bytes exceeds the limit of {max_frame_bytes}", default_id
        )
    try:
        # strict_map_key=False so that a non-string key gets our own clear error below.
        payload = msgpack.unpackb(frame, raw=False, strict_map_key=False, timestamp=0)
    except Exception as exc:  # msgpack raises several unrelated types for garbage input
        detail = str(exc) or type(exc).__name__
        raise ProtocolError("bad_request", f"frame is not valid msgpack: {detail}", default_id) from None
    if not isinstance(payload, dict):
        raise ProtocolError(
            "bad_request", f"frame must be a msgpack map, got {type(payload).__name__}", default_id
        )
    for key in payload:
        if not isinstance(key, str):
            raise ProtocolError(
                "bad_request", f"map keys must be strings, got {key!r:.40}", _id_for_errors(payload, default_id)
            )
    fields = dict(payload)
    request_id = _id_for_errors(fields, default_id)
    if "cmd" not in fields:
        raise ProtocolError("bad_request", 'missing "cmd" (the verb)', request_id)
    verb = fields.pop("cmd")
    if not isinstance(verb, str):
        raise ProtocolError("bad_request", f'"cmd" must be a string, got {type(verb).__name__}', request_id)
    ids = fields.get("ids")
    if isinstance(ids, (bytes, bytearray)):
        try:
            fields["ids"] = unpack_ids(ids, what="ids")
        except ProtocolError as exc:
            raise exc.with_request_id(request_id) from None
    return request_from_fields(verb, fields, default_id)


def _with_packed_ids(event: dict) -> dict:
    ids = event.get("ids")
    if isinstance(ids, list):
        return {**event, "ids": pack_ids(ids)}
    return event


def encode_event(event: dict, *, pack_ids: bool = False) -> bytes:
    """An event -> one msgpack frame; pack_ids sends "ids" as little-endian int32 bytes."""
    return msgpack.packb(_with_packed_ids(event) if pack_ids else event, use_bin_type=True)


def encode_request(request_fields: dict, *, pack_ids: bool = False) -> bytes:
    """Client side: {"cmd": VERB, "id": ..., fields...} -> one frame (not validated here: the
    daemon validates). pack_ids sends an "ids" list as packed int32 bytes.
    """
    if not isinstance(request_fields.get("cmd"), str):
        raise ValueError('request_fields needs a "cmd" string (the verb)')
    return msgpack.packb(_with_packed_ids(request_fields) if pack_ids else request_fields, use_bin_type=True)


def decode_event(frame: bytes) -> dict[str, Any]:
    """Client side: one event frame -> the event dict, packed "ids" unpacked to a list.

    Raises ValueError if the frame is not a msgpack map with an "event" string.
    """
    try:
        event = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:
        raise ValueError(f"event frame is not valid msgpack: {str(exc) or type(exc).__name__}") from None
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        raise ValueError(f"event frame must be a map with an 'event' string, got {event!r:.80}")
    ids = event.get("ids")
    if isinstance(ids, (bytes, bytearray)):
        try:
            event["ids"] = unpack_ids(ids)
        except ProtocolError as exc:
            raise ValueError(exc.message) from None
    return event
