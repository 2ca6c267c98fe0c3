// attention_sparse.cu -- block-sparse causal flash attention (fd_flashprefill_sparse_attention and the
// "BSA" entry point with per-head mask types), on tensor cores.
//
//   n new tokens at cache slots [p0, p0 + n), p0 % 128 == 0 (host int: prefill only); q (n, n_heads,
//   head_dim) f32 rotated; k/v cache f16 [n_kv_heads][max_ctx][head_dim] (this layer, keys of the
//   chunk already written); o (n, n_heads * head_dim) f32. Query head h reads kv head
//   h / (n_heads / n_kv_heads). Blocks of 128 slots: query block m = (p0 + i) / 128 of token i.
//   Token i, head h attends slot j iff key block j / 128 is in (m, h)'s block set and j <= p0 + i
//   (causal inside the diagonal block -- the anchor's BSA call runs non-causal there); softmax
//   (scale q k^T) v over the attended slots; a row attending nothing gets zeros.
//
// Block set of (query block m, head h), by head_mask_type[h] (NULL: every head FD_MASK_LISTS):
//   FD_MASK_DENSE (0)      every kb <= m (plain causal attention)
//   FD_MASK_STREAMING (<0) kb < sink_blocks or m - kb < local_blocks
//   FD_MASK_LISTS (>0)     block_idx[(mq * n_heads + h) * Nk + e], e < block_cnt[mq * n_heads + h]
//                          (mq = m - p0 / 128, Nk = ceil((p0 + n) / 128): fd_flashprefill_select's output),
//                          ascending; entries outside [0, m] see nothing (masked)
//
// Launch: grid (ceil(n / 64), n_heads), latest rows first; 4 warps x 16 rows = 64 consecutive
// tokens of one head (64 divides 128, so a block never straddles query blocks and all its rows
// share one block set). Each selected key block is two 64-key tiles; the second tile of the
// diagonal block is skipped when it starts past the block's last token. The tile loop is
// attention_tile.cuh's, shared with attention_prefill.cu (cp.async 3-stage K/V ring, Q fragments in
// registers, S = QK^T and O += PV by mma.sync m16n8k16 f16 with f32 accumulate, online softmax in
// exp2); only the tile -> slot map and the mask are this file's. Needs sm_80 and 16-byte aligned
// o/k/v (8-byte q): otherwise FD_E_SHAPE (no SIMT fallback; the drafter forward on such devices
// uses dense attention).
#include "attention_tile.cuh"

#include <limits.h>

namespace fd {
namespace {

constexpr int SP_BLOCK = FD_FLASHPREFILL_BLOCK;
constexpr int SP_BKV = flash::BKV;     // keys per tile
constexpr int SP_BQ = 64;              // tokens per CTA
constexpr int SP_WARPS = 4;
constexpr int SP_THREADS = SP_WARPS * 32;
constexpr int SP_STAGES = 3;

template <int HD>
struct SparseCfg {
    static constexpr int tile_halves = flash::KV_TILE_HALVES<HD>;
    static constexpr int smem_bytes = 2 * SP_STAGES * tile_halves * 2;
};

// The e-th key block of (m, h)'s set and the set's size.
struct BlockSet {
    int type, m, count, sink_part, local_lo;
    const int32_t* list;
    __device__ int at(int e) const {
        if (type == FD_MASK_DENSE) return e;
        if (type < 0) return e < sink_part ? e : local_lo + (e - sink_part);
        return list[e];
    }
};

#if FD_HAS_MMA

template <int HD>
__global__ void __launch_bounds__(SP_THREADS, 2) attention_sparse_kernel(
    float* __restrict__ o, const float* __restrict__ q, const __half* __restrict__ k_cache,
    const __half* __restrict__ v_cache, int p0, int n, int n_heads, int n_kv_heads, int max_ctx, float scale_log2,
    const int32_t* __restrict__ head_mask_type, const int32_t* __restrict__ block_idx,
    const int32_t* __restrict__ block_cnt, int sink_blocks, int local_blocks) {
#if FD_MMA_DEVICE_OK
    using namespace fd::mma;
    using C = SparseCfg<HD>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half* k_smem = reinterpret_cast<__half*>(smem_raw);
    __half* v_smem = k_smem + SP_STAGES * C::tile_halves;

    const int tid = threadIdx.x, lane = tid % 32, wq = tid / 32;
    const int g = lane / 4, t = lane % 4;
    const int head = blockIdx.y, kvh = head / (n_heads / n_kv_heads);
    const int row0 = (gridDim.x - 1 - blockIdx.x) * SP_BQ;            // first token of this CTA
    const int last_token = min(row0 + SP_BQ, n) - 1;
    const int mq = row0 / SP_BLOCK, m = p0 / SP_BLOCK + mq;
    const int n_kb = ceil_div(p0 + n, SP_BLOCK);
    const int kv_len = p0 + last_token + 1;                           // slots [0, kv_len) may be read

    BlockSet set;
    set.type = head_mask_type ? head_mask_type[head] : FD_MASK_LISTS;
    set.m = m;
    set.list = nullptr;
    set.sink_part = 0;
    set.local_lo = 0;
    if (set.type == FD_MASK_DENSE) {
        set.count = m + 1;
    } else if (set.type < 0) {
        set.local_lo = max(0, m - local_blocks + 1);
        set.sink_part = min(sink_blocks, set.local_lo);
        set.count = set.sink_part + (m + 1 - set.local_lo);
    } else {
        set.list = block_idx + ((size_t)mq * n_heads + head) * n_kb;
        set.count = min(max(block_cnt[mq * n_heads + head], 0), n_kb);
    }
    int n_tiles = 2 * set.count;
    if (set.count > 0 && set.at(set.count - 1) == m && m * SP_BLOCK + SP_BKV > p0 + last_token) --n_tiles;
    auto tile_slot = [&](int j) { return set.at(j / 2) * SP_BLOCK + (j % 2) * SP_BKV; };

    uint32_t qf[HD / 16][4];
    int lim[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int token = min(row0 + wq * 16 + g + 8 * h, n - 1);   // padding rows repeat the last token
        lim[h] = p0 + token;
        flash::load_q_row<HD>(qf, q + ((size_t)token * n_heads + head) * HD, h, t);
    }
    const int first_lim = p0 + row0;

    float o_acc[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_acc[d][e] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY};
    float l_run[2] = {0.f, 0.f};

    // tile j: slots tile_slot(j) .. + 63, those outside [0, kv_len) zero-filled; masked (keys past a
    // row's own slot, and slots outside [0, kv_len): listed blocks out of range) only where a tile can
    // hold such keys
    auto load_kv = [&](int tile, int stage) {
        flash::load_kv_tile<HD, SP_THREADS, true>(k_smem, v_smem, stage, k_cache, v_cache, kvh, max_ctx,
                                                  tile_slot(tile), kv_len, tid);
    };
    flash::kv_ring<SP_STAGES>(n_tiles, load_kv, [&](int j, int stage) {
        float s[SP_BKV / 8][4];
        flash::qk_tile<HD, SP_BKV>(s, qf, k_smem + stage * C::tile_halves, lane);
        const int key0 = tile_slot(j);   // after the mma: the list read overlaps it
        flash::scale_mask<SP_BKV, true>(s, scale_log2, key0, key0 < 0 || key0 + SP_BKV - 1 > first_lim, lim, lane);
        flash::softmax_pv<HD, SP_BKV>(s, v_smem + stage * C::tile_halves, lane, m_run, l_run, o_acc);
    });
    cp_async_wait<0>();

#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
        const int token = row0 + wq * 16 + g + 8 * h;
        if (token >= n) continue;
        float* o_row = o + ((size_t)token * n_heads + head) * HD;
        const float inv = l_run[h] > 0.f ? 1.f / l_run[h] : 0.f;   // 0: the row attended nothing
#pragma unroll
        for (int d = 0; d < HD / 8; ++d)
            *reinterpret_cast<float2*>(o_row + d * 8 + 2 * t) = make_float2(o_acc[d][2 * h] * inv, o_acc[d][2 * h + 1] * inv);
    }
#else
    __trap();
#endif
}

template <int HD>
int launch_sparse(float* o, const float* q, const __half* kc, const __half* vc, int p0, int n, int n_heads,
                  int n_kv_heads, int max_ctx, float scale_log2, const int32_t* types, const int32_t* idx,
                  const int32_t* cnt, int sink, int local, cudaStream_t stream) {
    const auto kernel = attention_sparse_kernel<HD>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SparseCfg<HD>::smem_bytes);
    if (err != cudaSuccess) return (int)err;
    const dim3 grid(ceil_div(n, SP_BQ), n_heads);
    kernel<<<grid, SP_THREADS, SparseCfg<HD>::smem_bytes, stream>>>(o, q, kc, vc, p0, n, n_heads, n_kv_heads, max_ctx,
                                                                    scale_log2, types, idx, cnt, sink, local);
    return FD_LAUNCH_STATUS();
}

#endif  // FD_HAS_MMA

}  // namespace
}  // namespace fd

extern "C" int fd_attention_block_sparse(float* o, const float* q, const void* k_cache, const void* v_cache, int p0,
                                         int n, const fd_attention_shape_t* shape, const int32_t* head_mask_type,
                                         const int32_t* block_idx, const int32_t* block_cnt, int sink_blocks,
                                         int local_blocks, void* stream) {
    FD_CHECK_ARG(o && q && k_cache && v_cache && n >= 1 && p0 >= 0 && p0 % FD_FLASHPREFILL_BLOCK == 0);
    FD_CHECK_ARG(fd::shape_valid(shape) && isfinite(shape->scale));
    if (!fd::kv_f16(shape)) return FD_E_SHAPE;   // reads float16 K/V only so far (flashd_attention.h)
    const int n_heads = shape->n_heads, n_kv_heads = shape->n_kv_heads, head_dim = shape->head_dim;
    const int max_ctx = shape->max_ctx;
    FD_CHECK_ARG((int64_t)p0 + n <= max_ctx && (int64_t)n * n_heads <= INT_MAX);
    FD_CHECK_ARG(sink_blocks >= 0 && local_blocks >= 0);
    // lists are needed unless every head is dense or streaming; without head_mask_type all heads use lists
    FD_CHECK_ARG(head_mask_type != NULL || (block_idx && block_cnt));
    if (head_dim != 64 && head_dim != 128) return FD_E_SHAPE;
#if FD_HAS_MMA
    fd::MmaDevice dev;
    cudaError_t err = fd::query_mma_device(&dev);
    if (err != cudaSuccess) return (int)err;
    const __half* kc = static_cast<const __half*>(k_cache);
    const __half* vc = static_cast<const __half*>(v_cache);
    const bool aligned = fd::is_aligned(o, 8) && fd::is_aligned(q, 8) && fd::is_aligned(kc, 16) && fd::is_aligned(vc, 16);
    if (!dev.has_mma || !aligned) return FD_E_SHAPE;
    const float sl = shape->scale * fd::flash::LOG2E;
    cudaStream_t s = (cudaStream_t)stream;
    return head_dim == 64 ? fd::launch_sparse<64>(o, q, kc, vc, p0, n, n_heads, n_kv_heads, max_ctx, sl, head_mask_type,
                                                  block_idx, block_cnt, sink_blocks, local_blocks, s)
                          : fd::launch_sparse<128>(o, q, kc, vc, p0, n, n_heads, n_kv_heads, max_ctx, sl, head_mask_type,
                                                   block_idx, block_cnt, sink_blocks, local_blocks, s);
#else
    return FD_E_UNSUPPORTED;   // HIP: mma.sync-only kernel, no SIMT fallback
#endif
}

extern "C" int fd_flashprefill_sparse_attention(float* o, const float* q, const void* k_cache, const void* v_cache,
                                                int p0, int n, const fd_attention_shape_t* shape,
                                                const int32_t* block_idx, const int32_t* block_cnt, void* stream) {
    FD_CHECK_ARG(block_idx && block_cnt);
    return fd_attention_block_sparse(o, q, k_cache, v_cache, p0, n, shape, NULL, block_idx, block_cnt, 0, 0, stream);
}
