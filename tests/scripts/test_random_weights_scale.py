"""scripts/random_weights.py scaled_weights: random blocks rescaled to a wanted root mean square by their float16
scale fields alone (the codes untouched), and make_synthetic_gguf's --random-blocks matrices at their tensors'
init_std -- what keeps a random-block clone's activations inside float16 on the GPU (its logits were NaN when the
blocks kept random_weights' kernel-test scales, up to 0.1 a Q8_0 step). Oracle: gguf.quants.dequantize."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from flashd.scripts.make_synthetic_gguf import SyntheticSpec, random_block_rows, tensor_plan
from flashd.scripts.random_weights import SCALE_FIELDS, random_weights, scaled_weights


def rms(data, qtype) -> float:
    return float(np.sqrt(np.mean(np.square(dequantize(data, qtype).astype(np.float64)))))


@pytest.mark.parametrize("qtype", sorted(SCALE_FIELDS, key=int))
def test_scaled_to_the_wanted_rms_codes_untouched(qtype):
    rng = np.random.default_rng(int(qtype))
    data = random_weights(rng, qtype, 64, 512)
    out = scaled_weights(data, qtype, 512, 0.02)
    assert out.shape == data.shape and out.dtype == np.uint8
    assert abs(rms(out, qtype) / 0.02 - 1) < 0.02            # float16 rounding of the scales only
    assert rms(data, qtype) > 5 * 0.02                        # the kernel tests' scales are far larger
    block, size = GGML_QUANT_SIZES[qtype]
    codes = np.ones(size, bool)                               # every byte outside the scale fields
    for lo, hi in SCALE_FIELDS[qtype]:
        codes[lo:hi] = False
    np.testing.assert_array_equal(out.reshape(64, -1, size)[..., codes], data.reshape(64, -1, size)[..., codes])


def test_random_block_matrices_take_their_tensors_init_std():
    spec = SyntheticSpec(arch="qwen2", n_layers=1, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab_size=300,
                         weight_type="Q4_K", random_blocks=True, type_overrides=(("*ffn_down*", "Q6_K"),))
    seen = set()
    for plan in tensor_plan(spec):
        if len(plan.shape) != 2 or plan.qtype not in SCALE_FIELDS:
            continue
        got = rms(random_block_rows(spec, plan), plan.qtype)
        want = float(np.hypot(plan.init_std, plan.init_mean))
        assert 0.5 < got / want < 2, plan.name                # the pool's RMS; rows are drawn from it at random
        seen.add(plan.qtype)
    assert {T.Q4_K, T.Q6_K} <= seen
