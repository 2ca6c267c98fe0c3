// sampling_sample.cuh -- fd_sample's kernel (sampling.cu launches it): penalties, temperature, top_k,
// top_p, min_p and the seeded draw in one block.
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
#pragma once

#include "sampling_select.cuh"

namespace {

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

}  // namespace
