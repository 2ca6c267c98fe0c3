// sampling.cu -- token selection on the device (flashd.h: fd_argmax, fd_sample,
// fd_sample_workspace_bytes, fd_decode_advance).
//
// fd_argmax: out[r] = argmax of logits row r (n_rows, n_vocab); the lowest id wins ties, NaN never
// wins, a row of NaNs gives -1. One block of 1024 threads per row, float4 loads; on sm_90 rows of
// >= 16384 logits take a cluster of 8 blocks (argmax_cluster_kernel).
//
// fd_sample reproduces flashd.daemon.sampling.sample for temperature > 0, in float32:
//   1. penalties over the window history[nh - w .. nh), w = min(repeat_last_n, nh), nh = *n_history:
//      each distinct id t of the window, seen c[t] times, gets
//      l = (l > 0 ? l / r : l * r) - c[t] * f - p          (ids outside [0, n_vocab) are ignored)
//   2. x = l (NaN -> -inf); top_k (0 < k < n_vocab): keep x >= theta_k, the k-th largest x
//   3. p = exp((x - max x) / T) for kept ids (p of the max is exactly 1); p < 2^-40 counts as 0
//   4. top_p < 1: keep p >= tau, tau the largest value whose mass(p >= tau) >= top_p * sum(p)
//   5. min_p > 0: keep p >= min_p (= min_p * p_max, p_max = 1)
//   6. u = uniform(seed, *step) (SplitMix64, bit-exact with the Python); walk kept ids in ascending
//      order and return the first whose running mass exceeds u * (kept mass).
// Every filter is a threshold, so nothing is sorted: thresholds come from radix selection on the
// float bits (3 digit levels of 11/11/10 bits over a shared-memory histogram), and the draw is a
// block-wide prefix sum.
//
// Launch: one block of 1024 threads over the whole vocabulary (the work is a few passes over at
// most ~1 MB of logits held in L2). To keep passes cheap no per-element atomics are used on the
// common paths: a threshold that is provably <= the final one (the k-th largest of the 1024
// per-thread maxima for top_k; for top_p the smallest per-thread maximum at which the maxima's own
// mass reaches the target) filters candidates into shared memory (CAND_CAP), and the exact select
// runs there; with min_p, p < min_p is never listed for top_p (only tau >= min_p can matter). If
// the candidates overflow CAND_CAP (huge k, very flat distributions without min_p) a slower exact
// path histograms the whole vocabulary with shared-memory atomics. Every pass loads U items per
// thread before using them (one memory round trip per U items, not per item).
//
// Cost (H200, vocab 151936, graph replay incl. a 4.5 us floor): T only 55 us; top_k 40 + top_p +
// repeat penalty 115 us; top_p + min_p 62 us. One SM streaming ~0.6 MB per pass is latency-bound
// (~45 GB/s); a multi-block variant would be the next step (see the report).
//
// Determinism: histogram masses are 64-bit fixed point (p * 2^40, truncated), so atomic order
// never matters; float sums are formed in a fixed order. The same inputs give the same token on
// every run. Differences from the float64 reference arise only where a threshold or u lands
// within float32 rounding (~1e-6 relative) of a boundary.
//
// Workspace (fd_sample_workspace_bytes): float x[V] (the penalized logits, later p), int32
// count[V] and int32 slot[V] (the window's per-id count and a position of the id in the window;
// never cleared: slot[t] is trusted only if history[start + slot[t]] == t -- the sparse-set trick
// -- so stale contents from earlier calls are harmless).
//
// fd_decode_advance: one thread appends the chosen token to the history and the pinned ring and
// advances step, position and n_past (flashd.h).
#include "common.cuh"

#include <limits.h>

#if FD_HAS_MMA
#include <cooperative_groups.h>
#endif

namespace {

constexpr int ST = 1024;                 // threads of the sampling and argmax blocks
constexpr int NW = ST / 32;
constexpr int BINS = 2048;               // radix digits: 11, 11, 10 bits
// candidates kept in shared memory for exact selection: 128 KB of the SM's 228 KB (HIP: 64 KB LDS)
constexpr int CAND_CAP = FD_HAS_MMA ? 32768 : 6144;
constexpr float FIX_ONE = 1099511627776.0f;   // 2^40: fixed-point unit of probability mass
constexpr float LOG2_P_MIN = -40.0f;          // p < 2^-40 is 0 in fixed point: not kept
constexpr int MAX_VOCAB = 1 << 24;            // V * 2^40 < 2^64

typedef unsigned long long u64;

// ---- float <-> order-preserving uint32 ----------------------------------------------------
__device__ __forceinline__ uint32_t f2key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key2f(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}
// p >= 0: its bits order like its value; its mass in fixed point
__device__ __forceinline__ u64 fix_of_bits(uint32_t bits) { return __float2ull_rz(__uint_as_float(bits) * FIX_ONE); }

// ---- SplitMix64 (flashd.daemon.sampling.uniform) -----------------------------------------
__device__ __forceinline__ u64 splitmix64(u64 x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
__device__ __forceinline__ double uniform(u64 seed, u64 step) {
    return (double)(splitmix64(splitmix64(seed) ^ step) >> 11) * 0x1.0p-53;
}

struct Smem {
    u64 hist[BINS];
    uint32_t cand[CAND_CAP];
    union {
        uint32_t tkeys[ST];                  // per-thread maxima during selection
        float incl[ST];                      // inclusive prefix sums during the draw
    };
    float red_f[NW];
    u64 red_u[NW];
    int n_cand;
    uint32_t sel_bin;
    u64 sel_above;
    int chosen;
};
static_assert(sizeof(Smem) <= (FD_HAS_MMA ? 200 : 60) * 1024, "fd_sample's shared memory budget");

// Block reductions: the same two-level shuffle tree three times (max f32, sum f32, sum u64) --
// deliberate: each is six lines, and a template over (type, op, scratch slot) would hide the fixed
// order that makes fd_sample deterministic.
__device__ __forceinline__ float block_max_f(float v, Smem& sm) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sm.red_f[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sm.red_f[threadIdx.x & 31];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// fixed reduction tree: deterministic
__device__ __forceinline__ float block_sum_f(float v, Smem& sm) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sm.red_f[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sm.red_f[threadIdx.x & 31];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ u64 block_sum_u(u64 v, Smem& sm) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sm.red_u[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sm.red_u[threadIdx.x & 31];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Warp 0: the largest bin b of hist[0, n_bins) with above + sum(hist[b..]) >= target (target is
// clamped to what is reachable, so some bin is always chosen); writes sm.sel_bin and sm.sel_above
// = above + sum(hist[b+1..]).
__device__ void select_bin_from_top(Smem& sm, int n_bins, u64 target, u64 above) {
    const int lane = threadIdx.x & 31, per = n_bins / 32, base = lane * per;
    u64 own = 0;
    for (int b = base; b < base + per; ++b) own += sm.hist[b];
    u64 suffix = own;                                   // sum over lanes >= this one
    for (int o = 1; o < 32; o <<= 1) {
        const u64 t = __shfl_down_sync(0xffffffffu, suffix, o);
        if (lane + o < 32) suffix += t;
    }
    const u64 total = __shfl_sync(0xffffffffu, suffix, 0);
    if (target > above + total) target = above + total;
    const unsigned ok = __ballot_sync(0xffffffffu, above + suffix >= target);   // lanes 0..L
    const int chosen_lane = ok ? 31 - __clz((int)ok) : 0;
    if (lane == chosen_lane) {
        u64 acc = above + (suffix - own);
        uint32_t bin = base;
        u64 bin_above = acc;
        for (int b = base + per - 1; b >= base; --b) {
            if (acc + sm.hist[b] >= target) { bin = b; bin_above = acc; break; }
            acc += sm.hist[b];
        }
        sm.sel_bin = bin;
        sm.sel_above = bin_above;
    }
}

constexpr int U = 4;   // items each thread has in flight per round of a pass

// One pass over src[0, n): item g (a float4 group of ids 4g..4g+3 when VEC, else id g) belongs to
// thread g % ST, so the reads are coalesced and every thread meets its ids in ascending order. A
// thread first issues the loads of U items, then calls f(first_id, value, count) for each (count
// 4 or 1; with UNIFORM also 0 for the padding items past n, so f may use warp collectives). The
// explicit batching matters: f may store to global memory, which would otherwise stop the
// compiler from hoisting the next loads and serialise one memory round trip per item.
template <bool VEC, bool UNIFORM, class F>
__device__ __forceinline__ void for_each_batched(const float* src, int n, F f) {
    const int n_items = VEC ? n / 4 : n;
    const int n_rounds = (n_items + ST * U - 1) / (ST * U);
    for (int r = 0; r < n_rounds; ++r) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int g = (r * U + u) * ST + threadIdx.x;
            v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (g < n_items) {
                if (VEC) v[u] = *reinterpret_cast<const float4*>(src + 4 * g);
                else v[u].x = src[g];
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int g = (r * U + u) * ST + threadIdx.x;
            const int count = g < n_items ? (VEC ? 4 : 1) : 0;
            if (UNIFORM || count) f(VEC ? 4 * g : g, v[u], count);
        }
    }
}

__device__ __forceinline__ float comp(const float4& v, int e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; }

// Exact radix selection (3 digit levels) over keys from one of two sources:
//   smem keys[0, n) (the candidate lists), or every element of a global float array (the overflow
//   paths: COUNT keys = f2key(x); MASS keys = bits of p, p > 0 only).
// COUNT: the largest key K with #{keys >= K} >= target (the target-th largest).
// MASS : keys are bits of p >= 0; the largest K with fixed-point mass{keys >= K} >= target.
// Called by the whole block; returns the key in every thread.
template <bool MASS, bool VEC, bool GLOBAL>
__device__ uint32_t radix_select(Smem& sm, const uint32_t* keys, const float* src, int n, u64 target) {
    uint32_t prefix = 0;
    u64 above = 0;
#pragma unroll 1
    for (int level = 0; level < 3; ++level) {
        const int shift = level == 0 ? 21 : (level == 1 ? 10 : 0);
        const int width = level == 2 ? 10 : 11;
        const uint32_t mask = (1u << width) - 1u;
        for (int b = threadIdx.x; b < BINS; b += ST) sm.hist[b] = 0;
        __syncthreads();
        auto add = [&](uint32_t key) {
            if (level > 0 && (key >> (shift + width)) != prefix) return;
            atomicAdd(&sm.hist[(key >> shift) & mask], MASS ? fix_of_bits(key) : 1ull);
        };
        if (GLOBAL) {
            for_each_batched<VEC, false>(src, n, [&](int, float4 v, int count) {
                for (int e = 0; e < count; ++e) {
                    const float f = comp(v, e);
                    if (!MASS) add(f2key(f));
                    else if (f > 0.0f) add(__float_as_uint(f));
                }
            });
        } else {
            for (int i = threadIdx.x; i < n; i += ST) {
                const uint32_t key = keys[i];
                if (!MASS || key != 0u) add(key);
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) select_bin_from_top(sm, 1 << width, target, above);
        __syncthreads();
        prefix = (prefix << width) | sm.sel_bin;
        above = sm.sel_above;
        __syncthreads();   // sel_* are rewritten by the next level
    }
    return prefix;
}

// Appends key to sm.cand (warp-aggregated: one shared atomic per warp). All 32 lanes call it.
__device__ __forceinline__ void append_candidate(Smem& sm, bool take, uint32_t key) {
    const unsigned m = __ballot_sync(0xffffffffu, take);
    if (m == 0u) return;
    const int lane = threadIdx.x & 31, leader = __ffs((int)m) - 1;
    int base = 0;
    if (lane == leader) base = atomicAdd(&sm.n_cand, __popc(m));
    base = __shfl_sync(0xffffffffu, base, leader);
    if (take) {
        const int at = base + __popc(m & ((1u << lane) - 1u));
        if (at < CAND_CAP) sm.cand[at] = key;
    }
}

// Lists every element of arr[0, n) with take(value, key) into sm.cand (any order). sm.n_cand >
// CAND_CAP afterwards means overflow (the list is then incomplete).
template <bool VEC, class Take>
__device__ void collect(Smem& sm, const float* arr, int n, Take take) {
    for_each_batched<VEC, true>(arr, n, [&](int, float4 v, int count) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            uint32_t key = 0u;
            const bool t = e < count && take(comp(v, e), key);
            if (VEC || e == 0) append_candidate(sm, t, key);
        }
    });
}

struct SampleArgs {
    int32_t* out;
    const float* logits;
    int n_vocab;
    const int32_t* history;
    const int32_t* n_history;
    int repeat_last_n;
    float repeat_penalty, frequency_penalty, presence_penalty;
    int penalties;            // 0: step 1 is the identity (host decided from the parameters)
    float log2e_over_t;       // log2(e) / temperature
    int top_k;                // 0 < top_k < n_vocab, else 0 (off)
    float top_p;              // < 1: on
    float min_p;              // > 0: on
    u64 seed;
    const int32_t* step;
    float* x;                 // workspace float[V]
    int32_t* count;           // workspace int32[V]
    int32_t* slot;            // workspace int32[V]
};

template <bool VEC>
__global__ void __launch_bounds__(ST, 1) sample_kernel(SampleArgs a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
    const int V = a.n_vocab;
    float* x = a.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    // ---- 1. penalties: count the window's ids (count/slot need no clearing, see the header); the
    // window is staged in shared memory (sm.cand is free until step 2) when it fits ----
    int w_len = 0, w_start = 0;
    const int32_t* window = nullptr;
    if (a.penalties) {
        const int nh = max(a.n_history[0], 0);
        w_len = min(a.repeat_last_n, nh);
        w_start = nh - w_len;
        window = a.history + w_start;
        for (int w = threadIdx.x; w < w_len; w += ST) {
            const int t = window[w];
            if (w < CAND_CAP) sm.cand[w] = (uint32_t)t;
            if (t >= 0 && t < V) { a.count[t] = 0; a.slot[t] = w; }
        }
        __syncthreads();
        for (int w = threadIdx.x; w < w_len; w += ST) {
            const int t = window[w];
            if (t >= 0 && t < V) atomicAdd(&a.count[t], 1);
        }
        __syncthreads();
    }
    const bool window_in_smem = w_len <= CAND_CAP;
    // penalised value of id i given its logit l and slot entry s (see the sparse-set trick)
    auto penalize = [&](int i, float l, int s) -> float {
        if (l != l) l = -INFINITY;                         // NaN never kept
        if (s >= 0 && s < w_len && (window_in_smem ? (int)sm.cand[s] : window[s]) == i) {
            if (a.repeat_penalty != 1.0f) l = l > 0.0f ? l / a.repeat_penalty : l * a.repeat_penalty;
            l = (l - (float)a.count[i] * a.frequency_penalty) - a.presence_penalty;
        }
        return l;
    };

    // ---- pass 1: x = penalized logits, per-thread and global maximum ----
    float tmax = -INFINITY;
    {
        const int n_items = VEC ? V / 4 : V;
        const int n_rounds = (n_items + ST * U - 1) / (ST * U);
        for (int r = 0; r < n_rounds; ++r) {
            float4 v[U];
            int4 sl[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int g = (r * U + u) * ST + threadIdx.x;
                v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
                sl[u] = make_int4(-1, -1, -1, -1);
                if (g < n_items) {
                    if (VEC) {
                        v[u] = *reinterpret_cast<const float4*>(a.logits + 4 * g);
                        if (w_len > 0) sl[u] = *reinterpret_cast<const int4*>(a.slot + 4 * g);
                    } else {
                        v[u].x = a.logits[g];
                        if (w_len > 0) sl[u].x = a.slot[g];
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int g = (r * U + u) * ST + threadIdx.x;
                if (g >= n_items) continue;
                if (VEC) {
                    const int i = 4 * g;
                    float4 o;
                    o.x = penalize(i, v[u].x, sl[u].x);
                    o.y = penalize(i + 1, v[u].y, sl[u].y);
                    o.z = penalize(i + 2, v[u].z, sl[u].z);
                    o.w = penalize(i + 3, v[u].w, sl[u].w);
                    *reinterpret_cast<float4*>(x + i) = o;
                    tmax = fmaxf(tmax, fmaxf(fmaxf(o.x, o.y), fmaxf(o.z, o.w)));
                } else {
                    const float o = penalize(g, v[u].x, sl[u].x);
                    x[g] = o;
                    tmax = fmaxf(tmax, o);
                }
            }
        }
    }
    __syncthreads();                                  // sm.cand (the window) is read no more
    sm.tkeys[threadIdx.x] = f2key(tmax);
    const float x_max = block_max_f(tmax, sm);       // syncs: x and tkeys are visible to all
    const float c2 = a.log2e_over_t;
    auto log2p = [&](float xv) { return (xv - x_max) * c2; };

    // ---- 2. top_k: theta_k = the k-th largest x ----
    float theta_k = -INFINITY;
    bool small = false;          // top_k's survivors (<= CAND_CAP) are listed in sm.cand
    if (a.top_k > 0) {
        float lo = -INFINITY;    // <= theta_k: the k-th largest per-thread maximum
        if (a.top_k <= ST) lo = key2f(radix_select<false, VEC, false>(sm, sm.tkeys, nullptr, ST, (u64)a.top_k));
        const bool filter = a.top_k <= ST || V <= CAND_CAP;     // else every id is a candidate
        if (threadIdx.x == 0) sm.n_cand = filter ? 0 : CAND_CAP + 1;
        __syncthreads();
        if (filter) collect<VEC>(sm, x, V, [&](float v, uint32_t& key) {
            key = f2key(v);
            return v >= lo;
        });
        __syncthreads();
        const int n_cand = sm.n_cand;
        if (n_cand <= CAND_CAP) {
            small = true;
            theta_k = key2f(radix_select<false, VEC, false>(sm, sm.cand, nullptr, n_cand, (u64)a.top_k));
        } else {
            theta_k = key2f(radix_select<false, VEC, true>(sm, nullptr, x, V, (u64)a.top_k));
        }
    }

    // ---- 3.-5. p, tau, min_p ----
    float tau = 0.0f;
    if (small) {
        // survivors x >= theta_k among the candidates: each entry becomes the bits of its p (0 =
        // not kept; every thread rewrites only the entries it reads)
        const int n_cand = sm.n_cand;
        u64 mass = 0;
        for (int i = threadIdx.x; i < n_cand; i += ST) {
            const float v = key2f(sm.cand[i]);
            const float lp = log2p(v);
            uint32_t bits = 0u;
            if (v >= theta_k && lp >= LOG2_P_MIN) {
                bits = __float_as_uint(exp2f(lp));
                mass += fix_of_bits(bits);
            }
            sm.cand[i] = bits;
        }
        const u64 total = block_sum_u(mass, sm);
        if (a.top_p < 1.0f) {
            const u64 target = (u64)ceil((double)a.top_p * (double)total);
            tau = __uint_as_float(radix_select<true, VEC, false>(sm, sm.cand, nullptr, n_cand, target));
        }
    } else {
        // full vocabulary: p stored over x
        float sum = 0.0f, tmax_p = 0.0f;
        for_each_batched<VEC, false>(x, V, [&](int i, float4 v, int count) {
            float4 p;
            p.x = (v.x >= theta_k && log2p(v.x) >= LOG2_P_MIN) ? exp2f(log2p(v.x)) : 0.0f;
            p.y = (v.y >= theta_k && log2p(v.y) >= LOG2_P_MIN) ? exp2f(log2p(v.y)) : 0.0f;
            p.z = (v.z >= theta_k && log2p(v.z) >= LOG2_P_MIN) ? exp2f(log2p(v.z)) : 0.0f;
            p.w = (v.w >= theta_k && log2p(v.w) >= LOG2_P_MIN) ? exp2f(log2p(v.w)) : 0.0f;
            if (count == 4) {
                *reinterpret_cast<float4*>(x + i) = p;
                sum += (p.x + p.y) + (p.z + p.w);
                tmax_p = fmaxf(tmax_p, fmaxf(fmaxf(p.x, p.y), fmaxf(p.z, p.w)));
            } else {
                x[i] = p.x;
                sum += p.x;
                tmax_p = fmaxf(tmax_p, p.x);
            }
        });
        sm.tkeys[threadIdx.x] = __float_as_uint(tmax_p);
        const float total = block_sum_f(sum, sm);          // syncs: p and tkeys visible
        if (a.top_p < 1.0f) {
            const u64 target = (u64)ceil((double)a.top_p * (double)total * (double)FIX_ONE);
            // lo <= tau: the per-thread maxima >= lo alone already carry the target mass (0 if they
            // cannot, i.e. no filtering)
            const u64 maxima_mass = block_sum_u(fix_of_bits(sm.tkeys[threadIdx.x]), sm);
            float lo = 0.0f;
            if (maxima_mass >= target)
                lo = __uint_as_float(radix_select<true, VEC, false>(sm, sm.tkeys, nullptr, ST, target));
            // With min_p, only tau >= min_p can matter (cut = max(tau, min_p)): p < min_p need not
            // be listed; if the listed mass misses the target, tau < min_p and min_p is the cut.
            lo = fmaxf(lo, a.min_p);
            const bool filter = lo > 0.0f || V <= CAND_CAP;    // else every p > 0 is a candidate
            if (threadIdx.x == 0) sm.n_cand = filter ? 0 : CAND_CAP + 1;
            __syncthreads();
            if (filter) collect<VEC>(sm, x, V, [&](float p, uint32_t& key) {
                key = __float_as_uint(p);
                return p > 0.0f && p >= lo;
            });
            __syncthreads();
            const int n_cand = sm.n_cand;
            if (n_cand <= CAND_CAP) {
                u64 listed = 0;
                for (int i = threadIdx.x; i < n_cand; i += ST) listed += fix_of_bits(sm.cand[i]);
                if (block_sum_u(listed, sm) >= target)
                    tau = __uint_as_float(radix_select<true, VEC, false>(sm, sm.cand, nullptr, n_cand, target));
            } else
                tau = __uint_as_float(radix_select<true, VEC, true>(sm, nullptr, x, V, target));
        }
    }
    const float cut = fmaxf(tau, a.min_p);   // keep p >= cut (and p > 0)

    // ---- 6. the draw: warp w owns the ids [w * seg, (w + 1) * seg), read in chunks of 32 items
    // (coalesced); u * kept_total is located first among the warps, then (in the one warp that
    // holds it) among chunks, lanes and finally the lane's ids ----
    // kept p of x value v; `small`: x holds logits (p computed for the few values >= theta_k)
    auto kept_p = [&](float v) -> float {
        float p = v;
        if (small) {
            const float lp = log2p(v);
            p = (v >= theta_k && lp >= LOG2_P_MIN) ? exp2f(lp) : 0.0f;
        }
        return (p > 0.0f && p >= cut) ? p : 0.0f;
    };
    constexpr int W = VEC ? 4 : 1;                           // ids per lane per chunk
    const int seg = ((V + 32 * 32 * W - 1) / (32 * 32 * W)) * 32 * W;   // ids per warp: whole chunks
    const int seg0 = warp * seg, seg_end = min(V, seg0 + seg);
    const int n_chunks = seg0 < seg_end ? (seg_end - seg0 + 32 * W - 1) / (32 * W) : 0;
    auto load_chunk = [&](int c) -> float4 {        // this lane's ids of chunk c, as kept p (0 past the end)
        const int i = seg0 + c * 32 * W + lane * W;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < seg_end) {
            if (VEC) v = *reinterpret_cast<const float4*>(x + i);
            else v.x = x[i];
            v.x = kept_p(v.x);
            if (VEC) { v.y = kept_p(v.y); v.z = kept_p(v.z); v.w = kept_p(v.w); }
        }
        return v;
    };
    float own = 0.0f;
    for (int c0 = 0; c0 < n_chunks; c0 += U) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = c0 + u < n_chunks ? load_chunk(c0 + u) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int u = 0; u < U; ++u) own += (v[u].x + v[u].y) + (v[u].z + v[u].w);
    }
    for (int o = 16; o > 0; o >>= 1) own += __shfl_xor_sync(0xffffffffu, own, o);   // warp total
    __syncthreads();
    if (lane == 0) sm.red_f[warp] = own;
    if (threadIdx.x == 0) sm.chosen = -1;
    __syncthreads();
    // inclusive prefix over warps, summed in one fixed order by every thread
    float excl = 0.0f, kept_total = 0.0f;
    for (int w = 0; w < NW; ++w) {
        if (w == warp) excl = kept_total;
        kept_total += sm.red_f[w];
    }
    const float incl = excl + own;
    const double u = uniform(a.seed, (u64)(int64_t)a.step[0]);
    float thr = (float)(u * (double)kept_total);
    if (!(thr < kept_total)) thr = nextafterf(kept_total, 0.0f);
    // the warp holding thr (exactly one: the intervals [excl, incl) tile [0, kept_total))
    if (own > 0.0f && excl <= thr && thr < incl) {
        float running = excl;
        int last_kept = -1, pick = -1;
        for (int c = 0; c < n_chunks && pick < 0; ++c) {
            const float4 v = load_chunk(c);
            const float mine = (v.x + v.y) + (v.z + v.w);
            float chunk = mine;
            for (int o = 16; o > 0; o >>= 1) chunk += __shfl_xor_sync(0xffffffffu, chunk, o);
            const int base = seg0 + c * 32 * W + lane * W;
            // this lane's last kept id, and the chunk's (the fallback when rounding hides the crossing)
            int lane_last = -1;
#pragma unroll
            for (int e = 0; e < W; ++e)
                if (comp(v, e) > 0.0f) lane_last = base + e;
            const unsigned has = __ballot_sync(0xffffffffu, lane_last >= 0);
            const int chunk_last = has ? __shfl_sync(0xffffffffu, lane_last, 31 - __clz((int)has)) : -1;
            if (running + chunk > thr) {
                float scan = mine;                     // inclusive over lanes
                for (int o = 1; o < 32; o <<= 1) {
                    const float t = __shfl_up_sync(0xffffffffu, scan, o);
                    if (lane >= o) scan += t;
                }
                const unsigned cross = __ballot_sync(0xffffffffu, mine > 0.0f && running + scan > thr);
                if (cross) {
                    const int l = __ffs((int)cross) - 1;
                    int p_lane = lane_last;
                    if (lane == l) {
                        float acc = running + scan - mine;
                        for (int e = 0; e < W; ++e) {
                            const float pe = comp(v, e);
                            if (pe > 0.0f) {
                                acc += pe;
                                if (acc > thr) { p_lane = base + e; break; }
                            }
                        }
                    }
                    pick = __shfl_sync(0xffffffffu, p_lane, l);
                } else {
                    pick = chunk_last;
                }
            } else {
                running += chunk;
                if (chunk_last >= 0) last_kept = chunk_last;
            }
        }
        if (pick < 0) pick = last_kept;
        if (lane == 0) sm.chosen = pick;
    }
    __syncthreads();
    if (threadIdx.x == 0) a.out[0] = sm.chosen;
}

// ---- argmax ------------------------------------------------------------------------------
__device__ __forceinline__ void argmax_take(float& best, int& best_id, float v, int id) {
    if (v > best || (v == best && id < best_id)) { best = v; best_id = id; }
}

// Block-level argmax of the slice [lo, hi) of a row into (best, best_id) of thread 0.
template <bool VEC>
__device__ __forceinline__ void argmax_slice(const float* row, int lo, int hi, float& best, int& best_id) {
    __shared__ float s_val[NW];
    __shared__ int s_id[NW];
    best = -INFINITY;
    best_id = INT_MAX;                           // NaN never compares: an all-NaN slice keeps this
    for_each_batched<VEC, false>(row + lo, hi - lo, [&](int i, float4 v, int count) {
        for (int e = 0; e < count; ++e) argmax_take(best, best_id, comp(v, e), lo + i + e);
    });
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
        argmax_take(best, best_id, ov, oi);
    }
    if ((threadIdx.x & 31) == 0) { s_val[threadIdx.x >> 5] = best; s_id[threadIdx.x >> 5] = best_id; }
    __syncthreads();
    if (threadIdx.x < 32) {
        best = s_val[threadIdx.x];
        best_id = s_id[threadIdx.x];
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
            argmax_take(best, best_id, ov, oi);
        }
    }
}

template <bool VEC>
__global__ void __launch_bounds__(ST) argmax_kernel(int32_t* out, const float* __restrict__ logits, int n_vocab) {
    float best;
    int best_id;
    argmax_slice<VEC>(logits + (size_t)blockIdx.x * n_vocab, 0, n_vocab, best, best_id);
    if (threadIdx.x == 0) out[blockIdx.x] = best_id == INT_MAX ? -1 : best_id;
}

// Long rows on sm_90: a cluster of ARGMAX_CLUSTER blocks per row (one row's logits are read by 8 SMs
// instead of 1: the single-block kernel takes ~14 us for Qwen's 151936 logits, bound by one SM's
// loads). Block r of a cluster reduces the r-th slice (a multiple of 4 elements); block 0 merges
// the slices' winners through distributed shared memory.
constexpr int ARGMAX_CLUSTER = 8;
constexpr int ARGMAX_CLUSTER_MIN_VOCAB = 16384;

template <bool VEC>
__global__ void __launch_bounds__(ST) argmax_cluster_kernel(int32_t* out, const float* __restrict__ logits,
                                                            int n_vocab) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    __shared__ float c_val;
    __shared__ int c_id;
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int r = blockIdx.x / ARGMAX_CLUSTER;
    const int per = ((n_vocab + ARGMAX_CLUSTER - 1) / ARGMAX_CLUSTER + 3) & ~3;
    const int lo = min(n_vocab, rank * per), hi = min(n_vocab, lo + per);
    float best;
    int best_id;
    argmax_slice<VEC>(logits + (size_t)r * n_vocab, lo, hi, best, best_id);
    if (threadIdx.x == 0) { c_val = best; c_id = best_id; }
    cluster.sync();                              // every slice's winner is in its block's shared memory
    if (rank == 0 && threadIdx.x < 32) {
        best = -INFINITY;
        best_id = INT_MAX;
        if (threadIdx.x < ARGMAX_CLUSTER) {
            best = *cluster.map_shared_rank(&c_val, threadIdx.x);
            best_id = *cluster.map_shared_rank(&c_id, threadIdx.x);
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
            argmax_take(best, best_id, ov, oi);
        }
        if (threadIdx.x == 0) out[r] = best_id == INT_MAX ? -1 : best_id;
    }
    cluster.sync();                              // no block exits while block 0 may still read it
#endif
}

template <bool VEC>
int launch_argmax(int32_t* out, const float* logits, int n_rows, int n_vocab, cudaStream_t s) {
#if FD_HAS_MMA
    int device = 0, major = 0;
    if (n_vocab >= ARGMAX_CLUSTER_MIN_VOCAB && cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(n_rows * ARGMAX_CLUSTER);
        cfg.blockDim = dim3(ST);
        cfg.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = ARGMAX_CLUSTER;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        return (int)cudaLaunchKernelEx(&cfg, argmax_cluster_kernel<VEC>, out, logits, n_vocab);
    }
#endif
    argmax_kernel<VEC><<<n_rows, ST, 0, s>>>(out, logits, n_vocab);
    return FD_LAUNCH_STATUS();
}

__global__ void decode_advance_kernel(const int32_t* token, int32_t* history, int32_t* n_history, int32_t* ring,
                                      int ring_len, int32_t* step, int32_t* positions, int32_t* n_past) {
    const int32_t t = token[0];
    history[n_history[0]] = t;
    n_history[0] += 1;
    const int32_t s = step[0];
    ring[((s % ring_len) + ring_len) % ring_len] = t;
    step[0] = s + 1;
    positions[0] += 1;
    n_past[0] += 1;
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

extern "C" {

int fd_argmax(int32_t* out, const float* logits, int n_rows, int n_vocab, void* stream) {
    FD_CHECK_ARG(out && logits && n_rows >= 0 && n_vocab > 0);
    if (n_rows == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (n_vocab % 4 == 0 && ((uintptr_t)logits & 15u) == 0) return launch_argmax<true>(out, logits, n_rows, n_vocab, s);
    return launch_argmax<false>(out, logits, n_rows, n_vocab, s);
}

size_t fd_sample_workspace_bytes(int n_vocab) {
    if (n_vocab <= 0) return 0;
    const size_t n = align_up((size_t)n_vocab, 64);    // each array 256-byte aligned
    return n * (sizeof(float) + 2 * sizeof(int32_t));
}

int fd_sample(int32_t* out, const float* logits, int n_vocab, const int32_t* history, const int32_t* n_history,
              int repeat_last_n, float repeat_penalty, float frequency_penalty, float presence_penalty,
              float temperature, int top_k, float top_p, float min_p, uint64_t seed, const int32_t* step,
              void* workspace, void* stream) {
    FD_CHECK_ARG(out && logits && step && workspace);
    FD_CHECK_ARG(n_vocab > 0 && n_vocab <= MAX_VOCAB);
    FD_CHECK_ARG(temperature > 0.0f && isfinite(temperature));
    FD_CHECK_ARG(top_k >= 0 && top_p > 0.0f && top_p <= 1.0f && min_p >= 0.0f && min_p < 1.0f);
    FD_CHECK_ARG(repeat_last_n >= 0 && repeat_penalty > 0.0f);
    FD_CHECK_ARG(((uintptr_t)workspace & 15u) == 0);
    const bool penalties = repeat_last_n > 0 &&
                           (repeat_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f);
    FD_CHECK_ARG(!penalties || (history && n_history));

    SampleArgs a;
    a.out = out;
    a.logits = logits;
    a.n_vocab = n_vocab;
    a.history = history;
    a.n_history = n_history;
    a.repeat_last_n = repeat_last_n;
    a.repeat_penalty = repeat_penalty;
    a.frequency_penalty = frequency_penalty;
    a.presence_penalty = presence_penalty;
    a.penalties = penalties ? 1 : 0;
    a.log2e_over_t = (float)(1.4426950408889634 / (double)temperature);
    a.top_k = (top_k > 0 && top_k < n_vocab) ? top_k : 0;
    a.top_p = top_p;
    a.min_p = min_p;
    a.seed = seed;
    a.step = step;
    const size_t n = align_up((size_t)n_vocab, 64);
    a.x = (float*)workspace;
    a.count = (int32_t*)((char*)workspace + n * sizeof(float));
    a.slot = a.count + n;

    cudaStream_t s = (cudaStream_t)stream;
    const size_t smem = sizeof(Smem);
    if (n_vocab % 4 == 0 && ((uintptr_t)logits & 15u) == 0) {
        cudaFuncSetAttribute(sample_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        sample_kernel<true><<<1, ST, smem, s>>>(a);
    } else {
        cudaFuncSetAttribute(sample_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        sample_kernel<false><<<1, ST, smem, s>>>(a);
    }
    return FD_LAUNCH_STATUS();
}

int fd_decode_advance(const int32_t* token, int32_t* history, int32_t* n_history, int32_t* ring, int ring_len,
                      int32_t* step, int32_t* positions, int32_t* n_past, void* stream) {
    FD_CHECK_ARG(token && history && n_history && ring && step && positions && n_past && ring_len > 0);
    decode_advance_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(token, history, n_history, ring, ring_len, step,
                                                              positions, n_past);
    return FD_LAUNCH_STATUS();
}

}  // extern "C"
