"""DDTree: the draft tree verified in one target forward (ARCHITECTURE.md, DDTree verification).

Input: a `Proposal` (per-depth top-K candidates with log-probs, not conditioned on the path) and
a node budget (the number of non-root nodes). Output: a `DraftTree` of n = 1 + n_drafted nodes in
insertion order; node 0 is the root (the newest generated token, not yet forwarded).

Best-first build. A node at depth d >= 1 takes the candidate of rank r at depth d (row d-1 of the
proposal); its score is the sum of its path's log-probs (cumulative log-prob, <= 0 when the
drafter's log-probs are normalised). Nodes are inserted in the order

    key(node) = (-score, depth, path_ranks)        (smaller key first)

where path_ranks is the tuple of ranks from depth 1 to the node: higher cumulative log-prob first,
then shallower, then the lexicographically smaller rank path. A heap pops the best frontier node
and pushes its next sibling (rank + 1) and its first child (depth + 1, rank 0), until the budget is
spent or the frontier is empty. Because a child never scores above its parent (log-probs <= 0) and
candidates are sorted by log-prob within a depth, the result is exactly the first `budget` nodes
of all possible nodes sorted by `key`, which is what the brute-force test checks. Candidates
with log-prob -inf are never inserted.

Chain seed: the top-1 chain (rank 0 at every depth) is inserted first, then the best-first build
continues among the other nodes. Chain mode: only the top-1 chain (one child per node).

Verification layout: node i sits at RoPE position base + depth[i] and writes its K/V to cache
slot n_past + i; `mask[i, j]` is True iff node j is node i or one of its ancestors.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from .drafter import Proposal

__all__ = ["DraftTree", "build_tree", "build_chain"]


@dataclass(slots=True, frozen=True)
class DraftTree:
    tokens: np.ndarray    # int32 (n,): token of each node; tokens[0] = root
    parents: np.ndarray   # int32 (n,): parent node index, -1 for the root; parents[i] < i
    depths: np.ndarray    # int32 (n,): 0 for the root
    ranks: np.ndarray     # int32 (n,): candidate rank at the node's depth; 0 for the root
    scores: np.ndarray    # float64 (n,): cumulative log-prob; 0 for the root

    @property
    def n_nodes(self) -> int:
        return int(self.tokens.shape[0])

    def ancestor_mask(self) -> np.ndarray:
        """bool (n, n): mask[i, j] iff j is i or an ancestor of i."""
        n = self.n_nodes
        mask = np.zeros((n, n), bool)
        for i in range(n):
            p = int(self.parents[i])
            if p >= 0:
                mask[i] = mask[p]       # parents come first, so mask[p] is final
            mask[i, i] = True
        return mask

    def positions(self, base: int) -> np.ndarray:
        return (base + self.depths).astype(np.int32)

    def children(self) -> list[list[int]]:
        """children()[i]: the children of node i in insertion order."""
        out: list[list[int]] = [[] for _ in range(self.n_nodes)]
        for i in range(1, self.n_nodes):
            out[int(self.parents[i])].append(i)
        return out

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to `node`, root first."""
        path = []
        while node >= 0:
            path.append(node)
            node = int(self.parents[node])
        return path[::-1]


def _sorted_candidates(proposal: Proposal, max_depth: int) -> tuple[np.ndarray, np.ndarray]:
    """The proposal's first max_depth rows with each row sorted by log-prob, descending (stable,
    so equal log-probs keep the drafter's order)."""
    tokens = proposal.tokens[:max_depth]
    logprobs = proposal.logprobs[:max_depth]
    order = np.argsort(-logprobs, axis=1, kind="stable")
    return np.take_along_axis(tokens, order, 1), np.take_along_axis(logprobs, order, 1)


def _make(root: int, nodes: list[tuple[int, int, int, int, float]]) -> DraftTree:
    # nodes: (token, parent, depth, rank, score) for the non-root nodes in insertion order
    rows = [(root, -1, 0, 0, 0.0)] + nodes
    return DraftTree(tokens=np.array([r[0] for r in rows], np.int32),
                     parents=np.array([r[1] for r in rows], np.int32),
                     depths=np.array([r[2] for r in rows], np.int32),
                     ranks=np.array([r[3] for r in rows], np.int32),
                     scores=np.array([r[4] for r in rows], np.float64))


def build_chain(root: int, proposal: Proposal, budget: int) -> DraftTree:
    """The top-1 chain, at most `budget` nodes deep (stops at the first -inf candidate)."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    tokens, logprobs = _sorted_candidates(proposal, budget)
    nodes, score = [], 0.0
    for d in range(tokens.shape[0]):
        if not np.isfinite(logprobs[d, 0]):
            break
        score += float(logprobs[d, 0])
        nodes.append((int(tokens[d, 0]), d, d + 1, 0, score))
    return _make(root, nodes)


def build_tree(root: int, proposal: Proposal, budget: int, *, chain_seed: bool = True,
               max_depth: int | None = None) -> DraftTree:
    """Best-first DDTree of at most `budget` non-root nodes and depth <= max_depth."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    n_depth = proposal.n_depth if max_depth is None else min(proposal.n_depth, max_depth)
    tokens, logprobs = _sorted_candidates(proposal, n_depth)
    n_rank = tokens.shape[1] if n_depth else 0
    tokens, logprobs = tokens.tolist(), logprobs.tolist()    # Python numbers: the same values, no numpy scalars
    nodes: list[tuple[int, int, int, int, float]] = []
    paths: list[tuple[int, ...]] = [()]            # rank path of each inserted node (root: ())
    scores: list[float] = [0.0]
    heap: list[tuple[float, int, tuple[int, ...], int]] = []   # (-score, depth, path, parent)

    def push(parent: int, depth: int, rank: int) -> None:
        if depth > n_depth or rank >= n_rank:
            return
        lp = logprobs[depth - 1][rank]
        if not math.isfinite(lp):
            return                                 # -inf: unusable, and so are later ranks
        heapq.heappush(heap, (-(scores[parent] + lp), depth, paths[parent] + (rank,), parent))

    def insert(parent: int, depth: int, rank: int) -> int:
        score = scores[parent] + logprobs[depth - 1][rank]
        nodes.append((tokens[depth - 1][rank], parent, depth, rank, score))
        paths.append(paths[parent] + (rank,))
        scores.append(score)
        return len(nodes)                          # node index (the root is 0)

    if chain_seed:
        spine = [0]
        for d in range(1, n_depth + 1):
            if len(nodes) >= budget or not math.isfinite(logprobs[d - 1][0]):
                break
            spine.append(insert(spine[-1], d, 0))
        for i, node in enumerate(spine[1:]):       # siblings of the spine nodes
            push(spine[i], i + 1, 1)
        push(spine[-1], len(spine), 0)             # the first child of the spine's tip
    else:
        push(0, 1, 0)
    while heap and len(nodes) < budget:
        _, depth, path, parent = heapq.heappop(heap)
        node = insert(parent, depth, path[-1])
        push(parent, depth, path[-1] + 1)          # next sibling
        push(node, depth + 1, 0)                   # first child
    return _make(root, nodes)
