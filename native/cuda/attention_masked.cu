// attention_masked.cu -- attention of n new tokens under an explicit mask over the new tokens:
// speculative tree verification (flashd.h: fd_attention_masked).
//
//   token i attends every slot < *n_past and new slot *n_past + j iff mask[i * n + j] != 0
//   q (n, n_heads, head_dim) float32, o (n, n_heads * head_dim), K/V float16 [n_kv_heads][max_ctx][head_dim]
//
// Launch: splitk_kernel (attention_splitk.cuh) with one split: grid (1, n_kv_heads,
// ceil(n * G / 16)), 128 threads, G = n_heads / n_kv_heads. A block's 16 query rows are
// (token, head) pairs of one KV head's group, so every K/V row it streams (64-slot tiles, 3-stage
// cp.async pipeline) serves 16 rows at once on tensor cores; its 4 warps split each tile's slots
// and merge their online-softmax states at the end; masked new slots get probability 0. Blocks of
// the same KV head read the same cache rows close together in time, so DRAM sees the context
// about once and the rest hits L2.
//
// Limits: n <= 256 (the tree budget); head_dim 64, 128 or 256. Without a workspace argument the
// context cannot be split across blocks: parallelism is n_kv_heads * ceil(n * G / 16) blocks, each
// streaming the whole context. Fine for short contexts; at 32K slots a workspace (split-K as in
// fd_attention_decode) would cut the latency several-fold -- an ABI addition proposed to the lead.
// Measured (H200, 1.5B heads, graph replay incl. a 4.5 us floor): n = 16 or 64 at n_past 1K: 27 us,
// 8K: 149 us, 32K: 562 us (each block is latency-bound at ~1 us per 64-slot tile).
#include "attention_splitk.cuh"

namespace {

using namespace fd::attn;

constexpr int MAX_NEW = 256;

template <int HD>
int launch(const Params& p, int row_tiles, cudaStream_t stream) {
    const size_t smem = Cfg<HD>::SMEM_BYTES;
    cudaFuncSetAttribute(splitk_kernel<HD, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    return fd::launch_pdl(splitk_kernel<HD, true>, dim3(1, p.n_kv_heads, row_tiles), dim3(THREADS), smem, stream, p);
}

}  // namespace

extern "C" int fd_attention_masked(float* o, const float* q, const void* k_cache, const void* v_cache,
                                   const uint8_t* mask, const int32_t* n_past, int n, int n_heads, int n_kv_heads,
                                   int head_dim, int max_ctx, float scale, void* stream) {
    FD_CHECK_ARG(o && q && k_cache && v_cache && mask && n_past);
    FD_CHECK_ARG(n >= 0 && n <= MAX_NEW);
    FD_CHECK_ARG(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0);
    FD_CHECK_ARG(max_ctx > 0 && max_ctx <= INT32_MAX - CHUNK_MULTIPLE);
    FD_CHECK_ARG(isfinite(scale) && scale != 0.0f);
    FD_CHECK_ARG(((uintptr_t)k_cache & 15u) == 0 && ((uintptr_t)v_cache & 15u) == 0 &&
                 ((uintptr_t)o & 15u) == 0);                                      // 16-byte accesses
    if (n == 0) return 0;
    const int group = n_heads / n_kv_heads;
    const int row_tiles = (n * group + ROWS - 1) / ROWS;
    Params p;
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
    p.group = group;
    p.max_ctx = max_ctx;
    p.chunk_len = (max_ctx + CHUNK_MULTIPLE - 1) / CHUNK_MULTIPLE * CHUNK_MULTIPLE;   // one chunk: no split
    p.n_splits = 1;
    p.q_scale = scale * LOG2E;
    cudaStream_t s = (cudaStream_t)stream;
    switch (head_dim) {
        case 64: return launch<64>(p, row_tiles, s);
        case 128: return launch<128>(p, row_tiles, s);
        case 256: return launch<256>(p, row_tiles, s);
        default: return FD_E_SHAPE;
    }
}
