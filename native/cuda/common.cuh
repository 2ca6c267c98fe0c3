// common.cuh -- shared device helpers for every flashd kernel file.
//
// Status convention (flashd.h): launchers return 0, a cudaError_t, or FD_E_* (< 0). FD_LAUNCH
// checks the launch itself; errors inside a kernel surface at the next synchronizing call.
#pragma once

#include "../hip/compat.h"   // runtime + fp16/bf16 headers; maps cuda* names to hip* under hipcc

#include <math.h>
#include <stdint.h>

#include "../include/flashd.h"

#define FD_CHECK_ARG(cond)        \
    do {                          \
        if (!(cond)) return FD_E_ARG; \
    } while (0)

#define FD_LAUNCH_STATUS() ((int)cudaGetLastError())

#define FD_WARP 32

namespace fd {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = FD_WARP / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = FD_WARP / 2; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Sum over the whole block; every thread gets the result. scratch: >= 32 floats of shared memory.
// Must be called by all threads of the block.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % FD_WARP, warp = threadIdx.x / FD_WARP;
    const int n_warps = (blockDim.x + FD_WARP - 1) / FD_WARP;
    v = warp_sum(v);
    __syncthreads();                       // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % FD_WARP, warp = threadIdx.x / FD_WARP;
    const int n_warps = (blockDim.x + FD_WARP - 1) / FD_WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : -INFINITY;
    return warp_max(v);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace fd
