// attention_splitk_rope_rot.cuh -- fd_attention_decode_rope's staging when K is quantized (q8_0 / q4_0), i.e. K
// holds Hadamard-rotated keys (kv_rotate.cuh) and q must be rotated alike. The result is bit for bit what
// fd_rope_kv_write computes (the same rope_math.cuh arithmetic, the same rotation order, ggml's encoder rounding),
// but laid out so that no q value crosses a warp:
//
//   q      warp w owns query rows w * RPW .. w * RPW + RPW - 1 of the tile (RPW = ROWS / WARPS); lane l holds
//          dims 32 r + l (r < NR = HD / 32) of each: qv[i * NR + r] = row w * RPW + i, dim 32 r + l. That is
//          kv_rotate.cuh's register layout, so the RoPE'd row is rotated in registers by shuffles (no shared
//          memory round trip, no barrier per stage).
//   cos/sin one table per block in shared memory (rope_dim / 2 pairs, one double pow + sincos per pair, as the
//          float16 path computes one per dim; before pdl_wait, as that path's): the only barrier. It lives in the dequantized K | V tile at the
//          start of the pipeline area, which the cp.async ring never writes and the main loop first writes
//          after its first __syncthreads (so no thread can still be reading the table).
//   new row (the block that owns the new key) its loads are issued with q's (load_new_row), then
//          the K warps (the second half, SIDE_WARPS) each form the RoPE'd K row in registers, subtract the key
//          offset (p.k_offset, if any: flashd_attention.h) and rotate it, and each encodes its share of the
//          32-value blocks as a warp (kv_quant.cuh encode_block_warp: max by shuffles, a code per lane); the V
//          warps do the same for the V row (no rotation; a float16 V is rounded). The values
//          the tiles will hold (float16(d * q) or float16(x)) go to kv_new, read only after the main loop's
//          first __syncthreads; the codes and scales (store) go to the cache at slot n_past.
#pragma once

#include "attention_splitk_params.cuh"
#include "kv_quant.cuh"
#include "attention_splitk_qfrag.cuh"
#include "kv_rotate.cuh"
#include "rope_math.cuh"

namespace fd {
namespace attn {

// The new row's value at dim d as its tile holds it: with a window ring (p.k_ring / p.v_ring: the new key always lies
// in its own window block) float16(x), the copy fd_rope_kv_write puts in the ring -- also written there if store --,
// else `as_stored` (the dequantized code, or a float16 side's value).
// ring_row: the new row's ring row, kv_head * ring_slots + n_past % ring_slots (window_ring_row, once per block).
template <int HD>
__device__ __forceinline__ __half window_value(const __half* ring, size_t ring_row, int d, float x, __half as_stored,
                                               bool store) {
    if (ring == nullptr) return as_stored;
    const __half h = __float2half_rn(x);
    if (store) const_cast<__half*>(ring)[ring_row * HD + d] = h;
    return h;
}

__device__ __forceinline__ size_t window_ring_row(const Params& p, int kvh, int slot) {
    return p.ring_slots > 0 ? (size_t)kvh * p.ring_slots + slot % p.ring_slots : 0;
}

template <int HD>
struct RotLayout {
    static constexpr int NR = HD / 32;            // registers per row (values per lane)
    static constexpr int RPW = ROWS / WARPS;      // query rows per warp
    static_assert(RPW * NR == ROWS * HD / THREADS, "the rotated layout holds a thread's qv");
};

// Element j of a thread's qv in the rotated layout: tile row r, dim d.
template <int HD>
__device__ __forceinline__ void rot_elem(int j, int tid, int& r, int& d) {
    r = (tid >> 5) * RotLayout<HD>::RPW + j / RotLayout<HD>::NR;
    d = 32 * (j % RotLayout<HD>::NR) + (tid & 31);
}

// Dim d of a row after RoPE, from its loaded values xd = x[d] and xp = x[partner of d] (unused past rope_dim),
// cos / sin from the table (cs[j], sn[j] of pair j).
__device__ __forceinline__ float rope_from_table(float xd, float xp, int d, int rope_dim, bool neox, const float* cs,
                                                 const float* sn) {
    if (d >= rope_dim) return xd;
    int j, partner;
    bool first;
    rope_pair_of(d, rope_dim, neox, j, partner, first);
    return rope_rotated(xd, xp, cs[j], sn[j], first);
}

// The new row's side of a warp: warps [0, SIDE_WARPS) form the V row, warps [SIDE_WARPS, WARPS) the K row, and warp
// part (its index within its side) encodes blocks [part NR / SIDE_WARPS, + NR / SIDE_WARPS) of it: the encoders (a
// max by shuffles, two IEEE divisions, a code per lane) run on every warp instead of two, in half the sequence. Each
// block is encoded and stored by one warp; the K warps each form the whole rotated row (its Hadamard rotation mixes
// all of it), the same instructions on the same values. K (RoPE + rotation + encode) is the longer side, so it goes
// to the last warps, whose q rows are the ones past a small GQA group (all zeros, not rotated: 1.5B's group of 6
// leaves warps 2 and 3 none).
constexpr int SIDE_WARPS = WARPS / 2;
static_assert(WARPS % 2 == 0, "K and V sides of equal size");

// The new row's loads of a K warp (x[d], x[partner], the key offset) or a V warp (v[d]), lane's dims 32 r + lane:
// issued with q's, before the table's barrier, so their global round trip overlaps q's (they used to start after
// q's rotation). Only the block that owns the new key loads.
template <int NR>
struct NewRowLoads {
    float x[NR], y[NR], off[NR];
};

template <int NR>
__device__ __forceinline__ void load_new_row(const Params& p, int kvh, int warp, int lane, bool own_key,
                                             NewRowLoads<NR>& ld) {
    constexpr int HD = 32 * NR;
    if (!own_key) return;
    const bool neox = p.neox != 0;
    if (warp >= SIDE_WARPS) {
        const float* kr = p.k_new + (size_t)kvh * HD;
        const float* c = p.k_offset != nullptr ? p.k_offset + (size_t)kvh * HD : nullptr;
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            const int d = 32 * r + lane;
            int j, partner;
            bool first;
            ld.x[r] = __ldg(kr + d);
            ld.y[r] = 0.0f;
            if (d < p.rope_dim) {
                rope_pair_of(d, p.rope_dim, neox, j, partner, first);
                ld.y[r] = __ldg(kr + partner);
            }
            ld.off[r] = c != nullptr ? __ldg(c + d) : 0.0f;
        }
    } else {
        const float* vr = p.v_new + (size_t)kvh * HD;
#pragma unroll
        for (int r = 0; r < NR; ++r) ld.x[r] = __ldg(vr + 32 * r + lane);
    }
}

// The cos / sin table (tab: >= rope_dim floats of shared memory, see above): cs = tab[0, rope_dim / 2), sn after.
// Called before pdl_wait (splitk_kernel: the position is an earlier step's), so its double pow + sincos run under
// the QKV projection's tail as the float16 path's rope_coefs do; rope_stage_rotated's barrier publishes it.
__device__ __forceinline__ void rope_table_rotated(const Params& p, float* tab, int tid) {
    const int half = p.rope_dim / 2;
    for (int j = tid; j < half; j += THREADS)
        rope_cos_sin(p.positions[0], j, p.rope_dim, p.theta, p.rope_scaling, tab[j], tab[half + j]);
}

// qv <- the tile's q rows RoPE'd and rotated (rotated layout; rows past the group exactly 0); if own_key, the new
// K | V rows are encoded into kv_new (2 HD halves; RAW: their codes and scales, laid out as raw_new_v says) and,
// if store, the cache. tab: rope_table_rotated's table, written by this block before (its barrier is here).
// Block-uniform: every thread calls it.
template <int HD, bool RAW = false>
__device__ __forceinline__ void rope_stage_rotated(const Params& p, float (&qv)[ROWS * HD / THREADS],
                                                   const float* q_tok, int row0, int kvh, int tid, bool own_key,
                                                   __half* kv_new, bool store, const float* tab, int k_type,
                                                   int v_type) {
    constexpr int NR = RotLayout<HD>::NR, RPW = RotLayout<HD>::RPW, Q_PER_THREAD = ROWS * HD / THREADS;
    const bool neox = p.neox != 0;
    const int half = p.rope_dim / 2, lane = tid & 31, warp = tid >> 5, block = kvq::rotation_block(HD);
    const float* cs = tab;
    const float* sn = tab + half;
    float xv[Q_PER_THREAD], yv[Q_PER_THREAD];
    NewRowLoads<NR> ld;
    load_new_row<NR>(p, kvh, warp, lane, own_key, ld);
#pragma unroll
    for (int j = 0; j < Q_PER_THREAD; ++j) {            // all loads first (they overlap the table's barrier)
        int r, d, pj, partner;
        bool first;
        rot_elem<HD>(j, tid, r, d);
        const bool in = row0 + r < p.group, rot = d < p.rope_dim;
        const float* row = q_tok + (size_t)(row0 + r) * HD;
        if (rot) rope_pair_of(d, p.rope_dim, neox, pj, partner, first);
        xv[j] = in ? __ldg(row + d) : 0.0f;
        yv[j] = in && rot ? __ldg(row + partner) : 0.0f;
    }
    __syncthreads();                                    // the cos / sin table is complete
#pragma unroll
    for (int j = 0; j < Q_PER_THREAD; ++j) {
        int r, d, pj, partner;
        bool first;
        rot_elem<HD>(j, tid, r, d);
        qv[j] = xv[j];
        if (d < p.rope_dim && row0 + r < p.group) {
            rope_pair_of(d, p.rope_dim, neox, pj, partner, first);
            qv[j] = rope_rotated(xv[j], yv[j], cs[pj], sn[pj], first);
        }
    }
#pragma unroll
    for (int i = 0; i < RPW; ++i) {                     // each row of the warp: RoPE'd -> rotated, in registers
        if (row0 + warp * RPW + i >= p.group) break;     // (warp-uniform) rows past the group: +0.0, rotated or not
        float x[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) x[r] = qv[i * NR + r];
        kvq::hadamard_rotate<NR>(x, NR, block, lane);
#pragma unroll
        for (int r = 0; r < NR; ++r) qv[i * NR + r] = x[r];
    }
    if (!own_key) return;
    static_assert(NR % SIDE_WARPS == 0, "a side's blocks split evenly over its warps");
    constexpr int NB = NR / SIDE_WARPS;                 // blocks a warp encodes
    const int part = warp % SIDE_WARPS;                 // this warp's blocks: r / NB == part (r unrolled: registers)
    const int slot = p.n_past[0];
    const size_t row = (size_t)kvh * p.max_ctx + slot;
    const size_t ring_row = RAW ? 0 : window_ring_row(p, kvh, slot);
    uint8_t* raw = reinterpret_cast<uint8_t*>(kv_new);
    const int kcb = kvq::code_bytes(k_type, HD), vcb = kvq::code_bytes(v_type, HD), vo = raw_new_v(HD, k_type);
    const kvq::Plane k_copy{raw, reinterpret_cast<__half*>(raw + kcb), kcb, HD / kvq::BLOCK};
    const kvq::Plane v_copy{raw + vo, reinterpret_cast<__half*>(raw + vo + vcb), vcb, HD / kvq::BLOCK};
    float x[NR];
    if (warp >= SIDE_WARPS) {                           // K: RoPE, rotate, encode (kv_rotate.cuh, kv_quant.cuh)
#pragma unroll
        for (int r = 0; r < NR; ++r) x[r] = rope_from_table(ld.x[r], ld.y[r], 32 * r + lane, p.rope_dim, neox, cs, sn);
        if (p.k_offset != nullptr) {                    // the key offset, as fd_rope_kv_write subtracts it
#pragma unroll
            for (int r = 0; r < NR; ++r) x[r] = __fsub_rn(x[r], ld.off[r]);
        }
        kvq::hadamard_rotate<NR>(x, NR, block, lane);
#pragma unroll
        for (int r = 0; r < NR; ++r)
            if (r / NB == part) {
                const __half v = kvq::encode_block_warp(p.kq, p.k_store + row * HD, k_type, row, r, x[r], lane, store,
                                                        RAW ? &k_copy : nullptr);
                if constexpr (!RAW)
                    kv_new[32 * r + lane] = window_value<HD>(p.k_ring, ring_row, 32 * r + lane, x[r], v, store);
            }
    } else {                                            // V: as it is (float16 or q8_0 / q4_0)
#pragma unroll
        for (int r = 0; r < NR; ++r)
            if (r / NB == part) {
                const __half v = kvq::encode_block_warp(p.vq, p.v_store + row * HD, v_type, row, r, ld.x[r], lane,
                                                        store, RAW ? &v_copy : nullptr);
                if constexpr (!RAW)
                    kv_new[HD + 32 * r + lane] = window_value<HD>(p.v_ring, ring_row, 32 * r + lane, ld.x[r], v, store);
            }
    }
}

}  // namespace attn
}  // namespace fd
