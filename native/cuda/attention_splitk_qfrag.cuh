// attention_splitk_qfrag.cuh -- split-K attention's warp step over a quantized K and V read straight from the raw
// ring (both sides q8_0 / q4_0, tensor-core builds): the mma B fragments are built in registers from the staged
// codes and scales, with no float16 tile in between (attention_splitk_qstage.cuh's dequant_side: a 16-byte
// shared store per 8 values, then the float16 path's ldmatrix of them -- twice the shared traffic, ~400 more
// instructions a lane a tile, and a tile's 35 KB of shared memory).
//
// Each fragment register is one ldmatrix of the codes (b16 elements = code byte pairs) dequantized by
// kvq::dequant_pair: float16(d * q), the value dequant8_codes gives, so the products are the float16 path's.
//
//   K (B operand of S = q k^T: k = dim, n = key). ldmatrix (not transposed) of 8 key rows x 16 code bytes gives
//     lane (g = lane / 4, t = lane % 4) bytes 4t .. 4t + 3 of key g's 16 bytes: q8_0, dims 4t .. 4t + 3 of a
//     16-dim slice; q4_0 (a block's 16 bytes hold dims j in the low nibble, 16 + j in the high one), the same
//     four dims of the block's two slices. The mma wants dims (2t, 2t + 1) in b0 and (2t + 8, 2t + 9) in b1;
//     this step gives it dims (4t, 4t + 1) and (4t + 2, 4t + 3) instead, i.e. slice position k holds dim
//     pi(k) = 4 (k % 8 / 2) + 2 (k / 8) + k % 2, and q's A fragments are staged in the same order
//     (qfrag_pos: q dim d of a slice sits at position pi^-1(d)). The dot product is the same sum of the same
//     16 exact products per mma, in other k positions of the instruction.
//   V (B operand of O += P v: k = key, n = dim). ldmatrix.trans of 8 key rows x 16 code bytes gives lane
//     (g, t) code bytes (2g, 2g + 1) of keys 2t and 2t + 1; a byte permute makes (key 2t, key 2t + 1) pairs of
//     dim 2g (bytes 0, 2) and of dim 2g + 1 (bytes 1, 3): two mma columns. Output column n of group (b, h, p)
//     is dim 32 b + 16 h + 2 n + p (q8_0: h = which 16 bytes of block b; q4_0: low / high nibble); columns are
//     independent sums, so this only moves where o's values sit (warp_store_q puts them back in dim order).
//   Scales: K, key g's and g + 8's (one vector load each); V, keys 2t, 2t + 1 (adjacent rows: one load) and
//     2t + 8, 2t + 9, a float16 pair of two keys' scales per register.
//
// Staged code rows are CODE_PAD bytes longer than the codes (attention_splitk_qstage.cuh: stage_rows' row
// stride), so the 8 rows of an ldmatrix phase start on 8 different 4-bank groups: cb + 16 bytes is an odd
// multiple of 16 for every head_dim / type here (48, 80, 144, 272).
// tests/emulation/test_kv_qfrag_emulation.py emulates ldmatrix on the staged bytes and checks that every lane's
// fragments are the dequantized values at the positions above, for both types and every head_dim.
#pragma once

#include "attention_splitk_warp.cuh"

namespace fd {
namespace attn {

constexpr int CODE_PAD = 16;                   // bytes after each staged row of codes (see above)

// The fragment step serves K and V types kvt = k_type * 4 + v_type (splitk_kernel's KVT) when both are quantized.
__host__ __device__ constexpr bool frag_types(int kvt) {
#if FD_ATTN_MMA
    return (kvt >> 2) != FD_KV_F16 && (kvt & 3) != FD_KV_F16;
#else
    (void)kvt;
    return false;     // SIMT builds keep the float16 tile
#endif
}

// Where q dim d sits in the staged q rows for the fragment step: position pi^-1(d % 16) of its 16-dim slice.
__host__ __device__ __forceinline__ int qfrag_pos(int d) {
    const int s = d & 15;
    return (d & ~15) | ((s & 2) << 2) | ((s >> 2) << 1) | (s & 1);
}

// The raw new row (RAW: both sides quantized, the fragment step) in the list area: K codes, K scales, then from
// raw_new_v(HD, k_type) (16-byte aligned) V codes and V scales -- at most 2 (HD + HD / 16) + 16 bytes.
__host__ __device__ inline int raw_new_v(int head_dim, int k_type) {
    return (kvq::code_bytes(k_type, head_dim) + head_dim / 16 + 15) & ~15;
}

#if FD_ATTN_MMA

// NB float16 scales of one staged row (NB * 2 = 4, 8 or 16 bytes, aligned to that).
template <int NB>
__device__ __forceinline__ void load_scales(const __half* p, __half (&d)[NB]) {
    static_assert(NB == 2 || NB == 4 || NB == 8, "head_dim 64, 128, 256");
    if constexpr (NB == 2) {
        *reinterpret_cast<uint32_t*>(d) = *reinterpret_cast<const uint32_t*>(p);
    } else if constexpr (NB == 4) {
        *reinterpret_cast<uint2*>(d) = *reinterpret_cast<const uint2*>(p);
    } else {
        *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(p);
    }
}

// A code register's bytes as dequant_pair takes them: q8_0 int8 q -> q + 128; q4_0 the low (HI false) or high
// nibbles.
template <int T, bool HI = false>
__device__ __forceinline__ uint32_t code_bytes_of(uint32_t r) {
    if constexpr (T == FD_KV_Q8_0) return r ^ 0x80808080u;
    else return (HI ? r >> 4 : r) & 0x0f0f0f0fu;
}

template <int T>
__device__ __forceinline__ __half2 code_bias() {
    return __half2half2(__ushort_as_half((unsigned short)(T == FD_KV_Q8_0 ? 0x6480 : 0x6408)));   // 1152, 1032
}

// S (16 q rows x the warp's 16 keys) = q k^T with k's fragments from the staged codes kc (the warp's first key
// row; rows CB + CODE_PAD bytes apart) and scales ks (NB halves a row). The mma order and accumulators are
// warp_scores'.
template <int HD, int T>
__device__ __forceinline__ void frag_scores(float (&s)[2][4], const __half* q_hi, const __half* q_lo, const uint8_t* kc,
                                            const __half* ks) {
    constexpr int LD = Cfg<HD>::LD, NB = HD / kvq::BLOCK;
    constexpr int CBP = (T == FD_KV_Q8_0 ? HD : HD / 2) + CODE_PAD;
    const int lane = threadIdx.x & 31, mi = lane >> 3, g = lane >> 2;
    float acc[2][2][2][4];
    zero_score_acc(acc);
    __half dk[2][NB];
    load_scales<NB>(ks + g * NB, dk[0]);
    load_scales<NB>(ks + (g + 8) * NB, dk[1]);
    const __half2 bias = code_bias<T>();
    const int q_row_off = ((mi & 1) * 8 + (lane & 7)) * LD + (mi >> 1) * 8;
    // matrices: q8_0 (keys 0-7 | 8-15) x (bytes 32 b .. + 15 | 32 b + 16 .. + 31) of block b, as m0 = (0-7, lo),
    // m1 = (0-7, hi), m2 = (8-15, lo), m3 = (8-15, hi); q4_0 the same over blocks 2 b2 and 2 b2 + 1
    const uint8_t* k_addr = kc + ((mi >> 1) * 8 + (lane & 7)) * CBP + (mi & 1) * 16;
    // one 16-dim slice: keys 0-7 from code register lo, 8-15 from hi, scales of block b
    auto slice = [&](int kk, uint32_t lo, uint32_t hi, int b) {
        uint32_t ah[4], al[4];
        ldsm_x4(ah, q_hi + q_row_off + kk * 16);
        ldsm_x4(al, q_lo + q_row_off + kk * 16);
        const __half2 d0 = __half2half2(dk[0][b]), d1 = __half2half2(dk[1][b]);
        const uint32_t b0 = kvq::dequant_pair(lo, 0x4140u, bias, d0), b1 = kvq::dequant_pair(lo, 0x4342u, bias, d0);
        const uint32_t b2 = kvq::dequant_pair(hi, 0x4140u, bias, d1), b3 = kvq::dequant_pair(hi, 0x4342u, bias, d1);
        mma16816(acc[0][kk & 1][0], ah, b0, b1);
        mma16816(acc[1][kk & 1][0], al, b0, b1);
        mma16816(acc[0][kk & 1][1], ah, b2, b3);
        mma16816(acc[1][kk & 1][1], al, b2, b3);
    };
    if constexpr (T == FD_KV_Q8_0) {
#pragma unroll
        for (int b = 0; b < NB; ++b) {                  // slices 2 b, 2 b + 1
            uint32_t r[4];
            ldsm_x4(r, k_addr + 32 * b);
            slice(2 * b, code_bytes_of<T>(r[0]), code_bytes_of<T>(r[2]), b);
            slice(2 * b + 1, code_bytes_of<T>(r[1]), code_bytes_of<T>(r[3]), b);
        }
    } else {
#pragma unroll
        for (int b2 = 0; b2 < NB / 2; ++b2) {           // blocks 2 b2, 2 b2 + 1: slices 4 b2 .. 4 b2 + 3
            uint32_t r[4];
            ldsm_x4(r, k_addr + 32 * b2);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int b = 2 * b2 + j;
                slice(2 * b, code_bytes_of<T, false>(r[j]), code_bytes_of<T, false>(r[2 + j]), b);
                slice(2 * b + 1, code_bytes_of<T, true>(r[j]), code_bytes_of<T, true>(r[2 + j]), b);
            }
        }
    }
    sum_score_acc(s, acc);
}

// O += P v with v's fragments from the staged codes vc / scales vs (as frag_scores'); o[4 b + 2 h + p] is output
// group (b, h, p) (see the top of the file). Each group gets ph then pl, as warp_pv's columns do.
template <int HD, int T>
__device__ __forceinline__ void frag_pv(WarpState<HD>& st, const uint32_t (&ph)[4], const uint32_t (&pl)[4],
                                        const uint8_t* vc, const __half* vs) {
    constexpr int NB = HD / kvq::BLOCK;
    constexpr int CBP = (T == FD_KV_Q8_0 ? HD : HD / 2) + CODE_PAD;
    const int lane = threadIdx.x & 31, mi = lane >> 3, t2 = (lane & 3) * 2;
    __half dv[4][NB];                                  // keys 2t, 2t + 1, 2t + 8, 2t + 9
    load_scales<NB>(vs + t2 * NB, dv[0]);
    load_scales<NB>(vs + (t2 + 1) * NB, dv[1]);
    load_scales<NB>(vs + (t2 + 8) * NB, dv[2]);
    load_scales<NB>(vs + (t2 + 9) * NB, dv[3]);
    const __half2 bias = code_bias<T>();
    // matrices: q8_0 m0 = (keys 0-7, bytes 32 b .. + 15), m1 = (8-15, same), m2 = (0-7, 32 b + 16 ..), m3 = (8-15,
    // same); q4_0 m0 / m1 = keys 0-7 / 8-15 of block 2 b2, m2 / m3 of block 2 b2 + 1
    const uint8_t* v_addr = vc + ((mi & 1) * 8 + (lane & 7)) * CBP + (mi >> 1) * 16;
    // group (b, h): code registers lo (keys 0-7) and hi (keys 8-15), already code bytes
    auto group = [&](int b, int h, uint32_t lo, uint32_t hi) {
        const __half2 d0 = __halves2half2(dv[0][b], dv[1][b]), d1 = __halves2half2(dv[2][b], dv[3][b]);
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const uint32_t sel = p == 0 ? 0x4240u : 0x4341u;   // (key 2t, key 2t + 1) of dim 2g + p
            const uint32_t b0 = kvq::dequant_pair(lo, sel, bias, d0), b1 = kvq::dequant_pair(hi, sel, bias, d1);
            float (&o)[4] = st.o[4 * b + 2 * h + p];
            mma16816(o, ph, b0, b1);
            mma16816(o, pl, b0, b1);
        }
    };
    if constexpr (T == FD_KV_Q8_0) {
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            uint32_t r[4];
            ldsm_x4_trans(r, v_addr + 32 * b);
            group(b, 0, code_bytes_of<T>(r[0]), code_bytes_of<T>(r[1]));
            group(b, 1, code_bytes_of<T>(r[2]), code_bytes_of<T>(r[3]));
        }
    } else {
#pragma unroll
        for (int b2 = 0; b2 < NB / 2; ++b2) {
            uint32_t r[4];
            ldsm_x4_trans(r, v_addr + 32 * b2);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int b = 2 * b2 + j;
                group(b, 0, code_bytes_of<T, false>(r[2 * j]), code_bytes_of<T, false>(r[2 * j + 1]));
                group(b, 1, code_bytes_of<T, true>(r[2 * j]), code_bytes_of<T, true>(r[2 * j + 1]));
            }
        }
    }
}

// One warp: 16 query rows x 16 keys over the raw stage (kc / ks: K codes and scales of the warp's first key row,
// vc / vs: V's); q_hi / q_lo staged at qfrag_pos. Keys v0 + i >= L are masked out.
template <int HD, int KT, int VT>
__device__ __forceinline__ void warp_step_q(WarpState<HD>& st, const __half* q_hi, const __half* q_lo,
                                            const uint8_t* kc, const __half* ks, const uint8_t* vc, const __half* vs,
                                            int v0, int L) {
    float s[2][4];
    frag_scores<HD, KT>(s, q_hi, q_lo, kc, ks);
    uint32_t ph[4], pl[4];
    warp_softmax<HD>(st, s, v0, L, ph, pl);
    frag_pv<HD, VT>(st, ph, pl, vc, vs);
}

// A window tile in the fragment step (splitk_kernel<..., WIN>): the warp's 16 keys as float16 rows in kt / vt (its
// first K and V row, rows LD halves apart: window_rows' copies), fragments in the code steps' order, so the same
// q staging, mma order and output groups serve both kinds of tile. K slice kk: b0 | b1 = dims 16 kk + 4t .. + 3 of
// key g (one 8-byte load: slice position k holds dim pi(k), above), b2 | b3 the same of key g + 8. V group (b, h, p):
// (key 2t, key 2t + 1) and (2t + 8, 2t + 9) of dim 32 b + 16 h + 2 g + p.
template <int HD>
__device__ __forceinline__ void frag_scores_f16(float (&s)[2][4], const __half* q_hi, const __half* q_lo,
                                                const __half* kt) {
    constexpr int LD = Cfg<HD>::LD;
    const int lane = threadIdx.x & 31, mi = lane >> 3, g = lane >> 2, t = lane & 3;
    float acc[2][2][2][4];
    zero_score_acc(acc);
    const int q_row_off = ((mi & 1) * 8 + (lane & 7)) * LD + (mi >> 1) * 8;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        uint32_t ah[4], al[4];
        ldsm_x4(ah, q_hi + q_row_off + kk * 16);
        ldsm_x4(al, q_lo + q_row_off + kk * 16);
        const uint2 k0 = *reinterpret_cast<const uint2*>(kt + g * LD + kk * 16 + 4 * t);
        const uint2 k1 = *reinterpret_cast<const uint2*>(kt + (g + 8) * LD + kk * 16 + 4 * t);
        mma16816(acc[0][kk & 1][0], ah, k0.x, k0.y);
        mma16816(acc[1][kk & 1][0], al, k0.x, k0.y);
        mma16816(acc[0][kk & 1][1], ah, k1.x, k1.y);
        mma16816(acc[1][kk & 1][1], al, k1.x, k1.y);
    }
    sum_score_acc(s, acc);
}

template <int HD>
__device__ __forceinline__ void frag_pv_f16(WarpState<HD>& st, const uint32_t (&ph)[4], const uint32_t (&pl)[4],
                                            const __half* vt) {
    constexpr int LD = Cfg<HD>::LD, NB = HD / kvq::BLOCK;
    const int lane = threadIdx.x & 31, g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // dims d, d + 1 (p = 0, 1) of keys 2t, 2t + 1, 2t + 8, 2t + 9: one 32-bit load each (conflict free: rows
            // LD = HD + 8 halves apart put the 4 t's 8 banks apart), their halves paired by byte permutes
            const int d = 32 * b + 16 * h + 2 * g;
            const uint32_t r0 = *reinterpret_cast<const uint32_t*>(vt + t2 * LD + d);
            const uint32_t r1 = *reinterpret_cast<const uint32_t*>(vt + (t2 + 1) * LD + d);
            const uint32_t r8 = *reinterpret_cast<const uint32_t*>(vt + (t2 + 8) * LD + d);
            const uint32_t r9 = *reinterpret_cast<const uint32_t*>(vt + (t2 + 9) * LD + d);
#pragma unroll
            for (int p = 0; p < 2; ++p) {
                const uint32_t sel = p == 0 ? 0x5410u : 0x7632u;     // the low (p 0) or high (p 1) halves
                const uint32_t b0 = __byte_perm(r0, r1, sel), b1 = __byte_perm(r8, r9, sel);
                float (&o)[4] = st.o[4 * b + 2 * h + p];
                mma16816(o, ph, b0, b1);
                mma16816(o, pl, b0, b1);
            }
        }
}

template <int HD>
__device__ __forceinline__ void warp_step_qf16(WarpState<HD>& st, const __half* q_hi, const __half* q_lo,
                                               const __half* kt, const __half* vt, int v0, int L) {
    float s[2][4];
    frag_scores_f16<HD>(s, q_hi, q_lo, kt);
    uint32_t ph[4], pl[4];
    warp_softmax<HD>(st, s, v0, L, ph, pl);
    frag_pv_f16<HD>(st, ph, pl, vt);
}

// warp_store for the fragment step: group (b, h, p)'s columns 2t, 2t + 1 are dims 32 b + 16 h + 4t + p and
// + 2 + p, so a (b, h) pair of groups is dims 32 b + 16 h + 4t .. + 3 of rows g and g + 8 (one float4 each).
template <int HD>
__device__ __forceinline__ void warp_store_q(WarpState<HD>& st, float* m_s, float* l_s, float* o_s) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t4 = (lane & 3) * 4;
    warp_store_ml<HD>(st, m_s, l_s);
    float* ow = o_s + (size_t)w * ROWS * HD;
#pragma unroll
    for (int bh = 0; bh < HD / 16; ++bh) {
        const float(&e)[4] = st.o[2 * bh];
        const float(&o)[4] = st.o[2 * bh + 1];
        *reinterpret_cast<float4*>(ow + g * HD + 16 * bh + t4) = make_float4(e[0], o[0], e[1], o[1]);
        *reinterpret_cast<float4*>(ow + (g + 8) * HD + 16 * bh + t4) = make_float4(e[2], o[2], e[3], o[3]);
    }
}

#else
// (SIMT builds: frag_types is false, so splitk_kernel's FRAG branches are discarded; the names must still exist)
template <int HD>
__device__ void warp_store_q(WarpState<HD>& st, float* m_s, float* l_s, float* o_s);
template <int HD>
__device__ void warp_step_qf16(WarpState<HD>& st, const __half* q_hi, const __half* q_lo, const __half* kt,
                               const __half* vt, int v0, int L);
#endif  // FD_ATTN_MMA

// ---- one tile of splitk_kernel's main loop (FRAG) ------------------------------------------------------
// The warp's 16 keys v0 .. v0 + 15 of landed raw stage src (K side: codes [TILE][KCB + CODE_PAD], scales
// [TILE][NB]; then V's alike). ROPE: if the new key (slot new_key) is one of them, its row in the stage -- the
// cache's stale copy -- is first overwritten by the warp with the raw new row (rope_stage_rotated's, in raw_new;
// the stage is refilled only after the next __syncthreads), as splitk_kernel's step (a) does on the float16 tile.
template <int HD, int KT, int VT, bool ROPE>
__device__ __forceinline__ void frag_tile(WarpState<HD>& st, const __half* q_hi, const __half* q_lo, uint8_t* src,
                                          const __half* raw_new, int new_key, int v0, int L) {
#if FD_ATTN_MMA
    constexpr int NB = HD / kvq::BLOCK;
    constexpr int KCB = KT == FD_KV_Q8_0 ? HD : HD / 2, VCB = VT == FD_KV_Q8_0 ? HD : HD / 2;
    constexpr int KS = KCB + CODE_PAD, VS = VCB + CODE_PAD;       // staged code row strides
    const int lane = threadIdx.x & 31, row0 = (threadIdx.x >> 5) * WARP_SLOTS;   // the warp's first tile row
    uint8_t* k_codes = src;
    __half* k_scales = reinterpret_cast<__half*>(src + TILE * KS);
    uint8_t* v_codes = src + TILE * (KS + 2 * NB);
    __half* v_scales = reinterpret_cast<__half*>(v_codes + TILE * VS);
    if constexpr (ROPE) {
        if (new_key >= v0 && new_key < v0 + WARP_SLOTS) {          // warp-uniform: the new key is ours
            const int i = row0 + new_key - v0;
            const uint8_t* raw = reinterpret_cast<const uint8_t*>(raw_new);
            const int vo = raw_new_v(HD, KT);
            for (int w = lane; w < KCB / 4; w += 32)
                reinterpret_cast<uint32_t*>(k_codes + i * KS)[w] = reinterpret_cast<const uint32_t*>(raw)[w];
            for (int w = lane; w < VCB / 4; w += 32)
                reinterpret_cast<uint32_t*>(v_codes + i * VS)[w] = reinterpret_cast<const uint32_t*>(raw + vo)[w];
            if (lane < NB) {
                k_scales[i * NB + lane] = reinterpret_cast<const __half*>(raw + KCB)[lane];
                v_scales[i * NB + lane] = reinterpret_cast<const __half*>(raw + vo + VCB)[lane];
            }
            __syncwarp();
        }
    }
    warp_step_q<HD, KT, VT>(st, q_hi, q_lo, k_codes + row0 * KS, k_scales + row0 * NB, v_codes + row0 * VS,
                            v_scales + row0 * NB, v0, L);
#endif
}

}  // namespace attn
}  // namespace fd
