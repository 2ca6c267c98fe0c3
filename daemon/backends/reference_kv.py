"""The reference backend's KV cache: float32 rows (kv type f16, the oracle's precision) or quantized rows
(q8_0 / q4_0, ggml's block bytes, written with kv_quant.py's encoders and read dequantized). A quantized K holds
keys rotated by kv_rotate.py's Hadamard transform (its `rotated` is True): ReferenceOps rotates q and k before
they meet it, so whoever reads K rows gets rotated ones. Such a K may also carry a key offset per layer
(kv_offset.py; set_key_offset): its `offset` (Hkv, d), which ReferenceOps subtracts from k before the rotation.

`layer(i)` gives (K, V) of one layer, each (max_ctx, Hkv, d) as the ops index it: a float32 array, or a
QuantizedRows whose item assignment encodes and whose slicing decodes, so ReferenceOps' attention is the
same code for every type. Prefix copies, moves and park keep the stored bytes (no re-rounding).

With a window (kv_types.py KVTypes.window) a quantized side is a WindowedRows: besides its stored bytes it keeps
every row's full-precision copy (float32, as the f16 cache is here; `full`), which ReferenceOps.attention reads for
the keys and values in the query's own window block. Moves carry the copies; prefix copies do not need them (a
reusable prefix ends on a multiple of the window).
"""
from __future__ import annotations

import numpy as np

from .base import KVCacheSpec
from .kv_offset import cache_key_offsets
from .kv_quant import decode_rows, encode_rows
from .kv_rotate import rotates_k
from .kv_types import row_bytes

__all__ = ["ReferenceKVCache", "QuantizedRows", "WindowedRows", "is_rotated"]


def is_rotated(rows) -> bool:
    """Whether a layer's K cache (a float32 array or a QuantizedRows) holds Hadamard-rotated keys."""
    return bool(getattr(rows, "rotated", False))


class QuantizedRows:
    """One layer's K or V in a quantized type: bytes (max_ctx, Hkv, row_bytes) uint8, seen as float32
    (max_ctx, Hkv, head_dim). `rows[slots] = x` encodes x; `rows[slots]` decodes (a new float32 array).
    rotated: the rows are keys in the rotated basis (the writer rotates them; this class stores what it is given).
    offset: None or (Hkv, head_dim) float32, the key offset the writer subtracts before rotating (kv_offset.py)."""

    def __init__(self, data: np.ndarray, kv_type: str, head_dim: int, rotated: bool = False, offset=None):
        self.data, self.kv_type, self.head_dim, self.rotated = data, kv_type, head_dim, rotated
        self.offset = offset

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data.shape[0], self.data.shape[1], self.head_dim)

    dtype = np.dtype(np.float32)      # what reading gives

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, slots) -> np.ndarray:
        return decode_rows(self.data[slots], self.kv_type)

    def __setitem__(self, slots, x) -> None:
        self.data[slots] = encode_rows(np.asarray(x, np.float32), self.kv_type)


class WindowedRows(QuantizedRows):
    """A quantized side with a full-precision copy of every row (a window, KVTypes.window): `rows[slots] = x`
    stores x's bytes and x itself; reading gives the stored (quantized) values, `full[slots]` the copies.
    window: the block size U in positions."""

    def __init__(self, data: np.ndarray, kv_type: str, head_dim: int, full: np.ndarray, window: int,
                 rotated: bool = False, offset=None):
        super().__init__(data, kv_type, head_dim, rotated, offset)
        self.full, self.window = full, window

    def __setitem__(self, slots, x) -> None:
        x = np.asarray(x, np.float32)
        super().__setitem__(slots, x)
        self.full[slots] = x


class ReferenceKVCache:
    """K and V for every layer: (n_layers, max_ctx, Hkv, d) float32 for f16, or (n_layers, max_ctx, Hkv,
    row_bytes) uint8 for a quantized type; K and V have their own types (spec.kv_types)."""

    def __init__(self, spec: KVCacheSpec):
        self.spec = spec
        self.k = self._storage(spec.kv_types.k)
        self.v = self._storage(spec.kv_types.v)
        # full-precision copies of a windowed side's rows (n_layers, max_ctx, Hkv, d) float32, or None
        self.k_full, self.v_full = (self._full() if spec.kv_types.windowed(side) else None for side in ("k", "v"))
        self.k_offset: np.ndarray | None = None     # (n_layers, Hkv, d) float32 key offsets (kv_offset.py)

    def set_key_offset(self, offsets) -> None:
        """Every layer's key offset, (n_layers, Hkv, d) float32 (kv_offset.model_key_offsets), or None. Kept only
        for a quantized (rotated) K; set it before anything is written (every key must have the same one)."""
        self.k_offset = cache_key_offsets(self.spec, offsets)

    def _storage(self, kv_type: str) -> np.ndarray:
        s = self.spec
        if kv_type == "f16":
            return np.zeros((s.n_layers, s.max_ctx, s.n_kv_heads, s.head_dim), np.float32)
        return np.zeros((s.n_layers, s.max_ctx, s.n_kv_heads, row_bytes(kv_type, s.head_dim)), np.uint8)

    def _full(self) -> np.ndarray:
        s = self.spec
        return np.zeros((s.n_layers, s.max_ctx, s.n_kv_heads, s.head_dim), np.float32)

    @property
    def n_bytes(self) -> int:
        return sum(a.nbytes for a in (self.k, self.v, self.k_full, self.v_full) if a is not None)

    def _view(self, store: np.ndarray, kv_type: str, i: int, full=None, rotated: bool = False, offset=None):
        if kv_type == "f16":
            return store[i]
        if full is not None:
            return WindowedRows(store[i], kv_type, self.spec.head_dim, full[i], self.spec.kv_types.window, rotated,
                                offset)
        return QuantizedRows(store[i], kv_type, self.spec.head_dim, rotated, offset)

    def layer(self, i: int):
        types = self.spec.kv_types
        offset = None if self.k_offset is None else self.k_offset[i]
        return (self._view(self.k, types.k, i, self.k_full, rotates_k(types.k), offset),
                self._view(self.v, types.v, i, self.v_full))

    def move(self, src_slots, dst_slots) -> None:
        """Copy slots src -> dst in every layer (speculative decoding's commit): the stored bytes (and a window's
        full-precision copies)."""
        for store in (self.k, self.v, self.k_full, self.v_full):
            if store is not None:
                store[:, dst_slots] = store[:, src_slots]

    def save_prefix(self, n_slots: int) -> np.ndarray:
        """A host copy of slots [0, n_slots) of every layer, K and V. Both f16: float32 (2, n_layers,
        n_slots, Hkv, d); otherwise the stored bytes of K then V per (layer, slot, head): uint8 (n_layers,
        n_slots, Hkv, K row bytes + V row bytes)."""
        if not self.spec.kv_types.quantized:
            return np.stack([self.k[:, :n_slots], self.v[:, :n_slots]])
        k = self.k[:, :n_slots].view(np.uint8)
        v = self.v[:, :n_slots].view(np.uint8)
        return np.concatenate([k, v], axis=-1)

    def load_prefix(self, saved: np.ndarray, n_slots: int) -> None:
        """Slots [0, n_slots) <- the first n_slots of a save_prefix copy."""
        if not self.spec.kv_types.quantized:
            self.k[:, :n_slots] = saved[0, :, :n_slots]
            self.v[:, :n_slots] = saved[1, :, :n_slots]
            return
        split = self.k.shape[-1] * self.k.itemsize
        self.k[:, :n_slots] = saved[:, :n_slots, :, :split].view(self.k.dtype)
        self.v[:, :n_slots] = saved[:, :n_slots, :, split:].view(self.v.dtype)
