"""RoPE position scaling (linear / YaRN) on the GPU: fd_rope_kv_write's cos/sin against ReferenceOps.rope_cos_sin
(rope_math.cuh repeats the reference's float64 operations one by one), the fused decode op
(fd_attention_decode_rope) against fd_rope_kv_write + fd_attention_decode bit for bit, and whole models --
per-op graph path, persistent forward and the reference -- on a YaRN synthetic model past its original
context. The unscaled rope's tests (test_rope.py, test_attention_decode_rope.py) run with scaling NULL.
"""
import numpy as np
import pytest
from tests.gpu.test_attention_decode_rope import Pair
from tests.gpu.test_forward import chain_logits, cuda_runner, ref_chain_logits, ref_runner
from tests.gpu.test_rope import _cache, _run_rope
from tests.gpu.logits_check import assert_logits_close, greedy_prefix_agrees

from flashd.daemon.backends.cuda.ops import attention_shape, rope_scaling_struct, rope_struct
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import ModelLoadError
from flashd.daemon.models.config import RopeScaling
from flashd.protocol.messages import SamplingParams

SCALINGS = {
    "qwen25-yarn4": (RopeScaling.create("yarn", 4.0, 32768), 128, 1e6, 131071),   # the model card's setting
    "tiny-yarn4": (RopeScaling.create("yarn", 4.0, 64), 64, 1e6, 255),
    "yarn8-attn": (RopeScaling.create("yarn", 8.0, 2048, attn_factor=0.9, beta_fast=16.0), 64, 10000.0, 16383),
    "linear2": (RopeScaling.create("linear", 2.0, 4096), 32, 500000.0, 8191),
}


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_scaled_cos_sin_match_reference(native, dev, name):
    """Rotating (1, 0) pairs gives the kernel's cos and sin exactly (a c - 0 s = c): they are the
    reference's float32 values bit for bit, except where CUDA's double pow / sincos (<= 2 double ulp, an
    angle error <= ~1e-10 at positions ~1e5) flips a float32 rounding: then by one rounding step of the
    value's magnitude, at most 2^-23 * mscale absolutely (near zero that is several ulps of a tiny value),
    and rarely (measured on an H200: 0 to a few in 6.4e4 values; bound 1e-3)."""
    scaling, rope_dim, theta, max_pos = SCALINGS[name]
    theta = float(np.float32(theta))               # the C ABI takes theta as float
    half = rope_dim // 2
    positions = np.unique(np.concatenate([np.arange(0, 300), np.linspace(0, max_pos, 700).astype(np.int64)]))
    n = len(positions)
    x = np.zeros((n, 1, rope_dim), np.float32)
    x[..., :half] = 1.0                            # NeoX pairs (j, j + half) = (1, 0)
    kc, vc = _cache(dev, 1, n, rope_dim)
    struct = rope_scaling_struct(native.ffi, scaling, rope_dim, theta)
    _, k_out = _run_rope(native, dev, None, x, x, kc, vc, positions, 0, 1, 1, rope_dim, rope_dim, np.float32(theta),
                         True, n, scaling=struct)
    cos, sin = ReferenceOps.rope_cos_sin(positions, theta, rope_dim, scaling)
    got_c, got_s = np.ascontiguousarray(k_out[:, 0, :half]), np.ascontiguousarray(k_out[:, 0, half:])
    for got, want, what in ((got_c, cos, "cos"), (got_s, sin, "sin")):
        diff = np.abs(got.astype(np.float64) - want)
        assert diff.max() <= 2.0 ** -23 * scaling.mscale, f"{what}: max |diff| {diff.max():.3g}"
        assert (diff > 0).mean() <= 1e-3, f"{what}: {(diff > 0).sum()} of {diff.size} values not bitwise equal"
    # and the whole rotation, as test_rope.py checks the plain rope
    rng = np.random.default_rng(201)
    q = rng.standard_normal((n, 3, rope_dim)).astype(np.float32)
    k = rng.standard_normal((n, 1, rope_dim)).astype(np.float32)
    kc, vc = _cache(dev, 1, n, rope_dim)
    q_out, k_out = _run_rope(native, dev, q, k, k, kc, vc, positions, 0, 3, 1, rope_dim, rope_dim, np.float32(theta),
                             False, n, scaling=struct)
    ref = ReferenceOps()
    # 1 float ulp of cos/sin (times mscale <= 1.14) on unit-scale data, as test_rope.py
    np.testing.assert_allclose(q_out, ref.rope(q, positions, theta, rope_dim, False, scaling), rtol=0, atol=2e-6)
    np.testing.assert_allclose(k_out, ref.rope(k, positions, theta, rope_dim, False, scaling), rtol=0, atol=2e-6)


def test_null_scaling_is_the_plain_rope_bitwise(native, dev, rng):
    """scaling NULL is the plain rope (the kernels branch on NULL and then run the instructions they ran
    before scaling existed): test_rope.py's comparison with the plain reference, here with the new argument."""
    n, rope_dim = 40, 64
    positions = rng.integers(0, 100000, n)
    x = rng.standard_normal((n, 2, rope_dim)).astype(np.float32)
    kc, vc = _cache(dev, 2, n, rope_dim)
    _, k_out = _run_rope(native, dev, None, x, x, kc, vc, positions, 0, 2, 2, rope_dim, rope_dim, np.float32(1e6),
                         True, n)
    np.testing.assert_allclose(k_out, ReferenceOps().rope(x, positions, 1e6, rope_dim, True), rtol=0, atol=1e-6)


def test_bad_scaling_refused(native, dev):
    t = dev.empty((64,))
    i = dev.empty((1,), np.int32)
    bad = native.ffi.new("fd_rope_scaling_t*", {"freq_scale": 0.0, "ext_factor": 1.0, "corr_low": 1.0,
                                                "corr_high": 9.0, "mscale": 1.0})
    status = native.lib.fd_rope_kv_write(dev.p(t, "float*"), dev.p(t, "float*"), dev.p(t, "float*"), dev.p(t), dev.p(t),
                                         dev.p(None), dev.p(i, "int32_t*"), dev.p(i, "int32_t*"), 1,
                                         attention_shape(native.ffi, 1, 1, 64, 1),
                                         rope_struct(native.ffi, 64, 1e4, 1, bad), dev.stream)
    assert status == native.lib.FD_E_ARG
    with pytest.raises(ModelLoadError, match="RoPE scaling"):      # checked before crossing the C ABI
        rope_scaling_struct(native.ffi, RopeScaling.create("yarn", 4.0, 64), 64, float("nan"))


# n_heads, n_kv_heads, head_dim, max_ctx, chunk_len, rope_dim, neox, scaling
FUSED = [
    (12, 2, 128, 4096, 64, 128, 1, "qwen25-yarn4"),     # Qwen2.5-1.5B's shape
    (14, 2, 64, 1000, 64, 64, 1, "tiny-yarn4"),
    (8, 8, 64, 777, 128, 64, 0, "yarn8-attn"),
    (6, 1, 128, 2048, 64, 32, 1, "linear2"),            # partial rope
]


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,max_ctx,chunk_len,rope_dim,neox,name", FUSED)
def test_fused_decode_with_scaling_is_bitwise_the_two_kernels(native, dev, rng, n_heads, n_kv_heads, head_dim,
                                                              max_ctx, chunk_len, rope_dim, neox, name):
    scaling, _, theta, max_pos = SCALINGS[name]
    pair = Pair(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, chunk_len, rope_dim, neox, theta=theta,
                scaling=scaling)
    for n_past in (0, 1, chunk_len, max_ctx // 2, max_ctx - 1):
        pair.check_bitwise(n_past)
    pair.check_bitwise(max_ctx // 3, pos=max_pos)          # a position past the original context


YARN_MODEL = dict(arch="qwen2", weight_type="Q8_0", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, ffn=512,
                  vocab_size=1000, context_length=64, rope_theta=1e6, rope_scaling="yarn", rope_factor=4.0,
                  rope_orig_ctx=64)


@pytest.mark.parametrize("forward", ["graph", "persistent"])
def test_yarn_model_matches_reference_past_the_original_context(backend, synthetic_model, forward):
    """A YaRN model (orig_ctx 64, factor 4) with a 150-token prompt and an 11-token chain: every position
    from 64 on is in the scaled region. Tolerance: test_forward.py's (logits_check)."""
    path = synthetic_model(**YARN_MODEL)
    rng = np.random.default_rng(202)
    prompt, chain = rng.integers(0, 1000, 150).tolist(), rng.integers(0, 1000, 11).tolist()
    run = cuda_runner(backend, path, forward)
    assert run.cfg.rope_scaling is not None
    ref = ref_runner(path)
    assert_logits_close(chain_logits(run, prompt, chain), ref_chain_logits(ref, prompt, chain))
    tokens = [s.token for s in run.generate(prompt, SamplingParams(), 24)]
    ok, where = greedy_prefix_agrees(ref, prompt, tokens)
    assert ok, f"greedy diverges from the reference at token {where} without a near-tie"


@pytest.fixture(scope="module")
def backend(native):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    return CudaBackend()
