"""What speculative decoding's tokens a step will be, from the acceptance of a draft rooted at every position.

A step rooted at position a (the newest committed token) emits 1 + accepted(a) tokens, and the next step is rooted
where it ended: a request's steps tile its answer. Averaged per position (the trainer's held-out accept_len, or
drafts at random anchors) every position counts alike; along the walk easy stretches pass in few long steps and
hard ones in many short ones, so the runtime's tokens a step -- the walk's -- are lower (the shipped 1.5B drafter,
DDTree 32 on 8 benchmark prompts: 3.10 per position, 2.546 along the walk, and 2.546 in the speculative decoder
itself; bench/results/2026-11-28-cpu-session28-ddtree-offline.md).
"""
from __future__ import annotations

__all__ = ["walk"]


def walk(where, accepted) -> float | None:
    """Tokens a step along the walk. where: (sequence, position a, answer start p, sequence length n) of each
    draft; accepted: the drafted tokens the target keeps at each. Each answer is walked from p: a step rooted at a
    emits 1 + accepted (at most the n - 1 - a tokens left) and the next is rooted at a + 1 + accepted. None if the
    walk reaches a position with no draft (drafts must cover every position the walk visits)."""
    at = {(si, a): k for (si, a, _, _), k in zip(where, accepted)}
    tokens = steps = 0
    for si, p, n in sorted({(w[0], w[2], w[3]) for w in where}):
        a = p
        while a < n - 1:
            if (si, a) not in at:
                return None
            step = 1 + at[(si, a)]
            tokens, steps, a = tokens + min(step, n - 1 - a), steps + 1, a + step
    return tokens / steps if steps else None
