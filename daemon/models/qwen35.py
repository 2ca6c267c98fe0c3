"""The qwen35 hybrid decoder (Qwen3.5 / Qwen3.6), written once against the backend `Ops`, as llama.cpp runs it
(src/models/qwen35.cpp, src/models/delta-net-base.cpp of the llama.cpp in llama-cpp-python 0.3.36).

    h = embed(ids)
    for each layer:  h = h + mixer(rmsnorm(h))              mixer: Gated DeltaNet, or every 4th layer gated attention
                     h = h + swiglu_mlp(rmsnorm(h))         (the norm is post_attention_norm)
    logits = lm_head(rmsnorm(h))

Gated DeltaNet (linear attention): q, k, v = silu(causal_conv1d(x Wqkv)) split into heads; q, k L2-normed;
per value head the gated delta rule with decay g = softplus(x Walpha + dt) * A and write strength
beta = sigmoid(x Wbeta); the output is RMS-normed per head, times silu(x Wgate), then projected (ssm_out).

Gated attention: Wq gives each head's query and an output gate; q and k are RMS-normed per head and rotated
over their first rope_dim dims (NeoX pairs); the attention output is multiplied by sigmoid(gate), then projected.

The cache (HybridCache) holds K/V for the attention layers and the recurrent state (conv + delta-rule memory)
for the linear ones. A forward that starts at slot 0 starts from a zero state; the state then follows the
tokens, so it cannot be cut back to a shorter prefix. Prefix reuse therefore keeps one copy of the state at a
prefill-chunk boundary of the last prompt (`mark_prefix_state`, the runner decides where) and may keep a prefix
of exactly that length only (runner.py). A draft tree's verify forward (batch.mask set) gives the linear layers a
state per tree node and keeps the accepted node's at the commit (qwen35_tree.py).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..backends.base import Batch, KVCacheSpec, RecurrentStateSpec
from .config import ModelConfig
from .dense import run_layers
from .qwen35_tree import MAX_TREE_NODES, TreeCacheView, TreeStateLayer, path_to, tree_parents
from .qwen35_weights import AttentionLayerWeights, LinearLayerWeights
from .weights import ModelWeights

__all__ = ["forward", "decoder_layer", "HybridCache", "HybridPrefix", "make_hybrid_cache"]


@dataclasses.dataclass(slots=True, frozen=True)
class HybridPrefix:
    """A host copy of a hybrid cache's first n_slots: the attention layers' K/V (the KV cache's save_prefix) and
    the recurrent state after exactly those slots, conv (n_linear, K - 1, C) and ssm (n_linear, Hv, S, S)."""

    n_slots: int
    kv: np.ndarray
    conv: np.ndarray
    ssm: np.ndarray
    whole_only = True             # usable only at n_slots: the state has no shorter prefixes (prefix_cache.py)

    @property
    def nbytes(self) -> int:
        return int(self.kv.nbytes + self.conv.nbytes + self.ssm.nbytes)


class HybridCache:
    """K/V of the full-attention layers (the backend's KV cache, indexed by attention layer) and the recurrent
    state of the linear-attention layers (one sequence). `layer(i)` is model layer i's part. The recurrent state
    is saved and restored whole (`save_state` / `load_state`: a host copy, e.g. per sequence). A prefix is kept
    only where a copy of the state was marked (`prefix_state_slots`). A draft tree's verify writes a state per
    node beside the live one (`tree_layer`), and the commit keeps one root-to-node path's (`keep_tree_path`)."""

    reusable_prefix = True        # at prefix_state_slots only (runner.py)

    def __init__(self, ops, cfg: ModelConfig, max_ctx: int, kv_types=None, max_tree_nodes: int | None = None,
                 max_rows: int = 512):
        """max_tree_nodes: the most nodes a verify forward may have, each one's state kept (qwen35_tree.py); None:
        MAX_TREE_NODES, 0: no tree is verified (a model loaded only to draft). The node buffers are allocated on the
        first verify and grow to the largest tree verified, never past this."""
        if max_tree_nodes is not None and (type(max_tree_nodes) is not int or max_tree_nodes < 0):
            raise ValueError(f"max_tree_nodes must be None or an int >= 0, got {max_tree_nodes!r}")
        self.max_tree_nodes = MAX_TREE_NODES if max_tree_nodes is None else max_tree_nodes
        lin = cfg.linear
        self._index = {}
        for j, i in enumerate(lin.attention_layers):
            self._index[i] = j
        for j, i in enumerate(lin.linear_layers):
            self._index[i] = j
        spec = KVCacheSpec(max(1, len(lin.attention_layers)), max_ctx, cfg.n_kv_heads, cfg.head_dim, max_rows=max_rows)
        self.kv = ops.kv_cache(spec if kv_types is None else dataclasses.replace(spec, kv_types=kv_types))
        self.state = ops.recurrent_state(RecurrentStateSpec(max(1, len(lin.linear_layers)), lin.conv_kernel,
                                                            lin.conv_channels, lin.n_v_heads, lin.head_dim))
        self._recurrent = lin.recurrent
        self._marked = None       # (n_slots, state.save()): the state after slots [0, n_slots), or None
        self._tree = None         # parents (n,) of the last tree forward while its node states are valid, or None

    @property
    def n_bytes(self) -> int:
        return self.kv.n_bytes + self.state.n_bytes

    def layer(self, i: int):
        return (self.state if self._recurrent[i] else self.kv).layer(self._index[i])

    def clear_state(self) -> None:
        self.state.clear()

    def save_state(self):
        return self.state.save()

    def load_state(self, saved) -> None:
        self.state.load(saved)
        self.end_tree()

    # -- the one reusable prefix: slots [0, prefix_state_slots) and the state after them ----------------
    @property
    def prefix_state_slots(self) -> int:
        """Slots whose state copy is kept (0: none)."""
        return 0 if self._marked is None else self._marked[0]

    def mark_prefix_state(self, n_slots: int) -> None:
        """The live state is the state after slots [0, n_slots) (a chunked prefill from slot 0): keep a copy."""
        self._marked = (n_slots, self.state.save())

    def forget_prefix_state(self, from_slot: int) -> None:
        """Slots >= from_slot are being overwritten: a copy for a longer prefix no longer matches the K/V."""
        if self._marked is not None and from_slot < self._marked[0]:
            self._marked = None

    def restore_prefix_state(self, n_slots: int) -> None:
        """The live state <- the kept copy (the context is cut back to slots [0, n_slots))."""
        if n_slots != self.prefix_state_slots:
            raise ValueError(f"no recurrent state kept at slot {n_slots} (kept: {self.prefix_state_slots})")
        self.state.load(self._marked[1])
        self.end_tree()

    def save_prefix(self, n_slots: int) -> HybridPrefix:
        if n_slots != self.prefix_state_slots:
            raise ValueError(f"no recurrent state kept at slot {n_slots} (kept: {self.prefix_state_slots})")
        conv, ssm = self._marked[1]
        return HybridPrefix(n_slots, self.kv.save_prefix(n_slots), conv.copy(), ssm.copy())

    def load_prefix(self, saved: HybridPrefix, n_slots: int) -> None:
        if n_slots != saved.n_slots:
            raise ValueError(f"a hybrid prefix of {saved.n_slots} slots cannot be kept at {n_slots}")
        self.kv.load_prefix(saved.kv, n_slots)
        self.state.load((saved.conv, saved.ssm))
        self.end_tree()
        self._marked = (n_slots, self.state.save())

    # -- a draft tree's verify and commit (qwen35_tree.py) ------------------------------------------------
    def tree_layer(self, i: int, parents: np.ndarray):
        """Model layer i's part of a tree forward over len(parents) nodes: K/V, or a TreeStateLayer."""
        if not self._recurrent[i]:
            return self.kv.layer(self._index[i])
        return TreeStateLayer(*self.state.tree_layer(self._index[i], len(parents)), self.state.node_parents(parents))

    def tree_done(self, parents: np.ndarray) -> None:
        """A tree forward over len(parents) nodes wrote their states: keep_tree_path may commit one path."""
        self._tree = parents

    def end_tree(self) -> None:
        """The node states are stale (a forward that is not a tree's, or a commit)."""
        self._tree = None

    def keep_tree_path(self, nodes) -> None:
        """Commit: the live state <- the state after nodes[-1] of the last tree forward, whose root-to-node path
        `nodes` must be (the K/V move is the caller's, Ops.kv_compact -> move)."""
        nodes = [int(i) for i in nodes]
        if self._tree is None:
            raise ValueError("no tree forward to commit: the node states are gone")
        if not nodes or nodes != path_to(self._tree, nodes[-1]):
            raise ValueError(f"nodes {nodes} are not a root-to-node path of the verified tree: a recurrent state "
                             "can only keep a path")
        self.state.keep_node(nodes[-1])
        self._tree = None

    def move(self, src_slots, dst_slots) -> None:
        """K/V of the attention layers (Ops.kv_compact); the recurrent state is kept by keep_tree_path."""
        self.kv.move(src_slots, dst_slots)


def make_hybrid_cache(ops, cfg: ModelConfig, max_ctx: int, kv_types=None,
                      max_tree_nodes: int | None = None, max_rows: int = 512) -> HybridCache:
    return HybridCache(ops, cfg, max_ctx, kv_types, max_tree_nodes, max_rows)


def gated_attention(ops, cfg: ModelConfig, x, w: AttentionLayerWeights, cache_layer, batch: Batch,
                    residual=None):
    """The gated attention's output, plus residual if given (the output projection's epilogue adds it)."""
    n, H, d = batch.n_tokens, cfg.n_heads, cfg.head_dim
    q_gate, k, v = ops.linear_multi(x, (w.attn_q, w.attn_k, w.attn_v), (None, None, None))   # one launch
    k = k.reshape(n, cfg.n_kv_heads, d)
    v = v.reshape(n, cfg.n_kv_heads, d)
    # per head [query | output gate] split, the query and k RMS-normed: one op (CUDA: one launch, fd_gated_qk_norm)
    q, gate, k = ops.gated_qk_norm(q_gate.reshape(n, H, 2 * d), k, w.attn_q_norm, w.attn_k_norm, cfg.rms_eps)
    q = ops.rope(q, batch.positions, cfg.rope_theta, cfg.rope_dim, True, cfg.rope_scaling)
    k = ops.rope(k, batch.positions, cfg.rope_theta, cfg.rope_dim, True, cfg.rope_scaling)
    o = ops.attention(q, k, v, cache_layer, batch)                  # (n, H d); CUDA: the RoPE runs inside
    return ops.linear(ops.mul(o, ops.sigmoid(gate.reshape(n, H * d))), w.attn_output, residual=residual)


def gated_delta_net(ops, cfg: ModelConfig, x, w: LinearLayerWeights, state_layer, batch: Batch, residual=None):
    """The Gated DeltaNet's output, plus residual if given (its output projection adds it). state_layer: (conv,
    memory), updated; or a draft tree's TreeStateLayer (qwen35_tree.py), a state per node. The four projections of x
    are one launch (ops.linear_multi)."""
    lin, n = cfg.linear, batch.n_tokens
    tree = state_layer if isinstance(state_layer, TreeStateLayer) else None
    conv_in, alpha, beta_in, z = ops.linear_multi(x, (w.attn_qkv, w.ssm_alpha, w.ssm_beta, w.attn_gate),
                                                  (None, None, None, None))
    # conv -> fused delta rule -> ssm_out: the L2 norms, the decay, the sigmoid and the gated output norm are
    # inside the fused op (backends/base.py HybridFusedDefaults composes it; CUDA: one kernel)
    core = (alpha, beta_in, z, w.ssm_dt, w.ssm_a, w.ssm_norm)
    if tree is None:
        conv_state, memory = state_layer
        qkv = ops.causal_conv1d_silu(conv_in, w.ssm_conv1d, conv_state)      # (n, 2 kd + Hv S)
        o = ops.gated_delta_rule_fused(qkv, *core, memory, lin.n_k_heads, lin.head_dim, cfg.rms_eps)
    else:
        qkv = ops.causal_conv1d_silu_tree(conv_in, w.ssm_conv1d, tree.conv, tree.parents, tree.node_conv)
        o = ops.gated_delta_rule_fused_tree(qkv, *core, tree.ssm, tree.parents, tree.node_ssm, lin.n_k_heads,
                                            lin.head_dim, cfg.rms_eps)
    return ops.linear(o.reshape(n, lin.value_dim), w.ssm_out, residual=residual)


def decoder_layer(ops, cfg: ModelConfig, h, w, cache_layer, batch: Batch):
    x = ops.rmsnorm(h, w.attn_norm, cfg.rms_eps)
    mixer = gated_delta_net if isinstance(w, LinearLayerWeights) else gated_attention
    h = mixer(ops, cfg, x, w, cache_layer, batch, h)
    x = ops.rmsnorm(h, w.post_attention_norm, cfg.rms_eps)
    return ops.linear(ops.linear_swiglu(x, w.ffn_gate, w.ffn_up), w.ffn_down, residual=h)


def forward(ops, cfg: ModelConfig, weights: ModelWeights, cache: HybridCache, batch: Batch, *,
            all_logits: bool = False, hidden_sink=None, new_sequence: bool | None = None):
    """Logits (n, vocab) for every new token, or (1, vocab) for the last one only (as models.dense.forward).
    With batch.mask (a draft tree's ancestor mask) the linear layers run a state per node (qwen35_tree.py) and the
    live state is left as it was; HybridCache.keep_tree_path commits one path.

    new_sequence: whether the forward starts a sequence (the state is cleared first); None reads batch.n_past
    back (0: it does). A caller that knows passes it: a forward captured in a CUDA graph must not read device
    memory on the host (CudaHybridRunner's decode step passes False and clears the state itself)."""
    cache.end_tree()
    if new_sequence is None:
        new_sequence = int(np.asarray(ops.to_numpy(batch.n_past))[0]) == 0
    if new_sequence:
        cache.clear_state()         # a forward from slot 0 starts a new sequence
    if batch.mask is not None:
        parents = tree_parents(ops.to_numpy(batch.mask))
        if len(parents) > cache.max_tree_nodes:
            raise ValueError(f"a tree of {len(parents)} nodes: a hybrid verifies at most {cache.max_tree_nodes}")
        logits = run_layers(ops, cfg, weights, TreeCacheView(cache, parents), batch, decoder_layer, all_logits,
                            hidden_sink)
        cache.tree_done(parents)
        return logits
    return run_layers(ops, cfg, weights, cache, batch, decoder_layer, all_logits, hidden_sink)
