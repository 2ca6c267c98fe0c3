"""The folded combine of the one-token attention launches (native/cuda/attention_splitk_combine.cuh:
fold_combine): fd_attention_decode and fd_attention_decode_rope no longer launch combine_kernel -- the last
split blocks of each query-row tile merge the partials -- and must give, bit for bit, what combine_kernel
gives, which fd_attention_masked still launches (so tree verification keeps reproducing decode exactly).

Checked here: decode o == masked(n = 1, mask [[1]]) o bitwise at depths whose active split counts span 1,
2, 3, several, a power of two +- 1 and the launch's maximum (lanes with one and two rounds of splits);
decode_rope o and cache rows == fd_rope_kv_write + masked; a workspace reused over many launches in a row
(no synchronisation between them), over graph replays, poisoned (0xFF) or zeroed, and shared by two shapes
(the arrival counters at its start must come back idle every time); and the float64 oracle at depth.
tests/emulation/test_attention_fold_emulation.py emulates the order and the counter protocol on the CPU.
"""
import numpy as np
import pytest
from tests.gpu.attention_oracle import attention_oracle, random_cache

from flashd.daemon.backends.cuda.ops import attention_shape, rope_struct

ATOL, RTOL = 3e-5, 1e-4        # test_attention_decode's budget
COUNTER_BYTES = 4096 * 4       # attention_splitk_combine.cuh: the arrival counters at the workspace's start


def bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


class Case:
    """One shape on the device: caches (slots >= n_written NaN), a decode workspace, and both paths."""

    def __init__(self, native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, chunk=64, n_written=None):
        self.native, self.dev, self.rng = native, dev, rng
        self.dims = (n_heads, n_kv_heads, head_dim, max_ctx, chunk)
        self.kc, self.vc = random_cache(rng, n_kv_heads, max_ctx, head_dim, max_ctx if n_written is None else n_written)
        self.dkc, self.dvc = dev.upload(self.kc), dev.upload(self.vc)
        self.scale = 1.0 / np.sqrt(head_dim)
        self.attn = attention_shape(native.ffi, n_heads, n_kv_heads, head_dim, max_ctx, self.scale)
        need = int(native.lib.fd_attention_workspace_bytes(1, self.attn, chunk))
        self.n_splits = 1 if need == 0 else (need - COUNTER_BYTES) // (n_heads * (head_dim + 2) * 4)
        self.ws = dev.empty((max(int(native.lib.fd_attention_decode_workspace_bytes(self.attn, chunk)), 16),), np.uint8)
        dev.fill_bytes(self.ws, 0xFF)               # NaN partials, idle (0xFFFFFFFF) counters
        self.n_past = dev.upload(np.zeros(1, np.int32))

    def depths(self):
        """n_past values whose active split count n_active = min(n_splits, ceil((n_past + 1) / chunk)) spans
        1, 2, 3, 5, 9, 16, 17, n_splits - 1, n_splits (first and last slot of the chunk), and the last slot."""
        chunk, max_ctx = self.dims[4], self.dims[3]
        out = {max_ctx - 1}
        for a in (1, 2, 3, 5, 9, 16, 17, self.n_splits - 1, self.n_splits):
            if a >= 1:
                out |= {a * chunk - chunk, a * chunk - 1}
        return sorted(n for n in out if 0 <= n < max_ctx)

    def q(self, scale=1.0):
        n_heads, _, head_dim = self.dims[:3]
        return (self.rng.standard_normal((1, n_heads, head_dim)) * scale).astype(np.float32)

    def decode(self, dq, n_past, o, ws=None):
        """fd_attention_decode (the folded combine) into o; no synchronisation."""
        dev, lib, p = self.dev, self.native.lib, self.dev.p
        dev.upload(np.array([n_past], np.int32), out=self.n_past)
        self.native.check(lib.fd_attention_decode(p(o, "float*"), p(dq, "float*"), p(self.dkc), p(self.dvc),
                                                  p(self.n_past, "int32_t*"), self.attn, self.dims[4],
                                                  p(self.ws if ws is None else ws), dev.stream), "fd_attention_decode")

    def masked(self, q, n_past, kc=None, vc=None):
        """fd_attention_masked over one token with mask [[1]] (split kernel + combine_kernel): o (H * d,)."""
        dev, lib, p = self.dev, self.native.lib, self.dev.p
        n_heads, _, head_dim, _, chunk = self.dims
        need = int(lib.fd_attention_workspace_bytes(1, self.attn, chunk))
        ws = dev.empty((max(need, 16),), np.uint8)
        dev.fill_bytes(ws, 0xFF)
        o = dev.empty((n_heads * head_dim,))
        dev.fill_bytes(o, 0xFF)
        dq, dmask = dev.upload(q), dev.upload(np.ones((1, 1), np.uint8))
        dnp = dev.upload(np.array([n_past], np.int32))
        self.native.check(lib.fd_attention_masked(p(o, "float*"), p(dq, "float*"), p(self.dkc if kc is None else kc),
                                                  p(self.dvc if vc is None else vc), p(dmask, "uint8_t*"),
                                                  p(dnp, "int32_t*"), 1, self.attn, chunk, p(ws), need, dev.stream),
                          "fd_attention_masked")
        dev.synchronize()
        return dev.download(o)

    def decode_now(self, q, n_past):
        o = self.dev.empty((self.dims[0] * self.dims[2],))
        self.dev.fill_bytes(o, 0xFF)
        self.decode(self.dev.upload(q), n_past, o)
        self.dev.synchronize()
        return self.dev.download(o)


SHAPES = [
    # n_heads, n_kv_heads, head_dim, max_ctx
    (12, 2, 128, 32768),      # Qwen2.5-1.5B: 2 tiles of 6 rows
    (14, 2, 64, 4100),        # 0.5B: 7 rows; max_ctx not a multiple of the chunk
    (8, 8, 64, 2000),         # MHA (group 1): 8 tiles of one row
    (16, 1, 128, 32768),      # one full tile; twice the splits: lanes with two rounds (13 x 16 < n_splits)
    (40, 2, 128, 3000),       # group 20: two row tiles per KV head (16 + 4 rows)
    (24, 4, 256, 9000),       # head_dim 256, 6 rows a tile
    (8, 1, 256, 16384),       # head_dim 256, 8 x 16 splits per round < n_splits: two rounds
    (12, 2, 128, 64),         # one chunk: n_splits = 1, the split kernel writes o (no fold)
]


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,max_ctx", SHAPES)
def test_decode_fold_is_combine_kernel_bitwise(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx):
    case = Case(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx)
    for n_past in case.depths():                     # one workspace throughout: counters reused
        q = case.q(scale=float(rng.uniform(0.5, 4.0)))
        got = case.decode_now(q, n_past)
        want = case.masked(q, n_past)
        assert np.isfinite(got).all(), f"n_past {n_past}: an output not written"
        assert np.array_equal(bits(got), bits(want)), f"n_past {n_past} (n_splits {case.n_splits})"


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,max_ctx", [SHAPES[0], SHAPES[3], SHAPES[6]])
def test_decode_fold_matches_float64_at_depth(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx):
    case = Case(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx)
    for n_past in (max_ctx - 1, case.n_splits * 64 - 1, 100):
        q = case.q(scale=3.0)
        visible = np.zeros((1, max_ctx), bool)
        visible[0, :n_past + 1] = True
        want = attention_oracle(q, case.kc, case.vc, visible, case.scale)[0]
        np.testing.assert_allclose(case.decode_now(q, n_past), want, rtol=RTOL, atol=ATOL, err_msg=f"n_past {n_past}")


def test_back_to_back_launches_leave_the_counters_idle(native, dev, rng):
    """Many launches on one workspace with no synchronisation between them (as the layers of a step run),
    at depths whose split counts change every launch; each output must be the combine_kernel result."""
    case = Case(native, dev, rng, 12, 2, 128, 16384)
    depths = [int(d) for d in rng.integers(0, 16384, 40)] + [0, 63, 64, 16383, 127, 5000]
    qs = [case.q() for _ in depths]
    outs = [dev.empty((12 * 128,)) for _ in depths]
    for o in outs:
        dev.fill_bytes(o, 0xFF)
    dqs = [dev.upload(q) for q in qs]
    for dq, n_past, o in zip(dqs, depths, outs):
        case.decode(dq, n_past, o)                   # n_past's upload is ordered on the same stream
    dev.synchronize()
    for q, n_past, o in zip(qs, depths, outs):
        assert np.array_equal(bits(dev.download(o)), bits(case.masked(q, n_past))), f"n_past {n_past}"


def test_graph_replays_reuse_the_counters(native, dev, rng):
    """fd_attention_decode captured once and replayed at changing depths (the decode step's graph)."""
    case = Case(native, dev, rng, 14, 2, 64, 8192)
    lib, ffi = native.lib, native.ffi
    q = case.q()
    dq = dev.upload(q)
    o = dev.empty((14 * 64,))
    native.check(lib.fd_graph_begin_capture(dev.stream), "fd_graph_begin_capture")
    native.check(lib.fd_attention_decode(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(case.dkc), dev.p(case.dvc),
                                         dev.p(case.n_past, "int32_t*"), case.attn, 64, dev.p(case.ws), dev.stream),
                 "fd_attention_decode")
    out = ffi.new("void**")
    native.check(lib.fd_graph_end_capture(dev.stream, out), "fd_graph_end_capture")
    try:
        for n_past in [8191, 0, 1, 64, 700, 8191, 130, 4095, 63, 2500]:
            dev.upload(np.array([n_past], np.int32), out=case.n_past)
            dev.fill_bytes(o, 0xFF)
            for _ in range(3):                       # replays back to back: the counters come back idle
                native.check(lib.fd_graph_launch(out[0], dev.stream), "fd_graph_launch")
            dev.synchronize()
            assert np.array_equal(bits(dev.download(o)), bits(case.masked(q, n_past))), f"n_past {n_past}"
    finally:
        lib.fd_graph_destroy(out[0])


@pytest.mark.parametrize("fill", [0x00, 0xFF])
def test_one_workspace_shared_by_two_shapes(native, dev, rng, fill):
    """The 1.5B and 0.5B shapes alternate on one workspace (as a target and its drafter may): the counters
    sit before every shape's partials, so neither shape's partials land on them; zeroed or 0xFF-filled."""
    a = Case(native, dev, rng, 12, 2, 128, 4096)
    b = Case(native, dev, rng, 14, 2, 64, 4096)
    ws = dev.empty((max(a.ws.nbytes, b.ws.nbytes),), np.uint8)
    dev.fill_bytes(ws, fill)
    for i in range(12):
        case = (a, b)[i % 2]
        n_past = int(rng.integers(0, 4096))
        q = case.q()
        o = dev.empty((case.dims[0] * case.dims[2],))
        case.decode(dev.upload(q), n_past, o, ws=ws)
        dev.synchronize()
        assert np.array_equal(bits(dev.download(o)), bits(case.masked(q, n_past))), f"launch {i}, n_past {n_past}"


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,max_ctx,rope_dim,neox", [
    (12, 2, 128, 8192, 128, 1),
    (40, 2, 64, 3000, 48, 1),
    (24, 4, 256, 9000, 64, 0),
])
def test_decode_rope_fold_is_rope_kv_write_plus_masked_bitwise(native, dev, rng, n_heads, n_kv_heads, head_dim,
                                                               max_ctx, rope_dim, neox):
    """The decode step's op (rope + K/V write + attention, combine folded) against the tree verification
    path's ops for the same token: fd_rope_kv_write + fd_attention_masked (combine_kernel)."""
    case = Case(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx)
    lib, p = native.lib, dev.p
    rope = rope_struct(native.ffi, rope_dim, float(np.float32(1e6)), neox)
    pos = dev.upload(np.zeros(1, np.int32))
    for n_past in case.depths():
        q, k, v = case.q(), case.q()[:, :n_kv_heads], case.q()[:, :n_kv_heads]
        dev.upload(np.array([n_past + 3], np.int32), out=pos)
        dev.upload(np.array([n_past], np.int32), out=case.n_past)
        kc1, vc1, kc2, vc2 = (dev.upload(case.kc), dev.upload(case.vc), dev.upload(case.kc), dev.upload(case.vc))
        dq, dk, dv = dev.upload(q), dev.upload(np.ascontiguousarray(k)), dev.upload(np.ascontiguousarray(v))
        o = dev.empty((n_heads * head_dim,))
        dev.fill_bytes(o, 0xFF)
        native.check(lib.fd_attention_decode_rope(p(o, "float*"), p(dq, "float*"), p(dk, "float*"), p(dv, "float*"),
                                                  p(kc1), p(vc1), p(pos, "int32_t*"), p(case.n_past, "int32_t*"),
                                                  case.attn, rope, 64, p(case.ws), dev.stream),
                     "fd_attention_decode_rope")
        dq2, dk2 = dev.upload(q), dev.upload(np.ascontiguousarray(k))
        native.check(lib.fd_rope_kv_write(p(dq2, "float*"), p(dk2, "float*"), p(dv, "float*"), p(kc2), p(vc2),
                                          p(pos, "int32_t*"), p(case.n_past, "int32_t*"), 1, case.attn, rope,
                                          dev.stream), "fd_rope_kv_write")
        dev.synchronize()
        want = case.masked(dev.download(dq2), n_past, kc2, vc2)
        where = f"n_past {n_past} (n_splits {case.n_splits})"
        assert np.array_equal(bits(dev.download(o)), bits(want)), where
        assert np.array_equal(dev.download(kc1).view(np.uint16), dev.download(kc2).view(np.uint16)), where
        assert np.array_equal(dev.download(vc1).view(np.uint16), dev.download(vc2).view(np.uint16)), where


def test_workspace_sizes_count_the_counters(native):
    shape = attention_shape(native.ffi, 12, 2, 128, 32768)
    decode = int(native.lib.fd_attention_decode_workspace_bytes(shape, 64))
    assert decode == COUNTER_BYTES + 12 * 512 * (128 + 2) * 4
    exact = int(native.lib.fd_attention_workspace_bytes(1, shape, 64))
    assert COUNTER_BYTES < exact <= decode
    assert (exact - COUNTER_BYTES) % (12 * 130 * 4) == 0
    assert int(native.lib.fd_attention_workspace_bytes(1, attention_shape(native.ffi, 12, 2, 128, 64), 64)) == 0
