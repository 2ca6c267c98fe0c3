// attention_splitk_combine.cuh -- the combine kernel of split-K attention (attention_splitk.cuh describes
// the design): combine_kernel merges the splits' partials (max, sum, unnormalised o) of one query row in a
// fixed order into the output; MAX_SPLITS bounds the split count.
#pragma once

#include "attention_splitk_params.cuh"

namespace fd {
namespace attn {

// Combine the splits' partials: one block per query row (n * n_heads rows), COMBINE_THREADS
// threads. Warp w merges splits w, w + COMBINE_WARPS, ... (combine_unroll<HD>() of them per round,
// all loads of a round in flight at once: the launchers' up to 198 splits (HD <= 128) in one memory
// round trip) into its own
// (max, sum, acc) online-softmax state, lanes covering head_dim; the warps' states meet in shared
// memory.
constexpr int COMBINE_THREADS = 512;
constexpr int COMBINE_WARPS = COMBINE_THREADS / 32;
constexpr int MAX_SPLITS = 512;
template <int HD>
constexpr int combine_unroll() { return HD >= 256 ? 8 : 13; }   // registers: 13 x (HD / 32 + 2) floats

// The merged output of dim d (combine_kernel's last step): the warps' states in a fixed order.
template <int HD>
__device__ __forceinline__ float lsum_acc_of(const float* wm, const float* wl, const float (*wa)[HD], int d) {
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < COMBINE_WARPS; ++w) mx = fmaxf(mx, wm[w]);
    float lsum = 0.0f, acc = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
        for (int w = 0; w < COMBINE_WARPS; ++w) {
            const float wt = exp2f(wm[w] - mx);
            lsum += wt * wl[w];
            acc += wt * wa[w][d];
        }
    }
    return lsum > 0.0f ? acc / lsum : __int_as_float(0x7fffffff);
}

// o[qrow] (head_dim 128) and its codes (flashd_attention.h o_codes): every thread computes dim tid & 127 (warps 4 ..
// 15 repeat warps 0 .. 3's values, so every warp reaches the barriers), warps 0 .. 3 store o and the codes; the
// head's max |o| meets in `red` (4 floats of shared memory no thread reads any more: wm, after the barrier).
__device__ __forceinline__ void combine_out_codes(const Params& p, size_t qrow, float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float wmax = warp_max(fabsf(v));
    __syncthreads();                                   // every thread has read wm in lsum_acc_of
    if (warp < XCODES_GROUP / 32 && lane == 0) red[warp] = wmax;
    __syncthreads();
    if (warp >= XCODES_GROUP / 32) return;
    const float m = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    const int d = threadIdx.x;
    p.o[qrow * XCODES_GROUP + d] = v;
    p.oq[qrow * XCODES_GROUP + d] = (int8_t)xcodes_code(v, xcodes_inv(m));
    if (d == 0) {
        const size_t token = qrow / p.n_heads, h = qrow % p.n_heads;
        p.osc[((token / XCODES_ROWS) * p.n_heads + h) * XCODES_ROWS + token % XCODES_ROWS] = xcodes_scale(m);
    }
}

template <int HD>
__global__ void __launch_bounds__(COMBINE_THREADS) combine_kernel(const Params p) {
    constexpr int PER_LANE = HD / 32;          // 2, 4 or 8 consecutive dims
    constexpr int COMBINE_UNROLL = combine_unroll<HD>();
    __shared__ float wm[COMBINE_WARPS], wl[COMBINE_WARPS];
    __shared__ float wa[COMBINE_WARPS][HD];
    const size_t qrow = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* m_row = p.ws_m + qrow * p.n_splits;
    const float* l_row = p.ws_l + qrow * p.n_splits;
    const float* acc_row = p.ws_acc + qrow * p.n_splits * HD + lane * PER_LANE;
    pdl_wait();                  // the partials of the split kernel
    pdl_launch_dependents();     // the next projection may start fetching its weights
    const int L = visible_keys(p, (int)(qrow / p.n_heads), nullptr);
    const int n_row_chunks = (L + p.chunk_len - 1) / p.chunk_len;
    if (n_row_chunks <= p.single_chunks || n_row_chunks == 0) return;   // split 0 wrote the row (splitk_kernel)
    const int n_active = min(p.n_splits, n_row_chunks);
    float m = -INFINITY, l = 0.0f, a[PER_LANE];
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) a[j] = 0.0f;
    for (int s0 = warp; s0 < n_active; s0 += COMBINE_WARPS * COMBINE_UNROLL) {
        float ms[COMBINE_UNROLL], ls[COMBINE_UNROLL], as[COMBINE_UNROLL][PER_LANE];
#pragma unroll
        for (int u = 0; u < COMBINE_UNROLL; ++u) {
            const int s = s0 + u * COMBINE_WARPS;
            const bool ok = s < n_active;
            ms[u] = ok ? m_row[s] : -INFINITY;
            ls[u] = ok ? l_row[s] : 0.0f;
#pragma unroll
            for (int j = 0; j < PER_LANE; j += 2) {
                const float2 t = ok ? *reinterpret_cast<const float2*>(acc_row + (size_t)s * HD + j)
                                    : make_float2(0.f, 0.f);
                as[u][j] = t.x;
                as[u][j + 1] = t.y;
            }
        }
        float mb = m;
#pragma unroll
        for (int u = 0; u < COMBINE_UNROLL; ++u) mb = fmaxf(mb, ms[u]);
        if (mb == -INFINITY) continue;                 // nothing visible yet
        const float f = exp2f(m - mb);                 // m = -inf: 0
        l *= f;
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) a[j] *= f;
#pragma unroll
        for (int u = 0; u < COMBINE_UNROLL; ++u) {
            const float wt = exp2f(ms[u] - mb);        // padding (-inf): 0
            l += wt * ls[u];
#pragma unroll
            for (int j = 0; j < PER_LANE; ++j) a[j] += wt * as[u][j];
        }
        m = mb;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) wa[warp][lane * PER_LANE + j] = a[j];
    __syncthreads();
    if constexpr (HD == XCODES_GROUP) {
        if (p.oq != nullptr) {      // o and its codes: the head is one group, its 128 values on warps 0 .. 3
            combine_out_codes(p, qrow, lsum_acc_of(wm, wl, wa, threadIdx.x & (HD - 1)), reinterpret_cast<float*>(wm));
            return;
        }
    }
    for (int d = threadIdx.x; d < HD; d += COMBINE_THREADS) p.o[qrow * HD + d] = lsum_acc_of(wm, wl, wa, d);
}

}  // namespace attn
}  // namespace fd
