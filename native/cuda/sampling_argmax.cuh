// sampling_argmax.cuh -- fd_argmax's kernels (sampling.cu launches them through launch_argmax).
//
// fd_argmax: out[r] = argmax of logits row r (n_rows, n_vocab); the lowest id wins ties, NaN never
// wins, a row of NaNs gives -1. One block of 1024 threads per row, float4 loads; on sm_90 rows of
// >= 16384 logits take a cluster of 8 blocks (argmax_cluster_kernel).
#pragma once

#include "sampling_common.cuh"

#include <limits.h>

#if FD_HAS_MMA
#include <cooperative_groups.h>
#endif

namespace {

// ---- argmax ------------------------------------------------------------------------------
__device__ __forceinline__ void argmax_take(float& best, int& best_id, float v, int id) {
    if (v > best || (v == best && id < best_id)) { best = v; best_id = id; }
}

// Block-level argmax of the slice [lo, hi) of a row into (best, best_id) of thread 0.
template <bool VEC>
__device__ __forceinline__ void argmax_slice(const float* row, int lo, int hi, float& best, int& best_id) {
    __shared__ float s_val[NW];
    __shared__ int s_id[NW];
    best = -INFINITY;
    best_id = INT_MAX;                           // NaN never compares: an all-NaN slice keeps this
    for_each_batched<VEC, false>(row + lo, hi - lo, [&](int i, float4 v, int count) {
        for (int e = 0; e < count; ++e) argmax_take(best, best_id, comp(v, e), lo + i + e);
    });
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
        argmax_take(best, best_id, ov, oi);
    }
    if ((threadIdx.x & 31) == 0) { s_val[threadIdx.x >> 5] = best; s_id[threadIdx.x >> 5] = best_id; }
    __syncthreads();
    if (threadIdx.x < 32) {
        best = s_val[threadIdx.x];
        best_id = s_id[threadIdx.x];
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
            argmax_take(best, best_id, ov, oi);
        }
    }
}

template <bool VEC>
__global__ void __launch_bounds__(ST) argmax_kernel(int32_t* out, const float* __restrict__ logits, int n_vocab) {
    float best;
    int best_id;
    argmax_slice<VEC>(logits + (size_t)blockIdx.x * n_vocab, 0, n_vocab, best, best_id);
    if (threadIdx.x == 0) out[blockIdx.x] = best_id == INT_MAX ? -1 : best_id;
}

// Long rows on sm_90: a cluster of ARGMAX_CLUSTER blocks per row (one row's logits are read by 8 SMs
// instead of 1: the single-block kernel takes ~14 us for Qwen's 151936 logits, bound by one SM's
// loads). Block r of a cluster reduces the r-th slice (a multiple of 4 elements); block 0 merges
// the slices' winners through distributed shared memory.
constexpr int ARGMAX_CLUSTER = 8;
constexpr int ARGMAX_CLUSTER_MIN_VOCAB = 16384;

template <bool VEC>
__global__ void __launch_bounds__(ST) argmax_cluster_kernel(int32_t* out, const float* __restrict__ logits,
                                                            int n_vocab) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    __shared__ float c_val;
    __shared__ int c_id;
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int r = blockIdx.x / ARGMAX_CLUSTER;
    const int per = ((n_vocab + ARGMAX_CLUSTER - 1) / ARGMAX_CLUSTER + 3) & ~3;
    const int lo = min(n_vocab, rank * per), hi = min(n_vocab, lo + per);
    float best;
    int best_id;
    argmax_slice<VEC>(logits + (size_t)r * n_vocab, lo, hi, best, best_id);
    if (threadIdx.x == 0) { c_val = best; c_id = best_id; }
    cluster.sync();                              // every slice's winner is in its block's shared memory
    if (rank == 0 && threadIdx.x < 32) {
        best = -INFINITY;
        best_id = INT_MAX;
        if (threadIdx.x < ARGMAX_CLUSTER) {
            best = *cluster.map_shared_rank(&c_val, threadIdx.x);
            best_id = *cluster.map_shared_rank(&c_id, threadIdx.x);
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
            argmax_take(best, best_id, ov, oi);
        }
        if (threadIdx.x == 0) out[r] = best_id == INT_MAX ? -1 : best_id;
    }
    cluster.sync();                              // no block exits while block 0 may still read it
#endif
}

template <bool VEC>
int launch_argmax(int32_t* out, const float* logits, int n_rows, int n_vocab, cudaStream_t s) {
#if FD_HAS_MMA
    int device = 0, major = 0;
    if (n_vocab >= ARGMAX_CLUSTER_MIN_VOCAB && cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9) {
        return (int)fd::launch_cluster(argmax_cluster_kernel<VEC>, dim3(n_rows * ARGMAX_CLUSTER), dim3(ST), 0, s,
                                       dim3(ARGMAX_CLUSTER), false, out, logits, n_vocab);
    }
#endif
    argmax_kernel<VEC><<<n_rows, ST, 0, s>>>(out, logits, n_vocab);
    return FD_LAUNCH_STATUS();
}

}  // namespace
