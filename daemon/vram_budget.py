"""The VRAM budget (`flashd serve --vram-budget SIZE`): the size parser and the plan's arithmetic.

Pure Python, no device and no model files: what each component allocates is computed from the model
configs by vram_sizes.py (the way the backends allocate), which components are resident by
vram_ledger.py (from the engine's state); this module adds them up per phase, compares the peak with
the budget and words the refusal.

Phases are the states in which different things are resident at once:

- serving: the target (weights, KV cache at max_ctx, its runner's buffers), the buffers every model on
  the backend shares (activation arena, weight scratch, attention workspace), the resident --draft
  drafters, and the PFlash drafter under the `resident` drafter policy;
- unparking: serving plus the parked target's embedding and lm_head, which a DFlash drafter holds
  while the target's weights load again (only with a DFlash drafter);
- target parked: the --draft drafters (and that head), and the PFlash drafter -- under the `park`
  policy this is where compression runs.

A plan's peak is its largest phase plus the safety margin (the CUDA context, kernel images, CUDA graphs
and allocator rounding, which the backend does not track).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

__all__ = ["parse_size", "format_size", "kv_cache_bytes", "KV_TYPES", "BUILT_KV_TYPES", "PHASES", "Component",
           "PHASE_TEXT", "VramPlan", "BudgetExceeded", "refusal", "largest_fitting", "DEFAULT_MARGIN", "MiB", "GiB"]

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
DEFAULT_MARGIN = 512 * MiB
MAX_SIZE = 1 << 50            # 1 PiB: anything larger is a typo

# K/M/G/T and KiB/MiB/GiB/TiB (and Ki/Mi/Gi/Ti) are powers of 1024, KB/MB/GB/TB powers of 1000
_UNITS = {"b": 1}
for _i, _p in enumerate("kmgt", start=1):
    _UNITS.update({_p: 1024 ** _i, _p + "i": 1024 ** _i, _p + "ib": 1024 ** _i, _p + "b": 1000 ** _i})
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)\s*")
SIZE_HELP = ("a number and a unit, e.g. 24GiB, 22.5G or 8000MiB (K, M, G, T, KiB, MiB, GiB, TiB: powers of 1024; "
             "KB, MB, GB, TB: powers of 1000; B: bytes)")

# bytes per block, values per block: ggml's block formats (a KV row of head_dim values is whole blocks)
KV_TYPES: dict[str, tuple[int, int]] = {"f32": (4, 1), "f16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32)}
BUILT_KV_TYPES = ("f32", "f16")      # the backends' unquantized caches (reference: f32, CUDA: f16); q8_0 / q4_0
                                     # on the reference backend (backends/reference_kv.py), not yet on CUDA

PHASES = ("serving", "unparking", "target parked")
PHASE_TEXT = {"serving": "while serving",
              "unparking": "while the target loads again after a park (a DFlash drafter still holds its parked "
                           "embedding and lm_head)",
              "target parked": "while the target is parked"}


def parse_size(text: str) -> int:
    """'24GiB' -> 25769803776; ValueError (saying what is accepted) for anything else. Fractions of a
    byte are dropped; the size must be positive and at most 1 PiB."""
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    unit = _UNITS.get(match.group(2).lower()) if match else None
    if unit is None:
        raise ValueError(f"{text!r} is not a size: give {SIZE_HELP}")
    n = int(Fraction(match.group(1)) * unit)
    if n <= 0:
        raise ValueError(f"{text!r}: a size must be more than 0 bytes")
    if n > MAX_SIZE:
        raise ValueError(f"{text!r}: more than 1 PiB")
    return n


def format_size(n: int) -> str:
    """Bytes for people: GiB with two decimals from 1 GiB, else MiB with one, else KiB or bytes."""
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    if abs(n) >= MiB:
        return f"{n / MiB:.1f} MiB"
    return f"{n / KiB:.1f} KiB" if abs(n) >= KiB else f"{n} B"


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, slots: int, kv_type: str = "f16",
                   v_type: str | None = None) -> int:
    """K and V of every layer: n_layers * n_kv_heads * slots rows of head_dim values of K in kv_type and as
    many of V in v_type (default: kv_type). A quantized row is whole ggml blocks of 32 values (q8_0: 34
    bytes, q4_0: 18), so head_dim must be a multiple of 32 (ValueError otherwise)."""
    row = 0
    for kind in (kv_type, kv_type if v_type is None else v_type):
        if kind not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {', '.join(KV_TYPES)}, got {kind!r}")
        block_bytes, block_values = KV_TYPES[kind]
        if head_dim % block_values:
            raise ValueError(f"a {kind} KV cache needs head_dim to be a multiple of {block_values}, got {head_dim}")
        row += head_dim // block_values * block_bytes
    return n_layers * n_kv_heads * slots * row


def kv_window_bytes(n_layers: int, n_kv_heads: int, head_dim: int, window: int, max_rows: int, n_sides: int) -> int:
    """A KV window's rings (backends/kv_types.py): per layer and windowed side, float16 [n_kv_heads][window_slots]
    [head_dim] on a 256-byte boundary (CudaQuantKVCache's layout); 0 without a window."""
    from .backends.kv_types import window_slots
    if not window or not n_sides:
        return 0
    ring = n_kv_heads * window_slots(window, max_rows) * 2 * head_dim
    return n_layers * n_sides * (-(-ring // 256) * 256)


class BudgetExceeded(Exception):
    """Loading this would exceed --vram-budget; the message names the components and what would fit."""


def _is_bytes(n) -> bool:
    return type(n) is int and n >= 0


@dataclass(slots=True, frozen=True)
class Component:
    """One thing the plan holds: a model (or the shared buffers), its parts in bytes, the phases it is in."""

    role: str                              # target | shared | draft | dflash | mtp | prefill_drafter | target_head
    name: str                              # the model's name ("" for the shared buffers)
    parts: tuple[tuple[str, int], ...]     # (what, bytes): weights, kv_cache, arena, ...
    phases: frozenset[str]                 # where it is resident (PHASES)
    model: str = ""                        # its file, when it is a model

    def __post_init__(self):
        if not self.role or not isinstance(self.role, str) or not isinstance(self.name, str):
            raise ValueError(f"a component needs a role and a name, got {self.role!r}, {self.name!r}")
        if not isinstance(self.phases, frozenset) or not self.phases or not self.phases <= set(PHASES):
            raise ValueError(f"{self.label}: phases must be a non-empty frozenset of {PHASES}, got {self.phases!r}")
        seen = set()
        for part in self.parts:
            if not (isinstance(part, tuple) and len(part) == 2 and isinstance(part[0], str) and part[0]):
                raise ValueError(f"{self.label}: a part is (what, bytes), got {part!r}")
            if part[0] in seen or not _is_bytes(part[1]):
                raise ValueError(f"{self.label}: part {part[0]!r} repeated or not a byte count ({part[1]!r})")
            seen.add(part[0])

    @property
    def label(self) -> str:
        return f"{self.role} {self.name}" if self.name else self.role

    @property
    def bytes(self) -> int:
        return sum(n for _, n in self.parts)

    def describe(self) -> str:
        inner = ", ".join(f"{what} {format_size(n)}" for what, n in self.parts if n)
        return f"{self.label} {format_size(self.bytes)} ({inner})"

    def as_dict(self) -> dict:
        return {"role": self.role, "name": self.name, "model": self.model, "bytes": self.bytes,
                "parts": dict(self.parts), "phases": [p for p in PHASES if p in self.phases]}


@dataclass(slots=True, frozen=True)
class VramPlan:
    """Every component with its phases, the safety margin and the budget (None: no budget, report only)."""

    components: tuple[Component, ...]
    margin_bytes: int
    budget_bytes: int | None = None
    where: str = "GPU"                                  # GPU, or host RAM on the reference backend
    settings: tuple[tuple[str, object], ...] = ()       # what the sizes assume: max_ctx, kv_type, ...

    def __post_init__(self):
        if not isinstance(self.components, tuple) or not all(isinstance(c, Component) for c in self.components):
            raise ValueError("components must be a tuple of Component")
        labels = [c.label for c in self.components]
        if len(set(labels)) != len(labels):
            raise ValueError(f"component names repeat: {labels}")
        if not _is_bytes(self.margin_bytes):
            raise ValueError(f"margin_bytes must be a non-negative int, got {self.margin_bytes!r}")
        if self.budget_bytes is not None and not (_is_bytes(self.budget_bytes) and self.budget_bytes > 0):
            raise ValueError(f"budget_bytes must be a positive int or None, got {self.budget_bytes!r}")

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases some component is in (serving first when nothing is)."""
        present = tuple(p for p in PHASES if any(p in c.phases for c in self.components))
        return present or ("serving",)

    def in_phase(self, phase: str) -> list[Component]:
        return [c for c in self.components if phase in c.phases]

    def phase_bytes(self, phase: str) -> int:
        return sum(c.bytes for c in self.in_phase(phase)) + self.margin_bytes

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_bytes)      # the first of equal ones

    @property
    def peak_bytes(self) -> int:
        return self.phase_bytes(self.peak_phase)

    @property
    def headroom_bytes(self) -> int | None:
        return None if self.budget_bytes is None else self.budget_bytes - self.peak_bytes

    @property
    def fits(self) -> bool:
        return self.budget_bytes is None or self.peak_bytes <= self.budget_bytes

    def describe(self, phase: str | None = None) -> str:
        """The components of a phase (default: the peak's) and the margin, one clause each."""
        phase = phase or self.peak_phase
        items = [c.describe() for c in self.in_phase(phase)] + [f"safety margin {format_size(self.margin_bytes)}"]
        return "; ".join(items)

    def as_dict(self) -> dict:
        return {"where": self.where, "budget_bytes": self.budget_bytes, "peak_bytes": self.peak_bytes,
                "peak_phase": self.peak_phase, "headroom_bytes": self.headroom_bytes, "fits": self.fits,
                "margin_bytes": self.margin_bytes, "phases": {p: self.phase_bytes(p) for p in self.phases},
                "components": [c.as_dict() for c in self.components], "settings": dict(self.settings)}

    def lines(self) -> list[str]:
        """A table for people (flashd bench): the peak and headroom, then one line per component."""
        budget = "" if self.budget_bytes is None else (f", budget {format_size(self.budget_bytes)}, headroom "
                                                       f"{format_size(self.headroom_bytes)}")
        settings = dict(self.settings)
        tree = ("" if "max_tree_nodes" not in settings else
                f"; target draft tree {settings['max_tree_nodes']} nodes ({settings.get('max_tree_nodes_from', '')})")
        out = [f"VRAM plan ({self.where}): peak {format_size(self.peak_bytes)} ({self.peak_phase}){budget}{tree}"]
        for c in self.components:
            inner = ", ".join(f"{what} {format_size(n)}" for what, n in c.parts)
            phases = ", ".join(p for p in PHASES if p in c.phases)
            out.append(f"  {c.label:<40} {format_size(c.bytes):>11}  ({inner}; {phases})")
        out.append(f"  {'safety margin':<40} {format_size(self.margin_bytes):>11}")
        return out


def refusal(action: str, plan: VramPlan, fixes: list[str]) -> str:
    """The message of a refused load: what was refused, the peak and its components against the budget,
    and what would fit (`fixes`, each a change and the peak it gives)."""
    over = plan.peak_bytes - (plan.budget_bytes or 0)
    text = (f"{action} does not fit --vram-budget {format_size(plan.budget_bytes or 0)}: the plan needs "
            f"{format_size(plan.peak_bytes)} {PHASE_TEXT[plan.peak_phase]}, {format_size(over)} over: "
            f"{plan.describe()}.")
    if fixes:
        text += " What would fit: " + "; ".join(fixes) + "."
    return text


def largest_fitting(plan_at: Callable[[int], VramPlan], lo: int, hi: int, step: int = 256) -> int | None:
    """The largest n in [lo, hi] whose plan fits (plans grow with n), rounded down to a multiple of
    `step` when that is still >= lo; None when not even `lo` fits."""
    if not plan_at(lo).fits:
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if plan_at(mid).fits:
            lo = mid
        else:
            hi = mid - 1
    rounded = lo // step * step
    return rounded if rounded >= step else lo
