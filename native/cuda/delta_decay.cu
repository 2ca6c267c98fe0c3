// delta_decay.cu -- the gated delta rule's per-token log decay (flashd_recurrent.h: fd_delta_decay; numpy:
// daemon/backends/reference.py ReferenceOps.delta_decay, Ops.delta_decay):
//
//     g[t, h] = softplus(alpha[t, h] + dt_bias[h]) * a[h]        alpha (n, Hv), dt_bias (Hv,), a (Hv,), g (n, Hv)
//     softplus(z) = z for z > 20, else log1p(exp(z))             (the reference's threshold)
//
// The arithmetic is the reference's float32 steps, in its order: z = alpha + dt_bias rounded to float32; exp(z)
// rounded to float32; log1p of that rounded to float32; times a rounded to float32. exp and log1p are computed in
// double and rounded once (--use_fast_math would make expf / logf the ~2-ulp intrinsics): the correctly rounded
// float32 exp / log1p, where numpy's SIMD float32 exp is itself up to 2-3 ulp off, so g agrees with the reference
// within a few ulp (most elements bit for bit; tests/gpu/test_hybrid_gates.py states the bounds).
// Below z ~ -87 exp(z) is a float32 subnormal, which the flush-to-zero build stores as 0 (numpy keeps it): g is
// then -0 instead of ~1e-40, exp(g) = 1 either way. A NaN z gives NaN, as numpy's.
//
// A thread per element, grid-stride; the (Hv,) vectors are tiny and stay in cache. g may alias alpha.
#include "common.cuh"

namespace {

constexpr int DD_THREADS = 256;
constexpr int64_t DD_MAX_BLOCKS = 1024;

__global__ void __launch_bounds__(DD_THREADS)
delta_decay_kernel(float* g, const float* alpha, const float* dt_bias, const float* a, int64_t n, int heads) {
    const int64_t total = n * heads;
    const int64_t stride = (int64_t)gridDim.x * DD_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * DD_THREADS + threadIdx.x; i < total; i += stride) {
        const int h = (int)(i % heads);
        const float z = __fadd_rn(alpha[i], dt_bias[h]);
        float sp = z;
        if (!(z > 20.0f)) {                                        // NaN takes this branch: exp, log1p keep it
            const float e = (float)exp((double)z);
            sp = (float)log1p((double)e);
        }
        g[i] = __fmul_rn(sp, a[h]);
    }
}

}  // namespace

extern "C" int fd_delta_decay(float* g, const float* alpha, const float* dt_bias, const float* a, int n_tokens,
                              int n_v_heads, void* stream) {
    FD_CHECK_ARG(g && alpha && dt_bias && a && n_tokens >= 0 && n_v_heads >= 1);
    if (n_tokens == 0) return 0;
    const int64_t total = (int64_t)n_tokens * n_v_heads;
    const int64_t want = (total + DD_THREADS - 1) / DD_THREADS;
    const int blocks = (int)(want < DD_MAX_BLOCKS ? want : DD_MAX_BLOCKS);
    delta_decay_kernel<<<blocks, DD_THREADS, 0, (cudaStream_t)stream>>>(g, alpha, dt_bias, a, n_tokens, n_v_heads);
    return FD_LAUNCH_STATUS();
}
