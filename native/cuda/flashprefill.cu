// flashprefill.cu -- FlashPrefill block scoring (ARCHITECTURE.md, PFlash): mean_K, score, select, and the
// tail-attention maxima that give PFlash its token importance.
//
// A drafter forward chunk holds n new tokens at cache slots [p0, p0 + n), p0 % 128 == 0; its keys
// are slots [0, p0 + n). Blocks are FD_FLASHPREFILL_BLOCK = 128 slots: Nk = ceil((p0 + n) / 128) key
// blocks, Mq = ceil(n / 128) query blocks with absolute index m = p0 / 128 + mq. K cache: f16
// [n_kv_heads][max_ctx][head_dim] (this layer); q (n, n_heads, head_dim) f32, rotated. GQA: query
// head h reads kv head h / (n_heads / n_kv_heads).
//
//   fd_flashprefill_mean_k
//                  mean_k (Nk, Hkv, d) f32: each key block's mean over its real rows.
//                  grid (Nk, Hkv), head_dim threads (one per dim), f32 sums.
//   fd_flashprefill_score
//                  score (Mq, H, Nk) f32: a[j, kb] = q_j . mean_k[kb] * scale for the rows j of
//                  block m and kb <= m; M = max over all (j, kb); s[kb] = sum_j exp(a - M), then
//                  normalised so that sum_kb s = 1 (the estimated attention mass, ARCHITECTURE.md, PFlash:
//                  the anchor skips this and thresholds on uniformity instead). 0 for kb > m.
//                  grid (Mq, H), 128 threads, thread j holds q row j (pre-scaled by scale*log2e,
//                  so exp is exp2) in registers; mean_k staged 32 blocks at a time in shared
//                  memory. Two passes over the blocks: the row max M, then the sums (written to
//                  `score`), then one division by their total.
//   fd_flashprefill_select
//                  idx (Mq, H, Nk) int32 ascending kept blocks, -1 padded; cnt (Mq, H). Keep kb <= m
//                  if s >= alpha * max s, kb < sink, m - kb < window, or m >= first_full_block.
//                  One warp per (mq, h) row, ballot compaction 32 blocks at a time.
//   fd_flashprefill_tail_max_probs
//                  acc (T, n_keys) f32 = max(acc, max_h P[h, t, j]) with P the dense causal
//                  softmax of tail token t (slot n_keys - T + t) over keys j <= its slot (the
//                  importance step's max over heads; called once per layer, so acc ends as the
//                  max over layers and heads). Two kernels: per (t, h) the log-sum-exp
//                  (grid T * H, 256 threads, online max/sum per thread then a block merge, into
//                  workspace (T * H * 2 floats)); then per (t, key) the max over heads (grid
//                  (ceil(n_keys / 128), T), 128 threads, the T * H q rows in shared memory).
#include "common.cuh"

#include <limits.h>

namespace fd {
namespace {

constexpr int BLOCK_SLOTS = FD_FLASHPREFILL_BLOCK;
constexpr float LOG2E = 1.4426950408889634f;
constexpr int SCORE_TILE = 32;             // key blocks staged per round

__global__ void flashprefill_mean_k_kernel(float* __restrict__ mean_k, const __half* __restrict__ k_cache, int n_keys,
                                           int n_kv_heads, int head_dim, int max_ctx) {
    const int kb = blockIdx.x, kvh = blockIdx.y, d = threadIdx.x;
    const int first = kb * BLOCK_SLOTS, last = min(n_keys, first + BLOCK_SLOTS);
    const __half* k = k_cache + ((size_t)kvh * max_ctx + first) * head_dim + d;
    float sum = 0.f;
    for (int r = first; r < last; ++r, k += head_dim) sum += __half2float(*k);
    mean_k[((size_t)kb * n_kv_heads + kvh) * head_dim + d] = sum / (float)(last - first);
}

template <int HD>
__global__ void __launch_bounds__(BLOCK_SLOTS)
flashprefill_score_kernel(float* __restrict__ score, const float* __restrict__ q, const float* __restrict__ mean_k,
                          int p0, int n, int n_heads, int n_kv_heads, int n_kb, float scale_log2) {
    __shared__ float mk_s[SCORE_TILE][HD];
    __shared__ float a_s[SCORE_TILE][BLOCK_SLOTS + 1];
    __shared__ float red[32];
    const int mq = blockIdx.x, h = blockIdx.y, j = threadIdx.x;
    const int lane = j % FD_WARP, warp = j / FD_WARP;
    const int kvh = h / (n_heads / n_kv_heads);
    const int m = p0 / BLOCK_SLOTS + mq;
    const int row = mq * BLOCK_SLOTS + j;
    const bool valid = row < n;
    float qr[HD];
    {
        const float* qp = q + ((size_t)min(row, n - 1) * n_heads + h) * HD;
#pragma unroll
        for (int d = 0; d < HD; ++d) qr[d] = qp[d] * scale_log2;
    }
    float* out = score + ((size_t)mq * n_heads + h) * n_kb;

    auto stage = [&](int kb0) {
        for (int i = j; i < SCORE_TILE * HD; i += BLOCK_SLOTS) {
            const int b = i / HD, d = i % HD;
            mk_s[b][d] = kb0 + b <= m ? mean_k[((size_t)(kb0 + b) * n_kv_heads + kvh) * HD + d] : 0.f;
        }
    };
    auto dot = [&](int b) {
        float a = 0.f;
#pragma unroll
        for (int d = 0; d < HD; ++d) a += qr[d] * mk_s[b][d];
        return a;
    };

    // pass 1: M = max over valid rows and kb <= m
    float row_max = -INFINITY;
    for (int kb0 = 0; kb0 <= m; kb0 += SCORE_TILE) {
        __syncthreads();
        stage(kb0);
        __syncthreads();
        const int nb = min(SCORE_TILE, m + 1 - kb0);
        for (int b = 0; b < nb; ++b) row_max = fmaxf(row_max, dot(b));
    }
    const float big_m = block_max(valid ? row_max : -INFINITY, red);   // >= 1 valid row per block

    // pass 2: s[kb] = sum_j exp2(a - M), and their total
    float total = 0.f;   // per warp (lane 0)
    for (int kb0 = 0; kb0 <= m; kb0 += SCORE_TILE) {
        __syncthreads();
        stage(kb0);
        __syncthreads();
        const int nb = min(SCORE_TILE, m + 1 - kb0);
        for (int b = 0; b < nb; ++b) a_s[b][j] = valid ? exp2f(dot(b) - big_m) : 0.f;
        __syncthreads();
        for (int b = warp; b < nb; b += BLOCK_SLOTS / FD_WARP) {
            float v = 0.f;
#pragma unroll
            for (int i = 0; i < BLOCK_SLOTS / FD_WARP; ++i) v += a_s[b][lane + FD_WARP * i];
            v = warp_sum(v);
            if (lane == 0) {
                out[kb0 + b] = v;
                total += v;
            }
        }
    }
    const float sum = block_sum(lane == 0 ? total : 0.f, red);   // also a barrier: out[] is written
    const float inv = 1.f / sum;                                  // sum >= 1: the max term is exp2(0)
    for (int kb = j; kb < n_kb; kb += BLOCK_SLOTS) out[kb] = kb <= m ? out[kb] * inv : 0.f;
}

__global__ void flashprefill_select_kernel(int32_t* __restrict__ idx, int32_t* __restrict__ cnt,
                                           const float* __restrict__ score, int p0, int n_rows, int n_heads, int n_kb,
                                           float alpha, int sink, int window, int first_full) {
    const int lane = threadIdx.x % FD_WARP;
    const int r = blockIdx.x * (blockDim.x / FD_WARP) + threadIdx.x / FD_WARP;   // mq * n_heads + h
    if (r >= n_rows) return;
    const int m = p0 / BLOCK_SLOTS + r / n_heads;
    const float* s = score + (size_t)r * n_kb;
    int32_t* out = idx + (size_t)r * n_kb;
    float mx = -INFINITY;
    for (int kb = lane; kb <= m; kb += FD_WARP) mx = fmaxf(mx, s[kb]);
    const float thr = alpha * warp_max(mx);
    const bool full = m >= first_full;
    int base = 0;
    for (int kb0 = 0; kb0 <= m; kb0 += FD_WARP) {
        const int kb = kb0 + lane;
        const bool keep = kb <= m && (full || kb < sink || m - kb < window || s[kb] >= thr);
        const unsigned ballot = __ballot_sync(0xffffffffu, keep);
        if (keep) out[base + __popc(ballot & ((1u << lane) - 1u))] = kb;
        base += __popc(ballot);
    }
    for (int i = base + lane; i < n_kb; i += FD_WARP) out[i] = -1;
    if (lane == 0) cnt[r] = base;
}

constexpr int TAIL_LSE_THREADS = 256;

template <int HD>
__global__ void __launch_bounds__(TAIL_LSE_THREADS)
flashprefill_tail_lse_kernel(float* __restrict__ ml, const float* __restrict__ q_tail,
                             const __half* __restrict__ k_cache, int n_keys, int n_tail, int n_heads, int n_kv_heads,
                             int max_ctx, float scale_log2) {
    __shared__ float qs[HD];
    __shared__ float red[32];
    const int t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
    const int kvh = h / (n_heads / n_kv_heads);
    for (int d = threadIdx.x; d < HD; d += blockDim.x) qs[d] = q_tail[((size_t)t * n_heads + h) * HD + d] * scale_log2;
    __syncthreads();
    const int last = n_keys - n_tail + t;
    const __half* kh = k_cache + (size_t)kvh * max_ctx * HD;
    float mx = -INFINITY, l = 0.f;
    for (int key = threadIdx.x; key <= last; key += blockDim.x) {
        const __half* kr = kh + (size_t)key * HD;
        float a = 0.f;
#pragma unroll 8
        for (int d = 0; d < HD; ++d) a += qs[d] * __half2float(kr[d]);
        const float m_new = fmaxf(mx, a);
        l = l * exp2f(mx - m_new) + exp2f(a - m_new);
        mx = m_new;
    }
    const float big = block_max(mx, red);
    const float sum = block_sum(mx == -INFINITY ? 0.f : l * exp2f(mx - big), red);
    if (threadIdx.x == 0) {
        ml[blockIdx.x * 2] = big;
        ml[blockIdx.x * 2 + 1] = sum;
    }
}

template <int HD>
__global__ void __launch_bounds__(BLOCK_SLOTS)
flashprefill_tail_max_kernel(float* __restrict__ acc, const float* __restrict__ q_tail,
                             const __half* __restrict__ k_cache, const float* __restrict__ ml, int n_keys, int n_tail,
                             int n_heads, int n_kv_heads, int max_ctx, float scale_log2) {
    extern __shared__ float qs[];   // [n_heads][HD], pre-scaled
    const int t = blockIdx.y;
    for (int i = threadIdx.x; i < n_heads * HD; i += blockDim.x)
        qs[i] = q_tail[(size_t)t * n_heads * HD + i] * scale_log2;
    __syncthreads();
    const int key = blockIdx.x * BLOCK_SLOTS + threadIdx.x;
    if (key > n_keys - n_tail + t) return;   // not visible to this tail token (or past the keys)
    const int group = n_heads / n_kv_heads;
    float best = 0.f;
    for (int kvh = 0; kvh < n_kv_heads; ++kvh) {
        float kr[HD];
        const __half* kp = k_cache + ((size_t)kvh * max_ctx + key) * HD;
#pragma unroll
        for (int d = 0; d < HD; ++d) kr[d] = __half2float(kp[d]);
        for (int hg = 0; hg < group; ++hg) {
            const int h = kvh * group + hg;
            float a = 0.f;
#pragma unroll
            for (int d = 0; d < HD; ++d) a += qs[h * HD + d] * kr[d];
            const float* mlh = ml + ((size_t)t * n_heads + h) * 2;
            best = fmaxf(best, exp2f(a - mlh[0]) / mlh[1]);
        }
    }
    float* dst = acc + (size_t)t * n_keys + key;
    *dst = fmaxf(*dst, best);
}

}  // namespace
}  // namespace fd

extern "C" int fd_flashprefill_mean_k(float* mean_k, const void* k_cache, int n_keys, const fd_attention_shape_t* shape,
                                      void* stream) {
    FD_CHECK_ARG(mean_k && k_cache && fd::shape_valid(shape) && n_keys >= 1 && n_keys <= shape->max_ctx);
    if (!fd::kv_f16(shape)) return FD_E_SHAPE;   // reads float16 K/V only so far (flashd_attention.h)
    const int n_kv_heads = shape->n_kv_heads, head_dim = shape->head_dim, max_ctx = shape->max_ctx;
    if (head_dim < 1 || head_dim > 256) return FD_E_SHAPE;
    const dim3 grid(fd::ceil_div(n_keys, FD_FLASHPREFILL_BLOCK), n_kv_heads);
    fd::flashprefill_mean_k_kernel<<<grid, head_dim, 0, (cudaStream_t)stream>>>(
        mean_k, static_cast<const __half*>(k_cache), n_keys, n_kv_heads, head_dim, max_ctx);
    return FD_LAUNCH_STATUS();
}

extern "C" int fd_flashprefill_score(float* score, const float* q, const float* mean_k, int p0, int n,
                                     const fd_attention_shape_t* shape, void* stream) {
    FD_CHECK_ARG(score && q && mean_k && n >= 1 && p0 >= 0 && p0 % FD_FLASHPREFILL_BLOCK == 0);
    FD_CHECK_ARG(fd::shape_valid(shape) && isfinite(shape->scale));
    const int n_heads = shape->n_heads, n_kv_heads = shape->n_kv_heads, head_dim = shape->head_dim;
    const float scale = shape->scale;
    FD_CHECK_ARG((int64_t)p0 + n <= INT_MAX);
    const int n_kb = fd::ceil_div(p0 + n, FD_FLASHPREFILL_BLOCK);
    const dim3 grid(fd::ceil_div(n, FD_FLASHPREFILL_BLOCK), n_heads);
    const float sl = scale * fd::LOG2E;
    cudaStream_t s = (cudaStream_t)stream;
    if (head_dim == 64)
        fd::flashprefill_score_kernel<64><<<grid, FD_FLASHPREFILL_BLOCK, 0, s>>>(score, q, mean_k, p0, n, n_heads,
                                                                                 n_kv_heads, n_kb, sl);
    else if (head_dim == 128)
        fd::flashprefill_score_kernel<128><<<grid, FD_FLASHPREFILL_BLOCK, 0, s>>>(score, q, mean_k, p0, n, n_heads,
                                                                                  n_kv_heads, n_kb, sl);
    else
        return FD_E_SHAPE;
    return FD_LAUNCH_STATUS();
}

extern "C" int fd_flashprefill_select(int32_t* idx, int32_t* cnt, const float* score, int p0, int n, int n_heads,
                                      float alpha, int sink_blocks, int window_blocks, int first_full_block,
                                      void* stream) {
    FD_CHECK_ARG(idx && cnt && score && n >= 1 && n_heads >= 1 && p0 >= 0 && p0 % FD_FLASHPREFILL_BLOCK == 0);
    FD_CHECK_ARG(isfinite(alpha) && alpha >= 0.f && sink_blocks >= 0 && window_blocks >= 0);
    const int n_kb = fd::ceil_div(p0 + n, FD_FLASHPREFILL_BLOCK);
    const int n_rows = fd::ceil_div(n, FD_FLASHPREFILL_BLOCK) * n_heads;
    constexpr int warps = 4;
    fd::flashprefill_select_kernel<<<fd::ceil_div(n_rows, warps), warps * FD_WARP, 0, (cudaStream_t)stream>>>(
        idx, cnt, score, p0, n_rows, n_heads, n_kb, alpha, sink_blocks, window_blocks, first_full_block);
    return FD_LAUNCH_STATUS();
}

extern "C" int fd_flashprefill_tail_max_probs(float* acc, const float* q_tail, const void* k_cache, int n_keys,
                                              int n_tail, const fd_attention_shape_t* shape, float* workspace,
                                              void* stream) {
    FD_CHECK_ARG(acc && q_tail && k_cache && workspace && fd::shape_valid(shape) && isfinite(shape->scale));
    if (!fd::kv_f16(shape)) return FD_E_SHAPE;   // reads float16 K/V only so far (flashd_attention.h)
    const int n_heads = shape->n_heads, n_kv_heads = shape->n_kv_heads, head_dim = shape->head_dim;
    const int max_ctx = shape->max_ctx;
    const float scale = shape->scale;
    FD_CHECK_ARG(n_tail >= 1 && n_keys >= n_tail && n_keys <= max_ctx);
    const size_t q_bytes = (size_t)n_heads * head_dim * sizeof(float);
    if ((head_dim != 64 && head_dim != 128) || q_bytes > 48 * 1024) return FD_E_SHAPE;
    const __half* kc = static_cast<const __half*>(k_cache);
    const float sl = scale * fd::LOG2E;
    cudaStream_t s = (cudaStream_t)stream;
    const dim3 grid_max(fd::ceil_div(n_keys, FD_FLASHPREFILL_BLOCK), n_tail);
    if (head_dim == 64) {
        fd::flashprefill_tail_lse_kernel<64><<<n_tail * n_heads, fd::TAIL_LSE_THREADS, 0, s>>>(
            workspace, q_tail, kc, n_keys, n_tail, n_heads, n_kv_heads, max_ctx, sl);
        fd::flashprefill_tail_max_kernel<64><<<grid_max, FD_FLASHPREFILL_BLOCK, q_bytes, s>>>(
            acc, q_tail, kc, workspace, n_keys, n_tail, n_heads, n_kv_heads, max_ctx, sl);
    } else {
        fd::flashprefill_tail_lse_kernel<128><<<n_tail * n_heads, fd::TAIL_LSE_THREADS, 0, s>>>(
            workspace, q_tail, kc, n_keys, n_tail, n_heads, n_kv_heads, max_ctx, sl);
        fd::flashprefill_tail_max_kernel<128><<<grid_max, FD_FLASHPREFILL_BLOCK, q_bytes, s>>>(
            acc, q_tail, kc, workspace, n_keys, n_tail, n_heads, n_kv_heads, max_ctx, sl);
    }
    return FD_LAUNCH_STATUS();
}
