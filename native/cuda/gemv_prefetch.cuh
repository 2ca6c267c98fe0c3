// gemv_prefetch.cuh -- the decode GEMVs' L2 prefetch of the next projection's weights (fd_gemv_prefetch_set,
// flashd_linear.h; fd_tuning_t.weights_prefetch_next).
//
// Why: a decode step is a chain of ~170 dependent launches, and DRAM is busy only while a launch streams its own
// weights; between the streams (a launch's prologue, its compute tail and epilogue, the attention kernels, the
// next launch's start) it idles. A launch whose first matrix has a plan entry asks the L2 for the next
// projection's weights right after the previous kernel has finished (its own first weights already in flight),
// so those bytes arrive while this launch computes and the launches between finish; the next launch then reads
// them from L2. A hint only: the data read is the same whether or not the lines arrived in time.
//
// Host side: the plan is a table from a matrix pointer (a launch's first matrix: q of a QKV launch, gate of a
// SwiGLU launch) to up to MAX_PREFETCH device ranges, set by the model's loader and cleared when it unloads.
// Device side: l2_prefetch spreads each range over every thread of the grid: mode 1 one prefetch.global.L2 per
// 128-byte line, mode 2 one bulk prefetch (cp.async.bulk.prefetch.L2, sm_90) per PREFETCH_PIECE bytes; elsewhere
// (HIP) a no-op.
#pragma once

#include "common.cuh"

namespace fd {

constexpr int MAX_PREFETCH = 4;
constexpr uint32_t PREFETCH_PIECE = 16384;   // bytes per prefetch instruction

struct PrefetchRanges {
    const uint8_t* ptr[MAX_PREFETCH];
    uint64_t bytes[MAX_PREFETCH];
    int n;
};

// The plan's entry for `key` (false: none; *out then has n = 0).
bool gemv_prefetch_lookup(const void* key, PrefetchRanges* out);

// Every thread of the grid calls it once; ranges are trimmed inward to 16-byte boundaries (the instruction's
// alignment), so no byte outside a range is touched.
__device__ __forceinline__ void l2_prefetch(const PrefetchRanges& r, int mode) {
#if defined(__CUDA_ARCH__) && !defined(__HIP_PLATFORM_AMD__)
    const uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, n_threads = (uint64_t)gridDim.x * blockDim.x;
    for (int k = 0; k < r.n; ++k) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(r.ptr[k]);
        const uintptr_t begin = (a + 15) & ~uintptr_t(15), end = (a + r.bytes[k]) & ~uintptr_t(15);
        if (end <= begin) continue;
        if (mode == 1) {          // a line each: the address's 128-byte line (inside the range: begin + i * 128)
            const uint64_t n_lines = (end - begin + 127) / 128;
            for (uint64_t i = t; i < n_lines; i += n_threads)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(begin + i * 128) : "memory");
            continue;
        }
#if __CUDA_ARCH__ >= 900
        const uint64_t n_pieces = (end - begin + PREFETCH_PIECE - 1) / PREFETCH_PIECE;
        for (uint64_t i = t; i < n_pieces; i += n_threads) {
            const uintptr_t p = begin + i * PREFETCH_PIECE;
            const uint32_t n = (uint32_t)(end - p < PREFETCH_PIECE ? end - p : PREFETCH_PIECE);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
        }
#endif
    }
#else
    (void)r;
    (void)mode;
#endif
}

}  // namespace fd
