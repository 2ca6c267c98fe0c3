// common.cuh -- shared device helpers for every flashd kernel file.
//
// Status convention (flashd.h): launchers return 0, a cudaError_t, or FD_E_* (< 0). FD_LAUNCH
// checks the launch itself; errors inside a kernel surface at the next synchronizing call.
#pragma once

#include "../hip/compat.h"   // runtime + fp16/bf16 headers; maps cuda* names to hip* under hipcc

#include <math.h>
#include <stdint.h>
#include <limits.h>
#include <stdlib.h>

#include "../include/flashd.h"

#define FD_CHECK_ARG(cond)        \
    do {                          \
        if (!(cond)) return FD_E_ARG; \
    } while (0)

#define FD_LAUNCH_STATUS() ((int)cudaGetLastError())

#define FD_WARP 32

namespace fd {

// fd_attention_shape_t as every attention entry point checks it (flashd_attention.h): FD_E_ARG unless true.
// The scale is checked by the entry points that read it.
inline bool kv_type_valid(int kv_type, int head_dim) {
    return kv_type == FD_KV_F16 || ((kv_type == FD_KV_Q8_0 || kv_type == FD_KV_Q4_0) && head_dim % 32 == 0);
}
// The window (flashd_attention.h): 0, or whole 64-key tiles beside a quantized side, its ring a whole number of
// tiles holding the block and at least one more tile of new rows.
inline bool window_valid(const fd_attention_shape_t* s) {
    if (s->window == 0) return true;
    return s->window > 0 && s->window % 64 == 0 && (s->k_type != FD_KV_F16 || s->v_type != FD_KV_F16) &&
           s->window_slots % 64 == 0 && s->window_slots >= s->window + 64;
}
// o_codes / o_scales: only the entry points that write them pass codes_ok (they check the rest themselves).
inline bool shape_valid(const fd_attention_shape_t* s, bool codes_ok = false) {
    return s != nullptr && s->n_heads > 0 && s->n_kv_heads > 0 && s->n_heads % s->n_kv_heads == 0 && s->head_dim > 0 &&
           s->max_ctx > 0 && s->max_keys >= 0 && kv_type_valid(s->k_type, s->head_dim) && kv_type_valid(s->v_type, s->head_dim) &&
           window_valid(s) && (codes_ok || (s->o_codes == nullptr && s->o_scales == nullptr));
}
// Whether K and V are float16: every entry point that reads the cache needs it (FD_E_SHAPE otherwise) until
// its kernel reads quantized rows (flashd_attention.h; fd_rope_kv_write writes every type).
inline bool kv_f16(const fd_attention_shape_t* s) { return s->k_type == FD_KV_F16 && s->v_type == FD_KV_F16; }

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

// ---- programmatic dependent launch (sm_90) ----------------------------------------------------------------
// A kernel launched with launch_pdl may become resident while the previous kernel of the stream
// drains. pdl_wait() blocks until that kernel has completed and its writes are visible: call it
// before the first read of anything an earlier kernel wrote (reads of weights may come before it).
// pdl_launch_dependents() lets the next PDL-launched kernel start early (its blocks then wait in
// their own pdl_wait). Both are no-ops without PDL and on older GPUs and HIP.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The launch tuning in effect on the current device (tuning.cu, flashd_tuning.h), and its SM count.
fd_tuning_t tuning_now();
int device_sm_count();

#if FD_HAS_MMA
// The one place a cudaLaunchConfig_t is built (launch_pdl, launch_cluster): kernel<<<grid, block, smem, stream>>>
// with a cluster-dimension attribute when cluster is non-null and then the PDL attribute when pdl is true, in that
// order. Returns cudaLaunchKernelEx's status only (no cudaGetLastError): each caller adds what it checked before.
template <class... KArgs, class... Args>
cudaError_t launch_ex(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      const dim3* cluster, bool pdl, Args... args) {
    cudaLaunchAttribute attr[2];
    unsigned n_attrs = 0;
    if (cluster != nullptr) {
        attr[n_attrs].id = cudaLaunchAttributeClusterDimension;
        attr[n_attrs].val.clusterDim.x = cluster->x;
        attr[n_attrs].val.clusterDim.y = cluster->y;
        attr[n_attrs].val.clusterDim.z = cluster->z;
        ++n_attrs;
    }
    if (pdl) {
        attr[n_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n_attrs].val.programmaticStreamSerializationAllowed = 1;
        ++n_attrs;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = n_attrs;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}
#endif

// Launches kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute where the device
// supports it (compute capability >= 9; the kernel must call pdl_wait() as described above) and the
// tuning has it on (fd_tuning_t.pdl: A/B benchmarks), else plainly. Returns the launch status.
inline bool pdl_enabled() { return tuning_now().pdl != 0; }

template <class... KArgs, class... Args>
int launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args... args) {
#if FD_HAS_MMA
    int device = 0, major = 0;
    if (pdl_enabled() && cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9)
        return (int)launch_ex(kernel, grid, block, smem, stream, nullptr, true, args...);
#endif
    kernel<<<grid, block, smem, stream>>>(args...);
    return FD_LAUNCH_STATUS();
}

#if FD_HAS_MMA
// Launches kernel over thread-block clusters of cluster.x * cluster.y * cluster.z blocks (grid counts blocks, a
// multiple of the cluster in each dimension), with the PDL attribute as well when pdl is true (the kernel then
// calls pdl_wait() as for launch_pdl; the caller decides, e.g. from pdl_enabled()). Clusters are sm_90 only and not
// under HIP, hence no fallback here: the caller has checked the device (and, where a build may target older GPUs,
// the kernel's binaryVersion) and launches its non-cluster form otherwise. Returns cudaLaunchKernelEx's status.
template <class... KArgs, class... Args>
cudaError_t launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                           dim3 cluster, bool pdl, Args... args) {
    return launch_ex(kernel, grid, block, smem, stream, &cluster, pdl, args...);
}
#endif

}  // namespace fd
