// gemv_plan.cuh -- the host side of a GEMV launch, shared by gemv.cu and forward.cu: the device facts
// (SM count, opt-in shared memory; cached per device), lanes per row per matrix (choose_lpr), the step
// geometry and activation form of a launch (gemv_plan -> GemvPlan) and the shared-memory layout of a pass
// of n_x staged rows (gemv_layout -> GemvArgs offsets).
#pragma once

#include "gemv_stage.cuh"

#include <mutex>

namespace fd {
namespace {

using namespace fd::q;

// ---- host side: device facts and planning (shared by gemv.cu and forward.cu) -----------------------------
struct DeviceFacts { int n_sms = 0, max_smem = 0, cc_major = 0; };   // cc_major: 0 under HIP

int device_facts(DeviceFacts* out) {
    static std::mutex mu;
    static DeviceFacts cache[64];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return (int)err;
    if (dev < 0 || dev >= 64) return FD_E_ARG;
    std::lock_guard<std::mutex> lock(mu);
    if (cache[dev].n_sms == 0) {
        int n_sms = 0, max_smem = 0, cc_major = 0;
        err = cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, dev);
        if (err == cudaSuccess) err = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
#if FD_HAS_MMA
        if (err == cudaSuccess) err = cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev);
#endif
        if (err != cudaSuccess) return (int)err;
        cache[dev].n_sms = n_sms;
        cache[dev].max_smem = max_smem;
        cache[dev].cc_major = cc_major;
    }
    *out = cache[dev];
    return 0;
}

struct MatIn { const void* w; float* y; const float* bias; int qtype, rows; };

// A GEMV kernel's dynamic shared-memory limit raised to the device's opt-in maximum, once per instantiation and
// process (host-side, no stream work: allowed while a graph is captured). Kernel: the __global__ instantiation.
template <auto Kernel>
int raise_smem_once(int max_smem) {
    static std::once_flag once;
    static cudaError_t err = cudaSuccess;
    std::call_once(once, [&] { err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem); });
    return (int)err;
}

int pieces_per_row(const FmtInfo& f, int cols) {
    return f.is_float ? ceil_div(cols, f.block_elems) : cols / f.block_elems * f.lanes_per_block;
}

// Lanes per row: among 4, 8, 16, 32 (>= lanes per block and the format's MIN_LPR, which keeps the
// lanes' x addresses affine),
// keep those whose step fits stage_bytes (else the largest); prefer at least min_steps steps, then
// the highest lane efficiency, then the smallest (more rows share xn).
int choose_lpr(const FmtInfo& f, int rows, int cols, int64_t rb, int n_ranges, int min_steps, int stage_bytes) {
    const int pieces = pieces_per_row(f, cols);
    int best = 32;
    double best_score = -1.0;
    for (int lpr = 4; lpr <= 32; lpr *= 2) {
        if (lpr < f.lanes_per_block || lpr < f.min_lpr) continue;
        const int G = 32 / lpr;
        if ((int64_t)n_ranges * G * rb > stage_bytes && lpr != 32) continue;
        const int iters = ceil_div(pieces, lpr);
        const double eff = (double)pieces / ((double)iters * lpr);
        const bool enough_steps = ceil_div(rows, G) >= min_steps || G == 1;
        const double score = (enough_steps ? 2.0 : 0.0) + eff - 1e-3 * lpr;
        if (score > best_score) { best_score = score; best = lpr; }
    }
    return best;
}

// The geometry of one GEMV launch (or of one stage of the persistent forward), independent of how many x
// rows a pass stages: matrices, lanes per row, steps, the stage buffer size, the activation form (int8 or
// float) and which shared-memory pieces are staged. gemv_layout() then places a pass of nx rows.
struct GemvPlan {
    GemvArgs a;                            // x, residual, n_x and the shared-memory offsets are set per pass
    bool xq;                               // int8 activations
    bool layout_used[XL_COUNT];            // float x rows staged in this layout
    bool layout8_used[XL_COUNT];           // int8 x rows staged in this layout
    bool need_xsum;                        // sums of x per 16 / 32 columns (every quant format)
    int64_t per_x_row_bytes;               // shared memory per staged x row
};

// Validates the matrices and plans their steps. int8_x: int8 activations where every matrix is quantized
// (and x / norm_w allow 16-byte loads); stage_bytes: the target bytes of one step; min_steps: lanes per row
// are chosen to give at least this many steps where a matrix has the rows (gemv.cu: two per SM; the
// persistent forward: one per warp of the grid, so a small matrix is done in one step's latency).
// split_cols > 0: a one-matrix int8 launch of at least that many columns whose rows take a whole warp (lpr 32)
// splits each row over a pair of warps (GemvMat.split_*; gemv.cu's SPLIT kernels). Whether a launch splits depends on
// the matrix, its columns and the tuning, never on n_x, so every x row still gets the same arithmetic.
inline int gemv_plan(int n_mats, const MatIn* mats, bool swiglu, int cols, const float* x, const float* norm_w,
                     float eps, int n_x, bool int8_x, int stage_bytes, int min_steps, GemvPlan* out,
                     int split_cols = 0) {
    FD_CHECK_ARG(n_mats >= 1 && n_mats <= MAX_MATS && x != nullptr && cols >= 1 && n_x >= 1 && n_x <= MAX_NX);
    FD_CHECK_ARG(eps >= 0.0f && (!swiglu || n_mats == 2));
    FmtInfo info[MAX_MATS];
    for (int k = 0; k < n_mats; ++k) {
        FD_CHECK_ARG(mats[k].w != nullptr && mats[k].y != nullptr && mats[k].rows >= 1);
        if (!fmt_info(mats[k].qtype, &info[k])) return FD_E_QTYPE;
        if (!info[k].is_float && cols % info[k].block_elems != 0) return FD_E_SHAPE;
        FD_CHECK_ARG(reinterpret_cast<uintptr_t>(mats[k].w) % (uintptr_t)info[k].align == 0);
    }
    GemvPlan pl{};
    GemvArgs& a = pl.a;
    a.n_mats = n_mats;
    a.cols = cols;
    a.eps = eps;
    a.norm_w = norm_w;
    // Activations: int8 (XQ) when every matrix is quantized (then cols % 32 == 0) and x / norm_w allow
    // 16-byte loads; else float32 in each layout the formats read.
    bool xq = int8_x && cols % 32 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(norm_w) % 16 == 0;
    for (int k = 0; k < n_mats; ++k) xq = xq && !info[k].is_float;
    pl.xq = xq;
    // Split rows: one int8 matrix of at least split_cols columns (and two blocks) takes a whole warp a row (lpr 32,
    // whatever choose_lpr would say) and a pair of warps computes it: slice 0 the first ceil(blocks / 2) blocks
    const bool split = split_cols > 0 && xq && n_mats == 1 && !swiglu && cols >= split_cols &&
                       cols / info[0].block_elems >= 2;
    // per-matrix step geometry
    int64_t range_bytes = 0;
    int steps = 0;
    const int n_ranges = swiglu ? 2 : 1;
    for (int k = 0; k < n_mats; ++k) {
        GemvMat& m = a.mat[k];
        m.w = static_cast<const uint8_t*>(mats[k].w);
        m.y = mats[k].y;
        m.bias = mats[k].bias;
        m.qtype = mats[k].qtype;
        m.rows = mats[k].rows;
        m.row_bytes = row_bytes(info[k], cols);
        m.pieces = pieces_per_row(info[k], cols);
        m.lpr = split ? 32 : choose_lpr(info[k], m.rows, cols, m.row_bytes, n_ranges, min_steps, stage_bytes);
        m.aligned16 = info[k].is_float && reinterpret_cast<uintptr_t>(m.w) % 16 == 0 && m.row_bytes % 16 == 0;
    }
    if (swiglu) {   // gate and up share the step geometry: the coarser of their choices
        FD_CHECK_ARG(a.mat[1].rows == a.mat[0].rows);
        const int lpr = max(a.mat[0].lpr, a.mat[1].lpr);
        a.mat[0].lpr = a.mat[1].lpr = lpr;
        a.mat[1].y = a.mat[0].y;
    }
    for (int k = 0; k < n_mats; ++k) {
        GemvMat& m = a.mat[k];
        const int G = 32 / m.lpr;
        range_bytes = max(range_bytes, stage_range_bytes((int64_t)G * m.row_bytes));
        m.first_step = swiglu ? 0 : steps;
        if (!swiglu || k == 0) steps += ceil_div(m.rows, G);
    }
    if (split) {   // a warp's buffer holds its slice (slice 0, the larger one)
        GemvMat& m = a.mat[0];
        const int h = (cols / info[0].block_elems + 1) / 2;
        m.split_pieces = h * info[0].lanes_per_block;
        m.split_bytes = h * info[0].block_bytes;
        range_bytes = stage_range_bytes((int64_t)m.split_bytes);
    }
    a.n_steps = steps;
    a.range_bytes = (int)range_bytes;
    a.stage_bytes = (int)(range_bytes * n_ranges);

    for (int L = 0; L < XL_COUNT; ++L) pl.layout_used[L] = pl.layout8_used[L] = false;
    pl.need_xsum = false;
    for (int k = 0; k < n_mats; ++k) {
        (xq ? pl.layout8_used : pl.layout_used)[info[k].layout] = true;
        pl.need_xsum |= !info[k].is_float;
    }
    int x_row_total = 0;
    for (int L = 0; L < XL_COUNT; ++L) {
        a.x_row[L] = x_row_floats(L, cols);
        if (pl.layout_used[L]) x_row_total += a.x_row[L];
    }
    a.xsum16_row = pl.need_xsum ? ((ceil_div(cols, 16) + 3) & ~3) : 0;
    a.xsum32_row = pl.need_xsum ? ((ceil_div(cols, 32) + 3) & ~3) : 0;
    a.xsc_row = xq ? a.xsum32_row : 0;
    int x8_row_total = 0;
    for (int L = 0; L < XL_COUNT; ++L) {
        a.x8_row[L] = (x8_row_bytes(L, cols) + 15) & ~15;
        if (pl.layout8_used[L]) x8_row_total += a.x8_row[L];
    }
    pl.per_x_row_bytes = 4 * (int64_t)(x_row_total + a.xsum16_row + a.xsum32_row + a.xsc_row) + x8_row_total;
    *out = pl;
    return 0;
}

// The shared-memory layout of a pass of nx staged x rows: scratch | x rows per layout (float) | xsum16 |
// xsum32 | xsc | x8 rows per layout | (16-aligned) stage buffers. Sets p's offsets and n_x; returns the
// byte offset of the stage buffers (p->stage_off_bytes), i.e. the bytes the staged activations take.
inline int gemv_layout(const GemvPlan& pl, int nx, GemvArgs* p) {
    const GemvArgs& a = pl.a;
    p->n_x = nx;
    int off = scratch_bytes_for(nx) / 4;
    for (int L = 0; L < XL_COUNT; ++L) {
        p->x_off_floats[L] = pl.layout_used[L] ? off : -1;
        if (pl.layout_used[L]) off += nx * a.x_row[L];
    }
    p->xsum16_off = pl.need_xsum ? off : -1;
    if (pl.need_xsum) off += nx * a.xsum16_row;
    p->xsum32_off = pl.need_xsum ? off : -1;
    if (pl.need_xsum) off += nx * a.xsum32_row;
    p->xsc_off = pl.xq ? off : -1;
    off += nx * a.xsc_row;
    int off_bytes = (off * 4 + 15) & ~15;
    for (int L = 0; L < XL_COUNT; ++L) {
        p->x8_off[L] = pl.layout8_used[L] ? off_bytes : -1;
        if (pl.layout8_used[L]) off_bytes += nx * a.x8_row[L];
    }
    p->stage_off_bytes = off_bytes;
    return off_bytes;
}

// ---- the launch shape: CTAs, warps a CTA, buffers a warp -------------------------------------------------
// A launch whose steps fit one per warp with at most this many warps a CTA runs them single-buffered,
// one step a warp, instead of double-buffered rounds. Measured on an H100 (bench/results/2026-11-26-
// h100-gemv-one-step-rule.md): the 0.5B's gate/up (9.2 steps an SM) is faster one step a warp, the
// 1.5B's ffn_down (11.6 steps an SM, 7 KB rows) faster in rounds; the threshold sits between them.
constexpr int SINGLE_STEP_MAX_WARPS = 10;

struct GemvLaunchShape { int ctas, warps, n_bufs; };

// steps of the launch, bytes of one step's buffer, bytes of staged activations before the buffers,
// the device's opt-in shared memory per CTA and SM count, warps a CTA may have (max_warps_for), and
// rounds >= 2 (persistent double-buffered warps, that many steps each) or 0 (one step a warp wherever
// the grid can hold them), and the x rows of the pass (nx > 1: as many warps as fit, see below).
// FD_E_SHAPE when not even one step's buffer fits beside the activations.
inline int gemv_launch_shape(int steps, int stage_bytes, int stage_off_bytes, int max_smem, int n_sms, int max_warps,
                             int rounds, int nx, GemvLaunchShape* out) {
    const int64_t avail = (int64_t)max_smem - stage_off_bytes;
    const int64_t fit1 = std::min<int64_t>(avail / stage_bytes, max_warps);
    const int64_t fit2 = std::min<int64_t>(avail / (2 * (int64_t)stage_bytes), max_warps);
    if (fit1 < 1) return FD_E_SHAPE;
    // At least MIN_CTA_WARPS warps per CTA even if some get no step: they share the prologue. A matrix
    // with fewer steps than SMs x MIN_CTA_WARPS (the QKV and O projections) takes only the CTAs that give
    // every warp one step: the SMs left free take the next kernel's first CTAs, which start streaming
    // their weights early (PDL). Measured in bench/results/2026-11-26-h100-gemv-stream-integrated.md.
    const int ctas = min(ceil_div(steps, MIN_CTA_WARPS), n_sms);
    int64_t warps;
    int bufs;
    if (nx > 1 && steps > ctas * fit1) {
        // Several x rows: a warp's step is compute-bound (per weight, nx x (a shared-memory load + 2 dp4a)),
        // so an SM needs as many warps computing as fit more than it needs buffers in flight: double-buffered
        // warps when nearly as many fit as single-buffered ones (x rows of 1536 columns), else one buffer a
        // warp and its steps in series (7 rows of ffn_down's 8960 columns leave room for 9 buffers: 4
        // double-buffered warps ran it at a tenth of the weights' bandwidth, results/2026-11-26-h100-
        // forward-rows-ncu-session10.md).
        bufs = 4 * fit2 >= 3 * fit1 ? 2 : 1;
        warps = std::max<int64_t>(std::min<int64_t>(bufs == 2 ? fit2 : fit1, ceil_div(steps, ctas)), 1);
    } else if (rounds && fit2 >= 1 && steps >= 2 * ctas && steps > ctas * SINGLE_STEP_MAX_WARPS) {
        bufs = 2;
        warps = std::min<int64_t>(std::max<int64_t>(ceil_div(steps, ctas * rounds), MIN_CTA_WARPS), fit2);
    } else if (steps <= ctas * fit1 || fit2 < 1) {   // every warp one step, single-buffered
        bufs = 1;
        warps = std::min<int64_t>(std::max<int64_t>(ceil_div(steps, ctas), MIN_CTA_WARPS), fit1);
    } else {                                         // as many rounds as needed, warps spread evenly
        bufs = 2;
        const int64_t r = (steps + ctas * fit2 - 1) / (ctas * fit2);
        warps = std::min<int64_t>(std::max<int64_t>((steps + ctas * r - 1) / (ctas * r), MIN_CTA_WARPS), fit2);
    }
    *out = GemvLaunchShape{ctas, (int)warps, bufs};
    return 0;
}

// A split launch (GemvMat.split_*) runs whole teams of two warps: from gemv_launch_shape's shape for 2 x steps
// warp-steps, an odd warp count gains a warp where it fits (max_warps, shared memory), else loses one; a lone
// double-buffered warp becomes a single-buffered team. FD_E_SHAPE when not even two single buffers fit (gemv.cu
// leaves room for 8 beside the staged x, so its launches never get it).
inline int gemv_split_shape(int stage_bytes, int stage_off_bytes, int max_smem, int max_warps, GemvLaunchShape* s) {
    auto fits = [&](int64_t warps, int bufs) {
        return warps <= max_warps && (int64_t)stage_off_bytes + warps * bufs * (int64_t)stage_bytes <= max_smem;
    };
    if (s->warps & 1) s->warps += fits(s->warps + 1, s->n_bufs) ? 1 : -1;
    if (s->warps < 2 && s->n_bufs == 2 && fits(2, 1)) {   // one double-buffered warp: a single-buffered team instead
        s->warps = 2;
        s->n_bufs = 1;
    }
    return s->warps >= 2 ? 0 : FD_E_SHAPE;
}

}  // namespace
}  // namespace fd
