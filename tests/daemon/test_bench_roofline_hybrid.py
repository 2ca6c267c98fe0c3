"""flashd bench's roofline bytes for a hybrid (qwen35): K/V of the full-attention layers only, plus the recurrent
state read and written once per step (daemon/bench.py decode_bytes_per_token); a dense model's bytes unchanged."""
from flashd.daemon.backends.cuda.hybrid_plan import hybrid_state_bytes
from flashd.daemon.bench import decode_bytes_per_token, recurrent_state_bytes
from flashd.daemon.models import open_model
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec


def test_hybrid_roofline_counts_attention_kv_and_the_state_twice(tmp_path):
    spec = SyntheticSpec(arch="qwen35", n_layers=8, hidden=64, n_heads=2, n_kv_heads=1, head_dim=64, rope_dim=16,
                         ffn=128, vocab_size=300, weight_type="F32", ssm_state=16, ssm_k_heads=2, ssm_v_heads=4,
                         ssm_conv_kernel=4, full_attn_interval=4)
    _, cfg = open_model(write_synthetic_model(tmp_path / "q35.gguf", spec))
    lin = cfg.linear
    assert len(lin.attention_layers) == 2 and len(lin.linear_layers) == 6
    state = 4 * 6 * (3 * lin.conv_channels + 4 * 16 * 16)
    assert recurrent_state_bytes(cfg) == state == hybrid_state_bytes(cfg)
    w, embd, depth = 10_000, 300 * 64 * 4, 100
    base = w - (0 if cfg.tie_embeddings else embd) + embd // 300
    assert decode_bytes_per_token(cfg, w, embd, depth) == base + 2 * 2 * depth * cfg.kv_dim * 2 + 2 * state


def test_dense_roofline_is_unchanged(tmp_path):
    spec = SyntheticSpec(arch="qwen2", n_layers=3, hidden=64, n_heads=2, n_kv_heads=1, ffn=128, vocab_size=300,
                         weight_type="F32")
    _, cfg = open_model(write_synthetic_model(tmp_path / "q2.gguf", spec))
    w, embd = 10_000, 300 * 64 * 4
    base = w - (0 if cfg.tie_embeddings else embd) + embd // 300
    assert decode_bytes_per_token(cfg, w, embd, 50) == base + 2 * 3 * 50 * cfg.kv_dim * 2
