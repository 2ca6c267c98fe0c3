// pdl_link_lab.cu -- what one dependent launch costs in a captured chain on this GPU (bench/lab; not the library).
//
// A decode step is ~145 dependent kernels; each waits for its predecessor's grid to complete (griddepcontrol.wait)
// before it reads the activations. This lab times a graph of N kernels of 132 CTAs x 256 threads whose only work
// is to read one word the previous kernel wrote and write one word, three ways:
//   plain  -- ordinary launches (each starts when the previous has completed);
//   pdl    -- programmatic dependent launch: launch_dependents right after the wait, as flashd's kernels do;
//   flag   -- PDL launch, launch_dependents at the start, and instead of griddepcontrol.wait every CTA spins on a
//             counter the previous kernel's CTAs increment (release / acquire) after their writes. Deadlock-free
//             because a dependent grid launches only when every CTA of its primary has triggered (is resident).
// Prints microseconds per kernel. Build: nvcc -O3 -arch=sm_90 -std=c++17 pdl_link_lab.cu -o pdl_link_lab
#include <cstdio>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

constexpr int CTAS = 132, THREADS = 256, N = 200;

__device__ __forceinline__ void wait_prev() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void trigger() { asm volatile("griddepcontrol.launch_dependents;" :::); }

__global__ void k_pdl(const int* in, int* out, int i, int use_wait) {
    if (use_wait) wait_prev();
    trigger();
    if (threadIdx.x == 0) out[blockIdx.x] = in[blockIdx.x] + i;
}

__global__ void k_flag(const int* in, int* out, unsigned* counters, int i) {
    trigger();
    if (threadIdx.x == 0 && i > 0) {
        unsigned v = 0;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counters + i - 1) : "memory");
        } while (v < CTAS);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        out[blockIdx.x] = in[blockIdx.x] + i;
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counters + i) : "memory");
    }
}

int run(const char* name, int mode) {
    int *a, *b;
    unsigned* counters;
    CK(cudaMalloc(&a, CTAS * 4));
    CK(cudaMalloc(&b, CTAS * 4));
    CK(cudaMalloc(&counters, N * 4));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(CTAS);
    cfg.blockDim = dim3(THREADS);
    cfg.stream = s;
    cfg.attrs = mode == 0 ? nullptr : &attr;
    cfg.numAttrs = mode == 0 ? 0 : 1;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    // the counters are zeroed by a memset node before the chain (flag mode)
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaMemsetAsync(counters, 0, N * 4, s));
    for (int i = 0; i < N; ++i) {
        int* in = (i & 1) ? b : a;
        int* out = (i & 1) ? a : b;
        if (mode == 2) CK(cudaLaunchKernelEx(&cfg, k_flag, (const int*)in, out, counters, i));
        else CK(cudaLaunchKernelEx(&cfg, k_pdl, (const int*)in, out, i, 1));
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int w = 0; w < 5; ++w) CK(cudaGraphLaunch(ge, s));
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
    printf("%-6s %7.3f us per kernel (%d kernels of %d x %d, %d graph replays)\n", name, ms * 1000 / reps / N, N, CTAS,
           THREADS, reps);
    return 0;
}

int main() {
    return run("plain", 0) || run("pdl", 1) || run("flag", 2);
}
