"""ModelConfig: the hyper-parameters of a dense GQA decoder, read from GGUF metadata."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .gguf_file import GGUFFile, ModelLoadError

__all__ = ["ModelConfig", "DENSE_ARCHS", "RopeScaling", "ROPE_SCALING_TYPES"]

# Architecture -> (RoPE style, q/k/v bias, per-head q/k RMSNorm).
# NeoX RoPE rotates (x[i], x[i + d/2]); "normal" rotates adjacent pairs (x[2i], x[2i+1]) -- llama.cpp's
# llama converter permutes the q/k rows so that the adjacent-pair form reproduces HF's rotate_half.
DENSE_ARCHS: dict[str, tuple[bool, bool, bool]] = {
    #          rope_neox, qkv_bias, qk_norm
    "llama": (False, False, False),
    "qwen2": (True, True, False),
    "qwen3": (True, False, True),
}


ROPE_SCALING_TYPES = ("linear", "yarn")


@dataclass(slots=True, frozen=True)
class RopeScaling:
    """RoPE position scaling, as llama.cpp applies it (ggml's rope_yarn; see rope_params).

    linear: every pair's angle is divided by `factor` (positions interpolated into the trained range).
    yarn: pairs that turn many times over `orig_ctx` keep their angle (extrapolation), pairs that turn
    less than once are divided by `factor`, a linear ramp between YaRN's correction dims (from
    beta_fast / beta_slow rotations over orig_ctx) mixes the two, and cos/sin are scaled by
    mscale = attn_factor * (1 + 0.1 ln factor) (softmax temperature). Built from GGUF metadata
    (`from_gguf`) or the user's `flashd serve --rope-scaling` (`create`); checked here, so the backends
    only see finite, in-range numbers.
    """

    type: str                       # "linear" | "yarn"
    factor: float                   # context extension: angles are divided by it (freq_scale = 1 / factor)
    orig_ctx: int                   # the context the model was trained at (YaRN's correction dims)
    ext_factor: float               # ramp weight of extrapolation: 1 for yarn, 0 for linear (llama.cpp's defaults)
    attn_factor: float = 1.0        # {arch}.rope.scaling.attn_factor: multiplies cos/sin in every mode
    yarn_attn_factor: float = 1.0   # {arch}.rope.scaling.yarn_attn_factor: llama.cpp uses it only if ext_factor == 0
    beta_fast: float = 32.0         # rotations over orig_ctx above which a pair is extrapolated
    beta_slow: float = 1.0          # rotations below which it is interpolated

    def __post_init__(self):
        if self.type not in ROPE_SCALING_TYPES:
            raise ModelLoadError(f"RoPE scaling type {self.type!r} is not supported "
                                 f"(supported: none, {', '.join(ROPE_SCALING_TYPES)})")
        for name in ("factor", "attn_factor", "yarn_attn_factor", "beta_fast", "beta_slow"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= 1e6):
                raise ModelLoadError(f"RoPE scaling {name} must be a finite number in (0, 1e6], got {value!r}")
        if not (isinstance(self.ext_factor, (int, float)) and math.isfinite(self.ext_factor)
                and 0 <= self.ext_factor <= 1e6):
            raise ModelLoadError(f"RoPE scaling ext_factor must be finite and >= 0, got {self.ext_factor!r}")
        if not (isinstance(self.orig_ctx, int) and 1 <= self.orig_ctx <= 1 << 30):
            raise ModelLoadError(f"RoPE scaling original context must be in [1, 2^30], got {self.orig_ctx!r}")

    @classmethod
    def create(cls, kind: str, factor: float, orig_ctx: int, *, ext_factor: float | None = None,
               **extra) -> RopeScaling:
        """ext_factor None: llama.cpp's default for the type (yarn 1, linear 0)."""
        if ext_factor is None:
            ext_factor = 1.0 if kind == "yarn" else 0.0
        return cls(type=kind, factor=float(factor), orig_ctx=int(orig_ctx), ext_factor=float(ext_factor),
                   **{k: float(v) for k, v in extra.items()})

    @property
    def freq_scale(self) -> float:
        return 1.0 / self.factor

    @property
    def mscale(self) -> float:
        """The factor on cos and sin: llama.cpp's yarn_attn_factor (llama_context: get_mscale(factor)
        cancelled by rope_yarn's own 1 + 0.1 ln(1/freq_scale), times rope.scaling.attn_factor) times
        rope_yarn's term, i.e. attn_factor * (1 + 0.1 ln factor) for factor > 1 when ext_factor != 0."""
        if self.ext_factor != 0.0:
            return self.attn_factor * (1.0 + 0.1 * math.log(self.factor) if self.factor > 1.0 else 1.0)
        return self.attn_factor * self.yarn_attn_factor

    def corr_dims(self, rope_dim: int, theta: float) -> tuple[float, float]:
        """ggml_rope_yarn_corr_dims: the pair indices (low, high) between which the ramp runs; pair j <=
        low is extrapolated, j >= high interpolated. dim(beta) = rope_dim ln(orig_ctx / (2 pi beta)) /
        (2 ln theta); low = max(0, floor(dim(beta_fast))), high = min(rope_dim - 1, ceil(dim(beta_slow)))
        (float64 here, float32 in ggml: they differ only if dim(beta) is within ~1e-6 of an integer)."""
        def dim(beta: float) -> float:
            return rope_dim * math.log(self.orig_ctx / (beta * 2.0 * math.pi)) / (2.0 * math.log(theta))
        return (float(max(0.0, math.floor(dim(self.beta_fast)))),
                float(min(rope_dim - 1.0, math.ceil(dim(self.beta_slow)))))

    def rope_params(self, rope_dim: int, theta: float) -> tuple[float, float, float, float, float]:
        """(freq_scale, ext_factor, corr_low, corr_high, mscale): everything the rope arithmetic needs
        (ReferenceOps.rope and the C ABI's fd_rope_scaling_t). Pair j's angle at position p, with
        e = p * theta^(-2j/rope_dim): i = freq_scale * e; if ext_factor != 0: ramp = 1 - clamp((j - low)
        / max(0.001, high - low), 0, 1), mix = ramp * ext_factor, angle = i (1 - mix) + e mix; else
        angle = i. cos/sin are cos(angle) * mscale, sin(angle) * mscale."""
        if not (theta > 0 and rope_dim >= 2):
            raise ModelLoadError(f"RoPE scaling needs theta > 0 and rope_dim >= 2 (got {theta}, {rope_dim})")
        low, high = self.corr_dims(rope_dim, theta)
        return (self.freq_scale, float(self.ext_factor), low, high, self.mscale)

    @classmethod
    def from_gguf(cls, f: GGUFFile, arch: str, context_length: int) -> RopeScaling | None:
        """{arch}.rope.scaling.*: type (none / linear / yarn), factor, original_context_length (default:
        the context_length, as llama.cpp), attn_factor and the yarn_* keys (llama.cpp's defaults when
        absent). None when the type is none or the factor is absent, 0 or 1 with no other effect."""
        def key(name, default):
            return f.metadata(f"{arch}.rope.scaling.{name}", default)

        kind = str(key("type", "none") or "none")
        if kind == "none":
            return None
        if kind not in ROPE_SCALING_TYPES:
            raise ModelLoadError(f"{f.path.name}: RoPE scaling {kind!r} is not supported "
                                 f"(supported: none, {', '.join(ROPE_SCALING_TYPES)})")
        factor = float(key("factor", 0.0))
        if factor == 0.0:            # llama.cpp: no factor is freq_scale 1
            factor = 1.0
        extra = {name: key(gguf_name, None) for name, gguf_name in (
            ("ext_factor", "yarn_ext_factor"), ("yarn_attn_factor", "yarn_attn_factor"),
            ("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow"), ("attn_factor", "attn_factor"))}
        try:
            scaling = cls.create(kind, factor, int(key("original_context_length", context_length)),
                                 **{k: v for k, v in extra.items() if v is not None})
        except ModelLoadError as exc:
            raise ModelLoadError(f"{f.path.name}: {exc}") from None
        if scaling.factor == 1.0 and scaling.mscale == 1.0:
            return None              # angles and magnitudes unchanged: the unscaled rope, exactly
        return scaling


@dataclass(slots=True, frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    hidden: int            # embedding width
    n_heads: int           # query heads
    n_kv_heads: int        # key/value heads (GQA: n_heads % n_kv_heads == 0)
    head_dim: int
    ffn: int               # SwiGLU inner width
    vocab_size: int        # 0 only for a DFlash drafter's layers (dflash_config.py: they borrow the target's)
    context_length: int    # trained context
    rope_theta: float
    rope_dim: int          # leading dims of each head that are rotated (== head_dim for these archs)
    rope_neox: bool
    rms_eps: float
    qkv_bias: bool
    qk_norm: bool
    tie_embeddings: bool   # lm_head reads token_embd
    name: str = ""
    rope_scaling: RopeScaling | None = None   # None: plain RoPE
    linear: Any = None     # a hybrid's Gated DeltaNet layers (qwen35_config.LinearAttentionConfig); None: dense

    @property
    def max_context(self) -> int:
        """Positions the model is meant to see: the trained context, or orig_ctx * factor when its RoPE
        is scaled (Qwen2.5 with YaRN factor 4: 32768 -> 131072)."""
        if self.rope_scaling is None:
            return self.context_length
        return int(round(self.rope_scaling.orig_ctx * self.rope_scaling.factor))

    def __post_init__(self):
        for field in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn"):
            if getattr(self, field) <= 0:
                raise ModelLoadError(f"{field} must be positive, got {getattr(self, field)}")
        if self.vocab_size < 0 or (self.vocab_size == 0 and self.arch in DENSE_ARCHS):
            raise ModelLoadError(f"vocab_size must be positive, got {self.vocab_size}")
        if self.n_heads % self.n_kv_heads:
            raise ModelLoadError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.rope_dim % 2 or not 0 < self.rope_dim <= self.head_dim:
            raise ModelLoadError(f"rope_dim {self.rope_dim} must be even and in (0, head_dim {self.head_dim}]")
        if not self.rope_theta > 0 or not self.rms_eps > 0:
            raise ModelLoadError(f"rope_theta ({self.rope_theta}) and rms_eps ({self.rms_eps}) must be positive")

    def with_rope_override(self, kind: str, factor: float | None = None, orig_ctx: int | None = None) -> ModelConfig:
        """The user's `flashd serve --rope-scaling KIND [--rope-factor F] [--rope-orig-ctx N]` over the GGUF's
        own: none drops scaling; linear / yarn replace it (llama.cpp's defaults for the rest), with orig_ctx
        defaulting to the model's original context (its scaling's, else context_length) and factor to the
        model's own factor."""
        import dataclasses

        if kind == "none":
            return dataclasses.replace(self, rope_scaling=None)
        own = self.rope_scaling
        if factor is None:
            if own is None:
                raise ModelLoadError(f"--rope-scaling {kind} needs --rope-factor (the model has no RoPE scaling)")
            factor = own.factor
        if orig_ctx is None:
            orig_ctx = own.orig_ctx if own is not None else self.context_length
        return dataclasses.replace(self, rope_scaling=RopeScaling.create(kind, factor, orig_ctx))

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> ModelConfig:
        from .qwen35_config import HYBRID_ARCHS, qwen35_config

        arch = f.arch
        if arch in HYBRID_ARCHS:
            return qwen35_config(f)
        if arch not in DENSE_ARCHS:
            raise ModelLoadError(
                f"{f.path.name}: architecture {arch!r} is not supported "
                f"(supported: {', '.join(sorted((*DENSE_ARCHS, *HYBRID_ARCHS)))})")
        rope_neox, qkv_bias, qk_norm = DENSE_ARCHS[arch]
        if f.has_tensor("rope_freqs.weight"):
            raise ModelLoadError(f"{f.path.name}: per-pair RoPE frequency factors (rope_freqs) are not supported")

        def key(name, default=...):
            return f.metadata(f"{arch}.{name}", default)

        hidden = int(key("embedding_length"))
        n_heads = int(key("attention.head_count"))
        head_dim = int(key("attention.key_length", hidden // n_heads))
        if int(key("attention.value_length", head_dim)) != head_dim:
            raise ModelLoadError(f"{f.path.name}: key_length != value_length is not supported")
        embd = f.tensor("token_embd.weight")
        vocab_size = int(key("vocab_size", embd.shape[0]))
        context_length = int(key("context_length", 4096))
        return cls(
            arch=arch,
            n_layers=int(key("block_count")),
            hidden=hidden,
            n_heads=n_heads,
            n_kv_heads=int(key("attention.head_count_kv", n_heads)),
            head_dim=head_dim,
            ffn=int(key("feed_forward_length")),
            vocab_size=vocab_size,
            context_length=context_length,
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rope_dim=int(key("rope.dimension_count", head_dim)),
            rope_neox=rope_neox,
            rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            tie_embeddings=not f.has_tensor("output.weight"),
            name=str(f.metadata("general.name", f.path.stem)),
            rope_scaling=RopeScaling.from_gguf(f, arch, context_length),
        )
