"""native/cuda/kv_rotate.cuh's index math on the CPU: hadamard_rotate's warp layout (lane l holds value 32 r + l
in register r; stages h < 32 pair lanes l ^ h through __shfl_xor_sync, stages h >= 32 pair registers r ^ (h / 32),
the lane with bit h set taking other - mine) emulated step by step in float32 gives daemon/backends/kv_rotate.py's
hadamard_rotate bit for bit; so do the callers' layouts: fd_rope_kv_write's one warp per head row and
fd_attention_decode_rope's q tile (attention_splitk_rope_rot.cuh: warp w owns rows w * RPW + i, lane l holds dims
32 r + l, qv[i * NR + r]); and the new key's warp encoders (kv_quant.cuh encode_q8_0_warp / encode_q4_0_warp:
a butterfly max, and a butterfly (magnitude, lowest index) argmax) give kv_quant.py's codes and scales."""
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


def rot_elem(j, tid, hd, threads, rows=16):
    """attention_splitk_rope_rot.cuh rot_elem: element j of thread tid -> (tile row, dim)."""
    nr, rpw = hd // 32, rows // (threads // 32)
    return (tid >> 5) * rpw + j // nr, 32 * (j % nr) + (tid & 31)


@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("threads", [128, 64])              # CUDA 4 warps, HIP 2
def test_fused_q_tile_rotated_layout(hd, threads):
    """rope_stage_rotated: the layout covers the ROWS x HD tile once, each warp's row i is its registers
    qv[i * NR + r] (lane l: dim 32 r + l), i.e. hadamard_rotate's layout, so rotating in registers gives
    fd_rope_kv_write's rotation of every row; rows past the group (zeros) stay zeros."""
    rows, group = 16, 6
    rng = np.random.default_rng(hd + threads)
    q = np.zeros((rows, hd), np.float32)
    q[:group] = rng.standard_normal((group, hd)).astype(np.float32)
    q_per_thread = rows * hd // threads
    nr = hd // 32
    seen = np.zeros((rows, hd), int)
    got = np.zeros((rows, hd), np.float32)
    for w in range(threads // 32):
        qv = np.array([[q[rot_elem(j, 32 * w + lane, hd, threads)] for j in range(q_per_thread)]
                       for lane in range(32)], np.float32)   # [lane][j]
        for i in range(q_per_thread // nr):
            row = qv[:, i * nr:(i + 1) * nr].T.reshape(-1)    # value 32 r + lane
            qv[:, i * nr:(i + 1) * nr] = warp_hadamard(row, nr).reshape(nr, 32).T
        for lane in range(32):
            for j in range(q_per_thread):
                r, d = rot_elem(j, 32 * w + lane, hd, threads)
                seen[r, d] += 1
                got[r, d] = qv[lane, j]
    assert (seen == 1).all()
    np.testing.assert_array_equal(got[:group], hadamard_rotate(q[:group]))
    assert not got[group:].any()


def warp_encode(x: np.ndarray, kind: str):
    """encode_q8_0_warp / encode_q4_0_warp over one block (lane l: x[l]): (float16 scale, codes per lane)."""
    x = x.astype(np.float32)
    lane = np.arange(32)
    with np.errstate(invalid="ignore", divide="ignore"):
        if kind == "q8_0":
            amax = np.fmax(np.float32(0), np.abs(x))
            for h in (16, 8, 4, 2, 1):
                amax = np.fmax(amax, amax[lane ^ h])
            d = np.float32(amax[0] / np.float32(127))
            idv = np.float32(1) / d if d != 0 else np.float32(0)
            t = (x * idv).astype(np.float64)
            return np.float16(d), (np.sign(t) * np.floor(np.abs(t) + 0.5)).astype(np.int8)
        a = np.where(np.abs(x) > 0, np.abs(x), np.float32(0)).astype(np.float32)
        idx = lane.copy()
        for h in (16, 8, 4, 2, 1):
            oa, oi = a[lane ^ h], idx[lane ^ h]
            take = (oa > a) | ((oa == a) & (oi < idx))
            a, idx = np.where(take, oa, a), np.where(take, oi, idx)
        mx = x[idx[0]] if a[0] > 0 else np.float32(0)
        d = np.float32(mx / np.float32(-8))
        idv = np.float32(1) / d if d != 0 else np.float32(0)
        t = (x * idv).astype(np.float32) + np.float32(8.5)
        return np.float16(d), np.minimum(np.trunc(t), 15).astype(np.uint8)


def test_warp_encoders_are_ggml_rounding():
    from flashd.daemon.backends.kv_quant import quantize_q4_0, quantize_q8_0
    rng = np.random.default_rng(5)
    blocks = [rng.standard_normal(32).astype(np.float32) * s for s in (1e-3, 1, 40, 3e4)]
    tie = rng.standard_normal(32).astype(np.float32)
    tie[[3, 20]] = 9.0
    tie[11] = -9.0                                           # equal magnitudes: index 3 (9.0) wins
    neg = tie.copy()
    neg[3] = -9.0                                            # now -9.0 wins: d = 9 / 8
    # (an all -0.0 block is left out: ggml's loop keeps mx = +0 there, as do both kernel encoders, where
    # kv_quant.py's argmax takes x[0] = -0 -- a scale of -0 vs +0, the same dequantized zeros)
    blocks += [tie, neg, np.zeros(32, np.float32),
               np.round(rng.standard_normal(32) * 4).astype(np.float32)]
    for x in blocks:
        d8, q8 = warp_encode(x, "q8_0")
        want8 = quantize_q8_0(x)[0]
        assert want8[:2].view(np.float16)[0].tobytes() == np.float16(d8).tobytes()
        np.testing.assert_array_equal(q8, want8[2:].view(np.int8))
        d4, q4 = warp_encode(x, "q4_0")
        want4 = quantize_q4_0(x)[0]
        assert want4[:2].tobytes() == np.float16(d4).tobytes()
        np.testing.assert_array_equal(q4[:16] | (q4[16:] << 4), want4[2:])


@pytest.mark.parametrize("warps", [4, 2])                   # CUDA 4 warps, HIP 2
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_new_row_blocks_are_encoded_once_each(warps, head_dim):
    """rope_stage_rotated's new row: warps [0, SIDE_WARPS) hold the V row, the rest the K row, and warp w encodes the
    blocks r with r / NB == w % SIDE_WARPS (NB = NR / SIDE_WARPS): every block of each side exactly once."""
    nr, side_warps = head_dim // 32, warps // 2
    assert nr % side_warps == 0
    nb = nr // side_warps
    seen = {"k": [], "v": []}
    for w in range(warps):
        side = "v" if w < side_warps else "k"
        seen[side] += [r for r in range(nr) if r // nb == w % side_warps]
    assert sorted(seen["k"]) == list(range(nr)) and sorted(seen["v"]) == list(range(nr))
