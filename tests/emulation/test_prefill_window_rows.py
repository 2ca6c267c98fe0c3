"""CPU emulation of the KV window's block map in native/cuda/attention_prefill.cu (window_rows_of, window_grid) and of
which key tiles its blocks read from the window's float16 rows (n_raw), for any *n_past.

With a window of U positions, the prefill kernel gives every block rows of one window block (positions p0 + t with the
same (p0 + t) // U), so the block shares one window start; the grid is sized on the host without knowing p0. Checked
here: every flattened row (token * group + head) belongs to exactly one block; a block's rows are consecutive, at most
BQ, and lie in one window block; the blocks that have rows fit the grid; idle blocks only follow the last segment; the
window tiles [n_raw, n_tiles) of a block are exactly the 64-key (or BK-key) tiles at or past its window start, and
they hold every key its rows read at full precision (tile starts are multiples of BK, the window start a multiple of
64)."""
from __future__ import annotations

import numpy as np
import pytest


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def window_grid(n: int, group: int, bq: int, window: int) -> int:
    return ceil_div(n * group, bq) + ceil_div(n, window) + 1


def window_rows_of(b: int, p0: int, n: int, group: int, bq: int, window: int) -> tuple[int, int]:
    """The device function, line for line: (row0, row_end), or (-1, -1) for an idle block."""
    t0, length = 0, min(n, window - p0 % window)
    while t0 < n:
        blocks = (length * group + bq - 1) // bq
        if b < blocks:
            row0 = t0 * group + b * bq
            return row0, min(row0 + bq, (t0 + length) * group)
        b -= blocks
        t0 += length
        length = min(window, n - t0)
    return -1, -1


def n_raw_tiles(p0: int, row0: int, group: int, window: int, bk: int, n_tiles: int) -> int:
    return min(n_tiles, window * ((p0 + row0 // group) // window) // bk)


CASES = [(0, 1, 6, 64, 64), (0, 512, 6, 64, 512), (1000, 100, 6, 64, 512), (37, 300, 7, 64, 64),
         (1020, 9, 6, 32, 64), (4096, 512, 6, 64, 512), (63, 1, 1, 64, 64), (5, 4096, 8, 64, 512),
         (511, 513, 12, 32, 128), (123456, 777, 5, 64, 256)]


@pytest.mark.parametrize("p0,n,group,bq,window", CASES)
def test_every_row_once_in_one_window_block(p0, n, group, bq, window):
    grid = window_grid(n, group, bq, window)
    owner = np.full(n * group, -1)
    seen_idle = False
    for b in range(grid):
        row0, row_end = window_rows_of(b, p0, n, group, bq, window)
        if row0 < 0:
            seen_idle = True
            continue
        assert not seen_idle, "a block with rows after an idle one"
        assert 0 <= row0 < row_end <= n * group and row_end - row0 <= bq
        assert (owner[row0:row_end] == -1).all()
        owner[row0:row_end] = b
        first, last = p0 + row0 // group, p0 + (row_end - 1) // group
        assert first // window == last // window, "a block straddles a window block"
    assert (owner >= 0).all(), "a row no block computes"


@pytest.mark.parametrize("p0,n,group,bq,window", CASES)
@pytest.mark.parametrize("bk", [64, 32])
def test_window_tiles_are_the_ones_at_or_past_the_block_start(p0, n, group, bq, window, bk):
    for b in range(window_grid(n, group, bq, window)):
        row0, row_end = window_rows_of(b, p0, n, group, bq, window)
        if row0 < 0:
            continue
        kv_len = p0 + (row_end - 1) // group + 1
        n_tiles = ceil_div(kv_len, bk)
        n_raw = n_raw_tiles(p0, row0, group, window, bk, n_tiles)
        start = window * ((p0 + row0 // group) // window)
        assert n_raw * bk == start and n_raw < n_tiles                  # the block's own keys are window keys
        for r in range(row0, row_end):                                  # every row: keys < start quantized, the
            pos = p0 + r // group                                       # rest (up to itself) full precision
            assert window * (pos // window) == start
