"""make_synthetic_gguf --arch qwen35: the tensors and keys llama.cpp's qwen35 loader asks for (src/models/qwen35.cpp
of the llama.cpp in llama-cpp-python 0.3.36, shapes in ggml order ne[0] = columns), at a tiny shape and at the
real 0.8B and 27B layer shapes; flashd's loader and (where llama-cpp-python is installed) llama.cpp load them;
--random-blocks writes valid quant blocks without a quantizer."""
import dataclasses

import gguf
import numpy as np
import pytest

from flashd.daemon.models import open_model
from flashd.scripts import make_synthetic_gguf as msg
from flashd.scripts.make_synthetic_gguf import tensor_plan, write_synthetic_model
from flashd.scripts.random_weights import FLOAT_FORMATS
from flashd.scripts.synthetic_qwen35 import rope_sections
from flashd.scripts.synthetic_spec import SyntheticSpec

TINY = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, head_dim=32, rope_dim=16,
                     ssm_state=16, ssm_k_heads=2, ssm_v_heads=4, weight_type="F32")


def llama_cpp_shapes(spec: SyntheticSpec) -> dict[str, list[int]]:
    """What llama.cpp's qwen35 load_arch_tensors creates (ggml order), written out from its source."""
    D, F, V, hd, H, Hkv = spec.hidden, spec.ffn, spec.vocab_size, spec.head_dim_resolved, spec.n_heads, spec.n_kv_heads
    S, Hk, Hv, K = spec.ssm_state, spec.ssm_k_heads, spec.ssm_v_heads, spec.ssm_conv_kernel
    conv = 2 * Hk * S + Hv * S
    out = {"token_embd.weight": [D, V], "output_norm.weight": [D]}
    if not spec.tie_embeddings:
        out["output.weight"] = [D, V]
    for i in range(spec.n_layers):
        b = f"blk.{i}."
        out.update({b + "attn_norm.weight": [D], b + "post_attention_norm.weight": [D], b + "ffn_gate.weight": [D, F],
                    b + "ffn_up.weight": [D, F], b + "ffn_down.weight": [F, D]})
        if (i + 1) % spec.full_attn_interval == 0:
            out.update({b + "attn_q.weight": [D, hd * H * 2], b + "attn_k.weight": [D, hd * Hkv],
                        b + "attn_v.weight": [D, hd * Hkv], b + "attn_output.weight": [hd * H, D],
                        b + "attn_q_norm.weight": [hd], b + "attn_k_norm.weight": [hd]})
        else:
            out.update({b + "attn_qkv.weight": [D, conv], b + "attn_gate.weight": [D, Hv * S],
                        b + "ssm_conv1d.weight": [K, conv], b + "ssm_dt.bias": [Hv], b + "ssm_a": [Hv],
                        b + "ssm_beta.weight": [D, Hv], b + "ssm_alpha.weight": [D, Hv], b + "ssm_norm.weight": [S],
                        b + "ssm_out.weight": [Hv * S, D]})
    return out


@pytest.mark.parametrize("preset", [None, "qwen3.5-0.8b", "qwen3.5-27b-q4_k_m"])
def test_tensors_have_llama_cpp_names_and_shapes(preset):
    spec = TINY if preset is None else msg.PRESETS[preset]
    assert {p.name: list(reversed(p.shape)) for p in tensor_plan(spec)} == llama_cpp_shapes(spec)


def test_real_shapes():
    s = msg.PRESETS["qwen3.5-0.8b"]
    assert (s.n_layers, s.hidden, s.ffn, s.n_heads, s.n_kv_heads, s.head_dim, s.rope_dim, s.vocab_size) == (
        24, 1024, 3584, 8, 2, 256, 64, 248320)
    assert rope_sections(32) == [11, 11, 10, 0]       # Qwen3.5's mrope_section
    b = msg.PRESETS["qwen3.5-27b-q4_k_m"]
    assert (b.n_layers, b.hidden, b.ffn, b.n_heads, b.n_kv_heads, b.ssm_k_heads, b.ssm_v_heads) == (
        64, 5120, 17408, 24, 4, 16, 48)
    assert 15.0e9 < sum(p.n_bytes for p in tensor_plan(b)) < 16.5e9      # a ~16 GB Q4_K_M-sized file


def test_metadata_keys_and_flashd_config(tmp_path):
    path = write_synthetic_model(tmp_path / "q.gguf", TINY)
    r = gguf.GGUFReader(path)
    keys = {k: f.contents() for k, f in r.fields.items() if k.startswith("qwen35.")}
    assert keys["qwen35.ssm.conv_kernel"] == 4 and keys["qwen35.ssm.state_size"] == 16
    assert keys["qwen35.ssm.group_count"] == 2 and keys["qwen35.ssm.time_step_rank"] == 4
    assert keys["qwen35.ssm.inner_size"] == 64 and keys["qwen35.full_attention_interval"] == 4
    assert keys["qwen35.rope.dimension_count"] == 16 and keys["qwen35.rope.dimension_sections"] == [3, 3, 2, 0]
    _, cfg = open_model(path)
    assert cfg.linear.recurrent == (True, True, True, False) and cfg.rope_dim == 16 and cfg.head_dim == 32
    assert (cfg.linear.n_k_heads, cfg.linear.n_v_heads, cfg.linear.head_dim) == (2, 4, 16)


def test_cli_takes_the_qwen35_options(tmp_path):
    args = msg.build_arg_parser().parse_args(["o.gguf", "--arch", "qwen35", "--ssm-state", "32", "--ssm-k-heads", "1",
                                              "--ssm-v-heads", "3", "--ssm-conv", "3", "--full-attn-interval", "2",
                                              "--rope-dim", "8", "--type", "Q8_0", "--seed", "5"])
    spec = msg.spec_from_args(args)
    assert (spec.ssm_state, spec.ssm_k_heads, spec.ssm_v_heads, spec.ssm_conv_kernel, spec.full_attn_interval,
            spec.rope_dim, spec.weight_type, spec.seed) == (32, 1, 3, 3, 2, 8, "Q8_0", 5)
    with pytest.raises(ValueError, match="multiple of ssm_k_heads"):
        dataclasses.replace(spec, ssm_v_heads=4, ssm_k_heads=3)


@pytest.mark.parametrize("preset", ["qwen3.5-0.8b", "qwen3.5-27b-q4_k_m"])
def test_random_blocks_at_real_layer_shapes_load(tmp_path, preset, monkeypatch):
    """Four layers of the real shapes (a smaller vocabulary), random valid blocks: written fast, every tensor
    dequantizes to finite numbers, flashd's loader accepts it; llama.cpp too where it is installed.

    "Fast" is checked by structure, not by a clock: no quantizer runs for a quantized format (what makes a
    real-shape file slow to write); only float formats are encoded (pools of rows, norms, conv weights)."""
    spec = dataclasses.replace(msg.PRESETS[preset], n_layers=4, vocab_size=1024)
    encode = msg.encode_tensor

    def floats_only(x, qtype):
        assert qtype in FLOAT_FORMATS, f"a {qtype.name} quantizer ran: --random-blocks should need none"
        return encode(x, qtype)

    monkeypatch.setattr(msg, "encode_tensor", floats_only)
    path = write_synthetic_model(tmp_path / "m.gguf", spec)
    r = gguf.GGUFReader(path)
    for t in r.tensors:
        if t.name.endswith(("attn_qkv.weight", "ffn_down.weight", "ssm_out.weight")):
            assert np.isfinite(gguf.quants.dequantize(t.data[:4], t.tensor_type)).all(), t.name
    _, cfg = open_model(path)
    assert cfg.linear.attention_layers == [3]
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(str(path), n_ctx=32, logits_all=True, verbose=False, n_threads=2)
    try:
        llm.eval([1, 2, 3])
        assert np.isfinite(np.array(llm.scores[:3])).all()
    finally:
        llm.close()


def test_llama_cpp_loads_tiny_quantized_qwen35(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    path = write_synthetic_model(tmp_path / "q.gguf", dataclasses.replace(TINY, weight_type="Q8_0"))
    llm = llama_cpp.Llama(str(path), n_ctx=32, logits_all=True, verbose=False, n_threads=2)
    try:
        llm.eval([5, 6, 7, 8])
        assert np.isfinite(np.array(llm.scores[:4])).all()
    finally:
        llm.close()
