// quant.cuh -- GGUF weight formats on the device: block layouts, the per-lane piece decoders shared by
// dequant.cu (dequantize, embed) and gemv.cu (decode projections), and the warp-level staging of
// weight bytes into shared memory.
//
// Semantics: gguf-py's gguf/quants.py (dequantize_blocks of Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K,
// and Q4_K.get_scale_min for the 6-bit K scales) is the definition. Every weight is
// w = a * (code - OFFSET) + b with a small unsigned code, a = d (or d * sub-block scale) and b = -0
// (or -dmin * min, or +m); a * (code - OFFSET) is exact in float32 (at most 24 significant bits:
// f16 d (11) x 6/8-bit scale x 6-bit code), so the one rounding of fmaf(a, q, b) is numpy's rounding
// of a*q + b: decode_run reproduces gguf's float32 values bit for bit (dequant, embed).
//
// How a row is read (gemv, dequant and embed alike):
//   1. Staging: a warp copies whole row ranges of quantized bytes into its own shared-memory buffer
//      with 16-byte cp.async (src rounded down to 16 bytes, last chunk zero-filled), so every format
//      -- also those whose blocks are only 2-byte aligned (Q4_0 18 B, Q5_0 22 B, Q8_0 34 B,
//      Q6_K 210 B) -- is fetched with full-width coalesced loads. Byte b of the range lies at
//      buf + (src & 15) + b: shared addresses keep the global alignment modulo 16.
//   2. Decoding: a block is split into LPB "pieces", one per lane (32-weight formats: a whole block
//      per lane; K formats: a quarter). A lane loads its piece's words from shared memory (LDS.128
//      for 16-aligned formats, funnel shifts of aligned words for 2-aligned ones), decodes the
//      header into per-part (a, b), and yields "runs": words holding 4 consecutive columns' codes.
//   3. Codes to floats: exact_codes (dequant) puts a code byte into the mantissa of 2^23 with one
//      PRMT and subtracts 2^23 + OFFSET. scaled_codes (gemv) needs one AND per code: a bit pattern
//      below 2^24 read as float32 is exactly pattern * 2^-149, so the masked code is an exact float
//      times a power of two fixed by its byte position; gemv multiplies it with x * 2^80 (staged) in
//      a non-flush-to-zero FMA and rescales once per part, and applies OFFSET and b through sums of
//      x over the part's 16 or 32 columns. That is ~1 integer op + 1 FMA per weight.
//
// Activation (x) layouts in shared memory: the lanes of a quarter-warp read float4s of x at the
// columns of their pieces in one instruction; a float4 of padding per 32 (XL_PAD32: 32-weight and
// float formats, whose lanes read consecutive blocks) or per 64 columns (XL_PAD64: K formats, lanes
// 64 columns apart) puts those 8 addresses in distinct bank quads (Q6_K: 2-way), and keeps each
// lane's address affine in its block index (register + immediate per run).
// tests/emulation/test_quant_layouts.py emulates exactly these per-lane indices and the arithmetic.
#pragma once

#include "common.cuh"

#include <stddef.h>

namespace fd {
namespace q {

// ---- block structs: the GGUF byte layouts (documentation + size checks; decoders index bytes) --------
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };                                   // 32 weights
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };         // 256 weights
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };

static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 is 18 bytes / 32 weights");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 is 20 bytes / 32 weights");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 is 22 bytes / 32 weights");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 is 34 bytes / 32 weights");
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K is 144 bytes / 256 weights");
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K is 176 bytes / 256 weights");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K is 210 bytes / 256 weights");
// byte offsets the decoders below rely on
static_assert(offsetof(BlockQ4_1, qs) == 4 && offsetof(BlockQ5_0, qh) == 2 && offsetof(BlockQ5_0, qs) == 6, "");
static_assert(offsetof(BlockQ8_0, qs) == 2 && offsetof(BlockQ4_K, qs) == 16, "");
static_assert(offsetof(BlockQ5_K, qh) == 16 && offsetof(BlockQ5_K, qs) == 48, "");
static_assert(offsetof(BlockQ6_K, qh) == 128 && offsetof(BlockQ6_K, scales) == 192 && offsetof(BlockQ6_K, d) == 208, "");

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

// The 32-weight formats: one lane per block (LPB 1) so the lane's scale and zero point cover all
// its 32 weights; runs r = 0..7 are columns 4r..4r+3; x layout PAD32.
struct Block32 {
    static constexpr int BE = 32, LPB = 1, RUNS = 8, XL = XL_PAD32, MIN_LPR = 4;
    static constexpr bool IS_FLOAT = false;
    __host__ __device__ static constexpr int col(int, int run) { return 4 * run; }
    __host__ __device__ static constexpr int xblk(int blk) { return 36 * blk; }
    __host__ __device__ static constexpr int xlane(int) { return 0; }
    __host__ __device__ static constexpr int xrun(int run) { return 4 * run; }
};

// Q4_0: d; qs[i] holds element i (low nibble) and i + 16 (high nibble); w = d * (nibble - 8).
// Part 0 = runs 0..3 (low nibbles of qs words 0..3), part 1 = runs 4..7 (high nibbles, shift 4).
template <> struct Fmt<FD_Q_Q4_0> : Block32 {
    static constexpr int BB = 18, PARTS = 2, ALIGN = 2, PART_COLS = 16, OFFSET = 8;
    static constexpr uint32_t CODE_MASK = 0xF;
    struct Raw { float d; uint32_t qs[4]; };
    template <bool>
    __device__ static void load(const uint8_t* blk, int, Raw& r) { lds_words<ALIGN>(blk + 2, r.qs); r.d = f16_at(blk); }
    __device__ static void params(const Raw& r, int, float* a, float* b) { a[0] = a[1] = r.d; b[0] = b[1] = -0.0f; }
    __device__ static uint32_t code_word(const Raw& r, int, int run) { return r.qs[run & 3]; }
    __host__ __device__ static constexpr int part_shift(int part) { return 4 * part; }
    __host__ __device__ static constexpr int part_group(int blk, int, int part) { return 2 * blk + part; }
};

// Q4_1: d, m; w = d * nibble + m.
template <> struct Fmt<FD_Q_Q4_1> : Block32 {
    static constexpr int BB = 20, PARTS = 2, ALIGN = 4, PART_COLS = 16, OFFSET = 0;
    static constexpr uint32_t CODE_MASK = 0xF;
    struct Raw { float d, m; uint32_t qs[4]; };
    template <bool>
    __device__ static void load(const uint8_t* blk, int, Raw& r) {
        uint32_t dm[1];
        lds_words<ALIGN>(blk, dm);
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&dm[0]));
        r.d = f.x; r.m = f.y;
        lds_words<ALIGN>(blk + 4, r.qs);
    }
    __device__ static void params(const Raw& r, int, float* a, float* b) { a[0] = a[1] = r.d; b[0] = b[1] = r.m; }
    __device__ static uint32_t code_word(const Raw& r, int, int run) { return r.qs[run & 3]; }
    __host__ __device__ static constexpr int part_shift(int part) { return 4 * part; }
    __host__ __device__ static constexpr int part_group(int blk, int, int part) { return 2 * blk + part; }
};

// Q5_0: d, qh (bit i = 5th bit of element i), qs as Q4_0; w = d * ((nibble | bit << 4) - 16).
// Codes are merged into bytes (shift 0): run r = columns 4r.. uses qh bits 4r..4r+3.
template <> struct Fmt<FD_Q_Q5_0> : Block32 {
    static constexpr int BB = 22, PARTS = 1, ALIGN = 2, PART_COLS = 32, OFFSET = 16;
    static constexpr uint32_t CODE_MASK = 0x1F;
    struct Raw { float d; uint32_t qh; uint32_t qs[4]; };
    template <bool>
    __device__ static void load(const uint8_t* blk, int, Raw& r) {
        uint32_t h[1];
        lds_words<ALIGN>(blk + 2, h);
        lds_words<ALIGN>(blk + 6, r.qs);
        r.qh = h[0];
        r.d = f16_at(blk);
    }
    __device__ static void params(const Raw& r, int, float* a, float* b) { a[0] = r.d; b[0] = -0.0f; }
    __device__ static uint32_t code_word(const Raw& r, int, int run) {
        const uint32_t nib = (run >= 4 ? r.qs[run & 3] >> 4 : r.qs[run & 3]) & 0x0F0F0F0Fu;
        return nib | spread4_to_bit4((r.qh >> (4 * run)) & 0xFu);
    }
    __host__ __device__ static constexpr int part_shift(int) { return 0; }
    __host__ __device__ static constexpr int part_group(int blk, int, int) { return blk; }
};

// Q8_0: d, 32 int8; signed bytes become unsigned codes q + 128 (flip the sign bits), OFFSET 128.
template <> struct Fmt<FD_Q_Q8_0> : Block32 {
    static constexpr int BB = 34, PARTS = 1, ALIGN = 2, PART_COLS = 32, OFFSET = 128;
    static constexpr uint32_t CODE_MASK = 0xFF;
    struct Raw { float d; uint32_t qs[8]; };
    template <bool>
    __device__ static void load(const uint8_t* blk, int, Raw& r) { lds_words<ALIGN>(blk + 2, r.qs); r.d = f16_at(blk); }
    __device__ static void params(const Raw& r, int, float* a, float* b) { a[0] = r.d; b[0] = -0.0f; }
    __device__ static uint32_t code_word(const Raw& r, int, int run) { return r.qs[run] ^ 0x80808080u; }
    __host__ __device__ static constexpr int part_shift(int) { return 0; }
    __host__ __device__ static constexpr int part_group(int blk, int, int) { return blk; }
};

// K-quant header (Q4_K, Q5_K): words h[0] = d | dmin << 16 (f16), h[1..3] = the 12 scale bytes.
// Lane c (0..3) owns sub-blocks 2c (low nibbles of qs[32c .. 32c+31]) and 2c+1 (high nibbles); its
// 6-bit (scale, min) pairs are Q4_K.get_scale_min's entries 2c and 2c+1:
//   c < 2:  sc = bytes 2c, 2c+1 of scales[0..3] & 63,  mn = same of scales[4..7] & 63
//   c >= 2: sc = (scales[8+k] & 15) | (scales[k] >> 6) << 4, mn = (scales[8+k] >> 4) | (scales[4+k] >> 6) << 4,
//           k = 2c-4, 2c-3
// computed branch-free (c is lane-constant but lanes of a warp differ). w = a * q + b, a = d * sc,
// b = -dmin * mn (both exact products).
__device__ __forceinline__ void kquant_params(const uint32_t (&h)[4], int c, float* a, float* b) {
    const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&h[0]));
    const bool hi = c >= 2;
    const uint32_t sh = 16u * (uint32_t)(c & 1);
    const uint32_t mask_lo = hi ? 0x0F0Fu : 0x3F3Fu, mask_hi = hi ? 0x3030u : 0u;
    const uint32_t sc = (((hi ? h[3] : h[1]) >> sh) & mask_lo) | ((h[1] >> (sh + 2)) & mask_hi);
    const uint32_t mn = (((hi ? h[3] >> 4 : h[2]) >> sh) & mask_lo) | ((h[2] >> (sh + 2)) & mask_hi);
    a[0] = dd.x * (float)(sc & 0xFFu);
    a[1] = dd.x * (float)(sc >> 8);
    b[0] = -(dd.y * (float)(mn & 0xFFu));
    b[1] = -(dd.y * (float)(mn >> 8));
}

// Q4_K: 8 sub-blocks of 32. Lane c: part 0 = runs 0..7 = columns 64c + 4k (low nibbles of qs word k
// of its 32 bytes), part 1 = runs 8..15 = columns 64c + 32 + 4k (high nibbles: shift 4).
template <> struct Fmt<FD_Q_Q4_K> {
    static constexpr int BE = 256, BB = 144, LPB = 4, RUNS = 16, PARTS = 2, ALIGN = 16, XL = XL_PAD64, MIN_LPR = 4;
    static constexpr int PART_COLS = 32, OFFSET = 0;
    static constexpr uint32_t CODE_MASK = 0xF;
    static constexpr bool IS_FLOAT = false;
    struct Raw { uint32_t h[4]; uint32_t qs[8]; };
    template <bool>
    __device__ static void load(const uint8_t* blk, int c, Raw& r) {
        lds_words<ALIGN>(blk, r.h);
        lds_words<ALIGN>(blk + 16 + 32 * c, r.qs);
    }
    __device__ static void params(const Raw& r, int c, float* a, float* b) { kquant_params(r.h, c, a, b); }
    __device__ static uint32_t code_word(const Raw& r, int, int run) { return r.qs[run & 7]; }
    __host__ __device__ static constexpr int part_shift(int part) { return 4 * part; }
    __host__ __device__ static constexpr int part_group(int blk, int c, int part) { return 8 * blk + 2 * c + part; }
    __host__ __device__ static constexpr int col(int c, int run) { return 64 * c + 32 * (run >> 3) + 4 * (run & 7); }
    __host__ __device__ static constexpr int xblk(int blk) { return 272 * blk; }
    __host__ __device__ static constexpr int xlane(int c) { return 68 * c; }
    __host__ __device__ static constexpr int xrun(int run) { return 32 * (run >> 3) + 4 * (run & 7); }
};

// Q5_K: as Q4_K plus qh[32]: bit s of qh[l] is the 5th bit of element l of sub-block s; codes merged
// into bytes (shift 0).
template <> struct Fmt<FD_Q_Q5_K> {
    static constexpr int BE = 256, BB = 176, LPB = 4, RUNS = 16, PARTS = 2, ALIGN = 16, XL = XL_PAD64, MIN_LPR = 4;
    static constexpr int PART_COLS = 32, OFFSET = 0;
    static constexpr uint32_t CODE_MASK = 0x1F;
    static constexpr bool IS_FLOAT = false;
    struct Raw { uint32_t h[4]; uint32_t qh[8]; uint32_t qs[8]; };
    template <bool>
    __device__ static void load(const uint8_t* blk, int c, Raw& r) {
        lds_words<ALIGN>(blk, r.h);
        lds_words<ALIGN>(blk + 16, r.qh);
        lds_words<ALIGN>(blk + 48 + 32 * c, r.qs);
    }
    __device__ static void params(const Raw& r, int c, float* a, float* b) { kquant_params(r.h, c, a, b); }
    __device__ static uint32_t code_word(const Raw& r, int c, int run) {
        const int k = run & 7, s = run >> 3;
        const uint32_t nib = (s ? r.qs[k] >> 4 : r.qs[k]) & 0x0F0F0F0Fu;
        return nib | (((r.qh[k] >> (2 * c + s)) & 0x01010101u) << 4);
    }
    __host__ __device__ static constexpr int part_shift(int) { return 0; }
    __host__ __device__ static constexpr int part_group(int blk, int c, int part) { return 8 * blk + 2 * c + part; }
    __host__ __device__ static constexpr int col(int c, int run) { return 64 * c + 32 * (run >> 3) + 4 * (run & 7); }
    __host__ __device__ static constexpr int xblk(int blk) { return 272 * blk; }
    __host__ __device__ static constexpr int xlane(int c) { return 68 * c; }
    __host__ __device__ static constexpr int xrun(int run) { return 32 * (run >> 3) + 4 * (run & 7); }
};

// Q6_K: element e = 128H + 32g + l (H half, g quarter, l < 32): low 4 bits = nibble (g >> 1) of
// ql[64H + 32(g & 1) + l], high 2 bits = bits 2g of qh[32H + l]; w = d * scales[e / 16] * (q - 32).
// Lane j: H = j >> 1, lh = j & 1 takes l = 16lh .. 16lh+15 of every g: runs r = 4g + k, columns
// 128H + 32g + 16lh + 4k; part g = the 16 columns of sub-block 8H + 2g + lh. Codes merged (shift 0).
template <> struct Fmt<FD_Q_Q6_K> {
    static constexpr int BE = 256, BB = 210, LPB = 4, RUNS = 16, PARTS = 4, ALIGN = 2, XL = XL_PAD64, MIN_LPR = 4;
    static constexpr int PART_COLS = 16, OFFSET = 32;
    static constexpr uint32_t CODE_MASK = 0x3F;
    static constexpr bool IS_FLOAT = false;
    struct Raw { uint32_t ql0[4]; uint32_t ql1[4]; uint32_t qh[4]; uint32_t sc[2]; float d; };
    template <bool>
    __device__ static void load(const uint8_t* blk, int j, Raw& r) {
        const int H = j >> 1, lh = j & 1;
        lds_words<ALIGN>(blk + 64 * H + 16 * lh, r.ql0);
        lds_words<ALIGN>(blk + 64 * H + 32 + 16 * lh, r.ql1);
        lds_words<ALIGN>(blk + 128 + 32 * H + 16 * lh, r.qh);
        lds_words<ALIGN>(blk + 192 + 8 * H, r.sc);
        r.d = f16_at(blk + 208);
    }
    __device__ static void params(const Raw& r, int j, float* a, float* b) {
        const int lh = j & 1;
#pragma unroll
        for (int g = 0; g < 4; ++g) {   // scale byte lh + 2g of the 8 at 192 + 8H, as int8
            const uint32_t w = r.sc[g >> 1];
            const int s = (int32_t)(w << (24 - 8 * (lh + 2 * (g & 1)))) >> 24;
            a[g] = r.d * (float)s;
            b[g] = -0.0f;
        }
    }
    __device__ static uint32_t code_word(const Raw& r, int, int run) {
        const int g = run >> 2, k = run & 3;
        const uint32_t l = (g & 1) ? r.ql1[k] : r.ql0[k];
        const uint32_t nib = ((g >> 1) ? l >> 4 : l) & 0x0F0F0F0Fu;
        return nib | (((r.qh[k] >> (2 * g)) & 0x03030303u) << 4);
    }
    __host__ __device__ static constexpr int part_shift(int) { return 0; }
    __host__ __device__ static constexpr int part_group(int blk, int j, int part) { return 16 * blk + 8 * (j >> 1) + 2 * part + (j & 1); }
    __host__ __device__ static constexpr int col(int j, int run) {
        return 128 * (j >> 1) + 32 * (run >> 2) + 16 * (j & 1) + 4 * (run & 3);
    }
    __host__ __device__ static constexpr int xblk(int blk) { return 272 * blk; }
    __host__ __device__ static constexpr int xlane(int j) { return 136 * (j >> 1) + 16 * (j & 1); }
    __host__ __device__ static constexpr int xrun(int run) { return 32 * (run >> 2) + 4 * (run >> 3) + 4 * (run & 3); }
};

// Exact decode of run `run` of a piece (dequant/embed): the 4 weights, bit-equal to gguf's float32.
template <int QT>
__device__ __forceinline__ void decode_run(const typename Fmt<QT>::Raw& raw, int j, int run, const float* a,
                                           const float* b, float* w) {
    using F = Fmt<QT>;
    constexpr int RPP = F::RUNS / F::PARTS;
    const int part = run / RPP;
    if constexpr (F::IS_FLOAT) {
        F::floats(raw, run, w);
    } else {
        float q[4];
        exact_codes<F::CODE_MASK>(F::code_word(raw, j, run), F::part_shift(part), (float)F::OFFSET, q);
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = fmaf(a[part], q[i], b[part]);   // exact: a*q has <= 24 bits
    }
}

// ---- host-side format facts (launch planning) ----------------------------------------------------------
struct FmtInfo { int block_elems, block_bytes, lanes_per_block, layout, align, min_lpr; bool is_float; };

template <int QT>
constexpr FmtInfo fmt_info_of() {
    return FmtInfo{Fmt<QT>::BE, Fmt<QT>::BB, Fmt<QT>::LPB, Fmt<QT>::XL, Fmt<QT>::ALIGN, Fmt<QT>::MIN_LPR,
                   Fmt<QT>::IS_FLOAT};
}

// false for a GGML type id no kernel here supports
inline bool fmt_info(int qtype, FmtInfo* out) {
    switch (qtype) {
        case FD_Q_F32: *out = fmt_info_of<FD_Q_F32>(); return true;
        case FD_Q_F16: *out = fmt_info_of<FD_Q_F16>(); return true;
        case FD_Q_BF16: *out = fmt_info_of<FD_Q_BF16>(); return true;
        case FD_Q_Q4_0: *out = fmt_info_of<FD_Q_Q4_0>(); return true;
        case FD_Q_Q4_1: *out = fmt_info_of<FD_Q_Q4_1>(); return true;
        case FD_Q_Q5_0: *out = fmt_info_of<FD_Q_Q5_0>(); return true;
        case FD_Q_Q8_0: *out = fmt_info_of<FD_Q_Q8_0>(); return true;
        case FD_Q_Q4_K: *out = fmt_info_of<FD_Q_Q4_K>(); return true;
        case FD_Q_Q5_K: *out = fmt_info_of<FD_Q_Q5_K>(); return true;
        case FD_Q_Q6_K: *out = fmt_info_of<FD_Q_Q6_K>(); return true;
        default: return false;
    }
}

// bytes of one row of `cols` elements (cols % block_elems == 0 for block formats)
inline int64_t row_bytes(const FmtInfo& f, int64_t cols) {
    return f.is_float ? cols * (f.block_bytes / f.block_elems) : cols / f.block_elems * f.block_bytes;
}

// Calls fn.template operator()<QT>() for the runtime qtype (one of the ten above).
template <class Fn>
__device__ __forceinline__ void dispatch_qtype(int qtype, Fn& fn) {
    switch (qtype) {
        case FD_Q_F32: fn.template run<FD_Q_F32>(); break;
        case FD_Q_F16: fn.template run<FD_Q_F16>(); break;
        case FD_Q_BF16: fn.template run<FD_Q_BF16>(); break;
        case FD_Q_Q4_0: fn.template run<FD_Q_Q4_0>(); break;
        case FD_Q_Q4_1: fn.template run<FD_Q_Q4_1>(); break;
        case FD_Q_Q5_0: fn.template run<FD_Q_Q5_0>(); break;
        case FD_Q_Q8_0: fn.template run<FD_Q_Q8_0>(); break;
        case FD_Q_Q4_K: fn.template run<FD_Q_Q4_K>(); break;
        case FD_Q_Q5_K: fn.template run<FD_Q_Q5_K>(); break;
        case FD_Q_Q6_K: fn.template run<FD_Q_Q6_K>(); break;
        default: break;
    }
}

// ---- staging: global -> shared with 16-byte cp.async ---------------------------------------------------
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src, int src_bytes) {
#if FD_HAS_MMA
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes));
#else
    uint4 v = make_uint4(0, 0, 0, 0);
    if (src_bytes == 16) v = *reinterpret_cast<const uint4*>(gmem_src);
    else for (int i = 0; i < src_bytes; ++i) reinterpret_cast<uint8_t*>(&v)[i] = reinterpret_cast<const uint8_t*>(gmem_src)[i];
    *reinterpret_cast<uint4*>(smem_dst) = v;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if FD_HAS_MMA
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if FD_HAS_MMA
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// The warp copies bytes [src, src + n_bytes) to dst (16-aligned shared), byte b landing at
// dst + (src & 15) + b; returns that first byte's shared address. The first chunk starts at src
// rounded down to 16 (bytes of the same 16-byte granule, inside the allocation); the last is
// zero-filled past src + n_bytes. Needs (src & 15) + n_bytes + 16 bytes of room at dst.
__device__ __forceinline__ const uint8_t* warp_stage(uint8_t* dst, const uint8_t* src, int64_t n_bytes, int lane) {
    const uintptr_t s = reinterpret_cast<uintptr_t>(src);
    const int head = (int)(s & 15);
    const uint8_t* a0 = src - head;
    const int64_t total = head + n_bytes;
    const int n_chunks = (int)((total + 15) >> 4);
    for (int ch = lane; ch < n_chunks; ch += 32) {
        const int64_t left = total - 16 * (int64_t)ch;
        cp_async16(dst + 16 * ch, a0 + 16 * (int64_t)ch, left >= 16 ? 16 : (int)left);
    }
    return dst + head;
}

// bytes of a stage range holding n_bytes staged from any alignment, plus the funnel-read slack
__host__ __device__ constexpr int64_t stage_range_bytes(int64_t n_bytes) { return ((15 + n_bytes + 15) & ~int64_t(15)) + 16; }

}  // namespace q
}  // namespace fd
