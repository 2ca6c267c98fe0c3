// attention_splitk.cuh -- the split-K flash-attention core of attention_decode.cu (one new token)
// and attention_masked.cu (n new tokens under a mask: speculative tree verification), over the
// float16 KV cache [n_kv_heads][max_ctx][head_dim].
//
// The ops it serves, by name through every layer (ARCHITECTURE.md, "Ops"): fd_attention_decode,
// fd_attention_decode_rope and fd_attention_masked -> CudaOps.attention_decode / attention_decode_rope /
// attention_masked (daemon/backends/cuda/attention_ops.py) -> tests/gpu/test_attention_decode.py,
// test_attention_decode_rope.py, test_attention_masked.py (and tests/emulation/test_decode_attention_emulation.py)
// -> bench/bench_attention_decode.py (decode and masked), bench_attention_decode_rope.py.
//
// A block owns one new token, one KV head, one tile of ROWS = 16 of that KV head's G = n_heads /
// n_kv_heads query heads (G <= 16: one tile) and one split of the token's visible keys:
//   visible keys  a token sees the committed slots [0, n_past) and, in masked mode, the new slots
//               n_past + j with mask[token, j] != 0, j ascending; decode sees [0, n_past]. These
//               are numbered as a virtual sequence v = 0 .. L-1: v < n_past is slot v, and v =
//               n_past + k is the k-th visible new slot (the block keeps that list in shared
//               memory). For a tree node the list is its root-to-node path, so node i reads exactly
//               the keys, in exactly the order, that a decode step at its position reads once the
//               accepted path is compacted into consecutive slots.
//   splits      the virtual sequence is cut into chunks of chunk_len; split s takes chunks s, s +
//               n_splits, ...; n_splits depends only on the model shape and max_ctx (never on n or
//               on the mask), so every (token, head) row is reduced in the same order as decode's.
//   tiles       a split's chunks are streamed in tiles of TILE = 64 keys through a STAGES-deep
//               cp.async pipeline of shared memory (K and V rows padded to HD + 8 halves so the
//               ldmatrix row reads of 8 consecutive rows hit distinct banks).
//   warps       4 warps; warp w takes keys [16w, 16w + 16) of every tile and keeps its own online
//               softmax state (running max m, sum l, o[16][HD]) -- no synchronisation per tile
//               beyond the pipeline's one __syncthreads. At the end the 4 states are merged in
//               shared memory, and the block writes either the normalised output (one split) or
//               the split's partial (m, l, unnormalised o) to the workspace for combine_kernel.
//
// Fused rope (splitk_kernel<HD, true>, fd_attention_decode_rope): the decode kernel with the new
// token's RoPE of q and k and its K/V cache write folded in (rope_stage and the new-key override in
// splitk_kernel); bit for bit fd_rope_kv_write followed by the plain kernel.
//
// Batch invariance: a row's arithmetic depends only on its q, its key sequence, chunk_len and
// n_splits. Speculative verification therefore reproduces plain decoding bit for bit (given
// bitwise-equal q/K/V, which the row-invariant GEMVs provide): tests/gpu/test_attention_masked.py.
//
// Warp math (FD_ATTN_MMA, sm_80+): tensor-core mma.m16n8k16 (f16 in, f32 accumulate) with the 16
// query rows as M. QK^T: A = q, B = K rows via ldmatrix; PV: A = P from the score fragments, B =
// V via ldmatrix.trans. To keep float32 accuracy, q (pre-multiplied by scale * log2 e) and P are
// each split into f16 hi + lo parts and multiplied twice (K and V are f16 already, so products
// are exact and the error is the ~2^-22 of the split plus f32 accumulation). Softmax runs in the
// log2 domain (exp2f). Without tensor cores (HIP, or -DFD_ATTENTION_SIMT to test) a SIMT warp
// step with the same inputs and merge layout is used.
//
// Launch latency: both kernels here are launched with programmatic dependent launch on sm_90
// (launch_pdl): pdl_wait() at the top of each kernel orders it after the previous kernel's writes.
//
// Numerical contract: o = softmax(q k^T * scale) v over the visible keys, with the f16 cache
// values as given; a row that sees no key at all (masked mode, n_past = 0 and an empty mask row)
// comes out NaN, like the reference's softmax of all -inf.
#pragma once

#include "common.cuh"
#include "rope_math.cuh"

#if FD_HAS_MMA
#define FD_ATTN_ASYNC 1           // cp.async pipeline
#else
#define FD_ATTN_ASYNC 0
#endif
#if FD_HAS_MMA && !defined(FD_ATTENTION_SIMT)
#define FD_ATTN_MMA 1             // tensor-core warp step
#else
#define FD_ATTN_MMA 0
#endif

namespace fd {
namespace attn {

constexpr int ROWS = 16;                       // query rows per block (one m16 tile)
constexpr int WARPS = FD_ATTN_ASYNC ? 4 : 2;   // HIP: 2 warps, smaller tiles (64 KB LDS)
constexpr int THREADS = WARPS * 32;
constexpr int WARP_SLOTS = 16;                 // slots per warp per tile
constexpr int TILE = WARPS * WARP_SLOTS;       // slots per pipeline stage
constexpr int CHUNK_MULTIPLE = 64;             // chunk_len granularity accepted by the launchers
constexpr float LOG2E = 1.4426950408889634f;

constexpr int MAX_NEW = 256;                   // masked mode: new tokens per launch

template <int HD>
struct Cfg {
    static constexpr int STAGES = FD_ATTN_ASYNC ? (HD >= 256 ? 2 : 3) : 2;
    static constexpr int LD = HD + 8;          // padded row stride (halves)
    static constexpr int CHUNKS = HD / 8;      // 16-byte pieces per K/V row
    static constexpr size_t Q_BYTES = 2 * ROWS * LD * sizeof(__half);           // q hi, q lo
    static constexpr size_t STAGE_BYTES = 2 * TILE * LD * sizeof(__half);       // K, V
    static constexpr size_t PIPE_BYTES = STAGES * STAGE_BYTES;
    static constexpr size_t MERGE_BYTES = ((size_t)WARPS * ROWS * (HD + 3) + 2 * ROWS) * sizeof(float);
    static constexpr size_t LIST_BYTES = MAX_NEW * sizeof(int);                    // masked mode's key list
    static constexpr size_t SMEM_BYTES = Q_BYTES + LIST_BYTES + (PIPE_BYTES > MERGE_BYTES ? PIPE_BYTES : MERGE_BYTES);
};

struct Params {
    const float* q;            // (n, n_heads, HD) float32
    const __half* k_cache;     // [n_kv_heads][max_ctx][HD]
    const __half* v_cache;
    const int32_t* n_past;     // device scalar
    const uint8_t* mask;       // (n, n) or nullptr (decode: n = 1, the token sees [0, n_past])
    float* o;                  // (n, n_heads * HD): written when n_splits == 1
    float* ws_acc;             // [n * n_heads][n_splits][HD] partial unnormalised o (n_splits > 1)
    float* ws_m;               // [n * n_heads][n_splits] running max (log2 domain)
    float* ws_l;               // [n * n_heads][n_splits] softmax denominator
    int n, n_heads, n_kv_heads, group, row_tiles, max_ctx, chunk_len, n_splits;
    float q_scale;             // scale * log2(e)
    // fd_attention_decode_rope only (splitk_kernel<HD, true>; n = 1, no mask): q is unrotated, and the
    // new token's K/V row comes from k_new / v_new instead of the cache (see splitk_kernel)
    const float* k_new;        // (n_kv_heads, HD) float32, unrotated
    const float* v_new;        // (n_kv_heads, HD) float32
    __half* k_store;           // the caches again, written at slot *n_past
    __half* v_store;
    const int32_t* positions;  // device scalar: the new token's RoPE position
    double theta;
    RopeScaling rope_scaling;  // linear / YaRN (rope_math.cuh); on = 0: none
    int rope_dim, neox;
};

// The number of visible keys L of `token` (all threads of the block call it; uniform result). In
// masked mode list[k] (shared memory, if list != nullptr) receives the k-th visible new slot's
// offset j (mask[token, j] != 0, ascending).
__device__ __forceinline__ int visible_keys(const Params& p, int token, int* list) {
    const int n_past = max(p.n_past[0], 0);
    if (p.mask == nullptr) return min(n_past + 1, p.max_ctx);
    const int lane = threadIdx.x & 31;
    const uint8_t* row = p.mask + (size_t)token * p.n;
    int count = 0;
    for (int j0 = 0; j0 < p.n; j0 += 32) {      // every warp counts; warp 0 writes the list
        const bool on = j0 + lane < p.n && row[j0 + lane] != 0;
        const unsigned bits = __ballot_sync(0xffffffffu, on);
        if (list != nullptr && on && threadIdx.x < 32) list[count + __popc(bits & ((1u << lane) - 1u))] = j0 + lane;
        count += __popc(bits);
    }
    return min(n_past + count, p.max_ctx);
}

// ---- pipeline primitives ------------------------------------------------------------------
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if FD_ATTN_ASYNC
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
#else
    *reinterpret_cast<uint4*>(smem) = valid ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0u, 0u, 0u, 0u);
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
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __half* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const __half* p) {
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

// One warp: 16 query rows x 16 keys (ks/vs point at the warp's first key row in shared memory);
// keys v0 + i with v0 + i >= L are masked out.
template <int HD>
__device__ __forceinline__ void warp_step(WarpState<HD>& st, const __half* q_hi, const __half* q_lo, const __half* ks,
                                          const __half* vs, int v0, int L) {
    constexpr int LD = Cfg<HD>::LD;
    const int lane = threadIdx.x & 31, mi = lane >> 3, t2 = (lane & 3) * 2;
    // (hi, lo) x (even, odd k-step) x 2 slot groups: eight independent mma chains, so the
    // tensor-core latency overlaps within the warp
    float acc[2][2][2][4];
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int j = 0; j < 2; ++j) acc[a][b][j][0] = acc[a][b][j][1] = acc[a][b][j][2] = acc[a][b][j][3] = 0.f;
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
    float s[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            s[j][e] = (acc[0][0][j][e] + acc[0][1][j][e]) + (acc[1][0][j][e] + acc[1][1][j][e]);
    // mask, online softmax (log2 domain)
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
    // P (16 rows x 16 slots) as the A operand: k = slot
    uint32_t ph[4], pl[4];
    split_pack(s[0][0], s[0][1], ph[0], pl[0]);
    split_pack(s[0][2], s[0][3], ph[1], pl[1]);
    split_pack(s[1][0], s[1][1], ph[2], pl[2]);
    split_pack(s[1][2], s[1][3], ph[3], pl[3]);
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

// Writes the warp's state to the merge area: m_s[w][r], l_s[w][r], o_s[w][r][HD].
template <int HD>
__device__ __forceinline__ void warp_store(WarpState<HD>& st, float* m_s, float* l_s, float* o_s) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t2 = (lane & 3) * 2;
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

// ---- fd_attention_decode_rope's staging -----------------------------------------------------
// Thread tid's q elements are e = tid + j * THREADS (row e / HD of the tile, dim e % HD), i.e. the
// NU = max(1, HD / THREADS) distinct dims dim_u = (tid + u * THREADS) % HD, u = j % NU: one cos/sin
// (double pow + sincos) per distinct dim, computed in registers. qv[j] receives the rotated q value
// (unscaled, as the plain kernel loads it). If own_key: the new token's K (rotated) | V rows of KV head
// kvh, as float16, go to kv_new[0, 2 HD) (element c = tid + i * THREADS; K dims c < HD are the dims
// dim_i above), and if store also to the cache at slot *n_past.
template <int HD>
__device__ __forceinline__ void rope_stage(const Params& p, float (&qv)[ROWS * HD / THREADS], const float* q_tok,
                                           int row0, int kvh, int tid, bool own_key, __half* kv_new, bool store) {
    constexpr int Q_PER_THREAD = ROWS * HD / THREADS;
    constexpr int NU = HD > THREADS ? HD / THREADS : 1;
    static_assert(HD % THREADS == 0 || THREADS % HD == 0, "dims per thread");
    const bool neox = p.neox != 0;
    const int pos = p.positions[0];
    float cs[NU], sn[NU];
    int partner[NU];
    bool first[NU], rot[NU];
#pragma unroll
    for (int u = 0; u < NU; ++u) {
        const int d = (tid + u * THREADS) % HD;
        int j = 0;
        rot[u] = d < p.rope_dim;
        partner[u] = d;
        first[u] = true;
        cs[u] = 1.0f;
        sn[u] = 0.0f;
        if (rot[u]) {
            rope_pair_of(d, p.rope_dim, neox, j, partner[u], first[u]);
            rope_cos_sin(pos, j, p.rope_dim, p.theta, p.rope_scaling, cs[u], sn[u]);
        }
    }
    float xv[Q_PER_THREAD], yv[Q_PER_THREAD];
#pragma unroll
    for (int j = 0; j < Q_PER_THREAD; ++j) {            // all loads first
        const int e = tid + j * THREADS, r = e / HD, d = e % HD, u = j % NU;
        const bool in = row0 + r < p.group;
        const float* row = q_tok + (size_t)(row0 + r) * HD;
        xv[j] = in ? __ldg(row + d) : 0.0f;
        yv[j] = in && rot[u] ? __ldg(row + partner[u]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < Q_PER_THREAD; ++j) {          // rows past the group stay exactly 0 (as plain)
        const int u = j % NU, r = (tid + j * THREADS) / HD;
        qv[j] = rot[u] && row0 + r < p.group ? rope_rotated(xv[j], yv[j], cs[u], sn[u], first[u]) : xv[j];
    }
    if (own_key) {
        const int slot = p.n_past[0];
        const float* kr = p.k_new + (size_t)kvh * HD;
        const float* vr = p.v_new + (size_t)kvh * HD;
#pragma unroll
        for (int i = 0; i < (2 * HD + THREADS - 1) / THREADS; ++i) {
            const int c = tid + i * THREADS;
            if (c >= 2 * HD) break;
            __half h;
            if (c < HD) {                               // K dim c == dim_i of the table above
                const int u = i < NU ? i : 0;
                const float x = __ldg(kr + c);
                h = __float2half_rn(rot[u] ? rope_rotated(x, __ldg(kr + partner[u]), cs[u], sn[u], first[u]) : x);
            } else {
                h = __float2half_rn(__ldg(vr + (c - HD)));
            }
            kv_new[c] = h;
            if (store) {
                __half* cache = c < HD ? p.k_store : p.v_store;
                cache[((size_t)kvh * p.max_ctx + slot) * HD + (c < HD ? c : c - HD)] = h;
            }
        }
    }
}

// ---- the block ----------------------------------------------------------------------------
// grid (n_splits, n_kv_heads, n * row_tiles); THREADS threads; Cfg<HD>::SMEM_BYTES
//
// ROPE (fd_attention_decode_rope: one token, no mask): p.q is the unrotated q; the block rotates its
// tile of q rows while staging them (rope_math.cuh, bit for bit fd_rope_kv_write's). The block whose
// split owns the new key (slot n_past = *p.n_past, if 0 <= n_past < max_ctx: chunk n_past / chunk_len,
// split chunk % n_splits; the last visible key, so that split never exits early) also forms the new
// token's K row (rotated) and V row as float16 in shared memory (the `list` area, unused without a
// mask: 2 * HD halves <= 1 KB), and
//   (a) the warp whose 16 keys of a tile contain slot n_past overwrites that row of the landed K/V tile
//       with them before its warp_step (after the pipeline's __syncthreads, so the cp.async copy of the
//       stale cache row is complete; __syncwarp orders the overwrite before the warp's ldmatrix reads):
//       no ordering between the global write below and any cp.async read is needed;
//   (b) query-row tile 0 of that split writes them into the cache at slot n_past for later steps.
// Everything else is the plain kernel's code, so o equals fd_rope_kv_write + fd_attention_decode's.
template <int HD, bool ROPE = false>
__global__ void __launch_bounds__(THREADS, 1) splitk_kernel(const Params p) {
    using C = Cfg<HD>;
    constexpr int LD = C::LD;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half* q_hi = reinterpret_cast<__half*>(smem_raw);
    __half* q_lo = q_hi + ROWS * LD;
    int* list = reinterpret_cast<int*>(q_lo + ROWS * LD);   // [MAX_NEW] visible new slots (masked mode)
    __half* pipe = reinterpret_cast<__half*>(list + MAX_NEW);   // STAGES x (K [TILE][LD], V [TILE][LD])
    float* m_s = reinterpret_cast<float*>(pipe);      // merge area, after the pipeline drains
    float* l_s = m_s + WARPS * ROWS;
    float* o_s = l_s + WARPS * ROWS;

    const int split = blockIdx.x, kvh = blockIdx.y;
    const int token = blockIdx.z / p.row_tiles, row0 = (blockIdx.z % p.row_tiles) * ROWS;   // row = head in group
    const int tid = threadIdx.x, warp = tid >> 5;
    pdl_wait();                  // q, the new K/V and n_past come from earlier kernels
    pdl_launch_dependents();     // the combine kernel may start waiting on us now
    const int n_past = max(p.n_past[0], 0);
    const int L = visible_keys(p, token, list);       // virtual keys [0, L)
    const int n_chunks = (L + p.chunk_len - 1) / p.chunk_len;
    if (split >= n_chunks) {                          // this split has no key at this depth
        if (n_chunks == 0 && p.n_splits == 1)          // no key at all (masked, n_past 0, empty row): NaN
            for (int e = tid; e < ROWS * HD; e += THREADS)
                if (row0 + e / HD < p.group)
                    p.o[((size_t)token * p.n_heads + kvh * p.group + row0 + e / HD) * HD + e % HD] =
                        __int_as_float(0x7fffffff);
        return;                                        // (with splits, the combine writes the NaN)
    }
    // ROPE: slot of the new key if this split owns it and it is inside the cache, else -1 (no key has
    // that number); its float16 K | V rows in the list area
    __half* kv_new = reinterpret_cast<__half*>(list);
    int new_key = -1;
    if constexpr (ROPE) {
        const int raw = p.n_past[0];
        if (raw >= 0 && raw < p.max_ctx && (raw / p.chunk_len) % p.n_splits == split) new_key = raw;
    }
    __syncthreads();                                  // list written
    // keys below this are slots of their own number (decode: all of them; masked: the committed ones)
    const int direct_end = p.mask == nullptr ? L : min(n_past, L);

    // this split's tiles: chunks split, split + n_splits, ...; all full but the global last one
    const int tiles_per_chunk = p.chunk_len / TILE;
    const int n_my_chunks = (n_chunks - split + p.n_splits - 1) / p.n_splits;
    const int last_chunk = split + (n_my_chunks - 1) * p.n_splits;
    const int last_tiles = min(tiles_per_chunk, (L - last_chunk * p.chunk_len + TILE - 1) / TILE);
    const int n_tiles = (n_my_chunks - 1) * tiles_per_chunk + last_tiles;
    // tile k of this split starts at key (split + (k / tpc) * n_splits) * chunk_len + (k % tpc) * TILE;
    // two cursors walk that sequence (the loader runs STAGES - 1 tiles ahead) without divisions
    struct Cursor {
        int v0, t, chunk0;
    };
    const int chunk_step = p.n_splits * p.chunk_len;
    auto advance = [&](Cursor& c) {
        c.v0 += TILE;
        if (++c.t == tiles_per_chunk) {
            c.t = 0;
            c.chunk0 += chunk_step;
            c.v0 = c.chunk0;
        }
    };
    Cursor load_cur = {split * p.chunk_len, 0, split * p.chunk_len};
    Cursor comp_cur = load_cur;
    // each thread copies one fixed 16-byte column piece of rows r0, r0 + ROW_STEP, ... of a tile
    constexpr int ROW_STEP = THREADS / C::CHUNKS;
    static_assert(THREADS % C::CHUNKS == 0 && TILE % ROW_STEP == 0, "tile copy mapping");
    const int piece = tid % C::CHUNKS, r0 = tid / C::CHUNKS;
    const __half* k_src = p.k_cache + (size_t)kvh * p.max_ctx * HD + piece * 8;
    const __half* v_src = p.v_cache + (size_t)kvh * p.max_ctx * HD + piece * 8;
    auto load_tile = [&](int k) {                      // tile k == the load cursor's tile
        if (k < n_tiles) {
            const int v0 = load_cur.v0;
            advance(load_cur);
            __half* ks = pipe + (size_t)(k % C::STAGES) * 2 * TILE * LD + r0 * LD + piece * 8;
            if (v0 + TILE <= direct_end) {             // keys are slots: constant offsets only
                const __half* kp = k_src + (size_t)(v0 + r0) * HD;
                const __half* vp = v_src + (size_t)(v0 + r0) * HD;
#pragma unroll
                for (int j = 0; j < TILE / ROW_STEP; ++j) {
                    cp_async16(ks + j * ROW_STEP * LD, kp + j * ROW_STEP * HD, true);
                    cp_async16(ks + TILE * LD + j * ROW_STEP * LD, vp + j * ROW_STEP * HD, true);
                }
            } else {
#pragma unroll
                for (int j = 0; j < TILE / ROW_STEP; ++j) {
                    const int v = v0 + r0 + j * ROW_STEP;
                    const bool valid = v < L;          // past L: zero-filled (never NaN garbage)
                    const int slot = !valid ? 0 : v < direct_end ? v : n_past + list[v - n_past];
                    const size_t off = (size_t)slot * HD;
                    cp_async16(ks + j * ROW_STEP * LD, k_src + off, valid);
                    cp_async16(ks + TILE * LD + j * ROW_STEP * LD, v_src + off, valid);
                }
            }
        }
        cp_async_commit();                             // empty groups keep the count uniform
    };
#pragma unroll 1
    for (int s = 0; s < C::STAGES - 1; ++s) load_tile(s);   // in flight while q is staged

    // q rows -> shared memory, scaled into the log2 domain and split into f16 hi + lo (all loads
    // first: the shared stores would otherwise serialise one global round trip per element)
    constexpr int Q_PER_THREAD = ROWS * HD / THREADS;
    const float* q_tok = p.q + ((size_t)token * p.n_heads + kvh * p.group) * HD;
    float qv[Q_PER_THREAD];
    if constexpr (!ROPE) {
#pragma unroll
        for (int j = 0; j < Q_PER_THREAD; ++j) {
            const int e = tid + j * THREADS, r = e / HD, d = e % HD;
            qv[j] = row0 + r < p.group ? __ldg(q_tok + (size_t)(row0 + r) * HD + d) : 0.0f;
        }
    } else {
        rope_stage<HD>(p, qv, q_tok, row0, kvh, tid, new_key >= 0, kv_new, blockIdx.z % p.row_tiles == 0);
    }
#pragma unroll
    for (int j = 0; j < Q_PER_THREAD; ++j) {
        const int e = tid + j * THREADS, r = e / HD, d = e % HD;
        const float v = qv[j] * p.q_scale;
        const __half hi = __float2half_rn(v);
        q_hi[r * LD + d] = hi;
        q_lo[r * LD + d] = __float2half_rn(v - __half2float(hi));
    }

    WarpState<HD> st;
    st.init();
#pragma unroll 1
    for (int k = 0; k < n_tiles; ++k) {
        cp_async_wait<C::STAGES - 2>();
        __syncthreads();                               // tile k landed; tile k-1's buffer is free
        load_tile(k + C::STAGES - 1);
        const int v0 = comp_cur.v0 + warp * WARP_SLOTS;
        advance(comp_cur);
        if (v0 < L) {
            __half* ks = pipe + (size_t)(k % C::STAGES) * 2 * TILE * LD + warp * WARP_SLOTS * LD;
            if constexpr (ROPE) {
                if (new_key >= v0 && new_key < v0 + WARP_SLOTS) {    // warp-uniform: the new key is ours
                    __half* krow = ks + (new_key - v0) * LD;
                    for (int c = tid & 31; c < 2 * C::CHUNKS; c += 32) {    // 16-byte pieces of K | V
                        __half* dst = c < C::CHUNKS ? krow + c * 8 : krow + TILE * LD + (c - C::CHUNKS) * 8;
                        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(kv_new + c * 8);
                    }
                    __syncwarp();
                }
            }
            warp_step<HD>(st, q_hi, q_lo, ks, ks + TILE * LD, v0, L);
        }
    }
    cp_async_wait<0>();
    __syncthreads();                                   // the pipeline area becomes the merge area
    warp_store<HD>(st, m_s, l_s, o_s);
    __syncthreads();

    // merge the warps' states: per-row weights first, then float4 sweeps over the outputs
    float* wt_s = o_s + (size_t)WARPS * ROWS * HD;     // [WARPS][ROWS]
    float* row_l = wt_s + WARPS * ROWS;                // [ROWS]
    float* row_m = row_l + ROWS;                       // [ROWS]
    if (tid < ROWS) {
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) m = fmaxf(m, m_s[w * ROWS + tid]);
        float l = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float wt = m == -INFINITY ? 0.0f : exp2f(m_s[w * ROWS + tid] - m);
            wt_s[w * ROWS + tid] = wt;
            l += wt * l_s[w * ROWS + tid];
        }
        row_m[tid] = m;
        row_l[tid] = l;
    }
    __syncthreads();
    for (int e = tid * 4; e < ROWS * HD; e += THREADS * 4) {
        const int r = e / HD, d = e % HD;
        if (row0 + r >= p.group) continue;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float wt = wt_s[w * ROWS + r];
            const float4 v = *reinterpret_cast<const float4*>(o_s + ((size_t)w * ROWS + r) * HD + d);
            acc.x += wt * v.x;
            acc.y += wt * v.y;
            acc.z += wt * v.z;
            acc.w += wt * v.w;
        }
        const float l = row_l[r];
        const size_t qrow = (size_t)token * p.n_heads + kvh * p.group + row0 + r;   // query row in (n, n_heads)
        if (p.n_splits == 1) {
            const float inv = l > 0.0f ? 1.0f / l : __int_as_float(0x7fffffff);
            *reinterpret_cast<float4*>(p.o + qrow * HD + d) = make_float4(acc.x * inv, acc.y * inv, acc.z * inv,
                                                                          acc.w * inv);
        } else {
            const size_t at = qrow * p.n_splits + split;
            *reinterpret_cast<float4*>(p.ws_acc + at * HD + d) = acc;
            if (d == 0) {
                p.ws_m[at] = row_m[r];
                p.ws_l[at] = l;
            }
        }
    }
}

// Combine the splits' partials: one block per query row (n * n_heads rows), COMBINE_THREADS
// threads. Warp w merges splits w, w + COMBINE_WARPS, ... (combine_unroll<HD>() of them per round,
// all loads of a round in flight at once: the launchers' up to 198 splits (HD <= 128) in one memory
// round trip) into its own
// (max, sum, acc) online-softmax state, lanes covering head_dim; the warps' states meet in shared
// memory.
constexpr int COMBINE_THREADS = 512;
constexpr int COMBINE_WARPS = COMBINE_THREADS / 32;
constexpr int MAX_SPLITS = 512;
template <int HD>
constexpr int combine_unroll() { return HD >= 256 ? 8 : 13; }   // registers: 13 x (HD / 32 + 2) floats

template <int HD>
__global__ void __launch_bounds__(COMBINE_THREADS) combine_kernel(const Params p) {
    constexpr int PER_LANE = HD / 32;          // 2, 4 or 8 consecutive dims
    constexpr int COMBINE_UNROLL = combine_unroll<HD>();
    __shared__ float wm[COMBINE_WARPS], wl[COMBINE_WARPS];
    __shared__ float wa[COMBINE_WARPS][HD];
    const size_t qrow = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* m_row = p.ws_m + qrow * p.n_splits;
    const float* l_row = p.ws_l + qrow * p.n_splits;
    const float* acc_row = p.ws_acc + qrow * p.n_splits * HD + lane * PER_LANE;
    pdl_wait();                  // the partials of the split kernel
    pdl_launch_dependents();     // the next projection may start fetching its weights
    const int L = visible_keys(p, (int)(qrow / p.n_heads), nullptr);
    const int n_active = min(p.n_splits, (L + p.chunk_len - 1) / p.chunk_len);
    float m = -INFINITY, l = 0.0f, a[PER_LANE];
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) a[j] = 0.0f;
    for (int s0 = warp; s0 < n_active; s0 += COMBINE_WARPS * COMBINE_UNROLL) {
        float ms[COMBINE_UNROLL], ls[COMBINE_UNROLL], as[COMBINE_UNROLL][PER_LANE];
#pragma unroll
        for (int u = 0; u < COMBINE_UNROLL; ++u) {
            const int s = s0 + u * COMBINE_WARPS;
            const bool ok = s < n_active;
            ms[u] = ok ? m_row[s] : -INFINITY;
            ls[u] = ok ? l_row[s] : 0.0f;
#pragma unroll
            for (int j = 0; j < PER_LANE; j += 2) {
                const float2 t = ok ? *reinterpret_cast<const float2*>(acc_row + (size_t)s * HD + j)
                                    : make_float2(0.f, 0.f);
                as[u][j] = t.x;
                as[u][j + 1] = t.y;
            }
        }
        float mb = m;
#pragma unroll
        for (int u = 0; u < COMBINE_UNROLL; ++u) mb = fmaxf(mb, ms[u]);
        if (mb == -INFINITY) continue;                 // nothing visible yet
        const float f = exp2f(m - mb);                 // m = -inf: 0
        l *= f;
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) a[j] *= f;
#pragma unroll
        for (int u = 0; u < COMBINE_UNROLL; ++u) {
            const float wt = exp2f(ms[u] - mb);        // padding (-inf): 0
            l += wt * ls[u];
#pragma unroll
            for (int j = 0; j < PER_LANE; ++j) a[j] += wt * as[u][j];
        }
        m = mb;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) wa[warp][lane * PER_LANE + j] = a[j];
    __syncthreads();
    for (int d = threadIdx.x; d < HD; d += COMBINE_THREADS) {
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < COMBINE_WARPS; ++w) mx = fmaxf(mx, wm[w]);
        float lsum = 0.0f, acc = 0.0f;
        if (mx != -INFINITY) {
#pragma unroll
            for (int w = 0; w < COMBINE_WARPS; ++w) {
                const float wt = exp2f(wm[w] - mx);
                lsum += wt * wl[w];
                acc += wt * wa[w][d];
            }
        }
        p.o[qrow * HD + d] = lsum > 0.0f ? acc / lsum : __int_as_float(0x7fffffff);
    }
}


// ---- host side: the split count, the workspace layout, the launch ---------------------------
// n_splits is a function of the model shape, max_ctx and chunk_len only (never of n or the mask):
// enough blocks to fill the GPU (blocks_per_sm * N_SMS over n_kv_heads * row tiles of ONE token),
// capped by the number of chunks max_ctx holds (at most MAX_SPLITS).
constexpr int N_SMS = 132;                      // H100/H200; only sizes the split count
constexpr size_t SMEM_PER_SM = 228 * 1024;

template <int HD>
constexpr int blocks_per_sm() {
    return (int)(SMEM_PER_SM / (Cfg<HD>::SMEM_BYTES + 1024)) > 0 ? (int)(SMEM_PER_SM / (Cfg<HD>::SMEM_BYTES + 1024))
                                                                 : 1;
}

inline int n_chunks_for(int max_ctx, int chunk_len) { return (max_ctx - 1) / chunk_len + 1; }
inline int row_tiles_for(int group) { return (group + ROWS - 1) / ROWS; }

template <int HD>
int splits_for(int n_kv_heads, int group, int max_ctx, int chunk_len) {
    const int target = blocks_per_sm<HD>() * N_SMS / (n_kv_heads * row_tiles_for(group));
    const int cap = n_chunks_for(max_ctx, chunk_len) < MAX_SPLITS ? n_chunks_for(max_ctx, chunk_len) : MAX_SPLITS;
    return target < 1 ? 1 : (target > cap ? cap : target);
}

// 0 for an unsupported head_dim
inline int splits_for_head_dim(int head_dim, int n_kv_heads, int group, int max_ctx, int chunk_len) {
    switch (head_dim) {
        case 64: return splits_for<64>(n_kv_heads, group, max_ctx, chunk_len);
        case 128: return splits_for<128>(n_kv_heads, group, max_ctx, chunk_len);
        case 256: return splits_for<256>(n_kv_heads, group, max_ctx, chunk_len);
        default: return 0;
    }
}

// workspace: acc [n_rows][n_splits][HD] | m [n_rows][n_splits] | l [n_rows][n_splits], n_rows = n * n_heads
inline size_t workspace_bytes_for(int n_rows, int n_splits, int head_dim) {
    return n_splits <= 1 ? 0 : (size_t)n_rows * n_splits * ((size_t)head_dim + 2) * sizeof(float);
}

inline void set_workspace(Params& p, void* workspace, int head_dim) {
    const size_t n_rows = (size_t)p.n * p.n_heads;
    p.ws_acc = (float*)workspace;
    p.ws_m = p.ws_acc + n_rows * p.n_splits * head_dim;
    p.ws_l = p.ws_m + n_rows * p.n_splits;
}

// The launch parameters of both entry points (decode: n = 1, mask = nullptr); n_splits = 0 for an
// unsupported head_dim. The workspace is set by set_workspace.
inline Params make_params(float* o, const float* q, const void* k_cache, const void* v_cache, const uint8_t* mask,
                          const int32_t* n_past, int n, const fd_attention_shape_t& shape, int chunk_len) {
    const int n_heads = shape.n_heads, n_kv_heads = shape.n_kv_heads, head_dim = shape.head_dim;
    const int max_ctx = shape.max_ctx;
    const float scale = shape.scale;
    Params p;
    p.q = q;
    p.k_cache = (const __half*)k_cache;
    p.v_cache = (const __half*)v_cache;
    p.n_past = n_past;
    p.mask = mask;
    p.o = o;
    p.ws_acc = p.ws_m = p.ws_l = nullptr;
    p.n = n;
    p.n_heads = n_heads;
    p.n_kv_heads = n_kv_heads;
    p.group = n_heads / n_kv_heads;
    p.row_tiles = row_tiles_for(p.group);
    p.max_ctx = max_ctx;
    p.chunk_len = chunk_len;
    p.n_splits = splits_for_head_dim(head_dim, n_kv_heads, p.group, max_ctx, chunk_len);
    p.q_scale = scale * LOG2E;
    p.k_new = p.v_new = nullptr;
    p.k_store = p.v_store = nullptr;
    p.positions = nullptr;
    p.theta = 0.0;
    p.rope_scaling = RopeScaling{};
    p.rope_dim = p.neox = 0;
    return p;
}

template <int HD, bool ROPE = false>
int launch(const Params& p, cudaStream_t stream) {
    const size_t smem = Cfg<HD>::SMEM_BYTES;
    cudaFuncSetAttribute(splitk_kernel<HD, ROPE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    int st = launch_pdl(splitk_kernel<HD, ROPE>, dim3(p.n_splits, p.n_kv_heads, p.n * p.row_tiles), dim3(THREADS),
                        smem, stream, p);
    if (st == 0 && p.n_splits > 1)
        st = launch_pdl(combine_kernel<HD>, dim3(p.n * p.n_heads), dim3(COMBINE_THREADS), 0, stream, p);
    return st;
}

template <bool ROPE = false>
int launch_head_dim(const Params& p, int head_dim, cudaStream_t stream) {
    switch (head_dim) {
        case 64: return launch<64, ROPE>(p, stream);
        case 128: return launch<128, ROPE>(p, stream);
        case 256: return launch<256, ROPE>(p, stream);
        default: return FD_E_SHAPE;
    }
}

}  // namespace attn
}  // namespace fd
