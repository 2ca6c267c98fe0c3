// quant_q32.cuh -- the legacy 32-weight GGUF formats as Fmt<QT> (quant_codes.cuh): Q4_0, Q4_1, Q5_0 and
// Q8_0, one block of 32 weights per lane with one f16 scale (and Q4_1's min), their byte layouts
// (BlockQ4_0 ..., with size and offset checks) and how a lane's codes and (a, b) come out of them.
#pragma once

#include "quant_codes.cuh"

#include <stddef.h>

namespace fd {
namespace q {

// ---- block structs: the GGUF byte layouts (documentation + size checks; decoders index bytes) --------
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };                                   // 32 weights
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };

static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 is 18 bytes / 32 weights");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 is 20 bytes / 32 weights");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 is 22 bytes / 32 weights");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 is 34 bytes / 32 weights");
// byte offsets the decoders below rely on
static_assert(offsetof(BlockQ4_1, qs) == 4 && offsetof(BlockQ5_0, qh) == 2 && offsetof(BlockQ5_0, qs) == 6, "");
static_assert(offsetof(BlockQ8_0, qs) == 2, "");

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

// Q4_1: d, m; w = d * nibble + m. code_word / part_shift / part_group are Q4_0's, spelled out again on
// purpose (quant_codes.cuh, "the formats": every Fmt<QT> is one self-contained block).
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

}  // namespace q
}  // namespace fd
