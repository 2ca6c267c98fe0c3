"""Logits of the CUDA backend against the reference backend's (shared by the whole-model tests).

Tolerance: the CUDA path stores the KV cache in float16 and feeds the prefill GEMM float16
activations (2^-11 relative rounding), accumulating in float32; through a few layers this moves
logits by ~1e-3 of their scale, so max |cuda - ref| <= REL_TOL * max |ref|, plus argmax agreement
wherever the reference's top-2 gap is clear (> REL_TOL * scale).
"""
import numpy as np

REL_TOL = 2e-2


def assert_logits_close(got, want, rel_tol=REL_TOL):
    scale = float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    assert np.isfinite(got).all(), "non-finite logits"
    assert err <= rel_tol * scale, f"max |diff| {err:.4g} > {rel_tol} * {scale:.4g}"
    top2 = np.sort(want, -1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > rel_tol * scale
    assert (got.argmax(-1) == want.argmax(-1))[clear].all()


def greedy_prefix_agrees(ref_runner, prompt, got_tokens):
    """(True, n) if got_tokens equals the reference's greedy tokens up to the first near-tie (the
    reference's top-2 logits within REL_TOL of the scale: either backend may break it differently)."""
    logits = ref_runner.score(prompt + got_tokens)[len(prompt) - 1:-1]
    scale = float(np.abs(logits).max())
    for i, row in enumerate(logits):
        a, b = np.sort(row)[-2:]
        if got_tokens[i] != int(row.argmax()):
            return (b - a) <= REL_TOL * scale, i
    return True, len(got_tokens)
