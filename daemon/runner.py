"""ModelRunner: one resident model, its KV cache and the prefill/decode loop (batch 1).

The runner knows tokens, not text: stop strings, streaming and cancellation live in the engine.
A backend with its own fast path (the CUDA decode graph) subclasses this and overrides `generate`.

Prompt prefix reuse: a new prompt usually repeats most of the last one (an agent's system prompt,
tools and conversation so far), and the cache still holds that prompt's K/V after the request.
`start(prompt)` keeps the longest common prefix of the two, counted in whole prefill chunks, and
computes only the chunks after it. A prompt is always prefilled in chunks of `prefill_chunk` from
slot 0, so a kept chunk holds exactly what a fresh prefill would write there, and every computed
chunk sees the same inputs as in a fresh prefill: the logits are bit for bit those of an empty
context (tests/reference/test_prefix_reuse.py). What decoding appended is never reused (decode
steps compute K/V by another path), and any write below the recorded prefix shortens it. With a
`prefix_store` (prefix_cache.py) the prefix about to be overwritten is first copied to host RAM,
and a new prompt may load a copy that shares more chunks with it than the cache does.

A hybrid model (models/qwen35.py) also carries a recurrent state, which follows the tokens and
cannot be cut back. start() keeps a copy of it at the last whole-chunk boundary of the prompt it
prefills (where the K/V a later prompt may keep ends: the common chat turn, old prompt + answer +
new message, keeps exactly there), and a prefix is kept only if it ends at that boundary; any other
match prefills from slot 0. The state after decoding is not kept: decode steps run the recurrent
form of the delta rule, a prefill the chunked one, equal only up to rounding. Speculative decoding
leaves that copy alone: a draft tree's verify writes node states beside the live one, and its
commit copies the accepted node's in (models/qwen35_tree.py); both sit after the prompt.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..protocol.messages import SamplingParams
from .backends.base import Batch
from .backends.kv_offset import model_key_offsets
from .models import forward_of, make_cache
from .models.config import ModelConfig
from .models.weights import ModelWeights
from .prefix_cache import PrefixStore, reusable_tokens
from .sampling import log_softmax, sample

MAX_FORWARD_TREE = 256      # the most draft-tree rows one verify forward writes (the GPU's masked attention takes 256)


def max_forward_rows(prefill_chunk: int) -> int:
    """The most cache rows one forward writes: a prefill chunk or a verified tree (KVCacheSpec.max_rows, which
    sizes a KV window's ring; the VRAM plans count the same)."""
    return max(prefill_chunk, MAX_FORWARD_TREE)

__all__ = ["ModelRunner", "Sampled", "max_forward_rows"]


def _capped(n: int, cap: int | None) -> int:
    """n nodes, at most `cap` (None: no cap)."""
    return n if cap is None else min(n, cap)


@dataclass(slots=True)
class Sampled:
    """One generated token; logprob and top are from the model's distribution (before penalties
    and temperature), present when the request asked for logprobs."""

    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


class ModelRunner:
    def __init__(self, ops, cfg: ModelConfig, weights: ModelWeights, max_ctx: int,
                 prefill_chunk: int = 512, kv_types=None, max_tree_nodes: int | None = None):
        """max_tree_nodes: the most nodes (root included) a verify forward may have -- the target's
        EngineConfig.max_tree_nodes, 0 for a model loaded only to draft (it verifies nothing, and a hybrid then
        plans no node states) --, within the backend's own bounds (the max_tree_nodes property); None: those bounds
        alone, as before the option existed."""
        if max_ctx <= 0 or prefill_chunk <= 0:
            raise ValueError("max_ctx and prefill_chunk must be positive")
        if max_tree_nodes is not None and (type(max_tree_nodes) is not int or max_tree_nodes < 0):
            raise ValueError(f"max_tree_nodes must be None or an int >= 0, got {max_tree_nodes!r}")
        self.ops, self.cfg, self.weights = ops, cfg, weights
        self.max_ctx, self.prefill_chunk = max_ctx, prefill_chunk
        window = getattr(kv_types, "window", 0)
        if window and prefill_chunk % window:
            # reusable prefixes end on chunk boundaries; a window needs them on its own (kv_types.py)
            raise ValueError(f"prefill_chunk {prefill_chunk} must be a multiple of the KV window {window} "
                             f"(--kv-window sets it; 0: none)")
        self.tree_nodes_cap = max_tree_nodes    # None: no cap but the backend's
        # kv_types: backends.kv_types.KVTypes (None: f16); a hybrid's cache sizes its tree node states by the cap
        # the most rows one forward writes: a prefill chunk, or a verified tree (masked attention's 256 at most)
        self.cache = make_cache(ops, cfg, max_ctx, kv_types, max_tree_nodes, max_rows=max_forward_rows(prefill_chunk))
        if hasattr(self.cache, "set_key_offset") and self.cache.spec.kv_types.k != "f16":
            self.cache.set_key_offset(model_key_offsets(ops, cfg, weights))   # a quantized K's (kv_offset.py)
        self._model_forward = forward_of(cfg)
        self.n_past = 0   # cache slots [0, n_past) hold committed context
        self._reuse_prefix = getattr(self.cache, "reusable_prefix", True)
        self._state_prefix = hasattr(self.cache, "prefix_state_slots")     # a hybrid: one keepable prefix length
        self._checkpoint: tuple[int, object] | None = None   # (n_past, a hybrid's state copy) for rewind()
        self.reuse_prefix = True      # start() may keep the cached prefix of the last prompt
        self.prefix_store: PrefixStore | None = None   # host copies of earlier prompts' prefixes (the engine's)
        self.n_reused = 0             # prompt tokens the last start() kept instead of recomputing
        self._prefix: list[int] = []  # tokens whose K/V fill slots [0, len) as a chunked prefill from slot 0 wrote them
        self._tree_features: dict[tuple[int, ...], list] = {}   # capture layers -> their buffers (tree_features)

    # -- the reusable prompt prefix --------------------------------------------------------------
    @property
    def reuse_prefix(self) -> bool:
        """Whether start() may keep the cached prefix (never for a cache without prefixes)."""
        return self._reuse_prefix

    @reuse_prefix.setter
    def reuse_prefix(self, value: bool) -> None:
        self._reuse_prefix = bool(value) and getattr(self.cache, "reusable_prefix", True)

    def _will_write(self, n: int) -> None:
        """Slots [n_past, n_past + n) are about to be written: check that they fit, and forget the
        reusable prefix from n_past on."""
        if self.n_past + n > self.max_ctx:
            raise ValueError(f"context overflow: {self.n_past} + {n} > max_ctx {self.max_ctx}")
        self._overwrite_from(self.n_past)

    def _overwrite_from(self, slot: int) -> None:
        """Slots >= `slot` are about to be written: what they held is no longer a reusable prefix.
        Every cache write goes through here (writes start at n_past, which only reset() lowers)."""
        if slot < len(self._prefix):
            del self._prefix[slot:]
        if self._state_prefix:
            self.cache.forget_prefix_state(slot)

    def _begin_prompt(self, prompt, reuse: bool = True) -> int:
        """Position the context for prefilling `prompt`: n_past = the start of the first chunk to
        compute (0, or a multiple of prefill_chunk when a cached prefix is kept). With a prefix
        store, a host copy that shares more chunks with `prompt` than the cache does is loaded,
        and the cache's own prefix is copied to the store before anything overwrites it."""
        n_keep = 0
        store = self.prefix_store if self.reuse_prefix else None
        if reuse and self.reuse_prefix:
            n_keep = self._keepable(reusable_tokens(self._prefix, prompt, self.prefill_chunk))
            hit = store.best(prompt) if store is not None else None
            if hit is not None and hit[1] > n_keep:
                snap, n_keep = hit
                self._save_prefix(store)
                self.cache.load_prefix(snap.kv, n_keep)
                self._prefix = list(snap.tokens[:n_keep])
            elif n_keep and self._state_prefix:
                self.cache.restore_prefix_state(n_keep)    # the state after the kept slots, not after decoding
        if store is not None and n_keep < self._savable():
            self._save_prefix(store)          # the chunks past n_keep are about to be overwritten
        self.n_past = self.n_reused = n_keep
        return n_keep

    def _keepable(self, n: int) -> int:
        """n kept slots, or 0 where the cache has no recurrent state for exactly n (a hybrid)."""
        return n if not self._state_prefix or n == self.cache.prefix_state_slots else 0

    def _savable(self) -> int:
        """Slots of the cache's reusable prefix that a host copy can hold: whole chunks (a hybrid: 0 or the
        marked state's slots)."""
        n = len(self._prefix) - len(self._prefix) % self.prefill_chunk
        return self._keepable(n) if self._state_prefix else n

    def keep_prefix(self) -> None:
        """Copy the cache's reusable prefix to the prefix store (before the cache goes away: park)."""
        if self.prefix_store is not None and self.reuse_prefix:
            self._save_prefix(self.prefix_store)

    def _save_prefix(self, store: PrefixStore) -> None:
        """Copy the cache's reusable prefix (its whole chunks) to the host store."""
        n = self._savable()
        if n > 0 and not store.covers(self._prefix[:n]):
            store.add(self._prefix[:n], self.cache.save_prefix(n))

    @property
    def cached_prefix_tokens(self) -> int:
        """Tokens of the last prompt whose K/V a next start() could keep (before chunk rounding; a hybrid:
        those its kept state covers)."""
        if not self.reuse_prefix:
            return 0
        return self._savable() if self._state_prefix else len(self._prefix)

    def _end_prompt(self, prompt) -> None:
        """`prompt` was prefilled in chunks from slot 0 (or kept): record it as the reusable prefix."""
        self._prefix = [int(t) for t in prompt]

    def start(self, prompt, *, hidden_sink=None) -> np.ndarray:
        """Make the context exactly `prompt`, reusing the cached prefix (see the module docstring),
        and return the last token's logits (1, vocab), bit for bit those of reset() + prefill(prompt).
        A hidden sink must see every position, so with one nothing is reused."""
        if len(prompt) == 0:
            raise ValueError("prefill needs at least one token")
        n_keep = self._begin_prompt(prompt, reuse=hidden_sink is None)
        mark = len(prompt) - len(prompt) % self.prefill_chunk     # the last whole-chunk boundary of prompt
        if self._state_prefix and self.reuse_prefix and mark > n_keep:
            # a hybrid: prefill up to the boundary (whole chunks: the chunking is unchanged), copy the state there
            logits = self.prefill(prompt[n_keep:mark], hidden_sink=hidden_sink)
            self.cache.mark_prefix_state(mark)
        if self.n_past < len(prompt):
            logits = self.prefill(prompt[self.n_past:], hidden_sink=hidden_sink)
        self._end_prompt(prompt)
        return logits

    # -- forward passes --------------------------------------------------------------------------
    def _forward(self, ids: list[int] | np.ndarray, *, all_logits: bool, hidden_sink=None) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int32)
        n = len(ids)
        self._will_write(n)
        ops = self.ops
        ops.begin_forward()
        batch = Batch(ids=ops.from_numpy(ids),
                      positions=ops.from_numpy(np.arange(self.n_past, self.n_past + n, dtype=np.int32)),
                      n_past=ops.from_numpy(np.array([self.n_past], np.int32)), n_tokens=n)
        logits = self._model_forward(ops, self.cfg, self.weights, self.cache, batch, all_logits=all_logits,
                         hidden_sink=hidden_sink)
        self.n_past += n
        return ops.to_numpy(logits)

    def prefill(self, ids, *, all_logits: bool = False, hidden_sink=None) -> np.ndarray:
        """Append `ids` to the context in chunks; logits of the last token (1, vocab), or of
        every token (n, vocab) with all_logits. hidden_sink: see models.dense.forward."""
        if len(ids) == 0:
            raise ValueError("prefill needs at least one token")
        outs = []
        for start in range(0, len(ids), self.prefill_chunk):
            outs.append(self._forward(ids[start:start + self.prefill_chunk], all_logits=all_logits,
                                      hidden_sink=hidden_sink))
        return np.concatenate(outs) if all_logits else outs[-1]

    def reset(self) -> None:
        self.n_past = 0
        self._checkpoint = None

    # -- speculative decoding (daemon/speculative/decoder.py) -------------------------------------------
    @property
    def max_tree_nodes(self) -> int:
        """The largest tree `forward_tree` takes (nodes, root included): a prefill chunk, for a hybrid
        at most the cache's bound (a whole recurrent state per node: models/qwen35_tree.py), and at most
        the configured cap (tree_nodes_cap; 0: no tree at all)."""
        return _capped(min(self.prefill_chunk, getattr(self.cache, "max_tree_nodes", self.prefill_chunk)),
                       self.tree_nodes_cap)

    def forward_tree(self, ids, positions, mask, *, hidden_sink=None, capture=()):
        """Forward the nodes of a draft tree without committing them: node i at RoPE position
        positions[i] writes K/V to slot n_past + i and attends the committed context plus the
        nodes j with mask[i, j] (bool (n, n)). Returns the logits (n, vocab) as a backend tensor,
        valid until the next forward. n_past is unchanged; `commit_tree` keeps a path.
        capture (target layer indices): row i of `tree_features(capture)[j]` becomes layer
        capture[j]'s output at node i (i < n), written by the forward itself (the CUDA runner
        replays a captured graph that copies them on the device; a hidden_sink runs host code per
        layer, so a forward with one is eager). A hybrid model also writes each node's recurrent
        state (models/qwen35_tree.py); mask must then be a tree's ancestor mask."""
        ids = np.asarray(ids, np.int32)
        n = len(ids)
        if n > self.max_tree_nodes:
            raise ValueError(f"a tree of {n} nodes: this runner verifies at most {self.max_tree_nodes} "
                             f"(max_tree_nodes)")
        self._will_write(n)
        ops = self.ops
        sink = self._capture_sink(hidden_sink, tuple(capture), n)
        ops.begin_forward()
        batch = Batch(ids=ops.from_numpy(ids), positions=ops.from_numpy(np.asarray(positions, np.int32)),
                      n_past=ops.from_numpy(np.array([self.n_past], np.int32)),
                      mask=ops.from_numpy(np.asarray(mask, bool)), n_tokens=n)
        return self._model_forward(ops, self.cfg, self.weights, self.cache, batch, all_logits=True, hidden_sink=sink)

    def tree_features(self, layers) -> list:
        """The buffers `forward_tree(..., capture=layers)` writes: one backend tensor (max_tree_nodes,
        hidden) float32 per layer of `layers`, in that order; row i is node i of the last such forward.
        Allocated on first use and kept (a captured graph reads their addresses)."""
        layers = tuple(int(i) for i in layers)
        bufs = self._tree_features.get(layers)
        if bufs is None:
            if not layers or not all(0 <= i < self.cfg.n_layers for i in layers):
                raise ValueError(f"capture layers {list(layers)}: need one or more in [0, {self.cfg.n_layers})")
            bufs = self._tree_features[layers] = self._feature_rows(len(layers))
        return bufs

    def _feature_rows(self, n_layers: int) -> list:
        """n_layers buffers (max_tree_nodes, hidden) float32 (the reference backend's device is host memory)."""
        return [np.zeros((self.max_tree_nodes, self.cfg.hidden), np.float32) for _ in range(n_layers)]

    def _capture_sink(self, hidden_sink, capture: tuple, n: int):
        """The hidden sink of a forward of n rows: hidden_sink's calls plus, per layer in `capture`,
        the copy of its rows into rows [0, n) of its tree_features buffer."""
        if not capture:
            return hidden_sink
        bufs, index = self.tree_features(capture), {layer: j for j, layer in enumerate(capture)}
        ops = self.ops

        def sink(layer: int, h) -> None:
            if hidden_sink is not None:
                hidden_sink(layer, h)
            j = index.get(layer)
            if j is not None:
                bufs[j][:n] = ops.to_numpy(h)
        return sink

    def commit_tree(self, node_offsets) -> None:
        """Keep the nodes at slots n_past + node_offsets (ascending, node_offsets[k] >= k) as the
        next len(node_offsets) committed slots. A hybrid: they must be a root-to-node path of the
        last forward_tree, and the live recurrent state becomes its last node's."""
        offsets = np.asarray(node_offsets, np.int32)
        self._will_write(len(offsets))
        if self._state_prefix:
            self.cache.keep_tree_path(offsets)
        if np.any(offsets != np.arange(len(offsets))):
            self.ops.kv_compact(self.cache, self.n_past, offsets)
        self.n_past += len(offsets)

    def greedy_continue(self, feed, n_new: int) -> list[int]:
        """Append `feed` to the context, then greedily choose n_new >= 1 tokens (plain argmax, no
        penalties); the context ends holding feed + all but the last chosen token (a drafter's
        chain). The CUDA runner replays its captured decode graph here."""
        if n_new < 1 or len(feed) == 0:
            raise ValueError("greedy_continue needs a non-empty feed and n_new >= 1")
        logits = self.prefill(list(feed))[0]
        out = [int(np.argmax(logits))]
        while len(out) < n_new:
            out.append(int(np.argmax(self._forward([out[-1]], all_logits=False)[0])))
        return out

    def greedy_stream(self, feed, n_new: int) -> Iterator[int]:
        """greedy_continue's tokens one at a time, each as soon as it is chosen (spec=auto's plain steps: the
        consumer streams them while the next ones are computed). The context afterwards is greedy_continue's; a
        consumer that closes the iterator early leaves it holding what was forwarded by then (n_past counts it).
        Here: greedy_continue, then its tokens."""
        yield from self.greedy_continue(feed, n_new)

    def checkpoint(self) -> None:
        """Remember the context's length (a hybrid: and a copy of its recurrent state) for rewind()."""
        self._checkpoint = (self.n_past, self.cache.save_state() if self._state_prefix else None)

    def rewind(self, n: int, tokens) -> None:
        """Cut the context back to its first n slots (a draft model after rejections). `tokens`: the
        context's tokens, at least its first n. A dense cache keeps its K/V: n_past = n. A hybrid's
        recurrent state cannot be cut back: the checkpoint's state (taken at n_past <= n) is loaded
        and slots [checkpoint, n) are prefilled again (the chunked form: a drafter's state, not kept
        for prefix reuse, so its rounding matters to nobody's output)."""
        if not 0 <= n <= self.n_past:
            raise ValueError(f"rewind to {n}: the context holds {self.n_past} slots")
        if not self._state_prefix or n == self.n_past:
            self.n_past = n
            return
        if self._checkpoint is None or self._checkpoint[0] > n:
            raise ValueError(f"rewind to {n}: no recurrent state checkpoint at or before it")
        start, state = self._checkpoint
        self.cache.load_state(state)
        self.n_past = start
        if n > start:
            self.prefill([int(t) for t in tokens[start:n]])

    def logits_to_host(self, logits) -> np.ndarray:
        return np.asarray(self.ops.to_numpy(logits))

    def argmax_rows(self, logits) -> np.ndarray:
        """int (n,): the argmax of each row (lowest id wins a tie, as sampling.sample)."""
        return np.argmax(self.logits_to_host(logits), axis=-1)

    def score(self, ids) -> np.ndarray:
        """Teacher forcing: logits (n, vocab) at every position of `ids`, from an empty context."""
        self.reset()
        try:
            return self.prefill(ids, all_logits=True)
        finally:
            self.reset()

    # -- generation ------------------------------------------------------------------------------
    def generate(self, prompt: list[int], params: SamplingParams, max_new_tokens: int,
                 logprobs: int = 0) -> Iterator[Sampled]:
        """Prefill `prompt` into an empty context (start(): the cached prefix is kept), then yield
        up to max_new_tokens tokens.

        The consumer stops early by closing the iterator (stop strings, cancel). The context
        holds prompt + every token yielded except the last one, which has not been forwarded.
        """
        history = list(prompt)
        logits = self.start(prompt)[0]
        for step in range(max_new_tokens):
            token = sample(logits, np.asarray(history), params, step)
            yield self._sampled(token, logits, logprobs)
            history.append(token)
            if step + 1 < max_new_tokens:
                logits = self._forward([token], all_logits=False)[0]

    @staticmethod
    def _sampled(token: int, logits: np.ndarray, n_top: int) -> Sampled:
        if n_top <= 0:
            return Sampled(token)
        lp = log_softmax(logits)
        top = np.argsort(-lp, kind="stable")[:n_top]
        return Sampled(token, float(lp[token]), [(int(t), float(lp[t])) for t in top])
