// gemv_rows_x.cuh -- gemv_rows.cuh's activations as its items read them: x (n, cols) f32, or rmsnorm(x) * norm_w,
// quantized per 128-column group (a scale a 32-column block in a launch of one 32-column format) to int8 codes and a
// float scale -- one definition (rows_quant_group, the norm's fixed partition) for the pre-pass launch
// (gemv_rows_quantize_x, into the stream's scratch) and for a GEMV CTA's own copy in shared memory (gemv_rows.cuh
// rows_quantize_cta, rows_stage_x), so the same codes whichever makes them -- and that copy's layout (rows_fx_stride,
// rows_fx_bytes).
#pragma once

#include "gemv_rows_item.cuh"
#include "x_codes.cuh"

namespace fd {
namespace {

constexpr int ROWS_PREPASS_THREADS = 256;   // also the RMSNorm sum's fixed partition
constexpr int ROWS_FX_MAX_NX = 8;           // x rows a CTA may quantize itself (one N-tile; rows_xrow's clamp)
constexpr int ROWS_FX_SC = rows_sc_stride<true>();   // x rows a scale row holds in the CTA's copy
constexpr int ROWS_GROUP_WARPS = ROWS_PREPASS_THREADS / 32;   // a pre-pass CTA's groups (a warp each)

__host__ __device__ constexpr int rows_groups(int cols) { return (cols + ROWS_XG - 1) / ROWS_XG; }
// Bytes between x rows in a CTA's own x copy: cols for one row (the dp4a items read row 0 only); for 2 .. 8 rows
// cols padded so that an mma item's B-fragment reads -- lanes g = 0..7 read x rows g at the same column -- fall in
// distinct shared-memory banks: rows 16 bytes apart modulo 128 where the items read x 4 bytes a lane (Q6_K: 8 rows x 4
// lanes x 4 bytes, one wavefront), 32 where they read 8 (Q4_K, Q8_0, Q5_0: each half-warp's 4 rows x 32 bytes) and in
// a mixed launch (q / k / v with a Q6_K v: no residue serves both widths; 32 keeps Q4_K's reads conflict-free and
// Q6_K's 2-way). Unpadded, cols a multiple of 128 put all 8 rows in one bank: 8-way conflicts (session 37: 8-row
// launches were slower with x in shared memory than reading it through L1).
__host__ __device__ inline int rows_fx_stride(int n, int cols, int fmt) {
    if (n <= 1) return cols;
    const int want = fmt == ROWS_Q6K ? 16 : 32;
    return cols + ((want - cols % 128) % 128 + 128) % 128;
}
// Shared memory of a CTA's own x copy (kernels with FX): n rows of cols codes stride bytes apart (rows_fx_stride;
// cols % 32 == 0, so 16-byte multiples), rows_scale_rows(cols, fine) x ROWS_FX_SC float scales, 32 floats for the
// norm's sums.
__host__ __device__ inline int rows_fx_bytes(int n, int stride, int cols, bool fine) {
    return n * stride + rows_scale_rows(cols, fine) * ROWS_FX_SC * 4 + 32 * 4;
}

// ---- x -> codes: one definition for the pre-pass and the CTAs' own copies (the same bits whatever n or route) --
// The RMSNorm's sum of squares is block_sum over ROWS_PREPASS_THREADS virtual threads: virtual thread v's chain
// over columns v, v + 256, ...; warp_sum of each virtual warp's 32; warp_sum of the 8 warp sums (lanes >= 8: 0).
__device__ __forceinline__ float rows_norm_part(const float* xr, int cols, int v) {
    float ss = 0.0f;
#pragma unroll 4
    for (int c = v; c < cols; c += ROWS_PREPASS_THREADS) ss = fmaf(xr[c], xr[c], ss);
    return ss;
}
// Divisions and the add are explicitly rounded: the library builds with --use_fast_math, and this must be one fixed
// expression wherever it is inlined (the pre-pass, every GEMV CTA), never contracted differently by context.
__device__ __forceinline__ float rows_norm_scale(float ss, int cols, float eps) {
    return rsqrtf(__fadd_rn(__fdiv_rn(ss, (float)cols), eps));
}

static_assert(ROWS_XG == XCODES_GROUP && ROWS_NX == XCODES_ROWS, "x_codes.cuh's layout is the pre-pass's");

// Warp-wide, one 128-column group of one x row: lane holds v[u] = x[c_u], w[u] = norm_w[c_u] for the group's
// columns c_u = 128 grp + 32 u + lane, u < nu (a row's last group may have 1..3 blocks of 32; loaded by the caller,
// batched): xn = v (* scale * w if norm), the codes q[u] = rint(xn * 127 / m) (0 for u >= nu) and the scales
// xd[u] = m / 127, m = max|xn| over the group -- or, fine, over block u alone (xd[u] for u < nu; coarse: xd[0]).
__device__ __forceinline__ void rows_quant_group(float (&v)[4], const float (&w)[4], int nu, bool norm, float scale,
                                                 bool fine, int (&q)[4], float (&xd)[4]) {
    float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        if (u >= nu) break;
        if (norm) v[u] = __fmul_rn(__fmul_rn(v[u], scale), w[u]);
        m[u] = fabsf(v[u]);
    }
    if (fine) {                        // nu is warp-uniform: every lane takes the same shuffles
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (u < nu) m[u] = warp_max(m[u]);
            const float inv = xcodes_inv(m[u]);
            q[u] = u < nu ? xcodes_code(v[u], inv) : 0;
            xd[u] = xcodes_scale(m[u]);
        }
        return;
    }
    const float g = warp_max(fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3])));
    const float inv = xcodes_inv(g);
#pragma unroll
    for (int u = 0; u < 4; ++u) q[u] = u < nu ? xcodes_code(v[u], inv) : 0;
    xd[0] = xcodes_scale(g);          // the group's one scale (rows_store_scales reads only xd[0] here)
}
// lane 0 stores a group's scales (xd of rows_quant_group): scale row grp, or 4 grp + u (fine), at stride floats a row
__device__ __forceinline__ void rows_store_scales(float* xsc, int grp, int nu, bool fine, int stride, int i,
                                                  const float (&xd)[4]) {
    if (!fine) { xsc[(size_t)grp * stride + i] = xd[0]; return; }
#pragma unroll
    for (int u = 0; u < 4; ++u)
        if (u < nu) xsc[(size_t)(4 * grp + u) * stride + i] = xd[u];
}

// ---- the x pre-pass --------------------------------------------------------------------------------------------
// grid (ceil(cols / 1024), n), ROWS_PREPASS_THREADS threads: warp w of CTA bx quantizes the 128-column group
// 8 bx + w of x row blockIdx.y (rows_quant_group): xn = x (* rsqrt(mean(x^2) + eps) * norm_w), codes
// q = rint(xn * 127 / max|xn|), xd = max|xn| / 127. With a norm every CTA sums the whole row's squares in the same
// fixed partition (a few KB from L2).
__global__ void __launch_bounds__(ROWS_PREPASS_THREADS)
    gemv_rows_quantize_x(const float* __restrict__ x, const float* __restrict__ norm_w, float eps, int cols, int fine,
                         int8_t* __restrict__ xq, float* __restrict__ xsc) {
    __shared__ float red[32];
    pdl_wait();                  // x (and norm_w's producer) are the previous kernel's
    pdl_launch_dependents();     // the GEMV may start streaming its weights now
    const int i = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* xr = x + (size_t)i * cols;
    float scale = 1.0f;
    if (norm_w) scale = rows_norm_scale(block_sum(rows_norm_part(xr, cols, threadIdx.x), red), cols, eps);
    const int grp = blockIdx.x * ROWS_GROUP_WARPS + warp;
    if (grp >= rows_groups(cols)) return;
    const int nu = min(4, cols / 32 - 4 * grp);
    float v[4], w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const int c = ROWS_XG * grp + 32 * u + lane;
        v[u] = u < nu ? xr[c] : 0.0f;
        w[u] = u < nu && norm_w ? norm_w[c] : 1.0f;
    }
    int q[4];
    float xd[4];
    rows_quant_group(v, w, nu, norm_w != nullptr, scale, fine != 0, q, xd);
#pragma unroll
    for (int u = 0; u < 4; ++u)
        if (u < nu) xq[(size_t)i * cols + ROWS_XG * grp + 32 * u + lane] = (int8_t)q[u];
    if (lane == 0) rows_store_scales(xsc, grp, nu, fine != 0, ROWS_NX, i, xd);
}

}  // namespace
}  // namespace fd
