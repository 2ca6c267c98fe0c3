// attention_splitk_qstage.cuh -- how split-K attention's QKV kernels (a q8_0 / q4_0 K or V: splitk_kernel<HD,
// ROPE, true>) load the cache: a tile's rows land as they are stored (codes and float16 scales, or float16
// values) in a ring of raw stages by cp.async, STAGES - 1 tiles ahead like the float16 kernel's ring; once a
// tile has landed each warp dequantizes its own 16 key rows of it into one float16 K | V tile (the layout
// the float16 kernel's ring slots have), so warp_step runs unchanged on the same float16 values as before:
// float16(d * q) (kv_quant.cuh dequant8_codes), bit for bit the previous synchronous loader's.
//
// Shared memory of the pipeline area (after q hi/lo and the masked-mode list, splitk_kernel):
//   float16 tile   K [TILE][LD] | V [TILE][LD] halves                   (Cfg<HD>::STAGE_BYTES)
//   raw ring       STAGES x ( K side | V side ), a side = codes [TILE][cb] bytes then scales [TILE][HD / 32]
//                  float16 (q8_0: cb = HD, q4_0: cb = HD / 2), or a float16 side's rows [TILE][2 HD] bytes.
// Every part starts 16-byte aligned: cb and 2 HD are multiples of 16 (HD % 32 == 0), TILE * HD / 16 too.
//
// Copies: a row's codes are cb / 16 16-byte cp.async (a row of codes starts at row * cb in the plane, cb a
// multiple of 16); its scales one cp.async of HD / 16 bytes (4, 8 or 16 for HD 64, 128, 256: cp.async.ca
// takes those sizes; the scales of row r start at r * HD / 16 bytes, so aligned to their size). Rows past
// the visible keys are zero-filled (scale 0, so value +0.0; q4_0: see stage_rows), never read from the cache.
//
// Why the raw rows go through shared memory rather than straight to registers: the loads are asynchronous
// (the previous loader's plain loads stalled every thread once per tile on a global round trip, with no
// tile in flight behind them), and each warp dequantizes only its own rows, so the one __syncthreads per
// tile of the ring is still the only block barrier (__syncwarp orders a warp's tile stores before its
// ldmatrix reads). The raw ring is deeper than the float16 ring (QCfg::STAGES, more tiles in flight) in
// about the same shared memory: a q8_0 K|V tile stage is 17 KB at HD 128 where a float16 one is 34 KB.
//
// HIP (FD_ATTN_ASYNC 0): the same code; cp_async16 / cp_async_small are plain copies there.
// tests/emulation/test_kv_quant_stage_emulation.py emulates the copy mapping and the dequantizing reads.
#pragma once

#include "attention_splitk_qfrag.cuh"

namespace fd {
namespace attn {

template <int HD>
struct QCfg {
    // ring depth: 4 (3 tiles in flight) up to HD 128; HD 256 keeps 2 (its float16 tile alone is 66 KB)
    static constexpr int STAGES = FD_ATTN_ASYNC ? (HD >= 256 ? 2 : 4) : 2;
    static constexpr int SCALE_BYTES = HD / kvq::BLOCK * 2;      // float16 scales per row
    static_assert(HD % kvq::BLOCK == 0, "quantized rows are whole 32-value blocks");
};

// Bytes of one tile row of a side in a raw stage: kvq::staged_row_bytes, plus CODE_PAD after a quantized row's
// codes where the fragment step reads them (pad).
__host__ __device__ inline int raw_row_bytes(int type, int head_dim, bool pad) {
    return kvq::staged_row_bytes(type, head_dim) + (pad && type != FD_KV_F16 ? CODE_PAD : 0);
}

// Shared memory of splitk_kernel<HD, *, true> for these K and V types: the float16 tile (none for the fragment
// step: attention_splitk_qfrag.cuh), the raw ring, or the merge area if larger.
template <int HD>
size_t qkv_smem_bytes(int k_type, int v_type, bool win = false) {
    using C = Cfg<HD>;
    const bool frag = frag_types(k_type * 4 + v_type);
    const int row_bytes = raw_row_bytes(k_type, HD, frag) + raw_row_bytes(v_type, HD, frag);
    // the float16 tile: not with the fragment step, unless a window's tiles need it
    const size_t pipe = (frag && !win ? 0 : C::STAGE_BYTES) + (size_t)QCfg<HD>::STAGES * TILE * row_bytes;
    return C::Q_BYTES + C::LIST_BYTES + (pipe > C::MERGE_BYTES ? pipe : C::MERGE_BYTES);
}

// One side (K or V) of the cache as the raw ring reads it.
struct QSide {
    const uint8_t* codes;      // quantized: the plane's codes; float16: the cache's rows
    const uint8_t* scales;     // quantized: the plane's scales (unused for float16)
    int type;                  // FD_KV_*
    int row_bytes;             // raw_row_bytes(type, HD, pad): the side's bytes per tile row in a raw stage
};

__host__ __device__ inline QSide qside(const __half* f16, const kvq::Plane& pl, int type, int head_dim, bool pad) {
    if (type == FD_KV_F16) return QSide{reinterpret_cast<const uint8_t*>(f16), nullptr, type, 2 * head_dim};
    return QSide{pl.codes, reinterpret_cast<const uint8_t*>(pl.scales), type, raw_row_bytes(type, head_dim, pad)};
}

// Copies of one side of a tile into its raw stage dst: CC 16-byte chunks of a row's CC * 16 bytes (rows
// CC * 16 + PAD bytes apart in dst), then (SB > 0) SB bytes of its scales. Chunk c = tid + j * THREADS is row
// c / CC, chunk c % CC, at dst + (c / CC) (CC * 16 + PAD) + 16 (c % CC); as THREADS % CC == 0, a thread keeps
// chunk tid % CC of rows tid / CC + j * THREADS / CC. row_of(i, valid,
// cache_row) gives tile row i's cache row (kv_head * max_ctx + slot; a valid address also when !valid).
// An invalid row's codes are cp.async's zero fill, except q4_0's (Q4 true): there code byte 0 is the value
// pair (-8, -8), which with the zero-filled scale dequantizes to -0.0; a plain shared store of 0x88 (code 8,
// value +0.0) instead, so the tile holds +0.0 past the visible keys as the synchronous loader's zeros were
// (the slot is free after the ring's barrier and the store is published by the next one, like the copies).
template <int CC, int SB, bool Q4, int PAD, class RowOf>
__device__ __forceinline__ void stage_rows(uint8_t* dst, const uint8_t* codes, const uint8_t* scales, RowOf row_of,
                                           int tid) {
    constexpr int ROW_STEP = THREADS / CC, STRIDE = CC * 16 + PAD;
    static_assert(THREADS % CC == 0 && TILE % ROW_STEP == 0, "a side's chunks split evenly over the threads");
    const uint8_t* src = codes + (tid % CC) * 16;
#pragma unroll 4   // (fully unrolled, HD 256 spills: the warp's o[] is live across the loader)
    for (int j = 0; j < TILE / ROW_STEP; ++j) {
        bool valid;
        size_t row;
        row_of(tid / CC + j * ROW_STEP, valid, row);
        uint8_t* d = dst + (tid / CC + j * ROW_STEP) * STRIDE + 16 * (tid % CC);
        if (!Q4 || valid)
            cp_async16(d, src + row * (CC * 16), valid);
        else
            *reinterpret_cast<uint4*>(d) = make_uint4(0x88888888u, 0x88888888u, 0x88888888u, 0x88888888u);
    }
    if constexpr (SB > 0) {
        static_assert(THREADS >= TILE, "one scale copy per thread");
        if (tid < TILE) {
            bool valid;
            size_t row;
            row_of(tid, valid, row);
            cp_async_small<SB>(dst + TILE * STRIDE + SB * tid, scales + row * SB, valid);
        }
    }
}

// PAD: CODE_PAD after each quantized row's codes (the fragment step's layout), else 0.
template <int HD, int PAD, class RowOf>
__device__ __forceinline__ void stage_side(uint8_t* dst, const QSide& s, RowOf row_of, int tid) {
    constexpr int SB = QCfg<HD>::SCALE_BYTES;
    if (s.type == FD_KV_Q8_0)
        stage_rows<HD / 16, SB, false, PAD>(dst, s.codes, s.scales, row_of, tid);
    else if (s.type == FD_KV_Q4_0)
        stage_rows<HD / 32, SB, true, PAD>(dst, s.codes, s.scales, row_of, tid);
    else
        stage_rows<HD / 8, 0, false, 0>(dst, s.codes, s.scales, row_of, tid);
}

// A tile's K side then V side into raw stage dst (TILE * k.row_bytes bytes of K first).
template <int HD, int PAD, class RowOf>
__device__ __forceinline__ void stage_tile(uint8_t* dst, const QSide& k, const QSide& v, RowOf row_of, int tid) {
    stage_side<HD, PAD>(dst, k, row_of, tid);
    stage_side<HD, PAD>(dst + TILE * k.row_bytes, v, row_of, tid);
}

// Tile rows [row0, row0 + WARP_SLOTS) of one side's raw stage src -> the float16 tile rows at tile (row
// stride LD halves; tile points at row row0). Piece c = lane + 32 j is row row0 + c / (HD / 8), dims
// [8 (c % (HD / 8)), + 8): one 16-byte shared store each.
template <int HD>
__device__ __forceinline__ void dequant_side(__half* tile, const uint8_t* src, int type, int row0, int lane) {
    constexpr int PIECES = HD / 8, LD = Cfg<HD>::LD, NB = HD / kvq::BLOCK;
    static_assert(WARP_SLOTS * PIECES % 32 == 0, "pieces split evenly over the lanes");
    if (type == FD_KV_F16) {
#pragma unroll 4   // (as stage_rows)
        for (int j = 0; j < WARP_SLOTS * PIECES / 32; ++j) {
            const int c = lane + 32 * j, r = c / PIECES, piece = c % PIECES;
            *reinterpret_cast<uint4*>(tile + r * LD + piece * 8) =
                *reinterpret_cast<const uint4*>(src + (row0 + r) * 2 * HD + piece * 16);
        }
        return;
    }
    const int cb = kvq::code_bytes(type, HD);
    const __half* scales = reinterpret_cast<const __half*>(src + TILE * cb);
#pragma unroll 4
    for (int j = 0; j < WARP_SLOTS * PIECES / 32; ++j) {
        const int c = lane + 32 * j, r = c / PIECES, piece = c % PIECES, i = row0 + r;
        *reinterpret_cast<uint4*>(tile + r * LD + piece * 8) =
            kvq::dequant8_codes(src + i * cb, scales[i * NB + (piece >> 2)], type, piece);
    }
}

// A window tile (splitk_kernel<..., WIN>; flashd_attention.h): this warp's WARP_SLOTS rows, virtual keys v0 .. v0 +
// 15, straight into the float16 K | V tile (tile: the warp's first row; V TILE rows below) from the window's copies:
// a quantized side's ring row slot % ring_slots, a float16 side's cache row; rows at or past L zero-filled (+0.0).
// The slot of a key is the loader's (committed keys below direct_end are their own slots; then the list of visible
// new slots). By cp.async, waited here for all of this thread's groups: the raw ring's tiles in flight were issued
// before these, so the wait is about one round trip, once per window tile (a window is a few tiles of a row's
// keys, spread over splits); the ring's later waits then find their tiles landed.
template <int HD>
__device__ __forceinline__ void window_rows_issue(__half* tile, const Params& p, int kvh, int v0, int L,
                                                  int direct_end, int n_past, const int* list, int lane) {
    constexpr int PIECES = HD / 8, LD = Cfg<HD>::LD, RPP = 32 / PIECES;   // rows one pass of the warp covers
    static_assert(32 % PIECES == 0 && WARP_SLOTS % RPP == 0, "a row's pieces within one pass");
    const int piece = lane % PIECES;
    // ring rows without a division per row: committed keys v0 + r are slots v0 + r, row (v0 % R + r) wrapped once
    // (r < WARP_SLOTS <= R); a masked row's new slot (rare: tree rows) takes its own modulo
    const int R = p.ring_slots, base = v0 % R;
#pragma unroll 4
    for (int j = 0; j < WARP_SLOTS / RPP; ++j) {
        const int r = lane / PIECES + RPP * j, v = v0 + r;
        const bool valid = v < L;
        int slot = 0, at = 0;
        if (valid && v < direct_end) {
            slot = v;
            at = base + r >= R ? base + r - R : base + r;
        } else if (valid) {
            slot = n_past + list[v - n_past];
            at = slot % R;
        }
        __half* dst = tile + r * LD + piece * 8;
        const size_t ring_off = ((size_t)kvh * R + at) * HD + piece * 8;
        const size_t cache_off = ((size_t)kvh * p.max_ctx + slot) * HD + piece * 8;
        cp_async16(dst, p.k_ring != nullptr ? p.k_ring + ring_off : p.k_cache + cache_off, valid);
        cp_async16(dst + TILE * LD, p.v_ring != nullptr ? p.v_ring + ring_off : p.v_cache + cache_off, valid);
    }
}

template <int HD>
__device__ __forceinline__ void window_rows(__half* tile, const Params& p, int kvh, int v0, int L, int direct_end,
                                            int n_past, const int* list, int lane) {
    window_rows_issue<HD>(tile, p, kvh, v0, L, direct_end, n_past, list, lane);
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
}

}  // namespace attn
}  // namespace fd
