"""The drafter's shape for the real targets: the Q8_0 file the issue caps at 60 MB (computed without torch; one
real-size export with it)."""
from __future__ import annotations

import pytest

from flashd.daemon.models.config import ModelConfig
from flashd.train.recipe import TrainConfig, drafter_config, param_count, q8_0_bytes


def qwen25(n_layers, hidden, n_heads, head_dim, ffn) -> ModelConfig:
    return ModelConfig(arch="qwen2", n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=2,
                       head_dim=head_dim, ffn=ffn, vocab_size=151936, context_length=32768, rope_theta=1e6,
                       rope_dim=head_dim, rope_neox=True, rms_eps=1e-6, qkv_bias=True, qk_norm=False,
                       tie_embeddings=True, name="qwen2.5")


CODER_15B = qwen25(28, 1536, 12, 128, 8960)
CODER_05B = qwen25(24, 896, 14, 64, 4864)


@pytest.mark.parametrize("target,layers,ffn", [(CODER_15B, (1, 7, 13, 19, 25), 1536),
                                               (CODER_05B, (1, 6, 11, 16, 21), 4864)])
def test_default_drafters_fit_the_size_cap(target, layers, ffn):
    cfg = drafter_config(target, TrainConfig(), mask_token_id=151935)
    assert cfg.target_layer_ids == layers and cfg.model.ffn == ffn and cfg.block_size == 16
    assert q8_0_bytes(cfg) < 56e6
    cfg.check_target(target)                      # the runtime's own check


def test_too_many_layers_for_the_cap_are_refused():
    with pytest.raises(ValueError, match="max-mb"):
        drafter_config(CODER_15B, TrainConfig(n_layers=8), mask_token_id=151935)


def test_real_size_export_matches_the_estimate(tmp_path):
    pytest.importorskip("torch")
    from flashd.train.drafter import TorchDrafter
    from flashd.train.export import export
    cfg = drafter_config(CODER_05B, TrainConfig(), mask_token_id=151935)
    path = tmp_path / "d.gguf"
    export(TorchDrafter(cfg), path, "q8_0")
    size = path.stat().st_size
    assert q8_0_bytes(cfg) <= size < q8_0_bytes(cfg) + 100_000 and size < 60e6     # metadata: a few KB
    assert sum(param_count(cfg)) > 40e6
