// gemv_mma.cuh -- the GEMV of 2..8 x rows on int8 tensor cores (gemv.cu launches it for speculative verification
// and multi-row decode), bit for bit the one-row kernel's result for every row.
//
// Why: the one-row kernel (gemv.cuh) spends per 4 weights and per x row a shared-memory load and two dp4a, so a
// verify forward of 8 rows cost ~4x a decode step. Here one mma.sync (u8 weight codes x s8 x codes -> s32) does 16
// weight rows x one part (16 or 32 columns) x 8 x rows, twice (hi and lo codes): extra x rows cost no instructions
// (bench/lab/gemv_mma_lab.cu measured the idea: 8 rows at 1.15-1.3x one row).
//
// Status: exact (bit for bit on an H100 for every format, 2..8 rows) but slower than the one-row kernel's passes
// (results/2026-11-26-h100-gemv-mma-passes.txt: 8 rows of ffn_down 118 vs 77 us), so every tuning-table entry
// leaves it off. Measured since (ncu, results/2026-11-26-h100-gemv-mma-ncu-session11.txt): latency-bound, not the
// tensor cores -- one CTA a 16-row tile, few warps (8 x rows of x staged per CTA), each running a long dependent
// instruction stream per block step. Smaller units (one virtual lane each) were slower still. bench/NOTES.md
// (session 11) says what the next version needs: a parallel decode+mma phase apart from the serial float chains,
// and x quantized once per launch instead of per CTA.
//
// Same bits as gemv.cuh: the integer sums of a part are exact in both kernels (dp4a or mma), and the float work is
// row_dot_q8's, operation for operation. gemv.cuh's lane t of a row (lpr lanes a row) adds, in one fmaf chain,
// its pieces t, t + lpr, ... (piece p = block p / LPB, quarter p % LPB) part by part, and the lpr lanes then meet
// in an xor butterfly (offsets lpr / 2 .. 1), whose lane-0 result is the halving sum a[t] += a[t + off]. Here lane
// t is a "virtual lane": its chain is computed by one warp in the same order, and the halving sum is done in
// shared memory. The virtual lanes t = LPB gi .. LPB gi + LPB - 1 (a "group") together own whole blocks gi,
// gi + NG, ... (NG = lpr / LPB groups), so a unit of work is (16-row tile, group): the warp stages those blocks of
// its 16 rows (cp.async, double-buffered), and for each of the LPB pieces and each part runs one mma on the
// part's integer sums, then the LPB chains' float steps.
//
// Fragments (PTX mma.m16n8k32 / m16n8k16, 8-bit): thread (g = lane / 4, t = lane % 4) holds A rows g and g + 8,
// B column (x row) g, C rows g, g + 8 x columns 2t, 2t + 1. k-slots 4t..4t+3 are the 4 columns of the part's run
// t, k-slots 16 + 4t.. those of run t + 4 (32-column parts: 8 runs; 16-column parts: 4 runs, k16): a run's code
// word (Fmt::code_word) and its x codes (one 8-byte x8 group: hi word, lo word) are the A and B registers.
//
// SwiGLU launches take this path when gate and up have one format (their blocks are then the same units).
//
// Work: a CTA owns tiles c, c + G, ... (over all matrices of the launch), R at a time (a round); the round's units
// go to its warps round-robin; each unit writes its LPB chains' values to shared memory; after a barrier, warp
// i % W halves tile i's lpr chains and runs gemv.cuh's epilogue (bias, residual, SwiGLU).
#pragma once

#include "gemv.cuh"

namespace fd {
namespace {

using namespace fd::q;

constexpr int MMA_TILE_ROWS = 16;        // weight rows of a tile: the mma's M
constexpr int MMA_MAX_WARPS = 16;
constexpr int MMA_NX = 8;                // x rows of a pass (the mma's N); fewer are masked

// Formats the mma path runs: quantized, parts of 4 or 8 runs (16 or 32 columns).
template <int QT>
__host__ __device__ constexpr bool mma_format_ok() {
    if constexpr (Fmt<QT>::IS_FLOAT) return false;
    else return Fmt<QT>::RUNS / Fmt<QT>::PARTS == 4 || Fmt<QT>::RUNS / Fmt<QT>::PARTS == 8;
}
inline bool mma_format(int qtype) {
    switch (qtype) {
        case FD_Q_Q4_0: return mma_format_ok<FD_Q_Q4_0>();
        case FD_Q_Q4_1: return mma_format_ok<FD_Q_Q4_1>();
        case FD_Q_Q5_0: return mma_format_ok<FD_Q_Q5_0>();
        case FD_Q_Q8_0: return mma_format_ok<FD_Q_Q8_0>();
        case FD_Q_Q4_K: return mma_format_ok<FD_Q_Q4_K>();
        case FD_Q_Q5_K: return mma_format_ok<FD_Q_Q5_K>();
        case FD_Q_Q6_K: return mma_format_ok<FD_Q_Q6_K>();
        default: return false;
    }
}

struct MmaArgs {
    GemvArgs a;                  // matrices (lpr, pieces, rows), x, norm, residual, staged-x offsets (gemv_layout)
    int tile_first[MAX_MATS];    // first tile slot of each matrix
    int lpb[MAX_MATS];           // lanes (pieces) per block of each matrix's format
    int nblk[MAX_MATS];          // blocks per row
    int bb[MAX_MATS];            // bytes per block
    int n_tiles;                 // tile slots of all matrices (SwiGLU: of the gate)
    int round_tiles;             // R: tiles a CTA reduces per round
    int row_stride;              // bytes of one staged block row (stage_range_bytes of the largest block)
    int buf_bytes;               // one stage buffer: 16 rows (x 2 matrices for SwiGLU)
    int part_off_bytes;          // shared-memory offset of the chains' values
    int part_tile_floats;        // floats a tile's chains take: max lpr x 32 lanes x 4
};

#if FD_HAS_MMA
__device__ __forceinline__ void mma_k32(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int (&d)[4]) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%11,%12,%13};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}
__device__ __forceinline__ void mma_k16(uint32_t a0, uint32_t a1, uint32_t b0, int (&d)[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0), "r"(0), "r"(0), "r"(0));
}

// matrix k's fields by a run-time index (static indices only: no local copy of the kernel parameters)
__device__ __forceinline__ int mat_of_tile(const MmaArgs& p, int slot) {
    int m = 0;
#pragma unroll
    for (int k = 1; k < MAX_MATS; ++k)
        if (k < p.a.n_mats && slot >= p.tile_first[k]) m = k;
    return m;
}
template <class T, class F>
__device__ __forceinline__ T pick(int m, F f) {
    T r = f(0);
#pragma unroll
    for (int k = 1; k < MAX_MATS; ++k)
        if (k == m) r = f(k);
    return r;
}

// A warp's place in a round: unit u (tile i of the round, group gi), block k of the group (block gi + k NG).
struct MmaIter {
    int u, i, slot, m, gi, k, ng, nblk;
    __device__ __forceinline__ bool valid() const { return u >= 0; }
    __device__ __forceinline__ int blk() const { return gi + k * ng; }
    __device__ __forceinline__ bool last() const { return blk() + ng >= nblk; }   // also an empty unit's only step
};

// The iteration at (unit u, block k) of round r0 (tiles blockIdx.x + (r0 + i) G, i < nt); u = -1 past the end.
__device__ __forceinline__ MmaIter mma_iter(const MmaArgs& p, int r0, int nt, int u, int k) {
    int first = 0;
    for (int i = 0; i < nt; ++i) {
        const int slot = blockIdx.x + (r0 + i) * gridDim.x;
        const int m = mat_of_tile(p, slot);
        const int lpr = pick<int>(m, [&](int q) { return p.a.mat[q].lpr; });
        const int ng = lpr / pick<int>(m, [&](int q) { return p.lpb[q]; });
        if (u < first + ng)
            return MmaIter{u, i, slot, m, u - first, k, ng, pick<int>(m, [&](int q) { return p.nblk[q]; })};
        first += ng;
    }
    return MmaIter{-1, 0, 0, 0, 0, 0, 1, 0};
}
__device__ __forceinline__ MmaIter mma_next(const MmaArgs& p, int r0, int nt, const MmaIter& it, int n_warps) {
    if (!it.last()) { MmaIter n = it; ++n.k; return n; }
    return mma_iter(p, r0, nt, it.u + n_warps, 0);
}

// Stage block it.blk() of the tile's 16 rows (and of the up matrix's, SwiGLU) into buf: row r at r * row_stride.
template <bool SWIGLU>
__device__ __forceinline__ void mma_issue(const MmaArgs& p, const MmaIter& it, uint8_t* buf, int lane) {
    if (it.blk() >= it.nblk) return;   // an empty unit (more groups than blocks): nothing to read
    const int m = it.m;
    const int rows = pick<int>(m, [&](int q) { return p.a.mat[q].rows; });
    const int64_t rb = pick<int64_t>(m, [&](int q) { return p.a.mat[q].row_bytes; });
    const int bb = pick<int>(m, [&](int q) { return p.bb[q]; });
    const int tile = it.slot - pick<int>(m, [&](int q) { return p.tile_first[q]; });
    const uint8_t* w = pick<const uint8_t*>(m, [&](int q) { return p.a.mat[q].w; });
    for (int r = 0; r < MMA_TILE_ROWS; ++r) {
        const int row = min(tile * MMA_TILE_ROWS + r, rows - 1);   // past the last row: a copy of it, never written
        warp_stage(buf + r * p.row_stride, w + row * rb + (int64_t)it.blk() * bb, bb, lane);
        if (SWIGLU)
            warp_stage(buf + (MMA_TILE_ROWS + r) * p.row_stride, p.a.mat[1].w + row * rb + (int64_t)it.blk() * bb, bb,
                       lane);
    }
}

// The staged block's pieces: acc[j][e] continues virtual lane (gi LPB + j)'s chain, e = C element (rows g, g + 8
// x columns 2t, 2t + 1), exactly as row_dot_q8 (gemv_dot.cuh) does for one piece.
template <int QT>
__device__ __forceinline__ void mma_block(const uint8_t* wa, const uint8_t* wb, int blk, const XViews& xv, int n_x,
                                          int lane, float (&acc)[4][4]) {
    using F = Fmt<QT>;
    constexpr int RPP = F::RUNS / F::PARTS;
    constexpr int L = F::XL;
    constexpr int BLK_X8 = 8 * x8_group<L>(F::BE);
    constexpr uint32_t MASK = F::CODE_MASK * 0x01010101u;
    const int g = lane >> 2, t = lane & 3;
    const int nb = g < n_x ? g : 0;   // B column g = x row g (rows >= n_x: row 0's codes, results unused)
    const uint8_t* x8 = xv.x8[L] + nb * xv.x8_row[L] + blk * BLK_X8;
    const float* xsum = F::PART_COLS == 16 ? xv.xsum16 : xv.xsum32;
    const int xsum_row = F::PART_COLS == 16 ? xv.xsum16_row : xv.xsum32_row;
    int nc[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) nc[c] = 2 * t + c < n_x ? 2 * t + c : 0;
#pragma unroll
    for (int j = 0; j < F::LPB; ++j) {
        typename F::Raw ra, rb;
        F::template load<false>(wa, j, ra);
        F::template load<false>(wb, j, rb);
        float pa[2][F::PARTS], pb[2][F::PARTS];
        F::params(ra, j, pa[0], pb[0]);
        F::params(rb, j, pa[1], pb[1]);
#pragma unroll
        for (int part = 0; part < F::PARTS; ++part) {
            const int shift = F::part_shift(part);
            int ch[4], cl[4];
            if constexpr (RPP == 8) {
                const int r0 = part * 8 + t, r1 = r0 + 4;
                const uint32_t A[4] = {(F::code_word(ra, j, r0) >> shift) & MASK, (F::code_word(rb, j, r0) >> shift) & MASK,
                                       (F::code_word(ra, j, r1) >> shift) & MASK, (F::code_word(rb, j, r1) >> shift) & MASK};
                const uint2 x0 = *reinterpret_cast<const uint2*>(x8 + 8 * x8_group<L>(F::col(j, r0)));
                const uint2 x1 = *reinterpret_cast<const uint2*>(x8 + 8 * x8_group<L>(F::col(j, r1)));
                mma_k32(A, x0.x, x1.x, ch);
                mma_k32(A, x0.y, x1.y, cl);
            } else {
                const int r0 = part * 4 + t;
                const uint32_t a0 = (F::code_word(ra, j, r0) >> shift) & MASK, a1 = (F::code_word(rb, j, r0) >> shift) & MASK;
                const uint2 x0 = *reinterpret_cast<const uint2*>(x8 + 8 * x8_group<L>(F::col(j, r0)));
                mma_k16(a0, a1, x0.x, ch);
                mma_k16(a0, a1, x0.y, cl);
            }
            const int grp = F::part_group(blk, j, part);
            const int blk32 = grp * F::PART_COLS / 32;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e >> 1, n = nc[e & 1];
                const float bbv = fmaf(-(float)F::OFFSET, pa[r][part], pb[r][part]);   // b - a * OFFSET
                const float cx = xv.xsc[n * xv.xsc_row + blk32] * fmaf((float)cl[e], 1.0f / XQ_LO, (float)ch[e]);
                acc[j][e] = fmaf(pa[r][part], cx, fmaf(bbv, xsum[n * xsum_row + grp], acc[j][e]));
            }
        }
    }
}

struct MmaBlock {   // mma_block for the qtype chosen at run time
    const uint8_t *wa, *wb;
    int blk, n_x, lane;
    const XViews* xv;
    float (*acc)[4][4];
    template <int QT>
    __device__ __forceinline__ void run() {
        if constexpr (mma_format_ok<QT>()) mma_block<QT>(wa, wb, blk, *xv, n_x, lane, *acc);
    }
};

template <bool SWIGLU>
__device__ __forceinline__ void mma_compute(const MmaArgs& p, const MmaIter& it, const uint8_t* buf, const XViews& xv,
                                            int lane, float (&acc)[4][4], float (&acc_u)[4][4]) {
    if (it.blk() >= it.nblk) return;
    const int m = it.m, g = lane >> 2;
    const int64_t rb = pick<int64_t>(m, [&](int q) { return p.a.mat[q].row_bytes; });
    const int bb = pick<int>(m, [&](int q) { return p.bb[q]; });
    const int rows = pick<int>(m, [&](int q) { return p.a.mat[q].rows; });
    const int tile = it.slot - pick<int>(m, [&](int q) { return p.tile_first[q]; });
    const uint8_t* w = pick<const uint8_t*>(m, [&](int q) { return p.a.mat[q].w; });
    const int qtype = pick<int>(m, [&](int q) { return p.a.mat[q].qtype; });
    const int64_t off = (int64_t)it.blk() * bb;
    const int ra = min(tile * MMA_TILE_ROWS + g, rows - 1), rbr = min(tile * MMA_TILE_ROWS + g + 8, rows - 1);
    const uint8_t* wa = buf + g * p.row_stride + (reinterpret_cast<uintptr_t>(w + ra * rb + off) & 15);
    const uint8_t* wb = buf + (g + 8) * p.row_stride + (reinterpret_cast<uintptr_t>(w + rbr * rb + off) & 15);
    MmaBlock fn{wa, wb, it.blk(), p.a.n_x, lane, &xv, &acc};
    dispatch_qtype(qtype, fn);
    if (SWIGLU) {
        const uint8_t* u = p.a.mat[1].w;
        const uint8_t* ua = buf + (MMA_TILE_ROWS + g) * p.row_stride + (reinterpret_cast<uintptr_t>(u + ra * rb + off) & 15);
        const uint8_t* ub = buf + (MMA_TILE_ROWS + g + 8) * p.row_stride +
                            (reinterpret_cast<uintptr_t>(u + rbr * rb + off) & 15);
        MmaBlock fu{ua, ub, it.blk(), p.a.n_x, lane, &xv, &acc_u};
        dispatch_qtype(p.a.mat[1].qtype, fu);
    }
}

// Virtual lanes gi LPB + j's chains into the round's tile i (float4 per (lane, chain): the 4 C elements).
__device__ __forceinline__ void mma_store(float* part, const MmaArgs& p, const MmaIter& it, int lane,
                                          const float (&acc)[4][4]) {
    const int lpb = pick<int>(it.m, [&](int q) { return p.lpb[q]; });
    float4* dst = reinterpret_cast<float4*>(part + (size_t)it.i * p.part_tile_floats);
#pragma unroll
    for (int j = 0; j < 4; ++j)   // static j: acc stays in registers
        if (j < lpb) dst[(it.gi * lpb + j) * 32 + lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
}

// Tile i's lpr chains halved in place (a[t] += a[t + off], off = lpr / 2 .. 1: the xor butterfly's lane-0 sum).
__device__ __forceinline__ float4 mma_halve(float* part, const MmaArgs& p, int i, int lpr, int lane) {
    float4* a = reinterpret_cast<float4*>(part + (size_t)i * p.part_tile_floats) + lane;
    for (int off = lpr >> 1; off > 0; off >>= 1)
        for (int v = 0; v < off; ++v) {
            float4 x = a[v * 32];
            const float4 y = a[(v + off) * 32];
            x.x += y.x; x.y += y.y; x.z += y.z; x.w += y.w;
            a[v * 32] = x;
        }
    return a[0];
}

template <bool SWIGLU>
__global__ void __launch_bounds__(MMA_MAX_WARPS * 32, 1) gemv_mma_kernel(const MmaArgs p) {
    extern __shared__ __align__(16) uint8_t smem[];
    float* smf = reinterpret_cast<float*>(smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    uint8_t* bufs = smem + p.a.stage_off_bytes + (size_t)warp * 2 * p.buf_bytes;
    float* part = reinterpret_cast<float*>(smem + p.part_off_bytes);
    float* part_u = part + (size_t)p.round_tiles * p.part_tile_floats;   // SwiGLU: the up matrix's chains
    const int c = blockIdx.x, G = gridDim.x;
    const int n_mine = c < p.n_tiles ? (p.n_tiles - 1 - c) / G + 1 : 0;

    int nt = min(p.round_tiles, n_mine);
    MmaIter it = mma_iter(p, 0, nt, warp, 0);
    if (it.valid()) mma_issue<SWIGLU>(p, it, bufs, lane);   // weights in flight during the prologue ...
    cp_async_commit();
    pdl_wait();   // ... and while the previous kernel finishes writing x (and the residual)
    pdl_launch_dependents();
    stage_xq<MMA_NX>(p.a, smem, smf);
    const XViews xv = x_views(p.a, smf);

    for (int r0 = 0; r0 < n_mine; r0 += p.round_tiles) {
        nt = min(p.round_tiles, n_mine - r0);
        if (r0 > 0) {
            it = mma_iter(p, r0, nt, warp, 0);
            if (it.valid()) mma_issue<SWIGLU>(p, it, bufs, lane);
            cp_async_commit();
        }
        float acc[4][4], acc_u[4][4];
        int bi = 0;
        while (it.valid()) {
            const MmaIter nx = mma_next(p, r0, nt, it, n_warps);
            if (nx.valid()) mma_issue<SWIGLU>(p, nx, bufs + (bi ^ 1) * p.buf_bytes, lane);
            cp_async_commit();
            cp_async_wait<1>();   // this lane's copies of it are done ...
            __syncwarp();         // ... and every lane's are visible
            if (it.k == 0) {
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[j][e] = acc_u[j][e] = 0.0f;
            }
            mma_compute<SWIGLU>(p, it, bufs + bi * p.buf_bytes, xv, lane, acc, acc_u);
            if (it.last()) {
                mma_store(part, p, it, lane, acc);
                if (SWIGLU) mma_store(part_u, p, it, lane, acc_u);
            }
            __syncwarp();         // the buffer is refilled by a later issue
            it = nx;
            bi ^= 1;
        }
        cp_async_wait<0>();
        __syncthreads();
        for (int i = warp; i < nt; i += n_warps) {   // tile i: halve its chains, then gemv.cuh's epilogue
            const int slot = c + (r0 + i) * G;
            const int m = mat_of_tile(p, slot);
            const int lpr = pick<int>(m, [&](int q) { return p.a.mat[q].lpr; });
            const int rows = pick<int>(m, [&](int q) { return p.a.mat[q].rows; });
            const int tile = slot - pick<int>(m, [&](int q) { return p.tile_first[q]; });
            float* y = pick<float*>(m, [&](int q) { return p.a.mat[q].y; });
            const float* bias = pick<const float*>(m, [&](int q) { return p.a.mat[q].bias; });
            const float4 s = mma_halve(part, p, i, lpr, lane);
            float4 su = make_float4(0.f, 0.f, 0.f, 0.f);
            if (SWIGLU) su = mma_halve(part_u, p, i, lpr, lane);
            const float sv[4] = {s.x, s.y, s.z, s.w}, su4[4] = {su.x, su.y, su.z, su.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = tile * MMA_TILE_ROWS + g + 8 * (e >> 1), n = 2 * t + (e & 1);
                if (row >= rows || n >= p.a.n_x) continue;
                const int64_t o = (int64_t)n * rows + row;
                if (SWIGLU) {
                    y[o] = silu(sv[e]) * su4[e];
                } else {
                    const float b = bias ? bias[row] : 0.0f;
                    float v = sv[e] + b;
                    if (p.a.residual) v += __ldcg(p.a.residual + o);   // y may alias the residual
                    y[o] = v;
                }
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
}
#endif  // FD_HAS_MMA

}  // namespace
}  // namespace fd
