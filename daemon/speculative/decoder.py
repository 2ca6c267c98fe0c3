"""The speculative decode loop: draft, verify in one target forward, accept, commit.

One step, with the root r (the newest generated token, not yet forwarded) and n_past committed
cache slots:

1. the drafter proposes per-depth candidates; tree.py builds a chain or a DDTree of n = 1 + m
   nodes (node 0 = r), at most `budget` drafted nodes, never deeper than the tokens still wanted
   (max_new_tokens - emitted - 1: a step emits accepted + 1 tokens) and never past max_ctx
   (n_past + n <= max_ctx); a greedy step whose drafter leaves its candidates on the device and whose runner
   builds trees there (DFlash on CUDA: `_device_step`, SpecConfig.device_tree) gets the same tree without a
   read-back before the verify;
2. one target forward over the n nodes: positions n_past + depth, cache slots n_past + i, the
   ancestor mask (committed context + ancestors + self); a drafter that wants target features gets
   them through the hidden sink, or (device_features) in the runner's buffers: the forward runs with
   capture= and no sink (on CUDA a replayed graph), then capture_device (drafter.py);
3. accept.py walks the tree (greedy, or rejection sampling at temperature > 0): path + bonus;
   a step with nothing drafted is a plain greedy step where the runner has a faster one
   (`greedy_stream`: the CUDA decode graph, steps in flight) and no drafter needs the target's hidden states;
4. commit: the path's K/V move to slots n_past .. n_past + len(path) - 1 (`Ops.kv_compact`),
   n_past += len(path); the drafter hears accepted + bonus (and which verify rows were committed,
   for its target features); bonus becomes the root;
5. the accepted tokens and the bonus are yielded one by one, so the engine streams them, stops at
   a stop id/string (the rest of the step is never emitted) and cancels between tokens.

Exactness at temperature 0: every emitted token is the target's argmax given exactly the context
plain decoding would have (tree attention), so the output equals plain greedy decoding token for
token on a backend whose logits do not depend on how many rows a forward has (the reference
backend; see tests/gpu/test_spec_gpu.py for the CUDA backend).
"""
from __future__ import annotations

import itertools
import time
from contextlib import closing
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ...protocol.messages import SamplingParams
from ..runner import ModelRunner, Sampled
from ..sampling import apply_penalties, candidate_probs, sample, uniform
from .accept import greedy_walk, sample_walk
from .drafter import Drafter, Proposal
from .policy import DepthPolicy
from .tree import DraftTree, build_chain, build_tree

__all__ = ["SpecConfig", "SpecStats", "SpecDecoder", "SPEC_MODES", "DEFAULT_DDTREE_BUDGET"]

SPEC_MODES = ("chain", "ddtree", "auto")   # auto: a chain whose depth DepthPolicy picks per step
DEFAULT_DDTREE_BUDGET = 22      # the anchor's default; the chain default is the drafter's max_depth
# Sampling draws use uniform(seed, SPEC_STEP_BASE + k): a counter range disjoint from plain
# decoding's (seed, step) so the first token (drawn as in plain decoding, step 0) is independent.
SPEC_STEP_BASE = 1 << 62
MAX_HISTOGRAM = 64


@dataclass(slots=True, frozen=True)
class SpecConfig:
    mode: str                   # chain | ddtree | auto
    budget: int                 # drafted (non-root) nodes per step, >= 1 (auto: the deepest chain)
    top_k: int = 8              # candidates per depth asked of the drafter (ddtree; chain uses 1)
    chain_seed: bool = True     # ddtree: insert the top-1 chain first
    # greedy steps build the tree on the device where the runner and the drafter can (CUDA + DFlash: no
    # read-back before the verify); False: always on the host (tree.py), the oracle and the A/B's baseline
    device_tree: bool = True

    def __post_init__(self):
        if self.mode not in SPEC_MODES:
            raise ValueError(f"spec mode must be one of {', '.join(SPEC_MODES)}, got {self.mode!r}")
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1, got {self.budget}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")


@dataclass(slots=True)
class SpecStats:
    """Per request. accepted = drafted tokens the target kept in a step (the bonus not counted)."""

    steps: int = 0
    accepted: int = 0
    drafted_nodes: int = 0
    histogram: list[int] = field(default_factory=lambda: [0] * (MAX_HISTOGRAM + 1))
    draft_s: float = 0.0
    verify_s: float = 0.0

    def add(self, n_accepted: int, n_nodes: int, draft_s: float, verify_s: float) -> None:
        self.steps += 1
        self.accepted += n_accepted
        self.drafted_nodes += n_nodes
        self.histogram[min(n_accepted, MAX_HISTOGRAM)] += 1
        self.draft_s += draft_s
        self.verify_s += verify_s

    def as_dict(self, mode: str, budget: int, drafter: str) -> dict:
        steps = max(self.steps, 1)
        last = max((i for i, c in enumerate(self.histogram) if c), default=0)
        return {"mode": mode, "budget": budget, "draft": drafter, "steps": self.steps,
                "accepted": self.accepted,
                "accepted_per_step": round(self.accepted / steps, 4),
                "tokens_per_step": round((self.accepted + self.steps) / steps, 4),
                "drafted_per_step": round(self.drafted_nodes / steps, 4),
                "accepted_histogram": self.histogram[:last + 1],
                "draft_ms": round(self.draft_s * 1e3, 3), "verify_ms": round(self.verify_s * 1e3, 3)}


def _tree_capacity(n_depth: int, k: int, cap: int) -> int:
    """Nodes a tree of n_depth levels with k candidates a level can hold (k + k^2 + ...), at most cap."""
    total, level = 0, 1
    for _ in range(n_depth):
        level *= k
        total += level
        if total >= cap:
            return cap
    return total


def _uses_penalties(p: SamplingParams) -> bool:
    return p.repeat_last_n > 0 and (p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0
                                    or p.presence_penalty != 0.0)


class SpecDecoder:
    """Drives one request: `generate` has ModelRunner.generate's contract (yield Sampled, the
    consumer may close early); `stats` is filled as it runs."""

    def __init__(self, runner: ModelRunner, drafter: Drafter, config: SpecConfig,
                 policy: DepthPolicy | None = None):
        if config.mode == "auto" and policy is None:
            policy = DepthPolicy(config.budget)
        self.runner, self.drafter, self.config, self.policy = runner, drafter, config, policy
        self.stats = SpecStats()

    def _sink(self):
        wanted = frozenset(self.drafter.target_layer_ids)
        if not wanted:
            return None
        drafter = self.drafter

        def sink(layer: int, h) -> None:
            if layer in wanted:
                drafter.capture_hidden(layer, h)
        sink.layers = wanted          # a runner may compute just these (the CUDA persistent forward)
        return sink

    def _tree(self, root: int, proposal: Proposal, max_nodes: int, max_depth: int) -> DraftTree:
        cfg = self.config
        if cfg.mode != "ddtree":
            return build_chain(root, proposal, min(max_nodes, max_depth))
        return build_tree(root, proposal, max_nodes, chain_seed=cfg.chain_seed, max_depth=max_depth)

    def generate(self, prompt: list[int], params: SamplingParams, max_new_tokens: int,
                 logprobs: int = 0) -> Iterator[Sampled]:
        runner, drafter, cfg = self.runner, self.drafter, self.config
        self.stats = stats = SpecStats()
        sink = self._sink()
        greedy = params.greedy
        device_argmax = greedy and not _uses_penalties(params) and not logprobs
        policy = self.policy if cfg.mode == "auto" else None
        # an undrafted step may take the runner's decode path (with target features: drafter.py, "Gaps")
        plain_step = device_argmax and (sink is None or (policy is not None and drafter.tolerates_gaps))
        device_tree = (cfg.device_tree and device_argmax and drafter.device_proposals and (
            sink is None or drafter.device_features) and getattr(runner, "device_tree", False))
        history = list(prompt)                  # prompt + every emitted token (penalties)
        draws = itertools.count(SPEC_STEP_BASE)          # the sampling walk's uniform draws, numbered

        def draw() -> float:
            return uniform(params.seed, next(draws))

        try:
            logits = runner.start(prompt, hidden_sink=sink)[0]      # the cached prompt prefix is kept
            if max_new_tokens <= 0:
                return
            root = sample(logits, np.asarray(history), params, 0)
            history.append(root)
            drafter.begin(list(prompt), root)
            yield ModelRunner._sampled(root, logits, logprobs)
            n_out = 1
            while n_out < max_new_tokens:
                # drafted nodes that fit: the context, and the forward size the runner is sized for
                room = min(runner.max_ctx - runner.n_past, runner.max_tree_nodes) - 1
                # no deeper than the tokens still wanted (a step emits accepted + 1), the drafter's
                # reach, the context, or the budget (a tree of B nodes is at most B deep)
                max_depth = min(max_new_tokens - n_out - 1, drafter.max_depth, room, cfg.budget)
                t0 = time.perf_counter()
                if policy is not None:
                    max_depth = policy.depth(max_depth)
                # the tree built and verified on the device where both sides can (no read-back before the verify)
                step = (self._device_step(root, max_depth, min(cfg.budget, room), sink)
                        if device_tree and max_depth > 0 else None)
                if step is not None:
                    tree, path, bonus, t1 = step
                    host = None
                else:
                    top_k = 1 if cfg.mode != "ddtree" else cfg.top_k
                    proposal = drafter.propose(max_depth, top_k) if max_depth > 0 else Proposal.empty()
                    tree = self._tree(root, proposal, min(cfg.budget, room), max_depth)
                    t1 = time.perf_counter()
                    if tree.n_nodes == 1 and plain_step:
                        # a burst only where the policy chose plain steps; where it wanted a draft and the drafter
                        # had none (no n-gram match), one step, so the next token asks the drafter again
                        burst = 1 if policy is None or max_depth > 0 else policy.plain_steps(
                            min(max_new_tokens - n_out, runner.max_ctx - runner.n_past))
                        tokens = yield from self._plain_run(root, burst, t0, history, policy)
                        n_out += len(tokens)
                        root = tokens[-1]
                        continue
                    path, bonus, host = self._verify(tree, sink, device_argmax, greedy, params, history, draw)
                    runner.commit_tree(np.asarray(path, np.int32))
                accepted = [int(t) for t in tree.tokens[path[1:]]]
                t2 = time.perf_counter()
                drafter.accept(accepted, bonus, path)       # drafter work (DFlash extends its context)
                t3 = time.perf_counter()
                stats.add(len(accepted), tree.n_nodes - 1, (t1 - t0) + (t3 - t2), t2 - t1)
                if policy is not None:
                    policy.observe(tree.n_nodes - 1, len(accepted), t3 - t0)
                emitted = accepted + [bonus]
                history.extend(emitted)
                root = bonus
                # the logits that chose emitted[k] are those of node path[k]
                for k, tok in enumerate(emitted):
                    yield (Sampled(tok) if not logprobs
                           else ModelRunner._sampled(tok, host[path[k]], logprobs))
                    n_out += 1
        finally:
            drafter.end()

    def _device_step(self, root: int, max_depth: int, max_nodes: int, sink):
        """A greedy step with the drafter's candidates left on the device and the tree built there (drafter.py,
        "Proposals on the device"; backends/cuda/tree_verify.py): the same tree as _tree's host build, verified,
        walked and committed. (tree, path, bonus, time the draft was queued), or None where the runner cannot
        take this tree (the caller then builds it on the host); the drafter has not run then."""
        runner, drafter, cfg = self.runner, self.drafter, self.config
        ddtree = cfg.mode == "ddtree"
        k = min(cfg.top_k, runner.cfg.vocab_size) if ddtree else 1      # the top-K kernel's k' = min(k, vocab)
        n_depth = min(max_depth, drafter.max_depth)
        # build_tree's budget, but no more nodes than the candidates can make (no padding rows where it is
        # known up front); the chain: one node a depth
        budget = min(max_nodes, _tree_capacity(n_depth, k, max_nodes)) if ddtree else min(max_nodes, n_depth)
        if not runner.device_tree_fits(n_depth, k, budget):
            return None
        proposal = drafter.propose_device(max_depth, k)
        if proposal is None:
            return None
        if (proposal.n_depth, proposal.k) != (n_depth, k):
            raise RuntimeError(f"{drafter.name}: propose_device gave {proposal.n_depth} x {proposal.k} candidates, "
                               f"asked {n_depth} x {k}")
        t1 = time.perf_counter()
        capture = tuple(drafter.target_layer_ids) if sink is not None else ()
        logits = runner.forward_tree_device(proposal, n_depth=n_depth, budget=budget,
                                            chain_seed=cfg.chain_seed or not ddtree, root=root, capture=capture)
        if capture:
            drafter.capture_device(runner.tree_features(capture), budget + 1)
        tree, argmax = runner.walk_device(logits)
        path, bonus = greedy_walk(tree, lambda i: argmax[i])
        runner.commit_tree(np.asarray(path, np.int32))
        return tree, path, bonus, t1

    def _plain_run(self, root: int, n: int, t0: float, history: list[int], policy: DepthPolicy | None):
        """n plain steps from `root` (as many as the policy would take in a row), streamed as plain decoding
        streams: the runner keeps steps in flight while each token is handed on, no host round trip in between.
        Each is its own step, timed from the token before it to its arrival (the rate plain steps come at, the
        consumer's share included where it is the slower); the drafter hears the run as one skip. Yields the
        tokens, returns them."""
        stats, tokens = self.stats, []
        # closed here if the consumer stops mid-run: the runner settles its context at once
        with closing(self.runner.greedy_stream([root], n)) as run:      # forwards root + n - 1 tokens
            for tok in run:
                now = time.perf_counter()
                stats.add(0, 0, 0.0, now - t0)
                if policy is not None:
                    policy.observe(0, 0, now - t0)
                t0 = now
                tokens.append(tok)
                history.append(tok)
                yield Sampled(tok)
        self.drafter.skip(tokens)
        return tokens

    def _verify(self, tree: DraftTree, sink, device_argmax: bool, greedy: bool, params: SamplingParams,
                history: list[int], draw):
        """One target forward over the tree and the acceptance walk: (path, bonus, the host logits
        or None when the argmax ran on the device). A drafter with device_features gets the verify
        rows' features in the runner's buffers (capture_device, drafter.py), not through the sink."""
        runner, drafter = self.runner, self.drafter
        capture = tuple(drafter.target_layer_ids) if sink is not None and drafter.device_features else ()
        logits_t = runner.forward_tree(tree.tokens, tree.positions(runner.n_past), tree.ancestor_mask(),
                                       hidden_sink=None if capture else sink, capture=capture)
        if capture:
            drafter.capture_device(runner.tree_features(capture), tree.n_nodes)
        if device_argmax:
            argmax = runner.argmax_rows(logits_t)
            path, bonus = greedy_walk(tree, lambda i: argmax[i])
            return path, bonus, None
        host = runner.logits_to_host(logits_t)          # (n, vocab)

        def node_history(i: int) -> np.ndarray:
            return np.asarray(history + [int(t) for t in tree.tokens[tree.path_to(i)[1:]]])

        if greedy:
            path, bonus = greedy_walk(
                tree, lambda i: int(np.argmax(apply_penalties(host[i], node_history(i), params))))
        else:
            path, bonus = sample_walk(
                tree, lambda i: candidate_probs(apply_penalties(host[i], node_history(i), params), params), draw)
        return path, bonus, host
