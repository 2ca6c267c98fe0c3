"""Prompt prefix reuse: which cached K/V a new prompt may keep, and host-RAM copies of earlier
prompts' prefixes.

The runner (runner.py) keeps the K/V of the last prompt in its cache; a new prompt keeps the
longest common prefix with it, rounded down to whole prefill chunks (`reusable_tokens`), so that
every chunk holds exactly what a fresh chunked prefill from slot 0 writes there. One cache holds
one prompt, though: an agent that interleaves conversations (a main thread and short side
requests: titles, summaries, sub-agents) overwrites the long prefix with every side request.
`PrefixStore` keeps host copies of such prefixes before they are overwritten, least recently used
first out under a byte budget, and hands back the one that shares the most chunks with a new
prompt; restoring a copy is a host-to-device copy of its bytes, so the result stays bit for bit a
fresh prefill's.

A hybrid model's copy (models.qwen35.HybridPrefix, `whole_only`) also holds the recurrent state after its
last token, which has no shorter prefixes: it is kept only by a prompt that keeps all of it, a copy of a
longer prefix does not cover it, and it does not replace the copies of its own prefixes.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

__all__ = ["reusable_tokens", "PrefixSnapshot", "PrefixStore"]


def reusable_tokens(cached, prompt, chunk: int) -> int:
    """Slots of `cached` (the tokens whose K/V fill slots [0, len)) that `prompt` may keep: their
    common prefix, at most len(prompt) - 1 (the last prompt token is forwarded for its logits),
    rounded down to a multiple of `chunk`."""
    limit = min(len(cached), len(prompt) - 1)
    if limit < chunk:
        return 0
    differ = np.flatnonzero(np.asarray(cached[:limit]) != np.asarray(prompt[:limit]))
    common = int(differ[0]) if len(differ) else limit
    return common - common % chunk


@dataclass(slots=True, frozen=True)
class PrefixSnapshot:
    tokens: tuple[int, ...]       # the prompt prefix, a whole number of chunks
    kv: np.ndarray                # the cache's save_prefix(len(tokens)) (a HybridPrefix for a hybrid model)

    @property
    def n_bytes(self) -> int:
        return int(self.kv.nbytes)

    @property
    def whole_only(self) -> bool:
        """Only all of it can be kept (a hybrid's recurrent state exists at its end only)."""
        return bool(getattr(self.kv, "whole_only", False))

    def keepable(self, prompt, chunk: int) -> int:
        """Tokens of this copy `prompt` may keep."""
        n = reusable_tokens(self.tokens, prompt, chunk)
        return 0 if self.whole_only and n != len(self.tokens) else n


class PrefixStore:
    """Host copies of prompt prefixes, at most `max_bytes` in all (least recently used evicted)."""

    def __init__(self, max_bytes: int, chunk: int):
        if max_bytes < 0 or chunk < 1:
            raise ValueError(f"max_bytes must be >= 0 and chunk >= 1, got {max_bytes}, {chunk}")
        self.max_bytes, self.chunk = max_bytes, chunk
        self._entries: OrderedDict[tuple[int, ...], PrefixSnapshot] = OrderedDict()   # oldest first
        self.n_bytes = 0
        self.n_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, prompt) -> tuple[PrefixSnapshot, int] | None:
        """The snapshot `prompt` may keep the most chunks of, and how many tokens; None if none."""
        best, best_n = None, 0
        for snap in self._entries.values():
            n = snap.keepable(prompt, self.chunk)
            if n > best_n:
                best, best_n = snap, n
        if best is None:
            return None
        self._entries.move_to_end(best.tokens)
        return best, best_n

    def covers(self, tokens) -> bool:
        """Whether a snapshot already holds the K/V of `tokens` (it starts with them; a hybrid's: it is them)."""
        n, tokens = len(tokens), tuple(tokens)
        return any(key == tokens or (len(key) > n and key[:n] == tokens and not snap.whole_only)
                   for key, snap in self._entries.items())

    def add(self, tokens, kv: np.ndarray) -> bool:
        """Keep a copy of `tokens`' K/V (what `covers` would answer True for is not added again;
        snapshots of prefixes of `tokens` are dropped: this one holds them). False if it does not
        fit the budget at all."""
        snap = PrefixSnapshot(tuple(int(t) for t in tokens), kv)
        if snap.n_bytes > self.max_bytes or len(snap.tokens) % self.chunk or not snap.tokens:
            return False
        if self.covers(snap.tokens):
            return True
        n = len(snap.tokens)
        for key in [k for k in self._entries if len(k) <= n and snap.tokens[:len(k)] == k
                    and not (snap.whole_only or self._entries[k].whole_only)]:
            self._drop(key)
        while self.n_bytes + snap.n_bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[snap.tokens] = snap
        self.n_bytes += snap.n_bytes
        self.n_tokens += len(snap.tokens)
        return True

    def _drop(self, key) -> None:
        snap = self._entries.pop(key)
        self.n_bytes -= snap.n_bytes
        self.n_tokens -= len(snap.tokens)

    def info(self) -> dict:
        """Counts only (status asks from another thread than the engine's, which changes the entries)."""
        return {"snapshots": len(self._entries), "tokens": self.n_tokens, "bytes": self.n_bytes,
                "max_bytes": self.max_bytes}
