// quant_float.cuh -- the float weight formats as Fmt<QT> (quant_codes.cuh): F32, F16 and BF16, read in
// virtual blocks of 16 bytes (4 / 8 / 8 weights) so they stream and index like the quantized formats;
// the weights are the floats themselves (a = 1, b = -0), masked past the row's last column.
#pragma once

#include "quant_codes.cuh"

namespace fd {
namespace q {

template <> struct Fmt<FD_Q_F32> {
    static constexpr int BE = 4, BB = 16, LPB = 1, RUNS = 1, PARTS = 1, ALIGN = 4, XL = XL_PAD32, MIN_LPR = 8;
    static constexpr bool IS_FLOAT = true;
    struct Raw { uint32_t w[4]; };
    template <bool A16>
    __device__ static void load(const uint8_t* blk, int, Raw& r) { lds_words<A16 ? 16 : ALIGN>(blk, r.w); }
    __device__ static void mask(Raw& r, int n_valid) {
#pragma unroll
        for (int k = 0; k < 4; ++k) r.w[k] = k < n_valid ? r.w[k] : 0u;
    }
    __device__ static void params(const Raw&, int, float* a, float* b) { a[0] = 1.0f; b[0] = -0.0f; }
    __device__ static void floats(const Raw& r, int, float* q) {
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = __uint_as_float(r.w[i]);
    }
    __host__ __device__ static constexpr int col(int, int) { return 0; }
    __host__ __device__ static constexpr int xblk(int blk) { return 4 * blk + 4 * (blk >> 3); }
    __host__ __device__ static constexpr int xlane(int) { return 0; }
    __host__ __device__ static constexpr int xrun(int) { return 0; }
};

// F16 (and BF16 below): F32's load and params again, on purpose (quant_codes.cuh, "the formats": every
// Fmt<QT> is one self-contained block); the mask and the conversion are each format's own.
template <> struct Fmt<FD_Q_F16> {
    static constexpr int BE = 8, BB = 16, LPB = 1, RUNS = 2, PARTS = 1, ALIGN = 2, XL = XL_PAD32, MIN_LPR = 8;
    static constexpr bool IS_FLOAT = true;
    struct Raw { uint32_t w[4]; };
    template <bool A16>
    __device__ static void load(const uint8_t* blk, int, Raw& r) { lds_words<A16 ? 16 : ALIGN>(blk, r.w); }
    __device__ static void mask(Raw& r, int n_valid) {   // element k is half (k & 1) of word k >> 1
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t keep = (2 * k < n_valid ? 0x0000FFFFu : 0u) | (2 * k + 1 < n_valid ? 0xFFFF0000u : 0u);
            r.w[k] &= keep;
        }
    }
    __device__ static void params(const Raw&, int, float* a, float* b) { a[0] = 1.0f; b[0] = -0.0f; }
    __device__ static void floats(const Raw& r, int run, float* q) {
        const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&r.w[2 * run]));
        const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&r.w[2 * run + 1]));
        q[0] = lo.x; q[1] = lo.y; q[2] = hi.x; q[3] = hi.y;
    }
    __host__ __device__ static constexpr int col(int, int run) { return 4 * run; }
    __host__ __device__ static constexpr int xblk(int blk) { return 8 * blk + 4 * (blk >> 2); }
    __host__ __device__ static constexpr int xlane(int) { return 0; }
    __host__ __device__ static constexpr int xrun(int run) { return 4 * run; }
};

template <> struct Fmt<FD_Q_BF16> : Fmt<FD_Q_F16> {
    __device__ static void floats(const Raw& r, int run, float* q) {   // bf16 = the top half of an f32
        const uint32_t lo = r.w[2 * run], hi = r.w[2 * run + 1];
        q[0] = __uint_as_float(lo << 16); q[1] = __uint_as_float(lo & 0xFFFF0000u);
        q[2] = __uint_as_float(hi << 16); q[3] = __uint_as_float(hi & 0xFFFF0000u);
    }
};

}  // namespace q
}  // namespace fd
