"""Acceptance walks over a verified draft tree: which drafted tokens the target keeps.

Both walks start at the root and return (path, bonus): `path` lists the node indices from the root
(path[0] == 0) to the deepest accepted node, `bonus` is the target's own token after that node.
The tokens emitted by the step are tree.tokens[path[1:]] followed by bonus.

Greedy (temperature 0): at node i the target's token is t_i (argmax of its post-penalty logits);
follow the first child (insertion order) whose token equals t_i; when none does, t_i is the
bonus. The emitted tokens are exactly what plain greedy decoding emits, because node i's logits
are the target's logits for the context committed + path(root..i) (tree attention).

Sampling (temperature > 0): recursive rejection with point-mass drafts. At node i let p be the
target's distribution (after penalties, temperature, top_k, top_p, min_p: `sampling.py`). Visit
the children c in insertion order: accept c with probability p(token_c) (that is min(1, p/q) for a
deterministic draft, q = point mass); on rejection set p := normalise(p with token_c zeroed)
(the residual max(p - q, 0) renormalised). If no child is accepted, draw the bonus from the
residual p. Each token x leaves node i with probability exactly p(x) whatever the drafts were
(P(x = c_k) = prod_{j<k} (1 - p_j(c_j)) * p_k(c_k) = p(c_k) by induction), so the emitted sequence
has the distribution of plain sampling from the target; only the random numbers differ from plain
decoding, so the same seed gives different (equally distributed) text.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .tree import DraftTree

__all__ = ["greedy_walk", "sample_walk"]


def greedy_walk(tree: DraftTree, target_token: Callable[[int], int]) -> tuple[list[int], int]:
    """target_token(node) -> the target's greedy token after `node` (called along the walk only)."""
    children = tree.children()
    path = [0]
    while True:
        node = path[-1]
        t = int(target_token(node))
        nxt = next((c for c in children[node] if int(tree.tokens[c]) == t), None)
        if nxt is None:
            return path, t
        path.append(nxt)


def sample_walk(tree: DraftTree, target_dist: Callable[[int], tuple[np.ndarray, np.ndarray]],
                draw: Callable[[], float]) -> tuple[list[int], int]:
    """target_dist(node) -> (ids ascending, probs) of the target's kept tokens after `node`;
    draw() -> a fresh uniform in [0, 1)."""
    children = tree.children()
    path = [0]
    while True:
        node = path[-1]
        ids, probs = target_dist(node)
        p = np.asarray(probs, np.float64).copy()
        ids = np.asarray(ids, np.int64)
        accepted = None
        for c in children[node]:
            tok = int(tree.tokens[c])
            j = int(np.searchsorted(ids, tok))
            if j >= ids.size or ids[j] != tok or p[j] <= 0.0:
                continue                           # p(token) = 0: rejected without a draw
            if draw() < p[j]:
                accepted = c
                break
            p[j] = 0.0                             # residual: max(p - point mass, 0) ...
            p /= p.sum()                           # ... renormalised (sum > 0: p[j] < 1 here)
        if accepted is None:
            u = draw()
            k = int(np.searchsorted(np.cumsum(p), u, side="right"))
            k = min(k, ids.size - 1)
            while p[k] <= 0.0:                     # rounding at the top end: last kept token
                k -= 1
            return path, int(ids[k])
        path.append(accepted)
