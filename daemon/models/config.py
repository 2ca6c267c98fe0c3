"""ModelConfig: the hyper-parameters of a dense GQA decoder, read from GGUF metadata."""
from __future__ import annotations

from dataclasses import dataclass

from .gguf_file import GGUFFile, ModelLoadError

__all__ = ["ModelConfig", "DENSE_ARCHS"]

# Architecture -> (RoPE style, q/k/v bias, per-head q/k RMSNorm).
# NeoX RoPE rotates (x[i], x[i + d/2]); "normal" rotates adjacent pairs (x[2i], x[2i+1]) -- llama.cpp's
# llama converter permutes the q/k rows so that the adjacent-pair form reproduces HF's rotate_half.
DENSE_ARCHS: dict[str, tuple[bool, bool, bool]] = {
    #          rope_neox, qkv_bias, qk_norm
    "llama": (False, False, False),
    "qwen2": (True, True, False),
    "qwen3": (True, False, True),
}


@dataclass(slots=True, frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    hidden: int            # embedding width
    n_heads: int           # query heads
    n_kv_heads: int        # key/value heads (GQA: n_heads % n_kv_heads == 0)
    head_dim: int
    ffn: int               # SwiGLU inner width
    vocab_size: int
    context_length: int    # trained context
    rope_theta: float
    rope_dim: int          # leading dims of each head that are rotated (== head_dim for these archs)
    rope_neox: bool
    rms_eps: float
    qkv_bias: bool
    qk_norm: bool
    tie_embeddings: bool   # lm_head reads token_embd
    name: str = ""

    def __post_init__(self):
        for field in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab_size"):
            if getattr(self, field) <= 0:
                raise ModelLoadError(f"{field} must be positive, got {getattr(self, field)}")
        if self.n_heads % self.n_kv_heads:
            raise ModelLoadError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.rope_dim % 2 or not 0 < self.rope_dim <= self.head_dim:
            raise ModelLoadError(f"rope_dim {self.rope_dim} must be even and in (0, head_dim {self.head_dim}]")

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> ModelConfig:
        arch = f.arch
        if arch not in DENSE_ARCHS:
            raise ModelLoadError(
                f"{f.path.name}: architecture {arch!r} is not supported "
                f"(supported: {', '.join(sorted(DENSE_ARCHS))})")
        rope_neox, qkv_bias, qk_norm = DENSE_ARCHS[arch]
        scaling = f.metadata(f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", "") or f.has_tensor("rope_freqs.weight"):
            raise ModelLoadError(f"{f.path.name}: RoPE scaling {scaling!r} is not supported")

        def key(name, default=...):
            return f.metadata(f"{arch}.{name}", default)

        hidden = int(key("embedding_length"))
        n_heads = int(key("attention.head_count"))
        head_dim = int(key("attention.key_length", hidden // n_heads))
        if int(key("attention.value_length", head_dim)) != head_dim:
            raise ModelLoadError(f"{f.path.name}: key_length != value_length is not supported")
        embd = f.tensor("token_embd.weight")
        vocab_size = int(key("vocab_size", embd.shape[0]))
        return cls(
            arch=arch,
            n_layers=int(key("block_count")),
            hidden=hidden,
            n_heads=n_heads,
            n_kv_heads=int(key("attention.head_count_kv", n_heads)),
            head_dim=head_dim,
            ffn=int(key("feed_forward_length")),
            vocab_size=vocab_size,
            context_length=int(key("context_length", 4096)),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rope_dim=int(key("rope.dimension_count", head_dim)),
            rope_neox=rope_neox,
            rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            tie_embeddings=not f.has_tensor("output.weight"),
            name=str(f.metadata("general.name", f.path.stem)),
        )
