// x_codes.cuh -- an activation's int8 codes, one definition for every kernel that makes them: a group of values v
// (128 columns of one row: gemv_rows' x groups) with m = max |v| becomes codes q = rint(v * (127 / m)) in
// [-127, 127] and the scale m / 127 (x ~= scale * q). The GEMV's own quantization (gemv_rows_x.cuh
// rows_quant_group: its pre-pass and every CTA's copy) and the attention's codes of o (attention_splitk_kernel.cuh,
// fd_attention_shape_t.o_codes) both use these, so a GEMV reading codes another kernel made computes the same bits as
// one that made them itself. Every step is explicitly rounded: the library builds with --use_fast_math, and the
// expression must not be contracted differently where it is inlined.
#pragma once

#include "common.cuh"

namespace fd {

constexpr int XCODES_GROUP = 128;   // columns a scale covers (a head of head_dim 128 is one group)
constexpr int XCODES_ROWS = 32;     // rows between a group's scales: scale of (group g, row i) at g * 32 + i

// 127 / m, 0 for m == 0 (all codes 0) and for a NaN m
__device__ __forceinline__ float xcodes_inv(float m) { return m > 0.0f ? __fdiv_rn(127.0f, m) : 0.0f; }
__device__ __forceinline__ int xcodes_code(float v, float inv) {
    return max(-127, min(127, __float2int_rn(__fmul_rn(v, inv))));
}
__device__ __forceinline__ float xcodes_scale(float m) { return __fdiv_rn(m, 127.0f); }

}  // namespace fd
