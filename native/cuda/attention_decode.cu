// attention_decode.cu -- attention of one new token over the KV cache, split-K over the context
// (flashd.h: fd_attention_decode, fd_attention_decode_rope, fd_attention_decode_workspace_bytes). The
// hot path at long context: every decode step runs it once per layer.
//
//   o (1, n_heads * head_dim) = softmax(q k^T * scale) v over cache slots [0, *n_past]
//   q (1, n_heads, head_dim) float32, already rotated; K/V float16 [n_kv_heads][max_ctx][head_dim]
//
// Launch (graph-capture safe: the grid depends only on the arguments, *n_past is read on the
// device; attention_masked.cu runs the same kernels, one token per block, for tree verification):
//   1. splitk_kernel (attention_splitk_kernel.cuh): grid (n_splits, n_kv_heads, ceil(G / 16)), 128
//      threads, G = n_heads / n_kv_heads. One block per (split, KV head) handles all G query heads
//      of the group (G <= 16 per block), so each K/V row is read from DRAM once, in 16-byte
//      cp.async pieces through a 3-stage shared-memory pipeline (tiles of 64 slots), and the
//      score/PV products run on tensor cores. The context [0, *n_past] is cut into chunks of
//      chunk_len slots; split s takes chunks s, s + n_splits, ... and writes one partial
//      (max, sum, unnormalised o) per query head to the workspace. n_splits is fixed per launch:
//      enough blocks to fill the GPU (BLOCKS_PER_SM * 132 SMs over n_kv_heads), capped by the
//      number of chunks max_ctx holds; at a shallow depth the splits with no chunk exit at once.
//   2. combine_kernel: one block per query head reduces the active splits' partials into o.
//   If max_ctx fits one chunk (n_splits == 1) the first kernel writes o itself.
//
// Both kernels use programmatic dependent launch on sm_90 (common.cuh: launch_pdl): their
// blocks become resident while the previous kernel drains, and the combine kernel starts waiting
// while the split kernel runs, hiding most of the launch latency inside a captured graph.
//
// chunk_len: a multiple of 64 (the tile), e.g. 64..512. It sets the granularity of the split:
// smaller chunks spread a short context over more blocks (lower latency at a few hundred slots);
// at depth every split streams several chunks, so bandwidth does not depend on it. 64 is the best
// choice measured (H200, graph replay: 9.0 us at depth 256 vs 11.9 us with 256; equal at 32K).
// Workspace: fd_attention_decode_workspace_bytes = n_heads * min(ceil(max_ctx / chunk_len), 512) *
// (head_dim + 2) floats, an upper bound over n_kv_heads (3.2 MB for the 1.5B model at max_ctx
// 32768, chunk 64); fd_attention_workspace_bytes(1, ...) is the exact need.
//
// Measured (bench/bench_attention_decode.py, H200, Qwen2.5-1.5B heads, graph replay including a
// 4.5 us event/graph floor): depth 256: 9.0 us; 8K: 12.1 us; 32K: 18.3 us (1.8 TB/s). The split
// kernel is latency-bound, not DRAM-bound (ncu: 2 blocks x 4 warps per SM, long-scoreboard and
// dependency stalls, DRAM ~50% busy at 32K); see the report for the next steps.
//
// fd_attention_decode_rope: the same attention with the new token's RoPE and K/V cache write folded in,
// so a one-row decode step needs no fd_rope_kv_write launch (a tiny kernel whose cost is all fixed
// launch/prologue/tail time, once per layer). Inputs are the QKV projection's outputs as they are:
//   q (1, n_heads, head_dim), k and v (1, n_kv_heads, head_dim) float32, unrotated; *positions (device
//   int32) the token's RoPE position; rope_dim / theta / neox / scaling as fd_rope_kv_write.
// Each split-kernel block rotates its tile of q rows while staging them; the block(s) of the split that
// owns slot *n_past (chunk *n_past / chunk_len, split chunk % n_splits) form the rotated K row and the V
// row of their KV head in float16, put them over that slot's row of the K/V tile in shared memory once
// the tile's cp.async copy has landed (the cache row may be stale: it is never used), and query-row
// tile 0 of them writes the rows to the cache at slot *n_past for later steps (not if the slot is
// outside [0, max_ctx), as fd_rope_kv_write). The rope arithmetic is rope_math.cuh's, shared with
// rope.cu, and the rest is the plain kernel's code with the same n_splits, so o and the cache rows are
// bit for bit those of fd_rope_kv_write + fd_attention_decode -- and hence of the tree verification
// path (fd_rope_kv_write + fd_attention_masked). A quantized K's key offset (k_offset, flashd_attention.h) is
// subtracted from the RoPE'd new key before its rotation, as fd_rope_kv_write does. q, k and v are not modified (unlike fd_rope_kv_write,
// the rotated q/k are not written back). Workspace: as fd_attention_decode.
#include "attention_splitk.cuh"

using namespace fd::attn;

extern "C" size_t fd_attention_decode_workspace_bytes(const fd_attention_shape_t* shape, int chunk_len) {
    if (!fd::shape_valid(shape, true) || chunk_len <= 0) return 0;
    const int n_chunks = n_chunks_for(shape->max_ctx, chunk_len);
    const size_t n_splits = (size_t)(n_chunks < MAX_SPLITS ? n_chunks : MAX_SPLITS);
    return (size_t)shape->n_heads * n_splits * ((size_t)shape->head_dim + 2) * sizeof(float);
}

extern "C" size_t fd_attention_workspace_bytes(int n_tokens, const fd_attention_shape_t* shape, int chunk_len) {
    if (n_tokens <= 0 || !fd::shape_valid(shape, true) || chunk_len < CHUNK_MULTIPLE || chunk_len % CHUNK_MULTIPLE != 0)
        return 0;
    const int n_splits = splits_for_head_dim(shape->head_dim, shape->n_kv_heads, shape->n_heads / shape->n_kv_heads,
                                             shape->max_ctx, chunk_len);
    return workspace_bytes_for(n_tokens * shape->n_heads, n_splits, shape->head_dim);
}

namespace {
// The checks both decode entry points make of the arguments they share (FD_E_ARG unless true); each entry
// point checks its own pointers for NULL first.
bool decode_args_valid(const float* o, const void* k_cache, const void* v_cache, const void* workspace,
                       const fd_attention_shape_t* shape, int chunk_len, bool codes_ok = false) {
    return fd::shape_valid(shape, codes_ok) && chunk_len >= CHUNK_MULTIPLE && chunk_len % CHUNK_MULTIPLE == 0 &&
           isfinite(shape->scale) && shape->scale != 0.0f && ((uintptr_t)workspace & 15u) == 0 &&
           ((uintptr_t)k_cache & 15u) == 0 && ((uintptr_t)v_cache & 15u) == 0 &&
           ((uintptr_t)o & 15u) == 0;   // 16-byte accesses
}
}  // namespace

extern "C" int fd_attention_decode(float* o, const float* q, const void* k_cache, const void* v_cache,
                                   const int32_t* n_past, const fd_attention_shape_t* shape, int chunk_len,
                                   void* workspace, void* stream) {
    FD_CHECK_ARG(o && q && k_cache && v_cache && n_past && workspace);
    FD_CHECK_ARG(decode_args_valid(o, k_cache, v_cache, workspace, shape, chunk_len));
    Params p = make_params(o, q, k_cache, v_cache, nullptr, n_past, 1, *shape, chunk_len);
    if (p.n_splits == 0) return FD_E_SHAPE;
    set_workspace(p, workspace, shape->head_dim);
    return launch_head_dim(p, shape->head_dim, (cudaStream_t)stream);
}

extern "C" int fd_attention_decode_rope(float* o, const float* q, const float* k, const float* v, void* k_cache,
                                        void* v_cache, const float* k_offset, const int32_t* positions, const int32_t* n_past,
                                        const fd_attention_shape_t* shape, const fd_rope_t* rope, int chunk_len,
                                        void* workspace, void* stream) {
    FD_CHECK_ARG(o && q && k && v && k_cache && v_cache && positions && n_past && workspace);
    FD_CHECK_ARG(fd::shape_valid(shape, true) && fd::rope_valid(rope, shape->head_dim));
    FD_CHECK_ARG(decode_args_valid(o, k_cache, v_cache, workspace, shape, chunk_len, true));
    Params p = make_params(o, q, k_cache, v_cache, nullptr, n_past, 1, *shape, chunk_len);
    if (p.n_splits == 0) return FD_E_SHAPE;
    FD_CHECK_ARG(o_codes_valid(*shape));
    p.k_new = k;
    p.k_offset = shape->k_type != FD_KV_F16 ? k_offset : nullptr;   // read only for a quantized (rotated) K
    p.v_new = v;
    p.k_store = (__half*)k_cache;
    p.v_store = (__half*)v_cache;
    p.positions = positions;
    p.theta = (double)rope->theta;
    p.rope_scaling = fd::rope_scaling_from(rope->scaling);
    p.rope_dim = rope->rope_dim;
    p.neox = rope->neox != 0;
    p.rope_tab_in = rope->table_mode == 2 ? rope->table : nullptr;
    p.rope_tab_out = rope->table_mode == 1 ? rope->table : nullptr;
    set_workspace(p, workspace, shape->head_dim);
    return launch_head_dim<true>(p, shape->head_dim, (cudaStream_t)stream);
}
