// chain_sync_lab.cu -- what a kernel boundary costs in a PDL chain, and what a counter in device memory saves
// (session 25; issue 11's "dependencies are counters in device memory" measured before building on it).
//
// A chain of K launches replayed from one CUDA graph; each launch is a small GEMV-like step over 132 CTAs: it issues
// its weight slice's loads (a region of W, different per launch, so it streams from DRAM) before waiting on its input,
// then reads x (the previous launch's output, through L2), reduces its rows, writes its part of y. Three ways to wait:
//   plain  no PDL: stream order
//   pdl    PDL launch, griddepcontrol.wait (the library's way today)
//   flag   PDL launch, no griddepcontrol.wait: spin until the previous launch's counter reaches its CTA count (each
//          CTA: __syncthreads, thread 0 fence + atomicAdd after its stores); counters zeroed by a memset at the start
// Prints us per launch for several weight bytes per launch. Build: nvcc -O3 -arch=sm_90 -o csl chain_sync_lab.cu
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t err_ = (x); if (err_) { printf("%s: %s\n", #x, cudaGetErrorString(err_)); return 1; } } while (0)

constexpr int THREADS = 256, COLS = 1536;

struct Args {
    const uint4* w;       // this launch's weights: ctas x THREADS x per_thread uint4
    const float* x;       // (COLS) input
    float* y;             // (COLS) output: each CTA writes COLS / ctas entries
    int* flags;           // per launch counters
    int k;                // this launch's index
    int per_thread;       // uint4 loads per thread (weight bytes = ctas * THREADS * per_thread * 16)
    int mode;             // 0 plain, 1 pdl, 2 flag
};

__global__ void __launch_bounds__(THREADS) step(Args a) {
    const int t = threadIdx.x, b = blockIdx.x, n = gridDim.x;
    // weights first: they do not depend on the previous launch
    uint32_t acc = 0;
    uint4 v[8];
    const uint4* wp = a.w + ((size_t)b * THREADS + t) * a.per_thread;
    for (int i0 = 0; i0 < a.per_thread; i0 += 8) {
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = i0 + u < a.per_thread ? __ldcs(wp + i0 + u) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 8; ++u) acc += v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (a.mode == 1) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
    } else if (a.mode == 2 && a.k > 0) {
        if (t == 0) {
            int seen;
            do {
                asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(a.flags + a.k - 1) : "memory");
            } while (seen < n);
        }
        __syncthreads();
    }
    if (a.mode != 0) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    // the input: all of x through L2, a dot with this CTA's "rows"
    float s = 0.0f;
    for (int c = t; c < COLS; c += THREADS) s += __ldcg(a.x + c) * (float)((acc >> (c & 7)) & 1);
    __shared__ float red[THREADS / 32];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((t & 31) == 0) red[t >> 5] = s;
    __syncthreads();
    const int rows = COLS / n + 1;
    if (t < rows && b * rows + t < COLS) {
        float r = 0.0f;
        for (int i = 0; i < THREADS / 32; ++i) r += red[i];
        a.y[b * rows + t] = r * 1e-3f + 1.0f;
    }
    if (a.mode == 2) {
        __syncthreads();
        if (t == 0) {
            __threadfence();
            atomicAdd(a.flags + a.k, 1);
        }
    }
}

int main() {
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int K = 168, reps = 20;
    const size_t w_bytes_max = 256ull << 20;
    uint4* w; float* xs; int* flags;
    CK(cudaMalloc(&w, w_bytes_max)); CK(cudaMemset(w, 3, w_bytes_max));
    CK(cudaMalloc(&xs, (K + 1) * COLS * sizeof(float))); CK(cudaMemset(xs, 0, (K + 1) * COLS * sizeof(float)));
    CK(cudaMalloc(&flags, K * sizeof(int)));
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const char* names[] = {"plain", "pdl", "flag"};
    for (int per_thread : {1, 4, 12, 48}) {       // 132 CTAs: 0.54, 2.2, 6.5, 26 MB a launch
        const size_t bytes = (size_t)sms * THREADS * per_thread * 16;
        const int regions = (int)std::max<size_t>(1, w_bytes_max / bytes);
        for (int mode = 0; mode < 3; ++mode) {
            cudaGraph_t g; cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            CK(cudaMemsetAsync(flags, 0, K * sizeof(int), st));
            for (int k = 0; k < K; ++k) {
                Args a{w + (size_t)(k % regions) * (bytes / 16), xs + k * COLS, xs + (k + 1) * COLS, flags, k, per_thread, mode};
                cudaLaunchConfig_t cfg = {};
                cudaLaunchAttribute attr[1];
                attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                attr[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.gridDim = dim3(sms); cfg.blockDim = dim3(THREADS); cfg.stream = st;
                cfg.attrs = attr; cfg.numAttrs = mode != 0 && k > 0 ? 1 : 0;
                CK(cudaLaunchKernelEx(&cfg, step, a));
            }
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, st)); CK(cudaStreamSynchronize(st));
            cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
            std::vector<float> ts;
            for (int r = 0; r < reps; ++r) {
                CK(cudaEventRecord(e0, st)); CK(cudaGraphLaunch(ge, st)); CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms * 1000.0f / K);
            }
            std::sort(ts.begin(), ts.end());
            printf("%6.2f MB a launch  %-5s  %6.2f us a launch (min %6.2f)  %7.1f GB/s\n", bytes / 1048576.0, names[mode],
                   ts[reps / 2], ts[0], bytes / (ts[reps / 2] * 1e3));
            CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
        }
    }
    return 0;
}
