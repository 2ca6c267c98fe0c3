// attention_splitk_warp.cuh -- one warp's share of a split-K attention tile (attention_splitk.cuh describes
// the design): the cp.async pipeline primitives, and warp_step / warp_store -- 16 query rows x 16 keys of
// online softmax in the log2 domain with q and P split into f16 hi + lo, on tensor cores (mma.m16n8k16,
// ldmatrix; FD_ATTN_MMA) or as a SIMT fallback with the same inputs and merge layout (HIP, or
// -DFD_ATTENTION_SIMT).
#pragma once

#include "attention_splitk_params.cuh"

namespace fd {
namespace attn {

// ---- pipeline primitives ------------------------------------------------------------------
// (mma.cuh and quant_stage.cuh have their own cp.async wrappers, on purpose: mma.cuh says why.)
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if FD_ATTN_ASYNC
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
#else
    *reinterpret_cast<uint4*>(smem) = valid ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0u, 0u, 0u, 0u);
#endif
}
// BYTES = 4, 8 or 16 bytes (a row's float16 scales, attention_splitk_qstage.cuh); src and dst aligned to BYTES.
// .ca: cp.async.cg takes 16 bytes only.
template <int BYTES>
__device__ __forceinline__ void cp_async_small(void* smem, const void* gmem, bool valid) {
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async sizes");
#if FD_ATTN_ASYNC
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(gmem), "n"(BYTES),
                 "r"(valid ? BYTES : 0));
#else
    unsigned char* d = static_cast<unsigned char*>(smem);
    const unsigned char* g = static_cast<const unsigned char*>(gmem);
    for (int i = 0; i < BYTES; ++i) d[i] = valid ? g[i] : 0;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if FD_ATTN_ASYNC
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if FD_ATTN_ASYNC
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

#if FD_ATTN_MMA
// ---- tensor-core warp step ----------------------------------------------------------------
// ldmatrix of b16 elements at a shared address: float16 tiles, or code byte pairs (attention_splitk_qfrag.cuh)
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
// c (16x8 f32) += a (16x16 f16, row) * b (16x8 f16, col)
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// (a, b) -> f16x2 hi and the f16x2 of the rounding remainders
__device__ __forceinline__ void split_pack(float a, float b, uint32_t& hi, uint32_t& lo) {
    const __half2 h = __floats2half2_rn(a, b);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(a - hf.x, b - hf.y);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
}

// Fragment ownership (PTX mma.m16n8k16): g = lane / 4, t2 = 2 * (lane % 4). Scores s[j][e]: row
// (e < 2 ? g : g + 8), slot j * 8 + t2 + (e & 1). Output o[nt][e]: row (e < 2 ? g : g + 8), dim
// nt * 8 + t2 + (e & 1). m[2], l[2]: rows g and g + 8 (l is this thread's partial sum over its
// columns until the final quad reduction).
template <int HD>
struct WarpState {
    float m[2];
    float l[2];
    float o[HD / 8][4];
    __device__ __forceinline__ void init() {
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.0f;
#pragma unroll
        for (int nt = 0; nt < HD / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    }
};

// A score step's accumulators, acc[q part (hi, lo)][16-dim slice parity][keys 0-7 | 8-15]: eight independent mma
// chains (warp_scores, and attention_splitk_qfrag.cuh's code and window steps), zeroed, then summed in one fixed
// order into s.
__device__ __forceinline__ void zero_score_acc(float (&acc)[2][2][2][4]) {
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int j = 0; j < 2; ++j) acc[a][b][j][0] = acc[a][b][j][1] = acc[a][b][j][2] = acc[a][b][j][3] = 0.f;
}

__device__ __forceinline__ void sum_score_acc(float (&s)[2][4], const float (&acc)[2][2][2][4]) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            s[j][e] = (acc[0][0][j][e] + acc[0][1][j][e]) + (acc[1][0][j][e] + acc[1][1][j][e]);
}

// S (16 q rows x the warp's 16 keys) = q k^T, q split into f16 hi + lo (ks: the warp's first key row in shared
// memory). (hi, lo) x (even, odd k-step) x 2 slot groups: eight independent mma chains, so the tensor-core
// latency overlaps within the warp.
template <int HD>
__device__ __forceinline__ void warp_scores(float (&s)[2][4], const __half* q_hi, const __half* q_lo, const __half* ks) {
    constexpr int LD = Cfg<HD>::LD;
    const int lane = threadIdx.x & 31, mi = lane >> 3;
    float acc[2][2][2][4];
    zero_score_acc(acc);
    const int q_row_off = ((mi & 1) * 8 + (lane & 7)) * LD + (mi >> 1) * 8;
    const int k_row_off = ((mi >> 1) * 8 + (lane & 7)) * LD + (mi & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        uint32_t ah[4], al[4], b[4];
        ldsm_x4(ah, q_hi + q_row_off + kk * 16);
        ldsm_x4(al, q_lo + q_row_off + kk * 16);
        ldsm_x4(b, ks + k_row_off + kk * 16);
        mma16816(acc[0][kk & 1][0], ah, b[0], b[1]);
        mma16816(acc[1][kk & 1][0], al, b[0], b[1]);
        mma16816(acc[0][kk & 1][1], ah, b[2], b[3]);
        mma16816(acc[1][kk & 1][1], al, b[2], b[3]);
    }
    sum_score_acc(s, acc);
}

// The scores s of keys v0 .. v0 + 15 (v0 + i >= L masked out) into the online softmax (log2 domain): st's m, l
// and o rescaled, P (16 rows x 16 slots, the A operand of P v: k = slot) split into f16 hi + lo.
template <int HD>
__device__ __forceinline__ void warp_softmax(WarpState<HD>& st, float (&s)[2][4], int v0, int L, uint32_t (&ph)[4],
                                             uint32_t (&pl)[4]) {
    const int t2 = (threadIdx.x & 3) * 2;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (v0 + j * 8 + t2 + (e & 1) >= L) s[j][e] = -INFINITY;
            mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
        }
    float m_use[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(st.m[r], mx[r]);
        m_use[r] = m_new == -INFINITY ? 0.0f : m_new;      // no slot seen yet: keep exp2 finite
        alpha[r] = exp2f(st.m[r] - m_use[r]);
        st.m[r] = m_new;
    }
    float rowsum[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[j][e] = exp2f(s[j][e] - m_use[e >> 1]);
            rowsum[e >> 1] += s[j][e];
        }
    st.l[0] = st.l[0] * alpha[0] + rowsum[0];
    st.l[1] = st.l[1] * alpha[1] + rowsum[1];
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {   // a row max moved
#pragma unroll
        for (int nt = 0; nt < HD / 8; ++nt) {
            st.o[nt][0] *= alpha[0];
            st.o[nt][1] *= alpha[0];
            st.o[nt][2] *= alpha[1];
            st.o[nt][3] *= alpha[1];
        }
    }
    split_pack(s[0][0], s[0][1], ph[0], pl[0]);
    split_pack(s[0][2], s[0][3], ph[1], pl[1]);
    split_pack(s[1][0], s[1][1], ph[2], pl[2]);
    split_pack(s[1][2], s[1][3], ph[3], pl[3]);
}

// One warp: 16 query rows x 16 keys (ks/vs point at the warp's first key row in shared memory);
// keys v0 + i with v0 + i >= L are masked out.
template <int HD>
__device__ __forceinline__ void warp_step(WarpState<HD>& st, const __half* q_hi, const __half* q_lo, const __half* ks,
                                          const __half* vs, int v0, int L) {
    constexpr int LD = Cfg<HD>::LD;
    const int lane = threadIdx.x & 31, mi = lane >> 3;
    float s[2][4];
    warp_scores<HD>(s, q_hi, q_lo, ks);
    uint32_t ph[4], pl[4];
    warp_softmax<HD>(st, s, v0, L, ph, pl);
#pragma unroll
    for (int np = 0; np < HD / 16; ++np) {
        uint32_t b[4];
        ldsm_x4_trans(b, vs + ((mi & 1) * 8 + (lane & 7)) * LD + np * 16 + (mi >> 1) * 8);
        mma16816(st.o[2 * np], ph, b[0], b[1]);
        mma16816(st.o[2 * np], pl, b[0], b[1]);
        mma16816(st.o[2 * np + 1], ph, b[2], b[3]);
        mma16816(st.o[2 * np + 1], pl, b[2], b[3]);
    }
}

// The warp's m and l (l quad-reduced) to the merge area: m_s[w][r], l_s[w][r].
template <int HD>
__device__ __forceinline__ void warp_store_ml(WarpState<HD>& st, float* m_s, float* l_s) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 1);
        st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 2);
    }
    if ((lane & 3) == 0) {
        m_s[w * ROWS + g] = st.m[0];
        m_s[w * ROWS + g + 8] = st.m[1];
        l_s[w * ROWS + g] = st.l[0];
        l_s[w * ROWS + g + 8] = st.l[1];
    }
}

// Writes the warp's state to the merge area: m_s[w][r], l_s[w][r], o_s[w][r][HD].
template <int HD>
__device__ __forceinline__ void warp_store(WarpState<HD>& st, float* m_s, float* l_s, float* o_s) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t2 = (lane & 3) * 2;
    warp_store_ml<HD>(st, m_s, l_s);
    float* ow = o_s + (size_t)w * ROWS * HD;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
        *reinterpret_cast<float2*>(ow + g * HD + nt * 8 + t2) = make_float2(st.o[nt][0], st.o[nt][1]);
        *reinterpret_cast<float2*>(ow + (g + 8) * HD + nt * 8 + t2) = make_float2(st.o[nt][2], st.o[nt][3]);
    }
}

#else  // !FD_ATTN_MMA
// ---- SIMT warp step (HIP, or -DFD_ATTENTION_SIMT) -----------------------------------------------
// Lane = (row r = lane % 16, half h = lane / 16): scores for the row's slots 8h .. 8h + 7, output
// dims [h * HD / 2, (h + 1) * HD / 2). m and l are per row (l: this lane's slots until the end).
template <int HD>
struct WarpState {
    float m, l;
    float o[HD / 2];
    __device__ __forceinline__ void init() {
        m = -INFINITY;
        l = 0.0f;
#pragma unroll
        for (int d = 0; d < HD / 2; ++d) o[d] = 0.0f;
    }
};

template <int HD>
__device__ __forceinline__ void warp_step(WarpState<HD>& st, const __half* q_hi, const __half* q_lo, const __half* ks,
                                          const __half* vs, int v0, int L) {
    constexpr int LD = Cfg<HD>::LD;
    const int lane = threadIdx.x & 31, r = lane & 15, h = lane >> 4;
    float s[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const __half* krow = ks + (h * 8 + j) * LD;
        float acc = 0.0f;
        for (int d = 0; d < HD; ++d)
            acc += (__half2float(q_hi[r * LD + d]) + __half2float(q_lo[r * LD + d])) * __half2float(krow[d]);
        s[j] = v0 + h * 8 + j < L ? acc : -INFINITY;
    }
    float mx = s[0];
#pragma unroll
    for (int j = 1; j < 8; ++j) mx = fmaxf(mx, s[j]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float m_new = fmaxf(st.m, mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = exp2f(st.m - m_use);
    st.m = m_new;
    float rowsum = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        s[j] = exp2f(s[j] - m_use);
        rowsum += s[j];
    }
    st.l = st.l * alpha + rowsum;
#pragma unroll
    for (int d = 0; d < HD / 2; ++d) st.o[d] *= alpha;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const float pa = s[j], pb = __shfl_xor_sync(0xffffffffu, s[j], 16);
        const __half* va = vs + (h * 8 + j) * LD + h * (HD / 2);
        const __half* vb = vs + ((1 - h) * 8 + j) * LD + h * (HD / 2);
#pragma unroll
        for (int d = 0; d < HD / 2; ++d) st.o[d] += pa * __half2float(va[d]) + pb * __half2float(vb[d]);
    }
}

template <int HD>
__device__ __forceinline__ void warp_store(WarpState<HD>& st, float* m_s, float* l_s, float* o_s) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, r = lane & 15, h = lane >> 4;
    st.l += __shfl_xor_sync(0xffffffffu, st.l, 16);
    if (h == 0) {
        m_s[w * ROWS + r] = st.m;
        l_s[w * ROWS + r] = st.l;
    }
    float* ow = o_s + ((size_t)w * ROWS + r) * HD + h * (HD / 2);
#pragma unroll
    for (int d = 0; d < HD / 2; ++d) ow[d] = st.o[d];
}
#endif  // FD_ATTN_MMA

}  // namespace attn
}  // namespace fd
