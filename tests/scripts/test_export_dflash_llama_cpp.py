"""scripts/export_dflash_llama_cpp.py: the exported file against what llama.cpp's DFlash loader requires
(the llama.cpp vendored in llama-cpp-python 0.3.36; each requirement names the source line it comes
from), and the tensor data round trip. No llama.cpp here: bench/compare_dflash_llama_cpp.py runs it."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from flashd.scripts.export_dflash_llama_cpp import ExportError, export, main
from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash

H, TARGET_LAYERS, VOCAB = 128, 6, 512
V = gguf.GGUFValueType


@pytest.fixture(scope="module")
def qwen3_target(synthetic_model):
    return synthetic_model(arch="qwen3", n_layers=TARGET_LAYERS, hidden=H, n_heads=4, n_kv_heads=2, head_dim=32,
                           ffn=256, vocab_size=VOCAB, weight_type="F32")


def drafter(tmp_path, **fields):
    fields = {"n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 32, "ffn": 256, "block_size": 16,
              "n_features": 3, **fields}
    spec = spec_for_target(H, TARGET_LAYERS, VOCAB, **fields)
    return spec, write_synthetic_dflash(tmp_path / "dflash.gguf", spec)


def value(r: gguf.GGUFReader, key: str):
    return r.fields[key].contents()


def test_export_has_every_tensor_llama_cpp_requires_with_its_shape(tmp_path, qwen3_target):
    spec, path = drafter(tmp_path, weight_type="Q8_0")
    out = export(path, qwen3_target, tmp_path / "out.gguf")
    r = gguf.GGUFReader(tmp_path / "out.gguf")
    # GGUFReader's shape is ggml's ne order, as create_tensor's lists in src/models/dflash.cpp
    # load_arch_tensors (flag 0 = required; n_embd_inp = target_layers.size() * n_embd, load_arch_hparams)
    n_embd, q, kv, ff, hd = H, spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim, spec.ffn, spec.head_dim
    want = {"fc.weight": [3 * n_embd, n_embd], "enc.output_norm.weight": [n_embd], "output_norm.weight": [n_embd]}
    for i in range(spec.n_layers):
        want |= {f"blk.{i}.attn_norm.weight": [n_embd], f"blk.{i}.attn_q.weight": [n_embd, q],
                 f"blk.{i}.attn_k.weight": [n_embd, kv], f"blk.{i}.attn_v.weight": [n_embd, kv],
                 f"blk.{i}.attn_output.weight": [q, n_embd], f"blk.{i}.attn_q_norm.weight": [hd],
                 f"blk.{i}.attn_k_norm.weight": [hd], f"blk.{i}.ffn_norm.weight": [n_embd],
                 f"blk.{i}.ffn_gate.weight": [n_embd, ff], f"blk.{i}.ffn_down.weight": [ff, n_embd],
                 f"blk.{i}.ffn_up.weight": [n_embd, ff]}
    # nothing else: llama.cpp's loader counts created tensors against the file's ("wrong number of tensors")
    assert {t.name: [int(d) for d in t.shape] for t in r.tensors} == want
    assert out.n_features == 3


def test_export_metadata_is_what_llama_cpp_reads(tmp_path, qwen3_target):
    spec, path = drafter(tmp_path, rope_theta=1e7)
    export(path, qwen3_target, tmp_path / "out.gguf")
    r = gguf.GGUFReader(tmp_path / "out.gguf")
    types = {k: f.types for k, f in r.fields.items()}
    # src/llama-arch.cpp: LLM_ARCH_DFLASH is "dflash"
    assert value(r, "general.architecture") == "dflash"
    # load_arch_hparams: get_arr(LLM_KV_TARGET_LAYERS) "%s.target_layers", int32/uint32 elements; the
    # extraction is llama_set_embeddings_layer_inp(id) (common/speculative.cpp), the input of layer id:
    # flashd's output of layer id - 1 (conversion/qwen.py writes i + 1)
    assert value(r, "dflash.target_layers") == [i + 1 for i in spec.target_layer_ids]
    assert types["dflash.target_layers"] == [V.ARRAY, V.INT32]
    # llama_model_loader::get_key<float> checks GGUF_TYPE_FLOAT32 ("wrong type f64 but expected type f32")
    assert types["dflash.rope.freq_base"] == [V.FLOAT32] and value(r, "dflash.rope.freq_base") == 1e7
    assert types["dflash.attention.layer_norm_rms_epsilon"] == [V.FLOAT32]
    # the standard hparams (llama_model_base::load_hparams), uint32
    for key, want in [("block_count", 2), ("embedding_length", H), ("feed_forward_length", 256),
                      ("attention.head_count", 4), ("attention.head_count_kv", 2), ("attention.key_length", 32),
                      ("attention.value_length", 32), ("rope.dimension_count", 32)]:
        assert value(r, f"dflash.{key}") == want and types[f"dflash.{key}"] == [V.UINT32], key
    # common/speculative.cpp reads dflash.block_size and dflash.attention.causal (false: non-causal block)
    assert value(r, "dflash.block_size") == 16 and value(r, "dflash.attention.causal") is False
    # the MASK is llama_vocab_mask(the draft's vocab): tokenizer.ggml.mask_token_id (src/llama-vocab.cpp)
    assert value(r, "tokenizer.ggml.mask_token_id") == spec.mask_token_id
    # flashd-only keys are gone (one source of truth per value in the file)
    assert not {"dflash.target_layer_ids", "dflash.mask_token_id"} & set(r.fields)


def test_export_carries_the_targets_tokenizer(tmp_path, qwen3_target):
    _, path = drafter(tmp_path)
    export(path, qwen3_target, tmp_path / "out.gguf")
    t, r = gguf.GGUFReader(qwen3_target), gguf.GGUFReader(tmp_path / "out.gguf")
    keys = [k for k in t.fields if k.startswith("tokenizer.") and k != "tokenizer.ggml.mask_token_id"]
    assert "tokenizer.ggml.tokens" in keys and "tokenizer.ggml.model" in keys
    for k in keys:          # the draft's vocabulary is built from these (common_speculative checks them too)
        assert r.fields[k].types == t.fields[k].types and value(r, k) == value(t, k), k


@pytest.mark.parametrize("fmt", ["F32", "F16", "BF16", "Q8_0", "Q4_0"])
def test_export_round_trips_the_tensor_bytes(tmp_path, qwen3_target, fmt):
    _, path = drafter(tmp_path, weight_type=fmt)
    export(path, qwen3_target, tmp_path / "out.gguf")
    src = {t.name: t for t in gguf.GGUFReader(path).tensors}
    dst = {t.name: t for t in gguf.GGUFReader(tmp_path / "out.gguf").tensors}
    back = {"fc.weight": "dflash.fc.weight", "enc.output_norm.weight": "dflash.hidden_norm.weight"}
    assert sorted(back.get(n, n) for n in dst) == sorted(src)
    for name, t in dst.items():
        s = src[back.get(name, name)]
        assert t.tensor_type == s.tensor_type and list(t.shape) == list(s.shape), name
        assert np.asarray(t.data).tobytes() == np.asarray(s.data).tobytes(), name


def test_export_refuses_what_llama_cpp_would_not_run_as_flashd(tmp_path, qwen3_target, synthetic_model):
    _, path = drafter(tmp_path)
    # src/models/qwen2.cpp sets no res->t_layer_inp: llama.cpp aborts ("layer input tensor is null")
    qwen2 = synthetic_model(arch="qwen2", n_layers=TARGET_LAYERS, hidden=H, n_heads=4, n_kv_heads=2, ffn=256,
                            vocab_size=VOCAB, weight_type="F32")
    with pytest.raises(ExportError, match="does not record layer inputs"):
        export(path, qwen2, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()
    export(path, qwen2, tmp_path / "x.gguf", check_target_arch=False)      # only to show llama.cpp's own abort
    # a theta float32 would round: llama.cpp reads it as float32 only
    (tmp_path / "odd").mkdir()
    _, odd = drafter(tmp_path / "odd", rope_theta=1e7 + 0.1)
    with pytest.raises(ExportError, match="not exact in float32"):
        export(odd, qwen3_target, tmp_path / "y.gguf")
    # a target the drafter does not fit (flashd's own check_target)
    other = synthetic_model(arch="qwen3", n_layers=TARGET_LAYERS, hidden=64, n_heads=4, n_kv_heads=2, ffn=128,
                            vocab_size=VOCAB, weight_type="F32")
    with pytest.raises(ExportError, match="hidden size"):
        export(path, other, tmp_path / "z.gguf")


def test_cli(tmp_path, qwen3_target, capsys):
    _, path = drafter(tmp_path)
    assert main([str(path), str(tmp_path / "out.gguf"), "--target", str(qwen3_target)]) == 0
    assert "--spec-draft-n-max 15" in capsys.readouterr().err
    assert main([str(path), str(tmp_path / "bad.gguf"), "--target", str(path)]) == 1
    assert "export_dflash_llama_cpp:" in capsys.readouterr().err
