"""The reference backend: numpy, float32, runs anywhere.

It is the oracle for every other backend and the CPU fallback, so each op is the textbook formula
with no shortcuts: weights are dequantized once by `gguf.quants.dequantize` (the project's
definition of what a quantized weight is), activations and the KV cache are float32 (a q8_0 / q4_0 KV
cache stores ggml's blocks and is read dequantized: reference_kv.py; a quantized K holds keys rotated by a
Hadamard transform, and q is rotated alike before it meets them: kv_rotate.py), and every matrix product
accumulates in float32 (BLAS).
"""
from __future__ import annotations

import numpy as np
from gguf.quants import dequantize

from .base import Batch, HybridFusedDefaults, KVCacheSpec, RecurrentStateSpec
from .kv_rotate import hadamard_rotate
from .reference_kv import ReferenceKVCache, WindowedRows, is_rotated
from .reference_recurrent import causal_conv1d, delta_rule_chunked, delta_rule_recurrent
from .reference_recurrent_tree import causal_conv1d_tree, delta_rule_tree

__all__ = ["ReferenceOps", "ReferenceKVCache", "ReferenceRecurrentState"]


def _window_block(k_cache, v_cache, n_past: int, n_ctx: int, batch: Batch):
    """(n, T) bool: query row i and key slot t lie in the same window block by position (KVTypes.window: those
    pairs read the full-precision copies), or None without a window. Slots below n_past hold the positions of their
    own number; the batch's rows (slots n_past..) are at batch.positions (a tree's nodes: by depth)."""
    window = next((c.window for c in (k_cache, v_cache) if isinstance(c, WindowedRows)), 0)
    if not window:
        return None
    q_pos = np.asarray(batch.positions, np.int64)
    k_pos = np.arange(n_ctx, dtype=np.int64)
    k_pos[n_past:] = q_pos
    return (k_pos[None, :] // window) == (q_pos[:, None] // window)


class ReferenceRecurrentState:
    """One sequence's state of every linear-attention layer: float32 conv (n_layers, K - 1, C) and delta-rule
    memory (n_layers, Hv, S, S). `save()` is a host copy, `load(copy)` puts one back, `clear()` zeroes both.

    A draft tree's verify forward writes a state per node into node buffers (`tree_layer`), conv (n_layers,
    nodes, K - 1, C) and memory (n_layers, nodes, Hv, S, S), grown to the largest tree verified so far and kept;
    `keep_node(i)` makes node i's the live state (the commit)."""

    def __init__(self, spec: RecurrentStateSpec):
        self.spec = spec
        self.conv = np.zeros((spec.n_layers, spec.conv_kernel - 1, spec.conv_channels), np.float32)
        self.ssm = np.zeros((spec.n_layers, spec.n_v_heads, spec.head_dim, spec.head_dim), np.float32)
        self.node_conv = np.zeros((spec.n_layers, 0) + self.conv.shape[1:], np.float32)
        self.node_ssm = np.zeros((spec.n_layers, 0) + self.ssm.shape[1:], np.float32)

    @property
    def n_bytes(self) -> int:
        """The live state's bytes (the node buffers are not counted: they follow the trees verified)."""
        return self.conv.nbytes + self.ssm.nbytes

    def layer(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        return self.conv[j], self.ssm[j]

    def tree_layer(self, j: int, n_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Layer j's (conv, memory, node conv (n_nodes, K - 1, C), node memory (n_nodes, Hv, S, S)) for a tree of
        n_nodes: the live state (read by the tree ops, not written) and the node buffers they write."""
        if self.node_conv.shape[1] < n_nodes:
            self.node_conv = np.zeros((self.spec.n_layers, n_nodes) + self.conv.shape[1:], np.float32)
            self.node_ssm = np.zeros((self.spec.n_layers, n_nodes) + self.ssm.shape[1:], np.float32)
        return self.conv[j], self.ssm[j], self.node_conv[j, :n_nodes], self.node_ssm[j, :n_nodes]

    def node_parents(self, parents: np.ndarray) -> np.ndarray:
        """The parents in the form the tree ops take: the host array itself."""
        return parents

    def keep_node(self, node: int) -> None:
        """The live state <- the state after tree node `node` of the last tree forward, every layer (a copy, no
        recomputation)."""
        self.conv[...] = self.node_conv[:, node]
        self.ssm[...] = self.node_ssm[:, node]

    def clear(self) -> None:
        self.conv.fill(0)
        self.ssm.fill(0)

    def save(self) -> tuple[np.ndarray, np.ndarray]:
        return self.conv.copy(), self.ssm.copy()

    def load(self, saved) -> None:
        self.conv[...], self.ssm[...] = saved


class ReferenceOps(HybridFusedDefaults):   # the hybrid's fused ops composed from the primitives below
    name = "reference"

    # -- memory ----------------------------------------------------------------------------------
    def load_weight(self, info) -> np.ndarray:
        w = dequantize(np.asarray(info.blocks), info.qtype)
        return np.ascontiguousarray(w.reshape(info.shape), dtype=np.float32)

    def kv_cache(self, spec: KVCacheSpec) -> ReferenceKVCache:
        return ReferenceKVCache(spec)

    def recurrent_state(self, spec: RecurrentStateSpec) -> ReferenceRecurrentState:
        return ReferenceRecurrentState(spec)

    def from_numpy(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def to_numpy(self, tensor) -> np.ndarray:
        return np.asarray(tensor)

    def begin_forward(self, row_invariant: bool = False) -> None:
        pass   # not honoured: several rows go through BLAS gemm and one through gemv (last-bit differences)

    def begin_layer(self, index: int) -> None:
        pass

    # -- math ------------------------------------------------------------------------------------
    def embed(self, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return table[ids.astype(np.int64)]

    def rmsnorm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
        return (x / np.sqrt(ms + np.float32(eps))) * weight

    def linear(self, x, weight, bias=None, residual=None) -> np.ndarray:
        y = x @ weight.T if x.shape[0] > 1 else (weight @ x[0])[None, :]  # gemv for one row
        if bias is not None:
            y = y + bias
        if residual is not None:
            y = y + residual
        return y

    def linear_multi(self, x, weights, biases) -> tuple:
        return tuple(self.linear(x, w, b) for w, b in zip(weights, biases))

    def linear_swiglu(self, x, w_gate, w_up) -> np.ndarray:
        return self.swiglu(self.linear(x, w_gate), self.linear(x, w_up))

    def rope(self, x: np.ndarray, positions: np.ndarray, theta: float, rope_dim: int,
             neox: bool, scaling=None) -> np.ndarray:
        """scaling: a models.config.RopeScaling (linear / YaRN, llama.cpp's rope_yarn) or None."""
        cos, sin = self.rope_cos_sin(positions, theta, rope_dim, scaling)
        cos, sin = cos[:, None, :], sin[:, None, :]          # (n, 1, half)
        half = rope_dim // 2
        out = x.copy()
        if neox:   # pairs (i, i + half)
            a, b = x[..., :half], x[..., half:rope_dim]
            out[..., :half] = a * cos - b * sin
            out[..., half:rope_dim] = a * sin + b * cos
        else:      # adjacent pairs (2i, 2i + 1)
            a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
            out[..., 0:rope_dim:2] = a * cos - b * sin
            out[..., 1:rope_dim:2] = a * sin + b * cos
        return out

    @staticmethod
    def rope_cos_sin(positions: np.ndarray, theta: float, rope_dim: int, scaling=None):
        """float32 (n, rope_dim / 2) cos and sin of every pair j at every position, formed in float64.

        Plain: angle = pos * theta^(-2j / rope_dim). Scaled (RopeScaling.rope_params, the arithmetic of
        llama.cpp's rope_yarn in float64): e = that angle, i = freq_scale * e; with ext_factor != 0,
        mix = (1 - clamp((j - low) / max(0.001, high - low), 0, 1)) * ext_factor and angle = i * (1 - mix)
        + e * mix, else angle = i; cos / sin are cos(angle) * mscale and sin(angle) * mscale, rounded to
        float32 once. The CUDA kernels (native/cuda/rope_math.cuh) repeat these float64 operations one by
        one, unfused."""
        half = rope_dim // 2
        inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rope_dim)
        angle = positions.astype(np.float64)[:, None] * inv_freq[None, :]
        if scaling is None:
            return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
        freq_scale, ext_factor, low, high, mscale = scaling.rope_params(rope_dim, theta)
        interp = freq_scale * angle
        if ext_factor != 0.0:
            y = (np.arange(half, dtype=np.float64) - low) / max(0.001, high - low)
            mix = (1.0 - np.minimum(1.0, np.maximum(0.0, y))) * ext_factor
            angle = interp * (1.0 - mix)[None, :] + angle * mix[None, :]
        else:
            angle = interp
        return (np.cos(angle) * mscale).astype(np.float32), (np.sin(angle) * mscale).astype(np.float32)

    @staticmethod
    def _rotated(k_cache, *xs):
        """xs (q and/or k after RoPE) as the K cache needs them: Hadamard-rotated over each head if it stores
        rotated keys (a quantized K: kv_rotate.py), else unchanged."""
        return tuple(hadamard_rotate(x) for x in xs) if is_rotated(k_cache) else xs

    @classmethod
    def _rotated_qk(cls, k_cache, q, k):
        """q and k (after RoPE) as the K cache needs them: (_rotated(q), _rotated_keys(k))."""
        return cls._rotated(k_cache, q)[0], cls._rotated_keys(k_cache, k)

    @classmethod
    def _rotated_keys(cls, k_cache, k):
        """k (after RoPE) as the K cache stores it: less the cache's key offset if it has one (a float32
        subtraction, kv_offset.py; only a rotated K has one), then rotated as _rotated does."""
        offset = getattr(k_cache, "offset", None)
        if offset is not None and is_rotated(k_cache):
            k = (k - offset).astype(np.float32, copy=False)
        return cls._rotated(k_cache, k)[0]

    def attention(self, q, k, v, cache_layer, batch: Batch) -> np.ndarray:
        k_cache, v_cache = cache_layer
        q, k = self._rotated_qk(k_cache, q, k)
        n, n_heads, head_dim = q.shape
        n_kv_heads = k.shape[1]
        n_past = int(batch.n_past[0])
        if n_past + n > k_cache.shape[0]:
            raise ValueError(f"KV cache overflow: {n_past} + {n} > {k_cache.shape[0]} slots")
        k_cache[n_past:n_past + n] = k
        v_cache[n_past:n_past + n] = v
        n_ctx = n_past + n
        keys = k_cache[:n_ctx]                                   # (T, Hkv, d)
        values = v_cache[:n_ctx]
        visible = np.ones((n, n_ctx), dtype=bool)                # (n, T)
        new = np.tril(np.ones((n, n), bool)) if batch.mask is None else np.asarray(batch.mask, bool)
        visible[:, n_past:] = new
        group = n_heads // n_kv_heads
        qg = q.reshape(n, n_kv_heads, group, head_dim)
        scale = np.float32(1.0 / np.sqrt(head_dim))
        scores = np.einsum("nkgd,tkd->kgnt", qg, keys) * scale
        near = _window_block(k_cache, v_cache, n_past, n_ctx, batch)      # (n, T) or None: full-precision pairs
        if near is not None and isinstance(k_cache, WindowedRows):
            scores = np.where(near[None, None], np.einsum("nkgd,tkd->kgnt", qg, k_cache.full[:n_ctx]) * scale, scores)
        scores = np.where(visible[None, None], scores, np.float32(-np.inf))
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        if near is not None and isinstance(v_cache, WindowedRows):
            out = (np.einsum("kgnt,tkd->nkgd", np.where(near[None, None], 0.0, probs).astype(np.float32), values)
                   + np.einsum("kgnt,tkd->nkgd", np.where(near[None, None], probs, 0.0).astype(np.float32),
                               v_cache.full[:n_ctx]))
        else:
            out = np.einsum("kgnt,tkd->nkgd", probs, values)
        return out.reshape(n, n_heads * head_dim).astype(np.float32, copy=False)

    def flashprefill_attention(self, q, k, v, cache_layer, batch: Batch, step) -> np.ndarray:
        """FlashPrefill attention of a chunk at slots [step.p0, step.p0 + n) (pflash.flashprefill):
        write k, v to the cache, then attend each query block's selected key blocks only."""
        from ..pflash.flashprefill import flashprefill_attention
        k_cache, v_cache = cache_layer
        q, k = self._rotated_qk(k_cache, q, k)
        n, _, head_dim = q.shape
        if step.p0 + n > k_cache.shape[0]:
            raise ValueError(f"KV cache overflow: {step.p0} + {n} > {k_cache.shape[0]} slots")
        k_cache[step.p0:step.p0 + n] = k
        v_cache[step.p0:step.p0 + n] = v
        out = flashprefill_attention(q, k_cache, v_cache, step.p0, 1.0 / np.sqrt(head_dim), alpha=step.alpha,
                                     sink=step.sink_blocks, window=step.window_blocks,
                                     first_full_block=step.first_full_block)
        return out.astype(np.float32)

    def tail_max_probs(self, q, cache_layer, n_keys: int, n_tail: int, acc: np.ndarray) -> None:
        """acc (n_tail, n_keys) = max(acc, max over heads of the dense causal attention
        probabilities of the last n_tail rows of q (slots n_keys - n_tail + t))."""
        from ..pflash.flashprefill import tail_max_probs
        (q,) = self._rotated(cache_layer[0], q)
        probs = tail_max_probs(q[-n_tail:], cache_layer[0], n_keys, 1.0 / np.sqrt(q.shape[-1]))
        np.maximum(acc, probs.astype(np.float32), out=acc)

    def kv_compact(self, cache: ReferenceKVCache, n_past: int, src_offsets) -> None:
        """Slot n_past + i <- slot n_past + src_offsets[i] in every layer, K and V."""
        src = n_past + np.asarray(src_offsets, np.int64)
        cache.move(src, n_past + np.arange(len(src)))

    def kv_write(self, k, v, cache_layer, start) -> None:
        k_cache, v_cache = cache_layer
        k = self._rotated_keys(k_cache, k)
        s, n = int(start[0]), k.shape[0]
        if s < 0 or s + n > k_cache.shape[0]:
            raise ValueError(f"KV cache overflow: slots {s}..{s + n} outside {k_cache.shape[0]}")
        k_cache[s:s + n] = k
        v_cache[s:s + n] = v

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        sigmoid = np.float32(0.5) * (np.float32(1.0) + np.tanh(np.float32(0.5) * gate))  # no overflow
        return gate * sigmoid * up

    def add(self, a, b) -> np.ndarray:
        return a + b

    def gather_rows(self, table, ids, out) -> None:
        out[...] = table[np.asarray(ids, np.int64)]

    # -- hybrid models (Gated DeltaNet layers and gated attention; models/qwen35.py) ------------------------
    def causal_conv1d(self, x, weight, conv_state) -> np.ndarray:
        """The short causal convolution over x (n, C) after the K - 1 inputs held in conv_state (updated)."""
        return causal_conv1d(x, weight, conv_state)

    def gated_delta_rule(self, q, k, v, g, beta, state) -> np.ndarray:
        """One token: the recurrent form; more: the chunked form (reference_recurrent.py). state updated."""
        rule = delta_rule_recurrent if q.shape[0] == 1 else delta_rule_chunked
        return rule(q, k, v, g, beta, state)

    def causal_conv1d_tree(self, x, weight, conv_state, parents, node_conv) -> np.ndarray:
        """The conv over the nodes of a draft tree, each after its parent's window (reference_recurrent_tree.py):
        conv_state read only, node i's window written to node_conv[i]."""
        return causal_conv1d_tree(x, weight, conv_state, parents, node_conv)

    def gated_delta_rule_tree(self, q, k, v, g, beta, state, parents, node_state) -> np.ndarray:
        """The recurrent form over the nodes of a draft tree, each from its parent's memory
        (reference_recurrent_tree.py): state read only, node i's memory written to node_state[i]."""
        return delta_rule_tree(q, k, v, g, beta, state, parents, node_state)

    def split(self, x, sizes) -> tuple:
        """x (..., sum(sizes)) -> its consecutive parts (..., sizes[i]) along the last axis (views)."""
        return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=-1))

    def silu(self, x) -> np.ndarray:
        return x * (np.float32(0.5) * (np.float32(1.0) + np.tanh(np.float32(0.5) * x)))

    def sigmoid(self, x) -> np.ndarray:
        return np.float32(0.5) * (np.float32(1.0) + np.tanh(np.float32(0.5) * x))

    def l2_norm(self, x, eps: float) -> np.ndarray:
        """x / sqrt(sum(x^2 over the last axis) + eps) (llama.cpp's build_gdn_l2_norm)."""
        return x / np.sqrt(np.sum(np.square(x), axis=-1, keepdims=True, dtype=np.float32) + np.float32(eps))

    def delta_decay(self, alpha, dt_bias, a) -> np.ndarray:
        """g = softplus(alpha + dt_bias) * a (a = -exp(A_log) < 0): the log of each token's decay, (n, Hv)."""
        z = alpha + dt_bias
        return np.where(z > 20, z, np.log1p(np.exp(np.minimum(z, 20)))).astype(np.float32) * a

    def mul(self, a, b) -> np.ndarray:
        return a * b
