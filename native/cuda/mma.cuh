// mma.cuh -- warp-level tensor-core helpers shared by gemm.cu and the flash attention tile loop
// (attention_tile.cuh): mma.sync m16n8k16 (f16 inputs, f32 accumulate), ldmatrix, cp.async and a
// host-side query of what the current device can run.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), lane = 4 * g + t
// (g = lane / 4 "group", t = lane % 4 "thread in group"); each .b32 register holds two f16,
// the lower-indexed element in the low 16 bits:
//   A 16x16 (row-major):  a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]
//                         a[2] = A[g][2t+8..2t+9]  a[3] = A[g+8][2t+8..2t+9]
//   B 16x8  (k x n, "col": stored as B^T[n][k]):  b[0] = B[2t..2t+1][g]   b[1] = B[2t+8..2t+9][g]
//   C 16x8  (f32):        c[0..1] = C[g][2t..2t+1]  c[2..3] = C[g+8][2t..2t+1]
// ldmatrix.x4 loads four 8x8 b16 matrices: lanes 8j..8j+7 give the row addresses of matrix j and
// register j of lane l receives row l/4, elements 2(l%4)..2(l%4)+1 of matrix j (.trans: column
// l/4, rows 2(l%4)..2(l%4)+1). tests/emulation/test_gemm_tiling.py and tests/emulation/test_flash_tiling.py emulate
// these layouts together with the address formulas the kernels use.
//
// Everything device-side here needs sm_80 (cp.async, m16n8k16); kernels built from these
// helpers compile to a trap on older targets and the launchers route such devices to the SIMT
// kernels (device_has_mma()).
#pragma once

#include "common.cuh"

#if FD_HAS_MMA

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define FD_MMA_DEVICE_OK 0
#else
#define FD_MMA_DEVICE_OK 1
#endif

namespace fd {
namespace mma {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 16-byte async copy global -> shared; when !pred the 16 destination bytes are zero-filled and
// nothing is read (src must still be a valid address: callers pass the tensor's base).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
#if FD_MMA_DEVICE_OK
    const int n_src = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n_src));
#endif
}

// 4-, 8- or 16-byte async copy (cp.async.ca: .cg takes 16 bytes only); dst and src aligned to BYTES;
// when !pred the BYTES destination bytes are zero-filled and nothing is read.
template <int BYTES>
__device__ __forceinline__ void cp_async_ca(uint32_t dst, const void* src, bool pred) {
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async sizes");
#if FD_MMA_DEVICE_OK
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(BYTES),
                 "r"(pred ? BYTES : 0));
#endif
}

// cp.async has two more sets of wrappers, quant_stage.cuh's (the GEMV's weight staging) and
// attention_splitk_warp.cuh's, kept apart on purpose: they differ where cp.async is missing (here: nothing,
// below sm_80 these kernels trap; quant_stage.cuh: a byte-exact copy of a partial chunk, its HIP path;
// split-K attention: a plain 16-byte copy or zeros, its HIP path) and in what they take (a shared address
// or a pointer, a predicate or a byte count); one set would change what some kernel compiles to.
__device__ __forceinline__ void cp_async_commit() {
#if FD_MMA_DEVICE_OK
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most n_pending of this thread's committed groups are still in flight.
template <int n_pending>
__device__ __forceinline__ void cp_async_wait() {
#if FD_MMA_DEVICE_OK
    asm volatile("cp.async.wait_group %0;\n" ::"n"(n_pending));
#endif
}

// ldmatrix_x4 and ldmatrix_x4_trans differ only in the .trans qualifier, which inline PTX must
// spell in the instruction string: two wrappers on purpose.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#if FD_MMA_DEVICE_OK
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
#if FD_MMA_DEVICE_OK
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

// d += A (16x16 f16) * B (16x8 f16), f32 accumulate
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if FD_MMA_DEVICE_OK
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two floats rounded to f16 (round to nearest even) in one register, lo in the low half.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

}  // namespace mma

// Host side: what the current device offers. Cheap attribute reads (no synchronization), so a
// launcher may call it on every launch, also during graph capture.
struct MmaDevice {
    int n_sms;
    bool has_mma;        // compute capability >= 8.0: mma.sync m16n8k16, ldmatrix, cp.async
    bool has_cluster;    // compute capability >= 9.0: thread-block clusters, distributed shared memory
    int smem_optin;      // bytes of dynamic shared memory one block may opt into (sm_90 227 KB, sm_80 163 KB,
                         // sm_86 / sm_89 99 KB)
};

inline cudaError_t query_mma_device(MmaDevice* out) {
    int device = 0, major = 0, n_sms = 0, smem_optin = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    out->smem_optin = smem_optin;
    out->n_sms = n_sms > 0 ? n_sms : 1;
    out->has_mma = major >= 8;
    out->has_cluster = major >= 9;
    return err;
}

}  // namespace fd

#endif  // FD_HAS_MMA

namespace fd {
// True when p is aligned to n_bytes (the vector loads and cp.async of the mma paths need 16).
__host__ __device__ inline bool is_aligned(const void* p, size_t n_bytes) {
    return ((uintptr_t)p % n_bytes) == 0;
}
}  // namespace fd
