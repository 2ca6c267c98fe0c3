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
//
// Files: forward_program.cuh (the stages and launch parameters), forward_schedule.cuh (the dependency
// protocol and the weight ring), forward_kernel.cuh (the GEMV stages and the kernel), forward_plan.cuh
// (host: the plan), forward_attention.cuh and forward_rope.cuh (the ATTN stage's pieces); this file holds
// the C entry points.
#include "gemv.cuh"
#include "forward_attention.cuh"
#include "forward_rope.cuh"
#include "forward_program.cuh"
#include "forward_schedule.cuh"
#include "forward_kernel.cuh"
#include "forward_plan.cuh"

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
