"""The hyper-parameters of a `qwen35` GGUF (Qwen3.5 / Qwen3.6 hybrids), as llama.cpp's loader reads them
(src/models/qwen35.cpp, src/llama-model.cpp of the llama.cpp vendored in llama-cpp-python 0.3.36).

A ModelConfig with `linear` set: the full-attention layers are described by the dense fields (n_heads,
n_kv_heads, head_dim, rope_dim: the partial rotary dims), the Gated DeltaNet layers by `linear`
(LinearAttentionConfig). Keys read:

    {arch}.ssm.conv_kernel        K, taps of the short causal convolution
    {arch}.ssm.state_size         S, the head size of linear attention's queries, keys and values
    {arch}.ssm.group_count        Hk, query/key heads of linear attention
    {arch}.ssm.time_step_rank     Hv, value heads (a multiple of Hk; value head h reads key head h % Hk)
    {arch}.ssm.inner_size         Hv * S
    {arch}.full_attention_interval  layer i is full attention iff (i + 1) % interval == 0 (default 4), unless
    {arch}.attention.recurrent_layers  (bool per layer) says which layers are linear attention
    {arch}.rope.dimension_count, {arch}.rope.dimension_sections  the rotated dims and llama.cpp's interleaved
                                  M-RoPE sections; for text every rotated pair must get the token's position
                                  (as in every Qwen3.5 model): then the rope is NeoX's over rope_dim dims.
"""
from __future__ import annotations

from dataclasses import dataclass

from .gguf_file import GGUFFile, ModelLoadError

__all__ = ["LinearAttentionConfig", "HYBRID_ARCHS", "qwen35_config", "sections_cover"]

HYBRID_ARCHS = ("qwen35",)


@dataclass(slots=True, frozen=True)
class LinearAttentionConfig:
    """The Gated DeltaNet layers of a hybrid model."""

    recurrent: tuple[bool, ...]   # per layer: True = linear attention (Gated DeltaNet), False = full attention
    conv_kernel: int              # K
    head_dim: int                 # S (queries, keys and values alike)
    n_k_heads: int                # Hk
    n_v_heads: int                # Hv

    def __post_init__(self):
        for name in ("conv_kernel", "head_dim", "n_k_heads", "n_v_heads"):
            if getattr(self, name) <= 0:
                raise ModelLoadError(f"linear attention {name} must be positive, got {getattr(self, name)}")
        if self.conv_kernel < 2:
            raise ModelLoadError(f"ssm.conv_kernel must be >= 2, got {self.conv_kernel}")
        if self.n_v_heads % self.n_k_heads:
            raise ModelLoadError(f"ssm.time_step_rank {self.n_v_heads} is not a multiple of ssm.group_count "
                                 f"{self.n_k_heads}")

    # Widths from head counts, one property each: ModelConfig's q_dim / kv_dim in shape, for these layers' heads.
    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """q, k and v channels of the convolution, in that order."""
        return 2 * self.key_dim + self.value_dim

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, r in enumerate(self.recurrent) if r]

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, r in enumerate(self.recurrent) if not r]


def sections_cover(sections, n_pairs: int) -> bool:
    """Whether llama.cpp's interleaved M-RoPE (ggml_mrope_cache_init, is_imrope) rotates every one of n_pairs
    pairs by a text token's position: pair j's sector s = j % sum(sections) reads position t, h or w (all the
    token's position for text) when s < 3 * sections[s % 3], else the 4th position, which is 0 for text."""
    total = sum(sections)
    return total > 0 and all((j % total) < 3 * sections[(j % total) % 3] for j in range(n_pairs))


def qwen35_config(f: GGUFFile):
    """ModelConfig of a qwen35 file (ModelLoadError naming what is missing or unsupported)."""
    from .config import ModelConfig, RopeScaling

    arch = f.arch

    def key(name, default=...):
        return f.metadata(f"{arch}.{name}", default)

    n_layers = int(key("block_count"))
    if int(key("nextn_predict_layers", 0)):
        n_layers -= int(key("nextn_predict_layers"))      # MTP blocks follow the trunk (qwen35_mtp_weights.py)
    recurrent = key("attention.recurrent_layers", None)
    if recurrent is None:
        interval = int(key("full_attention_interval", 4))
        recurrent = [(i + 1) % interval != 0 for i in range(n_layers)]
    recurrent = tuple(bool(r) for r in list(recurrent)[:n_layers])
    hidden = int(key("embedding_length"))
    n_heads = int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", hidden // n_heads))
    if int(key("attention.value_length", head_dim)) != head_dim:
        raise ModelLoadError(f"{f.path.name}: key_length != value_length is not supported")
    rope_dim = int(key("rope.dimension_count", head_dim))
    sections = [int(s) for s in list(key("rope.dimension_sections", [rope_dim // 2, 0, 0, 0]))][:4]
    if not sections_cover(sections + [0] * (4 - len(sections)), rope_dim // 2):
        raise ModelLoadError(f"{f.path.name}: rope.dimension_sections {sections} leave some of the {rope_dim // 2} "
                             "rotated pairs of a text token unrotated; only sections covering every pair are supported")
    state = int(key("ssm.state_size"))
    linear = LinearAttentionConfig(recurrent=recurrent, conv_kernel=int(key("ssm.conv_kernel")), head_dim=state,
                                   n_k_heads=int(key("ssm.group_count")), n_v_heads=int(key("ssm.time_step_rank")))
    if int(key("ssm.inner_size", linear.value_dim)) != linear.value_dim:
        raise ModelLoadError(f"{f.path.name}: ssm.inner_size {int(key('ssm.inner_size'))} != time_step_rank x "
                             f"state_size {linear.value_dim}")
    embd = f.tensor("token_embd.weight")
    context_length = int(key("context_length", 4096))
    return ModelConfig(
        arch=arch, n_layers=n_layers, hidden=hidden, n_heads=n_heads,
        n_kv_heads=int(key("attention.head_count_kv", n_heads)), head_dim=head_dim,
        ffn=int(key("feed_forward_length")), vocab_size=int(key("vocab_size", embd.shape[0])),
        context_length=context_length, rope_theta=float(key("rope.freq_base", 10000.0)), rope_dim=rope_dim,
        rope_neox=True, rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)), qkv_bias=False, qk_norm=True,
        tie_embeddings=not f.has_tensor("output.weight"), name=str(f.metadata("general.name", f.path.stem)),
        rope_scaling=RopeScaling.from_gguf(f, arch, context_length), linear=linear)
