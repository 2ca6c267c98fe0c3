"""CPU emulation of split-K attention's fragment step over a quantized K and V (native/cuda/attention_splitk_qfrag.cuh:
frag_scores, frag_pv, warp_store_q; both sides q8_0 / q4_0), with the kernel's formulas:

- a tile staged with padded code rows (stage_rows' PAD = CODE_PAD: rows cb + 16 bytes apart, the test_kv_quant_stage
  emulation's copies) is read by ldmatrix (b16 elements = code byte pairs; not transposed for K, transposed for V)
  from the lane addresses the kernel computes; every lane's B fragment registers, dequantized as kvq::dequant_pair
  does (byte selectors 0x4140 / 0x4342 / 0x4240 / 0x4341, q8_0 codes + 128, q4_0 low / high nibbles, times the
  row's scale), hold exactly the float16 values kv_quant.decode_rows gives, at the positions the header states:
  K slice position k = dim pi(k); V group (b, h, p) column n = dim 32 b + 16 h + 2 n + p;
- qfrag_pos (where q's dims are staged) is pi's inverse, so q and k meet dim by dim in every mma;
- warp_store_q puts every output dim of rows g, g + 8 back exactly once;
- each ldmatrix phase (one 8x8 matrix: 8 row addresses of 16 bytes) touches 8 different 4-bank groups: no shared
  memory bank conflicts from the padded rows.
The float16x2 identity itself (dequant_pair == float16(d q)) is test_kv_dequant_half2.py's; the GPU tests
(tests/gpu/test_attention_kv_quant.py) run the kernels.
"""
import numpy as np
import pytest

from tests.emulation.test_kv_quant_stage_emulation import code_bytes, make_plane, stage_rows

CODE_PAD = 16
TILE, THREADS, WARP_SLOTS = 64, 128, 16


def pi(k: int) -> int:
    """The dim held at position k of a 16-dim slice."""
    return 4 * ((k % 8) // 2) + 2 * (k // 8) + k % 2


def qfrag_pos(d: int) -> int:
    """attention_splitk_qfrag.cuh qfrag_pos."""
    s = d & 15
    return (d & ~15) | ((s & 2) << 2) | ((s >> 2) << 1) | (s & 1)


def ldmatrix_x4(smem: np.ndarray, addr_of_lane, trans: bool) -> list[list[np.ndarray]]:
    """regs[lane][j] = the 4 bytes lane receives from matrix j (rows: the addresses of lanes 8j .. 8j + 7)."""
    rows = [[addr_of_lane(8 * j + r) for r in range(8)] for j in range(4)]
    for j in range(4):
        assert all(a % 16 == 0 for a in rows[j])
        assert len({(a // 16) % 8 for a in rows[j]}) == 8, "bank conflict"
    regs = []
    for lane in range(32):
        g, t = lane // 4, lane % 4
        out = []
        for j in range(4):
            if not trans:   # row g, b16 elements 2t, 2t + 1
                a = rows[j][g] + 4 * t
                out.append(smem[a:a + 4].copy())
            else:           # column g of rows 2t, 2t + 1
                a0, a1 = rows[j][2 * t] + 2 * g, rows[j][2 * t + 1] + 2 * g
                out.append(np.concatenate([smem[a0:a0 + 2], smem[a1:a1 + 2]]))
        regs.append(out)
    return regs


def dequant_pair(reg: np.ndarray, kind: str, hi_nibble: bool, sel: tuple[int, int], d: tuple[float, float]):
    """kvq::dequant_pair on a code register: the two selected bytes' values times their scales, float16."""
    if kind == "q8_0":
        q = reg.view(np.int8).astype(np.int64)
    else:
        q = ((reg >> (4 if hi_nibble else 0)) & 15).astype(np.int64) - 8
    return np.array([np.float16(np.float64(d[i]) * q[sel[i]]) for i in range(2)], np.float16)


SEL_LO, SEL_HI, SEL_EVEN, SEL_ODD = (0, 1), (2, 3), (0, 2), (1, 3)


def stage_tile(rng, kinds, hd):
    """A full tile of both sides staged with padded code rows; returns (stage bytes, per side: (codes offset, scales
    offset, row stride, float16 values [TILE][hd]))."""
    sides, parts, off = [], [], 0
    for kind in kinds:
        plane, vals = make_plane(rng, kind, 1, TILE, hd)
        stride = code_bytes(kind, hd) + CODE_PAD
        size = TILE * (stride + hd // 16)
        buf = np.full(size, 0xAB, np.uint8)
        written = np.zeros(size, np.int32)
        stage_rows(buf, plane, kind, hd, TILE, lambda i: (True, i), THREADS, TILE, written, pad=CODE_PAD)
        pad_bytes = np.zeros(size, bool)
        for r in range(TILE):
            pad_bytes[r * stride + code_bytes(kind, hd):(r + 1) * stride] = True
        assert (written[~pad_bytes] == 1).all() and (written[pad_bytes] == 0).all()
        parts.append(buf)
        sides.append((off, off + TILE * stride, stride, vals))
        off += size
    return np.concatenate(parts), sides


def scales_of(stage, scale_off, row, nb):
    return stage[scale_off + row * nb * 2:scale_off + (row + 1) * nb * 2].view(np.float16)


@pytest.mark.parametrize("kinds", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0"), ("q4_0", "q8_0")],
                         ids=lambda k: f"{k[0]}-{k[1]}")
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_fragments_are_the_dequantized_values_at_their_positions(kinds, hd):
    rng = np.random.default_rng(hd + len(kinds[0]) * 7 + (kinds[1] == "q4_0"))
    stage, sides = stage_tile(rng, kinds, hd)
    nb = hd // 32
    for warp in range(THREADS // 32):
        row0 = warp * WARP_SLOTS
        # ---- K (frag_scores) ----
        kind = kinds[0]
        c_off, s_off, cbp, kv = sides[0]
        kc = c_off + row0 * cbp
        k_addr = lambda lane: kc + ((lane >> 3 >> 1) * 8 + (lane & 7)) * cbp + ((lane >> 3) & 1) * 16
        seen = {}
        n_ld = nb if kind == "q8_0" else nb // 2
        for i in range(n_ld):
            regs = ldmatrix_x4(stage, lambda lane: k_addr(lane) + 32 * i, trans=False)
            for lane in range(32):
                g, t = lane // 4, lane % 4
                dk = [scales_of(stage, s_off, row0 + g, nb), scales_of(stage, s_off, row0 + g + 8, nb)]
                if kind == "q8_0":   # slice(2b, r0, r2), slice(2b + 1, r1, r3)
                    calls = [(2 * i, regs[lane][0], regs[lane][2], i, False),
                             (2 * i + 1, regs[lane][1], regs[lane][3], i, False)]
                else:                # block b = 2 i + j: slice 2b (low nibbles), 2b + 1 (high)
                    calls = []
                    for j in range(2):
                        b = 2 * i + j
                        calls += [(2 * b, regs[lane][j], regs[lane][2 + j], b, False),
                                  (2 * b + 1, regs[lane][j], regs[lane][2 + j], b, True)]
                for kk, lo, hi, b, hn in calls:
                    for grp, reg, d in ((0, lo, dk[0][b]), (1, hi, dk[1][b])):
                        key = row0 + g + 8 * grp
                        b0 = dequant_pair(reg, kind, hn, SEL_LO, (d, d))
                        b1 = dequant_pair(reg, kind, hn, SEL_HI, (d, d))
                        # mma B fragment: b0 = positions (2t, 2t + 1), b1 = (2t + 8, 2t + 9) of slice kk
                        for pos, val in zip((2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9), (*b0, *b1)):
                            want = kv[key, 16 * kk + pi(pos)]
                            assert val.view(np.uint16) == want.view(np.uint16), (warp, lane, kk, pos)
                            seen[(key, kk, pos)] = seen.get((key, kk, pos), 0) + 1
        # every (key, slice, position) of the warp's 16 keys reaches the mma exactly once per lane quad's owner
        assert len(seen) == WARP_SLOTS * (hd // 16) * 16 and set(seen.values()) == {1}
        # ---- V (frag_pv) ----
        kind = kinds[1]
        c_off, s_off, cbp, vv = sides[1]
        vc = c_off + row0 * cbp
        v_addr = lambda lane: vc + (((lane >> 3) & 1) * 8 + (lane & 7)) * cbp + ((lane >> 3) >> 1) * 16
        got = {}
        n_ld = nb if kind == "q8_0" else nb // 2
        for i in range(n_ld):
            regs = ldmatrix_x4(stage, lambda lane: v_addr(lane) + 32 * i, trans=True)
            for lane in range(32):
                g, t = lane // 4, lane % 4
                dv = [scales_of(stage, s_off, row0 + k, nb) for k in (2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9)]
                if kind == "q8_0":   # group(b, 0, r0, r1), group(b, 1, r2, r3)
                    groups = [(i, 0, regs[lane][0], regs[lane][1], False), (i, 1, regs[lane][2], regs[lane][3], False)]
                else:                # block b = 2 i + j: group(b, 0 | 1, r[2j], r[2j + 1]) low | high nibbles
                    groups = []
                    for j in range(2):
                        b = 2 * i + j
                        groups += [(b, 0, regs[lane][2 * j], regs[lane][2 * j + 1], False),
                                   (b, 1, regs[lane][2 * j], regs[lane][2 * j + 1], True)]
                for b, h, lo, hi, hn in groups:
                    for p, sel in ((0, SEL_EVEN), (1, SEL_ODD)):
                        b0 = dequant_pair(lo, kind, hn, sel, (dv[0][b], dv[1][b]))
                        b1 = dequant_pair(hi, kind, hn, sel, (dv[2][b], dv[3][b]))
                        dim = 32 * b + 16 * h + 2 * g + p           # column n = g of group (b, h, p)
                        for key, val in zip((2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9), (*b0, *b1)):
                            want = vv[row0 + key, dim]
                            assert val.view(np.uint16) == want.view(np.uint16), (warp, lane, b, h, p, key)
                            got[(key, dim)] = got.get((key, dim), 0) + 1
        # each (key, dim) of the warp's keys: once per column owner, i.e. 4 lanes of a group (t) x ... exactly one
        # lane (g, t) holds (keys 2t, 2t + 1, 2t + 8, 2t + 9) x dim 2g + p of every group
        assert len(got) == WARP_SLOTS * hd and set(got.values()) == {1}


def test_q_positions_invert_pi():
    for d in range(256):
        k = qfrag_pos(d)
        assert k // 16 == d // 16 and pi(k % 16) == d % 16
    assert sorted(qfrag_pos(d) for d in range(256)) == list(range(256))


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_warp_store_q_writes_every_output_dim_once(hd):
    """Group (b, h, p) = o[4 b + 2 h + p]: columns 2t, 2t + 1 of it are dims 32 b + 16 h + 4t + p and + 2 + p; the
    store writes o[2 bh] / o[2 bh + 1] (p = 0 / 1) as one float4 at dim 16 bh + 4t of rows g and g + 8."""
    written = np.zeros((16, hd), np.int32)
    for lane in range(32):
        g, t4 = lane // 4, (lane % 4) * 4
        for bh in range(hd // 16):
            for row, (e_idx, o_idx) in ((g, (0, 1)), (g + 8, (2, 3))):
                # float4 = (even c[e_idx], odd c[e_idx], even c[o_idx], odd c[o_idx])
                elems = [(2 * bh, e_idx), (2 * bh + 1, e_idx), (2 * bh, o_idx), (2 * bh + 1, o_idx)]
                for x, (nt, c) in enumerate(elems):
                    b, h, p = nt // 4, (nt // 2) % 2, nt % 2
                    col = 2 * (lane % 4) + (c % 2)                # C fragment column of element c
                    assert 16 * bh + t4 + x == 32 * b + 16 * h + 2 * col + p
                    written[row, 16 * bh + t4 + x] += 1
    assert (written == 1).all()
