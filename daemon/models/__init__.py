"""Models: GGUF reading, configs, tensor maps and forward passes."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .config import ModelConfig
from .gguf_file import GGUFFile, ModelLoadError
from .weights import ModelWeights, load_weights, total_weight_bytes

__all__ = ["LoadedModel", "open_model", "ModelLoadError", "ModelConfig", "forward_of", "make_cache"]


def forward_of(cfg: ModelConfig) -> Callable:
    """The forward pass of the model's family: models.dense.forward, or models.qwen35.forward for a hybrid."""
    if cfg.linear is not None:
        from .qwen35 import forward
    else:
        from .dense import forward
    return forward


def make_cache(ops, cfg: ModelConfig, max_ctx: int, kv_types=None, max_tree_nodes: int | None = None,
               max_rows: int = 512):
    """The model's cache: the backend's KV cache (dense), or K/V + recurrent state (models.qwen35.HybridCache).
    kv_types: the storage of K and V (backends.kv_types.KVTypes; None: f16). max_tree_nodes: a hybrid's bound on a
    verify forward's nodes, a recurrent state each (None: qwen35_tree.MAX_TREE_NODES); a dense cache has none.
    max_rows: the most rows one forward writes (KVCacheSpec.max_rows: a KV window's ring)."""
    from ..backends.base import KVCacheSpec
    from ..backends.kv_types import KVTypes
    kv_types = kv_types or KVTypes()
    if cfg.linear is not None:
        from .qwen35 import make_hybrid_cache
        return make_hybrid_cache(ops, cfg, max_ctx, kv_types, max_tree_nodes, max_rows)
    return ops.kv_cache(KVCacheSpec(cfg.n_layers, max_ctx, cfg.n_kv_heads, cfg.head_dim, kv_types, max_rows))


@dataclass(slots=True)
class LoadedModel:
    file: GGUFFile
    config: ModelConfig
    weights: ModelWeights | None      # None while parked
    file_weight_bytes: int            # bytes of the tensors as stored in the GGUF

    @property
    def path(self) -> Path:
        return self.file.path


def open_model(path: str | Path, rope_override: tuple | None = None) -> tuple[GGUFFile, ModelConfig]:
    """Open and validate a model file without loading weights (checks every tensor's shape and
    format, so a bad file fails here, before anything is allocated). rope_override: (kind, factor or
    None, orig_ctx or None), the user's RoPE scaling (ModelConfig.with_rope_override)."""
    f = GGUFFile(path)
    cfg = ModelConfig.from_gguf(f)
    if rope_override is not None:
        cfg = cfg.with_rope_override(*rope_override)
    total_weight_bytes(f, cfg)   # walks the tensor plan: missing/unsupported tensors raise now
    return f, cfg


def load_model(source: str | Path | tuple[GGUFFile, ModelConfig], load: Callable[[Any], Any],
               progress: Callable[[int], None] | None = None) -> LoadedModel:
    """Load every weight through `load` (the backend's). `source` is a path or an already opened
    (GGUFFile, ModelConfig) pair (opening a GGUF with a large vocabulary takes seconds)."""
    f, cfg = source if isinstance(source, tuple) else open_model(source)
    weights = load_weights(f, cfg, load, progress)
    return LoadedModel(file=f, config=cfg, weights=weights, file_weight_bytes=total_weight_bytes(f, cfg))
