// quant_stage.cuh -- weight bytes from global to shared memory (step 1 of quant.cuh's "How a row is read"):
// 16-byte cp.async (a plain copy under HIP) and warp_stage, which copies any byte range -- also the
// 2-byte-aligned block formats -- with aligned, coalesced 16-byte loads, keeping the global alignment
// modulo 16 in shared memory; stage_range_bytes sizes a buffer for it.
#pragma once

#include "common.cuh"

namespace fd {
namespace q {

// ---- staging: global -> shared with 16-byte cp.async ---------------------------------------------------
// (mma.cuh and attention_splitk_warp.cuh have their own cp.async wrappers, on purpose: mma.cuh says why.)
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src, int src_bytes) {
#if FD_HAS_MMA
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes));
#else
    uint4 v = make_uint4(0, 0, 0, 0);
    if (src_bytes == 16) v = *reinterpret_cast<const uint4*>(gmem_src);
    else for (int i = 0; i < src_bytes; ++i) reinterpret_cast<uint8_t*>(&v)[i] = reinterpret_cast<const uint8_t*>(gmem_src)[i];
    *reinterpret_cast<uint4*>(smem_dst) = v;
#endif
}
// The same copy with an L2 evict-first hint (policy from l2_evict_first_policy): for streamed weights, read once
// a step, so they leave the rest of L2 (activations, KV rows, code) in place. HIP: the plain copy.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
    uint64_t pol = 0;
#if FD_HAS_MMA
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
#endif
    return pol;
}
__device__ __forceinline__ void cp_async16_hint(void* smem_dst, const void* gmem_src, int src_bytes, uint64_t pol) {
#if FD_HAS_MMA
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(gmem_src),
                 "r"(src_bytes), "l"(pol));
#else
    (void)pol;
    cp_async16(smem_dst, gmem_src, src_bytes);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if FD_HAS_MMA
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if FD_HAS_MMA
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// The warp copies bytes [src, src + n_bytes) to dst (16-aligned shared), byte b landing at
// dst + (src & 15) + b; returns that first byte's shared address. The first chunk starts at src
// rounded down to 16 (bytes of the same 16-byte granule, inside the allocation); the last is
// zero-filled past src + n_bytes. Needs (src & 15) + n_bytes + 16 bytes of room at dst.
// evict_first (uniform): the copies carry the L2 evict-first hint (weights; fd_tuning_t.weights_evict_first).
__device__ __forceinline__ const uint8_t* warp_stage(uint8_t* dst, const uint8_t* src, int64_t n_bytes, int lane,
                                                     bool evict_first = false) {
    const uintptr_t s = reinterpret_cast<uintptr_t>(src);
    const int head = (int)(s & 15);
    const uint8_t* a0 = src - head;
    const int64_t total = head + n_bytes;
    const int n_chunks = (int)((total + 15) >> 4);
    if (evict_first) {
        const uint64_t pol = l2_evict_first_policy();
        for (int ch = lane; ch < n_chunks; ch += 32) {
            const int64_t left = total - 16 * (int64_t)ch;
            cp_async16_hint(dst + 16 * ch, a0 + 16 * (int64_t)ch, left >= 16 ? 16 : (int)left, pol);
        }
        return dst + head;
    }
    for (int ch = lane; ch < n_chunks; ch += 32) {
        const int64_t left = total - 16 * (int64_t)ch;
        cp_async16(dst + 16 * ch, a0 + 16 * (int64_t)ch, left >= 16 ? 16 : (int)left);
    }
    return dst + head;
}

// bytes of a stage range holding n_bytes staged from any alignment, plus the funnel-read slack
__host__ __device__ constexpr int64_t stage_range_bytes(int64_t n_bytes) { return ((15 + n_bytes + 15) & ~int64_t(15)) + 16; }

}  // namespace q
}  // namespace fd
