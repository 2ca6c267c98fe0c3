// attention_masked.cu -- attention of n new tokens under an explicit mask over the new tokens:
// speculative tree verification, DFlash's non-causal block (flashd.h: fd_attention_masked).
//
//   token i attends every slot < *n_past and new slot *n_past + j iff mask[i * n + j] != 0
//   q (n, n_heads, head_dim) float32, o (n, n_heads * head_dim), K/V float16 [n_kv_heads][max_ctx][head_dim]
//
// Launch: the decode kernels of attention_decode.cu (attention_splitk.cuh) with one block per
// (split, KV head, token, row tile): grid (n_splits, n_kv_heads, n * ceil(G / 16)), 128 threads,
// then the combine kernel over n * n_heads rows. Token i's keys are the committed slots followed
// by its visible new slots in ascending order, split into chunk_len chunks exactly as decode
// splits them, so a tree node's output is bitwise the decode step's at the same position once the
// accepted path sits in consecutive slots (speculative decoding is exact on the GPU).
// Every token's blocks stream its context separately; blocks of one KV head read the same rows
// close together in time, so DRAM sees the context about once and the rest hits L2.
//
// Limits: n <= 256; head_dim 64, 128 or 256; workspace_bytes >= fd_attention_workspace_bytes(n, ...).
//
// fd_attention_masked_rope: the same launch with fd_rope_kv_write folded in (splitk_kernel's MR variant,
// attention_splitk_kernel.cuh): a verify forward's layers after the first need one attention launch a layer instead
// of two. Its rows' cos / sin come from the table the first layer's fd_rope_kv_write stored (mode 1 / 2).
#include "attention_splitk.cuh"

using namespace fd::attn;

extern "C" int fd_attention_masked(float* o, const float* q, const void* k_cache, const void* v_cache,
                                   const uint8_t* mask, const int32_t* n_past, int n, const fd_attention_shape_t* shape,
                                   int chunk_len, void* workspace, size_t workspace_bytes, void* stream) {
    FD_CHECK_ARG(o && q && k_cache && v_cache && mask && n_past);
    FD_CHECK_ARG(n >= 0 && n <= MAX_NEW);
    FD_CHECK_ARG(fd::shape_valid(shape, true) && shape->max_ctx <= INT32_MAX - CHUNK_MULTIPLE);
    FD_CHECK_ARG(chunk_len >= CHUNK_MULTIPLE && chunk_len % CHUNK_MULTIPLE == 0);
    FD_CHECK_ARG(isfinite(shape->scale) && shape->scale != 0.0f);
    FD_CHECK_ARG(((uintptr_t)workspace & 15u) == 0 && ((uintptr_t)k_cache & 15u) == 0 &&
                 ((uintptr_t)v_cache & 15u) == 0 && ((uintptr_t)o & 15u) == 0);   // 16-byte accesses
    if (n == 0) return 0;
    Params p = make_params(o, q, k_cache, v_cache, mask, n_past, n, *shape, chunk_len);
    if (p.n_splits == 0) return FD_E_SHAPE;
    FD_CHECK_ARG(o_codes_valid(*shape));
    if (workspace_bytes < workspace_bytes_for(n * shape->n_heads, p.n_splits, shape->head_dim)) return FD_E_ARG;
    FD_CHECK_ARG(workspace != nullptr || p.n_splits == 1);
    set_workspace(p, workspace, shape->head_dim);
    return launch_head_dim(p, shape->head_dim, (cudaStream_t)stream);
}

extern "C" int fd_attention_masked_rope(float* o, const float* q, const float* k, const float* v, void* k_cache,
                                        void* v_cache, const uint8_t* mask, const int32_t* n_past, int n,
                                        const fd_attention_shape_t* shape, const fd_rope_t* rope, int chunk_len,
                                        void* workspace, size_t workspace_bytes, void* stream) {
    static_assert(MR_MAX_NEW == FD_ATTENTION_MASKED_ROPE_MAX_NEW, "the header's bound");
    FD_CHECK_ARG(o && q && k && v && k_cache && v_cache && mask && n_past);
    FD_CHECK_ARG(n >= 0 && n <= MAX_NEW);
    FD_CHECK_ARG(fd::shape_valid(shape, true) && shape->max_ctx <= INT32_MAX - CHUNK_MULTIPLE);
    FD_CHECK_ARG(fd::rope_valid(rope, shape->head_dim) && rope->table_mode == 2);
    FD_CHECK_ARG(chunk_len >= CHUNK_MULTIPLE && chunk_len % CHUNK_MULTIPLE == 0);
    FD_CHECK_ARG(isfinite(shape->scale) && shape->scale != 0.0f);
    FD_CHECK_ARG(((uintptr_t)workspace & 15u) == 0 && ((uintptr_t)k_cache & 15u) == 0 &&
                 ((uintptr_t)v_cache & 15u) == 0 && ((uintptr_t)o & 15u) == 0 && ((uintptr_t)k & 15u) == 0 &&
                 ((uintptr_t)v & 15u) == 0);
    if (shape->k_type != FD_KV_F16 || shape->v_type != FD_KV_F16 || shape->window != 0 || n > MR_MAX_NEW ||
        (shape->head_dim != 64 && shape->head_dim != 128) || rope->rope_dim % 8 != 0)   // MrLane's quads
        return FD_E_SHAPE;
    if (n == 0) return 0;
    Params p = make_params(o, q, k_cache, v_cache, mask, n_past, n, *shape, chunk_len);
    if (p.n_splits == 0) return FD_E_SHAPE;
    FD_CHECK_ARG(o_codes_valid(*shape));
    if (workspace_bytes < workspace_bytes_for(n * shape->n_heads, p.n_splits, shape->head_dim)) return FD_E_ARG;
    FD_CHECK_ARG(workspace != nullptr || p.n_splits == 1);
    p.k_new = k;
    p.v_new = v;
    p.k_store = (__half*)k_cache;
    p.v_store = (__half*)v_cache;
    p.theta = (double)rope->theta;
    p.rope_scaling = fd::rope_scaling_from(rope->scaling);
    p.rope_dim = rope->rope_dim;
    p.neox = rope->neox != 0;
    p.rope_tab_in = rope->table;
    set_workspace(p, workspace, shape->head_dim);
    return launch_masked_rope(p, shape->head_dim, (cudaStream_t)stream);
}
