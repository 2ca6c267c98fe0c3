// attention_prefill.cu -- causal flash attention (FlashAttention-2 style) of a prefill chunk over
// the KV cache, on tensor cores.
//
//   q (n, n_heads, head_dim) f32, already rotated; k/v cache f16 [n_kv_heads][max_ctx][head_dim]
//   (this layer); the n new tokens sit at slots p0 + i with p0 = *n_past (device memory), and
//   token i attends slots [0, p0 + i]. Query head h reads kv head h / (n_heads / n_kv_heads).
//   o (n, n_heads * head_dim) f32 = softmax(scale * q k^T) v per (token, head).
//
// Rows: the G = n_heads / n_kv_heads query heads of one kv head are processed together, as
// "flattened rows" R = token * G + head_in_group (R < n * G). A block takes BQ = 16 * NQW
// consecutive rows of one kv head, so each K/V tile it stages serves all G heads (GQA reuse) and
// the causal diagonal of a tile spans only BQ / G tokens. Blocks run latest rows first (they see
// the most keys), for load balance.
//
// Per block: NQW x NKS warps. Warp (wq, ks) owns rows wq*16 .. wq*16+15 and, of every 64-key tile,
// the KW = 64 / NKS keys ks*KW .. ks*KW+KW-1; the NKS partial softmax states of a row are merged
// through shared memory at the end (split over keys inside the block, so that short query ranges
// -- n = 512 with 8K of context -- still give 8 warps per block). The tile loop (cp.async K/V ring,
// S = Q K^T and O += P V by mma.sync, online softmax in exp2) is attention_tile.cuh's, shared with
// attention_sparse.cu; here a tile j holds slots 64j .. 64j+63 and the causal mask is applied only
// on tiles that cross the diagonal of the block's first row (tiles wholly past the last row's
// diagonal are never visited).
//
// Configurations (launcher): NQW x NKS = 4 x 1 (4 warps, 3 stages; many blocks) and 4 x 2 (8 warps,
// 4 stages; fewer blocks than SMs, e.g. a 512-token chunk after a long context) at head_dim 64 and 128.
// head_dim 256 (launch_mma_for says which shape where): Q in shared memory rather than in registers (o_acc
// alone is 128 floats a lane), 32-key tiles split over 2 warps, 8 or 4 warps a block.
//
// SIMT fallback (HIP, pre-sm_80 devices, or misaligned pointers): one warp per (token, head),
// online softmax over the visible slots one key at a time, q rounded to f16 as in the mma path.
#include "attention_tile.cuh"

#include <limits.h>

namespace fd {
namespace {

constexpr int FLASH_BKV = flash::BKV;   // keys per tile

// Shared memory (bytes): [Q tile, QS only: BQ rows x KV_LD halves] [K ring] [V ring] (QKV: then the raw ring);
// after the tile loop the merge area (NKS > 1) reuses it from offset 0: o parts [0, merge_o_bytes), then m / l.
template <int HD_, int NQW_, int NKS_, int STAGES_, int MIN_BLOCKS_, int BK_ = FLASH_BKV, bool QS_ = false>
struct FlashCfg {
    static constexpr int HD = HD_, NQW = NQW_, NKS = NKS_, MIN_BLOCKS = MIN_BLOCKS_;
    static constexpr int STAGES = STAGES_;                 // K/V ring depth (STAGES - 1 tiles in flight)
    static constexpr int BK = BK_;                         // keys per tile (a multiple of 16 * NKS)
    static constexpr bool QS = QS_;                        // Q fragments read from shared memory, not registers
    static constexpr int n_warps = NQW * NKS;
    static constexpr int n_threads = 32 * n_warps;
    static constexpr int BQ = 16 * NQW;                    // flattened rows per block
    static constexpr int KW = BK / NKS;                    // keys per warp per tile
    static_assert(KW % 16 == 0 && FLASH_BKV % BK == 0, "tile shape");
    static constexpr int kv_tile_halves = BK * flash::KV_LD<HD>;
    static constexpr int q_bytes = QS ? BQ * flash::KV_LD<HD> * 2 : 0;   // f16 Q tile
    static constexpr int kv_bytes = 2 * STAGES * kv_tile_halves * 2;  // {K, V} x STAGES, f16
    static constexpr int O_LD = HD + 8;                    // floats per row of a partial O (merge)
    static constexpr int merge_o_bytes = NKS > 1 ? n_warps * 16 * O_LD * 4 : 0;
    static constexpr int merge_ml_bytes = NKS > 1 ? n_warps * 16 * 2 * 4 : 0;
    static constexpr int merge_ml_offset = q_bytes + kv_bytes > merge_o_bytes ? q_bytes + kv_bytes : merge_o_bytes;
    static constexpr int smem_bytes = merge_ml_offset + merge_ml_bytes;
};

#if FD_HAS_MMA

// QKV: a q8_0 / q4_0 K or V (kr / vr), staged as stored through a raw ring of STAGES - 1 stages and
// dequantized into two float16 tiles (attention_tile.cuh kv_ring_raw; shared memory qkv_smem_bytes); the float16
// kernel (QKV false) loads as it always did.
//
// WIN (a window, flashd_attention.h: QKV with window > 0): a block's rows lie in one window block of positions
// (window_rows_of: the grid holds a few more blocks than rows need, idle ones return), so they share win_start =
// window * (position / window), a multiple of 64: tiles below it are read as stored (the raw ring), the tiles from it
// on from the window's float16 rows through the double-buffered float16 tiles (flash::kv_ring of 2 stages), in
// key order, into the same online softmax.
struct Window {
    int window;                  // U (0: none)
    flash::WinSide k, v;
};

// WIN: flattened rows [row0, row_end) of block b (b = 0 .. gridDim.x - 1), or row0 = row_end = -1 for an idle block.
// Tokens split at positions p0 + t that are multiples of U: segment lengths f = min(n, U - p0 % U), then U, ..., each
// ceil(len * group / BQ) blocks of BQ rows (the last one short). At most ceil(n / U) + 1 segments: the launcher's
// grid (window_grid) has a block for every one of them. tests/emulation/test_prefill_window_rows.py checks the map.
__device__ __forceinline__ void window_rows_of(int b, int p0, int n, int group, int bq, int window, int& row0,
                                               int& row_end) {
    int t0 = 0, len = min(n, window - p0 % window);
    while (t0 < n) {
        const int blocks = (len * group + bq - 1) / bq;
        if (b < blocks) {
            row0 = t0 * group + b * bq;
            row_end = min(row0 + bq, (t0 + len) * group);
            return;
        }
        b -= blocks;
        t0 += len;
        len = min(window, n - t0);
    }
    row0 = row_end = -1;
}

template <class C, bool QKV = false, bool WIN = false>
__global__ void __launch_bounds__(C::n_threads, C::MIN_BLOCKS) attention_prefill_mma_kernel(
    float* __restrict__ o, const float* __restrict__ q, const __half* __restrict__ k_cache,
    const __half* __restrict__ v_cache, const int32_t* __restrict__ n_past, int n, int n_heads, int n_kv_heads,
    int max_ctx, float scale_log2, const kvq::Rows kr, const kvq::Rows vr, const Window win) {
#if FD_MMA_DEVICE_OK
    static_assert(!WIN || QKV, "a window reads a quantized side");
    using namespace fd::mma;
    constexpr int HD = C::HD, KW = C::KW, BK = C::BK, LD = flash::KV_LD<HD>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int N_BUF = QKV ? 2 : C::STAGES;                 // float16 tiles (QKV: double buffer)
    __half* q_smem = reinterpret_cast<__half*>(smem_raw);      // QS: [BQ][LD]
    __half* k_smem = reinterpret_cast<__half*>(smem_raw + C::q_bytes);   // [N_BUF][BK][LD]
    __half* v_smem = k_smem + N_BUF * C::kv_tile_halves;       // [N_BUF][BK][LD]
    uint8_t* raw = reinterpret_cast<uint8_t*>(v_smem + N_BUF * C::kv_tile_halves);   // QKV: the raw ring

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wq = warp % C::NQW, ks = warp / C::NQW;
    const int g = lane / 4, t = lane % 4;
    const int group = n_heads / n_kv_heads;
    const int kvh = blockIdx.y;
    const int p0 = max(*n_past, 0);
    int row0 = (gridDim.x - 1 - blockIdx.x) * C::BQ;           // latest rows (most keys) first
    int n_rows = n * group;                                    // (WIN: the end of the block's rows)
    if constexpr (WIN) {
        window_rows_of(gridDim.x - 1 - blockIdx.x, p0, n, group, C::BQ, win.window, row0, n_rows);
        if (row0 < 0) return;                                  // past the last segment's blocks
    }
    // last visible slot of a token, clamped into the cache (only a caller breaking
    // *n_past + n <= max_ctx could need the clamp; it keeps every read in bounds)
    auto last_slot = [&](int token) { return min(p0 + token, max_ctx - 1); };
    const int first_lim = last_slot(row0 / group);
    const int kv_len = last_slot(min(row0 + C::BQ - 1, n_rows - 1) / group) + 1;   // slots [0, kv_len) read
    const int n_tiles = ceil_div(kv_len, BK);

    // ---- Q fragments of this warp's 16 rows (A operand, f16) and their visible limits ---------
    // (QS: the block's BQ rows into q_smem, warp w rows w, w + n_warps, ...; the tile loop's first
    // __syncthreads, before any attend, makes them visible)
    uint32_t qf[C::QS ? 1 : HD / 16][4];
    int lim[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = min(row0 + wq * 16 + g + 8 * h, n_rows - 1);   // padding rows repeat the last row
        const int token = r / group, head = kvh * group + r % group;
        lim[h] = last_slot(token);
        if constexpr (!C::QS) flash::load_q_row<HD>(qf, q + ((size_t)token * n_heads + head) * HD, h, t);
    }
    if constexpr (C::QS) {
        for (int rb = warp; rb < C::BQ; rb += C::n_warps) {
            const int r = min(row0 + rb, n_rows - 1);
            const int token = r / group, head = kvh * group + r % group;
            flash::store_q_row<HD, 32>(q_smem + rb * LD, q + ((size_t)token * n_heads + head) * HD, lane);
        }
    }

    float o_acc[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_acc[d][e] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY};   // running max of rows g, g+8 (log2 domain)
    float l_run[2] = {0.f, 0.f};               // this thread's partial row sums

    // tile j: slots 64j .. 64j+63, those at or past kv_len zero-filled; masked only where a key can
    // pass the block's first row's diagonal
    auto attend = [&](int j, int stage) {
        const __half* k_tile = k_smem + stage * C::kv_tile_halves + (ks * KW) * LD;
        const __half* v_tile = v_smem + stage * C::kv_tile_halves + (ks * KW) * LD;
        float s[KW / 8][4];
        if constexpr (C::QS)
            flash::qk_tile_smem<HD, KW>(s, q_smem + wq * 16 * LD, k_tile, lane);
        else
            flash::qk_tile<HD, KW>(s, qf, k_tile, lane);
        flash::scale_mask<KW, false>(s, scale_log2, j * BK + ks * KW, j * BK + BK - 1 > first_lim, lim, lane);
        flash::softmax_pv<HD, KW>(s, v_tile, lane, m_run, l_run, o_acc);
    };
    if constexpr (QKV) {
        const int k_bytes = BK * kvq::staged_row_bytes(kr.type, HD);
        const int stage_bytes = k_bytes + BK * kvq::staged_row_bytes(vr.type, HD);
        const size_t head_row = (size_t)kvh * max_ctx;
        // WIN: tiles [n_raw, n_tiles) are the window's (the block's first row's block start, a multiple of BK)
        const int n_raw = WIN ? min(n_tiles, win.window * ((p0 + row0 / group) / win.window) / BK) : n_tiles;
        flash::kv_ring_raw<C::STAGES - 1>(
            n_raw,
            [&](int tile, int slot) {
                uint8_t* dst = raw + (size_t)slot * stage_bytes;
                flash::stage_raw_side<HD, C::n_threads, BK>(dst, kr, head_row, tile * BK, kv_len, tid);
                flash::stage_raw_side<HD, C::n_threads, BK>(dst + k_bytes, vr, head_row, tile * BK, kv_len, tid);
            },
            [&](int slot, int buf) {
                const uint8_t* src = raw + (size_t)slot * stage_bytes;
                flash::dequant_raw_side<HD, C::n_threads, BK>(k_smem + buf * C::kv_tile_halves, src, kr.type, tid);
                flash::dequant_raw_side<HD, C::n_threads, BK>(v_smem + buf * C::kv_tile_halves, src + k_bytes, vr.type,
                                                              tid);
            },
            attend);
        if constexpr (WIN) {
            cp_async_wait<0>();
            __syncthreads();                                   // every warp done with the float16 tiles
            flash::kv_ring<2>(n_tiles - n_raw, [&](int tile, int stage) {
                flash::load_window_tile<HD, C::n_threads, BK>(k_smem, v_smem, stage, win.k, win.v, kvh,
                                                              (n_raw + tile) * BK, kv_len, tid);
            }, [&](int tile, int stage) { attend(n_raw + tile, stage); });
        }
    } else {
        flash::kv_ring<C::STAGES>(n_tiles, [&](int tile, int stage) {
            flash::load_kv_tile<HD, C::n_threads, false, BK>(k_smem, v_smem, stage, k_cache, v_cache, kvh, max_ctx,
                                                             tile * BK, kv_len, tid);
        }, attend);
    }

#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    }

    if constexpr (C::NKS == 1) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + wq * 16 + g + 8 * h;
            if (r >= n_rows) continue;
            const int token = r / group, head = kvh * group + r % group;
            float* o_row = o + ((size_t)token * n_heads + head) * HD;
            const float inv = 1.f / l_run[h];   // >= 1: the row's maximum contributes exp2(0)
#pragma unroll
            for (int d = 0; d < HD / 8; ++d)
                *reinterpret_cast<float2*>(o_row + d * 8 + 2 * t) =
                    make_float2(o_acc[d][2 * h] * inv, o_acc[d][2 * h + 1] * inv);
        }
    } else {
        // merge the NKS key splits of each row: m* = max m_s, o = sum_s 2^(m_s - m*) O_s / sum_s 2^(m_s - m*) l_s
        __syncthreads();   // all warps done with K/V shared memory (reused below)
        float* o_part = reinterpret_cast<float*>(smem_raw);                         // [n_warps][16][O_LD]
        float* ml = reinterpret_cast<float*>(smem_raw + (QKV ? C::merge_o_bytes : C::merge_ml_offset));   // [n_warps][16][2]
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int rr = g + 8 * h;
#pragma unroll
            for (int d = 0; d < HD / 8; ++d)
                *reinterpret_cast<float2*>(o_part + (warp * 16 + rr) * C::O_LD + d * 8 + 2 * t) =
                    make_float2(o_acc[d][2 * h], o_acc[d][2 * h + 1]);
            if (t == 0) {
                ml[(warp * 16 + rr) * 2 + 0] = m_run[h];
                ml[(warp * 16 + rr) * 2 + 1] = l_run[h];
            }
        }
        __syncthreads();
        for (int idx = tid; idx < C::BQ * (HD / 4); idx += C::n_threads) {
            const int rb = idx / (HD / 4), d = (idx % (HD / 4)) * 4;   // row in block, first dim
            const int r = row0 + rb;
            if (r >= n_rows) continue;
            const int wq_r = rb / 16, rr = rb % 16;
            float m_star = -INFINITY;
#pragma unroll
            for (int sp = 0; sp < C::NKS; ++sp) m_star = fmaxf(m_star, ml[((sp * C::NQW + wq_r) * 16 + rr) * 2]);
            const float m_ref = m_star == -INFINITY ? 0.f : m_star;
            float l_star = 0.f;
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int sp = 0; sp < C::NKS; ++sp) {
                const int w = sp * C::NQW + wq_r;
                const float f = exp2f(ml[(w * 16 + rr) * 2] - m_ref);
                l_star += f * ml[(w * 16 + rr) * 2 + 1];
                const float4 part = *reinterpret_cast<const float4*>(o_part + (w * 16 + rr) * C::O_LD + d);
                acc.x += f * part.x;
                acc.y += f * part.y;
                acc.z += f * part.z;
                acc.w += f * part.w;
            }
            const float inv = 1.f / l_star;
            const int token = r / group, head = kvh * group + r % group;
            *reinterpret_cast<float4*>(o + ((size_t)token * n_heads + head) * HD + d) =
                make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
        }
    }
#else
    __trap();   // built for a target without mma.sync m16n8k16; launchers never pick this kernel there
#endif
}

#endif  // FD_HAS_MMA

// ---- SIMT fallback: one warp per (token, head) row --------------------------------------------
constexpr int SIMT_WARPS = 4;

template <int HD>
__global__ void __launch_bounds__(SIMT_WARPS* FD_WARP) attention_prefill_simt_kernel(
    float* __restrict__ o, const float* __restrict__ q, const __half* __restrict__ k_cache,
    const __half* __restrict__ v_cache, const int32_t* __restrict__ n_past, int n, int n_heads, int n_kv_heads,
    int max_ctx, float scale_log2) {
    constexpr int PER_LANE = HD / FD_WARP;   // dims d = lane + FD_WARP * i
    const int lane = threadIdx.x % FD_WARP;
    const int row = blockIdx.x * SIMT_WARPS + threadIdx.x / FD_WARP;   // token * n_heads + head
    if (row >= n * n_heads) return;
    const int token = row / n_heads, head = row % n_heads;
    const int kvh = head / (n_heads / n_kv_heads);
    const int lim = min(max(*n_past, 0) + token, max_ctx - 1);
    float qv[PER_LANE], acc[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        qv[i] = __half2float(__float2half_rn(q[(size_t)row * HD + lane + FD_WARP * i]));
        acc[i] = 0.f;
    }
    const __half* k_head = k_cache + (size_t)kvh * max_ctx * HD;
    const __half* v_head = v_cache + (size_t)kvh * max_ctx * HD;
    float m_run = -INFINITY, l_run = 0.f;
    for (int slot = 0; slot <= lim; ++slot) {
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) dot += qv[i] * __half2float(k_head[(size_t)slot * HD + lane + FD_WARP * i]);
        const float s = warp_sum(dot) * scale_log2;
        const float m_new = fmaxf(m_run, s);
        const float alpha = exp2f(m_run - m_new), p = exp2f(s - m_new);
        l_run = l_run * alpha + p;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
            acc[i] = acc[i] * alpha + p * __half2float(v_head[(size_t)slot * HD + lane + FD_WARP * i]);
        m_run = m_new;
    }
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) o[(size_t)row * HD + lane + FD_WARP * i] = acc[i] / l_run;
}

template <int HD>
int launch_simt(float* o, const float* q, const __half* k_cache, const __half* v_cache, const int32_t* n_past, int n,
                int n_heads, int n_kv_heads, int max_ctx, float scale_log2, cudaStream_t stream) {
    const int n_blocks = ceil_div(n * n_heads, SIMT_WARPS);
    attention_prefill_simt_kernel<HD><<<n_blocks, SIMT_WARPS * FD_WARP, 0, stream>>>(
        o, q, k_cache, v_cache, n_past, n, n_heads, n_kv_heads, max_ctx, scale_log2);
    return FD_LAUNCH_STATUS();
}

#if FD_HAS_MMA

// Shared memory of the QKV kernel: two float16 K | V tiles then STAGES - 1 raw stages of both sides
// (attention_tile.cuh kv_ring_raw), or the merge area if larger (o parts [0, merge_o_bytes), then m / l). For
// q8_0 at HD 128 that is the float16 kernel's 3 tiles in the 4x1 configuration (2 + 2 x 0.5), less in 4x2.
template <class C>
size_t qkv_smem_bytes(int k_type, int v_type) {
    const size_t row_bytes = kvq::staged_row_bytes(k_type, C::HD) + kvq::staged_row_bytes(v_type, C::HD);
    const size_t pipe = C::q_bytes + 2 * 2 * C::kv_tile_halves * sizeof(__half) + (C::STAGES - 1) * C::BK * row_bytes;
    const size_t merge = (size_t)C::merge_o_bytes + C::merge_ml_bytes;
    return pipe > merge ? pipe : merge;
}

template <class C, bool QKV = false>
size_t smem_bytes_for(const kvq::Rows& kr, const kvq::Rows& vr) {
    return QKV ? qkv_smem_bytes<C>(kr.type, vr.type) : (size_t)C::smem_bytes;
}

// FD_E_SHAPE where the device's per-block shared memory (smem_optin) cannot hold the configuration
// WIN's grid: a block per BQ rows of each window segment (window_rows_of), whatever *n_past is
inline int window_grid(int n, int group, int bq, int window) {
    return ceil_div(n * group, bq) + ceil_div(n, window) + 1;
}

template <class C, bool QKV = false>
int launch_mma(int smem_optin, float* o, const float* q, const __half* k_cache, const __half* v_cache,
               const int32_t* n_past, int n, int n_heads, int n_kv_heads, int max_ctx, float scale_log2,
               cudaStream_t stream, const kvq::Rows& kr, const kvq::Rows& vr, const Window& win) {
    const bool windowed = QKV && win.window > 0;
    const auto kernel = windowed ? attention_prefill_mma_kernel<C, QKV, QKV> : attention_prefill_mma_kernel<C, QKV>;
    const size_t smem = smem_bytes_for<C, QKV>(kr, vr);
    if (smem > (size_t)smem_optin) return FD_E_SHAPE;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return (int)err;
    const int group = n_heads / n_kv_heads;
    const dim3 grid(windowed ? window_grid(n, group, C::BQ, win.window) : ceil_div(n * group, C::BQ), n_kv_heads);
    kernel<<<grid, C::n_threads, smem, stream>>>(o, q, k_cache, v_cache, n_past, n, n_heads, n_kv_heads,
                                                          max_ctx, scale_log2, kr, vr, win);
    return FD_LAUNCH_STATUS();
}

// 64 rows per block. With at least one block per SM: 4 warps per block, a 3-deep K/V ring, two
// blocks per SM. With fewer blocks (n = 512 with GQA: 96 or 112 blocks): 8 warps splitting each key
// tile and a 4-deep ring, one block per SM. Measured on an H200: 4x1 is 1.4x faster than 4x2 at
// n = 8192, they tie at n = 512 after 8K of context, where the deeper ring gains 10% at head_dim 64;
// 32-row blocks (2 x 4 warps) were slower everywhere.
//
// head_dim 256: o_acc is 128 floats a lane and the register Q fragments would be 64 more, so Q is read from
// shared memory (QS). A 64-key K | V stage is 66 KB here, so every head_dim-256 shape takes 32-key tiles with
// 2 warps per row group (16 keys each: NKS 2, KW 16). One key split for all of them means each row's arithmetic
// is the same in every shape, float16 or quantized -- the quantized kernel is bit for bit the float16 one over
// the dequantized values, as at 64 / 128 (tests/gpu/test_attention_kv_quant.py):
//   wide   8 warps over 64-row blocks, 3-stage ring: 132 KB float16 (sm_80's 163 KB, sm_90's 227 KB), 133-148 KB
//          quantized (2-deep raw ring), where 64-row blocks are at least as many as SMs;
//   narrow 4 warps over 32-row blocks (twice the blocks for short chunks), 2-stage ring: 83 KB float16 (sm_86 /
//          sm_89's 99 KB take only this one), 101-132 KB quantized; also where the wide one does not fit.
// FD_E_SHAPE where neither fits (launch_mma). Neither shape is timed against the other yet.
template <int HD, bool QKV = false>
int launch_mma_for(const MmaDevice& dev, float* o, const float* q, const __half* k_cache, const __half* v_cache,
                   const int32_t* n_past, int n, int n_heads, int n_kv_heads, int max_ctx, float scale_log2,
                   cudaStream_t stream, const kvq::Rows& kr, const kvq::Rows& vr, const Window& win) {
    const int blocks_64 = ceil_div(n * (n_heads / n_kv_heads), 64) * n_kv_heads;
    if constexpr (HD == 256) {
        using Wide = FlashCfg<256, 4, 2, 3, 1, 32, true>;
        using Narrow = FlashCfg<256, 2, 2, QKV ? 3 : 2, 1, 32, true>;   // QKV: STAGES - 1 = 2 raw stages
        if (smem_bytes_for<Wide, QKV>(kr, vr) <= (size_t)dev.smem_optin && blocks_64 >= dev.n_sms)
            return launch_mma<Wide, QKV>(dev.smem_optin, o, q, k_cache, v_cache, n_past, n, n_heads, n_kv_heads,
                                         max_ctx, scale_log2, stream, kr, vr, win);
        return launch_mma<Narrow, QKV>(dev.smem_optin, o, q, k_cache, v_cache, n_past, n, n_heads, n_kv_heads,
                                       max_ctx, scale_log2, stream, kr, vr, win);
    } else {
        if (blocks_64 >= dev.n_sms)
            return launch_mma<FlashCfg<HD, 4, 1, 3, 2>, QKV>(dev.smem_optin, o, q, k_cache, v_cache, n_past, n,
                                                              n_heads, n_kv_heads, max_ctx, scale_log2, stream, kr, vr, win);
        return launch_mma<FlashCfg<HD, 4, 2, 4, 1>, QKV>(dev.smem_optin, o, q, k_cache, v_cache, n_past, n, n_heads,
                                                          n_kv_heads, max_ctx, scale_log2, stream, kr, vr, win);
    }
}

#endif  // FD_HAS_MMA

}  // namespace
}  // namespace fd

extern "C" int fd_attention_prefill(float* o, const float* q, const void* k_cache, const void* v_cache,
                                    const int32_t* n_past, int n, const fd_attention_shape_t* shape, void* stream) {
    FD_CHECK_ARG(o && q && k_cache && v_cache && n_past && n >= 1 && fd::shape_valid(shape));
    const int n_heads = shape->n_heads, n_kv_heads = shape->n_kv_heads, head_dim = shape->head_dim;
    const int max_ctx = shape->max_ctx;
    const float scale = shape->scale;
    FD_CHECK_ARG((int64_t)n * n_heads <= INT_MAX && isfinite(scale));
    if (head_dim != 64 && head_dim != 128 && head_dim != 256) return FD_E_SHAPE;
    const __half* kc = static_cast<const __half*>(k_cache);
    const __half* vc = static_cast<const __half*>(v_cache);
    const float scale_log2 = scale * fd::flash::LOG2E;
    cudaStream_t s = (cudaStream_t)stream;
#if FD_HAS_MMA
    fd::MmaDevice dev;
    cudaError_t err = fd::query_mma_device(&dev);
    if (err != cudaSuccess) return (int)err;
    // float2 q loads, float2 / float4 o stores, 16-byte cp.async of cache rows
    const bool aligned = fd::is_aligned(o, 16) && fd::is_aligned(q, 8) && fd::is_aligned(kc, 16) &&
                         fd::is_aligned(vc, 16);
    const fd::kvq::Rows kr = fd::kvq::rows_of(k_cache, shape->k_type, n_kv_heads, max_ctx, head_dim);
    const fd::kvq::Rows vr = fd::kvq::rows_of(v_cache, shape->v_type, n_kv_heads, max_ctx, head_dim);
    // the window's float16 rows: a quantized side's ring, a float16 side's cache
    const auto win_side = [&](const void* cache, int type) {
        __half* ring = fd::kvq::ring_of(cache, type, n_kv_heads, max_ctx, head_dim, shape->window);
        return ring != nullptr ? fd::flash::WinSide{ring, shape->window_slots, shape->window_slots}
                               : fd::flash::WinSide{static_cast<const __half*>(cache), max_ctx, 0};
    };
    const fd::Window win{shape->window, win_side(k_cache, shape->k_type), win_side(v_cache, shape->v_type)};
    if (dev.has_mma && aligned) {   // tensor cores; a quantized K or V: the dequantizing loader (QKV)
        const bool quant = !fd::kv_f16(shape);
        switch (head_dim) {
            case 64:
                return quant ? fd::launch_mma_for<64, true>(dev, o, q, kc, vc, n_past, n, n_heads, n_kv_heads, max_ctx,
                                                            scale_log2, s, kr, vr, win)
                             : fd::launch_mma_for<64>(dev, o, q, kc, vc, n_past, n, n_heads, n_kv_heads, max_ctx,
                                                      scale_log2, s, kr, vr, win);
            case 128:
                return quant ? fd::launch_mma_for<128, true>(dev, o, q, kc, vc, n_past, n, n_heads, n_kv_heads, max_ctx,
                                                             scale_log2, s, kr, vr, win)
                             : fd::launch_mma_for<128>(dev, o, q, kc, vc, n_past, n, n_heads, n_kv_heads, max_ctx,
                                                       scale_log2, s, kr, vr, win);
            default:
                return quant ? fd::launch_mma_for<256, true>(dev, o, q, kc, vc, n_past, n, n_heads, n_kv_heads, max_ctx,
                                                             scale_log2, s, kr, vr, win)
                             : fd::launch_mma_for<256>(dev, o, q, kc, vc, n_past, n, n_heads, n_kv_heads, max_ctx,
                                                       scale_log2, s, kr, vr, win);
        }
    }
#endif
    if (!fd::kv_f16(shape)) return FD_E_SHAPE;   // the SIMT fallback (HIP, no tensor cores) reads float16 only
    switch (head_dim) {
        case 64: return fd::launch_simt<64>(o, q, kc, vc, n_past, n, n_heads, n_kv_heads, max_ctx, scale_log2, s);
        case 128: return fd::launch_simt<128>(o, q, kc, vc, n_past, n, n_heads, n_kv_heads, max_ctx, scale_log2, s);
        default: return fd::launch_simt<256>(o, q, kc, vc, n_past, n, n_heads, n_kv_heads, max_ctx, scale_log2, s);
    }
}
