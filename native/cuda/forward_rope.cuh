// forward_rope.cuh -- rotary embedding inside the persistent forward (forward.cu): the cos/sin table of a
// launch's positions, and one head row (per-head RMSNorm first where the model has it, qwen3) rotated by a
// warp. forward_attention.cuh calls rope_row for its q tile and for this launch's K rows before it reads
// them, so no stage of its own (and no grid-wide wait) is spent on it.
//
// Arithmetic: rope.cu's. The table is inv_freq = theta^(-2j/rope_dim) and angle = pos * inv_freq in double,
// sincos in double, rounded to float; the rotation (a, b) -> (a c - b s, a s + b c) keeps separately
// rounded products (neox pairs (j, j + rope_dim/2), else (2j, 2j + 1); dims >= rope_dim unrotated), so a
// rotated row equals fd_rope_kv_write's bit for bit (without the qwen3 norm, which fd_rmsnorm computes in
// another order).
//
// Position scaling (linear / YaRN): the table entries come from rope_math.cuh's rope_cos_sin, so they are
// fd_rope_kv_write's cos/sin bit for bit, scaled or not.
#pragma once

#include "common.cuh"
#include "rope_math.cuh"

namespace fd {
namespace fwd {

struct RopeShape {
    const float* cs;            // the launch's table: cos [n][half] then sin [n][half]
    int n, head_dim, rope_dim, neox;
    float eps;                  // the per-head RMSNorm's
};

// cos / sin of row i's position for pair j < half, over the grid's threads (global thread index gt of
// n_threads). table: cos [n][half] | sin [n][half].
__device__ __forceinline__ void rope_table(float* table, const int32_t* positions, int n, int rope_dim, double theta,
                                           const RopeScaling& scaling, int gt, int n_threads) {
    const int half = rope_dim / 2;
    for (int e = gt; e < n * half; e += n_threads) {
        const int i = e / half, j = e % half;
        float c, s;
        rope_cos_sin(positions[i], j, rope_dim, theta, scaling, c, s);
        table[e] = c;
        table[n * half + e] = s;
    }
}

// One head row src (head_dim floats, written earlier in this launch) at table row t, by one warp: norm
// (nw != null), rotation, then out(d, y) for every dim d (lane d % 32 calls it). scratch: head_dim floats
// of the warp's own shared memory.
template <class Out>
__device__ __forceinline__ void rope_row(const RopeShape& a, const float* src, const float* nw, int t, float* scratch,
                                         Out out) {
    const int lane = threadIdx.x & 31, HD = a.head_dim, half = a.rope_dim / 2;
    float ss = 0.0f;
    for (int d = lane; d < HD; d += 32) {
        const float x = __ldcg(src + d);
        scratch[d] = x;
        ss = fmaf(x, x, ss);
    }
    ss = warp_sum(ss);
    if (nw != nullptr) {
        const float scale = rsqrtf(ss / (float)HD + a.eps);
        for (int d = lane; d < HD; d += 32) scratch[d] = scratch[d] * scale * __ldg(nw + d);
    }
    __syncwarp();
    const float* cs = a.cs + (size_t)t * half;
    const float* sn = a.cs + (size_t)a.n * half + (size_t)t * half;
    for (int d = lane; d < HD; d += 32) {
        float y = scratch[d];
        if (d < a.rope_dim) {
            const bool first = a.neox ? d < half : (d & 1) == 0;        // the pair's a element
            const int j = a.neox ? (first ? d : d - half) : d >> 1;
            const int pd = a.neox ? (first ? d + half : d - half) : d ^ 1;
            const float c = __ldcg(cs + j), s = __ldcg(sn + j);
            const float pa = first ? y : scratch[pd], pb = first ? scratch[pd] : y;
            y = first ? __fsub_rn(__fmul_rn(pa, c), __fmul_rn(pb, s)) : __fadd_rn(__fmul_rn(pa, s), __fmul_rn(pb, c));
        }
        out(d, y);
    }
    __syncwarp();                                        // scratch is reused by the warp's next row
}

}  // namespace fwd
}  // namespace fd
