"""Synthetic GGUF maker: layout, metadata, every weight format against gguf's dequantizer, weight
scale through deep stacks, tokenizer consistency, validation, CLI."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

from flashd.scripts import make_synthetic_gguf as msg
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, float_tensor, tensor_plan, write_synthetic_model

ARCHS = ("llama", "qwen2", "qwen3")
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")

# Relative RMS error ||dequant(quant(w)) - w|| / ||w|| allowed per format, for Gaussian weights
# (tensors of >= 8K values, so the statistic is stable). Reason for each bound:
REL_RMS_TOL = {
    "F32": 0.0,      # stored as is
    "F16": 5e-4,     # 11-bit significand: relative rounding error <= 2^-11 = 4.9e-4 per value
    "BF16": 4e-3,    # 8-bit significand: <= 2^-8 = 3.9e-3 per value
    "Q8_0": 8e-3,    # step = amax/127 over 32 values (amax ~ 2.1 sigma): rms step/sqrt(12) ~ 0.005
    "Q6_K": 0.03,    # 6-bit levels per 16 values: step ~ amax/31.5 -> rms ~ 0.019 (measured 0.019)
    "Q5_0": 0.06,    # 5-bit: step ~ amax/16 -> rms ~ 0.043
    "Q5_1": 0.06,    # 5-bit affine: step = range/31 -> rms ~ 0.038
    "Q5_K": 0.06,    # 5-bit affine per 32 values, 6-bit scales -> rms ~ 0.039
    "Q4_0": 0.12,    # 4-bit: step ~ amax/8 -> rms ~ 0.086
    "Q4_1": 0.12,    # 4-bit affine: step = range/15 -> rms ~ 0.078
    "Q4_K": 0.12,    # 4-bit affine per 32 values, 6-bit scales -> rms ~ 0.080
}
assert set(REL_RMS_TOL) == set(msg.SUPPORTED_WEIGHT_TYPES)


def small_spec(arch: str, weight_type: str, **kw) -> SyntheticSpec:
    """The smallest model whose rows fit the format's block (32, or 256 for K-quants)."""
    if GGML_QUANT_SIZES[Q[weight_type]][0] == 256:
        kw.setdefault("hidden", 256)
        kw.setdefault("ffn", 512)
    kw.setdefault("vocab_size", 300)   # reading a GGUF parses every token string: keep it short
    return SyntheticSpec(arch=arch, weight_type=weight_type, **kw)


def expected_names(spec: SyntheticSpec) -> list[str]:
    per_layer = ["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                 "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                 "ffn_down.weight"]
    if spec.arch == "qwen2":
        per_layer += ["attn_q.bias", "attn_k.bias", "attn_v.bias"]
    if spec.arch == "qwen3":
        per_layer += ["attn_q_norm.weight", "attn_k_norm.weight"]
    names = ["token_embd.weight", "output_norm.weight"] + [f"blk.{i}.{n}" for i in range(spec.n_layers) for n in per_layer]
    if not spec.tie_embeddings:
        names.append("output.weight")
    return sorted(names)


def field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def dequantized(t) -> np.ndarray:
    """A ReaderTensor's values (numpy shape: rows first) via gguf's dequantizer, the oracle."""
    return gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(tuple(int(d) for d in reversed(t.shape)))


def rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a.astype(np.float64) - b) ** 2) / np.mean(b.astype(np.float64) ** 2)))


# ----------------------------------------------------------------------------------------------
# Every arch x every weight format
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("weight_type", msg.SUPPORTED_WEIGHT_TYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_file_layout_metadata_and_weights(tmp_path, arch, weight_type):
    spec = small_spec(arch, weight_type, n_layers=2, seed=7)
    path = write_synthetic_model(tmp_path / "m.gguf", spec)
    r = gguf.GGUFReader(path)
    tensors = {t.name: t for t in r.tensors}
    assert sorted(tensors) == expected_names(spec)

    hd = spec.head_dim_resolved
    for name, t in tensors.items():
        kind = name.split(".")[-2]
        expected_gguf_shape = {   # GGUF dims: ne[0] (columns, the input features) first
            "token_embd": [spec.hidden, spec.vocab_size], "output": [spec.hidden, spec.vocab_size],
            "attn_q": [spec.hidden, spec.n_heads * hd], "attn_k": [spec.hidden, spec.n_kv_heads * hd],
            "attn_v": [spec.hidden, spec.n_kv_heads * hd], "attn_output": [spec.n_heads * hd, spec.hidden],
            "ffn_gate": [spec.hidden, spec.ffn], "ffn_up": [spec.hidden, spec.ffn],
            "ffn_down": [spec.ffn, spec.hidden], "attn_q_norm": [hd], "attn_k_norm": [hd],
        }.get(kind, [spec.hidden])
        if name.endswith(".bias"):
            expected_gguf_shape = [expected_gguf_shape[-1]]
        assert list(t.shape) == expected_gguf_shape, name
        is_matrix = len(expected_gguf_shape) == 2
        assert t.tensor_type == (Q[weight_type] if is_matrix else Q.F32), name

        values = dequantized(t)
        want = float_tensor(spec, name)
        assert values.shape == want.shape
        assert np.all(np.isfinite(values)), name
        assert rel_rms(values, want) <= REL_RMS_TOL[t.tensor_type.name], (name, rel_rms(values, want))

    a = spec.arch
    assert field(r, "general.architecture") == arch
    assert field(r, "general.name") == spec.name
    assert field(r, f"{a}.block_count") == spec.n_layers
    assert field(r, f"{a}.context_length") == spec.context_length
    assert field(r, f"{a}.embedding_length") == spec.hidden
    assert field(r, f"{a}.feed_forward_length") == spec.ffn
    assert field(r, f"{a}.attention.head_count") == spec.n_heads
    assert field(r, f"{a}.attention.head_count_kv") == spec.n_kv_heads
    assert field(r, f"{a}.rope.freq_base") == pytest.approx(spec.rope_theta)
    assert field(r, f"{a}.attention.layer_norm_rms_epsilon") == pytest.approx(spec.rms_eps)
    assert field(r, "general.file_type") == int(msg._FILE_TYPE[weight_type])
    assert (f"{a}.attention.key_length" in r.fields) == (arch == "qwen3")   # head_dim == hidden/heads here
    assert field(r, "tokenizer.ggml.model") == "gpt2"
    assert field(r, "tokenizer.ggml.pre") == ("smollm" if arch == "llama" else "qwen2")
    assert len(field(r, "tokenizer.ggml.tokens")) == spec.vocab_size
    assert field(r, "tokenizer.ggml.add_bos_token") is False


def test_head_dim_different_from_hidden_over_heads(tmp_path):
    spec = SyntheticSpec(arch="qwen3", hidden=64, n_heads=4, n_kv_heads=2, head_dim=32, weight_type="F16")
    r = gguf.GGUFReader(write_synthetic_model(tmp_path / "m.gguf", spec))
    shapes = {t.name: list(t.shape) for t in r.tensors}
    assert shapes["blk.0.attn_q.weight"] == [64, 128]
    assert shapes["blk.0.attn_k.weight"] == [64, 64]
    assert shapes["blk.0.attn_output.weight"] == [128, 64]
    assert shapes["blk.0.attn_q_norm.weight"] == [32]
    assert field(r, "qwen3.attention.key_length") == 32
    assert field(r, "qwen3.attention.value_length") == 32
    spec2 = SyntheticSpec(arch="qwen2", hidden=64, n_heads=4, head_dim=32, weight_type="F16")
    r2 = gguf.GGUFReader(write_synthetic_model(tmp_path / "m2.gguf", spec2))
    assert field(r2, "qwen2.attention.key_length") == 32


def test_tied_embeddings_have_no_output_tensor(tmp_path):
    spec = SyntheticSpec(arch="qwen2", tie_embeddings=True)
    r = gguf.GGUFReader(write_synthetic_model(tmp_path / "m.gguf", spec))
    names = {t.name for t in r.tensors}
    assert "output.weight" not in names and "token_embd.weight" in names


def test_type_overrides_later_entries_win(tmp_path):
    spec = SyntheticSpec(hidden=256, ffn=512, weight_type="Q8_0", type_overrides=(
        ("token_embd.weight", "Q4_K"), ("blk.*.ffn_down.weight", "Q4_K"), ("blk.1.ffn_down.weight", "Q6_K")))
    r = gguf.GGUFReader(write_synthetic_model(tmp_path / "m.gguf", spec))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["token_embd.weight"] == "Q4_K"
    assert types["blk.0.ffn_down.weight"] == "Q4_K"
    assert types["blk.1.ffn_down.weight"] == "Q6_K"
    assert types["blk.0.ffn_up.weight"] == "Q8_0"
    assert types["output.weight"] == "Q8_0"
    assert field(r, "general.file_type") == int(gguf.LlamaFileType.MOSTLY_Q8_0)


def test_same_spec_same_bytes_and_seed_changes_weights(tmp_path):
    spec = SyntheticSpec(weight_type="Q4_0")
    a = write_synthetic_model(tmp_path / "a.gguf", spec).read_bytes()
    b = write_synthetic_model(tmp_path / "b.gguf", spec).read_bytes()
    c = write_synthetic_model(tmp_path / "c.gguf", SyntheticSpec(weight_type="Q4_0", seed=1)).read_bytes()
    assert a == b
    assert len(a) == len(c) and a != c


@pytest.mark.slow
def test_dims_order_matches_real_qwen2_file(real_model):
    """The 0.5B preset's tensor plan has the GGUF shapes of llama.cpp's real file."""
    r = gguf.GGUFReader(real_model("qwen2.5-coder-0.5b"))
    real_shapes = {t.name: list(t.shape) for t in r.tensors}
    spec = msg.PRESETS["qwen2.5-0.5b"]
    planned = {p.name: list(reversed(p.shape)) for p in tensor_plan(spec)}
    assert planned == real_shapes
    assert planned["blk.0.ffn_gate.weight"] == [896, 4864]
    for key in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                "attention.head_count_kv", "context_length"):
        assert field(r, f"qwen2.{key}") is not None
    assert field(r, "qwen2.embedding_length") == spec.hidden
    assert field(r, "qwen2.attention.head_count") == spec.n_heads
    assert field(r, "qwen2.rope.freq_base") == pytest.approx(spec.rope_theta)
    assert len(field(r, "tokenizer.ggml.tokens")) == spec.vocab_size


@pytest.mark.slow
@pytest.mark.parametrize("preset, name", [("qwen2.5-coder-1.5b-q4_k_m", "qwen2.5-coder-1.5b"),
                                          ("qwen2.5-coder-0.5b-q4_k_m", "qwen2.5-coder-0.5b")])
def test_clone_presets_match_the_real_files(real_model, preset, name):
    """The clone presets (speed stand-ins) have every tensor's name, shape and format of the real file."""
    r = gguf.GGUFReader(real_model(name))
    real = {t.name: (t.tensor_type.name, list(t.shape)) for t in r.tensors}
    planned = {p.name: (gguf.GGMLQuantizationType(p.qtype).name, list(reversed(p.shape)))
               for p in tensor_plan(msg.PRESETS[preset])}
    assert planned == real


def test_flashd_loader_reads_the_file(tmp_path):
    """The daemon's GGUF loader accepts the file and derives the same hyper-parameters."""
    from flashd.daemon.models import open_model
    spec = SyntheticSpec(arch="qwen3", hidden=64, n_heads=4, n_kv_heads=2, head_dim=32, n_layers=3)
    _, cfg = open_model(write_synthetic_model(tmp_path / "m.gguf", spec))
    assert (cfg.arch, cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn,
            cfg.vocab_size, cfg.tie_embeddings) == ("qwen3", 3, 64, 4, 2, 32, 128, 512, False)


# ----------------------------------------------------------------------------------------------
# K-quant encoders (our own): exact range, nearest level
# ----------------------------------------------------------------------------------------------

def awkward_rows(n_cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((12, n_cols)).astype(np.float32)
    x[1] = 0.0                                  # all-zero blocks
    x[2] = np.abs(x[2]) + 0.5                   # all positive (min clamps to 0)
    x[3] = -np.abs(x[3]) - 0.5                  # all negative
    x[4] = 0.0
    x[4, 5] = 3.0                               # a lone outlier
    x[5] *= 1e-4                                # tiny values (subnormal-range f16 scales)
    x[6] *= 100.0
    x[7, : n_cols // 2] *= 1e-3                 # sub-blocks of very different scales
    x[8] = np.round(x[8] * 4) / 4               # values on a coarse grid
    return x


@pytest.mark.parametrize("weight_type", K_TYPES)
def test_k_quant_error_is_at_most_half_a_step(weight_type):
    """No value is clipped and each is rounded to its nearest level, so per 256-value super-block
    |err| <= step/2, where step <= range/(levels-1) enlarged by the rounding-up of the 6-bit
    (Q4_K/Q5_K) or 8-bit (Q6_K) sub-block scales onto their grid: at most (1+1/63)^2 resp. (1+1/127),
    and by the float16 rounding of the super-block scale d: relative 2^-11 (the 1.002), or, where d is
    float16-subnormal (the 1e-4 row), up to 2^-25 absolute, i.e. sub-scale (<= 63 resp. 127) * 2^-25 on
    the step. Fresh data each run (the bound holds for any input); the seed is in the failure message.
    Checked over 1,500 seeds per type: worst err/step 0.495."""
    qt = Q[weight_type]
    seed = int(np.random.SeedSequence().entropy % 2**32)
    x = awkward_rows(512, seed)
    values = gguf.quants.dequantize(msg.encode_tensor(x, qt), qt)
    blocks_x = x.reshape(-1, 256).astype(np.float64)
    err = np.abs(values.reshape(-1, 256) - blocks_x).max(axis=1)
    if weight_type == "Q6_K":
        value_range = np.abs(blocks_x).max(axis=1)          # symmetric: levels -32..31, step <= amax/31
        max_step = value_range / 31 * (1 + 1 / 127) * 1.002 + 127 * 2.0**-25
    else:
        value_range = np.maximum(blocks_x.max(axis=1), 0) - np.minimum(blocks_x.min(axis=1), 0)
        levels = 16 if weight_type == "Q4_K" else 32
        max_step = value_range / (levels - 1) * (1 + 1 / 63) ** 2 * 1.002 + 63 * 2.0**-25
    assert np.all(err <= max_step / 2 + 1e-7 * value_range + 1e-30), \
        f"seed {seed}: err / step up to {(err / np.maximum(max_step, 1e-30)).max()}"
    all_zero = np.all(blocks_x == 0, axis=1)
    assert all_zero.any() and np.all(values.reshape(-1, 256)[all_zero] == 0)


# ----------------------------------------------------------------------------------------------
# Weight scale: activations O(1) at any depth, spread logits
# ----------------------------------------------------------------------------------------------

def reference_forward(r: gguf.GGUFReader, ids: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """Minimal float64 forward of a dense GQA file, as llama.cpp runs it: NeoX RoPE (rotate
    x[i], x[i + d/2]) for qwen2/qwen3, adjacent pairs (x[2i], x[2i+1]) for llama.
    Returns logits (n, vocab) and the residual RMS after each layer."""
    w = {t.name: dequantized(t).astype(np.float64) for t in r.tensors}
    arch = field(r, "general.architecture")
    n_layers = field(r, f"{arch}.block_count")
    n_heads = field(r, f"{arch}.attention.head_count")
    n_kv = field(r, f"{arch}.attention.head_count_kv")
    eps = field(r, f"{arch}.attention.layer_norm_rms_epsilon")
    theta = field(r, f"{arch}.rope.freq_base")
    hidden = field(r, f"{arch}.embedding_length")
    hd = int(r.fields[f"{arch}.attention.key_length"].contents()) if f"{arch}.attention.key_length" in r.fields else hidden // n_heads

    def rmsnorm(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    n = len(ids)
    inv = theta ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(n)[:, None] * inv[None, :]               # (n, hd/2)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):                                              # (n, heads, hd)
        if arch == "llama":
            a, b = x[..., 0::2], x[..., 1::2]
            return np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    x = w["token_embd.weight"][ids]
    rms_per_layer = []
    causal = np.tril(np.ones((n, n), dtype=bool))
    for i in range(n_layers):
        p = f"blk.{i}."
        h = rmsnorm(x, w[p + "attn_norm.weight"])
        q, k, v = (h @ w[p + f"attn_{c}.weight"].T + w.get(p + f"attn_{c}.bias", 0) for c in "qkv")
        q, k, v = q.reshape(n, n_heads, hd), k.reshape(n, n_kv, hd), v.reshape(n, n_kv, hd)
        if p + "attn_q_norm.weight" in w:
            q, k = rmsnorm(q, w[p + "attn_q_norm.weight"]), rmsnorm(k, w[p + "attn_k_norm.weight"])
        q, k = rope(q), rope(k)
        group = n_heads // n_kv
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        s = np.where(causal, s, -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", pr, v).reshape(n, n_heads * hd)
        x = x + o @ w[p + "attn_output.weight"].T
        h = rmsnorm(x, w[p + "ffn_norm.weight"])
        g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        rms_per_layer.append(float(np.sqrt(np.mean(x * x))))
    lm_head = w.get("output.weight", w["token_embd.weight"])
    return rmsnorm(x, w["output_norm.weight"]) @ lm_head.T, rms_per_layer


@pytest.mark.parametrize("arch,n_layers,tie", [("llama", 1, False), ("qwen2", 32, False),
                                               ("qwen3", 32, False), ("qwen2", 12, True)])
def test_activations_stay_order_one_and_logits_spread(tmp_path, arch, n_layers, tie):
    spec = SyntheticSpec(arch=arch, n_layers=n_layers, tie_embeddings=tie, weight_type="Q8_0")
    r = gguf.GGUFReader(write_synthetic_model(tmp_path / "m.gguf", spec))
    ids = np.random.default_rng(201).integers(0, spec.vocab_size, size=24)
    logits, rms = reference_forward(r, ids)
    # Residual stream: embedding (rms 1, or ~0.25 when tied) plus 2 n_layers projections of
    # variance ~1/(2 n_layers) each: RMS stays in a band around 1 at every depth.
    assert 0.2 < min(rms) and max(rms) < 3.0, rms
    assert np.all(np.isfinite(logits))
    std = logits.std(axis=1)
    assert np.all((1.0 < std) & (std < 4.0)), std           # LOGIT_STD = 2 over the vocabulary
    top2 = np.sort(logits, axis=1)[:, -2:]
    gaps = top2[:, 1] - top2[:, 0]
    # For 512 draws of N(0, 2^2) the expected top-1/top-2 gap is ~0.6; near ties are rare.
    assert np.median(gaps) > 0.15 and np.mean(gaps < 1e-3) <= 0.1, gaps
    assert len(set(logits.argmax(axis=1).tolist())) >= 6    # next token depends on the input


@pytest.mark.parametrize("arch,weight_type", [("llama", "Q4_K"), ("qwen2", "Q6_K"), ("qwen3", "Q5_K"),
                                              ("qwen2", "Q8_0")])
def test_llama_cpp_runs_the_file_like_the_reference(tmp_path, arch, weight_type):
    """llama.cpp (an independent reader of GGUF) loads the file, including our own K-quant blocks,
    and its logits match the float64 forward above. Tolerance 0.3 (logit std is 2): llama.cpp's CPU
    matmuls quantize activations to 8 bits and keep the KV cache in F16, a few % of the logit
    scale; a transposed or misread tensor would differ by the whole scale. Skipped where
    llama-cpp-python (not a flashd dependency) is not installed."""
    llama_cpp = pytest.importorskip("llama_cpp")
    spec = SyntheticSpec(arch=arch, n_layers=3, hidden=256, ffn=512, weight_type=weight_type,
                         head_dim=128 if arch == "qwen3" else None)
    path = write_synthetic_model(tmp_path / "m.gguf", spec)
    ids = np.random.default_rng(202).integers(0, spec.vocab_size, size=8)
    llm = llama_cpp.Llama(str(path), n_ctx=32, logits_all=True, verbose=False, n_threads=2)
    try:
        llm.eval(ids.tolist())
        got = np.array(llm.scores[: len(ids)])
        text = "def main():\n    return the answer  # ok"
        assert llm.detokenize(llm.tokenize(text.encode(), add_bos=False, special=False)).decode() == text
    finally:
        llm.close()
    want, _ = reference_forward(gguf.GGUFReader(path), ids)
    assert np.abs(got - want).max() < 0.3, np.abs(got - want).max()


# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab_size", [259, 512, 5000])
def test_vocab_is_consistent(vocab_size):
    v = msg.build_vocab(vocab_size)
    assert len(v.tokens) == len(v.token_types) == vocab_size == len(set(v.tokens))
    n_special = len(msg.SPECIAL_TOKENS)
    assert v.tokens[-n_special:] == msg.SPECIAL_TOKENS
    assert v.token_types == (1,) * (vocab_size - n_special) + (3,) * n_special
    byte_tokens = set(msg.bytes_to_unicode())
    assert set(v.tokens[:256]) == byte_tokens and v.tokens[0] == "!"
    vocab = set(v.tokens)
    results = set()
    for rule in v.merges:
        left, right = rule.split(" ")
        assert left in vocab and right in vocab and left + right in vocab, rule
        assert left + right not in msg.SPECIAL_TOKENS
        results.add(left + right)
    assert results == set(v.tokens[256:vocab_size - n_special])   # every other token comes from a merge
    assert (v.bos_id, v.eos_id, v.pad_id) == (vocab_size - 3, vocab_size - 1, vocab_size - 3)


def test_vocab_tokenizes_text_with_hf_tokenizers():
    """Loaded as a byte-level BPE by HF tokenizers, the vocabulary round-trips text and common
    English/code words become single tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    v = msg.build_vocab(1024)
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(v.tokens)}, [tuple(m.split(" ")) for m in v.merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = "def main():\n    return the answer to the question, ünïcode 🙂\n"
    enc = tok.encode(text)
    assert tok.decode(enc.ids) == text
    assert len(enc.ids) < len(text.encode("utf-8")) * 0.7
    for word in (" the", " return", "def"):
        assert len(tok.encode(word).ids) == 1, word


def test_chat_template_renders_chatml(tmp_path):
    import jinja2
    r = gguf.GGUFReader(write_synthetic_model(tmp_path / "m.gguf", SyntheticSpec()))
    template = jinja2.Environment().from_string(field(r, "tokenizer.chat_template"))
    out = template.render(messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    tokens = field(r, "tokenizer.ggml.tokens")
    assert tokens[field(r, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    assert tokens[field(r, "tokenizer.ggml.bos_token_id")] == "<|endoftext|>"
    assert tokens[field(r, "tokenizer.ggml.padding_token_id")] == "<|endoftext|>"
    assert len(field(r, "tokenizer.ggml.merges")) == 512 - 256 - 3


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    ({"weight_type": "Q4_K"}, "token_embd.weight: row length 64"),              # 64 % 256
    ({"hidden": 256, "ffn": 320, "weight_type": "Q6_K"}, "blk.0.ffn_down.weight: row length 320"),
    ({"hidden": 48, "n_heads": 4, "weight_type": "Q8_0"}, "token_embd.weight: row length 48"),
    ({"weight_type": "Q8_0", "type_overrides": (("blk.0.ffn_down.weight", "Q4_K"),)}, "blk.0.ffn_down.weight"),
    ({"weight_type": "Q2_K"}, "weight_type"),
    ({"type_overrides": (("output.weight", "IQ4_XS"),)}, "IQ4_XS"),
    ({"type_overrides": (("blk.*.attn_qq.weight", "F16"),)}, "matches no weight matrix"),
    ({"type_overrides": (("blk.0.attn_norm.weight", "F16"),)}, "matches no weight matrix"),
    ({"tie_embeddings": True, "type_overrides": (("output.weight", "F16"),)}, "matches no weight matrix"),
    ({"arch": "gpt9"}, "arch"),
    ({"n_heads": 4, "n_kv_heads": 3}, "multiple of n_kv_heads"),
    ({"hidden": 66, "n_heads": 4}, "not divisible by n_heads"),
    ({"head_dim": 15}, "even"),
    ({"vocab_size": 258}, "vocab_size"),
    ({"n_layers": 0}, "n_layers"),
    ({"rope_theta": 0.0}, "rope_theta"),
])
def test_bad_spec_raises_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SyntheticSpec(**kwargs)


# ----------------------------------------------------------------------------------------------
# CLI and presets
# ----------------------------------------------------------------------------------------------

def test_cli_writes_model(tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert msg.main([str(out), "--arch", "qwen3", "--layers", "3", "--hidden", "256", "--ffn", "512",
                     "--heads", "4", "--kv-heads", "1", "--type", "q4_k", "--override", "token_embd.weight=Q6_K",
                     "--tie", "--seed", "3", "--name", "tiny", "-q"]) == 0
    r = gguf.GGUFReader(out)
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["token_embd.weight"] == "Q6_K" and types["blk.2.attn_q.weight"] == "Q4_K"
    assert "output.weight" not in types
    assert field(r, "qwen3.block_count") == 3 and field(r, "qwen3.attention.head_count_kv") == 1
    assert field(r, "general.name") == "tiny"
    assert "wrote" in capsys.readouterr().err


def test_cli_rejects_bad_spec(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        msg.main([str(tmp_path / "x.gguf"), "--type", "Q4_K", "-q"])
    assert e.value.code == 2
    assert "token_embd.weight" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


def test_presets_have_real_shapes():
    args = msg.build_arg_parser().parse_args(["o.gguf", "--preset", "qwen2.5-1.5b", "--layers", "2", "--type", "Q4_K"])
    spec = msg.spec_from_args(args)
    assert (spec.arch, spec.n_layers, spec.hidden, spec.n_heads, spec.n_kv_heads, spec.ffn, spec.vocab_size,
            spec.rope_theta, spec.weight_type) == ("qwen2", 2, 1536, 12, 2, 8960, 151936, 1e6, "Q4_K")
    p = msg.PRESETS["qwen2.5-0.5b"]
    assert (p.n_layers, p.hidden, p.n_heads, p.n_kv_heads, p.ffn, p.vocab_size) == (24, 896, 14, 2, 4864, 151936)
    with pytest.raises(ValueError, match="blk.0.attn_q.weight: row length 896"):
        dataclasses.replace(p, weight_type="Q4_K", type_overrides=(("token_embd.weight", "Q8_0"),))


@pytest.mark.slow
def test_preset_real_vocab_writes(tmp_path):
    """A one-layer model at the real 0.5B shapes and 151936-token vocabulary (~10 s)."""
    out = tmp_path / "p.gguf"
    msg.main([str(out), "--preset", "qwen2.5-0.5b", "--layers", "1", "--type", "Q5_0", "-q"])
    r = gguf.GGUFReader(out)
    assert len(field(r, "tokenizer.ggml.tokens")) == 151936
    t = {t.name: t for t in r.tensors}["output.weight"]
    assert list(t.shape) == [896, 151936] and t.tensor_type == Q.Q5_0
    spec = dataclasses.replace(msg.PRESETS["qwen2.5-0.5b"], n_layers=1, weight_type="Q5_0")
    want = float_tensor(spec, "output.weight")
    assert rel_rms(dequantized(t), want) <= REL_RMS_TOL["Q5_0"]
