"""CudaQuantKVCache: a KV cache on the GPU whose K or V is q8_0 / q4_0 (--kv-type; float16 caches are
kv_cache.CudaKVCache's), its moves (speculative commit) and its host copies for prefix reuse.

Storage, one allocation: per layer K then V, each in its type's device layout (native/include/flashd_attention.h):
float16 [n_kv_heads][max_ctx][head_dim], or the codes plane [n_kv_heads][max_ctx][code_bytes] followed by the
float16 scales plane [n_kv_heads][max_ctx][head_dim / 32]. A "row group" is one of those planes: rows of a fixed
byte size at a fixed offset in every layer, which fd_kv_compact_rows moves and the host copies slice. Each K or V
starts on a 256-byte boundary (a q4_0 row of head_dim 64 is 36 bytes: without the padding the next plane could
start 4-byte aligned, and the kernels load codes 8 bytes and float16 rows 16 bytes at a time).

With a KV window (kv_types.py KVTypes.window; flashd_attention.h) each quantized side also holds its window ring
after its planes, at the next 256-byte boundary (fd_kv_window_offset): float16 [n_kv_heads][window_slots][head_dim],
slot s in row s % window_slots, window_slots = kv_types.window_slots(window, spec.max_rows). The commit moves its
rows too (fd_kv_compact_ring); host prefix copies keep only the codes and scales (a reusable prefix ends on a multiple
of the window, so no query after it reads a copy from before it).

A quantized K may carry a key offset per layer (backends/kv_offset.py; set_key_offset): float32 (n_layers, Hkv, d)
in its own device buffer, handed to the K writers (fd_rope_kv_write, fd_attention_decode_rope) as the K plane's
`offset`, a (Hkv, d) view of its layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..base import KVCacheSpec
from ..kv_offset import cache_key_offsets
from ..kv_types import QUANT_BLOCK, row_bytes, window_slots
from .tensor import Device, DeviceTensor

ALIGN = 256                    # bytes: where every layer's K and V start

__all__ = ["CudaQuantKVCache", "KVPlane", "kv_type_of"]


@dataclass(slots=True, frozen=True)
class KVPlane:
    """One layer's quantized K or V as the attention ops see it: shape (n_kv_heads, max_ctx, head_dim) in values,
    bytes at ptr in kv_type's device layout (dtype uint8: the C ABI takes it as void*). offset: a K plane's key
    offset, a float32 (n_kv_heads, head_dim) DeviceTensor, or None."""

    ptr: int
    shape: tuple[int, int, int]
    kv_type: str
    owner: object = None
    offset: DeviceTensor | None = None
    window: int = 0                 # the KV window (0: none) and its ring's rows per KV head
    window_slots: int = 0
    dtype = np.dtype(np.uint8)


def kv_type_of(cache) -> str:
    """The row format of one layer's K or V (a float16 DeviceTensor, or a KVPlane)."""
    return getattr(cache, "kv_type", "f16")


class CudaQuantKVCache:
    def __init__(self, device: Device, spec: KVCacheSpec):
        self.spec, self.device = spec, device
        rows = spec.n_kv_heads * spec.max_ctx
        self.window = spec.kv_types.window
        self.window_slots = window_slots(self.window, spec.max_rows)
        self.ring_bytes = -(-spec.n_kv_heads * self.window_slots * 2 * spec.head_dim // ALIGN) * ALIGN
        plane_bytes = [-(-rows * row_bytes(t, spec.head_dim) // ALIGN) * ALIGN for t in (spec.kv_types.k, spec.kv_types.v)]
        self.side_bytes = [plane_bytes[side] + (self.ring_bytes if spec.kv_types.windowed(name) else 0)
                           for side, name in enumerate("kv")]
        # the offset in a layer of each windowed side's ring: after the side's planes
        self.rings = [(0 if side == 0 else self.side_bytes[0]) + plane_bytes[side]
                      for side, name in enumerate("kv") if spec.kv_types.windowed(name)]
        self.layer_bytes = sum(self.side_bytes)
        self.storage = device.empty((spec.n_layers * self.layer_bytes,), np.uint8)
        # (offset in a layer, bytes per row) of every row group, K's then V's
        self.groups: list[tuple[int, int]] = []
        for side, kind in enumerate((spec.kv_types.k, spec.kv_types.v)):
            base = 0 if side == 0 else self.side_bytes[0]
            if kind == "f16":
                self.groups.append((base, 2 * spec.head_dim))
            else:
                codes = row_bytes(kind, spec.head_dim) - 2 * (spec.head_dim // QUANT_BLOCK)
                self.groups += [(base, codes), (base + rows * codes, 2 * (spec.head_dim // QUANT_BLOCK))]
        self.k_offset: DeviceTensor | None = None      # (n_layers, Hkv, d) float32 (set_key_offset)

    def set_key_offset(self, offsets) -> None:
        """Every layer's key offset, (n_layers, Hkv, d) float32 (kv_offset.model_key_offsets), or None: uploaded
        once; only a quantized (rotated) K keeps one. Set it before anything is written or captured."""
        kept = cache_key_offsets(self.spec, offsets)
        self.k_offset = None if kept is None else self.device.upload(kept)

    def _layer_offset(self, i: int) -> DeviceTensor | None:
        if self.k_offset is None:
            return None
        spec = self.spec
        step = spec.n_kv_heads * spec.head_dim * 4
        return DeviceTensor(self.k_offset.ptr + i * step, (spec.n_kv_heads, spec.head_dim), np.dtype(np.float32),
                            self.k_offset.owner)

    @property
    def n_bytes(self) -> int:
        return self.storage.nbytes

    def layer(self, i: int):
        spec, base = self.spec, self.storage.ptr + i * self.layer_bytes
        shape = (spec.n_kv_heads, spec.max_ctx, spec.head_dim)
        out = []
        for side, kind in enumerate((spec.kv_types.k, spec.kv_types.v)):
            ptr = base + (0 if side == 0 else self.side_bytes[0])
            out.append(DeviceTensor(ptr, shape, np.dtype(np.float16), self.storage.owner) if kind == "f16"
                       else KVPlane(ptr, shape, kind, self.storage.owner, self._layer_offset(i) if side == 0 else None,
                                    self.window, self.window_slots))
        return tuple(out)

    def compact(self, src_offsets: DeviceTensor, n_past: DeviceTensor, n_keep: int) -> None:
        """Ops.kv_compact's moves on the device (offsets and n_past in device memory, as a captured graph
        replays them): one fd_kv_compact_rows per row group, over every layer."""
        dev, spec = self.device, self.spec
        for offset, rb in self.groups:
            dev.native.check(dev.lib.fd_kv_compact_rows(dev.ffi.cast("void*", self.storage.ptr + offset),
                                                        self.layer_bytes, spec.n_layers, spec.n_kv_heads,
                                                        spec.max_ctx, rb, dev.p(src_offsets), dev.p(n_past), n_keep,
                                                        dev.stream), "fd_kv_compact_rows")
        for offset in self.rings:
            dev.native.check(dev.lib.fd_kv_compact_ring(dev.ffi.cast("void*", self.storage.ptr + offset),
                                                        self.layer_bytes, spec.n_layers, spec.n_kv_heads,
                                                        self.window_slots, 2 * spec.head_dim, dev.p(src_offsets),
                                                        dev.p(n_past), n_keep, dev.stream), "fd_kv_compact_ring")

    def _pieces(self, n_slots: int):
        """(column, DeviceTensor (n_slots, row bytes) uint8) of slots [0, n_slots) of every (layer, row group, KV
        head): contiguous on the device; column is where its rows go in a host copy's (n_slots, bytes per slot)."""
        spec, col = self.spec, 0
        for layer in range(spec.n_layers):
            for offset, rb in self.groups:
                for head in range(spec.n_kv_heads):
                    ptr = self.storage.ptr + layer * self.layer_bytes + offset + head * spec.max_ctx * rb
                    yield col, DeviceTensor(ptr, (n_slots, rb), np.dtype(np.uint8), self.storage.owner)
                    col += rb

    def save_prefix(self, n_slots: int) -> np.ndarray:
        """A host copy of slots [0, n_slots), every layer, K and V: uint8 (n_slots, bytes per slot), the stored
        bytes (no re-rounding)."""
        per_slot = self.spec.n_layers * self.spec.n_kv_heads * sum(rb for _, rb in self.groups)
        out = np.empty((n_slots, per_slot), np.uint8)
        for col, rows in self._pieces(n_slots):
            out[:, col:col + rows.shape[1]] = self.device.download(rows)
        return out

    def load_prefix(self, saved: np.ndarray, n_slots: int) -> None:
        """Slots [0, n_slots) <- the first n_slots of a save_prefix copy."""
        for col, rows in self._pieces(n_slots):
            self.device.upload(np.ascontiguousarray(saved[:n_slots, col:col + rows.shape[1]]), out=rows)
