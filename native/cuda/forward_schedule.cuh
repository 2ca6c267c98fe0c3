// forward_schedule.cuh -- how the persistent forward's CTAs and warps move through the stages (forward.cu:
// "The schedule", "The weight ring"): the dependency protocol (one counter per stage in device memory,
// released by each CTA's thread 0 and acquired before a stage's first item; profiling stamps) and each
// warp's weight ring (its GEMV steps of every stage, streamed through private shared memory with
// cp.async across stage boundaries). tests/emulation/test_forward_schedule.py emulates both.
#pragma once

#include "forward_program.cuh"

namespace fd {
namespace {

using namespace fd::q;
using namespace fd::fwd;

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

}  // namespace
}  // namespace fd
