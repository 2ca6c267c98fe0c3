"""A small autoregressive draft model (e.g. Qwen2.5-Coder-0.5B for the 1.5B target).

It has its own ModelRunner and KV cache on the target's backend. Its cache holds a prefix of the
committed sequence (prompt + generated tokens before the root); tokens committed but not yet in
its cache wait in `_pending` and are forwarded together with the root at the next proposal.

propose(max_depth, top_k): forward pending + root, then greedily extend the top-1 chain one token
per forward (`ModelRunner.greedy_continue`: the CUDA runner replays its decode graph). Chain mode
stops there. For a tree, the chain's tokens are forwarded again in one batch from the same cache
position, and the top-K of each depth's log-softmax (at `temperature`) are the candidates, so
candidates at depth d are conditioned on the top-1 chain (path-independent, as DDTree expects).
After it the draft cache holds committed + root + chain[:-1]. accept() keeps the longest prefix
of the cache that matches the new committed sequence and queues the rest as pending.

Cutting the draft cache back goes through `ModelRunner.checkpoint` / `rewind`: a dense draft
model just lowers n_past; a hybrid one (qwen35) reloads the recurrent state checkpointed before
the proposal and prefills the kept tokens after it again.

The draft model must share the target's vocabulary: a different vocabulary size or different
token strings is a load error (DrafterLoadError).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..runner import ModelRunner
from ..sampling import log_softmax
from .drafter import Drafter, DrafterLoadError, Proposal

__all__ = ["DraftModelConfig", "DraftModelDrafter", "check_same_vocab", "DRAFT_TREE_NODES"]

# The runner's max_tree_nodes for a model loaded only as a draft model (loader.py, the VRAM plan: vram_ledger.py):
# it drafts with greedy_continue, checkpoint / rewind and a batched prefill, and never verifies a tree, so a hybrid
# draft model plans and allocates no tree node states (a whole recurrent state each: ~20 MB at the 0.8B shape).
DRAFT_TREE_NODES = 0


@dataclass(slots=True, frozen=True)
class DraftModelConfig:
    max_depth: int = 6            # draft forwards per step (the chain length)
    temperature: float = 1.0      # of the log-softmax that ranks candidates (tree shape only)

    def __post_init__(self):
        if self.max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {self.max_depth}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


def check_same_vocab(name: str, draft_cfg, target_cfg, draft_tokens=None, target_tokens=None) -> None:
    """DrafterLoadError unless the two models share the vocabulary (size, and token strings when
    both token lists are given)."""
    if draft_cfg.vocab_size != target_cfg.vocab_size:
        raise DrafterLoadError(f"drafter {name}: vocabulary of {draft_cfg.vocab_size} tokens does not match the "
                               f"target's {target_cfg.vocab_size}; a draft model must share the target's tokenizer")
    if draft_tokens is not None and target_tokens is not None:
        n = min(len(draft_tokens), len(target_tokens))
        diff = next((i for i in range(n) if draft_tokens[i] != target_tokens[i]), None)
        if diff is not None or len(draft_tokens) != len(target_tokens):
            where = diff if diff is not None else n
            raise DrafterLoadError(f"drafter {name}: token {where} differs from the target's "
                                   f"({draft_tokens[where] if where < len(draft_tokens) else None!r} vs "
                                   f"{target_tokens[where] if where < len(target_tokens) else None!r}); "
                                   "a draft model must share the target's tokenizer")


class DraftModelDrafter(Drafter):
    def __init__(self, runner: ModelRunner, name: str, config: DraftModelConfig = DraftModelConfig(),
                 token_strings: list | None = None):
        self.runner, self.name, self.config = runner, name, config
        self.max_depth = config.max_depth
        self.token_strings = token_strings      # for check_target; None skips the string check
        self._cached: list[int] = []            # the tokens whose K/V the draft cache holds, in order
        self._pending: list[int] = []           # committed tokens not in the draft cache yet
        self._root: int | None = None
        self._n_committed = 0                   # len(committed sequence) = cached + pending

    def check_target(self, target_cfg, target_token_strings=None) -> None:
        check_same_vocab(self.name, self.runner.cfg, target_cfg, self.token_strings, target_token_strings)

    def begin(self, prompt: Sequence[int], root: int) -> None:
        self.runner.start(list(prompt))     # the prompt into the draft cache now, keeping its cached prefix
        self._cached = list(prompt)
        self._pending = []
        self._n_committed = len(prompt)
        self._root = int(root)

    def propose(self, max_depth: int, top_k: int) -> Proposal:
        runner, cfg = self.runner, self.config
        max_depth = min(max_depth, cfg.max_depth)
        if max_depth <= 0:
            return Proposal.empty()
        # the cache must hold pending + root + max_depth - 1 chain tokens
        room = runner.max_ctx - runner.n_past - len(self._pending) - 1
        max_depth = min(max_depth, room + 1)
        if max_depth <= 0:
            return Proposal.empty()
        feed = self._pending + [self._root]
        n0 = runner.n_past
        runner.checkpoint()                               # accept() may cut back to n0 + len(feed) or later
        chain = runner.greedy_continue(feed, max_depth)   # cache: + feed + chain[:-1]
        self._cached += feed + chain[:-1]
        self._pending = []
        if top_k == 1:
            return Proposal.chain(chain)
        # candidates per depth: one batched forward over the same tokens gives the logits that
        # chose each chain token (depth d conditioned on root + chain[:d])
        runner.rewind(n0, self._cached)
        logits = runner.prefill(feed + chain[:-1], all_logits=True)[len(feed) - 1:]
        rows_t, rows_lp = [], []
        for row in logits:
            lp = log_softmax(row / cfg.temperature)
            k = min(top_k, lp.size)
            top = np.argpartition(-lp, k - 1)[:k]
            top = top[np.lexsort((top, -lp[top]))]          # by log-prob, then lower id
            rows_t.append(top)
            rows_lp.append(lp[top])
        return Proposal(np.array(rows_t, np.int32), np.array(rows_lp, np.float64))

    def accept(self, accepted: Sequence[int], bonus: int, rows: Sequence[int] | None = None) -> None:
        new = [self._root] + [int(t) for t in accepted]      # newly committed tokens
        n_old = self._n_committed
        if len(self._cached) > n_old:
            # propose ran this step: the cache = old committed + root + chain[:-1]; keep the
            # part that the target confirmed, queue the rest
            step = self._cached[n_old:]
            keep = 0
            while keep < min(len(step), len(new)) and step[keep] == new[keep]:
                keep += 1
            self.runner.rewind(n_old + keep, self._cached)
            self._cached = self._cached[:n_old + keep]
            self._pending += new[keep:]
        else:
            self._pending += new
        self._n_committed += len(new)
        self._root = int(bonus)

    def end(self) -> None:
        self.runner.reset()
        self._cached, self._pending, self._root = [], [], None

    def close(self) -> None:
        self.end()
        if hasattr(self.runner, "close"):
            self.runner.close()

    def info(self) -> dict:
        d = Drafter.info(self)
        d.update(model=self.runner.cfg.name, arch=self.runner.cfg.arch, n_layers=self.runner.cfg.n_layers)
        return d
