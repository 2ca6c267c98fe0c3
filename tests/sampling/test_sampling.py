"""The sampler (flashd.daemon.sampling) against brute-force definitions of each step."""
import numpy as np
import pytest

from flashd.daemon.sampling import NonFiniteLogits, apply_penalties, candidate_probs, sample, uniform
from flashd.protocol.messages import SamplingParams


@pytest.fixture
def rng():
    return np.random.default_rng(201)


def test_uniform_is_deterministic_and_in_range():
    us = [uniform(7, s) for s in range(20000)]
    assert us == [uniform(7, s) for s in range(20000)]
    assert min(us) >= 0.0 and max(us) < 1.0
    # mean and variance of U[0,1): 1/2 and 1/12; 20000 draws give std err ~0.002 on the mean
    assert abs(np.mean(us) - 0.5) < 0.01
    assert abs(np.var(us) - 1 / 12) < 0.005
    assert uniform(8, 0) != uniform(7, 0)


def test_greedy_is_argmax_lowest_id_on_ties(rng):
    x = rng.standard_normal(1000).astype(np.float32)
    assert sample(x, np.array([]), SamplingParams(), 0) == int(np.argmax(x))
    x[10] = x[500] = x.max() + 1
    assert sample(x, np.array([]), SamplingParams(), 0) == 10


def test_penalties_match_their_definitions():
    logits = np.array([2.0, -1.0, 0.5, 3.0, -2.0])
    history = np.array([0, 1, 1, 4, 3, 3, 3])
    p = SamplingParams(repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25, repeat_last_n=4)
    # window = last 4 ids: [1? no] -> history[-4:] = [4, 3, 3, 3]
    out = apply_penalties(logits, history, p)
    expect = logits.copy()
    expect[4] = -2.0 * 2.0 - 1 * 0.5 - 0.25
    expect[3] = 3.0 / 2.0 - 3 * 0.5 - 0.25
    np.testing.assert_allclose(out, expect)
    off = SamplingParams(repeat_penalty=2.0, repeat_last_n=0)
    np.testing.assert_allclose(apply_penalties(logits, history, off), logits)


def test_top_k_top_p_min_p_thresholds(rng):
    logits = np.log(np.array([0.4, 0.1, 0.25, 0.05, 0.2]))
    ids, probs = candidate_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert ids.tolist() == [0, 2]
    np.testing.assert_allclose(probs, [0.4 / 0.65, 0.25 / 0.65])
    # top_p 0.8: sorted 0.4, 0.25, 0.2 reaches 0.85 >= 0.8 -> keep {0, 2, 4}
    ids, _ = candidate_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert ids.tolist() == [0, 2, 4]
    ids, _ = candidate_probs(logits, SamplingParams(temperature=1.0, top_p=0.4))
    assert ids.tolist() == [0]
    # min_p 0.5: keep p >= 0.2
    ids, _ = candidate_probs(logits, SamplingParams(temperature=1.0, min_p=0.5))
    assert ids.tolist() == [0, 2, 4]
    # ties at the top_k boundary are all kept
    tied = np.array([1.0, 0.5, 0.5, 0.1])
    ids, _ = candidate_probs(tied, SamplingParams(temperature=1.0, top_k=2))
    assert ids.tolist() == [0, 1, 2]


def test_top_p_matches_brute_force(rng):
    for _ in range(50):
        x = rng.standard_normal(200) * 2
        top_p = float(rng.uniform(0.05, 0.99))
        ids, _ = candidate_probs(x, SamplingParams(temperature=0.7, top_p=top_p))
        p = np.exp(x / 0.7 - (x / 0.7).max())
        p /= p.sum()
        order = np.argsort(-p)
        n_keep = int(np.argmax(np.cumsum(p[order]) >= top_p)) + 1
        assert set(ids.tolist()) == set(order[:n_keep].tolist())


def test_seeded_sampling_is_reproducible_and_seed_dependent(rng):
    x = rng.standard_normal(50).astype(np.float32)
    p = SamplingParams(temperature=1.0, seed=1234)
    a = [sample(x, np.array([]), p, s) for s in range(200)]
    assert a == [sample(x, np.array([]), p, s) for s in range(200)]
    b = [sample(x, np.array([]), SamplingParams(temperature=1.0, seed=1235), s) for s in range(200)]
    assert a != b


def test_sampled_distribution_matches_softmax(rng):
    """Chi-square goodness of fit of 20000 draws against softmax(x / T)."""
    x = rng.standard_normal(8) * 1.5
    t = 0.8
    p = np.exp(x / t - (x / t).max())
    p /= p.sum()
    n = 20000
    params = SamplingParams(temperature=t, seed=int(rng.integers(1 << 62)))
    counts = np.bincount([sample(x, np.array([]), params, s) for s in range(n)], minlength=8)
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 30.0   # 7 degrees of freedom: P(chi2 > 30) ~ 1e-4


def test_extreme_temperatures_stay_finite(rng):
    """A temperature so small that logits / T overflows is argmax; a huge one is near-uniform."""
    x = rng.standard_normal(100)
    for t in (1e-300, 5e-324):
        for step in range(5):
            assert sample(x, np.array([]), SamplingParams(temperature=t, seed=step), step) == int(np.argmax(x))
    ids, probs = candidate_probs(x, SamplingParams(temperature=1e300))
    assert len(ids) == 100 and np.allclose(probs, 0.01)


@pytest.mark.parametrize("where", ["all", "one", "first"])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, top_k=40, seed=3)],
                         ids=["greedy", "sampled"])
def test_nan_logits_are_an_error_not_a_token(rng, where, params):
    """np.argmax would return the first NaN's index and the device's argmax -1: a model whose logits are NaN ends
    the request (protocol error model_output), it never emits a token chosen from them."""
    x = rng.standard_normal(1000).astype(np.float32)
    if where == "all":
        x[:] = np.nan
    else:
        x[0 if where == "first" else 517] = np.nan
    with pytest.raises(NonFiniteLogits, match="NaN at generation step 5"):
        sample(x, np.array([1, 2, 3]), params, 5)
    x[np.isnan(x)] = 0.0
    assert 0 <= sample(x, np.array([1, 2, 3]), params, 5) < 1000
