// attention_tile.cuh -- the key-tile loop of flash attention on tensor cores, shared by the causal
// prefill kernel (attention_prefill.cu) and the block-sparse one (attention_sparse.cu). The two
// differ only in which cache slots a tile holds and which keys a row may see; everything below is
// written once, so both kernels run the same instructions per tile.
//
// A warp owns 16 query rows, held as m16n8k16 fragments (mma.cuh: lane = 4g + t; a thread holds
// rows g and g + 8, index h = 0 / 1). Per 64-key tile (BKV) of which the warp takes KW keys:
//   - K and V tiles (64 x HD f16) arrive by cp.async through a STAGES-deep ring (kv_ring,
//     load_kv_tile); slots outside the visible range are zero-filled, never read unmasked; a quantized
//     K or V arrives as stored through a raw ring and is dequantized into float16 tiles (kv_ring_raw);
//   - S = Q K^T: Q fragments (f32 rounded to f16) stay in registers for the whole loop, K fragments
//     by ldmatrix (K rows are the mma's "col" B operand as stored);
//   - scale * log2(e) applied in f32; masked keys (the caller's predicate, only on tiles the caller
//     says can hold one) become -inf;
//   - online softmax in f32 with exp2; a row that has seen only masked keys keeps m = -inf and
//     uses 0 as its reference so that no inf - inf appears;
//   - O += P V with P rounded to f16: the S accumulator fragments are exactly the A fragments of
//     the PV mma, V fragments by ldmatrix.trans.
// Shared K/V rows are HD + 8 halves apart (KV_LD) so ldmatrix phases are bank-conflict free.
// tests/emulation/test_flash_tiling.py emulates the fragment and address formulas used here.
#pragma once

#include "kv_quant.cuh"
#include "mma.cuh"

namespace fd {
namespace flash {

constexpr int BKV = 64;                        // keys per tile
constexpr float LOG2E = 1.4426950408889634f;   // callers pass scale * LOG2E: the softmax runs in exp2
template <int HD>
constexpr int KV_LD = HD + 8;                  // halves per shared K/V row
template <int HD>
constexpr int KV_TILE_HALVES = BKV * KV_LD<HD>;

}  // namespace flash
}  // namespace fd

#if FD_HAS_MMA   // the device code needs mma.sync (sm_80); HIP builds and older targets leave it out

namespace fd {
namespace flash {

// Q fragments (A operand, f16) of row g + 8h from its f32 row: a[h] cols 2t, 2t+1; a[2 + h] cols 2t+8, 2t+9.
template <int HD>
__device__ __forceinline__ void load_q_row(uint32_t (&qf)[HD / 16][4], const float* q_row, int h, int t) {
    using namespace fd::mma;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        const float2 lo = *reinterpret_cast<const float2*>(q_row + kk * 16 + 2 * t);
        const float2 hi = *reinterpret_cast<const float2*>(q_row + kk * 16 + 8 + 2 * t);
        qf[kk][h] = pack_half2(lo.x, lo.y);
        qf[kk][2 + h] = pack_half2(hi.x, hi.y);
    }
}

// Q in shared memory instead of registers (attention_prefill.cu at HD 256, where the HD / 16 x 4 fragment
// registers next to o_acc's HD / 8 x 4 floats would spill): row r of q_tile (KV_LD<HD> halves apart) holds the
// f32 row rounded to f16 exactly as load_q_row rounds it, so qk_tile_smem's A fragments -- ldmatrix.x4 of rows
// 0-7 | 8-15 x cols 0-7 | 8-15 of the 16-column slice -- are load_q_row's bit for bit: r[h] = row g + 8h cols
// 2t, 2t+1; r[2 + h] = the same row, cols 2t + 8, 2t + 9. Thread c of n_threads writes columns pairs
// c, c + n_threads, ... of the row (float2 loads).
template <int HD, int N_THREADS>
__device__ __forceinline__ void store_q_row(__half* q_tile_row, const float* q_row, int tid_in_row) {
    using namespace fd::mma;
#pragma unroll
    for (int c = tid_in_row; c < HD / 2; c += N_THREADS) {
        const float2 v = *reinterpret_cast<const float2*>(q_row + 2 * c);
        *reinterpret_cast<uint32_t*>(q_tile_row + 2 * c) = pack_half2(v.x, v.y);
    }
}

// Stage one K/V tile of BK keys into ring slot `stage` (slots BK * KV_LD<HD> halves apart): tile row r is
// cache slot base + r of kv head kvh; a row whose slot is at or past kv_len (or, with DROP_NEGATIVE, below 0)
// is zero-filled without reading the cache.
template <int HD, int N_THREADS, bool DROP_NEGATIVE, int BK = BKV>
__device__ __forceinline__ void load_kv_tile(__half* k_smem, __half* v_smem, int stage,
                                             const __half* __restrict__ k_cache, const __half* __restrict__ v_cache,
                                             int kvh, int max_ctx, int base, int kv_len, int tid) {
    using namespace fd::mma;
    constexpr int chunks = BK * (HD / 8) / N_THREADS;    // 16 B chunks per thread per tile
    static_assert(BK * (HD / 8) % N_THREADS == 0, "K/V tile must split evenly over threads");
#pragma unroll
    for (int i = 0; i < chunks; ++i) {
        const int c = tid + i * N_THREADS;
        const int row = c / (HD / 8), col = (c % (HD / 8)) * 8;
        const int slot = base + row;
        const bool ok = (!DROP_NEGATIVE || slot >= 0) && slot < kv_len;
        const size_t off = ((size_t)kvh * max_ctx + slot) * HD + col;
        const int s_off = stage * BK * KV_LD<HD> + row * KV_LD<HD> + col;
        cp_async_16(smem_u32(k_smem + s_off), ok ? k_cache + off : k_cache, ok);
        cp_async_16(smem_u32(v_smem + s_off), ok ? v_cache + off : v_cache, ok);
    }
}

// ---- a window's float16 rows (attention_prefill.cu's WIN kernel; flashd_attention.h) ---------
// One side as a window tile reads it: a quantized side's ring (ring > 0: slot s in row s % ring of head_rows = ring
// rows per KV head), or a float16 side's cache (ring 0, head_rows = max_ctx).
struct WinSide {
    const __half* rows;
    int head_rows, ring;
};

// load_kv_tile over the window's rows: tile rows base .. base + BK - 1 (cache slots) of kv head kvh into stage
// `stage`; rows at or past kv_len zero-filled.
template <int HD, int N_THREADS, int BK>
__device__ __forceinline__ void load_window_tile(__half* k_smem, __half* v_smem, int stage, const WinSide& wk,
                                                 const WinSide& wv, int kvh, int base, int kv_len, int tid) {
    using namespace fd::mma;
    constexpr int chunks = BK * (HD / 8) / N_THREADS;    // 16 B chunks per thread per tile and side
    static_assert(BK * (HD / 8) % N_THREADS == 0, "K/V tile must split evenly over threads");
#pragma unroll
    for (int i = 0; i < chunks; ++i) {
        const int c = tid + i * N_THREADS;
        const int row = c / (HD / 8), col = (c % (HD / 8)) * 8;
        const int slot = base + row;
        const bool ok = slot < kv_len;
        const int s_off = stage * BK * KV_LD<HD> + row * KV_LD<HD> + col;
        const size_t k_off = ((size_t)kvh * wk.head_rows + (wk.ring ? slot % wk.ring : slot)) * HD + col;
        const size_t v_off = ((size_t)kvh * wv.head_rows + (wv.ring ? slot % wv.ring : slot)) * HD + col;
        cp_async_16(smem_u32(k_smem + s_off), ok ? wk.rows + k_off : wk.rows, ok);
        cp_async_16(smem_u32(v_smem + s_off), ok ? wv.rows + v_off : wv.rows, ok);
    }
}

// ---- quantized rows (attention_prefill.cu's QKV kernel) ------------------------------------
// A K or V that is q8_0 / q4_0 (kv_quant.cuh) is staged as stored into a raw ring by cp.async and
// dequantized from shared memory into a double-buffered float16 tile (kv_ring_raw below), so the copies of
// later tiles are in flight while a tile is attended, as on the float16 path. A raw stage is the K side, then
// the V side; a side is codes [BK][cb] bytes then the float16 scales [BK][HD / 32] (q8_0: cb = HD, q4_0:
// HD / 2), or a float16 side's rows [BK][2 HD] bytes (kvq::staged_row_bytes each row), BK keys a tile (BKV
// unless the caller says; attention_prefill.cu takes 32 at HD 256 where shared memory is short). Every part
// starts 16-byte aligned (cb, 2 HD and BK * HD / 16 are multiples of 16).

// One side of tile rows base .. base + BK - 1 (cache slots of kv head row head_row = kvh * max_ctx) into dst:
// chunk c (c < BK * CC, c = tid + k N_THREADS) is row c / CC, 16 bytes at c % CC of the row's CC * 16 bytes,
// to dst + 16 c; then (SB > 0) row r's SB scale bytes to dst + BK * CC * 16 + SB r (one cp.async.ca each:
// 4, 8 or 16 bytes at HD 64, 128 or 256, aligned to that in the plane). Rows at or past kv_len: zero-filled, except
// q4_0's codes (Q4), stored as 0x88 (code 8, value +0.0; zeros would be code 0 -> -8 * 0.0 = -0.0) so the tile
// holds +0.0 as the float16 loader's zero fill does.
template <int N_THREADS, int CC, int SB, bool Q4, int BK = BKV>
__device__ __forceinline__ void stage_raw_rows(uint8_t* dst, const uint8_t* codes, const uint8_t* scales,
                                               size_t head_row, int base, int kv_len, int tid) {
    using namespace fd::mma;
    constexpr int N_CHUNKS = BK * CC;
#pragma unroll
    for (int c0 = 0; c0 < N_CHUNKS; c0 += N_THREADS) {
        const int c = c0 + tid;
        if (N_CHUNKS % N_THREADS != 0 && c >= N_CHUNKS) break;
        const int slot = base + c / CC;
        const bool ok = slot < kv_len;
        uint8_t* d = dst + 16 * c;
        if (!Q4 || ok)
            cp_async_16(smem_u32(d), codes + (head_row + (ok ? slot : 0)) * (CC * 16) + (c % CC) * 16, ok);
        else
            *reinterpret_cast<uint4*>(d) = make_uint4(0x88888888u, 0x88888888u, 0x88888888u, 0x88888888u);
    }
    if constexpr (SB > 0) {
#pragma unroll
        for (int r0 = 0; r0 < BK; r0 += N_THREADS) {
            const int r = r0 + tid, slot = base + r;
            if (BK % N_THREADS != 0 && r >= BK) break;
            const bool ok = slot < kv_len;
            cp_async_ca<SB>(smem_u32(dst + BK * CC * 16 + SB * r), scales + (head_row + (ok ? slot : 0)) * SB, ok);
        }
    }
}

template <int HD, int N_THREADS, int BK = BKV>
__device__ __forceinline__ void stage_raw_side(uint8_t* dst, const kvq::Rows& src, size_t head_row, int base,
                                               int kv_len, int tid) {
    constexpr int SB = HD / kvq::BLOCK * 2;
    const uint8_t* codes = src.type == FD_KV_F16 ? reinterpret_cast<const uint8_t*>(src.f16) : src.q.codes;
    const uint8_t* scales = reinterpret_cast<const uint8_t*>(src.q.scales);
    if (src.type == FD_KV_Q8_0)
        stage_raw_rows<N_THREADS, HD / 16, SB, false, BK>(dst, codes, scales, head_row, base, kv_len, tid);
    else if (src.type == FD_KV_Q4_0)
        stage_raw_rows<N_THREADS, HD / 32, SB, true, BK>(dst, codes, scales, head_row, base, kv_len, tid);
    else
        stage_raw_rows<N_THREADS, HD / 8, 0, false, BK>(dst, codes, scales, head_row, base, kv_len, tid);
}

// One side of a landed raw stage -> the float16 tile (rows KV_LD<HD> halves apart): piece c = tid + k N_THREADS
// is row c / (HD / 8), dims [8 (c % (HD / 8)), + 8), values float16(d * q) (kvq::dequant8_codes), or the float16
// row's 16 bytes.
template <int HD, int N_THREADS, int BK = BKV>
__device__ __forceinline__ void dequant_raw_side(__half* tile, const uint8_t* src, int type, int tid) {
    constexpr int PIECES = HD / 8, NB = HD / kvq::BLOCK;
    static_assert(BK * PIECES % N_THREADS == 0, "pieces split evenly over the threads");
    if (type == FD_KV_F16) {
#pragma unroll
        for (int k = 0; k < BK * PIECES / N_THREADS; ++k) {
            const int c = tid + k * N_THREADS, r = c / PIECES, piece = c % PIECES;
            *reinterpret_cast<uint4*>(tile + r * KV_LD<HD> + piece * 8) =
                *reinterpret_cast<const uint4*>(src + r * 2 * HD + piece * 16);
        }
        return;
    }
    const int cb = kvq::code_bytes(type, HD);
    const __half* scales = reinterpret_cast<const __half*>(src + BK * cb);
#pragma unroll
    for (int k = 0; k < BK * PIECES / N_THREADS; ++k) {
        const int c = tid + k * N_THREADS, r = c / PIECES, piece = c % PIECES;
        *reinterpret_cast<uint4*>(tile + r * KV_LD<HD> + piece * 8) =
            kvq::dequant8_codes(src + r * cb, scales[r * NB + (piece >> 2)], type, piece);
    }
}

// The raw ring (R stages, one cp.async group per tile) in front of a double-buffered float16 tile:
// load_raw(tile, slot) issues a tile's copies into raw slot `slot`, dequant(slot, buf) turns raw slot `slot`
// into float16 buffer `buf`, attend(tile, buf) consumes it. Tile j + 1 is dequantized while tile j is
// attended; tiles j + 2 .. j + R are in flight meanwhile. Per tile one __syncthreads, after which float16 tile
// j (dequantized before it) is visible to all, raw tile j + 1 has landed, and the buffer of tile j - 1 and the
// raw slot of tile j are free. Group count: R + j committed before iteration j's wait; R - 2 pending = tiles
// 0 .. j + 1 landed.
template <int R, class LoadRaw, class Dequant, class Attend>
__device__ __forceinline__ void kv_ring_raw(int n_tiles, LoadRaw load_raw, Dequant dequant, Attend attend) {
    using namespace fd::mma;
    static_assert(R >= 2, "ring");
#pragma unroll
    for (int st = 0; st < R; ++st) {
        if (st < n_tiles) load_raw(st, st);
        cp_async_commit();
    }
    cp_async_wait<R - 1>();
    __syncthreads();                                       // raw tile 0 visible to all
    if (n_tiles > 0) dequant(0, 0);
    for (int j = 0; j < n_tiles; ++j) {
        cp_async_wait<R - 2>();
        __syncthreads();
        if (j + R < n_tiles) load_raw(j + R, j % R);       // (the slot tile j was dequantized from)
        cp_async_commit();
        if (j + 1 < n_tiles) dequant((j + 1) % R, (j + 1) % 2);
        attend(j, j % 2);
    }
}

// The cp.async ring over n_tiles tiles: load(tile, stage) issues a tile's copies, attend(tile, stage)
// consumes it. One group per tile (empty past the end), so wait_group<STAGES - 2> = "tile j landed".
template <int STAGES, class Load, class Attend>
__device__ __forceinline__ void kv_ring(int n_tiles, Load load, Attend attend) {
    using namespace fd::mma;
    static_assert(STAGES >= 2, "ring");
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (st < n_tiles) load(st, st);
        cp_async_commit();
    }
    for (int j = 0; j < n_tiles; ++j) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();   // tile j visible to all; every warp is done with tile j - 1
        if (j + STAGES - 1 < n_tiles) load(j + STAGES - 1, (j + STAGES - 1) % STAGES);
        cp_async_commit();   // (into slot (j - 1) % STAGES, free since the barrier)
        attend(j, j % STAGES);
    }
}

// One tile for the warp's 16 rows over its KW keys (k_tile / v_tile: rows KV_LD<HD> halves apart),
// in three steps so that a caller may work out the tile's slots between the first two:
//   qk_tile     S (16 x KW) = Q K^T;
//   scale_mask  S *= scale_log2; where `masked`, key k of row g + 8h (key i of the warp is slot
//               key0 + i) becomes -inf if k > lim[h] (past the row's last visible slot) or, with
//               DROP_NEGATIVE, k < 0 (a slot outside the cache: a block list's out-of-range entry);
//   softmax_pv  the online softmax update of the running max m_run, this thread's partial row sums
//               l_run (the quad's 4 threads hold a row's sum between them), and O += P V into o_acc.
template <int HD, int KW>
__device__ __forceinline__ void qk_tile(float (&s)[KW / 8][4], const uint32_t (&qf)[HD / 16][4], const __half* k_tile,
                                        int lane) {
    using namespace fd::mma;
    static_assert(HD % 16 == 0 && KW % 16 == 0, "mma tiles");
    constexpr int LD = KV_LD<HD>;
#pragma unroll
    for (int ni = 0; ni < KW / 8; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[ni][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
        for (int np = 0; np < KW / 16; ++np) {   // keys 0-7 x d 0-7|8-15, keys 8-15 x d 0-7|8-15
            uint32_t r[4];
            ldmatrix_x4(r, smem_u32(k_tile + (np * 16 + lane % 8 + (lane / 16) * 8) * LD + kk * 16 +
                                    ((lane / 8) % 2) * 8));
            mma_16816(s[2 * np], qf[kk], r[0], r[1]);
            mma_16816(s[2 * np + 1], qf[kk], r[2], r[3]);
        }
}

// qk_tile with the warp's 16 q rows in shared memory (q_tile: its first row; store_q_row wrote them): the
// A fragment of each 16-column slice by one ldmatrix.x4, the same products in the same order as qk_tile.
template <int HD, int KW>
__device__ __forceinline__ void qk_tile_smem(float (&s)[KW / 8][4], const __half* q_tile, const __half* k_tile,
                                             int lane) {
    using namespace fd::mma;
    static_assert(HD % 16 == 0 && KW % 16 == 0, "mma tiles");
    constexpr int LD = KV_LD<HD>;
#pragma unroll
    for (int ni = 0; ni < KW / 8; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[ni][e] = 0.f;
    const uint32_t q_addr = smem_u32(q_tile + (lane % 16) * LD + (lane / 16) * 8);
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, q_addr + kk * 16 * sizeof(__half));
#pragma unroll
        for (int np = 0; np < KW / 16; ++np) {
            uint32_t r[4];
            ldmatrix_x4(r, smem_u32(k_tile + (np * 16 + lane % 8 + (lane / 16) * 8) * LD + kk * 16 +
                                    ((lane / 8) % 2) * 8));
            mma_16816(s[2 * np], a, r[0], r[1]);
            mma_16816(s[2 * np + 1], a, r[2], r[3]);
        }
    }
}

// s[ni][2h + e] is row g + 8h, key ni*8 + 2t + e of this warp's keys
template <int KW, bool DROP_NEGATIVE>
__device__ __forceinline__ void scale_mask(float (&s)[KW / 8][4], float scale_log2, int key0, bool masked,
                                           const int (&lim)[2], int lane) {
    const int t = lane % 4;
#pragma unroll
    for (int ni = 0; ni < KW / 8; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[ni][e] *= scale_log2;
            const int key = key0 + ni * 8 + 2 * t + (e & 1);
            if (masked && (key > lim[e >> 1] || (DROP_NEGATIVE && key < 0))) s[ni][e] = -INFINITY;
        }
}

template <int HD, int KW>
__device__ __forceinline__ void softmax_pv(float (&s)[KW / 8][4], const __half* v_tile, int lane, float (&m_run)[2],
                                           float (&l_run)[2], float (&o_acc)[HD / 8][4]) {
    using namespace fd::mma;
    constexpr int LD = KV_LD<HD>;
    // online softmax; the 4 threads of a quad (same g) hold a row's KW keys between them
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int ni = 0; ni < KW / 8; ++ni) tile_max = fmaxf(tile_max, fmaxf(s[ni][2 * h], s[ni][2 * h + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float m_new = fmaxf(m_run[h], tile_max);
        const float m_ref = m_new == -INFINITY ? 0.f : m_new;   // all keys so far masked
        const float alpha = exp2f(m_run[h] - m_ref);            // 0 when m_run was -inf
        m_run[h] = m_new;
        float row_sum = 0.f;
#pragma unroll
        for (int ni = 0; ni < KW / 8; ++ni) {
            s[ni][2 * h] = exp2f(s[ni][2 * h] - m_ref);
            s[ni][2 * h + 1] = exp2f(s[ni][2 * h + 1] - m_ref);
            row_sum += s[ni][2 * h] + s[ni][2 * h + 1];
        }
        l_run[h] = l_run[h] * alpha + row_sum;
#pragma unroll
        for (int d = 0; d < HD / 8; ++d) {
            o_acc[d][2 * h] *= alpha;
            o_acc[d][2 * h + 1] *= alpha;
        }
    }

    // O (16 x HD) += P (16 x KW, f16) V (KW x HD)
#pragma unroll
    for (int kc = 0; kc < KW / 16; ++kc) {
        uint32_t pa[4];   // C fragments of S tiles 2kc, 2kc+1 are the A fragment of keys 16kc..16kc+15
        pa[0] = pack_half2(s[2 * kc][0], s[2 * kc][1]);
        pa[1] = pack_half2(s[2 * kc][2], s[2 * kc][3]);
        pa[2] = pack_half2(s[2 * kc + 1][0], s[2 * kc + 1][1]);
        pa[3] = pack_half2(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
        for (int dp = 0; dp < HD / 16; ++dp) {   // trans: keys 0-7|8-15 x d 0-7, then d 8-15
            uint32_t r[4];
            ldmatrix_x4_trans(r, smem_u32(v_tile + (kc * 16 + lane % 16) * LD + dp * 16 + (lane / 16) * 8));
            mma_16816(o_acc[2 * dp], pa, r[0], r[1]);
            mma_16816(o_acc[2 * dp + 1], pa, r[2], r[3]);
        }
    }
}

}  // namespace flash
}  // namespace fd

#endif  // FD_HAS_MMA
