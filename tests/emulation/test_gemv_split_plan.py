"""Split rows (gemv_plan.cuh `split`, gemv.cuh issue_step_split / compute_step_split): the index math of a row computed
by a pair of warps, emulated for every quantized format and awkward block counts.

Slice 0 stages bytes [0, split_bytes) of the row and its lanes run row_dot_q8 with t = lane, pieces = split_pieces;
slice 1 stages [split_bytes, row_bytes) and runs t = lane + split_pieces, pieces = row's pieces, with the row pointer
moved back by split_bytes. What must hold: every piece of the row is read by exactly one lane of one slice; a lane
keeps one piece-in-block index j (row_dot_q8 computes it once, from t) and walks blocks in steps of 32 / LPB; every
weight byte a lane reads lies inside its slice's staged bytes; and the buffer gemv_plan sizes holds the larger slice
wherever the row starts mod 16."""
import pytest

from tests.emulation.gemv_lane_emulation import pieces_per_row, row_bytes
from tests.emulation.quant_emulation import FORMATS

QUANT = [f for f in FORMATS if not f.IS_FLOAT]


def stage_range_bytes(n):            # quant_stage.cuh
    return ((15 + n + 15) & ~15) + 16


def plan(fmt, cols):
    blocks = cols // fmt.BE
    h = (blocks + 1) // 2
    return h * fmt.LPB, h * fmt.BB, stage_range_bytes(h * fmt.BB)


def lane_pieces(fmt, t, pieces):
    """row_dot_q8's walk: j fixed from t, blk from t / LPB in steps of 32 / LPB, piece p = t, t + 32, ..."""
    j, blk, out = t % fmt.LPB, t // fmt.LPB, []
    for p in range(t, pieces, 32):
        assert p // fmt.LPB == blk and p % fmt.LPB == j
        out.append((blk, j))
        blk += 32 // fmt.LPB
    return out


@pytest.mark.parametrize("fmt", QUANT, ids=lambda f: f.qtype.name)
@pytest.mark.parametrize("blocks", [2, 3, 7, 35, 68, 283])
def test_slices_cover_the_row_once_inside_their_staged_bytes(fmt, blocks):
    assert 32 % fmt.LPB == 0
    cols = blocks * fmt.BE
    pieces = pieces_per_row(fmt, cols)
    split_pieces, split_bytes, buf = plan(fmt, cols)
    seen = {}
    for slice_ in (0, 1):
        lo_byte = split_bytes if slice_ else 0
        hi_byte = row_bytes(fmt, cols) if slice_ else split_bytes
        assert stage_range_bytes(hi_byte - lo_byte) <= buf      # the larger slice is slice 0
        for lane in range(32):
            t = lane + (split_pieces if slice_ else 0)
            for blk, j in lane_pieces(fmt, t, pieces if slice_ else split_pieces):
                key = (blk, j)
                assert key not in seen, f"piece {key} read twice"
                seen[key] = slice_
                assert lo_byte <= blk * fmt.BB and (blk + 1) * fmt.BB <= hi_byte, "outside the slice's bytes"
    assert len(seen) == pieces


@pytest.mark.parametrize("fmt", QUANT, ids=lambda f: f.qtype.name)
def test_a_slice_fits_its_buffer_at_any_alignment(fmt):
    """warp_stage puts byte b of the slice at buf + (src & 15) + b and needs (src & 15) + n + 16 bytes."""
    for blocks in (2, 3, 35, 68):
        _, split_bytes, buf = plan(fmt, blocks * fmt.BE)
        for head in range(16):
            assert head + split_bytes + 16 <= buf
