"""CPU emulation of the split-K attention's quantized-row staging (native/cuda/attention_splitk_qstage.cuh,
used by splitk_kernel's QKV load_tile and warp loop), with the kernel's formulas:

- stage_rows: thread tid's cp.async of chunk tid % CC of tile rows tid / CC + j * THREADS / CC (16 bytes at
  dst + 16 (tid + j THREADS)), and one SB-byte scale copy per row (thread tid < TILE), cover every byte of
  the raw stage exactly once, read whole rows of the plane (codes at row * cb, scales at the plane's scale
  offset + row * SB), each copy aligned to its size, and zero-fill rows past the visible keys;
- the raw stage's layout (K side of TILE * row_bytes bytes, then V; codes [TILE][cb] then scales) and the
  ring of stages keep every part 16-byte aligned;
- dequant_side: each warp's pieces (lane + 32 j of its 16 rows) cover its rows once, and read from the raw
  stage the bytes dequant8 read from the plane: the float16 tile equals kv_quant.decode_rows rounded to
  float16 (the values the previous loader produced), zeros for rows past the visible keys;
- masked mode: rows past n_past come from the visible-slot list, exactly as the float16 loader's slots.
The GPU tests (tests/gpu/test_attention_kv_quant.py) check the kernels themselves.
"""
import numpy as np
import pytest

from flashd.daemon.backends.cuda.kv_planes import planes_from_blocks
from flashd.daemon.backends.kv_quant import decode_rows, encode_rows

CUDA = dict(threads=128, tile=64)     # FD_ATTN_ASYNC: 4 warps
HIP = dict(threads=64, tile=32)       # 2 warps
WARP_SLOTS = 16


def code_bytes(kind, hd):
    return {"q8_0": hd, "q4_0": hd // 2, "f16": 2 * hd}[kind]


def raw_row_bytes(kind, hd):
    return code_bytes(kind, hd) + (0 if kind == "f16" else hd // 16)


def cc_of(kind, hd):
    """stage_side's CC: 16-byte chunks of a row's codes (or float16 values)."""
    return code_bytes(kind, hd) // 16


def make_plane(rng, kind, n_kv_heads, max_ctx, hd):
    """(the plane's bytes as the device holds them, the float16 values the attention tiles hold)."""
    x = (rng.standard_normal((n_kv_heads, max_ctx, hd)) * 3).astype(np.float32)
    if kind == "f16":
        vals = x.astype(np.float16)
        return vals.view(np.uint8).reshape(-1), vals.reshape(-1, hd)
    blocks = encode_rows(x, kind)
    return planes_from_blocks(blocks, kind), decode_rows(blocks, kind).astype(np.float16).reshape(-1, hd)


def stage_rows(dst, plane, kind, hd, n_rows_total, row_of, threads, tile, written, pad=0):
    """stage_rows<CC, SB, Q4, PAD> of one side into dst (its raw-stage bytes; code rows cb + pad bytes apart, pad > 0
    only for a quantized side: the fragment step's layout); written counts each byte's copies."""
    cc = cc_of(kind, hd)
    row_step = threads // cc
    assert threads % cc == 0 and tile % row_step == 0
    cb = cc * 16
    assert pad == 0 or kind != "f16"
    stride = cb + pad
    for tid in range(threads):
        for j in range(tile // row_step):
            valid, row = row_of(tid // cc + j * row_step)
            d = (tid // cc + j * row_step) * stride + 16 * (tid % cc)
            assert pad or d == 16 * (tid + j * threads)
            s = row * cb + (tid % cc) * 16
            assert s % 16 == 0 and d % 16 == 0 and s + 16 <= n_rows_total * cb
            dst[d:d + 16] = plane[s:s + 16] if valid else (0x88 if kind == "q4_0" else 0)   # q4_0: code 8
            written[d:d + 16] += 1
    if kind == "f16":
        return
    sb = hd // 16
    assert sb in (4, 8, 16) and threads >= tile
    scale_base = n_rows_total * cb
    for tid in range(tile):
        valid, row = row_of(tid)
        d, s = tile * stride + sb * tid, scale_base + row * sb
        assert d % sb == 0 and s % sb == 0 and s + sb <= plane.size
        dst[d:d + sb] = plane[s:s + sb] if valid else 0
        written[d:d + sb] += 1


def dequant_side(src, kind, hd, tile, warp, lane):
    """dequant_side<HD> for one lane: {(tile row, piece): 8 float16 values}."""
    pieces, nb = hd // 8, hd // 32
    out = {}
    for j in range(WARP_SLOTS * pieces // 32):
        c = lane + 32 * j
        r, piece = c // pieces, c % pieces
        i = warp * WARP_SLOTS + r
        if kind == "f16":
            o = i * 2 * hd + piece * 16
            out[(i, piece)] = src[o:o + 16].view(np.float16)
            continue
        cb = code_bytes(kind, hd)
        b, off = piece >> 2, (piece & 3) * 8
        so = tile * cb + (i * nb + b) * 2
        d = np.float32(src[so:so + 2].view(np.float16)[0])
        if kind == "q8_0":
            q = src[i * cb + piece * 8:i * cb + piece * 8 + 8].view(np.int8).astype(np.float32)
        else:
            o = i * cb + b * 16 + (off & 15)
            assert o % 8 == 0
            q = (((src[o:o + 8] >> (4 if off >= 16 else 0)) & 15).astype(np.int32) - 8).astype(np.float32)
        out[(i, piece)] = (d * q).astype(np.float16)
    return out


def run_tile(cfg, kinds, hd, n_kv_heads, max_ctx, kvh, v0, L, direct_end, n_past, lst, seed=0):
    rng = np.random.default_rng(seed)
    threads, tile = cfg["threads"], cfg["tile"]
    planes = [make_plane(rng, k, n_kv_heads, max_ctx, hd) for k in kinds]
    n_rows = n_kv_heads * max_ctx

    def row_of(i):   # splitk_kernel's load_tile (the general lambda; the fast one is it with every v direct)
        v = v0 + i
        valid = v < L
        slot = 0 if not valid else (v if v < direct_end else n_past + lst[v - n_past])
        return valid, kvh * max_ctx + slot

    rb = [raw_row_bytes(k, hd) for k in kinds]
    stage = np.full(tile * sum(rb), 0xAB, np.uint8)      # poison: every byte must be written
    written = np.zeros(stage.size, np.int32)
    stage_rows(stage[:tile * rb[0]], planes[0][0], kinds[0], hd, n_rows, row_of, threads, tile, written[:tile * rb[0]])
    stage_rows(stage[tile * rb[0]:], planes[1][0], kinds[1], hd, n_rows, row_of, threads, tile, written[tile * rb[0]:])
    assert (written == 1).all()
    assert (tile * rb[0]) % 16 == 0 and stage.size % 16 == 0          # V side and the next ring stage aligned
    for side, (kind, (_, vals)) in enumerate(zip(kinds, planes)):
        src = stage[:tile * rb[0]] if side == 0 else stage[tile * rb[0]:]
        got = {}
        for warp in range(threads // 32):
            for lane in range(32):
                part = dequant_side(src, kind, hd, tile, warp, lane)
                assert not set(part) & set(got)
                got.update(part)
        assert len(got) == tile * hd // 8
        for i in range(tile):
            valid, row = row_of(i)
            row_vals = np.concatenate([got[(i, p)] for p in range(hd // 8)])
            want = vals[row] if valid else np.zeros(hd, np.float16)
            np.testing.assert_array_equal(row_vals.view(np.uint16), want.view(np.uint16))


KINDS = [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0"), ("f16", "q8_0"), ("q4_0", "f16")]


@pytest.mark.parametrize("cfg", [CUDA, HIP], ids=["cuda", "hip"])
@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_decode_tiles_stage_and_dequantize_to_the_rows_values(cfg, kinds, hd):
    n_kv_heads, max_ctx, kvh = 2, 3 * cfg["tile"] + 5, 1          # odd max_ctx: scale rows only 2-aligned
    L = 2 * cfg["tile"] + 7                                       # last tile partly visible
    for v0 in (0, cfg["tile"], 2 * cfg["tile"]):                  # full, full, partial
        run_tile(cfg, kinds, hd, n_kv_heads, max_ctx, kvh, v0, L, L, L - 1, [], seed=v0)


@pytest.mark.parametrize("cfg", [CUDA, HIP], ids=["cuda", "hip"])
@pytest.mark.parametrize("kinds", KINDS[:4], ids=lambda k: f"{k[0]}-{k[1]}")
def test_masked_tiles_read_the_listed_slots(cfg, kinds):
    hd, n_kv_heads, n_past = 128, 3, 37
    tile = cfg["tile"]
    lst = [0, 2, 3, 7, 8, 11, 20]                                 # visible new slots n_past + lst[k]
    max_ctx = n_past + 40
    L = n_past + len(lst)
    for v0 in range(0, L, tile):
        run_tile(cfg, kinds, hd, n_kv_heads, max_ctx, 2, v0, L, min(n_past, L), n_past, lst, seed=v0 + 1)


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_shared_memory_plan(hd):
    """qkv_smem_bytes: q hi/lo, the masked list, then max(merge, float16 tile + STAGES raw stages): for q8_0 and
    q4_0 at HD <= 128 at most the float16 kernel's Cfg<HD>::SMEM_BYTES (exactly it for q8_0 at HD 128), so as
    many blocks fit an SM as blocks_per_sm (and n_splits) assume; every size fits an sm_90 block's 227 KB."""
    rows, tile, warps, lst = 16, 64, 4, 256 * 4
    ld = hd + 8
    q_bytes, stage_f16 = 2 * rows * ld * 2, 2 * tile * ld * 2
    merge = (warps * rows * (hd + 3) + 2 * rows) * 4
    f16_stages = 2 if hd >= 256 else 3
    f16_smem = q_bytes + lst + max(f16_stages * stage_f16, merge)
    q_stages = 2 if hd >= 256 else 4

    def qkv(k, v):
        return q_bytes + lst + max(merge, stage_f16 + q_stages * tile * (raw_row_bytes(k, hd) + raw_row_bytes(v, hd)))

    def frag(k, v):   # both quantized (attention_splitk_qfrag.cuh): no float16 tile, code rows CODE_PAD longer
        return q_bytes + lst + max(merge, q_stages * tile * (raw_row_bytes(k, hd) + raw_row_bytes(v, hd) + 32))

    for k in ("q8_0", "q4_0"):
        for v in ("q8_0", "q4_0"):
            assert frag(k, v) < qkv(k, v) and frag(k, v) <= 227 * 1024
    if hd <= 128:
        assert qkv("q8_0", "q8_0") <= f16_smem and qkv("q4_0", "q4_0") < f16_smem
    if hd == 128:
        assert qkv("q8_0", "q8_0") == f16_smem
    for k in ("f16", "q8_0", "q4_0"):
        for v in ("f16", "q8_0", "q4_0"):
            if (k, v) != ("f16", "f16"):
                assert qkv(k, v) <= 227 * 1024


# ---- the prefill kernel's raw ring (attention_tile.cuh: stage_raw_rows, dequant_raw_side, kv_ring_raw) ----

def prefill_stage_rows(dst, plane, kind, hd, n_rows_total, head_row, base, kv_len, n_threads, written):
    """stage_raw_rows<N_THREADS, CC, SB, Q4>: chunk c = c0 + tid (< BKV * CC) and, with scales, row r = r0 + tid."""
    bkv, cc = 64, cc_of(kind, hd)
    cb = cc * 16
    for c0 in range(0, bkv * cc, n_threads):
        for tid in range(n_threads):
            c = c0 + tid
            if c >= bkv * cc:
                break
            slot = base + c // cc
            ok = slot < kv_len
            s = (head_row + (slot if ok else 0)) * cb + (c % cc) * 16
            assert s % 16 == 0 and s + 16 <= n_rows_total * cb
            dst[16 * c:16 * c + 16] = plane[s:s + 16] if ok else (0x88 if kind == "q4_0" else 0)
            written[16 * c:16 * c + 16] += 1
    if kind == "f16":
        return
    sb = hd // 16
    for r0 in range(0, bkv, n_threads):
        for tid in range(n_threads):
            r = r0 + tid
            if r >= bkv:
                break
            slot = base + r
            ok = slot < kv_len
            d, s = bkv * cb + sb * r, n_rows_total * cb + (head_row + (slot if ok else 0)) * sb
            assert d % sb == 0 and s % sb == 0
            dst[d:d + sb] = plane[s:s + sb] if ok else 0
            written[d:d + sb] += 1


@pytest.mark.parametrize("n_threads", [128, 256])                 # FlashCfg 4x1 and 4x2
@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
@pytest.mark.parametrize("hd", [64, 128])
def test_prefill_tiles_stage_and_dequantize_to_the_rows_values(n_threads, kinds, hd):
    rng = np.random.default_rng(hd + n_threads)
    n_kv_heads, max_ctx, kvh, kv_len = 2, 64 * 3 + 9, 1, 64 * 2 + 5
    n_rows = n_kv_heads * max_ctx
    planes = [make_plane(rng, k, n_kv_heads, max_ctx, hd) for k in kinds]
    for base in (0, 64, 128):
        for kind, (plane, vals) in zip(kinds, planes):
            raw = np.full(64 * raw_row_bytes(kind, hd), 0xAB, np.uint8)
            written = np.zeros(raw.size, np.int32)
            prefill_stage_rows(raw, plane, kind, hd, n_rows, kvh * max_ctx, base, kv_len, n_threads, written)
            assert (written == 1).all()
            # dequant_raw_side: piece c = tid + k N_THREADS of the whole tile (64 rows x HD / 8 pieces)
            pieces = hd // 8
            assert 64 * pieces % n_threads == 0
            seen = set()
            for c in range(64 * pieces):
                r, piece = c // pieces, c % pieces
                seen.add((r, piece))
            assert len(seen) == 64 * pieces
            # the values: same reads as dequant_side's, rows 0..63 of this raw stage
            got = {}
            for warp in range(4):
                for lane in range(32):
                    got.update(dequant_side(raw, kind, hd, 64, warp, lane))
            for r in range(64):
                slot = base + r
                row_vals = np.concatenate([got[(r, p)] for p in range(pieces)])
                want = vals[kvh * max_ctx + slot] if slot < kv_len else np.zeros(hd, np.float16)
                np.testing.assert_array_equal(row_vals.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("ring", [2, 3])
@pytest.mark.parametrize("n_tiles", [1, 2, 3, 4, 7])
def test_raw_ring_schedule(ring, n_tiles):
    """kv_ring_raw's order of events, with each thread's cp.async groups completing as late as wait_group
    allows: a raw slot is refilled only after its tile was dequantized (before an earlier barrier), dequantize
    reads a landed tile, and attend reads the float16 buffer its tile was dequantized into, not overwritten
    since (a barrier separates every write from the reads of the previous content)."""
    raw = [None] * ring                      # tile whose copies target the slot
    landed = set()
    buf = [None, None]                       # tile held by each float16 buffer
    committed = []                           # group -> tile or None (empty group)
    epoch = 0                                # barrier count
    raw_free_at = [-1] * ring                # barrier epoch after which the slot may be refilled
    buf_free_at = [-1, -1]

    def wait(pending):
        for g, t in enumerate(committed[:max(0, len(committed) - pending)]):
            if t is not None:
                landed.add(t)

    def load(t, slot):
        assert raw_free_at[slot] < epoch, "raw slot refilled before a barrier followed its dequantize"
        raw[slot] = t

    def dequant(slot, b, t):
        assert raw[slot] == t and t in landed
        assert buf_free_at[b] < epoch, "float16 buffer rewritten before a barrier followed its last read"
        buf[b] = t
        raw_free_at[slot] = epoch

    for st in range(ring):
        if st < n_tiles:
            load(st, st)
        committed.append(st if st < n_tiles else None)
    wait(ring - 1)
    epoch += 1
    dequant(0, 0, 0)
    for j in range(n_tiles):
        wait(ring - 2)
        epoch += 1
        if j + ring < n_tiles:
            load(j + ring, j % ring)
        committed.append(j + ring if j + ring < n_tiles else None)
        if j + 1 < n_tiles:
            dequant((j + 1) % ring, (j + 1) % 2, j + 1)
        assert buf[j % 2] == j                # attend(j) reads tile j
        buf_free_at[j % 2] = epoch
