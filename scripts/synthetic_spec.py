"""SyntheticSpec: the shape, formats and seed of a synthetic GGUF model (make_synthetic_gguf.py writes it),
its fields checked (synthetic_presets.py holds the real shapes it can take)."""
from __future__ import annotations

from dataclasses import dataclass

from flashd.scripts.synthetic_arch import ARCH_LAYOUTS
from flashd.scripts.synthetic_vocab import N_BYTE_TOKENS, SPECIAL_TOKENS

__all__ = ["SUPPORTED_WEIGHT_TYPES", "SyntheticSpec"]

# GGML type names accepted for 2-D weight matrices. Q5_1 is not among the formats flashd runs; it is
# here so tests can check that such a file is refused with a clear error.
SUPPORTED_WEIGHT_TYPES: tuple[str, ...] = (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
)


@dataclass(slots=True, frozen=True)
class SyntheticSpec:
    arch: str = "qwen2"          # a key of ARCH_LAYOUTS: llama | qwen2 | qwen3 | qwen35
    n_layers: int = 2
    hidden: int = 64             # embedding_length
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int | None = None  # default hidden // n_heads; qwen3 may differ (key_length/value_length)
    ffn: int = 128               # feed_forward_length
    vocab_size: int = 512        # >= 256 byte tokens + 3 special tokens
    context_length: int = 4096
    rope_theta: float = 10000.0
    rope_scaling: str = "none"   # {arch}.rope.scaling.type: none (no scaling keys written) | linear | yarn
    rope_factor: float = 1.0     # {arch}.rope.scaling.factor
    rope_orig_ctx: int | None = None   # {arch}.rope.scaling.original_context_length (None: not written)
    rms_eps: float = 1e-6
    weight_type: str = "Q8_0"    # GGML type name for 2-D weight matrices (SUPPORTED_WEIGHT_TYPES)
    type_overrides: tuple[tuple[str, str], ...] = ()  # (tensor-name glob, type); later entries win
    tie_embeddings: bool = False  # no output.weight; lm_head = token_embd
    seed: int = 0
    name: str = "synthetic"
    # qwen35 only (synthetic_qwen35.py): the Gated DeltaNet layers and the partial rotary dims
    rope_dim: int | None = None  # rope.dimension_count: rotated dims of each head (default head_dim)
    ssm_state: int = 16          # ssm.state_size: the head size of linear attention's keys and values
    ssm_k_heads: int = 2         # ssm.group_count: query / key heads of linear attention
    ssm_v_heads: int = 4         # ssm.time_step_rank: value heads (a multiple of ssm_k_heads)
    ssm_conv_kernel: int = 4     # ssm.conv_kernel: taps of the short causal convolution
    full_attn_interval: int = 4  # full_attention_interval: layer i is full attention iff (i + 1) % it == 0
    mtp: bool = False            # qwen35: one multi-token-prediction block (nextn_predict_layers = 1) after the
                                 # trunk, stored as block n_layers (synthetic_qwen35.py qwen35_mtp_tensors)
    mtp_own_head: bool = False   # with mtp: also nextn.embed_tokens and nextn.shared_head_head (else the MTP
                                 # block falls back to token_embd / output, as llama.cpp's loader allows)
    random_blocks: bool = False  # matrices as random valid quant blocks (no quantizer: a 16 GB file in
                                 # seconds; float_tensor does not apply to them)

    def __post_init__(self) -> None:
        if self.arch not in ARCH_LAYOUTS:
            raise ValueError(f"arch {self.arch!r} is not one of {sorted(ARCH_LAYOUTS)}")
        for field in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn", "context_length"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field} must be a positive int, got {value!r}")
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim is None and self.hidden % self.n_heads != 0:
            raise ValueError(f"hidden ({self.hidden}) is not divisible by n_heads ({self.n_heads}); give head_dim")
        if self.head_dim is not None and (not isinstance(self.head_dim, int) or self.head_dim < 1):
            raise ValueError(f"head_dim must be a positive int, got {self.head_dim!r}")
        if self.head_dim_resolved % 2 != 0:
            raise ValueError(f"head_dim ({self.head_dim_resolved}) must be even (RoPE rotates pairs)")
        min_vocab = N_BYTE_TOKENS + len(SPECIAL_TOKENS)
        if not isinstance(self.vocab_size, int) or self.vocab_size < min_vocab:
            raise ValueError(f"vocab_size must be >= {min_vocab} (byte tokens + special tokens), got {self.vocab_size!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta!r}")
        if not self.rms_eps > 0:
            raise ValueError(f"rms_eps must be > 0, got {self.rms_eps!r}")
        if self.rope_scaling not in ("none", "linear", "yarn"):
            raise ValueError(f"rope_scaling must be none, linear or yarn, got {self.rope_scaling!r}")
        if not self.rope_factor > 0:
            raise ValueError(f"rope_factor must be > 0, got {self.rope_factor!r}")
        if self.rope_orig_ctx is not None and (not isinstance(self.rope_orig_ctx, int) or self.rope_orig_ctx < 1):
            raise ValueError(f"rope_orig_ctx must be a positive int, got {self.rope_orig_ctx!r}")
        if not self.name:
            raise ValueError("name must be non-empty")
        if not isinstance(self.type_overrides, tuple) or not all(
                isinstance(o, tuple) and len(o) == 2 and all(isinstance(v, str) for v in o)
                for o in self.type_overrides):
            raise ValueError(f"type_overrides must be a tuple of (glob, type name) pairs, got {self.type_overrides!r}")
        for glob, type_name in ((None, self.weight_type), *self.type_overrides):
            if type_name not in SUPPORTED_WEIGHT_TYPES:
                where = "weight_type" if glob is None else f"type override for {glob!r}"
                raise ValueError(f"{where}: {type_name!r} is not one of {SUPPORTED_WEIGHT_TYPES}")
        if (self.mtp or self.mtp_own_head) and self.arch != "qwen35":
            raise ValueError(f"mtp is a qwen35 option, not {self.arch}'s")
        if self.mtp_own_head and not self.mtp:
            raise ValueError("mtp_own_head needs mtp")
        check = ARCH_LAYOUTS[self.arch].check
        if check is not None:
            check(self)
        from flashd.scripts.make_synthetic_gguf import tensor_plan
        tensor_plan(self)  # checks the overrides match tensors and every row fits its format's blocks

    @property
    def head_dim_resolved(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.n_heads

    @property
    def rope_dim_resolved(self) -> int:
        return self.rope_dim if self.rope_dim is not None else self.head_dim_resolved
