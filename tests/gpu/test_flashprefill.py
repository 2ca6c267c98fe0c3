"""FlashPrefill kernels (native/cuda/flashprefill.cu, attention_sparse.cu) against the numpy oracle
(flashd.daemon.pflash.flashprefill, itself checked against independent definitions in
tests/pflash), plus the drafter on the CUDA backend vs the reference backend and VRAM release on
park.

Layouts: the device cache is (n_kv, max_ctx, d) f16; the oracle takes slots first, so caches are
passed to it transposed. Cache slots past the chunk hold NaN (a kernel must never read them) and
outputs are poisoned (NaN) before each launch.

Tolerances (each with its reason):
- mean_k: f32 sums of <= 128 f16 values: rtol 1e-5.
- score: the kernel computes q . mean_k in f32 (q f32, not rounded) and exp2 with ex2.approx
  (2 ulp); the normalised scores lie in [0, 1]: atol 2e-5 + rtol 1e-4.
- select: exact (the same f32 scores are uploaded to the kernel and given to the oracle; random
  continuous scores put no value on a threshold).
- sparse attention: as tests/gpu/test_attention_prefill.py -- q is rounded to f16 in the mma
  fragments (the oracle gets the same rounded q), P is rounded to f16 before PV: atol 2e-3 * max|v|.
- tail maxima: f32 dots of f32 q with f16 k, exp2 approx, f32 log-sum-exp: rtol 1e-4, atol 1e-6.
"""
import gc

import numpy as np
import pytest

from flashd.daemon.backends.cuda.ops import attention_shape
from flashd.daemon.pflash import flashprefill as fp

B = fp.BLOCK
F16 = np.float16


_HELD: list = []


@pytest.fixture(autouse=True)
def _release_held_uploads():
    yield
    _HELD.clear()


def up(dev, x):
    """dev.upload(x), kept alive until the test ends: a temporary passed straight into a launch
    (dev.p(dev.upload(x))) is freed before the kernel runs, and the kernel reads freed memory."""
    t = dev.upload(x)
    _HELD.append(t)
    return t


def f16(a):
    return np.asarray(a, np.float64).astype(F16).astype(np.float64)


def slots_first(cache):
    return np.ascontiguousarray(cache.transpose(1, 0, 2))


def nan_cache(rng, n_kv, max_ctx, d, n_written):
    c = np.full((n_kv, max_ctx, d), np.nan, F16)
    c[:, :n_written] = rng.standard_normal((n_kv, n_written, d)).astype(F16)
    return c


def n_blocks(n):
    return -(-n // B)


# ---------------------------------------------------------------------------------------- mean_k
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n_keys", [1, 127, 128, 129, 1000])
def test_mean_k(native, dev, poisoned, rng, n_keys, d):
    n_kv, max_ctx = 2, n_keys + 9
    kc = nan_cache(rng, n_kv, max_ctx, d, n_keys)
    out = poisoned((n_blocks(n_keys), n_kv, d))
    native.check(native.lib.fd_flashprefill_mean_k(dev.p(out, "float*"), dev.p(up(dev, kc)), n_keys,
                                                   attention_shape(native.ffi, n_kv, n_kv, d, max_ctx),
                                                   dev.stream), "fd_flashprefill_mean_k")
    want = fp.mean_k(slots_first(kc)[:n_keys].astype(np.float64))
    np.testing.assert_allclose(dev.download(out), want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------- score
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n_heads,n_kv", [(2, 2), (12, 2), (14, 2)])
@pytest.mark.parametrize("p0,n", [(0, 1), (0, 100), (0, 128), (0, 300), (256, 77), (4096, 4100)])
def test_score_normalised(native, dev, poisoned, rng, p0, n, n_heads, n_kv, d):
    n_keys = p0 + n
    kc = nan_cache(rng, n_kv, n_keys + 5, d, n_keys)
    q = rng.standard_normal((n, n_heads, d)).astype(np.float32)
    mk = dev.empty((n_blocks(n_keys), n_kv, d))
    native.check(native.lib.fd_flashprefill_mean_k(dev.p(mk, "float*"), dev.p(up(dev, kc)), n_keys,
                                                   attention_shape(native.ffi, n_kv, n_kv, d, n_keys + 5),
                                                   dev.stream), "fd_flashprefill_mean_k")
    score = poisoned((n_blocks(n), n_heads, n_blocks(n_keys)))
    native.check(native.lib.fd_flashprefill_score(dev.p(score, "float*"), dev.p(up(dev, q), "float*"),
                                                  dev.p(mk, "float*"), p0, n,
                                                  attention_shape(native.ffi, n_heads, n_kv, d, p0 + n, 1 / np.sqrt(d)),
                                                  dev.stream), "fd_flashprefill_score")
    got = dev.download(score)
    want = fp.score(q, dev.download(mk).astype(np.float64), p0, 1 / np.sqrt(d))
    assert not np.isnan(got).any(), "score entries left unwritten"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
    for mq in range(got.shape[0]):
        m = p0 // B + mq
        np.testing.assert_allclose(got[mq, :, :m + 1].sum(-1), 1.0, rtol=1e-4)
        assert (got[mq, :, m + 1:] == 0).all()


def test_score_rejects_unaligned_p0(native, dev):
    z = dev.empty((16,))
    assert native.lib.fd_flashprefill_score(dev.p(z, "float*"), dev.p(z, "float*"), dev.p(z, "float*"), 100, 4,
                                            attention_shape(native.ffi, 1, 1, 64, 100 + 4, 0.125),
                                            dev.stream) == native.lib.FD_E_ARG


def test_pflash_kernels_refuse_head_dim_256(native, dev):
    """PFlash serves dense drafters of head_dim 64 / 128: its scores, block-sparse attention and tail probabilities
    return FD_E_SHAPE at 256 (the target's attention takes 256; PFlash's kernels are not instantiated for it)."""
    lib, ffi = native.lib, native.ffi
    n, n_heads, hd, max_ctx = 4, 2, 256, 256
    shape = attention_shape(ffi, n_heads, 1, hd, max_ctx, 0.0625)
    q, o = dev.empty((n, n_heads, hd)), dev.empty((n, n_heads * hd))
    kc = dev.empty((1, max_ctx, hd), np.float16)
    mean_k, score = dev.empty((2, 1, hd)), dev.empty((1, n_heads, 2))
    idx, cnt = dev.empty((1, n_heads, 2), np.int32), dev.empty((1, n_heads), np.int32)
    assert lib.fd_flashprefill_score(dev.p(score, "float*"), dev.p(q, "float*"), dev.p(mean_k, "float*"), 0, n, shape,
                                     dev.stream) == lib.FD_E_SHAPE
    assert lib.fd_flashprefill_sparse_attention(dev.p(o, "float*"), dev.p(q, "float*"), dev.p(kc), dev.p(kc), 0, n,
                                                shape, dev.p(idx, "int32_t*"), dev.p(cnt, "int32_t*"),
                                                dev.stream) == lib.FD_E_SHAPE
    acc, ws = dev.empty((1, n)), dev.empty((2 * n_heads,))
    assert lib.fd_flashprefill_tail_max_probs(dev.p(acc, "float*"), dev.p(q, "float*"), dev.p(kc), n, 1, shape,
                                              dev.p(ws, "float*"), dev.stream) == lib.FD_E_SHAPE


# ---------------------------------------------------------------------------------------- select
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.85, 1.0])
@pytest.mark.parametrize("p0,n", [(0, 1), (0, 129), (384, 700), (0, 8192)])
def test_select_matches_oracle(native, dev, rng, p0, n, alpha):
    n_heads = 3
    n_mq, n_kb = n_blocks(n), n_blocks(p0 + n)
    s = rng.uniform(size=(n_mq, n_heads, n_kb)).astype(np.float32) ** 3
    for mq in range(n_mq):
        s[mq, :, p0 // B + mq + 1:] = 0
    first_full = n_kb - 2
    idx = dev.empty((n_mq, n_heads, n_kb), np.int32)
    cnt = dev.empty((n_mq, n_heads), np.int32)
    dev.fill_bytes(idx, 0x7F)
    dev.fill_bytes(cnt, 0x7F)
    native.check(native.lib.fd_flashprefill_select(dev.p(idx, "int32_t*"), dev.p(cnt, "int32_t*"),
                                                   dev.p(up(dev, s), "float*"), p0, n, n_heads, alpha, 2, 4, first_full,
                                                   dev.stream), "fd_flashprefill_select")
    want_idx, want_cnt = fp.select(s, p0, np.float32(alpha), 2, 4, first_full)
    np.testing.assert_array_equal(dev.download(cnt), want_cnt)
    np.testing.assert_array_equal(dev.download(idx), want_idx)


# ------------------------------------------------------------------------------ sparse attention
def run_sparse(native, dev, poisoned, q, kc, vc, p0, n_heads, n_kv, d, types, idx, cnt, sink=0, local=0):
    n = q.shape[0]
    o = poisoned((n, n_heads * d))
    types_d = dev.upload(np.asarray(types, np.int32)) if types is not None else None
    idx_d = dev.upload(idx) if idx is not None else None
    cnt_d = dev.upload(cnt) if cnt is not None else None
    shape = attention_shape(native.ffi, n_heads, n_kv, d, kc.shape[1], 1 / np.sqrt(d))
    native.check(native.lib.fd_attention_block_sparse(dev.p(o, "float*"), dev.p(up(dev, q), "float*"),
                                                      dev.p(up(dev, kc)), dev.p(up(dev, vc)), p0, n, shape,
                                                      dev.p(types_d, "int32_t*"), dev.p(idx_d, "int32_t*"),
                                                      dev.p(cnt_d, "int32_t*"), sink, local,
                                                      dev.stream), "fd_attention_block_sparse")
    return dev.download(o)


def check_attention(got, q, kc, vc, p0, blocks, d):
    want = fp.sparse_attention(f16(q), slots_first(kc).astype(np.float64), slots_first(vc).astype(np.float64), p0,
                               blocks, 1 / np.sqrt(d))
    assert not np.isnan(got).any(), "outputs left unwritten (NaN poison) or never-written cache slots read"
    atol = 2e-3 * np.abs(vc[:, :p0 + q.shape[0]].astype(np.float64)).max()
    err = np.abs(got - want)
    assert err.max() <= atol, f"max err {err.max():.3g} > {atol:.3g} at {np.unravel_index(np.argmax(err), err.shape)}"


def random_lists(rng, p0, n, n_heads, density):
    n_mq, n_kb = n_blocks(n), n_blocks(p0 + n)
    idx = np.full((n_mq, n_heads, n_kb), -1, np.int32)
    cnt = np.zeros((n_mq, n_heads), np.int32)
    for mq in range(n_mq):
        m = p0 // B + mq
        for h in range(n_heads):
            keep = np.flatnonzero(rng.uniform(size=m + 1) < density)
            if rng.uniform() < 0.8 and m not in keep:           # usually the diagonal, not always
                keep = np.append(keep, m)
            keep = np.sort(keep)
            idx[mq, h, :len(keep)] = keep
            cnt[mq, h] = len(keep)
    return idx, cnt


@pytest.mark.parametrize("d,group", [(64, 1), (64, 7), (128, 2), (128, 6)])
@pytest.mark.parametrize("p0,n", [(0, 1), (0, 64), (0, 127), (0, 129), (128, 300), (384, 65)])
def test_all_selected_equals_dense_causal(native, dev, poisoned, rng, p0, n, d, group):
    n_kv = 2
    n_heads = n_kv * group
    kc, vc = nan_cache(rng, n_kv, p0 + n + 3, d, p0 + n), nan_cache(rng, n_kv, p0 + n + 3, d, p0 + n)
    q = rng.standard_normal((n, n_heads, d)).astype(np.float32)
    n_mq, n_kb = n_blocks(n), n_blocks(p0 + n)
    idx = np.full((n_mq, n_heads, n_kb), -1, np.int32)
    cnt = np.zeros((n_mq, n_heads), np.int32)
    for mq in range(n_mq):
        m = p0 // B + mq
        idx[mq, :, :m + 1] = np.arange(m + 1)
        cnt[mq] = m + 1
    got = run_sparse(native, dev, poisoned, q, kc, vc, p0, n_heads, n_kv, d, None, idx, cnt)
    dense = np.ones((n_mq, n_heads, n_kb), bool)
    check_attention(got, q, kc, vc, p0, dense, d)
    # and the same through FD_MASK_DENSE heads (no lists needed)
    got2 = run_sparse(native, dev, poisoned, q, kc, vc, p0, n_heads, n_kv, d, [fp.MASK_DENSE] * n_heads, None, None)
    check_attention(got2, q, kc, vc, p0, dense, d)


@pytest.mark.parametrize("d,group", [(64, 7), (128, 6), (128, 1)])
@pytest.mark.parametrize("p0,n", [(0, 300), (256, 513), (0, 1000)])
@pytest.mark.parametrize("density", [0.0, 0.3])
def test_sparse_attention_lists(native, dev, poisoned, rng, p0, n, d, group, density):
    n_kv = 2
    n_heads = n_kv * group
    kc, vc = nan_cache(rng, n_kv, p0 + n, d, p0 + n), nan_cache(rng, n_kv, p0 + n, d, p0 + n)
    q = rng.standard_normal((n, n_heads, d)).astype(np.float32)
    idx, cnt = random_lists(rng, p0, n, n_heads, density)
    o = poisoned((n, n_heads * d))
    shape = attention_shape(native.ffi, n_heads, n_kv, d, p0 + n, 1 / np.sqrt(d))
    native.check(native.lib.fd_flashprefill_sparse_attention(dev.p(o, "float*"), dev.p(up(dev, q), "float*"),
                                                             dev.p(up(dev, kc)), dev.p(up(dev, vc)), p0, n, shape,
                                                             dev.p(up(dev, idx), "int32_t*"),
                                                             dev.p(up(dev, cnt), "int32_t*"),
                                                             dev.stream), "fd_flashprefill_sparse_attention")
    types = np.full(n_heads, fp.MASK_LISTS, np.int32)
    check_attention(dev.download(o), q, kc, vc, p0, fp.block_mask(types, idx, cnt, p0, n, n_blocks(p0 + n), 0, 0), d)


@pytest.mark.parametrize("p0,n", [(0, 700), (512, 300)])
def test_per_head_mask_types(native, dev, poisoned, rng, p0, n):
    d, n_kv, n_heads = 128, 2, 6
    kc, vc = nan_cache(rng, n_kv, p0 + n, d, p0 + n), nan_cache(rng, n_kv, p0 + n, d, p0 + n)
    q = rng.standard_normal((n, n_heads, d)).astype(np.float32)
    types = np.array([fp.MASK_DENSE, fp.MASK_STREAMING, fp.MASK_LISTS, 3, -5, fp.MASK_DENSE], np.int32)
    idx, cnt = random_lists(rng, p0, n, n_heads, 0.4)
    got = run_sparse(native, dev, poisoned, q, kc, vc, p0, n_heads, n_kv, d, types, idx, cnt, sink=1, local=2)
    check_attention(got, q, kc, vc, p0, fp.block_mask(types, idx, cnt, p0, n, n_blocks(p0 + n), 1, 2), d)


def test_the_whole_flashprefill_chain_matches_the_oracle(native, dev, poisoned, rng):
    """mean_K -> score -> select -> sparse_attention on device == flashprefill_attention in numpy, with
    keys planted so that selection is far from dense (a planted block, fp.py's experiment)."""
    p0, n, d, n_kv, n_heads = 1024, 1500, 128, 2, 4
    n_keys = p0 + n
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    k = rng.standard_normal((n_kv, n_keys, d))
    k[:, 7 * B:8 * B] += 3 * u
    kc, vc = k.astype(F16), rng.standard_normal((n_kv, n_keys, d)).astype(F16)
    q = (rng.standard_normal((n, n_heads, d)) + 3 * u).astype(np.float32)
    lib, p = native.lib, dev.p
    kd, vd, qd = dev.upload(kc), dev.upload(vc), dev.upload(q)
    n_mq, n_kb = n_blocks(n), n_blocks(n_keys)
    mk, s = dev.empty((n_kb, n_kv, d)), dev.empty((n_mq, n_heads, n_kb))
    idx, cnt = dev.empty((n_mq, n_heads, n_kb), np.int32), dev.empty((n_mq, n_heads), np.int32)
    o = poisoned((n, n_heads * d))
    scale = 1 / np.sqrt(d)
    native.check(lib.fd_flashprefill_mean_k(p(mk, "float*"), p(kd), n_keys,
                                            attention_shape(dev.ffi, n_kv, n_kv, d, n_keys), dev.stream), "mean_k")
    native.check(lib.fd_flashprefill_score(p(s, "float*"), p(qd, "float*"), p(mk, "float*"), p0, n,
                                           attention_shape(dev.ffi, n_heads, n_kv, d, p0 + n, scale),
                                           dev.stream), "score")
    native.check(lib.fd_flashprefill_select(p(idx, "int32_t*"), p(cnt, "int32_t*"), p(s, "float*"), p0, n, n_heads,
                                            0.85, 2, 4, n_kb - 2, dev.stream), "select")
    native.check(lib.fd_flashprefill_sparse_attention(p(o, "float*"), p(qd, "float*"), p(kd), p(vd), p0, n,
                                                      attention_shape(dev.ffi, n_heads, n_kv, d, n_keys, scale),
                                                      p(idx, "int32_t*"), p(cnt, "int32_t*"),
                                                      dev.stream), "sparse_attention")
    got_cnt = dev.download(cnt)
    assert got_cnt[:-2].sum() < 0.75 * sum(p0 // B + mq + 1 for mq in range(n_mq - 2)) * n_heads, "selection is dense"
    got_idx = dev.download(idx)
    for mq in range(n_mq - 2):
        for h in range(n_heads):
            assert 7 in got_idx[mq, h, :got_cnt[mq, h]]
    # the oracle attends the device's own selection (scores near a threshold may round either way)
    types = np.full(n_heads, fp.MASK_LISTS, np.int32)
    check_attention(dev.download(o), q, kc, vc, p0, fp.block_mask(types, got_idx, got_cnt, p0, n, n_kb, 0, 0), d)


# ----------------------------------------------------------------------------------- tail maxima
@pytest.mark.parametrize("d,group", [(64, 7), (128, 2)])
@pytest.mark.parametrize("n_keys,n_tail", [(1, 1), (8, 8), (130, 8), (3000, 8), (1000, 3)])
def test_tail_max_probs(native, dev, rng, n_keys, n_tail, d, group):
    n_kv = 2
    n_heads = n_kv * group
    kc = nan_cache(rng, n_kv, n_keys + 4, d, n_keys)
    q = rng.standard_normal((n_tail, n_heads, d)).astype(np.float32)
    acc0 = rng.uniform(0, 2.0 / n_keys, size=(n_tail, n_keys)).astype(np.float32)
    acc = dev.upload(acc0)
    ws = dev.empty((2 * n_tail * n_heads,))
    shape = attention_shape(native.ffi, n_heads, n_kv, d, n_keys + 4, 1 / np.sqrt(d))
    native.check(native.lib.fd_flashprefill_tail_max_probs(dev.p(acc, "float*"), dev.p(up(dev, q), "float*"),
                                                           dev.p(up(dev, kc)), n_keys, n_tail, shape,
                                                           dev.p(ws, "float*"), dev.stream), "tail")
    want = np.maximum(acc0, fp.tail_max_probs(q, slots_first(kc).astype(np.float64), n_keys, 1 / np.sqrt(d)))
    np.testing.assert_allclose(dev.download(acc), want, rtol=1e-4, atol=1e-6)


# -------------------------------------------------------------------- drafter and engine on CUDA
def _synthetic(tmp_path, name, **kw):
    from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model
    return write_synthetic_model(tmp_path / f"{name}.gguf", SyntheticSpec(**kw))


def test_drafter_tail_probs_cuda_vs_reference(native, tmp_path):
    """The whole drafter forward (sparse attention in every layer, chunked, tail maxima) on the GPU
    against the reference backend. Tolerance: as tests/gpu/test_cuda_model.py, the f16 KV cache and
    f16 GEMM inputs move activations by ~1e-3 relative; probabilities are compared at 3e-2 of
    their max, and both must pick the same top chunks where scores are clearly apart."""
    from flashd.daemon.backends import ReferenceBackend
    from flashd.daemon.backends.cuda.backend import CudaBackend
    from flashd.daemon.pflash.config import PFlashConfig
    from flashd.daemon.pflash.service import PrefillCompressor
    from flashd.clients.tokenizer import Tokenizer

    path = _synthetic(tmp_path, "drafter", arch="qwen2", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, ffn=512,
                      head_dim=64, vocab_size=512, seed=5)
    tok = Tokenizer.from_gguf(str(path))
    cfg = PFlashConfig(forward_chunk=512, alpha=0.0)
    ids = [int(t) for t in np.random.default_rng(1).integers(0, 500, 1300)]
    got = PrefillCompressor(CudaBackend(), cfg, str(path), tok).load()[0].tail_probs(ids)
    want = PrefillCompressor(ReferenceBackend(), cfg, str(path), tok).load()[0].tail_probs(ids)
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= 3e-2 * np.abs(want).max()


def test_park_releases_device_memory_and_round_trips(native, tmp_path):
    from flashd.daemon.config import EngineConfig
    from flashd.daemon.engine import Engine
    from flashd.protocol import messages as m
    import threading

    path = _synthetic(tmp_path, "target", arch="qwen2", n_layers=8, hidden=1024, n_heads=8, n_kv_heads=2, ffn=2816,
                      head_dim=128, vocab_size=512, seed=9)
    engine = Engine(EngineConfig(model=str(path), device="cuda", max_ctx=32768))
    engine.load()
    engine.start()
    dev = engine.backend.device

    def ask(req):
        done, out = threading.Event(), []
        engine.submit(req, lambda e: (out.append(e), e["event"] in ("done", "result", "error") and done.set()))
        assert done.wait(120)
        return out[-1]
    try:
        prompt = [int(t) for t in np.random.default_rng(2).integers(0, 500, 300)]
        before = ask(m.Generate("g1", ids=prompt, max_tokens=16, ignore_eos=True, stream=False))["ids"]
        dev.synchronize()
        free_resident = dev.mem_info()[0]
        plan_bytes = engine.plan.total_bytes
        assert ask(m.Park("p", what="target"))["parked"]["target"] is True
        gc.collect()
        free_parked = dev.mem_info()[0]
        status = ask(m.Status("s"))["memory"]
        assert status["resident_weights_bytes"] == 0 and status["resident_kv_bytes"] == 0
        assert abs(status["device_free_bytes"] - free_parked) < (64 << 20)
        released = free_parked - free_resident
        assert released >= 0.9 * (plan_bytes - engine.plan.workspace_bytes), (released, engine.plan.as_dict())
        ask(m.Unpark("u", what="target"))
        assert dev.mem_info()[0] <= free_resident + (64 << 20)       # and taken again
        assert ask(m.Generate("g2", ids=prompt, max_tokens=16, ignore_eos=True, stream=False))["ids"] == before
    finally:
        engine.stop(10)
