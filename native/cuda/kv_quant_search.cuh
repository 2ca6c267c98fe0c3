// kv_quant_search.cuh -- the encoder of a q4_0 K cache: ggml's q4_0 block format (kv_quant.cuh), the scale searched
// over N_SEARCH step factors for the least squared read-back error. Bit for bit flashd's
// daemon/backends/kv_quant_search.py (its docstring has the measurement and the reasons); every reader of q4_0 rows
// is unchanged. V and q8_0 keep ggml's encoders (kv_quant.cuh).
//
// Per block x (32 float32): mx = the first value of largest magnitude (as encode_q4_0). Candidate i: d = mx *
// S[i], id = d ? 1 / d : 0, q = min(15, max(0, (int)(x * id + 8.5f))), dh = half(d), err = sum of (dh * (q - 8) -
// x)^2 in the xor-butterfly order (stage h = 16, 8, 4, 2, 1: s[j] += s[j ^ h]; the serial version keeps s[0]'s
// chain, s[j] += s[j + h] for j < h, the same operands in the same order). The least err wins, the lower i on a
// tie; S[0] = -1/8 makes candidate 0 ggml's encoder. Every operation is an explicit _rn intrinsic (the library
// builds with --use_fast_math).
//
// Cost: N_SEARCH x (one division, a few multiplies, five shuffles) per block. In fd_attention_decode_rope the
// owner CTA's warp 0 runs it for the new key's head_dim / 32 blocks (independent chains, unrolled).
#pragma once

#include "kv_quant.cuh"

namespace fd {
namespace kvq {

constexpr int N_SEARCH = 8;

// S[i] = float32(-F[i] / 8), F = 1.0, 0.95, 1.1, 0.925, 1.025, 0.975, 1.15, 0.9 (kv_quant_search.SCALE_FACTORS;
// each literal is the correctly rounded float32 of the exact decimal, as numpy's constant)
__device__ __forceinline__ float search_multiplier(int i) {
    switch (i) {
        case 0: return -0.125f;
        case 1: return -0.11875f;
        case 2: return -0.1375f;
        case 3: return -0.115625f;
        case 4: return -0.128125f;
        case 5: return -0.121875f;
        case 6: return -0.14375f;
        default: return -0.1125f;
    }
}

// The candidate's code of x (0..15) for scale d (ggml's rounding with id = 1 / d; clamped at 0 for d below ggml's).
__device__ __forceinline__ int search_code(float x, float d) {
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    return min(15, max(0, __float2int_rz(__fadd_rn(__fmul_rn(x, id), 8.5f))));
}

// Squared read-back error of one value: (half(d) * (q - 8) - x)^2, each step rounded.
__device__ __forceinline__ float search_sq(float x, float dhf, int q) {
    const float diff = __fsub_rn(__fmul_rn(dhf, (float)(q - 8)), x);
    return __fmul_rn(diff, diff);
}

// Serial: block x (32 values) -> packed codes (16 bytes) and its float16 scale, as encode_q4_0 stores them.
__device__ __forceinline__ void encode_q4_0_searched(const float* x, uint8_t* packed, __half* d_out) {
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < BLOCK; ++j) {
        const float a = fabsf(x[j]);
        if (amax < a) {
            amax = a;
            mx = x[j];
        }
    }
    float best_err = 0.0f, best_d = 0.0f;
    for (int i = 0; i < N_SEARCH; ++i) {
        const float d = __fmul_rn(mx, search_multiplier(i));
        const float dhf = __half2float(__float2half_rn(d));
        float s[BLOCK];                          // fully unrolled: registers, not local memory
#pragma unroll
        for (int j = 0; j < BLOCK; ++j) s[j] = search_sq(x[j], dhf, search_code(x[j], d));
#pragma unroll
        for (int h = BLOCK / 2; h > 0; h >>= 1)
#pragma unroll
            for (int j = 0; j < h; ++j) s[j] = __fadd_rn(s[j], s[j + h]);
        if (i == 0 || s[0] < best_err) {
            best_err = s[0];
            best_d = d;
        }
    }
    *d_out = __float2half_rn(best_d);
    for (int j = 0; j < BLOCK / 2; ++j)
        packed[j] = (uint8_t)(search_code(x[j], best_d) | (search_code(x[j + BLOCK / 2], best_d) << 4));
}

// One warp holding a block (lane l: value l, x): the lane's code (0..15) and the float16 scale (all lanes), bit for
// bit encode_q4_0_searched. mx as encode_q4_0_warp finds it.
__device__ __forceinline__ int encode_q4_0_searched_warp(float x, int lane, __half& d_out) {
    const float a0 = fabsf(x);
    float a = a0 > 0.0f ? a0 : 0.0f;
    int idx = lane;
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, a, h);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, h);
        if (oa > a || (oa == a && oi < idx)) {
            a = oa;
            idx = oi;
        }
    }
    const float xm = __shfl_sync(0xffffffffu, x, idx);
    const float mx = a > 0.0f ? xm : 0.0f;
    float best_err = 0.0f, best_d = 0.0f;
#pragma unroll
    for (int i = 0; i < N_SEARCH; ++i) {
        const float d = __fmul_rn(mx, search_multiplier(i));
        float s = search_sq(x, __half2float(__float2half_rn(d)), search_code(x, d));
#pragma unroll
        for (int h = 16; h > 0; h >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, h));
        if (i == 0 || s < best_err) {            // every lane holds the same s bits: a warp-uniform choice
            best_err = s;
            best_d = d;
        }
    }
    d_out = __float2half_rn(best_d);
    return search_code(x, best_d);
}

// A K row's block b <- x (serial): q4_0 searched, q8_0 ggml's (encode_block).
__device__ __forceinline__ void encode_k_block(const Plane& p, int kv_type, size_t row, int b, const float* x) {
    if (kv_type == FD_KV_Q4_0)
        encode_q4_0_searched(x, p.row_codes(row) + b * (BLOCK / 2), p.row_scales(row) + b);
    else
        encode_block(p, kv_type, row, b, x);
}

// encode_block_warp for a K row: a q4_0 K gets the searched scale; float16 and q8_0 as encode_block_warp.
__device__ __forceinline__ __half encode_k_block_warp(const Plane& p, __half* f16, int kv_type, size_t row, int b,
                                                      float x, int lane, bool store) {
    if (kv_type != FD_KV_Q4_0) return encode_block_warp(p, f16, kv_type, row, b, x, lane, store);
    __half dh;
    const int q = encode_q4_0_searched_warp(x, lane, dh);
    const int hi = __shfl_down_sync(0xffffffffu, q, BLOCK / 2);
    if (store && lane < BLOCK / 2) p.row_codes(row)[b * (BLOCK / 2) + lane] = (uint8_t)(q | (hi << 4));
    if (store && lane == 0) p.row_scales(row)[b] = dh;
    return __float2half_rn(__half2float(dh) * (float)(q - 8));
}

}  // namespace kvq
}  // namespace fd
