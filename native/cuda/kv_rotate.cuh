// kv_rotate.cuh -- the Hadamard rotation of q and k in front of a quantized K cache (flashd_attention.h: a
// q8_0 / q4_0 K stores rotated keys). The numpy oracle, and the reason, is flashd's daemon/backends/kv_rotate.py:
// Qwen2's K has a few huge channels, so a 32-value block's one scale is set by one channel; an orthonormal
// Walsh-Hadamard transform H of each head's vector spreads every channel over its block, and since q and k
// are rotated alike (after RoPE), q . k is unchanged up to rounding. V is not rotated.
//
// The transform: head_dim = 32 n_r values, block B = the largest power of two dividing head_dim (32 <= B,
// B | head_dim); each block of B values gets H_B / sqrt(B) (Sylvester order), as the fast transform: stages
// h = 1, 2, ..., B / 2 in that order, each replacing (x[i], x[i + h]) (bit h of i clear) with
// (x[i] + x[i + h], x[i] - x[i + h]), then every value times float(1 / sqrt(B)). Each sum, difference and the
// final product is one correctly rounded float32 operation (explicit _rn intrinsics: the library builds with
// --use_fast_math), so the result depends only on that order -- not on the thread layout -- and equals
// kv_rotate.py's bit for bit. That is what keeps every path bitwise consistent: fd_rope_kv_write (q rotated in
// place, k rotated before its encode) and fd_attention_decode_rope (q and the new k in registers)
// call this one function, so decode, masked (tree) and prefill attention see the same rotated q and the same
// stored K bits, and a tree node's output stays bitwise the decode step's.
//
// Layout (one warp per row, registers + shuffles, no shared memory): lane l holds x[r] = value 32 r + l of the
// row, r < n_r. Stages h < 32 pair lanes l and l ^ h (one __shfl_xor_sync per register); stages h >= 32 pair
// registers r and r ^ (h / 32) of the same lane. RMAX (compile-time) bounds n_r; the loops are unrolled over
// RMAX with the runtime n_r and B as guards, so x stays in registers.
#pragma once

#include "common.cuh"

namespace fd {
namespace kvq {

// B: the largest power of two dividing head_dim (>= 32 for a quantized type: head_dim % 32 == 0).
__host__ __device__ inline int rotation_block(int head_dim) { return head_dim & -head_dim; }

// float(1 / sqrt(B)) rounded once from double, as kv_rotate.py's rotation_scale (double division and square
// root are IEEE-exact under --use_fast_math, which only relaxes single precision).
__device__ __forceinline__ float rotation_scale(int block) {
    return __double2float_rn(1.0 / sqrt((double)block));
}

// x[r] (r < n_r) holds value 32 r + lane of one row of 32 n_r values; all 32 lanes call it (shuffles).
// block: rotation_block(32 n_r). On return x holds the rotated row in the same layout.
template <int RMAX>
__device__ __forceinline__ void hadamard_rotate(float (&x)[RMAX], int n_r, int block, int lane) {
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {                          // across lanes (block >= 32: every such stage)
#pragma unroll
        for (int r = 0; r < RMAX; ++r) {
            if (r < n_r) {
                const float mine = x[r], other = __shfl_xor_sync(0xffffffffu, x[r], h);
                x[r] = (lane & h) ? __fsub_rn(other, mine) : __fadd_rn(mine, other);   // (a + b, a - b)
            }
        }
    }
#pragma unroll
    for (int hr = 1; hr < RMAX; hr <<= 1) {                     // across registers: h = 32 hr < block
        if (32 * hr < block) {
#pragma unroll
            for (int r = 0; r < RMAX; ++r) {
                if ((r & hr) == 0 && r + hr < n_r) {
                    const float a = x[r], b = x[r + hr];
                    x[r] = __fadd_rn(a, b);
                    x[r + hr] = __fsub_rn(a, b);
                }
            }
        }
    }
    const float s = rotation_scale(block);
#pragma unroll
    for (int r = 0; r < RMAX; ++r)
        if (r < n_r) x[r] = __fmul_rn(x[r], s);
}

// One row of 32 n_r floats (global or shared memory) rotated in place by one warp (n_r <= RMAX). sub (NULL: none):
// 32 n_r floats subtracted first (the key offset, flashd_attention.h: one rounded float32 subtraction per value).
template <int RMAX>
__device__ __forceinline__ void hadamard_rotate_row(float* row, int n_r, int lane, const float* sub = nullptr) {
    float x[RMAX];
#pragma unroll
    for (int r = 0; r < RMAX; ++r) x[r] = r < n_r ? row[32 * r + lane] : 0.0f;
    if (sub != nullptr) {
#pragma unroll
        for (int r = 0; r < RMAX; ++r)
            if (r < n_r) x[r] = __fsub_rn(x[r], sub[32 * r + lane]);
    }
    hadamard_rotate<RMAX>(x, n_r, rotation_block(32 * n_r), lane);
#pragma unroll
    for (int r = 0; r < RMAX; ++r)
        if (r < n_r) row[32 * r + lane] = x[r];
}

}  // namespace kvq
}  // namespace fd
