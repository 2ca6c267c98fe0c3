"""dflash_topk.topk_logprobs against its definition (a full stable argsort of log_softmax per row).

Same ids and bitwise the same log-probs, on rows with ties at the top (equal values: the lower id
first), many equal values, -inf entries, vocabularies that are and are not a multiple of the chunk,
K above the number of chunks, and temperatures other than 1.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.speculative.dflash_topk import CHUNK, topk_logprobs, topk_logprobs_reference


def awkward_logits(rng, n: int, vocab: int) -> np.ndarray:
    x = (rng.standard_normal((n, vocab)) * 4).astype(np.float32)
    x[0, ::7] = x[0].max()                    # many ties at the maximum
    if n > 1:
        x[1] = np.round(x[1])                 # few distinct values: ties everywhere
    if n > 2:
        x[2, : vocab // 2] = -np.inf          # half the vocabulary impossible
    if n > 3:
        x[3, -1] = x[3].max() + 1             # the best id is the last one
    return x


@pytest.mark.parametrize("vocab", [CHUNK * 5, 320, 1000, 4099])
@pytest.mark.parametrize("k", [1, 8, 13])
@pytest.mark.parametrize("temperature", [1.0, 0.35, 2.0])
def test_same_ids_and_logprobs_as_the_definition(vocab, k, temperature):
    rng = np.random.default_rng(vocab * 31 + k)
    x = awkward_logits(rng, 6, vocab)
    ids, lp = topk_logprobs(x, k, temperature)
    ref_ids, ref_lp = topk_logprobs_reference(x, k, temperature)
    assert ids.dtype == np.int32 and lp.dtype == np.float64
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(lp, ref_lp)


def test_k_at_least_the_vocabulary_and_empty_input():
    x = awkward_logits(np.random.default_rng(0), 4, 40)
    for k in (20, 40, 100):
        ids, lp = topk_logprobs(x, k, 1.0)
        ref_ids, ref_lp = topk_logprobs_reference(x, k, 1.0)
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_array_equal(lp, ref_lp)
    ids, lp = topk_logprobs(np.zeros((0, 40), np.float32), 8, 1.0)
    assert ids.shape[0] == 0 and lp.shape[0] == 0
