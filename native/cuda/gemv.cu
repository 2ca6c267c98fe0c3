// gemv.cu -- decode projections as one launch each (fd_gemv, fd_gemv_multi, fd_gemv_swiglu): the kernel
// around gemv.cuh's step functions, its grid and warp plan, and the C entry points. gemv.cuh describes the
// design, the numerics and the measured speeds; forward.cu runs the same steps inside the persistent forward.
//
// The kernel: one CTA per SM at most; warp w of CTA b takes steps w * n_ctas + b + k * n_warps_total. A
// warp's first step of weights is fetched before pdl_wait() (programmatic dependent launch), i.e. while the
// previous kernel finishes; then the CTA stages x (the prologue) and the warps stream their steps through
// one or two shared-memory buffers each. The widest int8 launches (fd_tuning_t.gemv_xq_prepass_cols / _norm_cols)
// take x's staged image from a small pre-pass launch instead of quantizing x in every CTA (gemv_xq_image_kernel);
// one-row ones may read that image in place instead of copying it (fd_tuning_t.gemv_xq_direct: the XG kernels).
//
// Q4_K / Q6_K / Q8_0 / Q5_0 calls take gemv_rows.cuh's tensor-core kernel instead, for every n_x (1..32), where the
// tuning table's gemv_rows and gemv_rows_formats say so (gemv_rows_plan.cuh rows_eligible: the formats, cols and the
// tuning, never n_x);
// every other call keeps the kernels here (n_x <= 8).
#include "gemv_mma.cuh"
#include "gemv_scratch.cuh"

#include <mutex>
#include "x_codes.cuh"
#if FD_HAS_MMA
#include "gemv_rows_plan.cuh"
#else
namespace fd {
namespace {
struct RowsX;   // gemv_rows' x codes (gemv_rows_item.cuh): never read without int8 mma, where gemv_rows is not built
}  // namespace
}  // namespace fd
#endif

namespace fd {
namespace {
// XG (one-row int8 launches with the pre-pass, fd_tuning_t.gemv_xq_direct): the CTAs read x's image where the pre-pass
// wrote it (global memory, through L1: the first warp of an SM to touch a line brings it in for the others) instead of
// copying it into shared memory behind a CTA barrier -- each warp starts computing when its own weights have landed.
// The same bytes at the same offsets (x_views over the image), so the same bits.
template <int NX, bool SWIGLU, bool XQ, bool PAIR = false, bool XG = false>
__global__ void __launch_bounds__(max_warps_for(NX, SWIGLU) * 32, 1) gemv_kernel(const GemvArgs a) {
    static_assert(!XG || (XQ && NX == 1), "x read in place: one-row int8 launches");
    extern __shared__ __align__(16) uint8_t smem[];
    float* smf = reinterpret_cast<float*>(smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int stride = gridDim.x * n_warps;
    const int s0 = warp * gridDim.x + blockIdx.x;   // consecutive steps go to different CTAs (SMs)
    uint8_t* stage = smem + a.stage_off_bytes + (size_t)warp * a.n_bufs * a.stage_bytes;

    // weights: in flight during the prologue ... (issued only after it instead, so that x's loads would not queue
    // behind them, tg128 lost 9-14%: bench/NOTES.md session 17)
    if (s0 < a.n_steps) issue_step<SWIGLU>(a, s0, stage, lane);
    cp_async_commit();
    pdl_wait();                // ... and while the previous kernel finishes writing x (and the residual)
    // Only now may the next kernel start prefetching: triggered at our start instead, a chain of GEMVs
    // all prefetched at once and slowed the one on the critical path (1.5B tg128: 729 tok/s with PDL
    // vs 747 without; triggered here: 784 vs 769).
    pdl_launch_dependents();
    if constexpr (XG) {
        // nothing to stage: a.ximg holds bytes [xq_image_lo, stage_off_bytes) of the layout, so the views' offsets
        // apply to (a.ximg - xq_image_lo) as they do to smem (every offset they read is >= xq_image_lo)
    } else if constexpr (XQ) {
        if (a.ximg) load_xq_image(a, smem);
        else stage_xq<NX>(a, smem, smf);
    } else {
        stage_x<NX>(a, smf);
    }

    const XViews xv = XG ? x_views(a, reinterpret_cast<const float*>(a.ximg - xq_image_lo(a.n_x))) : x_views(a, smf);
    int it = 0;
    for (int s = s0; s < a.n_steps; s += stride, ++it) {
        const int cur = (it & 1) & (a.n_bufs - 1);
        if (a.n_bufs == 2) {   // prefetch step s + stride into the other buffer
            const int next = s + stride;
            if (next < a.n_steps) issue_step<SWIGLU>(a, next, stage + (cur ^ 1) * a.stage_bytes, lane);
            cp_async_commit();
            cp_async_wait<1>();   // this lane's copies of step s are done ...
        } else {               // one buffer: the launcher gives each warp one step (more would serialize)
            if (s != s0) {
                issue_step<SWIGLU>(a, s, stage, lane);
                cp_async_commit();
            }
            cp_async_wait<0>();
        }
        __syncwarp();             // ... and every lane's are visible
        compute_step<NX, SWIGLU, XQ, PAIR>(a, s, stage + cur * a.stage_bytes, xv, lane);
        __syncwarp();             // the buffer is refilled by a later issue
    }
    cp_async_wait<0>();
}

// ---- split rows (fd_tuning_t.gemv_split_cols, gemv.cuh compute_step_split) ---------------------------------------
// gemv_kernel's schedule with teams of two warps in place of warps: team t of CTA b takes steps (rows) t * n_ctas + b
// + k * n_teams_total, warp 2t + k computing slice k. One int8 matrix, no SwiGLU; XG as in gemv_kernel. Every
// barrier is per team (named), so a team without rows just passes its two per step.
template <int NX, bool XG = false>
__global__ void __launch_bounds__(max_warps_for(NX, false) * 32, 1) gemv_split_kernel(const GemvArgs a) {
    static_assert(!XG || NX == 1, "x read in place: one-row launches");
    extern __shared__ __align__(16) uint8_t smem[];
    float* smf = reinterpret_cast<float*>(smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, team = warp >> 1, slice = warp & 1;
    const int n_teams = blockDim.x >> 6;
    const int stride = gridDim.x * n_teams;
    const int s0 = team * gridDim.x + blockIdx.x;
    uint8_t* stage = smem + a.stage_off_bytes + (size_t)warp * a.n_bufs * a.stage_bytes;

    if (s0 < a.n_steps) issue_step_split(a, s0, stage, lane, slice);
    cp_async_commit();
    pdl_wait();
    pdl_launch_dependents();
    if constexpr (!XG) {
        if (a.ximg) load_xq_image(a, smem);
        else stage_xq<NX>(a, smem, smf);   // its last barrier frees the scratch for the teams' partial sums
    }
    const XViews xv = XG ? x_views(a, reinterpret_cast<const float*>(a.ximg - xq_image_lo(a.n_x))) : x_views(a, smf);
    float* part = smf + team * 2 * NX;     // scratch_bytes_for(NX) holds 12 teams x 2 x NX floats (NORM_LANES >= 24)
    int it = 0;
    for (int s = s0; s < a.n_steps; s += stride, ++it) {
        const int cur = (it & 1) & (a.n_bufs - 1);
        if (a.n_bufs == 2) {
            const int next = s + stride;
            if (next < a.n_steps) issue_step_split(a, next, stage + (cur ^ 1) * a.stage_bytes, lane, slice);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            if (s != s0) {
                issue_step_split(a, s, stage, lane, slice);
                cp_async_commit();
            }
            cp_async_wait<0>();
        }
        __syncwarp();
        compute_step_split<NX>(a, s, stage + cur * a.stage_bytes, xv, lane, slice, team, part);
        __syncwarp();
    }
    cp_async_wait<0>();
}
static_assert(NORM_LANES >= 2 * (24 / 2), "the teams' partial sums fit the prologue's scratch");

// ---- the x pre-pass (fd_tuning_t.gemv_xq_prepass_cols) ---------------------------------------------------
// x's int8 image for a pass (gemv_stage.cuh xq_image_lo .. stage_off_bytes) written once to global memory by a small
// launch of its own, so that each GEMV CTA copies ~2.3 bytes a column instead of normalizing and quantizing x: its
// prologue is a serial chain of shuffles (~4-6 us on ffn_down's 8960-17408 columns, bench/NOTES.md sessions 15-16)
// that the pre-pass runs once, spread over more SMs. The same norm_scales / stage_xq_groups as the CTAs' own
// prologue, so the same bytes: the GEMV's bits do not depend on where x was quantized.
constexpr int XIMG_THREADS = 256;

template <int NX>
__global__ void __launch_bounds__(XIMG_THREADS) gemv_xq_image_kernel(const GemvArgs a, uint8_t* img) {
    extern __shared__ __align__(16) float pre_smf[];   // norm_scales' partials: scratch_bytes_for(NX)
    pdl_wait();                // x is the previous kernel's output
    pdl_launch_dependents();   // the GEMV may start fetching its first weights while x is quantized
    float scale[NX];
    norm_scales<NX>(a, pre_smf, scale);
    stage_xq_groups<NX>(a, img - xq_image_lo(a.n_x), scale, blockIdx.x * blockDim.x + threadIdx.x,
                        gridDim.x * blockDim.x);
}

template <int NX>
int launch_xq_image(const GemvArgs& p, uint8_t* img, int n_sms, cudaStream_t stream) {
    const int groups = p.cols >> 2;
    const int ctas = max(1, min(ceil_div(groups, XIMG_THREADS), n_sms));
    return launch_pdl(gemv_xq_image_kernel<NX>, dim3(ctas), dim3(XIMG_THREADS), (size_t)scratch_bytes_for(NX), stream,
                      p, img);
}

int xq_image_any(int nx, const GemvArgs& p, uint8_t* img, int n_sms, cudaStream_t stream) {
    switch (nx) {
        case 1: return launch_xq_image<1>(p, img, n_sms, stream);
        case 2: return launch_xq_image<2>(p, img, n_sms, stream);
        case 3: return launch_xq_image<3>(p, img, n_sms, stream);
        case 4: return launch_xq_image<4>(p, img, n_sms, stream);
        case 5: return launch_xq_image<5>(p, img, n_sms, stream);
        case 6: return launch_xq_image<6>(p, img, n_sms, stream);
        case 7: return launch_xq_image<7>(p, img, n_sms, stream);
        case 8: return launch_xq_image<8>(p, img, n_sms, stream);
        default: return FD_E_ARG;
    }
}

// The pre-pass's output buffer: one per (device, stream), max_smem bytes (an image is at most what a CTA stages),
// from a StreamScratch of its own (gemv_scratch.cuh: allocated on the first call on that stream, kept for the
// process, relaxed capture mode inside graph capture). Launches on one stream share it safely: a pre-pass writes
// only after its pdl_wait, i.e. after the GEMV before it (the image's last reader) has completed.
int xq_image_scratch(cudaStream_t stream, int bytes, uint8_t** out) {
    static StreamScratch scratch;
    void* p = nullptr;
    if (int st = scratch.get(stream, (size_t)bytes, &p)) return st;
    *out = static_cast<uint8_t*>(p);
    return 0;
}

template <int NX, bool SWIGLU, bool XQ, bool PAIR = false, bool XG = false>
int launch_nx(const GemvArgs& a, int ctas, int warps, size_t smem, int max_smem, cudaStream_t stream) {
    const int st = raise_smem_once<gemv_kernel<NX, SWIGLU, XQ, PAIR, XG>>(max_smem);
    if (st) return st;
    return launch_pdl(gemv_kernel<NX, SWIGLU, XQ, PAIR, XG>, dim3(ctas), dim3(warps * 32), smem, stream, a);
}

template <int NX, bool XG = false>
int launch_split_nx(const GemvArgs& a, int ctas, int warps, size_t smem, int max_smem, cudaStream_t stream) {
    if (int st = raise_smem_once<gemv_split_kernel<NX, XG>>(max_smem)) return st;
    return launch_pdl(gemv_split_kernel<NX, XG>, dim3(ctas), dim3(warps * 32), smem, stream, a);
}

int launch_split(int nx, bool direct, const GemvArgs& a, int ctas, int warps, size_t smem, int max_smem,
                 cudaStream_t stream) {
    switch (nx) {
        case 1: return direct ? launch_split_nx<1, true>(a, ctas, warps, smem, max_smem, stream)
                              : launch_split_nx<1>(a, ctas, warps, smem, max_smem, stream);
        case 2: return launch_split_nx<2>(a, ctas, warps, smem, max_smem, stream);
        case 3: return launch_split_nx<3>(a, ctas, warps, smem, max_smem, stream);
        case 4: return launch_split_nx<4>(a, ctas, warps, smem, max_smem, stream);
        case 5: return launch_split_nx<5>(a, ctas, warps, smem, max_smem, stream);
        case 6: return launch_split_nx<6>(a, ctas, warps, smem, max_smem, stream);
        case 7: return launch_split_nx<7>(a, ctas, warps, smem, max_smem, stream);
        case 8: return launch_split_nx<8>(a, ctas, warps, smem, max_smem, stream);
        default: return FD_E_ARG;
    }
}

// A one-row int8 launch whose x image the pre-pass wrote, read in place (XG).
int launch_direct(const GemvArgs& a, bool swiglu, bool pair, int ctas, int warps, size_t smem, int max_smem,
                  cudaStream_t stream) {
    return pair     ? launch_nx<1, true, true, true, true>(a, ctas, warps, smem, max_smem, stream)
           : swiglu ? launch_nx<1, true, true, false, true>(a, ctas, warps, smem, max_smem, stream)
                    : launch_nx<1, false, true, false, true>(a, ctas, warps, smem, max_smem, stream);
}

template <bool SWIGLU, bool XQ>
int launch_any(int nx, const GemvArgs& a, int ctas, int warps, size_t smem, int max_smem, cudaStream_t stream) {
    switch (nx) {
        case 1: return launch_nx<1, SWIGLU, XQ>(a, ctas, warps, smem, max_smem, stream);
        case 2: return launch_nx<2, SWIGLU, XQ>(a, ctas, warps, smem, max_smem, stream);
        case 3: return launch_nx<3, SWIGLU, XQ>(a, ctas, warps, smem, max_smem, stream);
        case 4: return launch_nx<4, SWIGLU, XQ>(a, ctas, warps, smem, max_smem, stream);
        case 5: return launch_nx<5, SWIGLU, XQ>(a, ctas, warps, smem, max_smem, stream);
        case 6: return launch_nx<6, SWIGLU, XQ>(a, ctas, warps, smem, max_smem, stream);
        case 7: return launch_nx<7, SWIGLU, XQ>(a, ctas, warps, smem, max_smem, stream);
        case 8: return launch_nx<8, SWIGLU, XQ>(a, ctas, warps, smem, max_smem, stream);
        default: return FD_E_ARG;
    }
}

// The GEMV's part of the launch tuning (flashd_tuning.h: int8 activations, step buffer bytes, rounds), read
// per launch so fd_tuning_set applies to the next one.
struct GemvTuning {
    bool int8_x;
    int stage_bytes;
    int rounds;
    int mma_rows;   // passes of at least this many x rows run gemv_mma.cuh's kernel (0: never)
    int rows;       // > 0: calls of the formats in rows_formats run gemv_rows.cuh, chunks of `rows` super-blocks
    int rows_fuse_nx;   // gemv_rows calls of <= this many x rows quantize x in the GEMV kernel (no pre-pass launch)
    int rows_tma;       // > 0: gemv_rows calls stage weights by bulk copies (sm_90), this many tiles in flight ahead
    int rows_formats;   // the formats gemv_rows runs, bit ROWS_Q4K .. ROWS_Q50 (flashd_tuning.h gemv_rows_formats)
    bool rows_dp4a;     // one-row Q4_K / Q6_K gemv_rows launches on dp4a lanes (flashd_tuning.h gemv_rows_dp4a)
    int rows_tma_split; // one-tile bulk-copy CTAs copy their tile in pieces of this many chunks (gemv_rows_tma_split)
    int rows_stage_x;   // bulk-copy launches of 2 .. 8 x rows copy the pre-pass's codes in up to this many bytes
                        // (gemv_rows_stage_x)
    int rows_tma_warps; // bulk-copy launches of <= 8 x rows compute on at most this many warps (gemv_rows_tma_warps)
    bool evict_first;   // weights with the L2 evict-first hint
    int xq_prepass_cols;        // int8 one-row-kernel launches of at least this many columns take the x pre-pass (0: never)
    int xq_prepass_norm_cols;   // the same for launches with a fused RMSNorm
    int swiglu_stage_bytes;     // fd_gemv_swiglu's step bytes
    bool swiglu_pair;           // one-row int8 SwiGLU launches of one format: gate and up in one dot loop
    bool xq_direct;             // one-row launches with the pre-pass read x's image in place (no shared-memory copy)
    int split_cols;             // one-matrix int8 launches of at least this many columns (lpr 32): a warp pair a row
};

GemvTuning tuning() {
    const fd_tuning_t t = tuning_now();
    return GemvTuning{t.gemv_int8_x != 0, t.gemv_stage_bytes, t.gemv_rounds, FD_HAS_MMA ? t.gemv_mma_rows : 0,
                      FD_HAS_MMA ? t.gemv_rows : 0, t.gemv_rows_fuse_nx, FD_HAS_MMA ? t.gemv_rows_tma : 0,
                      t.gemv_rows_formats, FD_HAS_MMA && t.gemv_rows_dp4a != 0, t.gemv_rows_tma_split,
                      t.gemv_rows_stage_x, t.gemv_rows_tma_warps,
                      t.weights_evict_first != 0,
                      t.gemv_xq_prepass_cols, t.gemv_xq_prepass_norm_cols,
                      t.gemv_swiglu_stage_bytes > 0 ? t.gemv_swiglu_stage_bytes : t.gemv_stage_bytes,
                      t.gemv_swiglu_pair != 0, t.gemv_xq_direct != 0, FD_HAS_MMA ? t.gemv_split_cols : 0};
}

// ---- the tensor-core path (gemv_mma.cuh): passes of 2..8 x rows, the same bits as gemv_kernel ----------------
// Whether the launch's matrices can take it (int8 activations, every format with 16- or 32-column parts).
bool mma_eligible(const GemvPlan& pl, bool swiglu) {
    if (!pl.xq) return false;
    // SwiGLU: gate and up share a unit's blocks, so one format for both (else the one-row kernel)
    if (swiglu && pl.a.mat[0].qtype != pl.a.mat[1].qtype) return false;
    for (int k = 0; k < pl.a.n_mats; ++k)
        if (!mma_format(pl.a.mat[k].qtype) || pl.a.mat[k].lpr > 32 || pl.a.mat[k].split_pieces) return false;
    return true;
}

// Shared memory of one tensor-core pass besides the staged x: stage buffers (16 rows x the largest block, x 2
// matrices for SwiGLU) and one tile's chains (max lpr x 32 lanes x 4 floats, x 2 for SwiGLU).
struct MmaSizes { int row_stride, buf_bytes, part_tile_floats, part_tile_bytes; };

MmaSizes mma_sizes(const GemvPlan& pl, bool swiglu) {
    int max_bb = 0, max_lpr = 4;
    for (int k = 0; k < pl.a.n_mats; ++k) {
        FmtInfo f;
        fmt_info(pl.a.mat[k].qtype, &f);
        max_bb = max(max_bb, f.block_bytes);
        max_lpr = max(max_lpr, pl.a.mat[k].lpr);
    }
    MmaSizes z;
    z.row_stride = (int)stage_range_bytes(max_bb);
    z.buf_bytes = MMA_TILE_ROWS * z.row_stride * (swiglu ? 2 : 1);
    z.part_tile_floats = max_lpr * 32 * 4;
    z.part_tile_bytes = z.part_tile_floats * 4 * (swiglu ? 2 : 1);
    return z;
}
constexpr int MMA_MIN_WARPS = 4;

// x rows of a tensor-core pass: the most (<= n_x, <= MMA_NX) whose staging leaves room for MMA_MIN_WARPS warps'
// buffers and one tile's chains; 0 if not even 2 fit.
int mma_pass_rows(const GemvPlan& pl, const MmaSizes& z, int n_x, int max_smem) {
    for (int nx = min(n_x, MMA_NX); nx >= 2; --nx) {
        GemvArgs p = pl.a;
        const int64_t off = gemv_layout(pl, nx, &p);
        if (off + 2 * MMA_MIN_WARPS * (int64_t)z.buf_bytes + z.part_tile_bytes <= max_smem) return nx;
    }
    return 0;
}

#if FD_HAS_MMA
// One pass (p: the plan's arguments with this pass's x rows laid out) on gemv_mma_kernel.
int mma_launch(const GemvPlan& pl, const GemvArgs& p, bool swiglu, const MmaSizes& z, const DeviceFacts& dev,
               cudaStream_t stream) {
    MmaArgs m{};
    m.a = p;
    int slots = 0;
    for (int k = 0; k < MAX_MATS; ++k) {
        m.tile_first[k] = 0x7fffffff;   // SwiGLU's up matrix and unused slots own no tiles
        if (k >= p.n_mats) continue;
        FmtInfo f;
        fmt_info(p.mat[k].qtype, &f);
        m.lpb[k] = f.lanes_per_block;
        m.nblk[k] = p.cols / f.block_elems;
        m.bb[k] = f.block_bytes;
        if (!swiglu || k == 0) {
            m.tile_first[k] = slots;
            slots += ceil_div(p.mat[k].rows, MMA_TILE_ROWS);
        }
    }
    m.n_tiles = slots;
    m.row_stride = z.row_stride;
    m.buf_bytes = z.buf_bytes;
    m.part_tile_floats = z.part_tile_floats;
    const int ctas = min(slots, dev.n_sms);
    const int64_t avail = (int64_t)dev.max_smem - p.stage_off_bytes;
    const int warps = (int)std::min<int64_t>(MMA_MAX_WARPS, (avail - z.part_tile_bytes) / (2 * (int64_t)z.buf_bytes));
    if (warps < 1) return FD_E_SHAPE;
    const int per_cta = ceil_div(slots, ctas);
    const int64_t room = avail - (int64_t)warps * 2 * z.buf_bytes;
    m.round_tiles = (int)std::max<int64_t>(1, std::min<int64_t>(per_cta, room / z.part_tile_bytes));
    m.part_off_bytes = p.stage_off_bytes + warps * 2 * z.buf_bytes;
    const size_t smem = (size_t)m.part_off_bytes + (size_t)m.round_tiles * z.part_tile_bytes;
    const int st = swiglu ? raise_smem_once<gemv_mma_kernel<true>>(dev.max_smem)
                          : raise_smem_once<gemv_mma_kernel<false>>(dev.max_smem);
    if (st) return st;
    return swiglu ? launch_pdl(gemv_mma_kernel<true>, dim3(ctas), dim3(warps * 32), smem, stream, m)
                  : launch_pdl(gemv_mma_kernel<false>, dim3(ctas), dim3(warps * 32), smem, stream, m);
}
#else   // no int8 tensor cores (HIP): tuning() keeps mma_rows at 0, so this is never called
int mma_launch(const GemvPlan&, const GemvArgs&, bool, const MmaSizes&, const DeviceFacts&, cudaStream_t) {
    return FD_E_SHAPE;
}
#endif

// The whole launch: validation, planning, passes over x rows.
// given: x's codes (fd_gemv_xq), read where the call runs on gemv_rows; every other path quantizes x itself.
int gemv_run(int n_mats, const MatIn* mats, bool swiglu, int cols, const float* x, int n_x, const float* norm_w,
             float eps, const float* residual, cudaStream_t stream, const RowsX* given = nullptr) {
    DeviceFacts dev;
    if (int st = device_facts(&dev)) return st;
    const GemvTuning tn = tuning();
#if FD_HAS_MMA
    if (rows_eligible(tn.rows, tn.rows_formats, dev.cc_major, n_mats, mats, cols))
        return gemv_rows_run(n_mats, mats, swiglu, cols, x, n_x, norm_w, eps, residual,
                             RowsTuning{tn.rows, tn.rows_fuse_nx, tn.rows_tma, tn.rows_tma_split, tn.rows_stage_x,
                                        tn.rows_dp4a, tn.evict_first, tn.rows_tma_warps},
                             dev, stream, given);
#endif
    GemvPlan pl;
    if (int st = gemv_plan(n_mats, mats, swiglu, cols, x, norm_w, eps, n_x, tn.int8_x,
                           swiglu ? tn.swiglu_stage_bytes : tn.stage_bytes,
                           2 * dev.n_sms, &pl, tn.split_cols))
        return st;
    pl.a.evict_first = tn.evict_first ? 1 : 0;
    const GemvArgs& a = pl.a;
    const int steps = a.n_steps;
    const int64_t min_stages = 2 * (int64_t)a.stage_bytes;
    const int64_t room = (int64_t)dev.max_smem - scratch_bytes_for(n_x) - 16 - min_stages;
    if (room < pl.per_x_row_bytes) return FD_E_SHAPE;
    // x rows per pass: as many as fit while leaving room for 4 warps' stages (at least 1 row)
    int64_t nx_fit = (room - 3 * min_stages) / pl.per_x_row_bytes;
    if (nx_fit < 1) nx_fit = 1;
    int nx_pass = (int)(nx_fit < n_x ? nx_fit : n_x);
    // Several x rows: the tensor-core kernel (same bits), in passes of as many rows as its shared memory holds.
    const bool mma = tn.mma_rows >= 2 && n_x >= tn.mma_rows && mma_eligible(pl, swiglu);
    const MmaSizes z = mma ? mma_sizes(pl, swiglu) : MmaSizes{};
    const int mma_nx = mma ? mma_pass_rows(pl, z, n_x, dev.max_smem) : 0;
    const bool mma_passes = mma && mma_nx >= tn.mma_rows;   // (mma_nx is 0 when mma is off)
    if (mma_passes) nx_pass = mma_nx;

    for (int i0 = 0; i0 < n_x; i0 += nx_pass) {
        const int nx = min(nx_pass, n_x - i0);
        GemvArgs p = a;
        p.x = x + (int64_t)i0 * cols;
        p.residual = residual ? residual + (int64_t)i0 * a.mat[0].rows : nullptr;
        for (int k = 0; k < n_mats; ++k) p.mat[k].y = a.mat[k].y + (int64_t)i0 * a.mat[k].rows;
        gemv_layout(pl, nx, &p);
        if (mma_passes && nx >= tn.mma_rows) {   // a last pass of fewer rows takes the one-row kernel (same bits)
            if (int st = mma_launch(pl, p, swiglu, z, dev, stream)) return st;
            continue;
        }
        GemvLaunchShape shape;
        const bool split = a.mat[0].split_pieces != 0;   // a warp pair a row: the shape of 2 x steps warp-steps
        if (int st = gemv_launch_shape(split ? 2 * steps : steps, a.stage_bytes, p.stage_off_bytes, dev.max_smem,
                                       dev.n_sms, max_warps_for(nx, swiglu), tn.rounds, nx, &shape))
            return st;
        if (split)
            if (int st = gemv_split_shape(a.stage_bytes, p.stage_off_bytes, dev.max_smem, max_warps_for(nx, swiglu),
                                          &shape))
                return st;
        const int ctas = shape.ctas, w = shape.warps;
        p.n_bufs = shape.n_bufs;
        const size_t smem = (size_t)p.stage_off_bytes + (size_t)w * p.n_bufs * a.stage_bytes;
        const bool xq = pl.xq;
        p.ximg = nullptr;
        const int prepass_cols = norm_w ? tn.xq_prepass_norm_cols : tn.xq_prepass_cols;
        if (xq && prepass_cols > 0 && cols >= prepass_cols) {
            uint8_t* img = nullptr;
            if (int st = xq_image_scratch(stream, dev.max_smem, &img)) return st;
            if (int st = xq_image_any(nx, p, img, dev.n_sms, stream)) return st;
            p.ximg = img;
        }
        const bool pair = swiglu && xq && nx == 1 && tn.swiglu_pair && a.mat[0].qtype == a.mat[1].qtype;
        const bool direct = p.ximg != nullptr && nx == 1 && tn.xq_direct;
        const int st = split ? launch_split(nx, direct, p, ctas, w, smem, dev.max_smem, stream)
                     : direct ? launch_direct(p, swiglu, pair, ctas, w, smem, dev.max_smem, stream)
                     : pair ? launch_nx<1, true, true, true>(p, ctas, w, smem, dev.max_smem, stream)
                     : swiglu ? (xq ? launch_any<true, true>(nx, p, ctas, w, smem, dev.max_smem, stream)
                                    : launch_any<true, false>(nx, p, ctas, w, smem, dev.max_smem, stream))
                              : (xq ? launch_any<false, true>(nx, p, ctas, w, smem, dev.max_smem, stream)
                                    : launch_any<false, false>(nx, p, ctas, w, smem, dev.max_smem, stream));
        if (st) return st;
    }
    return 0;
}

}  // namespace
}  // namespace fd

extern "C" {

int fd_gemv(float* y, const void* w, int qtype, int rows, int cols, const float* x, int n_x, const float* norm_w,
            float eps, const float* bias, const float* residual, void* stream) {
    const fd::MatIn m{w, y, bias, qtype, rows};
    return fd::gemv_run(1, &m, false, cols, x, n_x, norm_w, eps, residual, (cudaStream_t)stream);
}

int fd_gemv_xq(float* y, const void* w, int qtype, int rows, int cols, const float* x, const int8_t* xq,
               const float* xsc, int n_x, const float* bias, const float* residual, void* stream) {
    FD_CHECK_ARG(xq != nullptr && xsc != nullptr && ((uintptr_t)xq & 15u) == 0 && n_x >= 1 && n_x <= fd::XCODES_ROWS);
    const fd::MatIn m{w, y, bias, qtype, rows};
#if FD_HAS_MMA
    const fd::RowsX given{xq, xsc, cols, fd::ROWS_NX - 1, 0};
    return fd::gemv_run(1, &m, false, cols, x, n_x, nullptr, 0.0f, residual, (cudaStream_t)stream, &given);
#else   // no gemv_rows here: fd_gemv on x
    return fd::gemv_run(1, &m, false, cols, x, n_x, nullptr, 0.0f, residual, (cudaStream_t)stream);
#endif
}

int fd_gemv_multi(int n_mats, float* const* y, const void* const* w, const int* qtype, const int* rows,
                  const float* const* bias, int cols, const float* x, int n_x, const float* norm_w, float eps,
                  void* stream) {
    FD_CHECK_ARG(n_mats >= 1 && n_mats <= fd::MAX_MATS && y && w && qtype && rows);
    fd::MatIn m[fd::MAX_MATS];
    for (int k = 0; k < n_mats; ++k) m[k] = fd::MatIn{w[k], y[k], bias ? bias[k] : nullptr, qtype[k], rows[k]};
    return fd::gemv_run(n_mats, m, false, cols, x, n_x, norm_w, eps, nullptr, (cudaStream_t)stream);
}

int fd_gemv_swiglu(float* y, const void* w_gate, int qtype_gate, const void* w_up, int qtype_up, int rows, int cols,
                   const float* x, int n_x, const float* norm_w, float eps, void* stream) {
    const fd::MatIn m[2] = {fd::MatIn{w_gate, y, nullptr, qtype_gate, rows}, fd::MatIn{w_up, y, nullptr, qtype_up, rows}};
    return fd::gemv_run(2, m, true, cols, x, n_x, norm_w, eps, nullptr, (cudaStream_t)stream);
}

}  // extern "C"
