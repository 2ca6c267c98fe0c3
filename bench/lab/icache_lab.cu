// icache_lab.cu -- what straight-line code costs on a cold instruction cache (bench/lab; not the library).
//
// A decode step runs ~5 different kernels a layer (30-57 KB of SASS each), so each launch may find its code gone
// from the SM's instruction caches. This lab times a section of S independent FFMAs (8 chains, 16 bytes of code
// each: S = 1024 is 16 KB) by clock64 in thread 0 of every CTA, in a chain of launches:
//   warm  -- the same kernel launched again right after itself;
//   cold  -- between two launches of it, E other kernels of the same size (different code) run.
// Also prints %globaltimer's step (its resolution) as seen by one thread, and (k_dry) whether running the same code
// once before -- one rolled loop of two passes, the first on dummy data -- makes the timed pass warm.
// Build: nvcc -O3 -arch=sm_90 -std=c++17 icache_lab.cu -o icache_lab
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

constexpr int S = 1024;

template <int V>
__global__ void __launch_bounds__(128) k_big(const float* in, float* out, long long* cyc, int slot) {
    float a[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) a[c] = in[c] + threadIdx.x;
    __syncthreads();
    const long long t0 = clock64();
#pragma unroll
    for (int i = 0; i < S; ++i) a[i & 7] = fmaf(a[i & 7], 1.0001f + (float)((i * 7 + V) % 13) * 1e-4f, (float)(i % 5 + V));
    const long long t1 = clock64();
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < 8; ++c) s += a[c];
    if (s == 1234.5f) out[threadIdx.x] = s;   // keep the chains alive
    if (threadIdx.x == 0 && slot >= 0) atomicAdd((unsigned long long*)cyc + slot, (unsigned long long)(t1 - t0));
}


// The same section run twice by one loop (one copy of the code): pass 0 on dummy inputs, results dropped; pass 1 times
// the section. With warm = 1 the first pass runs (warming the instruction cache), with 0 it is skipped.
__global__ void __launch_bounds__(128) k_dry(const float* in, float* out, long long* cyc, int slot, int warm) {
    float a[8];
    long long t0 = 0, t1 = 0;
#pragma unroll 1
    for (int pass = warm ? 0 : 1; pass < 2; ++pass) {
#pragma unroll
        for (int c = 0; c < 8; ++c) a[c] = (pass ? in[c] : 0.5f) + threadIdx.x;
        __syncthreads();
        t0 = clock64();
#pragma unroll
        for (int i = 0; i < S; ++i) a[i & 7] = fmaf(a[i & 7], 1.0001f + (float)((i * 5 + 3) % 11) * 1e-4f, (float)(i % 7));
        t1 = clock64();
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < 8; ++c) s += a[c];
        if (s == 1234.5f) out[threadIdx.x + pass] = s;
    }
    if (threadIdx.x == 0 && slot >= 0) atomicAdd((unsigned long long*)cyc + slot, (unsigned long long)(t1 - t0));
}

__global__ void k_timer(unsigned long long* res) {
    unsigned long long prev, t, steps = 0, sum = 0, minstep = ~0ull;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(prev));
    for (int i = 0; i < 20000 && steps < 200; ++i) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t != prev) {
            ++steps;
            sum += t - prev;
            if (t - prev < minstep) minstep = t - prev;
            prev = t;
        }
    }
    res[0] = steps;
    res[1] = steps ? sum / steps : 0;
    res[2] = minstep;
}

using KFn = void (*)(const float*, float*, long long*, int);

int main() {
    int G = 0;
    CK(cudaDeviceGetAttribute(&G, cudaDevAttrMultiProcessorCount, 0));
    float *in, *out;
    long long* cyc;
    unsigned long long* tr;
    CK(cudaMalloc(&in, 64));
    CK(cudaMemset(in, 0, 64));
    CK(cudaMalloc(&out, 4096));
    CK(cudaMalloc(&cyc, 64 * 8));
    CK(cudaMalloc(&tr, 64));
    k_timer<<<1, 1>>>(tr);
    unsigned long long h[3];
    CK(cudaMemcpy(h, tr, 24, cudaMemcpyDeviceToHost));
    printf("globaltimer: %llu steps seen, mean step %llu ns, min step %llu ns\n", h[0], h[1], h[2]);
    KFn ev[] = {k_big<1>, k_big<2>, k_big<3>, k_big<4>, k_big<5>, k_big<6>, k_big<7>, k_big<8>};
    int clk = 0;
    CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
    for (int grid : {2, G}) {
        for (int E : {0, 1, 2, 4, 8}) {
            CK(cudaMemset(cyc, 0, 64 * 8));
            const int reps = 200;
            for (int r = 0; r < reps; ++r) {
                k_big<0><<<grid, 128>>>(in, out, cyc, 0);
                for (int e = 0; e < E; ++e) ev[e]<<<grid, 128>>>(in, out, cyc, -1);
            }
            CK(cudaDeviceSynchronize());
            long long c0;
            CK(cudaMemcpy(&c0, cyc, 8, cudaMemcpyDeviceToHost));
            const double per = (double)c0 / reps / grid;
            printf("grid %3d  other kernels between %d: %d FFMAs (%d KB of code) in %8.0f cycles (%.2f us at %d MHz)\n",
                   grid, E, S, S * 16 / 1024, per, per / (clk / 1000.0), clk / 1000);
        }
    }
    // a cold section with and without a first pass of the same code on dummy data (two 16 KB kernels between launches)
    for (int warm : {0, 1}) {
        CK(cudaMemset(cyc, 0, 64 * 8));
        const int reps = 200;
        for (int r = 0; r < reps; ++r) {
            k_dry<<<G, 128>>>(in, out, cyc, 0, warm);
            for (int e = 0; e < 2; ++e) ev[e]<<<G, 128>>>(in, out, cyc, -1);
        }
        CK(cudaDeviceSynchronize());
        long long c0;
        CK(cudaMemcpy(&c0, cyc, 8, cudaMemcpyDeviceToHost));
        const double per = (double)c0 / reps / G;
        printf("dry first pass %d: the timed pass in %8.0f cycles (%.2f us)\n", warm, per, per / (clk / 1000.0));
    }
    return 0;
}
