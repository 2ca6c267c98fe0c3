"""CPU emulation of fd_attention_decode_rope's index math (native/cuda/attention_splitk_kernel.cuh: rope_stage
and the new-key override in splitk_kernel; native/cuda/rope_math.cuh), with the kernels' formulas:

- the new key (slot n_past) is handled by exactly one (split, tile, warp) step of the split schedule, in
  the split the kernel picks ((n_past // chunk_len) % n_splits), which never exits early;
- the per-thread dims of the q staging and of the K | V row staging cover every element once, and a K
  dim's cos/sin is the thread's table entry for it;
- rope_pair_of (per element, the fused kernel) is rope_pair_dims (per pair, rope.cu) seen from each
  element, and the per-element rotation in float32 equals the reference's pairwise one bit for bit.
The GPU tests (tests/gpu/test_attention_decode_rope.py) check the kernels themselves.
"""
import numpy as np
import pytest
from tests.emulation.test_decode_attention_emulation import (MAX_SPLITS, WARP_SLOTS, effective_splits, n_splits_for,
                                                             split_warp_slots)

from flashd.daemon.backends.reference import ReferenceOps


def owner_split(n_past, chunk_len, n_splits, single_chunks=0):
    """splitk_kernel<HD, true>: new_key = n_past in the block of this split (if 0 <= n_past < max_ctx); ns is 1
    for a row short enough for split 0 alone."""
    return (n_past // chunk_len) % effective_splits(n_splits, chunk_len, n_past + 1, single_chunks)


@pytest.mark.parametrize("max_ctx,chunk_len,n_kv_heads,group,head_dim", [
    (32768, 64, 2, 6, 128), (4096, 256, 2, 7, 64), (1000, 64, 8, 1, 64), (1500, 192, 2, 20, 128),
    (1200, 128, 4, 6, 256), (64, 64, 1, 16, 128), (256, 64, 2, 6, 128),
])
@pytest.mark.parametrize("single_chunks", [0, 4])
def test_exactly_one_warp_step_overrides_the_new_key(max_ctx, chunk_len, n_kv_heads, group, head_dim, single_chunks):
    n_splits = n_splits_for(n_kv_heads, group, head_dim, max_ctx, chunk_len)
    assert 1 <= n_splits <= MAX_SPLITS
    edges = {0, 1, max_ctx - 1}
    for b in range(chunk_len, max_ctx, chunk_len * max(1, max_ctx // chunk_len // 7)):
        edges |= {b - 1, b, b + 1}
    for n_past in sorted(n for n in edges if 0 <= n < max_ctx):
        L = min(n_past + 1, max_ctx)                  # decode: keys [0, n_past]
        hits = []
        for split in range(n_splits):
            steps = split_warp_slots(split, n_splits, chunk_len, L, single_chunks)
            owner = owner_split(n_past, chunk_len, n_splits, single_chunks)
            if steps is None:
                assert split != owner, "the owner split exits early"
                continue
            new_key = n_past if split == owner else -1
            for i, (warp, v0) in enumerate(steps):
                if new_key >= v0 and new_key < v0 + WARP_SLOTS:     # the kernel's test
                    hits.append((split, i, len(steps), warp, new_key - v0))
            # a split that does not own it never sees the key (so -1 loses nothing)
            if new_key < 0:
                assert not any(v0 <= n_past < v0 + WARP_SLOTS for _, v0 in steps)
        assert len(hits) == 1, f"n_past {n_past}: {hits}"
        split, i, n_steps, warp, row = hits[0]
        assert i == n_steps - 1, "the new key is the split's last visible key"
        assert 0 <= row < WARP_SLOTS and warp == (n_past % 64) // WARP_SLOTS


@pytest.mark.parametrize("threads", [128, 64])      # CUDA (4 warps), HIP (2 warps)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_staging_dims_cover_the_tile_once(threads, head_dim):
    rows = 16
    q_per_thread = rows * head_dim // threads
    nu = head_dim // threads if head_dim > threads else 1
    assert head_dim % threads == 0 or threads % head_dim == 0
    seen = np.zeros((rows, head_dim), int)
    for tid in range(threads):
        dims = [(tid + u * threads) % head_dim for u in range(nu)]
        for j in range(q_per_thread):
            e = tid + j * threads
            r, d = e // head_dim, e % head_dim
            assert d == dims[j % nu], "q element j uses table entry j % NU"
            seen[r, d] += 1
        for i in range((2 * head_dim + threads - 1) // threads):
            c = tid + i * threads
            if c >= 2 * head_dim:
                break
            if c < head_dim:
                assert i < nu and dims[i] == c, "a K dim's cos/sin is the thread's entry i"
    assert (seen == 1).all()
    # every K | V element written by exactly one thread
    owner = np.zeros(2 * head_dim, int)
    for tid in range(threads):
        for i in range((2 * head_dim + threads - 1) // threads):
            c = tid + i * threads
            if c < 2 * head_dim:
                owner[c] += 1
    assert (owner == 1).all()


def rope_pair_dims(j, rope_dim, neox):
    return (j, j + rope_dim // 2) if neox else (2 * j, 2 * j + 1)


def rope_pair_of(d, rope_dim, neox):
    half = rope_dim // 2
    first = d < half if neox else (d & 1) == 0
    j = (d if first else d - half) if neox else d >> 1
    partner = (d + half if first else d - half) if neox else d ^ 1
    return j, partner, first


@pytest.mark.parametrize("rope_dim", [2, 32, 48, 64, 96, 128, 256])
@pytest.mark.parametrize("neox", [False, True])
def test_pair_of_element_is_the_pair_of_rope_cu(rope_dim, neox):
    for d in range(rope_dim):
        j, partner, first = rope_pair_of(d, rope_dim, neox)
        assert 0 <= j < rope_dim // 2
        assert rope_pair_dims(j, rope_dim, neox) == ((d, partner) if first else (partner, d))


@pytest.mark.parametrize("head_dim,rope_dim,neox", [(128, 128, True), (64, 32, False), (256, 64, True),
                                                    (128, 96, False)])
def test_per_element_rotation_equals_the_reference_bitwise(head_dim, rope_dim, neox):
    """rope_rotated(self, partner, c, s, first) in float32 (separately rounded products) per element ==
    ReferenceOps.rope's pairwise float32 expressions, given its float32 cos/sin."""
    rng = np.random.default_rng(rope_dim + head_dim)
    x = (rng.standard_normal((3, 5, head_dim)) * 3).astype(np.float32)
    positions = np.array([0, 4095, 1_000_003])
    theta = 1e6
    want = ReferenceOps().rope(x, positions, theta, rope_dim, neox)
    half = rope_dim // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rope_dim)
    angle = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    got = x.copy()
    for d in range(rope_dim):
        j, partner, first = rope_pair_of(d, rope_dim, neox)
        c, s = cos[:, j][:, None], sin[:, j][:, None]
        me, other = x[..., d], x[..., partner]
        got[..., d] = (me * c - other * s) if first else (other * s + me * c)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
