// gated_qk_norm.cu -- a gated attention layer's q/k head norms and its output gate's split in one launch
// (flashd_linear.h, ABI 15: fd_gated_qk_norm; numpy: daemon/backends/base.py HybridFusedDefaults.gated_qk_norm,
// the reference's split + rmsnorm + rmsnorm).
//
//   q_gate (n, H, 2d) is each head's [query | output gate] (the Wq projection of a qwen35 attention layer):
//   q_out[t, h]    = rmsnorm(q_gate[t, h, :d]) * wq           (n, H, d)
//   gate_out[t, h] = q_gate[t, h, d:]                         (n, H, d): bit copies
//   k_out[t, h]    = rmsnorm(k[t, h]) * wk                    (n, Hkv, d)
//   rmsnorm(x) = x / sqrt(mean(x^2) + eps), the reference's float32 steps with correctly rounded sqrt and division
//
// It replaces the split's two fd_copy_cols launches and the two fd_rmsnorm launches of the decode step (the RoPE
// stays inside fd_attention_decode_rope / fd_rope_kv_write, which rotate the normed q and k). One warp per head
// row (two a block): lane l sums the squares of elements l, l + 32, ... in ascending order, then fd::warp_sum's
// fixed butterfly, so a row's bits depend on nothing but the row (a tree verify row equals the decode step's).
//
// Launched with programmatic dependent launch (fd::launch_pdl, common.cuh): pdl_wait before the first read, then
// the next kernel (the RoPE'd attention) may become resident and run its pre-wait part under this one.
#include "common.cuh"

namespace {

// Two warps a block: a decode step's n (H + Hkv) rows (28 on the 27B shape) spread over 14 SMs instead of 4;
// a prefill's thousands of rows still fill an SM (32 blocks of 64 threads).
constexpr int QKN_THREADS = 64;
constexpr int QKN_WARPS = QKN_THREADS / FD_WARP;

// One head row of d elements (x strided by 1): y = x / sqrt(mean(x^2) + eps) * w. EPL > 0: d <= 32 EPL and the
// lane's EPL elements of x (and w, and the gate row g when non-null) are loaded into registers before any
// arithmetic, so their global loads are in flight together (the loop form waits out one load per element);
// EPL == 0: any d, the loop form. Both evaluate the same fmaf chain per lane in ascending element order, then
// fd::warp_sum, then the same _rn steps per element: the bits do not depend on EPL. g: the gate row copied
// to gy (both may be null).
template <int EPL>
__device__ __forceinline__ void norm_row(float* y, const float* x, const float* __restrict__ w, float* gy,
                                         const float* g, int d, float eps, int lane) {
    if constexpr (EPL > 0) {
        float xv[EPL], wv[EPL], gv[EPL];
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
            const int i = lane + FD_WARP * e;
            xv[e] = i < d ? x[i] : 0.0f;
            wv[e] = i < d ? w[i] : 0.0f;
            gv[e] = (g && i < d) ? g[i] : 0.0f;
        }
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; ++e)
            if (lane + FD_WARP * e < d) ss = fmaf(xv[e], xv[e], ss);
        ss = fd::warp_sum(ss);
        const float rms = __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)d), eps));
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
            const int i = lane + FD_WARP * e;
            if (i < d) {
                y[i] = __fmul_rn(__fdiv_rn(xv[e], rms), wv[e]);
                if (g) gy[i] = gv[e];
            }
        }
    } else {
        float ss = 0.0f;
        for (int i = lane; i < d; i += FD_WARP) ss = fmaf(x[i], x[i], ss);
        ss = fd::warp_sum(ss);
        const float rms = __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)d), eps));
        for (int i = lane; i < d; i += FD_WARP) y[i] = __fmul_rn(__fdiv_rn(x[i], rms), w[i]);
        if (g)
            for (int i = lane; i < d; i += FD_WARP) gy[i] = g[i];
    }
}

// Row r < n H: a query head (normed, and its gate copied); r >= n H: a key head. EPL as norm_row's.
template <int EPL>
__global__ void __launch_bounds__(QKN_THREADS)
gated_qk_norm_kernel(float* q_out, float* gate_out, float* k_out, const float* q_gate, const float* k,
                     const float* __restrict__ wq, const float* __restrict__ wk, int64_t q_rows, int64_t k_rows,
                     int d, float eps) {
    const int lane = (int)threadIdx.x % FD_WARP;
    const int64_t r = (int64_t)blockIdx.x * QKN_WARPS + (int)threadIdx.x / FD_WARP;
    fd::pdl_wait();                                // q_gate and k are the previous kernels'
    fd::pdl_launch_dependents();
    if (r < q_rows) {
        const float* src = q_gate + r * 2 * d;
        norm_row<EPL>(q_out + r * d, src, wq, gate_out + r * d, src + d, d, eps, lane);
    } else if (r < q_rows + k_rows) {
        const int64_t rk = r - q_rows;
        norm_row<EPL>(k_out + rk * d, k + rk * d, wk, nullptr, nullptr, d, eps, lane);
    }
}

}  // namespace

extern "C" int fd_gated_qk_norm(float* q_out, float* gate_out, float* k_out, const float* q_gate, const float* k,
                                const float* wq, const float* wk, int n, int n_heads, int n_kv_heads, int head_dim,
                                float eps, void* stream) {
    FD_CHECK_ARG(q_out && gate_out && k_out && q_gate && k && wq && wk);
    FD_CHECK_ARG(n >= 0 && n_heads > 0 && n_kv_heads > 0 && head_dim > 0 && eps >= 0.0f);
    if (n == 0) return 0;
    const int64_t q_rows = (int64_t)n * n_heads, k_rows = (int64_t)n * n_kv_heads;
    const int64_t blocks = (q_rows + k_rows + QKN_WARPS - 1) / QKN_WARPS;
    if (blocks > 0x7fffffff) return FD_E_SHAPE;
    const int epl = head_dim <= 4 * FD_WARP ? 4 : head_dim <= 8 * FD_WARP ? 8 : 0;   // 0: the loop form
    const auto kernel = epl == 4   ? gated_qk_norm_kernel<4>
                        : epl == 8 ? gated_qk_norm_kernel<8>
                                   : gated_qk_norm_kernel<0>;
    return fd::launch_pdl(kernel, dim3((unsigned)blocks), dim3(QKN_THREADS), 0, (cudaStream_t)stream, q_out, gate_out,
                          k_out, q_gate, k, wq, wk, q_rows, k_rows, head_dim, eps);
}
