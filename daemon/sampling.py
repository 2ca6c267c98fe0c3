"""Token selection: the one definition every backend reproduces.

Given the logits of one position, the history of token ids (prompt + generated) and
`SamplingParams`, `sample()` returns a token id. The steps, in order:

1. penalties over the last `repeat_last_n` ids of the history (counts c[t]):
   repeat_penalty r (llama.cpp): logit /= r if logit > 0 else logit *= r, for every t with c[t] > 0;
   frequency f / presence p (OpenAI): logit -= c[t] * f + (c[t] > 0) * p.
2. temperature 0: argmax (lowest id wins a tie). Otherwise logits / temperature, then
3. top_k: keep tokens whose logit is >= the k-th largest logit,
4. softmax over the kept tokens; top_p: keep tokens with p >= tau, where tau is the largest
   threshold whose kept mass still reaches top_p (the smallest most-likely set, ties included),
5. min_p: keep tokens with p >= min_p * p_max,
6. draw: u = uniform(seed, step) in [0, 1); walk the kept tokens in ascending id order and return
   the first whose cumulative renormalised mass exceeds u.

Every filter is a threshold and the walk is in id order, so a GPU needs no sort: selections are
reductions and the draw is a prefix sum. Ties at a threshold are all kept.

`uniform(seed, step)` is a counter-based generator (SplitMix64 of seed and step), so the same seed
gives the same tokens on every backend and no state is carried between steps.
"""
from __future__ import annotations

import numpy as np

from ..protocol.messages import SamplingParams

__all__ = ["sample", "apply_penalties", "uniform", "candidate_probs", "log_softmax", "NonFiniteLogits"]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _splitmix64(x: int) -> int:
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def uniform(seed: int, step: int) -> float:
    """A uniform double in [0, 1) that depends only on (seed, step)."""
    return (_splitmix64(_splitmix64(seed & _MASK64) ^ (step & _MASK64)) >> 11) * 2.0 ** -53


def apply_penalties(logits: np.ndarray, history: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Step 1 on a float64 copy of `logits` (vocab,)."""
    out = logits.astype(np.float64)
    if params.repeat_last_n == 0 or len(history) == 0:
        return out
    if (params.repeat_penalty == 1.0 and params.frequency_penalty == 0.0
            and params.presence_penalty == 0.0):
        return out
    window = np.asarray(history[-params.repeat_last_n:], dtype=np.int64)
    ids, counts = np.unique(window, return_counts=True)
    sel = out[ids]
    if params.repeat_penalty != 1.0:
        sel = np.where(sel > 0, sel / params.repeat_penalty, sel * params.repeat_penalty)
    sel = sel - counts * params.frequency_penalty - params.presence_penalty
    out[ids] = sel
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def candidate_probs(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Steps 2-5 for temperature > 0: (ids, probs) of the kept tokens, in ascending id order."""
    x = logits.astype(np.float64)
    with np.errstate(over="ignore"):             # tiny T: -inf for all but the max, which stays 0
        x = (x - x.max()) / params.temperature
    keep = np.ones(x.size, bool)
    if 0 < params.top_k < x.size:
        keep &= x >= np.partition(x, x.size - params.top_k)[x.size - params.top_k]
    probs = np.where(keep, np.exp(x), 0.0)
    probs /= probs.sum()
    if params.top_p < 1.0:
        desc = np.sort(probs[keep])[::-1]
        cut = min(int(np.searchsorted(np.cumsum(desc), params.top_p, side="left")), desc.size - 1)
        keep &= probs >= desc[cut]
    if params.min_p > 0.0:
        keep &= probs >= params.min_p * probs.max()
    ids = np.flatnonzero(keep)
    kept = probs[ids]
    return ids, kept / kept.sum()


class NonFiniteLogits(RuntimeError):
    """A token was to be chosen from logits that hold NaN (a broken or unsupported weight file): the request ends
    with the protocol error `model_output` (handlers.py), the daemon keeps serving."""

    def __init__(self, where: str):
        super().__init__(f"the model's logits are NaN {where}: the weight file is broken or not supported")


def sample(logits: np.ndarray, history: np.ndarray, params: SamplingParams, step: int) -> int:
    """The token id chosen at generation step `step` (0 for the first generated token). NonFiniteLogits if the
    logits hold NaN (np.argmax would pick the first NaN; the device's argmax answers -1 for an all-NaN row)."""
    x = apply_penalties(logits, history, params)
    if params.greedy:
        i = int(np.argmax(x))
        if np.isnan(x[i]):
            raise NonFiniteLogits(f"at generation step {step}")
        return i
    if np.isnan(x).any():
        raise NonFiniteLogits(f"at generation step {step}")
    ids, probs = candidate_probs(x, params)
    u = uniform(params.seed, step)
    i = int(np.searchsorted(np.cumsum(probs), u, side="right"))
    return int(ids[min(i, len(ids) - 1)])
