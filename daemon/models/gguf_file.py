"""A GGUF model file opened read-only with memory mapping.

Wraps `gguf.GGUFReader` with the two things the rest of flashd needs: typed metadata lookup and
tensors as raw quantized blocks (`TensorInfo.blocks`, a uint8 memmap view, row-major), plus a
clear `ModelLoadError` for anything flashd cannot run.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.constants import GGML_QUANT_SIZES

__all__ = ["GGUFFile", "TensorInfo", "ModelLoadError", "SUPPORTED_WEIGHT_TYPES"]

Q = GGMLQuantizationType

# Weight formats every backend must run (README: the formats table). A file with any other tensor type
# fails to load with a message naming the tensor and its type.
SUPPORTED_WEIGHT_TYPES: frozenset[GGMLQuantizationType] = frozenset({
    Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K,
})


class ModelLoadError(Exception):
    """The file cannot be served: unreadable, unsupported architecture/format, missing tensor."""


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
    """An open GGUF file: `metadata(key)`, `tensor(name)`, `names`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(f"{self.path}: no such model file")
        try:
            self.reader = GGUFReader(self.path, "r")
        except Exception as exc:  # gguf raises ValueError/struct.error on garbage
            raise ModelLoadError(f"{self.path}: not a readable GGUF file ({exc})") from exc
        self._tensors = {t.name: t for t in self.reader.tensors}

    @property
    def arch(self) -> str:
        return str(self.metadata("general.architecture"))

    @property
    def names(self) -> list[str]:
        return list(self._tensors)

    def has(self, key: str) -> bool:
        return key in self.reader.fields

    def metadata(self, key: str, default=...):
        """The value of a metadata key (str, int, float, bool or list); `default` if absent."""
        field = self.reader.fields.get(key)
        if field is None:
            if default is ...:
                raise ModelLoadError(f"{self.path.name}: metadata key {key!r} is missing")
            return default
        return field.contents()

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor(self, name: str) -> TensorInfo:
        t = self._tensors.get(name)
        if t is None:
            raise ModelLoadError(f"{self.path.name}: tensor {name!r} is missing")
        qtype = GGMLQuantizationType(t.tensor_type)
        if qtype not in SUPPORTED_WEIGHT_TYPES:
            raise ModelLoadError(
                f"{self.path.name}: tensor {name!r} has weight format {qtype.name}, which flashd does "
                f"not support (supported: {', '.join(sorted(q.name for q in SUPPORTED_WEIGHT_TYPES))})")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # gguf lists ne[0] (columns) first
        return TensorInfo(name=name, qtype=qtype, shape=shape, blocks=t.data)
