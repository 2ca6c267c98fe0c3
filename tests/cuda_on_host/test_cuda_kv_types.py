"""The CUDA backend's quantized KV cache (--kv-type q8_0 / q4_0) without a GPU.

Load checks: every KV type passes CudaBackend.plan / make_runner's check (a type the kernels lacked would be a
KVTypeUnsupported -- a ModelLoadError, not ModelUnsupported, so --device auto never moves a GPU request to the CPU);
the float16 CudaKVCache refuses a quantized spec. CudaQuantKVCache on a stand-in native library whose device
memory is host memory (test_cuda_kv_prefix_on_host.py), with fd_kv_compact_rows emulated in numpy: the layer
pointers and planes, the host prefix copies and the commit's moves are checked byte for byte against numpy's view
of the storage."""
from types import SimpleNamespace

import numpy as np
import pytest

from flashd.daemon.backends.base import KVCacheSpec
from flashd.daemon.backends.cuda.backend import CudaBackend, KVTypeUnsupported, check_kv_types
from flashd.daemon.backends.cuda.kv_cache import CudaKVCache
from flashd.daemon.backends.cuda.kv_cache_quant import CudaQuantKVCache, KVPlane, kv_type_of
from flashd.daemon.backends.cuda.tensor import Device
from flashd.daemon.backends.kv_types import KVTypes, row_bytes
from flashd.daemon.models.gguf_file import ModelLoadError, ModelUnsupported
from tests.cuda_on_host.test_cuda_kv_prefix_on_host import HostMemoryLib, HostNative

TYPES = [KVTypes("q8_0", "q8_0"), KVTypes("q4_0", "q4_0"), KVTypes("q8_0", "f16"), KVTypes("f16", "q4_0")]


@pytest.mark.parametrize("types", TYPES, ids=str)
def test_every_kv_type_passes_the_load_checks(types):
    check_kv_types(types)
    backend = CudaBackend.__new__(CudaBackend)
    backend.device = None                           # past the checks, plan asks the device: AttributeError
    with pytest.raises(AttributeError):
        backend.plan(SimpleNamespace(head_dim=128, linear=None), weight_bytes=0, max_ctx=64, prefill_chunk=16,
                     kv_types=types)
    with pytest.raises(ValueError, match="float16 K/V only"):
        CudaKVCache(None, KVCacheSpec(1, 64, 1, 128, types))
    assert issubclass(KVTypeUnsupported, ModelLoadError) and not issubclass(KVTypeUnsupported, ModelUnsupported)


class CompactLib(HostMemoryLib):
    def fd_kv_compact_rows(self, base, plane_stride, n_planes, n_kv_heads, max_ctx, row_bytes_, offsets, n_past,
                           n_keep, stream):
        """fd_kv_compact_rows on host memory (the kernel's loop, kv_compact.cu)."""
        offs = np.frombuffer(self.ffi.buffer(offsets, 4 * n_keep), np.int32)
        start = int(np.frombuffer(self.ffi.buffer(n_past, 4), np.int32)[0])
        mem = np.frombuffer(self.ffi.buffer(self.ffi.cast("char*", base), (n_planes - 1) * plane_stride
                                            + n_kv_heads * max_ctx * row_bytes_), np.uint8)
        for p in range(n_planes):
            rows = mem[p * plane_stride:p * plane_stride + n_kv_heads * max_ctx * row_bytes_].reshape(
                n_kv_heads, max_ctx, row_bytes_)
            for i, src in enumerate(offs):
                if src != i and start + src < max_ctx and start + i < max_ctx:
                    rows[:, start + i] = rows[:, start + src]
        return 0


class CompactNative(HostNative):
    def __init__(self):
        super().__init__()
        self.lib = CompactLib(self.ffi)


def filled(types: KVTypes, seed: int):
    device = Device(CompactNative())
    spec = KVCacheSpec(n_layers=3, max_ctx=41, n_kv_heads=1, head_dim=64, kv_types=types)  # odd rows: padding shows
    cache = CudaQuantKVCache(device, spec)
    raw = np.random.default_rng(seed).integers(0, 256, cache.storage.shape, dtype=np.uint8)
    device.upload(raw, out=cache.storage)
    return device, cache, raw


def groups_of(raw: np.ndarray, cache: CudaQuantKVCache) -> list[np.ndarray]:
    """numpy's view of every (layer, row group) as (n_kv_heads, max_ctx, row bytes)."""
    spec, out = cache.spec, []
    layers = raw.reshape(spec.n_layers, cache.layer_bytes)
    for layer in layers:
        for offset, rb in cache.groups:
            out.append(layer[offset:offset + spec.n_kv_heads * spec.max_ctx * rb].reshape(
                spec.n_kv_heads, spec.max_ctx, rb))
    return out


@pytest.mark.parametrize("types", TYPES, ids=str)
def test_layout_and_layers(types):
    _, cache, _ = filled(types, 0)
    spec = cache.spec
    rows = spec.n_kv_heads * spec.max_ctx
    pad = lambda n: -(-n // 256) * 256                                  # noqa: E731 -- every K and V 256-aligned
    assert cache.n_bytes == spec.n_layers * (pad(rows * row_bytes(types.k, 64)) + pad(rows * row_bytes(types.v, 64)))
    k, v = cache.layer(1)
    assert k.ptr == cache.storage.ptr + cache.layer_bytes and v.ptr == k.ptr + pad(rows * row_bytes(types.k, 64))
    assert k.ptr % 256 == v.ptr % 256 == cache.storage.ptr % 256
    for t, kind in ((k, types.k), (v, types.v)):
        assert kv_type_of(t) == kind and t.shape == (1, 41, 64)
        assert isinstance(t, KVPlane) == (kind != "f16")
    assert sum(rb for _, rb in cache.groups) == row_bytes(types.k, 64) + row_bytes(types.v, 64)


@pytest.mark.parametrize("types", TYPES, ids=str)
def test_prefix_copies_keep_the_bytes(types):
    device, cache, raw = filled(types, 1)
    saved = cache.save_prefix(13)
    spec = cache.spec
    assert saved.nbytes == 13 * spec.n_layers * spec.n_kv_heads * (row_bytes(types.k, 64) + row_bytes(types.v, 64))
    _, other, raw2 = filled(types, 2)
    other.device = device                     # same stand-in memory space is not needed: copies go via the host
    other.load_prefix(saved, 9)
    got = device.download(other.storage)
    for mine, theirs, before in zip(groups_of(got, other), groups_of(raw, cache), groups_of(raw2, other)):
        np.testing.assert_array_equal(mine[:, :9], theirs[:, :9])
        np.testing.assert_array_equal(mine[:, 9:], before[:, 9:])


@pytest.mark.parametrize("types", TYPES, ids=str)
def test_commit_moves_every_group_of_every_layer(types):
    device, cache, raw = filled(types, 3)
    offsets = np.array([0, 2, 5, 6], np.int32)
    cache.compact(device.upload(offsets), device.upload(np.array([10], np.int32)), len(offsets))
    got = device.download(cache.storage)
    for after, before in zip(groups_of(got, cache), groups_of(raw, cache)):
        want = before.copy()
        for i, src in enumerate(offsets):
            want[:, 10 + i] = want[:, 10 + src]
        np.testing.assert_array_equal(after, want)
