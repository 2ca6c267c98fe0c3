"""FlashPrefill block-sparse attention in numpy (ARCHITECTURE.md, PFlash): the reference backend's op and the
oracle the CUDA kernels (native/cuda/flashprefill.cu, attention_sparse.cu) are tested against.

A forward over one chunk of n new tokens at cache slots [p0, p0 + n) (p0 a multiple of the block
B = 128) sees keys at slots [0, p0 + n). Blocks are absolute: key block kb holds slots
[kb*B, kb*B + B); local query block mq holds new tokens [mq*B, mq*B + B), absolute block
m = p0 / B + mq. Shapes: q (n, H, d); keys/values (n_keys, Hkv, d) (slot-major, the reference
cache's layout); GQA: query head h reads kv head h // (H // Hkv).

    mean_k  (Nk, Hkv, d)    mean of each key block's real rows
    score   (Mq, H, Nk)     s[m, h, kb] for kb <= m, normalised so sum_kb s = 1; 0 for kb > m
    select  idx (Mq, H, Nk) ascending kept key blocks, -1 padded; cnt (Mq, H)
    sparse_attention
            (n, H * d)      softmax(scale q K^T) V over the kept blocks, causal inside the diagonal

Everything is computed in float64 (the oracle's precision); callers cast.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FlashPrefillStep", "BLOCK", "MASK_DENSE", "MASK_STREAMING", "MASK_LISTS", "mean_k", "score", "select",
           "block_mask", "sparse_attention", "flashprefill_attention", "tail_max_probs"]

BLOCK = 128
# per-head mask types of the block-sparse attention entry point (the same values as flashd.h)
MASK_DENSE = 0        # every causal key block
MASK_STREAMING = -1   # key blocks kb < sink or m - kb < local
MASK_LISTS = 1        # the blocks listed in idx[mq, h, :cnt[mq, h]]


def _blocks(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


def mean_k(keys: np.ndarray) -> np.ndarray:
    """(n_keys, Hkv, d) -> (Nk, Hkv, d): block means over the real row count (the last block may
    be partial)."""
    n_keys = keys.shape[0]
    out = np.empty((_blocks(n_keys), keys.shape[1], keys.shape[2]), np.float64)
    for kb in range(out.shape[0]):
        out[kb] = keys[kb * BLOCK:min(n_keys, kb * BLOCK + BLOCK)].astype(np.float64).mean(axis=0)
    return out


def score(q: np.ndarray, mk: np.ndarray, p0: int, scale: float) -> np.ndarray:
    """(Mq, H, Nk) block scores: for query block m (rows j of the chunk inside it) and kb <= m,
    a[j, kb] = q_j . mk[kb] * scale, M = max over (j, kb <= m) of a, s = sum_j exp(a - M), then
    s /= sum_kb s: the estimated attention mass block m puts on key block kb."""
    if p0 % BLOCK:
        raise ValueError(f"p0 must be a multiple of {BLOCK}, got {p0}")
    n, n_heads, _ = q.shape
    n_kb, n_kv = mk.shape[0], mk.shape[1]
    group = n_heads // n_kv
    m_first = p0 // BLOCK
    out = np.zeros((_blocks(n), n_heads, n_kb), np.float64)
    for mq in range(out.shape[0]):
        m = m_first + mq
        rows = q[mq * BLOCK:min(n, mq * BLOCK + BLOCK)].astype(np.float64)      # (r, H, d)
        for h in range(n_heads):
            a = rows[:, h] @ mk[:m + 1, h // group].T * scale                    # (r, m + 1)
            s = np.exp(a - a.max()).sum(axis=0)
            out[mq, h, :m + 1] = s / s.sum()
    return out


def select(s: np.ndarray, p0: int, alpha: float, sink: int, window: int, first_full_block: int):
    """Kept key blocks per (query block, head): kb <= m and (s >= alpha * max_kb s, or kb < sink, or
    m - kb < window, or m >= first_full_block). Returns idx (Mq, H, Nk) int32 ascending, -1 padded,
    and cnt (Mq, H) int32."""
    n_mq, n_heads, n_kb = s.shape
    idx = np.full(s.shape, -1, np.int32)
    cnt = np.zeros((n_mq, n_heads), np.int32)
    kb = np.arange(n_kb)
    for mq in range(n_mq):
        m = p0 // BLOCK + mq
        for h in range(n_heads):
            row = s[mq, h]
            thr = alpha * row[:m + 1].max()
            keep = (kb <= m) & ((row >= thr) | (kb < sink) | (m - kb < window) | (m >= first_full_block))
            chosen = kb[keep]
            idx[mq, h, :len(chosen)] = chosen
            cnt[mq, h] = len(chosen)
    return idx, cnt


def block_mask(mask_type: np.ndarray, idx, cnt, p0: int, n: int, n_kb: int, sink: int, local: int) -> np.ndarray:
    """bool (Mq, H, Nk): the key blocks each (query block, head) attends under its mask type."""
    n_heads = len(mask_type)
    n_mq = _blocks(n)
    out = np.zeros((n_mq, n_heads, n_kb), bool)
    kb = np.arange(n_kb)
    for mq in range(n_mq):
        m = p0 // BLOCK + mq
        for h in range(n_heads):
            t = int(mask_type[h])
            if t == MASK_DENSE:
                out[mq, h] = kb <= m
            elif t < 0:
                out[mq, h] = (kb <= m) & ((kb < sink) | (m - kb < local))
            else:
                out[mq, h, idx[mq, h, :cnt[mq, h]]] = True
                out[mq, h] &= kb <= m
    return out


def sparse_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, p0: int, blocks: np.ndarray,
                     scale: float) -> np.ndarray:
    """(n, H * d): token i (slot p0 + i), head h attends slot j iff blocks[i // B, h, j // B] and
    j <= p0 + i. A row with no visible key gives zeros."""
    n, n_heads, d = q.shape
    n_kv = keys.shape[1]
    group = n_heads // n_kv
    n_keys = p0 + n
    k64 = keys[:n_keys].astype(np.float64)
    v64 = values[:n_keys].astype(np.float64)
    out = np.zeros((n, n_heads, d), np.float64)
    slot = np.arange(n_keys)
    for mq in range(blocks.shape[0]):
        rows = np.arange(mq * BLOCK, min(n, mq * BLOCK + BLOCK))
        for h in range(n_heads):
            cols = slot[np.repeat(blocks[mq, h], BLOCK)[:n_keys]]            # visible by block
            if cols.size == 0:
                continue
            a = q[rows, h].astype(np.float64) @ k64[cols, h // group].T * scale   # (r, c)
            vis = cols[None, :] <= (p0 + rows)[:, None]                      # causal
            a = np.where(vis, a, -np.inf)
            row_max = a.max(axis=1, keepdims=True)
            seen = np.isfinite(row_max[:, 0])
            p = np.exp(a - np.where(np.isfinite(row_max), row_max, 0.0))
            o = p @ v64[cols, h // group]
            out[rows[seen], h] = o[seen] / p[seen].sum(axis=1, keepdims=True)
    return out.reshape(n, n_heads * d)


def flashprefill_attention(q, keys, values, p0: int, scale: float, *, alpha: float, sink: int, window: int,
                           first_full_block: int) -> np.ndarray:
    """The whole FlashPrefill attention of one chunk: mean_K -> score -> select -> sparse_attention."""
    n = q.shape[0]
    mk = mean_k(keys[:p0 + n])
    s = score(q, mk, p0, scale)
    idx, cnt = select(s, p0, alpha, sink, window, first_full_block)
    types = np.full(q.shape[1], MASK_LISTS, np.int32)
    blocks = block_mask(types, idx, cnt, p0, n, mk.shape[0], 0, 0)
    return sparse_attention(q, keys, values, p0, blocks, scale)


def tail_max_probs(q_tail: np.ndarray, keys: np.ndarray, n_keys: int, scale: float) -> np.ndarray:
    """(T, n_keys): for the last T tokens (slots n_keys - T + t), the dense causal attention
    probability of every key, maximised over heads. q_tail (T, H, d); keys (>= n_keys, Hkv, d)."""
    n_tail, n_heads, _ = q_tail.shape
    group = n_heads // keys.shape[1]
    k64 = keys[:n_keys].astype(np.float64)
    out = np.zeros((n_tail, n_keys), np.float64)
    for t in range(n_tail):
        last = n_keys - n_tail + t                     # the token's own slot: keys [0, last]
        for h in range(n_heads):
            a = k64[:last + 1, h // group] @ q_tail[t, h].astype(np.float64) * scale
            p = np.exp(a - a.max())
            p /= p.sum()
            out[t, :last + 1] = np.maximum(out[t, :last + 1], p)
    return out


@dataclass(slots=True, frozen=True)
class FlashPrefillStep:
    """What `Ops.flashprefill_attention` needs besides the batch: the chunk's first slot (host int, a
    multiple of BLOCK) and the selection knobs. first_full_block = the prompt's block count minus
    last_full_blocks: query blocks from there on attend densely."""

    p0: int
    first_full_block: int
    alpha: float
    sink_blocks: int
    window_blocks: int

    def __post_init__(self):
        if self.p0 < 0 or self.p0 % BLOCK:
            raise ValueError(f"p0 must be a non-negative multiple of {BLOCK}, got {self.p0}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.sink_blocks < 0 or self.window_blocks < 1:
            raise ValueError("sink_blocks must be >= 0 and window_blocks >= 1")
