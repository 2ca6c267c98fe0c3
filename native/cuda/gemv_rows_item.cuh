// gemv_rows_item.cuh -- what one warp of gemv_rows.cuh computes for one item: the integer dot products of 16 weight
// rows x one chunk of columns x up to 32 x rows on int8 tensor cores, and the float sum of each (row, x row)
// over the chunk's x groups. Q4_K: mma.m16n8k32 u8 x s8 per 32-column sub-block; Q6_K: m16n8k16 s8 x s8 per 16
// columns (Q6_K has a scale per 16 values); Q8_0 and Q5_0: m16n8k32 s8 x s8 per 32-column block (Q5_0's 5-bit
// codes q - 16 in [-16, 15] are int8 values as they are). Ported from
// bench/lab/gemv_mma_rows_lab.cu (its --host-check emulated these fragment builders against the PTX tables and the
// ggml layouts; its GPU run checked them against float64), with the chunk length a runtime count (a row's last
// chunk may be shorter) and the rows' shared-memory addresses passed in.
//
// Fragments (PTX m16n8k32 / m16n8k16, 8-bit): thread (g = lane / 4, t = lane % 4) holds A rows g and g + 8, B
// column (x row) g of the N-tile, C rows g, g + 8 x columns 2t, 2t + 1. acc[nt][e]: e = 0 (row g, x row nt*8 + 2t),
// 1 (g, 2t + 1), 2 (g + 8, 2t), 3 (g + 8, 2t + 1). One decoded A fragment serves every N-tile (weights are A, x
// rows are B), so extra x rows cost one mma (two for Q4_K), integer multiply-adds and a float step a group each,
// no weight decoding.
//
// Numerics (why a row's bits depend on nothing but its own x row and the chunk): the mma's integer sums are exact
// and column i depends only on x row i; x has one scale a 128-column group (ROWS_XG), so each (row, x row)'s sums
// over a group's sub-blocks stay integers, and the float work is one fixed expression a group, explicitly rounded
// (__fmul_rn, fmaf), applied in group order (the items below).
// int32 -> float: __int2float_rn, exact for |v| < 2^24; on sm_90 one I2FP.F32.S32.
#pragma once

#include "quant_stage.cuh"

#include <cuda_fp16.h>

namespace fd {
namespace {

constexpr int ROWS_NX = 32;       // x rows a launch takes (4 N-tiles of 8); the x scratch holds that many
constexpr int ROWS_QK = 256;      // columns of a "super-block": the chunk unit (Q8_0: 8 blocks of 32)
constexpr int ROWS_XG = 128;      // columns of one x scale (a group: 4 Q4_K / Q8_0 / Q5_0 blocks, 8 Q6_K sub-blocks)

// The formats this path runs, as gemv_rows.cuh numbers them (FD_Q_* -> ROWS_*).
enum { ROWS_Q4K = 0, ROWS_Q6K = 1, ROWS_Q80 = 2, ROWS_Q50 = 3, ROWS_FANY = -1 };
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
// the same, accumulating into d (Q4_K's mins: m_j times the sub-block's x codes, summed over a group)
__device__ __forceinline__ void rows_mma_k32_u8s8_acc(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int (&d)[4]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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
// The activations of a launch: x' = xd * q per 128-column group (ROWS_XG) -- or, in a launch of one 32-column
// format, Q8_0 or Q5_0 (fine), per 32-column block -- either the pre-pass's scratch in global memory
// (gemv_rows_quantize_x; SX = false) or the CTA's own copy in shared memory (rows_quantize_cta; SX = true), the same
// bits either way.
struct RowsX {
    const int8_t* q;      // (rows, cols) codes; rows >= n hold stale values whose outputs are never written
    const float* sc;      // (rows_scale_rows(cols, fine), sc_stride): xd of each group (fine: block) and x row
    int cols;             // bytes between x rows: the scratch's cols, a CTA's copy rows_fx_stride (padded for 2 .. 8 rows)
    int last;             // shared memory: the last row a B fragment may read (n - 1, n <= 8); scratch: unused
    int fine;             // 1: a scale per 32-column block (launches of one format, Q8_0 or Q5_0); 0: per group
};
// Scale rows of x: one a 128-column group, or (fine) one a 32-column block (gemv_rows calls have cols % 32 == 0).
__host__ __device__ constexpr int rows_scale_rows(int cols, bool fine) {
    return fine ? cols / 32 : (cols + ROWS_XG - 1) / ROWS_XG;
}
// x rows a scale row holds: ROWS_NX in the scratch, 8 in a CTA's copy (float2 reads of rows 2t, 2t + 1 of N-tile 0)
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
// x has one scale a 128-column group (ROWS_XG), so within a group a (row, x row)'s dot is exact integer arithmetic:
// Q4_K: S = sum_j sc_j * isum_j and M = sum_j m_j * (sum of x codes of sub-block j) over the group's four sub-blocks
// (M by a second mma whose A holds m_j in every k-slot of sub-block j; the same B), Q6_K: S = sum sc * isum over
// its eight 16-column sub-blocks; then one float step a group, in group order:
//   Q4_K  acc = fmaf(xd, fmaf(d, f(S), -(dmin * f(M))), acc)      Q6_K  acc = fmaf(xd, d * f(S), acc)
// with f = __int2float_rn (exact below 2^24: |S| <= 4 * 63 * 60,960 for Q4_K, |M| <= 4 * 63 * 4,064; Q6_K's bound
// 8 * 128 * 65,024 can exceed it, where f rounds to nearest -- a fixed function of S all the same). Q8_0 / Q5_0 keep
// a float scale a 32-column block: ag = fmaf(d_b, f(isum_b), ag) over the group's blocks in order, then acc =
// fmaf(xd, ag, acc) -- or, with a scale per 32-column block (x.fine: a launch of one of these formats only), one step
// a block, acc = fmaf(d_b * xd_b, f(isum_b), acc). Every expression is per (row, x row) and fixed, and integer sums do
// not depend on their order,
// so a row's bits depend on its x row and the chunk only. ODD (n > 1): every fragment element; !ODD (n == 1): every
// B column is x row 0 (rows_xrow), so only elements 0 and 2 (rows g, g + 8 of x row 0) are computed -- the same
// operations on the same values as ODD's element (g, x row 0) in lane t == 0 (the only lane whose outputs are
// written: lanes t > 0 compute with other rows' scales and are discarded by the fold). The partial is written to
// acc (the Q8_0 / Q5_0 items add into it, the caller zeroed it).
template <bool ODD>
__host__ __device__ constexpr bool rows_elem(int e) { return ODD || !(e & 1); }

// the x scales of x rows 2t, 2t + 1 of N-tile nt in scale row grp (a group, or a block where x.fine; lanes t > 0 of a
// !ODD item read rows they discard)
template <bool SX>
__device__ __forceinline__ float2 rows_xscale(const RowsX& x, int grp, int nt, int t) {
    return rows_ldx<SX, float2>(x.sc + (size_t)grp * rows_sc_stride<SX>() + nt * 8 + 2 * t);
}

// Q4_K: super-blocks sb0 .. sb0 + nk - 1 of the row, each two groups of four 32-column sub-blocks.
template <int NT, bool ODD, bool SX>
__device__ __forceinline__ void rows_item_q4k(const RowsX& x, const uint8_t* r0, const uint8_t* r1, int sb0, int nk,
                                              int g, int t, float (&acc)[NT][4]) {
    const int8_t* xb = rows_xrow<ODD, SX>(x, g) + 8 * t + sb0 * ROWS_QK;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll 1
    for (int k = 0; k < nk; ++k) {
        const int8_t* xk = xb + k * ROWS_QK;      // column (sb0 + k) * 256 + 8t of the B column's x row
        const uint4 h0 = *reinterpret_cast<const uint4*>(r0 + k * 144);
        const uint4 h1 = *reinterpret_cast<const uint4*>(r1 + k * 144);
        const float2 dm0 = __half22float2(*reinterpret_cast<const __half2*>(&h0.x));
        const float2 dm1 = __half22float2(*reinterpret_cast<const __half2*>(&h1.x));
        const uint4 sm0 = rows_scales_mins(h0), sm1 = rows_scales_mins(h1);
#pragma unroll
        for (int half = 0; half < 2; ++half) {   // group 2 (sb0 + k) + half: sub-blocks 4 half .. 4 half + 3
            const uint32_t sw0 = half ? sm0.y : sm0.x, sw1 = half ? sm1.y : sm1.x;
            const uint32_t mw0 = half ? sm0.w : sm0.z, mw1 = half ? sm1.w : sm1.z;
            int S[NT][4], M[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[nt][e] = M[nt][e] = 0;
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int j = 4 * half + jj, p = j >> 1, hh = j & 1;
                const uint2 qa = *reinterpret_cast<const uint2*>(r0 + k * 144 + 16 + 32 * p + 8 * t);
                const uint2 qb = *reinterpret_cast<const uint2*>(r1 + k * 144 + 16 + 32 * p + 8 * t);
                uint32_t A[4];
                rows_q4k_a(qa, qb, hh, A);
                const int sc[2] = {(int)((sw0 >> (8 * jj)) & 0xFFu), (int)((sw1 >> (8 * jj)) & 0xFFu)};
                const uint32_t m0 = __byte_perm(mw0, 0, 0x1111u * jj), m1 = __byte_perm(mw1, 0, 0x1111u * jj);
                const uint32_t Am[4] = {m0, m1, m0, m1};   // m_j in every k-slot of rows g / g + 8
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const uint2 B = rows_ldx<SX, uint2>(xk + nt * 8 * x.cols + 32 * j);
                    int cs[4];
                    rows_mma_k32_u8s8(A, B.x, B.y, cs);
                    rows_mma_k32_u8s8_acc(Am, B.x, B.y, M[nt]);
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (rows_elem<ODD>(e)) S[nt][e] += sc[e >> 1] * cs[e];
                }
            }
            const int grp = 2 * (sb0 + k) + half;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const float2 xs = rows_xscale<SX>(x, grp, nt, t);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (!rows_elem<ODD>(e)) continue;
                    const float2 dm = (e >> 1) ? dm1 : dm0;
                    const float v = fmaf(dm.x, rows_i2f(S[nt][e]), -__fmul_rn(dm.y, rows_i2f(M[nt][e])));
                    acc[nt][e] = fmaf((e & 1) ? xs.y : xs.x, v, acc[nt][e]);
                }
            }
        }
    }
}

// Q6_K (block_q6_K: ql[128], qh[64], int8 scales[16], f16 d = 210 B, only 2-byte aligned): 16 sub-blocks of 16
// columns (h, u, s: columns 128h + 32s + 16u), so half h of a super-block is one x group of eight sub-blocks.
template <int NT, bool ODD, bool SX>
__device__ __forceinline__ void rows_item_q6k(const RowsX& x, const uint8_t* r0, const uint8_t* r1, int sb0, int nk,
                                              int g, int t, float (&acc)[NT][4]) {
    const int8_t* xb = rows_xrow<ODD, SX>(x, g) + 4 * t + sb0 * ROWS_QK;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll 1
    for (int k = 0; k < nk; ++k) {
        const int8_t* xk = xb + k * ROWS_QK;
        const uint8_t* b0 = r0 + k * 210;
        const uint8_t* b1 = r1 + k * 210;
        const float d[2] = {__half2float(*reinterpret_cast<const __half*>(b0 + 208)),
                            __half2float(*reinterpret_cast<const __half*>(b1 + 208))};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int S[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[nt][e] = 0;
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const uint32_t l00 = rows_ld32u(b0 + 64 * h + 16 * u + 4 * t), l01 = rows_ld32u(b0 + 64 * h + 32 + 16 * u + 4 * t);
                const uint32_t l10 = rows_ld32u(b1 + 64 * h + 16 * u + 4 * t), l11 = rows_ld32u(b1 + 64 * h + 32 + 16 * u + 4 * t);
                const uint32_t qh0 = rows_ld32u(b0 + 128 + 32 * h + 16 * u + 4 * t);
                const uint32_t qh1 = rows_ld32u(b1 + 128 + 32 * h + 16 * u + 4 * t);
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    const uint32_t a0 = rows_q6k_a(l00, l01, qh0, s), a1 = rows_q6k_a(l10, l11, qh1, s);
                    const int sci = 8 * h + 2 * s + u;
                    const int sc[2] = {(int)(int8_t)b0[192 + sci], (int)(int8_t)b1[192 + sci]};
                    const int colb = 128 * h + 32 * s + 16 * u;   // within the super-block
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        const uint32_t B = rows_ldx<SX, uint32_t>(xk + nt * 8 * x.cols + colb);
                        int cs[4];
                        rows_mma_k16_s8s8(a0, a1, B, cs);
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            if (rows_elem<ODD>(e)) S[nt][e] += sc[e >> 1] * cs[e];
                    }
                }
            }
            const int grp = 2 * (sb0 + k) + h;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const float2 xs = rows_xscale<SX>(x, grp, nt, t);
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (rows_elem<ODD>(e))
                        acc[nt][e] = fmaf((e & 1) ? xs.y : xs.x, __fmul_rn(d[e >> 1], rows_i2f(S[nt][e])), acc[nt][e]);
            }
        }
    }
}

__device__ __forceinline__ float rows_f16(const uint8_t* p) { return __half2float(*reinterpret_cast<const __half*>(p)); }

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

// Q8_0 (f16 d, 32 int8 codes = 34 B, 2-byte aligned) and Q5_0: blocks blk0 .. blk0 + nb - 1 of the row (blk0 is a
// chunk's first block, a multiple of 8, so groups of four blocks never straddle items; a row's last group may hold
// fewer). A = the int8 codes of rows g, g + 8 (k-slots as Q4_K's: thread t's words hold columns 8t..8t+3 and
// 8t+4..8t+7), d = their scales.
// One block bl of a Q8_0 / Q5_0 item: ag += d * isum per fragment element (FINE: ag += (d * xd_b) * isum, ag being
// the item's accumulator itself).
template <int NT, bool ODD, bool SX, int FMT, bool FINE = false>
__device__ __forceinline__ void rows_blk32_step(const RowsX& x, const int8_t* xb, const uint8_t* r0, const uint8_t* r1,
                                                int blk0, int bl, int t, float (&ag)[NT][4]) {
    constexpr int BB = rows_blk32_bytes(FMT);
    const uint8_t* b0 = r0 + BB * bl;
    const uint8_t* b1 = r1 + BB * bl;
    const float d[2] = {rows_f16(b0), rows_f16(b1)};
    uint32_t A[4];
    if constexpr (FMT == ROWS_Q80) {
        A[0] = rows_ld32u(b0 + 2 + 8 * t); A[1] = rows_ld32u(b1 + 2 + 8 * t);
        A[2] = rows_ld32u(b0 + 6 + 8 * t); A[3] = rows_ld32u(b1 + 6 + 8 * t);
    } else {
        const uint32_t h0 = rows_ld32u(b0 + 2), h1 = rows_ld32u(b1 + 2);
        A[0] = rows_q50_a(b0, h0, 8 * t); A[1] = rows_q50_a(b1, h1, 8 * t);
        A[2] = rows_q50_a(b0, h0, 8 * t + 4); A[3] = rows_q50_a(b1, h1, 8 * t + 4);
    }
    const int col0 = (blk0 + bl) * 32;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const uint2 B = rows_ldx<SX, uint2>(xb + (size_t)nt * 8 * x.cols + col0);
        int cs[4];
        rows_mma_k32_s8s8(A, B.x, B.y, cs);
        if constexpr (FINE) {
            const float2 xs = rows_xscale<SX>(x, blk0 + bl, nt, t);
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (rows_elem<ODD>(e))
                    ag[nt][e] = fmaf(__fmul_rn(d[e >> 1], (e & 1) ? xs.y : xs.x), rows_i2f(cs[e]), ag[nt][e]);
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (rows_elem<ODD>(e)) ag[nt][e] = fmaf(d[e >> 1], rows_i2f(cs[e]), ag[nt][e]);
        }
    }
}

// Q8_0 (f16 d, 32 int8 codes = 34 B, 2-byte aligned) and Q5_0: blocks blk0 .. blk0 + nb - 1 of the row (blk0 is a
// chunk's first block, a multiple of 8, so groups of four blocks never straddle items; a row's last group may hold
// fewer). A = the int8 codes of rows g, g + 8 (k-slots as Q4_K's: thread t's words hold columns 8t..8t+3 and
// 8t+4..8t+7), d = their scales. Whole groups run unrolled without a bound check (their loads issue together).
// FINE (x with a scale a block: a launch of this one format, rows_fine): every block steps acc itself, in block order.
template <int NT, bool ODD, bool SX, int FMT, bool FINE>
__device__ __forceinline__ void rows_item_blk32(const RowsX& x, const uint8_t* r0, const uint8_t* r1, int blk0, int nb,
                                                int g, int t, float (&acc)[NT][4]) {
    const int8_t* xb = rows_xrow<ODD, SX>(x, g) + 8 * t;
    if constexpr (FINE) {
#pragma unroll 1
        for (int bg = 0; bg < nb; bg += 4) {
            if (nb - bg >= 4) {
#pragma unroll
                for (int i = 0; i < 4; ++i) rows_blk32_step<NT, ODD, SX, FMT, true>(x, xb, r0, r1, blk0, bg + i, t, acc);
            } else {
#pragma unroll 1
                for (int bl = bg; bl < nb; ++bl) rows_blk32_step<NT, ODD, SX, FMT, true>(x, xb, r0, r1, blk0, bl, t, acc);
            }
        }
        return;
    }
#pragma unroll 1
    for (int bg = 0; bg < nb; bg += 4) {
        float ag[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) ag[nt][e] = 0.0f;
        if (nb - bg >= 4) {
#pragma unroll
            for (int i = 0; i < 4; ++i) rows_blk32_step<NT, ODD, SX, FMT>(x, xb, r0, r1, blk0, bg + i, t, ag);
        } else {
#pragma unroll 1
            for (int bl = bg; bl < nb; ++bl) rows_blk32_step<NT, ODD, SX, FMT>(x, xb, r0, r1, blk0, bl, t, ag);
        }
        const int grp = (blk0 + bg) >> 2;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const float2 xs = rows_xscale<SX>(x, grp, nt, t);
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (rows_elem<ODD>(e)) acc[nt][e] = fmaf((e & 1) ? xs.y : xs.x, ag[nt][e], acc[nt][e]);
        }
    }
}

}  // namespace
}  // namespace fd
