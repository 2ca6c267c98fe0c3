"""Real shapes for synthetic models: make_synthetic_gguf --preset NAME (other flags override)."""
from __future__ import annotations

from flashd.scripts.synthetic_spec import SyntheticSpec

__all__ = ["PRESETS"]

# Real shapes (hyper-parameters of the GGUFs of the same name; both keep a separate output.weight).
PRESETS: dict[str, SyntheticSpec] = {
    "qwen2.5-0.5b": SyntheticSpec(
        arch="qwen2", n_layers=24, hidden=896, n_heads=14, n_kv_heads=2, ffn=4864, vocab_size=151936,
        context_length=32768, rope_theta=1_000_000.0, rms_eps=1e-6, weight_type="Q8_0",
        name="synthetic qwen2.5-0.5b"),
    "qwen2.5-1.5b": SyntheticSpec(
        arch="qwen2", n_layers=28, hidden=1536, n_heads=12, n_kv_heads=2, ffn=8960, vocab_size=151936,
        context_length=32768, rope_theta=1_000_000.0, rms_eps=1e-6, weight_type="Q8_0",
        name="synthetic qwen2.5-1.5b"),
    # Clones of the real Q4_K_M files: same shapes and the same format for every tensor (read off
    # the files), random weights. Kernels do the same work on them as on the real models, so they
    # stand in for speed measurements where the real files cannot be copied.
    "qwen2.5-coder-1.5b-q4_k_m": SyntheticSpec(
        arch="qwen2", n_layers=28, hidden=1536, n_heads=12, n_kv_heads=2, ffn=8960, vocab_size=151936,
        context_length=32768, rope_theta=1_000_000.0, rms_eps=1e-6, weight_type="Q4_K",
        type_overrides=(("output.weight", "Q6_K"),) + tuple(
            (f"blk.{i}.{t}.weight", "Q6_K") for i in (0, 1, 5, 6, 7, 8, 9, 10, 13, 16, 19, 21, 24, 27)
            for t in ("attn_v", "ffn_down")),
        name="synthetic clone of qwen2.5-coder-1.5b-instruct-q4_k_m"),
    "qwen2.5-coder-0.5b-q4_k_m": SyntheticSpec(
        arch="qwen2", n_layers=24, hidden=896, n_heads=14, n_kv_heads=2, ffn=4864, vocab_size=151936,
        context_length=32768, rope_theta=1_000_000.0, rms_eps=1e-6, weight_type="Q5_0",
        type_overrides=(("output.weight", "Q8_0"),)
        + tuple((f"blk.{i}.attn_v.weight", "Q8_0") for i in (0, 1, 3, 6, 7, 8, 9, 10, 13, 16, 19, 21))
        + tuple((f"blk.{i}.ffn_down.weight", "Q6_K") for i in (0, 1, 3, 6, 7, 8, 9, 10, 13, 16, 19, 21))
        + tuple((f"blk.{i}.ffn_down.weight", "Q4_K") for i in (2, 4, 5, 11, 12, 14, 15, 17, 18, 20, 22, 23)),
        name="synthetic clone of qwen2.5-coder-0.5b-instruct-q4_k_m"),
    # Qwen3.5 shapes (config.json of Qwen/Qwen3.5-0.8B and -27B: 3 linear-attention layers then one full-attention
    # layer, head_dim 256 with 64 rotated dims, 128-wide DeltaNet heads, conv kernel 4, vocab 248320). Q4_K_M files
    # mix Q4_K / Q6_K; the q4_k_m presets write Q4_K matrices with Q6_K for the lm_head, as random valid blocks.
    "qwen3.5-0.8b": SyntheticSpec(
        arch="qwen35", n_layers=24, hidden=1024, n_heads=8, n_kv_heads=2, head_dim=256, rope_dim=64, ffn=3584,
        vocab_size=248320, context_length=262144, rope_theta=10_000_000.0, rms_eps=1e-6, weight_type="BF16",
        ssm_state=128, ssm_k_heads=16, ssm_v_heads=16, ssm_conv_kernel=4, full_attn_interval=4,
        tie_embeddings=True, random_blocks=True, name="synthetic qwen3.5-0.8b"),
    "qwen3.5-27b-q4_k_m": SyntheticSpec(
        arch="qwen35", n_layers=64, hidden=5120, n_heads=24, n_kv_heads=4, head_dim=256, rope_dim=64, ffn=17408,
        vocab_size=248320, context_length=262144, rope_theta=10_000_000.0, rms_eps=1e-6, weight_type="Q4_K",
        type_overrides=(("output.weight", "Q6_K"),), ssm_state=128, ssm_k_heads=16, ssm_v_heads=48,
        ssm_conv_kernel=4, full_attn_interval=4, random_blocks=True, name="synthetic qwen3.5-27b q4_k_m"),
}
