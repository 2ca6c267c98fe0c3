"""A drafter's stored PFlash calibration (`flashd pflash-calibrate`, calibrate.py measures it): the record, its file,
and the PFlashConfig that `flashd serve --prefill-drafter D` (and bench_niah --auto) builds from it.

One file per drafter file and RoPE scaling, in the cache: `<cache>/pflash/<name>-<identity>.json` for the drafter's
own positions, `<name>-<identity>-<rope>.json` under a scaling (e.g. `-yarn4x32768` for `--rope-scaling yarn
--rope-factor 4 --rope-orig-ctx 32768`): the identity is a digest of the file's size and first 4 MiB, so a replaced
file is not matched, and the scaling changes the drafter's attention at every length, so a setting measured under
one is not used under another.

Calibrations measured by flashd's developers ship in `calibrations/` beside this file, named the same way (the
published drafter files of the models flashd documents; bench/results names the run). A user's own record in the
cache comes first; a shipped one is used for a file of the same identity and scaling, whatever its name, so
`compress=auto` has measured settings for those files without running pflash-calibrate.

A calibration holds one band per measured prompt length: the cheapest drafter-layer window and keep fraction that
kept every case's facts at that length. A prompt uses the band of the nearest measured length on a log scale: band i
covers [sqrt(L[i-1] * L[i]), sqrt(L[i] * L[i+1])), the first band everything below, the last everything above
(pflash_bands). Format 1 files (one setting measured over all lengths, before bands) load as one band.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from .config import PFlashBand, PFlashConfig
from .needles import KINDS

__all__ = ["Calibration", "CalibratedBand", "file_identity", "rope_tag", "calibration_path", "save_calibration",
           "load_calibration", "find_calibration", "shipped_calibration_paths", "pflash_bands", "calibrated_pflash",
           "describe_bands"]

IDENTITY_BYTES = 4 << 20
FORMAT = 2
SHIPPED_DIR = Path(__file__).parent / "calibrations"


@dataclass(slots=True, frozen=True)
class CalibratedBand:
    length: int             # the prompt length measured (tokens, at most; the drafter's tokenizer)
    score_from: int         # first scoring layer (lo)
    score_layers: int       # layers run (hi)
    keep: float
    margin: bool            # also passed at the next smaller keep tried

    def __post_init__(self):
        if self.length < 1:
            raise ValueError(f"band length must be >= 1, got {self.length}")
        if not 0 <= self.score_from < self.score_layers:
            raise ValueError(f"bad window [{self.score_from}, {self.score_layers})")
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"keep must be in (0, 1], got {self.keep}")


@dataclass(slots=True, frozen=True)
class Calibration:
    bands: tuple[CalibratedBand, ...]   # ascending length
    n_layers: int           # the drafter's layers (score_layers == n_layers: the whole forward)
    cases: int              # per length and kind
    kinds: tuple[str, ...]  # needles.KINDS measured at every length
    alpha: float
    drafter: str            # file name
    identity: str           # file_identity
    rope: str | None        # rope_tag of the drafter's scaling while measured (None: its own positions)
    date: str
    seed: int | None = None  # None: a format 1 file (which did not record it)

    def __post_init__(self):
        if not self.bands or not all(isinstance(b, CalibratedBand) for b in self.bands):
            raise ValueError("a calibration needs at least one CalibratedBand")
        lengths = [b.length for b in self.bands]
        if any(a >= b for a, b in zip(lengths, lengths[1:])):
            raise ValueError(f"band lengths must increase, got {lengths}")
        for b in self.bands:
            if b.score_layers > self.n_layers:
                raise ValueError(f"bad window [{b.score_from}, {b.score_layers}) of {self.n_layers} layers")
        if self.cases < 1:
            raise ValueError(f"cases must be >= 1, got {self.cases}")
        if not self.kinds or any(k not in KINDS for k in self.kinds):
            raise ValueError(f"kinds must be some of {', '.join(KINDS)}, got {self.kinds}")

    def band_for(self, n_tokens: int) -> CalibratedBand:
        """The band of the measured length nearest n_tokens on a log scale (pflash_bands' rule)."""
        starts = [b.from_tokens for b in pflash_bands(self)]
        return self.bands[max(i for i, s in enumerate(starts) if s <= n_tokens)]

    def as_dict(self) -> dict:
        return {"format": FORMAT, **dataclasses.asdict(self), "bands": [dataclasses.asdict(b) for b in self.bands],
                "kinds": list(self.kinds)}

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        """A stored record: format 2, or format 1 (no "format": one setting over `lengths`) as one band."""
        if "format" not in d:
            band = CalibratedBand(length=min(d["lengths"]), score_from=d["score_from"],
                                  score_layers=d["score_layers"], keep=d["keep"], margin=d["margin"])
            return cls(bands=(band,), n_layers=d["n_layers"], cases=d["cases"], kinds=("single",), alpha=d["alpha"],
                       drafter=d["drafter"], identity=d["identity"], rope=None, date=d["date"], seed=None)
        if d["format"] != FORMAT:
            raise ValueError(f"calibration format {d['format']!r} is not {FORMAT}")
        fields = {k: v for k, v in d.items() if k != "format"}
        return cls(**{**fields, "bands": tuple(CalibratedBand(**b) for b in d["bands"]), "kinds": tuple(d["kinds"])})


def file_identity(path: str | Path) -> str:
    path = Path(path)
    h = hashlib.sha256(str(path.stat().st_size).encode())
    with open(path, "rb") as f:
        h.update(f.read(IDENTITY_BYTES))
    return h.hexdigest()[:16]


def rope_tag(scaling) -> str | None:
    """A drafter ModelConfig's rope_scaling (models/config.py RopeScaling, or None) as a file-name tag:
    "yarn4x32768" = YaRN, factor 4, original context 32768; None for no scaling."""
    if scaling is None:
        return None
    return f"{scaling.type}{scaling.factor:g}x{scaling.orig_ctx}"


def calibration_path(drafter_path: str | Path, identity: str | None = None, rope: str | None = None) -> Path:
    identity = identity or file_identity(drafter_path)
    from ..backends.cuda.build import cache_dir     # the user cache (pure Python, no CUDA needed)

    suffix = f"-{rope}" if rope else ""
    return cache_dir() / "pflash" / f"{Path(drafter_path).name}-{identity}{suffix}.json"


def save_calibration(calibration: Calibration, drafter_path: str | Path) -> Path:
    path = calibration_path(drafter_path, calibration.identity, calibration.rope)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(calibration.as_dict(), indent=1))
    os.replace(temporary, path)
    return path


def shipped_calibration_paths(identity: str, rope: str | None = None) -> list[Path]:
    """The shipped records (SHIPPED_DIR) of a file of this identity under this scaling, any file name."""
    suffix = f"-{rope}" if rope else ""
    return sorted(SHIPPED_DIR.glob(f"*-{identity}{suffix}.json"))


def _read(path: Path, identity: str, rope: str | None) -> Calibration | None:
    try:
        calibration = Calibration.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return calibration if calibration.rope == rope and calibration.identity == identity else None


def find_calibration(drafter_path: str | Path, rope: str | None = None,
                     shipped: bool = True) -> tuple[Calibration, Path] | None:
    """The calibration of this exact drafter file under this scaling (rope_tag) and the file it came from: the
    user's own (the cache), else with `shipped` one that ships with flashd; None if neither (or unreadable)."""
    try:
        identity = file_identity(drafter_path)
    except OSError:
        return None
    paths = [calibration_path(drafter_path, identity, rope)] + (shipped_calibration_paths(identity, rope)
                                                                   if shipped else [])
    for path in paths:
        calibration = _read(path, identity, rope)
        if calibration is not None:
            return calibration, path
    return None


def load_calibration(drafter_path: str | Path, rope: str | None = None, shipped: bool = True) -> Calibration | None:
    """find_calibration's record alone."""
    found = find_calibration(drafter_path, rope, shipped)
    return found[0] if found is not None else None


def pflash_bands(calibration: Calibration) -> tuple[PFlashBand, ...]:
    """One PFlashBand per calibrated length; band i starts at ceil(sqrt(L[i-1] * L[i])) (the first at 0)."""
    lengths = [b.length for b in calibration.bands]
    starts = [0] + [math.ceil(math.sqrt(a * b)) for a, b in zip(lengths, lengths[1:])]
    return tuple(PFlashBand(from_tokens=s, keep=b.keep, score_layers=b.score_layers, score_from=b.score_from)
                 for s, b in zip(starts, calibration.bands))


def calibrated_pflash(base: PFlashConfig, calibration: Calibration | None,
                      given: frozenset[str] = frozenset()) -> PFlashConfig:
    """`base` with the calibration's bands for what the command line did not give (`given`: names among keep,
    score_layers, score_from); the layer window only as a whole (a given --compress-layers or
    --compress-first-layer keeps the command line's window at every length). Its own keep and window become the
    first band's: what a request naming another drafter uses."""
    window_given = bool(given & {"score_layers", "score_from"})
    keep_given = "keep" in given
    if calibration is None or (window_given and keep_given):
        return base
    bands = tuple(dataclasses.replace(
        b, keep=base.keep if keep_given else b.keep,
        score_layers=base.score_layers if window_given else b.score_layers,
        score_from=base.score_from if window_given else b.score_from) for b in pflash_bands(calibration))
    first = bands[0]
    return dataclasses.replace(base, bands=bands, keep=first.keep, score_layers=first.score_layers,
                               score_from=first.score_from)


def describe_bands(bands: tuple[PFlashBand, ...]) -> str:
    """One line: "from 0 tokens keep 0.05 layers [4, 12); from 16384 tokens ..." (logs, bench output)."""
    return "; ".join(f"from {b.from_tokens} tokens keep {b.keep:g} layers [{b.score_from}, "
                     f"{b.score_layers or 'all'})" for b in bands)
