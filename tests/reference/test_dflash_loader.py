"""Loading a DFlash drafter GGUF: every way a file or a target pairing can be wrong is a clear error."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gguf import GGUFReader

from flashd.daemon.models import ModelLoadError, open_model
from flashd.daemon.models.dflash_config import DFLASH_ARCH, K_ROPE_THETA, DFlashConfig, write_metadata
from flashd.daemon.models.dflash_weights import open_dflash, split_columns
from flashd.scripts.gguf_out import new_gguf
from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_synthetic_dflash(tmp_path_factory.mktemp("dflash") / "good.gguf", spec_for_target(64, 4, 300))


class _SkipKeys:
    """A GGUFWriter stand-in for write_metadata that drops some keys."""

    def __init__(self, writer, drop):
        self.writer, self.drop = writer, set(drop)

    def __getattr__(self, attr):
        fn = getattr(self.writer, attr)
        return lambda *a, **k: None if a and a[0] in self.drop else fn(*a, **k)


def rewrite(src, dst, *, drop_tensors=(), drop_keys=(), cfg_changes=None, extra=None, reshape=None):
    """src's tensors and config, minus/plus what the test wants broken."""
    r = GGUFReader(src)
    cfg = DFlashConfig.from_gguf(open_dflash(src)[0])
    if cfg_changes:
        cfg = dataclasses.replace(cfg, **cfg_changes)
    with new_gguf(dst, DFLASH_ARCH) as w:
        write_metadata(_SkipKeys(w, drop_keys), cfg)
        for t in r.tensors:
            if t.name in drop_tensors:
                continue
            data = np.asarray(t.data)
            if reshape and t.name == reshape:
                data = data[:-1]                                  # one row short
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
        for name, arr in (extra or {}).items():
            w.add_tensor(name, arr)
    return dst


def test_good_file_opens(good):
    f, cfg = open_dflash(good)
    assert cfg.model.hidden == 64 and cfg.mask_token_id == 299


@pytest.mark.parametrize("kwargs,message", [
    (dict(drop_tensors={"blk.1.ffn_up.weight"}), "tensor 'blk.1.ffn_up.weight' is missing"),
    (dict(drop_tensors={"dflash.fc.weight"}), "tensor 'dflash.fc.weight' is missing"),
    (dict(reshape="blk.0.attn_k.weight"), "'blk.0.attn_k.weight' has shape \\(31, 64\\), expected \\(32, 64\\)"),
    (dict(drop_keys={K_ROPE_THETA}), "metadata key 'dflash.rope.freq_base' is missing"),
    (dict(extra={"blk.0.attention_conv.base_kernel": np.zeros((2, 64), np.float32)}),
     "tensors this DFlash drafter does not use: blk.0.attention_conv.base_kernel"),
    (dict(cfg_changes={"target_layer_ids": (1, 2, 3)}),
     "'dflash.fc.weight' has shape \\(64, 128\\), expected \\(64, 192\\)"),
])
def test_broken_files_are_clear_errors(good, tmp_path, kwargs, message):
    bad = rewrite(good, tmp_path / "bad.gguf", **kwargs)
    with pytest.raises(ModelLoadError, match=message):
        open_dflash(bad)


def test_a_dense_model_is_not_a_drafter(synthetic_model):
    with pytest.raises(ModelLoadError, match="architecture 'qwen2' is not a DFlash drafter"):
        open_dflash(synthetic_model())


def test_target_mismatches(good, synthetic_model):
    _, cfg = open_dflash(good)
    _, target = open_model(synthetic_model(hidden=128, n_layers=4, vocab_size=300))
    with pytest.raises(ModelLoadError, match="hidden size 64 != the target's 128"):
        cfg.check_target(target)
    _, shallow = open_model(synthetic_model(hidden=64, n_layers=2, vocab_size=300))
    with pytest.raises(ModelLoadError, match="name a layer >= the target's 2 layers"):
        cfg.check_target(shallow)
    _, last = open_model(synthetic_model(hidden=64, n_layers=3, vocab_size=300))
    with pytest.raises(ModelLoadError, match="include the target's last layer 2, whose trained feature is the "
                                             "final-normed state"):
        cfg.check_target(last)                      # ids (0, 2)
    _, small_vocab = open_model(synthetic_model(hidden=64, n_layers=4, vocab_size=280))
    with pytest.raises(ModelLoadError, match="mask_token_id 299 is outside the target's vocabulary of 280"):
        cfg.check_target(small_vocab)
    _, fits = open_model(synthetic_model(hidden=64, n_layers=4, vocab_size=300))
    cfg.check_target(fits)


@pytest.mark.parametrize("field,value,message", [
    ("block_size", 1, "block_size must be >= 2"),
    ("target_layer_ids", (), "non-empty"),
    ("target_layer_ids", (1, 1), "distinct"),
    ("model.n_kv_heads", 3, "not a multiple"),      # the layers' checks are ModelConfig's
    ("model.rope_theta", 0.0, "must be positive"),
])
def test_config_checks(good, field, value, message):
    _, cfg = open_dflash(good)
    with pytest.raises(ModelLoadError, match=message):
        if field.startswith("model."):
            dataclasses.replace(cfg.model, **{field[6:]: value})
        else:
            dataclasses.replace(cfg, **{field: value})


def test_decoder_names_the_drafter_in_its_errors():
    with pytest.raises(ModelLoadError, match="DFlash drafter: n_heads 4 is not a multiple of n_kv_heads 3"):
        DFlashConfig.decoder(n_layers=1, hidden=64, n_heads=4, n_kv_heads=3, head_dim=16, ffn=128,
                             rope_theta=1e7, rms_eps=1e-6)


def test_fc_split_needs_whole_quant_blocks(good):
    f, _ = open_dflash(good)
    fc = f.tensor("dflash.fc.weight")                 # Q8_0 (64, 128): blocks of 32
    assert [p.shape for p in split_columns(fc, 2)] == [(64, 64), (64, 64)]
    with pytest.raises(ModelLoadError, match="does not hold whole Q8_0 blocks of 32"):
        split_columns(fc, 8)                          # parts of 16 columns
    with pytest.raises(ModelLoadError, match="do not split into 3 equal parts"):
        split_columns(fc, 3)
