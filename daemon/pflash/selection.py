"""Token importance -> the kept chunks of the prompt (ARCHITECTURE.md, PFlash steps 2-3).

    importance[j] = mean over the T tail queries of (max over layers and heads of the tail
                    query's attention probability on token j)   -- `tail_probs` is that max, (T, S)
    smoothed      = centred moving average over `smooth` tokens, truncated at the edges (each
                    output is the mean of the tokens that exist in its window)
    chunk score   = mean of smoothed over the chunk's tokens (the last chunk may be short)
    kept chunks   = the first and the last chunk (ARCHITECTURE.md, PFlash; `first`/`last` chunks with the
                    knobs), plus the best-scoring others until ceil(keep * n_chunks) are kept
                    (ties: the earlier chunk); emitted in order
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["importance", "smooth", "chunk_scores", "select_chunks", "kept_positions", "chunk_positions"]


def importance(tail_probs: np.ndarray) -> np.ndarray:
    """(T, S) max-over-layers-and-heads probabilities -> (S,) importance (mean over T)."""
    return np.asarray(tail_probs, np.float64).mean(axis=0)


def smooth(x: np.ndarray, width: int) -> np.ndarray:
    """Centred moving average over `width` (odd) tokens, edge-truncated."""
    if width < 1 or width % 2 == 0:
        raise ValueError(f"width must be odd and >= 1, got {width}")
    x = np.asarray(x, np.float64)
    half = width // 2
    csum = np.concatenate(([0.0], np.cumsum(x)))
    j = np.arange(len(x))
    lo = np.maximum(j - half, 0)
    hi = np.minimum(j + half + 1, len(x))
    return (csum[hi] - csum[lo]) / (hi - lo)


def chunk_scores(x: np.ndarray, chunk: int) -> np.ndarray:
    """(ceil(S / chunk),) mean of x over each chunk."""
    x = np.asarray(x, np.float64)
    n_chunks = -(-len(x) // chunk)
    sums = np.add.reduceat(x, np.arange(0, n_chunks * chunk, chunk)) if len(x) else np.zeros(0)
    sizes = np.minimum(chunk, len(x) - np.arange(n_chunks) * chunk)
    return sums / sizes


def select_chunks(scores: np.ndarray, keep: float, first: int = 1, last: int = 1) -> np.ndarray:
    """Ascending indices of the kept chunks: the first `first` and the last `last` always, then
    by score (descending; ties to the lower index) until ceil(keep * n_chunks) are kept."""
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    n_chunks = len(scores)
    if n_chunks == 0:
        return np.zeros(0, np.int64)
    n_keep = max(math.ceil(keep * n_chunks - 1e-9), 1)   # 1e-9: 0.05 * 20 is 1.0000000000000002
    forced = set(range(min(first, n_chunks))) | set(range(max(n_chunks - last, 0), n_chunks))
    order = np.lexsort((np.arange(n_chunks), -np.asarray(scores, np.float64)))   # best first, stable
    kept = set(forced)
    for c in order:
        if len(kept) >= n_keep:
            break
        kept.add(int(c))
    return np.array(sorted(kept), np.int64)


def kept_positions(tail_probs: np.ndarray, keep: float, chunk: int, smooth_tokens: int, first: int = 1,
                   last: int = 1) -> np.ndarray:
    """Prompt positions to keep, ascending: the whole selection from the (T, S) tail maxima."""
    scores = chunk_scores(smooth(importance(tail_probs), smooth_tokens), chunk)
    return chunk_positions(select_chunks(scores, keep, first, last), chunk, tail_probs.shape[1])


def chunk_positions(chunks: np.ndarray, chunk: int, n_tokens: int) -> np.ndarray:
    """The ascending prompt positions of the (ascending) chunk indices."""
    if len(chunks) == 0:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(c * chunk, min(n_tokens, c * chunk + chunk)) for c in chunks])
