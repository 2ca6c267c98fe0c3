// forward.cu -- the persistent forward (fd_forward_*): every layer of a dense GQA decoder (llama, qwen2,
// qwen3) over n <= 8 rows -- a decode step, or a chain / tree of draft tokens under a mask -- in ONE
// launch, from the embedded rows to the logits (and each row's argmax).
//
// The program. A plan (fd_forward_create) turns the model into a list of stages, per layer
//     QKV     y = [Wq; Wk; Wv] rmsnorm(h) (+ bias)            GEMV, 3 matrices sharing one input
//     ATTN    q/k per-head norm (qwen3) and rope, this launch's K/V into the cache, split-K attention
//             over the cache; the last split of a row combines          (forward_attention.cuh)
//     O       h += Wo o                                       GEMV + residual
//     GU      act = silu(Wg rmsnorm(h)) * (Wu rmsnorm(h))     GEMV, SwiGLU pair
//     DOWN    h += Wd act                                     GEMV + residual
// and, after the last layer, LM: logits = Wout rmsnorm(h) with every row's argmax fused. GEMV stages run
// gemv.cuh's steps (a step = G consecutive rows of one matrix), so their rows are the same bits as
// fd_gemv's for the same lanes per row.
//
// The schedule. One CTA per SM (the grid is resident: the plan checks occupancy), W warps each. Every CTA
// walks the stages in order. A stage's items are dealt round-robin: GEMV step s goes to CTA s % n_ctas,
// warp (s / n_ctas + rot) % W (rot spreads consecutive stages over different warps); ATTN
// item i goes to CTA i % n_ctas as a whole. Dependencies are counters in device memory: a CTA arrives at
// stage k when its items of stage k are done (__syncthreads, then thread 0 fences and increments
// counters[k]); a CTA with items in stage k first waits until counters[k - 1] == n_ctas. A CTA without
// items in a stage arrives at once. Since every stage has an item somewhere, counters[k] == n_ctas implies
// every earlier stage is complete too (induction), so no stage reads a buffer a later stage writes.
// The last CTA to finish (a final counter) reduces the argmax partials and zeroes every counter for
// the next launch. tests/emulation/test_forward_schedule.py emulates this protocol for many shapes and SM counts.
//
// The weight ring. Weights do not depend on activations, so each warp streams ITS steps of every GEMV
// stage, in order, through a private byte ring of shared memory with 16-byte cp.async -- across stage
// boundaries: while a CTA waits for a counter or stages x, the next stages' weights keep arriving. The
// first steps are issued before griddepcontrol.wait (while the embedding kernel finishes); after each
// step's compute the warp issues every next step that fits (Ring below).
//
// Shared memory: [x area: the widest of the GEMV stages' staged activations (gemv_layout) and the
// attention item's q tile / key list / group states][argmax scratch][W rings of ring_bytes].
//
// Row invariance: a row's GEMV arithmetic is per row (gemv.cuh), its attention reduction order depends on
// its key sequence and the plan's n_splits only (forward_attention.cuh), rope is elementwise: a tree
// node's logits are bitwise a one-row forward's at its position (tests/gpu/test_forward.py).
#include "gemv.cuh"
#include "forward_attention.cuh"
#include "forward_rope.cuh"

#include <vector>

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

// ---- the dependency protocol -------------------------------------------------------------------------
__device__ __forceinline__ unsigned long long global_ns() {
#if FD_HAS_MMA
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#else
    return 0;   // HIP: no globaltimer; fd_forward_profile refuses to turn stamps on (FD_E_UNSUPPORTED)
#endif
}

// profiling: thread 0 of each CTA stamps (when it reached stage k, began its work, finished it)
__device__ __forceinline__ void stamp(const FwdParams& P, int k, int what) {
    if (P.stamps != nullptr && threadIdx.x == 0) P.stamps[((size_t)k * gridDim.x + blockIdx.x) * 4 + what] = global_ns();
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
#elif defined(__HIP_DEVICE_COMPILE__)
    return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
#else
    return *(volatile const unsigned*)p;
#endif
}

__device__ __forceinline__ void red_release(unsigned* p, unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
#else
    __threadfence();
    atomicAdd(p, v);
#endif
}

// The grid barrier's two halves (the pattern of CUTLASS's GenericBarrier): the CTA's threads meet at a
// __syncthreads, then thread 0 publishes with a release reduction / observes with acquire loads, which the
// next __syncthreads extends to the whole CTA. No full fence: thread 0's warp has weight copies in flight,
// and a fence would wait for them.
// every thread of the CTA returns once counters[k] == n_ctas
__device__ __forceinline__ void wait_stage(const FwdParams& P, int k) {
    if (k < 0) return;
    if (threadIdx.x == 0) {
        const unsigned* c = P.counters + k;
        while (ld_acquire(c) < gridDim.x) {
        }
    }
    __syncthreads();
}

__device__ __forceinline__ void arrive_stage(const FwdParams& P, int k) {
    __syncthreads();                 // every thread's writes of this stage happen-before thread 0's release
    if (threadIdx.x == 0) red_release(P.counters + k, 1u);
}

// ---- the weight ring ---------------------------------------------------------------------------------
// Warp-private, ring_bytes of shared memory. Entries are this warp's GEMV steps in (stage, step) order,
// each stage_bytes long (its stage's), placed at increasing virtual offsets: an entry that would straddle
// the end of the ring starts at the next multiple of ring_bytes instead (ring_place). An entry is issued
// once it fits behind the oldest unconsumed one and fewer than RING_MAX_INFLIGHT are in flight (an empty
// ring starts again at offset 0, where any entry fits); each is
// one cp.async commit group, so "the oldest has landed" is wait_group(in flight - 1). The consumer
// re-derives each entry's place with the same rule (tests/emulation/test_forward_schedule.py emulates it).
constexpr int RING_MAX_INFLIGHT = 8;

struct Ring {
    uint8_t* base;
    int gs, step;        // issue cursor: GEMV stage ordinal, step (gs == n_gemv: nothing left)
    int issued, consumed;
    int head;            // virtual offset just past the last issued entry
    int tail;            // virtual offset just past the last consumed entry
};

__host__ __device__ constexpr int ring_place(int off, int bytes, int ring_bytes) {
    return off % ring_bytes + bytes <= ring_bytes ? off : off - off % ring_bytes + ring_bytes;
}

// this warp's first step in a GEMV stage (>= n_items: none)
__device__ __forceinline__ int first_step(const Stage& S, int warp, int n_warps) {
    const int v = ((warp - S.rot) % n_warps + n_warps) % n_warps;
    return v * gridDim.x + blockIdx.x;
}

__device__ __forceinline__ void ring_seek(const FwdParams& P, Ring& r, int n_warps) {
    const int warp = threadIdx.x >> 5;
    while (r.gs < P.n_gemv) {
        const Stage& S = P.stages[P.gemv_stage[r.gs]];
        if (r.step < 0) r.step = first_step(S, warp, n_warps);
        if (r.step < S.n_items) return;
        ++r.gs;
        r.step = -1;
    }
}

// issue every next entry that fits (warp-uniform)
__device__ __forceinline__ void ring_fill(const FwdParams& P, Ring& r, int n_warps, int lane) {
    while (r.issued - r.consumed < RING_MAX_INFLIGHT) {
        if (r.issued == r.consumed) r.head = r.tail = 0;   // empty: restart at the front (any entry fits)
        ring_seek(P, r, n_warps);
        if (r.gs >= P.n_gemv) return;
        const Stage& S = P.stages[P.gemv_stage[r.gs]];
        const int at = ring_place(r.head, S.g.stage_bytes, P.ring_bytes);
        if (at + S.g.stage_bytes - r.tail > P.ring_bytes) return;     // would overwrite an unconsumed entry
        uint8_t* dst = r.base + at % P.ring_bytes;
        if (S.swiglu) issue_step<true>(S.g, r.step, dst, lane);
        else issue_step<false>(S.g, r.step, dst, lane);
        cp_async_commit();
        r.head = at + S.g.stage_bytes;
        r.step += gridDim.x * n_warps;
        ++r.issued;
    }
}

// wait for the oldest entry (of stage_bytes) to land; returns its shared-memory address
__device__ __forceinline__ const uint8_t* ring_front(const FwdParams& P, Ring& r, int stage_bytes) {
    switch (r.issued - r.consumed - 1) {        // groups committed after the oldest
        case 0: cp_async_wait<0>(); break;
        case 1: cp_async_wait<1>(); break;
        case 2: cp_async_wait<2>(); break;
        case 3: cp_async_wait<3>(); break;
        case 4: cp_async_wait<4>(); break;
        case 5: cp_async_wait<5>(); break;
        case 6: cp_async_wait<6>(); break;
        default: cp_async_wait<7>(); break;
    }
    __syncwarp();
    return r.base + ring_place(r.tail, stage_bytes, P.ring_bytes) % P.ring_bytes;
}

__device__ __forceinline__ void ring_pop(const FwdParams& P, Ring& r, int stage_bytes) {
    r.tail = ring_place(r.tail, stage_bytes, P.ring_bytes) + stage_bytes;
    ++r.consumed;
}

// ---- stages ------------------------------------------------------------------------------------------
template <int NX, bool SWIGLU, bool XQ>
__device__ __forceinline__ void gemv_steps(const FwdParams& P, const Stage& S, Ring& ring, uint8_t* smem, int n_warps,
                                           ArgmaxTrack<NX>* track) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const XViews xv = x_views(S.g, reinterpret_cast<const float*>(smem));
    const int bytes = S.g.stage_bytes;
    const int stride = gridDim.x * n_warps;
    for (int s = first_step(S, warp, n_warps); s < S.n_items; s += stride) {
        const uint8_t* buf = ring_front(P, ring, bytes);
        compute_step<NX, SWIGLU, XQ>(S.g, s, buf, xv, lane, track);
        __syncwarp();                    // every lane is done with the entry before it is refilled
        ring_pop(P, ring, bytes);
        // refill now only if this stage has more of this warp's steps to stream; after the last one the
        // refill waits until the CTA has arrived (forward_kernel), off the stage's critical path
        if (s + stride < S.n_items) ring_fill(P, ring, n_warps, lane);
    }
}

template <int NX>
__device__ void gemv_stage(const FwdParams& P, int k, const Stage& S, Ring& ring, uint8_t* smem, int n_warps,
                           ArgmaxTrack<NX>* track) {
    float* smf = reinterpret_cast<float*>(smem);
    if (S.xq) stage_xq<NX>(S.g, smem, smf);
    else stage_x<NX>(S.g, smf);
    stamp(P, k, 2);
    if (S.xq) {
        if (S.swiglu) gemv_steps<NX, true, true>(P, S, ring, smem, n_warps, track);
        else gemv_steps<NX, false, true>(P, S, ring, smem, n_warps, track);
    } else {
        if (S.swiglu) gemv_steps<NX, true, false>(P, S, ring, smem, n_warps, track);
        else gemv_steps<NX, false, false>(P, S, ring, smem, n_warps, track);
    }
}

// The CTA's best (value, row) per x row of the lm_head into am_val / am_idx[cta][i]
template <int NX>
__device__ void argmax_partial(const FwdParams& P, ArgmaxTrack<NX>& tr, uint8_t* smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    float* sv = reinterpret_cast<float*>(smem + P.misc_off);
    int* si = reinterpret_cast<int*>(sv + MAX_WARPS * FWD_MAX_ROWS);
#pragma unroll
    for (int i = 0; i < NX; ++i) {
        float v = tr.v[i];
        int r = tr.r[i];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, off);
            const int orow = __shfl_xor_sync(0xffffffffu, r, off);
            if (ov > v || (ov == v && orow < r)) { v = ov; r = orow; }
        }
        if (lane == 0) { sv[warp * FWD_MAX_ROWS + i] = v; si[warp * FWD_MAX_ROWS + i] = r; }
    }
    __syncthreads();
    if (threadIdx.x < P.n) {
        const int i = threadIdx.x;
        float v = -INFINITY;
        int r = 0x7fffffff;
        for (int w = 0; w < n_warps; ++w) {
            const float ov = sv[w * FWD_MAX_ROWS + i];
            const int orow = si[w * FWD_MAX_ROWS + i];
            if (ov > v || (ov == v && orow < r)) { v = ov; r = orow; }
        }
        P.am_val[blockIdx.x * FWD_MAX_ROWS + i] = v;
        P.am_idx[blockIdx.x * FWD_MAX_ROWS + i] = r;
    }
}

// ---- the kernel ----------------------------------------------------------------------------------------
template <int NX>
__global__ void __launch_bounds__(fwd_warps(NX) * 32, 1) forward_kernel(const FwdParams P) {
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int cta = blockIdx.x, n_ctas = gridDim.x;

    Ring ring{smem + P.ring_off + (size_t)warp * P.ring_bytes, 0, -1, 0, 0, 0, 0};
    ring_fill(P, ring, n_warps, lane);       // weights only: issued before the wait
    pdl_wait();                      // h (the embedded rows) comes from the previous kernel
    // (no pdl_launch_dependents: a dependent kernel's blocks resident early could take the room a CTA of
    // this grid still needs, and the resident CTAs would wait for it forever)
    rope_table(P.rope_cs, P.positions, P.n, P.rope_dim, P.theta, P.rope_scaling, cta * blockDim.x + threadIdx.x,
               n_ctas * blockDim.x);

    ArgmaxTrack<NX> track;
    track.init();
    bool argmax_stage = false;
    for (int k = 0; k < P.n_stages; ++k) {
        const Stage& S = P.stages[k];
        const int kind = S.kind, n_items = S.n_items;
        stamp(P, k, 0);
        if (kind == ST_GEMV) {
            // a CTA has steps iff some warp's first step exists: cta < n_items
            if (cta < n_items) {
                wait_stage(P, k - 1);
                stamp(P, k, 1);
                const int hl = S.h_layer;
                if (hl >= 0 && (P.capture_mask[hl >> 5] >> (hl & 31) & 1u)) {   // the layer's output rows, kept
                    const int n_el = P.n * P.hidden, stride = min(n_items, n_ctas) * blockDim.x;
                    float* dst = P.capture + (size_t)hl * P.max_rows * P.hidden;
                    for (int e = cta * blockDim.x + threadIdx.x; e < n_el; e += stride) dst[e] = __ldcg(S.g.x + e);
                }
                gemv_stage<NX>(P, k, S, ring, smem, n_warps, S.argmax ? &track : nullptr);
            }
            if (S.argmax) argmax_stage = true;
        } else {   // ST_ATTN
            if (cta < n_items) {
                wait_stage(P, k - 1);
                stamp(P, k, 1);
                stamp(P, k, 2);
                const LayerKV kv = P.layers[S.layer];
                AttnArgs aa{P.q, P.k, P.v, kv.q_norm, kv.k_norm,
                            RopeShape{P.rope_cs, P.n, P.head_dim, P.rope_dim, P.neox, P.eps},
                            kv.k_cache, kv.v_cache, P.o, P.part, P.attn_cnt, P.n_past, P.mask, P.mask_n, P.row0,
                            P.n_heads, P.n_kv, P.group, P.ht, P.n_htiles, P.max_ctx, P.n_splits, P.q_scale};
                float* sm = reinterpret_cast<float*>(smem);
                for (int it = cta; it < n_items; it += n_ctas) {
                    switch (P.head_dim) {
                        case 64: attention_item<64>(aa, it, sm); break;
                        case 128: attention_item<128>(aa, it, sm); break;
                        default: attention_item<256>(aa, it, sm); break;
                    }
                }
            }
        }
        arrive_stage(P, k);
        stamp(P, k, 3);
        ring_fill(P, ring, n_warps, lane);   // the steps of later stages, while the next wait runs
    }
    cp_async_wait<0>();

    // the end: argmax partials, then the last CTA reduces them and resets the counters
    if (argmax_stage && P.argmax_out != nullptr) argmax_partial<NX>(P, track, smem);
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(P.counters + P.n_stages, 1u) == (unsigned)(n_ctas - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (argmax_stage && P.argmax_out != nullptr && threadIdx.x < P.n) {
        const int i = threadIdx.x;
        float v = -INFINITY;
        int r = 0x7fffffff;
        for (int c = 0; c < n_ctas; ++c) {
            const float ov = __ldcg(P.am_val + c * FWD_MAX_ROWS + i);
            const int orow = __ldcg(P.am_idx + c * FWD_MAX_ROWS + i);
            if (ov > v || (ov == v && orow < r)) { v = ov; r = orow; }
        }
        P.argmax_out[i] = r == 0x7fffffff ? 0 : r;
    }
    for (int k = threadIdx.x; k <= P.n_stages; k += blockDim.x) P.counters[k] = 0u;
}

// ---- host side: the plan -------------------------------------------------------------------------------
template <int NX>
int configure(int n_warps, int smem, int* max_blocks) {
    cudaError_t err = cudaFuncSetAttribute(forward_kernel<NX>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(max_blocks, forward_kernel<NX>, n_warps * 32, smem);
    return (int)err;
}

int configure_nx(int nx, int n_warps, int smem, int* max_blocks) {
    switch (nx) {
        case 1: return configure<1>(n_warps, smem, max_blocks);
        case 2: return configure<2>(n_warps, smem, max_blocks);
        case 3: return configure<3>(n_warps, smem, max_blocks);
        case 4: return configure<4>(n_warps, smem, max_blocks);
        case 5: return configure<5>(n_warps, smem, max_blocks);
        case 6: return configure<6>(n_warps, smem, max_blocks);
        case 7: return configure<7>(n_warps, smem, max_blocks);
        case 8: return configure<8>(n_warps, smem, max_blocks);
        default: return FD_E_ARG;
    }
}

int launch_nx(int nx, const FwdParams& p, int ctas, int n_warps, size_t smem, cudaStream_t stream) {
    const dim3 grid(ctas), block(n_warps * 32);
    switch (nx) {
        case 1: return launch_pdl(forward_kernel<1>, grid, block, smem, stream, p);
        case 2: return launch_pdl(forward_kernel<2>, grid, block, smem, stream, p);
        case 3: return launch_pdl(forward_kernel<3>, grid, block, smem, stream, p);
        case 4: return launch_pdl(forward_kernel<4>, grid, block, smem, stream, p);
        case 5: return launch_pdl(forward_kernel<5>, grid, block, smem, stream, p);
        case 6: return launch_pdl(forward_kernel<6>, grid, block, smem, stream, p);
        case 7: return launch_pdl(forward_kernel<7>, grid, block, smem, stream, p);
        case 8: return launch_pdl(forward_kernel<8>, grid, block, smem, stream, p);
        default: return FD_E_ARG;
    }
}

}  // namespace
}  // namespace fd


// ---- host side: the plan ------------------------------------------------------------------------------
namespace fd {
namespace {

struct ForwardPlan {
    // model shape
    int n_layers, hidden, n_heads, n_kv, head_dim, ffn, vocab, rope_dim, neox, max_ctx, group, ht, n_htiles;
    double theta;
    RopeScaling rope_scaling;
    float eps;
    // schedule
    int max_rows, n_ctas, n_splits, n_stages, n_gemv, max_step_bytes;
    int n_warps[FWD_MAX_ROWS + 1];
    int ring_bytes[FWD_MAX_ROWS + 1], ring_off[FWD_MAX_ROWS + 1], misc_off[FWD_MAX_ROWS + 1], smem[FWD_MAX_ROWS + 1];
    Stage* d_stages[FWD_MAX_ROWS + 1];
    int* d_gemv_stage;
    LayerKV* d_layers;
    uint8_t* d_ws;
    float *h, *q, *k, *v, *o, *act, *logits, *rope_cs, *part, *am_val, *capture;
    unsigned long long* stamps;
    bool profile;
    int* am_idx;
    unsigned *attn_cnt, *counters;
};

void free_plan(ForwardPlan* p) {
    if (!p) return;
    for (int n = 0; n <= FWD_MAX_ROWS; ++n) if (p->d_stages[n]) cudaFree(p->d_stages[n]);
    if (p->d_gemv_stage) cudaFree(p->d_gemv_stage);
    if (p->d_layers) cudaFree(p->d_layers);
    if (p->d_ws) cudaFree(p->d_ws);
    delete p;
}

// Carves the workspace: returns the byte size for ws = nullptr, else sets the plan's pointers.
size_t carve(ForwardPlan* p, uint8_t* ws, int rows) {
    size_t off = 0;
    auto take = [&](size_t bytes) -> uint8_t* {
        uint8_t* at = ws ? ws + off : nullptr;
        off += (bytes + 255) & ~size_t(255);
        return at;
    };
    const size_t f = sizeof(float), qd = (size_t)p->n_heads * p->head_dim, kvd = (size_t)p->n_kv * p->head_dim;
    p->h = (float*)take(rows * p->hidden * f);
    p->q = (float*)take(rows * qd * f);
    p->k = (float*)take(rows * kvd * f);
    p->v = (float*)take(rows * kvd * f);
    p->o = (float*)take(rows * qd * f);
    p->act = (float*)take(rows * (size_t)p->ffn * f);
    p->logits = (float*)take(rows * (size_t)p->vocab * f);
    p->rope_cs = (float*)take(2 * rows * (size_t)(p->rope_dim / 2) * f);
    p->part = (float*)take(rows * qd / p->head_dim * p->n_splits * (p->head_dim + 2) * f);
    p->am_val = (float*)take((size_t)p->n_ctas * FWD_MAX_ROWS * f);
    p->am_idx = (int*)take((size_t)p->n_ctas * FWD_MAX_ROWS * sizeof(int));
    p->attn_cnt = (unsigned*)take((size_t)rows * p->n_kv * p->n_htiles * sizeof(unsigned));
    p->counters = (unsigned*)take((size_t)(p->n_stages + 1) * sizeof(unsigned));
    p->capture = (float*)take((size_t)p->n_layers * rows * p->hidden * f);
    p->stamps = (unsigned long long*)take((size_t)(p->n_stages) * p->n_ctas * 4 * sizeof(unsigned long long));
    return off;
}

// the stages of a forward over nx rows; x area bytes (the widest stage's shared memory) into *xarea
int build_stages(const ForwardPlan* p, const fd_forward_model_t* m, const fd_forward_tuning_t* t, int nx, int n_warps,
                 int n_sms, std::vector<Stage>* out, int* xarea) {
    std::vector<Stage>& st = *out;
    st.clear();
    int area = 0;
    const int attn = p->head_dim == 64 ? fa_smem_bytes<64>(p->ht)
                   : p->head_dim == 128 ? fa_smem_bytes<128>(p->ht) : fa_smem_bytes<256>(p->ht);
    area = std::max(area, attn);
    int rot = 0;
    auto add_gemv = [&](int layer, int n_mats, const MatIn* mats, bool swiglu, int cols, const float* x,
                        const float* norm_w, const float* residual, bool argmax) -> int {
        GemvPlan pl;
        if (int s = gemv_plan(n_mats, mats, swiglu, cols, x, norm_w, m->rms_eps, nx, true, t->step_bytes,
                              p->n_ctas * n_warps, &pl))
            return s;
        Stage s{};
        s.g = pl.a;
        s.g.x = x;
        s.g.residual = residual;
        s.g.n_bufs = 1;
        area = std::max(area, gemv_layout(pl, nx, &s.g));
        s.kind = ST_GEMV;
        s.n_items = s.g.n_steps;
        s.swiglu = swiglu;
        s.xq = pl.xq;
        s.rot = rot;
        s.layer = layer;
        s.argmax = argmax;
        s.h_layer = -1;
        rot = (rot + ceil_div(s.n_items, p->n_ctas)) % n_warps;
        st.push_back(s);
        return 0;
    };
    const int qd = p->n_heads * p->head_dim, kvd = p->n_kv * p->head_dim;
    for (int l = 0; l < p->n_layers; ++l) {
        const fd_layer_weights_t& L = m->layers[l];
        const MatIn qkv[3] = {{L.attn_q, p->q, L.bias_q, L.qtype_q, qd}, {L.attn_k, p->k, L.bias_k, L.qtype_k, kvd},
                              {L.attn_v, p->v, L.bias_v, L.qtype_v, kvd}};
        if (int s = add_gemv(l, 3, qkv, false, p->hidden, p->h, L.attn_norm, nullptr, false)) return s;
        st.back().h_layer = l - 1;
        Stage a{};
        a.h_layer = -1;
        a.kind = ST_ATTN;
        a.n_items = nx * p->n_kv * p->n_htiles * p->n_splits;
        a.layer = l;
        st.push_back(a);
        const MatIn o[1] = {{L.attn_output, p->h, nullptr, L.qtype_output, p->hidden}};
        if (int s = add_gemv(l, 1, o, false, qd, p->o, nullptr, p->h, false)) return s;
        const MatIn gu[2] = {{L.ffn_gate, p->act, nullptr, L.qtype_gate, p->ffn}, {L.ffn_up, p->act, nullptr, L.qtype_up, p->ffn}};
        if (int s = add_gemv(l, 2, gu, true, p->hidden, p->h, L.ffn_norm, nullptr, false)) return s;
        const MatIn d[1] = {{L.ffn_down, p->h, nullptr, L.qtype_down, p->hidden}};
        if (int s = add_gemv(l, 1, d, false, p->ffn, p->act, nullptr, p->h, false)) return s;
    }
    const MatIn lm[1] = {{m->output, p->logits, nullptr, m->qtype_output, p->vocab}};
    if (int s = add_gemv(p->n_layers, 1, lm, false, p->hidden, p->h, m->output_norm, nullptr, true)) return s;
    st.back().h_layer = p->n_layers - 1;
    *xarea = (area + 15) & ~15;
    return 0;
}

int create_plan(const fd_forward_model_t* m, const fd_forward_tuning_t* t, ForwardPlan** out) {
    FD_CHECK_ARG(m && t && out && m->layers && m->output && m->output_norm);
    FD_CHECK_ARG(m->n_layers >= 1 && m->n_layers <= 32 * FWD_CAPTURE_WORDS && m->hidden >= 1 && m->n_heads >= 1 && m->n_kv_heads >= 1 && m->ffn >= 1);
    FD_CHECK_ARG(m->vocab >= 1 && m->max_ctx >= 1 && m->n_heads % m->n_kv_heads == 0 && m->rms_eps >= 0.0f);
    FD_CHECK_ARG(t->max_rows >= 1 && t->max_rows <= FWD_MAX_ROWS && t->step_bytes >= 256 && t->ring_min_steps >= 1);
    FD_CHECK_ARG(t->attn_splits >= 1 && t->n_ctas >= 0);
    if (m->head_dim != 64 && m->head_dim != 128 && m->head_dim != 256) return FD_E_SHAPE;
    if (m->rope_dim < 2 || m->rope_dim % 2 || m->rope_dim > m->head_dim) return FD_E_SHAPE;
    FD_CHECK_ARG(rope_scaling_valid(m->rope_scaling));
    for (int l = 0; l < m->n_layers; ++l)
        FD_CHECK_ARG(m->layers[l].k_cache && m->layers[l].v_cache && m->layers[l].attn_norm && m->layers[l].ffn_norm);
    DeviceFacts dev;
    if (int s = device_facts(&dev)) return s;

    ForwardPlan* p = new ForwardPlan{};
    p->n_layers = m->n_layers; p->hidden = m->hidden; p->n_heads = m->n_heads; p->n_kv = m->n_kv_heads;
    p->head_dim = m->head_dim; p->ffn = m->ffn; p->vocab = m->vocab; p->rope_dim = m->rope_dim;
    p->neox = m->rope_neox != 0; p->max_ctx = m->max_ctx; p->theta = m->rope_theta; p->eps = m->rms_eps;
    p->rope_scaling = rope_scaling_from(m->rope_scaling);
    p->group = m->n_heads / m->n_kv_heads;
    p->ht = fa_head_tile(p->group, p->head_dim);
    p->n_htiles = ceil_div(p->group, p->ht);
    p->n_ctas = t->n_ctas > 0 ? std::min(t->n_ctas, dev.n_sms) : dev.n_sms;
    p->n_splits = std::min(ceil_div(m->max_ctx, FA_CHUNK), t->attn_splits);
    p->n_stages = 5 * m->n_layers + 1;
    p->n_gemv = 4 * m->n_layers + 1;
    const int rows = t->max_rows;

    auto fail = [&](int s) { free_plan(p); return s; };
    size_t ws_bytes = carve(p, nullptr, rows);
    if (cudaError_t e = cudaMalloc(&p->d_ws, ws_bytes)) return fail((int)e);
    carve(p, p->d_ws, rows);
    if (cudaError_t e = cudaMemset(p->d_ws, 0, ws_bytes)) return fail((int)e);

    std::vector<LayerKV> kv(m->n_layers);
    for (int l = 0; l < m->n_layers; ++l)
        kv[l] = LayerKV{(__half*)m->layers[l].k_cache, (__half*)m->layers[l].v_cache, m->layers[l].q_norm,
                        m->layers[l].k_norm};
    if (cudaError_t e = cudaMalloc(&p->d_layers, kv.size() * sizeof(LayerKV))) return fail((int)e);
    if (cudaError_t e = cudaMemcpy(p->d_layers, kv.data(), kv.size() * sizeof(LayerKV), cudaMemcpyHostToDevice))
        return fail((int)e);

    std::vector<Stage> st;
    std::vector<int> gemv_idx;
    p->max_rows = 0;
    for (int nx = 1; nx <= rows; ++nx) {
        int xarea = 0;
        if (int s = build_stages(p, m, t, nx, fwd_warps(nx), dev.n_sms, &st, &xarea)) {
            if (nx == 1) return fail(s);
            break;
        }
        if (nx == 1) {
            p->max_step_bytes = 0;
            for (size_t k = 0; k < st.size(); ++k)
                if (st[k].kind == ST_GEMV) {
                    gemv_idx.push_back((int)k);
                    p->max_step_bytes = std::max(p->max_step_bytes, st[k].g.stage_bytes);
                }
        }
        const int misc_off = xarea, ring_off = (misc_off + ARGMAX_SCRATCH + 15) & ~15;
        const int avail = dev.max_smem - STATIC_SMEM - ring_off;
        // The rest of shared memory is split into the warps' rings: as many warps as the kernel allows whose
        // rings each hold ring_min_steps of the largest step (a 7 KB Q6_K ffn_down row is one step), at
        // least MIN_WARPS. (Bytes in flight per SM -- bandwidth x latency, ~25 KB on an H100 -- are far
        // fewer than the rings hold; the depth absorbs the waits at stage boundaries.)
        const int need = t->ring_min_steps * p->max_step_bytes;
        int n_warps = fwd_warps(nx);
        while (n_warps > MIN_WARPS && avail / n_warps < need) --n_warps;
        const int ring_bytes = (avail / n_warps) & ~15;
        if (ring_bytes < need) {              // no room at this many rows
            if (nx == 1) return fail(FD_E_SHAPE);
            break;
        }
        if (n_warps != fwd_warps(nx) && build_stages(p, m, t, nx, n_warps, dev.n_sms, &st, &xarea) != 0) break;
        p->n_warps[nx] = n_warps;
        p->ring_bytes[nx] = ring_bytes;
        p->misc_off[nx] = misc_off;
        p->ring_off[nx] = ring_off;
        p->smem[nx] = ring_off + n_warps * ring_bytes;
        int blocks = 0;
        if (int s = configure_nx(nx, n_warps, p->smem[nx], &blocks)) return fail(s);
        if (blocks < 1) {
            if (nx == 1) return fail(FD_E_SHAPE);
            break;
        }
        if (cudaError_t e = cudaMalloc(&p->d_stages[nx], st.size() * sizeof(Stage))) return fail((int)e);
        if (cudaError_t e = cudaMemcpy(p->d_stages[nx], st.data(), st.size() * sizeof(Stage), cudaMemcpyHostToDevice))
            return fail((int)e);
        p->max_rows = nx;
    }
    if (cudaError_t e = cudaMalloc(&p->d_gemv_stage, gemv_idx.size() * sizeof(int))) return fail((int)e);
    if (cudaError_t e = cudaMemcpy(p->d_gemv_stage, gemv_idx.data(), gemv_idx.size() * sizeof(int),
                                   cudaMemcpyHostToDevice))
        return fail((int)e);
    *out = p;
    return 0;
}

}  // namespace
}  // namespace fd

extern "C" {

int fd_forward_create(void** plan, const fd_forward_model_t* model, const fd_forward_tuning_t* tuning) {
    FD_CHECK_ARG(plan != nullptr);
    *plan = nullptr;
    fd::ForwardPlan* p = nullptr;
    if (int s = fd::create_plan(model, tuning, &p)) return s;
    *plan = p;
    return 0;
}

int fd_forward_destroy(void* plan) {
    fd::free_plan(static_cast<fd::ForwardPlan*>(plan));
    return 0;
}

int fd_forward_profile(void* plan, int on) {
    FD_CHECK_ARG(plan != nullptr);
#if !FD_HAS_MMA
    if (on) return FD_E_UNSUPPORTED;   // HIP: the stamps are %globaltimer ns, which AMD GPUs lack
#endif
    static_cast<fd::ForwardPlan*>(plan)->profile = on != 0;
    return 0;
}

int fd_forward_info(void* plan, fd_forward_info_t* info) {
    FD_CHECK_ARG(plan && info);
    const fd::ForwardPlan* p = static_cast<const fd::ForwardPlan*>(plan);
    info->max_rows = p->max_rows;
    info->n_ctas = p->n_ctas;
    info->n_warps = p->n_warps[1];
    info->smem_bytes = p->smem[1];
    info->ring_bytes = p->ring_bytes[1];
    info->max_step_bytes = p->max_step_bytes;
    info->n_splits = p->n_splits;
    info->n_stages = p->n_stages;
    info->hidden = p->h;
    info->logits = p->logits;
    info->capture = p->capture;
    info->stamps = p->stamps;
    return 0;
}

int fd_forward(void* plan, const int32_t* positions, const int32_t* n_past, const uint8_t* mask, int mask_n, int row0,
               int n, int32_t* argmax, const uint8_t* host_capture, void* stream) {
    FD_CHECK_ARG(plan && positions && n_past);
    fd::ForwardPlan* p = static_cast<fd::ForwardPlan*>(plan);
    FD_CHECK_ARG(n >= 1 && n <= p->max_rows && row0 >= 0);
    if (mask) FD_CHECK_ARG(mask_n >= 1 && mask_n <= fd::fwd::FA_MAX_MASK && row0 + n <= mask_n);
    fd::FwdParams P{};
    P.stages = p->d_stages[n];
    P.n_stages = p->n_stages;
    P.gemv_stage = p->d_gemv_stage;
    P.n_gemv = p->n_gemv;
    P.layers = p->d_layers;
    P.q = p->q; P.k = p->k; P.v = p->v; P.o = p->o;
    P.positions = positions;
    P.n_past = n_past;
    P.mask = mask;
    P.mask_n = mask ? mask_n : 0;
    P.row0 = row0;
    P.n = n;
    P.rope_cs = p->rope_cs;
    P.part = p->part;
    P.attn_cnt = p->attn_cnt;
    P.counters = p->counters;
    P.am_val = p->am_val;
    P.am_idx = p->am_idx;
    P.argmax_out = argmax;
    P.capture = p->capture;
    P.stamps = p->profile ? p->stamps : nullptr;
    P.hidden = p->hidden;
    P.max_rows = p->max_rows;
    for (int l = 0; host_capture && l < p->n_layers; ++l)
        if (host_capture[l]) P.capture_mask[l >> 5] |= 1u << (l & 31);
    P.n_heads = p->n_heads; P.n_kv = p->n_kv; P.head_dim = p->head_dim; P.group = p->group; P.ht = p->ht;
    P.n_htiles = p->n_htiles; P.rope_dim = p->rope_dim; P.neox = p->neox; P.max_ctx = p->max_ctx;
    P.n_splits = p->n_splits; P.theta = p->theta; P.rope_scaling = p->rope_scaling; P.eps = p->eps;
    P.q_scale = (float)(1.4426950408889634 / std::sqrt((double)p->head_dim));
    P.ring_bytes = p->ring_bytes[n];
    P.ring_off = p->ring_off[n];
    P.misc_off = p->misc_off[n];
    return fd::launch_nx(n, P, p->n_ctas, p->n_warps[n], (size_t)p->smem[n], (cudaStream_t)stream);
}

}  // extern "C"
