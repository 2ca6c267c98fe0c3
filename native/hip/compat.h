// compat.h -- compile flashd's CUDA sources with hipcc (ROCm) without copies of the kernels.
//
// Under nvcc it only includes the CUDA runtime and half/bfloat16 headers. Under hipcc (__HIP_PLATFORM_AMD__)
// it maps the CUDA runtime names the sources use onto HIP's, supplies what old ROCm lacks (the *_sync warp
// intrinsics, __syncwarp, __ldcg, hip_bf16.h), and sets FD_HAS_MMA to 0. The kernels assume 32-lane warps,
// so the HIP build is for wave32 targets only (RDNA, e.g. gfx1030; a wave64 target stops with an #error
// below). With FD_HAS_MMA 0 the NVIDIA-only paths compile out: tensor-core (mma.sync / ldmatrix) kernels
// fall back to their SIMT variants, cp.async to synchronous copies, thread-block clusters and
// programmatic dependent launch to plain launches, and the one kernel without a fallback (block-sparse
// attention) returns FD_E_UNSUPPORTED -- see the README's "AMD / HIP". Built by
// daemon/backends/cuda/build.py's build_hip_library (tests/native/test_native_hip.py): compile-checked only.
#pragma once

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>
#else
#include <hip/hip_bfloat16.h>          // ROCm < 6.0 (Debian's ROCm 5.2): no hip_bf16.h; the kernels use no bf16 type
#endif

// Warp size. Every kernel assumes 32-lane warps (lane = threadIdx.x % 32, 32-bit __ballot_sync
// masks, shuffle offsets up to 16, 32-thread row groups), so the HIP build targets wave32 GPUs
// only (RDNA: gfx10xx / gfx11xx, where hipcc compiles wave32 by default). A wave64 target
// (CDNA gfx9xx, or -mwavefrontsize64) stops here rather than compiling wrong reductions.
#if defined(__HIP_DEVICE_COMPILE__) && defined(__AMDGCN_WAVEFRONT_SIZE) && __AMDGCN_WAVEFRONT_SIZE != 32
#error "flashd's HIP build needs a wave32 target (e.g. --offload-arch=gfx1030); the kernels assume 32-lane warps"
#endif

// CUDA's *_sync warp intrinsics. HIP before ROCm 6.2 has only the unmasked forms (and 6.2+ only
// behind HIP_ENABLE_WARP_SYNC_BUILTINS). The sources pass only the full mask 0xffffffff with the
// whole warp converged, which is what the unmasked forms do on a wave32 target.
#if !defined(HIP_ENABLE_WARP_SYNC_BUILTINS)
#define __shfl_sync(mask, ...) __shfl(__VA_ARGS__)
#define __shfl_xor_sync(mask, ...) __shfl_xor(__VA_ARGS__)
#define __shfl_up_sync(mask, ...) __shfl_up(__VA_ARGS__)
#define __shfl_down_sync(mask, ...) __shfl_down(__VA_ARGS__)
#define __ballot_sync(mask, pred) ((unsigned)__ballot(pred))
#define __any_sync(mask, pred) __any(pred)
#define __all_sync(mask, pred) __all(pred)
#endif
#if HIP_VERSION_MAJOR < 6
// __syncwarp as ROCm 6 defines it: order the wave's shared-memory accesses around the barrier.
__device__ __forceinline__ void __syncwarp() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
#endif

#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorNotReady hipErrorNotReady
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString
#define cudaGetErrorName hipGetErrorName
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaSetDevice hipSetDevice
#define cudaGetDevice hipGetDevice
#define cudaDevAttrComputeCapabilityMajor hipDeviceAttributeComputeCapabilityMajor
#define cudaDevAttrComputeCapabilityMinor hipDeviceAttributeComputeCapabilityMinor
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaFuncAttributes hipFuncAttributes
#define cudaFuncGetAttributes hipFuncGetAttributes
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDevAttrMaxSharedMemoryPerBlockOptin hipDeviceAttributeSharedMemPerBlockOptin
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceProp hipDeviceProp_t
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaMemGetInfo hipMemGetInfo
#define cudaDevAttrMemoryClockRate hipDeviceAttributeMemoryClockRate
#define cudaDevAttrGlobalMemoryBusWidth hipDeviceAttributeMemoryBusWidth
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocMapped hipHostMallocMapped
#define cudaFreeHost hipHostFree
#define cudaMemcpy hipMemcpy
#define cudaMemset hipMemset
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaStream_t hipStream_t
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaEvent_t hipEvent_t
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventDefault hipEventDefault
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventQuery hipEventQuery
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaGraph_t hipGraph_t
#define cudaGraphExec_t hipGraphExec_t
#define cudaStreamBeginCapture hipStreamBeginCapture
#define cudaStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define cudaStreamCaptureMode hipStreamCaptureMode
#define cudaStreamCaptureModeRelaxed hipStreamCaptureModeRelaxed
#define cudaThreadExchangeStreamCaptureMode hipThreadExchangeStreamCaptureMode
#define cudaStreamEndCapture hipStreamEndCapture
#define cudaGraphInstantiate(exec, graph, flags) hipGraphInstantiate(exec, graph, nullptr, nullptr, 0)
#define cudaGraphLaunch hipGraphLaunch
#define cudaGraphExecDestroy hipGraphExecDestroy
#define cudaGraphDestroy hipGraphDestroy
#define cudaFuncSetAttribute fd_hip::func_set_attribute
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize

namespace fd_hip {
// hipFuncSetAttribute takes the kernel as const void* (CUDA's takes any kernel pointer).
template <class Kernel>
inline hipError_t func_set_attribute(Kernel* kernel, hipFuncAttribute attr, int value) {
    return hipFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// __ldcg (ld.global.cg: through L2, never a stale per-SM cache) -- the sources use it where a kernel
// reads what other blocks of the same launch wrote (the persistent forward). HIP has no __ldcg; an
// agent-scope relaxed atomic load is the coherent load on AMD (glc/dlc: bypasses the per-CU caches).
// Vector types are loaded word by word (same values, more instructions).
__device__ __forceinline__ unsigned ldcg_u32(const unsigned* p) {
    return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
template <class T>
__device__ __forceinline__ T ldcg(const T* p) {
    static_assert(sizeof(T) % 4 == 0, "__ldcg: 4-byte words only");
    union { T v; unsigned w[sizeof(T) / 4]; } u;
    const unsigned* src = reinterpret_cast<const unsigned*>(p);
#pragma unroll
    for (int i = 0; i < (int)(sizeof(T) / 4); ++i) u.w[i] = ldcg_u32(src + i);
    return u.v;
}
}  // namespace fd_hip
#define __ldcg(p) fd_hip::ldcg(p)

#define FD_HAS_MMA 0
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define FD_HAS_MMA 1
#endif
