// topk.cu -- fd_topk_logprobs: per-row top-K with log-probabilities (flashd_sampling.h), the DFlash
// drafter's per-depth candidates (daemon/speculative/dflash_topk.py is the definition):
//
//     x = (double)logits[r, :] / temperature
//     lp = x - max(x) - log(sum(exp(x - max(x))))          in double, as daemon.sampling.log_softmax
//     ids[r, 0..k) = the k best ids under (logit desc, id asc), logprobs[r, j] = lp[ids[r, j]]
//
// Dividing float32 logits by a positive double keeps their order (distinct floats stay distinct in
// double), so ranking the float32 logits ranks lp. One block of 1024 threads per row; round 0 finds
// the row's best entry (the maximum), one pass sums exp(x - max) in double, and round j finds the
// best entry strictly after round j-1's pick in that order -- k + 1 coalesced passes over the row
// (~600 KB for Qwen's 151936 logits, L2-resident after the first), no workspace, no sort.
// NaN logits are never picked; a row with fewer than k non-NaN entries pads ids with -1 and
// logprobs with -inf. The sum's order differs from numpy's pairwise sum, so logprobs agree with the
// host definition to ~1e-15 relative, not bit for bit; the ids agree exactly.
#include "common.cuh"

#include <limits.h>

namespace {

constexpr int TK_THREADS = 1024;
constexpr int TK_WARPS = TK_THREADS / FD_WARP;

// (v, i) comes before (bv, bi): larger value first, the lower id among equal values
__device__ __forceinline__ bool tk_before(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// Block-wide best (value, id) pair; every thread returns with the winner.
__device__ void tk_block_best(float& v, int& i, float* s_v, int* s_i) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (tk_before(ov, oi, v, i)) { v = ov; i = oi; }
    }
    if ((threadIdx.x & 31) == 0) { s_v[threadIdx.x >> 5] = v; s_i[threadIdx.x >> 5] = i; }
    __syncthreads();
    if (threadIdx.x < 32) {
        v = s_v[threadIdx.x];
        i = s_i[threadIdx.x];
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, o);
            const int oi = __shfl_xor_sync(0xffffffffu, i, o);
            if (tk_before(ov, oi, v, i)) { v = ov; i = oi; }
        }
        if (threadIdx.x == 0) { s_v[0] = v; s_i[0] = i; }
    }
    __syncthreads();
    v = s_v[0];
    i = s_i[0];
    __syncthreads();                             // s_v / s_i are reused by the next reduction
}

__device__ double tk_block_sum(double v, double* s_d) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) s_d[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = s_d[threadIdx.x];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) s_d[0] = v;
    }
    __syncthreads();
    v = s_d[0];
    __syncthreads();
    return v;
}

__global__ void __launch_bounds__(TK_THREADS) topk_logprobs_kernel(int32_t* ids, double* logprobs,
                                                                   const float* __restrict__ logits, int n_vocab,
                                                                   int k, double temperature) {
    __shared__ float s_v[TK_WARPS];
    __shared__ int s_i[TK_WARPS];
    __shared__ double s_d[TK_WARPS];
    const float* row = logits + (size_t)blockIdx.x * n_vocab;
    float prev_v = INFINITY;                     // round 0 takes every entry "after" (+inf, -1)
    int prev_i = -1;
    double m = 0.0, log_z = 0.0;
    for (int r = 0; r < k; ++r) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (int j = threadIdx.x; j < n_vocab; j += TK_THREADS) {
            const float v = row[j];
            const bool after = v < prev_v || (v == prev_v && j > prev_i);   // NaN: never after
            if (after && tk_before(v, j, bv, bi)) { bv = v; bi = j; }
        }
        tk_block_best(bv, bi, s_v, s_i);
        if (r == 0) {                            // the normaliser, from the row's maximum
            m = (double)bv / temperature;
            double acc = 0.0;
            for (int j = threadIdx.x; j < n_vocab; j += TK_THREADS) {
                const float v = row[j];
                if (v == v) acc += exp((double)v / temperature - m);
            }
            log_z = log(tk_block_sum(acc, s_d));
        }
        if (threadIdx.x == 0) {
            const size_t o = (size_t)blockIdx.x * k + r;
            const bool found = bi != INT_MAX;
            ids[o] = found ? bi : -1;
            logprobs[o] = found ? (double)bv / temperature - m - log_z : -INFINITY;
        }
        prev_v = bv;
        prev_i = bi;
    }
}

}  // namespace

extern "C" {

int fd_topk_logprobs(int32_t* ids, double* logprobs, const float* logits, int n_rows, int n_vocab, int k,
                     double temperature, void* stream) {
    FD_CHECK_ARG(ids && logprobs && logits && n_rows >= 0 && n_vocab > 0);
    FD_CHECK_ARG(k > 0 && k <= n_vocab && temperature > 0.0 && isfinite(temperature));
    if (n_rows == 0) return 0;
    topk_logprobs_kernel<<<n_rows, TK_THREADS, 0, (cudaStream_t)stream>>>(ids, logprobs, logits, n_vocab, k,
                                                                          temperature);
    return FD_LAUNCH_STATUS();
}

}  // extern "C"
