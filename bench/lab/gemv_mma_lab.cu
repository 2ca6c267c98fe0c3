// gemv_mma_lab.cu -- a lab, not the library (issue 11): can a Q4_K GEMV on int8 tensor cores make extra x rows
// (speculative verification: 2-8 rows) nearly free, and what does it cost at one row?
//
// The library's GEMV (gemv.cuh) spends, per 4 weights and per x row, one shared-memory load of x codes and two
// dp4a (hi and lo codes): its per-row work grows linearly with the rows, and a verify forward of 8 rows costs
// 3.5-4x a decode step on an H100 (bench/results/2026-11-26-h100-forward-rows-ncu-session10.md). Here one
// mma.sync.m16n8k32 (u8 weight codes x s8 x codes, s32 sums) does 16 weight rows x 32 columns x 8 x rows at
// once, twice per 32-column sub-block (hi and lo codes), so rows 2-8 cost no extra instructions.
//
// gemv_q4k_mma: a CTA owns TILES tiles of 16 weight rows; its WARPS / TILES warps per tile take the tile's
// super-blocks round-robin (k split, so a matrix with few row tiles -- ffn_down, 96 tiles -- still has warps on
// every SM), U super-blocks of weights in registers ahead of the one computed (16-byte header + 4 x 8 code
// bytes per row, straight from global memory, no shared-memory staging); the warps of a tile then add their
// partial sums in warp order through shared memory (deterministic, and a row's bits do not depend on the other
// x rows: each x row is its own mma column). x' is the library's int8 activation form (hi + lo / 254 per
// column, a scale and a sum per 32 columns), pre-quantized in global memory for up to 8 rows.
//
// k-slot map of one sub-block (32 columns): mma k-slot 4t + j is column 8t + j and k-slot 16 + 4t + j is column
// 8t + 4 + j (t = thread in quad): then a thread's A registers for rows g and g + 8 are one 8-byte load of
// code bytes 8t .. 8t + 7 of the sub-block pair (low nibbles: sub-block 2p, high: 2p + 1), and its B
// registers one 8-byte load of x codes.
//
// Checked against a float64 host GEMV of the dequantized weights with the same x' (error relative to
// sum |w| |x'|, tolerance 1e-5), per x row, so a fast wrong variant cannot win. Timed in CUDA graphs of
// back-to-back launches over weight copies that exceed L2 (as gemv_stream_lab.cu), with PDL.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o gemv_mma_lab bench/lab/gemv_mma_lab.cu && ./gemv_mma_lab
//
// Repeats, on purpose: the PDL and 16-byte load helpers, the host dequant_row and random_q4k, quantize_row
// (quantize_x for several rows), time_graph and the PDL launch are gemv_stream_lab.cu's (and its kernels
// header's), sbyte / scale_min gemv_q4k_lab.cu's: each lab is one nvcc command and stays as it was measured
// (bench/NOTES.md), so the labs share no header with each other or with the library. The two variant lists
// in main (wide and narrow matrices) are tables, one launch a line.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

constexpr int QK = 256, BB = 144, MAXN = 8;

struct MArgs {
    const uint8_t* w; float* y; int rows, cols, nx;
    const int8_t* xhi; const int8_t* xlo;   // (MAXN, cols); rows >= nx are zero
    const float* xd; const float* xsum;      // (MAXN, cols / 32)
};

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_go() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ uint4 ld16(const void* p) {   // weights: read once, keep out of L1
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ld8(const void* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

// D = A (16x32 u8, row) x B (32x8 s8, col), s32
__device__ __forceinline__ void mma_u8s8(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int (&d)[4]) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%11,%12,%13};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}

// Q4_K sub-block j's 6-bit (scale, min) from the header words h.y, h.z, h.w (scale bytes 0..11); as in
// gemv_stream_lab_kernels.cuh, on purpose: each lab is one nvcc command and shares no header
__device__ __forceinline__ uint32_t sbyte(const uint4& h, int i) {
    const uint32_t word = i < 4 ? h.y : (i < 8 ? h.z : h.w);
    return (word >> (8 * (i & 3))) & 0xFFu;
}
__device__ __forceinline__ void scale_min(int j, const uint4& h, float& sc, float& m) {
    if (j < 4) { sc = (float)(sbyte(h, j) & 63); m = (float)(sbyte(h, j + 4) & 63); }
    else {
        sc = (float)((sbyte(h, j + 4) & 0xF) | ((sbyte(h, j - 4) >> 6) << 4));
        m = (float)((sbyte(h, j + 4) >> 4) | ((sbyte(h, j) >> 6) << 4));
    }
}

struct SB { uint4 h[2]; uint2 q[2][4]; };   // one super-block of rows g and g + 8: header, 4 x 8 code bytes

__device__ __forceinline__ void load_sb(const uint8_t* ra, const uint8_t* rb, int sb, int t, SB& s) {
    const uint8_t* pa = ra + (size_t)sb * BB;
    const uint8_t* pb = rb + (size_t)sb * BB;
    s.h[0] = ld16(pa);
    s.h[1] = ld16(pb);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        s.q[0][p] = ld8(pa + 16 + 32 * p + 8 * t);
        s.q[1][p] = ld8(pb + 16 + 32 * p + 8 * t);
    }
}

// acc[e]: e = 0 (row g, x row 2t), 1 (g, 2t + 1), 2 (g + 8, 2t), 3 (g + 8, 2t + 1)
template <bool ALLN>
__device__ __forceinline__ void compute_sb(const MArgs& a, const SB& s, int sb, int g, int t, float (&acc)[4]) {
    float dm[2][2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&s.h[r].x));
        dm[r][0] = f.x;
        dm[r][1] = f.y;
    }
    const int nb = g < a.nx ? g : 0;   // B column g: x row g (rows >= nx read row 0, their results unused)
    const int n0 = 2 * t, n1 = 2 * t + 1;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int j = 2 * p + hh, col0 = sb * QK + 32 * j;
            uint32_t A[4];
            A[0] = (s.q[0][p].x >> (4 * hh)) & 0x0F0F0F0Fu;
            A[1] = (s.q[1][p].x >> (4 * hh)) & 0x0F0F0F0Fu;
            A[2] = (s.q[0][p].y >> (4 * hh)) & 0x0F0F0F0Fu;
            A[3] = (s.q[1][p].y >> (4 * hh)) & 0x0F0F0F0Fu;
            const uint2 bh = __ldg(reinterpret_cast<const uint2*>(a.xhi + (size_t)nb * a.cols + col0 + 8 * t));
            const uint2 bl = __ldg(reinterpret_cast<const uint2*>(a.xlo + (size_t)nb * a.cols + col0 + 8 * t));
            int ch[4], cl[4];
            mma_u8s8(A, bh.x, bh.y, ch);
            mma_u8s8(A, bl.x, bl.y, cl);
            const int b32 = col0 >> 5, nq = a.cols >> 5;
            float xd[2], xs[2];
            xd[0] = (ALLN || n0 < a.nx) ? __ldg(a.xd + n0 * nq + b32) : 0.0f;
            xs[0] = (ALLN || n0 < a.nx) ? __ldg(a.xsum + n0 * nq + b32) : 0.0f;
            xd[1] = (ALLN || n1 < a.nx) ? __ldg(a.xd + n1 * nq + b32) : 0.0f;
            xs[1] = (ALLN || n1 < a.nx) ? __ldg(a.xsum + n1 * nq + b32) : 0.0f;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float sc, m;
                scale_min(j, s.h[r], sc, m);
                const float wa = dm[r][0] * sc, wb = -(dm[r][1] * m);
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int e = 2 * r + c;
                    const float cx = xd[c] * fmaf((float)cl[e], 1.0f / 254.0f, (float)ch[e]);
                    acc[e] = fmaf(wa, cx, fmaf(wb, xs[c], acc[e]));
                }
            }
        }
    }
}

template <int TILES, int WARPS, int U, bool PDL>
__global__ void __launch_bounds__(WARPS * 32) gemv_q4k_mma(MArgs a) {
    constexpr int WPT = WARPS / TILES;   // warps per tile
    __shared__ float part[WARPS][32][4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tile = blockIdx.x * TILES + warp % TILES, kw = warp / TILES;
    const int nsb = a.cols / QK;
    const size_t rb = (size_t)nsb * BB;
    const int r0 = tile * 16;
    const bool live = r0 < a.rows;
    const uint8_t* ra = a.w + (size_t)(live ? r0 + g : 0) * rb;
    const uint8_t* rbp = a.w + (size_t)(live ? r0 + g + 8 : 0) * rb;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    SB buf[U];
    // the warp's super-blocks: kw, kw + WPT, ...; the first U in flight before pdl_wait
#pragma unroll
    for (int u = 0; u < U; ++u)
        if (live && kw + u * WPT < nsb) load_sb(ra, rbp, kw + u * WPT, t, buf[u]);
    if (PDL) { pdl_wait(); pdl_go(); }
    if (live) {
        int it = 0;
        for (int sb = kw; sb < nsb; sb += U * WPT, it += U) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = sb + u * WPT;
                if (k < nsb) {
                    const SB cur = buf[u];
                    if (k + U * WPT < nsb) load_sb(ra, rbp, k + U * WPT, t, buf[u]);
                    if (a.nx == MAXN) compute_sb<true>(a, cur, k, g, t, acc);
                    else compute_sb<false>(a, cur, k, g, t, acc);
                }
            }
        }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) part[warp][lane][e] = acc[e];
    __syncthreads();
    if (kw == 0 && live) {   // the tile's first warp adds its warps' partials in warp order
        float s[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) s[e] = part[warp][lane][e];
        for (int w = 1; w < WPT; ++w)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[e] += part[warp + w * TILES][lane][e];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = r0 + g + 8 * (e >> 1), n = 2 * t + (e & 1);
            if (n < a.nx && row < a.rows) a.y[(size_t)n * a.rows + row] = s[e];
        }
    }
}

// gemv_q4k_mma_items: a CTA owns tiles c, c + G, c + 2G, ... (G CTAs), R at a time (a round); the round's items
// (tile, super-block) go to its warps round-robin, each warp keeping U of its items' weights in registers ahead;
// a warp writes an item's 16 x 8 partial to shared memory, and after a CTA barrier warp i % WARPS adds tile i's
// items in super-block order (fixed: a row's bits do not depend on the CTA shape or on the other x rows).
template <int WARPS, int U, int R>
__global__ void __launch_bounds__(WARPS * 32) gemv_q4k_mma_items(MArgs a) {
    extern __shared__ float part[];   // (R * nsb, 32 lanes, 4)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int nsb = a.cols / QK, n_tiles = a.rows / 16, G = gridDim.x, c = blockIdx.x;
    const size_t rb = (size_t)nsb * BB;
    const int n_mine = c < n_tiles ? (n_tiles - 1 - c) / G + 1 : 0;
    bool waited = false;
    for (int k0 = 0; k0 < n_mine; k0 += R) {
        const int nt = min(R, n_mine - k0), n_items = nt * nsb;
        SB buf[U];
        auto item_rows = [&](int j, const uint8_t*& ra, const uint8_t*& rbp) {
            const int tile = c + (k0 + j / nsb) * G;
            ra = a.w + (size_t)(tile * 16 + g) * rb;
            rbp = ra + 8 * rb;
        };
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = warp + u * WARPS;
            if (j < n_items) { const uint8_t *ra, *rbp; item_rows(j, ra, rbp); load_sb(ra, rbp, j % nsb, t, buf[u]); }
        }
        if (!waited) { pdl_wait(); pdl_go(); waited = true; }
        for (int j0 = warp; j0 < n_items; j0 += U * WARPS) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int j = j0 + u * WARPS;
                if (j < n_items) {
                    const SB cur = buf[u];
                    const int jn = j + U * WARPS;
                    if (jn < n_items) { const uint8_t *ra, *rbp; item_rows(jn, ra, rbp); load_sb(ra, rbp, jn % nsb, t, buf[u]); }
                    float acc[4] = {0.f, 0.f, 0.f, 0.f};
                    if (a.nx == MAXN) compute_sb<true>(a, cur, j % nsb, g, t, acc);
                    else compute_sb<false>(a, cur, j % nsb, g, t, acc);
                    *reinterpret_cast<float4*>(part + ((size_t)j * 32 + lane) * 4) = make_float4(acc[0], acc[1], acc[2], acc[3]);
                }
            }
        }
        __syncthreads();
        for (int i = warp; i < nt; i += WARPS) {
            const int tile = c + (k0 + i) * G;
            float4 s4 = *reinterpret_cast<const float4*>(part + ((size_t)(i * nsb) * 32 + lane) * 4);
            for (int sb = 1; sb < nsb; ++sb) {
                const float4 v = *reinterpret_cast<const float4*>(part + ((size_t)(i * nsb + sb) * 32 + lane) * 4);
                s4.x += v.x; s4.y += v.y; s4.z += v.z; s4.w += v.w;
            }
            const float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = tile * 16 + g + 8 * (e >> 1), n = 2 * t + (e & 1);
                if (n < a.nx) a.y[(size_t)n * a.rows + row] = sv[e];
            }
        }
        __syncthreads();
    }
    if (!waited) { pdl_wait(); pdl_go(); }
}

// ---- host ------------------------------------------------------------------------------------------------
static float h2f(uint16_t h) { __half_raw r; r.x = h; return __half2float(__half(r)); }
// (dequant_row as in gemv_q4k_lab.cu and gemv_stream_lab.cu, on purpose: each lab is one nvcc command)
static void dequant_row(const uint8_t* row, int cols, double* out) {
    for (int b = 0; b < cols / QK; ++b) {
        const uint8_t* blk = row + b * BB;
        uint16_t dh, mh; memcpy(&dh, blk, 2); memcpy(&mh, blk + 2, 2);
        const double d = h2f(dh), dmin = h2f(mh);
        const uint8_t* s = blk + 4;
        for (int j = 0; j < 8; ++j) {
            double sc, m;
            if (j < 4) { sc = s[j] & 63; m = s[j + 4] & 63; }
            else { sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4); m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
            for (int l = 0; l < 32; ++l) {
                const uint8_t q = blk[16 + 32 * (j / 2) + l];
                out[b * QK + 32 * j + l] = d * sc * ((j & 1) ? (q >> 4) : (q & 0xF)) - dmin * m;
            }
        }
    }
}

struct XQ { std::vector<int8_t> hi, lo; std::vector<float> d, sum; std::vector<double> xq; };
static void quantize_row(const float* x, int cols, XQ& r, int n) {   // the library's int8 activation form
    for (int b = 0; b < cols / 32; ++b) {
        float mx = 0.f;
        for (int k = 0; k < 32; ++k) mx = std::max(mx, std::fabs(x[32 * b + k]));
        const float inv = mx > 0.f ? 127.f / mx : 0.f, dx = mx / 127.f;
        int hs = 0, ls = 0;
        for (int k = 0; k < 32; ++k) {
            const size_t c = (size_t)n * cols + 32 * b + k;
            const float tt = x[32 * b + k] * inv;
            const int hi = (int)std::nearbyint(tt), lo = (int)std::nearbyint((tt - hi) * 254.f);
            r.hi[c] = (int8_t)hi; r.lo[c] = (int8_t)lo; hs += hi; ls += lo;
            r.xq[c] = (double)dx * (hi + lo / 254.0);
        }
        r.d[(size_t)n * (cols / 32) + b] = dx;
        r.sum[(size_t)n * (cols / 32) + b] = dx * (hs + ls / 254.f);
    }
}

static std::vector<uint8_t> random_q4k(size_t rows, int cols, std::mt19937& rng) {
    const size_t nblk = rows * (cols / QK);
    std::vector<uint8_t> w(nblk * BB);
    for (auto& v : w) v = rng() & 0xFF;
    for (size_t b = 0; b < nblk; ++b) {
        __half d = __float2half(1e-3f + 9e-3f * (rng() % 1000) / 1000.f), m = __float2half(1e-3f + 9e-3f * (rng() % 1000) / 1000.f);
        memcpy(&w[b * BB], &d, 2); memcpy(&w[b * BB + 2], &m, 2);
    }
    return w;
}

struct Launch { void (*k)(MArgs); int tiles, warps; const char* name; int items_r = 0; int ctas_per_sm = 1; };

// (time_graph as in gemv_stream_lab.cu, on purpose: each lab is one nvcc command)
template <class F>
static double time_graph(cudaStream_t st, int reps, F fn) {
    cudaGraph_t gr; cudaGraphExec_t e;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    fn(st);
    CHECK(cudaStreamEndCapture(st, &gr));
    CHECK(cudaGraphInstantiate(&e, gr, 0));
    for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(e, st));
    cudaEvent_t a, b; CHECK(cudaEventCreate(&a)); CHECK(cudaEventCreate(&b));
    CHECK(cudaEventRecord(a, st));
    for (int i = 0; i < reps; ++i) CHECK(cudaGraphLaunch(e, st));
    CHECK(cudaEventRecord(b, st)); CHECK(cudaEventSynchronize(b));
    float ms; CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaGraphExecDestroy(e)); CHECK(cudaGraphDestroy(gr));
    return ms * 1e3 / reps;
}

static int g_n_sm = 132;
static void launch(const Launch& L, const MArgs& a, cudaStream_t st) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(L.tiles ? (a.rows / 16 + L.tiles - 1) / L.tiles : 1); cfg.blockDim = dim3(L.warps * 32); cfg.stream = st;
    if (L.items_r) {   // gemv_q4k_mma_items: a persistent grid, R tiles x super-blocks of partials in shared memory
        cfg.gridDim = dim3(std::min(a.rows / 16, g_n_sm * L.ctas_per_sm));
        cfg.dynamicSmemBytes = (size_t)L.items_r * (a.cols / QK) * 32 * 4 * 4;
        CHECK(cudaFuncSetAttribute(L.k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cfg.dynamicSmemBytes));
    }
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at; cfg.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&cfg, L.k, a));
}

int main() {
    cudaDeviceProp prop; CHECK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t st; CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const size_t nb = 512u << 20;
    void *src, *dst; CHECK(cudaMalloc(&src, nb)); CHECK(cudaMalloc(&dst, nb));
    const double copy_us = time_graph(st, 5, [&](cudaStream_t s) { CHECK(cudaMemcpyAsync(dst, src, nb, cudaMemcpyDeviceToDevice, s)); });
    const double copy_gbs = 2.0 * nb / (copy_us * 1e-6) * 1e-9;
    CHECK(cudaFree(dst)); CHECK(cudaFree(src));
    printf("# %s, %d SMs; device copy %.0f GB/s (read + write)\n", prop.name, prop.multiProcessorCount, copy_gbs);
    g_n_sm = prop.multiProcessorCount;

    struct Case { const char* name; int rows, cols; };
    const Case cases[] = {{"ffn_gate 1.5B", 8960, 1536}, {"ffn_down 1.5B", 1536, 8960}, {"attn_q/o 1.5B", 1536, 1536},
                          {"lm_head 1.5B", 151936, 1536}};
    std::mt19937 rng(11);
    for (const Case& cs : cases) {
        const std::vector<uint8_t> hw = random_q4k(cs.rows, cs.cols, rng);
        XQ q;
        q.hi.assign((size_t)MAXN * cs.cols, 0); q.lo.assign((size_t)MAXN * cs.cols, 0); q.xq.assign((size_t)MAXN * cs.cols, 0);
        q.d.assign((size_t)MAXN * cs.cols / 32, 0); q.sum.assign((size_t)MAXN * cs.cols / 32, 0);
        std::vector<float> hx(cs.cols);
        for (int n = 0; n < MAXN; ++n) {
            for (auto& v : hx) v = (float)((int)(rng() % 2001) - 1000) / 1000.f;
            quantize_row(hx.data(), cs.cols, q, n);
        }
        const int check_rows = std::min(cs.rows, 4096);
        std::vector<double> ref((size_t)MAXN * check_rows), mag((size_t)MAXN * check_rows), wrow(cs.cols);
        for (int r = 0; r < check_rows; ++r) {
            dequant_row(hw.data() + (size_t)r * (cs.cols / QK) * BB, cs.cols, wrow.data());
            for (int n = 0; n < MAXN; ++n) {
                double s = 0, m = 0;
                for (int c = 0; c < cs.cols; ++c) { const double v = wrow[c] * q.xq[(size_t)n * cs.cols + c]; s += v; m += std::fabs(v); }
                ref[(size_t)n * check_rows + r] = s; mag[(size_t)n * check_rows + r] = m;
            }
        }
        const size_t wbytes = hw.size();
        const int ncopy = (int)std::max<size_t>(2, std::min<size_t>(64, (300u << 20) / wbytes));
        std::vector<uint8_t*> copies(ncopy);
        for (auto& p : copies) { CHECK(cudaMalloc(&p, wbytes)); CHECK(cudaMemcpy(p, hw.data(), wbytes, cudaMemcpyHostToDevice)); }
        int8_t *dhi, *dlo; float *dxd, *dxs, *dy;
        CHECK(cudaMalloc(&dhi, q.hi.size())); CHECK(cudaMalloc(&dlo, q.lo.size()));
        CHECK(cudaMalloc(&dxd, q.d.size() * 4)); CHECK(cudaMalloc(&dxs, q.sum.size() * 4));
        CHECK(cudaMalloc(&dy, (size_t)MAXN * cs.rows * 4));
        CHECK(cudaMemcpy(dhi, q.hi.data(), q.hi.size(), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dlo, q.lo.data(), q.lo.size(), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dxd, q.d.data(), q.d.size() * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dxs, q.sum.data(), q.sum.size() * 4, cudaMemcpyHostToDevice));
        std::vector<Launch> vs;
        if (cs.cols > 4096) {   // 35 super-blocks a row: k split over the warps of a tile
            vs.push_back({gemv_q4k_mma<1, 8, 2, true>, 1, 8, "tiles1 w8 u2"});
            vs.push_back({gemv_q4k_mma<1, 12, 2, true>, 1, 12, "tiles1 w12 u2"});
            vs.push_back({gemv_q4k_mma<1, 16, 1, true>, 1, 16, "tiles1 w16 u1"});
            vs.push_back({gemv_q4k_mma<2, 16, 1, true>, 2, 16, "tiles2 w16 u1"});
            vs.push_back({gemv_q4k_mma_items<16, 2, 1>, 0, 16, "items w16 u2 r1", 1});
            vs.push_back({gemv_q4k_mma_items<12, 2, 1>, 0, 12, "items w12 u2 r1", 1});
            vs.push_back({gemv_q4k_mma_items<8, 2, 1>, 0, 8, "items w8 u2 r1 x2", 1, 2});
        } else {                // 6 super-blocks a row
            vs.push_back({gemv_q4k_mma<2, 12, 1, true>, 2, 12, "tiles2 w12 u1"});
            vs.push_back({gemv_q4k_mma<4, 12, 2, true>, 4, 12, "tiles4 w12 u2"});
            vs.push_back({gemv_q4k_mma<4, 16, 1, true>, 4, 16, "tiles4 w16 u1"});
            vs.push_back({gemv_q4k_mma<8, 16, 1, true>, 8, 16, "tiles8 w16 u1"});
            vs.push_back({gemv_q4k_mma_items<16, 2, 5>, 0, 16, "items w16 u2 r5", 5});
            vs.push_back({gemv_q4k_mma_items<16, 3, 8>, 0, 16, "items w16 u3 r8", 8});
            vs.push_back({gemv_q4k_mma_items<12, 2, 8>, 0, 12, "items w12 u2 r8", 8});
            vs.push_back({gemv_q4k_mma_items<8, 2, 4>, 0, 8, "items w8 u2 r4 x2", 4, 2});
        }
        printf("# %s: %d x %d Q4_K, %.2f MB, %d copies\n", cs.name, cs.rows, cs.cols, wbytes / 1e6, ncopy);
        for (const Launch& L : vs)
            for (int nx : {1, 2, 4, 8}) {
                MArgs a = {copies[0], dy, cs.rows, cs.cols, nx, dhi, dlo, dxd, dxs};
                CHECK(cudaMemset(dy, 0, (size_t)MAXN * cs.rows * 4));
                launch(L, a, st);
                CHECK(cudaStreamSynchronize(st));
                std::vector<float> hy((size_t)MAXN * cs.rows);
                CHECK(cudaMemcpy(hy.data(), dy, hy.size() * 4, cudaMemcpyDeviceToHost));
                double worst = 0;
                for (int n = 0; n < nx; ++n)
                    for (int r = 0; r < check_rows; ++r)
                        worst = std::max(worst, std::fabs(hy[(size_t)n * cs.rows + r] - ref[(size_t)n * check_rows + r]) /
                                                    (mag[(size_t)n * check_rows + r] + 1e-30));
                const double us = time_graph(st, 10, [&](cudaStream_t s) {
                    for (int i = 0; i < ncopy; ++i) { MArgs b = a; b.w = copies[i]; launch(L, b, s); }
                }) / ncopy;
                printf("%-14s %-14s n=%d %8.2f us %7.0f GB/s (%5.1f%% of copy)  err %.1e %s\n", cs.name, L.name, nx, us,
                       wbytes / (us * 1e-6) * 1e-9, 100.0 * wbytes / (us * 1e-6) * 1e-9 / copy_gbs, worst,
                       worst < 1e-5 ? "ok" : "WRONG");
            }
        for (auto p : copies) CHECK(cudaFree(p));
        CHECK(cudaFree(dhi)); CHECK(cudaFree(dlo)); CHECK(cudaFree(dxd)); CHECK(cudaFree(dxs)); CHECK(cudaFree(dy));
    }
    printf("done\n");
    return 0;
}
