// gemv_args.cuh -- what a GEMV kernel receives (gemv.cuh): the row and matrix limits, the matrices
// (GemvMat: weights, output, bias, lanes per row, first step) and GemvArgs, which also carries where the
// prologue stages the activations in shared memory (float offsets of each activation layout, of the
// 16- / 32-column sums and of the int8 codes and scales; -1: not staged) and the stage buffers' size.
// gemv_plan() fills it on the host; gemv_stage.cuh and gemv_dot.cuh read it on the device.
#pragma once

#include "quant.cuh"

namespace fd {
namespace {

using namespace fd::q;

constexpr int MAX_MATS = 4;
constexpr int MAX_NX = 8;
// warps per CTA: n_x = 1 kernels fit 85 registers per thread, so an SM holds 24 warps of them;
// the others take up to 128 registers (16 warps), swiglu with 8 rows up to 168 (12 warps)
__host__ __device__ constexpr int max_warps_for(int nx, bool swiglu) { return nx == 1 ? 24 : (swiglu && nx >= 8) ? 12 : 16; }
constexpr int STAGE_TARGET_BYTES = 6 * 1024;  // a step's staged bytes: 16 warps x 2 buffers fit with x
constexpr int NORM_LANES = 256;               // fixed partition of the RMSNorm sums (row invariance)
// norm_scales' partial sums at the start of shared memory: NORM_LANES floats per x row of a pass
__host__ __device__ constexpr int scratch_bytes_for(int nx) { return NORM_LANES * nx * 4; }
constexpr int MIN_CTA_WARPS = 8;              // threads to share the prologue

struct GemvMat {
    const uint8_t* w;
    float* y;                 // (n_x, rows)
    const float* bias;        // (rows,) or NULL
    int64_t row_bytes;
    int qtype, rows;
    int lpr;                  // lanes per row; G = 32 / lpr rows per step
    int pieces;               // pieces per row
    int first_step;           // steps of earlier matrices
    int aligned16;            // float formats: every row 16-byte aligned (LDS.128 loads)
    // Split rows (fd_tuning_t.gemv_split_cols; lpr 32, one matrix, int8 activations): each row is computed by a pair of
    // warps, slice 0 over blocks [0, h), slice 1 over [h, blocks); 0: not split. split_pieces = h x lanes per block,
    // split_bytes = h x block bytes (where slice 1 starts in a row).
    int split_pieces, split_bytes;
};

struct GemvArgs {
    GemvMat mat[MAX_MATS];    // swiglu: mat[0] = gate (y), mat[1] = up
    int n_mats, n_steps;
    const float* x;           // (n_x, cols) of this pass
    const float* norm_w;      // (cols,) or NULL
    const float* residual;    // (n_x, rows) of mat[0] or NULL
    float eps;
    int cols, n_x;
    int x_off_floats[XL_COUNT];      // float offset of each layout's staged rows (xn * 2^X_SCALE_LOG2), -1 if unused
    int x_row[XL_COUNT];      // floats per staged row in that layout
    int xsum16_off, xsum32_off;   // sums of xn over 16 / 32 consecutive columns (n_x rows each), -1 if unused
    int xsum16_row, xsum32_row;
    int stage_off_bytes;            // byte offset of the warp stage buffers (16-aligned)
    int stage_bytes;          // one buffer; a warp owns n_bufs
    int n_bufs;               // 2: double-buffered steps; 1: every warp has a single step
    int range_bytes;          // swiglu: the up rows start range_bytes into a buffer
    // int8 activations (XQ kernels): byte offset / bytes per row of the codes, float offset / floats
    // per row of the 32-column block scales; xsum16 / xsum32 then hold sums of the quantized values
    int x8_off[XL_COUNT], x8_row[XL_COUNT];   // per activation layout (-1: unused)
    int xsc_off, xsc_row;
    int evict_first;          // weights staged with the L2 evict-first hint (fd_tuning_t.weights_evict_first)
    const uint8_t* ximg;      // XQ kernels: the pre-pass's image of the staged activations (gemv_stage.cuh load_xq_image;
                              // fd_tuning_t.gemv_xq_prepass_cols), copied instead of quantizing x in every CTA; NULL: quantize
};

// The matrix that step s belongs to (static indices only: no local-memory copy of the params).
__device__ __forceinline__ GemvMat mat_of_step(const GemvArgs& a, int s) {
    GemvMat m = a.mat[0];
#pragma unroll
    for (int k = 1; k < MAX_MATS; ++k)
        if (k < a.n_mats && s >= a.mat[k].first_step) m = a.mat[k];
    return m;
}

}  // namespace
}  // namespace fd
