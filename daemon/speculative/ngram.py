"""Prompt-lookup n-gram drafter: no model, drafts copied from earlier in the sequence.

The sequence is prompt + generated tokens + root. For n from max_ngram down to min_ngram, the
last n tokens are looked up among earlier occurrences of the same n-gram; the first n with any
match wins. Each match contributes the tokens that followed it (up to max_depth). Candidates at
depth d are the distinct tokens found d places after the matches, ranked by how many matches
agree (then by recency: the latest match first); log-prob = log(agreeing / all matches long
enough). The top-1 chain is the continuation of the most-agreed tokens, so chain mode copies the
most recent match when all matches agree.

State: the token list and a dict n-gram -> end indices of its earlier occurrences, per n,
extended incrementally as tokens are committed (O(max_ngram) per token).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .drafter import Drafter, Proposal

__all__ = ["NgramConfig", "NgramDrafter"]


@dataclass(slots=True, frozen=True)
class NgramConfig:
    min_ngram: int = 2        # shortest suffix looked up
    max_ngram: int = 4        # longest suffix looked up (longer matches win)
    max_depth: int = 7        # deepest proposal: a chain of root + 7 is one 8-row pass of the GPU's GEMVs
    max_matches: int = 16     # latest occurrences considered per lookup

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.max_depth < 1 or self.max_matches < 1:
            raise ValueError("max_depth and max_matches must be >= 1")


class NgramDrafter(Drafter):
    def __init__(self, config: NgramConfig = NgramConfig(), name: str = "ngram"):
        self.config = config
        self.name = name
        self.max_depth = config.max_depth
        self._tokens: list[int] = []
        # _index[n][ngram] = indices e (ascending) such that tokens[e - n:e] == ngram and e < len
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {}

    def _append(self, token: int) -> None:
        toks = self._tokens
        toks.append(int(token))
        end = len(toks) - 1          # index the n-grams that end just before the new token
        for n in range(self.config.min_ngram, self.config.max_ngram + 1):
            if end - n >= 0:
                self._index[n][tuple(toks[end - n:end])].append(end)

    def begin(self, prompt: Sequence[int], root: int) -> None:
        self._tokens = []
        self._index = {n: defaultdict(list) for n in range(self.config.min_ngram, self.config.max_ngram + 1)}
        for t in prompt:
            self._append(t)
        self._append(root)

    def propose(self, max_depth: int, top_k: int) -> Proposal:
        cfg, toks = self.config, self._tokens
        max_depth = min(max_depth, cfg.max_depth)
        if max_depth <= 0:
            return Proposal.empty()
        for n in range(min(cfg.max_ngram, len(toks) - 1), cfg.min_ngram - 1, -1):
            ends = self._index[n].get(tuple(toks[len(toks) - n:]))
            if ends:
                return self._from_matches(ends[::-1][:cfg.max_matches], max_depth, top_k)
        return Proposal.empty()

    def _from_matches(self, ends: list[int], max_depth: int, top_k: int) -> Proposal:
        toks = self._tokens
        rows_t, rows_lp = [], []
        for d in range(max_depth):
            votes: dict[int, int] = {}
            order: list[int] = []
            for e in ends:                           # latest match first (recency tie-break)
                if e + d < len(toks):
                    t = toks[e + d]
                    if t not in votes:
                        order.append(t)
                        votes[t] = 0
                    votes[t] += 1
            if not votes:
                break
            total = sum(votes.values())
            ranked = sorted(order, key=lambda t: -votes[t])[:top_k]   # stable: recency among equals
            rows_t.append(ranked + [ranked[0]] * (top_k - len(ranked)))
            rows_lp.append([np.log(votes[t] / total) for t in ranked] + [-np.inf] * (top_k - len(ranked)))
        if not rows_t:
            return Proposal.empty()
        return Proposal(np.array(rows_t, np.int32), np.array(rows_lp, np.float64))

    def accept(self, accepted: Sequence[int], bonus: int, rows: Sequence[int] | None = None) -> None:
        for t in accepted:
            self._append(t)
        self._append(bonus)

    def end(self) -> None:
        self._tokens = []
        self._index = {}

    def info(self) -> dict:
        d = Drafter.info(self)
        d.update(min_ngram=self.config.min_ngram, max_ngram=self.config.max_ngram)
        return d
