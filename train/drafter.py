"""The DFlash drafter in torch: the function flashd's reference backend computes (models/dflash.py), trainable.

    F      = hidden_norm(fc @ concat(target layer outputs))           (N, T, D), context features
    block  = target.embed([anchor token, MASK x (B-1)]) at positions a .. a+B-1
    layer  : x = attn_norm(h); Q from the block; K, V from F (no attn_norm: the runtime's `inject_context`
             projects F directly) and from x, q/k RMSNorm per head, NeoX RoPE at absolute positions;
             a block query attends context positions < a and its own whole block (non-causal);
             h += o_proj(attn); h += down(silu(gate(x2)) * up(x2)), x2 = ffn_norm(h)
    logits = target.lm_head(output_norm(h[1:]))                       the B-1 masked positions

Training runs many blocks of one sequence at once (anchors a_1 .. a_A): every block's queries share the
sequence's context K/V, each with its own visibility (context < a_j, block j only), so one masked attention
over [context ; all blocks] computes exactly A independent runtime drafts. Parameter names and shapes
(`gguf_tensors`) are the GGUF's (models/dflash_weights.py): fc (D, n_features * D), matrices (out, in).
"""
from __future__ import annotations

import math

from flashd.daemon.models.dflash_config import DFlashConfig

from . import require_torch
from .target import attend, compile_layer, rmsnorm, rope, rope_tables

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

__all__ = ["TorchDrafter", "block_visibility", "drafter_layer"]

# layer parameter -> GGUF tensor name suffix (blk.N.<suffix>.weight)
LAYER_NAMES = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
               "q_norm": "attn_q_norm", "k_norm": "attn_k_norm", "ffn_norm": "ffn_norm", "gate": "ffn_gate",
               "up": "ffn_up", "down": "ffn_down"}


class _Layer(nn.Module):
    def __init__(self, d: int, q: int, kv: int, head_dim: int, ffn: int, out_std: float, gen):
        super().__init__()

        def mat(rows, cols, std=None):   # std 1/sqrt(fan_in): activations O(1) at any width
            w = torch.randn(rows, cols, generator=gen)
            return nn.Parameter(w * (std if std is not None else 1 / math.sqrt(cols)))

        self.attn_norm, self.ffn_norm = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
        self.q_norm, self.k_norm = nn.Parameter(torch.ones(head_dim)), nn.Parameter(torch.ones(head_dim))
        self.wq, self.wk, self.wv = mat(q, d), mat(kv, d), mat(kv, d)
        self.wo = mat(d, q, out_std / math.sqrt(q))                   # residual writers scaled by depth
        self.gate, self.up = mat(ffn, d), mat(ffn, d)
        self.down = mat(d, ffn, out_std / math.sqrt(ffn))


def block_visibility(anchors, keep, n_ctx: int, block_size: int, ctx_valid=None):
    """bool (N, A*B, T + A*B): block query (j, i) sees context slot t iff t < anchors[j] (and ctx_valid), and the
    B slots of its own block; a dropped block (keep False) sees only itself (its rows are not in the loss).
    anchors int64 (N, A), keep bool (N, A), ctx_valid bool (N, T) or None."""
    n, a = anchors.shape
    dev = anchors.device
    t = torch.arange(n_ctx, device=dev)
    ctx = t[None, None, :] < anchors[:, :, None]                                   # (N, A, T)
    ctx = ctx & keep[:, :, None]
    if ctx_valid is not None:
        ctx = ctx & ctx_valid[:, None, :]
    ctx = ctx[:, :, None, :].expand(n, a, block_size, n_ctx).reshape(n, a * block_size, n_ctx)
    blk = torch.arange(a, device=dev).repeat_interleave(block_size)
    own = (blk[:, None] == blk[None, :]).expand(n, -1, -1)
    return torch.cat([ctx, own], dim=-1)


def _heads(x, w, norm, positions, cos, sin, *, n_heads: int, head_dim: int, eps: float):
    """x (N, T, D) -> (N, T, heads, d); with `norm`: RMSNorm per head, then NeoX RoPE at positions (N, T)."""
    y = F.linear(x, w).view(*x.shape[:2], n_heads, head_dim)
    if norm is not None:
        y = rope(rmsnorm(y, norm, eps), positions, cos, sin, head_dim, True)
    return y


def drafter_layer(h, ctx, mask, ctx_pos, blk_pos, cos, sin, attn_norm, wq, wk, wv, wo, q_norm, k_norm, ffn_norm,
                  gate, up, down, *, n_heads: int, n_kv_heads: int, head_dim: int, eps: float):
    """One drafter layer: block rows h (N, R, D) at blk_pos (N, R) read the context ctx (N, T, D) at ctx_pos
    (N, T) and the block rows, as mask bool (N, R, T + R) lets them (block_visibility) -> h after the layer.
    The layer's tensors in LAYER_NAMES order; the keywords are the config's constants. TorchDrafter.blocks calls
    it once a layer, eagerly or compiled (target.compile_layer; gradients flow to the tensors passed)."""
    kv = dict(n_heads=n_kv_heads, head_dim=head_dim, eps=eps)
    x = rmsnorm(h, attn_norm, eps)
    q = _heads(x, wq, q_norm, blk_pos, cos, sin, n_heads=n_heads, head_dim=head_dim, eps=eps)
    k = torch.cat([_heads(ctx, wk, k_norm, ctx_pos, cos, sin, **kv),
                   _heads(x, wk, k_norm, blk_pos, cos, sin, **kv)], dim=1)
    v = torch.cat([_heads(ctx, wv, None, ctx_pos, cos, sin, **kv),
                   _heads(x, wv, None, blk_pos, cos, sin, **kv)], dim=1)
    h = h + F.linear(attend(q, k, v, mask), wo)
    x2 = rmsnorm(h, ffn_norm, eps)
    return h + F.linear(F.silu(F.linear(x2, gate)) * F.linear(x2, up), down)


class TorchDrafter(nn.Module):
    """Trainable drafter weights (float32 masters); the target's embedding and lm_head are passed in, frozen."""

    def __init__(self, cfg: DFlashConfig, max_pos: int = 4096, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        m = cfg.model
        d, q, kv = m.hidden, m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
        gen = torch.Generator().manual_seed(seed)           # the initial weights depend on the seed only
        self.fc = nn.Parameter(torch.randn(d, cfg.n_features * d, generator=gen) / math.sqrt(cfg.n_features * d))
        self.hidden_norm, self.output_norm = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
        out_std = 1 / math.sqrt(2 * m.n_layers)
        self.layers = nn.ModuleList(_Layer(d, q, kv, m.head_dim, m.ffn, out_std, gen) for _ in range(m.n_layers))
        cos, sin = rope_tables(max_pos, m.rope_theta, m.head_dim, None, "cpu")
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self._layer_fn = drafter_layer            # blocks' layer: compile_layers swaps in the compiled one

    def compile_layers(self, enabled: bool = True) -> None:
        """blocks' layers through torch.compile (target.compile_layer(drafter_layer)), or eagerly again (enabled
        False). Not nn.Module.compile (which compiles a forward this module does not have)."""
        self._layer_fn = compile_layer(drafter_layer) if enabled else drafter_layer

    # -- the forward -----------------------------------------------------------------------------
    def context(self, feats):
        """feats (N, T, n_features * D): the target layer outputs concatenated in target_layer_ids order."""
        return rmsnorm(F.linear(feats, self.fc), self.hidden_norm, self.cfg.model.rms_eps)

    def blocks(self, ctx, block_emb, anchors, keep, ctx_valid=None):
        """Hidden states (N, A, B, D) of A blocks per sequence.

        ctx (N, T, D) from `context` (slot t = position t); block_emb (N, A, B, D) the target's embeddings of
        [anchor token, MASK x (B-1)]; anchors int64 (N, A) the anchor positions (block j sits at a_j .. a_j+B-1
        and sees context slots < a_j); keep bool (N, A) False for padding blocks."""
        m, B = self.cfg.model, self.cfg.block_size
        n, a = anchors.shape
        t = ctx.shape[1]
        ctx_pos = torch.arange(t, device=ctx.device).expand(n, t)
        blk_pos = (anchors[:, :, None] + torch.arange(B, device=ctx.device)).reshape(n, a * B)
        mask = block_visibility(anchors, keep, t, B, ctx_valid)
        h = block_emb.reshape(n, a * B, -1)
        if self._layer_fn is not drafter_layer:   # compiled: dynamo guards a view input on its base, so layer 0's
            h = h.clone()                          # view would be a variant of its own (no_grad: 2 where 1 does)
        consts = dict(n_heads=m.n_heads, n_kv_heads=m.n_kv_heads, head_dim=m.head_dim, eps=m.rms_eps)
        for lw in self.layers:                    # drafter_layer, eager or compiled
            h = self._layer_fn(h, ctx, mask, ctx_pos, blk_pos, self.cos, self.sin,
                               *(getattr(lw, name) for name in LAYER_NAMES), **consts)
        return h.view(n, a, B, -1)

    def logits(self, h, lm_head):
        """lm_head(output_norm(h)) for hidden states (..., D) -> (..., vocab)."""
        return F.linear(rmsnorm(h, self.output_norm, self.cfg.model.rms_eps), lm_head)

    def draft(self, feats, embed, lm_head, root: int):
        """The runtime's one draft step: the context of feats (1, n, n_features * D) (positions 0 .. n-1), the
        block [root, MASK x (B-1)] at n .. n+B-1 -> logits (B-1, vocab) (DFlashDrafter._draft's function)."""
        B, n = self.cfg.block_size, feats.shape[1]
        ids = torch.full((1, 1, B), self.cfg.mask_token_id, dtype=torch.long, device=feats.device)
        ids[0, 0, 0] = root
        anchors = torch.tensor([[n]], device=feats.device)
        keep = torch.ones(1, 1, dtype=torch.bool, device=feats.device)
        h = self.blocks(self.context(feats), embed[ids], anchors, keep)
        return self.logits(h[0, 0, 1:], lm_head)

    # -- GGUF names ------------------------------------------------------------------------------
    def gguf_tensors(self) -> dict:
        """GGUF tensor name -> parameter, in the loader's order (globals, then layer by layer)."""
        out = {"dflash.fc.weight": self.fc, "dflash.hidden_norm.weight": self.hidden_norm,
               "output_norm.weight": self.output_norm}
        for i, lw in enumerate(self.layers):
            for attr, suffix in LAYER_NAMES.items():
                out[f"blk.{i}.{suffix}.weight"] = getattr(lw, attr)
        return out
