"""The decode step of CudaRunner (runner.py), as a mixin: the body one captured CUDA graph runs -- forward of `tok`
at `pos`, token selection into `tok`, `fd_decode_advance` -- its capture, and the choice among the captured graphs.

Two decode graphs per sampling mode: the deep one, planned for max_ctx (split-K attention over a grid of splits,
then a combine kernel), and a shallow one for the first keys of a context (`shallow_keys`: as many as
fd_tuning_t.attn_single_chunks chunks hold, 256 by the table), captured with the attention shapes' max_keys bound,
so its attention runs one block per KV head and no combine -- the same bits, since no row that short is split. The
host knows each replay's position (one token a replay), so it picks the graph per replay (`_decode_graphs`).

Inside the body the fused decode attention of the first layer stores the step's RoPE cos / sin and the later layers
read them (CudaOps.rope_table_on; flashd_attention.h, fd_rope_t.table).
"""
from __future__ import annotations

import numpy as np

from ....protocol.messages import SamplingParams
from ...models.dense import forward
from ..base import Batch
from .attention_ops import DECODE_CHUNK_SLOTS
from .graphs import capture as capture_graph

__all__ = ["DecodeStep", "RING_LEN", "STATE_FIELDS", "MAX_CACHED_GRAPHS"]

RING_LEN = 64
MAX_CACHED_GRAPHS = 8
STATE_FIELDS = ("tok", "pos", "n_past", "step", "n_history")   # the decode state's words, in order


class DecodeStep:
    """Mixed into CudaRunner: uses its ops, dev, cfg, weights, cache, persistent, graphs, the decode state (tok,
    pos, n_past_dev, step, history, n_history, sample_ws, _state, _ring_ptr)."""

    def _select(self, logits, params: SamplingParams | None) -> None:
        """Token selection into self.tok (device); params None = greedy."""
        logits = logits.reshape(-1, self.cfg.vocab_size)[:1]           # the first row, as the step has one
        if params is None:
            self.ops.argmax(logits, self.tok)
        else:
            self.ops.sample(logits, self.tok, params, self.history, self.n_history, self.step, self.sample_ws)

    def _advance(self) -> None:
        lib, p = self.dev.lib, self.dev.p
        self.ops._check(lib.fd_decode_advance(p(self.tok), p(self.history), p(self.n_history), self._ring_ptr, RING_LEN,
                                              p(self.step), p(self.pos), p(self.n_past_dev),
                                              self.dev.stream), "fd_decode_advance")

    def _decode_body(self, params: SamplingParams | None, max_keys: int = 0) -> None:
        self.ops.begin_forward()
        if self.persistent is not None:
            # greedy: the forward's fused argmax writes the next token straight into tok (embed has read it)
            logits = self.persistent.forward(self.tok, self.pos, self.n_past_dev,
                                             argmax=self.tok if params is None else None)
            if params is not None:
                self._select(logits, params)
        else:
            batch = Batch(ids=self.tok, positions=self.pos, n_past=self.n_past_dev, n_tokens=1)
            # the shapes' bound (AttentionOps._shape) and the step's RoPE table (_rope_table_mode), this body only
            self.ops.attention_max_keys, self.ops.rope_table_on = max_keys, True
            try:
                logits = self._step_forward(batch)
            finally:
                self.ops.attention_max_keys, self.ops.rope_table_on = 0, False
            self._select(logits, params)
        self._advance()

    def _step_forward(self, batch: Batch):
        """The per-op decode step's forward of `tok` at `pos` (the graph's body: nothing here may read device
        memory on the host). models.dense.forward; CudaHybridRunner runs models.qwen35's."""
        return forward(self.ops, self.cfg, self.weights, self.cache, batch)

    def _set_state(self, n_past: int, n_history: int, tok: int = 0) -> None:
        state = dict(tok=tok, pos=n_past, n_past=n_past, step=0, n_history=n_history)
        self.dev.upload_staged(np.array([state[f] for f in STATE_FIELDS], np.int32), self._state)

    def _warm_up(self) -> None:
        """Run the step once eagerly (first-use kernel setup happens outside capture), then
        capture the greedy graph."""
        self._set_state(0, 0)
        self._decode_body(None)
        self.dev.synchronize()
        self._graph(None)
        bound = self.shallow_keys()
        if bound:
            self._graph(None, bound)

    def shallow_keys(self) -> int:
        """The keys a decode row may see for the shallow graph (module docstring): attn_single_chunks chunks of
        DECODE_CHUNK_SLOTS; 0 where there is none (the persistent forward plans its own attention)."""
        if self.persistent is not None:
            return 0
        return DECODE_CHUNK_SLOTS * self.dev.native.tuning()["attn_single_chunks"]

    def _decode_graphs(self, params: SamplingParams | None, first_keys: int):
        """The decode graph for a replay whose row sees `keys` keys, as a function of keys (both graphs captured
        here, before any replay of the run: none is captured while replays are in flight); first_keys: the
        run's first replay's (the shallow graph is not captured for a run that starts past it)."""
        bound = self.shallow_keys()
        deep = self._graph(params)
        if first_keys > bound:
            return lambda keys: deep
        shallow = self._graph(params, bound)
        return lambda keys: shallow if keys <= bound else deep

    def _graph(self, params: SamplingParams | None, max_keys: int = 0):
        """The decode graph of a sampling mode (None: greedy), captured on first use; max_keys > 0: the shallow
        one, whose rows see at most max_keys keys (its attention launches plan for them: flashd_attention.h)."""
        key = (params, max_keys)
        g = self.graphs.get(key)
        if g is not None:
            self.graphs.move_to_end(key)
            return g
        dev = self.dev
        graph, _ = self._capture(lambda: self._decode_body(params, max_keys))
        self.graphs[key] = graph
        if len(self.graphs) > MAX_CACHED_GRAPHS:     # the least recently used but the deep greedy graph
            old_key = next(k for k in self.graphs if k != (None, 0))
            dev.lib.fd_graph_destroy(self.graphs.pop(old_key))
        return graph

    def _capture(self, body):
        """(graph, body()) with body's launches captured from the stream (graphs.capture)."""
        return capture_graph(self.dev, body)
