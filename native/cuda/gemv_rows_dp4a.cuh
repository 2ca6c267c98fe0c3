// gemv_rows_dp4a.cuh -- one-row Q4_K and Q6_K items of gemv_rows_tma.cuh on dp4a lanes instead of int8 mma
// (fd_tuning_t.gemv_rows_dp4a): the same integer group sums and the same float steps as rows_item_q4k
// (gemv_rows_item.cuh) for x row 0, so the same bits, by a shorter instruction stream -- at one x row the mma item
// builds A fragments for 16 rows and uses one column of eight, where a dp4a lane reads its row's code words once.
//
// Why (bench/lab/megakernel_lab.cu, H200, session 34): whole-block dp4a lanes ran the 1.5B's gate/up at 24 GB/s an SM
// against ~14.5 for the library's one-row launches, and with gemv_rows' arithmetic (MK_EXACT) they matched a float32
// replay of rows_item_q4k's sequence bit for bit.
//
// An item (a tile's 16 rows x one chunk of ks super-blocks): lane r and lane r + 16 take row r of the tile, the first
// the 128-column group 0 of each super-block, the second group 1. Per (row, group): S = sum_j sc_j isum_j and
// M = sum_j m_j xsum_j over its four 32-column sub-blocks (isum by dp4a on the nibbles -- the high ones masked in place,
// 16 x their value, shifted back exactly -- xsum by dp4a against ones), v = fmaf(d, f(S), -(dmin * f(M))); then the
// chain acc = fmaf(xd, v, acc) from 0 in (super-block, group) order, passed between the two lanes by shuffles.
#pragma once

#include "gemv_dot.cuh"    // dot4_u8s8 / dot4_s8s8: dp4a.u32.s32 / dp4a.s32.s32
#include "gemv_rows.cuh"

namespace fd {
namespace {

// four code words q (16 bytes: 32 nibbles of a 64-column run's half) against x words xa / xb (8 bytes each): the low
// nibbles' dot into lo, 16 x the high nibbles' into hi
__device__ __forceinline__ void rows_dp4a_run(const uint4& q, const uint2& xa, const uint2& xb, const uint2& ya,
                                              const uint2& yb, int& lo, int& hi) {
    lo = dot4_u8s8(q.x & 0x0F0F0F0Fu, xa.x, lo);
    lo = dot4_u8s8(q.y & 0x0F0F0F0Fu, xa.y, lo);
    lo = dot4_u8s8(q.z & 0x0F0F0F0Fu, xb.x, lo);
    lo = dot4_u8s8(q.w & 0x0F0F0F0Fu, xb.y, lo);
    hi = dot4_u8s8(q.x & 0xF0F0F0F0u, ya.x, hi);
    hi = dot4_u8s8(q.y & 0xF0F0F0F0u, ya.y, hi);
    hi = dot4_u8s8(q.z & 0xF0F0F0F0u, yb.x, hi);
    hi = dot4_u8s8(q.w & 0xF0F0F0F0u, yb.y, hi);
}

// the sum of eight x words' codes
__device__ __forceinline__ int rows_dp4a_xsum(const uint2& a, const uint2& b, const uint2& c, const uint2& d) {
    int s = dot4_u8s8(0x01010101u, a.x, 0);
    s = dot4_u8s8(0x01010101u, a.y, s);
    s = dot4_u8s8(0x01010101u, b.x, s);
    s = dot4_u8s8(0x01010101u, b.y, s);
    s = dot4_u8s8(0x01010101u, c.x, s);
    s = dot4_u8s8(0x01010101u, c.y, s);
    s = dot4_u8s8(0x01010101u, d.x, s);
    return dot4_u8s8(0x01010101u, d.y, s);
}

// Group h (0 or 1) of one staged Q4_K super-block (blk: 16-byte aligned) against x row 0's 128 codes of that group
// (xg: 16-byte aligned -- gemv_rows_plan.cuh places the CTA's x copy so -- read 16 bytes a load):
// rows_item_q4k's v = fmaf(d, f(S), -(dmin * f(M))).
__device__ __forceinline__ float rows_dp4a_group(const uint8_t* blk, const int8_t* xg, int h) {
    const uint4 hd = *reinterpret_cast<const uint4*>(blk);
    const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&hd.x));
    const uint4 sm = rows_scales_mins(hd);
    const uint32_t sw = h ? sm.y : sm.x, mw = h ? sm.w : sm.z;   // sub-blocks 4h .. 4h + 3, a byte each
    int S = 0, M = 0;
#pragma unroll
    for (int pp = 0; pp < 2; ++pp) {   // run p = 2h + pp: sub-blocks 2p (low nibbles, jj = 2pp), 2p + 1 (high)
        const uint8_t* run = blk + 16 + 32 * (2 * h + pp);
        const uint4 q0 = *reinterpret_cast<const uint4*>(run);
        const uint4 q1 = *reinterpret_cast<const uint4*>(run + 16);
        const uint4* xw = reinterpret_cast<const uint4*>(xg + 64 * pp);   // 16-byte aligned: 128-bit loads
        const uint4 xa = xw[0], xb = xw[1], xc = xw[2], xd = xw[3];
        const uint2 x0 = make_uint2(xa.x, xa.y), x1 = make_uint2(xa.z, xa.w);   // columns 0 .. 31 (low nibbles)
        const uint2 x2 = make_uint2(xb.x, xb.y), x3 = make_uint2(xb.z, xb.w);
        const uint2 x4 = make_uint2(xc.x, xc.y), x5 = make_uint2(xc.z, xc.w);   // 32 .. 63 (high nibbles)
        const uint2 x6 = make_uint2(xd.x, xd.y), x7 = make_uint2(xd.z, xd.w);
        int lo = 0, hi = 0;
        rows_dp4a_run(q0, x0, x1, x4, x5, lo, hi);
        rows_dp4a_run(q1, x2, x3, x6, x7, lo, hi);
        const int sl = rows_dp4a_xsum(x0, x1, x2, x3), sh = rows_dp4a_xsum(x4, x5, x6, x7);
        const int jl = 2 * pp, jh = jl + 1;
        S += (int)((sw >> (8 * jl)) & 0xFFu) * lo + (int)((sw >> (8 * jh)) & 0xFFu) * (hi >> 4);
        M += (int)((mw >> (8 * jl)) & 0xFFu) * sl + (int)((mw >> (8 * jh)) & 0xFFu) * sh;
    }
    return fmaf(dm.x, rows_i2f(S), -__fmul_rn(dm.y, rows_i2f(M)));
}

// Group h of one staged Q6_K super-block (blk: 2-byte aligned, 210 bytes: ql[128], qh[64], int8 scales[16], f16 d)
// against x row 0's 128 codes of that group (xg: 16-byte aligned): rows_item_q6k's v = d * f(S), S = sum over the
// group's eight 16-column sub-blocks (h, s, u) of scale * isum -- the codes q - 32 built four at a time by rows_q6k_a
// (the same words and SWAR as the mma item's A fragments), dotted with x by signed dp4a.
__device__ __forceinline__ float rows_dp4a_group_q6k(const uint8_t* blk, const int8_t* xg, int h) {
    const float d = __half2float(*reinterpret_cast<const __half*>(blk + 208));
    int S = 0;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        uint32_t l0[4], l1[4], qh[4];
#pragma unroll
        for (int w = 0; w < 4; ++w) {   // columns 4w .. 4w + 3 of each 16-column half u
            l0[w] = rows_ld32u(blk + 64 * h + 16 * u + 4 * w);
            l1[w] = rows_ld32u(blk + 64 * h + 32 + 16 * u + 4 * w);
            qh[w] = rows_ld32u(blk + 128 + 32 * h + 16 * u + 4 * w);
        }
#pragma unroll
        for (int s = 0; s < 4; ++s) {   // sub-block (h, s, u): columns 128 h + 32 s + 16 u .. + 15
            const uint4 xv = *reinterpret_cast<const uint4*>(xg + 32 * s + 16 * u);   // 16-byte aligned
            int isum = dot4_s8s8(rows_q6k_a(l0[0], l1[0], qh[0], s), xv.x, 0);
            isum = dot4_s8s8(rows_q6k_a(l0[1], l1[1], qh[1], s), xv.y, isum);
            isum = dot4_s8s8(rows_q6k_a(l0[2], l1[2], qh[2], s), xv.z, isum);
            isum = dot4_s8s8(rows_q6k_a(l0[3], l1[3], qh[3], s), xv.w, isum);
            S += (int)(int8_t)blk[192 + 8 * h + 2 * s + u] * isum;
        }
    }
    return __fmul_rn(d, rows_i2f(S));
}

// One row's partial over a chunk (super-blocks u0 .. u0 + nu - 1) as rows_item_q4k / rows_item_q6k (F) computes
// element (row, x row 0):
// row: the row's staged bytes at the chunk's first byte; x: the CTA's own copy (n == 1). Lanes r and r + 16 (h = lane
// >> 4) share the row; every lane of the pair returns the same value.
template <int F>
__device__ __forceinline__ float rows_dp4a_row(const RowsX& x, const uint8_t* row, int u0, int nu, int lane) {
    const int h = lane >> 4, r = lane & 15;
    const int8_t* xr = x.q + (size_t)u0 * ROWS_QK + 128 * h;
    float acc = 0.0f;
    for (int k = 0; k < nu; ++k) {
        const float v = F == ROWS_Q4K ? rows_dp4a_group(row + k * 144, xr + k * ROWS_QK, h)
                                      : rows_dp4a_group_q6k(row + k * 210, xr + k * ROWS_QK, h);
        const int grp = 2 * (u0 + k);
        const float xd0 = x.sc[(size_t)grp * ROWS_FX_SC], xd1 = x.sc[(size_t)(grp + 1) * ROWS_FX_SC];
        const float a0 = fmaf(xd0, v, acc);                          // lanes 0..15: group 0
        const float a1 = fmaf(xd1, v, __shfl_sync(0xffffffffu, a0, r));   // lanes 16..31: group 1 after group 0
        acc = __shfl_sync(0xffffffffu, a1, r + 16);
    }
    return acc;
}

// rows_dp4a_row for a launch of format F; ROWS_FANY (every one-row dp4a launch: one kernel's code for q / k / v, o and
// ffn_down, rows_tma_launch_nf says why) takes the matrix's own format, fmt (warp-uniform: a warp's item is one tile of
// one matrix) -- the plan gives a launch the dp4a items only where every matrix is Q4_K or Q6_K, as rows_item_at
// dispatches its mma items.
template <int F>
__device__ __forceinline__ float rows_dp4a_row_of(const RowsX& x, int fmt, const uint8_t* row, int u0, int nu, int lane) {
    if constexpr (F != ROWS_FANY) return rows_dp4a_row<F>(x, row, u0, nu, lane);
    else return fmt == ROWS_Q4K ? rows_dp4a_row<ROWS_Q4K>(x, row, u0, nu, lane) : rows_dp4a_row<ROWS_Q6K>(x, row, u0, nu, lane);
}

}  // namespace
}  // namespace fd
