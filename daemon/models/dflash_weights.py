"""Declarative GGUF tensor map of a DFlash drafter, and loading it into a backend.

    dflash.fc.weight            (hidden, n_features * hidden)  context projection
    dflash.hidden_norm.weight   (hidden,)                      RMSNorm after fc
    output_norm.weight          (hidden,)                      final RMSNorm (before the target's lm_head)
    blk.N.*                     a Qwen3 decoder layer: the dense family's LAYER_TENSORS with q/k norms

`fc` is stored as one matrix (as in the checkpoint) and split at load time into n_features column
blocks of (hidden, hidden): fc @ concat(h_1..h_n) == sum_j fc_j @ h_j, so the drafter consumes the
target's captured layer outputs as separate tensors and no backend needs a concatenation op. The
split is along whole quantization blocks, so it is exact for every weight format.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from .dflash_config import DFlashConfig
from .gguf_file import GGUFFile, ModelLoadError, TensorInfo
from .weights import LAYER_TENSORS, LayerWeights

__all__ = ["DFlashWeights", "DFLASH_GLOBAL_TENSORS", "dflash_tensor_plan", "load_dflash_weights",
           "split_columns", "dflash_weight_bytes", "open_dflash"]


@dataclass(slots=True)
class DFlashWeights:
    fc: list                    # n_features backend weights (hidden, hidden): fc's column blocks
    hidden_norm: Any
    output_norm: Any
    layers: list[LayerWeights]  # q/k norms set, no biases


# field -> (GGUF name, expected numpy shape given the config)
DFLASH_GLOBAL_TENSORS = {
    "fc": ("dflash.fc.weight", lambda c: (c.model.hidden, c.n_features * c.model.hidden)),
    "hidden_norm": ("dflash.hidden_norm.weight", lambda c: (c.model.hidden,)),
    "output_norm": ("output_norm.weight", lambda c: (c.model.hidden,)),
}


def _checked(f: GGUFFile, name: str, shape: tuple[int, ...]) -> TensorInfo:
    info = f.tensor(name)       # ModelLoadError naming the tensor when it is missing
    if info.shape != shape:
        raise ModelLoadError(f"{f.path.name}: tensor {name!r} has shape {info.shape}, expected {shape}")
    return info


def dflash_tensor_plan(f: GGUFFile, cfg: DFlashConfig) -> list[tuple[str, int | None, TensorInfo]]:
    """Every tensor the drafter needs, checked: (field, layer index or None, info)."""
    plan = [(field, None, _checked(f, name, shape(cfg))) for field, (name, shape) in DFLASH_GLOBAL_TENSORS.items()]
    for i in range(cfg.model.n_layers):
        for field, (name, shape, needed) in LAYER_TENSORS.items():
            if needed(cfg.model):
                plan.append((field, i, _checked(f, name.format(i=i), shape(cfg.model))))
    known = {info.name for _, _, info in plan}
    extra = sorted(set(f.names) - known)
    if extra:   # e.g. a DFlash2 checkpoint's conv/selector tensors: running without them would be wrong
        raise ModelLoadError(f"{f.path.name}: tensors this DFlash drafter does not use: {', '.join(extra[:8])}"
                             f"{' ...' if len(extra) > 8 else ''}")
    return plan


def split_columns(info: TensorInfo, n: int) -> list[TensorInfo]:
    """A 2-D tensor (rows, n * c) as n tensors (rows, c), cut between quantization blocks."""
    rows, cols = info.shape
    if cols % n:
        raise ModelLoadError(f"tensor {info.name!r}: {cols} columns do not split into {n} equal parts")
    c = cols // n
    if c % info.block_size:
        raise ModelLoadError(f"tensor {info.name!r}: a column block of {c} does not hold whole "
                             f"{info.qtype.name} blocks of {info.block_size}")
    blocks = np.asarray(info.blocks).reshape(rows, -1)
    step = blocks.shape[1] // n          # bytes (block formats) or elements (plain floats) per part
    return [replace(info, name=f"{info.name}[{j}]", shape=(rows, c),
                    blocks=np.ascontiguousarray(blocks[:, j * step:(j + 1) * step]))
            for j in range(n)]


def load_dflash_weights(f: GGUFFile, cfg: DFlashConfig, load: Callable[[TensorInfo], Any],
                        progress: Callable[[int], None] | None = None) -> DFlashWeights:
    """Hand every tensor to `load` (the backend's weight loader) and assemble DFlashWeights."""
    globals_: dict[str, Any] = {}
    layers: list[dict[str, Any]] = [{} for _ in range(cfg.model.n_layers)]
    for field, layer, info in dflash_tensor_plan(f, cfg):
        if field == "fc":
            globals_[field] = [load(part) for part in split_columns(info, cfg.n_features)]
        else:
            (globals_ if layer is None else layers[layer])[field] = load(info)
        if progress is not None:
            progress(info.n_bytes)
    return DFlashWeights(fc=globals_["fc"], hidden_norm=globals_["hidden_norm"],
                         output_norm=globals_["output_norm"], layers=[LayerWeights(**d) for d in layers])


def dflash_weight_bytes(f: GGUFFile, cfg: DFlashConfig) -> int:
    return sum(info.n_bytes for _, _, info in dflash_tensor_plan(f, cfg))


def open_dflash(path) -> tuple[GGUFFile, DFlashConfig]:
    """Open and validate a DFlash drafter GGUF without loading weights (every tensor's presence,
    shape and format is checked here, before anything is allocated)."""
    f = GGUFFile(path)
    cfg = DFlashConfig.from_gguf(f)
    dflash_tensor_plan(f, cfg)
    return f, cfg
