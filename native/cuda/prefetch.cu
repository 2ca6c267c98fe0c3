// prefetch.cu -- fd_prefetch_l2 (flashd_linear.h): ask the GPU's L2 for a range of bytes (weights a later launch
// reads), as a concurrent branch of a captured forward (daemon/backends/cuda/ops.py CudaOps.prefetch, the tuning's
// l2_prefetch_mlp).
//
// Why a branch: a decode layer's q/k/v projection, attention and o projection are short, latency-bound launches
// (~13 us for ~3 MB on the 1.5B) during which DRAM mostly idles, and the SwiGLU launch right after them then streams
// 15.5 MB at about half the copy rate. Weights never depend on activations, so they can be on chip before the launch
// that reads them starts. A kernel that asks for bytes completes only once they have arrived (bench/NOTES.md session
// 25: in the chain each launch grew by its own prefetch), so the asking kernel runs on its own stream, forked from the
// captured stream after the q/k/v launch and joined at the forward's end: the chain never waits for it.
//
// Work: piece q = bytes [16 KB q, 16 KB (q + 1)) of the range, clipped to it and rounded inward to 16-byte bounds (the
// bulk prefetch's alignment), one cp.async.bulk.prefetch.L2 each (sm_90), spread over the lanes of 32-thread blocks;
// before sm_90 one prefetch.global.L2 a 128-byte line. 16 KB pieces served fastest in the lab (64 KB pieces took
// twice as long to complete; bench/lab/l2_prefetch_lab.cu).
#include "common.cuh"

namespace fd {
namespace {

constexpr unsigned PREFETCH_PIECE = 16384;   // bytes a bulk prefetch
constexpr int PREFETCH_THREADS = 32;         // one warp a block: the kernel only issues requests
constexpr int PREFETCH_MAX_BLOCKS = 64;      // ~8 pieces a lane for the 1.5B's gate + up (15.5 MB)

__global__ void __launch_bounds__(PREFETCH_THREADS) prefetch_l2_kernel(const uint8_t* base, unsigned long long lo,
                                                                       unsigned long long hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned long long n = (hi - lo + PREFETCH_PIECE - 1) / PREFETCH_PIECE;
    for (unsigned long long q = (unsigned long long)blockIdx.x * PREFETCH_THREADS + threadIdx.x; q < n;
         q += (unsigned long long)gridDim.x * PREFETCH_THREADS) {
        const unsigned long long s = lo + q * PREFETCH_PIECE;
        const unsigned long long e = s + PREFETCH_PIECE < hi ? s + PREFETCH_PIECE : hi;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + s), "r"((unsigned)(e - s)) : "memory");
    }
#elif defined(__CUDA_ARCH__)
    for (unsigned long long o = lo + ((unsigned long long)blockIdx.x * PREFETCH_THREADS + threadIdx.x) * 128; o < hi;
         o += (unsigned long long)gridDim.x * PREFETCH_THREADS * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(base + o));
#else
    (void)base, (void)lo, (void)hi;
#endif
}

}  // namespace
}  // namespace fd

extern "C" {

int fd_prefetch_l2(const void* ptr, size_t n_bytes, void* stream) {
    FD_CHECK_ARG(ptr != nullptr || n_bytes == 0);
#if !FD_HAS_MMA
    (void)stream;
    return FD_E_UNSUPPORTED;   // HIP: no bulk prefetch (and no decode graph that forks a branch for one)
#else
    // [lo, hi): the range's 16-byte-aligned inside, as offsets from the aligned-down base
    const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
    const uintptr_t first = (a + 15) & ~(uintptr_t)15, last = (a + n_bytes) & ~(uintptr_t)15;
    if (n_bytes == 0 || last <= first) return 0;
    const unsigned long long span = last - first;
    const unsigned long long pieces = (span + fd::PREFETCH_PIECE - 1) / fd::PREFETCH_PIECE;
    const unsigned long long want = (pieces + fd::PREFETCH_THREADS - 1) / fd::PREFETCH_THREADS;
    const int blocks = (int)(want < (unsigned long long)fd::PREFETCH_MAX_BLOCKS ? want : fd::PREFETCH_MAX_BLOCKS);
    fd::prefetch_l2_kernel<<<blocks, fd::PREFETCH_THREADS, 0, (cudaStream_t)stream>>>(
        reinterpret_cast<const uint8_t*>(first), 0ull, span);
    return FD_LAUNCH_STATUS();
#endif
}

}  // extern "C"
