"""The DFlash drafter forward (models/dflash.py) on the reference backend.

Oracle: an independent float64 numpy implementation written here from the raw GGUF arrays
(`gguf.quants.dequantize` of the stored bytes, read with GGUFReader, not through flashd's loader):
z-lab's formulation -- one concatenated fc, K/V of [context ; block] concatenated per layer, HF's
rotate_half RoPE -- rather than the per-feature fc split, KV cache and in-place pair rotation of
the code under test.

Tolerance: the reference backend computes in float32 (float32 accumulation); rounding of order
2^-24 per operation, summed over dot products of <= a few hundred terms and two layers with
RMSNorms, moves logits by ~1e-6 of their scale (measured: < 1e-6). We require
max |ref - oracle| <= 1e-4 * max |oracle|: 100x margin, while a wrong position, mask, norm or
feature order moves logits by O(1) of their scale.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.models.dflash import (TargetHead, block_batch, block_mask, dflash_cache_spec, draft_block,
                                         inject_context)
from flashd.daemon.models.dflash_weights import load_dflash_weights, open_dflash
from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash

REL_TOL = 1e-4


# -- the oracle ----------------------------------------------------------------------------------

def raw_arrays(path) -> dict[str, np.ndarray]:
    r = GGUFReader(path)
    out = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        out[t.name] = dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float64)
    return out


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_rotate_half(x, pos, theta):
    """HF Qwen3: x * cos + rotate_half(x) * sin, x (n, heads, d), frequencies duplicated over halves."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.asarray(pos, np.float64)[:, None] * inv[None, :]
    emb = np.concatenate([ang, ang], axis=-1)[:, None, :]
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * np.cos(emb) + rot * np.sin(emb)


def oracle_logits(d, cfg, embd, out_w, feats, root):
    """feats (n_ctx, n_features * D): the target layer outputs, concatenated in target_layer_ids order."""
    n_ctx, b, m = feats.shape[0], cfg.block_size, cfg.model
    H, Hkv, hd, eps = m.n_heads, m.n_kv_heads, m.head_dim, m.rms_eps
    f = rms(feats @ d["dflash.fc.weight"].T, d["dflash.hidden_norm.weight"], eps)
    ids = np.array([root] + [cfg.mask_token_id] * (b - 1))
    h = embd[ids]
    pos_ctx, pos_blk = np.arange(n_ctx), np.arange(n_ctx, n_ctx + b)
    for i in range(m.n_layers):
        w = lambda n: d[f"blk.{i}.{n}.weight"]
        x = rms(h, w("attn_norm"), eps)
        q = rms((x @ w("attn_q").T).reshape(b, H, hd), w("attn_q_norm"), eps)
        kv_in = np.concatenate([f, x])                                    # [context ; block]
        k = rms((kv_in @ w("attn_k").T).reshape(n_ctx + b, Hkv, hd), w("attn_k_norm"), eps)
        v = (kv_in @ w("attn_v").T).reshape(n_ctx + b, Hkv, hd)
        q = rope_rotate_half(q, pos_blk, m.rope_theta)
        k = rope_rotate_half(k, np.concatenate([pos_ctx, pos_blk]), m.rope_theta)
        o = np.empty((b, H, hd))
        for head in range(H):
            kvh = head // (H // Hkv)
            s = q[:, head] @ k[:, kvh].T / np.sqrt(hd)                   # non-causal: every key
            p = np.exp(s - s.max(-1, keepdims=True))
            o[:, head] = (p / p.sum(-1, keepdims=True)) @ v[:, kvh]
        h = h + o.reshape(b, H * hd) @ w("attn_output").T
        x = rms(h, w("ffn_norm"), eps)
        g = x @ w("ffn_gate").T
        h = h + ((g / (1 + np.exp(-g))) * (x @ w("ffn_up").T)) @ w("ffn_down").T
    return rms(h[1:], d["output_norm.weight"], eps) @ out_w.T


# -- fixtures ------------------------------------------------------------------------------------

TARGET = dict(arch="qwen3", n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=300, seed=3,
              name="dflash-target")


@pytest.fixture(scope="module")
def ops():
    return ReferenceOps()


def make_drafter(tmp_path_factory, target, **fields):
    cfg = target.config
    spec = spec_for_target(cfg.hidden, cfg.n_layers, cfg.vocab_size, **fields)
    path = tmp_path_factory.mktemp("dflash") / "drafter.gguf"
    return write_synthetic_dflash(path, spec)


def load_all(ops, drafter_path, target):
    f, cfg = open_dflash(drafter_path)
    cfg.check_target(target.config)
    w = load_dflash_weights(f, cfg, ops.load_weight)
    return cfg, w, TargetHead(target.weights.token_embd, target.weights.output)


def run_drafter(ops, cfg, w, head, feats_list, root, pieces):
    """Inject the context in `pieces` (row counts), drafting after every piece; returns the last logits."""
    cache = ops.kv_cache(dflash_cache_spec(cfg, 128))
    mask = block_mask(ops, cfg)
    n = 0
    logits = None
    for m in pieces:
        inject_context(ops, cfg, w, cache, [f[n:n + m] for f in feats_list], np.arange(n, n + m, dtype=np.int32),
                       np.array([n], np.int32))
        n += m
        ids = np.full(cfg.block_size, cfg.mask_token_id, np.int32)
        ids[0] = root
        batch = block_batch(cfg, ids, np.arange(n, n + cfg.block_size, dtype=np.int32), np.array([n], np.int32),
                            mask)
        logits = draft_block(ops, cfg, w, head, cache, batch)
    return logits


# -- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,hidden,head_dim,n_ctx", [
    ("F32", 64, 16, 1), ("F16", 64, 16, 7), ("BF16", 64, 16, 23), ("Q8_0", 64, 16, 37), ("Q4_K", 256, 64, 11),
])
def test_forward_matches_float64_oracle(ops, synthetic_model, tmp_path_factory, fmt, hidden, head_dim, n_ctx):
    rng = np.random.default_rng(201)
    target_path = synthetic_model(**dict(TARGET, hidden=hidden, head_dim=None))
    target = load_model(target_path, ops.load_weight)
    path = make_drafter(tmp_path_factory, target, n_features=3, head_dim=head_dim, ffn=2 * hidden,
                        weight_type=fmt, block_size=6, seed=int(rng.integers(1 << 30)))
    cfg, w, head = load_all(ops, path, target)
    feats = [rng.standard_normal((n_ctx, hidden)).astype(np.float32) for _ in range(cfg.n_features)]
    root = int(rng.integers(cfg.mask_token_id))
    got = run_drafter(ops, cfg, w, head, feats, root, [n_ctx])
    t = raw_arrays(target_path)
    want = oracle_logits(raw_arrays(path), cfg, t["token_embd.weight"], t["output.weight"],
                         np.concatenate(feats, axis=1).astype(np.float64), root)
    assert got.shape == (cfg.block_size - 1, target.config.vocab_size)
    scale = float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    assert err <= REL_TOL * scale, f"max |ref - oracle| {err:.3g} > {REL_TOL} * {scale:.3g}"


def test_oracle_sees_positions_mask_and_features(ops, synthetic_model, tmp_path_factory):
    """The comparison above can fail: a block at the wrong positions, a causal block mask or swapped
    feature layers each move the logits far beyond the tolerance."""
    rng = np.random.default_rng(202)
    target = load_model(synthetic_model(**TARGET), ops.load_weight)
    path = make_drafter(tmp_path_factory, target, n_features=2, block_size=5)
    cfg, w, head = load_all(ops, path, target)
    feats = [rng.standard_normal((9, 64)).astype(np.float32) for _ in range(2)]
    d, t = raw_arrays(path), raw_arrays(synthetic_model(**TARGET))
    want = oracle_logits(d, cfg, t["token_embd.weight"], t["output.weight"], np.concatenate(feats, 1), 7)
    scale = float(np.abs(want).max())
    swapped = run_drafter(ops, cfg, w, head, feats[::-1], 7, [9])
    assert np.abs(swapped - want).max() > 100 * REL_TOL * scale
    cache = ops.kv_cache(dflash_cache_spec(cfg, 64))
    inject_context(ops, cfg, w, cache, feats, np.arange(9, dtype=np.int32), np.array([0], np.int32))
    ids = np.array([7] + [cfg.mask_token_id] * 4, np.int32)
    causal = np.tril(np.ones((5, 5), bool))
    for positions, mask in ((np.arange(10, 15, dtype=np.int32), block_mask(ops, cfg)),      # shifted by one
                            (np.arange(9, 14, dtype=np.int32), causal)):
        bad = draft_block(ops, cfg, w, head, cache, block_batch(cfg, ids, positions, np.array([9], np.int32), mask))
        assert np.abs(bad - want).max() > 100 * REL_TOL * scale
    good = draft_block(ops, cfg, w, head, cache, block_batch(cfg, ids, np.arange(9, 14, dtype=np.int32),
                                                             np.array([9], np.int32), block_mask(ops, cfg)))
    assert np.abs(good - want).max() <= REL_TOL * scale


def test_cached_context_equals_recomputing_from_scratch(ops, synthetic_model, tmp_path_factory):
    """Appending the context piece by piece, with a draft (whose block K/V land in the slots the next
    piece overwrites) after every piece, equals injecting the whole context at once."""
    rng = np.random.default_rng(203)
    target = load_model(synthetic_model(**TARGET), ops.load_weight)
    path = make_drafter(tmp_path_factory, target, n_features=2, block_size=8)
    cfg, w, head = load_all(ops, path, target)
    pieces = [5, 1, 3, 8, 1, 2]
    n = sum(pieces)
    feats = [rng.standard_normal((n, 64)).astype(np.float32) for _ in range(2)]
    once = run_drafter(ops, cfg, w, head, feats, 42, [n])
    stepped = run_drafter(ops, cfg, w, head, feats, 42, pieces)
    # float32 products of different row counts may round differently (BLAS kernels): 1e-5 of scale
    assert np.abs(stepped - once).max() <= 1e-5 * np.abs(once).max()
