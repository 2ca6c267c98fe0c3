// gemv_stage.cuh -- the GEMV prologue: each CTA stages its x rows (n_x <= 8, (n_x, cols) f32 in global
// memory) in shared memory before the steps run (gemv.cuh). stage_x: xn = x * RMSNorm factor * norm_w as
// float xn * 2^X_SCALE_LOG2 in each activation layout the matrices' formats read (quant_codes.cuh x_phys),
// plus sums of xn per 16 and 32 columns. stage_xq: the int8 form (two codes per column and a scale per
// 32-column block; the XQ kernels, launches whose matrices are all quantized). Both share norm_scales,
// whose fixed partition of the RMSNorm sums keeps every row's result independent of n_x and of the CTA
// shape (row invariance). x_views then reads the staged pieces' addresses out of GemvArgs.
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

// rint(t) for |t| < 2^22 without a conversion instruction (F2I runs at a quarter of the float rate): adding
// 1.5 * 2^23 rounds t to an integer in round-to-nearest-even, as __float2int_rn does, and leaves it in the low
// mantissa bits. __fadd_rn keeps the compiler from contracting the add into the product that made t.
constexpr float XQ_MAGIC = 12582912.0f;                // 1.5 * 2^23
constexpr int XQ_MAGIC_BITS = 0x4B400000;              // its bit pattern
__device__ __forceinline__ int rint_magic(float t) { return __float_as_int(__fadd_rn(t, XQ_MAGIC)) - XQ_MAGIC_BITS; }
// (float)n for |n| < 2^22, exactly, without I2F
__device__ __forceinline__ float int_to_float_magic(int n) { return __fsub_rn(__int_as_float(n + XQ_MAGIC_BITS), XQ_MAGIC); }

// The low bytes of four ints (two's-complement int8 codes) in one word, v[0] lowest.
__device__ __forceinline__ uint32_t pack_s8(const int (&v)[4]) {
    return __byte_perm(__byte_perm(v[0], v[1], 0x0040), __byte_perm(v[2], v[3], 0x0040), 0x5410);
}

// Thread t of the CTA takes groups t, t + n_threads, ... (float4 loads: 8 lanes = one 32-column block,
// so block maxima and sums are 8-lane shuffles). cols % 32 == 0, x and norm_w 16-byte aligned.
// XQ_BATCH float4 loads of x (and of norm_w) in flight per thread: 4 x 768 threads cover 12288 columns
// per round at 32 registers. The batch's groups go through each phase together (xn and block maxima, the
// maxima's shuffles, the codes, the sums' shuffles), so their shuffle chains overlap instead of running one
// group after another. A batch runs as xq_groups<U> with U the warp's count of live groups (a branch around
// each shuffle would cost a convergence barrier a shuffle; four groups for a warp that owns one would cost
// 4x). The hi and lo code sums travel packed in one int (hi * 2^16 + lo: |lo sums| <= 8 * 4 * 127 < 2^15, so
// the packed sums are exact): half the shuffles. rint is rint_magic (no F2I). Every value is the one the
// group-at-a-time form computed: the same float operations in the same order, integer sums exact (GEMV
// outputs bitwise equal, results/2026-11-26-h100-session16-stage-xq-ab.md).
constexpr int XQ_BATCH = 4;

// U groups of this thread (g0 + u * n_threads, u < U; U is the warp's count of live groups, so no lane runs a
// shuffle for a group that no lane of its warp owns), every x row.
template <int NX, int U>
__device__ __forceinline__ void xq_groups(const GemvArgs& a, uint8_t* sm, float* smf, const float (&scale)[NX], int g0) {
    const int n_threads = blockDim.x, lane = threadIdx.x & 31;
    const int n_groups = a.cols >> 2, n_x = a.n_x;
    const float4* x4 = reinterpret_cast<const float4*>(a.x);
    const float4* nw4 = reinterpret_cast<const float4*>(a.norm_w);
    float4 nw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int g = g0 + u * n_threads;
        nw[u] = (nw4 && g < n_groups) ? __ldg(nw4 + g) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    }
#pragma unroll
    for (int i = 0; i < NX; ++i) {
        if (i >= n_x) break;
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int g = g0 + u * n_threads;
            v[u] = g < n_groups ? load_act4(x4 + (int64_t)i * n_groups + g) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        // phase 1: xn and each group's |max|, then the 32-column block maxima (8-lane shuffles)
        float xn[U][4], mx[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            xn[u][0] = v[u].x * scale[i] * nw[u].x;
            xn[u][1] = v[u].y * scale[i] * nw[u].y;
            xn[u][2] = v[u].z * scale[i] * nw[u].z;
            xn[u][3] = v[u].w * scale[i] * nw[u].w;
            mx[u] = fmaxf(fmaxf(fabsf(xn[u][0]), fabsf(xn[u][1])), fmaxf(fabsf(xn[u][2]), fabsf(xn[u][3])));
        }
#pragma unroll
        for (int off = 1; off < 8; off <<= 1) {
#pragma unroll
            for (int u = 0; u < U; ++u) mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], off));
        }
        // phase 2: the codes, t = xn * 127 / max: hi = rint(t), lo = rint((t - hi) * XQ_LO)
        float sx[U];
        int hi[U][4], lo[U][4], hl[U], hl16[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const float inv = mx[u] > 0.0f ? 127.0f / mx[u] : 0.0f;
            sx[u] = mx[u] * (1.0f / 127.0f);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const float t = xn[u][k] * inv;
                hi[u][k] = rint_magic(t);
                lo[u][k] = rint_magic(__fmul_rn(__fsub_rn(t, int_to_float_magic(hi[u][k])), XQ_LO));
            }
            hl[u] = (hi[u][0] + hi[u][1] + hi[u][2] + hi[u][3]) * 65536 + (lo[u][0] + lo[u][1] + lo[u][2] + lo[u][3]);
        }
        // phase 3: 16-column sums (4 lanes), then 32-column sums (8 lanes), of the packed hi / lo sums
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
#pragma unroll
            for (int u = 0; u < U; ++u) hl[u] += __shfl_xor_sync(0xffffffffu, hl[u], off);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            hl16[u] = hl[u];
            hl[u] += __shfl_xor_sync(0xffffffffu, hl[u], 4);
        }
        // phase 4: stores (int8 codes per layout, the block's sums and scale)
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int g = g0 + u * n_threads;
            if (g >= n_groups) continue;
            const int ls16 = (int)(int16_t)(hl16[u] & 0xFFFF), hs16 = (hl16[u] - ls16) >> 16;
            const int ls = (int)(int16_t)(hl[u] & 0xFFFF), hs = (hl[u] - ls) >> 16;
            const uint2 codes = make_uint2(pack_s8(hi[u]), pack_s8(lo[u]));
            if (a.x8_off[XL_PAD32] >= 0)
                *reinterpret_cast<uint2*>(sm + a.x8_off[XL_PAD32] + i * a.x8_row[XL_PAD32] +
                                          8 * x8_group<XL_PAD32>(4 * g)) = codes;
            if (a.x8_off[XL_PAD64] >= 0)
                *reinterpret_cast<uint2*>(sm + a.x8_off[XL_PAD64] + i * a.x8_row[XL_PAD64] +
                                          8 * x8_group<XL_PAD64>(4 * g)) = codes;
            if ((lane & 3) == 0)
                smf[a.xsum16_off + i * a.xsum16_row + (g >> 2)] =
                    sx[u] * fmaf(int_to_float_magic(ls16), 1.0f / XQ_LO, int_to_float_magic(hs16));
            if ((lane & 7) == 0) {
                smf[a.xsum32_off + i * a.xsum32_row + (g >> 3)] =
                    sx[u] * fmaf(int_to_float_magic(ls), 1.0f / XQ_LO, int_to_float_magic(hs));
                smf[a.xsc_off + i * a.xsc_row + (g >> 3)] = sx[u];
            }
        }
    }
}

template <int NX>
__device__ void stage_xq(const GemvArgs& a, uint8_t* sm, float* smf) {
    const int tid = threadIdx.x, n_threads = blockDim.x, lane = tid & 31;
    const int n_groups = a.cols >> 2;
    float scale[NX];
    norm_scales<NX>(a, smf, scale);
    for (int g0 = tid; g0 - lane < n_groups; g0 += XQ_BATCH * n_threads) {
        // groups of the batch that some lane of this warp owns (warp-uniform)
        const int n_live = min(XQ_BATCH, (n_groups - (g0 - lane) + n_threads - 1) / n_threads);
        static_assert(XQ_BATCH == 4, "the switch below lists every count");
        switch (n_live) {
            case 4: xq_groups<NX, 4>(a, sm, smf, scale, g0); break;
            case 3: xq_groups<NX, 3>(a, sm, smf, scale, g0); break;
            case 2: xq_groups<NX, 2>(a, sm, smf, scale, g0); break;
            default: xq_groups<NX, 1>(a, sm, smf, scale, g0); break;
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
