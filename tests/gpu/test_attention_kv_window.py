"""The KV window on the GPU (flashd_attention.h, fd_attention_shape_t.window / window_slots): split-K decode, masked
(tree) and prefill attention over a quantized cache whose current window block is read from float16 copies in a ring,
against the float64 oracle over exactly what the kernels read; fd_rope_kv_write's ring rows; fd_kv_compact_ring.

A quantized side's allocation here is its planes, then (at fd_kv_window_offset) the ring float16 [Hkv][R][d], slot s
in row s % R. The ring holds float16 copies of the slots a launch may read at full precision and NaN everywhere else,
and the planes of unwritten slots have NaN scales: a read outside the rule shows. Per query row at position p, key t
is read from the ring iff t >= U (p // U) (a float16 side reads its cache either way). The oracle is
test_attention_kv_quant.py's (float64 over those float16 values, the same tolerances); it differs from the oracle
without a window by far more than the tolerance (checked), so a kernel ignoring the window fails."""
import numpy as np
import pytest

from flashd.daemon.backends.cuda.attention_ops import KV_TYPE_CODES
from flashd.daemon.backends.cuda.ops import attention_shape, rope_struct
from flashd.daemon.backends.kv_quant import decode_rows, encode_rows
from flashd.daemon.backends.cuda.kv_planes import planes_from_blocks
from tests.gpu.attention_oracle import attention_oracle, tree_mask
from tests.gpu.test_attention_kv_quant import ATOL, CHUNK, NAN_F16, RTOL, decode, masked, prefill

NAN16 = np.float16(np.nan)


class WindowCache:
    """One layer's K and V with a window: x (Hkv, max_ctx, d) float32 per side; the device buffers (planes + ring
    for a quantized side, float16 rows for an f16 one) with the ring holding slots [lo, hi)."""

    def __init__(self, native, dev, rng, types, n_kv_heads, max_ctx, d, n_written, window, slots, lo, hi):
        self.types, self.window, self.slots = types, window, slots
        self.x, self.stored, self.bufs, self.rings = [], [], [], []
        for kind, scale in zip(types, (3.0, 1.0)):
            x = (rng.standard_normal((n_kv_heads, max_ctx, d)) * scale).astype(np.float32)
            if kind == "f16":
                c = x.astype(np.float16)
                c[:, n_written:] = np.nan
                self.stored.append(c)
                self.bufs.append(dev.upload(c.view(np.uint8).ravel()))
                self.rings.append(None)
            else:
                blocks = encode_rows(x, kind)
                per = 34 if kind == "q8_0" else 18
                b = blocks.reshape(n_kv_heads, max_ctx, d // 32, per).copy()
                b[:, n_written:, :, :2] = NAN_F16
                b = b.reshape(blocks.shape)
                self.stored.append(decode_rows(b, kind).astype(np.float16))
                planes = planes_from_blocks(b, kind)
                off = native.lib.fd_kv_window_offset(KV_TYPE_CODES[kind], n_kv_heads, max_ctx, d)
                assert off >= planes.size and off % 256 == 0
                ring = np.full((n_kv_heads, slots, d), NAN16, np.float16)
                for s in range(lo, hi):
                    ring[:, s % slots] = x[:, s].astype(np.float16)
                raw = np.concatenate([planes, np.zeros(off - planes.size, np.uint8), ring.view(np.uint8).ravel()])
                self.bufs.append(dev.upload(raw))
                self.rings.append(ring)
            self.x.append(x)
        self.full = [x.astype(np.float16) for x in self.x]             # what a window read gives

    def shape(self, native, n_heads, n_kv_heads, d, max_ctx, window=None):
        return attention_shape(native.ffi, n_heads, n_kv_heads, d, max_ctx, k_type=self.types[0],
                               v_type=self.types[1], window=self.window if window is None else window,
                               window_slots=self.slots)

    def seen(self, key_pos: np.ndarray, q_pos: int, window: bool = True):
        """(K, V) as a query at q_pos reads them: slot t of key position key_pos[t] full iff in its block."""
        near = key_pos >= self.window * (q_pos // self.window) if window else np.zeros(key_pos.shape, bool)
        return [np.where(near[None, :, None], full[:, :key_pos.size], stored[:, :key_pos.size])
                for full, stored in zip(self.full, self.stored)]


TYPES = [("q4_0", "q4_0"), ("q8_0", "q4_0"), ("q4_0", "f16"), ("f16", "q8_0")]
# (n_heads, n_kv_heads, d, max_ctx, n_past, window)
DECODE_CASES = [(12, 2, 128, 1100, 777, 512), (12, 2, 128, 1100, 512, 512), (12, 2, 128, 1100, 511, 512),
                (14, 2, 64, 300, 0, 64), (16, 16, 64, 700, 640, 128), (8, 1, 256, 400, 130, 64),
                (12, 2, 128, 32768, 20000, 512)]


@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("n_heads,n_kv_heads,d,max_ctx,n_past,window", DECODE_CASES)
def test_decode_reads_its_block_from_the_ring(native, dev, rng, types, n_heads, n_kv_heads, d, max_ctx, n_past,
                                              window):
    slots = window + 64
    lo = window * (n_past // window)
    wc = WindowCache(native, dev, rng, types, n_kv_heads, max_ctx, d, n_past + 1, window, slots, lo, n_past + 1)
    shape = wc.shape(native, n_heads, n_kv_heads, d, max_ctx)
    q = rng.standard_normal((1, n_heads, d)).astype(np.float32)
    visible = np.ones((1, n_past + 1), bool)
    kc, vc = wc.seen(np.arange(n_past + 1), n_past)
    expect = attention_oracle(q, kc, vc, visible, 1 / np.sqrt(d))[0]
    got = decode(native, dev, q, wc.bufs, shape, n_past)
    np.testing.assert_allclose(got, expect, rtol=RTOL, atol=ATOL)
    if "q4_0" in types and n_past - lo >= 64:                         # the window is visible in the output
        kq, vq = wc.seen(np.arange(n_past + 1), n_past, window=False)
        assert np.abs(attention_oracle(q, kq, vq, visible, 1 / np.sqrt(d))[0] - expect).max() > 10 * ATOL


@pytest.mark.parametrize("types", TYPES[:3], ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("n_heads,n_kv_heads,d,n,n_past,window", [(12, 2, 128, 16, 1020, 512), (14, 2, 64, 37, 60, 64),
                                                                  (8, 4, 256, 9, 250, 128), (12, 2, 128, 20, 0, 64)])
def test_masked_tree_rows_read_by_position_and_chain_rows_are_decode_rows(native, dev, rng, types, n_heads,
                                                                          n_kv_heads, d, n, n_past, window):
    max_ctx = n_past + n + 40
    slots = window + 256
    lo = window * (n_past // window)
    wc = WindowCache(native, dev, rng, types, n_kv_heads, max_ctx, d, n_past + n, window, slots, lo, n_past + n)
    shape = wc.shape(native, n_heads, n_kv_heads, d, max_ctx)
    q = rng.standard_normal((n, n_heads, d)).astype(np.float32)
    mask = tree_mask(rng, n)
    depth = mask.sum(axis=1) - 1                                       # node i sits at position n_past + depth[i]
    got = masked(native, dev, q, wc.bufs, shape, mask, n_past)
    key_pos = np.concatenate([np.arange(n_past), n_past + depth])      # slot -> position
    visible = np.zeros((1, n_past + n), bool)
    for i in range(n):
        visible[0, :n_past] = True
        visible[0, n_past:] = mask[i].astype(bool)
        kc, vc = wc.seen(key_pos, n_past + depth[i])
        expect = attention_oracle(q[i:i + 1], kc, vc, visible, 1 / np.sqrt(d))[0]
        np.testing.assert_allclose(got[i], expect, rtol=RTOL, atol=ATOL, err_msg=f"node {i} depth {depth[i]}")
    chain = np.tril(np.ones((n, n), np.uint8))
    rows = masked(native, dev, q, wc.bufs, shape, chain, n_past)
    for i in (0, n // 2, n - 1):
        np.testing.assert_array_equal(rows[i], decode(native, dev, q[i:i + 1], wc.bufs, shape, n_past + i))


@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("n_heads,n_kv_heads,d,n,p0,window", [(12, 2, 128, 100, 1000, 512), (12, 2, 128, 700, 0, 512),
                                                               (14, 2, 64, 300, 37, 64), (16, 16, 64, 1, 7, 64),
                                                               (8, 2, 256, 70, 300, 128), (24, 4, 256, 9, 1020, 64),
                                                               (12, 2, 128, 512, 4096, 512)])
def test_prefill_rows_read_their_own_block(native, dev, rng, types, n_heads, n_kv_heads, d, n, p0, window):
    max_ctx = p0 + n + 17
    slots = window + -(-n // 64) * 64
    lo = window * (p0 // window)
    wc = WindowCache(native, dev, rng, types, n_kv_heads, max_ctx, d, p0 + n, window, slots, lo, p0 + n)
    shape = wc.shape(native, n_heads, n_kv_heads, d, max_ctx)
    q = rng.standard_normal((n, n_heads, d)).astype(np.float32)
    got = prefill(native, dev, q, wc.bufs, shape, p0)
    assert not np.isnan(got).any()
    q16 = q.astype(np.float16).astype(np.float32)                          # the kernel's q fragments
    atol = 2e-3 * np.abs(wc.full[1][:, :p0 + n].astype(np.float64)).max()
    worst, moved = 0.0, 0.0
    for i in range(n):
        visible = np.zeros((1, p0 + n), bool)
        visible[0, :p0 + i + 1] = True
        kc, vc = wc.seen(np.arange(p0 + n), p0 + i)
        expect = attention_oracle(q16[i:i + 1], kc, vc, visible, 1 / np.sqrt(d))[0]
        worst = max(worst, np.abs(got[i] - expect).max())
        kq, vq = wc.seen(np.arange(p0 + n), p0 + i, window=False)
        moved = max(moved, np.abs(attention_oracle(q16[i:i + 1], kq, vq, visible, 1 / np.sqrt(d))[0] - expect).max())
    assert worst <= atol, (worst, atol)
    if "q4_0" in types:
        assert moved > 2 * atol                                           # the window is visible in the output


@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"k={t[0]},v={t[1]}")
def test_rope_kv_write_stores_the_ring_copies(native, dev, rng, types):
    """fd_rope_kv_write with a window: the codes and scales are the window-less write's bit for bit, and each
    quantized side's ring row (n_past + i) % R holds float16 of exactly what was encoded (K: the RoPE'd, rotated key
    fd_rope_kv_write leaves in k); every other ring row is untouched."""
    n_heads, n_kv_heads, d, max_ctx, window, slots, n, n_past = 12, 2, 128, 2000, 512, 640, 100, 1500
    ffi, lib = native.ffi, native.lib
    rope = rope_struct(ffi, d, 1e6, True)
    q = rng.standard_normal((n, n_heads, d)).astype(np.float32)
    k = (rng.standard_normal((n, n_kv_heads, d)) * 3).astype(np.float32)
    v = rng.standard_normal((n, n_kv_heads, d)).astype(np.float32)
    outs = []
    for w in (window, 0):
        wc = WindowCache(native, dev, np.random.default_rng(3), types, n_kv_heads, max_ctx, d, n_past, window, slots,
                         0, 0)
        shape = wc.shape(native, n_heads, n_kv_heads, d, max_ctx, window=w)
        dq, dk, dv = dev.upload(q), dev.upload(k), dev.upload(v)
        pos = dev.upload(np.arange(n_past, n_past + n, dtype=np.int32))
        npast = dev.upload(np.array([n_past], np.int32))
        native.check(lib.fd_rope_kv_write(dev.p(dq, "float*"), dev.p(dk, "float*"), dev.p(dv, "float*"),
                                          dev.p(wc.bufs[0]), dev.p(wc.bufs[1]), ffi.NULL, dev.p(pos, "int32_t*"),
                                          dev.p(npast, "int32_t*"), n, shape, rope, dev.stream), "fd_rope_kv_write")
        dev.synchronize()
        outs.append(([dev.download(b) for b in wc.bufs], dev.download(dk), wc))
    (win_bufs, k_rot, wc), (plain_bufs, _, _) = outs
    for side, (kind, a, b) in enumerate(zip(types, win_bufs, plain_bufs)):
        if kind == "f16":
            np.testing.assert_array_equal(a, b)
            continue
        off = lib.fd_kv_window_offset(KV_TYPE_CODES[kind], n_kv_heads, max_ctx, d)
        np.testing.assert_array_equal(a[:off], b[:off])                    # codes and scales as without a window
        ring = a[off:].view(np.float16).reshape(n_kv_heads, slots, d)
        x = (k_rot if side == 0 else v).transpose(1, 0, 2).astype(np.float16)   # (Hkv, n, d)
        rows = (n_past + np.arange(n)) % slots
        np.testing.assert_array_equal(ring[:, rows], x)
        others = np.setdiff1d(np.arange(slots), rows)
        assert np.isnan(ring[:, others]).all()


def test_compact_ring_moves_rows_modulo_the_ring(native, dev, rng):
    n_planes, n_kv_heads, slots, row_bytes, n_past = 3, 2, 128, 64, 1000
    stride = n_kv_heads * slots * row_bytes + 256
    raw = rng.integers(0, 256, n_planes * stride, dtype=np.uint8)
    buf = dev.upload(raw)
    src = np.array([0, 2, 5, 6, 11, 40], np.int32)                    # 1000 + 40 wraps past 1024 = 8 * 128
    dsrc, dnp = dev.upload(src), dev.upload(np.array([n_past], np.int32))
    native.check(native.lib.fd_kv_compact_ring(dev.p(buf), stride, n_planes, n_kv_heads, slots, row_bytes,
                                               dev.p(dsrc, "int32_t*"), dev.p(dnp, "int32_t*"), len(src), dev.stream),
                 "fd_kv_compact_ring")
    dev.synchronize()
    want = raw.copy()
    for p in range(n_planes):
        rows = want[p * stride:p * stride + n_kv_heads * slots * row_bytes].reshape(n_kv_heads, slots, row_bytes)
        for i, s in enumerate(src):
            rows[:, (n_past + i) % slots] = rows[:, (n_past + s) % slots]
    np.testing.assert_array_equal(dev.download(buf), want)


def test_a_bad_window_is_refused(native, dev):
    lib, ffi = native.lib, native.ffi
    buf = dev.empty((1 << 20,), np.uint8)
    o, q, npast = dev.empty((12 * 128,)), dev.empty((12 * 128,)), dev.upload(np.array([5], np.int32))
    ws = dev.empty((1 << 20,), np.uint8)
    for kt, window, slots in (("q4_0", 100, 256), ("q4_0", 512, 512), ("f16", 64, 128)):
        shape = attention_shape(ffi, 12, 2, 128, 1000, k_type=kt, v_type=kt, window=window, window_slots=slots)
        assert lib.fd_attention_decode(dev.p(o, "float*"), dev.p(q, "float*"), dev.p(buf), dev.p(buf),
                                       dev.p(npast, "int32_t*"), shape, CHUNK, dev.p(ws), dev.stream) == -1


@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("n_heads,n_kv_heads,d,max_ctx,n_past,window", [(12, 2, 128, 1100, 777, 512),
                                                                         (12, 2, 128, 1100, 512, 512),
                                                                         (14, 2, 64, 300, 0, 64),
                                                                         (8, 1, 256, 400, 130, 64),
                                                                         (32, 1, 64, 300, 200, 128)])
def test_fused_decode_rope_is_rope_kv_write_then_decode(native, dev, rng, types, n_heads, n_kv_heads, d, max_ctx,
                                                        n_past, window):
    """fd_attention_decode_rope with a window: o and every byte of both sides (codes, scales and ring) bit for bit
    fd_rope_kv_write + fd_attention_decode's -- the new row attended as its float16 copy, that copy stored in the
    ring."""
    ffi, lib = native.ffi, native.lib
    slots = window + 64
    lo = window * (n_past // window)
    rope = rope_struct(ffi, d, 1e6, True)
    q = rng.standard_normal((1, n_heads, d)).astype(np.float32)
    k = (rng.standard_normal((1, n_kv_heads, d)) * 3).astype(np.float32)
    v = rng.standard_normal((1, n_kv_heads, d)).astype(np.float32)
    pos, npast = dev.upload(np.array([n_past + 3], np.int32)), dev.upload(np.array([n_past], np.int32))
    results = []
    for fused in (True, False):
        wc = WindowCache(native, dev, np.random.default_rng(11), types, n_kv_heads, max_ctx, d, n_past, window, slots,
                         lo, n_past)
        shape = wc.shape(native, n_heads, n_kv_heads, d, max_ctx)
        ws = dev.empty((max(lib.fd_attention_decode_workspace_bytes(shape, CHUNK), 16),), np.uint8)
        o = dev.empty((n_heads * d,))
        dq, dk, dv = dev.upload(q), dev.upload(k), dev.upload(v)
        if fused:
            native.check(lib.fd_attention_decode_rope(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(dk, "float*"),
                                                      dev.p(dv, "float*"), dev.p(wc.bufs[0]), dev.p(wc.bufs[1]),
                                                      ffi.NULL, dev.p(pos, "int32_t*"), dev.p(npast, "int32_t*"),
                                                      shape, rope, CHUNK, dev.p(ws), dev.stream),
                         "fd_attention_decode_rope")
        else:
            native.check(lib.fd_rope_kv_write(dev.p(dq, "float*"), dev.p(dk, "float*"), dev.p(dv, "float*"),
                                              dev.p(wc.bufs[0]), dev.p(wc.bufs[1]), ffi.NULL, dev.p(pos, "int32_t*"),
                                              dev.p(npast, "int32_t*"), 1, shape, rope, dev.stream), "fd_rope_kv_write")
            native.check(lib.fd_attention_decode(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(wc.bufs[0]),
                                                 dev.p(wc.bufs[1]), dev.p(npast, "int32_t*"), shape, CHUNK, dev.p(ws),
                                                 dev.stream), "fd_attention_decode")
        dev.synchronize()
        results.append((dev.download(o), dev.download(wc.bufs[0]), dev.download(wc.bufs[1])))
    for fused, plain in zip(*results):
        np.testing.assert_array_equal(fused, plain)
    for kind, raw in zip(types, results[0][1:]):                       # the new row's copy is in the ring
        if kind != "f16":
            off = lib.fd_kv_window_offset(KV_TYPE_CODES[kind], n_kv_heads, max_ctx, d)
            ring = raw[off:].view(np.float16).reshape(n_kv_heads, slots, d)
            assert not np.isnan(ring[:, n_past % slots]).any()
