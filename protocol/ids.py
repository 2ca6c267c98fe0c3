"""Token ids as bytes: little-endian int32, no header (the `@path` file format, msgpack packed
ids, and the Lucebox stream), plus IdsFile, the not-yet-read `@path` reference.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass

from .errors import ProtocolError

ID_BYTES = 4  # one int32 per token id
_INT32_CODE = "i"
assert array(_INT32_CODE).itemsize == ID_BYTES, "array('i') must be 32-bit on this platform"
_NATIVE_IS_LITTLE = sys.byteorder == "little"


@dataclass(slots=True, frozen=True)
class IdsFile:
    """`ids=@/tmp/p.bin` in the line dialect: a file of raw little-endian int32 token ids.

    The protocol does no I/O: a request holds an IdsFile until the server reads the file with
    messages.resolve_ids_files.
    """

    path: str

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ProtocolError("bad_request", f"ids: @file needs a non-empty path, got {self.path!r}")


def pack_ids(ids) -> bytes:
    """Token ids (ints in int32 range) -> little-endian int32 bytes (4 bytes per id)."""
    try:
        packed = array(_INT32_CODE, ids)
    except OverflowError as exc:
        raise ValueError(f"token id out of int32 range: {exc}") from None
    except TypeError as exc:
        raise ValueError(f"token ids must be integers: {exc}") from None
    if not _NATIVE_IS_LITTLE:
        packed.byteswap()
    return packed.tobytes()


def unpack_ids(data: bytes | bytearray | memoryview, what: str = "ids") -> list[int]:
    """Little-endian int32 bytes -> token ids (may be negative: callers validate the range).

    `what` names the source in the error (a field name or a file path).
    """
    n_bytes = len(data)
    if n_bytes % ID_BYTES:
        raise ProtocolError(
            "bad_request",
            f"{what}: {n_bytes} bytes is not a whole number of int32 ids (not a multiple of 4)",
        )
    unpacked = array(_INT32_CODE)
    unpacked.frombytes(bytes(data))
    if not _NATIVE_IS_LITTLE:
        unpacked.byteswap()
    return unpacked.tolist()
