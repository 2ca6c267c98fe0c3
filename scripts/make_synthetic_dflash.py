"""Synthetic DFlash drafters: random weights matched to a (synthetic or real) target's shapes.

The file has exactly the layout `scripts/convert_dflash.py` writes for a real z-lab checkpoint
(`daemon/models/dflash_weights.py` names the tensors, `dflash_config.write_metadata` the keys), so
the loader, the forward on every backend and the speculative decoder can run end to end on CPU
without real weights.

    python -m flashd.scripts.make_synthetic_dflash OUT.gguf --target TARGET.gguf [--layers 2] ...

What a weight IS is `gguf.quants.dequantize` of the stored bytes; `float_tensor(spec, name)`
regenerates the float32 weights a tensor was encoded from (deterministic per tensor name).
"""
from __future__ import annotations

import argparse
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES

from flashd.daemon.models.dflash_config import DFLASH_ARCH, DFlashConfig, write_metadata
from flashd.daemon.models.dflash_weights import DFLASH_GLOBAL_TENSORS
from flashd.daemon.models.weights import LAYER_TENSORS
from flashd.scripts.gguf_out import new_gguf
from flashd.scripts.make_synthetic_gguf import NORM_WEIGHT_STD, encode_tensor

__all__ = ["SyntheticDFlashSpec", "write_synthetic_dflash", "float_tensor", "spec_for_target", "evenly_spaced_layers"]


# Settings one a line with their defaults: alike in shape to other settings records (record_reference_outputs.py's
# RecordingConfig), with nothing in common to share.
@dataclass(slots=True, frozen=True)
class SyntheticDFlashSpec:
    hidden: int                          # must equal the target's hidden size
    target_layer_ids: tuple[int, ...]    # must name layers of the target
    mask_token_id: int                   # must be inside the target's vocabulary
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 128
    block_size: int = 8
    rope_theta: float = 1e7              # z-lab's Qwen3.5 drafters use 1e7: not the 1e4/1e6 defaults
    rms_eps: float = 1e-6
    weight_type: str = "Q8_0"            # 2-D matrices; norms stay F32
    seed: int = 0
    name: str = "synthetic dflash"

    def __post_init__(self):
        self.config()                    # DFlashConfig's checks (ModelLoadError with the reason)
        if self.weight_type not in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K"):
            raise ValueError(f"weight_type {self.weight_type!r} is not a format flashd runs")
        bs = GGML_QUANT_SIZES[gguf.GGMLQuantizationType[self.weight_type]][0]
        for cols in (self.hidden, self.q_dim, self.ffn):
            if cols % bs:
                raise ValueError(f"row length {cols} is not a multiple of the {self.weight_type} block size {bs}")

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    def config(self) -> DFlashConfig:
        model = DFlashConfig.decoder(n_layers=self.n_layers, hidden=self.hidden, n_heads=self.n_heads,
                                     n_kv_heads=self.n_kv_heads, head_dim=self.head_dim, ffn=self.ffn,
                                     rope_theta=self.rope_theta, rms_eps=self.rms_eps, name=self.name)
        return DFlashConfig(model=model, block_size=self.block_size, mask_token_id=self.mask_token_id,
                            target_layer_ids=tuple(self.target_layer_ids))


def evenly_spaced_layers(n_target_layers: int, n: int) -> tuple[int, ...]:
    """n distinct layer ids spread over the target as z-lab spreads them: round(1 + k (L - 4) / (n - 1)),
    e.g. 1, 16, 31, 46, 61 for L = 64 and 1, 9, 17, 25, 33 for L = 36; over 0 .. L-2 when the target
    is too shallow for that. Never the last layer (its HF feature is the final-normed state, see
    DFlashConfig.check_target), so a target needs >= 2 layers and gets at most L - 1 ids."""
    if n_target_layers < 2:
        raise ValueError(f"a DFlash drafter needs a target of >= 2 layers (not the last one), got {n_target_layers}")
    n = min(n, n_target_layers - 1)
    if n == 1:
        return (max(0, n_target_layers - 3),)
    lo, hi = (1, n_target_layers - 3) if n_target_layers - 3 >= n else (0, n_target_layers - 2)
    return tuple(int(round(lo + k * (hi - lo) / (n - 1))) for k in range(n))


def spec_for_target(target_hidden: int, target_layers: int, target_vocab: int, *, n_features: int = 2,
                    **fields) -> SyntheticDFlashSpec:
    """A drafter for a target of these shapes; the mask token is the target's last id unless given."""
    fields.setdefault("target_layer_ids", evenly_spaced_layers(target_layers, n_features))
    fields.setdefault("mask_token_id", target_vocab - 1)
    return SyntheticDFlashSpec(hidden=target_hidden, **fields)


def tensor_plan(spec: SyntheticDFlashSpec) -> list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType, float, float]]:
    """(name, numpy shape, type, mean, std) of every tensor, in file order."""
    cfg = spec.config()
    matrix = gguf.GGMLQuantizationType[spec.weight_type]
    f32 = gguf.GGMLQuantizationType.F32
    plan = []

    def add(name, shape, out_scale=1.0):
        if len(shape) == 1:
            plan.append((name, shape, f32, 1.0, NORM_WEIGHT_STD))
        else:   # std 1/sqrt(fan_in) keeps activations O(1); residual writers scaled down by depth
            plan.append((name, shape, matrix, 0.0, out_scale / np.sqrt(shape[1])))

    for _, (name, shape) in DFLASH_GLOBAL_TENSORS.items():
        add(name, shape(cfg))
    residual_scale = 1.0 / np.sqrt(2 * cfg.model.n_layers)
    for i in range(cfg.model.n_layers):
        for field, (name, shape, needed) in LAYER_TENSORS.items():
            if needed(cfg.model):
                add(name.format(i=i), shape(cfg.model), residual_scale if field in ("attn_output", "ffn_down") else 1.0)
    return plan


def _floats(spec: SyntheticDFlashSpec, name: str, shape, mean: float, std: float) -> np.ndarray:
    rng = np.random.default_rng([spec.seed, zlib.crc32(name.encode())])
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)


def float_tensor(spec: SyntheticDFlashSpec, name: str) -> np.ndarray:
    for n, shape, _, mean, std in tensor_plan(spec):
        if n == name:
            return _floats(spec, n, shape, mean, std)
    raise KeyError(f"no tensor {name!r} in this DFlash drafter")


def write_synthetic_dflash(path: str | Path, spec: SyntheticDFlashSpec) -> Path:
    path = Path(path)
    with new_gguf(path, DFLASH_ARCH) as writer:
        write_metadata(writer, spec.config())
        for name, shape, qtype, mean, std in tensor_plan(spec):
            data = encode_tensor(_floats(spec, name, shape, mean, std), qtype)
            writer.add_tensor(name, data, raw_dtype=qtype)   # the writer derives the shape from the bytes
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashd.scripts.make_synthetic_dflash",
                                description="Write a DFlash drafter GGUF with random weights for a target GGUF.")
    p.add_argument("out", type=Path)
    p.add_argument("--target", type=Path, required=True, help="the target model GGUF (hidden, layers, vocab)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=None, help="default: 64 if hidden >= 256 else 16")
    p.add_argument("--ffn", type=int, default=None, help="default: 2 x hidden")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--features", type=int, default=5, help="how many target layers feed the context")
    p.add_argument("--rope-theta", type=float, default=1e7)
    p.add_argument("--type", default="Q8_0")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from flashd.daemon.models import ModelLoadError, open_model
    _, target = open_model(args.target)
    try:
        spec = spec_for_target(target.hidden, target.n_layers, target.vocab_size, n_features=args.features,
                               n_layers=args.layers, n_heads=args.heads, n_kv_heads=args.kv_heads,
                               head_dim=args.head_dim or (64 if target.hidden >= 256 else 16),
                               ffn=args.ffn or 2 * target.hidden, block_size=args.block_size,
                               rope_theta=args.rope_theta, weight_type=args.type.upper(), seed=args.seed)
    except (ValueError, ModelLoadError) as exc:
        p.error(str(exc))
    write_synthetic_dflash(args.out, spec)
    print(f"wrote {args.out}: {spec}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
