"""Declarative GGUF tensor-name map for the dense family, and loading into a backend.

A model's weights are a `ModelWeights` of backend tensors. Which GGUF tensor fills which field, and
whether it is required for the architecture, is data (`GLOBAL_TENSORS`, `LAYER_TENSORS`); the loader
walks the tables once and checks every shape against the config before handing blocks to the
backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .config import ModelConfig
from .gguf_file import GGUFFile, ModelLoadError, TensorInfo

__all__ = ["LayerWeights", "ModelWeights", "load_weights", "GLOBAL_TENSORS", "LAYER_TENSORS"]


@dataclass(slots=True)
class LayerWeights:
    attn_norm: Any
    attn_q: Any
    attn_k: Any
    attn_v: Any
    attn_output: Any
    ffn_norm: Any
    ffn_gate: Any
    ffn_up: Any
    ffn_down: Any
    attn_q_bias: Any = None     # qwen2
    attn_k_bias: Any = None
    attn_v_bias: Any = None
    attn_q_norm: Any = None     # qwen3: per-head RMSNorm weights, (head_dim,)
    attn_k_norm: Any = None


@dataclass(slots=True)
class ModelWeights:
    token_embd: Any
    output_norm: Any
    output: Any                 # lm_head; the same tensor as token_embd when tied
    layers: list[LayerWeights]


def _when(flag: str) -> Callable[[ModelConfig], bool]:
    return lambda cfg: getattr(cfg, flag)


def _always(cfg: ModelConfig) -> bool:
    return True


# field -> (GGUF name, expected numpy shape given the config, required-for-this-config predicate)
GLOBAL_TENSORS = {
    "token_embd": ("token_embd.weight", lambda c: (c.vocab_size, c.hidden), _always),
    "output_norm": ("output_norm.weight", lambda c: (c.hidden,), _always),
    "output": ("output.weight", lambda c: (c.vocab_size, c.hidden), lambda c: not c.tie_embeddings),
}
LAYER_TENSORS = {
    "attn_norm": ("blk.{i}.attn_norm.weight", lambda c: (c.hidden,), _always),
    "attn_q": ("blk.{i}.attn_q.weight", lambda c: (c.q_dim, c.hidden), _always),
    "attn_k": ("blk.{i}.attn_k.weight", lambda c: (c.kv_dim, c.hidden), _always),
    "attn_v": ("blk.{i}.attn_v.weight", lambda c: (c.kv_dim, c.hidden), _always),
    "attn_output": ("blk.{i}.attn_output.weight", lambda c: (c.hidden, c.q_dim), _always),
    "attn_q_bias": ("blk.{i}.attn_q.bias", lambda c: (c.q_dim,), _when("qkv_bias")),
    "attn_k_bias": ("blk.{i}.attn_k.bias", lambda c: (c.kv_dim,), _when("qkv_bias")),
    "attn_v_bias": ("blk.{i}.attn_v.bias", lambda c: (c.kv_dim,), _when("qkv_bias")),
    "attn_q_norm": ("blk.{i}.attn_q_norm.weight", lambda c: (c.head_dim,), _when("qk_norm")),
    "attn_k_norm": ("blk.{i}.attn_k_norm.weight", lambda c: (c.head_dim,), _when("qk_norm")),
    "ffn_norm": ("blk.{i}.ffn_norm.weight", lambda c: (c.hidden,), _always),
    "ffn_gate": ("blk.{i}.ffn_gate.weight", lambda c: (c.ffn, c.hidden), _always),
    "ffn_up": ("blk.{i}.ffn_up.weight", lambda c: (c.ffn, c.hidden), _always),
    "ffn_down": ("blk.{i}.ffn_down.weight", lambda c: (c.hidden, c.ffn), _always),
}


def _checked(f: GGUFFile, name: str, shape: tuple[int, ...]) -> TensorInfo:
    info = f.tensor(name)
    if info.shape != shape:
        raise ModelLoadError(f"{f.path.name}: tensor {name!r} has shape {info.shape}, expected {shape}")
    return info


def layer_table(cfg: ModelConfig, i: int) -> tuple[dict, type]:
    """The tensor table of layer i and the class its weights fill: LAYER_TENSORS / LayerWeights for the dense
    family, a hybrid's per-layer-type tables (qwen35_weights.py) otherwise."""
    if cfg.linear is not None:
        from .qwen35_weights import qwen35_layer_table
        return qwen35_layer_table(cfg, i)
    return LAYER_TENSORS, LayerWeights


def tensor_plan(f: GGUFFile, cfg: ModelConfig) -> list[tuple[str, int | None, TensorInfo]]:
    """Every tensor the model needs, checked: (field, layer index or None, info)."""
    plan = []
    for field, (name, shape, needed) in GLOBAL_TENSORS.items():
        if needed(cfg):
            plan.append((field, None, _checked(f, name, shape(cfg))))
    for i in range(cfg.n_layers):
        for field, (name, shape, needed) in layer_table(cfg, i)[0].items():
            if needed(cfg):
                plan.append((field, i, _checked(f, name.format(i=i), shape(cfg))))
    return plan


def load_weights(f: GGUFFile, cfg: ModelConfig, load: Callable[[TensorInfo], Any],
                 progress: Callable[[int], None] | None = None) -> ModelWeights:
    """Hand every needed tensor to `load` (the backend's weight loader) and assemble ModelWeights.

    `progress(n_bytes)` is called after each tensor, for progress bars.
    """
    plan = tensor_plan(f, cfg)
    globals_: dict[str, Any] = {}
    layers: list[dict[str, Any]] = [{} for _ in range(cfg.n_layers)]
    for field, layer, info in plan:
        (globals_ if layer is None else layers[layer])[field] = load(info)
        if progress is not None:
            progress(info.n_bytes)
    output = globals_.get("output", globals_["token_embd"])
    return ModelWeights(token_embd=globals_["token_embd"], output_norm=globals_["output_norm"],
                        output=output, layers=[layer_table(cfg, i)[1](**d) for i, d in enumerate(layers)])


def total_weight_bytes(f: GGUFFile, cfg: ModelConfig) -> int:
    return sum(info.n_bytes for _, _, info in tensor_plan(f, cfg))
