"""The DFlash drafter forward on the CUDA backend against the reference backend (the oracle).

Same synthetic target and drafter files on both backends; the context is injected in pieces
(one long prefill-like piece through the GEMM path, then decode-like pieces through the GEMV
path) with a draft after every piece, so the cached context K/V (Ops.kv_write -> fd_rope_kv_write
with q = NULL), the block's masked non-causal attention and the borrowed embedding/lm_head are
all compared.

Tolerance (as tests/gpu/test_cuda_model.py): the CUDA path keeps K/V in float16 and feeds the GEMM
float16 activations (2^-11 relative rounding) with float32 accumulation; through the drafter's
layers this moves logits by ~1e-3 of their scale, so max |cuda - ref| <= 2e-2 * max |ref|, plus
argmax agreement wherever the reference's top-2 gap is clear (> 2e-2 * scale).
"""
import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.models.dflash import (TargetHead, block_batch, block_mask, dflash_cache_spec, draft_block,
                                         inject_context)
from flashd.daemon.models.dflash_weights import load_dflash_weights, open_dflash
from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash

REL_TOL = 2e-2
TARGET = dict(arch="qwen3", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab_size=1000, seed=11,
              name="dflash-gpu-target")


@pytest.fixture(scope="module")
def cuda_ops(native):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    ops = CudaBackend().ops
    ops.reserve_arena(64 << 20)          # per half: far above a 77-row injection or a 16-row block
    ops.reserve_scratch(1 << 20)         # float16 elements: every drafter weight takes the GEMM path
    return ops


def assert_logits_close(got, want):
    scale = float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    assert np.isfinite(got).all(), "non-finite logits"
    assert err <= REL_TOL * scale, f"max |diff| {err:.4g} > {REL_TOL} * {scale:.4g}"
    top2 = np.sort(want, -1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > REL_TOL * scale
    assert (got.argmax(-1) == want.argmax(-1))[clear].all()


def drafts(ops, target, drafter_path, feats, root, pieces):
    """Logits (B-1, vocab) after each piece of context, on `ops`."""
    f, cfg = open_dflash(drafter_path)
    w = load_dflash_weights(f, cfg, ops.load_weight)
    head = TargetHead(target.weights.token_embd, target.weights.output)
    cache = ops.kv_cache(dflash_cache_spec(cfg, 256))
    mask = block_mask(ops, cfg)
    out, n = [], 0
    for m in pieces:
        ops.begin_forward()
        inject_context(ops, cfg, w, cache, [ops.from_numpy(np.ascontiguousarray(x[n:n + m])) for x in feats],
                       ops.from_numpy(np.arange(n, n + m, dtype=np.int32)), ops.from_numpy(np.array([n], np.int32)))
        n += m
        ids = np.full(cfg.block_size, cfg.mask_token_id, np.int32)
        ids[0] = root
        ops.begin_forward()
        batch = block_batch(cfg, ops.from_numpy(ids), ops.from_numpy(np.arange(n, n + cfg.block_size, dtype=np.int32)),
                            ops.from_numpy(np.array([n], np.int32)), mask)
        out.append(np.array(ops.to_numpy(draft_block(ops, cfg, w, head, cache, batch))))
    return out


@pytest.mark.parametrize("fmt", ["F16", "BF16", "Q8_0", "Q4_K"])
def test_dflash_forward_cuda_matches_reference(cuda_ops, synthetic_model, tmp_path, fmt):
    rng = np.random.default_rng()
    target_path = synthetic_model(**TARGET)
    spec = spec_for_target(256, 4, 1000, n_features=3, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512,
                           block_size=16, weight_type=fmt, seed=int(rng.integers(1 << 30)))
    path = write_synthetic_dflash(tmp_path / f"dflash-{fmt}.gguf", spec)
    pieces = [77, 1, 5, 3]             # 77: a partial GEMM tile; then GEMV-sized pieces
    feats = [rng.standard_normal((sum(pieces), 256)).astype(np.float32) for _ in range(3)]
    root = int(rng.integers(999))
    ref_ops = ReferenceOps()
    want = drafts(ref_ops, load_model(target_path, ref_ops.load_weight), path, feats, root, pieces)
    got = drafts(cuda_ops, load_model(target_path, cuda_ops.load_weight), path, feats, root, pieces)
    for g, w in zip(got, want):
        assert g.shape == w.shape == (15, 1000)
        assert_logits_close(g, w)
