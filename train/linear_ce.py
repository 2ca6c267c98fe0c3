"""The block loss's vocabulary projection and cross-entropy, a chunk of rows at a time, the gradient formed at once.

    linear_cross_entropy(x (R, D), weight (V, D) frozen, labels (R,), w (R,), chunk)
        -> (sum_r w_r CE(x_r @ weight^T, label_r) float32 scalar, hit bool (R,): argmax_r == label_r)

Why: the loss rows of one training step are N * A * (B - 1) (8 x 128 x 15 = 15,360) against a vocabulary of
151,936, so the logits are 2.3 G values. Formed whole (Trainer loss_rows=0), they are written in bfloat16, copied
to float32, log-softmaxed, and in backward the softmax gradient is written in float32 and cast back: ~42 bytes of
memory traffic a logit and 34 GiB of memory. Here each chunk of rows is projected, its argmax taken, its softmax
written over the logits' dtype in one pass (float32 inside), the label column turned into p - 1, and the gradient
of x formed by the second product before the next chunk: ~12 bytes a logit and one chunk's logits alive. The input
gradient is kept from forward, so backward only scales it (the loss is the step's only use of these rows).

Arithmetic: the softmax accumulates in float32 and is rounded once to the weight's dtype (bfloat16 on the GPU: the
whole-block path's backward rounds its float32 gradient to bfloat16 before the same product, so the gradient
differs by about one more rounding of p); the label's p - 1 is formed from that p; the row weight w_r scales the
product's float32 rows. The loss is -log p_label from the rounded p (2^-9 relative in p: ~0.002 in a row's CE;
the loss is logged, its gradient is the kept one), floored at the dtype's smallest normal (a row's CE <= ~87).
In float32 or float64 (the CPU tests) this is the whole-block path to rounding.
"""
from __future__ import annotations

from . import require_torch

torch = require_torch()

__all__ = ["linear_cross_entropy"]


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, labels, w, chunk: int):
        rows = x.shape[0]
        want_grad = ctx.needs_input_grad[0]
        acc = torch.promote_types(weight.dtype, torch.float32)            # float32 (float64 in the oracle test)
        grad = torch.empty(x.shape, dtype=acc, device=x.device) if want_grad else None
        total = torch.zeros((), dtype=acc, device=x.device)
        w = w.to(acc)
        tiny = torch.finfo(weight.dtype).tiny                             # a label p that underflows: CE ~87
        hit = torch.empty(rows, dtype=torch.bool, device=x.device)
        xw = x.to(weight.dtype)
        for s in range(0, rows, chunk):
            e = min(rows, s + chunk)
            lab = labels[s:e, None]
            logits = xw[s:e] @ weight.t()                                    # (r, V) in the weight's dtype
            hit[s:e] = logits.argmax(-1) == labels[s:e]
            p = torch.softmax(logits, dim=-1)                                # one pass, float32 inside
            del logits
            p_label = p.gather(1, lab).squeeze(1).to(acc)                     # (r,)
            total += -(torch.log(p_label.clamp(min=tiny)) * w[s:e]).sum()
            if want_grad:
                p.scatter_(1, lab, (p_label - 1).to(p.dtype)[:, None])      # p - onehot
                grad[s:e] = (p @ weight).to(acc) * w[s:e, None]
            del p
        ctx.save_for_backward(grad if want_grad else None)
        ctx.x_dtype = x.dtype
        ctx.mark_non_differentiable(hit)
        return total, hit

    @staticmethod
    def backward(ctx, g_total, g_hit):
        (grad,) = ctx.saved_tensors
        gx = None if grad is None else (grad * g_total).to(ctx.x_dtype)
        return gx, None, None, None, None


def linear_cross_entropy(x, weight, labels, w, chunk: int = 4096):
    """(weighted CE sum float32 (float64 for a float64 weight), hit bool (R,)) of rows x (R, D) through the frozen
    `weight` (V, D); labels int64 (R,), w float32 (R,) the rows' loss weights; `chunk` rows' logits at a time.
    The weight gets no gradient."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x (R, D) and weight (V, D) expected, got {tuple(x.shape)} and {tuple(weight.shape)}")
    if labels.shape != (x.shape[0],) or w.shape != (x.shape[0],):
        raise ValueError(f"labels and w must be ({x.shape[0]},), got {tuple(labels.shape)} and {tuple(w.shape)}")
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")
    if weight.requires_grad:
        raise ValueError("linear_cross_entropy: the projection is frozen (the target's lm_head); weight must not "
                         "require a gradient")
    return _LinearCrossEntropy.apply(x, weight, labels, w, chunk)
