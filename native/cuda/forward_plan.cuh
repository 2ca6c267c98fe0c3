// forward_plan.cuh -- the host side of the persistent forward (fd_forward_create): ForwardPlan checks the
// model, carves one device workspace (activations, logits, rope table, attention partials, argmax
// partials, counters, captured layer outputs, profiling stamps), builds the stage list for every row count
// 1..max_rows (gemv_plan / gemv_layout per GEMV stage) and sizes each row count's warps and weight rings
// from the shared memory left, keeping the row counts whose kernel fits on an SM.
#pragma once

#include "forward_kernel.cuh"

#include <vector>

namespace fd {
namespace {

using namespace fd::q;
using namespace fd::fwd;

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
