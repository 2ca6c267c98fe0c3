// gemv_stream_lab.cu -- a lab, not the library (issue 11): is a decode GEMV's time the bytes of its
// weights, or structure? Three measurements, one binary, on whatever GPU runs it:
//
//  1. floor: a kernel that only streams N bytes (16-byte loads, U in flight per thread, persistent grid),
//     launched back to back in a CUDA graph over copies of the buffer that together exceed L2, with and
//     without programmatic dependent launch (PDL). That is the best any one-launch-per-matrix design
//     can do for this size on this GPU.
//  2. gemv_q4k_stream: a Q4_K GEMV y = W x' built for that floor: no shared-memory staging of weights
//     (16-byte loads straight into registers, the next item's loads issued before the current item is
//     computed), 8 lanes per 256-column super-block, x' as int8 hi + lo codes per 32 columns (the
//     library's f16-like activations: xn ~ dx * (hi + lo / 254)) so each 4 weights cost two dp4a,
//     PDL (the first item's weights are loaded before griddepcontrol.wait). x' comes either already
//     quantized in global memory (QX: what a producer kernel's epilogue could write once) or as floats
//     quantized by every CTA (the library's current prologue, minus the RMSNorm).
//  3. layer: QKV, O, gate+up, down of a Qwen2.5-1.5B-shaped layer (all Q4_K here), x 28 layers of
//     distinct weights, chained with PDL: time per layer against the bytes' time at copy bandwidth.
//
// Correctness: every GEMV is checked against a float64 host GEMV of the dequantized weights with the
// same x' (relative to sum |w| |x'|, tolerance 1e-5: float32 accumulation over <= 9000 terms), so a
// fast wrong variant cannot win. The arithmetic order is not the library's; a winner would move into
// gemv.cuh keeping the library's row invariance (a row's bits independent of the rows beside it).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o gemv_stream_lab bench/lab/gemv_stream_lab.cu && ./gemv_stream_lab
//
// Repeats, on purpose: the host dequant_row is gemv_q4k_lab.cu's, and gemv_mma_lab.cu repeats this file's
// time_graph, launch and host helpers: each lab is one nvcc command and stays as it was measured
// (bench/NOTES.md), so the labs share no header. The two layer loops in main are spelled out as they ran.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "gemv_stream_lab_kernels.cuh"

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

// ---- host ------------------------------------------------------------------------------------------------
static float h2f(uint16_t h) { __half_raw r; r.x = h; return __half2float(__half(r)); }
// (dequant_row as in gemv_q4k_lab.cu, on purpose: the labs share no header; see gemv_q4k_lab.cu)
static void dequant_row(const uint8_t* row, int cols, double* out) {
    for (int b = 0; b < cols / QK; ++b) {
        const uint8_t* blk = row + b * BB;
        uint16_t dh, mh; memcpy(&dh, blk, 2); memcpy(&mh, blk + 2, 2);
        const double d = h2f(dh), dmin = h2f(mh);
        const uint8_t* s = blk + 4;
        for (int j = 0; j < 4; ++j) {
            double sc[2], m[2];
            for (int hh = 0; hh < 2; ++hh) {
                const int jj = 2 * j + hh;
                if (jj < 4) { sc[hh] = s[jj] & 63; m[hh] = s[jj + 4] & 63; }
                else { sc[hh] = (s[jj + 4] & 0xF) | ((s[jj - 4] >> 6) << 4); m[hh] = (s[jj + 4] >> 4) | ((s[jj] >> 6) << 4); }
            }
            for (int l = 0; l < 32; ++l) {
                const uint8_t q = blk[16 + 32 * j + l];
                out[b * QK + 64 * j + l] = d * sc[0] * (q & 0xF) - dmin * m[0];
                out[b * QK + 64 * j + 32 + l] = d * sc[1] * (q >> 4) - dmin * m[1];
            }
        }
    }
}

struct XQ { std::vector<int8_t> hi, lo; std::vector<float> d, sum; std::vector<double> xq; };
static XQ quantize_x(const std::vector<float>& x) {   // the kernel's per-CTA quantization, on the host
    const int cols = (int)x.size();
    XQ r; r.hi.resize(cols); r.lo.resize(cols); r.d.resize(cols / 32); r.sum.resize(cols / 32); r.xq.resize(cols);
    for (int b = 0; b < cols / 32; ++b) {
        float mx = 0.f;
        for (int k = 0; k < 32; ++k) mx = std::max(mx, std::fabs(x[32 * b + k]));
        const float inv = mx > 0.f ? 127.f / mx : 0.f, dx = mx / 127.f;
        int hs = 0, ls = 0;
        for (int k = 0; k < 32; ++k) {
            const float t = x[32 * b + k] * inv;
            const int hi = (int)std::nearbyint(t), lo = (int)std::nearbyint((t - hi) * 254.f);
            r.hi[32 * b + k] = (int8_t)hi; r.lo[32 * b + k] = (int8_t)lo; hs += hi; ls += lo;
            r.xq[32 * b + k] = (double)dx * (hi + lo / 254.0);
        }
        r.d[b] = dx; r.sum[b] = dx * (hs + ls / 254.f);
    }
    return r;
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

struct Launch { void (*k)(GArgs); int lpr, warps, grid; size_t smem; };
template <int LPR, int U, int WARPS, bool QX, bool PDL>
static Launch make_launch(int grid_per_sm, int n_sm, int cols) {
    auto k = gemv_q4k_stream<LPR, U, WARPS, QX, PDL>;
    const size_t smem = 2 * (xp(cols) + 32) + (size_t)cols / 32 * 8;
    CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return Launch{k, LPR, WARPS, grid_per_sm * n_sm, smem};
}

template <int LPR, int U, int WARPS, bool DB, int MINB>
static Launch make_s4(int grid_per_sm, int n_sm, int cols) {
    auto k = gemv_q4k_s4<LPR, U, WARPS, DB, MINB>;
    const size_t smem = 2 * (xq4(cols) + 16) + (size_t)cols / 32 * 8;
    CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return Launch{k, LPR, WARPS, grid_per_sm * n_sm, smem};
}

static void launch(const Launch& L, const GArgs& a, cudaStream_t st, bool pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(L.grid); cfg.blockDim = dim3(L.warps * 32); cfg.dynamicSmemBytes = L.smem; cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at; cfg.numAttrs = pdl ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&cfg, L.k, a));
}

// time a captured sequence: fn(stream) enqueues one replay's worth; returns us per replay
template <class F>
static double time_graph(cudaStream_t st, int reps, F fn) {
    cudaGraph_t g; cudaGraphExec_t e;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    fn(st);
    CHECK(cudaStreamEndCapture(st, &g));
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(e, st));
    cudaEvent_t a, b; CHECK(cudaEventCreate(&a)); CHECK(cudaEventCreate(&b));
    CHECK(cudaEventRecord(a, st));
    for (int i = 0; i < reps; ++i) CHECK(cudaGraphLaunch(e, st));
    CHECK(cudaEventRecord(b, st)); CHECK(cudaEventSynchronize(b));
    float ms; CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaGraphExecDestroy(e)); CHECK(cudaGraphDestroy(g));
    return ms * 1e3 / reps;
}

struct Case { const char* name; int rows, cols; };

int main(int argc, char** argv) {
    cudaDeviceProp prop; CHECK(cudaGetDeviceProperties(&prop, 0));
    const int n_sm = prop.multiProcessorCount;
    cudaStream_t st; CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const size_t nb = 512u << 20;
    void *src, *dst; CHECK(cudaMalloc(&src, nb)); CHECK(cudaMalloc(&dst, nb));
    const double copy_us = time_graph(st, 5, [&](cudaStream_t s) { CHECK(cudaMemcpyAsync(dst, src, nb, cudaMemcpyDeviceToDevice, s)); });
    const double copy_gbs = 2.0 * nb / (copy_us * 1e-6) * 1e-9;
    CHECK(cudaFree(dst));
    printf("# %s, %d SMs, L2 %d MB; device copy %.0f GB/s (read + write)\n", prop.name, n_sm, prop.l2CacheSize >> 20, copy_gbs);
    uint32_t* dout; CHECK(cudaMalloc(&dout, 64));

    const bool skip_floor = argc > 1 && !strcmp(argv[1], "--no-floor");
    // 1. floor
    if (!skip_floor) printf("## 1. streaming floor: per launch, back to back in a graph over copies exceeding L2\n");
    const double sizes_mb[] = {0.44, 1.33, 1.77, 7.74, 15.48, 11.29, 191.0};
    for (double mb : skip_floor ? std::vector<double>{} : std::vector<double>(std::begin(sizes_mb), std::end(sizes_mb))) {
        const size_t bytes = ((size_t)(mb * 1e6) + 15) & ~(size_t)15;
        const int n = (int)std::max<size_t>(2, std::min<size_t>(200, (400u << 20) / bytes));
        for (int pdl = 0; pdl < 2; ++pdl)
            for (int bps : {1, 2}) {
                const double us = time_graph(st, 20, [&](cudaStream_t s) {
                    for (int i = 0; i < n; ++i) {
                        const uint4* p = reinterpret_cast<const uint4*>((const uint8_t*)src + ((size_t)i * bytes) % (nb - bytes + 1) / 16 * 16);
                        cudaLaunchConfig_t cfg = {};
                        cfg.gridDim = dim3(bps * n_sm); cfg.blockDim = dim3(512); cfg.stream = s;
                        cudaLaunchAttribute at[1];
                        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 1;
                        cfg.attrs = at; cfg.numAttrs = pdl;
                        if (pdl) CHECK(cudaLaunchKernelEx(&cfg, stream_kernel<4, true>, p, bytes / 16, dout));
                        else CHECK(cudaLaunchKernelEx(&cfg, stream_kernel<4, false>, p, bytes / 16, dout));
                    }
                }) / n;
                printf("floor %8.2f MB  pdl %d  ctas/SM %d: %8.2f us  %7.0f GB/s (%5.1f%% of copy)\n", bytes / 1e6, pdl, bps, us,
                       bytes / (us * 1e-6) * 1e-9, 100.0 * bytes / (us * 1e-6) * 1e-9 / copy_gbs);
            }
    }

    // 2. GEMV variants
    printf("## 2. gemv_q4k_stream (checked against float64; us per launch in a graph over copies exceeding L2)\n");
    std::mt19937 rng(7);
    const Case cases[] = {{"attn_qkv 1.5B", 2048, 1536}, {"attn_o 1.5B", 1536, 1536}, {"ffn_gate+up 1.5B", 17920, 1536},
                          {"ffn_down 1.5B", 1536, 8960}, {"lm_head 1.5B", 151936, 1536}};
    for (const Case& cs : cases) {
        const std::vector<uint8_t> hw = random_q4k(cs.rows, cs.cols, rng);
        std::vector<float> hx(cs.cols);
        for (auto& v : hx) v = (float)((int)(rng() % 2001) - 1000) / 1000.f;
        const XQ q = quantize_x(hx);
        std::vector<double> ref(cs.rows), mag(cs.rows), wrow(cs.cols);
        for (int r = 0; r < cs.rows; ++r) {
            dequant_row(hw.data() + (size_t)r * (cs.cols / QK) * BB, cs.cols, wrow.data());
            double s = 0, m = 0;
            for (int c = 0; c < cs.cols; ++c) { s += wrow[c] * q.xq[c]; m += std::fabs(wrow[c] * q.xq[c]); }
            ref[r] = s; mag[r] = m;
        }
        const size_t wbytes = hw.size();
        const int ncopy = (int)std::max<size_t>(2, std::min<size_t>(64, (300u << 20) / wbytes));
        std::vector<uint8_t*> copies(ncopy);
        for (auto& p : copies) { CHECK(cudaMalloc(&p, wbytes)); CHECK(cudaMemcpy(p, hw.data(), wbytes, cudaMemcpyHostToDevice)); }
        GArgs a = {};
        a.rows = cs.rows; a.cols = cs.cols;
        float* dxf; int8_t *dhi, *dlo; float *dxd, *dxs, *dy;
        CHECK(cudaMalloc(&dxf, cs.cols * 4)); CHECK(cudaMalloc(&dhi, cs.cols)); CHECK(cudaMalloc(&dlo, cs.cols));
        CHECK(cudaMalloc(&dxd, cs.cols / 8)); CHECK(cudaMalloc(&dxs, cs.cols / 8)); CHECK(cudaMalloc(&dy, cs.rows * 4));
        CHECK(cudaMemcpy(dxf, hx.data(), cs.cols * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dhi, q.hi.data(), cs.cols, cudaMemcpyHostToDevice)); CHECK(cudaMemcpy(dlo, q.lo.data(), cs.cols, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dxd, q.d.data(), cs.cols / 8, cudaMemcpyHostToDevice)); CHECK(cudaMemcpy(dxs, q.sum.data(), cs.cols / 8, cudaMemcpyHostToDevice));
        a.xf = dxf; a.xhi = dhi; a.xlo = dlo; a.xd = dxd; a.xsum = dxs; a.y = dy;
        struct V { const char* name; Launch L; bool pdl; };
        std::vector<V> vs;
        const bool wide = cs.cols > 4096;
        if (wide) {
            vs.push_back({"lpr32 u2 w16 qx pdl", make_launch<32, 2, 16, true, true>(1, n_sm, cs.cols), true});
            vs.push_back({"lpr32 u2 w16 qx    ", make_launch<32, 2, 16, true, false>(1, n_sm, cs.cols), false});
            vs.push_back({"lpr32 u2 w16 fx pdl", make_launch<32, 2, 16, false, true>(1, n_sm, cs.cols), true});
            vs.push_back({"lpr32 u3 w16 qx pdl", make_launch<32, 3, 16, true, true>(1, n_sm, cs.cols), true});
            vs.push_back({"lpr32 u1 w32 qx pdl", make_launch<32, 1, 32, true, true>(1, n_sm, cs.cols), true});
            vs.push_back({"lpr32 u2 w8x2 qx pdl", make_launch<32, 2, 8, true, true>(2, n_sm, cs.cols), true});
            vs.push_back({"s4 lpr32 u5 w12", make_s4<32, 5, 12, false, 1>(1, n_sm, cs.cols), true});
            vs.push_back({"s4 lpr32 u5 w16", make_s4<32, 5, 16, false, 1>(1, n_sm, cs.cols), true});
            vs.push_back({"s4 lpr32 u5 w6x2", make_s4<32, 5, 6, false, 1>(2, n_sm, cs.cols), true});
            vs.push_back({"s4 lpr32 u3 w16 db", make_s4<32, 3, 16, true, 1>(1, n_sm, cs.cols), true});
            vs.push_back({"s4 lpr32 u5 w12 m2", make_s4<32, 5, 12, false, 2>(1, n_sm, cs.cols), true});
        } else {
            vs.push_back({"lpr16 u3 w16 qx pdl", make_launch<16, 3, 16, true, true>(1, n_sm, cs.cols), true});
            vs.push_back({"lpr16 u3 w16 qx    ", make_launch<16, 3, 16, true, false>(1, n_sm, cs.cols), false});
            vs.push_back({"lpr16 u3 w16 fx pdl", make_launch<16, 3, 16, false, true>(1, n_sm, cs.cols), true});
            vs.push_back({"lpr8 u3 w16 qx pdl ", make_launch<8, 3, 16, true, true>(1, n_sm, cs.cols), true});
            vs.push_back({"lpr16 u1 w32 qx pdl", make_launch<16, 1, 32, true, true>(1, n_sm, cs.cols), true});
            vs.push_back({"lpr16 u3 w8x2 qx pdl", make_launch<16, 3, 8, true, true>(2, n_sm, cs.cols), true});
            vs.push_back({"lpr32 u2 w16 qx pdl", make_launch<32, 2, 16, true, true>(1, n_sm, cs.cols), true});
            vs.push_back({"s4 lpr8 u3 w16 db", make_s4<8, 3, 16, true, 1>(1, n_sm, cs.cols), true});
            vs.push_back({"s4 lpr8 u3 w16 db m2", make_s4<8, 3, 16, true, 2>(1, n_sm, cs.cols), true});
            vs.push_back({"s4 lpr8 u3 w8x2 db", make_s4<8, 3, 8, true, 1>(2, n_sm, cs.cols), true});
            vs.push_back({"s4 lpr8 u3 w8 db m4", make_s4<8, 3, 8, true, 4>(1, n_sm, cs.cols), true});
            vs.push_back({"s4 lpr8 u3 w24 db", make_s4<8, 3, 24, true, 1>(1, n_sm, cs.cols), true});
            vs.push_back({"s4 lpr8 u3 w16", make_s4<8, 3, 16, false, 1>(1, n_sm, cs.cols), true});
        }
        printf("# %s: %d x %d, %.2f MB, %d copies\n", cs.name, cs.rows, cs.cols, wbytes / 1e6, ncopy);
        for (const V& v : vs) {
            CHECK(cudaMemset(dy, 0, cs.rows * 4));
            a.w = copies[0];
            launch(v.L, a, st, false);
            CHECK(cudaStreamSynchronize(st));
            std::vector<float> hy(cs.rows);
            CHECK(cudaMemcpy(hy.data(), dy, cs.rows * 4, cudaMemcpyDeviceToHost));
            double worst = 0;
            for (int r = 0; r < cs.rows; ++r) worst = std::max(worst, std::fabs(hy[r] - ref[r]) / (mag[r] + 1e-30));
            const int reps = 10;
            const double us = time_graph(st, reps, [&](cudaStream_t s) {
                for (int i = 0; i < ncopy; ++i) { GArgs b = a; b.w = copies[i]; launch(v.L, b, s, v.pdl); }
            }) / ncopy;
            printf("%-18s %-22s %8.2f us %7.0f GB/s (%5.1f%% of copy)  err %.1e %s\n", cs.name, v.name, us,
                   wbytes / (us * 1e-6) * 1e-9, 100.0 * wbytes / (us * 1e-6) * 1e-9 / copy_gbs, worst, worst < 1e-5 ? "ok" : "WRONG");
        }
        for (auto p : copies) CHECK(cudaFree(p));
        CHECK(cudaFree(dxf)); CHECK(cudaFree(dhi)); CHECK(cudaFree(dlo)); CHECK(cudaFree(dxd)); CHECK(cudaFree(dxs)); CHECK(cudaFree(dy));
    }

    // 3. a layer's four GEMVs x 28 layers, chained with PDL (x' pre-quantized; attention not included)
    printf("## 3. layer: QKV, O, gate+up, down (Q4_K) x 28 layers, PDL chain\n");
    {
        const Case lc[] = {{"qkv", 2048, 1536}, {"o", 1536, 1536}, {"gu", 17920, 1536}, {"down", 1536, 8960}};
        const int L = 28;
        std::vector<uint8_t*> w[4];
        size_t layer_bytes = 0;
        int8_t *dhi, *dlo; float *dxd, *dxs, *dy, *dxf;
        CHECK(cudaMalloc(&dhi, 8960)); CHECK(cudaMalloc(&dlo, 8960)); CHECK(cudaMalloc(&dxd, 8960 / 8)); CHECK(cudaMalloc(&dxs, 8960 / 8));
        CHECK(cudaMalloc(&dy, 17920 * 4)); CHECK(cudaMalloc(&dxf, 8960 * 4));
        CHECK(cudaMemset(dhi, 1, 8960)); CHECK(cudaMemset(dlo, 0, 8960)); CHECK(cudaMemset(dxd, 0, 8960 / 8)); CHECK(cudaMemset(dxs, 0, 8960 / 8));
        CHECK(cudaMemset(dxf, 0, 8960 * 4));
        for (int m = 0; m < 4; ++m) {
            const std::vector<uint8_t> hw = random_q4k(lc[m].rows, lc[m].cols, rng);
            layer_bytes += hw.size();
            for (int l = 0; l < L; ++l) { uint8_t* p; CHECK(cudaMalloc(&p, hw.size())); CHECK(cudaMemcpy(p, hw.data(), hw.size(), cudaMemcpyHostToDevice)); w[m].push_back(p); }
        }
        const Launch narrow = make_launch<16, 3, 16, true, true>(1, n_sm, 1536), wide = make_launch<32, 2, 16, true, true>(1, n_sm, 8960);
        const Launch narrow_f = make_launch<16, 3, 16, false, true>(1, n_sm, 1536), wide_f = make_launch<32, 2, 16, false, true>(1, n_sm, 8960);
        const Launch n4 = make_s4<8, 3, 16, true, 1>(1, n_sm, 1536), w4 = make_s4<32, 5, 12, false, 1>(1, n_sm, 8960);
        const Launch n4m = make_s4<8, 3, 16, true, 2>(1, n_sm, 1536), w4m = make_s4<32, 5, 12, false, 2>(1, n_sm, 8960);
        // Two layer loops (s4 kernels, then the stream kernels), spelled out as they ran for bench/NOTES.md's
        // figures: a lab keeps the code that was measured.
        for (int v = 0; v < 2; ++v) {
            const double us = time_graph(st, 10, [&](cudaStream_t s) {
                for (int l = 0; l < L; ++l)
                    for (int m = 0; m < 4; ++m) {
                        GArgs a = {}; a.w = w[m][l]; a.rows = lc[m].rows; a.cols = lc[m].cols; a.y = dy;
                        a.xf = dxf; a.xhi = dhi; a.xlo = dlo; a.xd = dxd; a.xsum = dxs;
                        launch(m == 3 ? (v ? w4m : w4) : (v ? n4m : n4), a, s, true);
                    }
            }) / L;
            printf("layer s4%s: %.2f us per layer for %.2f MB = %.0f GB/s (%.1f%% of copy); 28 layers %.3f ms\n",
                   v ? " (min 2 CTAs/SM)" : "", us, layer_bytes / 1e6, layer_bytes / (us * 1e-6) * 1e-9,
                   100.0 * layer_bytes / (us * 1e-6) * 1e-9 / copy_gbs, us * L * 1e-3);
        }
        for (int fx = 0; fx < 2; ++fx) {
            const double us = time_graph(st, 10, [&](cudaStream_t s) {
                for (int l = 0; l < L; ++l)
                    for (int m = 0; m < 4; ++m) {
                        GArgs a = {}; a.w = w[m][l]; a.rows = lc[m].rows; a.cols = lc[m].cols; a.y = dy;
                        a.xf = dxf; a.xhi = dhi; a.xlo = dlo; a.xd = dxd; a.xsum = dxs;
                        launch(m == 3 ? (fx ? wide_f : wide) : (fx ? narrow_f : narrow), a, s, true);
                    }
            }) / L;
            printf("layer (%s x): %.2f us per layer for %.2f MB = %.0f GB/s (%.1f%% of copy); 28 layers %.3f ms\n",
                   fx ? "float, quantized per CTA" : "pre-quantized", us, layer_bytes / 1e6, layer_bytes / (us * 1e-6) * 1e-9,
                   100.0 * layer_bytes / (us * 1e-6) * 1e-9 / copy_gbs, us * L * 1e-3);
        }
    }
    printf("done\n");
    return 0;
}
