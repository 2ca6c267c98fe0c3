// topk.cu -- fd_topk_logprobs: per-row top-K with log-probabilities (flashd_sampling.h), the DFlash
// drafter's per-depth candidates (daemon/speculative/dflash_topk.py is the definition):
//
//     x = (double)logits[r, :] / temperature
//     lp = x - max(x) - log(sum(exp(x - max(x))))          in double, as daemon.sampling.log_softmax
//     ids[r, 0..k) = the k best ids under (logit desc, id asc), logprobs[r, j] = lp[ids[r, j]]
//
// Dividing float32 logits by a positive double keeps their order (distinct floats stay distinct in
// double), so ranking the float32 logits ranks lp. NaN logits are never picked; a row with fewer than k
// non-NaN entries pads ids with -1 and logprobs with -inf. The sums' order differs from numpy's pairwise
// sum, so logprobs agree with the host definition to ~1e-15 relative, not bit for bit; the ids agree
// exactly.
//
// Two kernels (k <= TK_FAST_MAX_K, the drafter's case): a row is cut into chunks of TK_CHUNK logits, one
// CTA each (15 rows x 75 chunks for a 15-deep draft over Qwen's 151936 logits: 1,125 CTAs, every SM busy);
// a chunk CTA holds its logits in registers and writes its maximum mc, sum_c = sum(exp(x - mc)) and its own
// top-k (every entry of the row's top-k is in its chunk's top-k: fewer than k entries beat it anywhere);
// then one CTA per row merges: M = max mc, Z = sum_c sum_c * exp(mc - M), the row's top-k among the chunks'
// candidates. The single-kernel path (one 1024-thread CTA per row, k + 1 passes over the row) stays for
// larger k and for calls whose chunk records would not fit the scratch: on the drafter's shape it took
// ~220 us against the draft step's ~4.7 ms (H100, bench/results/2026-11-28-h100-session28-dflash-step.md).
#include "common.cuh"
#include "gemv_scratch.cuh"

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

// -- the two-kernel path --------------------------------------------------------------------------------------

constexpr int TK_CHUNK_THREADS = 256;
constexpr int TK_PER_THREAD = 8;
constexpr int TK_CHUNK = TK_CHUNK_THREADS * TK_PER_THREAD;     // logits a chunk CTA holds in registers
constexpr int TK_FAST_MAX_K = 32;
constexpr size_t TK_SCRATCH_BYTES = 4u << 20;                  // the chunk records of a call (~300 KB for the
                                                               // drafter's 15 x 75 chunks at k = 32)

// One chunk's record: [mc (double), sum_c (double)] then k (value float, id int) candidates, best first.
__host__ __device__ constexpr size_t tk_record_bytes(int k) { return 16 + 8 * (size_t)k; }

// Best (value, id) over a CTA of NT threads (NT / 32 groups of 32 lanes); every thread returns with it.
template <int NT>
__device__ void tk_cta_best(float& v, int& i, float* s_v, int* s_i) {
    constexpr int NG = NT / 32;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (tk_before(ov, oi, v, i)) { v = ov; i = oi; }
    }
    if ((threadIdx.x & 31) == 0) { s_v[threadIdx.x >> 5] = v; s_i[threadIdx.x >> 5] = i; }
    __syncthreads();
    v = s_v[0];
    i = s_i[0];
    for (int g = 1; g < NG; ++g)
        if (tk_before(s_v[g], s_i[g], v, i)) { v = s_v[g]; i = s_i[g]; }
    __syncthreads();                             // s_v / s_i are reused by the next reduction
}

template <int NT>
__device__ double tk_cta_sum(double v, double* s_d) {
    constexpr int NG = NT / 32;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) s_d[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0.0;
    for (int g = 0; g < NG; ++g) t += s_d[g];    // the same order in every thread
    __syncthreads();
    return t;
}

// grid (n_chunks, n_rows): chunk blockIdx.x of row blockIdx.y -> its record in ws.
__global__ void __launch_bounds__(TK_CHUNK_THREADS) topk_chunk_kernel(uint8_t* ws, const float* __restrict__ logits,
                                                                      int n_vocab, int k, double temperature) {
    __shared__ float s_v[TK_CHUNK_THREADS / 32];
    __shared__ int s_i[TK_CHUNK_THREADS / 32];
    __shared__ double s_d[TK_CHUNK_THREADS / 32];
    const float* row = logits + (size_t)blockIdx.y * n_vocab;
    const int base = blockIdx.x * TK_CHUNK;
    float x[TK_PER_THREAD];                      // entry base + threadIdx.x + j * threads (coalesced loads)
#pragma unroll
    for (int j = 0; j < TK_PER_THREAD; ++j) {
        const int idx = base + threadIdx.x + j * TK_CHUNK_THREADS;
        x[j] = idx < n_vocab ? row[idx] : NAN;   // past the row: never picked, never summed
    }
    uint8_t* rec = ws + ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * tk_record_bytes(k);
    float* cand_v = reinterpret_cast<float*>(rec + 16);
    int* cand_i = reinterpret_cast<int*>(cand_v + k);
    float prev_v = INFINITY;
    int prev_i = -1;
    for (int r = 0; r < k; ++r) {
        float bv = -INFINITY;
        int bi = INT_MAX;
#pragma unroll
        for (int j = 0; j < TK_PER_THREAD; ++j) {
            const int idx = base + threadIdx.x + j * TK_CHUNK_THREADS;
            const float v = x[j];
            const bool after = v < prev_v || (v == prev_v && idx > prev_i);   // NaN: never after
            if (after && tk_before(v, idx, bv, bi)) { bv = v; bi = idx; }
        }
        tk_cta_best<TK_CHUNK_THREADS>(bv, bi, s_v, s_i);
        if (r == 0) {                            // the chunk's normaliser, from its maximum
            const double mc = bi != INT_MAX ? (double)bv / temperature : -INFINITY;
            double acc = 0.0;
            if (bi != INT_MAX) {
#pragma unroll
                for (int j = 0; j < TK_PER_THREAD; ++j)
                    if (x[j] == x[j]) acc += exp((double)x[j] / temperature - mc);
            }
            acc = tk_cta_sum<TK_CHUNK_THREADS>(acc, s_d);
            if (threadIdx.x == 0) {
                reinterpret_cast<double*>(rec)[0] = mc;
                reinterpret_cast<double*>(rec)[1] = acc;
            }
        }
        if (threadIdx.x == 0) {
            cand_v[r] = bi != INT_MAX ? bv : NAN;    // an empty slot: NaN, never picked by the merge
            cand_i[r] = bi;
        }
        prev_v = bv;
        prev_i = bi;
    }
}

// One CTA per row: the row's normaliser from the chunk records and its top-k among their candidates.
__global__ void __launch_bounds__(TK_CHUNK_THREADS) topk_merge_kernel(int32_t* ids, double* logprobs,
                                                                      const uint8_t* __restrict__ ws, int n_chunks,
                                                                      int k, double temperature) {
    __shared__ float s_v[TK_CHUNK_THREADS / 32];
    __shared__ int s_i[TK_CHUNK_THREADS / 32];
    __shared__ double s_d[TK_CHUNK_THREADS / 32];
    (void)temperature;
    const size_t rb = tk_record_bytes(k);
    const uint8_t* recs = ws + (size_t)blockIdx.x * n_chunks * rb;
    // M: the row's scaled maximum (-inf when every logit is NaN)
    double m = -INFINITY;
    for (int c = 0; c < n_chunks; ++c) m = fmax(m, reinterpret_cast<const double*>(recs + c * rb)[0]);
    double acc = 0.0;
    for (int c = threadIdx.x; c < n_chunks; c += TK_CHUNK_THREADS) {
        const double* r = reinterpret_cast<const double*>(recs + c * rb);
        if (r[0] > -INFINITY) acc += r[1] * exp(r[0] - m);
    }
    const double log_z = log(tk_cta_sum<TK_CHUNK_THREADS>(acc, s_d));
    const int n_cand = n_chunks * k;
    float prev_v = INFINITY;
    int prev_i = -1;
    for (int r = 0; r < k; ++r) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (int t = threadIdx.x; t < n_cand; t += TK_CHUNK_THREADS) {
            const uint8_t* rec = recs + (t / k) * rb;
            const float v = reinterpret_cast<const float*>(rec + 16)[t % k];
            const int j = reinterpret_cast<const int*>(rec + 16 + 4 * (size_t)k)[t % k];
            const bool after = v < prev_v || (v == prev_v && j > prev_i);   // NaN: never after
            if (after && tk_before(v, j, bv, bi)) { bv = v; bi = j; }
        }
        tk_cta_best<TK_CHUNK_THREADS>(bv, bi, s_v, s_i);
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

// -- the single-kernel path ------------------------------------------------------------------------------------

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
    const cudaStream_t st = (cudaStream_t)stream;
    const int n_chunks = (n_vocab + TK_CHUNK - 1) / TK_CHUNK;
    if (k <= TK_FAST_MAX_K && n_rows <= 65535 && (size_t)n_rows * n_chunks * tk_record_bytes(k) <= TK_SCRATCH_BYTES) {
        static fd::StreamScratch scratch;
        void* ws = nullptr;
        if (int s = scratch.get(st, TK_SCRATCH_BYTES, &ws)) return s;
        topk_chunk_kernel<<<dim3(n_chunks, n_rows), TK_CHUNK_THREADS, 0, st>>>(static_cast<uint8_t*>(ws), logits,
                                                                            n_vocab, k, temperature);
        if (int s = FD_LAUNCH_STATUS()) return s;
        topk_merge_kernel<<<n_rows, TK_CHUNK_THREADS, 0, st>>>(ids, logprobs, static_cast<const uint8_t*>(ws),
                                                               n_chunks, k, temperature);
        return FD_LAUNCH_STATUS();
    }
    topk_logprobs_kernel<<<n_rows, TK_THREADS, 0, st>>>(ids, logprobs, logits, n_vocab, k, temperature);
    return FD_LAUNCH_STATUS();
}

}  // extern "C"
