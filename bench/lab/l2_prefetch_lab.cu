// l2_prefetch_lab.cu -- does an L2 prefetch leave data that a later kernel hits, and does the prefetching kernel
// last until its prefetches land? (session 25; the library's GEMVs slowed down with fd_gemv_prefetch_next.)
// Build: nvcc -O3 -arch=sm_90 -o l2pf bench/lab/l2_prefetch_lab.cu ; run: ./l2pf [MB]
// Per case: the prefetching kernel's time, a spin kernel (~gap us), then a reading kernel's time over the region.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t err_ = (x); if (err_) { printf("%s: %s\n", #x, cudaGetErrorString(err_)); return 1; } } while (0)

__global__ void pf_bulk(const uint8_t* p, int64_t bytes, int piece) {
    int64_t n = (bytes + piece - 1) / piece;
    for (int64_t q = (int64_t)blockIdx.x * 32 + (threadIdx.x & 31); threadIdx.x < 32 && q < n; q += (int64_t)gridDim.x * 32) {
        int64_t off = q * piece;
        unsigned b = (unsigned)(bytes - off < piece ? bytes - off : piece);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(b) : "memory");
    }
}
__global__ void pf_line(const uint8_t* p, int64_t bytes) {
    for (int64_t o = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 128; o < bytes; o += (int64_t)gridDim.x * blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
}
__global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
__global__ void readk(const uint4* p, int64_t n, int evict_first, unsigned* sink) {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    unsigned acc = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint4 v;
        if (evict_first)
            asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i), "l"(pol));
        else
            v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678) sink[0] = acc;
}

int main(int argc, char** argv) {
    const int64_t mb = argc > 1 ? atoi(argv[1]) : 16;
    const int64_t bytes = mb << 20, flush = 512ll << 20;
    uint8_t *r, *f;
    unsigned* sink;
    CK(cudaMalloc(&r, bytes)); CK(cudaMalloc(&f, flush)); CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(r, 1, bytes)); CK(cudaMemset(f, 2, flush));
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaEvent_t e[4];
    for (auto& x : e) CK(cudaEventCreate(&x));
    auto flushL2 = [&]() { readk<<<sms * 4, 512>>>((const uint4*)f, flush / 16, 0, sink); };
    const char* names[] = {"cold (no prefetch)", "warm (read twice)", "bulk prefetch 16K", "bulk prefetch 64K", "line prefetch"};
    for (int ef = 0; ef < 2; ++ef)
    for (int c = 0; c < 5; ++c) {
        std::vector<float> tp, tr;
        for (int rep = 0; rep < 7; ++rep) {
            flushL2();
            if (c == 1) readk<<<sms * 4, 512>>>((const uint4*)r, bytes / 16, 0, sink);
            CK(cudaEventRecord(e[0]));
            if (c == 2) pf_bulk<<<sms, 32>>>(r, bytes, 16384);
            if (c == 3) pf_bulk<<<sms, 32>>>(r, bytes, 65536);
            if (c == 4) pf_line<<<sms, 256>>>(r, bytes);
            CK(cudaEventRecord(e[1]));
            spin<<<1, 32>>>(1800ll * 40);   // ~40 us at ~1.8 GHz
            CK(cudaEventRecord(e[2]));
            readk<<<sms * 4, 512>>>((const uint4*)r, bytes / 16, ef, sink);
            CK(cudaEventRecord(e[3]));
            CK(cudaEventSynchronize(e[3]));
            float a, b;
            CK(cudaEventElapsedTime(&a, e[0], e[1])); CK(cudaEventElapsedTime(&b, e[2], e[3]));
            tp.push_back(a * 1000); tr.push_back(b * 1000);
        }
        std::sort(tp.begin(), tp.end()); std::sort(tr.begin(), tr.end());
        printf("%4lld MB evict_first=%d %-22s prefetch kernel %8.2f us   read %8.2f us (%.0f GB/s)\n", (long long)mb, ef,
               names[c], tp[3], tr[3], bytes / (tr[3] * 1e3));
    }
    return 0;
}
