// bulk_copy.cuh -- one-instruction global -> shared copies (the Hopper bulk-copy engine, cp.async.bulk) completed
// on an mbarrier: a whole x row lands in shared memory after one memory round trip, issued by one thread, with
// no registers held and no cp.async group of its own (so waiting for it never waits for the weight copies that
// cp.async groups track).
//
// Use (one CTA, one copy phase a launch):
//   thread 0: bar_init(bar); then bar_expect(bar, total bytes of every copy of the phase) and the copies
//   (bulk_g2s: dst, src 16-byte aligned, bytes a multiple of 16); every thread: __syncthreads() after bar_init
//   before anyone waits, then bar_wait(bar) -- after it the copied bytes are visible to the waiting thread.
// Reads of memory an earlier kernel wrote: call after pdl_wait() and after fence_proxy_async() (the copy engine
// is the async proxy; the fence orders the generic-proxy view this thread has of global memory before it).
// Only sm_90 and later (FD_HAS_BULK); elsewhere these compile to nothing and launchers never enable them.
#pragma once

#include "common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(__HIP_PLATFORM_AMD__)
#define FD_BULK_DEVICE 1
#else
#define FD_BULK_DEVICE 0
#endif

namespace fd {
namespace {

#if FD_BULK_DEVICE
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

__device__ __forceinline__ void bar_init(uint64_t* bar) {
#if FD_BULK_DEVICE
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   // visible to the async proxy
#else
    (void)bar;
#endif
}

// Arrive (the barrier's one arrival) and expect `bytes` of transfers before the phase completes.
__device__ __forceinline__ void bar_expect(uint64_t* bar, uint32_t bytes) {
#if FD_BULK_DEVICE
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
#else
    (void)bar, (void)bytes;
#endif
}

__device__ __forceinline__ void fence_proxy_async() {
#if FD_BULK_DEVICE
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

// dst (shared) <- src (global), bytes % 16 == 0, both 16-byte aligned; completes on bar.
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if FD_BULK_DEVICE
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)bar;
#endif
}

// Wait for the barrier's first phase (parity 0) to complete.
__device__ __forceinline__ void bar_wait(uint64_t* bar) {
#if FD_BULK_DEVICE
    const uint32_t a = smem_addr(bar);
    uint32_t done = 0;
    while (!done) {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(a)
            : "memory");
    }
#else
    (void)bar;
#endif
}

}  // namespace
}  // namespace fd
