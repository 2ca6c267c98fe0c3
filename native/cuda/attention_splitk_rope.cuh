// attention_splitk_rope.cuh -- fd_attention_decode_rope's staging in split-K attention (attention_splitk.cuh
// describes the design) where K is float16: the new token's q and K rows RoPE'd in the block (rope_math.cuh, bit for
// bit fd_rope_kv_write's), the new K / V rows encoded and stored (encode_new_rows: a quantized V), and the new row's
// override of its tile row (new_row_override, also the quantized-K path's: attention_splitk_rope_rot.cuh stages
// that K). splitk_kernel (attention_splitk_kernel.cuh) calls them.
#pragma once

#include "attention_splitk_params.cuh"
#include "attention_splitk_rope_rot.cuh"

namespace fd {
namespace attn {

// ---- fd_attention_decode_rope's staging -----------------------------------------------------
// Thread tid's q elements are e = tid + j * THREADS (row e / HD of the tile, dim e % HD), i.e. the
// NU = max(1, HD / THREADS) distinct dims dim_u = (tid + u * THREADS) % HD, u = j % NU: one cos/sin
// (double pow + sincos) per distinct dim, computed in registers. qv[j] receives the rotated q value
// (unscaled, as the plain kernel loads it). If own_key: the new token's K (rotated) | V rows of KV head
// kvh, as float16, go to kv_new[0, 2 HD) (element c = tid + i * THREADS; K dims c < HD are the dims
// dim_i above), and if store also to the cache at slot *n_past.
// QKV (a q8_0 / q4_0 K or V): the new token's rotated K row and V row go to `stage` (2 HD floats of shared
// memory) first; then one thread per 32-value block encodes it (kv_quant.cuh, fd_rope_kv_write's rounding), puts
// the dequantized values -- float16(d * q), what dequant8 gives for the stored codes -- into kv_new, and (store)
// writes the codes and scale to the cache. A float16 side's block is rounded and stored as the plain kernel does.
// Only a float16 K with a quantized V comes here: a quantized K holds rotated keys and is staged by
// rope_stage_rotated (attention_splitk_rope_rot.cuh) instead.
template <int HD>
__device__ __forceinline__ void encode_new_rows(const Params& p, const float* stage, __half* kv_new, int kvh, int tid,
                                                bool store, int k_type, int v_type) {
    constexpr int NB = HD / kvq::BLOCK;              // blocks per row
    if (tid >= 2 * NB) return;
    const bool is_k = tid < NB;
    const int type = is_k ? k_type : v_type, b = is_k ? tid : tid - NB;
    const float* x = stage + tid * kvq::BLOCK;
    __half* out = kv_new + tid * kvq::BLOCK;
    const int slot = p.n_past[0];
    const size_t row = (size_t)kvh * p.max_ctx + slot;
    if (type == FD_KV_F16) {
        __half* cache = (is_k ? p.k_store : p.v_store) + row * HD + b * kvq::BLOCK;
        for (int j = 0; j < kvq::BLOCK; ++j) {
            out[j] = __float2half_rn(x[j]);
            if (store) cache[j] = out[j];
        }
        return;
    }
    const kvq::Plane& pl = is_k ? p.kq : p.vq;
    __half d;
    if (type == FD_KV_Q8_0) {
        int8_t q[kvq::BLOCK];
        kvq::encode_q8_0(x, q, &d);
        for (int j = 0; j < kvq::BLOCK; ++j) out[j] = __float2half_rn(__half2float(d) * (float)q[j]);
        if (store)
            for (int j = 0; j < kvq::BLOCK; ++j) reinterpret_cast<int8_t*>(pl.row_codes(row) + b * kvq::BLOCK)[j] = q[j];
    } else {
        uint8_t q[kvq::BLOCK / 2];
        kvq::encode_q4_0(x, q, &d);
        for (int j = 0; j < kvq::BLOCK; ++j) {
            const int code = j < kvq::BLOCK / 2 ? (q[j] & 15) : (q[j - kvq::BLOCK / 2] >> 4);
            out[j] = __float2half_rn(__half2float(d) * (float)(code - 8));
        }
        if (store)
            for (int j = 0; j < kvq::BLOCK / 2; ++j) pl.row_codes(row)[b * (kvq::BLOCK / 2) + j] = q[j];
    }
    if (store) pl.row_scales(row)[b] = d;
    const __half* ring = is_k ? p.k_ring : p.v_ring;  // a window: the new row is in its own block, read exact
    if (ring != nullptr) {
        const size_t ring_row = window_ring_row(p, kvh, slot);
        for (int j = 0; j < kvq::BLOCK; ++j)
            out[j] = window_value<HD>(ring, ring_row, b * kvq::BLOCK + j, x[j], out[j], store);
    }
}

// Thread tid's rope coefficients: for each of its NU distinct dims, cos / sin at the new token's position (double
// pow + sincos: computed before pdl_wait, see splitk_kernel), the pair partner and the pair side.
template <int HD>
struct RopeCoefs {
    static constexpr int NU = HD > THREADS ? HD / THREADS : 1;
    float cs[NU], sn[NU];
    int partner[NU];
    bool first[NU], rot[NU];
};

// The step's table (p.rope_tab_in, fd_rope_t.table_mode 2) was written by an earlier launch that has completed
// (flashd_attention.h): read through L2, never a stale L1 line of an earlier step's table.
__device__ __forceinline__ float rope_tab_load(const float* a) {
#if defined(__HIP_PLATFORM_AMD__)
    return *reinterpret_cast<const volatile float*>(a);
#else
    return __ldcg(a);
#endif
}

// tab: the table to read (p.rope_tab_in, or fd_attention_masked_rope's row of this token), or NULL: computed here
// (COMPUTE false: never NULL -- the MR kernel then holds no float64 pow / sincos code)
template <int HD, bool COMPUTE = true>
__device__ __forceinline__ void rope_coefs(const Params& p, int tid, RopeCoefs<HD>& rc, const float* tab) {
    static_assert(HD % THREADS == 0 || THREADS % HD == 0, "dims per thread");
    const bool neox = p.neox != 0;
    // block 0 (of every KV head and row tile 0) stores the table where asked: each pair's first dim writes its j
    const bool store = p.rope_tab_out != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
#pragma unroll
    for (int u = 0; u < RopeCoefs<HD>::NU; ++u) {
        const int d = (tid + u * THREADS) % HD;
        int j = 0;
        rc.rot[u] = d < p.rope_dim;
        rc.partner[u] = d;
        rc.first[u] = true;
        rc.cs[u] = 1.0f;
        rc.sn[u] = 0.0f;
        if (rc.rot[u]) {
            rope_pair_of(d, p.rope_dim, neox, j, rc.partner[u], rc.first[u]);
            if (!COMPUTE || tab) {
                rc.cs[u] = rope_tab_load(tab + 2 * j);
                rc.sn[u] = rope_tab_load(tab + 2 * j + 1);
            } else if constexpr (COMPUTE) {
                rope_cos_sin(p.positions[0], j, p.rope_dim, p.theta, p.rope_scaling, rc.cs[u], rc.sn[u]);
                if (store && rc.first[u] && tid + u * THREADS < HD) {
                    p.rope_tab_out[2 * j] = rc.cs[u];
                    p.rope_tab_out[2 * j + 1] = rc.sn[u];
                }
            }
        }
    }
}

template <int HD, bool QKV = false>
__device__ __forceinline__ void rope_stage(const Params& p, const RopeCoefs<HD>& rc, float (&qv)[ROWS * HD / THREADS],
                                           const float* q_tok, int row0, int kvh, int tid, bool own_key,
                                           __half* kv_new, bool store, float* stage, int k_type, int v_type,
                                           bool live = true) {   // live false: every global load predicated off
    constexpr int Q_PER_THREAD = ROWS * HD / THREADS;
    constexpr int NU = RopeCoefs<HD>::NU;
    const float* cs = rc.cs;
    const float* sn = rc.sn;
    const int* partner = rc.partner;
    const bool* first = rc.first;
    const bool* rot = rc.rot;
    float xv[Q_PER_THREAD], yv[Q_PER_THREAD];
    // the new K | V row's values (own_key): element c = tid + i * THREADS, K dim c (and its rope partner) or V dim
    // c - HD, loaded here with q's so that both global round trips overlap (they used to follow q's rotation)
    constexpr int NI = (2 * HD + THREADS - 1) / THREADS;
    float kv_x[NI], kv_y[NI];
    const float* kr = p.k_new + (size_t)kvh * HD;
    const float* vr = p.v_new + (size_t)kvh * HD;
    if (own_key) {
#pragma unroll
        for (int i = 0; i < NI; ++i) {
            const int c = tid + i * THREADS, u = i < NU ? i : 0;
            kv_x[i] = kv_y[i] = 0.0f;
            if (c >= 2 * HD) continue;
            if (!live) continue;
            if (c < HD) {
                kv_x[i] = __ldg(kr + c);
                if (rot[u]) kv_y[i] = __ldg(kr + partner[u]);
            } else {
                kv_x[i] = __ldg(vr + (c - HD));
            }
        }
    }
#pragma unroll
    for (int j = 0; j < Q_PER_THREAD; ++j) {            // all loads first
        const int e = tid + j * THREADS, r = e / HD, d = e % HD, u = j % NU;
        const bool in = live && row0 + r < p.group;
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
#pragma unroll
        for (int i = 0; i < NI; ++i) {
            const int c = tid + i * THREADS;
            if (c >= 2 * HD) break;
            float val;
            if (c < HD) {                               // K dim c == dim_i of the table above
                const int u = i < NU ? i : 0;
                val = rot[u] ? rope_rotated(kv_x[i], kv_y[i], cs[u], sn[u], first[u]) : kv_x[i];
            } else {
                val = kv_x[i];
            }
            if constexpr (QKV) {
                stage[c] = val;
            } else {
                const __half h = __float2half_rn(val);
                kv_new[c] = h;
                if (store) {
                    __half* cache = c < HD ? p.k_store : p.v_store;
                    cache[((size_t)kvh * p.max_ctx + slot) * HD + (c < HD ? c : c - HD)] = h;
                }
            }
        }
        if constexpr (QKV) {                            // own_key is block-uniform: the barriers are too
            __syncthreads();                            // both rows staged
            encode_new_rows<HD>(p, stage, kv_new, kvh, tid, store, k_type, v_type);
            __syncthreads();                            // stage (q_hi's area) free again, kv_new written
        }
    }
}

// ROPE, step (a) below: if the new key is one of the warp's 16 keys v0 .. v0 + 15 (warp-uniform), its row of the
// float16 K | V tile (ks: the warp's first row) -- the cache's stale copy -- becomes the new row's values, kv_new.
template <int HD>
__device__ __forceinline__ void new_row_override(__half* ks, const __half* kv_new, int new_key, int v0, int lane) {
    constexpr int LD = Cfg<HD>::LD, CHUNKS = Cfg<HD>::CHUNKS;
    if (new_key < v0 || new_key >= v0 + WARP_SLOTS) return;
    __half* krow = ks + (new_key - v0) * LD;
    for (int c = lane; c < 2 * CHUNKS; c += 32) {        // 16-byte pieces of K | V
        __half* dst = c < CHUNKS ? krow + c * 8 : krow + TILE * LD + (c - CHUNKS) * 8;
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(kv_new + c * 8);
    }
    __syncwarp();
}

// ---- fd_attention_masked_rope's new rows (splitk_kernel's MR variant) ------------------------------------------
// A row of K | V is HD / 4 quad tasks of 8 values, each two float4 loads (and, RoPE'd, two float4 of the row's table
// row) and two 8-byte stores: quad g < HD / 8 holds K's pair slots 4g .. 4g + 3 -- RoPE pairs where 4g < rope_dim / 2
// (rope_dim % 8 == 0, so a quad is all pairs or none), dims 4g .. 4g + 3 with their NeoX partners rope_dim / 2 further,
// or adjacent pairs in dims 8g .. 8g + 7; unrotated slots t hold dims 2t, so those are 8g .. 8g + 7 too -- and quad
// g >= HD / 8 holds V's dims 8 (g - HD / 8) .. + 7. The pair slots' cos / sin are 8 consecutive floats of the table
// row at 8g either way. THREADS is a multiple of HD / 4, so a thread's quad is the same in every row (MrLane: worked
// out once) and RPP rows go at once. The kernel runs this once a launch between GEMV launches: its staging is one
// warp's instruction stream a row (a 4-warp block), so values are handled 8 a task, not 2 -- a first version with a
// pair a task cost ~0.1-0.15 us a row and lost above 8 rows (bench/NOTES.md, session 43); and the code is kept short
// (code size is latency on a cold instruction cache: a general task loop unrolled was 128 KB of SASS and lost).
constexpr int MR_BATCH = 2;      // rows a thread loads together: x RPP rows (8 at head_dim 128) a round trip

template <int HD>
struct MrLane {
    static constexpr int QPR = HD / 4;               // quads a row
    static constexpr int RPP = THREADS / QPR;        // rows one pass of the block covers
    static_assert(THREADS % QPR == 0, "a thread's quad is the same in every row");
    int lo, hi;                // the quad's two float4: first dims in the row's K | V (V: HD + d)
    bool k, rot, neox;         // a K quad; RoPE pairs; NeoX pairs (a pair's dims in lo and hi, else within lo | hi)
    int tab;                   // its cos / sin: table row + tab .. + 7
    int r_in;                  // this thread's row within a pass

    __device__ __forceinline__ MrLane(const Params& p, int tid) {
        const int g = tid % QPR, half = p.rope_dim / 2;
        r_in = tid / QPR;
        k = g < HD / 8;
        rot = k && 4 * g < half;
        neox = rot && p.neox != 0;
        tab = 8 * g;
        lo = neox ? 4 * g : k ? 8 * g : HD + 8 * (g - HD / 8);
        hi = neox ? 4 * g + half : lo + 4;
    }
};

// The step's rows table (written by an earlier launch that has completed): 4 floats through L2, as rope_tab_load
__device__ __forceinline__ float4 rope_tab_load4(const float* a) {
#if defined(__HIP_PLATFORM_AMD__)
    const volatile float* v = a;
    return make_float4(v[0], v[1], v[2], v[3]);
#else
    return __ldcg(reinterpret_cast<const float4*>(a));
#endif
}

struct MrQuad {
    float4 a, b;               // the values at lo and hi
    float4 c0, c1;             // cos / sin of pair slots 4g .. 4g + 3, interleaved (RoPE quads)
};

// Quad `lane` of row `row` of k_new / v_new (16-byte aligned rows: fd_attention_masked_rope checks k and v)
template <int HD>
__device__ __forceinline__ MrQuad mr_load(const Params& p, const MrLane<HD>& lane, int row, int kvh) {
    const size_t base = ((size_t)row * p.n_kv_heads + kvh) * HD;
    const float* src = (lane.k ? p.k_new : p.v_new) + base;
    const int off = lane.k ? 0 : HD;
    MrQuad t;
    t.a = __ldg(reinterpret_cast<const float4*>(src + (lane.lo - off)));
    t.b = __ldg(reinterpret_cast<const float4*>(src + (lane.hi - off)));
    t.c0 = t.c1 = make_float4(1.0f, 0.0f, 1.0f, 0.0f);
    if (lane.rot) {
        const float* tab = p.rope_tab_in + (size_t)row * p.rope_dim + lane.tab;
        t.c0 = rope_tab_load4(tab);
        t.c1 = rope_tab_load4(tab + 4);
    }
    return t;
}

__device__ __forceinline__ uint2 mr_halves(float x, float y, float z, float w) {
    const __half2 h0 = __halves2half2(__float2half_rn(x), __float2half_rn(y));
    const __half2 h1 = __halves2half2(__float2half_rn(z), __float2half_rn(w));
    return make_uint2(*reinterpret_cast<const unsigned*>(&h0), *reinterpret_cast<const unsigned*>(&h1));
}

// The quad's float16 values (rope_kv_write's float32 arithmetic and rounding: rope_rotated on each pair, so the same
// bits) into `dst` (the row's 2 HD halves) and, with store, into the caches at `slot`
template <int HD>
__device__ __forceinline__ void mr_store(const Params& p, const MrLane<HD>& lane, MrQuad t, __half* dst, int kvh,
                                         int slot, bool store) {
    const float c[8] = {t.c0.x, t.c0.y, t.c0.z, t.c0.w, t.c1.x, t.c1.y, t.c1.z, t.c1.w};   // pair m: c[2m], c[2m + 1]
    float x[8] = {t.a.x, t.a.y, t.a.z, t.a.w, t.b.x, t.b.y, t.b.z, t.b.w};
    if (lane.neox) {           // pair m: dims lo + m (first) and hi + m
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const float a = x[m], b = x[4 + m];
            x[m] = rope_rotated(a, b, c[2 * m], c[2 * m + 1], true);
            x[4 + m] = rope_rotated(b, a, c[2 * m], c[2 * m + 1], false);
        }
    } else if (lane.rot) {     // pair m: dims lo + 2m (first) and lo + 2m + 1
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const float a = x[2 * m], b = x[2 * m + 1];
            x[2 * m] = rope_rotated(a, b, c[2 * m], c[2 * m + 1], true);
            x[2 * m + 1] = rope_rotated(b, a, c[2 * m], c[2 * m + 1], false);
        }
    }
    const uint2 ha = mr_halves(x[0], x[1], x[2], x[3]), hb = mr_halves(x[4], x[5], x[6], x[7]);
    if (dst != nullptr) {
        *reinterpret_cast<uint2*>(dst + lane.lo) = ha;
        *reinterpret_cast<uint2*>(dst + lane.hi) = hb;
    }
    if (store) {
        __half* cache = (lane.k ? p.k_store : p.v_store) + ((size_t)kvh * p.max_ctx + slot) * HD;
        const int off = lane.k ? 0 : HD;
        *reinterpret_cast<uint2*>(cache + (lane.lo - off)) = ha;
        *reinterpret_cast<uint2*>(cache + (lane.hi - off)) = hb;
    }
}

// The MR variant's staging (all threads; after pdl_wait): q's rows of this block rotated into qv as rope_stage
// rotates them (coefficients rc: the token's table row), and the K | V rows of new rows list[0 .. count) -- the
// token's visible new slots that this split attends -- plus, if `store` (split 0, row tile 0 of the token: the block
// that writes the token's own cache row), the token's row -- at its place in the list if visible, else appended at
// index count -- RoPE'd into `rows` (row r at rows + r * 2 HD); the store block writes its row to the caches at slot
// *n_past + token (inside [0, max_ctx)). q's loads go out with the first batch of rows.
template <int HD>
__device__ __forceinline__ void masked_rope_stage(const Params& p, const RopeCoefs<HD>& rc,
                                                  float (&qv)[ROWS * HD / THREADS], const float* q_tok, int row0,
                                                  int kvh, int tid, const int* list, int count, int token, bool store,
                                                  __half* rows) {
    constexpr int Q_PER_THREAD = ROWS * HD / THREADS;
    constexpr int NU = RopeCoefs<HD>::NU;
    constexpr int RPP = MrLane<HD>::RPP;
    const MrLane<HD> lane(p, tid);
    int own = count;                                  // the store block's row: where the list has it, else appended
    if (store)
        for (int r = 0; r < count; ++r)
            if (list[r] == token) own = r;
    const int n_rows = count + (store && own == count ? 1 : 0);
    const int slot = p.n_past[0] + token;
    const bool slot_in = slot >= 0 && slot < p.max_ctx;
    float xv[Q_PER_THREAD], yv[Q_PER_THREAD];
#pragma unroll 1
    for (int r0 = 0; r0 < n_rows || r0 == 0; r0 += MR_BATCH * RPP) {
        MrQuad t[MR_BATCH];
#pragma unroll
        for (int i = 0; i < MR_BATCH; ++i) {
            const int r = r0 + i * RPP + lane.r_in;
            if (r < n_rows) t[i] = mr_load<HD>(p, lane, r < count ? list[r] : token, kvh);
        }
        if (r0 == 0) {                                // q's loads in the same round trip as the first batch
#pragma unroll
            for (int j = 0; j < Q_PER_THREAD; ++j) {
                const int e = tid + j * THREADS, r = e / HD, d = e % HD, u = j % NU;
                const bool in = row0 + r < p.group;
                const float* row = q_tok + (size_t)(row0 + r) * HD;
                xv[j] = in ? __ldg(row + d) : 0.0f;
                yv[j] = in && rc.rot[u] ? __ldg(row + rc.partner[u]) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < Q_PER_THREAD; ++j) {  // rows past the group stay exactly 0 (as rope_stage)
                const int u = j % NU, r = (tid + j * THREADS) / HD;
                qv[j] = rc.rot[u] && row0 + r < p.group ? rope_rotated(xv[j], yv[j], rc.cs[u], rc.sn[u], rc.first[u])
                                                        : xv[j];
            }
        }
#pragma unroll
        for (int i = 0; i < MR_BATCH; ++i) {
            const int r = r0 + i * RPP + lane.r_in;
            if (r < n_rows)
                mr_store<HD>(p, lane, t[i], rows + (size_t)r * 2 * HD, kvh, slot, store && r == own && slot_in);
        }
    }
}

// The store block's own row alone, straight to the caches (a token whose row sees no key at all: the kernel returns
// before masked_rope_stage)
template <int HD>
__device__ __forceinline__ void mr_store_own_row(const Params& p, int kvh, int token, int tid) {
    const MrLane<HD> lane(p, tid);
    const int slot = p.n_past[0] + token;
    if (lane.r_in != 0 || slot < 0 || slot >= p.max_ctx) return;
    mr_store<HD>(p, lane, mr_load<HD>(p, lane, token, kvh), nullptr, kvh, slot, true);
}

// MR, each tile: the warp's keys v0 .. v0 + 15 that are new slots (v >= n_past, v < L: the (v - n_past)-th visible new
// row) get their rows of the float16 K | V tile (ks: the warp's first row) from `rows` -- the tile's copies of those
// slots are the cache's stale rows. After the pipeline's __syncthreads (the copies have landed); __syncwarp orders
// the stores before the warp's ldmatrix reads.
template <int HD>
__device__ __forceinline__ void masked_rows_override(__half* ks, const __half* rows, int n_past, int L, int v0,
                                                     int lane) {
    constexpr int LD = Cfg<HD>::LD, CHUNKS = Cfg<HD>::CHUNKS;
    const int first = max(v0, n_past), end = min(v0 + WARP_SLOTS, L);
    if (first >= end) return;
    for (int c = lane; c < (end - first) * 2 * CHUNKS; c += 32) {   // 16-byte pieces of K | V, row by row
        const int v = first + c / (2 * CHUNKS), piece = c % (2 * CHUNKS);
        __half* krow = ks + (v - v0) * LD;
        __half* dst = piece < CHUNKS ? krow + piece * 8 : krow + TILE * LD + (piece - CHUNKS) * 8;
        *reinterpret_cast<uint4*>(dst) =
            *reinterpret_cast<const uint4*>(rows + (size_t)(v - n_past) * 2 * HD + piece * 8);
    }
    __syncwarp();
}

}  // namespace attn
}  // namespace fd
