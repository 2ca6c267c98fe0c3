"""Convert a z-lab DFlash drafter checkpoint (config.json + *.safetensors) to flashd's DFlash GGUF.

    python -m flashd.scripts.convert_dflash CHECKPOINT_DIR OUT.gguf [--outtype auto|f32|f16|bf16|q8_0]

Kept from the config exactly (the anchor's converter wrote rope theta 1e6 where the config said
1e7): rope theta, block size, mask token id and target layer ids (`dflash_config.*`, falling back
to top-level keys as z-lab's loader does), plus the Qwen3 shapes. Refused with a clear error
rather than converted into something that would draft differently: sliding-window or causal
drafter layers, attention biases, RoPE scaling, logit multipliers/soft-capping, embedding scales,
and tensors the DFlash model does not have (DFlash2's convolutions and candidate selector).

Checkpoint tensors (HF names, [out, in] row-major == flashd's numpy (rows, cols), no transposes):
    fc.weight, hidden_norm.weight, norm.weight,
    layers.N.{input_layernorm, post_attention_layernorm}.weight,
    layers.N.self_attn.{q_proj, k_proj, v_proj, o_proj, q_norm, k_norm}.weight,
    layers.N.mlp.{gate_proj, up_proj, down_proj}.weight
safetensors is read here directly (8-byte little-endian header length, a JSON header, raw
little-endian arrays), memory-mapped; no torch.
"""
from __future__ import annotations

import argparse
import json
import re
import struct
import sys
from pathlib import Path

import gguf
import numpy as np

from flashd.daemon.models.dflash_config import DFLASH_ARCH, DFlashConfig, write_metadata
from flashd.daemon.models.gguf_file import ModelLoadError
from flashd.scripts.gguf_out import new_gguf

__all__ = ["ConversionError", "read_safetensors", "config_from_hf", "gguf_name", "convert"]


class ConversionError(ValueError):
    """The checkpoint cannot be converted faithfully; the message says what and why."""


# -- safetensors ---------------------------------------------------------------------------------

_ST_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}   # BF16 kept as raw bits


def read_safetensors(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (safetensors dtype, memory-mapped array in the file's shape); BF16 as uint16 bits."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ConversionError(f"{path}: not a safetensors file (shorter than its header length)")
        (n,) = struct.unpack("<Q", head)
        try:
            header = json.loads(fh.read(n))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConversionError(f"{path}: unreadable safetensors header ({exc})") from exc
    data_start = 8 + n
    size = path.stat().st_size
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = meta.get("dtype")
        if dtype not in _ST_DTYPES:
            raise ConversionError(f"{path}: tensor {name!r} has dtype {dtype}; supported: {', '.join(_ST_DTYPES)}")
        shape = tuple(int(d) for d in meta["shape"])
        begin, end = (int(o) for o in meta["data_offsets"])
        nbytes = int(np.prod(shape, dtype=np.int64)) * _ST_DTYPES[dtype].itemsize
        if end - begin != nbytes or data_start + end > size:
            raise ConversionError(f"{path}: tensor {name!r} ({dtype} {list(shape)}) has data offsets "
                                  f"[{begin}, {end}) that do not fit its shape or the file")
        arr = np.memmap(path, dtype=_ST_DTYPES[dtype], mode="r", offset=data_start + begin, shape=shape)
        out[name] = (dtype, arr)
    return out


# -- config --------------------------------------------------------------------------------------

def _draft_value(cfg: dict, key: str, default=...):
    """z-lab's lookup: dflash_config first, then the top level."""
    sub = cfg.get("dflash_config") or {}
    if key in sub:
        return sub[key]
    if key in cfg:
        return cfg[key]
    if default is ...:
        raise ConversionError(f"config.json has no {key!r} (neither in dflash_config nor at the top level)")
    return default


def _rope_theta(cfg: dict) -> float:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    for p in (params, scaling):
        kind = p.get("rope_type", p.get("type", "default"))
        if kind not in ("default", None):
            raise ConversionError(f"config.json: RoPE type {kind!r} is not supported (only plain RoPE)")
    theta = cfg.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        raise ConversionError("config.json has no rope_theta (top level or rope_parameters): refusing to guess it")
    return float(theta)


def config_from_hf(cfg: dict, name: str = "") -> DFlashConfig:
    """The DFlashConfig of a z-lab config.json, refusing what flashd's DFlash forward does not run."""
    if cfg.get("attention_bias"):
        raise ConversionError("config.json: attention_bias is true; flashd's DFlash layers have no biases")
    layer_types = set(cfg.get("layer_types") or ["full_attention"])
    if layer_types != {"full_attention"} or cfg.get("use_sliding_window"):
        raise ConversionError(f"config.json: layer types {sorted(layer_types)} / use_sliding_window: only "
                              f"full (non-windowed) attention drafter layers are supported")
    if cfg.get("is_causal") or _draft_value(cfg, "is_causal", False):
        raise ConversionError("config.json: is_causal is true; flashd drafts with non-causal block attention")
    for key, neutral in (("output_multiplier", 1.0), ("input_embedding_scale", 1.0)):
        if float(_draft_value(cfg, key, neutral)) != neutral:
            raise ConversionError(f"config.json: {key} = {_draft_value(cfg, key)} is not supported")
    if _draft_value(cfg, "final_logit_softcapping", None) not in (None, 0, 0.0):
        raise ConversionError("config.json: final_logit_softcapping is not supported")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConversionError(f"config.json: hidden_act {act!r} is not supported (SwiGLU with silu)")
    try:
        hidden = int(cfg["hidden_size"])
        n_heads = int(cfg["num_attention_heads"])
        return DFlashConfig(
            model=DFlashConfig.decoder(
                n_layers=int(cfg["num_hidden_layers"]),
                hidden=hidden,
                n_heads=n_heads,
                n_kv_heads=int(cfg.get("num_key_value_heads", n_heads)),
                head_dim=int(cfg.get("head_dim") or hidden // n_heads),
                ffn=int(cfg["intermediate_size"]),
                rope_theta=_rope_theta(cfg),
                rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                context_length=int(cfg.get("max_position_embeddings", 32768)),
                name=name,
            ),
            block_size=int(_draft_value(cfg, "block_size", 16)),      # z-lab's loader defaults to 16 too
            mask_token_id=int(_draft_value(cfg, "mask_token_id")),
            target_layer_ids=tuple(int(i) for i in _draft_value(cfg, "target_layer_ids")),
        )
    except KeyError as exc:
        raise ConversionError(f"config.json has no {exc.args[0]!r}") from exc
    except ModelLoadError as exc:
        raise ConversionError(f"config.json: {exc}") from exc


# -- tensor names --------------------------------------------------------------------------------

_GLOBAL_NAMES = {"fc.weight": "dflash.fc.weight", "hidden_norm.weight": "dflash.hidden_norm.weight",
                 "norm.weight": "output_norm.weight"}
_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)\.weight$")


def gguf_name(hf_name: str) -> str | None:
    """The GGUF name of a checkpoint tensor, or None if the DFlash model has no such tensor."""
    name = hf_name[len("model."):] if hf_name.startswith("model.") else hf_name
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"blk.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.weight"
    return None


# -- conversion ----------------------------------------------------------------------------------

def _to_f32(dtype: str, arr: np.ndarray) -> np.ndarray:
    if dtype == "BF16":
        return (np.asarray(arr, np.uint32) << 16).view(np.float32)
    return np.asarray(arr, np.float32)


_OUTTYPES = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}


def _encode(dtype: str, arr: np.ndarray, outtype: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """(data for GGUFWriter.add_tensor, its type). Norms (1-D) are always F32."""
    Q = gguf.GGMLQuantizationType
    if arr.ndim == 1:
        return _to_f32(dtype, arr), Q.F32
    target = {"BF16": "bf16", "F16": "f16", "F32": "f32"}[dtype] if outtype == "auto" else outtype
    if target == "bf16" and dtype == "BF16":
        return np.ascontiguousarray(arr).view(np.uint8), Q.BF16          # the bits as they are
    if target == "f16" and dtype == "F16":
        return np.ascontiguousarray(arr), Q.F16
    x = _to_f32(dtype, arr)
    if target == "f32":
        return x, Q.F32
    if target == "f16":
        return x.astype(np.float16), Q.F16
    return gguf.quants.quantize(x, _OUTTYPES[target]), _OUTTYPES[target]


def convert(checkpoint: Path, out: Path, outtype: str = "auto", name: str | None = None) -> DFlashConfig:
    """Write the GGUF; returns the config it holds. ConversionError for anything not faithful."""
    checkpoint = Path(checkpoint)
    if outtype != "auto" and outtype not in _OUTTYPES:
        raise ConversionError(f"outtype {outtype!r} is not one of auto, {', '.join(_OUTTYPES)}")
    config_path = checkpoint / "config.json"
    if not config_path.is_file():
        raise ConversionError(f"{checkpoint}: no config.json")
    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{checkpoint}: no *.safetensors files")
    cfg = config_from_hf(json.loads(config_path.read_text()), name or checkpoint.name)

    tensors: dict[str, tuple[str, np.ndarray]] = {}
    for f in files:
        for hf_name, value in read_safetensors(f).items():
            target = gguf_name(hf_name)
            if target is None:
                raise ConversionError(f"{f.name}: tensor {hf_name!r} is not part of a DFlash drafter "
                                      f"(DFlash2 convolutions/selectors and embeddings are not supported)")
            if target in tensors:
                raise ConversionError(f"tensor {hf_name!r} appears twice in the checkpoint")
            tensors[target] = value

    # every tensor the loader will ask for, with the shape it will check
    from flashd.daemon.models.dflash_weights import DFLASH_GLOBAL_TENSORS
    from flashd.daemon.models.weights import LAYER_TENSORS
    expected = {name: shape(cfg) for name, shape in DFLASH_GLOBAL_TENSORS.values()}
    for i in range(cfg.model.n_layers):
        expected.update({name.format(i=i): shape(cfg.model) for name, shape, needed in LAYER_TENSORS.values()
                         if needed(cfg.model)})
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ConversionError(f"the checkpoint lacks {len(missing)} tensors the config implies, e.g. {missing[:4]}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise ConversionError(f"the checkpoint has tensors beyond the config's {cfg.model.n_layers} layers: "
                              f"{extra[:4]}")
    for gname, (dtype, arr) in tensors.items():
        if tuple(arr.shape) != expected[gname]:
            raise ConversionError(f"tensor {gname} has shape {list(arr.shape)}, the config implies "
                                  f"{list(expected[gname])}")

    with new_gguf(out, DFLASH_ARCH) as writer:
        write_metadata(writer, cfg)
        for gname in expected:                       # loader order: globals, then layer by layer
            data, qtype = _encode(*tensors[gname], outtype)
            writer.add_tensor(gname, data, raw_dtype=qtype)
    return cfg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashd.scripts.convert_dflash",
                                description="Convert a z-lab DFlash drafter (config.json + safetensors) to GGUF.")
    p.add_argument("checkpoint", type=Path, help="folder with config.json and *.safetensors")
    p.add_argument("out", type=Path, help="output .gguf")
    p.add_argument("--outtype", default="auto", choices=["auto", *_OUTTYPES],
                   help="weight matrix format (auto: as stored); norms are always F32")
    p.add_argument("--name", help="general.name (default: the checkpoint folder's name)")
    args = p.parse_args(argv)
    try:
        cfg = convert(args.checkpoint, args.out, args.outtype, args.name)
    except ConversionError as exc:
        print(f"convert_dflash: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {cfg}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
