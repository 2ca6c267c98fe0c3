// quant_codes.cuh -- what every GGUF format's device decoder is built from (quant.cuh): the activation
// (x) layouts in shared memory, word loads from shared memory at a format's alignment, the conversions of
// code bytes to floats (exact_codes for dequant, scaled_codes for gemv) and the Fmt<QT> interface that
// quant_float.cuh, quant_q32.cuh and quant_kquant.cuh specialise.
//
// Activation (x) layouts in shared memory: the lanes of a quarter-warp read float4s of x at the
// columns of their pieces in one instruction; a float4 of padding per 32 (XL_PAD32: 32-weight and
// float formats, whose lanes read consecutive blocks) or per 64 columns (XL_PAD64: K formats, lanes
// 64 columns apart) puts those 8 addresses in distinct bank quads (Q6_K: 2-way), and keeps each
// lane's address affine in its block index (register + immediate per run).
// tests/emulation/test_quant_layouts.py emulates exactly these per-lane indices and the arithmetic.
#pragma once

#include "common.cuh"

namespace fd {
namespace q {

// ---- activation layouts in shared memory ---------------------------------------------------------------
// A float4 of padding per 32 (PAD32) or 64 (PAD64) columns: lanes that read the same run of
// consecutive blocks (32-blocks, virtual float blocks) or of the 4 lanes of a K block land in
// distinct bank quads, and each lane's address stays base + k * step + (compile-time run offset).
enum XLayout { XL_PAD32 = 0, XL_PAD64 = 1, XL_COUNT = 2 };

__host__ __device__ constexpr int x_phys(int layout, int e) {
    return layout == XL_PAD64 ? e + 4 * (e >> 6) : e + 4 * (e >> 5);
}
// floats per staged x row: cols rounded up to 64 (zero-filled) plus padding
__host__ __device__ constexpr int x_row_floats(int layout, int cols) {
    return layout == XL_PAD64 ? ((cols + 63) & ~63) + ((cols + 63) & ~63) / 16 : ((cols + 63) & ~63) + ((cols + 63) & ~63) / 8;
}

// ---- shared-memory word loads at a format's guaranteed alignment ---------------------------------------
// N 32-bit little-endian words starting at byte address p. ALIGN 16: LDS.128; 4: LDS.32; 2: the
// aligned words around the range and a funnel shift (reads up to 4 bytes past the range: stage
// buffers carry 16 bytes of padding).
template <int ALIGN, int N>
__device__ __forceinline__ void lds_words(const uint8_t* p, uint32_t (&w)[N]) {
    if constexpr (ALIGN >= 16 && N % 4 == 0) {
#pragma unroll
        for (int k = 0; k < N / 4; ++k) {
            const uint4 v = reinterpret_cast<const uint4*>(p)[k];
            w[4 * k] = v.x; w[4 * k + 1] = v.y; w[4 * k + 2] = v.z; w[4 * k + 3] = v.w;
        }
    } else if constexpr (ALIGN >= 4) {
#pragma unroll
        for (int k = 0; k < N; ++k) w[k] = reinterpret_cast<const uint32_t*>(p)[k];
    } else {
        const uint32_t mis = (uint32_t)(reinterpret_cast<uintptr_t>(p) & 3);
        // pointer arithmetic (not an integer round trip) keeps p's address space: LDS, not generic LD
        const uint32_t* base = reinterpret_cast<const uint32_t*>(p - mis);
        const uint32_t shift = mis * 8;
        uint32_t t[N + 1];
#pragma unroll
        for (int k = 0; k <= N; ++k) t[k] = base[k];
#pragma unroll
        for (int k = 0; k < N; ++k) w[k] = __funnelshift_r(t[k], t[k + 1], shift);
    }
}

__device__ __forceinline__ float f16_at(const uint8_t* p) {   // p 2-byte aligned
    return __half2float(*reinterpret_cast<const __half*>(p));
}

constexpr float MAGIC = 8388608.0f;   // 2^23

// ---- codes to floats -----------------------------------------------------------------------------------
// A run's 4 codes sit in a word w at bits [8i + shift, 8i + shift + bits) (mask = 2^bits - 1).
//
// exact_codes (dequant): code_i - offset as exact floats: PRMT the byte into the mantissa of 2^23
// (0x4B0000cc), subtract 2^23 + offset.
template <uint32_t MASK>
__device__ __forceinline__ void exact_codes(uint32_t w, int shift, float offset, float* q) {
    const uint32_t c = (w >> shift) & (MASK * 0x01010101u);
#pragma unroll
    for (int i = 0; i < 4; ++i)
        q[i] = __uint_as_float(__byte_perm(c, 0x4B000000u, 0x7650u | (uint32_t)i)) - (MAGIC + offset);
}

// scaled_codes (gemv): one AND per code. A bit pattern below 2^24 read as a float32 is exactly
// pattern * 2^-149 (subnormal, or the first normal binade), so w & (mask << (8i + shift)) is
// code_i * 2^(8i + shift - 149); byte 3 is first moved to bits 16..23. v[i] = code_i * 2^(class_i
// + shift - 149) with class = 0, 8, 16, 16. gemv multiplies these by x * 2^X_SCALE_LOG2 with a
// non-flush-to-zero FMA and rescales each class once per part: no magic subtraction per weight.
constexpr int X_SCALE_LOG2 = 80;   // staged activations are x * 2^80: codes * x land in normal range
template <uint32_t MASK>
__device__ __forceinline__ void scaled_codes(uint32_t w, int shift, float* v) {
    const uint32_t m = MASK << shift;
    v[0] = __uint_as_float(w & m);
    v[1] = __uint_as_float(w & (m << 8));
    v[2] = __uint_as_float(w & (m << 16));
    v[3] = __uint_as_float((w >> 8) & (m << 16));
}
// 2^e as a float, e in [-126, 127] (constant-folds for constant e)
__host__ __device__ constexpr uint32_t exp2i_bits(int e) { return (uint32_t)(127 + e) << 23; }
__device__ __forceinline__ float exp2i(int e) { return __uint_as_float(exp2i_bits(e)); }
// the factor that turns a class accumulator (codes of class c, shift s, times x * 2^X_SCALE_LOG2)
// into sum(code * x)
__device__ __forceinline__ float class_scale(int cls, int shift) { return exp2i(149 - 8 * cls - shift - X_SCALE_LOG2); }

// a*b + c and a*b with subnormal inputs kept (the library builds with -ftz)
__device__ __forceinline__ float fma_keep_subnormal(float a, float b, float c) {
#if FD_HAS_MMA
    float d;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
    return d;
#else
    return __builtin_fmaf(a, b, c);
#endif
}
__device__ __forceinline__ float mul_keep_subnormal(float a, float b) {
#if FD_HAS_MMA
    float d;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
#else
    return a * b;
#endif
}

// 4 bits (x & 0xF) spread to bit 4 of each byte: bit i -> bit 8i + 4 (x * 0x02040810 places copies of
// x at shifts 4, 11, 18, 25; bit i of the copy at 4 + 7i lands on 8i + 4; the copies do not overlap)
__device__ __forceinline__ uint32_t spread4_to_bit4(uint32_t x) { return (x * 0x02040810u) & 0x10101010u; }

// ---- the formats ---------------------------------------------------------------------------------------
// Each Fmt<QT> describes how lane j (0 <= j < LPB) of a block decodes its piece:
//   BE, BB       elements and bytes per block (F32/F16/BF16: a virtual block of 16 bytes)
//   LPB          pieces (lanes) per block; RUNS runs of 4 columns per piece, in PARTS parts that share
//                (a, b) and a code shift; runs of part p are p*RUNS/PARTS .. (p+1)*RUNS/PARTS-1
//   ALIGN        alignment of every block given a 16-aligned tensor base (rows inherit it)
//   Quant formats: w = a * (code - OFFSET) + b, code = (code_word(run) >> (8i + shift)) & CODE_MASK,
//                shift = part_shift(part); a part covers PART_COLS consecutive columns starting at
//                column PART_COLS * part_group(blk, j, part) (gemv's per-group sums of x).
//   Float formats: floats(run) are the weights; a = 1, b = -0.
//   XL           activation layout; x offset of run r of lane j in block blk is
//                xblk(blk) + xlane(j) + xrun(r) == x_phys(XL, blk*BE + col(j, r)), and
//                xblk(blk + step) == xblk(blk) + xblk(step) for gemv's block steps (LPR / LPB, LPR >= MIN_LPR)
//   load/params: Raw words from shared memory -> (a, b) per part.
// b = -0.0f where gguf adds nothing: a*q + (-0) == a*q for every a*q including -0 (dequant exactness).
// Each specialization spells out all its maps even where two formats agree (Q4_K and Q5_K share
// col/xblk/xlane/xrun): one self-contained block per layout, read against that layout's comment and
// checked by tests/emulation/test_quant_layouts.py -- repeated on purpose.
template <int QT> struct Fmt;

}  // namespace q
}  // namespace fd
