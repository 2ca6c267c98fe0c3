// attention_splitk_plan.cuh -- the host side of split-K attention (attention_splitk.cuh describes the
// design): the split count (a function of the model shape, max_ctx and chunk_len only, so every row
// is reduced in decode's order), the workspace layout of the splits' partials, the launch parameters
// of both entry points, and the launch of splitk_kernel then combine_kernel per head_dim.
#pragma once

#include "attention_splitk_combine.cuh"
#include "attention_splitk_kernel.cuh"

namespace fd {
namespace attn {

// ---- host side: the split count, the workspace layout, the launch ---------------------------
// n_splits is a function of the model shape, max_ctx and chunk_len only (never of n or the mask):
// enough blocks to fill the GPU (blocks_per_sm * the device's SM count over n_kv_heads * row tiles of ONE
// token), capped by the number of chunks max_ctx holds (at most MAX_SPLITS).
//
// Quantized rows (QKV) keep the float16 plan: the same n_splits (from Cfg<HD>::SMEM_BYTES) and the caller's
// chunk_len. A chunk's cost is its tiles (64 keys each: one barrier, one dequantize, one warp step per
// warp), not its bytes, so smaller rows give no reason for longer or shorter chunks: chunk_len stays the
// granularity that spreads a short context over the GPU, and at depth every split streams many chunks
// whatever their length. What smaller rows change is the bytes a tile stage holds, which the raw ring
// (attention_splitk_qstage.cuh) spends on depth: 4 stages (3 tiles in flight) where the float16 ring has 3,
// in the same shared memory for q8_0 at HD 128 (1 + 4 x 0.5 float16 tiles = 3 float16 tiles) and less for
// q4_0, so as many blocks fit an SM as blocks_per_sm assumes. (A float16 side next to a quantized one needs
// more: 1 block per SM then at HD 128, the grid running in two waves.) Keeping n_splits also keeps decode and
// masked attention splitting a row alike whatever the cache type, and both depend on the shape only.
constexpr size_t SMEM_PER_SM = 228 * 1024;

template <int HD>
constexpr int blocks_per_sm() {
    return (int)(SMEM_PER_SM / (Cfg<HD>::SMEM_BYTES + 1024)) > 0 ? (int)(SMEM_PER_SM / (Cfg<HD>::SMEM_BYTES + 1024))
                                                                 : 1;
}

inline int n_chunks_for(int max_ctx, int chunk_len) { return (max_ctx - 1) / chunk_len + 1; }
inline int row_tiles_for(int group) { return (group + ROWS - 1) / ROWS; }

template <int HD>
int splits_for(int n_kv_heads, int group, int max_ctx, int chunk_len) {
    const int target = blocks_per_sm<HD>() * device_sm_count() / (n_kv_heads * row_tiles_for(group));
    const int cap = n_chunks_for(max_ctx, chunk_len) < MAX_SPLITS ? n_chunks_for(max_ctx, chunk_len) : MAX_SPLITS;
    return target < 1 ? 1 : (target > cap ? cap : target);
}

// 0 for an unsupported head_dim
inline int splits_for_head_dim(int head_dim, int n_kv_heads, int group, int max_ctx, int chunk_len) {
    switch (head_dim) {
        case 64: return splits_for<64>(n_kv_heads, group, max_ctx, chunk_len);
        case 128: return splits_for<128>(n_kv_heads, group, max_ctx, chunk_len);
        case 256: return splits_for<256>(n_kv_heads, group, max_ctx, chunk_len);
        default: return 0;
    }
}

// workspace: acc [n_rows][n_splits][HD] | m [n_rows][n_splits] | l [n_rows][n_splits], n_rows = n * n_heads
inline size_t workspace_bytes_for(int n_rows, int n_splits, int head_dim) {
    return n_splits <= 1 ? 0 : (size_t)n_rows * n_splits * ((size_t)head_dim + 2) * sizeof(float);
}

inline void set_workspace(Params& p, void* workspace, int head_dim) {
    const size_t n_rows = (size_t)p.n * p.n_heads;
    p.ws_acc = (float*)workspace;
    p.ws_m = p.ws_acc + n_rows * p.n_splits * head_dim;
    p.ws_l = p.ws_m + n_rows * p.n_splits;
}

// The launch parameters of both entry points (decode: n = 1, mask = nullptr); n_splits = 0 for an
// unsupported head_dim. The workspace is set by set_workspace.
inline Params make_params(float* o, const float* q, const void* k_cache, const void* v_cache, const uint8_t* mask,
                          const int32_t* n_past, int n, const fd_attention_shape_t& shape, int chunk_len) {
    const int n_heads = shape.n_heads, n_kv_heads = shape.n_kv_heads, head_dim = shape.head_dim;
    const int max_ctx = shape.max_ctx;
    const float scale = shape.scale;
    Params p;
    p.k_offset = nullptr;
    p.q = q;
    p.k_cache = (const __half*)k_cache;
    p.v_cache = (const __half*)v_cache;
    p.n_past = n_past;
    p.mask = mask;
    p.o = o;
    p.ws_acc = p.ws_m = p.ws_l = nullptr;
    p.n = n;
    p.n_heads = n_heads;
    p.n_kv_heads = n_kv_heads;
    p.group = n_heads / n_kv_heads;
    p.row_tiles = row_tiles_for(p.group);
    p.max_ctx = max_ctx;
    p.chunk_len = chunk_len;
    p.n_splits = splits_for_head_dim(head_dim, n_kv_heads, p.group, max_ctx, chunk_len);
    p.single_chunks = tuning_now().attn_single_chunks;
    // a bound (flashd_attention.h: max_keys) under which no row is split: one split, no combine, the same bits
    if (shape.max_keys > 0 && p.n_splits > 0 && n_chunks_for(shape.max_keys, chunk_len) <= p.single_chunks)
        p.n_splits = 1;
    p.q_scale = scale * LOG2E;
    p.k_new = p.v_new = nullptr;
    p.k_store = p.v_store = nullptr;
    p.positions = nullptr;
    p.theta = 0.0;
    p.rope_scaling = RopeScaling{};
    p.rope_dim = p.neox = 0;
    p.rope_tab_in = nullptr;
    p.rope_tab_out = nullptr;
    p.k_type = shape.k_type;
    p.v_type = shape.v_type;
    p.kq = kvq::plane(const_cast<void*>(k_cache), shape.k_type, n_kv_heads, max_ctx, head_dim);
    p.vq = kvq::plane(const_cast<void*>(v_cache), shape.v_type, n_kv_heads, max_ctx, head_dim);
    p.window = shape.window;
    p.ring_slots = shape.window_slots;
    p.k_ring = kvq::ring_of(k_cache, shape.k_type, n_kv_heads, max_ctx, head_dim, shape.window);
    p.v_ring = kvq::ring_of(v_cache, shape.v_type, n_kv_heads, max_ctx, head_dim, shape.window);
    p.oq = shape.o_codes;
    p.osc = shape.o_scales;
    return p;
}

// o's codes (fd_attention_shape_t.o_codes) where the launch can write them: none asked, or both pointers, head_dim
// 128 (a head is one 128-column group: the one block that writes a row's head -- split 0 of an unsplit row, or the
// combine's block of a split one -- holds all its values) and 4-byte stores.
inline bool o_codes_valid(const fd_attention_shape_t& s) {
    if (s.o_codes == nullptr && s.o_scales == nullptr) return true;
    return s.o_codes != nullptr && s.o_scales != nullptr && s.head_dim == XCODES_GROUP && ((uintptr_t)s.o_codes & 3u) == 0;
}

// FD_E_SHAPE where the device cannot give a block the kernel's shared memory (cudaFuncSetAttribute refuses it):
// head_dim 256 takes ~150 KB (float16; Cfg<256>), more than sm_86 / sm_89's 99 KB and HIP's 64 KB of LDS; the
// refusal is cleared from the runtime's last error so no later launch reports it.
template <int HD, bool ROPE = false, bool QKV = false, int KVT = 0, bool WIN = false, int MR = 0>
int launch(const Params& p, cudaStream_t stream) {
    const size_t smem = QKV ? qkv_smem_bytes<HD>(p.k_type, p.v_type, WIN)
                            : MR ? MrCfg<HD, MR>::SMEM_BYTES : Cfg<HD>::SMEM_BYTES;
    if (cudaFuncSetAttribute(splitk_kernel<HD, ROPE, QKV, KVT, WIN, MR>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem) != cudaSuccess) {
        (void)cudaGetLastError();
        return FD_E_SHAPE;
    }
    int st = launch_pdl(splitk_kernel<HD, ROPE, QKV, KVT, WIN, MR>, dim3(p.n_splits, p.n_kv_heads, p.n * p.row_tiles),
                        dim3(THREADS), smem, stream, p);
    // no combine where every row is short enough for split 0 alone (the row's keys never exceed max_ctx)
    if (st == 0 && p.n_splits > 1 && n_chunks_for(p.max_ctx, p.chunk_len) > p.single_chunks)
        st = launch_pdl(combine_kernel<HD>, dim3(p.n * p.n_heads), dim3(COMBINE_THREADS), 0, stream, p);
    return st;
}

// A quantized K or V runs the dequantizing loader (and, with ROPE, the quantizing new-row staging), one kernel per
// (K type, V type) pair: KVT = k_type * 4 + v_type (splitk_kernel says why).
// WIN: a window's kernels.
template <int HD, bool ROPE, bool WIN = false>
int launch_quant(const Params& p, cudaStream_t stream) {
    constexpr int F = FD_KV_F16, Q8 = FD_KV_Q8_0, Q4 = FD_KV_Q4_0;
    switch (p.k_type * 4 + p.v_type) {
        case F * 4 + Q8: return launch<HD, ROPE, true, F * 4 + Q8, WIN>(p, stream);
        case F * 4 + Q4: return launch<HD, ROPE, true, F * 4 + Q4, WIN>(p, stream);
        case Q8 * 4 + F: return launch<HD, ROPE, true, Q8 * 4 + F, WIN>(p, stream);
        case Q8 * 4 + Q8: return launch<HD, ROPE, true, Q8 * 4 + Q8, WIN>(p, stream);
        case Q8 * 4 + Q4: return launch<HD, ROPE, true, Q8 * 4 + Q4, WIN>(p, stream);
        case Q4 * 4 + F: return launch<HD, ROPE, true, Q4 * 4 + F, WIN>(p, stream);
        case Q4 * 4 + Q8: return launch<HD, ROPE, true, Q4 * 4 + Q8, WIN>(p, stream);
        case Q4 * 4 + Q4: return launch<HD, ROPE, true, Q4 * 4 + Q4, WIN>(p, stream);
        default: return FD_E_ARG;
    }
}

template <int HD, bool ROPE>
int launch_quant_or_window(const Params& p, cudaStream_t stream) {
    return p.window > 0 ? launch_quant<HD, ROPE, true>(p, stream) : launch_quant<HD, ROPE>(p, stream);
}

// fd_attention_masked_rope: float16 K and V, head_dim 64 or 128 (the entry point checks the rest)
inline int launch_masked_rope(const Params& p, int head_dim, cudaStream_t stream) {
    switch (head_dim) {
        case 64: return launch<64, false, false, 0, false, mr_stages<64>()>(p, stream);
        case 128: return launch<128, false, false, 0, false, mr_stages<128>()>(p, stream);
        default: return FD_E_SHAPE;
    }
}

template <bool ROPE = false>
int launch_head_dim(const Params& p, int head_dim, cudaStream_t stream) {
    const bool quant = p.k_type != FD_KV_F16 || p.v_type != FD_KV_F16;
    switch (head_dim) {
        case 64: return quant ? launch_quant_or_window<64, ROPE>(p, stream) : launch<64, ROPE>(p, stream);
        case 128: return quant ? launch_quant_or_window<128, ROPE>(p, stream) : launch<128, ROPE>(p, stream);
        case 256: return quant ? launch_quant_or_window<256, ROPE>(p, stream) : launch<256, ROPE>(p, stream);
        default: return FD_E_SHAPE;
    }
}

}  // namespace attn
}  // namespace fd
