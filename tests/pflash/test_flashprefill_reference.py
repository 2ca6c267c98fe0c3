"""The numpy FlashPrefill (daemon/pflash/flashprefill.py) -- the reference backend's op and the
CUDA kernels' oracle -- checked against definitions written independently here."""
import numpy as np
import pytest

from flashd.daemon.backends.base import Batch
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.pflash import flashprefill as fp
from tests.gpu.attention_oracle import attention_oracle

B = fp.BLOCK


def dense_causal(q, keys, values, p0):
    """Plain causal GQA attention of tokens at slots p0 + i over slots [0, p0 + i], float64: the attention
    tests' brute-force oracle (tests/gpu/attention_oracle.py) over (slot, head, d) keys with the causal mask."""
    n, n_keys = q.shape[0], keys.shape[0]
    visible = np.arange(n_keys)[None, :] <= p0 + np.arange(n)[:, None]
    return attention_oracle(q, keys.transpose(1, 0, 2), values.transpose(1, 0, 2), visible, 1 / np.sqrt(q.shape[2]))


def qkv(rng, n_keys, n, n_heads, n_kv, d):
    q = rng.normal(size=(n, n_heads, d)).astype(np.float32)
    keys = rng.normal(size=(n_keys, n_kv, d)).astype(np.float32)
    values = rng.normal(size=(n_keys, n_kv, d)).astype(np.float32)
    return q, keys, values


@pytest.mark.parametrize("p0,n,n_heads,n_kv", [(0, 1, 2, 1), (0, 127, 4, 2), (0, 129, 6, 2), (128, 200, 4, 4),
                                              (256, 61, 7, 1)])
def test_all_selected_equals_dense_causal(p0, n, n_heads, n_kv, rng):
    q, keys, values = qkv(rng, p0 + n, n, n_heads, n_kv, 16)
    got = fp.flashprefill_attention(q, keys, values, p0, 0.25, alpha=0.0, sink=2, window=4, first_full_block=10**6)
    np.testing.assert_allclose(got, dense_causal(q, keys, values, p0), rtol=1e-10, atol=1e-12)
    # last_full rows: with any alpha, the rows from first_full_block on are dense too
    got = fp.flashprefill_attention(q, keys, values, p0, 0.25, alpha=1.0, sink=0, window=1, first_full_block=0)
    np.testing.assert_allclose(got, dense_causal(q, keys, values, p0), rtol=1e-10, atol=1e-12)


def test_mean_k_uses_the_real_row_count(rng):
    keys = rng.normal(size=(300, 2, 8))
    mk = fp.mean_k(keys)
    assert mk.shape == (3, 2, 8)
    np.testing.assert_allclose(mk[2], keys[256:300].mean(0))
    np.testing.assert_allclose(mk[0], keys[:128].mean(0))


def test_scores_are_normalised_and_causal(rng):
    p0, n = 256, 300
    q, keys, _ = qkv(rng, p0 + n, n, 4, 2, 16)
    s = fp.score(q, fp.mean_k(keys), p0, 0.25)
    assert s.shape == (3, 4, 5)
    for mq in range(3):
        m = p0 // B + mq
        np.testing.assert_allclose(s[mq, :, :m + 1].sum(-1), 1.0, rtol=1e-12)
        assert (s[mq, :, m + 1:] == 0).all()
        assert (s[mq, :, :m + 1] > 0).all()


def test_score_definition_by_hand(rng):
    q, keys, _ = qkv(rng, 200, 200, 2, 1, 8)
    mk = np.stack([keys[:128, 0].mean(0), keys[128:, 0].mean(0)])[:, None, :]
    s = fp.score(q, mk, 0, 0.5)
    rows = q[128:200, 1].astype(np.float64)                   # query block 1, head 1
    a = rows @ mk[:, 0].T * 0.5                               # (72, 2)
    e = np.exp(a - a.max()).sum(0)
    np.testing.assert_allclose(s[1, 1, :2], e / e.sum(), rtol=1e-12)


def test_planted_block_is_selected_where_the_anchor_misses_it(rng):
    """fp.py's experiment (research/pflash-megakernel-oracles): keys of block 7 aligned with every
    query. Normalised scores select it in every row at alpha 0.85 (the anchor's never do)."""
    S, D = 4096, 128
    q = rng.normal(size=(S, 1, D)).astype(np.float32)
    keys = rng.normal(size=(S, 1, D)).astype(np.float32)
    u = rng.normal(size=D)
    u /= np.linalg.norm(u)
    q[:, 0] += 3 * u
    keys[7 * B:8 * B, 0] += 3 * u
    s = fp.score(q, fp.mean_k(keys), 0, 1 / np.sqrt(D))
    idx, cnt = fp.select(s, 0, 0.85, 2, 4, S // B - 2)
    for m in range(12, S // B - 2):
        assert 7 in idx[m, 0, :cnt[m, 0]]
    density = cnt[12:S // B - 2, 0].sum() / sum(m + 1 for m in range(12, S // B - 2))
    assert density < 0.5


def test_select_lists_ascending_padded_with_sink_window_and_full_rows(rng):
    p0, n = 384, 700
    n_mq, n_kb = 6, 9
    s = rng.uniform(size=(n_mq, 3, n_kb))
    s /= s.sum(-1, keepdims=True)
    first_full = 8
    idx, cnt = fp.select(s, p0, 0.5, 2, 3, first_full)
    for mq in range(n_mq):
        m = p0 // B + mq
        for h in range(3):
            chosen = idx[mq, h, :cnt[mq, h]]
            assert (np.diff(chosen) > 0).all() and (idx[mq, h, cnt[mq, h]:] == -1).all()
            thr = 0.5 * s[mq, h, :m + 1].max()
            expect = [kb for kb in range(m + 1)
                      if s[mq, h, kb] >= thr or kb < 2 or m - kb < 3 or m >= first_full]
            assert list(chosen) == expect
    idx0, cnt0 = fp.select(s, p0, 0.0, 0, 1, 10**6)       # alpha 0: the full causal set
    assert all(cnt0[mq, h] == p0 // B + mq + 1 for mq in range(n_mq) for h in range(3))


def test_block_mask_types():
    idx = np.full((2, 3, 4), -1, np.int32)
    cnt = np.zeros((2, 3), np.int32)
    idx[1, 2, :2] = [0, 3]
    cnt[1, 2] = 2
    mask = fp.block_mask(np.array([fp.MASK_DENSE, fp.MASK_STREAMING, fp.MASK_LISTS]), idx, cnt, 256, 200, 4, 1, 1)
    # absolute query blocks 2 and 3
    assert mask[0, 0].tolist() == [True, True, True, False] and mask[1, 0].tolist() == [True] * 4
    assert mask[0, 1].tolist() == [True, False, True, False] and mask[1, 1].tolist() == [True, False, False, True]
    assert mask[1, 2].tolist() == [True, False, False, True] and not mask[0, 2].any()
    q = np.ones((200, 3, 4), np.float32)
    out = fp.sparse_attention(q, np.ones((456, 1, 4)), np.ones((456, 1, 4)), 256, mask, 0.5).reshape(200, 3, 4)
    assert (out[:128, 2] == 0).all()                       # a row attending nothing gives zeros


def test_tail_max_probs_definition(rng):
    n_keys, n_tail = 90, 5
    q = rng.normal(size=(n_tail, 4, 8))
    keys = rng.normal(size=(n_keys, 2, 8))
    got = fp.tail_max_probs(q, keys, n_keys, 0.3)
    for t in range(n_tail):
        last = n_keys - n_tail + t
        per_head = []
        for h in range(4):
            a = keys[:last + 1, h // 2] @ q[t, h] * 0.3
            p = np.exp(a - a.max())
            per_head.append(np.concatenate([p / p.sum(), np.zeros(n_keys - last - 1)]))
        np.testing.assert_allclose(got[t], np.max(per_head, axis=0), rtol=1e-12)


def test_reference_ops_flashprefill_attention_writes_the_cache_and_matches_dense(rng):
    ops = ReferenceOps()
    n_kv, d, p0, n = 2, 16, 128, 150
    k_cache = np.zeros((512, n_kv, d), np.float32)
    v_cache = np.zeros((512, n_kv, d), np.float32)
    k_cache[:p0] = rng.normal(size=(p0, n_kv, d))
    v_cache[:p0] = rng.normal(size=(p0, n_kv, d))
    q, k, v = qkv(rng, n, n, 4, n_kv, d)
    batch = Batch(ids=np.zeros(n, np.int32), positions=np.arange(p0, p0 + n, dtype=np.int32),
                  n_past=np.array([p0], np.int32))
    step = fp.FlashPrefillStep(p0=p0, first_full_block=99, alpha=0.0, sink_blocks=2, window_blocks=4)
    got = ops.flashprefill_attention(q, k, v, (k_cache, v_cache), batch, step)
    np.testing.assert_array_equal(k_cache[p0:p0 + n], k)
    dense = ops.attention(q, k, v, (k_cache.copy(), v_cache.copy()), batch)
    np.testing.assert_allclose(got, dense, rtol=2e-5, atol=2e-6)   # float32 reference vs float64 oracle


def test_step_checks_its_fields():
    with pytest.raises(ValueError):
        fp.FlashPrefillStep(p0=100, first_full_block=0, alpha=0.1, sink_blocks=2, window_blocks=4)
    with pytest.raises(ValueError):
        fp.FlashPrefillStep(p0=0, first_full_block=0, alpha=1.5, sink_blocks=2, window_blocks=4)
