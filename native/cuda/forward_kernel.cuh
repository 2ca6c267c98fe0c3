// forward_kernel.cuh -- the persistent forward's kernel (forward.cu describes the design): the GEMV stages
// (gemv.cuh's steps fed from the weight ring, the LM stage's fused argmax partials), forward_kernel (rope
// table, then every stage in order under the dependency protocol, the attention items of
// forward_attention.cuh, and the last CTA's argmax reduction and counter reset), and its host-side
// occupancy configuration and launch per row count (1..8 instantiations).
#pragma once

#include "forward_schedule.cuh"

namespace fd {
namespace {

using namespace fd::q;
using namespace fd::fwd;

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

// ---- host side: occupancy and launch, per row count ---------------------------------------------------
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
