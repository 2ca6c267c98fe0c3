// gemv.cu -- decode projections: y = W xn for GGUF-quantized W (rows, cols) and n_x <= 8 activation
// rows, with an optional fused RMSNorm prologue, bias and residual epilogue; up to 4 matrices sharing
// one input in one launch (fd_gemv_multi); the SwiGLU pair silu(Wg xn) * (Wu xn) (fd_gemv_swiglu).
//
// Layouts: x (n_x, cols) f32, norm_w (cols,), y / residual (n_x, rows) f32, W as stored (quant.cuh).
//
// Design (decode is bandwidth-bound: every weight byte is read once, at full width, with many bytes
// in flight; the arithmetic per weight is ~4 instructions so compute hides under the loads):
//   * Grid: at most one CTA per SM (the staged activations are copied once per SM), W warps each
//     (W <= 32 for n_x = 1, whose kernels fit 64 registers; <= 16 otherwise, 12 for the n_x = 8
//     swiglu). Warps are independent: a "step" is G consecutive rows of one matrix; warp k of the
//     grid takes steps k, k + n_warps, ... When the grid can hold one warp per step (all projections of the 1.5B
//     model but lm_head), every warp gets exactly one step and stages it single-buffered: all weight
//     loads are in flight at once and there is no tail. Otherwise warps are persistent and
//     double-buffered, W chosen so that every warp runs the same number of rounds (+-1 step).
//   * Prologue (per CTA): x rows -> xn = x * rsqrt(mean(x^2) + eps) * norm_w (if norm_w) staged in
//     shared memory as float, in each activation layout the matrices' formats read (quant.cuh:
//     XL_PLAIN / XL_S32 / XL_PAD64, chosen so the float4 reads of a quarter-warp hit distinct bank
//     quads), plus per-32-column sums of xn when a format has mins (Q4_K, Q5_K: w = a*q + b, so
//     sum w x = a sum q x + b sum x). The first step's weight copy is issued before the prologue.
//   * Weight streaming: each warp copies its steps into its shared-memory buffer(s) with 16-byte
//     cp.async (warp_stage: every format, also the 2-byte-aligned ones, is fetched with aligned
//     16-byte loads, perfectly coalesced); double-buffered, step s + n_warps is in flight while
//     step s is computed.
//   * Compute: LPR lanes per row (LPR in {4,8,16,32}, chosen per matrix for lane efficiency, G =
//     32 / LPR rows per step). Lane t of a row takes pieces t, t + LPR, ... (quant.cuh: a piece is
//     the lane's share of one block); per run of 4 columns it reads one float4 of xn per x row,
//     shared (broadcast) by the G rows of the warp, so each weight is decoded once and used for
//     all n_x rows. Float accumulation; the LPR lanes combine with xor-shuffles.
//   * Epilogue: lane 0 of each row group writes y[i, r] = acc (+ bias[r]) (+ residual[i, r]) -- read
//     then written by the same thread, so y may alias residual (but not x).
//   * n_x * cols too large for shared memory: the launcher splits the x rows into passes (each pass
//     rereads W); e.g. cols 8960 holds 4 rows per pass.
//
// Numerics: codes and scales are exact (quant.cuh); sum q x accumulates in float32 per part, then
// acc += a * part (+ b * xsum). Error vs the float64 oracle ~ 1e-6 * sum |W||xn| for cols <= 9000.
//
// Shared memory: up to the device's opt-in maximum, raised with cudaFuncSetAttribute on the first
// launch of each kernel instantiation (host-side, no stream work: allowed also during capture).
// The device's SM count and shared-memory limit are read once per device and cached.
#include "quant.cuh"

#include <algorithm>
#include <mutex>

namespace fd {
namespace {

using namespace fd::q;

constexpr int MAX_MATS = 4;
constexpr int MAX_NX = 8;
// warps per CTA: n_x = 1 kernels fit 64 registers per thread, so an SM holds 32 warps of them;
// the others take up to 128 registers (16 warps), swiglu with 8 rows up to 168 (12 warps)
__host__ __device__ constexpr int max_warps_for(int nx, bool swiglu) { return nx == 1 ? 32 : (swiglu && nx >= 8) ? 12 : 16; }
constexpr int STAGE_TARGET_BYTES = 6 * 1024;  // a step's staged bytes: 16 warps x 2 buffers fit with x
constexpr int SCRATCH_BYTES = 128;            // block_sum scratch at the start of shared memory

struct GemvMat {
    const uint8_t* w;
    float* y;                 // (n_x, rows)
    const float* bias;        // (rows,) or NULL
    int64_t row_bytes;
    int qtype, rows;
    int lpr;                  // lanes per row; G = 32 / lpr rows per step
    int pieces;               // pieces per row
    int first_step;           // steps of earlier matrices
};

struct GemvArgs {
    GemvMat mat[MAX_MATS];    // swiglu: mat[0] = gate (y), mat[1] = up
    int n_mats, n_steps;
    const float* x;           // (n_x, cols) of this pass
    const float* norm_w;      // (cols,) or NULL
    const float* residual;    // (n_x, rows) of mat[0] or NULL
    float eps;
    int cols, n_x;
    int x_off[XL_COUNT];      // float offset of each layout's staged rows in shared memory, -1 if unused
    int x_row[XL_COUNT];      // floats per staged row in that layout
    int xsum_off, xsum_row;   // per-32-column sums (n_x rows of xsum_row floats), -1 if unused
    int stage_off;            // byte offset of the warp stage buffers (16-aligned)
    int stage_bytes;          // one buffer; a warp owns n_bufs
    int n_bufs;               // 2: double-buffered steps; 1: every warp has a single step
    int range_bytes;          // swiglu: the up rows start range_bytes into a buffer
};

// The matrix that step s belongs to (static indices only: no local-memory copy of the params).
__device__ __forceinline__ GemvMat mat_of_step(const GemvArgs& a, int s) {
    GemvMat m = a.mat[0];
#pragma unroll
    for (int k = 1; k < MAX_MATS; ++k)
        if (k < a.n_mats && s >= a.mat[k].first_step) m = a.mat[k];
    return m;
}

// ---- prologue: stage xn in shared memory ---------------------------------------------------------------
template <int NX>
__device__ void stage_x(const GemvArgs& a, float* smf) {
    const int tid = threadIdx.x, n_threads = blockDim.x;
    const int cols = a.cols, n_x = a.n_x;
    float scale[NX];
#pragma unroll
    for (int i = 0; i < NX; ++i) scale[i] = 1.0f;
    if (a.norm_w) {
        float ss[NX];
#pragma unroll
        for (int i = 0; i < NX; ++i) ss[i] = 0.0f;
        for (int c = tid; c < cols; c += n_threads) {
#pragma unroll
            for (int i = 0; i < NX; ++i)
                if (i < n_x) { const float v = a.x[(int64_t)i * cols + c]; ss[i] = fmaf(v, v, ss[i]); }
        }
#pragma unroll
        for (int i = 0; i < NX; ++i) {
            const float total = block_sum(ss[i], smf);
            scale[i] = rsqrtf(total / (float)cols + a.eps);
        }
    }
    // c runs over 32-aligned groups per warp (tid's warp base and n_threads are multiples of 32), so a
    // warp's lanes are all in range or all out: the warp sums below are full-warp.
    const int cols_pad = (cols + 63) & ~63;
    for (int c = tid; c < cols_pad; c += n_threads) {
        const bool in = c < cols;
        const float nw = in ? (a.norm_w ? a.norm_w[c] : 1.0f) : 0.0f;
#pragma unroll
        for (int i = 0; i < NX; ++i) {
            if (i >= n_x) break;
            const float v = in ? a.x[(int64_t)i * cols + c] * scale[i] * nw : 0.0f;
#pragma unroll
            for (int L = 0; L < XL_COUNT; ++L)
                if (a.x_off[L] >= 0) smf[a.x_off[L] + i * a.x_row[L] + x_phys(L, c)] = v;
            if (a.xsum_off >= 0) {
                const float s = warp_sum(v);
                if ((tid & 31) == 0 && c < cols) smf[a.xsum_off + i * a.xsum_row + (c >> 5)] = s;
            }
        }
    }
    __syncthreads();
}

// ---- one row's dot products over its pieces -------------------------------------------------------------
// acc[i] += sum over the lane's pieces of dot(W[row, piece cols], xn[i, piece cols])
template <int QT, int NX>
__device__ __forceinline__ void row_dot(const uint8_t* wrow, int t, int lpr, int pieces, int cols,
                                        const float* xs, int x_row, const float* xsum, int xsum_row,
                                        float (&acc)[NX]) {
    using F = Fmt<QT>;
    constexpr int RPP = F::RUNS / F::PARTS;               // runs per part
    constexpr int NACC = (NX == 1 && RPP > 1) ? 2 : 1;   // independent FMA chains when n_x is 1
    const int j = t % F::LPB;                             // the lane's piece within each block
    int blk = t / F::LPB;
    const int blk_step = lpr / F::LPB;                    // LPB divides lpr
    const int parity = blk & 1;                           // constant: blk_step is even where it matters
    const uint8_t* wp = wrow + (int64_t)blk * F::BB;
    const float* xp = xs + F::xblk(blk) + F::xlane(j, parity);
    const int x_step = F::xblk(blk_step);
    const float* sp = xsum;
    if constexpr (F::HAS_MIN) sp += F::sub(blk, j, 0);

    for (int p = t; p < pieces; p += lpr) {
        typename F::Raw raw;
        F::load(wp, j, raw);
        if constexpr (F::IS_FLOAT) F::mask(raw, cols - blk * F::BE);
        float pa[F::PARTS], pb[F::PARTS];
        F::params(raw, j, pa, pb);
#pragma unroll
        for (int part = 0; part < F::PARTS; ++part) {
            float dot[NX][NACC];
#pragma unroll
            for (int i = 0; i < NX; ++i)
#pragma unroll
                for (int u = 0; u < NACC; ++u) dot[i][u] = 0.0f;
#pragma unroll
            for (int rr = 0; rr < RPP; ++rr) {
                const int run = part * RPP + rr;
                float qv[4];
                F::codes(raw, j, run, qv);
                const int xo = F::xrun(j, parity, run);
#pragma unroll
                for (int i = 0; i < NX; ++i) {
                    const float4 xv = *reinterpret_cast<const float4*>(xp + i * x_row + xo);
                    float d = dot[i][rr % NACC];
                    d = fmaf(qv[0], xv.x, d);
                    d = fmaf(qv[1], xv.y, d);
                    d = fmaf(qv[2], xv.z, d);
                    d = fmaf(qv[3], xv.w, d);
                    dot[i][rr % NACC] = d;
                }
            }
#pragma unroll
            for (int i = 0; i < NX; ++i) {
                float d = dot[i][0];
#pragma unroll
                for (int u = 1; u < NACC; ++u) d += dot[i][u];
                acc[i] = fmaf(pa[part], d, acc[i]);
                if constexpr (F::HAS_MIN) acc[i] = fmaf(pb[part], sp[i * xsum_row + part], acc[i]);
            }
        }
        blk += blk_step;
        wp += (int64_t)blk_step * F::BB;
        xp += x_step;
        if constexpr (F::HAS_MIN) sp += 8 * blk_step;
    }
}

// Activation views for one CTA (values copied out of the kernel parameters with static indices: taking
// the address of a kernel parameter would copy the whole struct to local memory).
struct XViews {
    const float* xs[XL_COUNT];
    int x_row[XL_COUNT];
    const float* xsum;
    int xsum_row;
};

__device__ __forceinline__ XViews x_views(const GemvArgs& a, const float* smf) {
    XViews v;
#pragma unroll
    for (int L = 0; L < XL_COUNT; ++L) {
        v.xs[L] = smf + (a.x_off[L] >= 0 ? a.x_off[L] : 0);
        v.x_row[L] = a.x_row[L];
    }
    v.xsum = smf + (a.xsum_off >= 0 ? a.xsum_off : 0);
    v.xsum_row = a.xsum_row;
    return v;
}

template <int NX>
struct RowDot {   // row_dot for the qtype chosen at run time (quant.cuh dispatch_qtype)
    const uint8_t* wrow;
    int t, lpr, pieces, cols;
    const XViews* xv;
    float (*acc)[NX];
    template <int QT>
    __device__ __forceinline__ void run() {
        constexpr int L = Fmt<QT>::XL;
        row_dot<QT, NX>(wrow, t, lpr, pieces, cols, xv->xs[L], xv->x_row[L], xv->xsum, xv->xsum_row, *acc);
    }
};

// ---- staging and computing one step ----------------------------------------------------------------------
template <bool SWIGLU>
__device__ __forceinline__ void issue_step(const GemvArgs& a, int s, uint8_t* buf, int lane) {
    const GemvMat m = SWIGLU ? a.mat[0] : mat_of_step(a, s);
    const int G = 32 / m.lpr;
    const int r0 = (s - m.first_step) * G;
    const int n_rows = min(G, m.rows - r0);
    warp_stage(buf, m.w + r0 * m.row_bytes, n_rows * m.row_bytes, lane);
    if (SWIGLU) {
        const GemvMat u = a.mat[1];
        warp_stage(buf + a.range_bytes, u.w + r0 * u.row_bytes, n_rows * u.row_bytes, lane);
    }
}

template <int NX>
__device__ __forceinline__ void reduce_lanes(float (&acc)[NX], int lpr) {
#pragma unroll
    for (int i = 0; i < NX; ++i)
        for (int off = lpr >> 1; off > 0; off >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], off);
}

template <int NX, bool SWIGLU>
__device__ __forceinline__ void compute_step(const GemvArgs& a, int s, const uint8_t* buf, const XViews& xv, int lane) {
    const GemvMat m = SWIGLU ? a.mat[0] : mat_of_step(a, s);
    const int lpr = m.lpr, G = 32 / lpr;
    const int g = lane / lpr, t = lane % lpr;
    const int r0 = (s - m.first_step) * G;
    const int row = r0 + g;
    const bool valid = row < m.rows;

    float acc[NX];
#pragma unroll
    for (int i = 0; i < NX; ++i) acc[i] = 0.0f;
    if (valid) {
        const uint8_t* src = m.w + r0 * m.row_bytes;
        const uint8_t* wrow = buf + (reinterpret_cast<uintptr_t>(src) & 15) + g * m.row_bytes;
        RowDot<NX> fn{wrow, t, lpr, m.pieces, a.cols, &xv, &acc};
        dispatch_qtype(m.qtype, fn);
    }
    reduce_lanes(acc, lpr);

    if (SWIGLU) {
        const GemvMat u = a.mat[1];
        float acc_u[NX];
#pragma unroll
        for (int i = 0; i < NX; ++i) acc_u[i] = 0.0f;
        if (valid) {
            const uint8_t* src = u.w + r0 * u.row_bytes;
            const uint8_t* wrow = buf + a.range_bytes + (reinterpret_cast<uintptr_t>(src) & 15) + g * u.row_bytes;
            RowDot<NX> fn{wrow, t, lpr, u.pieces, a.cols, &xv, &acc_u};
            dispatch_qtype(u.qtype, fn);
        }
        reduce_lanes(acc_u, lpr);
        if (valid && t == 0) {
#pragma unroll
            for (int i = 0; i < NX; ++i)
                if (i < a.n_x) m.y[(int64_t)i * m.rows + row] = silu(acc[i]) * acc_u[i];
        }
    } else if (valid && t == 0) {
        const float b = m.bias ? m.bias[row] : 0.0f;
#pragma unroll
        for (int i = 0; i < NX; ++i) {
            if (i < a.n_x) {
                const int64_t o = (int64_t)i * m.rows + row;
                float v = acc[i] + b;
                if (a.residual) v += a.residual[o];   // read then written by this thread: y may alias it
                m.y[o] = v;
            }
        }
    }
}

template <int NX, bool SWIGLU>
__global__ void __launch_bounds__(max_warps_for(NX, SWIGLU) * 32, 1) gemv_kernel(const GemvArgs a) {
    extern __shared__ __align__(16) uint8_t smem[];
    float* smf = reinterpret_cast<float*>(smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int stride = gridDim.x * n_warps;
    const int s0 = blockIdx.x * n_warps + warp;
    uint8_t* stage = smem + a.stage_off + (size_t)warp * a.n_bufs * a.stage_bytes;

    if (s0 < a.n_steps) issue_step<SWIGLU>(a, s0, stage, lane);   // in flight during the prologue
    cp_async_commit();
    stage_x<NX>(a, smf);

    const XViews xv = x_views(a, smf);
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
        compute_step<NX, SWIGLU>(a, s, stage + cur * a.stage_bytes, xv, lane);
        __syncwarp();             // the buffer is refilled by a later issue
    }
    cp_async_wait<0>();
}

// ---- host side: device facts, planning, launch -------------------------------------------------------
struct DeviceFacts { int n_sms = 0, max_smem = 0; };

int device_facts(DeviceFacts* out) {
    static std::mutex mu;
    static DeviceFacts cache[64];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return (int)err;
    if (dev < 0 || dev >= 64) return FD_E_ARG;
    std::lock_guard<std::mutex> lock(mu);
    if (cache[dev].n_sms == 0) {
        int n_sms = 0, max_smem = 0;
        err = cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, dev);
        if (err == cudaSuccess) err = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        if (err != cudaSuccess) return (int)err;
        cache[dev].n_sms = n_sms;
        cache[dev].max_smem = max_smem;
    }
    *out = cache[dev];
    return 0;
}

template <int NX, bool SWIGLU>
int raise_smem_limit(int max_smem) {
    static std::once_flag once;
    static cudaError_t err = cudaSuccess;
    std::call_once(once, [&] {
        err = cudaFuncSetAttribute(gemv_kernel<NX, SWIGLU>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem);
    });
    return (int)err;
}

template <int NX, bool SWIGLU>
int launch_nx(const GemvArgs& a, int ctas, int warps, size_t smem, int max_smem, cudaStream_t stream) {
    const int st = raise_smem_limit<NX, SWIGLU>(max_smem);
    if (st) return st;
    gemv_kernel<NX, SWIGLU><<<ctas, warps * 32, smem, stream>>>(a);
    return FD_LAUNCH_STATUS();
}

template <bool SWIGLU>
int launch_any(int nx, const GemvArgs& a, int ctas, int warps, size_t smem, int max_smem, cudaStream_t stream) {
    switch (nx) {
        case 1: return launch_nx<1, SWIGLU>(a, ctas, warps, smem, max_smem, stream);
        case 2: return launch_nx<2, SWIGLU>(a, ctas, warps, smem, max_smem, stream);
        case 3: return launch_nx<3, SWIGLU>(a, ctas, warps, smem, max_smem, stream);
        case 4: return launch_nx<4, SWIGLU>(a, ctas, warps, smem, max_smem, stream);
        case 5: return launch_nx<5, SWIGLU>(a, ctas, warps, smem, max_smem, stream);
        case 6: return launch_nx<6, SWIGLU>(a, ctas, warps, smem, max_smem, stream);
        case 7: return launch_nx<7, SWIGLU>(a, ctas, warps, smem, max_smem, stream);
        case 8: return launch_nx<8, SWIGLU>(a, ctas, warps, smem, max_smem, stream);
        default: return FD_E_ARG;
    }
}

struct MatIn { const void* w; float* y; const float* bias; int qtype, rows; };

int pieces_per_row(const FmtInfo& f, int cols) {
    return f.is_float ? ceil_div(cols, f.block_elems) : cols / f.block_elems * f.lanes_per_block;
}

// Lanes per row: among 4, 8, 16, 32 (>= lanes per block; S32 layouts need an even block step),
// keep those whose step fits STAGE_TARGET_BYTES (else the largest); prefer enough steps to give
// every SM two warps, then the highest lane efficiency, then the smallest (more rows share xn).
int choose_lpr(const FmtInfo& f, int rows, int cols, int64_t rb, int n_ranges, int n_sms) {
    const int pieces = pieces_per_row(f, cols);
    int best = 32;
    double best_score = -1.0;
    for (int lpr = 4; lpr <= 32; lpr *= 2) {
        if (lpr < f.lanes_per_block) continue;
        if (f.layout == XL_S32 && lpr < 2 * f.lanes_per_block) continue;
        const int G = 32 / lpr;
        if ((int64_t)n_ranges * G * rb > STAGE_TARGET_BYTES && lpr != 32) continue;
        const int iters = ceil_div(pieces, lpr);
        const double eff = (double)pieces / ((double)iters * lpr);
        const bool enough_steps = ceil_div(rows, G) >= 2 * n_sms || G == 1;
        const double score = (enough_steps ? 2.0 : 0.0) + eff - 1e-3 * lpr;
        if (score > best_score) { best_score = score; best = lpr; }
    }
    return best;
}

// The whole launch: validation, planning, passes over x rows.
int gemv_run(int n_mats, const MatIn* mats, bool swiglu, int cols, const float* x, int n_x, const float* norm_w,
             float eps, const float* residual, cudaStream_t stream) {
    FD_CHECK_ARG(n_mats >= 1 && n_mats <= MAX_MATS && x != nullptr && cols >= 1 && n_x >= 1 && n_x <= MAX_NX);
    FD_CHECK_ARG(eps >= 0.0f);
    FmtInfo info[MAX_MATS];
    for (int k = 0; k < n_mats; ++k) {
        FD_CHECK_ARG(mats[k].w != nullptr && mats[k].y != nullptr && mats[k].rows >= 1);
        if (!fmt_info(mats[k].qtype, &info[k])) return FD_E_QTYPE;
        if (!info[k].is_float && cols % info[k].block_elems != 0) return FD_E_SHAPE;
        FD_CHECK_ARG(reinterpret_cast<uintptr_t>(mats[k].w) % (uintptr_t)info[k].align == 0);
    }
    DeviceFacts dev;
    if (int st = device_facts(&dev)) return st;

    GemvArgs a{};
    a.n_mats = n_mats;
    a.cols = cols;
    a.eps = eps;
    a.norm_w = norm_w;
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
        m.lpr = choose_lpr(info[k], m.rows, cols, m.row_bytes, n_ranges, dev.n_sms);
    }
    if (swiglu) {   // gate and up share the step geometry: the coarser of their choices
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
    a.n_steps = steps;
    a.range_bytes = (int)range_bytes;
    a.stage_bytes = (int)(range_bytes * n_ranges);

    // shared memory: scratch | x rows per layout | xsum | 16-aligned warp stages
    bool layout_used[XL_COUNT] = {false, false, false};
    bool need_xsum = false;
    for (int k = 0; k < n_mats; ++k) {
        layout_used[info[k].layout] = true;
        need_xsum |= info[k].has_min;
    }
    int x_row_total = 0;
    for (int L = 0; L < XL_COUNT; ++L) {
        a.x_row[L] = x_row_floats(L, cols);
        if (layout_used[L]) x_row_total += a.x_row[L];
    }
    a.xsum_row = need_xsum ? ((cols / 32 + 3) & ~3) : 0;
    const int64_t per_x_row_bytes = 4 * (int64_t)(x_row_total + a.xsum_row);
    const int64_t min_stages = 2 * (int64_t)a.stage_bytes;
    const int64_t room = (int64_t)dev.max_smem - SCRATCH_BYTES - 16 - min_stages;
    if (room < per_x_row_bytes) return FD_E_SHAPE;
    // x rows per pass: as many as fit while leaving room for 4 warps' stages (at least 1 row)
    int64_t nx_fit = (room - 3 * min_stages) / per_x_row_bytes;
    if (nx_fit < 1) nx_fit = 1;
    const int nx_pass = (int)(nx_fit < n_x ? nx_fit : n_x);

    for (int i0 = 0; i0 < n_x; i0 += nx_pass) {
        const int nx = min(nx_pass, n_x - i0);
        GemvArgs p = a;
        p.n_x = nx;
        p.x = x + (int64_t)i0 * cols;
        p.residual = residual ? residual + (int64_t)i0 * a.mat[0].rows : nullptr;
        for (int k = 0; k < n_mats; ++k) p.mat[k].y = a.mat[k].y + (int64_t)i0 * a.mat[k].rows;
        int off = SCRATCH_BYTES / 4;
        for (int L = 0; L < XL_COUNT; ++L) {
            p.x_off[L] = layout_used[L] ? off : -1;
            if (layout_used[L]) off += nx * a.x_row[L];
        }
        p.xsum_off = need_xsum ? off : -1;
        if (need_xsum) off += nx * a.xsum_row;
        p.stage_off = (off * 4 + 15) & ~15;
        // Warps: every warp one step, single-buffered, when the grid can hold them all (small and
        // mid-size matrices: all loads in flight at once, no tail); else persistent double-buffered
        // warps, as many rounds as needed and warps spread so rounds are even.
        const int max_warps = max_warps_for(nx, swiglu);
        const int64_t avail = (int64_t)dev.max_smem - p.stage_off;
        const int64_t fit1 = std::min<int64_t>(avail / a.stage_bytes, max_warps);
        const int64_t fit2 = std::min<int64_t>(avail / (2 * (int64_t)a.stage_bytes), max_warps);
        if (fit1 < 1) return FD_E_SHAPE;
        int warps, ctas;
        if (steps <= (int64_t)dev.n_sms * fit1 || fit2 < 1) {
            p.n_bufs = 1;
            warps = ceil_div(steps, dev.n_sms);
            if (warps > fit1) warps = (int)fit1;
        } else {
            p.n_bufs = 2;
            const int64_t rounds = (steps + dev.n_sms * fit2 - 1) / (dev.n_sms * fit2);
            warps = (int)((steps + dev.n_sms * rounds - 1) / (dev.n_sms * rounds));
        }
        if (warps < 1) warps = 1;
        ctas = ceil_div(steps, warps);
        if (ctas > dev.n_sms) ctas = dev.n_sms;
        const size_t smem = (size_t)p.stage_off + (size_t)warps * p.n_bufs * a.stage_bytes;
        const int st = swiglu ? launch_any<true>(nx, p, ctas, warps, smem, dev.max_smem, stream)
                              : launch_any<false>(nx, p, ctas, warps, smem, dev.max_smem, stream);
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
