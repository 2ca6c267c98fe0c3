"""The header of a GGUF file (v2/v3, little-endian), parsed in bulk: key/value metadata and tensor infos.

gguf-py's GGUFReader builds a numpy view per field part -- for a 151936-token vocabulary and its merges,
~900K views and ~10 s, most of a daemon's start-up (bench/NOTES.md, "Start-up"). This parser walks the
same bytes with struct and slices of one mmap: ~0.3 s for the same file. Layout (gguf-py's reader and
writer are the definition):

  magic "GGUF", u32 version, u64 n_tensors, u64 n_kv
  n_kv x (string key, u32 value type, value)          string = u64 length + UTF-8 bytes
  n_tensors x (string name, u32 n_dims, u64 dims[n_dims] (ne[0] first), u32 ggml type, u64 offset)
  padding to `general.alignment` (default 32), then the tensor data; offsets are relative to it

Values: scalars as Python int/float/bool, strings as str, arrays of strings as lists of str, arrays of
numbers as numpy arrays (tokenizer scores and types are large).
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["GGUFHeader", "TensorRecord", "read_gguf_header", "read_gguf_metadata", "GGUFHeaderError"]

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
# GGUF value type -> struct format of one little-endian scalar (8 = string, 9 = array).
SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                  10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class GGUFHeaderError(ValueError):
    """Not a GGUF file, or a truncated / corrupt header."""


@dataclass(slots=True, frozen=True)
class TensorRecord:
    name: str
    dims: tuple[int, ...]     # ne[0] (columns) first, as stored
    ggml_type: int
    offset: int               # bytes from the start of the data section


@dataclass(slots=True, frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, object]
    tensors: list[TensorRecord]
    data_offset: int          # file offset of the data section
    file_size: int


class _Cursor:
    """Reads little-endian values from a buffer, with bounds checks that name what ran past the end."""

    __slots__ = ("buf", "pos", "size")

    def __init__(self, buf, pos: int = 0):
        self.buf, self.pos, self.size = buf, pos, len(buf)

    def unpack(self, fmt: str):
        n = struct.calcsize(fmt)
        if self.pos + n > self.size:
            raise GGUFHeaderError(f"truncated or corrupt GGUF header: it runs past the end of the file at offset {self.pos}")
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return values

    def string(self) -> str:
        (n_bytes,) = self.unpack("<Q")
        end = self.pos + n_bytes
        if end > self.size:
            raise GGUFHeaderError(f"truncated or corrupt GGUF header: a string of {n_bytes} bytes at offset {self.pos} "
                                  f"runs past the end of the file")
        try:
            text = self.buf[self.pos:end].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFHeaderError(f"truncated or corrupt GGUF header: a string at offset {self.pos} is not UTF-8 "
                                  f"({exc.reason})") from None
        self.pos = end
        return text

    def value(self, vtype: int):
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            item_type, n_items = self.unpack("<IQ")
            if item_type == STRING:
                return [self.string() for _ in range(n_items)]
            fmt = SCALAR_FORMATS.get(item_type)
            if fmt is None:                    # arrays of arrays: in the spec, used by no model key we read
                raise GGUFHeaderError(f"unsupported GGUF array item type {item_type}")
            dtype = np.dtype(fmt.replace("?", "u1"))
            n_bytes = n_items * dtype.itemsize
            if self.pos + n_bytes > self.size:
                raise GGUFHeaderError(f"truncated or corrupt GGUF header: an array of {n_items} items at offset "
                                      f"{self.pos} runs past the end of the file")
            array = np.frombuffer(self.buf[self.pos:self.pos + n_bytes], dtype=dtype)
            self.pos += n_bytes
            return array.astype(bool) if fmt == "<?" else array
        fmt = SCALAR_FORMATS.get(vtype)
        if fmt is None:
            raise GGUFHeaderError(f"unknown GGUF value type {vtype} at offset {self.pos - 4}")
        return self.unpack(fmt)[0]


def _parse(buf, prefix: str | None, tensors: bool) -> tuple[int, dict, list[TensorRecord], int]:
    if bytes(buf[:4]) != MAGIC:
        raise GGUFHeaderError(f"not a GGUF file (magic {bytes(buf[:4])!r})")
    cur = _Cursor(buf, 4)
    (version,) = cur.unpack("<I")
    if version not in (2, 3):
        hint = " (a big-endian file?)" if version > 0xFFFF else ""
        raise GGUFHeaderError(f"unsupported GGUF version {version}{hint}")
    n_tensors, n_kv = cur.unpack("<QQ")
    metadata: dict[str, object] = {}
    for _ in range(n_kv):
        key = cur.string()
        (vtype,) = cur.unpack("<I")
        value = cur.value(vtype)
        if prefix is None or key.startswith(prefix):
            metadata[key] = value
    records: list[TensorRecord] = []
    if not tensors:
        return version, metadata, records, 0
    seen: set[str] = set()
    for _ in range(n_tensors):
        name = cur.string()
        (n_dims,) = cur.unpack("<I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFHeaderError(f"tensor {name!r} has {n_dims} dimensions")
        dims = cur.unpack(f"<{n_dims}Q")
        ggml_type, offset = cur.unpack("<IQ")
        if name in seen:
            raise GGUFHeaderError(f"tensor {name!r} appears twice")
        seen.add(name)
        records.append(TensorRecord(name, tuple(int(d) for d in dims), int(ggml_type), int(offset)))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT) if prefix is None else DEFAULT_ALIGNMENT
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFHeaderError(f"general.alignment must be a power of two, got {alignment!r}")
    data_offset = -(-cur.pos // alignment) * alignment
    return version, metadata, records, data_offset


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """The whole header: every metadata key and every tensor's record."""
    path = Path(path)
    with open(path, "rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:              # an empty file
            raise GGUFHeaderError(f"not a GGUF file ({exc})") from None
    with mm:
        version, metadata, records, data_offset = _parse(mm, None, True)
        return GGUFHeader(version, metadata, records, data_offset, len(mm))


def read_gguf_metadata(path: str | Path, *, prefix: str = "") -> dict[str, object]:
    """The key/value metadata whose keys start with `prefix` (tensor infos are not read)."""
    path = Path(path)
    with open(path, "rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:
            raise GGUFHeaderError(f"{path}: not a GGUF file ({exc})") from None
    with mm:
        try:
            return _parse(mm, prefix, False)[1]
        except GGUFHeaderError as exc:
            raise GGUFHeaderError(f"{path}: {exc}") from None
