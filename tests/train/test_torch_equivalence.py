"""The torch re-implementations compute flashd's functions (float32 on the CPU, tiny synthetic models).

- train.target.TorchTarget against the reference backend's dense forward: logits and the captured layer outputs
  (llama with its interleaved RoPE, qwen2 with q/k/v biases, qwen3 with q/k norms).
- train.drafter.TorchDrafter exported to GGUF and run by the runtime (models/dflash.py on ReferenceOps, through
  the DFlashDrafter's own inject + draft path) gives torch's block logits: F32 export within 1e-4 (float32
  summation order only), the Q8_0 export against torch holding the dequantized Q8_0 weights within 1e-4, and the
  Q8_0 file against the float32 torch drafter within a looser bound (8-bit weights).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flashd.daemon.backends.base import Batch                        # noqa: E402
from flashd.daemon.backends.reference import ReferenceOps            # noqa: E402
from flashd.daemon.models import load_model, make_cache              # noqa: E402
from flashd.daemon.models.dense import forward                       # noqa: E402
from flashd.daemon.models.dflash_weights import open_dflash          # noqa: E402
from flashd.daemon.speculative.dflash_drafter import load_dflash_drafter   # noqa: E402
from flashd.train.drafter import TorchDrafter                        # noqa: E402
from flashd.train.export import export                               # noqa: E402
from flashd.train.recipe import TrainConfig, drafter_config          # noqa: E402
from flashd.train.target import TorchTarget                          # noqa: E402

TOL = 1e-4      # float32, different summation orders (numpy BLAS vs torch); logits are O(1..10)
TARGET = dict(arch="qwen2", n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=320, seed=3)


def reference_forward(path, ids, capture):
    ops = ReferenceOps()
    m = load_model(path, ops.load_weight)
    cache = make_cache(ops, m.config, 128)
    got = {}
    n = len(ids)
    batch = Batch(ids=np.asarray(ids, np.int32), positions=np.arange(n, dtype=np.int32),
                  n_past=np.array([0], np.int32), mask=None, n_tokens=n)
    logits = forward(ops, m.config, m.weights, cache, batch, all_logits=True,
                     hidden_sink=lambda i, h: got.__setitem__(i, np.array(h)))
    return np.asarray(logits), [got[i] for i in capture]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_torch_target_equals_reference(synthetic_model, arch):
    path = synthetic_model(**{**TARGET, "arch": arch})
    ids = np.random.default_rng(0).integers(0, TARGET["vocab_size"], 23)
    want_logits, want_feats = reference_forward(path, ids, (0, 2))
    t = TorchTarget(path)
    feats, logits = t.forward(torch.from_numpy(ids)[None], capture=(0, 2), logits=True)
    np.testing.assert_allclose(logits[0].numpy(), want_logits, atol=TOL, rtol=TOL)
    for f, w in zip(feats, want_feats):
        np.testing.assert_allclose(f[0].numpy(), w, atol=TOL, rtol=TOL)


def test_torch_target_decode_equals_full_forward(synthetic_model):
    """Left-padded batched prefill + one decode step give the unpadded forward's last logits."""
    t = TorchTarget(synthetic_model(**TARGET))
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, 300, n) for n in (5, 9)]
    width = 9
    ids = torch.zeros(2, width, dtype=torch.long)
    pos = torch.zeros(2, width, dtype=torch.long)
    valid = torch.zeros(2, width + 1, dtype=torch.bool)
    for i, s in enumerate(seqs):
        pad = width - len(s)
        ids[i, pad:] = torch.from_numpy(s)
        pos[i, pad:] = torch.arange(len(s))
        valid[i, pad:] = True
    cache = t.new_cache(2, width + 1)
    t.step(ids, pos, cache, 0, valid)
    nxt = torch.tensor([[7], [11]])
    last = t.step(nxt, torch.tensor([[5], [9]]), cache, width, valid)
    for i, s in enumerate(seqs):
        _, full = t.forward(torch.from_numpy(np.append(s, int(nxt[i, 0])))[None], logits=True)
        np.testing.assert_allclose(last[i].numpy(), full[0, -1].numpy(), atol=TOL, rtol=TOL)


def runtime_block_logits(drafter_path, target_path, ids, root):
    """Block logits from the daemon's DFlashDrafter on the reference backend, after a prefill of `ids`."""
    ops = ReferenceOps()
    m = load_model(target_path, ops.load_weight)
    d = load_dflash_drafter(drafter_path, ops, m.config, m.weights, 128)
    cache = make_cache(ops, m.config, 128)
    n = len(ids)
    batch = Batch(ids=np.asarray(ids, np.int32), positions=np.arange(n, dtype=np.int32),
                  n_past=np.array([0], np.int32), mask=None, n_tokens=n)
    forward(ops, m.config, m.weights, cache, batch, hidden_sink=d.capture_hidden)
    d.begin(list(ids), root)
    return d._draft()


@pytest.fixture(scope="module")
def setup(tmp_path_factory, synthetic_model):
    path = synthetic_model(**TARGET)
    target = TorchTarget(path)
    tc = TrainConfig(block_size=6, n_layers=2, n_features=2, max_prompt=32, max_new=32, max_seq=64)
    cfg = drafter_config(target.cfg, tc, mask_token_id=TARGET["vocab_size"] - 1)
    drafter = TorchDrafter(cfg, seed=4)
    ids = np.random.default_rng(2).integers(0, 300, 17)
    feats, _ = target.forward(torch.from_numpy(ids)[None], capture=cfg.target_layer_ids)
    return path, target, drafter, ids, torch.cat(feats, dim=-1), tmp_path_factory.mktemp("export")


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_exported_drafter_equals_torch_in_the_runtime(setup, outtype):
    path, target, drafter, ids, feats, tmp = setup
    out = tmp / f"drafter-{outtype}.gguf"
    cfg = export(drafter, out, outtype)
    assert cfg == drafter.cfg
    want = runtime_block_logits(out, path, ids, root=42)
    if outtype == "q8_0":     # torch with the file's (dequantized) weights computes the same function
        f, _ = open_dflash(out)
        ref = ReferenceOps()
        same = TorchDrafter(drafter.cfg)
        with torch.no_grad():
            for n, p in same.gguf_tensors().items():
                p.copy_(torch.from_numpy(np.array(ref.load_weight(f.tensor(n)))))
        got = same.draft(feats, target.embed, target.lm_head, 42).detach().numpy()
        np.testing.assert_allclose(got, want, atol=TOL, rtol=TOL)
        loose = drafter.draft(feats, target.embed, target.lm_head, 42).detach().numpy()
        np.testing.assert_allclose(loose, want, atol=0.05 * np.abs(want).max())   # 8-bit weights
    else:
        got = drafter.draft(feats, target.embed, target.lm_head, 42).detach().numpy()
        assert got.shape == (drafter.cfg.block_size - 1, TARGET["vocab_size"])
        np.testing.assert_allclose(got, want, atol=TOL, rtol=TOL)


def test_training_blocks_equal_separate_drafts(setup):
    """Many anchors in one masked forward == one runtime-style draft per anchor (the training batch is exact)."""
    _, target, drafter, ids, feats, _ = setup
    B = drafter.cfg.block_size
    anchors = torch.tensor([[3, 9, 12]])
    block_ids = torch.full((1, 3, B), drafter.cfg.mask_token_id)
    block_ids[0, :, 0] = torch.from_numpy(ids)[anchors[0]]
    keep = torch.ones(1, 3, dtype=torch.bool)
    h = drafter.blocks(drafter.context(feats), target.embed[block_ids], anchors, keep)
    together = drafter.logits(h[0, :, 1:], target.lm_head)
    for j, a in enumerate(anchors[0].tolist()):
        alone = drafter.draft(feats[:, :a], target.embed, target.lm_head, int(ids[a]))
        np.testing.assert_allclose(together[j].detach().numpy(), alone.detach().numpy(), atol=TOL, rtol=TOL)
