"""CudaOps.attention's choice of kernels, without a GPU: the CUDA backend's Device runs on a stand-in native
library (host memory, tests/cuda_on_host/test_cuda_kv_prefix_on_host.py) that records the attention and rope calls.

A one-row unmasked step (the decode step) is one fd_attention_decode_rope call with the projection
outputs as they are, q's positions, the step's n_past and the rope parameters; with
CudaOps.fuse_decode_rope off, and for masked or multi-row batches, fd_rope_kv_write runs first, then the
batch's attention kernel. Shapes are checked before crossing the C ABI. The kernels themselves:
tests/gpu/test_attention_decode_rope.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from tests.cuda_on_host.test_cuda_kv_prefix_on_host import HostMemoryLib, HostNative

from flashd.daemon.backends.base import Batch, KVCacheSpec
from flashd.daemon.backends.cuda.ops import DECODE_CHUNK_SLOTS, CudaKVCache, CudaOps
from flashd.daemon.backends.cuda.tensor import Device
from flashd.daemon.models.config import RopeScaling

KERNELS = ("fd_rope_kv_write", "fd_attention_decode", "fd_attention_decode_rope", "fd_attention_masked",
           "fd_attention_prefill")


class RecordingLib(HostMemoryLib):
    def __init__(self, ffi):
        super().__init__(ffi)
        self.calls: list[tuple[str, tuple]] = []
        for name in KERNELS:
            setattr(self, name, self._recorder(name))

    def _recorder(self, name):
        def call(*args):
            self.calls.append((name, args))
            return 0
        return call

    def fd_attention_decode_workspace_bytes(self, shape, chunk_len):
        return 4096

    def fd_attention_workspace_bytes(self, n, shape, chunk_len):
        return 4096


class RecordingNative(HostNative):
    def __init__(self):
        super().__init__()
        self.lib = RecordingLib(self.ffi)


N_HEADS, N_KV, HD, MAX_CTX = 6, 2, 64, 128


@pytest.fixture
def setup():
    dev = Device(RecordingNative())
    ops = CudaOps(dev)
    ops.reserve_arena(1 << 16)
    ops.reserve_attention(N_HEADS, N_KV, HD, MAX_CTX)
    cache = CudaKVCache(dev, KVCacheSpec(n_layers=1, max_ctx=MAX_CTX, n_kv_heads=N_KV, head_dim=HD))
    ops.begin_forward()
    return dev, ops, cache


def _inputs(dev, ops, n, mask=False):
    q = ops.take((n, N_HEADS, HD))
    k = ops.take((n, N_KV, HD))
    v = ops.take((n, N_KV, HD))
    positions = dev.upload(np.arange(5, 5 + n, dtype=np.int32))
    n_past = dev.upload(np.array([5], np.int32))
    m = dev.upload(np.ones((n, n), np.uint8)) if mask else None
    batch = Batch(ids=positions, positions=positions, n_past=n_past, mask=m, n_tokens=n)
    return (ops.rope(q, positions, 1e6, 48, True), ops.rope(k, positions, 1e6, 48, True), v, batch)


def _addr(dev, p) -> int:
    return int(dev.ffi.cast("uintptr_t", p))


def test_decode_step_is_one_fused_call(setup):
    dev, ops, cache = setup
    q, k, v, batch = _inputs(dev, ops, 1)
    o = ops.attention(q, k, v, cache.layer(0), batch)
    calls = dev.lib.calls
    assert [c[0] for c in calls] == ["fd_attention_decode_rope"]
    a = calls[0][1]
    kc, vc = cache.layer(0)
    assert [_addr(dev, x) for x in a[:9]] == [o.ptr, q.x.ptr, k.x.ptr, v.ptr, kc.ptr, vc.ptr, 0, batch.positions.ptr,
                                              batch.n_past.ptr]            # an f16 K: no key offset (NULL)
    shape, rope = a[9], a[10]
    assert (shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.max_ctx) == (N_HEADS, N_KV, HD, MAX_CTX)
    assert shape.scale == pytest.approx(1 / np.sqrt(HD))
    assert (rope.rope_dim, rope.theta, rope.neox) == (48, pytest.approx(1e6), 1)
    assert rope.scaling == dev.ffi.NULL                  # no RoPE scaling
    assert a[11] == DECODE_CHUNK_SLOTS
    assert _addr(dev, a[12]) == ops.attn_workspace.ptr
    assert o.shape == (1, N_HEADS * HD)


YARN = RopeScaling.create("yarn", 4.0, 64)


@pytest.mark.parametrize("n,mask", [(1, False), (1, True), (3, False)])
def test_rope_scaling_reaches_every_rope_kernel(setup, n, mask):
    """A YaRN-scaled rope passes an fd_rope_scaling_t holding RopeScaling.rope_params (the reference's
    numbers) to the fused decode op and to fd_rope_kv_write alike."""
    dev, ops, cache = setup
    _, _, v, batch = _inputs(dev, ops, n, mask)
    q = ops.rope(ops.take((n, N_HEADS, HD)), batch.positions, 1e6, 48, True, YARN)
    k = ops.rope(ops.take((n, N_KV, HD)), batch.positions, 1e6, 48, True, YARN)
    ops.attention(q, k, v, cache.layer(0), batch)
    name, args = dev.lib.calls[0]
    struct = args[10].scaling                            # the fd_rope_t (argument 10 of both)
    assert name == ("fd_attention_decode_rope" if n == 1 and not mask else "fd_rope_kv_write")
    got = (struct.freq_scale, struct.ext_factor, struct.corr_low, struct.corr_high, struct.mscale)
    assert got == YARN.rope_params(48, 1e6)              # doubles: exactly the reference's numbers


def test_fused_refuses_q_and_k_scaled_differently(setup):
    dev, ops, cache = setup
    q, k, v, batch = _inputs(dev, ops, 1)
    k_yarn = ops.rope(k.x, batch.positions, 1e6, 48, True, YARN)
    with pytest.raises(ValueError, match="roped alike"):
        ops.attention(q, k_yarn, v, cache.layer(0), batch)
    assert dev.lib.calls == []


def test_switch_off_and_other_batches_keep_the_two_kernels(setup):
    dev, ops, cache = setup
    def run(n, mask=False):
        q, k, v, batch = _inputs(dev, ops, n, mask)
        ops.attention(q, k, v, cache.layer(0), batch)

    ops.fuse_decode_rope = False
    run(1)
    ops.fuse_decode_rope = True
    run(1, mask=True)        # a one-node tree: verification keeps rope_kv_write + masked attention
    run(3)                   # prefill
    assert [c[0] for c in dev.lib.calls] == ["fd_rope_kv_write", "fd_attention_decode",
                                             "fd_rope_kv_write", "fd_attention_masked",
                                             "fd_rope_kv_write", "fd_attention_prefill"]


def test_fused_checks_shapes_before_the_call(setup):
    dev, ops, cache = setup
    q, k, v, batch = _inputs(dev, ops, 1)
    bad_v = ops.take((1, N_KV, HD - 8))
    with pytest.raises(ValueError, match="attention_decode_rope"):
        ops.attention(q, k, bad_v, cache.layer(0), batch)
    other = ops.rope(k.x, dev.upload(np.array([9], np.int32)), 1e6, 48, True)     # k roped at another position
    with pytest.raises(ValueError, match="roped alike"):
        ops.attention(q, other, v, cache.layer(0), batch)
    assert dev.lib.calls == []


@pytest.mark.parametrize("n,mask", [(1, True), (3, False)])
def test_every_attention_path_checks_q_against_the_cache(setup, n, mask):
    """q whose heads do not fit the cache (head_dim, or query heads not a multiple of the KV heads) is refused
    before fd_rope_kv_write, and so before any attention kernel."""
    dev, ops, cache = setup
    _, _, _, batch = _inputs(dev, ops, n, mask)
    for q_heads, q_dim in ((N_HEADS, HD - 8), (N_HEADS + 1, HD)):
        q = ops.rope(ops.take((n, q_heads, q_dim)), batch.positions, 1e6, 48, True)
        k = ops.rope(ops.take((n, N_KV, q_dim)), batch.positions, 1e6, 48, True)
        with pytest.raises(ValueError, match="rope_kv_write"):
            ops.attention(q, k, ops.take((n, N_KV, q_dim)), cache.layer(0), batch)
    assert dev.lib.calls == []


@pytest.mark.parametrize("n,mask", [(1, False), (1, True), (3, False)])
def test_a_quantized_k_passes_its_layers_key_offset(setup, n, mask):
    """A q8_0 K with key offsets (kv_cache_quant.py set_key_offset): every K writer (the fused decode op and
    fd_rope_kv_write, argument 6 of both) gets layer i's (n_kv_heads, head_dim) float32 slice of the one device
    buffer; the cache refuses offsets of the wrong shape, and an f16 K keeps none."""
    from flashd.daemon.backends.cuda.kv_cache_quant import CudaQuantKVCache
    from flashd.daemon.backends.kv_types import KVTypes
    dev, ops, _ = setup
    spec = KVCacheSpec(n_layers=2, max_ctx=MAX_CTX, n_kv_heads=N_KV, head_dim=HD, kv_types=KVTypes("q8_0", "f16"))
    cache = CudaQuantKVCache(dev, spec)
    with pytest.raises(ValueError, match="key offsets"):
        cache.set_key_offset(np.zeros((2, N_KV, HD - 8), np.float32))
    offsets = np.arange(2 * N_KV * HD, dtype=np.float32).reshape(2, N_KV, HD)
    cache.set_key_offset(offsets)
    q, k, v, batch = _inputs(dev, ops, n, mask)
    ops.attention(q, k, v, cache.layer(1), batch)
    name, args = dev.lib.calls[0]
    assert name == ("fd_attention_decode_rope" if n == 1 and not mask else "fd_rope_kv_write")
    at = 6 if name == "fd_attention_decode_rope" else 5
    assert _addr(dev, args[at]) == cache.k_offset.ptr + N_KV * HD * 4
    np.testing.assert_array_equal(dev.download(cache.layer(1)[0].offset), offsets[1])
    f16k = CudaQuantKVCache(dev, KVCacheSpec(2, MAX_CTX, N_KV, HD, KVTypes("f16", "q8_0")))
    f16k.set_key_offset(offsets)
    assert f16k.k_offset is None
