"""fd_attention_decode_rope (the one-row decode step's rope + K/V write + split-K attention in one op)
against its contract: bit for bit fd_rope_kv_write + fd_attention_decode (o and both whole caches), on
awkward shapes; against a float64 oracle; and at the runner level, where greedy decoding and the tree
verification path (fd_rope_kv_write + fd_attention_masked) must still reproduce the one-row step
bitwise (row invariance).
"""
import numpy as np
import pytest
from tests.gpu.attention_oracle import attention_oracle, random_cache

from flashd.daemon.backends.cuda.ops import attention_shape, rope_scaling_struct, rope_struct
from flashd.daemon.backends.reference import ReferenceOps

CHUNK = 64          # the runner's DECODE_CHUNK_SLOTS; other chunk lengths are covered below


class Pair:
    """One shape on the device: the fused op and the two-kernel path, each on its own copy of the same
    cache (slots >= n_written hold NaN: a stale slot n_past must never reach o), re-launchable at any
    (n_past, position) like a replayed graph."""

    def __init__(self, native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, chunk_len, rope_dim, neox,
                 theta=1e6, n_written=None, scaling=None):
        self.native, self.dev, self.rng = native, dev, rng
        # scaling: a RopeScaling (linear / YaRN) or None; passed to both paths as an fd_rope_scaling_t
        self.scaling = scaling
        self.scaling_arg = rope_scaling_struct(native.ffi, scaling, rope_dim, float(np.float32(theta)))
        self.shape = (n_heads, n_kv_heads, head_dim, max_ctx, chunk_len)
        self.rope = (rope_dim, np.float32(theta), int(neox))
        self.kc, self.vc = random_cache(rng, n_kv_heads, max_ctx, head_dim, max_ctx if n_written is None
                                        else n_written)
        self.scale = 1.0 / np.sqrt(head_dim)
        self.attn = attention_shape(native.ffi, n_heads, n_kv_heads, head_dim, max_ctx, self.scale)
        self.rope_arg = rope_struct(native.ffi, rope_dim, np.float32(theta), neox, self.scaling_arg)
        ws_bytes = native.lib.fd_attention_decode_workspace_bytes(self.attn, chunk_len)
        self.ws = [dev.empty((max(ws_bytes, 16),), np.uint8) for _ in range(2)]
        self.n_past = dev.upload(np.zeros(1, np.int32))
        self.pos = dev.upload(np.zeros(1, np.int32))
        self.o = [dev.empty((n_heads * head_dim,)) for _ in range(2)]

    def inputs(self, scale=1.0):
        n_heads, n_kv_heads, head_dim = self.shape[:3]
        rng = self.rng
        q = (rng.standard_normal((1, n_heads, head_dim)) * scale).astype(np.float32)
        k = (rng.standard_normal((1, n_kv_heads, head_dim)) * scale).astype(np.float32)
        v = rng.standard_normal((1, n_kv_heads, head_dim)).astype(np.float32)
        return q, k, v

    def run(self, q, k, v, n_past, pos=None):
        """(o fused, o two kernels, (k_cache, v_cache) fused, (k_cache, v_cache) two kernels, q/k after the
        fused op), all downloaded; both paths start from self.kc / self.vc."""
        chunk_len = self.shape[4]
        dev, lib, check, p = self.dev, self.native.lib, self.native.check, self.dev.p
        dev.upload(np.array([n_past], np.int32), out=self.n_past)
        dev.upload(np.array([n_past if pos is None else pos], np.int32), out=self.pos)
        caches = [(dev.upload(self.kc), dev.upload(self.vc)) for _ in range(2)]
        for t in (*self.o, *self.ws):
            dev.fill_bytes(t, 0xFF)                   # NaN garbage: stale partials / outputs show up
        # fused
        dq, dk, dv = dev.upload(q), dev.upload(k), dev.upload(v)
        (kc, vc), ws, o = caches[0], self.ws[0], self.o[0]
        check(lib.fd_attention_decode_rope(p(o, "float*"), p(dq, "float*"), p(dk, "float*"), p(dv, "float*"), p(kc),
                                           p(vc), p(None), p(self.pos, "int32_t*"), p(self.n_past, "int32_t*"),
                                           self.attn, self.rope_arg, chunk_len, p(ws), dev.stream),
              "fd_attention_decode_rope")
        # the two kernels (rotating copies of q, k in place)
        dq2, dk2 = dev.upload(q), dev.upload(k)
        (kc2, vc2), ws2, o2 = caches[1], self.ws[1], self.o[1]
        check(lib.fd_rope_kv_write(p(dq2, "float*"), p(dk2, "float*"), p(dv, "float*"), p(kc2), p(vc2), p(None),
                                   p(self.pos, "int32_t*"), p(self.n_past, "int32_t*"), 1, self.attn, self.rope_arg,
                                   dev.stream), "fd_rope_kv_write")
        check(lib.fd_attention_decode(p(o2, "float*"), p(dq2, "float*"), p(kc2), p(vc2), p(self.n_past, "int32_t*"),
                                      self.attn, chunk_len, p(ws2), dev.stream), "fd_attention_decode")
        dev.synchronize()
        down = dev.download
        return (down(o), down(o2), (down(kc), down(vc)), (down(kc2), down(vc2)), (down(dq), down(dk)))

    def check_bitwise(self, n_past, pos=None, scale=1.0):
        q, k, v = self.inputs(scale)
        o, o2, (kc, vc), (kc2, vc2), (q_after, k_after) = self.run(q, k, v, n_past, pos)
        where = f"shape {self.shape} rope {self.rope} n_past {n_past} pos {pos}"
        assert np.array_equal(o.view(np.uint32), o2.view(np.uint32)), f"o differs: {where}"
        assert np.array_equal(kc.view(np.uint16), kc2.view(np.uint16)), f"k_cache differs: {where}"
        assert np.array_equal(vc.view(np.uint16), vc2.view(np.uint16)), f"v_cache differs: {where}"
        assert np.array_equal(q_after, q) and np.array_equal(k_after, k), "the fused op must not modify q / k"
        if 0 <= n_past < self.shape[3]:
            assert np.isfinite(o).all(), f"o not finite (a stale slot read?): {where}"
        return q, k, v, o, kc, vc


def chunk_edges(chunk_len, max_ctx):
    """n_past at the first chunk boundaries -1 / 0 / +1 and the last slot."""
    out = {0, 1, max_ctx - 1}
    for b in (chunk_len, 2 * chunk_len, 5 * chunk_len):
        out |= {b - 1, b, b + 1}
    return sorted(n for n in out if 0 <= n < max_ctx)


# n_heads, n_kv_heads, head_dim, max_ctx, chunk_len, rope_dim, neox
SHAPES = [
    (12, 2, 128, 4096, 64, 128, 1),     # Qwen2.5-1.5B, the runner's chunk
    (14, 2, 64, 1000, 64, 64, 1),       # 0.5B; max_ctx not a multiple of the chunk
    (8, 8, 64, 777, 128, 32, 0),        # G = 1, partial adjacent-pair rope
    (6, 1, 128, 2048, 64, 64, 1),       # G = 6, partial NeoX rope
    (28, 4, 128, 1500, 192, 128, 0),    # G = 7, chunk 192
    (16, 1, 128, 2048, 64, 96, 0),      # G = 16: one full row tile
    (40, 2, 128, 1500, 64, 128, 1),     # G = 20: two row tiles (only tile 0 writes the cache)
    (40, 2, 64, 640, 128, 48, 1),       # G = 20, head_dim 64
    (24, 4, 256, 1200, 128, 64, 1),     # head_dim 256 (qwen35-style partial rope)
    (8, 2, 256, 1001, 64, 64, 1),       # Qwen3.5-0.8B: G = 4, rope_dim 64 of 256, NeoX
    (12, 2, 256, 777, 64, 64, 0),       # head_dim 256, G = 6, partial adjacent-pair rope
    (12, 2, 128, 64, 64, 128, 1),       # max_ctx = one chunk: n_splits = 1, the split kernel writes o
    (12, 2, 128, 256, 64, 128, 0),      # a few splits (4 chunks)
    (12, 2, 128, 32768, 64, 128, 1),    # 1.5B at 32K: many splits with several chunks each
]


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,max_ctx,chunk_len,rope_dim,neox", SHAPES)
def test_fused_equals_rope_kv_write_plus_decode_bitwise(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx,
                                                       chunk_len, rope_dim, neox):
    depths = chunk_edges(chunk_len, max_ctx) + [int(rng.integers(0, max_ctx))]
    for n_past in depths:
        # slots >= n_past NaN: the stale row at n_past must be replaced, never read
        pair = Pair(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, chunk_len, rope_dim, neox,
                    n_written=n_past)
        pair.check_bitwise(n_past)
    # peaked scores (large q, k), and a position other than n_past (tree-style: the rope reads *positions)
    pair = Pair(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, chunk_len, rope_dim, neox, theta=1e4)
    pair.check_bitwise(max_ctx // 2, scale=4.0)
    pair.check_bitwise(max_ctx // 3, pos=1_000_003)


def test_fused_out_of_range_slot_is_not_written(native, dev, rng):
    """n_past outside [0, max_ctx) (a host bug): as fd_rope_kv_write + fd_attention_decode -- no cache
    write, attention over the clamped range -- bit for bit."""
    pair = Pair(native, dev, rng, 12, 2, 128, 300, 64, 128, 1)
    for n_past in (300, 5000, -1):
        _, _, _, _, kc, vc = pair.check_bitwise(n_past)
        assert np.array_equal(kc.view(np.uint16), pair.kc.view(np.uint16))
        assert np.array_equal(vc.view(np.uint16), pair.vc.view(np.uint16))


def test_fused_replay_across_steps(native, dev, rng):
    """Consecutive steps on one cache, as the captured decode step runs: each step's written row is the
    next step's context (only the fused op writes this cache; the two-kernel path is recomputed from it)."""
    n_heads, n_kv_heads, head_dim, max_ctx = 12, 2, 128, 512
    pair = Pair(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, CHUNK, 128, 1, n_written=60)
    for n_past in range(60, 70):
        _, _, _, _, kc, vc = pair.check_bitwise(n_past)
        pair.kc, pair.vc = kc, vc                    # the fused op's cache is the next step's input


# float64 oracle. Tolerance: ReferenceOps.rope rounds cos/sin to float32 like the kernel (<= 1 float ulp of
# cos/sin apart: 1.2e-7 * (|a| + |b|)); the written K row is checked against float16(reference rope) to
# 1 float16 ulp (a rotation that lands within 1e-7 of a float16 rounding midpoint may round either way),
# and the attention is then checked against float64 over the cache as written, with
# test_attention_decode's budget (q and P split into float16 hi + lo, float32 accumulation: a few 1e-6).
ATOL, RTOL = 3e-5, 1e-4


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,max_ctx,chunk_len,rope_dim,neox", SHAPES[:11])
def test_fused_matches_float64_oracle(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, chunk_len,
                                      rope_dim, neox):
    ref = ReferenceOps()
    theta = 1e6
    pair = Pair(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, chunk_len, rope_dim, neox, theta=theta)
    for n_past in (0, chunk_len, max_ctx - 1, int(rng.integers(1, max_ctx))):
        pos = n_past + 17
        q, k, v = pair.inputs()
        o, _, (kc, vc), _, _ = pair.run(q, k, v, n_past, pos)
        positions = np.array([pos])
        q_rot = ref.rope(q, positions, float(np.float32(theta)), rope_dim, bool(neox))
        k_rot = ref.rope(k, positions, float(np.float32(theta)), rope_dim, bool(neox))
        k_row = kc[:, n_past].astype(np.float32)
        want_row = k_rot[0].astype(np.float16).astype(np.float32)
        ulp = np.abs(np.spacing(k_rot[0].astype(np.float16))).astype(np.float32)
        assert (np.abs(k_row - want_row) <= ulp).all(), "written K row vs float16(reference rope)"
        assert np.array_equal(vc[:, n_past], v[0].astype(np.float16)), "written V row"
        visible = np.zeros((1, max_ctx), bool)
        visible[0, :n_past + 1] = True
        want = attention_oracle(q_rot, kc, vc, visible, pair.scale)[0]
        np.testing.assert_allclose(o, want, rtol=RTOL, atol=ATOL, err_msg=f"n_past={n_past}")


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,max_ctx,chunk_len,rope_dim,neox,yarn", [
    (12, 2, 128, 4096, 64, 128, 1, False),     # 1.5B: one split at 100 keys, a split grid at 3000
    (14, 2, 64, 1000, 64, 64, 1, True),        # 0.5B's heads, YaRN
    (8, 8, 64, 777, 128, 32, 0, False),        # partial adjacent-pair rope
    (8, 2, 256, 1001, 64, 64, 1, False),       # head_dim 256, rope_dim 64 (qwen35-style)
])
def test_the_rope_table_gives_the_computed_bits(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, chunk_len,
                                                rope_dim, neox, yarn):
    """fd_rope_t.table (flashd_attention.h): a launch that stores the position's cos / sin (mode 1) and one that reads
    them (mode 2) give the computing launch's o and caches bit for bit; a table of another position is really read
    (o changes), so the equality is not the table being ignored."""
    from flashd.daemon.models.config import RopeScaling
    scaling = RopeScaling.create("yarn", 4.0, 64) if yarn else None
    pair = Pair(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, chunk_len, rope_dim, neox, scaling=scaling)
    table = dev.empty((256,), np.float32)
    dev.fill_bytes(table, 0xFF)                                   # NaN: an entry the store missed shows up
    theta = np.float32(1e6)
    ropes = [pair.rope_arg] + [rope_struct(native.ffi, rope_dim, theta, neox, pair.scaling_arg, dev.p(table, "float*"),
                                           mode) for mode in (1, 2)]
    lib, p = native.lib, dev.p

    def fused(rope, q, k, v, n_past, pos):
        dev.upload(np.array([n_past], np.int32), out=pair.n_past)
        dev.upload(np.array([pos], np.int32), out=pair.pos)
        kc, vc = dev.upload(pair.kc), dev.upload(pair.vc)
        dq, dk, dv = dev.upload(q), dev.upload(k), dev.upload(v)
        o = pair.o[0]
        dev.fill_bytes(o, 0xFF)
        native.check(lib.fd_attention_decode_rope(p(o, "float*"), p(dq, "float*"), p(dk, "float*"), p(dv, "float*"),
                                                  p(kc), p(vc), p(None), p(pair.pos, "int32_t*"),
                                                  p(pair.n_past, "int32_t*"), pair.attn, rope, chunk_len, p(pair.ws[0]),
                                                  dev.stream), "fd_attention_decode_rope")
        dev.synchronize()
        return [dev.download(t).view(np.uint32 if t is o else np.uint16) for t in (o, kc, vc)]

    for n_past in (100, min(3000, max_ctx - 2)):
        pos = n_past + 7
        q, k, v = pair.inputs()
        want = fused(ropes[0], q, k, v, n_past, pos)
        for mode in (1, 2):
            got = fused(ropes[mode], q, k, v, n_past, pos)
            assert all(np.array_equal(g, w) for g, w in zip(got, want)), f"mode {mode}, n_past {n_past}"
        # the table now holds pos's; read at another position it must change o (and equal nothing computed there)
        other = fused(ropes[2], q, k, v, n_past, pos + 1)
        assert not np.array_equal(other[0], fused(ropes[0], q, k, v, n_past, pos + 1)[0])


def test_fused_rejects_bad_arguments(native, dev):
    t = dev.empty((4096,))
    i = dev.upload(np.zeros(1, np.int32))
    p = dev.p

    def call(n_heads=12, n_kv_heads=2, head_dim=128, chunk_len=64, rope_dim=128, theta=1e6, positions=i):
        return native.lib.fd_attention_decode_rope(p(t, "float*"), p(t, "float*"), p(t, "float*"), p(t, "float*"), p(t),
                                                   p(t), p(None), p(positions, "int32_t*"), p(i, "int32_t*"),
                                                   attention_shape(native.ffi, n_heads, n_kv_heads, head_dim, 64, 0.1),
                                                   rope_struct(native.ffi, rope_dim, theta, 1, native.ffi.NULL),
                                                   chunk_len, p(t), dev.stream)
    lib = native.lib
    assert call(chunk_len=100) == lib.FD_E_ARG       # chunk_len not a multiple of 64
    assert call(n_kv_heads=5) == lib.FD_E_ARG        # heads not a multiple of kv heads
    assert call(rope_dim=130) == lib.FD_E_ARG        # rope_dim > head_dim
    assert call(rope_dim=63) == lib.FD_E_ARG         # odd rope_dim
    assert call(theta=0.0) == lib.FD_E_ARG
    assert call(positions=None) == lib.FD_E_ARG
    assert call(head_dim=96, rope_dim=96) == lib.FD_E_SHAPE
    for mode, table in ((1, None), (2, None), (3, t), (-1, t)):   # a mode without a table, or out of range
        rope = rope_struct(native.ffi, 128, 1e6, 1, native.ffi.NULL, p(table, "float*"), mode)
        assert native.lib.fd_attention_decode_rope(p(t, "float*"), p(t, "float*"), p(t, "float*"), p(t, "float*"),
                                                   p(t), p(t), p(None), p(i, "int32_t*"), p(i, "int32_t*"),
                                                   attention_shape(native.ffi, 12, 2, 128, 64, 0.1), rope, 64, p(t),
                                                   dev.stream) == lib.FD_E_ARG


# ---- the runner: the decode graph runs the fused op; everything it feeds must be unchanged -------------
@pytest.fixture(scope="module")
def backend(native):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    return CudaBackend()


def _runner(backend, path, max_ctx=256, chunk=64):
    from flashd.daemon.models import load_model, open_model
    from flashd.daemon.models.weights import total_weight_bytes
    f, cfg = open_model(path)
    plan = backend.plan(cfg, total_weight_bytes(f, cfg), max_ctx, chunk)
    lm = load_model((f, cfg), backend.ops.load_weight)
    runner = backend.make_runner(cfg, lm.weights, max_ctx, chunk, plan)
    assert runner.forward_path == "graph"
    return runner


def _one_row_logits(runner, prompt, tokens):
    """Logits of each token fed one row at a time (no mask: the decode step's ops, eagerly)."""
    runner.reset()
    runner.prefill(prompt)
    return np.concatenate([runner.prefill([t], all_logits=True) for t in tokens])


@pytest.mark.parametrize("arch,hidden,n_heads,n_kv_heads,head_dim", [
    ("qwen2", 256, 4, 2, None),      # head_dim 64, G = 2
    ("llama", 512, 8, 1, None),      # head_dim 64, G = 8, adjacent-pair rope
    ("qwen3", 256, 4, 1, 128),       # head_dim 128, q/k norms before the rope
    ("qwen3", 256, 4, 1, 256),       # head_dim 256, G = 4
    ("qwen3", 512, 12, 2, 256),      # head_dim 256, G = 6
])
def test_runner_decode_is_bitwise_the_two_kernel_step(backend, synthetic_model, arch, hidden, n_heads, n_kv_heads,
                                                      head_dim):
    """Greedy graph decoding and one-row logits with fd_attention_decode_rope equal, bit for bit, the
    same steps with fd_rope_kv_write + fd_attention_decode (CudaOps.fuse_decode_rope = False)."""
    from flashd.protocol.messages import SamplingParams
    path = synthetic_model(arch=arch, weight_type="Q4_K", n_layers=3, hidden=hidden, n_heads=n_heads,
                           n_kv_heads=n_kv_heads, head_dim=head_dim, ffn=512, vocab_size=1000)
    run = _runner(backend, path)
    ops = backend.ops
    rng = np.random.default_rng(101)
    prompt = rng.integers(0, 1000, 70).tolist()        # 70: past a 64-slot chunk boundary
    tokens = rng.integers(0, 1000, 12).tolist()
    try:                        # eager rows first: each path's kernels are loaded before a graph captures them
        ops.fuse_decode_rope = True
        run.drop_graphs()
        fused_logits = _one_row_logits(run, prompt, tokens)
        fused_tokens = [s.token for s in run.generate(prompt, SamplingParams(), 40)]
        ops.fuse_decode_rope = False
        run.drop_graphs()
        plain_logits = _one_row_logits(run, prompt, tokens)
        plain_tokens = [s.token for s in run.generate(prompt, SamplingParams(), 40)]
    finally:
        ops.fuse_decode_rope = True
        run.drop_graphs()
    assert fused_tokens == plain_tokens
    assert np.array_equal(fused_logits.view(np.uint32), plain_logits.view(np.uint32))


def test_runner_tree_rows_equal_fused_one_row_steps(backend, synthetic_model):
    """Row invariance with the fused decode step: a chain verified in one forward (fd_rope_kv_write +
    fd_attention_masked) gives, bit for bit, the logits of one-row steps (fd_attention_decode_rope),
    and the decode graph's greedy continuation picks the tree's argmax."""
    path = synthetic_model(arch="qwen2", weight_type="Q4_K", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                           ffn=512, vocab_size=1000)
    run = _runner(backend, path)
    assert backend.ops.fuse_decode_rope
    rng = np.random.default_rng(102)
    prompt = rng.integers(0, 1000, 61).tolist()         # the chain crosses the 64-slot chunk boundary
    chain = rng.integers(0, 1000, 8).tolist()           # <= GRAPH_FEED_MAX: greedy_continue feeds the graph
    run.reset()
    run.prefill(prompt)
    base = run.n_past
    n = len(chain)
    tree = run.logits_to_host(run.forward_tree(chain, np.arange(base, base + n),
                                               np.tril(np.ones((n, n), np.uint8)))).copy()
    rows = _one_row_logits(run, prompt, chain)
    assert np.array_equal(tree.view(np.uint32), rows.view(np.uint32))
    run.reset()
    run.prefill(prompt)
    assert run.greedy_continue(chain, 1)[0] == int(np.argmax(tree[-1]))
