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
//     shared memory as float xn * 2^80 (quant_codes.cuh scaled_codes) in each activation layout the
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
//
// Files: gemv_args.cuh (the kernel arguments), gemv_stage.cuh (the prologue: x -> shared memory),
// gemv_dot.cuh (a row's dot products), gemv_plan.cuh (host: lanes per row, steps, shared-memory layout);
// this file holds what a warp does with one step (stage its weights, compute its rows, the epilogue).
#pragma once

#include "gemv_dot.cuh"
#include "gemv_plan.cuh"

#include <algorithm>
#include <cstdlib>
#include <mutex>

namespace fd {
namespace {

using namespace fd::q;

// ---- staging and computing one step ----------------------------------------------------------------------
template <bool SWIGLU>
__device__ __forceinline__ void issue_step(const GemvArgs& a, int s, uint8_t* buf, int lane) {
    const GemvMat m = SWIGLU ? a.mat[0] : mat_of_step(a, s);
    const int G = 32 / m.lpr;
    const int r0 = (s - m.first_step) * G;
    const int n_rows = min(G, m.rows - r0);
    warp_stage(buf, m.w + r0 * m.row_bytes, n_rows * m.row_bytes, lane, a.evict_first != 0);
    if (SWIGLU) {
        const GemvMat u = a.mat[1];
        warp_stage(buf + a.range_bytes, u.w + r0 * u.row_bytes, n_rows * u.row_bytes, lane, a.evict_first != 0);
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

// PAIR (SWIGLU, XQ, gate and up of one format): both rows' dots in one loop (gemv_dot.cuh row_dot_q8_pair), the
// same bits as the two loops.
template <int NX, bool SWIGLU, bool XQ, bool PAIR = false>
__device__ __forceinline__ void compute_step(const GemvArgs& a, int s, const uint8_t* buf, const XViews& xv, int lane,
                                             ArgmaxTrack<NX>* track = nullptr) {
    static_assert(!PAIR || (SWIGLU && XQ), "the paired dot is SwiGLU's on int8 activations");
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
    if constexpr (PAIR) {
        const GemvMat u = a.mat[1];
        float acc_u[NX];
#pragma unroll
        for (int i = 0; i < NX; ++i) acc_u[i] = 0.0f;
        if (valid) {
            const uint8_t* src = m.w + r0 * m.row_bytes;
            const uint8_t* src_u = u.w + r0 * u.row_bytes;
            RowDotQ8Pair<NX> fn{buf + (reinterpret_cast<uintptr_t>(src) & 15) + g * m.row_bytes,
                                buf + a.range_bytes + (reinterpret_cast<uintptr_t>(src_u) & 15) + g * u.row_bytes,
                                t, lpr, m.pieces, &xv, &acc, &acc_u};
            dispatch_qtype(m.qtype, fn);
        }
        reduce_lanes(acc, lpr);
        reduce_lanes(acc_u, lpr);
        if (valid && t == 0) {
#pragma unroll
            for (int i = 0; i < NX; ++i)
                if (i < a.n_x) m.y[(int64_t)i * m.rows + row] = silu(acc[i]) * acc_u[i];
        }
        return;
    }
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

// ---- split rows (GemvMat.split_*): a pair of warps per row ----------------------------------------------------
// A one-matrix int8 launch whose rows are wide (ffn_down's 8,960-17,408 columns) has ~12 rows an SM, one a warp: too
// few warps to hide the dot loop's latencies. Splitting each row over the two warps of a team doubles the warps
// computing and halves each one's serial chain. Slice k of row r is blocks [k h, ...) (GemvMat.split_*); its warp stages
// only those bytes, runs row_dot_q8 over them as if its lanes were lanes k h LPB .. of the row (same lane -> piece
// map, so the same per-lane sums as lanes of a longer row would have), folds its lanes, and the team adds the two
// slices in slice order through shared memory: one fixed order for every launch of the matrix, whatever n_x.
__device__ __forceinline__ void issue_step_split(const GemvArgs& a, int s, uint8_t* buf, int lane, int slice) {
    const GemvMat m = a.mat[0];
    const int64_t lo = slice ? m.split_bytes : 0, hi = slice ? m.row_bytes : m.split_bytes;
    warp_stage(buf, m.w + (int64_t)(s - m.first_step) * m.row_bytes + lo, hi - lo, lane, a.evict_first != 0);
}

// Named barrier of a team's two warps (ids 1..15; 0 is __syncthreads'). CUDA only: HIP has no named barriers, and the
// launcher never splits there (gemv.cu, FD_HAS_MMA); the HIP body only keeps the file compiling.
__device__ __forceinline__ void team_sync(int team) {
#if FD_HAS_MMA
    asm volatile("bar.sync %0, 64;" ::"r"(team + 1) : "memory");
#else
    (void)team;
    __syncthreads();
#endif
}

// part: this team's 2 x NX floats of shared memory (scratch after the prologue).
template <int NX>
__device__ __forceinline__ void compute_step_split(const GemvArgs& a, int s, const uint8_t* buf, const XViews& xv,
                                                   int lane, int slice, int team, float* part) {
    const GemvMat m = a.mat[0];
    const int row = s - m.first_step;
    const bool valid = row < m.rows;                    // team-uniform
    float acc[NX];
#pragma unroll
    for (int i = 0; i < NX; ++i) acc[i] = 0.0f;
    if (valid) {
        const uint8_t* src = m.w + (int64_t)row * m.row_bytes + (slice ? m.split_bytes : 0);
        // the staged slice, addressed as if the whole row were staged (blocks below the slice are never read)
        const uint8_t* wrow = buf + (reinterpret_cast<uintptr_t>(src) & 15) - (slice ? m.split_bytes : 0);
        RowDotQ8<NX> fn{wrow, lane + (slice ? m.split_pieces : 0), 32, slice ? m.pieces : m.split_pieces, &xv, &acc};
        dispatch_qtype(m.qtype, fn);
    }
    reduce_lanes(acc, 32);
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < NX; ++i) part[slice * NX + i] = acc[i];
    }
    team_sync(team);                                    // both slices' sums written
    if (valid && slice == 0 && lane == 0) {
        const float b = m.bias ? m.bias[row] : 0.0f;
#pragma unroll
        for (int i = 0; i < NX; ++i) {
            if (i < a.n_x) {
                const int64_t o = (int64_t)i * m.rows + row;
                float v = (part[i] + part[NX + i]) + b;
                if (a.residual) v += __ldcg(a.residual + o);   // read then written by this thread: y may alias it
                m.y[o] = v;
            }
        }
    }
    team_sync(team);                                    // part is free for the team's next step
}

}  // namespace
}  // namespace fd
