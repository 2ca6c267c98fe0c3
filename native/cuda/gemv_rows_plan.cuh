// gemv_rows_plan.cuh -- the host side of gemv_rows.cuh: which calls take it (rows_eligible), the chunk size KS
// (rows_ks: the only plan value that changes bits, so a function of cols and the tuning table, never of n), the
// launch shape of a call (rows_shape: CTAs an SM, warps, slots, tiles a round -- free to depend on n and the
// shape), the x scratch the pre-pass writes (rows_scratch; calls whose CTAs quantize x themselves need none), and
// gemv_rows_run, the whole call.
#pragma once

#include "gemv_plan.cuh"
#include "gemv_rows.cuh"
#include "gemv_rows_tma.cuh"
#include "gemv_scratch.cuh"

#include <mutex>

namespace fd {
namespace {

constexpr int ROWS_MAX_COLS = 65536;   // the x scratch's width (wider calls keep gemv.cuh's kernel)
constexpr int ROWS_MAX_CHUNKS = 36;   // chunks a row at most: one tile's partials (32 x rows) must fit shared memory
constexpr int ROWS_FX_MIN_TILES_PER_SM = 2;   // cp.async kernel: CTAs quantize x themselves only above this many tiles an SM

// Whether a call runs here: the tuning has it on (gemv_rows > 0, an NVIDIA GPU of sm_80 or later: int8 mma.sync and
// cp.async), every matrix is Q4_K, Q6_K, Q8_0 or Q5_0 with its format's bit in the tuning's gemv_rows_formats (bit
// ROWS_Q4K .. ROWS_Q50) and cols fits the scratch. Never depends on n_x (row invariance between a verify row and a
// decode step). Malformed shapes (cols % block) are left to gemv.cu's checks.
inline bool rows_eligible(int gemv_rows, int formats, int cc_major, int n_mats, const MatIn* mats, int cols) {
    if (gemv_rows <= 0 || cc_major < 8 || cols < 32 || cols > ROWS_MAX_COLS) return false;
    for (int k = 0; k < n_mats; ++k) {
        const int f = rows_fmt(mats[k].qtype);
        if (f < 0 || !((formats >> f) & 1) || cols % (rows_blk32(f) ? 32 : ROWS_QK) != 0) return false;
    }
    return true;
}

// Super-blocks a chunk: the table's value, raised where a row would have more than ROWS_MAX_CHUNKS chunks.
inline int rows_ks(int cols, int gemv_rows) { return max(gemv_rows, ceil_div(ceil_div(cols, ROWS_QK), ROWS_MAX_CHUNKS)); }

// Bytes between staged rows of a slot: the most 16-byte pieces a row's chunk takes (from its 16-byte floor), padded
// for conflict-free reads -- Q4_K: 8-byte loads at row g, offset 8t (rows g..g+3 of a half-warp 8 banks apart:
// stride = 32 mod 64 bytes); Q6_K / Q8_0 / Q5_0: 2-byte loads at 4t / 8t (stride = 16 mod 32).
inline int rows_stride(int fmt, int ks) {
    int b = fmt == ROWS_Q4K ? ks * 144 : ((ks * rows_unit_bytes(fmt) + 14 + 15) / 16) * 16;
    if (fmt == ROWS_Q4K) { while (b % 64 != 32) b += 16; }
    else { while (b % 32 != 16) b += 16; }
    return b;
}

struct RowsShape { int ctas, warps, st, R; size_t smem; };

// 8-row N-tiles a launch of n x rows computes (the kernels' NT, at least 1): 1, 2, 3 or 4. Each row's arithmetic is
// the same whatever the count (row invariance), so the count only sets the work: 17-24 rows take 3 tiles, not 4
// (a DDTree of 22 is 23 rows).
inline int rows_ntiles(int n) { return n <= 8 ? 1 : (n + 7) / 8; }

// Bytes a persistent SM keeps in flight (warps x CTAs an SM x (slots - 1) x item bytes: one slot is being
// computed): the lab's best lm_head shape (Q6_K 151936 x 1536, ks1 st2 w8 cps2 R8: 16 x 1 x 3.4 KB ~ 54 KB a SM)
// reached 78% of copy bandwidth (bench/results/2026-11-26-h100-lab-gemv-mma-rows.txt); at st2 a Q4_K item is only
// 2.3 KB (37 KB a SM), so Q4_K lm_heads take st3, Q6_K / Q8_0 stay at st2.
constexpr int ROWS_INFLIGHT_BYTES = 52 * 1024;

// The launch shape for a call of n x rows (a.tiles, a.C, a.slot_bytes set); fx_bytes: the CTA's own x copy (0:
// the pre-pass). Items a CTA = its tiles x C; warps enough for them (4..16, 8 with two CTAs an SM), slots a warp
// to put a CTA's whole share in flight at once where it fits (2..4); long persistent runs (items > 4 x warps) take
// slots for ROWS_INFLIGHT_BYTES an SM; R tiles a round (<= 8) from the shared memory left. Two CTAs an SM for
// launches of many tiles (the lm_head), so one CTA's fold overlaps the other's streaming. This reproduces the
// lab's best one-row shapes (bench/results/2026-11-26-h100-lab-gemv-mma-rows.txt) at gemv_rows = 1 (ks1):
//   ffn_gate/up 8960 x 1536 (560 tiles, C 6): 132 CTAs, 5 tiles (30 items) -> w16 st2 R5   (lab ks1: 6.8 us)
//   ffn_down 1536 x 8960 (96 tiles, C 35): 96 CTAs, 35 items -> w16 st3 R1                 (lab w16 st2-4: 7.7 us)
//   attn_q/o 1536 x 1536 (96 tiles, C 6), attn_k/v 256 x 1536 (16 tiles): 6 items -> w8 st2 (lab best: w8 st2)
//   lm_head 151936 x 1536 (9496 tiles >= 8 x SMs): cps2, 264 CTAs, 36 tiles -> w8 st2 (Q6_K) / st3 (Q4_K) R8
inline int rows_shape(const RowsArgs& a, bool swiglu, int n, int fx_bytes, const DeviceFacts& dev, RowsShape* out) {
    const int NTT = rows_ntiles(n);
    const int cps = a.tiles >= 8 * dev.n_sms ? 2 : 1;
    const int ctas = min(a.tiles, dev.n_sms * cps);
    const int per_cta = ceil_div(a.tiles, ctas);
    const int items = per_cta * a.C;
    int warps = min(max((items + 3) & ~3, 4), min(rows_max_warps(NTT), ROWS_MAX_WARPS / cps));
    int st = min(max(ceil_div(items, warps), 2), ROWS_MAX_SLOTS);
    if (items > 4 * warps) {   // persistent: enough bytes in flight, not the whole share
        const int item_bytes = a.slot_bytes;   // 16 rows x the padded stride (x 2 for SwiGLU): ~ the bytes copied
        st = min(1 + ceil_div(ROWS_INFLIGHT_BYTES, warps * cps * item_bytes), ROWS_MAX_SLOTS);
        st = max(st, 2);
    }
    const int64_t budget = (int64_t)dev.max_smem / cps - 1024 - fx_bytes;
    const int64_t per_tile = (int64_t)a.C * (swiglu ? 2 : 1) * NTT * 4 * 32 * 4;
    for (;;) {
        const int64_t ring = (int64_t)warps * st * a.slot_bytes;
        if (ring + per_tile <= budget) {
            const int R = (int)std::min<int64_t>(std::min(per_cta, 8), (budget - ring) / per_tile);
            *out = RowsShape{ctas, warps, st, R, (size_t)(ring + (int64_t)R * per_tile)};
            return 0;
        }
        if (st > 2) --st;                  // fewer slots first, then fewer warps, then a single slot
        else if (warps > 4) warps -= 4;
        else if (st > 1) --st;
        else if (warps > 1) --warps;
        else return FD_E_SHAPE;
    }
}

constexpr int ROWS_TMA_LOOK_MANY_ROWS = 4;   // bulk-copy tiles in flight above 8 x rows (at least)
constexpr int ROWS_TMA_RING_TILES = 16;      // more tiles a CTA than this: a long ring ...
constexpr int ROWS_TMA_LOOK_RING = 2;        // ... with at least this many tiles in flight

// The bulk-copy kernel's plan (gemv_rows_tma.cuh) for a call of n x rows (a.tiles, a.C and the matrices set;
// fx_bytes: the CTAs' own x copy, else 0), or false where the call keeps gemv_rows_kernel: look (the tuning's
// gemv_rows_tma) 0, a GPU before sm_90, a matrix not 16-byte aligned or whose last tile's bytes are not whole
// 16-byte units, or n > 8 with one tile a CTA (the lab lost there: attn q/k/v, o and ffn_down at n = 32 -- one tile
// a CTA leaves nothing to stream under the computing -- while gate/up, 4-5 tiles a CTA, won at every n; bench/
// results/2026-11-27-h200-session24-gemv-rows-tma-lab.txt). Warps as rows_shape's (4..16 for the CTA's items; at
// most ROWS_TMA_MANY_ROWS_WARPS above 8 x rows, for the registers), plus the copy warp; all of a CTA's tiles in
// stages where they fit (<= ROWS_TMA_MAX_STAGES), R tiles a fold round in what is left. The launch shape never
// changes a bit.
// split (the tuning's gemv_rows_tma_split): where every CTA has one tile and a row has more than split chunks, the
// tile is copied in pieces of split chunks (rows_tma_copy_pieces), one "full" mbarrier each.
inline bool rows_tma_plan(const RowsArgs& a, bool swiglu, int n, int fx_bytes, int look, int split,
                          const DeviceFacts& dev, RowsTmaArgs* out, RowsShape* sh, int max_warps = ROWS_MAX_WARPS,
                          bool dp4a = false) {
    if (look <= 0 || dev.cc_major < 9) return false;
    for (int k = 0; k < a.n_mats; ++k) {
        const RowsMat& m = a.mat[k];
        if (reinterpret_cast<uintptr_t>(m.w) % 16 != 0 || ((m.rows % 16) * m.row_bytes) % 16 != 0) return false;
    }
    const int ctas = min(a.tiles, dev.n_sms);
    const int per_cta = ceil_div(a.tiles, ctas);
    if ((n > 8 && per_cta < 2) || per_cta > ROWS_TMA_MAX_PIECES) return false;
    const int items = per_cta * a.C;
    const int NTT = rows_ntiles(n);
    // up to 8 x rows: the tuning's cap (4 .. the kernel's launch bound: ROWS_TMA_DP4A_WARPS for the dp4a kernel,
    // ROWS_TMA_WIDE_WARPS for the mma one), else the register cap
    const int cap = n > 8 ? rows_tma_max_warps(NTT) : max(4, min(max_warps, rows_tma_bound_warps(1, dp4a)));
    const int warps = min(max((items + 3) & ~3, 4), cap);
    RowsTmaArgs t{};
    // tiles in flight: the tuning's, but at least ROWS_TMA_LOOK_MANY_ROWS above 8 x rows (each tile's compute is
    // longer, so more bytes must stream under it) and ROWS_TMA_LOOK_RING in long rings (the lm_head: a steady stream
    // matters there, not how soon the first tile lands). Chain, 1.5B clone, one row, tiles in flight 1 / 2 / 4:
    // lm_head 76.0 / 64.6 / 66.6 us, gate/up (5 tiles a CTA) 8.8 / 9.9 / 10.5; 32 rows 3.11 ms at 1, 2.99 at 4
    // (bench/NOTES.md session 24).
    t.look = n > 8 ? max(look, ROWS_TMA_LOOK_MANY_ROWS) : per_cta > ROWS_TMA_RING_TILES ? max(look, ROWS_TMA_LOOK_RING)
                                                                                       : look;
    if (per_cta == 1 && split > 0 && a.C > split) {
        t.kc = split;
        t.n_full = ceil_div(a.C, split);
    } else {
        t.kc = 0;
        t.n_full = per_cta;
    }
    long long stage = 0;
    if (swiglu) {
        t.mat_off = (int)(16 * a.mat[0].row_bytes);
        stage = t.mat_off + 16 * a.mat[1].row_bytes;
    } else {
        for (int k = 0; k < a.n_mats; ++k) stage = std::max(stage, 16 * a.mat[k].row_bytes);
    }
    const long long per_tile = (long long)a.C * (swiglu ? 2 : 1) * NTT * 4 * 32 * 4;
    // a full mbarrier a piece, an empty one a stage, and 8 bytes to 16-align what follows (the CTA's x copy)
    const long long bars = 8LL * (t.n_full + ROWS_TMA_MAX_STAGES) + 8;
    const long long budget = (long long)dev.max_smem - 1024 - fx_bytes - bars;
    for (int R = min(per_cta, 8); R >= 1; --R) {
        const long long left = budget - R * per_tile;
        if (left < stage) continue;
        const int S = (int)std::min<long long>(std::min(per_cta, ROWS_TMA_MAX_STAGES), left / stage);
        if (S < min(per_cta, 2)) continue;
        t.S = S;
        t.stage_bytes = (int)stage;
        t.bar_off = (int)(S * stage + R * per_tile);   // multiples of 16
        *out = t;
        *sh = RowsShape{ctas, warps, 0, R, ((size_t)t.bar_off + 8 * (t.n_full + S) + 15) & ~(size_t)15};
        return true;
    }
    return false;
}

template <int NT, bool SWIGLU, bool FX, int F, bool DP = false>
int rows_tma_launch(const RowsTmaArgs& t, const RowsShape& sh, int max_smem, cudaStream_t stream) {
    if (int st = raise_smem_once<gemv_rows_tma_kernel<NT, SWIGLU, FX, F, DP>>(max_smem)) return st;
    return launch_pdl(gemv_rows_tma_kernel<NT, SWIGLU, FX, F, DP>, dim3(sh.ctas), dim3((sh.warps + 1) * 32), sh.smem,
                      stream, t);
}

template <bool SWIGLU, int F>
int rows_tma_launch_nf(const RowsTmaArgs& t, const RowsShape& sh, bool fx, int max_smem, cudaStream_t stream) {
    const int n = t.a.n;
    // Every one-row dp4a launch, one format or mixed, runs the ROWS_FANY kernel (a warp-uniform format switch an item,
    // the same bits as the one-format kernel): q / k / v, o and ffn_down then run one kernel's code, which the SM's
    // instruction cache still holds from the launch before -- a decode step runs ~5 kernels a layer of 40-57 KB of
    // code each, and straight code runs about twice as long from a cold cache (bench/lab/icache_lab.cu; measured:
    // bench/NOTES.md session 39).
    if constexpr (F == ROWS_Q4K || F == ROWS_Q6K || F == ROWS_FANY) {
        if (fx && n == 1 && t.dp4a) return rows_tma_launch<0, SWIGLU, true, ROWS_FANY, true>(t, sh, max_smem, stream);
    }
    if (fx) return n == 1 ? rows_tma_launch<0, SWIGLU, true, F>(t, sh, max_smem, stream)
                          : rows_tma_launch<1, SWIGLU, true, F>(t, sh, max_smem, stream);
    if (n == 1) return rows_tma_launch<0, SWIGLU, false, F>(t, sh, max_smem, stream);
    switch (rows_ntiles(n)) {
        case 1: return rows_tma_launch<1, SWIGLU, false, F>(t, sh, max_smem, stream);
        case 2: return rows_tma_launch<2, SWIGLU, false, F>(t, sh, max_smem, stream);
        case 3: return rows_tma_launch<3, SWIGLU, false, F>(t, sh, max_smem, stream);
        default: return rows_tma_launch<4, SWIGLU, false, F>(t, sh, max_smem, stream);
    }
}

// The launch's one format (every matrix's), or ROWS_FANY: the kernels' F.
inline int rows_launch_fmt(const RowsArgs& a) {
    for (int k = 1; k < a.n_mats; ++k)
        if (a.mat[k].fmt != a.mat[0].fmt) return ROWS_FANY;
    return a.mat[0].fmt;
}
// x's scale a 32-column block in a launch of one 32-column format (Q8_0 or Q5_0: its items take a float step a block
// anyway, so a finer x costs one multiply a block; the 0.5B's Q8_0 lm_head at 896 columns drifted 2.3% of its
// logits' scale from the reference with a scale per 128 columns, bench/NOTES.md session 33); else one a 128-column
// group (mixed launches too: their kernel, ROWS_FANY, keeps one x form). A function of the formats, never of n_x.
inline bool rows_fine(const RowsArgs& a) {
    const int f = rows_launch_fmt(a);
    return f == ROWS_Q80 || f == ROWS_Q50;
}

template <bool SWIGLU>
int rows_tma_launch_n(const RowsTmaArgs& t, const RowsShape& sh, bool fx, int max_smem, cudaStream_t stream) {
    switch (rows_launch_fmt(t.a)) {
        case ROWS_Q4K: return rows_tma_launch_nf<SWIGLU, ROWS_Q4K>(t, sh, fx, max_smem, stream);
        case ROWS_Q6K: return rows_tma_launch_nf<SWIGLU, ROWS_Q6K>(t, sh, fx, max_smem, stream);
        case ROWS_Q80: return rows_tma_launch_nf<SWIGLU, ROWS_Q80>(t, sh, fx, max_smem, stream);
        case ROWS_Q50: return rows_tma_launch_nf<SWIGLU, ROWS_Q50>(t, sh, fx, max_smem, stream);
        default: return rows_tma_launch_nf<SWIGLU, ROWS_FANY>(t, sh, fx, max_smem, stream);
    }
}

// The pre-pass's output, ROWS_NX rows of ROWS_MAX_COLS int8 codes, then their rows_scale_rows(ROWS_MAX_COLS, fine) x
// ROWS_NX float scales (room for the fine ones: a scale a 32-column block), in one StreamScratch allocation (cudaMalloc's alignment; q_bytes is a multiple of 65536, so the
// scales stay 8-byte aligned for the items' float2 reads).
struct RowsScratch { int8_t* xq = nullptr; float* xsc = nullptr; };

inline int rows_scratch(cudaStream_t stream, RowsScratch* out) {
    static StreamScratch scratch;
    const size_t q_bytes = (size_t)ROWS_NX * ROWS_MAX_COLS;
    const size_t sc_bytes = (size_t)rows_scale_rows(ROWS_MAX_COLS, true) * ROWS_NX * sizeof(float);
    void* p = nullptr;
    if (int st = scratch.get(stream, q_bytes + sc_bytes, &p)) return st;
    out->xq = static_cast<int8_t*>(p);
    out->xsc = reinterpret_cast<float*>(static_cast<uint8_t*>(p) + q_bytes);
    return 0;
}

template <int NT, bool SWIGLU, bool FX, int F>
int rows_launch(const RowsArgs& a, const RowsShape& sh, int max_smem, cudaStream_t stream) {
    if (int st = raise_smem_once<gemv_rows_kernel<NT, SWIGLU, FX, F>>(max_smem)) return st;
    return launch_pdl(gemv_rows_kernel<NT, SWIGLU, FX, F>, dim3(sh.ctas), dim3(sh.warps * 32), sh.smem, stream, a);
}

// fx: the CTAs quantize x themselves (n <= ROWS_FX_MAX_NX, so NT <= 1)
template <bool SWIGLU, int F>
int rows_launch_nf(const RowsArgs& a, const RowsShape& sh, bool fx, int max_smem, cudaStream_t stream) {
    if (fx) return a.n == 1 ? rows_launch<0, SWIGLU, true, F>(a, sh, max_smem, stream)
                            : rows_launch<1, SWIGLU, true, F>(a, sh, max_smem, stream);
    if (a.n == 1) return rows_launch<0, SWIGLU, false, F>(a, sh, max_smem, stream);
    switch (rows_ntiles(a.n)) {
        case 1: return rows_launch<1, SWIGLU, false, F>(a, sh, max_smem, stream);
        case 2: return rows_launch<2, SWIGLU, false, F>(a, sh, max_smem, stream);
        case 3: return rows_launch<3, SWIGLU, false, F>(a, sh, max_smem, stream);
        default: return rows_launch<4, SWIGLU, false, F>(a, sh, max_smem, stream);
    }
}

template <bool SWIGLU>
int rows_launch_n(const RowsArgs& a, const RowsShape& sh, bool fx, int max_smem, cudaStream_t stream) {
    switch (rows_launch_fmt(a)) {
        case ROWS_Q4K: return rows_launch_nf<SWIGLU, ROWS_Q4K>(a, sh, fx, max_smem, stream);
        case ROWS_Q6K: return rows_launch_nf<SWIGLU, ROWS_Q6K>(a, sh, fx, max_smem, stream);
        case ROWS_Q80: return rows_launch_nf<SWIGLU, ROWS_Q80>(a, sh, fx, max_smem, stream);
        case ROWS_Q50: return rows_launch_nf<SWIGLU, ROWS_Q50>(a, sh, fx, max_smem, stream);
        default: return rows_launch_nf<SWIGLU, ROWS_FANY>(a, sh, fx, max_smem, stream);
    }
}

// The x pre-pass: x (normalized with norm_w where given) -> the stream's scratch codes and scales, which a->x then
// points at; one launch.
inline int rows_prepass(cudaStream_t stream, const float* x, const float* norm_w, float eps, int cols, int n_x,
                        RowsArgs* a) {
    RowsScratch s;
    if (int st = rows_scratch(stream, &s)) return st;
    a->x = RowsX{s.xq, s.xsc, cols, ROWS_NX - 1, a->x.fine};
    const dim3 pre_grid(ceil_div(rows_groups(cols), ROWS_GROUP_WARPS), n_x);
    return launch_pdl(gemv_rows_quantize_x, pre_grid, dim3(ROWS_PREPASS_THREADS), 0, stream, x, norm_w, eps, cols,
                      a->x.fine, s.xq, s.xsc);
}

// The tuning's gemv_rows fields (flashd_tuning.h) gemv_rows_run reads.
struct RowsTuning {
    int rows;           // gemv_rows: chunks of that many super-blocks (the chunking changes the bits)
    int fuse_nx;        // gemv_rows_fuse_nx: calls of <= that many x rows quantize x in every CTA (no pre-pass)
    int tma_look;       // gemv_rows_tma: bulk-copy tiles in flight beyond those landed (0: cp.async)
    int tma_split;      // gemv_rows_tma_split: one-tile CTAs copy their tile in pieces of that many chunks (0: whole)
    int stage_x;        // gemv_rows_stage_x: bulk-copy calls of 2 .. 8 x rows with the pre-pass copy its codes into
                        // every CTA's shared memory where they are at most this many bytes (0: never)
    bool dp4a;          // gemv_rows_dp4a: one-row Q4_K / Q6_K calls with the CTAs' own x: dp4a items
    bool evict_first;   // weights_evict_first
    int tma_warps = ROWS_MAX_WARPS;   // gemv_rows_tma_warps: computing warps at most of a bulk-copy call of <= 8 x rows
};

// The bulk-copy plan of a call (rows_tma_plan), with room for the CTAs' x copy where they hold x: fx (they quantize
// it themselves, fx_bytes of it) or, 2 .. 8 x rows with the pre-pass, its codes copied in (rows_stage_x; *stage) where
// they are at most tn.stage_x bytes, the copy fits, and the CTA's warps have more than one item each to read x in
// (H200, 1.5B clone, session 37: staged, the lm_head at 2 rows 93.6 -> 64 us, gate/up 9.0 -> 8.3, ffn_down 10.6 -> 8.8;
// but q/k/v and o, one item a warp, 3.9 / 4.4 -> 5.0 / 5.5 us at 8 rows: the copy's round trip and barrier come before
// their only item, whose own x loads would have overlapped; and ffn_down's 72 KB of codes at 8 rows lost too).
inline bool rows_tma_plan_x(const RowsArgs& a, bool swiglu, int n_x, bool fx, int fx_bytes, const RowsTuning& tn,
                            const DeviceFacts& dev, RowsTmaArgs* ta, RowsShape* sh, bool* stage, bool dp4a = false) {
    *stage = !fx && n_x >= 2 && n_x <= ROWS_FX_MAX_NX && (long long)n_x * a.cols <= tn.stage_x;
    if (rows_tma_plan(a, swiglu, n_x, fx || *stage ? fx_bytes : 0, tn.tma_look, tn.tma_split, dev, ta, sh,
                      tn.tma_warps, dp4a)) {
        if (!*stage || (long long)ceil_div(a.tiles, sh->ctas) * a.C > sh->warps) return true;
    }
    const bool was = *stage;
    *stage = false;
    return was && rows_tma_plan(a, swiglu, n_x, 0, tn.tma_look, tn.tma_split, dev, ta, sh, tn.tma_warps, dp4a);
}

// The whole call (validated as gemv_plan validates): one GEMV launch over every matrix, after the pre-pass (x ->
// codes, with the norm) or, for n_x <= fuse_nx (the tuning's gemv_rows_fuse_nx, <= ROWS_FX_MAX_NX), with each CTA
// quantizing x itself (no second launch and no scratch; the same codes, so the same bits: the choice is a launch
// shape). 1 <= n_x <= ROWS_NX.
// given (fd_gemv_xq; no norm): x's codes made by its producer in the pre-pass's layout (x_codes.cuh), read in
// place of the pre-pass's or a CTA's own (the same codes, so the same bits) where the launch's groups are 128-column
// ones; a launch of a format with a scale per 32 columns (Q8_0 / Q5_0) quantizes x as without them.
inline int gemv_rows_run(int n_mats, const MatIn* mats, bool swiglu, int cols, const float* x, int n_x,
                         const float* norm_w, float eps, const float* residual, const RowsTuning& tn,
                         const DeviceFacts& dev, cudaStream_t stream, const RowsX* given = nullptr) {
    FD_CHECK_ARG(n_mats >= 1 && n_mats <= MAX_MATS && x != nullptr && n_x >= 1 && n_x <= ROWS_NX);
    FD_CHECK_ARG(eps >= 0.0f && (!swiglu || (n_mats == 2 && mats[0].rows == mats[1].rows)));
    RowsArgs a{};
    a.n_mats = n_mats;
    a.n = n_x;
    a.cols = cols;
    a.ks = rows_ks(cols, tn.rows);
    a.C = ceil_div(cols, ROWS_QK * a.ks);
    a.residual = residual;
    a.evict_first = tn.evict_first ? 1 : 0;
    int stride_max = 0, tiles = 0;
    for (int k = 0; k < n_mats; ++k) {
        FmtInfo info;
        if (!fmt_info(mats[k].qtype, &info)) return FD_E_QTYPE;
        FD_CHECK_ARG(mats[k].w != nullptr && mats[k].y != nullptr && mats[k].rows >= 1);
        FD_CHECK_ARG(reinterpret_cast<uintptr_t>(mats[k].w) % (uintptr_t)info.align == 0);
        RowsMat& m = a.mat[k];
        m.w = static_cast<const uint8_t*>(mats[k].w);
        m.y = mats[k].y;
        m.bias = mats[k].bias;
        m.fmt = rows_fmt(mats[k].qtype);
        m.rows = mats[k].rows;
        m.row_bytes = row_bytes(info, cols);
        m.stride = rows_stride(m.fmt, a.ks);
        m.tile_first = swiglu ? 0 : tiles;
        if (!swiglu || k == 0) tiles += ceil_div(m.rows, 16);
        stride_max = max(stride_max, m.stride);
    }
    a.x.fine = rows_fine(a) ? 1 : 0;
    if (given && (a.x.fine || norm_w || cols % ROWS_XG != 0)) given = nullptr;
    a.fx_stride = rows_fx_stride(n_x, cols, rows_launch_fmt(a));
    const int fxb = rows_fx_bytes(n_x, a.fx_stride, cols, a.x.fine != 0);
    a.tiles = tiles;
    a.up_off = 16 * stride_max;
    a.slot_bytes = a.up_off * (swiglu ? 2 : 1);
    RowsShape sh;
    // the bulk-copy kernel where it applies (sm_90), with the CTAs' own x copy wherever n_x <= fuse_nx, the narrow
    // launches (q/k/v, o, down) included: with one x scale a 128-column group that beats the pre-pass launch (H200,
    // bench/NOTES.md session 32: one-row forward 1.139 -> 1.127 ms on the 1.5B clone, 0.813 -> 0.772 on the 0.5B;
    // tg128 +1.2% / +4.7%), where with a scale per 32 columns it had lost (1.27 -> 1.35 ms, session 24)
    const bool fx_wanted = n_x <= min(tn.fuse_nx, ROWS_FX_MAX_NX);
    // one-row launches of Q4_K / Q6_K matrices (one format, or q / k / v with a Q6_K v) with the CTAs' own x: the items
    // on dp4a lanes where asked (the same bits), on the dp4a kernel (up to ROWS_TMA_DP4A_WARPS warps)
    bool kq = true;
    for (int k = 0; k < n_mats; ++k) kq = kq && (a.mat[k].fmt == ROWS_Q4K || a.mat[k].fmt == ROWS_Q6K);
    const bool dp4a = tn.dp4a && n_x == 1 && fx_wanted && kq;
    bool stage_x = false;
    RowsTmaArgs ta;
    const bool tma = rows_tma_plan_x(a, swiglu, n_x, fx_wanted, fxb, tn, dev, &ta, &sh, &stage_x, dp4a);
    if (tma) {
        if (given) {
            a.x = RowsX{given->q, given->sc, cols, ROWS_NX - 1, 0};   // with smem_x the CTAs copy them (rows_stage_x)
        } else if (fx_wanted) {
            a.xin = x;
            a.norm_w = norm_w;
            a.eps = eps;
        } else {
            if (int st = rows_prepass(stream, x, norm_w, eps, cols, n_x, &a)) return st;
        }
        const bool smem_x = fx_wanted || stage_x;   // a.xin NULL with smem_x: the kernel copies the pre-pass's codes
        if (smem_x) {
            a.fx_off = (int)sh.smem;
            sh.smem += (size_t)fxb;
        }
        a.R = sh.R;
        ta.a = a;
        ta.dp4a = dp4a ? 1 : 0;
        return swiglu ? rows_tma_launch_n<true>(ta, sh, smem_x, dev.max_smem, stream)
                      : rows_tma_launch_n<false>(ta, sh, smem_x, dev.max_smem, stream);
    }
    // cp.async kernel (GPUs before sm_90, or no bulk-copy plan): the CTAs' own x copy where asked for, the launch
    // has more than ROWS_FX_MIN_TILES_PER_SM tiles an SM and it leaves room for a shape (else the pre-pass: the same
    // bits either way). Every CTA normalizes and quantizes all of x, which paid there only where each CTA has many
    // tiles to amortize it over: H100, n = 1 (bench/NOTES.md session 13, x per 32 columns), own copy vs pre-pass:
    // lm_head 72.9 vs 83.2 us, ffn_gate 10.1 vs 10.2, but ffn_down (96 tiles, 8960 columns) 17.5 vs 12.6, attn_q/o
    // 6.2 vs 4.7, attn_k/v 5.6 vs 4.3 (not re-measured with 128-column groups).
    const bool fx = !given && fx_wanted && tiles > ROWS_FX_MIN_TILES_PER_SM * dev.n_sms &&
                    rows_shape(a, swiglu, n_x, fxb, dev, &sh) == 0 && sh.st >= 2;
    if (fx) {
        a.st = sh.st;
        a.R = sh.R;
        a.xin = x;
        a.norm_w = norm_w;
        a.eps = eps;
        a.fx_off = (int)sh.smem;
        sh.smem += (size_t)fxb;
        return swiglu ? rows_launch_n<true>(a, sh, true, dev.max_smem, stream)
                      : rows_launch_n<false>(a, sh, true, dev.max_smem, stream);
    }
    if (int st = rows_shape(a, swiglu, n_x, 0, dev, &sh)) return st;
    a.st = sh.st;
    a.R = sh.R;
    if (given) a.x = RowsX{given->q, given->sc, cols, ROWS_NX - 1, 0};
    else if (int st = rows_prepass(stream, x, norm_w, eps, cols, n_x, &a)) return st;
    return swiglu ? rows_launch_n<true>(a, sh, false, dev.max_smem, stream)
                  : rows_launch_n<false>(a, sh, false, dev.max_smem, stream);
}

}  // namespace
}  // namespace fd
