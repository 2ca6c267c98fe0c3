"""The trained drafter to the DFlash GGUF that `--draft` loads: scripts/convert_dflash.py's format, and back
(`load_drafter`: a file's weights dequantized into a TorchDrafter, for offline evaluation).

The metadata is written by dflash_config.write_metadata (the one writer of the schema) through
scripts/gguf_out.new_gguf (the file appears whole or not at all); matrices are Q8_0 (or F32 / F16 / BF16),
norms always F32, exactly as convert_dflash encodes them. The file is checked by opening it with the runtime's
own loader (`open_dflash`: every tensor's presence, shape and format) before `export` returns.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from flashd.daemon.models.dflash_config import DFLASH_ARCH, write_metadata
from flashd.daemon.models.dflash_weights import open_dflash
from flashd.scripts.gguf_out import new_gguf

__all__ = ["export", "load_drafter", "OUTTYPES"]

Q = gguf.GGMLQuantizationType
OUTTYPES = {"q8_0": Q.Q8_0, "f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16}


def _encode(x: np.ndarray, qtype: "gguf.GGMLQuantizationType") -> tuple[np.ndarray, "gguf.GGMLQuantizationType"]:
    if x.ndim == 1 or qtype == Q.F32:
        return x, Q.F32
    if qtype == Q.F16:
        return x.astype(np.float16), Q.F16
    return gguf.quants.quantize(x, qtype), qtype


def export(drafter, path: str | Path, outtype: str = "q8_0"):
    """Write the drafter (a train.drafter.TorchDrafter) to `path`; returns the DFlashConfig the file holds."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r} is not one of {', '.join(OUTTYPES)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    qtype = OUTTYPES[outtype]
    with new_gguf(path, DFLASH_ARCH) as writer:
        write_metadata(writer, drafter.cfg)
        for name, p in drafter.gguf_tensors().items():
            x = np.ascontiguousarray(p.detach().float().cpu().numpy(), dtype=np.float32)
            data, qt = _encode(x, qtype)
            writer.add_tensor(name, data, raw_dtype=qt)
    _, cfg = open_dflash(path)
    return cfg


def load_drafter(path: str | Path, device="cpu"):
    """A TorchDrafter holding the file's weights, dequantized to float32 (Q8_0 codes times their scales: the
    function the runtime computes, up to its own arithmetic). -> (drafter, DFlashConfig)."""
    from flashd.daemon.backends.reference import ReferenceOps

    from . import require_torch
    from .drafter import TorchDrafter
    torch = require_torch()
    f, cfg = open_dflash(path)
    drafter = TorchDrafter(cfg, max_pos=cfg.model.context_length)
    ops = ReferenceOps()
    with torch.no_grad():
        for name, param in drafter.gguf_tensors().items():
            w = np.array(ops.load_weight(f.tensor(name)), dtype=np.float32)     # a writable copy
            if tuple(w.shape) != tuple(param.shape):
                raise ValueError(f"{Path(path).name}: tensor {name} has shape {w.shape}, the drafter {tuple(param.shape)}")
            param.copy_(torch.from_numpy(w))
    return drafter.to(device), cfg
