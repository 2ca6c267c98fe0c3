"""The recurrent layers of qwen35 on the reference backend, against themselves in float64:

- the chunked gated delta rule (prefill) equals the recurrent one (decode) -- across chunk boundaries, for any
  chunk size, and with the state carried across calls in any split (prefill, then decode, then prefill);
- the causal conv1d over a whole sequence equals the same sequence fed in pieces through its state;
- a sequence's recurrent state saved and restored continues exactly (two sequences interleaved through one
  cache give each one's own logits, bit for bit).

Tolerance (float64): 1e-12 absolute on O(1) outputs and states. The two forms are algebraically equal; in
float64 the chunked form's triangular solve and products round differently (measured ~2e-16..1e-15).
"""
import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.backends.reference_recurrent import causal_conv1d, delta_rule_chunked, delta_rule_recurrent
from flashd.daemon.models import load_model
from flashd.daemon.runner import ModelRunner
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec

TOL64 = 1e-12


def inputs(seed, n, n_k, n_v, S):
    rng = np.random.default_rng(seed)

    def l2(x):
        return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)

    q, k = l2(rng.standard_normal((n, n_k, S))), l2(rng.standard_normal((n, n_k, S)))
    v = rng.standard_normal((n, n_v, S))
    g = -np.log1p(np.exp(rng.standard_normal((n, n_v)))) * rng.uniform(0.01, 1.0, n_v)   # log decay <= 0
    beta = 1 / (1 + np.exp(-rng.standard_normal((n, n_v))))
    state = rng.standard_normal((n_v, S, S)) * 0.3
    return q, k, v, g, beta, state


@pytest.mark.parametrize("n, chunk", [(1, 64), (63, 64), (64, 64), (65, 64), (200, 64), (37, 8), (129, 32)])
@pytest.mark.parametrize("heads", [(1, 1), (2, 4), (1, 3)])
def test_chunked_equals_recurrent(n, chunk, heads):
    q, k, v, g, beta, s0 = inputs(n * 7 + chunk, n, heads[0], heads[1], 16)
    s_rec, s_chk = s0.copy(), s0.copy()
    o_rec = delta_rule_recurrent(q, k, v, g, beta, s_rec)
    o_chk = delta_rule_chunked(q, k, v, g, beta, s_chk, chunk=chunk)
    np.testing.assert_allclose(o_chk, o_rec, rtol=0, atol=TOL64)
    np.testing.assert_allclose(s_chk, s_rec, rtol=0, atol=TOL64)


def test_state_carried_across_calls():
    """prefill 70 (chunks of 16), decode 1, prefill the rest (chunks of 33) == one recurrent pass."""
    q, k, v, g, beta, s0 = inputs(5, 180, 2, 4, 16)
    s_ref = s0.copy()
    o_ref = delta_rule_recurrent(q, k, v, g, beta, s_ref)
    s = s0.copy()
    parts = [delta_rule_chunked(q[:70], k[:70], v[:70], g[:70], beta[:70], s, chunk=16),
             delta_rule_recurrent(q[70:71], k[70:71], v[70:71], g[70:71], beta[70:71], s),
             delta_rule_chunked(q[71:], k[71:], v[71:], g[71:], beta[71:], s, chunk=33)]
    np.testing.assert_allclose(np.concatenate(parts), o_ref, rtol=0, atol=TOL64)
    np.testing.assert_allclose(s, s_ref, rtol=0, atol=TOL64)


def test_strong_decay_stays_finite():
    """Decays of exp(-30) per token: the chunked form never forms exp of a positive cumulative difference."""
    q, k, v, g, beta, s0 = inputs(9, 130, 1, 2, 8)
    g = np.full_like(g, -30.0)
    s_rec, s_chk = s0.copy(), s0.copy()
    o_rec = delta_rule_recurrent(q, k, v, g, beta, s_rec)
    o_chk = delta_rule_chunked(q, k, v, g, beta, s_chk)
    assert np.isfinite(o_chk).all()
    np.testing.assert_allclose(o_chk, o_rec, rtol=0, atol=TOL64)


def test_conv_in_pieces_equals_whole():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((50, 24)), rng.standard_normal((24, 4))
    s_whole = np.zeros((3, 24))
    whole = causal_conv1d(x, w, s_whole)
    # the definition: y[t, c] = sum_k x[t + k - 3, c] w[c, k] with zeros before the sequence
    padded = np.concatenate([np.zeros((3, 24)), x])
    np.testing.assert_allclose(whole, sum(padded[kk:kk + 50] * w[:, kk] for kk in range(4)), rtol=0, atol=TOL64)
    s = np.zeros((3, 24))
    pieces = [causal_conv1d(x[a:b], w, s) for a, b in ((0, 1), (1, 2), (2, 30), (30, 31), (31, 50))]
    np.testing.assert_allclose(np.concatenate(pieces), whole, rtol=0, atol=TOL64)
    np.testing.assert_array_equal(s, s_whole)
    np.testing.assert_array_equal(s, x[-3:])


SPEC = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=16,
                     ssm_state=16, ssm_k_heads=1, ssm_v_heads=2, full_attn_interval=2, weight_type="F32", seed=7)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    ops = ReferenceOps()
    lm = load_model(write_synthetic_model(tmp_path_factory.mktemp("q35") / "m.gguf", SPEC), ops.load_weight)
    return ops, lm


def test_save_and_restore_two_sequences(hybrid):
    """Two sequences decoded alternately through one runner, each one's K/V and recurrent state saved and
    restored around the other's steps, give exactly what each gives alone."""
    ops, lm = hybrid
    a, b = [5, 9, 300, 301, 7, 8, 100], [42, 43, 44, 45]
    alone = {}
    for name, prompt in (("a", a), ("b", b)):
        r = ModelRunner(ops, lm.config, lm.weights, 64, 512)
        r.reset()
        rows = [r.prefill(prompt)[0]]
        for t in (11, 12, 13):
            rows.append(r.prefill([t])[0])
        alone[name] = np.array(rows)
    r = ModelRunner(ops, lm.config, lm.weights, 64, 512)
    saved, rows = {}, {"a": [], "b": []}
    for step in range(4):
        for name, prompt in (("a", a), ("b", b)):
            if step == 0:
                r.reset()
                rows[name].append(r.prefill(prompt)[0])
            else:
                kv, state, n_past = saved[name]
                r.cache.kv.k[...], r.cache.kv.v[...] = kv
                r.cache.load_state(state)
                r.n_past = n_past
                rows[name].append(r.prefill([10 + step])[0])
            saved[name] = ((r.cache.kv.k.copy(), r.cache.kv.v.copy()), r.cache.save_state(), r.n_past)
    for name in ("a", "b"):
        np.testing.assert_array_equal(np.array(rows[name]), alone[name])


def test_a_forward_from_slot_zero_starts_a_new_sequence(hybrid):
    ops, lm = hybrid
    r = ModelRunner(ops, lm.config, lm.weights, 64, 512)
    first = r.score([3, 4, 5, 6])
    r.prefill([7, 8, 9])            # the state now holds another sequence
    np.testing.assert_array_equal(r.score([3, 4, 5, 6]), first)
    # prefix reuse keeps a copy of the state at a chunk boundary: test_qwen35_prefix_reuse.py


def test_decode_steps_equal_prefill(hybrid):
    """Token-by-token decoding (recurrent form) equals one prefill (chunked form) within float32 rounding."""
    ops, lm = hybrid
    ids = list(np.random.default_rng(3).integers(0, 512, 150))
    r = ModelRunner(ops, lm.config, lm.weights, 256, 512)
    whole = r.score(ids)
    r.reset()
    steps = np.concatenate([r.prefill([t]) for t in ids])
    np.testing.assert_allclose(steps, whole, rtol=0, atol=1e-4)
