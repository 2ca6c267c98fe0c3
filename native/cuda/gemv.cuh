// gemv.cuh -- the quantized GEMV core shared by gemv.cu (one launch per projection) and forward.cu (the
// persistent forward): y = W xn for GGUF-quantized W (rows, cols) and n_x <= 8 activation rows, with an
// optional fused RMSNorm prologue, bias and residual epilogue; up to 4 matrices sharing one input
// (fd_gemv_multi); the SwiGLU pair silu(Wg xn) * (Wu xn) (fd_gemv_swiglu). Both kernels run these same
// device functions, so a row's result is the same bits whichever kernel computes it (given the same
// lanes per row).
//
// Layouts: x (n_x, cols) f32, norm_w (cols,), y / residual (n_x, rows) f32, W as stored (quant.cuh).
//
// Design (decode is bandwidth-bound: every weight byte is read once, at full width, with many bytes
// in flight; the arithmetic per weight is ~2-3 instructions so compute can hide under the loads):
//   * Grid: at most one CTA per SM (the staged activations are copied once per SM), W warps each
//     (W <= 24 for n_x = 1, whose kernels fit 85 registers; <= 16 otherwise, 12 for the n_x = 8
//     swiglu). Warps are independent: a "step" is G consecutive rows of one matrix; warp w of CTA b
//     takes steps w * n_ctas + b + k * n_warps_total (consecutive steps on different SMs). By default
//     (FLASHD_GEMV_ROUNDS, below) warps are persistent and double-buffered with two or more steps
//     each, W chosen so that every warp runs the same number of rounds (+-1 step); with ROUNDS=0 a
//     grid that can hold one warp per step gives every warp one single-buffered step.
//   * Row invariance: every x row's result is the same bits whatever n_x, the pass split and the
//     CTA shape (per-row arithmetic only; the RMSNorm sums use a fixed partition), which makes
//     speculative verification reproduce one-row decoding exactly.
//   * Prologue (per CTA): x rows -> xn = x * rsqrt(mean(x^2) + eps) * norm_w (if norm_w), staged in
//     shared memory as float xn * 2^80 (quant.cuh scaled_codes) in each activation layout the
//     matrices' formats read (XL_PAD32 / XL_PAD64: float4 reads of a quarter-warp hit distinct bank
//     quads), plus sums of xn over every 16 and 32 columns (zero points and mins: sum w x =
//     a sum code x + (b - a OFFSET) sum x). Loads are batched 8 per thread; CTAs have >= 8 warps
//     to share it. The first step's weight copy is issued before the prologue.
//   * Weight streaming: each warp copies its steps into its shared-memory buffer(s) with 16-byte
//     cp.async (warp_stage: every format, also the 2-byte-aligned ones, is fetched with aligned
//     16-byte loads, perfectly coalesced); double-buffered, step s + n_warps is in flight while
//     step s is computed.
//   * Compute: LPR lanes per row (LPR in {4,8,16,32}, chosen per matrix for lane efficiency, G =
//     32 / LPR rows per step). Lane t of a row takes pieces t, t + LPR, ... (quant.cuh: a piece is
//     the lane's share of one block); per run of 4 columns it reads one float4 of xn per x row
//     (the G rows of a warp read the same addresses, but an LDS.128 is served per quarter-warp, so
//     that is no saving), and each weight is decoded once and used for all n_x rows. Float
//     accumulation; the LPR lanes combine with xor-shuffles.
//   * Epilogue: lane 0 of each row group writes y[i, r] = acc (+ bias[r]) (+ residual[i, r]) -- read
//     then written by the same thread, so y may alias residual (but not x).
//   * n_x * cols too large for shared memory: the launcher splits the x rows into passes (each pass
//     rereads W); e.g. cols 8960 holds 4 rows per pass.
//
// Numerics: codes and scales are exact (quant.cuh); sum code * x accumulates in float32 per part,
// then acc += a * that + (b - a * OFFSET) * sum(x over the part). Error vs
// the float64 oracle ~ 1e-6 * sum |W||xn| for cols <= 9000. |x| must stay below 2^48 (x * 2^80 is
// a float) -- activations are many orders of magnitude smaller.
//
// Activations: launches whose matrices are all quantized stage xn as int8 hi + lo codes per 32-column
// block (XQ kernels, "int8 activations" below: f16-like precision, 2 bytes per column instead of 4 and
// one dp4a per 4 weights instead of 4 FMAs); float formats keep the float32 path described above.
// The kernels use programmatic dependent launch: a warp's first step of weights is fetched before
// pdl_wait(), i.e. while the previous kernel finishes.
//
// Measured (H200, n_x = 1, bench/bench_gemv.py --quick, graph replay; results/2026-11-21-h200-session2-
// decode.md): lm_head 151936x1536 Q4_K 40.9 us (67% of DRAM peak; 58.2 us with float activations),
// 1536x1536 Q4_K 3.1 us, 256x1536 2.9 us, 8960x1536 Q6_K 8.8 us, 1536x8960 Q6_K 13.2 us. The wide,
// few-row ffn_down is the worst: 1536 warps of one row each, every warp loads its row and only then
// computes, so loads and compute do not overlap (persistent double-buffered warps, now the default,
// are 3% faster end to end); next: split long rows across the warps of a CTA.
// Shared memory: up to the device's opt-in maximum, raised with cudaFuncSetAttribute on the first
// launch of each kernel instantiation (host-side, no stream work: allowed also during capture).
#pragma once

#include "quant.cuh"

#include <algorithm>
#include <cstdlib>
#include <mutex>

namespace fd {
namespace {

using namespace fd::q;

constexpr int MAX_MATS = 4;
constexpr int MAX_NX = 8;
// warps per CTA: n_x = 1 kernels fit 85 registers per thread, so an SM holds 24 warps of them;
// the others take up to 128 registers (16 warps), swiglu with 8 rows up to 168 (12 warps)
__host__ __device__ constexpr int max_warps_for(int nx, bool swiglu) { return nx == 1 ? 24 : (swiglu && nx >= 8) ? 12 : 16; }
constexpr int STAGE_TARGET_BYTES = 6 * 1024;  // a step's staged bytes: 16 warps x 2 buffers fit with x
constexpr int NORM_LANES = 256;               // fixed partition of the RMSNorm sums (row invariance)
// norm_scales' partial sums at the start of shared memory: NORM_LANES floats per x row of a pass
__host__ __device__ constexpr int scratch_bytes_for(int nx) { return NORM_LANES * nx * 4; }
constexpr int MIN_CTA_WARPS = 8;              // threads to share the prologue

struct GemvMat {
    const uint8_t* w;
    float* y;                 // (n_x, rows)
    const float* bias;        // (rows,) or NULL
    int64_t row_bytes;
    int qtype, rows;
    int lpr;                  // lanes per row; G = 32 / lpr rows per step
    int pieces;               // pieces per row
    int first_step;           // steps of earlier matrices
    int aligned16;            // float formats: every row 16-byte aligned (LDS.128 loads)
};

struct GemvArgs {
    GemvMat mat[MAX_MATS];    // swiglu: mat[0] = gate (y), mat[1] = up
    int n_mats, n_steps;
    const float* x;           // (n_x, cols) of this pass
    const float* norm_w;      // (cols,) or NULL
    const float* residual;    // (n_x, rows) of mat[0] or NULL
    float eps;
    int cols, n_x;
    int x_off_floats[XL_COUNT];      // float offset of each layout's staged rows (xn * 2^X_SCALE_LOG2), -1 if unused
    int x_row[XL_COUNT];      // floats per staged row in that layout
    int xsum16_off, xsum32_off;   // sums of xn over 16 / 32 consecutive columns (n_x rows each), -1 if unused
    int xsum16_row, xsum32_row;
    int stage_off_bytes;            // byte offset of the warp stage buffers (16-aligned)
    int stage_bytes;          // one buffer; a warp owns n_bufs
    int n_bufs;               // 2: double-buffered steps; 1: every warp has a single step
    int range_bytes;          // swiglu: the up rows start range_bytes into a buffer
    // int8 activations (XQ kernels): byte offset / bytes per row of the codes, float offset / floats
    // per row of the 32-column block scales; xsum16 / xsum32 then hold sums of the quantized values
    int x8_off[XL_COUNT], x8_row[XL_COUNT];   // per activation layout (-1: unused)
    int xsc_off, xsc_row;
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
// Activations are loaded through L2 (ld.global.cg), never the non-coherent path: the persistent forward
// (forward.cu) reads rows that other SMs wrote earlier in the same launch.
__device__ __forceinline__ float load_act(const float* p) { return __ldcg(p); }
__device__ __forceinline__ float4 load_act4(const float4* p) { return __ldcg(p); }
constexpr int X_BATCH = 8;   // x loads in flight per thread in the prologue

// v[u] = row[c0 + u * stride] (0 past n): X_BATCH independent loads in flight per thread.
__device__ __forceinline__ void load_x_batch(const float* row, int c0, int stride, int n, float (&v)[X_BATCH]) {
#pragma unroll
    for (int u = 0; u < X_BATCH; ++u) {
        const int c = c0 + u * stride;
        v[u] = c < n ? load_act(row + c) : 0.0f;
    }
}

// The RMSNorm factor of every x row (1 without norm_w). Row invariance: a row's sum of squares must
// not depend on the CTA size or on how many rows share the launch (speculative verification
// reproduces decoding bit for bit), so it is cut into NORM_LANES fixed partial sums (partial v:
// columns v, v + NORM_LANES, ... in order; a thread takes partials tid, tid + n_threads, ...) that
// warp i % n_warps adds in a fixed order. Loads are issued X_BATCH at a time (latency-bound).
// smf: scratch_bytes_for(n_x) bytes.
template <int NX>
__device__ __forceinline__ void norm_scales(const GemvArgs& a, float* smf, float (&scale)[NX]) {
    const int tid = threadIdx.x, n_threads = blockDim.x, lane = tid & 31, warp = tid >> 5;
    const int cols = a.cols, n_x = a.n_x;
#pragma unroll
    for (int i = 0; i < NX; ++i) scale[i] = 1.0f;
    if (!a.norm_w) return;
    for (int v = tid; v < NORM_LANES; v += n_threads) {
        float ss[NX];
#pragma unroll
        for (int i = 0; i < NX; ++i) ss[i] = 0.0f;
        for (int c0 = v; c0 < cols; c0 += X_BATCH * NORM_LANES) {
#pragma unroll
            for (int i = 0; i < NX; ++i) {
                if (i >= n_x) break;
                float x[X_BATCH];
                load_x_batch(a.x + (int64_t)i * cols, c0, NORM_LANES, cols, x);
#pragma unroll
                for (int u = 0; u < X_BATCH; ++u) ss[i] = fmaf(x[u], x[u], ss[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < NX; ++i)
            if (i < n_x) smf[i * NORM_LANES + v] = ss[i];
    }
    __syncthreads();
    for (int i = warp; i < n_x; i += n_threads >> 5) {
        float t = 0.0f;
#pragma unroll
        for (int k = 0; k < NORM_LANES / 32; ++k) t += smf[i * NORM_LANES + lane + 32 * k];
        t = warp_sum(t);
        if (lane == 0) smf[i * NORM_LANES] = t;   // this warp alone read row i's partials
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < NX; ++i)
        if (i < n_x) scale[i] = rsqrtf(smf[i * NORM_LANES] / (float)cols + a.eps);
}

// xn (scaled by 2^X_SCALE_LOG2) into each used layout, zero-padded; sums of xn per 16 and 32
// columns.
template <int NX>
__device__ void stage_x(const GemvArgs& a, float* smf) {
    const int tid = threadIdx.x, n_threads = blockDim.x;
    const int cols = a.cols, n_x = a.n_x;
    const int cols_pad = (cols + 63) & ~63;
    float scale[NX];
    norm_scales<NX>(a, smf, scale);
    const float up = exp2i(X_SCALE_LOG2);
    // c runs over 32-aligned groups per warp (n_threads is a multiple of 32): the warp sums below are
    // over 32 consecutive columns, all lanes present
    for (int c0 = tid; c0 < cols_pad; c0 += X_BATCH * n_threads) {
        float nw[X_BATCH];
#pragma unroll
        for (int u = 0; u < X_BATCH; ++u) {
            const int c = c0 + u * n_threads;
            nw[u] = c < cols ? (a.norm_w ? __ldg(a.norm_w + c) : 1.0f) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < NX; ++i) {
            if (i >= n_x) break;
            float v[X_BATCH];
            load_x_batch(a.x + (int64_t)i * cols, c0, n_threads, cols, v);
#pragma unroll
            for (int u = 0; u < X_BATCH; ++u) {
                const int c = c0 + u * n_threads;
                if (c - (tid & 31) >= cols_pad) break;   // warp-uniform: the whole 32-group is past the end
                const float xn = v[u] * scale[i] * nw[u];
#pragma unroll
                for (int L = 0; L < XL_COUNT; ++L)
                    if (a.x_off_floats[L] >= 0) smf[a.x_off_floats[L] + i * a.x_row[L] + x_phys(L, c)] = xn * up;
                if (a.xsum16_off >= 0) {
                    float s = xn;
#pragma unroll
                    for (int off = 8; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);   // 16-lane sums
                    const int g16 = c >> 4;
                    if ((tid & 15) == 0 && c < cols) smf[a.xsum16_off + i * a.xsum16_row + g16] = s;
                    s += __shfl_xor_sync(0xffffffffu, s, 16);
                    if ((tid & 31) == 0 && c < cols) smf[a.xsum32_off + i * a.xsum32_row + (c >> 5)] = s;
                }
            }
        }
    }
    __syncthreads();
}

// ---- int8 activations (XQ kernels: launches whose matrices are all quantized) ----------------------------
// Each x row is staged per 32-column block as a float scale sx and two int8 codes per column with
// xn ~= x' = sx * (hi + lo / XQ_LO): t = xn * 127 / max|xn over the block|, hi = rint(t),
// lo = rint((t - hi) * XQ_LO). |xn - x'| <= max / (127 * 2 * XQ_LO) ~ 1.6e-5 of the block's largest |xn|
// (about float16's relative precision, which the prefill GEMM uses for activations). The weights
// stay exact: a part's sum of code * x' is sx * (sum code * hi + sum code * lo / XQ_LO), two integer
// dp4a sums, and its zero-point / min term uses the sums of the same x' (xsum16 / xsum32), so the
// result is sum w * x' up to float32 rounding.
// Bytes: the 4 columns of a group are 8 bytes (4 hi codes, then 4 lo codes); column col's group lies
// at byte 8 * x8_group<L>(col), with one 8-byte pad per 32 columns (XL_PAD32: the 32-weight formats,
// whose lanes read consecutive blocks: 18 words apart, distinct bank pairs in a half-warp) or per 64
// columns (XL_PAD64: K formats, lanes 64 columns = 34 words and blocks 136 words apart: distinct bank
// pairs for the 16 lanes of a half-warp of Q4_K / Q5_K; Q6_K 2-way at worst).
constexpr float XQ_LO = 254.0f;
template <int L>
__host__ __device__ constexpr int x8_group(int col) { return (col >> 2) + (col >> (L == XL_PAD64 ? 6 : 5)); }
__host__ __device__ constexpr int x8_row_bytes(int L, int cols) {
    return L == XL_PAD64 ? 8 * x8_group<XL_PAD64>((cols + 63) & ~63) : 8 * x8_group<XL_PAD32>((cols + 31) & ~31);
}

// sum over k of byte k of a (unsigned) times byte k of b (signed), plus c
__device__ __forceinline__ int dot4_u8s8(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
#pragma unroll
    for (int k = 0; k < 4; ++k) c += (int)((a >> (8 * k)) & 0xFFu) * (int)(int8_t)(uint8_t)(b >> (8 * k));
    return c;
#endif
}

__device__ __forceinline__ uint32_t pack_s8(const int (&v)[4]) {
    return (uint32_t)(v[0] & 0xFF) | (uint32_t)(v[1] & 0xFF) << 8 | (uint32_t)(v[2] & 0xFF) << 16 | (uint32_t)(v[3] & 0xFF) << 24;
}

// Thread t of the CTA takes groups t, t + n_threads, ... (float4 loads: 8 lanes = one 32-column block,
// so block maxima and sums are 8-lane shuffles). cols % 32 == 0, x and norm_w 16-byte aligned.
// XQ_BATCH float4 loads of x (and of norm_w) in flight per thread: 4 x 768 threads cover 12288 columns
// per round at 32 registers.
constexpr int XQ_BATCH = 4;
template <int NX>
__device__ void stage_xq(const GemvArgs& a, uint8_t* sm, float* smf) {
    const int tid = threadIdx.x, n_threads = blockDim.x, lane = tid & 31;
    const int n_groups = a.cols >> 2, n_x = a.n_x;
    float scale[NX];
    norm_scales<NX>(a, smf, scale);
    const float4* x4 = reinterpret_cast<const float4*>(a.x);
    const float4* nw4 = reinterpret_cast<const float4*>(a.norm_w);
    for (int g0 = tid; g0 - lane < n_groups; g0 += XQ_BATCH * n_threads) {
        float4 nw[XQ_BATCH];
#pragma unroll
        for (int u = 0; u < XQ_BATCH; ++u) {
            const int g = g0 + u * n_threads;
            nw[u] = (nw4 && g < n_groups) ? __ldg(nw4 + g) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        }
#pragma unroll
        for (int i = 0; i < NX; ++i) {
            if (i >= n_x) break;
            float4 v[XQ_BATCH];
#pragma unroll
            for (int u = 0; u < XQ_BATCH; ++u) {
                const int g = g0 + u * n_threads;
                v[u] = g < n_groups ? load_act4(x4 + (int64_t)i * n_groups + g) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < XQ_BATCH; ++u) {
                const int g = g0 + u * n_threads;
                if (g - lane >= n_groups) break;   // warp-uniform: the whole warp is past the end
                const float xn[4] = {v[u].x * scale[i] * nw[u].x, v[u].y * scale[i] * nw[u].y,
                                     v[u].z * scale[i] * nw[u].z, v[u].w * scale[i] * nw[u].w};
                float mx = fmaxf(fmaxf(fabsf(xn[0]), fabsf(xn[1])), fmaxf(fabsf(xn[2]), fabsf(xn[3])));
#pragma unroll
                for (int off = 1; off < 8; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
                const float sx = mx * (1.0f / 127.0f);
                int hi[4], lo[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const float t = xn[k] * inv;
                    hi[k] = __float2int_rn(t);
                    lo[k] = __float2int_rn((t - (float)hi[k]) * XQ_LO);
                }
                int hs = hi[0] + hi[1] + hi[2] + hi[3], ls = lo[0] + lo[1] + lo[2] + lo[3];
#pragma unroll
                for (int off = 1; off < 4; off <<= 1) {   // 16-column sums (4 lanes)
                    hs += __shfl_xor_sync(0xffffffffu, hs, off);
                    ls += __shfl_xor_sync(0xffffffffu, ls, off);
                }
                const float s16 = sx * fmaf((float)ls, 1.0f / XQ_LO, (float)hs);
                hs += __shfl_xor_sync(0xffffffffu, hs, 4);
                ls += __shfl_xor_sync(0xffffffffu, ls, 4);
                if (g < n_groups) {
                    const uint2 codes = make_uint2(pack_s8(hi), pack_s8(lo));
                    if (a.x8_off[XL_PAD32] >= 0)
                        *reinterpret_cast<uint2*>(sm + a.x8_off[XL_PAD32] + i * a.x8_row[XL_PAD32] +
                                                  8 * x8_group<XL_PAD32>(4 * g)) = codes;
                    if (a.x8_off[XL_PAD64] >= 0)
                        *reinterpret_cast<uint2*>(sm + a.x8_off[XL_PAD64] + i * a.x8_row[XL_PAD64] +
                                                  8 * x8_group<XL_PAD64>(4 * g)) = codes;
                    if ((lane & 3) == 0) smf[a.xsum16_off + i * a.xsum16_row + (g >> 2)] = s16;
                    if ((lane & 7) == 0) {
                        smf[a.xsum32_off + i * a.xsum32_row + (g >> 3)] = sx * fmaf((float)ls, 1.0f / XQ_LO, (float)hs);
                        smf[a.xsc_off + i * a.xsc_row + (g >> 3)] = sx;
                    }
                }
            }
        }
    }
    __syncthreads();
}

// The x8 byte offset of column col(j, run) of a piece splits into a lane part and a run part (the
// run part is then a compile-time immediate): checked for every quant format here.
template <int QT>
constexpr bool x8_affine() {
    using F = Fmt<QT>;
    constexpr int L = F::XL;
    for (int j = 0; j < F::LPB; ++j)
        for (int r = 0; r < F::RUNS; ++r)
            if (x8_group<L>(F::col(j, r)) != x8_group<L>(F::col(j, 0)) + x8_group<L>(F::col(0, r))) return false;
    return F::BE % (L == XL_PAD64 ? 64 : 32) == 0;   // blocks start on a pad boundary: uniform block stride
}
static_assert(x8_affine<FD_Q_Q4_0>() && x8_affine<FD_Q_Q4_1>() && x8_affine<FD_Q_Q5_0>() && x8_affine<FD_Q_Q8_0>() &&
                  x8_affine<FD_Q_Q4_K>() && x8_affine<FD_Q_Q5_K>() && x8_affine<FD_Q_Q6_K>(),
              "int8 activation offsets must be affine in (lane, run)");

// acc[i] += sum over the lane's pieces of dot(W[row, piece cols], x'[i, piece cols]) (quant formats).
template <int QT, int NX>
__device__ __forceinline__ void row_dot_q8(const uint8_t* wrow, int t, int lpr, int pieces, const uint8_t* x8,
                                           int x8_row, const float* xsc, int xsc_row, const float* xsum,
                                           int xsum_row, float (&acc)[NX]) {
    using F = Fmt<QT>;
    constexpr int RPP = F::RUNS / F::PARTS;
    constexpr int L = F::XL;
    constexpr int BLK_X8 = 8 * x8_group<L>(F::BE);   // x8 bytes per weight block
    const int j = t % F::LPB;
    int blk = t / F::LPB;
    const int blk_step = lpr / F::LPB;
    const uint8_t* wp = wrow + (int64_t)blk * F::BB;
    const uint8_t* xp = x8 + blk * BLK_X8 + 8 * x8_group<L>(F::col(j, 0));

    // two pieces per iteration for one or two x rows, so the compiler may issue the second piece's
    // shared-memory loads under the first's arithmetic (the sums still run piece by piece, in order:
    // same bits); no speed change was measurable end to end (bench/NOTES.md, session 6)
#pragma unroll (NX <= 2 ? 2 : 1)
    for (int p = t; p < pieces; p += lpr) {
        typename F::Raw raw;
        F::template load<false>(wp, j, raw);
        float pa[F::PARTS], pb[F::PARTS];
        F::params(raw, j, pa, pb);
#pragma unroll
        for (int part = 0; part < F::PARTS; ++part) {
            const int shift = F::part_shift(part);
            int ah[NX], al[NX];
#pragma unroll
            for (int i = 0; i < NX; ++i) ah[i] = al[i] = 0;
#pragma unroll
            for (int rr = 0; rr < RPP; ++rr) {
                const int run = part * RPP + rr;
                const uint32_t code = (F::code_word(raw, j, run) >> shift) & (F::CODE_MASK * 0x01010101u);
#pragma unroll
                for (int i = 0; i < NX; ++i) {
                    const uint2 xv = *reinterpret_cast<const uint2*>(xp + i * x8_row + 8 * x8_group<L>(F::col(0, run)));
                    ah[i] = dot4_u8s8(code, xv.x, ah[i]);
                    al[i] = dot4_u8s8(code, xv.y, al[i]);
                }
            }
            const float bb = fmaf(-(float)F::OFFSET, pa[part], pb[part]);   // b - a * OFFSET
            const int grp = F::part_group(blk, j, part);                     // in PART_COLS columns
            const int blk32 = grp * F::PART_COLS / 32;
#pragma unroll
            for (int i = 0; i < NX; ++i) {
                const float cx = xsc[i * xsc_row + blk32] * fmaf((float)al[i], 1.0f / XQ_LO, (float)ah[i]);
                acc[i] = fmaf(pa[part], cx, fmaf(bb, xsum[i * xsum_row + grp], acc[i]));
            }
        }
        blk += blk_step;
        wp += (int64_t)blk_step * F::BB;
        xp += blk_step * BLK_X8;
    }
}

// ---- one row's dot products over its pieces -------------------------------------------------------------
// acc[i] += sum over the lane's pieces of dot(W[row, piece cols], xn[i, piece cols]).
// Quant formats, per part: cls[i][c] = sum of scaled_codes of class c * xs (= x * 2^X_SCALE_LOG2), then
// acc += a * sum_c cls * class_scale(c, shift) + (b - a * OFFSET) * sum(x over the part's columns).
template <int QT, int NX, bool A16>
__device__ __forceinline__ void row_dot(const uint8_t* wrow, int t, int lpr, int pieces, int cols, const float* xs,
                                        int x_row, const float* xsum, int xsum_row, float (&acc)[NX]) {
    using F = Fmt<QT>;
    constexpr int RPP = F::RUNS / F::PARTS;   // runs per part
    const int j = t % F::LPB;                  // the lane's piece within each block (LPB divides lpr)
    int blk = t / F::LPB;
    const int blk_step = lpr / F::LPB;
    const uint8_t* wp = wrow + (int64_t)blk * F::BB;
    const float* xp = xs + F::xblk(blk) + F::xlane(j);
    const int x_step = F::xblk(blk_step);

#pragma unroll 1
    for (int p = t; p < pieces; p += lpr) {
        typename F::Raw raw;
        F::template load<A16>(wp, j, raw);
        float pa[F::PARTS], pb[F::PARTS];
        F::params(raw, j, pa, pb);
        if constexpr (F::IS_FLOAT) {
            F::mask(raw, cols - blk * F::BE);
            float dot[NX];
#pragma unroll
            for (int i = 0; i < NX; ++i) dot[i] = 0.0f;
#pragma unroll
            for (int run = 0; run < F::RUNS; ++run) {
                float w[4];
                F::floats(raw, run, w);
#pragma unroll
                for (int i = 0; i < NX; ++i) {
                    const float4 xv = *reinterpret_cast<const float4*>(xp + i * x_row + F::xrun(run));
                    dot[i] = fmaf(w[0], xv.x, fmaf(w[1], xv.y, fmaf(w[2], xv.z, fmaf(w[3], xv.w, dot[i]))));
                }
            }
#pragma unroll
            for (int i = 0; i < NX; ++i) acc[i] = fmaf(exp2i(-X_SCALE_LOG2), dot[i], acc[i]);
        } else {
#pragma unroll
            for (int part = 0; part < F::PARTS; ++part) {
                // the byte classes are first rescaled to class 0 (exact power-of-two multiplies) so
                // each row keeps one accumulator (one FMA chain per row, whatever NX: three chains
                // for n_x = 1 were faster but broke row invariance)
                const int shift = F::part_shift(part);
                float cls[NX];
#pragma unroll
                for (int i = 0; i < NX; ++i) cls[i] = 0.0f;
#pragma unroll
                for (int rr = 0; rr < RPP; ++rr) {
                    const int run = part * RPP + rr;
                    float v[4];
                    scaled_codes<F::CODE_MASK>(F::code_word(raw, j, run), shift, v);
                    v[1] = mul_keep_subnormal(v[1], exp2i(-8));
                    v[2] = mul_keep_subnormal(v[2], exp2i(-16));
                    v[3] = mul_keep_subnormal(v[3], exp2i(-16));
#pragma unroll
                    for (int i = 0; i < NX; ++i) {
                        const float4 xv = *reinterpret_cast<const float4*>(xp + i * x_row + F::xrun(run));
                        cls[i] = fma_keep_subnormal(v[0], xv.x, cls[i]);
                        cls[i] = fma_keep_subnormal(v[1], xv.y, cls[i]);
                        cls[i] = fma_keep_subnormal(v[2], xv.z, cls[i]);
                        cls[i] = fma_keep_subnormal(v[3], xv.w, cls[i]);
                    }
                }
                const float bb = fmaf(-(float)F::OFFSET, pa[part], pb[part]);   // b - a * OFFSET
                const int grp = F::part_group(blk, j, part);
#pragma unroll
                for (int i = 0; i < NX; ++i)
                    acc[i] = fmaf(pa[part], cls[i] * class_scale(0, shift), fmaf(bb, xsum[i * xsum_row + grp], acc[i]));
            }
        }
        blk += blk_step;
        wp += (int64_t)blk_step * F::BB;
        xp += x_step;
    }
}

// Activation views for one CTA (values copied out of the kernel parameters with static indices: taking
// the address of a kernel parameter would copy the whole struct to local memory).
struct XViews {
    const float* xs[XL_COUNT];
    int x_row[XL_COUNT];
    const float* xsum16;
    const float* xsum32;
    int xsum16_row, xsum32_row;
    const uint8_t* x8[XL_COUNT];   // int8 activations (XQ kernels), per layout
    int x8_row[XL_COUNT];
    const float* xsc;
    int xsc_row;
};

__device__ __forceinline__ XViews x_views(const GemvArgs& a, const float* smf) {
    XViews v;
#pragma unroll
    for (int L = 0; L < XL_COUNT; ++L) {
        v.xs[L] = smf + (a.x_off_floats[L] >= 0 ? a.x_off_floats[L] : 0);
        v.x_row[L] = a.x_row[L];
    }
    v.xsum16 = smf + (a.xsum16_off >= 0 ? a.xsum16_off : 0);
    v.xsum32 = smf + (a.xsum32_off >= 0 ? a.xsum32_off : 0);
    v.xsum16_row = a.xsum16_row;
    v.xsum32_row = a.xsum32_row;
#pragma unroll
    for (int L = 0; L < XL_COUNT; ++L) {
        v.x8[L] = reinterpret_cast<const uint8_t*>(smf) + (a.x8_off[L] >= 0 ? a.x8_off[L] : 0);
        v.x8_row[L] = a.x8_row[L];
    }
    v.xsc = smf + (a.xsc_off >= 0 ? a.xsc_off : 0);
    v.xsc_row = a.xsc_row;
    return v;
}

template <int QT>
constexpr int part_cols_of() {
    if constexpr (Fmt<QT>::IS_FLOAT) return 0;
    else return Fmt<QT>::PART_COLS;
}

template <int NX>
struct RowDot {   // row_dot for the qtype chosen at run time (quant.cuh dispatch_qtype)
    const uint8_t* wrow;
    int t, lpr, pieces, cols;
    bool aligned16;
    const XViews* xv;
    float (*acc)[NX];
    template <int QT>
    __device__ __forceinline__ void run() {
        constexpr int L = Fmt<QT>::XL;
        constexpr bool P16 = part_cols_of<QT>() == 16;
        const float* xsum = P16 ? xv->xsum16 : xv->xsum32;
        const int xsum_row = P16 ? xv->xsum16_row : xv->xsum32_row;
        if (Fmt<QT>::IS_FLOAT && aligned16)
            row_dot<QT, NX, true>(wrow, t, lpr, pieces, cols, xv->xs[L], xv->x_row[L], xsum, xsum_row, *acc);
        else
            row_dot<QT, NX, false>(wrow, t, lpr, pieces, cols, xv->xs[L], xv->x_row[L], xsum, xsum_row, *acc);
    }
};

template <int NX>
struct RowDotQ8 {   // row_dot_q8 for the qtype chosen at run time (quant formats only)
    const uint8_t* wrow;
    int t, lpr, pieces;
    const XViews* xv;
    float (*acc)[NX];
    template <int QT>
    __device__ __forceinline__ void run() {
        if constexpr (!Fmt<QT>::IS_FLOAT) {
            constexpr bool P16 = Fmt<QT>::PART_COLS == 16;
            constexpr int L = Fmt<QT>::XL;
            row_dot_q8<QT, NX>(wrow, t, lpr, pieces, xv->x8[L], xv->x8_row[L], xv->xsc, xv->xsc_row,
                               P16 ? xv->xsum16 : xv->xsum32, P16 ? xv->xsum16_row : xv->xsum32_row, *acc);
        }
    }
};

// acc += the row's dot products, by the activation form of the kernel
template <int NX, bool XQ>
__device__ __forceinline__ void row_dot_any(const GemvMat& m, const uint8_t* wrow, int t, int cols, const XViews& xv,
                                            float (&acc)[NX]) {
    if constexpr (XQ) {
        RowDotQ8<NX> fn{wrow, t, m.lpr, m.pieces, &xv, &acc};
        dispatch_qtype(m.qtype, fn);
    } else {
        RowDot<NX> fn{wrow, t, m.lpr, m.pieces, cols, m.aligned16 != 0, &xv, &acc};
        dispatch_qtype(m.qtype, fn);
    }
}

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

// The best (value, row) of each x row over the steps a lane wrote (the persistent forward's fused argmax over
// the lm_head rows; ties keep the lower row, as fd_argmax does).
template <int NX>
struct ArgmaxTrack {
    float v[NX];
    int r[NX];
    __device__ __forceinline__ void init() {
#pragma unroll
        for (int i = 0; i < NX; ++i) { v[i] = -INFINITY; r[i] = 0x7fffffff; }
    }
    __device__ __forceinline__ void offer(int i, float val, int row) {
        if (val > v[i] || (val == v[i] && row < r[i])) { v[i] = val; r[i] = row; }
    }
};

template <int NX, bool SWIGLU, bool XQ>
__device__ __forceinline__ void compute_step(const GemvArgs& a, int s, const uint8_t* buf, const XViews& xv, int lane,
                                             ArgmaxTrack<NX>* track = nullptr) {
    const GemvMat m = SWIGLU ? a.mat[0] : mat_of_step(a, s);
    const int lpr = m.lpr, G = 32 / lpr;
    const int g = lane / lpr, t = lane % lpr;
    const int r0 = (s - m.first_step) * G;
    const int row = r0 + g;
    const bool valid = row < m.rows;

    // the epilogue's bias and residual are loaded before the dot products (their round trip overlaps
    // them); up to 4 x rows (registers)
    constexpr bool PRE = !SWIGLU && NX <= 4;
    float pre_b = 0.0f, pre_r[PRE ? NX : 1];
    if constexpr (PRE) {
        const bool lead = valid && t == 0;
        pre_b = lead && m.bias ? m.bias[row] : 0.0f;
#pragma unroll
        for (int i = 0; i < NX; ++i)
            pre_r[i] = lead && i < a.n_x && a.residual ? __ldcg(a.residual + (int64_t)i * m.rows + row) : 0.0f;
    }
    float acc[NX];
#pragma unroll
    for (int i = 0; i < NX; ++i) acc[i] = 0.0f;
    if (valid) {
        const uint8_t* src = m.w + r0 * m.row_bytes;
        const uint8_t* wrow = buf + (reinterpret_cast<uintptr_t>(src) & 15) + g * m.row_bytes;
        row_dot_any<NX, XQ>(m, wrow, t, a.cols, xv, acc);
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
            row_dot_any<NX, XQ>(u, wrow, t, a.cols, xv, acc_u);
        }
        reduce_lanes(acc_u, lpr);
        if (valid && t == 0) {
#pragma unroll
            for (int i = 0; i < NX; ++i)
                if (i < a.n_x) m.y[(int64_t)i * m.rows + row] = silu(acc[i]) * acc_u[i];
        }
    } else if (valid && t == 0) {
        float b;
        if constexpr (PRE) b = pre_b;
        else b = m.bias ? m.bias[row] : 0.0f;
#pragma unroll
        for (int i = 0; i < NX; ++i) {
            if (i < a.n_x) {
                const int64_t o = (int64_t)i * m.rows + row;
                float v = acc[i] + b;
                if (a.residual) {                  // read then written by this thread: y may alias it
                    if constexpr (PRE) v += pre_r[i];
                    else v += __ldcg(a.residual + o);
                }
                m.y[o] = v;
                if (track) track->offer(i, v, row);
            }
        }
    }
}

// ---- host side: device facts and planning (shared by gemv.cu and forward.cu) -----------------------------
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

struct MatIn { const void* w; float* y; const float* bias; int qtype, rows; };

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
inline int gemv_plan(int n_mats, const MatIn* mats, bool swiglu, int cols, const float* x, const float* norm_w,
                     float eps, int n_x, bool int8_x, int stage_bytes, int min_steps, GemvPlan* out) {
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
        m.lpr = choose_lpr(info[k], m.rows, cols, m.row_bytes, n_ranges, min_steps, stage_bytes);
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
    a.n_steps = steps;
    a.range_bytes = (int)range_bytes;
    a.stage_bytes = (int)(range_bytes * n_ranges);

    // Activations: int8 (XQ) when every matrix is quantized (then cols % 32 == 0) and x / norm_w allow
    // 16-byte loads; else float32 in each layout the formats read.
    bool xq = int8_x && cols % 32 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(norm_w) % 16 == 0;
    for (int k = 0; k < n_mats; ++k) xq = xq && !info[k].is_float;
    pl.xq = xq;
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

}  // namespace
}  // namespace fd
