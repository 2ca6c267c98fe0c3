// x_hotspot_lab.cu -- does every CTA reading the same freshly written x cost more than reading a copy of its own?
// (bench/lab; not the library.)
//
// A one-row gemv_rows launch (gemv_rows_tma.cuh) starts with every one of its ~132 CTAs loading the whole x
// (1536 or 8960 floats) that the previous kernel's CTAs have just written, then (RMSNorm launches) reading it a second
// time for the norm's sum. Session 38's stamps put that first L2 round trip after griddepcontrol.wait at 1.0-1.7 us,
// several times an L2 hit's latency. If that is the 132 x (48 .. 280) requests converging on the same few L2 lines,
// the producer writing K copies of x (CTA b reading copy b % K) spreads them; the arithmetic is unchanged.
//
// This lab times a captured chain of N PDL kernels, each: wait; load x copy (b % K) the way rows_quantize_cta
// does (warp w: 128-column groups w, w + W, ..., 4 floats a lane), optionally the norm's second pass (8 virtual
// warps, columns v, v + 256, ...), or one bulk copy (cp.async.bulk) of x into shared memory; a CTA barrier; then
// write its share of the next x (cols / G floats) into all K copies. Prints us per kernel and the mean time from
// the wait's return to the barrier (globaltimer, thread 0). Then (run_cons) the attention's shape: a few CTAs of 128
// threads reading 6 rows of 128 floats and their RoPE partners that a 132-CTA kernel just wrote.
// Build: nvcc -O3 -arch=sm_90 -std=c++17 x_hotspot_lab.cu -o x_hotspot_lab
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

constexpr int N = 200, W = 19, THREADS = (W + 1) * 32;

__device__ __forceinline__ void wait_prev() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void trigger() { asm volatile("griddepcontrol.launch_dependents;" :::); }
__device__ __forceinline__ uint64_t gtime() {
    uint64_t t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned su32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// mode 0: group loads; 1: group loads + the norm's pass; 2: one bulk copy into shared memory
__global__ void __launch_bounds__(THREADS, 1)
    k_x(const float* __restrict__ xin, float* __restrict__ xout, int cols, int K, int mode, unsigned long long* dt,
        int it) {
    extern __shared__ __align__(16) float sx[];
    __shared__ __align__(8) uint64_t bar;
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, G = gridDim.x, b = blockIdx.x;
    if (mode == 2 && threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(su32(&bar)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    wait_prev();
    trigger();
    const uint64_t t0 = gtime();
    const float* xr = xin + (size_t)(b % K) * cols;
    float s = 0.0f;
    if (mode == 2) {
        if (threadIdx.x == 0) {
            const unsigned bytes = cols * 4;
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(su32(&bar)), "r"(bytes)
                         : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(su32(sx)), "l"(xr), "r"(bytes), "r"(su32(&bar)) : "memory");
        }
        unsigned ok = 0;
        do {
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                         : "=r"(ok) : "r"(su32(&bar)) : "memory");
        } while (!ok);
        for (int c = threadIdx.x; c < cols; c += blockDim.x) s += sx[c];
    } else if (warp < W) {
        const int ngrp = cols / 128;
        for (int grp = warp; grp < ngrp; grp += 2 * W) {   // two groups in flight a warp, as rows_quantize_cta
            float v[8];
#pragma unroll
            for (int uu = 0; uu < 2; ++uu)
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int g = grp + uu * W;
                    v[4 * uu + u] = g < ngrp ? xr[128 * g + 32 * u + lane] : 0.0f;
                }
#pragma unroll
            for (int u = 0; u < 8; ++u) s += v[u];
        }
        if (mode == 1)
            for (int vw = warp; vw < 8; vw += W)
                for (int c = 32 * vw + lane; c < cols; c += 256) s = fmaf(xr[c], xr[c], s);
    }
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    const uint64_t t1 = gtime();
    if (threadIdx.x == 0) atomicAdd(dt + it, (unsigned long long)(t1 - t0));
    float tot = 0.0f;
    for (int w = 0; w < W + 1; ++w) tot += red[w];
    const int per = (cols + G - 1) / G;   // the CTA's rows of the next x, written into every copy
    for (int r = threadIdx.x; r < per; r += blockDim.x) {
        const int c = b * per + r;
        if (c >= cols) break;
        const float v = tot * 1e-9f + (float)c;
        for (int k = 0; k < K; ++k) xout[(size_t)k * cols + c] = v;
    }
}

int run(int cols, int K, int mode, int G) {
    float *a, *bb;
    unsigned long long* dt;
    CK(cudaMalloc(&a, (size_t)G * cols * 4));
    CK(cudaMalloc(&bb, (size_t)G * cols * 4));
    CK(cudaMemset(a, 0, (size_t)G * cols * 4));
    CK(cudaMalloc(&dt, N * 8));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int smem = mode == 2 ? cols * 4 : 0;
    CK(cudaFuncSetAttribute(k_x, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(G);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < N; ++i) {
        const float* in = (i & 1) ? bb : a;
        float* out = (i & 1) ? a : bb;
        CK(cudaLaunchKernelEx(&cfg, k_x, in, out, cols, K, mode, dt, i));
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int w = 0; w < 5; ++w) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemset(dt, 0, N * 8));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const int reps = 50;
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
    const char* mn[] = {"loads", "loads+norm", "bulk"};
    printf("cols %5d  K %3d  %-10s  %7.3f us a kernel   wait->x in CTA %6.3f us (mean over CTAs)\n", cols, K, mn[mode],
           ms * 1000 / reps / N, sum / (N - 1) / reps / G / 1000.0);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaFree(a);
    cudaFree(bb);
    cudaFree(dt);
    cudaStreamDestroy(s);
    return 0;
}


// ---- a few-CTA consumer (the attention's shape): k_prod's G CTAs write a 2,048-float q/k/v row (16 floats each,
// like the q/k/v GEMV's fold); k_cons's C CTAs x 128 threads wait, then load 6 rows x 128 floats and the RoPE partner
// of each (12 loads a thread, __ldg or plain) and stamp the wait -> data time. Chain: prod, cons, prod, cons, ...
__global__ void k_prod(float* qkv, int it) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
    const int per = (2048 + gridDim.x - 1) / gridDim.x;
    for (int r = threadIdx.x; r < per; r += blockDim.x) {
        const int c = blockIdx.x * per + r;
        if (c < 2048) qkv[c] = (float)(c + it);
    }
}
template <bool NC>
__global__ void k_cons(const float* qkv, float* sink, unsigned long long* dt, int it) {
    __shared__ float red[4];
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
    const uint64_t t0 = gtime();
    const int tid = threadIdx.x, partner = tid < 64 ? tid + 64 : tid - 64;
    float x[6], y[6];
#pragma unroll
    for (int j = 0; j < 6; ++j) {
        const float* row = qkv + (blockIdx.x % 2) * 768 + j * 128;
        x[j] = NC ? __ldg(row + tid) : row[tid];
        y[j] = NC ? __ldg(row + partner) : row[partner];
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 6; ++j) s += x[j] * 0.5f - y[j] * 0.25f;
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((tid & 31) == 0) red[tid >> 5] = s;
    __syncthreads();
    const uint64_t t1 = gtime();
    if (tid == 0) {
        atomicAdd(dt + it, (unsigned long long)(t1 - t0));
        if (red[0] + red[1] + red[2] + red[3] == 1.5f) sink[blockIdx.x] = 1.0f;
    }
}

int run_cons(int C, bool nc, int G) {
    float *qkv, *sink;
    unsigned long long* dt;
    CK(cudaMalloc(&qkv, 2048 * 4));
    CK(cudaMalloc(&sink, 1024 * 4));
    CK(cudaMalloc(&dt, N * 8));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cp = {}, cc = {};
    cp.gridDim = dim3(G);
    cp.blockDim = dim3(256);
    cp.stream = s;
    cp.attrs = &attr;
    cp.numAttrs = 1;
    cc = cp;
    cc.gridDim = dim3(C);
    cc.blockDim = dim3(128);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < N / 2; ++i) {
        CK(cudaLaunchKernelEx(&cp, k_prod, qkv, i));
        if (nc) CK(cudaLaunchKernelEx(&cc, k_cons<true>, (const float*)qkv, sink, dt, i));
        else CK(cudaLaunchKernelEx(&cc, k_cons<false>, (const float*)qkv, sink, dt, i));
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int w = 0; w < 5; ++w) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemset(dt, 0, N * 8));
    const int reps = 50;
    for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    std::vector<unsigned long long> h(N);
    CK(cudaMemcpy(h.data(), dt, N * 8, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 1; i < N / 2; ++i) sum += (double)h[i];
    printf("consumer of %3d CTAs x 128 (%s): wait -> 12 loads a thread used %6.3f us (mean over CTAs)\n", C,
           nc ? "__ldg" : "ld", sum / (N / 2 - 1) / reps / C / 1000.0);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaFree(qkv);
    cudaFree(sink);
    cudaFree(dt);
    cudaStreamDestroy(s);
    return 0;
}

int main() {
    int G = 0;
    CK(cudaDeviceGetAttribute(&G, cudaDevAttrMultiProcessorCount, 0));
    for (int C : {2, 4, 16, 132})
        for (bool nc : {true, false})
            if (run_cons(C, nc, G)) return 1;
    const int Ks[] = {1, 2, 4, 8, 16, 33, 0};
    for (int rep = 0; rep < 2; ++rep) {
        for (int mode = 0; mode < 3; ++mode)
            for (int k = 0; k < 7; ++k)
                if (run(1536, Ks[k] ? Ks[k] : G, mode, G)) return 1;
        for (int mode = 0; mode < 3; mode += 2)
            for (int k = 0; k < 7; ++k)
                if (run(8960, Ks[k] ? Ks[k] : G, mode, G)) return 1;
    }
    return 0;
}
