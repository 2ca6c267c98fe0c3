// gemv_stage.cuh -- the GEMV prologue: each CTA stages its x rows (n_x <= 8, (n_x, cols) f32 in global
// memory) in shared memory before the steps run (gemv.cuh). stage_x: xn = x * RMSNorm factor * norm_w as
// float xn * 2^X_SCALE_LOG2 in each activation layout the matrices' formats read (quant_codes.cuh x_phys),
// plus sums of xn per 16 and 32 columns. stage_xq: the int8 form (two codes per column and a scale per
// 32-column block; the XQ kernels, launches whose matrices are all quantized). Both share norm_scales,
// whose fixed partition of the RMSNorm sums keeps every row's result independent of n_x and of the CTA
// shape (row invariance). stage_xq's per-group work (stage_xq_groups) also runs in gemv.cu's pre-pass launch, which
// writes the same bytes to global memory once for all CTAs (load_xq_image copies them). x_views then reads the
// staged pieces' addresses out of GemvArgs.
#pragma once

#include "gemv_args.cuh"

namespace fd {
namespace {

using namespace fd::q;

// ---- prologue: stage xn in shared memory ---------------------------------------------------------------
// Activations are loaded through L2 (ld.global.cg), never the non-coherent path: the persistent forward
// (forward.cu) reads rows that other SMs wrote earlier in the same launch.
__device__ __forceinline__ float load_act(const float* p) { return __ldcg(p); }
__device__ __forceinline__ float4 load_act4(const float4* p) { return __ldcg(p); }
constexpr int X_BATCH = 8;   // x loads in flight per thread in the prologue

// v[u] = row[c0 + u * stride] (0 past n): X_BATCH independent loads in flight per thread.
__device__ __forceinline__ void load_x_batch(const float* row, int c0, int stride, int n, float (&v)[X_BATCH]) {
#pragma unroll
    for (int u = 0; u < X_BATCH; ++u) {
        const int c = c0 + u * stride;
        v[u] = c < n ? load_act(row + c) : 0.0f;
    }
}

// The second half of norm_scales: warp i % n_warps adds row i's NORM_LANES partials (in smf, written before a
// CTA barrier) in a fixed order; scale[i] = rsqrt(mean x^2 + eps). Ends with a CTA barrier.
template <int NX>
__device__ __forceinline__ void norm_total(const GemvArgs& a, float* smf, float (&scale)[NX]) {
    const int n_threads = blockDim.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = warp; i < a.n_x; i += n_threads >> 5) {
        float t = 0.0f;
#pragma unroll
        for (int k = 0; k < NORM_LANES / 32; ++k) t += smf[i * NORM_LANES + lane + 32 * k];
        t = warp_sum(t);
        if (lane == 0) smf[i * NORM_LANES] = t;   // this warp alone read row i's partials
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < NX; ++i)
        if (i < a.n_x) scale[i] = rsqrtf(smf[i * NORM_LANES] / (float)a.cols + a.eps);
}

// The RMSNorm factor of every x row (1 without norm_w). Row invariance: a row's sum of squares must
// not depend on the CTA size or on how many rows share the launch (speculative verification
// reproduces decoding bit for bit), so it is cut into NORM_LANES fixed partial sums (partial v:
// columns v, v + NORM_LANES, ... in order; a thread takes partials tid, tid + n_threads, ...) that
// warp i % n_warps adds in a fixed order. Loads are issued X_BATCH at a time (latency-bound).
// smf: scratch_bytes_for(n_x) bytes.
template <int NX>
__device__ __forceinline__ void norm_scales(const GemvArgs& a, float* smf, float (&scale)[NX]) {
    const int tid = threadIdx.x, n_threads = blockDim.x;
    const int cols = a.cols, n_x = a.n_x;
#pragma unroll
    for (int i = 0; i < NX; ++i) scale[i] = 1.0f;
    if (!a.norm_w) return;
    for (int v = tid; v < NORM_LANES; v += n_threads) {
        float ss[NX];
#pragma unroll
        for (int i = 0; i < NX; ++i) ss[i] = 0.0f;
        for (int c0 = v; c0 < cols; c0 += X_BATCH * NORM_LANES) {
#pragma unroll
            for (int i = 0; i < NX; ++i) {
                if (i >= n_x) break;
                float x[X_BATCH];
                load_x_batch(a.x + (int64_t)i * cols, c0, NORM_LANES, cols, x);
#pragma unroll
                for (int u = 0; u < X_BATCH; ++u) ss[i] = fmaf(x[u], x[u], ss[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < NX; ++i)
            if (i < n_x) smf[i * NORM_LANES + v] = ss[i];
    }
    __syncthreads();
    norm_total<NX>(a, smf, scale);
}

// xn (scaled by 2^X_SCALE_LOG2) into each used layout, zero-padded; sums of xn per 16 and 32
// columns.
template <int NX>
__device__ void stage_x(const GemvArgs& a, float* smf) {
    const int tid = threadIdx.x, n_threads = blockDim.x;
    const int cols = a.cols, n_x = a.n_x;
    const int cols_pad = (cols + 63) & ~63;
    float scale[NX];
    norm_scales<NX>(a, smf, scale);
    const float up = exp2i(X_SCALE_LOG2);
    // A second pass over x, batched as norm_scales' (which must finish the row's sum of squares first),
    // with this thread's columns instead of its norm partials.
    // c runs over 32-aligned groups per warp (n_threads is a multiple of 32): the warp sums below are
    // over 32 consecutive columns, all lanes present
    for (int c0 = tid; c0 < cols_pad; c0 += X_BATCH * n_threads) {
        float nw[X_BATCH];
#pragma unroll
        for (int u = 0; u < X_BATCH; ++u) {
            const int c = c0 + u * n_threads;
            nw[u] = c < cols ? (a.norm_w ? __ldg(a.norm_w + c) : 1.0f) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < NX; ++i) {
            if (i >= n_x) break;
            float v[X_BATCH];
            load_x_batch(a.x + (int64_t)i * cols, c0, n_threads, cols, v);
#pragma unroll
            for (int u = 0; u < X_BATCH; ++u) {
                const int c = c0 + u * n_threads;
                if (c - (tid & 31) >= cols_pad) break;   // warp-uniform: the whole 32-group is past the end
                const float xn = v[u] * scale[i] * nw[u];
#pragma unroll
                for (int L = 0; L < XL_COUNT; ++L)
                    if (a.x_off_floats[L] >= 0) smf[a.x_off_floats[L] + i * a.x_row[L] + x_phys(L, c)] = xn * up;
                if (a.xsum16_off >= 0) {
                    float s = xn;
#pragma unroll
                    for (int off = 8; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);   // 16-lane sums
                    const int g16 = c >> 4;
                    if ((tid & 15) == 0 && c < cols) smf[a.xsum16_off + i * a.xsum16_row + g16] = s;
                    s += __shfl_xor_sync(0xffffffffu, s, 16);
                    if ((tid & 31) == 0 && c < cols) smf[a.xsum32_off + i * a.xsum32_row + (c >> 5)] = s;
                }
            }
        }
    }
    __syncthreads();
}

// ---- int8 activations (XQ kernels: launches whose matrices are all quantized) ----------------------------
// Each x row is staged per 32-column block as a float scale sx and two int8 codes per column with
// xn ~= x' = sx * (hi + lo / XQ_LO): t = xn * 127 / max|xn over the block|, hi = rint(t),
// lo = rint((t - hi) * XQ_LO). |xn - x'| <= max / (127 * 2 * XQ_LO) ~ 1.6e-5 of the block's largest |xn|
// (about float16's relative precision, which the prefill GEMM uses for activations). The weights
// stay exact: a part's sum of code * x' is sx * (sum code * hi + sum code * lo / XQ_LO), two integer
// dp4a sums, and its zero-point / min term uses the sums of the same x' (xsum16 / xsum32), so the
// result is sum w * x' up to float32 rounding.
// Bytes: the 4 columns of a group are 8 bytes (4 hi codes, then 4 lo codes); column col's group lies
// at byte 8 * x8_group<L>(col), with one 8-byte pad per 32 columns (XL_PAD32: the 32-weight formats,
// whose lanes read consecutive blocks: 18 words apart, distinct bank pairs in a half-warp) or per 64
// columns (XL_PAD64: K formats, lanes 64 columns = 34 words and blocks 136 words apart: distinct bank
// pairs for the 16 lanes of a half-warp of Q4_K / Q5_K; Q6_K 2-way at worst).
constexpr float XQ_LO = 254.0f;
template <int L>
__host__ __device__ constexpr int x8_group(int col) { return (col >> 2) + (col >> (L == XL_PAD64 ? 6 : 5)); }
__host__ __device__ constexpr int x8_row_bytes(int L, int cols) {
    return L == XL_PAD64 ? 8 * x8_group<XL_PAD64>((cols + 63) & ~63) : 8 * x8_group<XL_PAD32>((cols + 31) & ~31);
}

__device__ __forceinline__ uint32_t pack_s8(const int (&v)[4]) {
    return (uint32_t)(v[0] & 0xFF) | (uint32_t)(v[1] & 0xFF) << 8 | (uint32_t)(v[2] & 0xFF) << 16 | (uint32_t)(v[3] & 0xFF) << 24;
}

// Thread t takes groups g_first, g_first + g_stride, ... (float4 loads: 8 lanes = one 32-column block, so
// block maxima and sums are 8-lane shuffles; g_first % 32 is the lane and g_stride a multiple of 32) and writes
// their codes, sums and scales at the pass layout's offsets from dst: shared memory in the GEMV kernels (stage_xq),
// global memory in the pre-pass (gemv_xq_image_kernel), so both write the same bytes. scale: norm_scales' factors.
// cols % 32 == 0, x and norm_w 16-byte aligned. XQ_BATCH float4 loads of x (and of norm_w) in flight per thread:
// 4 x 768 threads cover 12288 columns per round at 32 registers.
constexpr int XQ_BATCH = 4;
template <int NX>
__device__ __forceinline__ void stage_xq_groups(const GemvArgs& a, uint8_t* sm, const float (&scale)[NX],
                                                int g_first, int g_stride) {
    const int lane = threadIdx.x & 31;
    const int n_groups = a.cols >> 2, n_x = a.n_x;
    float* smf = reinterpret_cast<float*>(sm);
    const float4* x4 = reinterpret_cast<const float4*>(a.x);
    const float4* nw4 = reinterpret_cast<const float4*>(a.norm_w);
    for (int g0 = g_first; g0 - lane < n_groups; g0 += XQ_BATCH * g_stride) {
        float4 nw[XQ_BATCH];
#pragma unroll
        for (int u = 0; u < XQ_BATCH; ++u) {
            const int g = g0 + u * g_stride;
            nw[u] = (nw4 && g < n_groups) ? __ldg(nw4 + g) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        }
#pragma unroll
        for (int i = 0; i < NX; ++i) {
            if (i >= n_x) break;
            float4 v[XQ_BATCH];
#pragma unroll
            for (int u = 0; u < XQ_BATCH; ++u) {
                const int g = g0 + u * g_stride;
                v[u] = g < n_groups ? load_act4(x4 + (int64_t)i * n_groups + g) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < XQ_BATCH; ++u) {
                const int g = g0 + u * g_stride;
                if (g - lane >= n_groups) break;   // warp-uniform: the whole warp is past the end
                const float xn[4] = {v[u].x * scale[i] * nw[u].x, v[u].y * scale[i] * nw[u].y,
                                     v[u].z * scale[i] * nw[u].z, v[u].w * scale[i] * nw[u].w};
                float mx = fmaxf(fmaxf(fabsf(xn[0]), fabsf(xn[1])), fmaxf(fabsf(xn[2]), fabsf(xn[3])));
#pragma unroll
                for (int off = 1; off < 8; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
                const float sx = mx * (1.0f / 127.0f);
                int hi[4], lo[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const float t = xn[k] * inv;
                    hi[k] = __float2int_rn(t);
                    lo[k] = __float2int_rn((t - (float)hi[k]) * XQ_LO);
                }
                int hs = hi[0] + hi[1] + hi[2] + hi[3], ls = lo[0] + lo[1] + lo[2] + lo[3];
#pragma unroll
                for (int off = 1; off < 4; off <<= 1) {   // 16-column sums (4 lanes)
                    hs += __shfl_xor_sync(0xffffffffu, hs, off);
                    ls += __shfl_xor_sync(0xffffffffu, ls, off);
                }
                const float s16 = sx * fmaf((float)ls, 1.0f / XQ_LO, (float)hs);
                hs += __shfl_xor_sync(0xffffffffu, hs, 4);
                ls += __shfl_xor_sync(0xffffffffu, ls, 4);
                if (g < n_groups) {
                    const uint2 codes = make_uint2(pack_s8(hi), pack_s8(lo));
                    if (a.x8_off[XL_PAD32] >= 0)
                        *reinterpret_cast<uint2*>(sm + a.x8_off[XL_PAD32] + i * a.x8_row[XL_PAD32] +
                                                  8 * x8_group<XL_PAD32>(4 * g)) = codes;
                    if (a.x8_off[XL_PAD64] >= 0)
                        *reinterpret_cast<uint2*>(sm + a.x8_off[XL_PAD64] + i * a.x8_row[XL_PAD64] +
                                                  8 * x8_group<XL_PAD64>(4 * g)) = codes;
                    if ((lane & 3) == 0) smf[a.xsum16_off + i * a.xsum16_row + (g >> 2)] = s16;
                    if ((lane & 7) == 0) {
                        smf[a.xsum32_off + i * a.xsum32_row + (g >> 3)] = sx * fmaf((float)ls, 1.0f / XQ_LO, (float)hs);
                        smf[a.xsc_off + i * a.xsc_row + (g >> 3)] = sx;
                    }
                }
            }
        }
    }
}

// The int8 prologue of one CTA: the norm factors, then thread t of the CTA takes groups t, t + n_threads, ...
template <int NX>
__device__ void stage_xq(const GemvArgs& a, uint8_t* sm, float* smf) {
    float scale[NX];
    norm_scales<NX>(a, smf, scale);
    stage_xq_groups<NX>(a, sm, scale, threadIdx.x, blockDim.x);
    __syncthreads();
}

// The staged int8 activations of a pass as one image: bytes [xq_image_lo(n_x), stage_off_bytes) of the layout
// (xsum16 | xsum32 | xsc | codes per layout, gemv_layout; 16-byte aligned at both ends). The pre-pass
// (gemv_xq_image_kernel, gemv.cu) writes it to global memory once per launch; each CTA of the GEMV then copies it
// instead of quantizing x itself (load_xq_image). Gaps (pads) are never read.
__host__ __device__ constexpr int xq_image_lo(int nx) { return scratch_bytes_for(nx); }
constexpr int XIMG_BATCH = 8;   // 16-byte loads in flight per thread

// a.ximg's image into shared memory at the same offsets; ends with a CTA barrier.
__device__ __forceinline__ void load_xq_image(const GemvArgs& a, uint8_t* sm) {
    const int lo = xq_image_lo(a.n_x);
    const int n16 = (a.stage_off_bytes - lo) >> 4;
    const uint4* src = reinterpret_cast<const uint4*>(a.ximg);
    uint4* dst = reinterpret_cast<uint4*>(sm + lo);
    for (int i0 = threadIdx.x; i0 < n16; i0 += XIMG_BATCH * blockDim.x) {
        uint4 v[XIMG_BATCH];
#pragma unroll
        for (int u = 0; u < XIMG_BATCH; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < n16) v[u] = __ldcg(src + i);   // written by the pre-pass: through L2
        }
#pragma unroll
        for (int u = 0; u < XIMG_BATCH; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < n16) dst[i] = v[u];
        }
    }
    __syncthreads();
}

// Activation views for one CTA (values copied out of the kernel parameters with static indices: taking
// the address of a kernel parameter would copy the whole struct to local memory).
struct XViews {
    const float* xs[XL_COUNT];
    int x_row[XL_COUNT];
    const float* xsum16;
    const float* xsum32;
    int xsum16_row, xsum32_row;
    const uint8_t* x8[XL_COUNT];   // int8 activations (XQ kernels), per layout
    int x8_row[XL_COUNT];
    const float* xsc;
    int xsc_row;
};

__device__ __forceinline__ XViews x_views(const GemvArgs& a, const float* smf) {
    XViews v;
#pragma unroll
    for (int L = 0; L < XL_COUNT; ++L) {
        v.xs[L] = smf + (a.x_off_floats[L] >= 0 ? a.x_off_floats[L] : 0);
        v.x_row[L] = a.x_row[L];
    }
    v.xsum16 = smf + (a.xsum16_off >= 0 ? a.xsum16_off : 0);
    v.xsum32 = smf + (a.xsum32_off >= 0 ? a.xsum32_off : 0);
    v.xsum16_row = a.xsum16_row;
    v.xsum32_row = a.xsum32_row;
#pragma unroll
    for (int L = 0; L < XL_COUNT; ++L) {
        v.x8[L] = reinterpret_cast<const uint8_t*>(smf) + (a.x8_off[L] >= 0 ? a.x8_off[L] : 0);
        v.x8_row[L] = a.x8_row[L];
    }
    v.xsc = smf + (a.xsc_off >= 0 ? a.xsc_off : 0);
    v.xsc_row = a.xsc_row;
    return v;
}

}  // namespace
}  // namespace fd
