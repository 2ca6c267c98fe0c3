// attention_decode.cu -- attention of one new token over the KV cache, split-K over the context
// (flashd.h: fd_attention_decode, fd_attention_decode_workspace_bytes). The hot path at long
// context: every decode step runs it once per layer.
//
//   o (1, n_heads * head_dim) = softmax(q k^T * scale) v over cache slots [0, *n_past]
//   q (1, n_heads, head_dim) float32, already rotated; K/V float16 [n_kv_heads][max_ctx][head_dim]
//
// Launch (graph-capture safe: the grid depends only on the arguments, *n_past is read on the
// device; attention_masked.cu runs the same kernels, one token per block, for tree verification):
//   1. splitk_kernel (attention_splitk.cuh): grid (n_splits, n_kv_heads, ceil(G / 16)), 128
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
#include "attention_splitk.cuh"

using namespace fd::attn;

extern "C" size_t fd_attention_decode_workspace_bytes(int n_heads, int head_dim, int max_ctx, int chunk_len) {
    if (n_heads <= 0 || head_dim <= 0 || max_ctx <= 0 || chunk_len <= 0) return 0;
    const int n_chunks = n_chunks_for(max_ctx, chunk_len);
    const size_t n_splits = (size_t)(n_chunks < MAX_SPLITS ? n_chunks : MAX_SPLITS);
    return (size_t)n_heads * n_splits * ((size_t)head_dim + 2) * sizeof(float);
}

extern "C" size_t fd_attention_workspace_bytes(int n_tokens, int n_heads, int n_kv_heads, int head_dim, int max_ctx,
                                               int chunk_len) {
    if (n_tokens <= 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || max_ctx <= 0 ||
        chunk_len < CHUNK_MULTIPLE || chunk_len % CHUNK_MULTIPLE != 0)
        return 0;
    const int n_splits = splits_for_head_dim(head_dim, n_kv_heads, n_heads / n_kv_heads, max_ctx, chunk_len);
    return workspace_bytes_for(n_tokens * n_heads, n_splits, head_dim);
}

extern "C" int fd_attention_decode(float* o, const float* q, const void* k_cache, const void* v_cache,
                                   const int32_t* n_past, int n_heads, int n_kv_heads, int head_dim, int max_ctx,
                                   int chunk_len, float scale, void* workspace, void* stream) {
    FD_CHECK_ARG(o && q && k_cache && v_cache && n_past && workspace);
    FD_CHECK_ARG(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && max_ctx > 0);
    FD_CHECK_ARG(chunk_len >= CHUNK_MULTIPLE && chunk_len % CHUNK_MULTIPLE == 0);
    FD_CHECK_ARG(isfinite(scale) && scale != 0.0f);
    FD_CHECK_ARG(((uintptr_t)workspace & 15u) == 0 && ((uintptr_t)k_cache & 15u) == 0 &&
                 ((uintptr_t)v_cache & 15u) == 0 && ((uintptr_t)o & 15u) == 0);   // 16-byte accesses
    Params p = make_params(o, q, k_cache, v_cache, nullptr, n_past, 1, n_heads, n_kv_heads, head_dim, max_ctx,
                           chunk_len, scale);
    if (p.n_splits == 0) return FD_E_SHAPE;
    set_workspace(p, workspace, head_dim);
    return launch_head_dim(p, head_dim, (cudaStream_t)stream);
}
