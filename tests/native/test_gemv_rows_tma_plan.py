"""gemv_rows_tma's plan (gemv_rows_plan.cuh rows_tma_plan), computed on the CPU by a host-only program compiled with
nvcc: for the real 1.5B / 0.5B decode and verify launches and a sweep of shapes, every plan it returns fits the
kernel's limits (shared memory, warps, stages for every matrix's 16 rows, 16-byte aligned offsets), and it refuses
what the bulk copy cannot do (a GPU before sm_90, look 0, a last tile of bytes not whole 16-byte units, a misaligned
matrix, n > 8 with one tile a CTA, more tiles a CTA than it has mbarriers for).
"""
import json
import shutil
import subprocess

import pytest

from flashd.native import CUDA_DIR, NATIVE_DIR

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: the host program needs it")

PROGRAM = r"""
#include "gemv_rows_plan.cuh"
#include <cstdio>
using namespace fd;

// row bytes of cols columns in each format (ggml blocks)
static long long rb(int fmt, int cols) { return fmt == ROWS_Q4K ? cols / 256 * 144 : fmt == ROWS_Q6K ? cols / 256 * 210 : cols / 32 * 34; }

struct Call { const char* name; int n_mats; int fmt[3]; int rows[3]; int cols; bool swiglu; uintptr_t base = 0x10000; };

static RowsArgs make_args(const Call& c, int n) {
    RowsArgs a{};
    a.n_mats = c.n_mats;
    a.n = n;
    a.cols = c.cols;
    a.ks = rows_ks(c.cols, 1);
    a.C = ceil_div(c.cols, ROWS_QK * a.ks);
    int tiles = 0;
    for (int k = 0; k < c.n_mats; ++k) {
        RowsMat& m = a.mat[k];
        m.w = reinterpret_cast<const uint8_t*>(c.base + 0x100000 * k);
        m.fmt = c.fmt[k];
        m.rows = c.rows[k];
        m.row_bytes = rb(c.fmt[k], c.cols);
        m.tile_first = c.swiglu ? 0 : tiles;
        if (!c.swiglu || k == 0) tiles += ceil_div(m.rows, 16);
    }
    a.tiles = tiles;
    return a;
}

static void plan(const Call& c, int n, bool fx, int look, int split, const DeviceFacts& dev) {
    const RowsArgs a = make_args(c, n);
    const int tiles = a.tiles;
    const int fx_bytes = fx ? rows_fx_bytes(n, rows_fx_stride(n, c.cols, rows_launch_fmt(a)), c.cols, rows_fine(a)) : 0;
    RowsTmaArgs t;
    RowsShape sh;
    const bool ok = rows_tma_plan(a, c.swiglu, n, fx_bytes, look, split, dev, &t, &sh);
    long long rbs[3] = {0, 0, 0};
    for (int k = 0; k < c.n_mats; ++k) rbs[k] = a.mat[k].row_bytes;
    printf("{\"name\": \"%s\", \"n\": %d, \"fx\": %d, \"look\": %d, \"split\": %d, \"sms\": %d, \"smem_max\": %d, \"cc\": %d, "
           "\"ok\": %d, \"tiles\": %d, \"C\": %d, \"swiglu\": %d, \"n_mats\": %d, \"rows\": [%d, %d, %d], "
           "\"rb\": [%lld, %lld, %lld], \"fx_bytes\": %d",
           c.name, n, fx ? 1 : 0, look, split, dev.n_sms, dev.max_smem, dev.cc_major, ok ? 1 : 0, tiles, a.C, c.swiglu ? 1 : 0,
           c.n_mats, c.rows[0], c.rows[1], c.rows[2], rbs[0], rbs[1], rbs[2], fx_bytes);
    if (ok)
        printf(", \"S\": %d, \"R\": %d, \"warps\": %d, \"ctas\": %d, \"smem\": %zu, \"stage\": %d, \"mat_off\": %d, "
               "\"bar_off\": %d, \"tlook\": %d, \"kc\": %d, \"n_full\": %d", t.S, sh.R, sh.warps, sh.ctas, sh.smem,
               t.stage_bytes, t.mat_off, t.bar_off, t.look, t.kc, t.n_full);
    printf("}\n");
}

int main() {
    const int Q4 = ROWS_Q4K, Q6 = ROWS_Q6K, Q8 = ROWS_Q80;
    const Call calls[] = {
        {"gate_up_1.5b", 2, {Q4, Q4}, {8960, 8960}, 1536, true},
        {"down_1.5b_q4k", 1, {Q4}, {1536}, 8960, false},
        {"down_1.5b_q6k", 1, {Q6}, {1536}, 8960, false},
        {"qkv_1.5b", 3, {Q4, Q4, Q6}, {1536, 256, 256}, 1536, false},
        {"o_1.5b", 1, {Q4}, {1536}, 1536, false},
        {"lm_head_1.5b", 1, {Q6}, {151936}, 1536, false},
        {"gate_up_0.5b_q8", 2, {Q8, Q8}, {4864, 4864}, 896, true},
        {"down_0.5b_q8", 1, {Q8}, {896}, 4864, false},
        {"swiglu_mixed", 2, {Q4, Q6}, {4864, 4864}, 1024, true},
        {"q6k_awkward", 1, {Q6}, {333}, 768, false},     // 9 rows in the last tile x 630 bytes: not whole 16-byte units
        {"q8_awkward", 1, {Q8}, {100}, 96, false},       // 4 rows x 102 bytes: refused
        {"q4k_awkward", 1, {Q4}, {333}, 768, false},     // Q4_K: always whole units
        {"misaligned", 1, {Q4}, {1536}, 1536, false, 0x10008},
        {"vocab_256k", 1, {Q6}, {262144}, 4096, false},  // 16384 tiles: 125 a CTA
        {"huge_vocab", 1, {Q6}, {600000}, 1024, false},  // 285 tiles a CTA: more than the mbarriers
        {"down_wide_q6k", 1, {Q6}, {4096}, 18944, false},  // a tile of 249 KB: no stage fits
    };
    for (int fmt : {ROWS_Q4K, ROWS_Q6K, ROWS_Q80, ROWS_Q50, ROWS_FANY})
        for (int cols : {256, 768, 896, 1536, 2048, 4864, 8960, 160, 96})
            for (int n : {1, 2, 5, 8})
                printf("{\"stride\": %d, \"fmt\": %d, \"cols\": %d, \"n\": %d}\n", rows_fx_stride(n, cols, fmt), fmt, cols, n);
    // gemv_rows_run's choice of where x sits, with sm_90's table (fuse_nx 1, look 1, split 8, stage_x 20000, 19 warps), H100
    for (const Call& c : calls)
        for (int n : {1, 2, 4, 8, 9}) {
            RowsArgs a = make_args(c, n);
            a.x.fine = rows_fine(a) ? 1 : 0;
            a.fx_stride = rows_fx_stride(n, c.cols, rows_launch_fmt(a));
            const RowsTuning tn{1, 1, 1, 8, 20000, true, true, 19};
            RowsTmaArgs t;
            RowsShape sh;
            bool stage = false;
            const bool fx = n <= 1;
            const bool ok = rows_tma_plan_x(a, c.swiglu, n, fx, rows_fx_bytes(n, a.fx_stride, c.cols, a.x.fine != 0), tn,
                                            DeviceFacts{132, 232448, 9}, &t, &sh, &stage);
            printf("{\"stage_of\": \"%s\", \"n\": %d, \"ok\": %d, \"stage\": %d, \"kc\": %d}\n", c.name, n, ok ? 1 : 0,
                   stage ? 1 : 0, ok ? t.kc : -1);
        }
    // the tuning's cap on the computing warps (gemv_rows_tma_warps): 1 and 8 x rows take it, 9+ keep the register cap
    for (const Call& c : calls)
        for (int n : {1, 8, 9})
            for (int cap : {3, 4, 5, 16, 18, 19, 24, 31, 40}) {
                RowsArgs a = make_args(c, n);
                RowsTmaArgs t;
                RowsShape sh;
                for (int dp = 0; dp < (n == 1 ? 2 : 1); ++dp) {
                    const bool ok = rows_tma_plan(a, c.swiglu, n, 0, 1, 8, DeviceFacts{132, 232448, 9}, &t, &sh, cap,
                                                  dp != 0);
                    printf("{\"warps_of\": \"%s\", \"n\": %d, \"cap\": %d, \"dp\": %d, \"ok\": %d, \"items\": %d, "
                           "\"warps\": %d}\n", c.name, n, cap, dp, ok ? 1 : 0, ok ? ceil_div(a.tiles, sh.ctas) * a.C : 0,
                           ok ? sh.warps : 0);
                }
            }
    const DeviceFacts devs[] = {{132, 232448, 9}, {114, 232448, 9}, {108, 166912, 8}};
    for (const DeviceFacts& d : devs)
        for (const Call& c : calls)
            for (int n : {1, 2, 8, 9, 16, 17, 32})
                for (int look : {0, 1, 4})
                    for (int fx = 0; fx < 2; ++fx)
                        for (int split : {0, 4}) {
                            if (fx && n > ROWS_FX_MAX_NX) continue;
                            plan(c, n, fx != 0, look, split, d);
                        }
}
"""


@pytest.fixture(scope="module")
def plans(plans_and_strides):
    return [p for p in plans_and_strides if "stride" not in p and "stage_of" not in p and "warps_of" not in p]


@pytest.fixture(scope="module")
def warp_caps(plans_and_strides):
    return {(p["warps_of"], p["n"], p["cap"], p["dp"]): p for p in plans_and_strides if "warps_of" in p}


@pytest.fixture(scope="module")
def stagings(plans_and_strides):
    return {(p["stage_of"], p["n"]): p for p in plans_and_strides if "stage_of" in p}


@pytest.fixture(scope="module")
def plans_and_strides(tmp_path_factory):
    d = tmp_path_factory.mktemp("rows_tma_plan")
    (d / "main.cu").write_text(PROGRAM)
    exe = d / "main"
    # sm_90: the header's non-template kernels (the x pre-pass) use instructions older targets lack
    subprocess.run(["nvcc", "-std=c++17", "--expt-relaxed-constexpr", "-arch=sm_90", "-I", str(CUDA_DIR), "-I",
                    str(NATIVE_DIR / "include"), "-o", str(exe), str(d / "main.cu")], check=True, capture_output=True,
                   text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture(scope="module")
def strides(plans_and_strides):
    return [p for p in plans_and_strides if "stride" in p]


def test_where_x_sits_for_the_real_launches(stagings):
    """gemv_rows_plan.cuh rows_tma_plan_x with sm_90's table on an H100: 2..8-row launches copy the pre-pass's codes in
    where a CTA's warps have several items and the codes are at most 20,000 bytes -- gate/up (5 tiles a CTA) and the
    lm_head at every such n, ffn_down (one tile, 35 chunks) at 2 rows (17.9 KB) but not 4 or 8 (35.8 / 71.7 KB), never
    q/k/v or o (6 items on 8 warps); one row (the CTAs quantize x) and 9+ rows never; ffn_down's one-tile CTAs take
    their tile in pieces (kc 8), the many-tile launches and the 6-chunk ones whole."""
    for n in (2, 4, 8):
        for name in ("gate_up_1.5b", "lm_head_1.5b"):
            assert stagings[(name, n)]["ok"] and stagings[(name, n)]["stage"], (name, n)
        for name in ("qkv_1.5b", "o_1.5b"):
            assert stagings[(name, n)]["ok"] and not stagings[(name, n)]["stage"], (name, n)
        for name in ("down_1.5b_q4k", "down_1.5b_q6k"):
            assert stagings[(name, n)]["stage"] == (n == 2), (name, n)
    for (name, n), p in stagings.items():
        if n == 1 or n > 8:
            assert not p["stage"], p
    for n in (1, 2, 8):
        assert stagings[("down_1.5b_q4k", n)]["kc"] == 8 and stagings[("down_1.5b_q6k", n)]["kc"] == 8
        assert stagings[("gate_up_1.5b", n)]["kc"] == 0 and stagings[("o_1.5b", n)]["kc"] == 0


def test_the_tunings_warp_cap(warp_caps):
    """gemv_rows_tma_warps caps the computing warps of launches of up to 8 x rows, clamped to 4 .. 19 on the mma kernel
    (its launch bound: 20 warps with the copy warp still leave 96 registers a thread) and 4 .. 31 on the one-row dp4a
    kernel (32 warps, 64 registers); the warps are the CTA's items rounded up to a multiple of 4 (at least 4) where
    fewer: ffn_down's 35 items a CTA on 18 or 19 warps take 2 rounds instead of 16 warps' 3, gate/up's 30 (5 tiles) one
    round on 31 dp4a warps; q/k/v and o (6 items) stay on 8; above 8 x rows the register cap holds whatever the
    tuning."""
    for (name, n, cap, dp), p in warp_caps.items():
        if not p["ok"]:
            continue
        bound = 31 if dp else 19
        want = min(max((p["items"] + 3) // 4 * 4, 4), max(4, min(cap, bound))) if n <= 8 else p["warps"]
        assert p["warps"] == want, p
        assert 4 <= p["warps"] <= (bound if n <= 8 else 15), p
    for name in ("down_1.5b_q4k", "down_1.5b_q6k"):
        assert warp_caps[(name, 1, 18, 0)]["warps"] == 18 and warp_caps[(name, 1, 24, 0)]["warps"] == 19
        assert warp_caps[(name, 1, 16, 0)]["warps"] == 16 and warp_caps[(name, 8, 19, 0)]["warps"] == 19
        assert warp_caps[(name, 1, 24, 1)]["warps"] == 24 and warp_caps[(name, 1, 40, 1)]["warps"] == 31
    assert warp_caps[("gate_up_1.5b", 1, 31, 1)]["warps"] == 31 and warp_caps[("gate_up_1.5b", 1, 31, 1)]["items"] == 30
    assert warp_caps[("qkv_1.5b", 1, 19, 0)]["warps"] == 8 and warp_caps[("o_1.5b", 1, 3, 0)]["warps"] == 4
    assert warp_caps[("qkv_1.5b", 1, 31, 1)]["warps"] == 8
    assert warp_caps[("gate_up_1.5b", 9, 19, 0)]["warps"] == warp_caps[("gate_up_1.5b", 9, 4, 0)]["warps"]


def per_cta(p):
    return -(-p["tiles"] // min(p["tiles"], p["sms"]))


def test_every_plan_fits_the_kernels_limits(plans):
    made = [p for p in plans if p["ok"]]
    assert len(made) > 100
    for p in made:
        pc = per_cta(p)
        ntt = 1 if p["n"] <= 8 else -(-p["n"] // 8)          # 8-row N-tiles (rows_ntiles): 17-24 rows take 3
        nr = 2 if p["swiglu"] else 1
        per_tile = p["C"] * nr * ntt * 4 * 32 * 4
        assert p["ctas"] == min(p["tiles"], p["sms"]), p
        assert min(pc, 2) <= p["S"] <= min(pc, 16), p
        assert 1 <= p["R"] <= min(pc, 8), p
        # above 8 x rows at most 15 (+ the copy warp: 128 registers a thread, not 96), four tiles (25-32) at most 11
        # (168 registers)
        allowed = (4, 8, 11) if ntt == 4 else (4, 8, 12, 15) if p["n"] > 8 else (4, 8, 12, 16)
        assert p["warps"] in allowed, p
        rbs = p["rb"][:p["n_mats"]]
        if p["swiglu"]:
            assert p["mat_off"] == 16 * rbs[0] and p["stage"] == 16 * (rbs[0] + rbs[1]), p
        else:
            assert p["stage"] == 16 * max(rbs), p
        assert p["stage"] % 16 == 0 and p["bar_off"] % 16 == 0, p
        assert p["bar_off"] == p["S"] * p["stage"] + p["R"] * per_tile, p
        # the mbarriers, then the CTA's x copy 16-byte aligned (the dp4a items read x codes 16 bytes a load)
        # one "full" mbarrier a tile, or (split: one tile a CTA, more chunks than split) one a piece of split chunks
        if p["split"] and pc == 1 and p["C"] > p["split"]:
            assert p["kc"] == p["split"] and p["n_full"] == -(-p["C"] // p["split"]), p
        else:
            assert p["kc"] == 0 and p["n_full"] == pc, p
        assert p["smem"] == -(-(p["bar_off"] + 8 * (p["n_full"] + p["S"])) // 16) * 16, p
        assert p["smem"] + p["fx_bytes"] <= p["smem_max"] - 1024, p
        assert pc <= 256, p
        # tiles in flight: the tuning's, at least 4 above 8 x rows, at least 2 in rings of more than 16 tiles a CTA
        want = max(p["look"], 4) if p["n"] > 8 else (max(p["look"], 2) if pc > 16 else p["look"])
        assert p["tlook"] == want, p


def test_what_the_bulk_copy_cannot_do_is_refused(plans):
    for p in plans:
        if p["cc"] < 9 or p["look"] == 0 or p["name"] in ("q6k_awkward", "q8_awkward", "misaligned", "huge_vocab",
                                                          "down_wide_q6k"):
            assert not p["ok"], p
        if p["n"] > 8 and per_cta(p) < 2:
            assert not p["ok"], p


def test_the_real_decode_launches_take_it_on_an_h100(plans):
    """The 1.5B's launches at one row (look 1, an H100's 132 SMs): the lab's shapes (bench/results/
    2026-11-27-h200-session24-gemv-rows-tma-lab.txt) -- gate / up 5 tiles a CTA all in flight on 16 warps, ffn_down
    one tile a CTA on 16 warps, q/k/v and o one tile a CTA on 8 warps, lm_head a ring of stages."""
    h100 = {(p["name"], p["fx"]): p for p in plans if p["sms"] == 132 and p["n"] == 1 and p["look"] == 1}
    g = h100[("gate_up_1.5b", 1)]
    assert g["ok"] and g["S"] == 5 and g["R"] == 5 and g["warps"] == 16
    for name in ("down_1.5b_q4k", "down_1.5b_q6k"):
        d = h100[(name, 0)]
        assert d["ok"] and d["S"] == 1 and d["warps"] == 16, d
    for name in ("qkv_1.5b", "o_1.5b"):
        assert h100[(name, 0)]["ok"] and h100[(name, 0)]["warps"] == 8
    lm = h100[("lm_head_1.5b", 0)]
    assert lm["ok"] and 2 <= lm["S"] < per_cta(lm) and lm["tlook"] == 2 and g["tlook"] == 1
    assert h100[("q4k_awkward", 0)]["ok"]


def piece_spans(row_bytes: int, unit_bytes: int, rows: int, C: int, kc: int, k: int):
    """gemv_rows_tma.cuh rows_tma_copy_pieces for one matrix of chunks of one unit (ks 1): row r's span of piece k
    (chunks k kc .. k kc + kc - 1, the last piece shorter), from its 16-byte floor to its 16-byte ceiling, as (start,
    length) in the stage (the tile's first byte at 0)."""
    c0, c1 = k * kc, min(C, k * kc + kc) - 1
    o0, o1 = c0 * unit_bytes, c1 * unit_bytes + unit_bytes
    return [((r * row_bytes + o0) // 16 * 16, (r * row_bytes + o1 + 15) // 16 * 16 - (r * row_bytes + o0) // 16 * 16)
            for r in range(rows)]


@pytest.mark.parametrize("unit,C,rows", [(144, 35, 16), (210, 35, 16), (210, 6, 16), (144, 3, 5), (210, 3, 8),
                                         (210, 36, 16), (144, 1, 16)])
@pytest.mark.parametrize("kc", [1, 3, 4, 8])
def test_a_tiles_pieces_cover_its_bytes_in_whole_16_byte_copies(unit, C, rows, kc):
    """Every byte of every chunk of every row lands in the piece of its chunk; each copy starts and ends 16-byte
    aligned (a bulk copy's contract) inside the tile's span, whose end the plan has made 16-byte aligned (a last
    tile's bytes whole 16-byte units: rows_tma_plan refuses the rest); rows are copied whole across the pieces."""
    row_bytes = C * unit
    if (rows * row_bytes) % 16:
        pytest.skip("rows_tma_plan refuses a tile of bytes that are not whole 16-byte units")
    n_pieces = -(-C // kc)
    landed = [set() for _ in range(rows)]
    for k in range(n_pieces):
        spans = piece_spans(row_bytes, unit, rows, C, kc, k)
        for r, (start, length) in enumerate(spans):
            assert start % 16 == 0 and length % 16 == 0 and length > 0
            assert 0 <= start and start + length <= rows * row_bytes
            chunks = range(k * kc, min(C, k * kc + kc))
            for c in chunks:     # the piece holds its chunks' bytes of row r
                lo, hi = r * row_bytes + c * unit, r * row_bytes + (c + 1) * unit
                assert start <= lo and hi <= start + length
                landed[r].update(range(c, c + 1))
    assert all(landed[r] == set(range(C)) for r in range(rows))


def bank_wavefronts(stride: int, load_bytes: int) -> int:
    """Shared-memory wavefronts of one warp's B-fragment read of x rows g = 0..7 (lane = 4 g + t) at
    row g * stride + load_bytes * t (+ any common column offset, a multiple of 32): a warp's request is served in
    phases of 128 bytes of lanes (8-byte loads: two half-warps), each phase taking as many wavefronts as the most
    distinct 4-byte words any one of its 32 banks holds."""
    lanes_per_phase = 128 // load_bytes
    worst = 0
    for phase in range(32 // lanes_per_phase):
        banks: dict[int, set] = {}
        for lane in range(phase * lanes_per_phase, (phase + 1) * lanes_per_phase):
            g, t = divmod(lane, 4)
            for w in range(load_bytes // 4):
                addr = g * stride + load_bytes * t + 4 * w
                banks.setdefault((addr // 4) % 32, set()).add(addr // 4)
        worst += max(len(v) for v in banks.values())
    return worst


def test_a_ctas_x_copy_of_several_rows_is_padded_against_bank_conflicts(strides):
    """gemv_rows.cuh rows_fx_stride: one row keeps cols (the dp4a items read row 0 alone); 2..8 rows are padded by less
    than 128 bytes to a 16-byte multiple, so that an mma item's B-fragment read of rows g = 0..7 takes the fewest
    wavefronts: one for Q6_K's 4-byte reads, one a half-warp for Q4_K / Q8_0 / Q5_0's 8-byte reads, and in a mixed launch
    (q / k / v with a Q6_K v) the latter and two for the 4-byte reads -- where an unpadded copy of cols a multiple of
    128 takes 8."""
    Q4K, Q6K, Q80, Q50, FANY = 0, 1, 2, 3, -1
    assert len(strides) == 5 * 9 * 4
    for p in strides:
        stride, cols, n, fmt = p["stride"], p["cols"], p["n"], p["fmt"]
        if n == 1:
            assert stride == cols, p
            continue
        assert cols <= stride < cols + 128 and stride % 16 == 0, p
        if fmt == Q6K:
            assert bank_wavefronts(stride, 4) == 1, p
        elif fmt == FANY:
            assert bank_wavefronts(stride, 4) == 2 and bank_wavefronts(stride, 8) == 2, p
        else:
            assert bank_wavefronts(stride, 8) == 2, p     # two half-warps, one wavefront each
    assert bank_wavefronts(1536, 4) == 8 and bank_wavefronts(1536, 8) == 8   # unpadded: every row in one bank
