// gemv_rows_tma.cuh -- gemv_rows.cuh's GEMV with its weights staged by the copy engine (sm_90: cp.async.bulk, the
// "TMA" 1-D form) instead of every warp's 16-byte cp.async: the same items, the same arithmetic (rows_item_at) and
// the same fold (rows_fold), so the same bits; only where the bytes come from in shared memory differs.
//
// Why (bench/lab/gemv_rows_tma_lab.cu, bench/NOTES.md session 24): 16 consecutive rows of a matrix are one
// contiguous span, so a whole 16-row tile is one bulk copy (a 1.5B gate/up tile: 2 x 13.8 KB). Issued by one
// lane, it leaves the computing warps free of copy instructions (the cp.async kernel's warps stall on them: ncu,
// session 23), and lands at copy bandwidth (the lab's copy-only kernel: 15.5 MB in 5.5 us on an H100).
//
// Roles: warps 0 .. W - 1 compute, warp W copies. Pieces are the CTA's tiles in order (tile b + p G); piece p goes
// to stage p % S of a ring of S stages. Each piece has its own "full" mbarrier (its copies' bytes land:
// complete_tx), used once, so a warp may wait on it whichever pieces it skipped (items go to warps round-robin, so
// a warp's next piece can be S or more ahead of the last it read: one barrier a stage would alias its phases).
// Each stage has an "empty" mbarrier (each of a tile's C items arrives once it has read its rows), waited on only by
// the copy warp, stage uses in order. The copy warp issues piece p once piece p - S is consumed and piece p - look
// has landed (look: the tuning's gemv_rows_tma; fewer pieces in flight make the first ones land sooner, so
// computing starts under the stream: lab, look 1 vs all at once, 8.4 -> 7.9 us). Weights do not depend on the
// previous kernel, so the copy warp never waits for it (PDL) before copying. tests/emulation/test_gemv_rows_tma_
// protocol.py plays this protocol with adversarial landing orders and warp speeds. Where every CTA has one tile
// (ffn_down: 96 tiles of 35 chunks on the 1.5B) and the tuning's gemv_rows_tma_split says so, the pieces are instead
// that tile's chunk ranges (kc chunks each, all issued at once into the one stage, each on its own "full" barrier; an
// item waits for its chunk's piece), so the first items start while the rest of the tile streams (bench/NOTES.md
// session 37); the stage is never reused, so no "empty" barrier is waited on.
//
// Stage layout: matrix k's tile (SwiGLU: gate, then up at mat_off) with row r at r * row_bytes -- the global bytes
// as they are, so a staged row keeps its global alignment modulo 16 (the item loaders' contract, as with cp.async).
// A bulk copy needs 16-byte aligned addresses and a size a multiple of 16: rows_tma_plan takes a call only where
// every matrix starts 16-byte aligned and its last tile's bytes are a multiple of 16 (always for Q4_K's 144-byte
// blocks; Q6_K / Q8_0 where rows % 16 == 0 or the row bytes allow), and only on sm_90 and later.
#pragma once

#include "gemv_rows.cuh"
#include "gemv_rows_dp4a.cuh"

namespace fd {
namespace {

constexpr int ROWS_TMA_MAX_STAGES = 16;
constexpr int ROWS_TMA_MAX_PIECES = 256;   // tiles a CTA (one "full" mbarrier each): larger calls keep cp.async
// Computing warps of a launch (the copy warp comes on top). 16 + 1 warps leave 96 registers a thread (the register
// file is allotted by groups of 4 warps: 65536 / 640), which the kernels of more than 8 x rows (NT 2 and 4) spill
// past -- ptxas, sm_90: SwiGLU NT 4 1,076 bytes of spill stores, NT 2 472; q/k/v / o / down NT 4 164. 15 + 1 warps
// get 128 registers. One-row and <= 8-row launches (no or 16 bytes of spills) keep 16.
// With x in 128-column groups the four-tile kernels (25-32 x rows) hold integer sums for 32 x rows per matrix and
// still spilled at 128 (SwiGLU NT 4: 308 bytes): 11 + 1 warps get 168.
constexpr int ROWS_TMA_MANY_ROWS_WARPS = 15;
constexpr int ROWS_TMA_FOUR_TILE_WARPS = 11;
__host__ __device__ constexpr int rows_tma_max_warps(int nt) {
    return nt >= 4 ? ROWS_TMA_FOUR_TILE_WARPS : nt >= 2 ? ROWS_TMA_MANY_ROWS_WARPS : ROWS_MAX_WARPS;
}
// The kernels of <= 8 x rows (NT 0 and 1) are built for up to 19 + 1 warps: 640 threads still leave 96 registers a
// thread (65536 / 640, the same cap as 16 + 1 warps), so the code is the same; the tuning's gemv_rows_tma_warps picks
// how many a launch uses (4 .. 19).
constexpr int ROWS_TMA_WIDE_WARPS = 19;
// The one-row launches whose items all run on dp4a lanes (gemv_rows_dp4a) have a kernel of their own (DP), without
// the mma items' accumulators, built for up to ROWS_TMA_DP4A_WARPS + 1 warps.
constexpr int ROWS_TMA_DP4A_WARPS = 31;
__host__ __device__ constexpr int rows_tma_bound_warps(int nt, bool dp = false) {
    return dp ? ROWS_TMA_DP4A_WARPS : nt <= 1 ? ROWS_TMA_WIDE_WARPS : rows_tma_max_warps(nt);
}

struct RowsTmaArgs {
    RowsArgs a;          // the call (st, slot_bytes, up_off unused; R: tiles a fold round)
    int S;               // stages
    int look;            // pieces in flight beyond those landed (>= 1)
    int stage_bytes;     // one stage: every matrix's 16 rows (the largest), SwiGLU both matrices
    int mat_off;         // SwiGLU: the up tile's offset in a stage
    int bar_off;         // bytes: the CTA's pieces' n_full "full" mbarriers, then S "empty" ones
    int n_full;          // "full" mbarriers a CTA: one a tile (ceil(tiles / grid)), or one a piece where kc > 0
    int kc;              // > 0: every CTA has one tile, copied in pieces of kc chunks, each on its own "full" mbarrier
                         // (fd_tuning_t.gemv_rows_tma_split), so its items start as their chunks land; 0: whole tiles
    int dp4a;            // one-row launches of Q4_K / Q6_K matrices (one format or mixed) with the CTA's own x: items on
                         // dp4a lanes (gemv_rows_dp4a.cuh), the same bits as the mma items (fd_tuning_t.gemv_rows_dp4a)
};

// ---- mbarrier and bulk copy (sm_90); other targets compile these empty -- the plan never launches the kernel there
#if FD_HAS_MMA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FD_ROWS_TMA_DEVICE 1
#else
#define FD_ROWS_TMA_DEVICE 0
#endif

__device__ __forceinline__ unsigned rows_smem_u32(const void* p) {
#if FD_ROWS_TMA_DEVICE
    return (unsigned)__cvta_generic_to_shared(p);
#else
    (void)p;
    return 0;
#endif
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
#if FD_ROWS_TMA_DEVICE
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(rows_smem_u32(bar)), "r"(count) : "memory");
#else
    (void)bar, (void)count;
#endif
}
__device__ __forceinline__ void mbar_init_fence() {
#if FD_ROWS_TMA_DEVICE
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// one arrival that also expects `bytes` of copies to complete on the barrier's current phase
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
#if FD_ROWS_TMA_DEVICE
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(rows_smem_u32(bar)), "r"(bytes)
                 : "memory");
#else
    (void)bar, (void)bytes;
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar, unsigned count) {
#if FD_ROWS_TMA_DEVICE
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(rows_smem_u32(bar)), "r"(count) : "memory");
#else
    (void)bar, (void)count;
#endif
}
// until the phase of parity `parity` has completed
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
#if FD_ROWS_TMA_DEVICE
    unsigned ok = 0;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(ok) : "r"(rows_smem_u32(bar)), "r"(parity) : "memory");
    } while (!ok);
#else
    (void)bar, (void)parity;
#endif
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from global to shared memory, completing on bar
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, unsigned bytes, uint64_t* bar,
                                              bool evict_first, uint64_t pol) {
#if FD_ROWS_TMA_DEVICE
    if (evict_first)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                     " [%0], [%1], %2, [%3], %4;" ::"r"(rows_smem_u32(dst)), "l"(src), "r"(bytes),
                     "r"(rows_smem_u32(bar)), "l"(pol) : "memory");
    else
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(rows_smem_u32(dst)), "l"(src), "r"(bytes), "r"(rows_smem_u32(bar)) : "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)bar, (void)evict_first, (void)pol;
#endif
}

// The copy warp's pieces when a CTA has one tile (tile b) and kc > 0: piece k = chunks k kc .. k kc + kc - 1 of the
// tile's rows (SwiGLU: of both matrices), lane r copying row r's bytes of them, on full[k]. A row's piece is taken
// from its 16-byte floor to its 16-byte ceiling (Q6_K rows are only 2-byte aligned; the tile's first byte and its
// span's end are 16-byte aligned, rows_tma_plan), so neighbouring pieces may both write a boundary's 16 bytes: the
// same bytes from the same global address, so every read sees the weights whichever copy wrote them last.
template <bool SWIGLU>
__device__ __forceinline__ void rows_tma_copy_pieces(const RowsTmaArgs& ta, int b, uint8_t* smem, uint64_t* full,
                                                     int lane, uint64_t pol) {
    const RowsArgs& a = ta.a;
    const RowsMat m = SWIGLU ? a.mat[0] : rows_mat_of(a, b);
    const int tl = b - m.tile_first, rows = min(16, m.rows - tl * 16);
    const int n_mats = SWIGLU ? 2 : 1;
    for (int k = 0; k < ta.n_full; ++k) {
        const int c0 = k * ta.kc, c1 = min(a.C, c0 + ta.kc) - 1;
        unsigned lo[2] = {0u, 0u}, len[2] = {0u, 0u}, total = 0;   // lane r's span of each matrix, bytes
        for (int mi = 0; mi < n_mats; ++mi) {
            const RowsMat& mm = mi == 0 ? m : a.mat[1];
            long long o0, o1;
            int by0, by1, u, nu;
            rows_chunk(a, mm, c0, o0, by0, u, nu);
            rows_chunk(a, mm, c1, o1, by1, u, nu);
            for (int r = 0; r < rows; ++r) {   // every lane sums all rows' spans: lane 0 announces the total
                const long long s0 = ((long long)r * mm.row_bytes + o0) & ~15LL;
                const long long s1 = ((long long)r * mm.row_bytes + o1 + by1 + 15) & ~15LL;
                total += (unsigned)(s1 - s0);
                if (r == lane) { lo[mi] = (unsigned)s0; len[mi] = (unsigned)(s1 - s0); }
            }
        }
        if (lane == 0) mbar_arrive_expect_tx(&full[k], total);
        __syncwarp();
        if (lane < rows) {
            bulk_copy_g2s(smem + lo[0], m.w + (long long)tl * 16 * m.row_bytes + lo[0], len[0], &full[k], a.evict_first,
                          pol);
            if (SWIGLU)
                bulk_copy_g2s(smem + ta.mat_off + lo[1], a.mat[1].w + (long long)tl * 16 * a.mat[1].row_bytes + lo[1],
                              len[1], &full[k], a.evict_first, pol);
        }
    }
}

// NT, SWIGLU, FX, F as gemv_rows_kernel's. DP: every item on dp4a lanes (a one-row launch with ta.dp4a; the kernel
// without the mma items, so with fewer registers and up to ROWS_TMA_DP4A_WARPS computing warps); otherwise every item
// on int8 mma. Shared memory: S stages, R x C item partials, the mbarriers (a full one a piece, an empty one a stage),
// then (FX) the CTA's x copy at a.fx_off.
template <int NT, bool SWIGLU, bool FX, int F, bool DP = false>
__global__ void __launch_bounds__((rows_tma_bound_warps(NT, DP) + 1) * 32, 1) gemv_rows_tma_kernel(const RowsTmaArgs ta) {
    static_assert(!FX || NT <= 1, "a CTA's own x copy holds one N-tile (n <= ROWS_FX_MAX_NX)");
    static_assert(!DP || (NT == 0 && FX && (F == ROWS_Q4K || F == ROWS_Q6K || F == ROWS_FANY)),
                  "dp4a items: one x row in the CTA, K-quant matrices");
    extern __shared__ __align__(16) uint8_t smem[];
    const RowsArgs& a = ta.a;
    constexpr int NTT = NT == 0 ? 1 : NT;
    constexpr bool ODD = NT != 0;
    constexpr int NR = SWIGLU ? 2 : 1;
    const int W = (blockDim.x >> 5) - 1;   // computing warps
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int G = gridDim.x, b = blockIdx.x;
    float* part = reinterpret_cast<float*>(smem + (size_t)ta.S * ta.stage_bytes);
    const int n_mine = b < a.tiles ? (a.tiles - 1 - b) / G + 1 : 0;
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + ta.bar_off);   // [piece]
    uint64_t* empty = full + ta.n_full;                                    // [stage]
    const int n_pieces = ta.kc > 0 ? (n_mine > 0 ? ta.n_full : 0) : n_mine;
    if (threadIdx.x == 0) {
        for (int p = 0; p < n_pieces; ++p) mbar_init(&full[p], 1);
        for (int s = 0; s < ta.S; ++s) mbar_init(&empty[s], a.C);   // one arrival an item of the tile
        mbar_init_fence();
    }
    __syncthreads();

    if (warp == W) {   // the copy warp: piece p = tile b + p G into stage p % S, or (kc) the one tile's chunk pieces
        const uint64_t pol = a.evict_first ? q::l2_evict_first_policy() : 0;
        if (ta.kc > 0) {
            if (n_mine > 0) rows_tma_copy_pieces<SWIGLU>(ta, b, smem, full, lane, pol);
            pdl_wait();
            pdl_launch_dependents();
            return;
        }
        for (int p = 0; p < n_mine; ++p) {
            const int s = p % ta.S;
            if (p >= ta.S) mbar_wait(&empty[s], (p / ta.S - 1) & 1);   // uses of stage s in order
            if (p >= ta.look) mbar_wait(&full[p - ta.look], 0);
            const int tile = b + p * G;
            const RowsMat m = SWIGLU ? a.mat[0] : rows_mat_of(a, tile);
            const int tl = tile - m.tile_first, rows = min(16, m.rows - tl * 16);
            const unsigned bytes = (unsigned)(rows * m.row_bytes);   // SwiGLU: up has gate's rows and formats' bytes
            const unsigned up_bytes = SWIGLU ? (unsigned)(rows * a.mat[1].row_bytes) : 0u;
            if (lane == 0) mbar_arrive_expect_tx(&full[p], bytes + up_bytes);
            __syncwarp();
            uint8_t* dst = smem + (size_t)s * ta.stage_bytes;
            if (lane == 0) bulk_copy_g2s(dst, m.w + (long long)tl * 16 * m.row_bytes, bytes, &full[p], a.evict_first, pol);
            if (SWIGLU && lane == 1)
                bulk_copy_g2s(dst + ta.mat_off, a.mat[1].w + (long long)tl * 16 * a.mat[1].row_bytes, up_bytes, &full[p],
                              a.evict_first, pol);
        }
        pdl_wait();
        pdl_launch_dependents();
        return;
    }

    pdl_wait();                // the pre-pass's codes (FX: x itself), the residual
    pdl_launch_dependents();
    RowsX x = a.x;
    if (FX) {   // while the first tiles stream: x quantized here, or (no a.xin) the pre-pass's codes copied in
        if (a.xin) rows_quantize_cta<F == ROWS_Q80 || F == ROWS_Q50>(a, smem + a.fx_off, W, W * 32);
        else rows_stage_x(a, smem + a.fx_off, W * 32);
        x = rows_fx_x(a, smem + a.fx_off);
    }
    const int total = n_mine * a.C;   // items j = tile_local_cta * C + chunk, as gemv_rows_kernel's
    const int n_rounds = (n_mine + a.R - 1) / a.R;
    int q = 0;
    for (int rd = 0; rd < n_rounds; ++rd) {
        const int jend = min(total, (rd + 1) * a.R * a.C);
        for (;; ++q) {
            const int j = warp + q * W;
            if (j >= jend) break;
            const int p = j / a.C, chunk = j % a.C, s = p % ta.S;
            mbar_wait(&full[ta.kc > 0 ? chunk / ta.kc : p], 0);
            const int tile = b + p * G;
            const RowsMat m = SWIGLU ? a.mat[0] : rows_mat_of(a, tile);
            long long off;
            int bytes, u0, nu;
            rows_chunk(a, m, chunk, off, bytes, u0, nu);
            const uint8_t* st = smem + (size_t)s * ta.stage_bytes;
            if constexpr (DP) {   // row lane & 15 of the tile on a lane pair; the partial where rows_fold reads it
                const int r = lane & 15;
                const float v = rows_dp4a_row_of<F>(x, m.fmt, st + r * m.row_bytes + off, u0, nu, lane);
                float vu = 0.0f;
                if (SWIGLU) {
                    const RowsMat& mu = a.mat[1];
                    long long offu;
                    int bu, u0u, nuu;
                    rows_chunk(a, mu, chunk, offu, bu, u0u, nuu);
                    vu = rows_dp4a_row_of<F>(x, mu.fmt, st + ta.mat_off + r * mu.row_bytes + offu, u0u, nuu, lane);
                }
                __syncwarp();      // every lane has read the stage
                if (lane == 0) mbar_arrive(&empty[s], 1);
                if (lane < 16) {   // element e = 2 (r >> 3) of lane 4 (r & 7): (row r, x row 0) in rows_put_partial's layout
                    float* pp = part + (size_t)(j - rd * a.R * a.C) * (NR * 4 * 32) + (2 * (r >> 3)) * 32 + 4 * (r & 7);
                    pp[0] = v;
                    if (SWIGLU) pp[4 * 32] = vu;
                }
            } else {
                float acc[NR][NTT][4];
                rows_zero(acc);
                const uint8_t* r0 = st + g * m.row_bytes + off;
                rows_item_at<NTT, ODD, FX, F>(x, m, u0, nu, r0, r0 + 8 * m.row_bytes, g, t, acc[0]);
                if (SWIGLU) {
                    const RowsMat& mu = a.mat[1];
                    long long offu;
                    int bu, u0u, nuu;
                    rows_chunk(a, mu, chunk, offu, bu, u0u, nuu);
                    const uint8_t* ru = st + ta.mat_off + g * mu.row_bytes + offu;
                    rows_item_at<NTT, ODD, FX, F>(x, mu, u0u, nuu, ru, ru + 8 * mu.row_bytes, g, t, acc[NR - 1]);
                }
                __syncwarp();      // every lane has read the stage
                if (lane == 0) mbar_arrive(&empty[s], 1);
                rows_put_partial(part, j - rd * a.R * a.C, lane, acc);
            }
        }
        rows_bar(W * 32);
        rows_fold<NTT, SWIGLU>(a, part, b, G, rd, n_mine, threadIdx.x, W * 32);
        rows_bar(W * 32);
    }
}

}  // namespace
}  // namespace fd
