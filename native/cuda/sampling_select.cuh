// sampling_select.cuh -- exact threshold selection for fd_sample (sampling_sample.cuh), without sorting:
// radix selection on the float bits (3 digit levels of 11/11/10 bits over a shared-memory histogram) of
// either a candidate list in shared memory or a whole float array in global memory, by count (the k-th
// largest: top_k) or by probability mass in 64-bit fixed point (p * 2^40, truncated: top_p), so atomic
// order never changes a result; the candidate lists (collect: warp-aggregated appends, CAND_CAP
// entries), the fd_sample block's shared memory (Smem) and its fixed-order block reductions.
#pragma once

#include "sampling_common.cuh"

namespace {

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

}  // namespace
