"""CudaKVCache.save_prefix / load_prefix (prefix reuse's host copies) without a GPU: the CUDA
backend's Device runs here on a stand-in native library whose "device memory" is host memory
(malloc, memcpy), so the slot arithmetic over the [layer][K|V][KV head][max_ctx][head_dim] storage
is checked against numpy's view of the same bytes. Kernels are not involved; the GPU test
tests/gpu/test_cuda_model.py::test_prefix_reuse_* covers the real device."""
from __future__ import annotations

import cffi
import numpy as np
import pytest

from flashd.daemon.backends.base import KVCacheSpec
from flashd.daemon.backends.cuda.lib import NativeLib, cdef_source
from flashd.daemon.backends.cuda.ops import CudaKVCache
from flashd.daemon.backends.cuda.tensor import Device


class HostMemoryLib:
    """The memory and stream calls of flashd.h, on host memory."""

    def __init__(self, ffi: cffi.FFI):
        self.ffi = ffi
        self.blocks: dict[int, object] = {}

    def _addr(self, p) -> int:
        return int(self.ffi.cast("uintptr_t", p))

    def fd_set_device(self, index):
        return 0

    def fd_stream_create(self, out):
        out[0] = self.ffi.NULL
        return 0

    def fd_stream_synchronize(self, stream):
        return 0

    def fd_malloc(self, out, n_bytes):
        block = self.ffi.new("char[]", n_bytes)
        self.blocks[self._addr(block)] = block
        out[0] = block
        return 0

    def fd_free(self, p):
        self.blocks.pop(self._addr(p), None)
        return 0

    def fd_host_alloc(self, out, n_bytes):           # pinned host memory: plain host memory here
        return self.fd_malloc(out, n_bytes)

    def fd_memcpy_h2d(self, dst, src, n_bytes, stream):
        self.ffi.memmove(self.ffi.cast("char*", dst), self.ffi.cast("char*", src), n_bytes)
        return 0

    fd_memcpy_d2h = fd_memcpy_h2d

    def fd_tuning_get(self, out):   # every field 0: the GEMV kernels' defaults (CudaOps reads gemv_rows)
        return 0

    def fd_status_string(self, status):
        return self.ffi.new("char[]", b"host stand-in error")


class HostNative(NativeLib):
    def __init__(self):          # no library to open: the stand-in above answers the calls
        self.ffi = cffi.FFI()
        self.ffi.cdef(cdef_source())
        self.lib = HostMemoryLib(self.ffi)


SPEC = KVCacheSpec(n_layers=3, max_ctx=40, n_kv_heads=2, head_dim=8)


def filled(device: Device, seed: int) -> tuple[CudaKVCache, np.ndarray]:
    cache = CudaKVCache(device, SPEC)
    values = np.random.default_rng(seed).standard_normal(cache.storage.shape).astype(np.float16)
    device.upload(values, out=cache.storage)
    return cache, values.reshape(SPEC.n_layers, 2, SPEC.n_kv_heads, SPEC.max_ctx, SPEC.head_dim)


def test_save_prefix_copies_the_first_slots_of_every_layer_and_head():
    device = Device(HostNative())
    cache, view = filled(device, 1)
    saved = cache.save_prefix(13)
    np.testing.assert_array_equal(saved, view[:, :, :, :13])


def test_load_prefix_writes_those_slots_back_and_nothing_else():
    device = Device(HostNative())
    src, src_view = filled(device, 1)
    dst, dst_view = filled(device, 2)
    dst.load_prefix(src.save_prefix(20), 13)          # a longer copy: its first 13 slots
    now = device.download(dst.storage).reshape(dst_view.shape)
    np.testing.assert_array_equal(now[:, :, :, :13], src_view[:, :, :, :13])
    np.testing.assert_array_equal(now[:, :, :, 13:], dst_view[:, :, :, 13:])


def test_download_into_a_wrong_array_is_an_error():
    device = Device(HostNative())
    cache, _ = filled(device, 3)
    t = cache.storage[:16]
    with pytest.raises(ValueError, match="download into"):
        device.download(t, out=np.empty(8, np.float16))
    with pytest.raises(ValueError, match="download into"):
        device.download(t, out=np.empty(32, np.float16)[::2])
