"""PFlash calibration: the cheapest drafter-layer window and keep fraction that keep the needle.

PFlash's cost is mostly the drafter's forward, and scoring with fewer drafter layers is cheaper --
but which layers locate what matters depends on the drafter (for Qwen2.5-Coder-0.5B the first layers'
attention is local and sink-heavy and, in a max, hides a needle that layers 10-11 find). So the
setting is measured per drafter, not guessed:

  1. generate needle-in-a-haystack cases (needles.py) at each length, with the drafter's tokenizer
     and chat template;
  2. for each case, one drafter forward records every layer's own tail attention maxima
     (`layer_maxima`: attention of layer l does not depend on later layers, so a forward truncated
     after layer hi gives the same maxima for l < hi);
  3. every window [lo, hi) and keep fraction runs the chunk selection; a setting passes when every
     case's needle value survives it;
  4. the chosen setting runs the fewest layers (hi), then keeps the least (the target's prefill is the
     rest of the time), then scores the most layers (lo smallest: the widest view); among equals the
     one with a margin (it also passes at the next smaller keep) wins.

The result is stored per drafter file in the cache (`<cache>/pflash/<name>-<identity>.json`, the
identity a digest of the file's size and first 4 MiB, so a replaced file is not matched) and used by
`flashd serve --prefill-drafter D` for whatever of --compress-layers, --compress-first-layer and
--compress-keep the command line does not set.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .selection import kept_positions

__all__ = ["Calibration", "CalibrationFailed", "layer_maxima", "choose_setting", "calibrate", "calibration_path",
           "load_calibration", "save_calibration"]

IDENTITY_BYTES = 4 << 20


class CalibrationFailed(RuntimeError):
    """No window and keep fraction kept every needle."""


@dataclass(slots=True, frozen=True)
class Calibration:
    score_from: int         # first scoring layer (lo)
    score_layers: int       # layers run (hi)
    keep: float
    n_layers: int           # the drafter's layers (hi == n_layers: the whole forward)
    lengths: tuple[int, ...]
    cases: int              # per length
    alpha: float
    drafter: str            # file name
    identity: str
    date: str
    margin: bool            # also passed at the next smaller keep tried

    def __post_init__(self):
        if not 0 <= self.score_from < self.score_layers <= self.n_layers:
            raise ValueError(f"bad window [{self.score_from}, {self.score_layers}) of {self.n_layers} layers")
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"keep must be in (0, 1], got {self.keep}")

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "lengths": list(self.lengths)}

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        return cls(**{**d, "lengths": tuple(d["lengths"])})


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


def _windows(n_layers: int) -> list[tuple[int, int]]:
    return [(lo, hi) for hi in range(1, n_layers + 1) for lo in range(hi)]


def choose_setting(cases: Sequence[tuple[np.ndarray, Sequence[int]]], keeps: Sequence[float],
                   select: Callable[[np.ndarray, float], np.ndarray]) -> tuple[int, int, float, bool] | None:
    """cases: (layer maxima (N, T, S), needle positions). select(probs, keep) -> kept positions.
    The passing (lo, hi, keep) that runs the fewest layers, then keeps least, then scores most
    layers, preferring one that also passes at the next smaller keep; (lo, hi, keep, margin) or
    None when nothing passes."""
    n_layers = cases[0][0].shape[0]
    keeps = sorted(set(keeps))
    passed: dict[tuple[int, int, float], bool] = {}
    for lo, hi in _windows(n_layers):
        for keep in keeps:
            ok = True
            for maxima, where in cases:
                probs = maxima[lo:hi].max(axis=0)
                if not np.isin(where, select(probs, keep)).all():
                    ok = False
                    break
            passed[(lo, hi, keep)] = ok
    best = None
    for (lo, hi, keep), ok in passed.items():
        if not ok:
            continue
        i = keeps.index(keep)
        margin = i > 0 and passed[(lo, hi, keeps[i - 1])]
        rank = (hi, keep, not margin, lo)
        if best is None or rank < best[0]:
            best = (rank, (lo, hi, keep, margin))
    return None if best is None else best[1]


def file_identity(path: str | Path) -> str:
    path = Path(path)
    h = hashlib.sha256(str(path.stat().st_size).encode())
    with open(path, "rb") as f:
        h.update(f.read(IDENTITY_BYTES))
    return h.hexdigest()[:16]


def calibration_path(drafter_path: str | Path, identity: str | None = None) -> Path:
    identity = identity or file_identity(drafter_path)
    from ..backends.cuda.build import cache_dir     # the user cache (pure Python, no CUDA needed)

    return cache_dir() / "pflash" / f"{Path(drafter_path).name}-{identity}.json"


def save_calibration(calibration: Calibration, drafter_path: str | Path) -> Path:
    path = calibration_path(drafter_path, calibration.identity)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(calibration.as_dict(), indent=1))
    os.replace(temporary, path)
    return path


def load_calibration(drafter_path: str | Path) -> Calibration | None:
    """The stored calibration of this exact drafter file, or None (none stored, or unreadable)."""
    try:
        path = calibration_path(drafter_path)
        return Calibration.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def calibrate(drafter, tokenizer, template, drafter_path: str | Path, *, lengths: Sequence[int], cases: int,
              keeps: Sequence[float], alpha: float, seed: int = 0,
              log: Callable[[str], None] = lambda msg: None) -> Calibration:
    """Measure (steps 1-4 above) and return the setting; CalibrationFailed if nothing kept every needle."""
    from .needles import make_case, needle_positions

    pc = drafter.config
    measured = []
    for n_tokens in lengths:
        for i in range(cases):
            case = make_case(tokenizer, template, n_tokens, seed * 1_000_003 + n_tokens * 101 + i)
            where = needle_positions(tokenizer, case)
            measured.append((layer_maxima(drafter, case.ids, alpha), where))
            log(f"{n_tokens} tokens, case {i + 1}/{cases}: needle at token {where[0]} of {case.n_tokens}")

    def select(probs, keep):
        return kept_positions(probs, keep, pc.chunk_tokens, pc.smooth_tokens, pc.first_chunks, pc.last_chunks)

    chosen = choose_setting(measured, keeps, select)
    if chosen is None:
        raise CalibrationFailed(f"no drafter-layer window kept every needle at keep <= {max(keeps)} "
                                f"({len(measured)} cases); try larger --keeps or another drafter")
    lo, hi, keep, margin = chosen
    n_layers = measured[0][0].shape[0]
    return Calibration(score_from=lo, score_layers=hi, keep=keep, n_layers=n_layers, lengths=tuple(lengths),
                       cases=cases, alpha=alpha, drafter=Path(drafter_path).name,
                       identity=file_identity(drafter_path), date=datetime.date.today().isoformat(), margin=margin)
