"""scripts/make_synthetic_dflash.py: drafters matched to a target, their stored weights, the CLI."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import ModelLoadError, open_model
from flashd.daemon.models.dflash_weights import load_dflash_weights, open_dflash
from flashd.scripts.make_synthetic_dflash import (SyntheticDFlashSpec, evenly_spaced_layers, float_tensor, main,
                                                  spec_for_target, write_synthetic_dflash)


@pytest.mark.parametrize("n_layers,n,want", [
    (64, 5, (1, 16, 31, 46, 61)),      # z-lab's Qwen3.5-27B drafter
    (36, 5, (1, 9, 17, 25, 33)),       # z-lab's Qwen3-8B drafter
    (28, 5, (1, 7, 13, 19, 25)),
    (4, 2, (0, 2)), (3, 3, (0, 1)), (2, 5, (0,)),   # shallow: never the last layer
])
def test_evenly_spaced_layers(n_layers, n, want):
    assert evenly_spaced_layers(n_layers, n) == want


def test_a_one_layer_target_has_no_usable_layer():
    with pytest.raises(ValueError, match=">= 2 layers"):
        evenly_spaced_layers(1, 1)


def test_stored_weights_are_the_float_weights(tmp_path):
    spec = spec_for_target(64, 4, 300, weight_type="F32", seed=4)
    f, cfg = open_dflash(write_synthetic_dflash(tmp_path / "d.gguf", spec))
    w = load_dflash_weights(f, cfg, ReferenceOps().load_weight)
    np.testing.assert_array_equal(np.concatenate(w.fc, axis=1), float_tensor(spec, "dflash.fc.weight"))
    np.testing.assert_array_equal(w.layers[1].ffn_down, float_tensor(spec, "blk.1.ffn_down.weight"))
    assert cfg.model.rms_eps == float(np.float32(spec.rms_eps))   # stored as float32, as GGUF files do
    assert dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, rms_eps=spec.rms_eps)) == spec.config()


def test_spec_checks():
    with pytest.raises(ValueError, match="multiple of the Q4_K block size 256"):
        spec_for_target(64, 4, 300, weight_type="Q4_K")
    with pytest.raises(ValueError, match="Q5_1"):
        spec_for_target(64, 4, 300, weight_type="Q5_1")
    with pytest.raises(ModelLoadError, match="block_size must be >= 2"):
        SyntheticDFlashSpec(hidden=64, target_layer_ids=(0,), mask_token_id=1, block_size=1)


def test_cli_matches_the_target(synthetic_model, tmp_path):
    target = synthetic_model(n_layers=6, hidden=128, n_heads=4, n_kv_heads=2, vocab_size=400)
    out = tmp_path / "cli.gguf"
    assert main([str(out), "--target", str(target), "--features", "3", "--block-size", "8"]) == 0
    _, cfg = open_dflash(out)
    _, tcfg = open_model(target)
    cfg.check_target(tcfg)
    assert (cfg.model.hidden, cfg.block_size, cfg.target_layer_ids, cfg.mask_token_id) == (128, 8, (1, 2, 3), 399)
    assert cfg.model.rope_theta == 1e7
