// forward_attention.cuh -- attention inside the persistent forward (forward.cu): one work item is one
// (token, KV head, head tile, split) and is run by a whole CTA, over the float16 KV cache
// [n_kv_heads][max_ctx][head_dim] of one layer.
//
// Rope and the cache write come first, in the item itself: its warps rotate this launch's K rows of its KV
// head (forward_rope.cuh) and store them with the V rows as float16 at slots n_past + row0 + j, then rotate
// its q tile into shared memory. Every item of a KV head writes the same bytes to the same slots, and reads
// them only after its own write (__syncthreads), so no item waits for another: the rope needs no stage.
//
// Keys: token t (global row r = row0 + t) sees a virtual sequence v = 0 .. L-1 of keys: decode mode
// (mask == null) the slots [0, n_past + r]; masked mode the committed slots [0, n_past) and then the new
// slots n_past + j with mask[r, j] != 0, j ascending (its tree path). The sequence is cut into chunks of
// FA_CHUNK keys; split s takes chunks s, s + n_splits, ... (n_splits is fixed by the plan: it depends on
// max_ctx, never on n or the mask).
//
// Inside an item a chunk is cut into FA_GROUPS fixed key groups of FA_KPG consecutive keys; group gk keeps
// its own online-softmax state (running max m, sum l, unnormalised o) over every chunk of the split, for
// each query head of the tile. Warps take groups gk = warp, warp + n_warps, ... (a warp that takes two
// runs them one after the other); the groups' states then meet in shared memory in group order, and the
// splits' partials are combined in split order by the item that finishes last (a counter per (token, KV
// head, tile)). Every reduction order is a function of (token, key sequence, n_splits) alone, so a tree
// row's output is bitwise the decode step's at its position, whatever n, the warp count or the schedule.
//
// Lane math: lane l holds dims [l * HD / 32, (l + 1) * HD / 32) of q, K and V (one 4, 8 or 16-byte load
// per key row); q . k is a per-lane partial sum reduced with xor shuffles; softmax in the log2 domain
// (q pre-scaled by scale * log2 e). K and V are float16 as stored; products and sums are float32.
//
// A row that sees no key (masked mode, n_past 0, an empty mask row) comes out NaN, like the reference.
#pragma once

#include "common.cuh"
#include "forward_rope.cuh"

namespace fd {
namespace fwd {

constexpr int FA_CHUNK = 64;                    // keys per chunk of the virtual sequence
constexpr int FA_GROUPS = 16;                   // fixed key groups per chunk
constexpr int FA_KPG = FA_CHUNK / FA_GROUPS;    // keys per group (4)
constexpr int FA_MAX_HT = 8;                    // query heads per item (head tile)
constexpr int FA_MAX_MASK = 256;                // masked mode: new tokens a mask row may list

__host__ __device__ constexpr int fa_head_tile(int group, int head_dim) {
    return group < (head_dim > 128 ? 4 : FA_MAX_HT) ? group : (head_dim > 128 ? 4 : FA_MAX_HT);
}

struct AttnArgs {
    const float* q;             // (n, n_heads, HD) float32, as projected (rotated here)
    const float* k;             // (n, n_kv, HD), as projected
    const float* v;             // (n, n_kv, HD)
    const float* q_norm;        // qwen3 per-head RMSNorm weights (HD,), or null
    const float* k_norm;
    RopeShape rope;
    __half* k_cache;            // this layer's [n_kv_heads][max_ctx][HD]
    __half* v_cache;
    float* o;                   // (n, n_heads * HD)
    float* part;                // partials [n * n_heads][n_splits][HD + 2]: acc[HD], m, l
    unsigned* cnt;              // [n * n_kv * n_htiles] splits done (reset by the combiner)
    const int32_t* n_past;
    const uint8_t* mask;        // (mask_n, mask_n) or null
    int mask_n, row0;
    int n_heads, n_kv, group, ht, n_htiles, max_ctx, n_splits;
    float q_scale;              // scale * log2(e)
};

// shared memory of an item: q tile | key list | group states | a flag
template <int HD>
__host__ __device__ constexpr int fa_smem_bytes(int ht) {
    return 4 * (ht * HD + FA_MAX_MASK + FA_GROUPS * ht * (HD + 2) + 4);
}

// Number of visible keys of global row r; in masked mode list[k] (shared) = the k-th visible new slot's
// offset j. All threads call it; ends with __syncthreads (the list is then readable).
__device__ __forceinline__ int fa_visible(const AttnArgs& a, int r, int n_past, int* list, int* flag) {
    if (a.mask == nullptr) return min(n_past + r + 1, a.max_ctx);
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const uint8_t* row = a.mask + (size_t)r * a.mask_n;
        int count = 0;
        for (int j0 = 0; j0 < a.mask_n; j0 += 32) {
            const bool on = j0 + lane < a.mask_n && row[j0 + lane] != 0;
            const unsigned bits = __ballot_sync(0xffffffffu, on);
            if (on) list[count + __popc(bits & ((1u << lane) - 1u))] = j0 + lane;
            count += __popc(bits);
        }
        if (lane == 0) *flag = count;
    }
    __syncthreads();
    return min(n_past + *flag, a.max_ctx);
}

template <int HD>
struct KeyPiece {   // a lane's HD / 32 halves of one K or V row
    static constexpr int H = HD / 32;
    uint32_t w[H / 2];
    __device__ __forceinline__ void load(const __half* row, int lane, bool valid) {
        const uint32_t* p = reinterpret_cast<const uint32_t*>(row + lane * H);
        if constexpr (H == 8) {
            const uint4 v = valid ? __ldcg(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
            w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
        } else if constexpr (H == 4) {
            const uint2 v = valid ? __ldcg(reinterpret_cast<const uint2*>(p)) : make_uint2(0, 0);
            w[0] = v.x; w[1] = v.y;
        } else {
            w[0] = valid ? __ldcg(reinterpret_cast<const unsigned int*>(p)) : 0u;
        }
    }
    __device__ __forceinline__ float at(int e) const {
        const __half2 h = *reinterpret_cast<const __half2*>(&w[e >> 1]);
        return (e & 1) ? __high2float(h) : __low2float(h);
    }
};

// One item. CTA-uniform control flow (every thread calls it). Returns after the item's output or partial
// (and, for the last split of a row, the combine) is written.
template <int HD>
__device__ __noinline__ void attention_item(const AttnArgs& a, int item, float* sm) {
    constexpr int H = HD / 32;
    constexpr int HTM = fa_head_tile(FA_MAX_HT, HD);        // register arrays: heads of a tile at most
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_warps = blockDim.x >> 5;
    const int HT = a.ht;
    float* q_s = sm;                                        // [HT][HD]
    int* list = reinterpret_cast<int*>(q_s + HT * HD);      // [FA_MAX_MASK]
    float* g_s = reinterpret_cast<float*>(list + FA_MAX_MASK);   // [FA_GROUPS][HT][HD + 2]
    int* flag = reinterpret_cast<int*>(g_s + FA_GROUPS * HT * (HD + 2));

    const int split = item % a.n_splits;
    int rest = item / a.n_splits;
    const int htile = rest % a.n_htiles;
    rest /= a.n_htiles;
    const int kvh = rest % a.n_kv;
    const int t = rest / a.n_kv;
    const int r = a.row0 + t;
    const int n_past = max(__ldcg(a.n_past), 0);
    // this launch's K/V rows of this KV head into the cache: every item of the head (also one with no key to
    // read) writes the same bytes, and reads them only after its own write
    for (int j = warp; j < a.rope.n; j += n_warps) {
        const int slot = n_past + a.row0 + j;
        const size_t row = (size_t)j * a.n_kv + kvh;
        __half* kd = a.k_cache + ((size_t)kvh * a.max_ctx + slot) * HD;
        __half* vd = a.v_cache + ((size_t)kvh * a.max_ctx + slot) * HD;
        const float* vs = a.v + row * HD;
        const bool store = slot < a.max_ctx;
        rope_row(a.rope, a.k + row * HD, a.k_norm, j, g_s + warp * HD, [&](int d, float y) {
            if (store) {
                kd[d] = __float2half_rn(y);
                vd[d] = __float2half_rn(__ldcg(vs + d));
            }
        });
    }
    const int L = fa_visible(a, r, n_past, list, flag);
    const int n_chunks = (L + FA_CHUNK - 1) / FA_CHUNK;
    const int n_active = min(a.n_splits, n_chunks);
    const int h0 = kvh * a.group + htile * HT;              // first query head of the tile
    const int n_h = min(HT, a.group - htile * HT);          // heads in this tile
    if (split >= n_chunks) {                                // no key of this split at this depth
        if (n_chunks == 0 && split == 0)                    // nothing visible at all: NaN rows
            for (int e = tid; e < n_h * HD; e += blockDim.x)
                a.o[((size_t)t * a.n_heads + h0 + e / HD) * HD + e % HD] = __int_as_float(0x7fffffff);
        __syncthreads();                                    // the list / flag area is reused next item
        return;
    }
    const int direct_end = a.mask == nullptr ? L : min(n_past, L);
    // the q tile, rotated and scaled (the group-state area is the warps' rope scratch until the keys)
    for (int g = warp; g < n_h; g += n_warps)
        rope_row(a.rope, a.q + ((size_t)t * a.n_heads + h0 + g) * HD, a.q_norm, t, g_s + warp * HD,
                 [&](int d, float y) { q_s[g * HD + d] = y * a.q_scale; });
    __syncthreads();

    const __half* kc = a.k_cache + (size_t)kvh * a.max_ctx * HD;
    const __half* vc = a.v_cache + (size_t)kvh * a.max_ctx * HD;
    for (int gk = warp; gk < FA_GROUPS; gk += n_warps) {
        float m[HTM], l[HTM], o[HTM][H];
#pragma unroll
        for (int g = 0; g < HTM; ++g) {
            m[g] = -INFINITY;
            l[g] = 0.0f;
#pragma unroll
            for (int e = 0; e < H; ++e) o[g][e] = 0.0f;
        }
        for (int c = split; c < n_chunks; c += a.n_splits) {
            const int v0 = c * FA_CHUNK + gk * FA_KPG;
            KeyPiece<HD> kp[FA_KPG], vp[FA_KPG];
            bool valid[FA_KPG];
#pragma unroll
            for (int kk = 0; kk < FA_KPG; ++kk) {
                const int v = v0 + kk;
                valid[kk] = v < L;
                const int slot = !valid[kk] ? 0 : v < direct_end ? v : n_past + list[v - n_past];
                kp[kk].load(kc + (size_t)slot * HD, lane, valid[kk]);
                vp[kk].load(vc + (size_t)slot * HD, lane, valid[kk]);
            }
#pragma unroll
            for (int g = 0; g < HTM; ++g) {
                if (g >= n_h) break;
                const float* qg = q_s + g * HD + lane * H;
                float s[FA_KPG];
#pragma unroll
                for (int kk = 0; kk < FA_KPG; ++kk) {
                    float d = 0.0f;
#pragma unroll
                    for (int e = 0; e < H; ++e) d = fmaf(qg[e], kp[kk].at(e), d);
                    d = warp_sum(d);
                    s[kk] = valid[kk] ? d : -INFINITY;
                }
                float mx = s[0];
#pragma unroll
                for (int kk = 1; kk < FA_KPG; ++kk) mx = fmaxf(mx, s[kk]);
                const float m_new = fmaxf(m[g], mx);
                if (m_new == -INFINITY) continue;           // nothing visible yet for this group
                const float alpha = exp2f(m[g] - m_new);    // m = -inf: 0
                float p[FA_KPG], psum = 0.0f;
#pragma unroll
                for (int kk = 0; kk < FA_KPG; ++kk) {
                    p[kk] = exp2f(s[kk] - m_new);
                    psum += p[kk];
                }
                l[g] = fmaf(l[g], alpha, psum);
#pragma unroll
                for (int e = 0; e < H; ++e) {
                    float acc = o[g][e] * alpha;
#pragma unroll
                    for (int kk = 0; kk < FA_KPG; ++kk) acc = fmaf(p[kk], vp[kk].at(e), acc);
                    o[g][e] = acc;
                }
                m[g] = m_new;
            }
        }
#pragma unroll
        for (int g = 0; g < HTM; ++g) {
            if (g >= n_h) break;
            float* st = g_s + ((size_t)gk * HT + g) * (HD + 2);
#pragma unroll
            for (int e = 0; e < H; ++e) st[lane * H + e] = o[g][e];
            if (lane == 0) {
                st[HD] = m[g];
                st[HD + 1] = l[g];
            }
        }
    }
    __syncthreads();

    // the groups' states, merged in group order: this split's (acc, m, l) per head
    for (int e = tid; e < n_h * HD; e += blockDim.x) {
        const int g = e / HD, d = e % HD;
        float M = -INFINITY;
        for (int gk = 0; gk < FA_GROUPS; ++gk) M = fmaxf(M, g_s[((size_t)gk * HT + g) * (HD + 2) + HD]);
        float acc = 0.0f, lsum = 0.0f;
        if (M != -INFINITY) {
            for (int gk = 0; gk < FA_GROUPS; ++gk) {
                const float* st = g_s + ((size_t)gk * HT + g) * (HD + 2);
                const float wt = exp2f(st[HD] - M);
                acc = fmaf(wt, st[d], acc);
                lsum = fmaf(wt, st[HD + 1], lsum);
            }
        }
        const size_t qrow = (size_t)t * a.n_heads + h0 + g;
        if (n_active == 1) {
            a.o[qrow * HD + d] = lsum > 0.0f ? acc / lsum : __int_as_float(0x7fffffff);
        } else {
            float* pp = a.part + (qrow * a.n_splits + split) * (HD + 2);
            pp[d] = acc;
            if (d == 0) {
                pp[HD] = M;
                pp[HD + 1] = lsum;
            }
        }
    }
    if (n_active == 1) {
        __syncthreads();
        return;
    }
    // the last split of this (token, KV head, tile) to finish combines all of them, in split order
    __syncthreads();
    unsigned* cnt = a.cnt + ((size_t)t * a.n_kv + kvh) * a.n_htiles + htile;
    if (tid == 0) {                          // acq_rel: publishes this split's partial, sees the others'
        unsigned old;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(cnt) : "memory");
#else
        __threadfence();
        old = atomicAdd(cnt, 1u);
        __threadfence();
#endif
        *flag = old == (unsigned)(n_active - 1);
    }
    __syncthreads();
    if (*flag) {
        for (int e = tid; e < n_h * HD; e += blockDim.x) {
            const int g = e / HD, d = e % HD;
            const size_t qrow = (size_t)t * a.n_heads + h0 + g;
            const float* pp = a.part + qrow * a.n_splits * (HD + 2);
            float M = -INFINITY;
            for (int s = 0; s < n_active; ++s) M = fmaxf(M, __ldcg(pp + (size_t)s * (HD + 2) + HD));
            float acc = 0.0f, lsum = 0.0f;
            if (M != -INFINITY) {
                for (int s = 0; s < n_active; ++s) {
                    const float* ps = pp + (size_t)s * (HD + 2);
                    const float wt = exp2f(__ldcg(ps + HD) - M);
                    acc = fmaf(wt, __ldcg(ps + d), acc);
                    lsum = fmaf(wt, __ldcg(ps + HD + 1), lsum);
                }
            }
            a.o[qrow * HD + d] = lsum > 0.0f ? acc / lsum : __int_as_float(0x7fffffff);
        }
        if (tid == 0) *cnt = 0u;                            // ready for the next layer (after barriers)
    }
    __syncthreads();
}

}  // namespace fwd
}  // namespace fd
