"""CudaKVCache: the KV cache on the GPU, and its host copies for prefix reuse (prefix_cache.py)."""
from __future__ import annotations

import numpy as np

from ..base import KVCacheSpec
from .tensor import Device, DeviceTensor

__all__ = ["CudaKVCache"]


class CudaKVCache:
    """float16 K and V, per layer [n_kv_heads][max_ctx][head_dim], in one allocation."""

    def __init__(self, device: Device, spec: KVCacheSpec):
        if spec.kv_types.quantized:      # backend.check_kv_types refuses these at load with what is missing
            raise ValueError(f"CudaKVCache stores float16 K/V only, asked for {spec.kv_types}")
        self.spec, self.device = spec, device
        self.layer_elems = spec.n_kv_heads * spec.max_ctx * spec.head_dim
        self.storage = device.empty((2 * spec.n_layers * self.layer_elems,), np.float16)

    @property
    def n_bytes(self) -> int:
        return self.storage.nbytes

    def layer(self, i: int) -> tuple[DeviceTensor, DeviceTensor]:
        base = self.storage.ptr + 2 * i * self.layer_elems * 2
        shape = (self.spec.n_kv_heads, self.spec.max_ctx, self.spec.head_dim)
        return (DeviceTensor(base, shape, np.dtype(np.float16), self.storage.owner),
                DeviceTensor(base + self.layer_elems * 2, shape, np.dtype(np.float16), self.storage.owner))

    def _rows(self, n_slots: int):
        """(index, DeviceTensor (n_slots, head_dim)) of slots [0, n_slots) of every (layer, K|V,
        KV head): the storage is [layer][K|V][KV head][max_ctx][head_dim], so these are the
        contiguous pieces of a prefix; index is its place in a (n_layers, 2, Hkv) host copy."""
        spec = self.spec
        row_bytes = spec.max_ctx * spec.head_dim * 2
        for layer in range(spec.n_layers):
            for kv in range(2):
                for head in range(spec.n_kv_heads):
                    ptr = self.storage.ptr + ((layer * 2 + kv) * spec.n_kv_heads + head) * row_bytes
                    yield (layer, kv, head), DeviceTensor(ptr, (n_slots, spec.head_dim), np.dtype(np.float16),
                                                          self.storage.owner)

    def save_prefix(self, n_slots: int) -> np.ndarray:
        """A host copy of slots [0, n_slots) of every layer, K and V: (n_layers, 2, Hkv, n_slots, d) float16."""
        spec = self.spec
        out = np.empty((spec.n_layers, 2, spec.n_kv_heads, n_slots, spec.head_dim), np.float16)
        for index, rows in self._rows(n_slots):
            self.device.download(rows, out=out[index])
        return out

    def load_prefix(self, saved: np.ndarray, n_slots: int) -> None:
        """Slots [0, n_slots) <- the first n_slots of a save_prefix copy."""
        for index, rows in self._rows(n_slots):
            self.device.upload(saved[index][:n_slots], out=rows)
