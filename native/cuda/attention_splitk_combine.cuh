// attention_splitk_combine.cuh -- the combine step of split-K attention (attention_splitk.cuh describes the
// design): the splits' partials (max, sum, unnormalised o) of one query row are merged in a fixed order into
// the output, either by combine_kernel (a second launch: fd_attention_masked) or, folded into the split
// kernel, by the split blocks that arrive last (fold_combine: the one-token launches fd_attention_decode and
// fd_attention_decode_rope). Both run the same two functions, combine_lane and combine_merge, so a row's
// output is bit for bit the same either way (tree verification reproduces decode exactly).
//
// The order (written once, below): COMBINE_WARPS = 16 "combine warps" of 32 lanes; lane x of warp w covers
// dims [x * HD / 32, (x + 1) * HD / 32) and merges splits w, w + 16, ... in rounds of combine_unroll<HD>()
// splits (all loads of a round in flight at once: up to 198 splits (HD <= 128) in one memory round trip)
// into its own online-softmax state (combine_lane); the 16 warps' states then meet in warp order
// w = 0 .. 15 (combine_merge). The products and sums are spelt with __fmul_rn / __fmaf_rn exactly as nvcc
// contracted the original source (l *= f; l += wt * ls[0] -> fma(l, f, wt * ls[0]); later terms fma(wt, x,
// l)), so the result cannot depend on how the caller's code around them is compiled.
//
// combine_kernel (combine_row): one block of COMBINE_THREADS = 16 x 32 threads per query row; thread
// (warp w, lane x) is combine lane (w, x). tests/native/test_attention_fold_ptx.py runs the compiled PTX of
// combine_row and fold_combine on the CPU and checks that every output is the same expression.
//
// fold_combine (p.fold > 0; one token): after a split block has written its partials it arrives on its
// query-row tile's counter (one per (token, KV head, row tile) at the workspace's start, COUNTER_SLOTS of
// them): thread 0 does an acq_rel atomicDec(counter, n_active - 1), which takes an idle counter (0, or any
// value >= n_active, e.g. 0xFFFFFFFF from a poisoned workspace) to n_active - 1 and then counts down; the
// arrival that finds 1 is the last one and leaves the counter at 0 for the next launch (the next layer, the
// next graph replay) -- no reset step, nothing to zero per launch. The last K arrivals (K = min(n_active,
// passes, p.fold)) combine the tile's rows: each waits (acquire load) until the counter reads 0 -- every
// active split has written its partials -- and takes passes rank, rank + K, ... A pass is `cols` (row, lane)
// columns of combine lanes, cols = THREADS / nw where nw = min(16, n_active) rounded up to a power of two:
// thread t computes combine warps w = t % nw, w + nw, ... of column t / nw (warps with no split -- w >=
// n_active -- keep the initial state, as in combine_kernel) into shared memory, then the columns' dims are
// merged. Waiting is safe: a waiting block only waits for blocks of its own tile that have not arrived, and
// the blocks that can wait number at most p.fold - 1 per tile, fewer than the SMs over all tiles (launch
// side), so they can never hold every slot a missing block needs; a dependent (PDL) grid is only launched
// once every block of this one has started. Inactive splits (no chunk at this depth) exit before arriving:
// n_active = min(n_splits, ceil(L / chunk_len)) is what arrives. n_active = 1: the one split combines alone
// (no counter). n_splits = 1: the split kernel writes o itself, nothing here runs.
#pragma once

#include "attention_splitk_params.cuh"

namespace fd {
namespace attn {

constexpr int COMBINE_THREADS = 512;
constexpr int COMBINE_WARPS = COMBINE_THREADS / 32;
constexpr int MAX_SPLITS = 512;
constexpr int COUNTER_SLOTS = 4096;                             // arrival counters (token, KV head, row tile)
constexpr size_t COUNTER_BYTES = COUNTER_SLOTS * sizeof(unsigned);   // the workspace's head (16-byte aligned)
template <int HD>
constexpr int combine_unroll() { return HD >= 256 ? 8 : 13; }   // registers: 13 x (HD / 32 + 2) floats

template <int HD>
struct CombineLane {           // one combine lane's online-softmax state over its splits
    float m, l, a[HD / 32];
};

// Combine lane `lane` of combine warp `w` for one query row: m_row / l_row [n_splits], acc_row
// [n_splits][HD] (the row's partials; read through L2: other blocks of the launch may have written them).
template <int HD>
__device__ __forceinline__ void combine_lane(const float* m_row, const float* l_row, const float* acc_row,
                                             int n_active, int w, int lane, CombineLane<HD>& st) {
    constexpr int PER_LANE = HD / 32;          // 2, 4 or 8 consecutive dims
    constexpr int U = combine_unroll<HD>();
    const float* acc = acc_row + lane * PER_LANE;
    st.m = -INFINITY;
    st.l = 0.0f;
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) st.a[j] = 0.0f;
    for (int s0 = w; s0 < n_active; s0 += COMBINE_WARPS * U) {
        float ms[U], ls[U], as[U][PER_LANE];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = s0 + u * COMBINE_WARPS;
            const bool ok = s < n_active;
            ms[u] = ok ? __ldcg(m_row + s) : -INFINITY;
            ls[u] = ok ? __ldcg(l_row + s) : 0.0f;
#pragma unroll
            for (int j = 0; j < PER_LANE; j += 2) {
                const float2 t = ok ? __ldcg(reinterpret_cast<const float2*>(acc + (size_t)s * HD + j))
                                    : make_float2(0.f, 0.f);
                as[u][j] = t.x;
                as[u][j + 1] = t.y;
            }
        }
        float mb = st.m;
#pragma unroll
        for (int u = 0; u < U; ++u) mb = fmaxf(mb, ms[u]);
        if (mb == -INFINITY) continue;                 // nothing visible yet
        const float f = exp2f(st.m - mb);              // m = -inf: 0
        const float wt0 = exp2f(ms[0] - mb);
        st.l = __fmaf_rn(st.l, f, __fmul_rn(wt0, ls[0]));          // l * f + wt0 * ls[0]
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) st.a[j] = __fmaf_rn(st.a[j], f, __fmul_rn(wt0, as[0][j]));
#pragma unroll
        for (int u = 1; u < U; ++u) {
            const float wt = exp2f(ms[u] - mb);        // padding (-inf): 0
            st.l = __fmaf_rn(wt, ls[u], st.l);
#pragma unroll
            for (int j = 0; j < PER_LANE; ++j) st.a[j] = __fmaf_rn(wt, as[u][j], st.a[j]);
        }
        st.m = mb;
    }
}

// One output dim from the 16 combine warps' states: wm / wl [COMBINE_WARPS], wa[w * stride] that dim's
// accumulator of warp w. A row with no visible key (lsum 0) gives NaN.
__device__ __forceinline__ float combine_merge(const float* wm, const float* wl, const float* wa, int stride) {
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < COMBINE_WARPS; ++w) mx = fmaxf(mx, wm[w]);
    float lsum = 0.0f, acc = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
        for (int w = 0; w < COMBINE_WARPS; ++w) {
            const float wt = exp2f(wm[w] - mx);
            lsum = __fmaf_rn(wt, wl[w], lsum);
            acc = __fmaf_rn(wt, wa[(size_t)w * stride], acc);
        }
    }
    return lsum > 0.0f ? acc / lsum : __int_as_float(0x7fffffff);
}

// Query row qrow by a block of COMBINE_THREADS threads: thread (warp, lane) is combine lane (warp, lane).
// combine_kernel's body (tests/native/test_attention_fold_ptx.py compiles it alone, next to fold_combine).
template <int HD>
__device__ __forceinline__ void combine_row(const Params& p, size_t qrow) {
    constexpr int PER_LANE = HD / 32;
    __shared__ float wm[COMBINE_WARPS], wl[COMBINE_WARPS];
    __shared__ float wa[COMBINE_WARPS][HD];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int L = visible_keys(p, (int)(qrow / p.n_heads), nullptr);
    const int n_active = min(p.n_splits, (L + p.chunk_len - 1) / p.chunk_len);
    CombineLane<HD> st;
    combine_lane<HD>(p.ws_m + qrow * p.n_splits, p.ws_l + qrow * p.n_splits, p.ws_acc + qrow * p.n_splits * HD,
                     n_active, warp, lane, st);
    if (lane == 0) {
        wm[warp] = st.m;
        wl[warp] = st.l;
    }
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) wa[warp][lane * PER_LANE + j] = st.a[j];
    __syncthreads();
    for (int d = threadIdx.x; d < HD; d += COMBINE_THREADS) p.o[qrow * HD + d] = combine_merge(wm, wl, &wa[0][d], HD);
}

// One block per query row (n * n_heads rows), COMBINE_THREADS threads.
template <int HD>
__global__ void __launch_bounds__(COMBINE_THREADS) combine_kernel(const Params p) {
    pdl_wait();                  // the partials of the split kernel
    pdl_launch_dependents();     // the next projection may start fetching its weights
    combine_row<HD>(p, blockIdx.x);
}

// ---- the folded combine ---------------------------------------------------------------------------
// Shared memory of fold_combine, in floats: the arrival slot (4) and, per column of a pass (at most
// THREADS), the 16 combine warps' m, l and accumulators.
template <int HD>
constexpr size_t fold_smem_bytes() {
    return (4 + (size_t)THREADS * COMBINE_WARPS * (HD / 32 + 2)) * sizeof(float);
}

// Thread 0 of an arriving block: the counter's old value (see the top of this file).
__device__ __forceinline__ unsigned fold_arrive(unsigned* cnt, unsigned last) {
    unsigned old;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    // acq_rel: publishes this block's partials (ordered before by the caller's __syncthreads), and the
    // last arrival sees everyone's
    asm volatile("atom.acq_rel.gpu.global.dec.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(cnt), "r"(last) : "memory");
#else
    __threadfence();
    old = atomicDec(cnt, last);
    __threadfence();
#endif
    return old;
}

// Thread 0 of a combining block that is not the last arrival: until every active split has arrived.
__device__ __forceinline__ void fold_wait(const unsigned* cnt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    for (;;) {
        unsigned v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(cnt) : "memory");
        if (v == 0u) break;
        __nanosleep(32);
    }
#else
    while (__ldcg(cnt) != 0u) {
    }
    __threadfence();
#endif
}

// Called by every thread of an active split block of a one-token launch after its partials are written
// (block-uniform arguments): arrive, and if among the last K, combine passes rank, rank + K, ... of the
// tile's rows [row0, row0 + rows) into p.o. sm: fold_smem_bytes<HD>() of shared memory, free to reuse.
template <int HD>
__device__ __forceinline__ void fold_combine(const Params& p, int token, int kvh, int tile, int row0, int n_active,
                                             float* sm) {
    constexpr int PER_LANE = HD / 32;
    const int tid = threadIdx.x;
    const int rows = min(ROWS, p.group - row0);
    int nw = 1;                                        // combine warps with a split, rounded up to 2^k (| THREADS)
    while (nw < min(COMBINE_WARPS, n_active)) nw *= 2;
    const int cols = THREADS / nw;                     // (row, lane) columns per pass
    const int n_cols = rows * 32;
    const int n_passes = (n_cols + cols - 1) / cols;
    const int k = min(min(n_active, n_passes), p.fold);   // combining blocks
    unsigned* slot = reinterpret_cast<unsigned*>(sm);
    float* cm = sm + 4;                                // [cols][COMBINE_WARPS]
    float* cl = cm + cols * COMBINE_WARPS;             // [cols][COMBINE_WARPS]
    float* ca = cl + cols * COMBINE_WARPS;             // [cols][COMBINE_WARPS][PER_LANE]
    __syncthreads();                                   // partials written; the merge area is free
    int arrival = 0;                                   // this block's place among the n_active arrivals
    if (n_active > 1) {
        unsigned* cnt = p.counters + ((size_t)token * p.n_kv_heads + kvh) * p.row_tiles + tile;
        if (tid == 0) {
            const unsigned old = fold_arrive(cnt, (unsigned)(n_active - 1));
            *slot = old == 0u || old >= (unsigned)n_active ? 0u : (unsigned)n_active - old;
        }
        __syncthreads();
        arrival = (int)*slot;
        if (arrival < n_active - k) return;            // not a combiner (block-uniform)
        if (arrival < n_active - 1) {                  // a combiner that is not the last arrival
            if (tid == 0) fold_wait(cnt);
            __syncthreads();
        }
    }
    for (int pass = arrival - (n_active - k); pass < n_passes; pass += k) {
        const int c0 = pass * cols;
        {
            const int c = tid / nw, col = c0 + c;
            if (col < n_cols) {
                const size_t qrow = (size_t)token * p.n_heads + kvh * p.group + row0 + col / 32;
                for (int w = tid % nw; w < COMBINE_WARPS; w += nw) {
                    CombineLane<HD> st;
                    combine_lane<HD>(p.ws_m + qrow * p.n_splits, p.ws_l + qrow * p.n_splits,
                                     p.ws_acc + qrow * p.n_splits * HD, n_active, w, col % 32, st);
                    cm[c * COMBINE_WARPS + w] = st.m;
                    cl[c * COMBINE_WARPS + w] = st.l;
#pragma unroll
                    for (int j = 0; j < PER_LANE; ++j) ca[((size_t)c * COMBINE_WARPS + w) * PER_LANE + j] = st.a[j];
                }
            }
        }
        __syncthreads();
        for (int e = tid; e < cols * PER_LANE; e += THREADS) {
            const int c = e / PER_LANE, j = e % PER_LANE, col = c0 + c;
            if (col < n_cols) {
                const size_t qrow = (size_t)token * p.n_heads + kvh * p.group + row0 + col / 32;
                p.o[qrow * HD + (col % 32) * PER_LANE + j] =
                    combine_merge(cm + c * COMBINE_WARPS, cl + c * COMBINE_WARPS,
                                  ca + (size_t)c * COMBINE_WARPS * PER_LANE + j, PER_LANE);
            }
        }
        __syncthreads();                               // the pass's states are read before the next pass
    }
}

}  // namespace attn
}  // namespace fd
