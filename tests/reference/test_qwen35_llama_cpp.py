"""qwen35 (Qwen3.5 hybrid) against llama.cpp: the reference backend on the tiny synthetic models of
scripts/record_qwen35_reference.py (float32 weights; Gated DeltaNet layers mixed with gated full-attention
layers, partial rotary dims, value heads sharing key heads, tied and untied embeddings), rebuilt bit for bit
from their seeds, against llama.cpp 0.3.36's recorded logits (tests/data/reference/qwen35-synthetic.json) over
a 200-token prompt and 16 greedy tokens after it.

Tolerance: |logit difference| <= 1e-4 (logits up to ~12 in magnitude). With float32 weights llama.cpp's CPU matmuls
do not quantize activations, so what remains is float32 rounding in a different order: llama.cpp runs the
recurrent delta rule token by token in float32 while the reference prefill runs the chunked form (64-token
chunks: a triangular solve and matrix products), plus summation order in the matmuls and float32 rope; the
JSON rounds to 1e-6. Measured when recorded (x86-64, AVX2): full rows 4.2e-6 (hybrid-a) and 6.2e-6 (hybrid-b),
top-5 logits at all 200 positions 2.0e-5; 1e-4 is 5x the worst. A mistake in any part of a layer costs far more
(checked below: grouped instead of ggml's modular value-to-key head mapping, the sigmoids (attention output gate,
beta) left out, every dim rotated instead of the partial rope_dim).
"""
import dataclasses

import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.runner import ModelRunner
from flashd.protocol.messages import SamplingParams
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.record_qwen35_reference import FORMAT, MODELS, N_GENERATE
from tests.reference.llama_cpp_recording import (TOL, load_recording, prompt_logits, rebuilt_model, runner,
                                                 worst_full_row_error)

REC = load_recording("qwen35-synthetic.json")


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request, tmp_path_factory):
    name = request.param
    return name, rebuilt_model(tmp_path_factory.mktemp("q35") / f"{name}.gguf", MODELS[name],
                               REC["models"][name]["gguf_md5"])


def test_recording_is_of_these_models():
    assert REC["format"] == FORMAT and sorted(REC["models"]) == sorted(MODELS)
    for name, spec in MODELS.items():
        assert REC["models"][name]["spec"]["arch"] == "qwen35"
        assert len(REC["models"][name]["prompt_ids"]) == 200


def test_teacher_forced_logits_match_llama_cpp(model):
    name, path = model
    rec = REC["models"][name]
    logits, r = prompt_logits(path, rec["prompt_ids"])
    assert r.cfg.linear is not None and any(r.cfg.linear.recurrent) and not all(r.cfg.linear.recurrent)
    worst = worst_full_row_error(logits, rec)
    assert worst <= TOL, f"{name}: worst full-row difference {worst:.2e}"
    tf = rec["teacher_forced"]
    top_ids, top_logits = np.array(tf["top_ids"]), np.array(tf["top_logits"])
    np.testing.assert_allclose(np.take_along_axis(logits, top_ids, 1), top_logits, rtol=0, atol=TOL)
    clear = top_logits[:, 0] - top_logits[:, 1] > 2 * TOL       # argmax equal where the top-2 gap is clear
    assert clear.sum() >= 195
    assert np.array_equal(logits.argmax(1)[clear], np.array(tf["argmax_ids"])[clear])


def test_greedy_tokens_match_llama_cpp(model):
    name, path = model
    rec = REC["models"][name]
    tokens = [s.token for s in runner(path).generate(rec["prompt_ids"], SamplingParams(), N_GENERATE)]
    assert tokens == rec["greedy"]["generated_ids"]


def test_a_wrong_head_mapping_is_far_off(monkeypatch, tmp_path):
    """The comparison has teeth: value head h reading key head h // (Hv / Hk) (grouped, as transformers
    repeats heads) instead of ggml's h % Hk misses llama.cpp's logits by far more than the tolerance."""
    from flashd.daemon.backends import reference_recurrent as rr

    def grouped(a, n_v_heads):
        return a[:, np.arange(n_v_heads) // (n_v_heads // a.shape[1])]

    rec = REC["models"]["hybrid-a"]
    path = write_synthetic_model(tmp_path / "a.gguf", MODELS["hybrid-a"])
    monkeypatch.setattr(rr, "_per_value_head", grouped)
    logits, _ = prompt_logits(path, rec["prompt_ids"])
    assert worst_full_row_error(logits, rec) > 100 * TOL


def test_without_the_sigmoids_the_logits_are_far_off(monkeypatch, tmp_path):
    rec = REC["models"]["hybrid-b"]
    path = write_synthetic_model(tmp_path / "b.gguf", MODELS["hybrid-b"])
    monkeypatch.setattr(ReferenceOps, "sigmoid", lambda self, x: np.ones_like(x), raising=True)
    logits, _ = prompt_logits(path, rec["prompt_ids"])
    assert worst_full_row_error(logits, rec) > 100 * TOL


def test_partial_rotary_matters(tmp_path):
    """The same weights read with every dim rotated (rope_dim = head_dim) miss llama.cpp's logits."""
    rec = REC["models"]["hybrid-a"]
    path = write_synthetic_model(tmp_path / "a.gguf", MODELS["hybrid-a"])
    ops = ReferenceOps()
    lm = load_model(path, ops.load_weight)
    r = ModelRunner(ops, dataclasses.replace(lm.config, rope_dim=lm.config.head_dim), lm.weights, 256, 512)
    logits = np.asarray(r.prefill(rec["prompt_ids"], all_logits=True))
    assert worst_full_row_error(logits, rec) > 100 * TOL
