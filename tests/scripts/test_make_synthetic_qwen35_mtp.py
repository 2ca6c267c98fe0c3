"""make_synthetic_gguf --arch qwen35 --mtp: the multi-token-prediction block with llama.cpp's names and shapes
(load_block_mtp in src/models/qwen35.cpp of the llama.cpp in llama-cpp-python 0.3.36, ggml order ne[0] = columns),
block_count / nextn_predict_layers as llama.cpp reads them, and flashd's loader of the block
(daemon/models/qwen35_mtp_weights.py): its config, the fallbacks to the target's tensors and its refusals."""
import dataclasses

import gguf
import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import ModelLoadError, load_model, open_model
from flashd.daemon.models.qwen35_mtp_weights import load_mtp_weights, mtp_config, mtp_weight_bytes
from flashd.scripts import make_synthetic_gguf as msg
from flashd.scripts.make_synthetic_gguf import float_tensor, tensor_plan, write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec
from tests.scripts.test_make_synthetic_qwen35 import TINY, llama_cpp_shapes

MTP = dataclasses.replace(TINY, mtp=True)


def llama_cpp_mtp_shapes(spec: SyntheticSpec) -> dict[str, list[int]]:
    """What load_block_mtp creates for block n_layers (ggml order), written out from its source."""
    D, F, V, hd, H, Hkv = spec.hidden, spec.ffn, spec.vocab_size, spec.head_dim_resolved, spec.n_heads, spec.n_kv_heads
    b = f"blk.{spec.n_layers}."
    out = {b + "attn_norm.weight": [D], b + "post_attention_norm.weight": [D], b + "attn_q.weight": [D, hd * H * 2],
           b + "attn_k.weight": [D, hd * Hkv], b + "attn_v.weight": [D, hd * Hkv], b + "attn_output.weight": [hd * H, D],
           b + "attn_q_norm.weight": [hd], b + "attn_k_norm.weight": [hd], b + "ffn_gate.weight": [D, F],
           b + "ffn_down.weight": [F, D], b + "ffn_up.weight": [D, F], b + "nextn.eh_proj.weight": [2 * D, D],
           b + "nextn.enorm.weight": [D], b + "nextn.hnorm.weight": [D], b + "nextn.shared_head_norm.weight": [D]}
    if spec.mtp_own_head:
        out.update({b + "nextn.embed_tokens.weight": [D, V], b + "nextn.shared_head_head.weight": [D, V]})
    return out


@pytest.mark.parametrize("own_head", [False, True])
def test_mtp_tensors_have_llama_cpp_names_and_shapes(own_head):
    spec = dataclasses.replace(MTP, mtp_own_head=own_head)
    assert {p.name: list(reversed(p.shape)) for p in tensor_plan(spec)} == {**llama_cpp_shapes(spec),
                                                                           **llama_cpp_mtp_shapes(spec)}


def test_mtp_keys_and_the_trunk_is_unchanged(tmp_path):
    path = write_synthetic_model(tmp_path / "m.gguf", MTP)
    r = gguf.GGUFReader(path)
    keys = {k: f.contents() for k, f in r.fields.items() if k.startswith("qwen35.")}
    assert keys["qwen35.block_count"] == 5 and keys["qwen35.nextn_predict_layers"] == 1
    f, cfg = open_model(path)
    assert cfg.n_layers == 4 and cfg.linear.recurrent == (True, True, True, False)
    plain = write_synthetic_model(tmp_path / "p.gguf", TINY)
    # the trunk's tensors are those of the model without --mtp (seeded per tensor name)
    for name in ("token_embd.weight", "blk.3.attn_q.weight", "output.weight"):
        assert np.array_equal(float_tensor(MTP, name), float_tensor(TINY, name))
    assert "qwen35.nextn_predict_layers" not in {k for k in gguf.GGUFReader(plain).fields}


def test_cli_mtp_flags():
    spec = msg.spec_from_args(msg.build_arg_parser().parse_args(["o.gguf", "--arch", "qwen35", "--mtp",
                                                                 "--mtp-own-head"]))
    assert spec.mtp and spec.mtp_own_head
    with pytest.raises(ValueError, match="qwen35 option"):
        SyntheticSpec(arch="qwen3", mtp=True)
    with pytest.raises(ValueError, match="needs mtp"):
        dataclasses.replace(TINY, mtp_own_head=True)


@pytest.mark.parametrize("own_head", [False, True])
def test_loader_reads_the_block_and_falls_back_to_the_target(tmp_path, own_head):
    spec = dataclasses.replace(MTP, mtp_own_head=own_head)
    path = write_synthetic_model(tmp_path / "m.gguf", spec)
    ops = ReferenceOps()
    f, cfg = open_model(path)
    target = load_model((f, cfg), ops.load_weight)
    mcfg = mtp_config(f, cfg)
    assert mcfg.layer == 4
    assert mcfg.own == (frozenset({"embed", "head", "head_norm"}) if own_head else frozenset({"head_norm"}))
    w = load_mtp_weights(f, cfg, mcfg, ops.load_weight, target.weights)
    eh = float_tensor(spec, "blk.4.nextn.eh_proj.weight")        # F32: stored exactly
    assert np.array_equal(np.asarray(w.eh_proj_e), eh[:, :64]) and np.array_equal(np.asarray(w.eh_proj_h), eh[:, 64:])
    assert np.array_equal(np.asarray(w.block.attn_q), float_tensor(spec, "blk.4.attn_q.weight"))
    assert np.array_equal(np.asarray(w.head_norm), float_tensor(spec, "blk.4.nextn.shared_head_norm.weight"))
    if own_head:
        assert np.array_equal(np.asarray(w.embed), float_tensor(spec, "blk.4.nextn.embed_tokens.weight"))
        assert np.array_equal(np.asarray(w.head), float_tensor(spec, "blk.4.nextn.shared_head_head.weight"))
    else:
        assert w.embed is target.weights.token_embd and w.head is target.weights.output
    assert mtp_weight_bytes(f, cfg, mcfg) == sum(p.n_bytes for p in tensor_plan(spec) if p.name.startswith("blk.4."))


def test_loader_refuses_a_model_without_mtp_and_a_quantized_split(tmp_path):
    f, cfg = open_model(write_synthetic_model(tmp_path / "p.gguf", TINY))
    with pytest.raises(ModelLoadError, match="no multi-token-prediction"):
        mtp_config(f, cfg)
    # Q8_0 eh_proj splits between blocks of 32 (hidden 64); a hidden of 48 would not
    q = dataclasses.replace(MTP, weight_type="Q8_0")
    f, cfg = open_model(write_synthetic_model(tmp_path / "q.gguf", q))
    ops = ReferenceOps()
    w = load_mtp_weights(f, cfg, mtp_config(f, cfg), ops.load_weight, load_model((f, cfg), ops.load_weight).weights)
    assert np.asarray(w.eh_proj_e).shape == (64, 64)
