// x_inflight_lab.cu -- does a CTA's weight stream in flight delay its first read of x after griddepcontrol.wait?
// (bench/lab; not the library.)
//
// Session 38's stamps put a one-row GEMV launch's first L2 round trip for x at 1.0-1.7 us after its wait (q/k/v
// 1.05, gate/up 1.74, ffn_down's two batches 2.9 for the whole staging); x_hotspot_lab.cu (session 39) measured
// ~0.7 us for the same loads in a chain with no other traffic. The library's copy warp issues the CTA's weight
// pieces by bulk copy before the wait (gemv_rows_tma.cuh: ffn_down's whole ~118 KB tile at once, gate/up ~2 pieces of
// 27.6 KB in flight), so x's loads may queue behind them. Prediction (session 41): the wait -> x time grows with the
// bytes in flight, ~0.7 us with none to ~1.5 us with 112 KB.
//
// A captured chain of N PDL kernels of 19 + 1 warps, one CTA an SM: the copy warp issues `wbytes` of "weights" (a
// 1 GiB buffer walked so every kernel reads new DRAM lines) into shared memory as pieces of `piece` bytes, before the
// wait; the 19 computing warps wait, then load x (cols floats, 128-column groups per warp, two in flight, as
// rows_quantize_cta) and meet at a barrier (globaltimer stamps: wait -> x in the CTA, thread 0); then the CTA waits for
// its weights, and writes its share of the next x. Printed: us a kernel, and the mean wait -> x over CTAs and kernels.
// Second form: only `pre` bytes before the wait, the rest issued once x is in the CTA (after the barrier).
// Build: nvcc -O3 -arch=sm_90 -std=c++17 x_inflight_lab.cu -o x_inflight_lab
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

constexpr int N = 200, W = 19, THREADS = (W + 1) * 32;
constexpr size_t WSIZE = size_t(1) << 30;

__device__ __forceinline__ uint64_t gtime() {
    uint64_t t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned su32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__global__ void __launch_bounds__(THREADS, 1)
    k_xw(const float* __restrict__ xin, float* __restrict__ xout, const uint8_t* __restrict__ wts, int cols,
         int wbytes, int piece, int pre, unsigned long long* dt, int it) {
    extern __shared__ __align__(16) uint8_t sw[];
    __shared__ __align__(8) uint64_t bar;
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, G = gridDim.x, b = blockIdx.x;
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(su32(&bar)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const size_t span = WSIZE - (size_t)wbytes;
    const size_t off = (((size_t)it * G + b) * (size_t)wbytes) % span & ~size_t(15);
    // the copy warp's pieces [p0, p1) of the CTA's weights
    auto issue = [&](int p0, int p1) {
        for (int p = p0; p < p1; p += piece) {
            const int n = p1 - p < piece ? p1 - p : piece;
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(su32(sw + p)), "l"(wts + off + p), "r"(n), "r"(su32(&bar)) : "memory");
        }
    };
    if (warp == W && lane == 0 && wbytes > 0) {   // the copy warp: the first `pre` bytes before the wait
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(su32(&bar)), "r"(wbytes)
                     : "memory");
        issue(0, pre < wbytes ? pre : wbytes);
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
    const uint64_t t0 = gtime();
    float s = 0.0f;
    if (warp < W) {
        const int ngrp = cols / 128;
        for (int grp = warp; grp < ngrp; grp += 2 * W) {
            float v[8];
#pragma unroll
            for (int uu = 0; uu < 2; ++uu)
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int g = grp + uu * W;
                    v[4 * uu + u] = g < ngrp ? xin[128 * g + 32 * u + lane] : 0.0f;
                }
#pragma unroll
            for (int u = 0; u < 8; ++u) s += v[u];
        }
    }
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    const uint64_t t1 = gtime();
    if (threadIdx.x == 0) atomicAdd(dt + it, (unsigned long long)(t1 - t0));
    if (warp == W && lane == 0 && pre < wbytes) issue(pre, wbytes);   // the rest once x is in the CTA
    if (wbytes > 0) {   // the weights have landed before the CTA moves on (and before it may exit)
        unsigned ok = 0;
        do {
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                         : "=r"(ok) : "r"(su32(&bar)) : "memory");
        } while (!ok);
    }
    float tot = 0.0f;
    for (int w = 0; w < W + 1; ++w) tot += red[w];
    if (wbytes > 0) tot += (float)sw[threadIdx.x % wbytes] * 1e-12f;
    const int per = (cols + G - 1) / G;
    for (int r = threadIdx.x; r < per; r += blockDim.x) {
        const int c = b * per + r;
        if (c < cols) xout[c] = tot * 1e-9f + (float)c;
    }
}

int run(const uint8_t* wts, int cols, int wbytes, int piece, int pre, int G) {
    float *a, *bb;
    unsigned long long* dt;
    CK(cudaMalloc(&a, (size_t)cols * 4));
    CK(cudaMalloc(&bb, (size_t)cols * 4));
    CK(cudaMemset(a, 0, (size_t)cols * 4));
    CK(cudaMalloc(&dt, N * 8));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaFuncSetAttribute(k_xw, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(G);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = wbytes > 0 ? wbytes : 16;
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < N; ++i) {
        const float* in = (i & 1) ? bb : a;
        float* out = (i & 1) ? a : bb;
        CK(cudaLaunchKernelEx(&cfg, k_xw, in, out, wts, cols, wbytes, piece, pre, dt, i));
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int w = 0; w < 5; ++w) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemset(dt, 0, N * 8));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const int reps = 20;
    cudaEventRecord(e0, s);
    for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, s));
    cudaEventRecord(e1, s);
    CK(cudaStreamSynchronize(s));
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    std::vector<unsigned long long> h(N);
    CK(cudaMemcpy(h.data(), dt, N * 8, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 1; i < N; ++i) sum += (double)h[i];
    printf("cols %5d  weights %6d B (pieces of %5d, %6d before the wait)  %7.3f us a kernel   wait->x in CTA %6.3f us\n",
           cols, wbytes, piece, pre < wbytes ? pre : wbytes, ms * 1000 / reps / N, sum / (N - 1) / reps / G / 1000.0);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaFree(a);
    cudaFree(bb);
    cudaFree(dt);
    cudaStreamDestroy(s);
    return 0;
}

int main() {
    int G = 0;
    CK(cudaDeviceGetAttribute(&G, cudaDevAttrMultiProcessorCount, 0));
    uint8_t* wts;
    CK(cudaMalloc(&wts, WSIZE));
    CK(cudaMemset(wts, 1, WSIZE));
    for (int rep = 0; rep < 2; ++rep)
        for (int cols : {1536, 8960}) {
            for (int wb : {0, 14336, 28672, 57344, 114688})   // every piece before the wait
                if (run(wts, cols, wb, 14336, wb, G)) return 1;
            for (int pre : {0, 28672, 57344})                  // the rest after x (session 41's second call)
                if (run(wts, cols, 114688, 14336, pre, G)) return 1;
        }
    cudaFree(wts);
    return 0;
}
