// sampling_common.cuh -- what fd_argmax (sampling_argmax.cuh) and fd_sample (sampling_sample.cuh) share:
// the block of ST = 1024 threads that reads a whole vocabulary row, and the batched pass over a row
// (for_each_batched: coalesced, ids met in ascending order per thread, U loads in flight per thread).
#pragma once

#include "common.cuh"

namespace {

constexpr int ST = 1024;                 // threads of the sampling and argmax blocks
constexpr int NW = ST / 32;

constexpr int U = 4;   // items each thread has in flight per round of a pass

// One pass over src[0, n): item g (a float4 group of ids 4g..4g+3 when VEC, else id g) belongs to
// thread g % ST, so the reads are coalesced and every thread meets its ids in ascending order. A
// thread first issues the loads of U items, then calls f(first_id, value, count) for each (count
// 4 or 1; with UNIFORM also 0 for the padding items past n, so f may use warp collectives). The
// explicit batching matters: f may store to global memory, which would otherwise stop the
// compiler from hoisting the next loads and serialise one memory round trip per item.
template <bool VEC, bool UNIFORM, class F>
__device__ __forceinline__ void for_each_batched(const float* src, int n, F f) {
    const int n_items = VEC ? n / 4 : n;
    const int n_rounds = (n_items + ST * U - 1) / (ST * U);
    for (int r = 0; r < n_rounds; ++r) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int g = (r * U + u) * ST + threadIdx.x;
            v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (g < n_items) {
                if (VEC) v[u] = *reinterpret_cast<const float4*>(src + 4 * g);
                else v[u].x = src[g];
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int g = (r * U + u) * ST + threadIdx.x;
            const int count = g < n_items ? (VEC ? 4 : 1) : 0;
            if (UNIFORM || count) f(VEC ? 4 * g : g, v[u], count);
        }
    }
}

__device__ __forceinline__ float comp(const float4& v, int e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; }

}  // namespace
