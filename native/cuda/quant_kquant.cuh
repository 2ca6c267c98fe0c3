// quant_kquant.cuh -- the K-quant GGUF formats as Fmt<QT> (quant_codes.cuh): Q4_K, Q5_K and Q6_K, blocks
// of 256 weights in sub-blocks with 6-bit (Q4_K, Q5_K) or 8-bit (Q6_K) scales, decoded by 4 lanes a block
// (a quarter each); their byte layouts (BlockQ4_K ..., with size and offset checks), the shared K header
// decoder (kquant_params) and each format's code words and column maps.
#pragma once

#include "quant_codes.cuh"

#include <stddef.h>

namespace fd {
namespace q {

// ---- block structs: the GGUF byte layouts (documentation + size checks; decoders index bytes) --------
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };         // 256 weights
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };

static_assert(sizeof(BlockQ4_K) == 144, "Q4_K is 144 bytes / 256 weights");
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K is 176 bytes / 256 weights");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K is 210 bytes / 256 weights");
// byte offsets the decoders below rely on
static_assert(offsetof(BlockQ4_K, qs) == 16, "");
static_assert(offsetof(BlockQ5_K, qh) == 16 && offsetof(BlockQ5_K, qs) == 48, "");
static_assert(offsetof(BlockQ6_K, qh) == 128 && offsetof(BlockQ6_K, scales) == 192 && offsetof(BlockQ6_K, d) == 208, "");

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
// into bytes (shift 0). Its params and column maps are Q4_K's, spelled out again on purpose (quant_codes.cuh,
// "the formats": every Fmt<QT> is one self-contained block).
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

}  // namespace q
}  // namespace fd
