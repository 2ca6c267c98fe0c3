"""CudaRunner: the decode loop on the GPU, one CUDA-graph launch per token.

The decode step's inputs live in device memory (`tok`, `pos`, `n_past`, `step`, the token
history for penalties). One captured graph runs: forward of `tok` at `pos` -> token selection
into `tok` -> `fd_decode_advance` (appends to the history, writes the token into a ring of pinned
host memory, advances the scalars). The host keeps PIPELINE_DEPTH steps in flight and reads token
k from the ring once step k's event completes, so it never waits for the GPU to go idle; it only
streams and stops. A consumer that stops early leaves at most PIPELINE_DEPTH tokens computed and
discarded.

Per layer the per-op decode step runs the QKV GEMV, then `fd_attention_decode_rope` (RoPE of q and k,
the K/V write at slot n_past and split-K attention in one op: CudaOps.attention for one unmasked row),
then the O, gate/up and down GEMVs. Prefill and tree verification keep `fd_rope_kv_write` + their
attention kernel; a tree node's logits stay bitwise a decode step's (the fused op is bit for bit the
two kernels).

The decode step's body, its capture and the choice between its shallow and deep graphs: decode_step.py.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterator

import numpy as np

from ....protocol.messages import SamplingParams
from ...runner import ModelRunner, Sampled, _capped
from ...sampling import NonFiniteLogits
from ..base import Batch
from .decode_step import RING_LEN, STATE_FIELDS, DecodeStep
from .ops import MAX_MASKED_TOKENS, CudaOps
from .persistent import FORWARD_PATHS, ForwardTuning, ForwardUnsupported, PersistentForward
from .tree_inputs import pack_tree_inputs, tree_input_views, tree_input_words
from .tree_verify import DeviceTreeVerify

__all__ = ["CudaRunner"]

# Below this temperature logits / T leaves float32's range (fd_sample takes T as a float): every
# token but the argmax has probability 0, which the argmax path computes exactly.
TINY_TEMPERATURE = 1e-30
PIPELINE_DEPTH = 2
GRAPH_FEED_MAX = 8        # greedy_continue feeds up to this many tokens through the decode graph
MAX_TREE_GRAPHS = 96      # verify forwards captured per tree size (sizes 1 .. budget + 1 recur)
SCORE_CHUNK = 64          # rows of logits per forward when every position's logits are needed


def _uses_penalties(p: SamplingParams) -> bool:
    return p.repeat_last_n > 0 and (p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0
                                    or p.presence_penalty != 0.0)


class CudaRunner(DecodeStep, DeviceTreeVerify, ModelRunner):   # decode_step.py; tree_verify.py: trees on the device
    def __init__(self, ops: CudaOps, cfg, weights, max_ctx: int, prefill_chunk: int = 512,
                 forward_path: str = "graph", tuning: ForwardTuning | None = None, kv_types=None,
                 max_tree_nodes: int | None = None):
        super().__init__(ops, cfg, weights, max_ctx, prefill_chunk, kv_types, max_tree_nodes)
        if forward_path not in FORWARD_PATHS:
            raise ValueError(f"forward_path must be one of {FORWARD_PATHS}, got {forward_path!r}")
        dev = self.dev = ops.dev
        # Decode steps and verify forwards: the per-op graph path, or (forward_path="persistent") the
        # persistent forward (one launch) where it can run this model; `forward_path` / `forward_note` say
        # which ran and why.
        self.persistent: PersistentForward | None = None
        self.forward_note = "configured"
        if forward_path == "persistent" and self.cache.spec.kv_types.quantized:
            self.forward_note = (f"the persistent forward reads a float16 KV cache only (--kv-type "
                                 f"{self.cache.spec.kv_types}): the per-op graph runs")
        elif forward_path == "persistent":
            try:
                self.persistent = PersistentForward(ops, cfg, weights, self.cache, tuning)
            except ForwardUnsupported as e:
                self.forward_note = str(e)
        self.forward_path = "persistent" if self.persistent is not None else "graph"
        ffi, lib = dev.ffi, dev.lib
        i32 = np.int32
        # prefill inputs (host-written per chunk)
        self.p_ids = dev.empty((prefill_chunk,), i32)
        self.p_pos = dev.empty((prefill_chunk,), i32)
        self.p_n_past = dev.empty((1,), i32)
        # decode state (device-resident; read by the captured graph): tok, pos, n_past, step, n_history
        # in one allocation, so that setting it is one upload (every upload synchronises the stream)
        self._state = dev.empty((len(STATE_FIELDS),), i32)
        self.tok, self.pos, self.n_past_dev, self.step, self.n_history = (self._state[i:i + 1]
                                                                          for i in range(len(STATE_FIELDS)))
        self.history = dev.empty((max_ctx + 1,), i32)
        self.sample_ws = dev.empty((max(int(lib.fd_sample_workspace_bytes(cfg.vocab_size)), 1),), np.uint8)
        ring = ffi.new("void**")
        dev.native.check(lib.fd_host_alloc(ring, RING_LEN * 4), "cudaHostAlloc(ring)")
        self._ring_ptr = ring[0]
        self.ring = np.frombuffer(ffi.buffer(self._ring_ptr, RING_LEN * 4), dtype=np.int32)
        self.events = []
        for _ in range(RING_LEN):
            e = ffi.new("void**")
            dev.native.check(lib.fd_event_create(e, 0), "cudaEventCreate")
            self.events.append(e[0])
        self.graphs: OrderedDict[object, object] = OrderedDict()
        self.tree_graphs: OrderedDict[tuple, tuple] = OrderedDict()   # (n nodes, capture, max_keys) -> (graph, logits)
        # tree verification inputs, sized once for the largest tree: the captured tree graphs read
        # these addresses, so they are never reallocated. One allocation per upload: [ids | positions
        # | n_past | mask bytes] for a verify forward, [n_past | offsets] for a commit.
        # a model that verifies no tree (max_tree_nodes 0: one loaded only to draft) keeps one-node buffers
        n_tree = self._tree_slots = max(self.max_tree_nodes, 1)
        self._t_inputs = dev.empty((tree_input_words(n_tree),), i32)
        self.t_ids, self.t_pos, self.t_n_past, self.t_mask = tree_input_views(self._t_inputs, n_tree)
        self._t_commit = dev.empty((n_tree + 1,), i32)
        self.c_n_past, self.t_offsets = self._t_commit[:1], self._t_commit[1:]
        self.t_argmax = dev.empty((n_tree,), i32)
        self._warm_up()

    @property
    def max_tree_nodes(self) -> int:
        """Trees up to the masked-attention workspace's size (MAX_MASKED_TOKENS), the arena's and the
        configured cap (ModelRunner: tree_nodes_cap, 0 for a model that only drafts)."""
        return _capped(min(self.prefill_chunk, MAX_MASKED_TOKENS), self.tree_nodes_cap)

    def drop_graphs(self) -> None:
        """Forget the captured graphs (they are recaptured on next use): needed when the shared
        arena or workspaces may have been reallocated, e.g. after loading another model on the
        same ops (a drafter)."""
        self.dev.synchronize()
        for g in self.graphs.values():
            self.dev.lib.fd_graph_destroy(g)
        self.graphs.clear()
        for g, _ in self.tree_graphs.values():
            self.dev.lib.fd_graph_destroy(g)
        self.tree_graphs.clear()

    def close(self) -> None:
        lib = self.dev.lib
        self.dev.synchronize()
        if self.persistent is not None:
            self.persistent.close()
        for g in self.graphs.values():
            lib.fd_graph_destroy(g)
        self.graphs.clear()
        for g, _ in self.tree_graphs.values():
            lib.fd_graph_destroy(g)
        self.tree_graphs.clear()
        for e in self.events:
            lib.fd_event_destroy(e)
        self.events = []
        if self._ring_ptr is not None:
            self.ring = None
            lib.fd_host_free(self._ring_ptr)
            self._ring_ptr = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- forward passes --------------------------------------------------------------------------
    def _forward_device(self, ids, *, all_logits: bool, hidden_sink=None):
        """Eager forward of a chunk; returns the logits as a device tensor (in the arena)."""
        n = len(ids)
        if n > self.p_ids.shape[0]:
            raise ValueError(f"chunk of {n} tokens > prefill buffer {self.p_ids.shape[0]}")
        self._will_write(n)
        dev = self.dev
        dev.upload(np.asarray(ids, np.int32), out=self.p_ids[:n])
        dev.upload(np.arange(self.n_past, self.n_past + n, dtype=np.int32), out=self.p_pos[:n])
        dev.upload(np.array([self.n_past], np.int32), out=self.p_n_past)
        self.ops.begin_forward()
        batch = Batch(ids=self.p_ids[:n], positions=self.p_pos[:n], n_past=self.p_n_past, n_tokens=n)
        logits = self._model_forward(self.ops, self.cfg, self.weights, self.cache, batch, all_logits=all_logits,
                                     hidden_sink=hidden_sink)      # models.dense.forward, or a hybrid's
        self.n_past += n
        return logits

    def _forward(self, ids, *, all_logits: bool, hidden_sink=None) -> np.ndarray:
        return self.dev.download(self._forward_device(ids, all_logits=all_logits, hidden_sink=hidden_sink))

    # -- speculative decoding: tree verify and commit (daemon/speculative/decoder.py) -------------------
    def forward_tree(self, ids, positions, mask, *, hidden_sink=None, capture=()):
        """ModelRunner.forward_tree. Without a hidden sink the forward replays a CUDA graph captured
        once per (n, capture); `capture`'s feature rows are device copies inside it (tree_features)."""
        n, capture = self._upload_tree(ids, positions, mask, capture)
        dev = self.dev
        if hidden_sink is not None:             # the sink runs host code per layer: eager
            return self._tree_body(n, hidden_sink, capture)
        graph, logits = self._tree_graph(n, capture)
        dev.native.check(dev.lib.fd_graph_launch(graph, dev.stream), "graph launch")
        return logits

    def _upload_tree(self, ids, positions, mask, capture) -> tuple[int, tuple]:
        """forward_tree's inputs checked (at most max_tree_nodes nodes; capture's layers, whose feature buffers are
        allocated here, never inside a capture) and uploaded in one staged copy (no synchronisation: the host goes
        on to launch the forward); returns (n, capture as ints)."""
        ids = np.asarray(ids, np.int32)
        n = len(ids)
        if n > self.max_tree_nodes:
            raise ValueError(f"a tree of {n} nodes > the {self.max_tree_nodes} the runner is sized for")
        capture = tuple(int(i) for i in capture)
        if capture:
            self.tree_features(capture)
        self._will_write(n)
        self.dev.upload_staged(pack_tree_inputs(ids, positions, mask, self.n_past, self._tree_slots), self._t_inputs)
        return n, capture

    def _feature_rows(self, n_layers: int) -> list:
        """One device allocation (n_layers * max_tree_nodes, hidden) float32, viewed per layer."""
        n = self.max_tree_nodes
        flat = self.dev.empty((n_layers * n, self.cfg.hidden), np.float32)
        return [flat[j * n:(j + 1) * n] for j in range(n_layers)]

    def _tree_body(self, n: int, hidden_sink=None, capture: tuple = (), max_keys: int = 0):
        """The verify forward of an n-node tree; max_keys > 0: every row sees at most that many keys (the shallow
        verify graph's bound, _tree_graph: its attention runs one split and no combine, the same bits)."""
        self.ops.begin_forward(row_invariant=True)      # every node's logits = a decode step's, bit for bit
        self.ops.attention_max_keys = max_keys
        try:
            return self._tree_rows(n, hidden_sink, capture)
        finally:
            self.ops.attention_max_keys = 0

    def _tree_rows(self, n: int, hidden_sink, capture: tuple):
        pf = self.persistent
        bufs = self.tree_features(capture) if capture else []
        index = {layer: j for j, layer in enumerate(capture)}
        # a sink that names its layers (the speculative decoder's) gets them from the persistent forward too
        sink_layers = getattr(hidden_sink, "layers", None) if hidden_sink is not None else frozenset()

        def keep(layer: int, h, row0: int) -> None:
            """Layer `layer`'s output rows row0 .. row0 + len(h) - 1: to the sink and/or the capture buffer."""
            if hidden_sink is not None and (sink_layers is None or layer in sink_layers):
                hidden_sink(layer, h)
            j = index.get(layer)
            if j is not None:                           # stream-ordered device copy: capturable in a graph
                h = self.ops.materialize(h)
                self.dev.copy(bufs[j][row0:row0 + h.shape[0]], h)

        if pf is not None and sink_layers is not None:
            layers = frozenset(sink_layers) | frozenset(capture)
            if n <= pf.max_rows:
                logits = pf.forward(self.t_ids[:n], self.t_pos[:n], self.t_n_past, mask=self.t_mask, mask_n=n,
                                    capture=layers)
                for layer in sorted(layers):
                    keep(layer, pf.captured(layer, n), 0)
                return logits
            # more rows than a launch holds: consecutive groups, ancestors first (the tree is in
            # topological order), each group's K/V in the cache before the next group attends to it
            logits = self.ops.take((n, self.cfg.vocab_size))
            for s in range(0, n, pf.max_rows):
                e = min(n, s + pf.max_rows)
                part = pf.forward(self.t_ids[s:e], self.t_pos[s:e], self.t_n_past, mask=self.t_mask, mask_n=n, row0=s,
                                  capture=layers)
                self.dev.copy(logits[s:e], part)
                for layer in sorted(layers):
                    keep(layer, pf.captured(layer, e - s), s)
            return logits
        batch = Batch(ids=self.t_ids[:n], positions=self.t_pos[:n], n_past=self.t_n_past,
                      mask=self.t_mask[:n * n].reshape(n, n), n_tokens=n)
        sink = hidden_sink
        if capture:
            def sink(layer: int, h) -> None:
                if hidden_sink is not None or layer in index:
                    keep(layer, h, 0)
        return self._model_forward(self.ops, self.cfg, self.weights, self.cache, batch, all_logits=True,
                                   hidden_sink=sink)

    def _tree_graph(self, n: int, capture: tuple = ()):
        """The verify forward of an n-node tree captured once per (n, capture) (inputs are read from
        t_ids, t_pos, t_mask, t_n_past; the arena and the tree_features buffers give the same addresses
        every replay). Returns (graph, the logits tensor the graph writes).
        A tree whose rows all see at most shallow_keys() keys (the committed n_past plus the tree's n rows) replays a
        shallow graph, captured with that max_keys bound, as the decode step's shallow graph (decode_step.py)."""
        bound = self.shallow_keys()
        max_keys = bound if bound and self.n_past + n <= bound else 0
        key = (n, capture, max_keys)
        hit = self.tree_graphs.get(key)
        if hit is not None:
            self.tree_graphs.move_to_end(key)
            return hit
        dev = self.dev
        self._tree_body(n, None, capture, max_keys)   # first use of this size's kernels (and setup): outside capture
        dev.synchronize()
        graph, logits = self._capture(lambda: self._tree_body(n, None, capture, max_keys))
        self.tree_graphs[key] = (graph, logits)
        if len(self.tree_graphs) > MAX_TREE_GRAPHS:
            _, (old, _) = self.tree_graphs.popitem(last=False)
            dev.lib.fd_graph_destroy(old)
        return graph, logits

    def argmax_rows(self, logits) -> np.ndarray:
        n = logits.shape[0]
        self.ops.argmax(logits, self.t_argmax[:n])
        out = self.dev.download(self.t_argmax[:n])
        if (out < 0).any():              # fd_argmax: -1 for a row of NaNs
            raise NonFiniteLogits(f"in verify row {int(np.flatnonzero(out < 0)[0])}")
        return out

    def logits_to_host(self, logits) -> np.ndarray:
        return self.dev.download(logits)

    def greedy_continue(self, feed, n_new: int) -> list[int]:
        """ModelRunner.greedy_continue with the decode graph. A short feed (a drafter's step: the new root, plus the
        tokens it had not cached) goes through the graph too: each feed token is written into `tok` before a replay
        (the replay's own choice is overwritten), so a step is len(feed) + n_new - 1 replays and one
        synchronisation. A long feed (the prompt) is prefilled eagerly first."""
        feed, dev, lib = [int(t) for t in feed], self.dev, self.dev.lib
        if (len(feed) - 1 if len(feed) <= GRAPH_FEED_MAX else 0) + n_new > RING_LEN:
            raise ValueError(f"greedy_continue: {n_new} tokens (and the feed's) > ring of {RING_LEN}")
        feed, n0, skip, _ = self._start_replays(feed, n_new)
        keys = n0 + len(feed)                           # the keys the next replay's row sees
        if len(feed) > GRAPH_FEED_MAX:
            self._set_state(n0 + len(feed) - 1, 0)      # advance() moves pos/n_past to the next slot
            logits = None
            for start in range(0, len(feed), self.prefill_chunk):
                logits = self._forward_device(feed[start:start + self.prefill_chunk], all_logits=False)
            self._select(logits, None)
            self._advance()
            keys += 1
        graphs = self._decode_graphs(None, keys)
        for r in range(n_new if len(feed) <= GRAPH_FEED_MAX else n_new - 1):
            dev.native.check(lib.fd_graph_launch(graphs(keys + r), dev.stream), "graph launch")
        dev.synchronize()
        self.n_past = n0 + len(feed) + n_new - 1
        tokens = [int(t) for t in self.ring[skip:skip + n_new]]
        if min(tokens) < 0:              # fd_argmax: -1 for a row of NaNs
            raise NonFiniteLogits(f"at continued step {tokens.index(min(tokens))}")
        return tokens

    def _start_replays(self, feed, n_new: int):
        """greedy_continue / greedy_stream's start: arguments checked, slots from n_past on given up, a short feed's
        tokens but the last replayed (the caller prefills a long one). -> (feed, n_past, ring entries to skip,
        the graph chooser of _decode_graphs or None)."""
        feed = [int(t) for t in feed]
        if n_new < 1 or not feed:
            raise ValueError("greedy_continue / greedy_stream need a non-empty feed and n_new >= 1")
        if self.n_past + len(feed) + n_new - 1 > self.max_ctx:
            raise ValueError(f"context overflow: {self.n_past} + {len(feed)} + {n_new - 1} > max_ctx {self.max_ctx}")
        dev, lib, n0 = self.dev, self.dev.lib, self.n_past
        self._overwrite_from(n0)
        if len(feed) > GRAPH_FEED_MAX:
            return feed, n0, 0, None
        self._set_state(n0, 0, tok=feed[0])
        graphs = self._decode_graphs(None, n0 + 1)
        for i, t in enumerate(feed[1:]):                # replay i forwards feed[i] at slot n0 + i
            dev.native.check(lib.fd_graph_launch(graphs(n0 + i + 1), dev.stream), "graph launch")
            dev.upload_staged(np.array([t], np.int32), self.tok)
        return feed, n0, len(feed) - 1, graphs

    def greedy_stream(self, feed, n_new: int) -> Iterator[int]:
        """ModelRunner.greedy_stream as generate() runs: replays of the decode graph with PIPELINE_DEPTH in flight,
        token k read from the ring once its event completes -- no synchronisation between tokens and none at the
        end of a run, so a run of plain steps costs what plain decoding does whatever its length (no ring limit).
        A short feed goes through the graph as in greedy_continue (its replays' ring entries are skipped); a long
        one (a prompt) is greedy_continue's."""
        if len(feed) > GRAPH_FEED_MAX:
            yield from self.greedy_continue(feed, n_new)
            return
        dev, lib = self.dev, self.dev.lib
        feed, n0, skip, graphs = self._start_replays(feed, n_new)
        launched = read = 0                             # of the n_new replays; replay j writes ring[skip + j]
        try:
            while read < n_new:
                while launched < n_new and launched - read < PIPELINE_DEPTH:
                    # replay j forwards slot n0 + skip + j: its row sees one key more
                    dev.native.check(lib.fd_graph_launch(graphs(n0 + skip + launched + 1), dev.stream),
                                     "graph launch")
                    dev.native.check(lib.fd_event_record(self.events[(skip + launched) % RING_LEN], dev.stream),
                                     "event record")
                    launched += 1
                slot = (skip + read) % RING_LEN
                dev.native.check(lib.fd_event_synchronize(self.events[slot]), "decode step")
                token = int(self.ring[slot])
                if token < 0:                           # fd_argmax: -1 for a row of NaNs
                    raise NonFiniteLogits(f"at continued step {read}")
                read += 1
                yield token
        finally:
            dev.synchronize()                           # nothing may still write the cache after this
            self.n_past = n0 + skip + launched          # the slots forwarded: the feed and all but the last token

    def commit_tree(self, node_offsets) -> None:
        offsets = np.asarray(node_offsets, np.int32)
        n = len(offsets)
        self._will_write(n)
        if np.any(offsets != np.arange(n)):
            if np.any(np.diff(offsets) <= 0) or np.any(offsets < np.arange(n)):
                raise ValueError(f"kv_compact offsets must increase with offsets[i] >= i, got {offsets.tolist()}")
            dev, spec = self.dev, self.cache.spec
            dev.upload_staged(np.concatenate([np.array([self.n_past], np.int32), offsets]), self._t_commit[:n + 1])
            if hasattr(self.cache, "compact"):            # a quantized K or V (kv_cache_quant.py)
                self.cache.compact(self.t_offsets, self.c_n_past, n)
                self.n_past += n
                return
            dev.native.check(dev.lib.fd_kv_compact(dev.p(self.cache.storage), dev.p(self.t_offsets),
                                                   dev.p(self.c_n_past), n, spec.n_layers, spec.n_kv_heads,
                                                   spec.max_ctx, spec.head_dim, dev.stream),
                             "fd_kv_compact")
        self.n_past += n

    def score(self, ids) -> np.ndarray:
        self.reset()
        try:
            return np.concatenate([self._forward(ids[s:s + SCORE_CHUNK], all_logits=True)
                                   for s in range(0, len(ids), SCORE_CHUNK)])
        finally:
            self.reset()

    # -- generation ------------------------------------------------------------------------------
    def _prefill_prompt(self, prompt):
        """ModelRunner.start with the logits left on the device: the cached prefix's chunks kept, the rest prefilled
        in chunks from there, and (a hybrid) a copy of the recurrent state taken at the prompt's last whole-chunk
        boundary, as start() takes it. Returns the last chunk's logits (1, vocab)."""
        n_keep = self._begin_prompt(prompt)
        n_prompt = len(prompt)
        mark = n_prompt - n_prompt % self.prefill_chunk
        logits = None
        for start in range(n_keep, n_prompt, self.prefill_chunk):
            logits = self._forward_device(prompt[start:start + self.prefill_chunk], all_logits=False)
            if self._state_prefix and self.reuse_prefix and self.n_past == mark:
                self.cache.mark_prefix_state(mark)
        self._end_prompt(prompt)
        return logits

    def generate(self, prompt: list[int], params: SamplingParams, max_new_tokens: int,
                 logprobs: int = 0) -> Iterator[Sampled]:
        greedy = params.greedy or params.temperature < TINY_TEMPERATURE
        if logprobs or max_new_tokens == 0 or (greedy and _uses_penalties(params)):
            # logprobs need the logits on the host; greedy-with-penalties has no device kernel
            yield from super().generate(prompt, params, max_new_tokens, logprobs)
            return
        dev, lib = self.dev, self.dev.lib
        sel = None if greedy else params
        n_prompt = len(prompt)
        dev.upload(np.asarray(prompt, np.int32), out=self.history[:n_prompt])
        self._set_state(n_prompt - 1, n_prompt)     # advance() moves pos/n_past to the new token's slot
        logits = self._prefill_prompt(prompt)
        self._select(logits, sel)
        self._advance()
        dev.native.check(lib.fd_event_record(self.events[0], dev.stream), "event record")
        graphs = self._decode_graphs(sel, n_prompt + 1)
        launched, read = 1, 0
        try:
            while read < max_new_tokens:
                while launched < max_new_tokens and launched - read < PIPELINE_DEPTH:
                    # replay `launched` forwards slot n_prompt + launched - 1: n_prompt + launched keys
                    dev.native.check(lib.fd_graph_launch(graphs(n_prompt + launched), dev.stream), "graph launch")
                    dev.native.check(lib.fd_event_record(self.events[launched % RING_LEN], dev.stream),
                                     "event record")
                    launched += 1
                dev.native.check(lib.fd_event_synchronize(self.events[read % RING_LEN]), "decode step")
                token = int(self.ring[read % RING_LEN])
                if token < 0:                # fd_argmax: -1 for a row of NaNs
                    raise NonFiniteLogits(f"at generation step {read}")
                read += 1
                yield Sampled(token)
        finally:
            dev.synchronize()        # nothing may still write the cache when the next request starts
            self.n_past = n_prompt + max(launched - 1, 0)
