"""RoPE position scaling (linear / YaRN): the GGUF metadata -> RopeScaling, and ReferenceOps.rope's cos/sin
against an independent float64 implementation written here from llama.cpp's C (ggml-cpu ops.cpp rope_yarn,
rope_yarn_ramp, ggml_rope_cache_init; ggml.c ggml_rope_yarn_corr_dim(s); llama-context.cpp's
yarn_attn_factor), and the plain rope unchanged bit for bit.

llama.cpp's recorded logits on a YaRN model: test_yarn_llama_cpp.py. The CUDA kernels:
tests/gpu/test_rope_scaling_gpu.py.
"""
import math

import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import ModelLoadError, open_model
from flashd.daemon.models.config import RopeScaling


# ---- llama.cpp's formulas, transcribed (float64 instead of its float32) -------------------------------
def llama_cpp_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow):
    def corr_dim(n_rot):    # ggml_rope_yarn_corr_dim
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(freq_base))
    start, end = math.floor(corr_dim(beta_fast)), math.ceil(corr_dim(beta_slow))
    return [max(0, start), min(n_dims - 1, end)]


def llama_cpp_cos_sin(p, n_dims, freq_base, factor, n_ctx_orig, yarn, attn_factor=1.0, beta_fast=32.0,
                      beta_slow=1.0):
    """ggml_rope_cache_init for position p: the (cos, sin) of every pair, float64 arrays."""
    freq_scale = 1.0 / factor
    ext_factor = 1.0 if yarn else 0.0                   # llama_context: yarn_ext_factor < 0 -> 1 for YaRN, else 0
    # llama_context: yarn_attn_factor = get_mscale(factor) / (1 + 0.1 ln factor) when ext_factor != 0, then
    # times rope.scaling.attn_factor
    mscale = attn_factor
    if ext_factor != 0:
        mscale *= (1.0 if factor <= 1.0 else 0.1 * math.log(factor) + 1.0) / (1.0 + 0.1 * math.log(factor))
    corr = llama_cpp_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    theta_scale = freq_base ** (-2.0 / n_dims)
    cos, sin = [], []
    for i0 in range(0, n_dims, 2):
        theta_extrap = p * theta_scale ** (i0 // 2)     # ggml: theta *= theta_scale per pair
        theta_interp = freq_scale * theta_extrap
        theta, m = theta_interp, mscale
        if ext_factor != 0:
            y = (i0 // 2 - corr[0]) / max(0.001, corr[1] - corr[0])       # rope_yarn_ramp
            ramp_mix = (1 - min(1, max(0, y))) * ext_factor
            theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
            m *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
        cos.append(math.cos(theta) * m)
        sin.append(math.sin(theta) * m)
    return np.array(cos), np.array(sin)


CASES = [
    # rope_dim, theta, factor, orig_ctx, type, attn_factor
    (128, 1e6, 4.0, 32768, "yarn", 1.0),     # Qwen2.5-Coder's model card: factor 4 over 32K
    (64, 1e6, 4.0, 64, "yarn", 1.0),         # the llama.cpp recording's tiny model
    (32, 10000.0, 8.0, 2048, "yarn", 1.0),
    (64, 500000.0, 2.5, 8192, "yarn", 0.9),  # rope.scaling.attn_factor multiplies mscale
    (64, 10000.0, 4.0, 4096, "linear", 1.0),
]


@pytest.mark.parametrize("rope_dim,theta,factor,orig_ctx,kind,attn_factor", CASES)
def test_cos_sin_match_llama_cpp_formulas(rope_dim, theta, factor, orig_ctx, kind, attn_factor):
    scaling = RopeScaling.create(kind, factor, orig_ctx, attn_factor=attn_factor)
    positions = np.array([0, 1, 7, orig_ctx - 1, orig_ctx, 3 * orig_ctx + 5, int(factor * orig_ctx) - 1])
    cos, sin = ReferenceOps.rope_cos_sin(positions, theta, rope_dim, scaling)
    assert cos.dtype == np.float32 and cos.shape == (len(positions), rope_dim // 2)
    for row, p in enumerate(positions):
        want_c, want_s = llama_cpp_cos_sin(int(p), rope_dim, theta, factor, orig_ctx, kind == "yarn", attn_factor)
        # The reference forms the same float64 quantities (theta^(-2j/d) directly where ggml multiplies
        # theta_scale j times, a few float64 ulps of the angle, ~1e-16 * pos * inv_freq), then rounds to
        # float32 once: at most one float32 rounding, 2^-24 * |value| <= 2^-24 * mscale, plus the angle's
        # float64 error (< 1e-9 at these positions).
        tol = 2.0 ** -24 * scaling.mscale + 1e-9
        np.testing.assert_allclose(cos[row], want_c, rtol=0, atol=tol, err_msg=f"cos at {p}")
        np.testing.assert_allclose(sin[row], want_s, rtol=0, atol=tol, err_msg=f"sin at {p}")


def test_yarn_parameters_are_llama_cpps():
    """Qwen2.5-Coder with YaRN factor 4: correction dims (23, 40) of 64 pairs, mscale 1 + 0.1 ln 4."""
    s = RopeScaling.create("yarn", 4.0, 32768)
    assert s.rope_params(128, 1e6) == (0.25, 1.0, 23.0, 40.0, 1.0 + 0.1 * math.log(4.0))
    assert s.corr_dims(128, 1e6) == tuple(float(x) for x in llama_cpp_corr_dims(128, 32768, 1e6, 32.0, 1.0))
    lin = RopeScaling.create("linear", 4.0, 32768)
    assert lin.ext_factor == 0.0 and lin.mscale == 1.0


def test_pairs_outside_the_ramp():
    """YaRN keeps the high-frequency pairs (j <= low) exactly at their plain angle and divides the
    low-frequency ones (j >= high) by the factor; only the magnitude mscale differs."""
    rope_dim, theta = 64, 1e6
    s = RopeScaling.create("yarn", 4.0, 64)
    _, _, low, high, mscale = s.rope_params(rope_dim, theta)
    pos = np.array([1000])
    c, sn = ReferenceOps.rope_cos_sin(pos, theta, rope_dim, s)
    j = np.arange(rope_dim // 2)
    plain = 1000.0 * theta ** (-j * 2.0 / rope_dim)
    lo, hi = j <= low, j >= high
    assert lo.any() and hi.any()
    np.testing.assert_allclose(c[0, lo], np.cos(plain[lo]) * mscale, rtol=0, atol=2e-7)
    np.testing.assert_allclose(c[0, hi], np.cos(plain[hi] / 4.0) * mscale, rtol=0, atol=2e-7)
    np.testing.assert_allclose(sn[0, hi], np.sin(plain[hi] / 4.0) * mscale, rtol=0, atol=2e-7)


@pytest.mark.parametrize("neox", [True, False])
def test_plain_rope_is_unchanged_bit_for_bit(neox):
    """scaling=None is today's formula exactly (the GPU tests compare the kernels against it bitwise)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 3, 64)).astype(np.float32)
    positions = rng.integers(0, 1_000_000, 9)
    got = ReferenceOps().rope(x, positions, 1e6, 48, neox)
    # the formula as it stood before scaling existed
    half = 24
    inv_freq = 1e6 ** (-np.arange(half, dtype=np.float64) * 2.0 / 48)
    angle = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    cos = np.cos(angle).astype(np.float32)[:, None, :]
    sin = np.sin(angle).astype(np.float32)[:, None, :]
    want = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:48]
        want[..., :half], want[..., half:48] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., 0:48:2], x[..., 1:48:2]
        want[..., 0:48:2], want[..., 1:48:2] = a * cos - b * sin, a * sin + b * cos
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_rope_applies_the_scaled_cos_sin():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 2, 64)).astype(np.float32)
    positions = np.array([3, 70, 200, 255])
    s = RopeScaling.create("yarn", 4.0, 64)
    c, sn = ReferenceOps.rope_cos_sin(positions, 1e6, 64, s)
    out = ReferenceOps().rope(x, positions, 1e6, 64, True, s)
    a, b = x[..., :32], x[..., 32:]
    assert np.array_equal(out[..., :32], a * c[:, None] - b * sn[:, None])
    assert np.array_equal(out[..., 32:], a * sn[:, None] + b * c[:, None])


# ---- GGUF metadata -------------------------------------------------------------------------------------
def test_metadata_yarn(synthetic_model):
    path = synthetic_model(arch="qwen2", context_length=64, rope_scaling="yarn", rope_factor=4.0, rope_orig_ctx=64)
    _, cfg = open_model(path)
    s = cfg.rope_scaling
    assert (s.type, s.factor, s.orig_ctx, s.ext_factor, s.attn_factor, s.beta_fast, s.beta_slow) == \
        ("yarn", 4.0, 64, 1.0, 1.0, 32.0, 1.0)
    assert cfg.max_context == 256


def test_metadata_orig_ctx_defaults_to_context_length(synthetic_model):
    _, cfg = open_model(synthetic_model(context_length=512, rope_scaling="linear", rope_factor=2.0))
    assert cfg.rope_scaling.orig_ctx == 512 and cfg.rope_scaling.ext_factor == 0.0 and cfg.max_context == 1024


def test_no_scaling_metadata(synthetic_model):
    _, cfg = open_model(synthetic_model())
    assert cfg.rope_scaling is None and cfg.max_context == cfg.context_length
    # a factor of 1 changes nothing: the plain rope
    _, cfg = open_model(synthetic_model(rope_scaling="yarn", rope_factor=1.0))
    assert cfg.rope_scaling is None


def test_yarn_keys_read(tmp_path):
    """{arch}.rope.scaling.yarn_* and attn_factor (gguf.Keys.Rope) override llama.cpp's defaults."""
    import gguf

    from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model
    from flashd.daemon.models.gguf_file import GGUFFile

    path = write_synthetic_model(tmp_path / "m.gguf", SyntheticSpec(arch="qwen2", rope_scaling="yarn",
                                                                     rope_factor=4.0, rope_orig_ctx=64))
    base = GGUFFile(path)
    extra = {gguf.Keys.Rope.SCALING_YARN_BETA_FAST.format(arch="qwen2"): 16.0,
             gguf.Keys.Rope.SCALING_YARN_BETA_SLOW.format(arch="qwen2"): 2.0,
             gguf.Keys.Rope.SCALING_YARN_EXT_FACTOR.format(arch="qwen2"): 0.5,
             gguf.Keys.Rope.SCALING_ATTN_FACTOR.format(arch="qwen2"): 0.75}

    class WithKeys:            # the same file with a few more metadata keys
        path = base.path

        def metadata(self, key, default=...):
            return extra[key] if key in extra else base.metadata(key, default)

    s = RopeScaling.from_gguf(WithKeys(), "qwen2", 4096)
    assert (s.beta_fast, s.beta_slow, s.ext_factor, s.attn_factor) == (16.0, 2.0, 0.5, 0.75)
    assert s.mscale == 0.75 * (1 + 0.1 * math.log(4.0))


@pytest.mark.parametrize("fields", [dict(factor=0.0), dict(factor=float("nan")), dict(orig_ctx=0),
                                    dict(ext_factor=-1.0), dict(beta_fast=float("inf")), dict(attn_factor=0.0)])
def test_bad_values_refused(fields):
    args = dict(type="yarn", factor=4.0, orig_ctx=64, ext_factor=1.0) | fields
    with pytest.raises(ModelLoadError):
        RopeScaling(**args)


def test_unsupported_type_refused():
    with pytest.raises(ModelLoadError, match="longrope"):
        RopeScaling.create("longrope", 4.0, 64)


# ---- the user's override (flashd serve --rope-scaling) ---------------------------------------------------
def test_user_override(synthetic_model):
    path = synthetic_model(arch="qwen2", context_length=32768)
    _, cfg = open_model(path, rope_override=("yarn", 4.0, None))      # the model card's Qwen2.5 setting
    assert cfg.rope_scaling == RopeScaling.create("yarn", 4.0, 32768) and cfg.max_context == 131072
    _, cfg = open_model(path, rope_override=("linear", 2.0, 1024))
    assert (cfg.rope_scaling.type, cfg.rope_scaling.orig_ctx, cfg.max_context) == ("linear", 1024, 2048)
    with pytest.raises(ModelLoadError, match="--rope-factor"):
        open_model(path, rope_override=("yarn", None, None))
    scaled = synthetic_model(arch="qwen2", context_length=64, rope_scaling="yarn", rope_factor=4.0, rope_orig_ctx=64)
    assert open_model(scaled, rope_override=("none", None, None))[1].rope_scaling is None
    _, cfg = open_model(scaled, rope_override=("yarn", 8.0, None))     # the GGUF's orig_ctx kept
    assert (cfg.rope_scaling.factor, cfg.rope_scaling.orig_ctx) == (8.0, 64)


def test_serve_options_reach_the_engine_config():
    from click.testing import CliRunner

    from flashd.daemon import serve_command as sc

    seen = {}
    real = sc.serve
    sc.serve = lambda config: seen.setdefault("config", config) and 0
    try:
        result = CliRunner().invoke(sc.serve_command, ["--model", "m.gguf", "--rope-scaling", "yarn",
                                                       "--rope-factor", "4"])
        bad = CliRunner().invoke(sc.serve_command, ["--model", "m.gguf", "--rope-factor", "4"])
    finally:
        sc.serve = real
    assert result.exit_code == 0, result.output
    assert seen["config"].rope_override == ("yarn", 4.0, None)
    assert bad.exit_code != 0 and "--rope-scaling" in bad.output
