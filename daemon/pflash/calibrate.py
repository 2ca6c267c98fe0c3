"""PFlash calibration: per prompt length, the cheapest drafter-layer window and keep fraction that keep the facts.

PFlash's cost is mostly the drafter's forward, and scoring with fewer drafter layers is cheaper --
but which layers locate what matters depends on the drafter (for Qwen2.5-Coder-0.5B the first layers'
attention is local and sink-heavy and, in a max, hides a needle that layers 10-11 find), and what keep
fraction suffices depends on the prompt's length (2% of a 4K prompt is 3 chunks, two of them forced).
So the setting is measured per drafter and length, not guessed:

  1. at each length, generate needle-in-a-haystack cases of each kind (needles.py: single, multi, multi-all,
     two-hop) with the drafter's tokenizer and chat template, from a seed stream disjoint from bench_niah's
     (needles.case_seed);
  2. for each case, one drafter forward records every layer's own tail attention maxima
     (`layer_maxima`: attention of layer l does not depend on later layers, so a forward truncated
     after layer hi gives the same maxima for l < hi);
  3. every window [lo, hi) and keep fraction runs the chunk selection; a setting passes when every
     case's facts (needles.fact_positions: the value of a single needle, the whole sentences of the others)
     survive it;
  4. the chosen setting runs the fewest layers (hi), then keeps the least (the target's prefill is the
     rest of the time), then scores the most layers (lo smallest: the widest view); among equals the
     one with a margin (it also passes at the next smaller keep) wins. From margin_from tokens on, only
     settings with a margin count: slack for prompts the calibration did not see (at 128K tokens the
     cheapest single-layer window that kept all 16 calibration cases kept 17 of 20 new ones, where the
     margin's setting kept 20 of 20; at 32K the margin raised the kept tokens by two thirds: bench/NOTES.md,
     session 20).

The result, one band per length, is stored with the drafter (calibration_store.py) and used by
`flashd serve --prefill-drafter D` for whatever of --compress-layers, --compress-first-layer and
--compress-keep the command line does not set, by the prompt's length.
"""
from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .calibration_store import CalibratedBand, Calibration, file_identity, rope_tag
from .selection import chunk_positions, chunk_scores, importance, select_chunks, smooth

__all__ = ["CalibrationFailed", "layer_maxima", "choose_setting", "calibrate", "merge"]


class CalibrationFailed(RuntimeError):
    """No window and keep fraction kept every case's facts at some length."""


def layer_maxima(drafter, ids, alpha: float) -> np.ndarray:
    """(n_layers, T, S): each drafter layer's own tail attention maxima over the prompt `ids`, from
    one forward (the ops' tail_max_probs is wrapped to fold every layer into a fresh array too)."""
    ops = drafter.ops
    layers: list[np.ndarray] = []
    original = ops.tail_max_probs

    def recording(q, cache_layer, n_keys, n_tail, acc):
        own = ops.from_numpy(np.zeros(acc.shape, np.float32))
        original(q, cache_layer, n_keys, n_tail, own)
        layers.append(np.array(ops.to_numpy(own)))
        original(q, cache_layer, n_keys, n_tail, acc)

    ops.tail_max_probs = recording
    try:
        total = drafter.tail_probs(ids, alpha)
    finally:
        del ops.tail_max_probs              # back to the class's method
    stacked = np.stack(layers)
    if not np.array_equal(stacked.max(axis=0), total):
        raise AssertionError("per-layer maxima do not fold back into the drafter's tail_probs")
    return stacked


def _all_kept(wanted: np.ndarray, kept: np.ndarray) -> bool:
    """Every wanted position is in `kept` (ascending positions, as the selection returns them)."""
    if len(kept) == 0:
        return len(wanted) == 0
    at = np.minimum(np.searchsorted(kept, wanted), len(kept) - 1)
    return bool(np.all(kept[at] == wanted))


def choose_setting(cases: Sequence[tuple[np.ndarray, Sequence[int]]], keeps: Sequence[float],
                   select: Callable[[np.ndarray, float], np.ndarray],
                   require_margin: bool = False) -> tuple[int, int, float, bool] | None:
    """cases: (layer maxima (N, T, S), fact positions). select(probs, keep) -> kept positions.
    The passing (lo, hi, keep) that runs the fewest layers, then keeps least, then scores most
    layers, preferring one that also passes at the next smaller keep (require_margin: only those count);
    (lo, hi, keep, margin) or None when nothing passes. Windows are tried by hi ascending and the search stops after
    the first hi with a pass (the rank's first key); for one hi, the max over [lo, hi) grows one layer at a time as
    lo falls, so each window costs one elementwise max per case, not hi - lo."""
    n_layers = cases[0][0].shape[0]
    keeps = sorted(set(keeps))
    wanted = [np.asarray(where) for _, where in cases]
    for hi in range(1, n_layers + 1):
        passed: dict[tuple[int, float], bool] = {}
        running = [None] * len(cases)
        for lo in range(hi - 1, -1, -1):
            for c, (maxima, _) in enumerate(cases):
                running[c] = maxima[lo] if running[c] is None else np.maximum(running[c], maxima[lo])
            alive = keeps                          # the keeps no case has failed yet at [lo, hi)
            for r, w in zip(running, wanted):      # case by case, every keep of one case together
                alive = [keep for keep in alive if _all_kept(w, select(r, keep))]
                if not alive:
                    break
            for keep in keeps:
                passed[(lo, keep)] = keep in alive
        best = None
        for (lo, keep), ok in passed.items():
            if not ok:
                continue
            i = keeps.index(keep)
            margin = i > 0 and passed[(lo, keeps[i - 1])]
            if require_margin and not margin:
                continue
            rank = (keep, not margin, lo)
            if best is None or rank < best[0]:
                best = (rank, (lo, hi, keep, margin))
        if best is not None:
            return best[1]
    return None


def calibrate(drafter, tokenizer, template, drafter_path: str | Path, *, lengths: Sequence[int], cases: int,
              keeps: Sequence[float], alpha: float, kinds: Sequence[str] = ("single",), seed: int = 0,
              margin_from: int | None = None, log: Callable[[str], None] = lambda msg: None) -> Calibration:
    """Measure (steps 1-4 above), one band per length (a margin required at lengths >= margin_from; None: at none);
    CalibrationFailed, naming the lengths, if at some length nothing kept every case's facts (after measuring all
    of them: the log has every band found)."""
    from .needles import case_seed, fact_positions, make_case

    pc = drafter.config

    last: list = [None, None]                  # (probs, its chunk scores): choose_setting asks every keep in a row

    def select(probs, keep):
        if last[0] is not probs:
            last[:] = [probs, chunk_scores(smooth(importance(probs), pc.smooth_tokens), pc.chunk_tokens)]
        return chunk_positions(select_chunks(last[1], keep, pc.first_chunks, pc.last_chunks), pc.chunk_tokens,
                               probs.shape[1])

    bands, failed, n_layers = [], [], drafter.model.config.n_layers
    for n_tokens in sorted(set(lengths)):
        measured = []                  # (layers, T, n_tokens) float32 per case: ~100 MB a case at 128K, 24 layers
        for kind in kinds:
            for i in range(cases):
                case = make_case(tokenizer, template, n_tokens, case_seed("calibrate", seed, n_tokens, kind, i), kind)
                where = fact_positions(tokenizer, case)
                measured.append((layer_maxima(drafter, case.ids, alpha), where))
                log(f"{n_tokens} tokens, {kind} case {i + 1}/{cases}: facts at tokens {where[0]}-{where[-1]} "
                    f"of {case.n_tokens}")
        require_margin = margin_from is not None and n_tokens >= margin_from
        chosen = choose_setting(measured, keeps, select, require_margin)
        del measured
        if chosen is None:
            failed.append(f"{n_tokens} tokens{' (with a margin)' if require_margin else ''}")
            log(f"{n_tokens} tokens: no window kept every case's facts at keep <= {max(keeps)}"
                f"{' with a margin' if require_margin else ''}")
            continue
        lo, hi, keep, margin = chosen
        bands.append(CalibratedBand(length=n_tokens, score_from=lo, score_layers=hi, keep=keep, margin=margin))
        log(f"{n_tokens} tokens: layers [{lo}, {hi}) of {n_layers}, keep {keep:g}{' (margin)' if margin else ''}")
    if failed:
        raise CalibrationFailed(f"no drafter-layer window kept every case's facts at keep <= {max(keeps)} at "
                                f"{', '.join(failed)} ({len(kinds) * cases} cases a length); try larger --keeps or "
                                f"another drafter")
    return Calibration(bands=tuple(bands), n_layers=n_layers, cases=cases, kinds=tuple(kinds), alpha=alpha,
                       drafter=Path(drafter_path).name, identity=file_identity(drafter_path),
                       rope=rope_tag(drafter.model.config.rope_scaling), date=datetime.date.today().isoformat(),
                       seed=seed)


def merge(stored: Calibration, new: Calibration) -> Calibration:
    """`new`'s bands added to `stored`'s (a band of the same length replaced): a calibration measured a few lengths
    at a time. Both must be of the same drafter file, scaling, kinds, cases per kind, alpha and seed (ValueError
    naming what differs)."""
    differ = [name for name in ("drafter", "identity", "rope", "n_layers", "kinds", "cases", "alpha", "seed")
              if getattr(stored, name) != getattr(new, name)]
    if differ:
        raise ValueError("the stored calibration differs in " + ", ".join(
            f"{name} ({getattr(stored, name)!r} stored, {getattr(new, name)!r} now)" for name in differ))
    by_length = {b.length: b for b in stored.bands} | {b.length: b for b in new.bands}
    return dataclasses.replace(new, bands=tuple(by_length[n] for n in sorted(by_length)))
