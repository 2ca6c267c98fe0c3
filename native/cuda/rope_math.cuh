// rope_math.cuh -- the rotary-embedding arithmetic that every flashd kernel applying RoPE shares, so the
// rotated values agree bit for bit between them: fd_rope_kv_write (rope.cu) and fd_attention_decode_rope
// (attention_decode.cu, attention_splitk.cuh), which must reproduce rope_kv_write + attention_decode
// exactly (the one-row decode step against tree verification's rope_kv_write + attention_masked).
//
// Pair j < rope_dim / 2 of a head row is (a, b) = neox ? (x[j], x[j + rope_dim/2]) : (x[2j], x[2j+1]);
// dims >= rope_dim are not rotated. angle = pos * theta^(-2j/rope_dim), formed in double (pow and sincos
// in double: full argument reduction, unaffected by --use_fast_math) and rounded to float like the
// reference (ReferenceOps.rope: float64 angles, float32 cos/sin). The rotation (a, b) -> (a c - b s,
// a s + b c) keeps separately rounded products (no FMA contraction), numpy's float32 expression.
#pragma once

#include "common.cuh"

namespace fd {

// cos / sin (float) of pair j at position pos
__device__ __forceinline__ void rope_cos_sin(int pos, int j, int rope_dim, double theta, float& c, float& s) {
    // the reference: theta ** (-arange(half) * 2.0 / rope_dim), angle = pos * inv_freq (float64)
    const double inv_freq = pow(theta, (-(double)j * 2.0) / (double)rope_dim);
    double sd, cd;
    sincos((double)pos * inv_freq, &sd, &cd);
    c = (float)cd;
    s = (float)sd;
}

// the two dims (ia: the pair's a, ib: its b) of pair j
__device__ __forceinline__ void rope_pair_dims(int j, int rope_dim, bool neox, int& ia, int& ib) {
    ia = neox ? j : 2 * j;
    ib = neox ? j + rope_dim / 2 : 2 * j + 1;
}

// the pair of dim d < rope_dim: its index j, the other dim of the pair, and whether d is the pair's a
__device__ __forceinline__ void rope_pair_of(int d, int rope_dim, bool neox, int& j, int& partner, bool& first) {
    const int half = rope_dim / 2;
    first = neox ? d < half : (d & 1) == 0;
    j = neox ? (first ? d : d - half) : d >> 1;
    partner = neox ? (first ? d + half : d - half) : d ^ 1;
}

// the rotated value of one dim: self is x[d], partner the other element of its pair; first: d is the a
// element (result a c - b s) else the b element (result a s + b c)
__device__ __forceinline__ float rope_rotated(float self, float partner, float c, float s, bool first) {
    return first ? __fsub_rn(__fmul_rn(self, c), __fmul_rn(partner, s))
                 : __fadd_rn(__fmul_rn(partner, s), __fmul_rn(self, c));
}

}  // namespace fd
