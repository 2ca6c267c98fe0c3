"""The block loss's vocabulary projection and cross-entropy, a chunk of rows at a time, the gradient formed at once.

    linear_cross_entropy(x (R, D), weight (V, D) frozen, labels (R,), w (R,), chunk, soft=None, alpha=0)
        -> (sum_r w_r CE(x_r @ weight^T, t_r) float32 scalar, hit bool (R,): argmax_r == label_r)

    t_r = onehot(label_r), or with soft targets (alpha > 0: distillation) (1 - alpha) onehot(label_r) + alpha s_r,
    s_r a distribution over the vocabulary (the target's own at that position) that soft(i0, i1) gives for rows
    i0 .. i1 - 1, a chunk at a time (never all rows' at once): dense, (r, V), or sparse, (ids (r, k) distinct
    within a row, probabilities (r, k) summing to 1): s_r is zero outside its k tokens.
    CE(z, t) = -sum_v t_v log softmax(z)_v.

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
In float32 or float64 (the CPU tests) this is the whole-block path to rounding. Soft targets: the row's soft term
is logsumexp(z) - sum_v s_v z_v (float32 sums), and the logit gradient q - (1 - alpha) onehot - alpha s is formed
in the logits' dtype (sparse: s_v z_v over the row's k tokens, gathered, and alpha s scattered into the gradient).
"""
from __future__ import annotations

from . import require_torch

torch = require_torch()

__all__ = ["linear_cross_entropy"]


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, labels, w, chunk: int, soft, alpha: float):
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
            t = t_ids = None
            if alpha:
                t = soft(s, e)
                lse = torch.logsumexp(logits.to(acc), dim=-1)
                if isinstance(t, tuple):                                      # (r, k) ids and probabilities
                    t_ids, t = t
                    tz = (t.to(acc) * logits.gather(1, t_ids).to(acc)).sum(-1)
                else:
                    t = t.to(logits.dtype)                                    # (r, V): the rows' soft targets
                    tz = torch.bmm(t.unsqueeze(1), logits.unsqueeze(2)).view(-1).to(acc)   # sum_v s_v z_v
                total += alpha * ((lse - tz) * w[s:e]).sum()
            p = torch.softmax(logits, dim=-1)                                # one pass, float32 inside
            del logits
            p_label = p.gather(1, lab).squeeze(1).to(acc)                     # (r,)
            total += -((1 - alpha) * torch.log(p_label.clamp(min=tiny)) * w[s:e]).sum()
            if want_grad:
                if t is None:
                    p.scatter_(1, lab, (p_label - 1).to(p.dtype)[:, None])  # p - onehot
                else:                                                        # p - (1 - alpha) onehot - alpha s
                    if t_ids is None:
                        p.sub_(t, alpha=alpha)
                    else:
                        p.scatter_add_(1, t_ids, (-alpha * t.to(acc)).to(p.dtype))
                    p.scatter_add_(1, lab, torch.full(lab.shape, alpha - 1, dtype=p.dtype, device=p.device))
                grad[s:e] = (p @ weight).to(acc) * w[s:e, None]
            del p, t
        ctx.save_for_backward(grad if want_grad else None)
        ctx.x_dtype = x.dtype
        ctx.mark_non_differentiable(hit)
        return total, hit

    @staticmethod
    def backward(ctx, g_total, g_hit):
        (grad,) = ctx.saved_tensors
        gx = None if grad is None else (grad * g_total).to(ctx.x_dtype)
        return gx, None, None, None, None, None, None


def linear_cross_entropy(x, weight, labels, w, chunk: int = 4096, soft=None, alpha: float = 0.0):
    """(weighted CE sum float32 (float64 for a float64 weight), hit bool (R,)) of rows x (R, D) through the frozen
    `weight` (V, D); labels int64 (R,), w float32 (R,) the rows' loss weights; `chunk` rows' logits at a time.
    alpha in [0, 1]: the soft targets' share, soft(i0, i1) -> (i1 - i0, V) distributions or (ids, probabilities)
    (i1 - i0, k) each (needed when alpha > 0).
    The weight gets no gradient."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x (R, D) and weight (V, D) expected, got {tuple(x.shape)} and {tuple(weight.shape)}")
    if labels.shape != (x.shape[0],) or w.shape != (x.shape[0],):
        raise ValueError(f"labels and w must be ({x.shape[0]},), got {tuple(labels.shape)} and {tuple(w.shape)}")
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")
    if not 0.0 <= alpha <= 1.0 or (alpha and soft is None):
        raise ValueError(f"alpha must be in [0, 1], with soft targets when > 0; got {alpha!r}")
    if weight.requires_grad:
        raise ValueError("linear_cross_entropy: the projection is frozen (the target's lm_head); weight must not "
                         "require a gradient")
    return _LinearCrossEntropy.apply(x, weight, labels, w, chunk, soft, float(alpha))
