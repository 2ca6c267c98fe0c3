"""FusedOps: the hybrid's (qwen35) fused ops on the GPU, one kernel each (native/include/flashd_recurrent.h and
flashd_linear.h, ABI 15). One name per op, kernel to C entry point to method:

    causal_conv1d_silu           fd_causal_conv1d_silu           (causal_conv1d.cu)
    causal_conv1d_silu_tree      fd_causal_conv1d_silu_tree      (causal_conv1d.cu)
    gated_delta_rule_fused       fd_gated_delta_rule_fused       (gated_delta_rule_fused.cu)
    gated_delta_rule_fused_tree  fd_gated_delta_rule_fused_tree  (gated_delta_rule_fused.cu)
    gated_qk_norm                fd_gated_qk_norm                (gated_qk_norm.cu)

What each computes is backends/base.py HybridFusedDefaults (the reference backend runs that composition of the
primitive ops, and is the oracle). The conv's SiLU is fd_silu's bits; the fused delta rule and the q/k norm have
bits of their own, equal to the composition within float32 rounding, and the same bits for the same row in every
form (decode, prefill, tree): a tree verify row equals the decode step at its position.

A decode step's Gated DeltaNet layer is then linear_multi -> conv -> fused delta rule -> ssm_out (4 launches, 10
before: silu, l2_norm x 2, delta_decay, sigmoid, rmsnorm and the gated product now run inside), and a gated
attention layer linear_multi -> gated_qk_norm -> attention (RoPE inside) -> sigmoid_mul -> output (5, 8 before:
the split's two copies and the two norms are one launch).

Two switches (attributes, as CudaOps.fuse_decode_rope; a captured graph keeps what it was captured with: drop the
runner's graphs after changing them): `fuse_hybrid` False runs every op as the composition (the unfused launches, for
an A/B of the decode step); `fused_delta_prefill` False (the default) runs a prefill (n > 1, no tree) of the delta
rule as the composition, whose fd_gated_delta_rule_prefill spreads over Hv * d_v / 32 blocks instead of Hv (its outputs are then
within rounding of the decode steps', not bitwise; a tree and a decode step stay fused and bitwise alike).

Shapes beyond the fused kernel's limits (d_k or d_v over FD_DELTA_FUSED_MAX_DK / _DV = 128: a block holds a whole
value head) run the composition (HybridFusedDefaults) instead. Every method checks shapes and dtypes here, before
the C ABI. No method synchronizes, uploads or downloads: a decode step stays capturable (hybrid_runner.py).

A mixin of CudaOps: needs self.dev, self.lib, self.take, self.p, self._check, self.materialize and RecurrentOps'
_conv_shapes.
"""
from __future__ import annotations

import numpy as np

from ..base import HybridFusedDefaults
from .recurrent_ops import _float32, _need, _parents, delta_scale

__all__ = ["FusedOps", "DELTA_FUSED_MAX_DK", "DELTA_FUSED_MAX_DV"]

DELTA_FUSED_MAX_DK = 128     # flashd_recurrent.h FD_DELTA_FUSED_MAX_DK
DELTA_FUSED_MAX_DV = 128     # flashd_recurrent.h FD_DELTA_FUSED_MAX_DV


class FusedOps(HybridFusedDefaults):
    fuse_hybrid = True              # False: every op below runs HybridFusedDefaults' composition
    # False (the default): n > 1 rows of gated_delta_rule_fused without a tree run the composition, whose prefill
    # kernel spreads over Hv * d_v / 32 blocks: the fused kernel's one block a value head made pp512 of the 0.8B
    # shape 3x slower (H200, session 15: 1,952 vs 383 us a layer at 512 tokens; bench_recurrent.py). Exactness does
    # not need prefill rows to be decode steps' bits (a tree and a decode step stay fused and bitwise alike).
    fused_delta_prefill = False

    # -- conv + SiLU -----------------------------------------------------------------------------------------
    def causal_conv1d_silu(self, x, weight, conv_state):
        """fd_causal_conv1d_silu: silu of the conv of x (n, C) after conv_state's K - 1 inputs; conv_state updated."""
        if not self.fuse_hybrid:
            return super().causal_conv1d_silu(x, weight, conv_state)
        x = self.materialize(x)
        n, channels, taps, w_ptr = self._conv_shapes(x, weight, conv_state)
        y = self.take((n, channels))
        self._check(self.lib.fd_causal_conv1d_silu(self.p(y), self.p(x), w_ptr, self.p(conv_state), n, channels,
                                                   taps, self.dev.stream), "fd_causal_conv1d_silu")
        return y

    def causal_conv1d_silu_tree(self, x, weight, conv_state, parents, node_conv):
        """fd_causal_conv1d_silu_tree: the tree conv (causal_conv1d_tree) with the SiLU on its outputs."""
        if not self.fuse_hybrid:
            return super().causal_conv1d_silu_tree(x, weight, conv_state, parents, node_conv)
        x = self.materialize(x)
        n, channels, taps, w_ptr = self._conv_shapes(x, weight, conv_state)
        _parents(parents, n)
        _float32(node_conv=node_conv)
        _need(node_conv.ndim == 3 and node_conv.shape[0] >= n and tuple(node_conv.shape[1:]) == (taps - 1, channels),
              f"causal_conv1d_silu_tree node_conv: (>= {n}, {taps - 1}, {channels}) expected, got "
              f"{tuple(node_conv.shape)}")
        y = self.take((n, channels))
        self._check(self.lib.fd_causal_conv1d_silu_tree(self.p(y), self.p(x), w_ptr, self.p(conv_state),
                                                        self.p(parents), self.p(node_conv), n, channels, taps,
                                                        self.dev.stream), "fd_causal_conv1d_silu_tree")
        return y

    # -- the fused gated delta rule --------------------------------------------------------------------------
    def _fused_args(self, qkv, alpha, beta, z, dt_bias, a, norm_weight, state, n_k_heads: int, head_dim: int,
                    what: str):
        """The checked, materialized inputs and the C arguments they give, or None where the shape is beyond the
        fused kernel (the caller composes the primitives): (q, k, v pointers, row stride, the tensors, n, Hk, Hv,
        S)."""
        qkv, alpha, beta, z, dt_bias, a, norm_weight = (self.materialize(t) for t in
                                                        (qkv, alpha, beta, z, dt_bias, a, norm_weight))
        _float32(qkv=qkv, alpha=alpha, beta=beta, z=z, dt_bias=dt_bias, a=a, norm_weight=norm_weight, state=state)
        S, hk = int(head_dim), int(n_k_heads)
        _need(qkv.ndim == 2 and alpha.ndim == 2, f"{what}: qkv (n, 2 Hk S + Hv S) and alpha (n, Hv) expected, got "
                                                 f"{tuple(qkv.shape)} and {tuple(alpha.shape)}")
        n, width = qkv.shape
        hv = alpha.shape[1]
        _need(hk > 0 and S > 0 and hv % hk == 0, f"{what}: {hv} value heads are not a multiple of {hk} key heads")
        _need(width == (2 * hk + hv) * S, f"{what}: qkv width {width}, (2 * {hk} + {hv}) * {S} expected")
        _need(tuple(alpha.shape) == (n, hv) and tuple(beta.shape) == (n, hv),
              f"{what}: alpha {tuple(alpha.shape)}, beta {tuple(beta.shape)}: ({n}, {hv}) expected")
        _need(z.size == n * hv * S and z.shape[0] == n, f"{what}: z {tuple(z.shape)}: ({n}, {hv * S}) expected")
        _need(tuple(dt_bias.shape) == (hv,) and tuple(a.shape) == (hv,),
              f"{what}: dt_bias {tuple(dt_bias.shape)}, a {tuple(a.shape)}: ({hv},) expected")
        _need(tuple(norm_weight.shape) == (S,), f"{what}: norm_weight {tuple(norm_weight.shape)}: ({S},) expected")
        _need(tuple(state.shape) == (hv, S, S), f"{what}: state {tuple(state.shape)}: ({hv}, {S}, {S}) expected")
        if S > DELTA_FUSED_MAX_DK or S > DELTA_FUSED_MAX_DV:
            return None
        flat = qkv.reshape(qkv.size)
        kd = hk * S
        ptrs = (self.p(flat), self.p(flat[kd:]), self.p(flat[2 * kd:]))     # q, k, v: rows `width` floats apart
        return ptrs, width, (alpha, beta, z, dt_bias, a, norm_weight), n, hk, hv, S

    def gated_delta_rule_fused(self, qkv, alpha, beta, z, dt_bias, a, norm_weight, state, n_k_heads: int,
                               head_dim: int, eps: float):
        """fd_gated_delta_rule_fused (HybridFusedDefaults.gated_delta_rule_fused): state (Hv, S, S) updated;
        returns (n, Hv, S). One token is the decode step, more run in order (the same arithmetic per token)."""
        # shapes checked whichever path runs (a composed prefill must refuse them before any launch, too)
        args = self.fuse_hybrid and self._fused_args(qkv, alpha, beta, z, dt_bias, a, norm_weight, state, n_k_heads,
                                                     head_dim, "gated_delta_rule_fused")
        if not args or not (self.fused_delta_prefill or qkv.shape[0] == 1):
            return super().gated_delta_rule_fused(qkv, alpha, beta, z, dt_bias, a, norm_weight, state, n_k_heads,
                                                  head_dim, eps)
        (qp, kp, vp), stride, tensors, n, hk, hv, S = args
        out = self.take((n, hv, S))
        self._check(self.lib.fd_gated_delta_rule_fused(
            self.p(out), qp, kp, vp, stride, *(self.p(t) for t in tensors), self.p(state), n, hk, hv, S, S,
            delta_scale(S), float(eps), float(eps), self.dev.stream), "fd_gated_delta_rule_fused")
        return out

    def gated_delta_rule_fused_tree(self, qkv, alpha, beta, z, dt_bias, a, norm_weight, state, parents, node_state,
                                    n_k_heads: int, head_dim: int, eps: float):
        """fd_gated_delta_rule_fused_tree: node i from its parent's memory, bit for bit the one-token
        gated_delta_rule_fused from that memory; state read only, node_state (>= n, Hv, S, S) written."""
        args = self.fuse_hybrid and self._fused_args(qkv, alpha, beta, z, dt_bias, a, norm_weight, state, n_k_heads,
                                                     head_dim, "gated_delta_rule_fused_tree")
        if not args:
            return super().gated_delta_rule_fused_tree(qkv, alpha, beta, z, dt_bias, a, norm_weight, state, parents,
                                                       node_state, n_k_heads, head_dim, eps)
        (qp, kp, vp), stride, tensors, n, hk, hv, S = args
        _parents(parents, n)
        _float32(node_state=node_state)
        _need(node_state.ndim == 4 and node_state.shape[0] >= n and tuple(node_state.shape[1:]) == (hv, S, S),
              f"gated_delta_rule_fused_tree node_state: (>= {n}, {hv}, {S}, {S}) expected, got "
              f"{tuple(node_state.shape)}")
        out = self.take((n, hv, S))
        self._check(self.lib.fd_gated_delta_rule_fused_tree(
            self.p(out), qp, kp, vp, stride, *(self.p(t) for t in tensors), self.p(state), self.p(parents),
            self.p(node_state), n, hk, hv, S, S, delta_scale(S), float(eps), float(eps), self.dev.stream),
            "fd_gated_delta_rule_fused_tree")
        return out

    # -- the gated attention's q/k norms ---------------------------------------------------------------------
    def gated_qk_norm(self, q_gate, k, q_norm, k_norm, eps: float) -> tuple:
        """fd_gated_qk_norm: q_gate (n, H, 2d), k (n, Hkv, d), q_norm and k_norm (d,) -> (q (n, H, d) normed,
        gate (n, H, d), k (n, Hkv, d) normed), one launch."""
        if not self.fuse_hybrid:
            return super().gated_qk_norm(q_gate, k, q_norm, k_norm, eps)
        q_gate, k, q_norm, k_norm = (self.materialize(t) for t in (q_gate, k, q_norm, k_norm))
        _float32(q_gate=q_gate, k=k, q_norm=q_norm, k_norm=k_norm)
        _need(q_gate.ndim == 3 and k.ndim == 3 and q_gate.shape[-1] % 2 == 0,
              f"gated_qk_norm: q_gate (n, H, 2d) and k (n, Hkv, d) expected, got {tuple(q_gate.shape)}, "
              f"{tuple(k.shape)}")
        n, H, d2 = q_gate.shape
        d = d2 // 2
        _need(k.shape[0] == n and k.shape[2] == d, f"gated_qk_norm: k {tuple(k.shape)} for q_gate {q_gate.shape}")
        _need(tuple(q_norm.shape) == (d,) and tuple(k_norm.shape) == (d,),
              f"gated_qk_norm: norm weights {tuple(q_norm.shape)}, {tuple(k_norm.shape)}: ({d},) expected")
        q, gate, kn = self.take((n, H, d)), self.take((n, H, d)), self.take(tuple(k.shape))
        self._check(self.lib.fd_gated_qk_norm(self.p(q), self.p(gate), self.p(kn), self.p(q_gate), self.p(k),
                                              self.p(q_norm), self.p(k_norm), n, H, k.shape[1], d, float(eps),
                                              self.dev.stream), "fd_gated_qk_norm")
        return q, gate, kn
