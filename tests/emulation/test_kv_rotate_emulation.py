"""native/cuda/kv_rotate.cuh's index math on the CPU: hadamard_rotate's warp layout (lane l holds value 32 r + l
in register r; stages h < 32 pair lanes l ^ h through __shfl_xor_sync, stages h >= 32 pair registers r ^ (h / 32),
the lane with bit h set taking other - mine) emulated step by step in float32 gives daemon/backends/kv_rotate.py's
hadamard_rotate bit for bit; so do the callers' layouts: fd_rope_kv_write's one warp per head row and
fd_attention_decode_rope's q tile (thread tid's element j is e = tid + j * THREADS = row e / HD, dim e % HD,
staged through a ROWS x HD buffer)."""
import numpy as np
import pytest

from flashd.daemon.backends.kv_rotate import hadamard_rotate, rotation_block, rotation_scale

LANES = 32


def warp_hadamard(row: np.ndarray, rmax: int = 16) -> np.ndarray:
    """hadamard_rotate_row<rmax> on one row (float32, 32 n_r values) as the kernel runs it."""
    n_r = row.size // LANES
    assert n_r <= rmax
    block = rotation_block(row.size)
    x = np.zeros((rmax, LANES), np.float32)                 # x[r][lane]
    x[:n_r] = row.reshape(n_r, LANES)                        # value 32 r + lane
    lane = np.arange(LANES)
    h = 1
    while h < 32:
        other = x[:, lane ^ h]                              # __shfl_xor_sync(x[r], h)
        x[:n_r] = np.where((lane & h) != 0, other - x, x + other)[:n_r]
        h *= 2
    hr = 1
    while hr < rmax:
        if 32 * hr < block:
            for r in range(rmax):
                if r & hr == 0 and r + hr < n_r:
                    a, b = x[r].copy(), x[r + hr].copy()
                    x[r], x[r + hr] = a + b, a - b
        hr *= 2
    x[:n_r] *= rotation_scale(block)
    return x[:n_r].reshape(-1)


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 160, 192, 256, 512])
def test_warp_layout_is_the_reference(head_dim):
    rng = np.random.default_rng(head_dim)
    rows = (rng.standard_normal((6, head_dim)) * 4).astype(np.float32)
    rows[:, 9] += 70.0
    want = hadamard_rotate(rows)
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(warp_hadamard(row), want[i])
        if head_dim <= 256:                                  # the fused kernel's RMAX = HD / 32
            np.testing.assert_array_equal(warp_hadamard(row, head_dim // 32), want[i])


@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("threads", [128, 64])              # CUDA 4 warps, HIP 2
def test_fused_q_tile_round_trip(hd, threads):
    """rotate_q_tile: qv[j] of thread tid -> buf[tid + j * THREADS] -> one warp per row -> back: every query row
    of the tile rotated as fd_rope_kv_write rotates it; rows past the group (zeros) stay zeros."""
    rows, group = 16, 6
    rng = np.random.default_rng(hd + threads)
    q = np.zeros((rows, hd), np.float32)
    q[:group] = rng.standard_normal((group, hd)).astype(np.float32)
    q_per_thread = rows * hd // threads
    qv = np.array([[q.reshape(-1)[tid + j * threads] for j in range(q_per_thread)] for tid in range(threads)])
    buf = np.zeros(rows * hd, np.float32)
    for tid in range(threads):
        for j in range(q_per_thread):
            buf[tid + j * threads] = qv[tid, j]
    for r in range(rows):
        buf[r * hd:(r + 1) * hd] = warp_hadamard(buf[r * hd:(r + 1) * hd], hd // 32)
    back = np.array([[buf[tid + j * threads] for j in range(q_per_thread)] for tid in range(threads)])
    got = np.zeros(rows * hd, np.float32)
    for tid in range(threads):
        for j in range(q_per_thread):
            got[tid + j * threads] = back[tid, j]
    got = got.reshape(rows, hd)
    np.testing.assert_array_equal(got[:group], hadamard_rotate(q[:group]))
    assert not got[group:].any()
