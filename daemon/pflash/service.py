"""PrefillCompressor: what the engine calls for `compress`, `generate compress=...`, `park/unpark
draft` and `free drafter`.

It owns at most one loaded drafter (a second model on the target's backend, with its own ops so
that its activation arena never disturbs the target's captured decode graph). Compression:

    target ids --(same vocabulary: as is | else: target detokenize -> drafter tokenize)--> drafter ids
    drafter forward with FlashPrefill attention -> (T, S) tail maxima -> kept positions
    kept drafter ids --(same vocabulary: as is | else: drafter detokenize -> target tokenize)--> ids

Errors are ProtocolErrors with the daemon's codes: a drafter file that cannot be opened is
`bad_request`, no drafter configured or given is `not_loaded`.
"""
from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import dataclass

from ...protocol.errors import ProtocolError
from ..models import ModelLoadError, load_model, open_model
from ..models.weights import total_weight_bytes
from .config import PFlashBand, PFlashConfig
from .drafter import Drafter
from .selection import kept_positions

__all__ = ["PrefillCompressor", "Compressed", "compressed_fields", "drafter_token_limit"]

log = logging.getLogger("flashd.pflash")


@dataclass(slots=True, frozen=True)
class Compressed:
    ids: list[int]            # the kept prompt, target token ids, in order
    n_in: int                 # target tokens in
    n_out: int
    drafter_tokens: int       # tokens the drafter scored
    ms: float                 # wall time of the whole compression (load excluded)
    load_ms: float            # drafter load time (0 when it was resident)
    keep: float               # the setting it ran with (the request's, else the length band's: PFlashConfig.setting)
    first_layer: int          # scoring layers [first_layer, layers) of the drafter
    layers: int


class PrefillCompressor:
    def __init__(self, backend, config: PFlashConfig, default_path: str | None, target_tokenizer,
                 rope_override: tuple | None = None):
        self.backend, self.config = backend, config
        # --rope-scaling (EngineConfig.rope_override) reaches the drafter too: it scores the target's prompt, so it
        # must see the same positions (Qwen2.5-Coder 0.5B / 1.5B: YaRN x4 for 128K on both; orig_ctx defaults to
        # the drafter's own trained context)
        self.rope_override = rope_override
        self.default_path = default_path
        self.target_tokenizer = target_tokenizer
        self.drafter: Drafter | None = None
        self.parked_path: str | None = None     # parked: weights released, reloaded on unpark
        self.admit = None                       # the engine's --vram-budget check of a load (check())
        self._kept_open = None                  # (realpath, GGUFFile, ModelConfig) from check(keep_open=True)
        self._same_vocab: dict[str, bool] = {}

    # -- lifecycle -------------------------------------------------------------------------------
    def _drafter_ops(self, cfg):
        if self.backend.name != "cuda":
            return self.backend.ops               # the reference ops hold no per-forward state
        from ..backends.cuda.ops import CudaOps
        ops = CudaOps(self.backend.device)
        ops.reserve_scratch(max(cfg.q_dim * cfg.hidden, cfg.ffn * cfg.hidden, cfg.kv_dim * cfg.hidden))
        return ops

    def check(self, path: str | None = None, keep_open: bool = False):
        """What load(path) would refuse, before anything is allocated: no drafter, not a model file, or (the
        engine's `admit(path, file, config)`, raising ProtocolError) over --vram-budget. Returns (path, file,
        config) of the drafter to load, or None when it is the one loaded. keep_open: the next check of the
        same file reuses this one's opened file (opening a large vocabulary takes a second)."""
        kept, self._kept_open = self._kept_open, None
        path = path or self.default_path or self.parked_path
        if path is None:
            raise ProtocolError("not_loaded", "no prefill drafter: start the daemon with --prefill-drafter or "
                                              "pass drafter=PATH")
        if self.drafter is not None and os.path.realpath(self.drafter.path) == os.path.realpath(path):
            return None
        if not os.path.isfile(path):
            raise ProtocolError("bad_request", f"drafter: {path} is not a file")
        if kept is not None and kept[0] == os.path.realpath(path):
            f, cfg = kept[1:]
        else:
            try:
                f, cfg = open_model(path, self.rope_override)
            except ModelLoadError as exc:
                raise ProtocolError("bad_request", f"drafter: {exc}") from None
        check_head_dim = getattr(self.backend, "check_pflash_drafter", None)   # CudaBackend: PFlash's kernels' shapes
        if check_head_dim is not None:
            try:
                check_head_dim(cfg)
            except ModelLoadError as exc:
                raise ProtocolError("bad_request", f"drafter: {exc}") from None
        if self.admit is not None:
            self.admit(path, f, cfg)
        if keep_open:
            self._kept_open = (os.path.realpath(path), f, cfg)
        return path, f, cfg

    def load(self, path: str | None = None) -> tuple[Drafter, float]:
        """The drafter at `path` (default: the configured one), loading it if needed; returns it
        and the load time in ms (0 when already resident)."""
        from ...clients.tokenizer import Tokenizer

        t0 = time.perf_counter()
        opened = self.check(path)
        if opened is None:
            return self.drafter, 0.0
        path, f, cfg = opened
        if self.backend.name == "cuda":
            plan = self.backend.plan(cfg, total_weight_bytes(f, cfg), self.config.forward_chunk,
                                     self.config.forward_chunk)
            try:
                self.backend.check_fits(plan)
            except MemoryError as exc:
                raise ProtocolError("oom", f"drafter: {exc}") from None
        self.free()
        ops = self._drafter_ops(cfg)
        model = load_model((f, cfg), ops.load_weight)
        self.drafter = Drafter(ops, model, Tokenizer.from_gguf(f.metadata_dict), self.config)
        self.parked_path = None
        self._shares_vocab(self.drafter)         # compares every token once (~0.3 s at 150K): part of loading
        ms = (time.perf_counter() - t0) * 1e3
        log.info("prefill drafter %s loaded in %.0f ms", path, ms)
        return self.drafter, ms

    def free(self) -> bool:
        """Unload the drafter (and forget a parked one); True if there was one."""
        had = self.drafter is not None or self.parked_path is not None
        self.drafter = None
        self.parked_path = None
        gc.collect()                              # device buffers are freed when unreferenced
        return had

    def park(self) -> None:
        if self.drafter is not None:
            self.parked_path = str(self.drafter.path)
            self.drafter = None
            gc.collect()

    def unpark(self) -> None:
        if self.drafter is None and self.parked_path is not None:
            self.load(self.parked_path)

    def status(self) -> dict:
        d = self.drafter
        return {"path": str(d.path) if d else self.parked_path or self.default_path,
                "loaded": d is not None, "parked": self.parked_path is not None,
                "policy": self.config.drafter_policy,
                "weights_bytes": int(d.model.file_weight_bytes) if d else 0}

    # -- compression -----------------------------------------------------------------------------
    def _shares_vocab(self, drafter: Drafter) -> bool:
        key = str(drafter.path)
        if key not in self._same_vocab:
            a, b = self.target_tokenizer, drafter.tokenizer
            self._same_vocab[key] = a.vocab_size == b.vocab_size and all(
                a.token_bytes(i) == b.token_bytes(i) for i in range(a.vocab_size))
        return self._same_vocab[key]

    def wants(self, mode: str, n_prompt: int, threshold: int | None) -> bool:
        """Whether a generate with compress=`mode` compresses a prompt of n_prompt tokens."""
        if mode == "always":
            return True
        return mode == "auto" and n_prompt > (threshold if threshold is not None else self.config.threshold)

    def setting(self, n_prompt: int, drafter_path: str | None = None) -> PFlashBand:
        """What a compression of n_prompt target tokens uses where the request does not say: the configured
        drafter's length band (PFlashConfig.setting: its calibration's bands); a drafter the request names runs
        with the config's own keep and window (the bands were measured on the configured one)."""
        c = self.config
        if drafter_path is not None and (self.default_path is None
                                         or os.path.realpath(drafter_path) != os.path.realpath(self.default_path)):
            return PFlashBand(0, c.keep, c.score_layers, c.score_from)
        return c.setting(n_prompt)

    def compress(self, ids: list[int], keep: float | None = None, drafter_path: str | None = None,
                 alpha: float | None = None, layers: int | None = None,
                 first_layer: int | None = None) -> Compressed:
        """keep None: the length band's (setting()); layers and first_layer both None: the band's scoring window,
        else the one given with the config's default for the other (Drafter.score_window)."""
        band = self.setting(len(ids), drafter_path)
        if keep is None:
            keep = band.keep
        if layers is None and first_layer is None:
            layers, first_layer = band.score_layers, band.score_from
        if not 0.0 < keep <= 1.0:
            raise ProtocolError("bad_request", f"keep: must be in (0, 1], got {keep}")
        drafter, load_ms = self.load(drafter_path)
        try:
            first_layer, end = drafter.score_window(layers, first_layer)
        except ValueError as exc:
            raise ProtocolError("bad_request", f"layers/first_layer: {exc}") from None
        t0 = time.perf_counter()
        same = self._shares_vocab(drafter)
        if same:
            d_ids = list(ids)
        else:
            d_ids = drafter.tokenizer.encode(self.target_tokenizer.decode(ids))
        bad = [t for t in d_ids if not 0 <= t < drafter.model.config.vocab_size]
        if bad:
            raise ProtocolError("bad_request", f"ids: token id {bad[0]} is outside the drafter's vocabulary")
        if not d_ids:
            raise ProtocolError("bad_request", "ids: the prompt is empty in the drafter's vocabulary")
        trained = drafter_token_limit(drafter.model.config)
        if len(d_ids) > trained:          # RoPE past the trained length scores garbage
            raise ProtocolError("ctx_overflow", f"compress: {len(d_ids)} drafter tokens > the drafter's trained "
                                                f"context {trained} (a model card's YaRN setting, --rope-scaling, "
                                                f"extends the drafter with the target)")
        probs = drafter.tail_probs(d_ids, alpha, end, first_layer)
        pc = self.config
        kept = kept_positions(probs, keep, pc.chunk_tokens, pc.smooth_tokens, pc.first_chunks, pc.last_chunks)
        kept_ids = [int(d_ids[i]) for i in kept]
        if not same:
            kept_ids = self.target_tokenizer.encode(drafter.tokenizer.decode(kept_ids))
        ms = (time.perf_counter() - t0) * 1e3
        return Compressed(ids=kept_ids, n_in=len(ids), n_out=len(kept_ids), drafter_tokens=len(d_ids),
                          ms=round(ms, 3), load_ms=round(load_ms, 3), keep=keep, first_layer=first_layer, layers=end)


def drafter_token_limit(cfg) -> int:
    """The longest prompt (in drafter tokens) a drafter scores: the positions it is meant to see (its trained
    context, or orig_ctx * factor under --rope-scaling: ModelConfig.max_context). The VRAM plan sizes the drafter's
    per-compression memory for it (vram_sizes.py)."""
    return cfg.max_context


def compressed_fields(c: Compressed) -> dict:
    """The result/done-event fields describing a compression."""
    return {"n_in": c.n_in, "n_out": c.n_out, "ms": c.ms, "load_ms": c.load_ms,
            "drafter_tokens": c.drafter_tokens, "keep": c.keep, "first_layer": c.first_layer, "layers": c.layers}


