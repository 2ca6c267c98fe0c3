"""CPU emulation of attention_sparse.cu's tile map: for every CTA (64 tokens of one head) the kernel
walks the 64-key tiles of its block set (BlockSet::at, the diagonal-tile skip, the kv_len zero-fill
bound and the `masked` shortcut); the keys it lets into the softmax must be exactly the oracle's
visible set (pflash.flashprefill.block_mask & causal). The fragment-level arithmetic is
attention_tile.cuh's (shared with attention_prefill.cu), emulated in tests/emulation/test_flash_tiling.py;
this covers what is new."""
import numpy as np
import pytest

from flashd.daemon.pflash import flashprefill as fp

B, BKV, BQ = 128, 64, 64


def block_set(t, m, mq, h, n_heads, n_kb, idx, cnt, sink, local):
    """(count, at) as in the kernel."""
    if t == fp.MASK_DENSE:
        return m + 1, (lambda e: e)
    if t < 0:
        local_lo = max(0, m - local + 1)
        sink_part = min(sink, local_lo)
        return sink_part + (m + 1 - local_lo), (lambda e: e if e < sink_part else local_lo + (e - sink_part))
    count = min(max(int(cnt[mq, h]), 0), n_kb)
    return count, (lambda e: int(idx[mq, h, e]))


def kernel_visible(types, idx, cnt, p0, n, n_heads, sink, local):
    """bool (n, n_heads, p0 + n): keys entering each row's softmax with a finite score."""
    n_kb = -(-(p0 + n) // B)
    out = np.zeros((n, n_heads, p0 + n), bool)
    n_ctas = -(-n // BQ)
    for bx in range(n_ctas):
        row0 = (n_ctas - 1 - bx) * BQ
        last_token = min(row0 + BQ, n) - 1
        mq = row0 // B
        m = p0 // B + mq
        kv_len = p0 + last_token + 1
        first_lim = p0 + row0
        for h in range(n_heads):
            count, at = block_set(int(types[h]), m, mq, h, n_heads, n_kb, idx, cnt, sink, local)
            n_tiles = 2 * count
            if count > 0 and at(count - 1) == m and m * B + BKV > p0 + last_token:
                n_tiles -= 1
            for j in range(n_tiles):
                key0 = at(j // 2) * B + (j % 2) * BKV
                masked = key0 < 0 or key0 + BKV - 1 > first_lim
                for r in range(row0, row0 + BQ):
                    token = min(r, n - 1)
                    lim = p0 + token
                    for key in range(key0, key0 + BKV):
                        if masked and (key > lim or key < 0):
                            continue
                        # an unmasked key must have been loaded (not zero-filled) and be real
                        assert 0 <= key < kv_len, (key, kv_len)
                        if r < n:
                            assert not out[r, h, key], "a key visited twice"
                            out[r, h, key] = True
    return out


def oracle_visible(types, idx, cnt, p0, n, n_heads, sink, local):
    n_kb = -(-(p0 + n) // B)
    blocks = fp.block_mask(types, idx, cnt, p0, n, n_kb, sink, local)
    slot = np.arange(p0 + n)
    vis = np.zeros((n, n_heads, p0 + n), bool)
    for i in range(n):
        vis[i] = np.repeat(blocks[i // B], B, axis=-1)[:, :p0 + n] & (slot <= p0 + i)[None, :]
    return vis


@pytest.mark.parametrize("p0,n", [(0, 1), (0, 63), (0, 64), (0, 65), (0, 200), (128, 129), (384, 300), (256, 256)])
def test_tile_map_equals_the_oracle(p0, n, rng):
    n_heads = 5
    n_mq, n_kb = -(-n // B), -(-(p0 + n) // B)
    idx = np.full((n_mq, n_heads, n_kb), -1, np.int32)
    cnt = np.zeros((n_mq, n_heads), np.int32)
    for mq in range(n_mq):
        m = p0 // B + mq
        for h in range(n_heads):
            keep = np.flatnonzero(rng.uniform(size=m + 1) < 0.5)
            idx[mq, h, :len(keep)] = keep
            cnt[mq, h] = len(keep)
    types = np.array([fp.MASK_DENSE, fp.MASK_STREAMING, fp.MASK_LISTS, -3, 7], np.int32)
    for sink, local in ((0, 1), (1, 2), (2, 4), (3, 0)):
        got = kernel_visible(types, idx, cnt, p0, n, n_heads, sink, local)
        np.testing.assert_array_equal(got, oracle_visible(types, idx, cnt, p0, n, n_heads, sink, local))
