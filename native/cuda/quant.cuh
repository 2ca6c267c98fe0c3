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
// Files: quant_codes.cuh (x layouts, shared-memory word loads, codes to floats, the Fmt<QT> interface),
// quant_float.cuh (F32, F16, BF16), quant_q32.cuh (Q4_0, Q4_1, Q5_0, Q8_0), quant_kquant.cuh (Q4_K,
// Q5_K, Q6_K), quant_stage.cuh (global -> shared staging); this file holds what runs on any format: the
// exact decode of a run (dequant, embed), the host-side format facts and the run-time qtype dispatch.
#pragma once

#include "quant_codes.cuh"
#include "quant_float.cuh"
#include "quant_q32.cuh"
#include "quant_kquant.cuh"
#include "quant_stage.cuh"

namespace fd {
namespace q {

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

}  // namespace q
}  // namespace fd
