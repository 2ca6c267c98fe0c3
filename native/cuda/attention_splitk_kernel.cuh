// attention_splitk_kernel.cuh -- the split kernel of split-K attention (attention_splitk.cuh describes the
// design): splitk_kernel, one block per (split, KV head, token x query-row tile), streams its split's
// chunks through the cp.async pipeline, merges its 4 warps' softmax states and writes the output (one
// split) or the split's partial for combine_kernel; with ROPE (fd_attention_decode_rope) it also rotates
// q and the new key and writes the new K/V row (rope_stage; a quantized K: attention_splitk_rope_rot.cuh).
#pragma once

#include "attention_splitk_warp.cuh"
#include "attention_splitk_qstage.cuh"
#include "attention_splitk_rope.cuh"

namespace fd {
namespace attn {

// o's codes for head h of `token` (flashd_attention.h o_codes; head_dim 128, so the head is one x_codes.cuh group),
// called by a whole warp whose lane holds the head's values d .. d + 3 (d = 4 lane): the codes as one 4-byte store,
// the scale by lane 0. The same definition as the GEMV's own quantization, so the same codes.
__device__ __forceinline__ void store_o_codes(const Params& p, int token, int h, int d, float4 v) {
    const float m = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    const float inv = xcodes_inv(m);
    const unsigned packed = (unsigned)(xcodes_code(v.x, inv) & 0xff) | (unsigned)(xcodes_code(v.y, inv) & 0xff) << 8 |
                            (unsigned)(xcodes_code(v.z, inv) & 0xff) << 16 | (unsigned)(xcodes_code(v.w, inv) & 0xff) << 24;
    const size_t row = (size_t)token * p.n_heads + h;
    *reinterpret_cast<unsigned*>(p.oq + row * XCODES_GROUP + d) = packed;
    if ((threadIdx.x & 31) == 0)
        p.osc[((size_t)(token / XCODES_ROWS) * p.n_heads + h) * XCODES_ROWS + token % XCODES_ROWS] = xcodes_scale(m);
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
//
// QKV (a q8_0 / q4_0 K or V, p.k_type / p.v_type; shared memory qkv_smem_bytes): the tiles' rows arrive as
// stored (codes and scales; a float16 side's values) in a raw cp.async ring of QCfg<HD>::STAGES, and each warp
// dequantizes its 16 rows of the landed tile into the one float16 K | V tile at the start of the pipeline area
// (attention_splitk_qstage.cuh), values float16(d * q); the warp's rows of that tile are its own, so the ring's
// __syncthreads (the slot it refills was dequantized before it) plus a __syncwarp order everything. The
// warp step is the plain kernel's, so o is the float16 path's attention over those float16 values, and decode
// and masked attention stay bit for bit consistent. The ROPE override (a) goes over the dequantized row. With
// ROPE, the new key's rows are encoded as fd_rope_kv_write encodes them and attended dequantized
// (encode_new_rows), so o and the cache equal fd_rope_kv_write + fd_attention_decode's over the quantized cache.
// A quantized K (rotated keys) is staged by rope_stage_rotated (attention_splitk_rope_rot.cuh): q in a warp-per-row
// layout, rotated in registers; its cos / sin table sits in the dequantized tile, free until the main loop.
//
// KVT (QKV kernels): the K and V types as k_type * 4 + v_type, compile-time, so that each instantiation holds only
// its own types' loaders, dequantizers and encoders (p.k_type / p.v_type must agree: the launcher picks it). One
// kernel for every type pair was 187 KB of SASS at HD 128 with ROPE (the float16 one 54 KB), and a decode step runs
// it once per CTA: at short depth its time was instruction fetch (bench/NOTES.md, session 13).
//
// WIN (a window, p.window > 0; QKV): the query's position is
// L - 1 (decode: n_past; a masked row: its path's last node), and a tile at or past win_start = window * ((L - 1) /
// window) -- tiles are 64 keys, 64-aligned, so wholly in or out -- is not staged raw but copied from the window's
// float16 rows by each warp when it attends it (window_rows) into the float16 tile (FRAG keeps one for these), then
// attended as a dequantized tile is (FRAG: warp_step_qf16, fragments in the code step's order from those rows). With
// ROPE the new row's tile values are float16(x) and its ring row is stored (window_value), as fd_rope_kv_write +
// fd_attention_decode.
//
// MR > 0 (fd_attention_masked_rope; MR is the pipeline's stage count, mr_stages: n tokens under a mask, float16 K and
// V, head_dim <= 128, n <= MR_MAX_NEW): q, k and v are the QKV projection's outputs as they are, row i's cos / sin in
// the rows table (fd_rope_kv_write stored it with the forward's first layer). As ROPE, the plan (the mask and n_past
// are the forward's inputs), the first tiles' copies and the table's loads run before pdl_wait; after it
// masked_rope_stage rotates the block's q rows, RoPEs the token's visible new rows into shared memory (`mrows`, MrCfg;
// only in a split that attends a new slot) and -- in the token's store block, split 0 and row tile 0 -- writes the
// token's own row to the cache at slot n_past + token; masked_rows_override puts the visible rows over each tile's
// stale copies of their slots. So o and the cache equal fd_rope_kv_write + fd_attention_masked's bit for bit (the
// same rope_math.cuh arithmetic and roundings), and q, k, v are left unrotated.
template <int HD, bool ROPE = false, bool QKV = false, int KVT = 0, bool WIN = false, int MR = 0>
__global__ void __launch_bounds__(THREADS, 1) splitk_kernel(const Params p) {
    static_assert(QKV || KVT == 0, "float16 K and V: KVT 0");
    static_assert(!WIN || QKV, "a window is beside a quantized side");
    static_assert(!MR || (!ROPE && !QKV && HD <= 128), "MR: float16 K and V, no decode rope, head_dim <= 128");
    constexpr int k_type = KVT >> 2, v_type = KVT & 3;
    constexpr bool FRAG = QKV && frag_types(KVT);     // both quantized: fragments from the raw ring (qfrag.cuh)
    constexpr bool F16_TILE = QKV && (!FRAG || WIN);  // a float16 K | V tile before the raw ring
    using C = Cfg<HD>;
    constexpr int LD = C::LD;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half* q_hi = reinterpret_cast<__half*>(smem_raw);
    __half* q_lo = q_hi + ROWS * LD;
    int* list = reinterpret_cast<int*>(q_lo + ROWS * LD);   // [MAX_NEW] visible new slots (masked mode)
    __half* mrows = reinterpret_cast<__half*>(list + MAX_NEW);   // MR: [MR_MAX_NEW + 1][2 HD] new K | V rows
    __half* pipe = MR ? mrows + MrCfg<HD, MR ? MR : 2>::ROWS_BYTES / sizeof(__half)   // STAGES x (K, V [TILE][LD])
                      : mrows;
    // QKV: pipe is one K | V tile, then the raw ring (attention_splitk_qstage.cuh); FRAG: the raw ring alone (with
    // WIN the tile too: a window tile's float16 rows)
    constexpr int N_STAGES = QKV ? QCfg<HD>::STAGES : MR ? MR : C::STAGES;
    uint8_t* qring = reinterpret_cast<uint8_t*>(F16_TILE ? pipe + 2 * TILE * LD : pipe);
    const QSide k_side = qside(p.k_cache, p.kq, k_type, HD, FRAG), v_side = qside(p.v_cache, p.vq, v_type, HD, FRAG);
    const int q_stage_bytes = TILE * (k_side.row_bytes + v_side.row_bytes);
    float* m_s = reinterpret_cast<float*>(pipe);      // merge area, after the pipeline drains
    float* l_s = m_s + WARPS * ROWS;
    float* o_s = l_s + WARPS * ROWS;

    const int split = blockIdx.x, kvh = blockIdx.y;
    const int token = blockIdx.z / p.row_tiles, row0 = (blockIdx.z % p.row_tiles) * ROWS;   // row = head in group
    const int tid = threadIdx.x, warp = tid >> 5;
    constexpr bool ROT_K = ROPE && QKV && k_type != FD_KV_F16;   // a quantized K: rope_stage_rotated's own coefficients
    // RoPE from the step's table (fd_rope_t.table_mode 2): its loads issued first, in flight under the plan and the
    // first tiles' copies; computed (float64), later, otherwise
    RopeCoefs<HD> rc;
    if constexpr (ROPE && !ROT_K)
        if (p.rope_tab_in) rope_coefs<HD>(p, tid, rc, p.rope_tab_in);
    if constexpr (MR) rope_coefs<HD, false>(p, tid, rc, p.rope_tab_in + (size_t)token * p.rope_dim);
    // ROPE (one decode token): everything but q and the new K/V row was written two or more launches back -- the
    // cache rows below slot n_past, n_past and the position by earlier steps; every kernel of this library triggers
    // its dependents only after its own pdl_wait, so the kernel before the previous one has completed when this one
    // starts -- so the plan, the first tiles' copies and the rope's cos / sin run before pdl_wait, under the QKV
    // projection's tail. (The copy of the stale row at slot n_past is overwritten in shared memory by (a) below.)
    // Otherwise the cache or the mask may be the previous kernel's: everything after pdl_wait.
    // MR: the mask, n_past and the table are the forward's inputs or two or more launches back, as above.
    if constexpr (!ROPE && !MR) {
        pdl_wait();              // q, the cache rows, the mask and n_past come from earlier kernels
        pdl_launch_dependents(); // the combine kernel may start waiting on us now
    }
    // MR: the block that writes the token's own K / V row to the cache (whatever its visibility)
    const bool mr_store_block = MR && split == 0 && blockIdx.z % p.row_tiles == 0;
    const int n_past = max(p.n_past[0], 0);
    const int L = visible_keys(p, token, list);       // virtual keys [0, L)
    const int n_chunks = (L + p.chunk_len - 1) / p.chunk_len;
    if (n_chunks == 0) {                              // no key at all (masked, n_past 0, empty row): NaN
        if constexpr (MR) {
            pdl_wait();                                // o may be an earlier kernel's input; q, k, v the QKV's
            pdl_launch_dependents();
            if (mr_store_block) mr_store_own_row<HD>(p, kvh, token, tid);   // the token's row still goes to the cache
        }
        if (split == 0) {                              // (the combine skips the row)
            for (int e = tid; e < ROWS * HD; e += THREADS)
                if (row0 + e / HD < p.group)
                    p.o[((size_t)token * p.n_heads + kvh * p.group + row0 + e / HD) * HD + e % HD] =
                        __int_as_float(0x7fffffff);
            if constexpr (HD == XCODES_GROUP) {
                const float nan = __int_as_float(0x7fffffff);
                if (p.oq != nullptr)
                    for (int r = warp; r < ROWS && row0 + r < p.group; r += WARPS)
                        store_o_codes(p, token, kvh * p.group + row0 + r, 4 * (tid & 31),
                                      make_float4(nan, nan, nan, nan));
            }
        }
        return;
    }
    // A row of at most p.single_chunks chunks is attended by split 0 alone, over all its chunks in order (ns = 1:
    // no partials, the output written here, the combine skips the row); a function of the row's key count only,
    // so decode and masked rows agree.
    const int win_start = WIN ? p.window * ((L - 1) / p.window) : INT_MAX;   // keys read from float16 copies
    const bool single = n_chunks <= p.single_chunks;
    const int ns = single ? 1 : p.n_splits;
    if (split >= (single ? 1 : n_chunks)) return;    // this split has no key at this depth
    // ROPE: slot of the new key if this split owns it and it is inside the cache, else -1 (no key has
    // that number); its float16 K | V rows in the list area
    __half* kv_new = reinterpret_cast<__half*>(list);
    int new_key = -1;
    if constexpr (ROPE) {
        const int raw = p.n_past[0];
        if (raw >= 0 && raw < p.max_ctx && (raw / p.chunk_len) % ns == split) new_key = raw;
    }
    __syncthreads();                                  // list written
    // keys below this are slots of their own number (decode: all of them; masked: the committed ones)
    const int direct_end = p.mask == nullptr ? L : min(n_past, L);

    // this split's tiles: chunks split, split + n_splits, ...; all full but the global last one
    const int tiles_per_chunk = p.chunk_len / TILE;
    const int n_my_chunks = (n_chunks - split + ns - 1) / ns;
    const int last_chunk = split + (n_my_chunks - 1) * ns;
    const int last_tiles = min(tiles_per_chunk, (L - last_chunk * p.chunk_len + TILE - 1) / TILE);
    const int n_tiles = (n_my_chunks - 1) * tiles_per_chunk + last_tiles;
    // tile k of this split starts at key (split + (k / tpc) * n_splits) * chunk_len + (k % tpc) * TILE;
    // two cursors walk that sequence (the loader runs STAGES - 1 tiles ahead) without divisions
    struct Cursor {
        int v0, t, chunk0;
    };
    const int chunk_step = ns * p.chunk_len;
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
            __half* ks = pipe + (size_t)(k % N_STAGES) * 2 * TILE * LD + r0 * LD + piece * 8;
            if constexpr (QKV) {                       // raw rows into ring stage k % N_STAGES (see above)
                uint8_t* dst = qring + (size_t)(k % N_STAGES) * q_stage_bytes;
                const size_t head_row = (size_t)kvh * p.max_ctx;
                if (WIN && v0 >= win_start) {
                    // a window tile: its warps copy their rows when they attend it (window_rows)
                } else if (v0 + TILE <= direct_end) {  // keys are slots, all visible: no per-row checks
                    stage_tile<HD, FRAG ? CODE_PAD : 0>(dst, k_side, v_side, [&](int i, bool& valid, size_t& row) {
                        valid = true;
                        row = head_row + v0 + i;
                    }, tid);
                } else {
                    stage_tile<HD, FRAG ? CODE_PAD : 0>(dst, k_side, v_side, [&](int i, bool& valid, size_t& row) {
                        const int v = v0 + i;
                        valid = v < L;                 // past L: zero-filled
                        row = head_row + (!valid ? 0 : v < direct_end ? v : n_past + list[v - n_past]);
                    }, tid);
                }
            } else if (v0 + TILE <= direct_end) {      // keys are slots: constant offsets only
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
    // FRAG && WIN: the split's first window tile (v0 = pre_v0) is copied into the float16 tile now, its group the
    // oldest, so the ring's first wait covers it; only window tiles use that tile there, and a split attends its
    // tiles in key order, so nothing overwrites it before. Later window tiles of the split (a short row's single
    // split takes them all) are copied when attended (window_rows).
    int pre_v0 = -1;
    if constexpr (FRAG && WIN) {
        const int c0 = win_start / p.chunk_len;
        const int c = c0 + ((split - c0) % ns + ns) % ns;      // the split's first chunk at or past c0
        const int v = c == c0 ? win_start : c * p.chunk_len;
        if (c < n_chunks && v < L) {
            pre_v0 = v;
            if (v + warp * WARP_SLOTS < L)
                window_rows_issue<HD>(pipe + warp * WARP_SLOTS * LD, p, kvh, v + warp * WARP_SLOTS, L, direct_end,
                                      n_past, list, tid & 31);
        }
        cp_async_commit();
    }
#pragma unroll 1
    for (int s = 0; s < N_STAGES - 1; ++s) load_tile(s);    // in flight while q is staged
    if constexpr (MR) {
        pdl_wait();              // q, k and v are the QKV projection's
        pdl_launch_dependents();
    }
    // ROT_K's cos / sin table: in the dequantized tile, or (FRAG, no such tile) in the ring's last stage -- neither is
    // written before the main loop's first __syncthreads
    float* rope_tab = reinterpret_cast<float*>(FRAG ? qring + (size_t)(N_STAGES - 1) * q_stage_bytes
                                                    : reinterpret_cast<uint8_t*>(pipe));
    if constexpr (ROPE && !ROT_K)
        if (!p.rope_tab_in) rope_coefs<HD>(p, tid, rc, nullptr);
    if constexpr (ROT_K) rope_table_rotated(p, rope_tab, tid);
    // DRY_Q (a float16 K and V with RoPE, the decode step's kernel): the q staging below runs twice in one rolled loop,
    // first before pdl_wait with its global loads predicated off and the cache store skipped (its shared-memory
    // results are overwritten), so that the real pass after the wait runs on a warm instruction cache -- this kernel
    // runs once a layer between GEMVs of 40-57 KB of code, and the staging is ~17 KB of unrolled code at HD 128
    // (bench/lab/icache_lab.cu: straight code runs about twice as long from a cold cache, and a first pass of the
    // same code warms it; measured: bench/NOTES.md session 39).
    // Only the launch's first DRY_BLOCKS blocks (linear order, the order they are dispatched in) run it: they find the
    // SMs the QKV projection's CTAs leave free (4 of 132 on sm_90 under its launch shape for the 1.5B / 0.5B, two of
    // these blocks an SM) and idle there until the wait returns. A split grid's later blocks (depth past
    // attn_single_chunks chunks) enter only as those CTAs leave, at or past the wait, where a dry pass would delay
    // the launch's last block (bench/lab/attention_stamps.patch; measured: bench/NOTES.md session 40).
    constexpr bool DRY_Q = ROPE && !QKV && HD <= 128;   // HD 256: the loop's registers spill (ptxas: 156 bytes)
    constexpr unsigned DRY_BLOCKS = 8;
    const bool dry = DRY_Q && blockIdx.z == 0 && blockIdx.y * gridDim.x + blockIdx.x < DRY_BLOCKS;
    if constexpr (ROPE && !DRY_Q) {
        pdl_wait();              // q and the new K/V row are the QKV projection's
        pdl_launch_dependents();
    }

    // q rows -> shared memory, scaled into the log2 domain and split into f16 hi + lo (all loads
    // first: the shared stores would otherwise serialise one global round trip per element)
    constexpr int Q_PER_THREAD = ROWS * HD / THREADS;
    const float* q_tok = p.q + ((size_t)token * p.n_heads + kvh * p.group) * HD;
    float qv[Q_PER_THREAD];
#pragma unroll 1
    for (int pass = dry ? 0 : 1; pass < 2; ++pass) {
        const bool live = pass == 1;
        if (DRY_Q && live) {
            pdl_wait();              // q and the new K/V row are the QKV projection's
            pdl_launch_dependents();
        }
        if constexpr (MR) {
            // the new rows this split attends: keys [n_past, L) lie in chunks c0 .. c1; split s takes c % ns == s
            int count = 0;
            if (L > n_past) {
                const int c0 = n_past / p.chunk_len, c1 = (L - 1) / p.chunk_len;
                bool mine = c1 - c0 + 1 >= ns;
                for (int c = c0; !mine && c <= c1; ++c) mine = c % ns == split;
                if (mine) count = L - n_past;
            }
            masked_rope_stage<HD>(p, rc, qv, q_tok, row0, kvh, tid, list, count, token, mr_store_block, mrows);
        } else if constexpr (!ROPE) {
#pragma unroll
            for (int j = 0; j < Q_PER_THREAD; ++j) {
                const int e = tid + j * THREADS, r = e / HD, d = e % HD;
                qv[j] = row0 + r < p.group ? __ldg(q_tok + (size_t)(row0 + r) * HD + d) : 0.0f;
            }
        } else if constexpr (ROT_K) {
            rope_stage_rotated<HD, FRAG && !WIN>(p, qv, q_tok, row0, kvh, tid, new_key >= 0, kv_new,  // (WIN: float16)
                                                 blockIdx.z % p.row_tiles == 0, rope_tab, k_type, v_type);
        } else {
            rope_stage<HD, QKV>(p, rc, qv, q_tok, row0, kvh, tid, new_key >= 0, kv_new,
                                live && blockIdx.z % p.row_tiles == 0, reinterpret_cast<float*>(q_hi), k_type, v_type,
                                live);   // q_hi is written only after this
        }
        constexpr bool rot_layout = ROT_K;                // qv in rope_stage_rotated's layout
#pragma unroll
        for (int j = 0; j < Q_PER_THREAD; ++j) {
            int r = (tid + j * THREADS) / HD, d = (tid + j * THREADS) % HD;
            if (rot_layout) rot_elem<HD>(j, tid, r, d);
            const float v = qv[j] * p.q_scale;
            const __half hi = __float2half_rn(v);
            const int at = r * LD + (FRAG ? qfrag_pos(d) : d);      // FRAG: the fragments' dim order
            q_hi[at] = hi;
            q_lo[at] = __float2half_rn(v - __half2float(hi));
        }
    }   // pass

    WarpState<HD> st;
    st.init();
#pragma unroll 1
    for (int k = 0; k < n_tiles; ++k) {
        cp_async_wait<N_STAGES - 2>();
        __syncthreads();                               // tile k landed; tile k-1's buffer is free
        load_tile(k + N_STAGES - 1);
        const int v0 = comp_cur.v0 + warp * WARP_SLOTS;
        advance(comp_cur);
        if constexpr (FRAG) {
            if (WIN && v0 < L && v0 >= win_start) {    // a window tile: float16 rows, fragments in the code order
                __half* ks = pipe + warp * WARP_SLOTS * LD;
                if (v0 - warp * WARP_SLOTS != pre_v0) window_rows<HD>(ks, p, kvh, v0, L, direct_end, n_past, list,
                                                                      tid & 31);
                if constexpr (ROPE) new_row_override<HD>(ks, kv_new, new_key, v0, tid & 31);
                warp_step_qf16<HD>(st, q_hi, q_lo, ks, ks + TILE * LD, v0, L);
            } else if (v0 < L) {
                frag_tile<HD, k_type, v_type, ROPE && !WIN>(st, q_hi, q_lo,
                                                            qring + (size_t)(k % N_STAGES) * q_stage_bytes, kv_new,
                                                            new_key, v0, L);
            }
        } else if (v0 < L) {
            __half* ks = pipe + (size_t)(QKV ? 0 : k % N_STAGES) * 2 * TILE * LD + warp * WARP_SLOTS * LD;
            if constexpr (QKV) {                       // this warp's rows of tile k, dequantized
                if (WIN && v0 >= win_start) {          // (or the window's float16 rows)
                    window_rows<HD>(ks, p, kvh, v0, L, direct_end, n_past, list, tid & 31);
                } else {
                    const uint8_t* src = qring + (size_t)(k % N_STAGES) * q_stage_bytes;
                    dequant_side<HD>(ks, src, k_type, warp * WARP_SLOTS, tid & 31);
                    dequant_side<HD>(ks + TILE * LD, src + TILE * k_side.row_bytes, v_type, warp * WARP_SLOTS,
                                     tid & 31);
                    __syncwarp();
                }
            }
            if constexpr (ROPE) new_row_override<HD>(ks, kv_new, new_key, v0, tid & 31);
            if constexpr (MR) masked_rows_override<HD>(ks, mrows, n_past, L, v0, tid & 31);
            warp_step<HD>(st, q_hi, q_lo, ks, ks + TILE * LD, v0, L);
        }
    }
    cp_async_wait<0>();
    __syncthreads();                                   // the pipeline area becomes the merge area
    if constexpr (FRAG) warp_store_q<HD>(st, m_s, l_s, o_s);
    else warp_store<HD>(st, m_s, l_s, o_s);
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
        if (ns == 1) {
            const float inv = l > 0.0f ? 1.0f / l : __int_as_float(0x7fffffff);
            const float4 out = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
            *reinterpret_cast<float4*>(p.o + qrow * HD + d) = out;
            // HD 128: this warp's 32 float4 are row r's whole head (e steps by THREADS * 4, a multiple of 128), so
            // the row test above and the codes' warp_max are warp-uniform
            if constexpr (HD == XCODES_GROUP)
                if (p.oq != nullptr) store_o_codes(p, token, kvh * p.group + row0 + r, d, out);
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

}  // namespace attn
}  // namespace fd
