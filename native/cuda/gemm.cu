// gemm.cu -- prefill projections on tensor cores.
//
//   fd_gemm_f16:        y (m, n) = x (m, k) f32 @ w (n, k) f16 ^T (+ bias[n]) (+ residual (m, n))
//   fd_gemm_swiglu_f16: y (m, n) = silu(x @ wg^T) * (x @ wu^T), wg and wu (n, k) f16
//
// x is float32 activations, row-major; w is a weight dequantized to float16 (row-major (n, k),
// i.e. the mma's "col" B operand as stored). x is rounded to f16 on its way into shared memory
// (no separate conversion kernel), products are exact in the tensor cores and accumulate in f32.
//
// Kernel (FD_HAS_MMA, sm_80+): a block computes a BM x BN tile of y with mma.sync m16n8k16; its
// warps form a WARPS_M x WARPS_N grid, each owning a (BM/WARPS_M) x (BN/WARPS_N) sub-tile.
// Per k-tile of GEMM_BK = 32, through a STAGES-deep cp.async ring (STAGES - 1 tiles in flight, so
// L2 latency hides behind several tiles of work even at one block per SM):
//   - X (BM x 32 f32) and W (BN x 32 f16 per weight) arrive as 16-byte cp.async chunks;
//   - one tile ahead of use, every thread converts the X chunks it copied itself (its own
//     wait_group is enough: no barrier between copy and conversion) into a double-buffered f16 A
//     tile, so X is converted once per block, not once per warp;
//   - each warp: ldmatrix.x4 fragments of A and B, MI x NI mma per 16-wide k step.
// One barrier per k-tile. f16 shared rows are GEMM_BK + 8 halves (80 B) apart, so the 8 row
// addresses of an ldmatrix phase fall into 8 distinct 16-byte bank groups (no swizzle needed).
// Boundary tiles are predicated: rows >= m and k >= k arrive as zeros (cp.async zero-fill), columns
// >= n are skipped in the epilogue; nothing is read or written out of bounds. k % 8 == 0 keeps every
// 16-byte chunk wholly inside or wholly outside the matrix.
//
// Grid: (ceil(m / BM), ceil(n / BN)[, n_split]); blockIdx.x runs over m so that consecutive blocks
// share one W column tile while it sits in L2. Launch choice (measured on an H200, see
// bench/bench_gemm.py):
//   - SwiGLU: 128x64 per weight (64x64 for grids too small to fill the SMs);
//   - small grids (m = 512: 48..64 tiles of 128x128 for 132 SMs): split-k over a thread-block
//     cluster of 2, 4 or 8 blocks (sm_90): each block runs an even share of the k-tiles and the
//     cluster sums the partial tiles through distributed shared memory in rank order
//     (deterministic, no workspace), then applies bias / residual once;
//   - otherwise the tile shape (128x128, 64x128, 64x64) with the least per-SM work
//     (ceil(blocks / n_sms) * tile area / measured efficiency).
//
// SIMT fallback (HIP, pre-sm_80 devices, or pointers not 16-byte aligned): 16x16 output tiles,
// one output per thread, the same f16 rounding of x. Correct, not fast.
#include "mma.cuh"

#if FD_HAS_MMA
#include <cooperative_groups.h>
#endif

namespace fd {
namespace {

constexpr int GEMM_BK = 32;                  // k per pipeline stage: two m16n8k16 steps
constexpr int GEMM_LD = GEMM_BK + 8;         // halves per f16 shared row (80 B: conflict-free ldmatrix)

// One tile configuration. n_w = 2 for SwiGLU (gate and up weights share the X tile).
template <int BM_, int BN_, int WARPS_M_, int WARPS_N_, bool SWIGLU_, int STAGES_, int MIN_BLOCKS_>
struct GemmTile {
    static constexpr int BM = BM_, BN = BN_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
    static constexpr bool SWIGLU = SWIGLU_;
    static constexpr int STAGES = STAGES_;           // cp.async ring depth (STAGES - 1 tiles in flight)
    static constexpr int MIN_BLOCKS = MIN_BLOCKS_;   // resident blocks per SM (register cap for ptxas)
    static constexpr int n_w = SWIGLU ? 2 : 1;
    static constexpr int n_threads = 32 * WARPS_M * WARPS_N;
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;     // warp sub-tile
    static constexpr int MI = WM / 16, NI = WN / 8;                 // m16 and n8 mma tiles per warp
    static constexpr int x_chunks = BM * (GEMM_BK / 4) / n_threads;  // 16 B (4 f32) of X per thread per tile
    static constexpr int w_chunks = BN * (GEMM_BK / 8) / n_threads;  // 16 B (8 f16) per thread per weight
    static constexpr int x_stage_floats = BM * GEMM_BK;              // f32 ring slot, rows 128 B apart
    static constexpr int w_stage_halves = n_w * BN * GEMM_LD;
    static constexpr int a_tile_halves = BM * GEMM_LD;               // f16 A tile (double-buffered)
    static constexpr int smem_bytes = STAGES * (x_stage_floats * 4 + w_stage_halves * 2) + 2 * a_tile_halves * 2;

    static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must be a multiple of 16x16");
    static_assert(BM * (GEMM_BK / 4) % n_threads == 0, "X tile must split evenly over threads");
    static_assert(BN * (GEMM_BK / 8) % n_threads == 0, "W tile must split evenly over threads");
    static_assert(STAGES >= 2, "ring");
};

// The configurations the launcher chooses from (shared memory 98, 82, 62, 98 and 82 KB: two or
// three blocks per SM; registers capped by MIN_BLOCKS, no spills).
using Tile128x128 = GemmTile<128, 128, 2, 4, false, 3, 2>;   // 8 warps of 64x32
using Tile64x128 = GemmTile<64, 128, 2, 4, false, 4, 2>;     // 8 warps of 32x32
using Tile64x64 = GemmTile<64, 64, 2, 2, false, 4, 3>;       // 4 warps of 32x32
using SwiTile128x64 = GemmTile<128, 64, 4, 2, true, 3, 2>;   // 8 warps of 32x32 (x2 weights)
using SwiTile64x64 = GemmTile<64, 64, 2, 2, true, 4, 2>;     // 4 warps of 32x32 (x2 weights)

#if FD_HAS_MMA

template <class T, bool SPLIT>
__global__ void __launch_bounds__(T::n_threads, T::MIN_BLOCKS) gemm_f16_mma_kernel(
    float* y, const float* __restrict__ x, const __half* __restrict__ w0, const __half* __restrict__ w1, int m,
    int n, int k, const float* __restrict__ bias, const float* residual) {
#if FD_MMA_DEVICE_OK
    using namespace fd::mma;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* x_ring = reinterpret_cast<float*>(smem_raw);                            // [STAGES][BM][32] f32
    __half* w_ring = reinterpret_cast<__half*>(x_ring + T::STAGES * T::x_stage_floats);  // [STAGES][n_w][BN][LD]
    __half* a_smem = w_ring + T::STAGES * T::w_stage_halves;                        // [2][BM][LD] f16

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int warp_m = warp / T::WARPS_N, warp_n = warp % T::WARPS_N;
    const int m0 = blockIdx.x * T::BM, n0 = blockIdx.y * T::BN;
    // this block's k-tiles: all of them, or (split-k) the blockIdx.z-th of gridDim.z even shares
    const int n_ktiles_total = ceil_div(k, GEMM_BK);
    const int kt_begin = (int)((int64_t)n_ktiles_total * blockIdx.z / gridDim.z);
    const int n_ktiles = (int)((int64_t)n_ktiles_total * (blockIdx.z + 1) / gridDim.z) - kt_begin;

    // ---- k-tile kt_begin + kt of X (f32) and W (f16) into ring slot `stage`, 16-byte cp.async ----
    // Rows >= m / n and columns >= k are zero-filled (k % 8 == 0: a chunk is wholly in or out).
    auto load_tile = [&](int kt, int stage) {
#pragma unroll
        for (int i = 0; i < T::x_chunks; ++i) {
            const int c = tid + i * T::n_threads;                  // chunk index in the BM x 32 tile
            const int row = c / (GEMM_BK / 4), col = (c % (GEMM_BK / 4)) * 4;
            const int gm = m0 + row, gk = (kt_begin + kt) * GEMM_BK + col;
            const bool ok = gm < m && gk < k;
            cp_async_16(smem_u32(x_ring + stage * T::x_stage_floats + row * GEMM_BK + col),
                        ok ? x + (size_t)gm * k + gk : x, ok);
        }
        // The W tiles as the X tile above, 8 halves a 16-byte chunk instead of 4 floats: two loops, as the
        // tiles differ in element type, row width and ring.
#pragma unroll
        for (int wi = 0; wi < T::n_w; ++wi) {
            const __half* w = wi ? w1 : w0;                        // 0: w0 (gate), 1: w1 (up)
#pragma unroll
            for (int i = 0; i < T::w_chunks; ++i) {
                const int c = tid + i * T::n_threads;              // chunk index in the BN x 32 tile
                const int row = c / (GEMM_BK / 8), col = (c % (GEMM_BK / 8)) * 8;
                const int gn = n0 + row, gk = (kt_begin + kt) * GEMM_BK + col;
                const bool ok = gn < n && gk < k;
                cp_async_16(smem_u32(w_ring + stage * T::w_stage_halves + (wi * T::BN + row) * GEMM_LD + col),
                            ok ? w + (size_t)gn * k + gk : w, ok);
            }
        }
    };
    // ---- X f32 -> f16 A tile. Each thread converts exactly the chunks it copied itself, so its
    // own cp.async.wait_group suffices (no barrier between the copy and the conversion). ----------
    auto convert_x = [&](int stage, int buf) {
#pragma unroll
        for (int i = 0; i < T::x_chunks; ++i) {
            const int c = tid + i * T::n_threads;
            const int row = c / (GEMM_BK / 4), col = (c % (GEMM_BK / 4)) * 4;
            const float4 v = *reinterpret_cast<const float4*>(x_ring + stage * T::x_stage_floats + row * GEMM_BK + col);
            uint2 h;
            h.x = pack_half2(v.x, v.y);
            h.y = pack_half2(v.z, v.w);
            *reinterpret_cast<uint2*>(a_smem + buf * T::a_tile_halves + row * GEMM_LD + col) = h;
        }
    };

    float acc[T::n_w][T::MI][T::NI][4];
#pragma unroll
    for (int wi = 0; wi < T::n_w; ++wi)
#pragma unroll
        for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
            for (int ni = 0; ni < T::NI; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[wi][mi][ni][e] = 0.f;

    auto compute = [&](int a_buf, int stage) {
        const __half* a_tile = a_smem + a_buf * T::a_tile_halves + (warp_m * T::WM) * GEMM_LD;
#pragma unroll
        for (int kk = 0; kk < GEMM_BK / 16; ++kk) {
            uint32_t bf[T::n_w][T::NI][2];
#pragma unroll
            for (int wi = 0; wi < T::n_w; ++wi) {
                const __half* b_tile = w_ring + stage * T::w_stage_halves + (wi * T::BN + warp_n * T::WN) * GEMM_LD;
#pragma unroll
                for (int np = 0; np < T::NI / 2; ++np) {   // n 0-7 x k 0-7|8-15, n 8-15 x k 0-7|8-15
                    uint32_t r[4];
                    ldmatrix_x4(r, smem_u32(b_tile + (np * 16 + lane % 8 + (lane / 16) * 8) * GEMM_LD + kk * 16 +
                                            ((lane / 8) % 2) * 8));
                    bf[wi][2 * np][0] = r[0];
                    bf[wi][2 * np][1] = r[1];
                    bf[wi][2 * np + 1][0] = r[2];
                    bf[wi][2 * np + 1][1] = r[3];
                }
            }
#pragma unroll
            for (int mi = 0; mi < T::MI; ++mi) {
                uint32_t af[4];   // matrices: rows 0-7|8-15 x k 0-7|8-15 -> a[0..3]
                ldmatrix_x4(af, smem_u32(a_tile + (mi * 16 + lane % 16) * GEMM_LD + kk * 16 + (lane / 16) * 8));
#pragma unroll
                for (int wi = 0; wi < T::n_w; ++wi)
#pragma unroll
                    for (int ni = 0; ni < T::NI; ++ni) mma_16816(acc[wi][mi][ni], af, bf[wi][ni][0], bf[wi][ni][1]);
            }
        }
    };

    // ---- pipeline --------------------------------------------------------------------------------
    // Invariant at the top of iteration kt: A tile kt (f16) is in a_smem[kt % 2] and W tile kt in
    // ring slot kt % STAGES, both visible to all threads; tiles kt + 1 .. kt + STAGES - 2 are in
    // flight. One cp.async group is committed per tile (empty past the end), so wait_group<STAGES - 2>
    // always means "tile kt + 1 landed".
#pragma unroll
    for (int s = 0; s < T::STAGES - 1; ++s) {
        if (s < n_ktiles) load_tile(s, s);
        cp_async_commit();
    }
    cp_async_wait<T::STAGES - 2>();
    convert_x(0, 0);
    __syncthreads();

    for (int kt = 0; kt < n_ktiles; ++kt) {
        // slot (kt - 1) % STAGES and a_smem[(kt + 1) % 2] were last read by compute(kt - 1), which
        // every thread finished before the barrier that ended iteration kt - 1
        if (kt + T::STAGES - 1 < n_ktiles) load_tile(kt + T::STAGES - 1, (kt + T::STAGES - 1) % T::STAGES);
        cp_async_commit();
        compute(kt % 2, kt % T::STAGES);
        cp_async_wait<T::STAGES - 2>();
        if (kt + 1 < n_ktiles) convert_x((kt + 1) % T::STAGES, (kt + 1) % 2);
        __syncthreads();
    }

    const int g = lane / 4, t = lane % 4;
    if constexpr (SPLIT) {
        // ---- split-k: the gridDim.z blocks of one tile form a thread-block cluster; each leaves
        // its partial tile in its own shared memory, and block r of the cluster sums rows
        // r * BM / S .. of all S partials through distributed shared memory, in rank order (the
        // same order every run: deterministic), then applies the epilogue. ---------------------
#if __CUDA_ARCH__ >= 900
        namespace cg = cooperative_groups;
        cg::cluster_group cluster = cg::this_cluster();
        float* part = reinterpret_cast<float*>(smem_raw);   // [BM][RED_LD]: the ring is free now
        constexpr int RED_LD = T::BN + 8;                    // float2 fragment stores conflict-free
        static_assert(T::BM * RED_LD * 4 <= T::smem_bytes, "partial tile must fit the ring");
#pragma unroll
        for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int ni = 0; ni < T::NI; ++ni)
                    *reinterpret_cast<float2*>(part + (warp_m * T::WM + mi * 16 + g + 8 * h) * RED_LD + warp_n * T::WN +
                                               ni * 8 + 2 * t) = make_float2(acc[0][mi][ni][2 * h], acc[0][mi][ni][2 * h + 1]);
        cluster.sync();   // every partial written (and visible cluster-wide)
        const int n_split = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
        const int rows_per = ceil_div(T::BM, n_split);
        for (int idx = tid; idx < rows_per * (T::BN / 4); idx += T::n_threads) {
            const int row = rank * rows_per + idx / (T::BN / 4), col = (idx % (T::BN / 4)) * 4;
            if (row >= T::BM || m0 + row >= m) continue;
            float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int r = 0; r < n_split; ++r) {
                const float4 v = *reinterpret_cast<const float4*>(cluster.map_shared_rank(part, r) + row * RED_LD + col);
                sum.x += v.x;
                sum.y += v.y;
                sum.z += v.z;
                sum.w += v.w;
            }
            const float vals[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int gcol = n0 + col + e;
                if (gcol >= n) break;
                const size_t idx_y = (size_t)(m0 + row) * n + gcol;
                float v = vals[e];
                if (bias) v += bias[gcol];
                if (residual) v += residual[idx_y];   // same thread reads then writes: y may alias
                y[idx_y] = v;
            }
        }
        cluster.sync();   // no block may exit while another still reads its shared memory
#else
        __trap();   // split-k needs clusters (sm_90); the launcher checks the kernel's binary version
#endif
    } else {
        // ---- epilogue: C fragment c[2h + e] is y[g + 8h][2t + e] of each 16x8 tile -----------------
#pragma unroll
        for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m0 + warp_m * T::WM + mi * 16 + g + 8 * h;
                if (row >= m) continue;
#pragma unroll
                for (int ni = 0; ni < T::NI; ++ni)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int col = n0 + warp_n * T::WN + ni * 8 + 2 * t + e;
                        if (col >= n) continue;
                        const size_t idx = (size_t)row * n + col;
                        float v;
                        if constexpr (T::SWIGLU) {
                            v = silu(acc[0][mi][ni][2 * h + e]) * acc[T::n_w - 1][mi][ni][2 * h + e];
                        } else {
                            v = acc[0][mi][ni][2 * h + e];
                            if (bias) v += bias[col];
                            if (residual) v += residual[idx];   // same thread reads then writes: y may alias
                        }
                        y[idx] = v;
                    }
            }
    }
#else
    __trap();   // built for a target without mma.sync m16n8k16; launchers never pick this kernel there
#endif
}

#endif  // FD_HAS_MMA

// (This guard-then-fallback layout -- the mma kernel traps where it cannot run, a SIMT kernel follows -- is
// attention_prefill.cu's too, on purpose: each op's .cu holds its own tensor-core kernel and its fallback.)
// ---- SIMT fallback: 16x16 output tile per block, one output per thread -----------------------
constexpr int SIMT_TILE = 16;

template <bool SWIGLU>
__global__ void __launch_bounds__(SIMT_TILE* SIMT_TILE) gemm_f16_simt_kernel(
    float* y, const float* __restrict__ x, const __half* __restrict__ w0, const __half* __restrict__ w1, int m,
    int n, int k, const float* __restrict__ bias, const float* residual) {
    __shared__ float xs[SIMT_TILE][SIMT_TILE + 1];        // [row][k], x rounded to f16
    __shared__ float ws[2][SIMT_TILE][SIMT_TILE + 1];     // [weight][output column][k]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int m0 = blockIdx.x * SIMT_TILE, n0 = blockIdx.y * SIMT_TILE;
    float acc0 = 0.f, acc1 = 0.f;
    for (int k0 = 0; k0 < k; k0 += SIMT_TILE) {
        const int gk = k0 + tx;
        xs[ty][tx] = (m0 + ty < m && gk < k) ? __half2float(__float2half_rn(x[(size_t)(m0 + ty) * k + gk])) : 0.f;
        const bool w_ok = n0 + ty < n && gk < k;
        ws[0][ty][tx] = w_ok ? __half2float(w0[(size_t)(n0 + ty) * k + gk]) : 0.f;
        if (SWIGLU) ws[1][ty][tx] = w_ok ? __half2float(w1[(size_t)(n0 + ty) * k + gk]) : 0.f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < SIMT_TILE; ++kk) {
            acc0 += xs[ty][kk] * ws[0][tx][kk];
            if (SWIGLU) acc1 += xs[ty][kk] * ws[1][tx][kk];
        }
        __syncthreads();
    }
    const int row = m0 + ty, col = n0 + tx;
    if (row >= m || col >= n) return;
    const size_t idx = (size_t)row * n + col;
    float v;
    if (SWIGLU) {
        v = silu(acc0) * acc1;
    } else {
        v = acc0;
        if (bias) v += bias[col];
        if (residual) v += residual[idx];
    }
    y[idx] = v;
}

template <bool SWIGLU>
int launch_simt(float* y, const float* x, const __half* w0, const __half* w1, int m, int n, int k, const float* bias,
                const float* residual, cudaStream_t stream) {
    const dim3 grid(ceil_div(m, SIMT_TILE), ceil_div(n, SIMT_TILE)), block(SIMT_TILE, SIMT_TILE);
    gemm_f16_simt_kernel<SWIGLU><<<grid, block, 0, stream>>>(y, x, w0, w1, m, n, k, bias, residual);
    return FD_LAUNCH_STATUS();
}

#if FD_HAS_MMA

template <class T>
int launch_mma(float* y, const float* x, const __half* w0, const __half* w1, int m, int n, int k, const float* bias,
               const float* residual, cudaStream_t stream) {
    const auto kernel = gemm_f16_mma_kernel<T, false>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::smem_bytes);
    if (err != cudaSuccess) return (int)err;
    const dim3 grid(ceil_div(m, T::BM), ceil_div(n, T::BN));
    kernel<<<grid, T::n_threads, T::smem_bytes, stream>>>(y, x, w0, w1, m, n, k, bias, residual);
    return FD_LAUNCH_STATUS();
}

// Split-k over a (1, 1, n_split) thread-block cluster (sm_90). Returns 1 when the kernel in this
// build cannot use clusters (compiled for an older target), so the caller falls back.
template <class T>
int launch_mma_split(int n_split, float* y, const float* x, const __half* w0, int m, int n, int k, const float* bias,
                     const float* residual, cudaStream_t stream) {
    static_assert(!T::SWIGLU, "split-k reduces one accumulator");
    const auto kernel = gemm_f16_mma_kernel<T, true>;
    cudaFuncAttributes attrs;
    cudaError_t err = cudaFuncGetAttributes(&attrs, kernel);
    if (err != cudaSuccess) return (int)err;
    if (attrs.binaryVersion < 90) return 1;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::smem_bytes);
    if (err != cudaSuccess) return (int)err;
    err = launch_cluster(kernel, dim3(ceil_div(m, T::BM), ceil_div(n, T::BN), n_split), dim3(T::n_threads),
                         T::smem_bytes, stream, dim3(1, 1, n_split), false, y, x, w0, (const __half*)nullptr, m, n, k,
                         bias, residual);
    return err != cudaSuccess ? (int)err : FD_LAUNCH_STATUS();
}

// Per-SM work of a tile shape: every SM runs ceil(blocks / n_sms) tiles one after another (the
// padded rows and columns of boundary tiles cost as much as real ones), divided by the shape's
// relative efficiency. The least wins; ties go to the earlier (larger) shape.
struct TileChoice {
    int bm, bn;
    double efficiency;
};

int pick_tile(const TileChoice* choices, int n_choices, int m, int n, int n_sms) {
    int best = 0;
    double best_cost = 0.0;
    for (int i = 0; i < n_choices; ++i) {
        const double blocks = (double)ceil_div(m, choices[i].bm) * ceil_div(n, choices[i].bn);
        const double waves = ceil(blocks / n_sms);
        const double cost = waves * choices[i].bm * choices[i].bn / choices[i].efficiency;
        if (i == 0 || cost < best_cost) best = i, best_cost = cost;
    }
    return best;
}

// Split-k factor for the 128x128 tile, from {1, 2, 4, 8} (cluster sizes 3, 5, 6, 7 measured
// slower on an H200): the largest whose blocks (tiles * n_split) stay within 1.5 blocks per SM --
// 2 per SM when every share is still >= 16 k-tiles long -- and whose shares are >= 4 k-tiles.
// Measured at m = 512: qkv (64 tiles) 2, o and down (48 tiles) 4, 0.5b down (28 tiles, k = 4864) 8.
int pick_split(int m, int n, int k, int n_sms) {
    const int tiles = ceil_div(m, Tile128x128::BM) * ceil_div(n, Tile128x128::BN);
    const int n_ktiles = ceil_div(k, GEMM_BK);
    for (int n_split = 8; n_split >= 2; n_split /= 2) {
        const int share = n_ktiles / n_split;
        const int max_blocks = share >= 16 ? 2 * n_sms : 3 * n_sms / 2;
        if (share >= 4 && tiles * n_split <= max_blocks) return n_split;
    }
    return 1;
}

#endif  // FD_HAS_MMA

int launch_gemm(bool swiglu, float* y, const float* x, const void* w0_f16, const void* w1_f16, int m, int n, int k,
                const float* bias, const float* residual, cudaStream_t stream) {
    const __half* w0 = static_cast<const __half*>(w0_f16);
    const __half* w1 = static_cast<const __half*>(w1_f16);
#if FD_HAS_MMA
    MmaDevice dev;
    cudaError_t err = query_mma_device(&dev);
    if (err != cudaSuccess) return (int)err;
    // 16-byte vector loads of x rows and cp.async of w rows: k % 8 == 0 keeps rows aligned when
    // the base pointers are
    const bool aligned = is_aligned(x, 16) && is_aligned(w0, 16) && (!swiglu || is_aligned(w1, 16));
    if (dev.has_mma && aligned) {
        if (swiglu) {
            static const TileChoice choices[] = {{128, 64, 1.0}, {64, 64, 0.75}};
            switch (pick_tile(choices, 2, m, n, dev.n_sms)) {
                case 0: return launch_mma<SwiTile128x64>(y, x, w0, w1, m, n, k, nullptr, nullptr, stream);
                default: return launch_mma<SwiTile64x64>(y, x, w0, w1, m, n, k, nullptr, nullptr, stream);
            }
        }
        if (dev.has_cluster) {
            const int n_split = pick_split(m, n, k, dev.n_sms);
            if (n_split > 1) {
                const int status = launch_mma_split<Tile128x128>(n_split, y, x, w0, m, n, k, bias, residual, stream);
                if (status != 1) return status;
            }
        }
        // efficiencies measured on an H200 at the model shapes (m = 512, 2048)
        static const TileChoice choices[] = {{128, 128, 1.0}, {64, 128, 0.7}, {64, 64, 0.6}};
        switch (pick_tile(choices, 3, m, n, dev.n_sms)) {
            case 0: return launch_mma<Tile128x128>(y, x, w0, nullptr, m, n, k, bias, residual, stream);
            case 1: return launch_mma<Tile64x128>(y, x, w0, nullptr, m, n, k, bias, residual, stream);
            default: return launch_mma<Tile64x64>(y, x, w0, nullptr, m, n, k, bias, residual, stream);
        }
    }
#endif
    return swiglu ? launch_simt<true>(y, x, w0, w1, m, n, k, nullptr, nullptr, stream)
                  : launch_simt<false>(y, x, w0, nullptr, m, n, k, bias, residual, stream);
}

}  // namespace
}  // namespace fd

extern "C" {

int fd_gemm_f16(float* y, const float* x, const void* w_f16, int m, int n, int k, const float* bias,
                const float* residual, void* stream) {
    FD_CHECK_ARG(y && x && w_f16);
    FD_CHECK_ARG(m >= 1 && n >= 1 && k >= 1);
    if (k % 8 != 0) return FD_E_SHAPE;
    return fd::launch_gemm(false, y, x, w_f16, nullptr, m, n, k, bias, residual, (cudaStream_t)stream);
}

int fd_gemm_swiglu_f16(float* y, const float* x, const void* wg_f16, const void* wu_f16, int m, int n, int k,
                       void* stream) {
    FD_CHECK_ARG(y && x && wg_f16 && wu_f16);
    FD_CHECK_ARG(m >= 1 && n >= 1 && k >= 1);
    if (k % 8 != 0) return FD_E_SHAPE;
    return fd::launch_gemm(true, y, x, wg_f16, wu_f16, m, n, k, nullptr, nullptr, (cudaStream_t)stream);
}

}  // extern "C"
