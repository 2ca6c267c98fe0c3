"""scripts/convert_dflash.py on synthetic z-lab-style checkpoints written here (safetensors by hand,
z-lab's tensor names and config layout), then loaded by flashd's DFlash loader."""
from __future__ import annotations

import json
import struct

import gguf
import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models.dflash_weights import load_dflash_weights, open_dflash
from flashd.scripts.convert_dflash import ConversionError, convert, main, read_safetensors

H, HEADS, KV, HD, FFN, LAYERS, TARGET_IDS = 64, 4, 2, 16, 96, 2, [1, 3, 5]


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (what torch stores)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def zlab_tensors(rng, n_layers=LAYERS) -> dict[str, np.ndarray]:
    t = {"fc.weight": rng.standard_normal((H, len(TARGET_IDS) * H)),
         "hidden_norm.weight": 1 + 0.1 * rng.standard_normal(H), "norm.weight": 1 + 0.1 * rng.standard_normal(H)}
    for i in range(n_layers):
        p = f"layers.{i}."
        t |= {p + "input_layernorm.weight": 1 + 0.1 * rng.standard_normal(H),
              p + "post_attention_layernorm.weight": 1 + 0.1 * rng.standard_normal(H),
              p + "self_attn.q_proj.weight": rng.standard_normal((HEADS * HD, H)),
              p + "self_attn.k_proj.weight": rng.standard_normal((KV * HD, H)),
              p + "self_attn.v_proj.weight": rng.standard_normal((KV * HD, H)),
              p + "self_attn.o_proj.weight": rng.standard_normal((H, HEADS * HD)),
              p + "self_attn.q_norm.weight": 1 + 0.1 * rng.standard_normal(HD),
              p + "self_attn.k_norm.weight": 1 + 0.1 * rng.standard_normal(HD),
              p + "mlp.gate_proj.weight": rng.standard_normal((FFN, H)),
              p + "mlp.up_proj.weight": rng.standard_normal((FFN, H)),
              p + "mlp.down_proj.weight": rng.standard_normal((H, FFN))}
    return {k: bf16_bits(v.astype(np.float32) * 0.1) for k, v in t.items()}


def write_safetensors(path, tensors: dict[str, np.ndarray], dtype="BF16"):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def zlab_config(**changes) -> dict:
    cfg = {"architectures": ["DFlashDraftModel"], "attention_bias": False, "hidden_act": "silu",
           "hidden_size": H, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD,
           "intermediate_size": FFN, "num_hidden_layers": LAYERS, "rms_norm_eps": 1e-6, "rope_theta": 10000000.0,
           "max_position_embeddings": 40960, "num_target_layers": 8, "tie_word_embeddings": False,
           "dflash_config": {"block_size": 16, "mask_token_id": 300, "target_layer_ids": TARGET_IDS}}
    cfg.update(changes)
    return cfg


@pytest.fixture
def checkpoint(tmp_path):
    rng = np.random.default_rng(201)
    d = tmp_path / "Qwen3-tiny-DFlash"
    d.mkdir()
    tensors = zlab_tensors(rng)
    names = sorted(tensors)
    half = len(names) // 2       # two shards, as large checkpoints come
    write_safetensors(d / "model-00001-of-00002.safetensors", {n: tensors[n] for n in names[:half]})
    write_safetensors(d / "model-00002-of-00002.safetensors", {n: tensors[n] for n in names[half:]})
    (d / "config.json").write_text(json.dumps(zlab_config()))
    return d, tensors


def test_convert_keeps_config_and_weights(checkpoint, tmp_path):
    d, tensors = checkpoint
    out = tmp_path / "drafter.gguf"
    assert main([str(d), str(out)]) == 0
    f, cfg = open_dflash(out)
    assert cfg.model.rope_theta == 1e7                # not the anchor's 1e6
    assert (cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids) == (16, 300, tuple(TARGET_IDS))
    m = cfg.model
    assert (m.n_layers, m.hidden, m.n_heads, m.n_kv_heads, m.head_dim, m.ffn) == (LAYERS, H, HEADS, KV, HD, FFN)
    assert f.tensor("blk.0.attn_q.weight").qtype == gguf.GGMLQuantizationType.BF16   # auto: stored as BF16
    assert f.tensor("blk.0.attn_norm.weight").qtype == gguf.GGMLQuantizationType.F32
    w = load_dflash_weights(f, cfg, ReferenceOps().load_weight)
    fc = bf16_value(tensors["fc.weight"])
    for j, part in enumerate(w.fc):                   # fc split per target layer, columns in id order
        np.testing.assert_array_equal(part, fc[:, j * H:(j + 1) * H])
    np.testing.assert_array_equal(w.hidden_norm, bf16_value(tensors["hidden_norm.weight"]))
    np.testing.assert_array_equal(w.output_norm, bf16_value(tensors["norm.weight"]))
    pairs = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj",
             "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for i, layer in enumerate(w.layers):
        for field, hf in pairs.items():
            np.testing.assert_array_equal(getattr(layer, field), bf16_value(tensors[f"layers.{i}.{hf}.weight"]),
                                          err_msg=f"layer {i} {field}")


@pytest.mark.parametrize("outtype,qtype,tol", [("f32", "F32", 0.0), ("f16", "F16", 2 ** -11), ("q8_0", "Q8_0", 2 ** -7)])
def test_outtypes(checkpoint, tmp_path, outtype, qtype, tol):
    d, tensors = checkpoint
    out = tmp_path / f"d-{outtype}.gguf"
    convert(d, out, outtype)
    f, cfg = open_dflash(out)
    assert f.tensor("blk.1.ffn_down.weight").qtype == gguf.GGMLQuantizationType[qtype]
    w = load_dflash_weights(f, cfg, ReferenceOps().load_weight)
    want = bf16_value(tensors["layers.1.mlp.down_proj.weight"])
    # f16 rounds to 2^-11 relative; q8_0 to half a step of its 32-block scale (max/127)
    assert np.abs(w.layers[1].ffn_down - want).max() <= tol * np.abs(want).max()


def test_rope_theta_from_rope_parameters(checkpoint, tmp_path):
    d, _ = checkpoint
    cfg = zlab_config()
    del cfg["rope_theta"]
    cfg["rope_parameters"] = {"rope_theta": 5e5, "rope_type": "default"}
    (d / "config.json").write_text(json.dumps(cfg))
    assert convert(d, tmp_path / "x.gguf").model.rope_theta == 5e5


@pytest.mark.parametrize("changes,message", [
    ({"rope_theta": None}, "no rope_theta"),
    ({"dflash_config": {"block_size": 16, "mask_token_id": 300}}, "no 'target_layer_ids'"),
    ({"dflash_config": {"block_size": 16, "target_layer_ids": TARGET_IDS}}, "no 'mask_token_id'"),
    ({"layer_types": ["sliding_attention"] * LAYERS, "sliding_window": 2048}, "full .* attention"),
    ({"is_causal": True}, "is_causal"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE type 'yarn'"),
    ({"num_hidden_layers": 3}, "lacks .* tensors"),
    ({"num_hidden_layers": 1}, "beyond the config's 1 layers"),
    ({"intermediate_size": 128}, "has shape .* the config implies"),
    ({"hidden_size": 32, "head_dim": 8}, "has shape"),
])
def test_refuses_what_it_cannot_convert_faithfully(checkpoint, tmp_path, changes, message):
    d, _ = checkpoint
    cfg = zlab_config(**changes)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    (d / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "x.gguf"
    with pytest.raises(ConversionError, match=message):
        convert(d, out)
    assert not out.exists()


def test_refuses_dflash2_tensors(checkpoint, tmp_path):
    d, _ = checkpoint
    write_safetensors(d / "extra.safetensors", {"layers.0.attention_conv.base_kernel": np.zeros((2, 2, H), np.uint16)})
    with pytest.raises(ConversionError, match="attention_conv.base_kernel' is not part of a DFlash drafter"):
        convert(d, tmp_path / "x.gguf")


def test_safetensors_reader_checks_offsets(tmp_path):
    p = tmp_path / "bad.safetensors"
    head = json.dumps({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 60]}}).encode()
    p.write_bytes(struct.pack("<Q", len(head)) + head + bytes(64))
    with pytest.raises(ConversionError, match="do not fit its shape"):
        read_safetensors(p)
    good = tmp_path / "good.safetensors"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    write_safetensors(good, {"w": x}, dtype="F32")
    dtype, arr = read_safetensors(good)["w"]
    assert dtype == "F32"
    np.testing.assert_array_equal(arr, x)
