"""YaRN against llama.cpp: the reference backend on the tiny synthetic YaRN model of
scripts/record_yarn_reference.py (qwen2, float32 weights, rope_dim 32, theta 1e4, original context 64, factor 4),
rebuilt bit for bit from its seed, against llama.cpp 0.3.36's recorded logits (tests/data/reference/
yarn-synthetic.json) over a 200-token prompt -- positions 64..199 past the original context -- and 16
greedy tokens after it.

Tolerance: |logit difference| <= 1e-4. Measured 5.3e-6 (logits of magnitude ~6-8): with float32 weights
llama.cpp's CPU matmuls do not quantize activations, so what remains is float32 summation order and llama.cpp's
float32 rope (theta_scale^j by repeated multiplication, cosf/sinf) against our float64 angles, ~1e-6 relative;
the JSON rounds to 1e-6. 1e-4 is ~20x that and four orders of magnitude below what a wrong rope costs: the
same model without YaRN differs by ~1 (checked below, so the test cannot pass vacuously).
"""
import dataclasses

import numpy as np
import pytest

from flashd.protocol.messages import SamplingParams
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.record_yarn_reference import FORMAT, YARN_SPEC
from tests.reference.llama_cpp_recording import (TOL, load_recording, prompt_logits, rebuilt_model, runner,
                                                 worst_full_row_error)

REC = load_recording("yarn-synthetic.json")


@pytest.fixture(scope="module")
def yarn_model(tmp_path_factory):
    return rebuilt_model(tmp_path_factory.mktemp("yarn") / "yarn.gguf", YARN_SPEC, REC["model"]["gguf_md5"])


def test_recording_is_the_yarn_model():
    assert REC["format"] == FORMAT
    spec = REC["model"]["spec"]
    assert (spec["rope_scaling"], spec["rope_factor"], spec["rope_orig_ctx"]) == ("yarn", 4.0, 64)
    assert len(REC["prompt_ids"]) == 200


def test_teacher_forced_logits_match_llama_cpp(yarn_model):
    logits, r = prompt_logits(yarn_model, REC["prompt_ids"])
    assert r.cfg.rope_scaling is not None
    tf = REC["teacher_forced"]
    for p, row in tf["full_rows"].items():
        np.testing.assert_allclose(logits[int(p)], np.array(row), rtol=0, atol=TOL, err_msg=f"position {p}")
    top_ids, top_logits = np.array(tf["top_ids"]), np.array(tf["top_logits"])
    np.testing.assert_allclose(np.take_along_axis(logits, top_ids, 1), top_logits, rtol=0, atol=TOL)
    # argmax equal wherever llama.cpp's top-2 gap exceeds twice the tolerance (all 200 positions here)
    clear = top_logits[:, 0] - top_logits[:, 1] > 2 * TOL
    assert clear.sum() >= 195
    assert np.array_equal(logits.argmax(1)[clear], np.array(tf["argmax_ids"])[clear])


def test_greedy_tokens_match_llama_cpp(yarn_model):
    r = runner(yarn_model)
    tokens = [s.token for s in r.generate(REC["prompt_ids"], SamplingParams(), 16)]
    assert tokens == REC["greedy"]["generated_ids"]


def test_without_yarn_the_logits_are_far_off(tmp_path):
    """The comparison has teeth: the same weights with the plain rope miss llama.cpp's YaRN logits by ~1."""
    path = write_synthetic_model(tmp_path / "plain.gguf", dataclasses.replace(YARN_SPEC, rope_scaling="none"))
    logits, _ = prompt_logits(path, REC["prompt_ids"])
    assert worst_full_row_error(logits, REC) > 0.1
