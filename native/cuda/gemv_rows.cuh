// gemv_rows.cuh -- the GEMV of every x-row count n = 1..32 on int8 tensor cores for Q4_K, Q6_K, Q8_0 and Q5_0 weights
// (gemv.cu runs it for fd_gemv, fd_gemv_multi and fd_gemv_swiglu when the tuning table's gemv_rows says so and
// every matrix of the call has one of these formats). The design is bench/lab/gemv_mma_rows_lab.cu's (bench/NOTES.md
// session 12); gemv_rows_item.cuh holds the per-item arithmetic, gemv_rows_x.cuh x's codes (the pre-pass, the norm,
// the CTA copy's layout), gemv_rows_plan.cuh the host side.
//
// y (n, rows) f32 = W (rows, cols) x' (n, cols), x' = xn quantized per 128 columns (a group, ROWS_XG; in a launch
// of one 32-column format, Q8_0 or Q5_0, per 32 columns: their blocks take a float step each anyway) to int8 codes
// q and a float scale xd (x' = xd * q) by a pre-pass (gemv_rows_quantize_x: one launch per call, shared by the matrices of a
// multi / SwiGLU call) or, for n <= the tuning's gemv_rows_fuse_nx, by every GEMV CTA for itself into shared memory
// (rows_quantize_cta: no second launch; the same definition, so the same codes), xn = x or rmsnorm(x) * norm_w (the
// norm is folded into the quantization: normalize, then quantize). One scale per 128 columns is coarser than
// llama.cpp's q8_1 activations (32) and finer than its Q8_K (256): it lets a group's K-quant sub-block sums add in
// int32 (gemv_rows_item.cuh), a quarter of the float work of a scale per 32 columns; the tests state the bound, and
// bench/results/2026-11-28-cpu-session31-x-quant-block.md the logit error it costs (per 32 / 128 columns: median
// 5.0e-3 / 8.3e-3 of a logit spread on the 1.5B).
//
// Row invariance by construction: every output (weight row r, x row i) is one fixed float expression of W's row r
// and x row i alone. A row is cut into C chunks of KS super-blocks (256 columns; a row's last chunk may be
// shorter); an item is (16-row tile, chunk); its float sum per (r, i) starts at 0 and takes one step a 128-column
// group, after the group's exact int32 sums (gemv_rows_item.cuh), and a
// tile's C chunk partials are added in chunk order in shared memory, then the epilogue runs in a fixed order:
// (+ bias[r]) (+ residual[i, r]), or silu(gate) * up. So the bits depend on KS (gemv_rows_plan.cuh: a function
// of cols and the tuning table only) and on nothing else: not on n, the warps, CTAs, slots or rounds. The RMSNorm
// sum uses a fixed partition (256 threads, block_sum) whatever n.
//
// Work: CTA b owns tiles b, b + G, ... of all matrices of the launch (tiles concatenated in matrix order; SwiGLU:
// the gate's tiles, each staging the up matrix's same rows beside them), R at a time (a round). A round's items
// (tile, chunk) go to its W warps round-robin; each warp keeps a private ring of ST item slots filled with 16-byte
// cp.async (its first ST items are issued before griddepcontrol.wait, i.e. under the previous kernel), computes
// item q while items q+1 .. q+ST-1 are in flight, and writes the item's partial (16 rows x 8 NT x rows) to shared
// memory; after a barrier the CTA folds each tile's chunks and writes y. Staging: a row's chunk is copied from its
// 16-byte floor (Q6_K, Q8_0 and Q5_0 rows are 2-byte aligned), at a per-matrix row stride chosen for conflict-free reads
// (gemv_rows_plan.cuh rows_stride); rows past a matrix's end are not staged and their outputs not written.
#pragma once

#include "gemv_args.cuh"
#include "gemv_rows_x.cuh"

namespace fd {
namespace {

constexpr int ROWS_MAX_WARPS = 16;
// gemv_rows_kernel's warps for NT N-tiles: 12 for four tiles (168 registers a thread, no spills; 16 warps get 128,
// where the NT 4 SwiGLU kernel spilled 124 bytes), else 16
__host__ __device__ constexpr int rows_max_warps(int nt) { return nt >= 4 ? 12 : ROWS_MAX_WARPS; }
constexpr int ROWS_MAX_SLOTS = 4;

struct RowsMat {
    const uint8_t* w;         // (rows, row_bytes) ggml blocks
    float* y;                 // (n, rows); SwiGLU: the up matrix's is unused
    const float* bias;        // (rows,) or NULL
    long long row_bytes;
    int fmt;                  // ROWS_Q4K / ROWS_Q6K / ROWS_Q80 / ROWS_Q50
    int rows;
    int tile_first;           // first tile of this matrix in the launch's tile order
    int stride;               // bytes between staged rows in a slot (rows_stride)
};

struct RowsArgs {
    RowsMat mat[MAX_MATS];    // SwiGLU: mat[0] = gate (its y is the output), mat[1] = up
    int n_mats;
    int n;                    // x rows, 1..32
    int cols;
    int ks;                   // super-blocks a chunk (changes the bits)
    int C;                    // chunks a row: ceil(cols / (256 ks))
    int tiles;                // tiles of the launch (SwiGLU: of the gate)
    int R;                    // tiles a CTA folds per round
    int st;                   // slots a warp, 1..ROWS_MAX_SLOTS
    int slot_bytes;           // one slot: 16 rows x the largest stride (x 2 for SwiGLU: up at up_off)
    int up_off;
    RowsX x;                  // the pre-pass's codes and scales (kernels with FX: only x.fine, set for every launch)
    const float* residual;    // (n, rows of mat[0]) or NULL; y may alias it
    // kernels with FX (n <= ROWS_FX_MAX_NX) quantize x themselves into shared memory at fx_off -- or, bulk-copy
    // launches with xin NULL, copy the pre-pass's codes there (rows_stage_x):
    const float* xin;         // (n, cols) f32, the call's x
    const float* norm_w;      // (cols,) or NULL: x is RMS-normalized first
    float eps;
    int fx_stride;            // bytes between x rows there (rows_fx_stride)
    int fx_off;               // bytes, 16-byte aligned: codes (n, fx_stride), then scales (rows_scale_rows(cols, fine), 8)
                              // floats, then 32
    int evict_first;          // weights staged with the L2 evict-first hint (fd_tuning_t.weights_evict_first)
};

// A barrier over the CTA's computing warps: all threads (n_threads 0: __syncthreads) or the first n_threads, named
// barrier 1 (gemv_rows_tma.cuh: its copy warp does not take part).
__device__ __forceinline__ void rows_bar(int n_threads) {
    if (n_threads == 0) __syncthreads();
    else asm volatile("bar.sync 1, %0;" ::"r"(n_threads) : "memory");
}

// The same codes and scales, made by one GEMV CTA (warps 0 .. W - 1, after pdl_wait; bar_threads: rows_bar's) for
// its own use: x rows 0 .. n - 1 (n <= ROWS_FX_MAX_NX) into shared memory (rows_fx_bytes; scales at (group, row),
// ROWS_FX_SC a group). Every CTA reads the whole x (n x cols floats, from L2) but no pre-pass launch, scratch or
// its round trip is needed; the bits are the pre-pass's: the norm replays block_sum's partition over these warps.
// The chain is the launch's critical path (bench/NOTES.md sessions 15, 36): a warp's first batch of x is loaded
// before the norm's sum, which only its quantization needs, so the two L2 round trips overlap.
// FINE: a scale a 32-column block (== a.x.fine; the kernel knows it from its format, rows_fine).
template <bool FINE>
__device__ __forceinline__ void rows_quantize_cta(const RowsArgs& a, uint8_t* fx, int W, int bar_threads) {
    int8_t* xq = reinterpret_cast<int8_t*>(fx);
    float* xsc = reinterpret_cast<float*>(fx + a.n * a.fx_stride);
    float* red = xsc + rows_scale_rows(a.cols, FINE) * ROWS_FX_SC;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ngrp = rows_groups(a.cols);
    constexpr int U = 2;   // groups a warp loads before it quantizes them (8 loads in flight, not one L2 trip each)
    for (int i = 0; i < a.n; ++i) {
        const float* xr = a.xin + (size_t)i * a.cols;
        float v[U][4], w[U][4];   // x and norm_w loaded together: one L2 round trip for the batch
        auto load = [&](int g0) {
#pragma unroll
            for (int uu = 0; uu < U; ++uu) {
                const int grp = g0 + uu * W, nu = min(4, a.cols / 32 - 4 * grp);
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const bool in = grp < ngrp && u < nu;
                    const int c = ROWS_XG * grp + 32 * u + lane;
                    v[uu][u] = in ? xr[c] : 0.0f;
                    w[uu][u] = in && a.norm_w ? __ldg(a.norm_w + c) : 1.0f;
                }
            }
        };
        load(warp);   // the first batch before the norm's own loads: both in flight at once, not one after the other
        float scale = 1.0f;
        if (a.norm_w) {
            for (int vw = warp; vw < ROWS_PREPASS_THREADS / 32; vw += W) {
                const float p = warp_sum(rows_norm_part(xr, a.cols, 32 * vw + lane));
                if (lane == 0) red[vw] = p;
            }
            rows_bar(bar_threads);
            const float ss = warp_sum(lane < ROWS_PREPASS_THREADS / 32 ? red[lane] : 0.0f);
            scale = rows_norm_scale(ss, a.cols, a.eps);
            rows_bar(bar_threads);   // every thread has read red before the next row writes it
        }
        for (int g0 = warp; g0 < ngrp; g0 += U * W) {
            if (g0 != warp) load(g0);
#pragma unroll
            for (int uu = 0; uu < U; ++uu) {
                const int grp = g0 + uu * W;   // warp-uniform: the shuffles inside see the whole warp
                if (grp >= ngrp) break;
                const int nu = min(4, a.cols / 32 - 4 * grp);
                int q[4];
                float xd[4];
                rows_quant_group(v[uu], w[uu], nu, a.norm_w != nullptr, scale, FINE, q, xd);
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    if (u < nu) xq[i * a.fx_stride + ROWS_XG * grp + 32 * u + lane] = (int8_t)q[u];
                if (lane == 0) rows_store_scales(xsc, grp, nu, FINE, ROWS_FX_SC, i, xd);
            }
        }
    }
    rows_bar(bar_threads);
}

// The pre-pass's codes and scales of x rows 0 .. n - 1 (n <= ROWS_FX_MAX_NX; a.x: the stream's scratch) copied by
// threads 0 .. n_threads - 1 into the CTA's own copy in rows_quantize_cta's layout, so a launch of 2 .. 8 x rows reads
// x from shared memory as a one-row launch does (fd_tuning_t.gemv_rows_stage_x) instead of through L1, where the
// weights' stages leave it little room. The codes by 16-byte cp.async, all in flight at once under the scales' loads
// (one L2 round trip, not one a word a thread). The same codes, so the same bits.
__device__ __forceinline__ void rows_stage_x(const RowsArgs& a, uint8_t* fx, int n_threads) {
    const int row_words = a.cols / 16;   // cols % 32 == 0; the scratch's rows are cols bytes apart, the copy's fx_stride
    for (int k = threadIdx.x; k < a.n * row_words; k += n_threads) {
        const int i = k / row_words, w = k - i * row_words;
        q::cp_async16(fx + i * a.fx_stride + 16 * w, a.x.q + (size_t)i * a.cols + 16 * w, 16);
    }
    q::cp_async_commit();
    float* xsc = reinterpret_cast<float*>(fx + a.n * a.fx_stride);
    const int scales = rows_scale_rows(a.cols, a.x.fine != 0) * a.n;
    for (int k = threadIdx.x; k < scales; k += n_threads) {
        const int sr = k / a.n, i = k - sr * a.n;
        xsc[sr * ROWS_FX_SC + i] = __ldg(a.x.sc + (size_t)sr * ROWS_NX + i);
    }
    q::cp_async_wait<0>();
    rows_bar(n_threads);
}

// ---- the GEMV ----------------------------------------------------------------------------------------------------
__device__ __forceinline__ void rows_wait(int pending) {   // cp.async.wait_group takes an immediate
    switch (pending) {
        case 0: q::cp_async_wait<0>(); break;
        case 1: q::cp_async_wait<1>(); break;
        case 2: q::cp_async_wait<2>(); break;
        default: q::cp_async_wait<3>(); break;
    }
}

// the matrix of launch tile `tile` (static indices only: a dynamic index into the kernel parameters would copy
// them to local memory)
__device__ __forceinline__ RowsMat rows_mat_of(const RowsArgs& a, int tile) {
    if (a.n_mats == 1) return a.mat[0];   // most calls: no select chain over the other matrices' parameters
    RowsMat m = a.mat[0];
#pragma unroll
    for (int j = 1; j < MAX_MATS; ++j)
        if (j < a.n_mats && tile >= a.mat[j].tile_first) m = a.mat[j];
    return m;
}

// bytes and first byte of chunk `chunk` within a row of matrix m
__device__ __forceinline__ void rows_chunk(const RowsArgs& a, const RowsMat& m, int chunk, long long& off, int& bytes,
                                           int& u0, int& nu) {
    if (rows_blk32(m.fmt)) {   // units of one 32-column block
        const int nblk = a.cols / 32, bb = rows_blk32_bytes(m.fmt);
        u0 = chunk * 8 * a.ks;
        nu = min(8 * a.ks, nblk - u0);
        off = (long long)bb * u0;
        bytes = bb * nu;
    } else {
        const int nsb = a.cols / ROWS_QK, bb = m.fmt == ROWS_Q4K ? 144 : 210;
        u0 = chunk * a.ks;
        nu = min(a.ks, nsb - u0);
        off = (long long)bb * u0;
        bytes = bb * nu;
    }
}

// The warp copies rows tile*16 .. +15 (those < m.rows) of one chunk of matrix m into dst (row r at r * m.stride,
// from its 16-byte floor): lanes r and r + 16 take row r's even and odd 16-byte pieces (no division a piece, one
// row address a lane; a lane pair's pieces are adjacent bytes).
__device__ __forceinline__ void rows_stage_mat(const RowsArgs& a, const RowsMat& m, int tile_local, int chunk,
                                               uint8_t* dst, int lane) {
    long long off;
    int bytes, u0, nu;
    rows_chunk(a, m, chunk, off, bytes, u0, nu);
    const int r = lane & 15, row = tile_local * 16 + r;
    if (row >= m.rows) return;
    const uint8_t* src = m.w + (long long)row * m.row_bytes + off;
    const int head = (int)(reinterpret_cast<uintptr_t>(src) & 15);
    const uint8_t* s0 = src - head;
    uint8_t* d0 = dst + r * m.stride;
    const int total = head + bytes;   // bytes from the floor
    if (a.evict_first) {
        const uint64_t pol = q::l2_evict_first_policy();
        for (int pc = lane >> 4; 16 * pc < total; pc += 2) {
            const int left = total - 16 * pc;
            q::cp_async16_hint(d0 + 16 * pc, s0 + 16 * pc, left >= 16 ? 16 : left, pol);
        }
        return;
    }
    for (int pc = lane >> 4; 16 * pc < total; pc += 2) {
        const int left = total - 16 * pc;
        q::cp_async16(d0 + 16 * pc, s0 + 16 * pc, left >= 16 ? 16 : left);
    }
}

// One item's arithmetic from the staged bytes of rows g (r0) and g + 8 (r1) at the chunk's first byte. F: the
// launch's one format (ROWS_Q4K ..), so only its code is compiled into the kernel (no other format's registers or
// instructions beside it), or ROWS_FANY where the launch's matrices differ (q / k / v with a Q6_K v). A launch of one
// 32-column format (Q8_0 / Q5_0) has x's scale a block (x.fine, rows_fine), every other one a 128-column group.
template <int NT, bool ODD, bool SX, int F>
__device__ __forceinline__ void rows_item_at(const RowsX& x, const RowsMat& m, int u0, int nu, const uint8_t* r0,
                                             const uint8_t* r1, int g, int t, float (&acc)[NT][4]) {
    if constexpr (F == ROWS_Q4K) rows_item_q4k<NT, ODD, SX>(x, r0, r1, u0, nu, g, t, acc);
    else if constexpr (F == ROWS_Q6K) rows_item_q6k<NT, ODD, SX>(x, r0, r1, u0, nu, g, t, acc);
    else if constexpr (F == ROWS_Q80 || F == ROWS_Q50) rows_item_blk32<NT, ODD, SX, F, true>(x, r0, r1, u0, nu, g, t, acc);
    else if (m.fmt == ROWS_Q4K) rows_item_q4k<NT, ODD, SX>(x, r0, r1, u0, nu, g, t, acc);
    else if (m.fmt == ROWS_Q6K) rows_item_q6k<NT, ODD, SX>(x, r0, r1, u0, nu, g, t, acc);
    else if (m.fmt == ROWS_Q80) rows_item_blk32<NT, ODD, SX, ROWS_Q80, false>(x, r0, r1, u0, nu, g, t, acc);
    else rows_item_blk32<NT, ODD, SX, ROWS_Q50, false>(x, r0, r1, u0, nu, g, t, acc);
}

template <int NT, bool ODD, bool SX, int F>
__device__ __forceinline__ void rows_item(const RowsArgs& a, const RowsX& x, const RowsMat& m, int tile_local,
                                          int chunk, const uint8_t* slot, int g, int t, float (&acc)[NT][4]) {
    long long off;
    int bytes, u0, nu;
    rows_chunk(a, m, chunk, off, bytes, u0, nu);
    // the staged rows keep their global alignment modulo 16 (rows past the end: any offset, outputs unused)
    const long long rb = m.row_bytes;
    const int h0 = (int)(reinterpret_cast<uintptr_t>(m.w + (long long)(tile_local * 16 + g) * rb + off) & 15);
    const int h1 = (int)(reinterpret_cast<uintptr_t>(m.w + (long long)(tile_local * 16 + g + 8) * rb + off) & 15);
    rows_item_at<NT, ODD, SX, F>(x, m, u0, nu, slot + g * m.stride + h0, slot + (g + 8) * m.stride + h1, g, t, acc);
}

// An item's accumulators, zeroed (the Q8_0 / Q5_0 items add into them; the Q4_K / Q6_K items write them).
template <int NR, int NTT>
__device__ __forceinline__ void rows_zero(float (&acc)[NR][NTT][4]) {
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int nt = 0; nt < NTT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][nt][e] = 0.0f;
}
// An item's partial into shared memory at round-local item jl: [jl][r][nt * 4 + e][lane] (conflict-free writes and
// fold reads; rows_fold's layout).
template <int NR, int NTT>
__device__ __forceinline__ void rows_put_partial(float* part, int jl, int lane, const float (&acc)[NR][NTT][4]) {
    float* pp = part + (size_t)jl * (NR * NTT * 4 * 32) + lane;
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int nt = 0; nt < NTT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) pp[((r * NTT + nt) * 4 + e) * 32] = acc[r][nt][e];
}
// The CTA's own x copy (rows_quantize_cta's output at fx) as the items read it.
__device__ __forceinline__ RowsX rows_fx_x(const RowsArgs& a, const uint8_t* fx) {
    return RowsX{reinterpret_cast<const int8_t*>(fx), reinterpret_cast<const float*>(fx + a.n * a.fx_stride), a.fx_stride,
                 a.n - 1, a.x.fine};
}

// Folds a round's tiles (rd: the round, its tiles t0 = rd * R ..): chunks added in chunk order, then the epilogue;
// one thread (tid < n_threads) per (tile, fragment element kk = nt * 4 + e, lane), the fragment's (row, x row) from
// (lane, kk). part: [round-local item][r][nt * 4 + e][lane] floats, PF a item.
template <int NTT, bool SWIGLU>
__device__ __forceinline__ void rows_fold(const RowsArgs& a, const float* part, int b, int G, int rd, int n_mine,
                                          int tid, int n_threads) {
    constexpr int PF = (SWIGLU ? 2 : 1) * NTT * 4 * 32;
    const int t0 = rd * a.R, nt_round = min(a.R, n_mine - t0);
    const int n_out = nt_round * (NTT * 4) * 32;
    for (int o = tid; o < n_out; o += n_threads) {
        const int ln = o & 31, kk = (o >> 5) % (NTT * 4), tl = (o >> 5) / (NTT * 4);
        const int xr = (kk >> 2) * 8 + 2 * (ln & 3) + (kk & 1);
        if (xr >= a.n) continue;
        const int tile = b + (t0 + tl) * G;
        const RowsMat m = SWIGLU ? a.mat[0] : rows_mat_of(a, tile);
        const int row = (tile - m.tile_first) * 16 + (ln >> 2) + 8 * ((kk & 3) >> 1);
        if (row >= m.rows) continue;
        const float* pp = part + (size_t)tl * a.C * PF + kk * 32 + ln;
        float s = pp[0];
        for (int c = 1; c < a.C; ++c) s = __fadd_rn(s, pp[(size_t)c * PF]);
        const size_t yo = (size_t)xr * m.rows + row;
        if (SWIGLU) {
            const float* pu = pp + NTT * 4 * 32;
            float su = pu[0];
            for (int c = 1; c < a.C; ++c) su = __fadd_rn(su, pu[(size_t)c * PF]);
            m.y[yo] = __fmul_rn(silu(s), su);
        } else {
            if (m.bias) s = __fadd_rn(s, m.bias[row]);
            if (a.residual) s = __fadd_rn(s, __ldcg(a.residual + yo));   // read then written by this thread
            m.y[yo] = s;
        }
    }
}

// NT N-tiles of 8 x rows (NT = 0: n == 1, one N-tile whose odd fragment columns are skipped -- the same operations
// for x row 0). Shared memory: W x st slots, then R x C x (1 or 2) x NT x 4 x 32 floats of partials, then (FX:
// NT <= 1, the CTA quantizes x itself) the x copy at a.fx_off.
template <int NT, bool SWIGLU, bool FX, int F>
__global__ void __launch_bounds__(rows_max_warps(NT) * 32, 1) gemv_rows_kernel(const RowsArgs a) {
    static_assert(!FX || NT <= 1, "a CTA's own x copy holds one N-tile (n <= ROWS_FX_MAX_NX)");
    extern __shared__ __align__(16) uint8_t smem[];
    constexpr int NTT = NT == 0 ? 1 : NT;
    constexpr bool ODD = NT != 0;
    constexpr int NR = SWIGLU ? 2 : 1;            // matrices an item computes
    const int W = blockDim.x >> 5;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int G = gridDim.x, b = blockIdx.x;
    uint8_t* ring = smem + (size_t)warp * a.st * a.slot_bytes;
    float* part = reinterpret_cast<float*>(smem + (size_t)W * a.st * a.slot_bytes);
    const int n_mine = b < a.tiles ? (a.tiles - 1 - b) / G + 1 : 0;
    const int total = n_mine * a.C;   // this CTA's items: j = tile_local_cta * C + chunk, tile = b + (j / C) * G

    auto stage = [&](int j, int s) {
        const int tile = b + (j / a.C) * G, chunk = j % a.C;
        const RowsMat m = SWIGLU ? a.mat[0] : rows_mat_of(a, tile);
        uint8_t* dst = ring + s * a.slot_bytes;
        rows_stage_mat(a, m, tile - m.tile_first, chunk, dst, lane);
        if (SWIGLU) rows_stage_mat(a, a.mat[1], tile, chunk, dst + a.up_off, lane);
    };
    // the first st items go out before griddepcontrol.wait: weights do not depend on the previous kernel
    for (int s = 0; s < a.st; ++s) {
        const int j = warp + s * W;
        if (j < total) stage(j, s);
        q::cp_async_commit();
    }
    pdl_wait();                // the pre-pass's codes (FX: x itself), the residual
    pdl_launch_dependents();
    RowsX x = a.x;
    if (FX) {   // while the first slots stream
        rows_quantize_cta<F == ROWS_Q80 || F == ROWS_Q50>(a, smem + a.fx_off, W, 0);
        x = rows_fx_x(a, smem + a.fx_off);
    }
    const int n_rounds = (n_mine + a.R - 1) / a.R;
    int q = 0;
    for (int rd = 0; rd < n_rounds; ++rd) {
        const int jend = min(total, (rd + 1) * a.R * a.C);
        for (;; ++q) {
            const int j = warp + q * W;
            if (j >= jend) break;
            rows_wait(a.st - 1);
            __syncwarp();
            const int tile = b + (j / a.C) * G, chunk = j % a.C;
            const uint8_t* slot = ring + (q % a.st) * a.slot_bytes;
            const RowsMat m = SWIGLU ? a.mat[0] : rows_mat_of(a, tile);
            float acc[NR][NTT][4];
            rows_zero(acc);
            rows_item<NTT, ODD, FX, F>(a, x, m, tile - m.tile_first, chunk, slot, g, t, acc[0]);
            if (SWIGLU) rows_item<NTT, ODD, FX, F>(a, x, a.mat[1], tile, chunk, slot + a.up_off, g, t, acc[NR - 1]);
            __syncwarp();      // every lane has read the slot before it is refilled
            const int jn = warp + (q + a.st) * W;
            if (jn < total) stage(jn, q % a.st);
            q::cp_async_commit();
            rows_put_partial(part, j - rd * a.R * a.C, lane, acc);
        }
        __syncthreads();
        rows_fold<NTT, SWIGLU>(a, part, b, G, rd, n_mine, threadIdx.x, blockDim.x);
        __syncthreads();
    }
    q::cp_async_wait<0>();
}

}  // namespace
}  // namespace fd
