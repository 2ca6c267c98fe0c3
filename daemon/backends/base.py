"""The contract between models and backends.

Models (`flashd.daemon.models.dense`) are written once against `Ops`; a backend implements it.
Tensors are the backend's own type (numpy arrays for `reference`, device buffers for `cuda`) and
support `.shape` and `.reshape(*shape)` (a view, never a copy).

Shapes use this legend: n = new tokens in the forward, T = cache slots visible, H = query heads,
Hkv = key/value heads, d = head_dim, D = hidden width.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .kv_types import KVTypes

__all__ = ["Backend", "Batch", "HybridFusedDefaults", "KVCacheSpec", "Ops", "RecurrentStateSpec"]


@dataclass(slots=True)
class Batch:
    """The new tokens of one forward pass (ARCHITECTURE.md: "The backend contract").

    ids, positions: int32 (n,); n_past: int32 (1,) -- tensors, so a captured CUDA graph reads
    them from device memory. Token i writes its K/V to cache slot n_past + i and attends every
    committed slot < n_past plus the new tokens j with mask[i, j] (causal when mask is None).
    """

    ids: Any
    positions: Any
    n_past: Any
    mask: Any = None          # bool (n, n) or None for causal
    n_tokens: int = 0         # host copy of n, for shapes

    def __post_init__(self):
        if not self.n_tokens:
            self.n_tokens = int(self.ids.shape[0])


@dataclass(slots=True, frozen=True)
class KVCacheSpec:
    n_layers: int
    max_ctx: int      # slots per layer
    n_kv_heads: int
    head_dim: int
    kv_types: KVTypes = KVTypes()    # storage of K and V (kv_types.py): f16 or ggml's q8_0 / q4_0 blocks
    max_rows: int = 512              # the most rows one forward writes (a prefill chunk, a verified tree): a KV
                                     # window's ring holds window + max_rows (kv_types.window_slots)

    def __post_init__(self):
        for name in ("n_layers", "max_ctx", "n_kv_heads", "head_dim", "max_rows"):
            if getattr(self, name) <= 0:
                raise ValueError(f"KVCacheSpec.{name} must be positive")
        if not isinstance(self.kv_types, KVTypes):
            raise ValueError(f"KVCacheSpec.kv_types must be a KVTypes, got {self.kv_types!r}")
        self.kv_types.check_head_dim(self.head_dim)


@dataclass(slots=True, frozen=True)
class RecurrentStateSpec:
    """The recurrent state of a hybrid model's linear-attention layers (one sequence)."""

    n_layers: int        # linear-attention layers
    conv_kernel: int     # K: the conv state holds the K - 1 last inputs
    conv_channels: int   # C
    n_v_heads: int       # Hv: one S x S memory each
    head_dim: int        # S

    def __post_init__(self):
        for name in ("n_layers", "conv_kernel", "conv_channels", "n_v_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RecurrentStateSpec.{name} must be positive")


class Ops(Protocol):
    """What a model needs from a backend. Every op returns a new tensor."""

    name: str

    # -- memory ----------------------------------------------------------------------------------
    def load_weight(self, info) -> Any:
        """A GGUF tensor (TensorInfo) made resident in the backend's preferred form."""

    def kv_cache(self, spec: KVCacheSpec) -> Any:
        """Storage for K and V of every layer: `cache.layer(i)` is passed to `attention`;
        `cache.save_prefix(n)` returns a host copy of slots [0, n) (a numpy array; prefix reuse keeps
        it in RAM) and `cache.load_prefix(copy, n)` writes the first n slots of one back."""

    def from_numpy(self, array: np.ndarray) -> Any: ...

    def to_numpy(self, tensor) -> np.ndarray: ...

    def begin_forward(self, row_invariant: bool = False) -> None:
        """A new forward pass starts: scratch from the previous one may be reused. row_invariant:
        every row must come out exactly as it would in a one-row forward (speculative
        verification reproducing plain decoding bit for bit); a backend whose kernels already
        work row by row may ignore it."""

    def begin_layer(self, index: int) -> None:
        """Layer `index` starts (index == n_layers: the output head). Tensors made before the
        previous layer started are dead from here on, except what the model still holds (h)."""

    # -- math ------------------------------------------------------------------------------------
    def embed(self, table, ids) -> Any:
        """(n, D) rows of the embedding table."""

    def rmsnorm(self, x, weight, eps: float) -> Any:
        """x * rsqrt(mean(x^2 over the last axis) + eps) * weight; x (..., d), weight (d,)."""

    def linear(self, x, weight, bias=None, residual=None) -> Any:
        """x @ weight.T (+ bias) (+ residual); x (n, in), weight (out, in) -> (n, out)."""

    def linear_multi(self, x, weights, biases) -> tuple:
        """Several projections of one input (q, k, v): one launch where the backend can."""

    def linear_swiglu(self, x, w_gate, w_up) -> Any:
        """silu(x @ w_gate.T) * (x @ w_up.T): the first half of the SwiGLU MLP, fused."""

    def rope(self, x, positions, theta: float, rope_dim: int, neox: bool) -> Any:
        """Rotary embedding of the first rope_dim dims of each head; x (n, heads, d)."""

    def attention(self, q, k, v, cache_layer, batch: Batch) -> Any:
        """Write k, v (n, Hkv, d) to the cache, then softmax(q K^T / sqrt(d) + mask) V.

        q (n, H, d) -> (n, H * d). GQA: query head h reads key/value head h // (H // Hkv).
        """

    def kv_compact(self, cache, n_past: int, src_offsets) -> None:
        """Speculative decoding's commit, in place: for i in range(len(src_offsets)), in every
        layer, K and V of cache slot n_past + src_offsets[i] move to slot n_past + i.
        src_offsets (host int32) is strictly increasing with src_offsets[i] >= i, so copying in
        ascending i never reads a slot already overwritten."""

    def kv_write(self, k, v, cache_layer, start) -> None:
        """Store k (from `rope`) and v, (n, Hkv, d), in cache slots start[0] + i without attending:
        context K/V that no query of this forward needs (the DFlash drafter's KV injection)."""

    def swiglu(self, gate, up) -> Any:
        """silu(gate) * up, elementwise."""

    def gather_rows(self, table, ids, out) -> None:
        """out[i] = table[ids[i]], exact copies: table (R, C) and out (m, C) float32 tensors, ids an
        int32 (m,) tensor of row indices in [0, R) (the DFlash drafter keeps a verify forward's
        accepted feature rows on the device this way)."""

    # -- PFlash (the prefill drafter's forward; flashd.daemon.pflash) ----------------------------
    def flashprefill_attention(self, q, k, v, cache_layer, batch: Batch, step) -> Any:
        """Like `attention` (causal, batch.mask None) but FlashPrefill block-sparse: the chunk sits
        at slots [step.p0, step.p0 + n) with step.p0 a multiple of 128; each 128-token query block
        attends only the key blocks its block scores select (pflash.flashprefill.FlashPrefillStep)."""

    def tail_max_probs(self, q, cache_layer, n_keys: int, n_tail: int, acc) -> None:
        """acc (n_tail, n_keys) float32, in place: max(acc, max over heads of the dense causal
        attention probabilities of q's last n_tail rows), q as passed to the layer's attention."""

    def add(self, a, b) -> Any: ...

    # -- hybrid models (models/qwen35.py; CudaOps: cuda/recurrent_ops.py and cuda/hybrid_ops.py, which says which
    #    elementwise ops still run on the host) -----------------------------------------------------------------
    def recurrent_state(self, spec: RecurrentStateSpec) -> Any:
        """One sequence's conv and delta-rule state of every linear-attention layer: `layer(j)` is passed to
        the ops below, `save()` returns a host copy, `load(copy)` puts one back, `clear()` zeroes it;
        `tree_layer(j, n)` adds the node buffers of a draft tree's verify, `node_parents(parents)` gives a tree's
        parents (host int32) as the tree ops take them, and `keep_node(i)` commits node i."""

    def causal_conv1d(self, x, weight, conv_state) -> Any:
        """x (n, C), weight (C, K): y[t] = sum_k u[t + k] * weight[:, k] over u = (the K - 1 inputs in
        conv_state, then x); conv_state becomes the last K - 1 rows of u."""

    def gated_delta_rule(self, q, k, v, g, beta, state) -> Any:
        """q, k (n, Hk, S) L2-normed, v (n, Hv, S), g (log decay), beta (n, Hv), state (Hv, S, S) updated:
        the gated delta rule (backends/reference_recurrent.py) -> (n, Hv, S)."""

    def causal_conv1d_tree(self, x, weight, conv_state, parents, node_conv) -> Any:
        """A draft tree's nodes (x (n, C), parents (n,): parent index < i, -1 for the committed context): node i's
        output is the one-token causal_conv1d of x_i after its parent's window; conv_state is read only and
        node_conv (n, K - 1, C) gets each node's window (backends/reference_recurrent_tree.py)."""

    def gated_delta_rule_tree(self, q, k, v, g, beta, state, parents, node_state) -> Any:
        """A draft tree's nodes: node i's output is the recurrent (one-token) form's from its parent's memory,
        bit for bit a decode step along its root-to-node path; state is read only and node_state (n, Hv, S, S)
        gets each node's memory (backends/reference_recurrent_tree.py)."""

    def split(self, x, sizes) -> tuple:
        """x (..., sum(sizes)) -> its consecutive parts (..., sizes[i]) along the last axis, exact copies or
        views (a projection's per-head [query | gate], the conv output's q | k | v)."""

    def l2_norm(self, x, eps: float) -> Any: ...

    def delta_decay(self, alpha, dt_bias, a) -> Any:
        """softplus(alpha + dt_bias) * a, (n, Hv)."""

    def silu(self, x) -> Any: ...

    def sigmoid(self, x) -> Any: ...

    def mul(self, a, b) -> Any: ...

    # -- the hybrid's fused ops (HybridFusedDefaults composes them from the primitives above; CudaOps runs each as
    #    one kernel, cuda/fused_ops.py) -----------------------------------------------------------------------
    def causal_conv1d_silu(self, x, weight, conv_state) -> Any:
        """silu(causal_conv1d(x, weight, conv_state))."""

    def causal_conv1d_silu_tree(self, x, weight, conv_state, parents, node_conv) -> Any:
        """silu(causal_conv1d_tree(...))."""

    def gated_delta_rule_fused(self, qkv, alpha, beta, z, dt_bias, a, norm_weight, state, n_k_heads: int,
                               head_dim: int, eps: float) -> Any:
        """A Gated DeltaNet layer's core from the raw projections (HybridFusedDefaults says what) -> (n, Hv, S)."""

    def gated_delta_rule_fused_tree(self, qkv, alpha, beta, z, dt_bias, a, norm_weight, state, parents, node_state,
                                    n_k_heads: int, head_dim: int, eps: float) -> Any:
        """The same over a draft tree's nodes (gated_delta_rule_tree's state handling)."""

    def gated_qk_norm(self, q_gate, k, q_norm, k_norm, eps: float) -> tuple:
        """A gated attention layer's (rmsnorm(query) * q_norm, gate, rmsnorm(k) * k_norm) of q_gate (n, H, 2d)."""


class HybridFusedDefaults:
    """The hybrid's fused ops (models/qwen35.py) as compositions of the primitive ops: what they mean, and the
    implementation of every backend that has no fused kernel for them (the reference backend, the oracle, runs
    these). A backend with a fused kernel overrides the op (CudaOps: cuda/fused_ops.py) and keeps the same math;
    its bits are its own, equal to this composition within float32 rounding.

    Shapes: n tokens (tree nodes); Hk key heads, Hv value heads, S the head size (d_k = d_v = S); H, Hkv, d the
    attention's heads and head size."""

    def causal_conv1d_silu(self, x, weight, conv_state):
        """silu(causal_conv1d(x, weight, conv_state)): x (n, C), conv_state (K - 1, C) updated."""
        return self.silu(self.causal_conv1d(x, weight, conv_state))

    def causal_conv1d_silu_tree(self, x, weight, conv_state, parents, node_conv):
        """silu(causal_conv1d_tree(...)): node_conv gets the raw windows, conv_state is read only."""
        return self.silu(self.causal_conv1d_tree(x, weight, conv_state, parents, node_conv))

    def _fused_prologue(self, qkv, alpha, beta, dt_bias, a, n_k_heads: int, head_dim: int, eps: float):
        """(q, k, v, g, beta) as the delta rule takes them: q, k (n, Hk, S) L2-normed, v (n, Hv, S), the log decay
        g and sigmoid(beta) (n, Hv)."""
        n, hv, S = qkv.shape[0], alpha.shape[-1], head_dim
        kd = n_k_heads * S
        q, k, v = self.split(qkv, (kd, kd, hv * S))
        q = self.l2_norm(q.reshape(n, n_k_heads, S), eps)
        k = self.l2_norm(k.reshape(n, n_k_heads, S), eps)
        return q, k, v.reshape(n, hv, S), self.delta_decay(alpha, dt_bias, a), self.sigmoid(beta)

    def _fused_epilogue(self, o, z, norm_weight, eps: float):
        """The gated output norm: rmsnorm(o per head, norm_weight) * silu(z), (n, Hv, S)."""
        return self.mul(self.rmsnorm(o, norm_weight, eps), self.silu(z.reshape(o.shape)))

    def gated_delta_rule_fused(self, qkv, alpha, beta, z, dt_bias, a, norm_weight, state, n_k_heads: int,
                               head_dim: int, eps: float):
        """qkv (n, 2 Hk S + Hv S) the conv's output [q | k | v]; alpha, beta (n, Hv) raw; z (n, Hv S) the output
        gate; dt_bias, a (Hv,); norm_weight (S,); state (Hv, S, S) updated. Per token and value head (key head
        h % Hk): q, k L2-normed (eps), g = delta_decay(alpha, dt_bias, a), beta = sigmoid(beta), o = the gated delta
        rule, out = rmsnorm(o, norm_weight, eps) * silu(z) -> (n, Hv, S)."""
        q, k, v, g, b = self._fused_prologue(qkv, alpha, beta, dt_bias, a, n_k_heads, head_dim, eps)
        return self._fused_epilogue(self.gated_delta_rule(q, k, v, g, b, state), z, norm_weight, eps)

    def gated_delta_rule_fused_tree(self, qkv, alpha, beta, z, dt_bias, a, norm_weight, state, parents, node_state,
                                    n_k_heads: int, head_dim: int, eps: float):
        """gated_delta_rule_fused over a draft tree's nodes: state read only, node_state (>= n, Hv, S, S) gets each
        node's memory (gated_delta_rule_tree)."""
        q, k, v, g, b = self._fused_prologue(qkv, alpha, beta, dt_bias, a, n_k_heads, head_dim, eps)
        o = self.gated_delta_rule_tree(q, k, v, g, b, state, parents, node_state)
        return self._fused_epilogue(o, z, norm_weight, eps)

    def gated_qk_norm(self, q_gate, k, q_norm, k_norm, eps: float) -> tuple:
        """q_gate (n, H, 2d) each head's [query | output gate], k (n, Hkv, d), q_norm and k_norm (d,) ->
        (rmsnorm(query) * q_norm (n, H, d), gate (n, H, d), rmsnorm(k) * k_norm (n, Hkv, d))."""
        d = q_gate.shape[-1] // 2
        q, gate = self.split(q_gate, (d, d))
        return self.rmsnorm(q, q_norm, eps), gate, self.rmsnorm(k, k_norm, eps)


class Backend:
    """What the engine holds of a backend: its `name` and `ops`, `info()`, a memory `plan(cfg,
    weight_bytes, max_ctx, prefill_chunk, kv_types=None, max_tree_nodes=None)` checked by
    `check_fits(plan)` before anything is allocated, and `make_runner(cfg, weights, max_ctx,
    prefill_chunk, plan, kv_types=None, max_tree_nodes=None)` -- max_tree_nodes the same in both (the
    runner's cap on a verify tree, which sizes a hybrid's node states: runner.py).

    Runners that replay captured graphs (the CUDA decode and tree verify graphs) bake in the
    addresses of memory every model on the backend shares: the activation arena, the weight scratch
    and the attention workspace. Loading another model (a drafter), parking and PFlash may
    reallocate that memory, so the engine tells the backend when such graphs may be stale. The
    defaults here are for a backend that captures nothing.
    """

    name: str
    ops: Any

    def drop_graphs(self, runners) -> None:
        """Forget every graph these runners captured (None entries are skipped); they are captured
        again on next use. Called after something reallocated the shared memory."""

    def drop_stale_graphs(self, runners) -> None:
        """Drop these runners' graphs when the shared memory they bake in has been reallocated
        since the last call (the check before a speculative request's graph replays)."""
