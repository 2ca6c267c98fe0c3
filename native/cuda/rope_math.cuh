// rope_math.cuh -- the rotary-embedding arithmetic that every flashd kernel applying RoPE shares, so the
// rotated values agree bit for bit between them: fd_rope_kv_write (rope.cu) and fd_attention_decode_rope
// (attention_decode.cu; rope_stage in attention_splitk_kernel.cuh), which must reproduce rope_kv_write +
// attention_decode exactly (the one-row decode step against tree verification's rope_kv_write + attention_masked).
//
// Pair j < rope_dim / 2 of a head row is (a, b) = neox ? (x[j], x[j + rope_dim/2]) : (x[2j], x[2j+1]);
// dims >= rope_dim are not rotated. angle = pos * theta^(-2j/rope_dim), formed in double (pow and sincos
// in double: full argument reduction, unaffected by --use_fast_math) and rounded to float like the
// reference (ReferenceOps.rope: float64 angles, float32 cos/sin). The rotation (a, b) -> (a c - b s,
// a s + b c) keeps separately rounded products (no FMA contraction), numpy's float32 expression.
//
// Position scaling (linear / YaRN, flashd.h fd_rope_scaling_t; RopeScaling in the host code): the angle
// is mixed from the extrapolated and the interpolated one by YaRN's ramp and cos/sin are scaled by
// mscale, every double operation written as an explicit _rn intrinsic in ReferenceOps.rope_cos_sin's
// order (nvcc's --fmad would otherwise contract a*b + c into an FMA that numpy does not do), so the
// float cos/sin equal the reference's under the same proviso as the plain rope (CUDA's double pow and
// sincos). RopeScaling{} (on = 0) is the plain rope, by the very same instructions as before.
#pragma once

#include "common.cuh"

namespace fd {

// the kernels' copy of fd_rope_scaling_t (by value in their parameters); on = 0: no scaling
struct RopeScaling {
    double freq_scale, ext_factor, corr_low, corr_high, mscale;
    int on;
};

// NULL -> off. Host side; the caller has checked it with rope_scaling_valid.
inline RopeScaling rope_scaling_from(const fd_rope_scaling_t* s) {
    RopeScaling r{};
    if (s != nullptr) {
        r.freq_scale = s->freq_scale;
        r.ext_factor = s->ext_factor;
        r.corr_low = s->corr_low;
        r.corr_high = s->corr_high;
        r.mscale = s->mscale;
        r.on = 1;
    }
    return r;
}

inline bool rope_scaling_valid(const fd_rope_scaling_t* s) {
    if (s == nullptr) return true;
    return isfinite(s->freq_scale) && s->freq_scale > 0.0 && isfinite(s->ext_factor) && s->ext_factor >= 0.0 &&
           isfinite(s->corr_low) && isfinite(s->corr_high) && isfinite(s->mscale) && s->mscale > 0.0;
}

// fd_rope_t as every rope entry point checks it (flashd_attention.h): FD_E_ARG unless true.
inline bool rope_valid(const fd_rope_t* r, int head_dim) {
    return r != nullptr && r->rope_dim >= 2 && r->rope_dim % 2 == 0 && r->rope_dim <= head_dim && r->theta > 0.0f &&
           rope_scaling_valid(r->scaling) && r->table_mode >= 0 && r->table_mode <= 2 &&
           (r->table_mode == 0 || r->table != nullptr);
}

// cos / sin (float) of pair j at position pos
__device__ __forceinline__ void rope_cos_sin(int pos, int j, int rope_dim, double theta, const RopeScaling& sc,
                                             float& c, float& s) {
    // the reference: theta ** (-arange(half) * 2.0 / rope_dim), angle = pos * inv_freq (float64)
    const double inv_freq = pow(theta, (-(double)j * 2.0) / (double)rope_dim);
    double sd, cd;
    if (!sc.on) {
        sincos((double)pos * inv_freq, &sd, &cd);
        c = (float)cd;
        s = (float)sd;
        return;
    }
    // ReferenceOps.rope_cos_sin's scaled branch, operation by operation
    const double extrap = __dmul_rn((double)pos, inv_freq);
    const double interp = __dmul_rn(sc.freq_scale, extrap);
    double angle = interp;
    if (sc.ext_factor != 0.0) {
        const double y = __ddiv_rn(__dsub_rn((double)j, sc.corr_low), fmax(0.001, __dsub_rn(sc.corr_high, sc.corr_low)));
        const double mix = __dmul_rn(__dsub_rn(1.0, fmin(1.0, fmax(0.0, y))), sc.ext_factor);
        angle = __dadd_rn(__dmul_rn(interp, __dsub_rn(1.0, mix)), __dmul_rn(extrap, mix));
    }
    sincos(angle, &sd, &cd);
    c = (float)__dmul_rn(cd, sc.mscale);
    s = (float)__dmul_rn(sd, sc.mscale);
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
