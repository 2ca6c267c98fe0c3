"""A GGUF model file opened read-only with memory mapping.

The header is parsed in bulk (gguf_header.py: ~0.3 s for a 151936-token vocabulary where
gguf.GGUFReader takes ~10 s); the rest of flashd gets typed metadata lookup and tensors as raw
quantized blocks (`TensorInfo.blocks`, a uint8 memmap view, row-major -- the same arrays
GGUFReader's `tensor.data` gives), plus a clear `ModelLoadError` for anything flashd cannot run.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES

from .gguf_header import GGUFHeaderError, TensorRecord, read_gguf_header

__all__ = ["GGUFFile", "TensorInfo", "ModelLoadError", "SUPPORTED_WEIGHT_TYPES"]

Q = GGMLQuantizationType

# Weight formats every backend must run (README: the formats table). A file with any other tensor type
# fails to load with a message naming the tensor and its type.
SUPPORTED_WEIGHT_TYPES: frozenset[GGMLQuantizationType] = frozenset({
    Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K,
})


class ModelLoadError(Exception):
    """The file cannot be served: unreadable, unsupported architecture/format, missing tensor."""


class ModelUnsupported(ModelLoadError):
    """This backend has no kernels for the model (another backend may run it: --device auto falls back to the CPU)."""


@dataclass(slots=True, frozen=True)
class TensorInfo:
    """One tensor as stored. `shape` is numpy order: a weight matrix is (out_features, in_features)."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    blocks: np.ndarray  # uint8 (rows, bytes_per_row) for block formats, or the typed array for F32/F16/BF16

    @property
    def n_bytes(self) -> int:
        return int(self.blocks.nbytes)

    @property
    def block_size(self) -> int:
        """Number of weights per quantization block (1 for plain float types)."""
        return GGML_QUANT_SIZES[self.qtype][0]

    @property
    def type_size_bytes(self) -> int:
        """Bytes per block."""
        return GGML_QUANT_SIZES[self.qtype][1]


class GGUFFile:
    """An open GGUF file: `metadata(key)`, `tensor(name)`, `names`, `metadata_dict`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(f"{self.path}: no such model file")
        try:
            header = read_gguf_header(self.path)
        except (GGUFHeaderError, OSError) as exc:
            raise ModelLoadError(f"{self.path}: not a readable GGUF file ({exc})") from exc
        self.metadata_dict = header.metadata      # every key: str, int, float, bool, list[str], numpy arrays
        self._records = {t.name: t for t in header.tensors}
        self._data = np.memmap(self.path, mode="r") if header.tensors else None
        self._data_offset = header.data_offset
        for t in header.tensors:                   # every tensor inside the file: a bad offset fails here
            try:
                qtype = GGMLQuantizationType(t.ggml_type)
            except ValueError:
                continue                            # reported by tensor() if the model uses it
            end = header.data_offset + t.offset + _n_bytes(t, qtype)
            if end > header.file_size:
                raise ModelLoadError(f"{self.path}: not a readable GGUF file (tensor {t.name!r} runs past the end "
                                     f"of the file: truncated?)")

    @property
    def arch(self) -> str:
        return str(self.metadata("general.architecture"))

    @property
    def names(self) -> list[str]:
        return list(self._records)

    def has(self, key: str) -> bool:
        return key in self.metadata_dict

    def metadata(self, key: str, default=...):
        """The value of a metadata key (str, int, float, bool or list); `default` if absent."""
        if key not in self.metadata_dict:
            if default is ...:
                raise ModelLoadError(f"{self.path.name}: metadata key {key!r} is missing")
            return default
        value = self.metadata_dict[key]
        return value.tolist() if isinstance(value, np.ndarray) else value

    def has_tensor(self, name: str) -> bool:
        return name in self._records

    def tensor(self, name: str) -> TensorInfo:
        t = self._records.get(name)
        if t is None:
            raise ModelLoadError(f"{self.path.name}: tensor {name!r} is missing")
        try:
            qtype = GGMLQuantizationType(t.ggml_type)
        except ValueError:
            qtype = None
        if qtype not in SUPPORTED_WEIGHT_TYPES:
            shown = qtype.name if qtype is not None else f"type {t.ggml_type}"
            raise ModelLoadError(
                f"{self.path.name}: tensor {name!r} has weight format {shown}, which flashd does "
                f"not support (supported: {', '.join(sorted(q.name for q in SUPPORTED_WEIGHT_TYPES))})")
        shape = tuple(reversed(t.dims))            # gguf lists ne[0] (columns) first
        start = self._data_offset + t.offset
        raw = self._data[start:start + _n_bytes(t, qtype)]
        if qtype == Q.F32:
            blocks = raw.view(np.float32).reshape(shape)
        elif qtype == Q.F16:
            blocks = raw.view(np.float16).reshape(shape)
        else:                                      # block formats and BF16: bytes per row
            block, size = GGML_QUANT_SIZES[qtype]
            if shape[-1] % block:
                raise ModelLoadError(f"{self.path.name}: tensor {name!r} has {shape[-1]} columns, not a multiple of "
                                     f"{qtype.name}'s block of {block}")
            blocks = raw.reshape(*shape[:-1], shape[-1] // block * size)
        return TensorInfo(name=name, qtype=qtype, shape=shape, blocks=blocks)


def _n_bytes(t: TensorRecord, qtype: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return int(np.prod(t.dims, dtype=np.int64)) * size // block
