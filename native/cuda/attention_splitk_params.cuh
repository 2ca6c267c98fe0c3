// attention_splitk_params.cuh -- the split-K attention's shapes and launch parameters
// (attention_splitk.cuh describes the design): the tensor-core / cp.async switches, the block shape (16
// query rows, 4 warps of 16 key slots a tile; HIP 2 warps), the shared-memory plan per head_dim (Cfg<HD>),
// Params (q, the f16 caches, mask, output, split workspace, fused-rope inputs), and visible_keys, a
// token's key count and, in masked mode, its list of visible new slots.
#pragma once

#include "common.cuh"
#include "kv_quant.cuh"
#include "rope_math.cuh"
#include "x_codes.cuh"

#if FD_HAS_MMA
#define FD_ATTN_ASYNC 1           // cp.async pipeline
#else
#define FD_ATTN_ASYNC 0
#endif
#if FD_HAS_MMA && !defined(FD_ATTENTION_SIMT)
#define FD_ATTN_MMA 1             // tensor-core warp step
#else
#define FD_ATTN_MMA 0
#endif

namespace fd {
namespace attn {

constexpr int ROWS = 16;                       // query rows per block (one m16 tile)
constexpr int WARPS = FD_ATTN_ASYNC ? 4 : 2;   // HIP: 2 warps, smaller tiles (64 KB LDS)
constexpr int THREADS = WARPS * 32;
constexpr int WARP_SLOTS = 16;                 // slots per warp per tile
constexpr int TILE = WARPS * WARP_SLOTS;       // slots per pipeline stage
constexpr int CHUNK_MULTIPLE = 64;             // chunk_len granularity accepted by the launchers
constexpr float LOG2E = 1.4426950408889634f;

constexpr int MAX_NEW = 256;                   // masked mode: new tokens per launch

template <int HD>
struct Cfg {
    static constexpr int STAGES = FD_ATTN_ASYNC ? (HD >= 256 ? 2 : 3) : 2;
    static constexpr int LD = HD + 8;          // padded row stride (halves)
    static constexpr int CHUNKS = HD / 8;      // 16-byte pieces per K/V row
    static constexpr size_t Q_BYTES = 2 * ROWS * LD * sizeof(__half);           // q hi, q lo
    static constexpr size_t STAGE_BYTES = 2 * TILE * LD * sizeof(__half);       // K, V
    static constexpr size_t PIPE_BYTES = STAGES * STAGE_BYTES;
    static constexpr size_t MERGE_BYTES = ((size_t)WARPS * ROWS * (HD + 3) + 2 * ROWS) * sizeof(float);
    static constexpr size_t LIST_BYTES = MAX_NEW * sizeof(int);                    // masked mode's key list
    static constexpr size_t SMEM_BYTES = Q_BYTES + LIST_BYTES + (PIPE_BYTES > MERGE_BYTES ? PIPE_BYTES : MERGE_BYTES);
};

// fd_attention_masked_rope (splitk_kernel's MR variant: float16 K and V, head_dim <= 128, n <= MR_MAX_NEW): the
// block's visible new rows -- and the store block's own row -- RoPE'd into float16 K | V rows of shared memory between
// the key list and the pipeline (MR_MAX_NEW + 1 rows of 2 HD halves), so that each tile's copies of those slots (stale
// cache rows) are overwritten there. The pipeline keeps as many stages (MR, the kernel's template argument) as leave
// two blocks an SM, the plain kernel's residency, which the split count assumes: 3 at head_dim 64, 2 at 128 (3 there
// fit one block an SM: 8 rows at depth 1000 1.318 -> 1.460 ms, bench/NOTES.md session 43). Stages change when a
// tile's copy is issued, never a value, so o is the plain kernel's bit for bit.
constexpr int MR_MAX_NEW = 48;

template <int HD, int STAGES_>
struct MrCfg {
    static constexpr int STAGES = STAGES_;
    static constexpr size_t ROWS_BYTES = (size_t)(MR_MAX_NEW + 1) * 2 * HD * sizeof(__half);
    static constexpr size_t PIPE_BYTES = (size_t)STAGES * Cfg<HD>::STAGE_BYTES;
    static constexpr size_t SMEM_BYTES = Cfg<HD>::Q_BYTES + Cfg<HD>::LIST_BYTES + ROWS_BYTES +
                                         (PIPE_BYTES > Cfg<HD>::MERGE_BYTES ? PIPE_BYTES : Cfg<HD>::MERGE_BYTES);
};

template <int HD>
constexpr int mr_stages() {
    return Cfg<HD>::STAGES >= 3 && 2 * (MrCfg<HD, 3>::SMEM_BYTES + 1024) <= 228 * 1024 ? 3 : 2;
}

struct Params {
    const float* q;            // (n, n_heads, HD) float32
    const __half* k_cache;     // [n_kv_heads][max_ctx][HD]
    const __half* v_cache;
    const int32_t* n_past;     // device scalar
    const uint8_t* mask;       // (n, n) or nullptr (decode: n = 1, the token sees [0, n_past])
    float* o;                  // (n, n_heads * HD): written when n_splits == 1
    int8_t* oq;                // NULL, or o's codes (n, n_heads * HD) and scales (flashd_attention.h o_codes; HD 128,
    float* osc;                // n_splits 1): written with o
    float* ws_acc;             // [n * n_heads][n_splits][HD] partial unnormalised o (n_splits > 1)
    float* ws_m;               // [n * n_heads][n_splits] running max (log2 domain)
    float* ws_l;               // [n * n_heads][n_splits] softmax denominator
    int n, n_heads, n_kv_heads, group, row_tiles, max_ctx, chunk_len, n_splits;
    int single_chunks;         // rows of at most this many chunks: split 0 alone (fd_tuning_t.attn_single_chunks)
    float q_scale;             // scale * log2(e)
    // fd_attention_decode_rope only (splitk_kernel<HD, true>; n = 1, no mask): q is unrotated, and the
    // new token's K/V row comes from k_new / v_new instead of the cache (see splitk_kernel)
    const float* k_new;        // (n_kv_heads, HD) float32, unrotated
    const float* k_offset;     // NULL or (n_kv_heads, HD) float32: a quantized K's key offset (flashd_attention.h)
    const float* v_new;        // (n_kv_heads, HD) float32
    __half* k_store;           // the caches again, written at slot *n_past
    __half* v_store;
    const int32_t* positions;  // device scalar: the new token's RoPE position (fd_attention_masked_rope: unused, the
                               // table holds each row's cos / sin)
    double theta;
    RopeScaling rope_scaling;  // linear / YaRN (rope_math.cuh); on = 0: none
    int rope_dim, neox;
    const float* rope_tab_in;  // the step's cos / sin to read (fd_rope_t.table_mode 2), or NULL: computed here;
                               // fd_attention_masked_rope: row i's at rope_tab_in + i * rope_dim (always given)
    float* rope_tab_out;       // where block 0 stores the cos / sin it computed (table_mode 1), or NULL
    // the cache's row formats (FD_KV_*); a quantized K or V is read through its planes (kv_quant.cuh) and
    // dequantized into the float16 tile (splitk_kernel<HD, false, true>: load_tile)
    int k_type, v_type;
    kvq::Plane kq, vq;
    // the window (flashd_attention.h; window 0: none): a query at position p reads keys v >= window * (p / window)
    // from float16 copies -- a quantized side's ring (k_ring / v_ring, slot s in row s % ring_slots), a float16
    // side's cache rows (splitk_kernel<..., WIN>: window_rows)
    int window, ring_slots;
    const __half* k_ring;
    const __half* v_ring;
};

// The number of visible keys L of `token` (all threads of the block call it; uniform result). In
// masked mode list[k] (shared memory, if list != nullptr) receives the k-th visible new slot's
// offset j (mask[token, j] != 0, ascending).
__device__ __forceinline__ int visible_keys(const Params& p, int token, int* list) {
    const int n_past = max(p.n_past[0], 0);
    if (p.mask == nullptr) return min(n_past + 1, p.max_ctx);
    const int lane = threadIdx.x & 31;
    const uint8_t* row = p.mask + (size_t)token * p.n;
    int count = 0;
    for (int j0 = 0; j0 < p.n; j0 += 32) {      // every warp counts; warp 0 writes the list
        const bool on = j0 + lane < p.n && row[j0 + lane] != 0;
        const unsigned bits = __ballot_sync(0xffffffffu, on);
        if (list != nullptr && on && threadIdx.x < 32) list[count + __popc(bits & ((1u << lane) - 1u))] = j0 + lane;
        count += __popc(bits);
    }
    return min(n_past + count, p.max_ctx);
}

}  // namespace attn
}  // namespace fd
