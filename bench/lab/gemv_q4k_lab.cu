// gemv_q4k_lab.cu -- a lab, not the library: how fast can ONE launch of a Q4_K GEMV y = W x go on this GPU,
// for the decode shapes where fd_gemv is furthest from the bandwidth roofline (bench/NOTES.md: ffn_down
// 1536 x 8960 at ~21% of DRAM peak, gate/up 8960 x 1536 at ~40%)? Bare variants, no RMSNorm, no int8
// activations, float accumulation in an order that is not the library's -- the question is only the
// time structure: how much of a launch is fixed cost, and what a row split or no shared-memory staging
// buys. A winner would be brought into gemv.cuh with the library's numerics and its row invariance.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/gemv_q4k_lab bench/lab/gemv_q4k_lab.cu && /tmp/gemv_q4k_lab
//
// Its Q4_K scale decoder (sbyte, scale_min) and host dequant_row are also in gemv_stream_lab.cu and
// gemv_stream_lab_kernels.cuh, on purpose: each lab is one nvcc command and stays as it was measured
// (bench/NOTES.md), so the labs share no header with each other or with the library.
//
// Variants, all with one warp per (row, part) unit and every load of the unit issued before any use
// (16-byte __ldg into registers: up to MAXQ quarter-blocks x 48 bytes in flight per lane):
//   split   1, 2, 4: a row's 4 * (cols / 256) quarter-blocks are dealt over `split` warps of one CTA
//           (partial sums combined in shared memory), so each warp's dependent chain is 1/split long
//   x       smem: x staged in shared memory per CTA (padded: one float4 per 64 columns, conflict-free
//           float4 reads across a quarter-warp) plus per-32-column sums; ldg: x read from global
//           through L1 (no staging prologue), its 32-column sums precomputed once per launch by the
//           first warps of the grid... here simply by a tiny pre-kernel in the same graph
// Timing: CUDA graph of NCOPY launches, each on its own copy of W (the copies together exceed L2), the
// graph replayed REPS times; reported per launch, with GB/s of weight bytes and % of a measured
// device-to-device copy's bandwidth. Correctness: y is compared with a float64 host GEMV of the same
// dequantized weights (relative error printed), so a fast wrong variant cannot win.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

constexpr int QK = 256, BLOCK_BYTES = 144;
constexpr int MAXQ = 8;                // quarter-blocks per lane held in registers at once

// byte i (runtime, 0..11) of the scales, held in the header words y, z, w: register selects, no local memory
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

__host__ __device__ constexpr int xpad(int c) { return c + 4 * (c >> 6); }   // float index with padding

// xsum[c / 32] = sum of x over 32 columns
__global__ void xsum_kernel(const float* x, float* xsum, int cols) {
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s * 32 >= cols) return;
    float acc = 0.f;
    for (int k = 0; k < 32; ++k) acc += x[s * 32 + k];
    xsum[s] = acc;
}

template <int WARPS, int SPLIT, bool XSMEM>
__global__ void __launch_bounds__(WARPS * 32)
gemv_q4k(const uint8_t* __restrict__ w, const float* __restrict__ x, const float* __restrict__ xsum_g,
         float* __restrict__ y, int rows, int cols) {
    extern __shared__ float smem[];
    const int nq = 4 * (cols / QK);                 // quarter-blocks per row
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rows_per_cta = WARPS / SPLIT;
    const int row = blockIdx.x * rows_per_cta + warp / SPLIT, part = warp % SPLIT;
    const int64_t row_bytes = (int64_t)(cols / QK) * BLOCK_BYTES;
    // this warp's quarters: [q0, q1) of the row, dealt over lanes q = q0 + lane + 32 k
    const int per = (nq + SPLIT - 1) / SPLIT, q0 = part * per, q1 = min(nq, q0 + per);

    // 1. issue every weight load of the unit (header + 32 code bytes per quarter)
    uint4 hdr[MAXQ], lo[MAXQ], hi[MAXQ];
    const uint8_t* wr = w + (int64_t)min(row, rows - 1) * row_bytes;
#pragma unroll
    for (int k = 0; k < MAXQ; ++k) {
        const int q = q0 + lane + 32 * k;
        if (q < q1) {
            const uint8_t* blk = wr + (int64_t)(q >> 2) * BLOCK_BYTES;
            hdr[k] = __ldg(reinterpret_cast<const uint4*>(blk));
            lo[k] = __ldg(reinterpret_cast<const uint4*>(blk + 16 + 32 * (q & 3)));
            hi[k] = __ldg(reinterpret_cast<const uint4*>(blk + 32 + 32 * (q & 3)));
        }
    }
    // 2. x: staged (padded) with its 32-column sums, or read through L1
    float* xs = smem;
    float* xsum = smem + xpad(cols) + 64;
    if (XSMEM) {
        for (int c = threadIdx.x * 4; c < cols; c += WARPS * 32 * 4)
            *reinterpret_cast<float4*>(xs + xpad(c)) = __ldg(reinterpret_cast<const float4*>(x + c));
        for (int s = threadIdx.x; s < cols / 32; s += WARPS * 32) xsum[s] = xsum_g[s];
        __syncthreads();
    }
    // 3. compute
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < MAXQ; ++k) {
        const int q = q0 + lane + 32 * k;
        if (q < q1) {
            const int j = q & 3, col = (q >> 2) * QK + 64 * j;
            const float d = __half2float(__ushort_as_half((unsigned short)(hdr[k].x & 0xFFFFu))),
                        dmin = __half2float(__ushort_as_half((unsigned short)(hdr[k].x >> 16)));
            float sc1, m1, sc2, m2;
            scale_min(2 * j, hdr[k], sc1, m1);
            scale_min(2 * j + 1, hdr[k], sc2, m2);
            const uint32_t code[8] = {lo[k].x, lo[k].y, lo[k].z, lo[k].w, hi[k].x, hi[k].y, hi[k].z, hi[k].w};
            float s_lo = 0.f, s_hi = 0.f;
#pragma unroll
            for (int t = 0; t < 8; ++t) {         // 4 bytes = 4 columns at a time
                const float4 xl = XSMEM ? *reinterpret_cast<const float4*>(xs + xpad(col + 4 * t))
                                        : __ldg(reinterpret_cast<const float4*>(x + col + 4 * t));
                const float4 xh = XSMEM ? *reinterpret_cast<const float4*>(xs + xpad(col + 32 + 4 * t))
                                        : __ldg(reinterpret_cast<const float4*>(x + col + 32 + 4 * t));
                const uint32_t c = code[t];
                s_lo += (c & 0xF) * xl.x + ((c >> 8) & 0xF) * xl.y + ((c >> 16) & 0xF) * xl.z + ((c >> 24) & 0xF) * xl.w;
                s_hi += ((c >> 4) & 0xF) * xh.x + ((c >> 12) & 0xF) * xh.y + ((c >> 20) & 0xF) * xh.z + (c >> 28) * xh.w;
            }
            const float xs1 = XSMEM ? xsum[col / 32] : __ldg(xsum_g + col / 32);
            const float xs2 = XSMEM ? xsum[col / 32 + 1] : __ldg(xsum_g + col / 32 + 1);
            acc += d * sc1 * s_lo - dmin * m1 * xs1 + d * sc2 * s_hi - dmin * m2 * xs2;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (SPLIT == 1) {
        if (lane == 0 && row < rows) y[row] = acc;
        return;
    }
    __shared__ float part_sum[WARPS];
    if (lane == 0) part_sum[warp] = acc;
    __syncthreads();
    if (part == 0 && lane == 0 && row < rows) {
        float total = 0.f;
        for (int p = 0; p < SPLIT; ++p) total += part_sum[warp + p];
        y[row] = total;
    }
}

// ---- host --------------------------------------------------------------------------------------------
static float half_to_float(uint16_t h) { __half_raw r; r.x = h; return __half2float(__half(r)); }

static void dequant_row(const uint8_t* row, int cols, std::vector<double>& out) {
    for (int b = 0; b < cols / QK; ++b) {
        const uint8_t* blk = row + b * BLOCK_BYTES;
        uint16_t dh, mh; memcpy(&dh, blk, 2); memcpy(&mh, blk + 2, 2);
        const double d = half_to_float(dh), dmin = half_to_float(mh);
        const uint8_t* s = blk + 4;
        for (int j = 0; j < 4; ++j) {
            float sc[2], m[2];
            for (int h = 0; h < 2; ++h) {
                int jj = 2 * j + h;
                if (jj < 4) { sc[h] = s[jj] & 63; m[h] = s[jj + 4] & 63; }
                else { sc[h] = (s[jj + 4] & 0xF) | ((s[jj - 4] >> 6) << 4); m[h] = (s[jj + 4] >> 4) | ((s[jj] >> 6) << 4); }
            }
            for (int l = 0; l < 32; ++l) {
                const uint8_t q = blk[16 + 32 * j + l];
                out[b * QK + 64 * j + l] = d * sc[0] * (q & 0xF) - dmin * m[0];
                out[b * QK + 64 * j + 32 + l] = d * sc[1] * (q >> 4) - dmin * m[1];
            }
        }
    }
}

struct Case { const char* name; int rows, cols; };

template <int WARPS, int SPLIT, bool XSMEM>
static void run(const Case& cs, const std::vector<uint8_t*>& copies, const float* dx, const float* dxsum, float* dy,
                const std::vector<double>& ref, double copy_gbs, cudaStream_t st) {
    const int rows_per_cta = WARPS / SPLIT;
    const int grid = (cs.rows + rows_per_cta - 1) / rows_per_cta;
    const int nq = 4 * (cs.cols / QK), per = (nq + SPLIT - 1) / SPLIT;
    if (per > 32 * MAXQ) { printf("%-18s warps %2d split %d x %-4s: skipped (row too long for MAXQ)\n", cs.name, WARPS, SPLIT, XSMEM ? "smem" : "ldg"); return; }
    const size_t smem = XSMEM ? (size_t)(xpad(cs.cols) + 64 + cs.cols / 32) * 4 : 0;
    auto kern = gemv_q4k<WARPS, SPLIT, XSMEM>;
    CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaGraph_t graph; cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (uint8_t* w : copies) kern<<<grid, WARPS * 32, smem, st>>>(w, dx, dxsum, dy, cs.rows, cs.cols);
    CHECK(cudaStreamEndCapture(st, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, st));
    cudaEvent_t a, b; CHECK(cudaEventCreate(&a)); CHECK(cudaEventCreate(&b));
    const int reps = 20;
    CHECK(cudaEventRecord(a, st));
    for (int i = 0; i < reps; ++i) CHECK(cudaGraphLaunch(exec, st));
    CHECK(cudaEventRecord(b, st));
    CHECK(cudaEventSynchronize(b));
    float ms; CHECK(cudaEventElapsedTime(&ms, a, b));
    const double us = ms * 1e3 / (reps * copies.size());
    std::vector<float> y(cs.rows);
    CHECK(cudaMemcpy(y.data(), dy, cs.rows * 4, cudaMemcpyDeviceToHost));
    double err = 0, scale = 0;
    for (int r = 0; r < cs.rows; ++r) { err = fmax(err, fabs(y[r] - ref[r])); scale = fmax(scale, fabs(ref[r])); }
    const double bytes = (double)cs.rows * (cs.cols / QK) * BLOCK_BYTES;
    printf("%-18s warps %2d split %d x %-4s grid %5d: %7.2f us  %7.1f GB/s (%5.1f%% of copy)  max rel err %.1e\n", cs.name,
           WARPS, SPLIT, XSMEM ? "smem" : "ldg", grid, us, bytes / us * 1e-3, 100 * bytes / us * 1e-3 / copy_gbs, err / scale);
    CHECK(cudaGraphExecDestroy(exec)); CHECK(cudaGraphDestroy(graph));
}

int main() {
    cudaDeviceProp prop; CHECK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t st; CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    // copy bandwidth: 512 MB device to device (read + write)
    const size_t nb = 512u << 20;
    void *src, *dst; CHECK(cudaMalloc(&src, nb)); CHECK(cudaMalloc(&dst, nb));
    cudaEvent_t a, b; CHECK(cudaEventCreate(&a)); CHECK(cudaEventCreate(&b));
    CHECK(cudaMemcpyAsync(dst, src, nb, cudaMemcpyDeviceToDevice, st));
    CHECK(cudaEventRecord(a, st));
    for (int i = 0; i < 5; ++i) CHECK(cudaMemcpyAsync(dst, src, nb, cudaMemcpyDeviceToDevice, st));
    CHECK(cudaEventRecord(b, st)); CHECK(cudaEventSynchronize(b));
    float ms; CHECK(cudaEventElapsedTime(&ms, a, b));
    const double copy_gbs = 2.0 * nb * 5 / (ms * 1e-3) * 1e-9;
    CHECK(cudaFree(src)); CHECK(cudaFree(dst));
    printf("# %s, %d SMs, L2 %d MB; device copy %.0f GB/s (read + write)\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20, copy_gbs);

    const Case cases[] = {{"ffn_down 1.5B", 1536, 8960}, {"ffn_gate 1.5B", 8960, 1536}, {"attn_q/o 1.5B", 1536, 1536},
                          {"ffn_down 0.5B", 896, 4864}};
    std::mt19937 rng(1);
    for (const Case& cs : cases) {
        const size_t wbytes = (size_t)cs.rows * (cs.cols / QK) * BLOCK_BYTES;
        std::vector<uint8_t> hw(wbytes);
        for (auto& v : hw) v = rng() & 0xFF;
        for (size_t blk = 0; blk < wbytes / BLOCK_BYTES; ++blk) {         // sane f16 d, dmin in [1e-3, 1e-2)
            __half d = __float2half(1e-3f + 9e-3f * (rng() % 1000) / 1000.f), m = __float2half(1e-3f + 9e-3f * (rng() % 1000) / 1000.f);
            memcpy(&hw[blk * BLOCK_BYTES], &d, 2); memcpy(&hw[blk * BLOCK_BYTES + 2], &m, 2);
        }
        std::vector<float> hx(cs.cols);
        for (auto& v : hx) v = (float)((int)(rng() % 2001) - 1000) / 1000.f;
        std::vector<double> ref(cs.rows), wrow(cs.cols);
        for (int r = 0; r < cs.rows; ++r) {
            dequant_row(hw.data() + (size_t)r * (cs.cols / QK) * BLOCK_BYTES, cs.cols, wrow);
            double s = 0; for (int c = 0; c < cs.cols; ++c) s += wrow[c] * hx[c];
            ref[r] = s;
        }
        const int ncopy = (int)std::max<size_t>(4, (160u << 20) / wbytes);
        std::vector<uint8_t*> copies(ncopy);
        for (auto& p : copies) { CHECK(cudaMalloc(&p, wbytes)); CHECK(cudaMemcpy(p, hw.data(), wbytes, cudaMemcpyHostToDevice)); }
        float *dx, *dxsum, *dy;
        CHECK(cudaMalloc(&dx, cs.cols * 4)); CHECK(cudaMalloc(&dxsum, cs.cols / 32 * 4)); CHECK(cudaMalloc(&dy, cs.rows * 4));
        CHECK(cudaMemcpy(dx, hx.data(), cs.cols * 4, cudaMemcpyHostToDevice));
        xsum_kernel<<<(cs.cols / 32 + 127) / 128, 128, 0, st>>>(dx, dxsum, cs.cols);
        CHECK(cudaStreamSynchronize(st));
        printf("## %s (%d x %d, %.2f MB, %d copies)\n", cs.name, cs.rows, cs.cols, wbytes / 1e6, ncopy);
        run<8, 1, true>(cs, copies, dx, dxsum, dy, ref, copy_gbs, st);
        run<8, 1, false>(cs, copies, dx, dxsum, dy, ref, copy_gbs, st);
        run<16, 1, false>(cs, copies, dx, dxsum, dy, ref, copy_gbs, st);
        run<8, 2, true>(cs, copies, dx, dxsum, dy, ref, copy_gbs, st);
        run<8, 2, false>(cs, copies, dx, dxsum, dy, ref, copy_gbs, st);
        run<8, 4, false>(cs, copies, dx, dxsum, dy, ref, copy_gbs, st);
        run<16, 4, false>(cs, copies, dx, dxsum, dy, ref, copy_gbs, st);
        run<4, 1, false>(cs, copies, dx, dxsum, dy, ref, copy_gbs, st);
        run<4, 2, false>(cs, copies, dx, dxsum, dy, ref, copy_gbs, st);
        for (auto p : copies) CHECK(cudaFree(p));
        CHECK(cudaFree(dx)); CHECK(cudaFree(dxsum)); CHECK(cudaFree(dy));
    }
    return 0;
}
