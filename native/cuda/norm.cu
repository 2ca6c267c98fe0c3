// norm.cu -- RMSNorm over the rows of a float32 matrix (flashd.h: fd_rmsnorm).
//
//   y (rows, cols) = x * rsqrt(mean(x^2) + eps) * w        w: (cols,); y may alias x.
//
// Launch: one block of 256 threads per row. The sum of squares is a block reduction (float32,
// like the reference's np.mean(..., dtype=float32)); then every thread rescales exactly the
// elements it read itself, so y == x in place is safe without a second buffer. Rows whose cols
// is a multiple of 4 (and 16-byte aligned pointers) use float4 accesses. Standalone norms are
// rare in the decode step (the GEMV prologue fuses the norm into the next projection); this
// kernel serves the final norm, q/k-norms and the prefill path.
#include "common.cuh"

namespace {

constexpr int NORM_THREADS = 256;

template <bool VEC4>
__global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_kernel(float* y, const float* x, const float* __restrict__ w, int cols, float eps) {
    __shared__ float scratch[32];
    const size_t row = (size_t)blockIdx.x * (size_t)cols;
    const float* xr = x + row;
    float* yr = y + row;
    float ss = 0.0f;
    if (VEC4) {
        const int n4 = cols / 4;
        for (int i = threadIdx.x; i < n4; i += NORM_THREADS) {
            const float4 v = reinterpret_cast<const float4*>(xr)[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        for (int i = threadIdx.x; i < cols; i += NORM_THREADS) ss += xr[i] * xr[i];
    }
    ss = fd::block_sum(ss, scratch);
    const float inv_rms = rsqrtf(ss / (float)cols + eps);
    if (VEC4) {
        const int n4 = cols / 4;
        for (int i = threadIdx.x; i < n4; i += NORM_THREADS) {
            const float4 v = reinterpret_cast<const float4*>(xr)[i];
            const float4 g = reinterpret_cast<const float4*>(w)[i];
            reinterpret_cast<float4*>(yr)[i] =
                make_float4(v.x * inv_rms * g.x, v.y * inv_rms * g.y, v.z * inv_rms * g.z, v.w * inv_rms * g.w);
        }
    } else {
        for (int i = threadIdx.x; i < cols; i += NORM_THREADS) yr[i] = xr[i] * inv_rms * w[i];
    }
}

bool aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

}  // namespace

extern "C" int fd_rmsnorm(float* y, const float* x, const float* w, int rows, int cols, float eps, void* stream) {
    FD_CHECK_ARG(y && x && w);
    FD_CHECK_ARG(rows >= 0 && cols > 0 && eps >= 0.0f);
    if (rows == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (cols % 4 == 0 && aligned16(y) && aligned16(x) && aligned16(w))
        rmsnorm_kernel<true><<<rows, NORM_THREADS, 0, s>>>(y, x, w, cols, eps);
    else
        rmsnorm_kernel<false><<<rows, NORM_THREADS, 0, s>>>(y, x, w, cols, eps);
    return FD_LAUNCH_STATUS();
}
