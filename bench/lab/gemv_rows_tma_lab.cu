// gemv_rows_tma_lab.cu -- a lab, not the library (issue 11): does gemv_rows' one-row time come from how it stages
// its weights? The library kernel (native/cuda/gemv_rows.cuh) has every warp copy its own items with 16-byte
// cp.async (a warp instruction: 32 bytes of 16 rows) into a private ring; ncu puts its SwiGLU gate/up at 22% of
// DRAM bandwidth with the CTA's whole share in flight. This lab keeps the library's item arithmetic and fold (so its
// outputs must equal the library kernel's bit for bit) and changes only the staging: a producer warp issues Hopper
// bulk copies (cp.async.bulk, the TMA engine; completion on an mbarrier with a byte count) of pieces -- a whole
// 16-row tile when its rows fit one stage (16 consecutive rows are one contiguous span), else a group of CG
// chunks of the 16 rows (one bulk copy a row, issued by 16 lanes) -- into a ring of S stages; consumer warps wait
// on a stage's "full" barrier, compute their items from it and arrive on its "empty" barrier.
//
// A flaw kept as it ran: the lab has one "full" mbarrier a stage, waited by parity, which is only right where no
// warp's next piece is a whole stage use ahead of the last landing (a parity wait on the phase before passes at
// once). Every shape it ran satisfies that (every warp's first piece < S, later ones one use ahead) and every
// output matched the library bit for bit; the library kernel (native/cuda/gemv_rows_tma.cuh) has a full mbarrier a
// piece, and tests/emulation/test_gemv_rows_tma_protocol.py shows the per-stage form failing.
//
// Q4_K only (every 144-byte super-block offset is 16-byte aligned, as bulk copies need). Cases: the 1.5B's
// gate/up (SwiGLU 2 x 8960 x 1536), ffn_down (1536 x 8960), attn q/k/v (one launch of three matrices) and attn_o,
// n = 1, 8 and 32 x rows, x quantized once by the library's pre-pass (both kernels read the same codes). Each row
// prints us a launch (a CUDA graph of PDL launches over weight copies that together exceed L2) and GB/s; "nocomp"
// rows are the bulk-copy kernel with the arithmetic skipped (its streaming floor; outputs not checked).
//
// It includes the library's headers: as measured, those of e4b59f8 (git show e4b59f8:native/cuda/...). From the
// four-chain Q4_K arithmetic on (bench/NOTES.md session 24), its item_q4k_h (the one-chain arithmetic with hoisted
// addresses) no longer matches the library kernel, so the "hoist" rows report MISMATCH against today's headers.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 --use_fast_math --expt-relaxed-constexpr -Inative/cuda \
//        -o /tmp/gemv_rows_tma_lab bench/lab/gemv_rows_tma_lab.cu && /tmp/gemv_rows_tma_lab
#include "gemv_rows_plan.cuh"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace fd {
fd_tuning_t tuning_now() { fd_tuning_t t{}; t.pdl = 1; return t; }   // launch_pdl reads only .pdl here
int device_sm_count() { return 0; }
}  // namespace fd

using namespace fd;

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

// ---- mbarrier and bulk-copy wrappers (sm_90) ------------------------------------------------------------------
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
    unsigned ok = 0;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(ok) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    } while (!ok);
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar, bool hint,
                                          uint64_t pol) {
    if (hint)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                     ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(pol) : "memory");
    else
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void bar_consumers(int n_threads) { asm volatile("bar.sync 1, %0;" ::"r"(n_threads) : "memory"); }

// rows_item_q4k (gemv_rows_item.cuh) with its x addresses hoisted out of the sub-block loop: the same loads of the
// same values in the same order, so the same bits; only the address arithmetic differs (HOIST variants).
template <int NT, bool ODD, bool SX>
__device__ __forceinline__ void item_q4k_h(const RowsX& x, const uint8_t* r0, const uint8_t* r1, int sb0, int nk,
                                           int g, int t, float (&acc)[NT][4]) {
    constexpr int SCS = rows_sc_stride<SX>();
    const int8_t* xb = rows_xrow<ODD, SX>(x, g) + 8 * t + sb0 * ROWS_QK;
    const float2* sb = x.sc + sb0 * 8 * SCS + 2 * t;
#pragma unroll 1
    for (int k = 0; k < nk; ++k) {
        const int8_t* xk = xb + k * ROWS_QK;
        const float2* sk = sb + k * 8 * SCS;
        const uint4 h0 = *reinterpret_cast<const uint4*>(r0 + k * 144);
        const uint4 h1 = *reinterpret_cast<const uint4*>(r1 + k * 144);
        const float2 dm0 = __half22float2(*reinterpret_cast<const __half2*>(&h0.x));
        const float2 dm1 = __half22float2(*reinterpret_cast<const __half2*>(&h1.x));
        const uint4 sm0 = rows_scales_mins(h0), sm1 = rows_scales_mins(h1);
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            const uint2 qa = *reinterpret_cast<const uint2*>(r0 + k * 144 + 16 + 32 * p + 8 * t);
            const uint2 qb = *reinterpret_cast<const uint2*>(r1 + k * 144 + 16 + 32 * p + 8 * t);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int j = 2 * p + hh;
                uint32_t A[4];
                rows_q4k_a(qa, qb, hh, A);
                const uint32_t s0 = j < 4 ? sm0.x : sm0.y, s1 = j < 4 ? sm1.x : sm1.y;
                const uint32_t m0 = j < 4 ? sm0.z : sm0.w, m1 = j < 4 ? sm1.z : sm1.w;
                const float wa[2] = {__fmul_rn(dm0.x, rows_byte2f(s0, j & 3)),
                                     __fmul_rn(dm1.x, rows_byte2f(s1, j & 3))};
                const float wb[2] = {-__fmul_rn(dm0.y, rows_byte2f(m0, j & 3)),
                                     -__fmul_rn(dm1.y, rows_byte2f(m1, j & 3))};
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const uint2 B = rows_ldx<SX, uint2>(xk + nt * 8 * x.cols + 32 * j);
                    const float4 xs = rows_ldx<SX, float4>(sk + j * SCS + nt * 8);
                    int c[4];
                    rows_mma_k32_u8s8(A, B.x, B.y, c);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        if (!ODD && (e & 1)) continue;
                        const int r = e >> 1;
                        const float xd = (e & 1) ? xs.z : xs.x, xsum = (e & 1) ? xs.w : xs.y;
                        acc[nt][e] = fmaf(wa[r], __fmul_rn(xd, rows_i2f(c[e])), acc[nt][e]);
                        acc[nt][e] = fmaf(wb[r], xsum, acc[nt][e]);
                    }
                }
            }
        }
    }
}

// ---- the bulk-copy kernel --------------------------------------------------------------------------------------
struct TmaArgs {
    RowsArgs a;      // the library's arguments (mat[], n, cols, ks, C, tiles, R; st / slot_bytes unused)
    int CG;          // chunks a piece (CG == C: whole tiles, one contiguous copy a matrix)
    int NP;          // pieces a tile: ceil(C / CG)
    int S;           // stages
    int srs;         // bytes between a piece's rows in a stage (whole tiles: row_bytes)
    int mat_off;     // bytes between a piece's matrices (SwiGLU: up after gate)
    int stage_bytes;
    int hint;        // L2 evict-first on the bulk copies
    int split;       // SwiGLU: gate and up of an item on two warps
    int look;        // > 0: piece p is issued only once piece p - look has landed (early pieces land first)
    int xs_off;      // XS kernels: bytes of shared memory where the consumers copy x's codes and scales (n <= 8)
    long long* stamps;   // clock64 stamps of CTAs 0..3 (or null): [b][64 items][2] + [b][128] issue / fold
};

// Warps 0 .. Wc - 1 compute, warp Wc copies. Items j = tile_local * C + chunk as the library's; piece of item j:
// (j / C) * NP + (j % C) / CG; stage p % S, its use p / S.
template <int NT, bool SWIGLU, bool NOCOMP, bool HOIST = false, bool XS = false>
__global__ void __launch_bounds__(17 * 32, 1) rows_tma_kernel(const TmaArgs ta) {
    extern __shared__ __align__(128) uint8_t smem[];
    const RowsArgs& a = ta.a;
    constexpr int NTT = NT == 0 ? 1 : NT;
    constexpr bool ODD = NT != 0;
    constexpr int NR = SWIGLU ? 2 : 1;
    constexpr int PF = NR * NTT * 4 * 32;
    const int Wc = (blockDim.x >> 5) - 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int G = gridDim.x, b = blockIdx.x;
    uint8_t* stages = smem;
    float* part = reinterpret_cast<float*>(smem + (size_t)ta.S * ta.stage_bytes);
    uint64_t* full = reinterpret_cast<uint64_t*>(part + (size_t)a.R * a.C * PF);
    uint64_t* empty = full + ta.S;
    const int n_mine = b < a.tiles ? (a.tiles - 1 - b) / G + 1 : 0;
    const int total = n_mine * a.C;
    const int P = n_mine * ta.NP;
    if (threadIdx.x == 0) {
        for (int s = 0; s < ta.S; ++s) { mbar_init(&full[s], 1); mbar_init(&empty[s], ta.CG * (ta.split ? 2 : 1)); }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const long long t_start = clock64();
    long long* stamp = ta.stamps && b < 4 ? ta.stamps + (size_t)b * 256 : nullptr;

    if (warp == Wc) {   // the producer
        const uint64_t pol = q::l2_evict_first_policy();
        for (int p = 0; p < P; ++p) {
            const int s = p % ta.S;
            if (p >= ta.S) mbar_wait(&empty[s], ((p / ta.S) - 1) & 1);
            if (ta.look > 0 && p >= ta.look) mbar_wait(&full[(p - ta.look) % ta.S], ((p - ta.look) / ta.S) & 1);
            const int tl = p / ta.NP, cg = p % ta.NP;
            const int tile = b + tl * G;
            const RowsMat m = SWIGLU ? a.mat[0] : rows_mat_of(a, tile);
            const int tile_local = tile - m.tile_first;
            const int rows = min(16, m.rows - tile_local * 16);
            const int c0 = cg * ta.CG, k = min(ta.CG, a.C - c0);
            const long long coff = (long long)c0 * a.ks * 144;
            const int cbytes = min(k * a.ks, a.cols / ROWS_QK - c0 * a.ks) * 144;   // a row's bytes of the piece
            const bool whole = ta.CG == a.C;
            const unsigned bytes = (unsigned)(NR * rows * (whole ? m.row_bytes : cbytes));
            if (lane == 0) mbar_expect_tx(&full[s], bytes);
            __syncwarp();
            uint8_t* dst = stages + (size_t)s * ta.stage_bytes;
            if (whole) {
                if (lane < NR) {
                    const RowsMat mm = lane == 0 ? m : a.mat[1];
                    bulk_copy(dst + lane * ta.mat_off, mm.w + (long long)tile_local * 16 * m.row_bytes,
                              (unsigned)(rows * m.row_bytes), &full[s], ta.hint, pol);
                }
            } else {
                const int r = lane & 15, mi = lane >> 4;
                if (r < rows && mi < NR) {
                    const RowsMat mm = mi == 0 ? m : a.mat[1];
                    bulk_copy(dst + mi * ta.mat_off + r * ta.srs, mm.w + (long long)(tile_local * 16 + r) * m.row_bytes + coff,
                              (unsigned)cbytes, &full[s], ta.hint, pol);
                }
            }
        }
        if (stamp && lane == 0) stamp[128] = clock64() - t_start;
        pdl_wait();
        pdl_launch_dependents();
        return;
    }

    pdl_wait();                // the pre-pass's codes, the residual
    pdl_launch_dependents();
    RowsX x = a.x;
    if (XS) {   // the codes and scales of x rows 0..n-1 into shared memory, the layout of the library's FX copy
        int8_t* xq = reinterpret_cast<int8_t*>(smem + ta.xs_off);
        float2* xsc = reinterpret_cast<float2*>(smem + ta.xs_off + a.n * a.cols);
        for (int i = threadIdx.x; i < a.n * a.cols / 16; i += Wc * 32) {
            const int r = i / (a.cols / 16), c = i % (a.cols / 16);
            reinterpret_cast<uint4*>(xq)[i] = __ldg(reinterpret_cast<const uint4*>(a.x.q + (size_t)r * a.cols) + c);
        }
        for (int i = threadIdx.x; i < a.n * (a.cols / 32); i += Wc * 32) {
            const int r = i % a.n, blk = i / a.n;
            xsc[blk * 8 + r] = __ldg(a.x.sc + (size_t)blk * ROWS_NX + r);
        }
        bar_consumers(Wc * 32);
        x = RowsX{xq, xsc, a.cols, a.n - 1};
    }
    if (stamp && threadIdx.x == 0) stamp[129] = clock64() - t_start;
    const int n_rounds = (n_mine + a.R - 1) / a.R;
    int q = 0;
    for (int rd = 0; rd < n_rounds; ++rd) {
        const int NS = ta.split && SWIGLU ? 2 : 1;
        const int jend = min(total, (rd + 1) * a.R * a.C) * NS;
        for (;; ++q) {
            const int jj = warp + q * Wc;
            if (jj >= jend) break;
            const int j = jj / NS, rsel = NS == 2 ? jj % 2 : -1;
            const int tl = j / a.C, chunk = j % a.C, cg = chunk / ta.CG;
            const int p = tl * ta.NP + cg, s = p % ta.S;
            mbar_wait(&full[s], (p / ta.S) & 1);
            if (stamp && lane == 0 && jj < 64) stamp[2 * jj] = clock64() - t_start;
            const int tile = b + tl * G;
            const RowsMat m = SWIGLU ? a.mat[0] : rows_mat_of(a, tile);
            long long off;
            int bytes, u0, nu;
            rows_chunk(a, m, chunk, off, bytes, u0, nu);
            const uint8_t* st = stages + (size_t)s * ta.stage_bytes;
            const int in_off = ta.CG == a.C ? (int)off : (chunk - cg * ta.CG) * a.ks * 144;
            float acc[NR][NTT][4];
#pragma unroll
            for (int r = 0; r < NR; ++r)
#pragma unroll
                for (int nt = 0; nt < NTT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[r][nt][e] = 0.0f;
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                if (rsel >= 0 && r != rsel) continue;
                const uint8_t* r0 = st + r * ta.mat_off + g * ta.srs + in_off;
                const uint8_t* r1 = r0 + 8 * ta.srs;
                if (NOCOMP) acc[r][0][0] = (float)*reinterpret_cast<const int*>(r0);
                else if (HOIST) item_q4k_h<NTT, ODD, XS>(x, r0, r1, u0, nu, g, t, acc[r]);
                else rows_item_q4k<NTT, ODD, XS>(x, r0, r1, u0, nu, g, t, acc[r]);
            }
            __syncwarp();
            if (stamp && lane == 0 && jj < 64) stamp[2 * jj + 1] = clock64() - t_start;
            if (lane == 0) {   // the piece's last chunk also arrives for the chunks a short piece lacks
                const int k = min(ta.CG, a.C - cg * ta.CG);
                mbar_arrive(&empty[s], chunk == cg * ta.CG + k - 1 ? (1 + ta.CG - k) : 1);
            }
            float* pp = part + (size_t)(j - rd * a.R * a.C) * PF + lane;
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                if (rsel >= 0 && r != rsel) continue;
#pragma unroll
                for (int nt = 0; nt < NTT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) pp[((r * NTT + nt) * 4 + e) * 32] = acc[r][nt][e];
            }
        }
        bar_consumers(Wc * 32);
        const int t0 = rd * a.R, nt_round = min(a.R, n_mine - t0);
        const int n_out = nt_round * (NTT * 4) * 32;
        for (int o = threadIdx.x; o < n_out; o += Wc * 32) {
            const int ln = o & 31, kk = (o >> 5) % (NTT * 4), tl = (o >> 5) / (NTT * 4);
            const int xr = (kk >> 2) * 8 + 2 * (ln & 3) + (kk & 1);
            if (xr >= a.n) continue;
            const int tile = b + (t0 + tl) * G;
            const RowsMat m = SWIGLU ? a.mat[0] : rows_mat_of(a, tile);
            const int row = (tile - m.tile_first) * 16 + (ln >> 2) + 8 * ((kk & 3) >> 1);
            if (row >= m.rows) continue;
            const float* pp = part + (size_t)tl * a.C * PF + kk * 32 + ln;
            float s = pp[0];
            for (int c = 1; c < a.C; ++c) s = __fadd_rn(s, pp[(size_t)c * PF]);
            const size_t yo = (size_t)xr * m.rows + row;
            if (SWIGLU) {
                const float* pu = pp + NTT * 4 * 32;
                float su = pu[0];
                for (int c = 1; c < a.C; ++c) su = __fadd_rn(su, pu[(size_t)c * PF]);
                m.y[yo] = __fmul_rn(silu(s), su);
            } else {
                if (m.bias) s = __fadd_rn(s, m.bias[row]);
                if (a.residual) s = __fadd_rn(s, __ldcg(a.residual + yo));
                m.y[yo] = s;
            }
        }
        bar_consumers(Wc * 32);
    }
    if (stamp && threadIdx.x == 0) stamp[130] = clock64() - t_start;
}

// ---- host ------------------------------------------------------------------------------------------------------
struct Case { const char* name; int n_mats; int rows[3]; int cols; bool swiglu; int copies; };

static std::vector<uint8_t> random_q4k(int rows, int cols, std::mt19937& rng) {
    const int nsb = cols / 256;
    std::vector<uint8_t> w((size_t)rows * nsb * 144);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> dd(0.0005f, 0.004f);
    for (size_t blk = 0; blk < (size_t)rows * nsb; ++blk) {
        uint8_t* p = w.data() + blk * 144;
        const __half d = __float2half(dd(rng)), dm = __float2half(dd(rng));
        memcpy(p, &d, 2);
        memcpy(p + 2, &dm, 2);
        for (int i = 4; i < 144; ++i) p[i] = (uint8_t)byte(rng);
    }
    return w;
}

// the library's arguments for one launch of copy c (gemv_rows_run's setup, non-FX path, pre-pass codes in xs)
static RowsArgs lib_args(const Case& k, const std::vector<uint8_t*>& w, int c, float* y, int n, const RowsScratch& xs,
                         int gemv_rows) {
    RowsArgs a{};
    a.n_mats = k.n_mats;
    a.n = n;
    a.cols = k.cols;
    a.ks = rows_ks(k.cols, gemv_rows);
    a.C = ceil_div(k.cols, ROWS_QK * a.ks);
    int tiles = 0, stride_max = 0;
    size_t yoff = 0;
    for (int m = 0; m < k.n_mats; ++m) {
        RowsMat& rm = a.mat[m];
        rm.w = w[m * k.copies + c];
        rm.y = y + yoff;
        yoff += (size_t)n * k.rows[m];
        rm.fmt = ROWS_Q4K;
        rm.rows = k.rows[m];
        rm.row_bytes = (long long)(k.cols / 256) * 144;
        rm.stride = rows_stride(ROWS_Q4K, a.ks);
        rm.tile_first = k.swiglu ? 0 : tiles;
        if (!k.swiglu || m == 0) tiles += ceil_div(rm.rows, 16);
        stride_max = std::max(stride_max, rm.stride);
    }
    a.tiles = tiles;
    a.up_off = 16 * stride_max;
    a.slot_bytes = a.up_off * (k.swiglu ? 2 : 1);
    a.evict_first = 1;
    a.x = RowsX{xs.xq, xs.xsc, k.cols, ROWS_NX - 1};
    return a;
}

template <int NT, bool SW, bool NC, bool H, bool XS>
static void tma_launch(const TmaArgs& t, int ctas, int wc, size_t smem, cudaStream_t st) {
    static bool raised = false;
    if (!raised) { CHECK(cudaFuncSetAttribute(rows_tma_kernel<NT, SW, NC, H, XS>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024)); raised = true; }
    CHECK((cudaError_t)launch_pdl(rows_tma_kernel<NT, SW, NC, H, XS>, dim3(ctas), dim3((wc + 1) * 32), smem, st, t));
}
// kind: 1 plain, 2 nocomp, 3 hoisted x addresses, 4 x in shared memory, 5 both (4, 5: n <= 8)
template <bool SW>
static void tma_launch_k(int kind, const TmaArgs& t, int ctas, int wc, size_t smem, cudaStream_t st) {
    const int n = t.a.n;
    switch (kind) {
        case 1: if (n == 1) tma_launch<0, SW, false, false, false>(t, ctas, wc, smem, st);
                else if (n <= 8) tma_launch<1, SW, false, false, false>(t, ctas, wc, smem, st);
                else tma_launch<4, SW, false, false, false>(t, ctas, wc, smem, st);
                break;
        case 2: if (n == 1) tma_launch<0, SW, true, false, false>(t, ctas, wc, smem, st);
                else if (n <= 8) tma_launch<1, SW, true, false, false>(t, ctas, wc, smem, st);
                else tma_launch<4, SW, true, false, false>(t, ctas, wc, smem, st);
                break;
        case 3: if (n == 1) tma_launch<0, SW, false, true, false>(t, ctas, wc, smem, st);
                else if (n <= 8) tma_launch<1, SW, false, true, false>(t, ctas, wc, smem, st);
                else tma_launch<4, SW, false, true, false>(t, ctas, wc, smem, st);
                break;
        case 4: if (n == 1) tma_launch<0, SW, false, false, true>(t, ctas, wc, smem, st);
                else tma_launch<1, SW, false, false, true>(t, ctas, wc, smem, st);
                break;
        default: if (n == 1) tma_launch<0, SW, false, true, true>(t, ctas, wc, smem, st);
                 else tma_launch<1, SW, false, true, true>(t, ctas, wc, smem, st);
                 break;
    }
}

// Plans a bulk-copy launch: CG (0: whole tiles), Wc consumer warps, S stages as many as fit (<= pieces a CTA).
static bool tma_plan(const RowsArgs& a, bool swiglu, int cg_req, int wc, int hint, int split, int xs_bytes,
                     const DeviceFacts& dev, TmaArgs* out, int* ctas, size_t* smem) {
    TmaArgs t{};
    t.a = a;
    const int NR = swiglu ? 2 : 1, NTT = a.n == 1 ? 1 : (a.n <= 8 ? 1 : 4);
    const long long rb = a.mat[0].row_bytes;
    t.CG = cg_req <= 0 || cg_req >= a.C ? a.C : cg_req;
    t.NP = ceil_div(a.C, t.CG);
    if (t.CG == a.C) t.srs = (int)rb;
    else { t.srs = t.CG * a.ks * 144; while (t.srs % 64 != 32) t.srs += 16; }
    t.mat_off = 16 * t.srs;
    t.stage_bytes = NR * t.mat_off;
    t.hint = hint;
    t.split = swiglu ? split : 0;
    *ctas = std::min(a.tiles, dev.n_sms);
    const int per_cta = ceil_div(a.tiles, *ctas);
    const long long per_tile = (long long)a.C * NR * NTT * 4 * 32 * 4;
    const long long budget = dev.max_smem - 1024 - xs_bytes;
    for (int R = std::min(per_cta, 8); R >= 1; --R) {
        const long long left = budget - R * per_tile - 2 * 32 * 8;
        const int S = (int)std::min<long long>(std::min(per_cta * t.NP, 16), left / t.stage_bytes);
        if (S >= std::min(2, per_cta * t.NP)) {
            t.S = S;
            t.a.R = R;
            *smem = (size_t)S * t.stage_bytes + (size_t)R * per_tile + 2 * S * 8;
            *smem = (*smem + 15) & ~(size_t)15;
            t.xs_off = (int)*smem;
            *smem += xs_bytes;
            *out = t;
            (void)wc;
            return true;
        }
    }
    return false;
}

int main() {
    DeviceFacts dev;
    CHECK((cudaError_t)device_facts(&dev));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("# %s, %d SMs, %d KB opt-in shared memory a CTA\n", prop.name, dev.n_sms, dev.max_smem / 1024);
    std::mt19937 rng(7);
    const Case cases[] = {
        {"gate/up", 2, {8960, 8960, 0}, 1536, true, 4},
        {"down", 1, {1536, 0, 0}, 8960, false, 8},
        {"qkv", 3, {1536, 256, 256}, 1536, false, 32},
        {"o", 1, {1536, 0, 0}, 1536, false, 40},
    };
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    RowsScratch xs;
    CHECK((cudaError_t)rows_scratch(st, &xs));
    long long* stamps_dev;
    CHECK(cudaMalloc(&stamps_dev, 4 * 256 * 8));
    CHECK(cudaMemset(stamps_dev, 0, 4 * 256 * 8));
    long long* stamps_now = nullptr;
    for (const Case& k : cases) {
        std::vector<uint8_t*> w;
        double mb = 0;
        for (int m = 0; m < k.n_mats; ++m) {
            const std::vector<uint8_t> h = random_q4k(k.rows[m], k.cols, rng);
            mb += h.size() / 1e6;
            for (int c = 0; c < k.copies; ++c) {
                uint8_t* d;
                CHECK(cudaMalloc(&d, h.size()));
                CHECK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
                w.push_back(d);
            }
        }
        int out_rows = 0;
        for (int m = 0; m < k.n_mats; ++m) out_rows += k.rows[m];
        float *y0, *y1, *x;
        CHECK(cudaMalloc(&y0, sizeof(float) * 32 * out_rows));
        CHECK(cudaMalloc(&y1, sizeof(float) * 32 * out_rows));
        CHECK(cudaMalloc(&x, sizeof(float) * 32 * k.cols));
        std::vector<float> hx((size_t)32 * k.cols);
        std::normal_distribution<float> nd(0.f, 1.f);
        for (float& v : hx) v = nd(rng);
        CHECK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
        printf("## %s: %d matrices, %.2f MB a launch, %d copies\n", k.name, k.n_mats, mb, k.copies);
        for (int n : {1, 8, 32}) {
            gemv_rows_quantize_x<<<dim3(ceil_div(k.cols, ROWS_PREPASS_THREADS), n), ROWS_PREPASS_THREADS, 0, st>>>(
                x, nullptr, 0.f, k.cols, xs.xq, xs.xsc);
            CHECK(cudaStreamSynchronize(st));
            // variants: library (lib), bulk copies with CG chunks a piece (0 = whole tiles), Wc consumer warps
            struct V { const char* name; int kind; int cg, wc, hint, split, look = 0; };
            const V vs[] = {{"lib ks1", 0, 0, 0, 0, 0},
                            {"tma w16", 1, 0, 16, 1, 0}, {"tma w8", 1, 0, 8, 1, 0},
                            {"tma w16 split", 1, 0, 16, 1, 1},
                            {"tma w16 hoist", 3, 0, 16, 1, 0}, {"tma w8 hoist", 3, 0, 8, 1, 0},
                            {"tma w16 xs", 4, 0, 16, 1, 0}, {"tma w16 hoist xs", 5, 0, 16, 1, 0},
                            {"tma w8 hoist xs", 5, 0, 8, 1, 0}, {"tma w16 hoist xs split", 5, 0, 16, 1, 1},
                            {"tma w16 hoist split", 3, 0, 16, 1, 1},
                            {"tma w16 hoist look1", 3, 0, 16, 1, 0, 1}, {"tma w16 hoist look2", 3, 0, 16, 1, 0, 2},
                            {"tma w16 hoist look3", 3, 0, 16, 1, 0, 3},
                            {"nocomp w16", 2, 0, 16, 1, 0}, {"nocomp w16 look2", 2, 0, 16, 1, 0, 2}};
            for (const V& v : vs) {
                auto launch = [&](int c, float* y) {
                    RowsArgs a = lib_args(k, w, c, y, n, xs, 1);
                    if (v.kind == 0) {
                        RowsShape sh;
                        if (rows_shape(a, k.swiglu, n, 0, dev, &sh)) { fprintf(stderr, "no shape\n"); exit(1); }
                        a.st = sh.st;
                        a.R = sh.R;
                        CHECK((cudaError_t)(k.swiglu ? rows_launch_n<true>(a, sh, false, dev.max_smem, st)
                                                     : rows_launch_n<false>(a, sh, false, dev.max_smem, st)));
                        return true;
                    }
                    if ((v.kind == 4 || v.kind == 5) && n > 8) return false;
                    if (v.split && !k.swiglu) return false;
                    TmaArgs t;
                    int ctas;
                    size_t smem;
                    const int xs_bytes = v.kind >= 4 ? ((n * k.cols + 15) & ~15) + (k.cols / 32) * 8 * 8 : 0;
                    if (!tma_plan(a, k.swiglu, v.cg, v.wc, v.hint, v.split, xs_bytes, dev, &t, &ctas, &smem)) return false;
                    t.stamps = stamps_now;
                    t.look = v.look;
                    if (k.swiglu) tma_launch_k<true>(v.kind, t, ctas, v.wc, smem, st);
                    else tma_launch_k<false>(v.kind, t, ctas, v.wc, smem, st);
                    return true;
                };
                if (!launch(0, y1)) { printf("%-8s %-22s n=%-2d  (no plan)\n", k.name, v.name, n); continue; }
                CHECK(cudaStreamSynchronize(st));
                CHECK(cudaGetLastError());
                const char* verdict = "";
                if (v.kind == 0) { CHECK(cudaMemcpy(y0, y1, sizeof(float) * 32 * out_rows, cudaMemcpyDeviceToDevice)); }
                else if (v.kind != 2) {
                    std::vector<float> a0(32 * out_rows), a1(32 * out_rows);
                    CHECK(cudaMemcpy(a0.data(), y0, a0.size() * 4, cudaMemcpyDeviceToHost));
                    CHECK(cudaMemcpy(a1.data(), y1, a1.size() * 4, cudaMemcpyDeviceToHost));
                    // outputs: matrix m's (n, rows[m]) blocks one after another
                    size_t bad = 0, o = 0;
                    for (int m = 0; m < (k.swiglu ? 1 : k.n_mats); ++m) {
                        for (size_t i = 0; i < (size_t)n * k.rows[m]; ++i)
                            if (memcmp(&a0[o + i], &a1[o + i], 4) != 0) ++bad;
                        o += (size_t)n * k.rows[m];
                    }
                    verdict = bad ? "MISMATCH" : "bitwise == lib";
                    if (bad) printf("   %zu outputs differ\n", bad);
                }
                // time: a graph of 8 x copies launches
                const int iters = 8 * k.copies;
                cudaGraph_t gr;
                cudaGraphExec_t ge;
                CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                for (int i = 0; i < iters; ++i) launch(i % k.copies, y1);
                CHECK(cudaStreamEndCapture(st, &gr));
                CHECK(cudaGraphInstantiate(&ge, gr, 0));
                for (int wup = 0; wup < 2; ++wup) CHECK(cudaGraphLaunch(ge, st));
                cudaEvent_t e0, e1;
                CHECK(cudaEventCreate(&e0));
                CHECK(cudaEventCreate(&e1));
                CHECK(cudaEventRecord(e0, st));
                const int reps = 5;
                for (int r = 0; r < reps; ++r) CHECK(cudaGraphLaunch(ge, st));
                CHECK(cudaEventRecord(e1, st));
                CHECK(cudaEventSynchronize(e1));
                float ms;
                CHECK(cudaEventElapsedTime(&ms, e0, e1));
                const double us = 1000.0 * ms / (reps * iters);
                printf("%-8s %-22s n=%-2d %8.2f us %7.0f GB/s  %s\n", k.name, v.name, n, us, mb * 1e3 / us, verdict);
                if (k.swiglu && n <= 8 && (strcmp(v.name, "tma w16 hoist") == 0 || strcmp(v.name, "tma w16 hoist look2") == 0)) {
                    for (int c = 0; c < k.copies; ++c) launch(c, y1);
                    stamps_now = stamps_dev;
                    launch(0, y1);
                    stamps_now = nullptr;
                    CHECK(cudaStreamSynchronize(st));
                    std::vector<long long> hs(4 * 256);
                    CHECK(cudaMemcpy(hs.data(), stamps_dev, hs.size() * 8, cudaMemcpyDeviceToHost));
                    for (int cb = 0; cb < 2; ++cb) {
                        const long long* S = hs.data() + cb * 256;
                        printf("   stamps CTA %d (cycles): producer issued %lld, x ready %lld, end %lld; items (wait done / computed):",
                               cb, S[128], S[129], S[130]);
                        for (int jj = 0; jj < 64; ++jj) if (S[2 * jj] || S[2 * jj + 1]) printf(" %d:%lld/%lld", jj, S[2 * jj], S[2 * jj + 1]);
                        printf("\n");
                    }
                    CHECK(cudaMemset(stamps_dev, 0, 4 * 256 * 8));
                }
                CHECK(cudaGraphExecDestroy(ge));
                CHECK(cudaGraphDestroy(gr));
                CHECK(cudaEventDestroy(e0));
                CHECK(cudaEventDestroy(e1));
            }
        }
        for (uint8_t* d : w) CHECK(cudaFree(d));
        CHECK(cudaFree(y0));
        CHECK(cudaFree(y1));
        CHECK(cudaFree(x));
    }
    return 0;
}
