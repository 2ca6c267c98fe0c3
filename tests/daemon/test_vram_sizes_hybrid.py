"""The CUDA VRAM plan's sizes for a hybrid (qwen35) target (daemon/vram_sizes.py CudaSizes._hybrid), without a GPU:
K/V only for the full-attention layers, the device recurrent state, its draft-tree node states and hybrid_ops.py's
buffers as their own parts,
and an arena / scratch need at least what CudaBackend.plan reserves for the hybrid's layers (hybrid_plan.py)."""
from flashd.daemon.backends.cuda.hybrid_plan import (hybrid_largest_weight, hybrid_layer_bytes, hybrid_state_bytes,
                                                     hybrid_workspace_bytes)
from flashd.daemon.models import open_model
from flashd.daemon.vram_budget import kv_cache_bytes
from flashd.daemon.vram_sizes import CudaSizes, describe_model
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model
from tests.daemon.test_vram_sizes import attention_ws, sample_ws

SPEC = SyntheticSpec(arch="qwen35", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, rope_dim=32,
                     ffn=512, vocab_size=512, ssm_state=64, ssm_k_heads=2, ssm_v_heads=4, seed=31, name="hyb")


def test_cuda_hybrid_target_parts_and_needs(tmp_path):
    desc = describe_model("hyb", *open_model(write_synthetic_model(tmp_path / "hyb.gguf", SPEC)))
    cfg = desc.cfg
    parts, need = CudaSizes(attention_ws, sample_ws).model(desc, max_ctx=1024, prefill_chunk=128, kv_type="f16")
    parts = dict(parts)
    assert set(parts) == {"weights", "kv_cache", "recurrent_state", "tree_states", "hybrid_buffers", "runner"}
    assert parts["tree_states"] == 65 * parts["recurrent_state"]              # the largest tree: 65 nodes
    assert parts["kv_cache"] == kv_cache_bytes(1, 2, 64, 1024, "f16", "f16")     # layer 3 alone is attention
    assert parts["recurrent_state"] == hybrid_state_bytes(cfg) == 3 * 4 * (3 * cfg.linear.conv_channels + 4 * 64 * 64)
    assert parts["hybrid_buffers"] == hybrid_workspace_bytes(cfg, 128)
    assert need.arena_half >= hybrid_layer_bytes(cfg, 128)
    assert need.scratch_elems == hybrid_largest_weight(cfg) == 2 * 256 * 256  # attn_q: query and gate rows
    assert need.attention == attention_ws(4, 2, 64, 1024, 65)
