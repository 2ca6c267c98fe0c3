"""The target model's forward in torch, from its GGUF: what training needs of it.

Weights: every tensor dequantized with the reference backend's loader (gguf.quants.dequantize -> float32) and
moved to the device in `dtype` (bfloat16 on the GPU, float32 on the CPU for the tests). The layers are
models/dense.py's (llama, qwen2 with q/k/v biases, qwen3 with q/k RMSNorm), the RoPE tables are the reference
backend's own `rope_cos_sin` (plain and scaled RoPE, formed in float64, rounded to float32 once), so on the CPU in
float32 this computes the reference backend's function (tests/train/test_target_torch.py checks logits and the
captured layer outputs).

Shapes: N sequences, T positions, D hidden, H / Hkv heads of d; layer outputs are the residual stream after
the layer (HF hidden_states[i + 1]), which is what the daemon's feature sink captures for the drafter.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import open_model
from flashd.daemon.models.weights import load_weights

from . import require_torch

torch = require_torch()
F = torch.nn.functional

__all__ = ["TorchTarget", "rmsnorm", "rope", "rope_tables", "attend", "decode_attend", "DECODE_ATTENTION",
           "target_layer", "compile_layer"]


def rmsnorm(x, w, eps: float):
    """x / sqrt(mean(x^2) + eps) * w over the last axis, by F.rms_norm: one fused kernel where torch has one (the
    composite of casts, powers, means and products it replaces moved ~40 bytes an element; a training step spent
    ~45 of ~125 ms in such elementwise work). x and w of one dtype: that dtype's kernel, which sums in float32
    (float32 on the CPU tests: bitwise the composite); mixed (the drafter's float32 weights under autocast):
    float32 arithmetic, the result in x's dtype."""
    if x.dtype != w.dtype:
        return F.rms_norm(x.float(), (x.shape[-1],), w.float(), eps).to(x.dtype)
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def rope_tables(n_pos: int, theta: float, rope_dim: int, scaling, device):
    """(cos, sin) float32 (n_pos, rope_dim / 2): ReferenceOps.rope_cos_sin at positions 0 .. n_pos-1."""
    cos, sin = ReferenceOps.rope_cos_sin(np.arange(n_pos, dtype=np.int64), theta, rope_dim, scaling)
    return torch.from_numpy(cos).to(device), torch.from_numpy(sin).to(device)


def rope(x, positions, cos, sin, rope_dim: int, neox: bool):
    """x (..., T, heads, d) rotated at int64 positions (..., T): NeoX pairs (i, i + half) or adjacent pairs."""
    c = cos[positions].unsqueeze(-2).to(x.dtype)     # (..., T, 1, half)
    s = sin[positions].unsqueeze(-2).to(x.dtype)
    half = rope_dim // 2
    if neox:
        a, b = x[..., :half], x[..., half:rope_dim]
        rot = torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    else:
        a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        rot = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    return torch.cat([rot, x[..., rope_dim:]], dim=-1) if rope_dim < x.shape[-1] else rot


def attend(q, k, v, mask=None, causal: bool = False):
    """Softmax attention, scale 1/sqrt(d). q (N, Tq, H, d), k/v (N, Tk, Hkv, d) (GQA: query head h reads KV head
    h // (H / Hkv), as the reference groups them); mask bool (N, Tq, Tk) or None; -> (N, Tq, H * d)."""
    n, tq, h, d = q.shape
    hkv = k.shape[2]
    group = h // hkv
    if tq == 1 and mask is not None:    # a decode step: group the query heads instead of copying K/V per head
        s = torch.einsum("nqkgd,ntkd->nkgqt", q.view(n, 1, hkv, group, d), k).float() * d ** -0.5
        p = s.masked_fill(~mask[:, None, None], float("-inf")).softmax(-1).to(v.dtype)   # (N, Hkv, g, 1, Tk)
        return torch.einsum("nkgqt,ntkd->nqkgd", p, v).reshape(n, 1, h * d)
    if group > 1:
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=None if mask is None else mask.unsqueeze(1), is_causal=causal)
    return o.transpose(1, 2).reshape(n, tq, h * d)


DECODE_ATTENTION = ("matmul", "kq", "sdpa")


def decode_attend(q, k, v, key_mask, how: str = "matmul"):
    """One query row per sequence over a cache in (N, Hkv, T, d) layout: q (N, 1, H, d), key_mask bool (N, T) ->
    (N, 1, H * d); query head h reads KV head h // (H / Hkv). `how` (DECODE_ATTENTION) picks the kernels, the
    function is the same (TorchTarget's default, sdpa, measured fastest: H100, synthetic 1.5B shapes, 256 sequences,
    graph replay, 21,412 answer tok/s against kq 19,792 and matmul 11,182; bench/bench_train_gen.py --attention):
        matmul  scores q k^T and p v as batched matmuls reading the cache in place (scores in the cache dtype,
                softmax in float32, as attend)
        kq      the same with the scores as k q^T (T x group per KV head: the cache operand untransposed; on an
                H200 q k^T ran on a slow MAGMA batched GEMM, 8.5 of a ~20 ms generation step)
        sdpa    F.scaled_dot_product_attention with enable_gqa: one fused kernel where the backend has one for a
                boolean mask (its own rounding)"""
    n, _, h, d = q.shape
    hkv = k.shape[1]
    if how == "sdpa":
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=key_mask[:, None, None, :],
                                           enable_gqa=True)                                   # (N, H, 1, d)
        return o.transpose(1, 2).reshape(n, 1, h * d)
    qg = q.reshape(n, hkv, h // hkv, d)
    if how == "kq":
        s = torch.matmul(k, qg.transpose(-1, -2)).float() * d ** -0.5                          # (N, Hkv, T, g)
        p = s.masked_fill(~key_mask[:, None, :, None], float("-inf")).softmax(-2).to(v.dtype)
        return torch.matmul(p.transpose(-1, -2), v).reshape(n, 1, h * d)
    if how != "matmul":
        raise ValueError(f"decode attention {how!r}: one of {', '.join(DECODE_ATTENTION)}")
    s = torch.matmul(qg, k.transpose(-1, -2)).float() * d ** -0.5                              # (N, Hkv, g, T)
    p = s.masked_fill(~key_mask[:, None, None, :], float("-inf")).softmax(-1).to(v.dtype)
    return torch.matmul(p, v).reshape(n, 1, h * d)


# -- one layer as a function of tensors (torch.compile fuses its elementwise work; see compile_layer) -------------
def qkv_heads(x, positions, cos, sin, wq, wk, wv, bq, bk, bv, q_norm, k_norm, *, n_heads: int, n_kv_heads: int,
              head_dim: int, rope_dim: int, neox: bool, eps: float):
    """x (N, T, D) -> q (N, T, H, d), k / v (N, T, Hkv, d): projections (biases None when absent), q/k RMSNorm
    per head when q_norm / k_norm are given (qwen3), RoPE at int64 positions (N, T) from the (cos, sin) tables."""
    n, t = x.shape[:2]
    q, k, v = F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)
    q = q.view(n, t, n_heads, head_dim)
    k = k.view(n, t, n_kv_heads, head_dim)
    v = v.view(n, t, n_kv_heads, head_dim)
    if q_norm is not None:
        q, k = rmsnorm(q, q_norm, eps), rmsnorm(k, k_norm, eps)
    q = rope(q, positions, cos, sin, rope_dim, neox)
    k = rope(k, positions, cos, sin, rope_dim, neox)
    return q, k, v


def mlp(h, ffn_norm, gate, up, down, eps: float):
    """h (N, T, D) + down(silu(gate(x)) * up(x)), x = ffn_norm(h): the SwiGLU block with its residual."""
    x = rmsnorm(h, ffn_norm, eps)
    return h + F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def target_layer(h, positions, cos, sin, attn_norm, wq, wk, wv, bq, bk, bv, q_norm, k_norm, wo, ffn_norm, gate,
                 up, down, *, n_heads: int, n_kv_heads: int, head_dim: int, rope_dim: int, neox: bool, eps: float):
    """One causal layer over full sequences: h (N, T, D) at positions (N, T) -> the residual stream after it.
    The layer's tensors in this order (TorchTarget._layer_tensors; biases and q/k norms None when the model has
    none); the keywords are the config's constants. TorchTarget.forward calls it once a layer, eagerly or
    compiled (compile_layer)."""
    q, k, v = qkv_heads(rmsnorm(h, attn_norm, eps), positions, cos, sin, wq, wk, wv, bq, bk, bv, q_norm, k_norm,
                        n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, rope_dim=rope_dim, neox=neox,
                        eps=eps)
    h = h + F.linear(attend(q, k, v, causal=True), wo)
    return mlp(h, ffn_norm, gate, up, down, eps)


@functools.cache
def compile_layer(fn):
    """torch.compile(fn, dynamic=True): one compiled layer that every layer of a forward reuses (its tensors are
    arguments), its elementwise work (norms, RoPE, SwiGLU, residual adds, casts) fused; sizes symbolic, so a new
    N or T does not recompile. Python ints and floats among the arguments (head counts, eps) are kept constants:
    under dynamic=True dynamo would make ints symbolic and floats 0-d tensors read back with .item() (a device
    sync a call on the GPU), hence specialize_int / specialize_float around each call. No duck sizing: by default
    input sizes of equal value share one symbol, so a mask's T + R that happens to equal the hidden size would be
    pinned to it (the hidden size is a constant) and every other T would recompile, until dynamo's recompile
    limit left the layer eager. Cached per function: one wrapper, so every model in the process shares its compiled
    graphs (and that limit: 8 variants, e.g. grad mode, N = 1, an input that requires grad or not)."""
    from torch.fx.experimental import _config as fx_config
    compiled = fx_config.patch(use_duck_shape=False)(torch.compile(fn, dynamic=True))
    return torch._dynamo.config.patch(specialize_int=True, specialize_float=True)(compiled)


@dataclass(slots=True)
class _Layer:
    attn_norm: object
    wq: object
    wk: object
    wv: object
    wo: object
    bq: object
    bk: object
    bv: object
    q_norm: object
    k_norm: object
    ffn_norm: object
    gate: object
    up: object
    down: object


class TorchTarget:
    """A dense target (llama / qwen2 / qwen3) in torch, frozen: no gradients, inference only."""

    def __init__(self, path: str | Path, device="cpu", dtype=None, max_pos: int = 4096,
                 decode_attention: str = "sdpa"):
        if decode_attention not in DECODE_ATTENTION:
            raise ValueError(f"decode attention {decode_attention!r}: one of {', '.join(DECODE_ATTENTION)}")
        self.decode_attention = decode_attention     # step_static's kernels (decode_attend)
        self.path = Path(path)
        self.file, self.cfg = open_model(self.path)
        if self.cfg.linear is not None:
            raise ValueError(f"{self.path.name}: a hybrid target ({self.cfg.arch}) is not supported for training")
        self.device = torch.device(device)
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        ref = ReferenceOps()

        def load(info):
            return torch.from_numpy(np.array(ref.load_weight(info))).to(self.device, self.dtype)   # a copy: writable

        w = load_weights(self.file, self.cfg, load)
        self.embed, self.output_norm, self.lm_head = w.token_embd, w.output_norm, w.output
        self.layers = [_Layer(lw.attn_norm, lw.attn_q, lw.attn_k, lw.attn_v, lw.attn_output, lw.attn_q_bias,
                              lw.attn_k_bias, lw.attn_v_bias, lw.attn_q_norm, lw.attn_k_norm, lw.ffn_norm,
                              lw.ffn_gate, lw.ffn_up, lw.ffn_down) for lw in w.layers]
        c = self.cfg
        self.cos, self.sin = rope_tables(max_pos, c.rope_theta, c.rope_dim, c.rope_scaling, self.device)
        # qkv_heads' / target_layer's constants; forward's layer (compile_layers swaps in the compiled one)
        self._consts = dict(n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim, rope_dim=c.rope_dim,
                            neox=c.rope_neox, eps=c.rms_eps)
        self._layer_fn = target_layer

    def compile_layers(self, enabled: bool = True) -> None:
        """forward's layers through torch.compile (compile_layer(target_layer)), or eagerly again (enabled False).
        step / step_static (generation, CUDA-graph captured) stay eager either way."""
        self._layer_fn = compile_layer(target_layer) if enabled else target_layer

    def _layer_tensors(self, lw: _Layer) -> tuple:
        """lw's tensors in target_layer's order; the q/k norms None unless the config applies them."""
        qn, kn = (lw.q_norm, lw.k_norm) if self.cfg.qk_norm else (None, None)
        return (lw.attn_norm, lw.wq, lw.wk, lw.wv, lw.bq, lw.bk, lw.bv, qn, kn, lw.wo, lw.ffn_norm, lw.gate, lw.up,
                lw.down)

    # -- one layer -------------------------------------------------------------------------------
    def _qkv(self, lw: _Layer, x, positions):
        qn, kn = (lw.q_norm, lw.k_norm) if self.cfg.qk_norm else (None, None)
        return qkv_heads(x, positions, self.cos, self.sin, lw.wq, lw.wk, lw.wv, lw.bq, lw.bk, lw.bv, qn, kn,
                         **self._consts)

    def _mlp(self, lw: _Layer, h):
        return mlp(h, lw.ffn_norm, lw.gate, lw.up, lw.down, self.cfg.rms_eps)

    def logits(self, h):
        """lm_head(output_norm(h)) -> (..., vocab)."""
        return F.linear(rmsnorm(h, self.output_norm, self.cfg.rms_eps), self.lm_head)

    # -- full sequences (training features) -------------------------------------------------------
    @torch.no_grad()
    def forward(self, ids, capture=(), logits: bool = False, top: int = 0, top_rows: int = 4096):
        """Causal forward over ids int64 (N, T) at positions 0 .. T-1 (right padding is harmless: no position
        attends a later one). Returns ([layer output (N, T, D) for each layer in `capture`], logits (N, T, V) or
        None); with top > 0 (and logits) instead of the logits the distribution over each position's top `top`
        tokens, renormalized: (ids int64 (N, T, top), probabilities float32 (N, T, top)), formed top_rows positions
        at a time (the whole (N, T, V) logits are never alive)."""
        n, t = ids.shape
        positions = torch.arange(t, device=ids.device).expand(n, t)
        h = self.embed[ids]
        feats = {}
        want = set(capture)
        last = max(want) if want and not logits else len(self.layers) - 1
        for i, lw in enumerate(self.layers[:last + 1]):        # target_layer, eager or compiled
            h = self._layer_fn(h, positions, self.cos, self.sin, *self._layer_tensors(lw), **self._consts)
            if i in want:
                feats[i] = h
        if not logits:
            return [feats[i] for i in capture], None
        if not top:
            return [feats[i] for i in capture], self.logits(h)
        top = min(top, self.cfg.vocab_size)
        flat = h.reshape(n * t, -1)
        idx = torch.empty((n * t, top), dtype=torch.long, device=h.device)
        prob = torch.empty((n * t, top), dtype=torch.float32, device=h.device)
        for s in range(0, n * t, top_rows):
            val, idx[s:s + top_rows] = self.logits(flat[s:s + top_rows]).topk(top, dim=-1)
            prob[s:s + top_rows] = torch.softmax(val.float(), dim=-1)
        return [feats[i] for i in capture], (idx.view(n, t, top), prob.view(n, t, top))

    # -- decoding with a KV cache (data generation) -----------------------------------------------
    def new_cache(self, n: int, t_max: int):
        """K and V (n_layers, N, Hkv, t_max, d) in the model's dtype: a KV head's slots contiguous, the layout a
        decode step's attention multiplies directly (decode_attend; (N, t, Hkv, d) made every einsum copy the
        whole cache, half of a generation step's GPU time)."""
        c = self.cfg
        shape = (c.n_layers, n, c.n_kv_heads, t_max, c.head_dim)
        return (torch.zeros(shape, device=self.device, dtype=self.dtype),
                torch.zeros(shape, device=self.device, dtype=self.dtype))

    @torch.no_grad()
    def step(self, ids, positions, cache, start: int, key_valid):
        """New tokens ids (N, t) at int64 positions (N, t) into cache slots start .. start+t-1; each attends the
        valid slots (key_valid bool (N, start + t): False for left padding) up to itself. -> last logits (N, V)."""
        n, t = ids.shape
        end = start + t
        slot = torch.arange(end, device=ids.device)
        causal = slot[None, :] <= (start + torch.arange(t, device=ids.device))[:, None]      # (t, end)
        mask = causal[None] & key_valid[:, None, :end]
        mask = mask | (slot[None, None, :] == (start + torch.arange(t, device=ids.device))[None, :, None])
        h = self.embed[ids]
        kc, vc = cache
        for i, lw in enumerate(self.layers):
            q, k, v = self._qkv(lw, rmsnorm(h, lw.attn_norm, self.cfg.rms_eps), positions)
            kc[i, :, :, start:end], vc[i, :, :, start:end] = k.transpose(1, 2), v.transpose(1, 2)
            h = h + F.linear(attend(q, kc[i, :, :, :end].transpose(1, 2), vc[i, :, :, :end].transpose(1, 2), mask),
                             lw.wo)
            h = self._mlp(lw, h)
        return self.logits(h[:, -1])

    @torch.no_grad()
    def step_static(self, ids, positions, cache, slot, key_mask):
        """One new token per sequence with every shape fixed (batch_decode.py: a CUDA graph replays it): ids /
        positions int64 (N, 1), slot a 0-d int64 tensor (the cache slot written, the same for every sequence),
        key_mask bool (N, t_max): the slots each token attends (its own included). Attention runs over the whole
        cache, masked, so nothing depends on how many slots are filled. -> logits (N, V)."""
        h = self.embed[ids]
        kc, vc = cache
        index = slot.view(1)
        for i, lw in enumerate(self.layers):
            q, k, v = self._qkv(lw, rmsnorm(h, lw.attn_norm, self.cfg.rms_eps), positions)
            kc[i].index_copy_(2, index, k.transpose(1, 2))
            vc[i].index_copy_(2, index, v.transpose(1, 2))
            h = h + F.linear(decode_attend(q, kc[i], vc[i], key_mask, self.decode_attention), lw.wo)
            h = self._mlp(lw, h)
        return self.logits(h[:, -1])
