// gemv_dot.cuh -- one row's dot products over its pieces (gemv.cuh's steps): row_dot on the float staged
// activations (quant formats through quant_codes.cuh scaled_codes, float formats with plain FMAs) and
// row_dot_q8 on the int8 ones (dp4a on the codes), each adding a lane's share of W[row, :] . xn[i, :] for
// every x row i into acc[i]; RowDot / RowDotQ8 / row_dot_any pick the instantiation for a matrix's
// run-time qtype (quant.cuh dispatch_qtype). The per-lane indexing is emulated in
// tests/emulation/test_quant_layouts.py.
#pragma once

#include "gemv_stage.cuh"

namespace fd {
namespace {

using namespace fd::q;

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

// sum over k of byte k of a (signed) times byte k of b (signed), plus c
__device__ __forceinline__ int dot4_s8s8(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
#pragma unroll
    for (int k = 0; k < 4; ++k) c += (int)(int8_t)(uint8_t)(a >> (8 * k)) * (int)(int8_t)(uint8_t)(b >> (8 * k));
    return c;
#endif
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

// SwiGLU's gate and up rows of one format at once: row_dot_q8 of each, in one loop that loads each x code and
// block sum once for both matrices and keeps two independent dp4a chains in flight. Each accumulator sees exactly
// row_dot_q8's operations in row_dot_q8's order, so acc_g / acc_u are its bits (fd_tuning_t.gemv_swiglu_pair).
template <int QT, int NX>
__device__ __forceinline__ void row_dot_q8_pair(const uint8_t* wrow_g, const uint8_t* wrow_u, int t, int lpr,
                                                int pieces, const uint8_t* x8, int x8_row, const float* xsc,
                                                int xsc_row, const float* xsum, int xsum_row, float (&acc_g)[NX],
                                                float (&acc_u)[NX]) {
    using F = Fmt<QT>;
    constexpr int RPP = F::RUNS / F::PARTS;
    constexpr int L = F::XL;
    constexpr int BLK_X8 = 8 * x8_group<L>(F::BE);
    const int j = t % F::LPB;
    int blk = t / F::LPB;
    const int blk_step = lpr / F::LPB;
    const uint8_t* wg = wrow_g + (int64_t)blk * F::BB;
    const uint8_t* wu = wrow_u + (int64_t)blk * F::BB;
    const uint8_t* xp = x8 + blk * BLK_X8 + 8 * x8_group<L>(F::col(j, 0));
#pragma unroll 1
    for (int p = t; p < pieces; p += lpr) {
        typename F::Raw raw_g, raw_u;
        F::template load<false>(wg, j, raw_g);
        F::template load<false>(wu, j, raw_u);
        float pag[F::PARTS], pbg[F::PARTS], pau[F::PARTS], pbu[F::PARTS];
        F::params(raw_g, j, pag, pbg);
        F::params(raw_u, j, pau, pbu);
#pragma unroll
        for (int part = 0; part < F::PARTS; ++part) {
            const int shift = F::part_shift(part);
            int ahg[NX], alg[NX], ahu[NX], alu[NX];
#pragma unroll
            for (int i = 0; i < NX; ++i) ahg[i] = alg[i] = ahu[i] = alu[i] = 0;
#pragma unroll
            for (int rr = 0; rr < RPP; ++rr) {
                const int run = part * RPP + rr;
                const uint32_t cg = (F::code_word(raw_g, j, run) >> shift) & (F::CODE_MASK * 0x01010101u);
                const uint32_t cu = (F::code_word(raw_u, j, run) >> shift) & (F::CODE_MASK * 0x01010101u);
#pragma unroll
                for (int i = 0; i < NX; ++i) {
                    const uint2 xv = *reinterpret_cast<const uint2*>(xp + i * x8_row + 8 * x8_group<L>(F::col(0, run)));
                    ahg[i] = dot4_u8s8(cg, xv.x, ahg[i]);
                    alg[i] = dot4_u8s8(cg, xv.y, alg[i]);
                    ahu[i] = dot4_u8s8(cu, xv.x, ahu[i]);
                    alu[i] = dot4_u8s8(cu, xv.y, alu[i]);
                }
            }
            const float bbg = fmaf(-(float)F::OFFSET, pag[part], pbg[part]);
            const float bbu = fmaf(-(float)F::OFFSET, pau[part], pbu[part]);
            const int grp = F::part_group(blk, j, part);
            const int blk32 = grp * F::PART_COLS / 32;
#pragma unroll
            for (int i = 0; i < NX; ++i) {
                const float sc = xsc[i * xsc_row + blk32], xs = xsum[i * xsum_row + grp];
                const float cxg = sc * fmaf((float)alg[i], 1.0f / XQ_LO, (float)ahg[i]);
                const float cxu = sc * fmaf((float)alu[i], 1.0f / XQ_LO, (float)ahu[i]);
                acc_g[i] = fmaf(pag[part], cxg, fmaf(bbg, xs, acc_g[i]));
                acc_u[i] = fmaf(pau[part], cxu, fmaf(bbu, xs, acc_u[i]));
            }
        }
        blk += blk_step;
        wg += (int64_t)blk_step * F::BB;
        wu += (int64_t)blk_step * F::BB;
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

template <int NX>
struct RowDotQ8Pair {   // row_dot_q8_pair for the (shared) qtype chosen at run time
    const uint8_t* wrow_g;
    const uint8_t* wrow_u;
    int t, lpr, pieces;
    const XViews* xv;
    float (*acc_g)[NX];
    float (*acc_u)[NX];
    template <int QT>
    __device__ __forceinline__ void run() {
        if constexpr (!Fmt<QT>::IS_FLOAT) {
            constexpr bool P16 = Fmt<QT>::PART_COLS == 16;
            constexpr int L = Fmt<QT>::XL;
            row_dot_q8_pair<QT, NX>(wrow_g, wrow_u, t, lpr, pieces, xv->x8[L], xv->x8_row[L], xv->xsc, xv->xsc_row,
                                    P16 ? xv->xsum16 : xv->xsum32, P16 ? xv->xsum16_row : xv->xsum32_row, *acc_g,
                                    *acc_u);
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

}  // namespace
}  // namespace fd
