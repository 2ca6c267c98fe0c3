// kv_quant.cuh -- the quantized KV cache rows (flashd_attention.h: FD_KV_Q8_0, FD_KV_Q4_0): where a row's
// codes and scales live, and the encoders of one 32-value block, bit for bit ggml's reference rounding
// (ggml-quants.c quantize_row_q8_0_ref / quantize_row_q4_0_ref; the numpy oracle is flashd's
// daemon/backends/kv_quant.py).
//
// The library builds with --use_fast_math, which would turn x / y into an approximate division and allow
// contractions; every operation of the encoders is therefore an explicit round-to-nearest intrinsic
// (__fdiv_rn, __fmul_rn, __fadd_rn), so each step is the correctly rounded float32 operation of the C code.
// One difference: -ftz flushes float32 denormals, so a block whose largest magnitude is below ~1.2e-36
// (d = amax / 127 denormal) gets d = 0 and zero codes here, where ggml keeps the codes; its float16 scale is
// 0 in both (fp16 cannot hold such a d), so the dequantized values agree (all 0).
#pragma once

#include "common.cuh"

namespace fd {
namespace kvq {

constexpr int BLOCK = 32;                    // values per block

// Bytes of a row's codes: int8 per value (q8_0), a nibble per value (q4_0).
__host__ __device__ inline int code_bytes(int kv_type, int head_dim) {
    return kv_type == FD_KV_Q8_0 ? head_dim : head_dim / 2;
}

// One layer's plane of a quantized type: codes [n_kv_heads][max_ctx][code_bytes], then the float16 scales
// [n_kv_heads][max_ctx][head_dim / 32]. row = kv_head * max_ctx + slot.
struct Plane {
    uint8_t* codes;
    __half* scales;
    int code_bytes, n_blocks;
    __device__ __forceinline__ uint8_t* row_codes(size_t row) const { return codes + row * code_bytes; }
    __device__ __forceinline__ __half* row_scales(size_t row) const { return scales + row * n_blocks; }
};

inline Plane plane(void* base, int kv_type, int n_kv_heads, int max_ctx, int head_dim) {
    const int cb = code_bytes(kv_type, head_dim);
    uint8_t* codes = static_cast<uint8_t*>(base);
    return Plane{codes, reinterpret_cast<__half*>(codes + (size_t)n_kv_heads * max_ctx * cb), cb, head_dim / BLOCK};
}

// q8_0: amax = max |x|, d = amax / 127, id = d ? 1 / d : 0, q = roundf(x * id) (half away from zero).
__device__ __forceinline__ void encode_q8_0(const float* x, int8_t* q, __half* d_out) {
    float amax = 0.0f;
#pragma unroll 8
    for (int j = 0; j < BLOCK; ++j) amax = fmaxf(amax, fabsf(x[j]));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    *d_out = __float2half_rn(d);
#pragma unroll 8
    for (int j = 0; j < BLOCK; ++j) q[j] = (int8_t)roundf(__fmul_rn(x[j], id));
}

// q4_0: max = the first value of largest magnitude (strict <), d = max / -8, id = d ? 1 / d : 0,
// q = min(15, (int)(x * id + 8.5f)) (truncation); byte j = q[j] | q[j + 16] << 4.
__device__ __forceinline__ void encode_q4_0(const float* x, uint8_t* packed, __half* d_out) {
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < BLOCK; ++j) {
        const float a = fabsf(x[j]);
        if (amax < a) {
            amax = a;
            mx = x[j];
        }
    }
    const float d = __fdiv_rn(mx, -8.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    *d_out = __float2half_rn(d);
#pragma unroll 4
    for (int j = 0; j < BLOCK / 2; ++j) {
        const int lo = min(15, __float2int_rz(__fadd_rn(__fmul_rn(x[j], id), 8.5f)));
        const int hi = min(15, __float2int_rz(__fadd_rn(__fmul_rn(x[j + BLOCK / 2], id), 8.5f)));
        packed[j] = (uint8_t)(lo | (hi << 4));
    }
}

// The same two encoders for one warp holding a block in registers (lane l: value l of the block, x), bit for bit
// the serial ones above: max and the first-largest index are exact reductions (ties go to the lower index, as the
// strict < of the serial loop; a NaN or zero magnitude never wins, as there), and every lane rounds its own code
// by the same intrinsics. Each returns the float16 scale (all lanes) and the lane's code: q8_0 the int8 value,
// q4_0 the 4-bit code 0..15 (byte j of the packed row = code of lane j | code of lane j + 16 << 4).
__device__ __forceinline__ int encode_q8_0_warp(float x, __half& d_out) {
    float amax = fmaxf(0.0f, fabsf(x));
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, h));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    d_out = __float2half_rn(d);
    return (int)(int8_t)roundf(__fmul_rn(x, id));
}

__device__ __forceinline__ int encode_q4_0_warp(float x, int lane, __half& d_out) {
    const float a0 = fabsf(x);
    float a = a0 > 0.0f ? a0 : 0.0f;                    // NaN / 0: never selected (serial: amax < a false)
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
    const float mx = a > 0.0f ? xm : 0.0f;              // nothing above 0: the serial loop's initial mx = +0
    const float d = __fdiv_rn(mx, -8.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    d_out = __float2half_rn(d);
    return min(15, __float2int_rz(__fadd_rn(__fmul_rn(x, id), 8.5f)));
}

// Block b of row `row` of a quantized plane (or of a float16 row: f16 != nullptr) <- one warp's 32 values x (lane l:
// value l). Returns the lane's value as the attention tiles see it: float16(d * q) (dequant8_codes' rounding) or
// float16(x). Writes the cache only if store; a quantized block's codes and scale also to row 0 of copy, if given
// (split-K attention's raw new row in shared memory, attention_splitk_rope_rot.cuh).
__device__ __forceinline__ __half encode_block_warp(const Plane& p, __half* f16, int kv_type, size_t row, int b,
                                                    float x, int lane, bool store, const Plane* copy = nullptr) {
    if (kv_type == FD_KV_F16) {
        const __half h = __float2half_rn(x);
        if (store) f16[b * BLOCK + lane] = h;
        return h;
    }
    __half dh;
    float val;
    if (kv_type == FD_KV_Q8_0) {
        const int q = encode_q8_0_warp(x, dh);
        if (store) reinterpret_cast<int8_t*>(p.row_codes(row) + b * BLOCK)[lane] = (int8_t)q;
        if (copy != nullptr) reinterpret_cast<int8_t*>(copy->codes + b * BLOCK)[lane] = (int8_t)q;
        val = __half2float(dh) * (float)q;
    } else {
        const int q = encode_q4_0_warp(x, lane, dh);
        const int hi = __shfl_down_sync(0xffffffffu, q, BLOCK / 2);
        if (store && lane < BLOCK / 2) p.row_codes(row)[b * (BLOCK / 2) + lane] = (uint8_t)(q | (hi << 4));
        if (copy != nullptr && lane < BLOCK / 2) copy->codes[b * (BLOCK / 2) + lane] = (uint8_t)(q | (hi << 4));
        val = __half2float(dh) * (float)(q - 8);
    }
    if (store && lane == 0) p.row_scales(row)[b] = dh;
    if (copy != nullptr && lane == 0) copy->scales[b] = dh;
    return __float2half_rn(val);
}

// Where a quantized side's window ring starts in its allocation (flashd_attention.h: fd_kv_window_offset): after the
// codes and scales, rounded up to 256 bytes.
inline size_t window_offset(int kv_type, int n_kv_heads, int max_ctx, int head_dim) {
    const size_t plane = (size_t)n_kv_heads * max_ctx * (code_bytes(kv_type, head_dim) + 2 * (head_dim / BLOCK));
    return (plane + 255) / 256 * 256;
}

// A side's window ring, float16 [n_kv_heads][window_slots][head_dim] (nullptr: none -- no window, or a float16 side).
inline __half* ring_of(const void* base, int kv_type, int n_kv_heads, int max_ctx, int head_dim, int window) {
    if (window == 0 || kv_type == FD_KV_F16) return nullptr;
    return reinterpret_cast<__half*>(static_cast<uint8_t*>(const_cast<void*>(base)) +
                                     window_offset(kv_type, n_kv_heads, max_ctx, head_dim));
}

// One layer's K or V cache as the attention loaders read it: float16 rows, or a quantized plane.
struct Rows {
    const __half* f16;           // FD_KV_F16: [n_kv_heads][max_ctx][head_dim]
    Plane q;                     // FD_KV_Q8_0 / FD_KV_Q4_0
    int type;
};

inline Rows rows_of(const void* base, int kv_type, int n_kv_heads, int max_ctx, int head_dim) {
    return Rows{static_cast<const __half*>(base), plane(const_cast<void*>(base), kv_type, n_kv_heads, max_ctx, head_dim),
                kv_type};
}

// Values [8 piece, 8 piece + 8) of a quantized row, dequantized and rounded to float16 (round to nearest
// even): float16(d * q), what the attention tiles hold. codes: the row's codes (global or shared memory, 8-byte
// aligned: a row's codes start at a multiple of 16 bytes); dh: the scale of block piece / 4. The codes are one
// 8-byte load (q4_0: bytes 16 b + off % 16 .. + 7, low nibbles for off < 16, else high).
//
// CUDA: in float16x2 arithmetic, no conversion instructions (I2F / F2F issue at 16 a clock an SM on sm_90, a
// quarter of the integer and half-precision rate: at depth they were the quantized cache's whole cost over the
// float16 one). A byte u (the code + 128 for q8_0, the nibble for q4_0) under the float16 exponent byte 0x64 is
// 1024 + u exactly (one __byte_perm builds two); minus 1152 (q8_0) or 1032 (q4_0) is the code's value q exactly;
// times d rounded once (__hmul2_rn: correctly rounded, subnormal results kept, never contracted) is float16(d q)
// -- the same bits as the float32 path below, whose product d q (11 x 8 significant bits) is exact before its one
// rounding. tests/emulation/test_kv_dequant_half2.py checks the identity over every scale and code; the GPU tests
// compare the tiles' attention bit for bit with the float16 kernels' over numpy's dequantized values.
// HIP keeps the float32 path (its half intrinsics' rounding is not documented the same way).
#if FD_HAS_MMA
__device__ __forceinline__ uint32_t dequant_pair(uint32_t bytes, uint32_t sel, __half2 bias, __half2 d2) {
    const uint32_t h = __byte_perm(bytes, 0x64646464u, sel);     // (1024 + u_lo, 1024 + u_hi)
    const __half2 q = __hsub2_rn(*reinterpret_cast<const __half2*>(&h), bias);
    const __half2 v = __hmul2_rn(q, d2);
    return *reinterpret_cast<const uint32_t*>(&v);
}
#endif

__device__ __forceinline__ uint4 dequant8_codes(const uint8_t* codes, __half dh, int kv_type, int piece) {
    const int b = piece >> 2, off = (piece & 3) * 8;             // block, first value in the block
#if FD_HAS_MMA
    uint2 c;
    __half bias;
    if (kv_type == FD_KV_Q8_0) {
        c = *reinterpret_cast<const uint2*>(codes + piece * 8);
        c.x ^= 0x80808080u;                                      // int8 q -> byte q + 128
        c.y ^= 0x80808080u;
        bias = __ushort_as_half((unsigned short)0x6480);        // 1152
    } else {
        c = *reinterpret_cast<const uint2*>(codes + b * 16 + (off & 15));
        const int shift = off >= 16 ? 4 : 0;
        c.x = (c.x >> shift) & 0x0f0f0f0fu;
        c.y = (c.y >> shift) & 0x0f0f0f0fu;
        bias = __ushort_as_half((unsigned short)0x6408);        // 1032
    }
    const __half2 bias2 = __half2half2(bias), d2 = __half2half2(dh);
    return make_uint4(dequant_pair(c.x, 0x4140u, bias2, d2), dequant_pair(c.x, 0x4342u, bias2, d2),
                      dequant_pair(c.y, 0x4140u, bias2, d2), dequant_pair(c.y, 0x4342u, bias2, d2));
#else
    const float d = __half2float(dh);
    float x[8];
    if (kv_type == FD_KV_Q8_0) {
        const uint2 c = *reinterpret_cast<const uint2*>(codes + piece * 8);
        const int8_t* q = reinterpret_cast<const int8_t*>(&c);
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = d * (float)q[i];
    } else {
        const uint2 c = *reinterpret_cast<const uint2*>(codes + b * 16 + (off & 15));
        const uint8_t* q = reinterpret_cast<const uint8_t*>(&c);
        const int shift = off >= 16 ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = d * (float)(((q[i] >> shift) & 15) - 8);
    }
    uint4 out;
    __half2* h = reinterpret_cast<__half2*>(&out);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(x[2 * i], x[2 * i + 1]);
    return out;
#endif
}

// dequant8_codes of row `row` of a plane, read from global memory.
__device__ __forceinline__ uint4 dequant8(const Plane& pl, int kv_type, size_t row, int piece) {
    return dequant8_codes(pl.row_codes(row), pl.row_scales(row)[piece >> 2], kv_type, piece);
}

// Bytes of one row as the attention kernels' cp.async rings stage it (attention_splitk_qstage.cuh,
// attention_tile.cuh): codes then float16 scales, or a float16 row's values.
__host__ __device__ inline int staged_row_bytes(int kv_type, int head_dim) {
    return kv_type == FD_KV_F16 ? 2 * head_dim : code_bytes(kv_type, head_dim) + head_dim / BLOCK * 2;
}

// Block b of row `row` of a quantized plane <- the 32 float32 values x.
__device__ __forceinline__ void encode_block(const Plane& p, int kv_type, size_t row, int b, const float* x) {
    if (kv_type == FD_KV_Q8_0)
        encode_q8_0(x, reinterpret_cast<int8_t*>(p.row_codes(row) + b * BLOCK), p.row_scales(row) + b);
    else
        encode_q4_0(x, p.row_codes(row) + b * (BLOCK / 2), p.row_scales(row) + b);
}

}  // namespace kvq
}  // namespace fd
