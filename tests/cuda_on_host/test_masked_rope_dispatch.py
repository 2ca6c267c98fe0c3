"""CudaOps.attention's choice for masked batches (tree verification, DFlash blocks) with the tuning's
attn_masked_rope on, without a GPU (the recording stand-in library of test_decode_rope_dispatch.py).

Within one forward the first masked layer runs fd_rope_kv_write with the rows table in mode 1 (row i's cos / sin
stored) and fd_attention_masked; every later layer of the same rope, positions tensor and row count runs one
fd_attention_masked_rope call reading that table (mode 2) with the projection outputs as they are. A quantized K
or V, a window, head_dim other than 64 / 128, more than 48 rows, the tuning off, or another rope keep the two
kernels, and so does a forward of more rows than the tuning's attn_masked_rope; begin_forward makes the next forward
store the table again. A read of a table nothing stored would rotate
by another forward's angles. The kernel itself: tests/gpu/test_attention_masked_rope.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from tests.cuda_on_host.test_decode_rope_dispatch import RecordingLib, RecordingNative

from flashd.daemon.backends.base import Batch, KVCacheSpec
from flashd.daemon.backends.cuda.attention_ops import MASKED_ROPE_MAX_NEW
from flashd.daemon.backends.cuda.ops import DECODE_CHUNK_SLOTS, CudaKVCache, CudaOps
from flashd.daemon.backends.cuda.tensor import Device


class TunedLib(RecordingLib):
    def __init__(self, ffi, on: bool):
        super().__init__(ffi)
        self.on = on
        self.fd_attention_masked_rope = self._recorder("fd_attention_masked_rope")

    def fd_tuning_get(self, out):
        out.attn_masked_rope = self.on if not isinstance(self.on, bool) else (48 if self.on else 0)
        return 0


class TunedNative(RecordingNative):
    def __init__(self, on: bool):
        super().__init__()
        self.lib = TunedLib(self.ffi, on)


N_HEADS, N_KV, MAX_CTX = 6, 2, 256


def make(on=True, head_dim=128, kv_types=None):
    dev = Device(TunedNative(on))
    ops = CudaOps(dev)
    ops.reserve_arena(1 << 23)
    ops.reserve_attention(N_HEADS, N_KV, head_dim, MAX_CTX)
    spec = KVCacheSpec(n_layers=3, max_ctx=MAX_CTX, n_kv_heads=N_KV, head_dim=head_dim)
    if kv_types is None:
        cache = CudaKVCache(dev, spec)
    else:
        from flashd.daemon.backends.cuda.kv_cache_quant import CudaQuantKVCache
        from flashd.daemon.backends.kv_types import KVTypes
        cache = CudaQuantKVCache(dev, KVCacheSpec(3, MAX_CTX, N_KV, head_dim, kv_types=KVTypes(*kv_types)))
    ops.begin_forward()
    return dev, ops, cache


def batch_of(dev, n, positions=None):
    positions = positions if positions is not None else dev.upload(np.arange(7, 7 + n, dtype=np.int32))
    return Batch(ids=positions, positions=positions, n_past=dev.upload(np.array([7], np.int32)),
                 mask=dev.upload(np.tril(np.ones((n, n), np.uint8))), n_tokens=n)


def layer(dev, ops, cache, i, batch, head_dim=128, rope_dim=None, theta=1e6):
    n = batch.n_tokens
    rope_dim = rope_dim or head_dim
    q = ops.rope(ops.take((n, N_HEADS, head_dim)), batch.positions, theta, rope_dim, True)
    k = ops.rope(ops.take((n, N_KV, head_dim)), batch.positions, theta, rope_dim, True)
    v = ops.take((n, N_KV, head_dim))
    return q, k, v, ops.attention(q, k, v, cache.layer(i), batch)


def addr(dev, p) -> int:
    return int(dev.ffi.cast("uintptr_t", p))


def names(dev):
    return [c[0] for c in dev.lib.calls]


def test_the_first_layer_stores_the_rows_and_the_later_ones_fuse():
    dev, ops, cache = make()
    batch = batch_of(dev, 5)
    layer(dev, ops, cache, 0, batch)
    q, k, v, o = layer(dev, ops, cache, 1, batch)
    layer(dev, ops, cache, 2, batch)
    assert names(dev) == ["fd_rope_kv_write", "fd_attention_masked", "fd_attention_masked_rope",
                          "fd_attention_masked_rope"]
    store = dev.lib.calls[0][1][10]                      # fd_rope_kv_write's fd_rope_t: mode 1, the rows table
    assert store.table_mode == 1 and addr(dev, store.table) == ops.rope_rows_table.ptr
    a = dev.lib.calls[2][1]
    kc, vc = cache.layer(1)
    assert [addr(dev, x) for x in a[:8]] == [o.ptr, q.x.ptr, k.x.ptr, v.ptr, kc.ptr, vc.ptr, batch.mask.ptr,
                                             batch.n_past.ptr]
    assert a[8] == 5
    shape, rope = a[9], a[10]
    assert (shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.max_ctx) == (N_HEADS, N_KV, 128, MAX_CTX)
    assert rope.table_mode == 2 and addr(dev, rope.table) == ops.rope_rows_table.ptr
    assert (rope.rope_dim, rope.neox) == (128, 1)
    assert a[11] == DECODE_CHUNK_SLOTS and addr(dev, a[12]) == ops.attn_workspace.ptr
    assert ops.rope_rows_table.size >= MASKED_ROPE_MAX_NEW * 128
    assert o.shape == (5, N_HEADS * 128)


def test_a_new_forward_stores_again():
    dev, ops, cache = make()
    batch = batch_of(dev, 4)
    layer(dev, ops, cache, 0, batch)
    layer(dev, ops, cache, 1, batch)
    ops.begin_forward()
    layer(dev, ops, cache, 0, batch)
    assert names(dev) == ["fd_rope_kv_write", "fd_attention_masked", "fd_attention_masked_rope",
                          "fd_rope_kv_write", "fd_attention_masked"]
    assert dev.lib.calls[3][1][10].table_mode == 1


@pytest.mark.parametrize("change", ["positions", "rows", "theta", "rope_dim"])
def test_another_rope_positions_or_row_count_keeps_the_two_kernels(change):
    """Only the rows a mode-1 launch of this forward stored are read: another positions tensor, row count or rope
    runs rope_kv_write (without storing) + masked attention."""
    dev, ops, cache = make()
    batch = batch_of(dev, 4)
    layer(dev, ops, cache, 0, batch)
    kw = {}
    other = batch
    if change == "positions":
        other = batch_of(dev, 4, dev.upload(np.arange(7, 11, dtype=np.int32)))
    elif change == "rows":
        other = batch_of(dev, 3)
    elif change == "theta":
        kw = dict(theta=1e4)
    else:
        kw = dict(rope_dim=64)
    layer(dev, ops, cache, 1, other, **kw)
    assert names(dev) == ["fd_rope_kv_write", "fd_attention_masked", "fd_rope_kv_write", "fd_attention_masked"]
    assert dev.lib.calls[2][1][10].table_mode == 0


@pytest.mark.parametrize("case", ["off", "head_dim_256", "too_many_rows", "q8_0_k", "q4_0_v"])
def test_shapes_the_kernel_does_not_take_keep_the_two_kernels(case):
    head_dim = 256 if case == "head_dim_256" else 128
    kv_types = {"q8_0_k": ("q8_0", "f16"), "q4_0_v": ("f16", "q4_0")}.get(case)
    dev, ops, cache = make(on=case != "off", head_dim=head_dim, kv_types=kv_types)
    n = MASKED_ROPE_MAX_NEW + 1 if case == "too_many_rows" else 4
    batch = batch_of(dev, n)
    for i in range(3):
        layer(dev, ops, cache, i, batch, head_dim=head_dim)
    assert names(dev) == ["fd_rope_kv_write", "fd_attention_masked"] * 3
    assert all(c[1][10].table_mode == 0 for c in dev.lib.calls if c[0] == "fd_rope_kv_write")


@pytest.mark.parametrize("case", ["rope_dim_44", "k_misaligned", "v_misaligned"])
def test_rows_the_kernel_cannot_take_8_at_a_time_keep_the_two_kernels(case):
    """The kernel takes a row's values 8 at a time (float4 loads of k / v, 8 cos / sin a quad of RoPE pairs): a
    rope_dim that is not a multiple of 8, or k / v not 16-byte aligned, keep rope_kv_write + attention_masked."""
    dev, ops, cache = make()
    batch = batch_of(dev, 4)
    n = batch.n_tokens
    for i in range(3):
        rope_dim = 44 if case == "rope_dim_44" else 128
        q = ops.rope(ops.take((n, N_HEADS, 128)), batch.positions, 1e6, rope_dim, True)
        kx = ops.take((n * N_KV * 128 + 1,))
        kx = kx[1:] if case == "k_misaligned" else kx[:-1]
        k = ops.rope(kx.reshape(n, N_KV, 128), batch.positions, 1e6, rope_dim, True)
        vx = ops.take((n * N_KV * 128 + 2,))
        v = (vx[2:] if case == "v_misaligned" else vx[:-2]).reshape(n, N_KV, 128)
        ops.attention(q, k, v, cache.layer(i), batch)
    assert names(dev) == ["fd_rope_kv_write", "fd_attention_masked"] * 3


def test_head_dim_64_fuses_and_the_largest_batch_too():
    dev, ops, cache = make(head_dim=64)
    batch = batch_of(dev, MASKED_ROPE_MAX_NEW)
    for i in range(2):
        layer(dev, ops, cache, i, batch, head_dim=64)
    assert names(dev) == ["fd_rope_kv_write", "fd_attention_masked", "fd_attention_masked_rope"]


@pytest.mark.parametrize("bound,n,fused", [(8, 8, True), (8, 9, False), (1, 1, True), (1, 2, False)])
def test_the_tunings_row_bound(bound, n, fused):
    """attn_masked_rope is the most rows a fused forward has (measured per row count: the fused launch loses where
    each block RoPEs many visible rows)."""
    dev, ops, cache = make(on=bound)
    batch = batch_of(dev, n)
    for i in range(2):
        layer(dev, ops, cache, i, batch)
    assert names(dev)[2:] == (["fd_attention_masked_rope"] if fused else ["fd_rope_kv_write", "fd_attention_masked"])


def test_unmasked_batches_are_not_touched():
    """The decode step and prefill keep their paths; neither stores nor reads the rows table."""
    dev, ops, cache = make()
    for n in (1, 3):
        b = batch_of(dev, n)
        b = Batch(ids=b.ids, positions=b.positions, n_past=b.n_past, mask=None, n_tokens=n)
        layer(dev, ops, cache, 0, b)
        layer(dev, ops, cache, 1, b)
    assert names(dev) == ["fd_attention_decode_rope", "fd_attention_decode_rope", "fd_rope_kv_write",
                          "fd_attention_prefill", "fd_rope_kv_write", "fd_attention_prefill"]
    assert ops._rope_rows_key is None
