"""PFlashConfig: the knobs of FlashPrefill attention and of chunk selection (ARCHITECTURE.md, PFlash)."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PFlashConfig", "PFlashBand", "COMPRESS_MODES", "DRAFTER_POLICIES"]

COMPRESS_MODES = ("off", "auto", "always")
# resident: the drafter stays loaded next to the target. park: the 24 GB choreography -- park the
# target, load the drafter, compress, free the drafter, unpark the target.
DRAFTER_POLICIES = ("resident", "park")


@dataclass(slots=True, frozen=True)
class PFlashBand:
    """The compress setting of prompts from `from_tokens` tokens up to the next band's from_tokens (a drafter's
    calibration by prompt length, `flashd pflash-calibrate`; calibration_store.pflash_bands)."""

    from_tokens: int            # the band's first prompt length (target tokens); the first band's is 0
    keep: float                 # as PFlashConfig.keep
    score_layers: int           # as PFlashConfig.score_layers (0 = all)
    score_from: int             # as PFlashConfig.score_from

    def __post_init__(self):
        if self.from_tokens < 0:
            raise ValueError(f"band from_tokens must be >= 0, got {self.from_tokens}")
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"band keep must be in (0, 1], got {self.keep}")
        if self.score_layers < 0:
            raise ValueError(f"band score_layers must be >= 0 (0 = every layer), got {self.score_layers}")
        if self.score_from < 0 or (self.score_layers and self.score_from >= self.score_layers):
            raise ValueError(f"band score_from must be >= 0 and below score_layers, got {self.score_from} "
                             f"(score_layers {self.score_layers})")


@dataclass(slots=True, frozen=True)
class PFlashConfig:
    block: int = 128            # FlashPrefill block (tokens) for queries and keys; fixed by the kernels
    alpha: float = 0.7          # keep key block n when its score >= alpha * the row's max score (FlashPrefill
                                # upstream's default, tuned on the same normalised scores)
    sink_blocks: int = 2        # key blocks [0, sink) always kept
    window_blocks: int = 4      # key blocks with m - n < window always kept (includes the diagonal)
    last_full_blocks: int = 2   # the last query blocks of the prompt attend densely
    tail_tokens: int = 8        # T: the last T prompt tokens score every token by dense attention
    smooth_tokens: int = 13     # centred moving average of the importance (odd)
    chunk_tokens: int = 32      # selection granularity
    first_chunks: int = 1       # always kept at the start of the prompt (PFlash's rule: 1)
    last_chunks: int = 1        # always kept at the end, where the question usually is (PFlash's rule: 1)
    forward_chunk: int = 4096   # drafter forward: tokens per forward (a multiple of block)
    score_layers: int = 0       # drafter layers run to score tokens: the first N (0 = all). Later layers are
                                # optional work: fewer layers, less prefill time (the drafter's forward is
                                # most of a compression's time)
    score_from: int = 0         # the first layer whose attention scores (earlier layers run but do not count:
                                # the first layers' attention is local and sink-heavy, and as part of a max
                                # it can hide the needle -- bench/results/*-pflash-layer-windows-*.md)
    keep: float = 0.05          # default kept fraction of chunks, (0, 1]
    mode: str = "off"           # the generate default: off | auto | always
    threshold: int = 32000      # auto: compress prompts longer than this many tokens
    drafter_policy: str = "resident"
    bands: tuple[PFlashBand, ...] = ()   # by prompt length, what a compression the request does not set uses (keep,
                                         # scoring window); empty: keep / score_layers / score_from at every length

    def __post_init__(self):
        if self.block != 128:
            raise ValueError(f"PFlashConfig.block must be 128 (the kernels' block), got {self.block}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        for name in ("sink_blocks", "window_blocks", "last_full_blocks"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.window_blocks < 1:
            raise ValueError("window_blocks must be >= 1 (the diagonal block is always attended)")
        if not 1 <= self.tail_tokens <= self.block:
            raise ValueError(f"tail_tokens must be in [1, {self.block}], got {self.tail_tokens}")
        if self.chunk_tokens < 1 or self.first_chunks < 0 or self.last_chunks < 0:
            raise ValueError("chunk_tokens must be >= 1, first_chunks and last_chunks >= 0")
        if self.smooth_tokens < 1 or self.smooth_tokens % 2 == 0:
            raise ValueError(f"smooth_tokens must be odd and >= 1, got {self.smooth_tokens}")
        if self.forward_chunk < self.block or self.forward_chunk % self.block:
            raise ValueError(f"forward_chunk must be a positive multiple of {self.block}")
        if self.score_layers < 0:
            raise ValueError(f"score_layers must be >= 0 (0 = every layer), got {self.score_layers}")
        if self.score_from < 0 or (self.score_layers and self.score_from >= self.score_layers):
            raise ValueError(f"score_from must be >= 0 and below score_layers, got {self.score_from} "
                             f"(score_layers {self.score_layers})")
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"keep must be in (0, 1], got {self.keep}")
        if self.mode not in COMPRESS_MODES:
            raise ValueError(f"mode must be one of {', '.join(COMPRESS_MODES)}, got {self.mode!r}")
        if self.threshold < 1:
            raise ValueError(f"threshold must be >= 1, got {self.threshold}")
        if self.drafter_policy not in DRAFTER_POLICIES:
            raise ValueError(f"drafter_policy must be one of {', '.join(DRAFTER_POLICIES)}")
        if not isinstance(self.bands, tuple) or not all(isinstance(b, PFlashBand) for b in self.bands):
            raise ValueError("bands must be a tuple of PFlashBand")
        if self.bands and self.bands[0].from_tokens != 0:
            raise ValueError(f"the first band must start at 0 tokens (every length has a band), got "
                             f"{self.bands[0].from_tokens}")
        starts = [b.from_tokens for b in self.bands]
        if any(a >= b for a, b in zip(starts, starts[1:])):
            raise ValueError(f"bands must start at increasing prompt lengths, got {starts}")

    def setting(self, n_tokens: int) -> PFlashBand:
        """The band a prompt of n_tokens target tokens compresses with: the last band starting at or below it (with
        no bands, this config's keep and scoring window)."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        chosen = PFlashBand(0, self.keep, self.score_layers, self.score_from)
        for band in self.bands:
            if band.from_tokens <= n_tokens:
                chosen = band
        return chosen
