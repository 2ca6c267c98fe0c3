// forward_program.cuh -- the persistent forward's program as the kernel reads it (forward.cu describes the
// design): the limits (rows, warps, the capture mask), the stages (Stage: a GEMV with its GemvArgs and
// shared-memory layout for this row count, or an attention stage), each layer's KV cache and norms
// (LayerKV), and the launch's parameters (FwdParams: buffers, shapes, counters, the ring's place in
// shared memory). forward_plan.cuh builds them on the host; forward_kernel.cuh runs them.
#pragma once

#include "gemv.cuh"
#include "forward_attention.cuh"
#include "forward_rope.cuh"

namespace fd {
namespace {

using namespace fd::q;
using namespace fd::fwd;

constexpr int FWD_MAX_ROWS = 8;
constexpr int FWD_CAPTURE_WORDS = 4;                            // capture bitmask: layers < 128
constexpr int MAX_WARPS = 24;
constexpr int MIN_WARPS = 8;                                    // fewer cannot hide a step's loads
constexpr int ARGMAX_SCRATCH = MAX_WARPS * FWD_MAX_ROWS * 8;   // warps x rows x (value, row)
constexpr int STATIC_SMEM = 64;                                 // the kernel's own __shared__ words

enum StageKind { ST_GEMV = 0, ST_ATTN = 2 };

// warps per CTA by rows: the n_x = 8 SwiGLU step needs up to 168 registers (gemv.cu), the others <= 128
__host__ __device__ constexpr int fwd_warps(int nx) { return nx >= 8 ? 12 : 16; }

struct Stage {
    GemvArgs g;          // ST_GEMV: matrices, x, y, this n's shared-memory layout
    int kind;
    int n_items;         // GEMV: steps; ATTN: n * n_kv * n_htiles * n_splits
    int swiglu, xq;      // GEMV: the step form
    int rot;             // GEMV: warp rotation
    int layer;
    int argmax;          // the LM stage: fused argmax of every row
    int h_layer;         // the layer whose output h holds when this stage starts (QKV of l > 0, LM), else -1
};

struct LayerKV {
    __half* k_cache;
    __half* v_cache;
    const float* q_norm;
    const float* k_norm;
};

struct FwdParams {
    const Stage* stages;
    int n_stages;
    const int* gemv_stage;      // stage index of the k-th GEMV stage
    int n_gemv;
    const LayerKV* layers;
    float *q, *k, *v, *o;       // (n, q_dim), (n, kv_dim) x 2, (n, q_dim)
    const int32_t* positions;   // (n,)
    const int32_t* n_past;      // device scalar
    const uint8_t* mask;        // (mask_n, mask_n) or null
    int mask_n, row0, n;
    float* rope_cs;             // [2][n][rope_dim / 2]
    float* part;                // attention partials
    unsigned* attn_cnt;
    unsigned* counters;         // [n_stages + 1]
    float* am_val;              // [n_ctas][n]
    int* am_idx;
    int32_t* argmax_out;        // (n,) or null
    float* capture;             // [n_layers][max_rows][hidden]: layer outputs asked for by capture_mask
    unsigned capture_mask[FWD_CAPTURE_WORDS];
    unsigned long long* stamps;  // profiling: [n_stages][n_ctas][4] globaltimer ns (reached, began, staged, done), or null
    int hidden, max_rows;
    int n_heads, n_kv, head_dim, group, ht, n_htiles, rope_dim, neox, max_ctx, n_splits;
    double theta;
    RopeScaling rope_scaling;   // linear / YaRN (rope_math.cuh); on = 0: none
    float eps, q_scale;
    int ring_bytes, ring_off, misc_off;     // weight ring per warp (bytes), its and the argmax scratch's offsets
};

}  // namespace
}  // namespace fd
