// gemv_rows_item.cuh -- what one warp of gemv_rows.cuh computes for one item: the integer dot products of 16 weight
// rows x one chunk of columns x up to 32 x rows on int8 tensor cores, and the float chains of each (row, x row)
// over the chunk's sub-blocks. Q4_K: mma.m16n8k32 u8 x s8 per 32-column sub-block; Q6_K: m16n8k16 s8 x s8 per 16
// columns (Q6_K has a scale per 16 values); Q8_0 and Q5_0: m16n8k32 s8 x s8 per 32-column block (Q5_0's 5-bit
// codes q - 16 in [-16, 15] are int8 values as they are). Ported from
// bench/lab/gemv_mma_rows_lab.cu (its --host-check emulated these fragment builders against the PTX tables and the
// ggml layouts; its GPU run checked them against float64), with the chunk length a runtime count (a row's last
// chunk may be shorter) and the rows' shared-memory addresses passed in.
//
// Fragments (PTX m16n8k32 / m16n8k16, 8-bit): thread (g = lane / 4, t = lane % 4) holds A rows g and g + 8, B
// column (x row) g of the N-tile, C rows g, g + 8 x columns 2t, 2t + 1. acc[nt][e]: e = 0 (row g, x row nt*8 + 2t),
// 1 (g, 2t + 1), 2 (g + 8, 2t), 3 (g + 8, 2t + 1). One decoded A fragment serves every N-tile (weights are A, x
// rows are B), so extra x rows cost one mma and one float chain step each, no weight decoding.
//
// Numerics (why a row's bits depend on nothing but its own x row and the chunk): the mma's integer sums are exact
// and column i depends only on x row i; the float work per (row, x row) is explicitly rounded operations (__fmul_rn,
// fmaf, __fadd_rn) in a fixed order -- Q4_K and Q6_K: four chains over the sub-blocks (every fourth), added as
// (C0 + C1) + (C2 + C3), so that at n == 1, where the fragment's four column pairs hold the same x row, each lane of
// a group runs one chain (a quarter of the float work; bench/NOTES.md session 24); Q8_0 / Q5_0: one chain in block
// order.
// int32 -> float: __int2float_rn, exact for |v| < 2^24 (|isum| <= 32 * 15 * 127 or 16 * 32 * 127); on sm_90 one
// I2FP.F32.S32 where the 1.5 * 2^23 trick took an IADD3 and an FADD (the same bits: both exact in this range).
#pragma once

#include "quant_stage.cuh"

#include <cuda_fp16.h>

namespace fd {
namespace {

constexpr int ROWS_NX = 32;       // x rows a launch takes (4 N-tiles of 8); the x scratch holds that many
constexpr int ROWS_QK = 256;      // columns of a "super-block": the chunk unit (Q8_0: 8 blocks of 32)

// The formats this path runs, as gemv_rows.cuh numbers them (FD_Q_* -> ROWS_*).
enum { ROWS_Q4K = 0, ROWS_Q6K = 1, ROWS_Q80 = 2, ROWS_Q50 = 3 };
inline int rows_fmt(int qtype) {
    return qtype == FD_Q_Q4_K ? ROWS_Q4K : qtype == FD_Q_Q6_K ? ROWS_Q6K : qtype == FD_Q_Q8_0 ? ROWS_Q80
         : qtype == FD_Q_Q5_0 ? ROWS_Q50 : -1;
}
// formats of 32-column blocks (chunks count blocks; cols need only be a multiple of 32) and a block's bytes
__host__ __device__ constexpr bool rows_blk32(int f) { return f == ROWS_Q80 || f == ROWS_Q50; }
__host__ __device__ constexpr int rows_blk32_bytes(int f) { return f == ROWS_Q80 ? 34 : 22; }
// bytes of one chunk unit (256 columns) in each format
__host__ __device__ constexpr int rows_unit_bytes(int f) {
    return f == ROWS_Q4K ? 144 : (f == ROWS_Q6K ? 210 : 8 * rows_blk32_bytes(f));
}

// ---- exact arithmetic -----------------------------------------------------------------------------------------
__device__ __forceinline__ float rows_i2f(int v) { return __int2float_rn(v); }
// a 32-bit word from a 2-byte-aligned shared-memory address (Q6_K rows, Q8_0 blocks)
__device__ __forceinline__ uint32_t rows_ld32u(const uint8_t* p) {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
    return (uint32_t)q[0] | ((uint32_t)q[1] << 16);
}

// ---- the three mma shapes (s32 accumulate from zero) ------------------------------------------------------------
__device__ __forceinline__ void rows_mma_k32_u8s8(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int (&d)[4]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}
__device__ __forceinline__ void rows_mma_k32_s8s8(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int (&d)[4]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}
__device__ __forceinline__ void rows_mma_k16_s8s8(uint32_t a0, uint32_t a1, uint32_t b0, int (&d)[4]) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0), "r"(0), "r"(0), "r"(0));
}

// ---- fragment builders ----------------------------------------------------------------------------------------
// Q4_K sub-block j = 2p + hh of rows g (qa) and g + 8 (qb); qa / qb = code bytes 8t..8t+7 of pair p's 32 bytes.
// k-slot 4t+i <-> column 8t+i, slot 16+4t+i <-> column 8t+4+i (the x codes are loaded the same way).
__device__ __forceinline__ void rows_q4k_a(uint2 qa, uint2 qb, int hh, uint32_t (&A)[4]) {
    const int s = 4 * hh;
    A[0] = (qa.x >> s) & 0x0F0F0F0Fu;
    A[1] = (qb.x >> s) & 0x0F0F0F0Fu;
    A[2] = (qa.y >> s) & 0x0F0F0F0Fu;
    A[3] = (qb.y >> s) & 0x0F0F0F0Fu;
}
// Q6_K: the 4 values l = 16u + 4t .. +3 of group (h, s) of one row as int8 q - 32, from the words of
// ql[64h + 16u + 4t] (ql0), ql[64h + 32 + 16u + 4t] (ql1) and qh[32h + 16u + 4t] (qh).
// (q - 32) mod 256 = lo + 16 * ((hi2 + 14) mod 16); per byte hi2 + 14 <= 17 never carries into the next byte,
// and the carry out of bit 3 lands in the next byte's low nibble, which the mask clears.
__device__ __forceinline__ uint32_t rows_q6k_a(uint32_t ql0, uint32_t ql1, uint32_t qh, int s) {
    const uint32_t lo = ((s & 1 ? ql1 : ql0) >> (4 * (s >> 1))) & 0x0F0F0F0Fu;
    const uint32_t hi = ((((qh >> (2 * s)) & 0x03030303u) + 0x0E0E0E0Eu) << 4) & 0xF0F0F0F0u;
    return lo | hi;
}
// Q4_K: all 8 sub-blocks' 6-bit (scale, min) of one super-block at once from the header words (scale bytes
// q[0..11] in h.y, h.z, h.w), one byte each: sm.x = scales 0..3, sm.y = scales 4..7, sm.z = mins 0..3, sm.w = mins
// 4..7 -- ggml's get_scale_min_k4 (j < 4: q[j] & 63, q[j + 4] & 63; j >= 4: (q[j + 4] & 15) | (q[j - 4] >> 6) << 4,
// (q[j + 4] >> 4) | (q[j] >> 6) << 4) in SWAR, once a super-block instead of once a sub-block.
__device__ __forceinline__ uint4 rows_scales_mins(const uint4& h) {
    return make_uint4(h.y & 0x3F3F3F3Fu, (h.w & 0x0F0F0F0Fu) | (((h.y >> 6) & 0x03030303u) << 4),
                      h.z & 0x3F3F3F3Fu, ((h.w >> 4) & 0x0F0F0F0Fu) | (((h.z >> 6) & 0x03030303u) << 4));
}
// byte i (compile-time) of w as a float, exactly: 0x4B0000bb (one byte permute) is 2^23 + bb
__device__ __forceinline__ float rows_byte2f(uint32_t w, int i) {
    return __fsub_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | (uint32_t)i)), 8388608.0f);
}

// The activations of a launch: x' = xd * q per 32 columns, either the pre-pass's scratch in global memory
// (gemv_rows_quantize_x; SX = false) or the CTA's own copy in shared memory (rows_quantize_cta; SX = true), the
// same bits either way.
struct RowsX {
    const int8_t* q;      // (rows, cols) codes; rows >= n hold stale values whose outputs are never written
    const float2* sc;     // (cols / 32, sc_stride): {xd, xd * sum of the block's codes}
    int cols;
    int last;             // shared memory: the last row a B fragment may read (n - 1, n <= 8); scratch: unused
};
// x rows a scale row holds: ROWS_NX in the scratch, 8 in a CTA's copy (float4 reads of rows 2t, 2t + 1 of N-tile 0)
template <bool SX>
constexpr int rows_sc_stride() { return SX ? 8 : ROWS_NX; }

// x loads: __ldg from the scratch, plain loads from shared memory (a .nc load of a shared address would fault)
template <bool SX, class T>
__device__ __forceinline__ T rows_ldx(const void* p) {
    if constexpr (SX) return *reinterpret_cast<const T*>(p);
    else return __ldg(reinterpret_cast<const T*>(p));
}
// The first code of B-fragment column g (x row g of N-tile 0) at column 0. n == 1 (!ODD): every column reads x row
// 0 (one broadcast load instead of 8 rows' sectors; columns 1..7 of the result are never written); otherwise row g,
// in shared memory clamped to x.last so a copy of n <= 8 rows is never read past its end (columns >= n: unused).
template <bool ODD, bool SX>
__device__ __forceinline__ const int8_t* rows_xrow(const RowsX& x, int g) {
    return x.q + (size_t)(ODD ? (SX ? min(g, x.last) : g) : 0) * x.cols;
}

// ---- items: r0 / r1 = the staged bytes of rows g and g + 8 at the chunk's first byte ---------------------------
// Q4_K: super-blocks sb0 .. sb0 + nk - 1 of the row, 8 sub-blocks j of 32 columns each. A (row, x row)'s partial is
// four chains added as (C0 + C1) + (C2 + C3); chain c runs over the sub-blocks j = c and j = c + 4 of each
// super-block in order, each step acc = fmaf(d*sc_j, xd*isum, acc); acc = fmaf(-(dmin*m_j), xd * sum(x codes), acc).
// Why four chains: at n == 1 the fragment's four column pairs (t = 0..3) all hold x row 0, so lane t runs chain t
// alone -- a quarter of the float work of one chain a lane -- and two shuffles add the chains; with more x rows
// each lane runs the four chains of its own columns (rows_q4k_chains: together up to 16 x rows, one after another
// beyond), the same operations on the same values in the same order, so a row's bits never depend on n. The partial
// is written to acc.
// The four chains' sum, added in the fixed order as chain c's accumulators arrive (c = 0, 1, 2, 3): tot = C0,
// tot = C0 + C1, keep = C2, tot = (C0 + C1) + (C2 + C3).
template <int NT>
__device__ __forceinline__ void rows_chain_add(int c, const float (&cc)[NT][4], float (&tot)[NT][4],
                                               float (&keep)[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (c == 0) tot[nt][e] = cc[nt][e];
            else if (c == 1) tot[nt][e] = __fadd_rn(tot[nt][e], cc[nt][e]);
            else if (c == 2) keep[nt][e] = cc[nt][e];
            else tot[nt][e] = __fadd_rn(tot[nt][e], __fadd_rn(keep[nt][e], cc[nt][e]));
        }
}

// Chains a pass over the chunk: all four where their accumulators fit (NT <= 2: the steps in sub-block order, each
// into its chain's), else one (a pass a chain, so three chains' accumulators are alive at most). Each chain's steps
// run in the same order either way.
template <int NT>
constexpr int rows_chains_a_pass() { return NT <= 2 ? 4 : 1; }

template <int NT, bool SX>
__device__ __forceinline__ void rows_q4k_chains(const RowsX& x, const uint8_t* r0, const uint8_t* r1, int sb0, int nk,
                                                int g, int t, float (&acc)[NT][4]) {
    constexpr int SCS = rows_sc_stride<SX>(), CPP = rows_chains_a_pass<NT>();
    const int8_t* xb = rows_xrow<true, SX>(x, g) + 8 * t + sb0 * ROWS_QK;
    const float2* sb = x.sc + sb0 * 8 * SCS + 2 * t;   // x rows 2t, 2t + 1 of N-tile 0
    float tot[NT][4], keep[NT][4];
#pragma unroll
    for (int pass = 0; pass < 4 / CPP; ++pass) {
        float cc[CPP][NT][4];
#pragma unroll
        for (int ci = 0; ci < CPP; ++ci)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) cc[ci][nt][e] = 0.0f;
#pragma unroll 1
        for (int k = 0; k < nk; ++k) {
            const int8_t* xk = xb + k * ROWS_QK;      // column (sb0 + k) * 256 + 8t of x row g
            const float2* sk = sb + k * 8 * SCS;      // scales of the super-block's first 32 columns
            const uint4 h0 = *reinterpret_cast<const uint4*>(r0 + k * 144);
            const uint4 h1 = *reinterpret_cast<const uint4*>(r1 + k * 144);
            const float2 dm0 = __half22float2(*reinterpret_cast<const __half2*>(&h0.x));
            const float2 dm1 = __half22float2(*reinterpret_cast<const __half2*>(&h1.x));
            const uint4 sm0 = rows_scales_mins(h0), sm1 = rows_scales_mins(h1);
#pragma unroll
            for (int jj = 0; jj < 2 * CPP; ++jj) {
                const int j = CPP == 4 ? jj : pass + 4 * jj;   // compile-time: sub-block, its chain j & 3
                const int c = j & 3, ci = CPP == 4 ? c : 0, p = j >> 1, hh = j & 1, half = j >> 2;
                const uint2 qa = *reinterpret_cast<const uint2*>(r0 + k * 144 + 16 + 32 * p + 8 * t);
                const uint2 qb = *reinterpret_cast<const uint2*>(r1 + k * 144 + 16 + 32 * p + 8 * t);
                uint32_t A[4];
                rows_q4k_a(qa, qb, hh, A);
                const uint32_t s0 = half ? sm0.y : sm0.x, s1 = half ? sm1.y : sm1.x;
                const uint32_t m0 = half ? sm0.w : sm0.z, m1 = half ? sm1.w : sm1.z;
                const float wa[2] = {__fmul_rn(dm0.x, rows_byte2f(s0, c)), __fmul_rn(dm1.x, rows_byte2f(s1, c))};
                const float wb[2] = {-__fmul_rn(dm0.y, rows_byte2f(m0, c)), -__fmul_rn(dm1.y, rows_byte2f(m1, c))};
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const uint2 B = rows_ldx<SX, uint2>(xk + nt * 8 * x.cols + 32 * j);
                    const float4 xs = rows_ldx<SX, float4>(sk + j * SCS + nt * 8);
                    int cs[4];
                    rows_mma_k32_u8s8(A, B.x, B.y, cs);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int r = e >> 1;
                        const float xd = (e & 1) ? xs.z : xs.x, xsum = (e & 1) ? xs.w : xs.y;
                        cc[ci][nt][e] = fmaf(wa[r], __fmul_rn(xd, rows_i2f(cs[e])), cc[ci][nt][e]);
                        cc[ci][nt][e] = fmaf(wb[r], xsum, cc[ci][nt][e]);
                    }
                }
            }
        }
#pragma unroll
        for (int ci = 0; ci < CPP; ++ci) rows_chain_add<NT>(CPP == 4 ? ci : pass, cc[ci], tot, keep);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = tot[nt][e];
}

// n == 1: every B column is x row 0, so every lane's mma results are x row 0's; lane t keeps those of its sub-blocks
// j = t and t + 4 (selects), runs chain t on them, and the lanes add their chains: (C0 + C1) + (C2 + C3) in lanes 0
// and 1 as in 2 and 3 (the additions commute bit for bit). acc[0][0] / [0][2]: rows g / g + 8.
template <bool SX>
__device__ __forceinline__ void rows_q4k_one(const RowsX& x, const uint8_t* r0, const uint8_t* r1, int sb0, int nk,
                                             int g, int t, float (&acc)[1][4]) {
    constexpr int SCS = rows_sc_stride<SX>();
    const int8_t* xb = rows_xrow<false, SX>(x, g) + 8 * t + sb0 * ROWS_QK;
    const float2* sb = x.sc + sb0 * 8 * SCS;           // x row 0's scales
    float a0 = 0.0f, a1 = 0.0f;                         // chain t of rows g and g + 8
#pragma unroll 1
    for (int k = 0; k < nk; ++k) {
        const int8_t* xk = xb + k * ROWS_QK;
        const float2* sk = sb + k * 8 * SCS;
        const float2 xlo = rows_ldx<SX, float2>(sk + t * SCS), xhi = rows_ldx<SX, float2>(sk + (t + 4) * SCS);
        const uint4 h0 = *reinterpret_cast<const uint4*>(r0 + k * 144);
        const uint4 h1 = *reinterpret_cast<const uint4*>(r1 + k * 144);
        int lo0 = 0, lo1 = 0, hi0 = 0, hi1 = 0;   // isum of sub-blocks t / t + 4, rows g / g + 8
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            const uint2 qa = *reinterpret_cast<const uint2*>(r0 + k * 144 + 16 + 32 * p + 8 * t);
            const uint2 qb = *reinterpret_cast<const uint2*>(r1 + k * 144 + 16 + 32 * p + 8 * t);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int j = 2 * p + hh;
                uint32_t A[4];
                rows_q4k_a(qa, qb, hh, A);
                const uint2 B = rows_ldx<SX, uint2>(xk + 32 * j);
                int cs[4];
                rows_mma_k32_u8s8(A, B.x, B.y, cs);
                if (j == t) { lo0 = cs[0]; lo1 = cs[2]; }
                if (j == t + 4) { hi0 = cs[0]; hi1 = cs[2]; }
            }
        }
        const float2 dm0 = __half22float2(*reinterpret_cast<const __half2*>(&h0.x));
        const float2 dm1 = __half22float2(*reinterpret_cast<const __half2*>(&h1.x));
        const uint4 sm0 = rows_scales_mins(h0), sm1 = rows_scales_mins(h1);
        a0 = fmaf(__fmul_rn(dm0.x, rows_byte2f(sm0.x, t)), __fmul_rn(xlo.x, rows_i2f(lo0)), a0);
        a0 = fmaf(-__fmul_rn(dm0.y, rows_byte2f(sm0.z, t)), xlo.y, a0);
        a1 = fmaf(__fmul_rn(dm1.x, rows_byte2f(sm1.x, t)), __fmul_rn(xlo.x, rows_i2f(lo1)), a1);
        a1 = fmaf(-__fmul_rn(dm1.y, rows_byte2f(sm1.z, t)), xlo.y, a1);
        a0 = fmaf(__fmul_rn(dm0.x, rows_byte2f(sm0.y, t)), __fmul_rn(xhi.x, rows_i2f(hi0)), a0);
        a0 = fmaf(-__fmul_rn(dm0.y, rows_byte2f(sm0.w, t)), xhi.y, a0);
        a1 = fmaf(__fmul_rn(dm1.x, rows_byte2f(sm1.y, t)), __fmul_rn(xhi.x, rows_i2f(hi1)), a1);
        a1 = fmaf(-__fmul_rn(dm1.y, rows_byte2f(sm1.w, t)), xhi.y, a1);
    }
    a0 = __fadd_rn(a0, __shfl_xor_sync(0xffffffffu, a0, 1));
    a1 = __fadd_rn(a1, __shfl_xor_sync(0xffffffffu, a1, 1));
    acc[0][0] = __fadd_rn(a0, __shfl_xor_sync(0xffffffffu, a0, 2));
    acc[0][2] = __fadd_rn(a1, __shfl_xor_sync(0xffffffffu, a1, 2));
}

template <int NT, bool ODD, bool SX>
__device__ __forceinline__ void rows_item_q4k(const RowsX& x, const uint8_t* r0, const uint8_t* r1, int sb0, int nk,
                                              int g, int t, float (&acc)[NT][4]) {
    if constexpr (ODD) rows_q4k_chains<NT, SX>(x, r0, r1, sb0, nk, g, t, acc);
    else rows_q4k_one<SX>(x, r0, r1, sb0, nk, g, t, acc);
}

// Q6_K (block_q6_K: ql[128], qh[64], int8 scales[16], f16 d = 210 B, only 2-byte aligned): 16 sub-blocks of 16
// columns (h, u, s: columns 128h + 32s + 16u), each step acc = fmaf(d*sc, xd*isum, acc). As Q4_K's, four chains
// added as (C0 + C1) + (C2 + C3): chain c runs over the sub-blocks with s = c, in the order super-block, h, u -- at
// n == 1 lane t runs chain t alone (rows_q6k_one), with more x rows each lane all four (rows_q6k_chains).
template <int NT, bool SX>
__device__ __forceinline__ void rows_q6k_chains(const RowsX& x, const uint8_t* r0, const uint8_t* r1, int sb0, int nk,
                                                int g, int t, float (&acc)[NT][4]) {
    constexpr int SCS = rows_sc_stride<SX>(), CPP = rows_chains_a_pass<NT>();
    const int8_t* xb = rows_xrow<true, SX>(x, g) + 4 * t + sb0 * ROWS_QK;
    const float2* sb = x.sc + sb0 * 8 * SCS + 2 * t;
    float tot[NT][4], keep[NT][4];
#pragma unroll
    for (int pass = 0; pass < 4 / CPP; ++pass) {
        float cc[CPP][NT][4];
#pragma unroll
        for (int ci = 0; ci < CPP; ++ci)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) cc[ci][nt][e] = 0.0f;
#pragma unroll 1
        for (int k = 0; k < nk; ++k) {
            const int8_t* xk = xb + k * ROWS_QK;   // as rows_item_q4k: one base a super-block
            const float2* sk = sb + k * 8 * SCS;
            const uint8_t* b0 = r0 + k * 210;
            const uint8_t* b1 = r1 + k * 210;
            const float d0 = __half2float(*reinterpret_cast<const __half*>(b0 + 208));
            const float d1 = __half2float(*reinterpret_cast<const __half*>(b1 + 208));
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    const uint32_t l00 = rows_ld32u(b0 + 64 * h + 16 * u + 4 * t), l01 = rows_ld32u(b0 + 64 * h + 32 + 16 * u + 4 * t);
                    const uint32_t l10 = rows_ld32u(b1 + 64 * h + 16 * u + 4 * t), l11 = rows_ld32u(b1 + 64 * h + 32 + 16 * u + 4 * t);
                    const uint32_t qh0 = rows_ld32u(b0 + 128 + 32 * h + 16 * u + 4 * t);
                    const uint32_t qh1 = rows_ld32u(b1 + 128 + 32 * h + 16 * u + 4 * t);
#pragma unroll
                    for (int ci = 0; ci < CPP; ++ci) {
                        const int c = CPP == 4 ? ci : pass;   // s: the sub-block's chain (compile-time)
                        const uint32_t a0 = rows_q6k_a(l00, l01, qh0, c), a1 = rows_q6k_a(l10, l11, qh1, c);
                        const int sci = 8 * h + 2 * c + u;
                        const float w[2] = {__fmul_rn(d0, rows_i2f((int)(int8_t)b0[192 + sci])),
                                            __fmul_rn(d1, rows_i2f((int)(int8_t)b1[192 + sci]))};
                        const int colb = 128 * h + 32 * c + 16 * u;   // within the super-block
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) {
                            const uint32_t B = rows_ldx<SX, uint32_t>(xk + nt * 8 * x.cols + colb);
                            const float4 xs = rows_ldx<SX, float4>(sk + (colb >> 5) * SCS + nt * 8);
                            int cs[4];
                            rows_mma_k16_s8s8(a0, a1, B, cs);
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const float xd = (e & 1) ? xs.z : xs.x;
                                cc[ci][nt][e] = fmaf(w[e >> 1], __fmul_rn(xd, rows_i2f(cs[e])), cc[ci][nt][e]);
                            }
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int ci = 0; ci < CPP; ++ci) rows_chain_add<NT>(CPP == 4 ? ci : pass, cc[ci], tot, keep);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = tot[nt][e];
}

template <bool SX>
__device__ __forceinline__ void rows_q6k_one(const RowsX& x, const uint8_t* r0, const uint8_t* r1, int sb0, int nk,
                                             int g, int t, float (&acc)[1][4]) {
    constexpr int SCS = rows_sc_stride<SX>();
    const int8_t* xb = rows_xrow<false, SX>(x, g) + 4 * t + sb0 * ROWS_QK;
    const float2* sb = x.sc + sb0 * 8 * SCS;            // x row 0's scales
    float a0 = 0.0f, a1 = 0.0f;                          // chain t of rows g and g + 8
#pragma unroll 1
    for (int k = 0; k < nk; ++k) {
        const int8_t* xk = xb + k * ROWS_QK;
        const float2* sk = sb + k * 8 * SCS;
        const uint8_t* b0 = r0 + k * 210;
        const uint8_t* b1 = r1 + k * 210;
        const float d0 = __half2float(*reinterpret_cast<const __half*>(b0 + 208));
        const float d1 = __half2float(*reinterpret_cast<const __half*>(b1 + 208));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const uint32_t l00 = rows_ld32u(b0 + 64 * h + 16 * u + 4 * t), l01 = rows_ld32u(b0 + 64 * h + 32 + 16 * u + 4 * t);
                const uint32_t l10 = rows_ld32u(b1 + 64 * h + 16 * u + 4 * t), l11 = rows_ld32u(b1 + 64 * h + 32 + 16 * u + 4 * t);
                const uint32_t qh0 = rows_ld32u(b0 + 128 + 32 * h + 16 * u + 4 * t);
                const uint32_t qh1 = rows_ld32u(b1 + 128 + 32 * h + 16 * u + 4 * t);
                int i0 = 0, i1 = 0;   // isum of sub-block (h, u, s = t), rows g / g + 8
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    const uint32_t B = rows_ldx<SX, uint32_t>(xk + 128 * h + 32 * s + 16 * u);
                    int cs[4];
                    rows_mma_k16_s8s8(rows_q6k_a(l00, l01, qh0, s), rows_q6k_a(l10, l11, qh1, s), B, cs);
                    if (s == t) { i0 = cs[0]; i1 = cs[2]; }
                }
                const int sci = 8 * h + 2 * t + u;
                const float xd = rows_ldx<SX, float2>(sk + (4 * h + t) * SCS).x;
                a0 = fmaf(__fmul_rn(d0, rows_i2f((int)(int8_t)b0[192 + sci])), __fmul_rn(xd, rows_i2f(i0)), a0);
                a1 = fmaf(__fmul_rn(d1, rows_i2f((int)(int8_t)b1[192 + sci])), __fmul_rn(xd, rows_i2f(i1)), a1);
            }
        }
    }
    a0 = __fadd_rn(a0, __shfl_xor_sync(0xffffffffu, a0, 1));
    a1 = __fadd_rn(a1, __shfl_xor_sync(0xffffffffu, a1, 1));
    acc[0][0] = __fadd_rn(a0, __shfl_xor_sync(0xffffffffu, a0, 2));
    acc[0][2] = __fadd_rn(a1, __shfl_xor_sync(0xffffffffu, a1, 2));
}

template <int NT, bool ODD, bool SX>
__device__ __forceinline__ void rows_item_q6k(const RowsX& x, const uint8_t* r0, const uint8_t* r1, int sb0, int nk,
                                              int g, int t, float (&acc)[NT][4]) {
    if constexpr (ODD) rows_q6k_chains<NT, SX>(x, r0, r1, sb0, nk, g, t, acc);
    else rows_q6k_one<SX>(x, r0, r1, sb0, nk, g, t, acc);
}

// One 32-column block of a Q8_0 / Q5_0 item: A = the int8 codes of rows g, g + 8 (k-slots as Q4_K's: thread t's
// words hold columns 8t..8t+3 and 8t+4..8t+7), d = their scales; acc = fmaf(d, xd * isum, acc) per x row.
template <int NT, bool ODD, bool SX>
__device__ __forceinline__ void rows_blk32_step(const RowsX& x, const int8_t* xb, const uint32_t (&A)[4],
                                                const float (&d)[2], int col0, int t, float (&acc)[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const uint2 B = rows_ldx<SX, uint2>(xb + (size_t)nt * 8 * x.cols + col0);
        const float4 xs = rows_ldx<SX, float4>(x.sc + (size_t)(col0 >> 5) * rows_sc_stride<SX>() + nt * 8 + 2 * t);
        int c[4];
        rows_mma_k32_s8s8(A, B.x, B.y, c);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (!ODD && (e & 1)) continue;
            const float xd = (e & 1) ? xs.z : xs.x;
            acc[nt][e] = fmaf(d[e >> 1], __fmul_rn(xd, rows_i2f(c[e])), acc[nt][e]);
        }
    }
}

__device__ __forceinline__ float rows_f16(const uint8_t* p) { return __half2float(*reinterpret_cast<const __half*>(p)); }

// Q8_0 (f16 d, 32 int8 codes = 34 B, 2-byte aligned): blocks blk0 .. blk0 + nb - 1 of the row.
template <int NT, bool ODD, bool SX>
__device__ __forceinline__ void rows_item_q80(const RowsX& x, const uint8_t* r0, const uint8_t* r1, int blk0, int nb,
                                              int g, int t, float (&acc)[NT][4]) {
    const int8_t* xb = rows_xrow<ODD, SX>(x, g) + 8 * t;
#pragma unroll 4
    for (int bl = 0; bl < nb; ++bl) {
        const uint8_t* b0 = r0 + 34 * bl;
        const uint8_t* b1 = r1 + 34 * bl;
        const float d[2] = {rows_f16(b0), rows_f16(b1)};
        const uint32_t A[4] = {rows_ld32u(b0 + 2 + 8 * t), rows_ld32u(b1 + 2 + 8 * t), rows_ld32u(b0 + 6 + 8 * t),
                               rows_ld32u(b1 + 6 + 8 * t)};
        rows_blk32_step<NT, ODD, SX>(x, xb, A, d, (blk0 + bl) * 32, t, acc);
    }
}

// Q5_0 (f16 d, qh = the 32 high bits, qs = 16 bytes of low nibbles: column c's nibble is qs[c % 16] >> 4 (c / 16),
// its high bit qh >> c; 22 B, 2-byte aligned): the 4 codes q - 16 of columns c0 .. c0 + 3 (c0 = 8t or 8t + 4) as
// int8 bytes. lo = the nibbles; the high bits h (4 bits of qh) spread to one per byte by a multiply (bit i lands on
// bit 8i; no two partial products overlap, so nothing carries); q - 16 = lo where h = 1, lo - 16 = lo | 0xF0 (mod
// 256) where h = 0.
__device__ __forceinline__ uint32_t rows_q50_a(const uint8_t* b, uint32_t qh, int c0) {
    const uint32_t lo = (rows_ld32u(b + 6 + (c0 & 15)) >> (4 * (c0 >> 4))) & 0x0F0F0F0Fu;
    const uint32_t h = (((qh >> c0) & 0xFu) * 0x00204081u) & 0x01010101u;
    return lo | ((h ^ 0x01010101u) * 0xF0u);
}

template <int NT, bool ODD, bool SX>
__device__ __forceinline__ void rows_item_q50(const RowsX& x, const uint8_t* r0, const uint8_t* r1, int blk0, int nb,
                                              int g, int t, float (&acc)[NT][4]) {
    const int8_t* xb = rows_xrow<ODD, SX>(x, g) + 8 * t;
#pragma unroll 4
    for (int bl = 0; bl < nb; ++bl) {
        const uint8_t* b0 = r0 + 22 * bl;
        const uint8_t* b1 = r1 + 22 * bl;
        const float d[2] = {rows_f16(b0), rows_f16(b1)};
        const uint32_t h0 = rows_ld32u(b0 + 2), h1 = rows_ld32u(b1 + 2);
        const uint32_t A[4] = {rows_q50_a(b0, h0, 8 * t), rows_q50_a(b1, h1, 8 * t), rows_q50_a(b0, h0, 8 * t + 4),
                               rows_q50_a(b1, h1, 8 * t + 4)};
        rows_blk32_step<NT, ODD, SX>(x, xb, A, d, (blk0 + bl) * 32, t, acc);
    }
}

}  // namespace
}  // namespace fd
