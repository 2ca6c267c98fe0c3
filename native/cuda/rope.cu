// rope.cu -- rotary position embedding fused with the KV-cache write (flashd_attention.h: fd_rope_kv_write).
//
// fd_rope_kv_write: q (n, n_heads, head_dim) and k (n, n_kv_heads, head_dim), float32, are rotated
// in place at positions[i]: for j < rope_dim / 2 the pair (a, b) = neox ? (x[j], x[j + rope_dim/2])
// : (x[2j], x[2j+1]) becomes (a cos - b sin, a sin + b cos) with angle = pos * theta^(-2j/rope_dim)
// (or, with `scaling`, linear / YaRN position scaling: rope_math.cuh); dims >= rope_dim are left alone.
// Then k and v (n, n_kv_heads, head_dim) are stored into the cache at slot *n_past + i: as float16
// (round to nearest even), float16 [n_kv_heads][max_ctx][head_dim] per layer (FD_KV_F16), or as q8_0 /
// q4_0 codes and scales (kv_quant.cuh) of the rotated float32 row, each of K and V in its own type. A slot outside [0, max_ctx) is not written (the device cannot report it; the
// host's memory plan keeps n_past + n <= max_ctx). q may be NULL (K/V injection without queries).
// A quantized K stores rotated keys (kv_rotate.cuh): after RoPE, every head of q and of k is Hadamard-rotated in
// place (whether or not the slot is stored: q must meet the rotated keys), and k is encoded in that basis. With a
// key offset (k_offset, [n_kv_heads][head_dim]: flashd_attention.h), head h of k has k_offset[h] subtracted just
// before its rotation (in the same warp, as fd_attention_decode_rope does), q is not changed.
//
// Accuracy (the arithmetic lives in rope_math.cuh, shared with fd_attention_decode_rope, which must
// match this kernel bit for bit): the reference (flashd ReferenceOps.rope) forms angles in float64
// and rounds cos/sin to float32; this kernel does the same -- inv_freq = pow(theta, -2j/rope_dim) and angle = pos *
// inv_freq in double, sincos in double (full argument reduction, unaffected by --use_fast_math),
// then (float) -- and evaluates a*c - b*s with separately rounded products (no FMA contraction),
// exactly like numpy's float32 expression. The result therefore equals the reference bit for bit
// except where CUDA's double pow/sincos (<= 2 ulp of a double) flips a float32 rounding of cos or
// sin: an error of at most 1 float ulp of cos/sin, i.e. |err| <= 1.2e-7 * (|a| + |b|), for any
// position (int32) and theta.
//
// Table (fd_rope_t.table_mode 1, ABI 31): block i also stores its cos / sin at table + i * rope_dim, the rows
// fd_attention_masked_rope reads in later layers (mode 2 is not read here).
//
// Launch: one block of 128 threads per token, with programmatic dependent launch (fd::launch_pdl). The block first
// tabulates cos/sin for its position (rope_dim / 2 <= 256 entries in shared memory) before pdl_wait, while the QKV
// projection runs (as a plain launch its whole time followed the projection's: bench/NOTES.md session 36), then walks
// (head, pair) for q and k, the unrotated tail of k, and v. Work per token is a few KB, so a simple mapping is
// enough. A quantized K or V is encoded after a __syncthreads (the rotated k is read back from global memory, where
// this block wrote it): one thread per (head, 32-value block), the block's values in order as ggml's loop.
// The float16 path runs the instructions it always ran. A quantized K adds the rotation between the two: a
// __syncthreads (RoPE'd q and k are in global memory), then one warp per head of q and of k rotates its row
// (kv_rotate.cuh: registers and shuffles, head_dim <= 32 * ROTATE_RMAX).
// A window (flashd_attention.h) adds, for each quantized side, the float16 copy of the values each block encodes,
// written by the same thread into the side's ring at row slot % window_slots.

#include "common.cuh"
#include "kv_quant.cuh"
#include "kv_rotate.cuh"
#include "rope_math.cuh"

namespace {

constexpr int ROPE_THREADS = 128;
constexpr int ROPE_MAX_HALF = 256;          // rope_dim <= 512
constexpr int ROTATE_RMAX = 16;             // a rotated (quantized) K: head_dim <= 512, 16 values per lane

__global__ void __launch_bounds__(ROPE_THREADS)
rope_kv_write_kernel(float* q, float* k, const float* __restrict__ v, __half* __restrict__ k_cache,
                     __half* __restrict__ v_cache, const int32_t* __restrict__ positions,
                     const int32_t* __restrict__ n_past, int n_heads, int n_kv_heads, int head_dim, int rope_dim,
                     double theta, int neox, const fd::RopeScaling scaling, int max_ctx, int k_type, int v_type,
                     const fd::kvq::Plane kq, const fd::kvq::Plane vq, const float* __restrict__ k_offset,
                     __half* __restrict__ k_ring, __half* __restrict__ v_ring, int ring_slots, float* table_out) {
    __shared__ float cos_s[ROPE_MAX_HALF], sin_s[ROPE_MAX_HALF];
    const int i = blockIdx.x;                 // token
    const int half = rope_dim / 2;
    // Launched with PDL (fd::launch_pdl): the positions are the forward's inputs, uploaded before it (or written by a
    // kernel at least two launches back, which has completed: every kernel of the library triggers its dependents only
    // after its own pdl_wait), so cos / sin -- a double pow and sincos a pair -- run before pdl_wait, under the QKV
    // projection; q, k, v, n_past and the caches only after it.
    const int pos = positions[i];
    for (int j = threadIdx.x; j < half; j += ROPE_THREADS)
        fd::rope_cos_sin(pos, j, rope_dim, theta, scaling, cos_s[j], sin_s[j]);
    fd::pdl_wait();                // q / k / v are the QKV projection's
    fd::pdl_launch_dependents();   // the attention may become resident (it waits for this kernel in its pdl_wait)
    if (table_out != nullptr)      // table_mode 1: token i's row of the table (flashd_attention.h), each thread its own
        for (int j = threadIdx.x; j < half; j += ROPE_THREADS) {   // pairs (after the wait: the buffer is the
            table_out[(size_t)i * rope_dim + 2 * j] = cos_s[j];       // stream's, whoever read it before)
            table_out[(size_t)i * rope_dim + 2 * j + 1] = sin_s[j];
        }
    __syncthreads();

    // (a, b) -> (a c - b s, a s + b c), products rounded separately as numpy does in float32 (rope_math.cuh)
    auto rotate = [&](float* x, int j, float& ra, float& rb) {
        int ia, ib;
        fd::rope_pair_dims(j, rope_dim, neox, ia, ib);
        const float a = x[ia], b = x[ib], c = cos_s[j], s = sin_s[j];
        ra = fd::rope_rotated(a, b, c, s, true);
        rb = fd::rope_rotated(b, a, c, s, false);
        x[ia] = ra;
        x[ib] = rb;
    };

    if (q != nullptr) {
        float* qi = q + (size_t)i * n_heads * head_dim;
        for (int p = threadIdx.x; p < n_heads * half; p += ROPE_THREADS) {
            float ra, rb;
            rotate(qi + (size_t)(p / half) * head_dim, p % half, ra, rb);
        }
    }

    const int slot = n_past[0] + i;
    const bool store = slot >= 0 && slot < max_ctx;
    float* ki = k + (size_t)i * n_kv_heads * head_dim;
    const float* vi = v + (size_t)i * n_kv_heads * head_dim;
    for (int p = threadIdx.x; p < n_kv_heads * half; p += ROPE_THREADS) {
        const int h = p / half, j = p % half;
        float ra, rb;
        rotate(ki + (size_t)h * head_dim, j, ra, rb);
        if (store && k_type == FD_KV_F16) {
            __half* row = k_cache + ((size_t)h * max_ctx + slot) * head_dim;
            int ia, ib;
            fd::rope_pair_dims(j, rope_dim, neox, ia, ib);
            row[ia] = __float2half_rn(ra);
            row[ib] = __float2half_rn(rb);
        }
    }
    if (k_type != FD_KV_F16) {                // rotated keys: q and k after RoPE, one warp per head
        __syncthreads();                      // every RoPE'd value of this token is in global memory
        const int lane = threadIdx.x % FD_WARP, n_r = head_dim / FD_WARP;
        const int n_rows = (q != nullptr ? n_heads : 0) + n_kv_heads;
        for (int r = threadIdx.x / FD_WARP; r < n_rows; r += ROPE_THREADS / FD_WARP) {
            const bool is_k = r < n_kv_heads;
            float* row = is_k ? ki + (size_t)r * head_dim : q + ((size_t)i * n_heads + (r - n_kv_heads)) * head_dim;
            fd::kvq::hadamard_rotate_row<ROTATE_RMAX>(row, n_r, lane,
                                                      is_k && k_offset ? k_offset + (size_t)r * head_dim : nullptr);
        }
    }
    if (!store) return;
    const int tail = head_dim - rope_dim;     // unrotated dims of k
    if (k_type == FD_KV_F16) {
        for (int e = threadIdx.x; e < n_kv_heads * tail; e += ROPE_THREADS) {
            const int h = e / tail, d = rope_dim + e % tail;
            k_cache[((size_t)h * max_ctx + slot) * head_dim + d] = __float2half_rn(ki[(size_t)h * head_dim + d]);
        }
    }
    if (v_type == FD_KV_F16) {
        for (int e = threadIdx.x; e < n_kv_heads * head_dim; e += ROPE_THREADS) {
            const int h = e / head_dim, d = e % head_dim;
            v_cache[((size_t)h * max_ctx + slot) * head_dim + d] = __float2half_rn(vi[e]);
        }
    }
    if (k_type == FD_KV_F16 && v_type == FD_KV_F16) return;
    __syncthreads();                          // every rotated k value of this token is in global memory (RoPE,
                                              // and for a quantized K the Hadamard rotation)
    const int n_blocks = head_dim / fd::kvq::BLOCK;
    for (int e = threadIdx.x; e < 2 * n_kv_heads * n_blocks; e += ROPE_THREADS) {
        const bool is_k = e < n_kv_heads * n_blocks;
        const int type = is_k ? k_type : v_type, hb = is_k ? e : e - n_kv_heads * n_blocks;
        if (type == FD_KV_F16) continue;
        const int h = hb / n_blocks, b = hb % n_blocks;
        const float* x = (is_k ? ki : vi) + (size_t)h * head_dim + b * fd::kvq::BLOCK;
        fd::kvq::encode_block(is_k ? kq : vq, type, (size_t)h * max_ctx + slot, b, x);
        __half* ring = is_k ? k_ring : v_ring;   // the window's float16 copy of the same values
        if (ring != nullptr) {
            __half* dst = ring + ((size_t)h * ring_slots + slot % ring_slots) * head_dim + b * fd::kvq::BLOCK;
            for (int j = 0; j < fd::kvq::BLOCK; ++j) dst[j] = __float2half_rn(x[j]);
        }
    }
}

}  // namespace

extern "C" int fd_rope_kv_write(float* q, float* k, const float* v, void* k_cache, void* v_cache,
                                const float* k_offset, const int32_t* positions, const int32_t* n_past, int n, const fd_attention_shape_t* shape,
                                const fd_rope_t* rope, void* stream) {
    FD_CHECK_ARG(k && v && k_cache && v_cache && positions && n_past && n >= 0);
    FD_CHECK_ARG(fd::shape_valid(shape) && fd::rope_valid(rope, shape->head_dim));
    if (rope->rope_dim / 2 > ROPE_MAX_HALF) return FD_E_SHAPE;
    if (shape->k_type != FD_KV_F16 && shape->head_dim > FD_WARP * ROTATE_RMAX) return FD_E_SHAPE;
    if (n == 0) return 0;
    const int kvh = shape->n_kv_heads, ctx = shape->max_ctx, hd = shape->head_dim;
    return fd::launch_pdl(
        rope_kv_write_kernel, dim3(n), dim3(ROPE_THREADS), 0, (cudaStream_t)stream, q, k, v, (__half*)k_cache,
        (__half*)v_cache, positions, n_past, shape->n_heads, shape->n_kv_heads, shape->head_dim, rope->rope_dim,
        (double)rope->theta, (int)(rope->neox != 0), fd::rope_scaling_from(rope->scaling), shape->max_ctx,
        shape->k_type, shape->v_type, fd::kvq::plane(k_cache, shape->k_type, kvh, ctx, hd),
        fd::kvq::plane(v_cache, shape->v_type, kvh, ctx, hd), shape->k_type != FD_KV_F16 ? k_offset : nullptr,
        fd::kvq::ring_of(k_cache, shape->k_type, kvh, ctx, hd, shape->window),
        fd::kvq::ring_of(v_cache, shape->v_type, kvh, ctx, hd, shape->window), shape->window_slots,
        rope->table_mode == 1 ? rope->table : nullptr);
}

extern "C" size_t fd_kv_window_offset(int kv_type, int n_kv_heads, int max_ctx, int head_dim) {
    if (n_kv_heads <= 0 || max_ctx <= 0 || head_dim <= 0 || kv_type == FD_KV_F16 ||
        !fd::kv_type_valid(kv_type, head_dim))
        return 0;
    return fd::kvq::window_offset(kv_type, n_kv_heads, max_ctx, head_dim);
}

extern "C" size_t fd_kv_plane_bytes(int kv_type, int n_kv_heads, int max_ctx, int head_dim) {
    if (n_kv_heads <= 0 || max_ctx <= 0 || head_dim <= 0 || !fd::kv_type_valid(kv_type, head_dim)) return 0;
    const size_t rows = (size_t)n_kv_heads * max_ctx;
    if (kv_type == FD_KV_F16) return rows * head_dim * 2;
    return rows * (fd::kvq::code_bytes(kv_type, head_dim) + 2 * (head_dim / fd::kvq::BLOCK));
}
