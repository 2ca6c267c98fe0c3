"""o's int8 codes written by the attention (fd_attention_shape_t.o_codes) and read by the output projection
(fd_gemv_xq) -- ABI 30.

Oracles: the codes against numpy in float32 of the o the same launch returns (x_codes.cuh's definition: m = max |o|
over a head's 128 values, codes rint(o * float32(127 / m)) clipped to +-127, scale float32(m / 127); every step is one
correctly rounded float32 operation, so numpy gives the exact bits); fd_gemv_xq against fd_gemv on the same x, bit for
bit (the codes are x's, so the kernel's result cannot change); the forward with the tuning's attn_o_codes on against
off, bit for bit (logits of a decode graph and of shallow verify trees), with the calls counted so the codes path is
known to run. Wrong codes change a gemv_rows call's result (the codes are really read) and not a Q8_0 one's (that
launch quantizes x per 32 columns itself).
"""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.gpu.attention_oracle import random_cache, tree_mask
from tests.gpu.test_forward import cuda_runner, random_tree
from tests.gpu.test_gemv import bits, call_gemv

from flashd.daemon.backends.cuda.ops import attention_shape, gemv_rows_call
from flashd.scripts.random_weights import random_weights

FD_E_ARG = -1
CHUNK = 64


def codes_of(o: np.ndarray, n_heads: int):
    """x_codes.cuh on o (n, n_heads * 128) float32: codes (n, n_heads * 128) int8, scales (n, n_heads) float32."""
    n = o.shape[0]
    v = o.reshape(n, n_heads, 128).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = np.abs(v)
        m = np.where(np.isnan(a).all(-1), np.float32(np.nan), np.nanmax(np.where(np.isnan(a), -1, a), -1)).astype(
            np.float32)
        inv = np.where(m > 0, np.float32(127) / m, np.float32(0)).astype(np.float32)
        prod = (v * inv[..., None]).astype(np.float32)
        q = np.clip(np.rint(np.nan_to_num(prod, nan=0.0)), -127, 127).astype(np.int8)
        scale = (m / np.float32(127)).astype(np.float32)
    return q.reshape(n, -1), scale


def scales_layout(dev_scales: np.ndarray, n: int, n_heads: int) -> np.ndarray:
    """(n, n_heads) from flashd_attention.h's layout: row i, head h at ((i // 32) * n_heads + h) * 32 + i % 32."""
    flat = dev_scales.reshape(-1)
    return np.array([[flat[((i // 32) * n_heads + h) * 32 + i % 32] for h in range(n_heads)] for i in range(n)],
                    np.float32)


def run_masked(native, dev, q, kc, vc, mask, n_past, max_keys, codes):
    n, n_heads, head_dim = q.shape
    n_kv_heads, max_ctx = kc.shape[0], kc.shape[1]
    shape = attention_shape(native.ffi, n_heads, n_kv_heads, head_dim, max_ctx, max_keys=max_keys)
    ws_bytes = native.lib.fd_attention_workspace_bytes(n, shape, CHUNK)
    ws = dev.empty((max(ws_bytes, 16),), np.uint8)
    o = dev.empty((n, n_heads * head_dim))
    dev.fill_bytes(o, 0xFF)
    xq = dev.empty((-(-n // 8) * 8, n_heads * head_dim), np.int8)
    xsc = dev.empty((-(-n // 32) * n_heads, 32), np.float32)
    dev.fill_bytes(xq, 0x55)
    dev.fill_bytes(xsc, 0xFF)
    if codes:
        shape.o_codes = dev.p(xq, "int8_t*")
        shape.o_scales = dev.p(xsc, "float*")
    # the uploads held until the kernel has run (a cffi pointer does not keep its allocation alive)
    dq, dkc, dvc, dmask = dev.upload(q), dev.upload(kc), dev.upload(vc), dev.upload(mask)
    dnp = dev.upload(np.array([n_past], np.int32))
    st = native.lib.fd_attention_masked(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(dkc), dev.p(dvc),
                                        dev.p(dmask, "uint8_t*"), dev.p(dnp, "int32_t*"), n, shape, CHUNK,
                                        dev.p(ws), ws_bytes, dev.stream)
    dev.synchronize()
    return st, dev.download(o), dev.download(xq)[:n], dev.download(xsc)


@pytest.mark.parametrize("n_heads,n_kv_heads,n,n_past,max_ctx,max_keys", [
    (12, 2, 2, 0, 4096, 256),    # the 1.5B's heads, a shallow bound in an 8K-class cache: every row unsplit
    (12, 2, 37, 63, 4096, 256),  # rows across 8-row tiles
    (32, 8, 65, 150, 1024, 256), # GQA 4, 65 rows: three scale blocks of 32
    (16, 16, 5, 200, 300, 256),  # MHA
    (28, 4, 9, 0, 2048, 256),    # GQA 7 (a row tile of 16 with 7 rows), from an empty cache
    (12, 2, 8, 1000, 4096, 0),   # deep: every row split, its o (and codes) from the combine kernel
    (12, 2, 40, 230, 2048, 0),   # rows on both sides of 256 keys: split 0 alone, then split + combine
])
def test_masked_attention_writes_o_and_its_codes(native, dev, rng, n_heads, n_kv_heads, n, n_past, max_ctx, max_keys):
    kc, vc = random_cache(rng, n_kv_heads, max_ctx, 128, n_past + n)
    q = (rng.standard_normal((n, n_heads, 128)) * rng.uniform(0.5, 3.0)).astype(np.float32)
    mask = tree_mask(rng, n)
    if n_past == 0 and n > 1:
        mask[n - 1] = 0                              # a row that sees no key: NaN o, codes 0, scale NaN
    st, o_plain, _, _ = run_masked(native, dev, q, kc, vc, mask, n_past, max_keys, codes=False)
    assert st == 0
    st, o, xq, xsc = run_masked(native, dev, q, kc, vc, mask, n_past, max_keys, codes=True)
    assert st == 0
    assert np.array_equal(bits(o), bits(o_plain)), "writing the codes changed o"
    want_q, want_sc = codes_of(o, n_heads)
    assert not np.isnan(o[0]).any()                                  # real rows attended real keys
    bad = np.argwhere(xq != want_q)
    assert bad.size == 0, f"{len(bad)} codes differ, first at {bad[:4].tolist()}"
    got_sc = scales_layout(xsc, n, n_heads)
    nan = np.isnan(want_sc)                   # a NaN row's scale is NaN (its payload is not specified)
    assert np.array_equal(np.isnan(got_sc), nan)
    assert np.array_equal(bits(got_sc[~nan]), bits(want_sc[~nan]))
    if n_past == 0 and n > 1:
        assert np.isnan(o[n - 1]).all() and (xq[n - 1] == 0).all() and np.isnan(got_sc[n - 1]).all()


def test_codes_are_refused_where_the_launch_cannot_write_them(native, dev, rng):
    """head_dim 64 (a group spans two heads), one pointer without the other, and the entry points that do not write
    codes: FD_E_ARG, nothing launched."""
    n, n_past = 4, 10
    mask = tree_mask(rng, n)
    kc, vc = random_cache(rng, 2, 4096, 128, n_past + n)
    q = rng.standard_normal((n, 4, 128)).astype(np.float32)
    assert run_masked(native, dev, q, kc, vc, mask, n_past, 0, codes=True)[0] == 0
    kc64, vc64 = random_cache(rng, 2, 256, 64, n_past + n)
    q64 = rng.standard_normal((n, 4, 64)).astype(np.float32)
    assert run_masked(native, dev, q64, kc64, vc64, mask, n_past, 256, codes=True)[0] == FD_E_ARG
    shape = attention_shape(native.ffi, 4, 2, 128, 256, max_keys=256)
    buf = dev.empty((64, 512), np.int8)
    shape.o_codes = dev.p(buf, "int8_t*")           # no scales
    ws = dev.empty((1 << 20,), np.uint8)
    o = dev.empty((n, 512))
    held = [dev.upload(q), dev.upload(kc[:, :256].copy()), dev.upload(vc[:, :256].copy()),
            dev.upload(np.array([n_past], np.int32)), dev.upload(mask)]
    args = (dev.p(o, "float*"), dev.p(held[0], "float*"), dev.p(held[1]), dev.p(held[2]))
    np_ = dev.p(held[3], "int32_t*")
    assert native.lib.fd_attention_masked(*args, dev.p(held[4], "uint8_t*"), np_, n, shape, CHUNK,
                                          dev.p(ws), ws.nbytes, dev.stream) == FD_E_ARG
    shape.o_scales = dev.p(dev.empty((64, 32), np.float32), "float*")
    assert native.lib.fd_attention_decode(*args, np_, shape, CHUNK, dev.p(ws), dev.stream) == FD_E_ARG


def call_gemv_xq(native, dev, y, w, qtype, rows, cols, x, xq, xsc, n_x, bias, res):
    st = native.lib.fd_gemv_xq(dev.p(y, "float*"), dev.p(w), int(qtype), rows, cols, dev.p(x, "float*"),
                               dev.p(xq, "int8_t*"), dev.p(xsc, "float*"), n_x, dev.p(bias, "float*"),
                               dev.p(res, "float*"), dev.stream)
    dev.synchronize()
    return st


def device_codes(dev, x):
    """x's codes (codes_of: 128-column groups) in fd_gemv_xq's layout for one call of <= 32 rows."""
    n, cols = x.shape
    q, sc = codes_of(x, cols // 128)
    qpad = np.zeros((-(-n // 8) * 8, cols), np.int8)
    qpad[:n] = q
    scl = np.full((cols // 128, 32), np.nan, np.float32)
    scl[:, :n] = sc.T
    return dev.upload(qpad), dev.upload(scl)


@pytest.mark.parametrize("n_x", [1, 2, 5, 8, 13, 32])
@pytest.mark.parametrize("qtype,rows,cols", [(T.Q4_K, 1536, 1536), (T.Q6_K, 300, 1536), (T.Q4_K, 129, 512),
                                             (T.Q8_0, 333, 1536)], ids=["q4k-o", "q6k", "q4k-odd", "q8_0"])
def test_gemv_xq_is_fd_gemv_bit_for_bit(native, dev, rng, poisoned, n_x, qtype, rows, cols):
    if n_x > 8 and not gemv_rows_call(native.tuning(), [qtype], cols):
        pytest.skip("fd_gemv takes 8 rows a call off gemv_rows")
    data = random_weights(rng, qtype, rows, cols)
    w = dev.upload(data)
    x = (rng.standard_normal((n_x, cols)) * rng.uniform(0.1, 10.0, (n_x, 1))).astype(np.float32)
    d_x = dev.upload(x)
    bias = dev.upload(rng.standard_normal(rows).astype(np.float32))
    res = rng.standard_normal((n_x, rows)).astype(np.float32)
    want = dev.upload(res)
    call_gemv(native, dev, want, w, qtype, rows, cols, d_x, n_x, None, bias, want)
    xq, xsc = device_codes(dev, x)
    got = dev.upload(res)
    assert call_gemv_xq(native, dev, got, w, qtype, rows, cols, d_x, xq, xsc, n_x, bias, got) == 0
    assert np.array_equal(bits(dev.download(got)), bits(dev.download(want)))
    # codes that are not x's: a gemv_rows call reads them (another result), a Q8_0 one quantizes x itself
    wrong_q, _ = device_codes(dev, -x)
    other = dev.upload(res)
    assert call_gemv_xq(native, dev, other, w, qtype, rows, cols, d_x, wrong_q, xsc, n_x, bias, other) == 0
    same = np.array_equal(bits(dev.download(other)), bits(dev.download(want)))
    assert same == (qtype == T.Q8_0)


def test_gemv_xq_refuses_bad_codes_arguments(native, dev, rng):
    data = random_weights(rng, T.Q4_K, 16, 512)
    w, x = dev.upload(data), dev.upload(rng.standard_normal((1, 512)).astype(np.float32))
    y = dev.empty((1, 16))
    xq, xsc = device_codes(dev, rng.standard_normal((1, 512)).astype(np.float32))
    assert call_gemv_xq(native, dev, y, w, T.Q4_K, 16, 512, x, None, xsc, 1, None, None) == FD_E_ARG
    assert call_gemv_xq(native, dev, y, w, T.Q4_K, 16, 512, x, xq, None, 1, None, None) == FD_E_ARG
    assert call_gemv_xq(native, dev, y, w, T.Q4_K, 16, 512, x, xq, xsc, 33, None, None) == FD_E_ARG
    assert call_gemv_xq(native, dev, y, w, T.Q4_K, 16, 512, x, xq, xsc, 0, None, None) == FD_E_ARG


# ---- the forward -------------------------------------------------------------------------------------------------
MODEL = dict(arch="qwen2", weight_type="Q4_K", n_layers=3, hidden=512, n_heads=4, n_kv_heads=2, ffn=1024,
             vocab_size=1000, name="o-codes")     # head_dim 128


@pytest.fixture(scope="module")
def backend(native):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    return CudaBackend()


class CountingLib:
    """ops.lib with the calls of the named entry points counted (cffi functions cannot be patched in place); by
    default fd_gemv_xq / fd_gemv."""

    def __init__(self, lib, names=("fd_gemv_xq", "fd_gemv")):
        self._lib = lib
        self.calls = {name: 0 for name in names}

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if name not in self.calls:
            return fn

        def counted(*args):
            self.calls[name] += 1
            return fn(*args)
        return counted


def counted_runner(backend, path):
    run = cuda_runner(backend, path, "graph", max_ctx=2048, chunk=64)
    counter = CountingLib(run.ops.lib)
    run.ops.lib = counter
    return run, counter


def test_the_forward_is_bitwise_the_same_with_o_codes(backend, native, synthetic_model):
    if native.tuning()["gemv_rows"] <= 0:
        pytest.skip("no gemv_rows here: fd_gemv_xq is fd_gemv")
    path = synthetic_model(**MODEL)
    prompts = [np.random.default_rng(303).integers(0, 1000, k).tolist() for k in (40, 300)]   # shallow, deep
    results = {}
    before = native.tuning()
    for on in (0, 1):
        native.set_tuning(**{**before, "attn_o_codes": on})    # read by every forward (CudaOps.begin_forward)
        try:
            run, counter = counted_runner(backend, path)
            trees, greedy = [], []
            for prompt in prompts:
                run.reset()
                run.prefill(prompt)
                base = run.n_past
                for n in (1, 5, 13, 40):             # a shallow (40 + n <= 256) and a deep verify graph each
                    _, mask, depth = random_tree(np.random.default_rng(n), n)
                    tokens = np.random.default_rng(100 + n).integers(0, 1000, n).tolist()
                    trees.append(run.logits_to_host(run.forward_tree(tokens, base + depth, mask)).copy())
                run.n_past = base
                greedy.append(run.greedy_continue([7, 8, 9], 24))     # the decode graphs (no codes asked)
        finally:
            native.set_tuning(**before)
        results[on] = (trees, greedy, dict(counter.calls))
    (t0, g0, c0), (t1, g1, c1) = results[0], results[1]
    assert g0 == g1
    for a, b in zip(t0, t1):
        assert np.array_equal(bits(a), bits(b))
    assert c0["fd_gemv_xq"] == 0
    assert c1["fd_gemv_xq"] >= 6 * MODEL["n_layers"], c1     # the o projections of every tree of 2+ rows
