"""fd_attention_masked_rope (ABI 31: a verify forward's RoPE + K/V write + masked split-K attention in one launch)
against its contract: bit for bit fd_rope_kv_write + fd_attention_masked -- o, both whole caches, and q / k left as
given -- on awkward shapes (GQA 1 / 6 / 7 / 16 / 20, partial and adjacent-pair rope, head_dim 64 / 128), masks of
every kind (random trees, causal chains, a DFlash block's all-ones, random rows including empty ones and rows that do
not see themselves), 1 .. 48 rows, shallow and split depths; the rows table fd_rope_kv_write stores in mode 1 against
numpy's float64 cos / sin (within one float32 ulp, rope.cu's accuracy statement), and mode 1 leaving its other results
unchanged; refusals of what the kernel does not take; and the verify forward with the tuning's attn_masked_rope on
against off, logits bit for bit, the fused launch counted so the path is known to run.
"""
import numpy as np
import pytest

from tests.gpu.attention_oracle import random_cache, tree_mask
from tests.gpu.test_forward import cuda_runner, random_tree
from tests.gpu.test_gemv import bits
from tests.gpu.test_o_codes import CountingLib, backend  # noqa: F401 (backend: the module's CudaBackend fixture)

from flashd.daemon.backends.cuda.ops import attention_shape, rope_struct

CHUNK = 64
FD_E_ARG, FD_E_SHAPE = -1, -3
MAX_NEW = 48


def masks(rng, n):
    """name -> (n, n) uint8 mask"""
    out = {"tree": tree_mask(rng, n), "causal": np.tril(np.ones((n, n), np.uint8)),
           "block": np.ones((n, n), np.uint8)}
    r = (rng.random((n, n)) < 0.4).astype(np.uint8)
    if n > 2:
        r[1] = 0                                  # a row that sees no new slot
        r[2, 2] = 0                               # and one that does not see itself
    out["random"] = r
    return out


def run_pair(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, rope_dim, neox, n, n_past, mask,
             theta=1e6, max_keys=0):
    """(fused, two-kernel) results: o, k cache, v cache, q and k after, and the rows table (downloaded)."""
    ffi, lib, p = native.ffi, native.lib, dev.p
    kc, vc = random_cache(rng, n_kv_heads, max_ctx, head_dim, n_past)
    q = rng.standard_normal((n, n_heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((n, n_kv_heads, head_dim)).astype(np.float32)
    v = rng.standard_normal((n, n_kv_heads, head_dim)).astype(np.float32)
    positions = (n_past + tree_depths(mask)).astype(np.int32)
    shape = attention_shape(ffi, n_heads, n_kv_heads, head_dim, max_ctx, max_keys=max_keys)
    table = dev.empty((n * rope_dim,), np.float32)
    dev.fill_bytes(table, 0xFF)
    rope_store = rope_struct(ffi, rope_dim, np.float32(theta), neox, None, p(table, "float*"), 1)
    rope_read = rope_struct(ffi, rope_dim, np.float32(theta), neox, None, p(table, "float*"), 2)
    ws_bytes = lib.fd_attention_workspace_bytes(n, shape, CHUNK)
    keep = []                                     # uploads held until the kernels have run

    def up(a):
        t = dev.upload(a)
        keep.append(t)
        return t
    dpos, dnp, dmask, dv = up(positions), up(np.array([n_past], np.int32)), up(mask), up(v)
    res = []
    for fused in (False, True):                   # the two kernels first: they store the table the fused one reads
        dq, dk, dkc, dvc = up(q), up(k), up(kc), up(vc)
        o = dev.empty((n, n_heads * head_dim))
        dev.fill_bytes(o, 0xFF)
        ws = dev.empty((max(ws_bytes, 16),), np.uint8)
        dev.fill_bytes(ws, 0xFF)
        keep += [o, ws]
        if fused:
            st = lib.fd_attention_masked_rope(p(o, "float*"), p(dq, "float*"), p(dk, "float*"), p(dv, "float*"),
                                              p(dkc), p(dvc), p(dmask, "uint8_t*"), p(dnp, "int32_t*"), n, shape,
                                              rope_read, CHUNK, p(ws), ws_bytes, dev.stream)
            assert st == 0, st
        else:
            native.check(lib.fd_rope_kv_write(p(dq, "float*"), p(dk, "float*"), p(dv, "float*"), p(dkc), p(dvc),
                                              p(None), p(dpos, "int32_t*"), p(dnp, "int32_t*"), n, shape, rope_store,
                                              dev.stream), "fd_rope_kv_write")
            native.check(lib.fd_attention_masked(p(o, "float*"), p(dq, "float*"), p(dkc), p(dvc),
                                                 p(dmask, "uint8_t*"), p(dnp, "int32_t*"), n, shape, CHUNK, p(ws),
                                                 ws_bytes, dev.stream), "fd_attention_masked")
        dev.synchronize()
        res.append((dev.download(o), dev.download(dkc), dev.download(dvc), dev.download(dq), dev.download(dk)))
    dev.synchronize()
    return res[1], res[0], (q, k), positions, dev.download(table)


def tree_depths(mask):
    """a row's position offset: its visible new slots before itself (a tree node's depth; any mask: a count)"""
    n = mask.shape[0]
    return np.array([int(mask[i, :i].sum()) for i in range(n)])


# n_heads, n_kv_heads, head_dim, max_ctx, rope_dim, neox
SHAPES = [
    (12, 2, 128, 4096, 128, 1),     # Qwen2.5-1.5B
    (14, 2, 64, 1000, 64, 1),       # 0.5B; max_ctx not a multiple of the chunk
    (8, 8, 64, 777, 32, 0),         # G = 1, partial adjacent-pair rope
    (6, 1, 128, 2048, 64, 1),       # G = 6, partial NeoX rope
    (28, 4, 128, 1500, 128, 0),     # G = 7, adjacent pairs
    (16, 1, 128, 2048, 96, 0),      # G = 16: one full row tile
    (40, 2, 128, 1500, 128, 1),     # G = 20: two row tiles (only tile 0 writes the cache)
    (40, 2, 64, 640, 48, 1),        # G = 20, head_dim 64
]


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,max_ctx,rope_dim,neox", SHAPES)
@pytest.mark.parametrize("n,n_past", [(1, 0), (2, 1), (5, 63), (16, 100), (33, 250), (MAX_NEW, 0), (8, 600)])
def test_fused_equals_rope_kv_write_plus_masked_bitwise(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx,
                                                       rope_dim, neox, n, n_past):
    if n_past + n > max_ctx:
        pytest.skip("the host keeps n_past + n <= max_ctx")
    for name, mask in masks(rng, n).items():
        for max_keys in (0, 256):                 # the deep plan and a shallow graph's bound
            if max_keys and n_past + n > max_keys:
                continue
            (o, kc, vc, q_after, k_after), (o2, kc2, vc2, _, _), (q, k), positions, table = run_pair(
                native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, rope_dim, neox, n, n_past, mask,
                max_keys=max_keys)
            where = f"{name} mask, n {n}, n_past {n_past}, max_keys {max_keys}"
            assert np.array_equal(bits(o), bits(o2)), f"o differs: {where}"
            assert np.array_equal(kc.view(np.uint16), kc2.view(np.uint16)), f"k cache differs: {where}"
            assert np.array_equal(vc.view(np.uint16), vc2.view(np.uint16)), f"v cache differs: {where}"
            assert np.array_equal(q_after, q) and np.array_equal(k_after, k), "the fused op must not modify q / k"
            seen = mask.any(1) | (n_past > 0)
            assert np.isfinite(o[seen]).all(), f"a row with keys is not finite (a stale slot read?): {where}"


@pytest.mark.parametrize("theta,rope_dim,neox", [(1e6, 128, 1), (1e4, 64, 0), (5e5, 96, 1)])
def test_rows_table_holds_each_rows_cos_and_sin(native, dev, rng, theta, rope_dim, neox):
    """fd_rope_kv_write's mode 1: row i's pair j at table[i * rope_dim + 2j] (cos) and + 1 (sin), within one float32
    ulp of numpy's float64 (the device's double pow / sincos, rounded once: rope.cu)."""
    n, n_past = 7, 3000
    mask = tree_mask(rng, n)
    _, _, _, positions, table = run_pair(native, dev, rng, 12, 2, 128, 4096, rope_dim, neox, n, n_past, mask,
                                         theta=theta)
    j = np.arange(rope_dim // 2)
    inv = np.float64(np.float32(theta)) ** (-2.0 * j / rope_dim)
    ang = positions[:, None].astype(np.float64) * inv[None, :]
    t = table.reshape(n, rope_dim // 2, 2)
    for got, want in ((t[..., 0], np.cos(ang)), (t[..., 1], np.sin(ang))):
        ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        assert (np.abs(got.astype(np.float64) - want) <= ulp + 1e-12).all()


def test_refusals(native, dev, rng):
    """FD_E_SHAPE for what the kernel does not take (the caller then runs the two launches): a quantized K or V, a
    window, head_dim 256, more than 48 rows; FD_E_ARG for a table not in mode 2 and a misaligned v."""
    ffi, lib, p = native.ffi, native.lib, dev.p
    buf = dev.empty((1 << 22,), np.float32)
    table = dev.empty((64 * 256,), np.float32)
    mask = dev.upload(np.ones((64, 64), np.uint8))
    npast = dev.upload(np.zeros(1, np.int32))
    base = p(buf, "float*")

    def call(n=4, head_dim=128, k_type="f16", mode=2, v_off=0):
        shape = attention_shape(ffi, 12, 2, head_dim, 1024, k_type=k_type)
        rope = rope_struct(ffi, 64, 1e6, 1, None, p(table, "float*"), mode)
        return lib.fd_attention_masked_rope(base, base, base, ffi.cast("float*", base) + v_off, p(buf), p(buf),
                                            p(mask, "uint8_t*"), p(npast, "int32_t*"), n, shape, rope, CHUNK,
                                            p(buf), buf.nbytes, dev.stream)
    assert call(k_type="q8_0") == FD_E_SHAPE
    assert call(head_dim=256) == FD_E_SHAPE
    assert call(n=MAX_NEW + 1) == FD_E_SHAPE
    assert call(mode=1) == FD_E_ARG and call(mode=0) == FD_E_ARG
    assert call(v_off=1) == FD_E_ARG
    dev.synchronize()


MODEL = dict(arch="qwen2", weight_type="Q4_K", n_layers=3, hidden=512, n_heads=4, n_kv_heads=2, ffn=1024,
             vocab_size=1000, name="masked-rope")     # head_dim 128
MODEL_64 = dict(arch="qwen2", weight_type="Q4_K", n_layers=2, hidden=512, n_heads=8, n_kv_heads=1, ffn=1024,
                vocab_size=1000, name="masked-rope-64")   # head_dim 64, GQA 8


@pytest.mark.parametrize("model", [MODEL, MODEL_64], ids=["head_dim_128", "head_dim_64"])
def test_the_verify_forward_is_bitwise_the_same_fused(backend, native, synthetic_model, model):
    path = synthetic_model(**model)
    prompts = [np.random.default_rng(404).integers(0, 1000, k).tolist() for k in (40, 300)]   # shallow, deep
    results = {}
    before = native.tuning()
    for on in (0, 1):
        native.set_tuning(**{**before, "attn_masked_rope": 48 * on})  # read by every forward (CudaOps.begin_forward)
        try:
            run = cuda_runner(backend, path, "graph", max_ctx=2048, chunk=64)
            counter = CountingLib(run.ops.lib, ("fd_attention_masked_rope", "fd_attention_masked"))
            run.ops.lib = counter
            trees, greedy = [], []
            for prompt in prompts:
                run.reset()
                run.prefill(prompt)
                base = run.n_past
                for n in (1, 5, 13, 40):
                    _, mask, depth = random_tree(np.random.default_rng(n), n)
                    tokens = np.random.default_rng(100 + n).integers(0, 1000, n).tolist()
                    trees.append(run.logits_to_host(run.forward_tree(tokens, base + depth, mask)).copy())
                run.n_past = base
                greedy.append(run.greedy_continue([7, 8, 9], 24))
        finally:
            native.set_tuning(**before)
        results[on] = (trees, greedy, dict(counter.calls))
    (t0, g0, c0), (t1, g1, c1) = results[0], results[1]
    assert g0 == g1
    for a, b in zip(t0, t1):
        assert np.array_equal(bits(a), bits(b))
    assert c0["fd_attention_masked_rope"] == 0
    # every layer after the first of each of the 8 trees (captured once per shape, replayed: counted at capture)
    assert c1["fd_attention_masked_rope"] >= (model["n_layers"] - 1) * 4, c1
