// kv_compact.cu -- speculative decoding's commit: move the accepted tree path's K/V rows into
// consecutive cache slots (flashd.h: fd_kv_compact).
//
//   for every layer l, K and V, every KV head h, for i = 0 .. n_keep-1 in ascending order:
//       cache[l][kv][h][n_past + i][:] = cache[l][kv][h][n_past + src_offsets[i]][:]
//
// Layout: the whole cache is one allocation of 2 * n_layers planes, plane 2l = K of layer l and
// plane 2l+1 = V, each float16 [n_kv_heads][max_ctx][head_dim] (the flashd.h KV layout).
// src_offsets is strictly increasing with src_offsets[i] >= i (tree nodes are numbered parents
// first, and the path is a root-to-node chain), so in ascending i a row is only ever read before
// it is overwritten: row n_past + i is written at step i, and every later read is of a row
// n_past + src_offsets[j] >= n_past + j > n_past + i. Each thread owns one 32-bit column (two
// halves) of every row of its (plane, head) and walks i in order, so the only dependencies are
// within one thread and need no synchronisation. Rows with src_offsets[i] == i are skipped.
//
// Launch: grid (n_kv_heads, 2 * n_layers), block min(head_dim / 2, 128) threads striding over the
// head_dim / 2 columns. n_past is read from device memory (graph-replayable, like every per-step
// scalar); a source or destination slot at or past max_ctx is skipped (the host checks bounds).
// fd_kv_compact_ring makes the same moves in a KV window's rings, slot s at row s % ring_slots: a tree's
// slots are fewer than ring_slots apart, so a wrapped destination is never a later source.
#include "common.cuh"

namespace {

constexpr int KVC_MAX_THREADS = 128;

__global__ void __launch_bounds__(KVC_MAX_THREADS)
kv_compact_kernel(uint32_t* cache, const int32_t* __restrict__ src_offsets, const int32_t* __restrict__ n_past,
                  int n_keep, int max_ctx, int n_cols) {
    const int head = blockIdx.x, plane = blockIdx.y;
    const int64_t plane_rows = (int64_t)gridDim.x * max_ctx;
    uint32_t* rows = cache + ((int64_t)plane * plane_rows + (int64_t)head * max_ctx) * n_cols;
    const int base = n_past[0];
    for (int i = 0; i < n_keep; ++i) {
        const int src = src_offsets[i];
        if (src == i || base + src >= max_ctx || base + i >= max_ctx) continue;
        const uint32_t* from = rows + (int64_t)(base + src) * n_cols;
        uint32_t* to = rows + (int64_t)(base + i) * n_cols;
        for (int c = threadIdx.x; c < n_cols; c += blockDim.x) to[c] = from[c];
    }
}

// fd_kv_compact_rows: the same moves over n_planes planes of [n_kv_heads][max_ctx] rows of row_bytes bytes,
// plane p at base + p * plane_stride (a quantized cache's codes or scales of every layer), 16-bit columns.
// RING (fd_kv_compact_ring): max_ctx is the ring's rows and slot s is row s % max_ctx (a window ring).
template <bool RING>
__global__ void __launch_bounds__(KVC_MAX_THREADS)
kv_compact_rows_kernel(unsigned char* base, size_t plane_stride, const int32_t* __restrict__ src_offsets,
                       const int32_t* __restrict__ n_past, int n_keep, int max_ctx, int n_cols) {
    const int head = blockIdx.x, plane = blockIdx.y;
    uint16_t* rows = reinterpret_cast<uint16_t*>(base + (size_t)plane * plane_stride) + (int64_t)head * max_ctx * n_cols;
    const int start = n_past[0];
    for (int i = 0; i < n_keep; ++i) {
        const int src = src_offsets[i];
        if (src == i) continue;
        int from_row = start + src, to_row = start + i;
        if (RING) {
            if (from_row < 0 || to_row < 0) continue;
            from_row %= max_ctx;
            to_row %= max_ctx;
        } else if (from_row >= max_ctx || to_row >= max_ctx) {
            continue;
        }
        const uint16_t* from = rows + (int64_t)from_row * n_cols;
        uint16_t* to = rows + (int64_t)to_row * n_cols;
        for (int c = threadIdx.x; c < n_cols; c += blockDim.x) to[c] = from[c];
    }
}

int launch_compact_rows(bool ring, void* base, size_t plane_stride, int n_planes, int n_kv_heads, int max_ctx,
                        int row_bytes, const int32_t* src_offsets, const int32_t* n_past, int n_keep, void* stream) {
    if (n_keep == 0) return 0;
    const int n_cols = row_bytes / 2;
    const int threads = n_cols < KVC_MAX_THREADS ? n_cols : KVC_MAX_THREADS;
    const dim3 grid(n_kv_heads, n_planes);
    if (ring)
        kv_compact_rows_kernel<true><<<grid, threads, 0, (cudaStream_t)stream>>>(
            (unsigned char*)base, plane_stride, src_offsets, n_past, n_keep, max_ctx, n_cols);
    else
        kv_compact_rows_kernel<false><<<grid, threads, 0, (cudaStream_t)stream>>>(
            (unsigned char*)base, plane_stride, src_offsets, n_past, n_keep, max_ctx, n_cols);
    return FD_LAUNCH_STATUS();
}

}  // namespace

extern "C" int fd_kv_compact_rows(void* base, size_t plane_stride, int n_planes, int n_kv_heads, int max_ctx,
                                  int row_bytes, const int32_t* src_offsets, const int32_t* n_past, int n_keep,
                                  void* stream) {
    FD_CHECK_ARG(base && src_offsets && n_past && n_keep >= 0 && n_planes > 0 && n_kv_heads > 0 && max_ctx > 0);
    FD_CHECK_ARG(row_bytes > 0 && row_bytes % 2 == 0 && plane_stride % 2 == 0 && ((uintptr_t)base & 1u) == 0);
    FD_CHECK_ARG(n_kv_heads <= 65535 && n_planes <= 65535);
    return launch_compact_rows(false, base, plane_stride, n_planes, n_kv_heads, max_ctx, row_bytes, src_offsets,
                               n_past, n_keep, stream);
}

extern "C" int fd_kv_compact_ring(void* base, size_t plane_stride, int n_planes, int n_kv_heads, int ring_slots,
                                  int row_bytes, const int32_t* src_offsets, const int32_t* n_past, int n_keep,
                                  void* stream) {
    FD_CHECK_ARG(base && src_offsets && n_past && n_keep >= 0 && n_planes > 0 && n_kv_heads > 0 && ring_slots > 0);
    FD_CHECK_ARG(row_bytes > 0 && row_bytes % 2 == 0 && plane_stride % 2 == 0 && ((uintptr_t)base & 1u) == 0);
    FD_CHECK_ARG(n_kv_heads <= 65535 && n_planes <= 65535);
    return launch_compact_rows(true, base, plane_stride, n_planes, n_kv_heads, ring_slots, row_bytes, src_offsets,
                               n_past, n_keep, stream);
}

extern "C" int fd_kv_compact(void* cache, const int32_t* src_offsets, const int32_t* n_past, int n_keep,
                             int n_layers, int n_kv_heads, int max_ctx, int head_dim, void* stream) {
    FD_CHECK_ARG(cache && src_offsets && n_past && n_keep >= 0 && n_layers > 0 && n_kv_heads > 0 && max_ctx > 0);
    FD_CHECK_ARG(head_dim > 0 && head_dim % 2 == 0 && ((uintptr_t)cache & 3u) == 0);
    FD_CHECK_ARG(n_kv_heads <= 65535 && 2 * n_layers <= 65535);
    if (n_keep == 0) return 0;
    const int n_cols = head_dim / 2;                       // 32-bit columns: two float16 each
    const int threads = n_cols < KVC_MAX_THREADS ? n_cols : KVC_MAX_THREADS;
    kv_compact_kernel<<<dim3(n_kv_heads, 2 * n_layers), threads, 0, (cudaStream_t)stream>>>(
        (uint32_t*)cache, src_offsets, n_past, n_keep, max_ctx, n_cols);
    return FD_LAUNCH_STATUS();
}
