/* flashd_attention.h -- RoPE and the K/V cache write, decode / prefill / masked attention over
   the cache, and the speculative commit of the cache.
   Part of the C ABI: include flashd.h (its conventions hold here), not this file. */
#ifndef FLASHD_ATTENTION_H
#define FLASHD_ATTENTION_H
#ifndef FLASHD_H
#error "include flashd.h, which includes this header"
#endif
/* --- cdef begin --- */

/* ---- the shape of one layer's attention, and its rope ------------------------------------ */
/* KV cache row formats (fd_attention_shape_t.k_type / v_type). One layer's K (or V) cache is, for
   FD_KV_F16, float16 [n_kv_heads][max_ctx][head_dim]; for a quantized type (head_dim % 32 == 0, 32-value
   blocks b with a float16 scale d[b] each, ggml's reference rounding) two planes, codes then scales:
     codes  [n_kv_heads][max_ctx][code_bytes]   q8_0: int8 q, code_bytes = head_dim, value = d * q;
                                                q4_0: code_bytes = head_dim / 2, byte 16b + j holds values
                                                32b + j (low nibble) and 32b + j + 16 (high), value = d * (q - 8)
     scales [n_kv_heads][max_ctx][head_dim / 32] float16
   -- 34 (q8_0) or 18 (q4_0) bytes per 32 values, like ggml's blocks, but the codes of a row stay 16-byte
   aligned for vector loads. fd_kv_plane_bytes gives a plane pair's size.
   Rotated keys (ABI 7): a quantized K type implies the rotation, no flag. Whenever k_type != FD_KV_F16, the
   entry points that rotate q and k by RoPE (fd_rope_kv_write, fd_attention_decode_rope) then rotate every head's
   q and k by R = the block-diagonal orthonormal Walsh-Hadamard transform: blocks of B values, B = the largest
   power of two dividing head_dim (>= 32), each H_B / sqrt(B) in Sylvester order, computed as the fast transform
   with stages h = 1, 2, ..., B / 2 in that order and float32 rounding at every step, then times float(1 /
   sqrt(B)) (flashd's daemon/backends/kv_rotate.py is the same arithmetic). K is quantized in that basis and
   attention reads the rotated q, so q . k is unchanged up to rounding, while a channel far larger than the rest
   (Qwen2's K) no longer sets its block's scale alone. The readers (decode, masked, prefill attention) take q as
   given: a caller handing them q for a quantized K must rotate it as fd_rope_kv_write does. V is not rotated;
   an FD_KV_F16 K is not rotated (bit for bit ABI 6).
   Key offset (ABI 9): the same two entry points take k_offset, NULL or device float32 [n_kv_heads][head_dim] (this
   layer's): for a quantized K every RoPE'd key of KV head h first has k_offset[h] subtracted (one float32
   subtraction per value), then is rotated and encoded; q is not changed. Every score of a query moves by the same
   q . k_offset[h], so the softmax is exactly the same function, while the stored range shrinks where K has channels
   that are nearly constant across tokens (a k bias in slowly turning RoPE pairs). Every writer of one cache must
   pass the same offset (decode, prefill and tree rows then stay bitwise consistent). Not read for an FD_KV_F16 K. */
#define FD_KV_F16 0
#define FD_KV_Q8_0 1
#define FD_KV_Q4_0 2

/* Passed by pointer to every attention entry point (read on the host during the call only). q (n, n_heads,
   head_dim) float32, o (n, n_heads * head_dim) float32, the K and V caches of one layer in k_type / v_type
   (above); query head h reads KV head h / (n_heads / n_kv_heads). FD_E_ARG unless every count is >= 1,
   n_heads % n_kv_heads == 0, the types are FD_KV_* (a quantized one with head_dim % 32 == 0) and scale is
   finite and non-zero (where it is read). Quantized rows: fd_rope_kv_write and fd_attention_decode_rope write
   them; fd_attention_decode(_rope), fd_attention_masked and fd_attention_prefill (its tensor-core path; the
   SIMT fallback returns FD_E_SHAPE) read them, dequantized into their float16 tiles: the attention is the
   float16 path's over float16(d * q). The FlashPrefill entry points return FD_E_SHAPE for a type other than
   FD_KV_F16; fd_kv_compact moves float16 caches, fd_kv_compact_rows any. */
typedef struct {
    int n_heads;       /* query heads */
    int n_kv_heads;    /* KV heads (grouped-query attention) */
    int head_dim;      /* dims per head */
    int max_ctx;       /* cache slots per KV head */
    float scale;       /* softmax scale, usually 1 / sqrt(head_dim) (not read by fd_rope_kv_write) */
    int k_type;        /* FD_KV_*: K's row format (0: float16, what a zero-filled struct gets) */
    int v_type;        /* FD_KV_*: V's row format */
    int window;        /* U: the full-precision window block in positions (0: none; see below) */
    int window_slots;  /* R: rows per KV head of each window ring (with a window) */
    int max_keys;      /* 0, or the most keys a row of the launch sees (ABI 28; see below) */
    int8_t* o_codes;   /* NULL, or where the launch also writes o's int8 codes (ABI 30; see below) */
    float* o_scales;   /* with o_codes: their scales */
} fd_attention_shape_t;

/* max_keys (decode and masked attention; others ignore it; >= 0, else FD_E_ARG): the caller's bound on the keys
   any row of the launch sees. Where it spans at most fd_tuning_t.attn_single_chunks chunks of chunk_len, no row
   would be split anyway, so the launch runs one block per (KV head, row tile) instead of a grid of splits for
   max_ctx, and no combine kernel: the same bits, two to three fewer microseconds a layer at a shallow depth in a
   large cache (a decode graph captured for the first keys of a context). A row past the bound is still attended
   whole by that one block -- the right values, but reduced in another order than its decode at that depth. */

/* o_codes / o_scales (ABI 30; fd_attention_decode_rope and fd_attention_masked only -- every other entry point
   returns FD_E_ARG when either is set): the launch also writes o as a GEMV reads it, so the output projection need
   not quantize it (fd_gemv_xq): codes o_codes[i * n_heads * 128 + c] = rint(o[i, c] * 127 / m) and scales
   o_scales[((i / 32) * n_heads + h) * 32 + i % 32] = m / 127, m = max |o[i, 128 h .. 128 h + 127]| -- head h of row i
   is one 128-column group (x_codes.cuh; a NaN row: codes 0, scale NaN). So rows i0 .. i0 + 31 (i0 a multiple of 32,
   or any i0 of a call of <= 8 rows within such a block) are fd_gemv_xq's (xq = o_codes + i0 * n_heads * 128,
   xsc = o_scales + (i0 / 32) * n_heads * 32 + i0 % 32). Written by the block that writes the head's o -- the one
   that attends an unsplit row, or the combine kernel's for a split one -- which holds all 128 values. FD_E_ARG
   unless both are set, head_dim is 128 and o_codes is 4-byte aligned. */

/* The window (ABI 21; window > 0: a multiple of 64, a quantized K or V, window_slots a multiple of 64 and
   >= window + 64, else FD_E_ARG). A query at position p reads the key / value at position t from a float16 copy
   instead of the stored codes iff t >= window * (p / window), i.e. t lies in p's own window block: the most recent
   1..U positions are exact, every completed block is read quantized. Each quantized side keeps those copies in a
   ring: float16 [n_kv_heads][window_slots][head_dim], slot s in row s % window_slots, at byte offset
   fd_kv_window_offset(...) of the side's allocation (after its codes and scales; an FD_KV_F16 side has no ring and
   is read as it is). Writers: fd_rope_kv_write stores every written slot's copy -- the float32 value it encodes (a
   K: RoPE'd, minus k_offset, rotated), rounded to float16 -- beside its codes; fd_kv_compact_ring moves ring rows.
   A reader needs rows [window * (p0 / window), p0 + n) of the ring to be the copies of those slots (p0 = *n_past,
   n the rows of the forward), so window_slots >= window + the most rows one forward writes. Positions, per
   reader: decode p = *n_past; prefill row i p = *n_past + i (keys by slot); masked token i p = *n_past + c_i - 1
   with c_i its visible new slots, the k-th of them at position *n_past + k (a tree node's path, which a
   verify mask is). fd_attention_decode_rope stores the new row's copy as fd_rope_kv_write does and attends it exact
   (bit for bit fd_rope_kv_write + fd_attention_decode). The FlashPrefill entry points take float16 caches only. */
size_t fd_kv_window_offset(int kv_type, int n_kv_heads, int max_ctx, int head_dim);

/* Bytes of one layer's K or V cache of n_kv_heads * max_ctx rows of head_dim values in kv_type (both planes
   of a quantized type); 0 if the arguments are invalid. */
size_t fd_kv_plane_bytes(int kv_type, int n_kv_heads, int max_ctx, int head_dim);

/* RoPE position scaling (linear / YaRN, llama.cpp's rope_yarn; NULL wherever it is taken: none).
   Pair j at position pos, e = pos * theta^(-2j/rope_dim), all in double: i = freq_scale * e; if
   ext_factor != 0: mix = (1 - clamp((j - corr_low) / max(0.001, corr_high - corr_low), 0, 1)) * ext_factor,
   angle = i * (1 - mix) + e * mix, else angle = i; cos/sin = cos(angle) * mscale, sin(angle) * mscale,
   rounded to float once (flashd RopeScaling.rope_params computes the fields). */
typedef struct {
    double freq_scale;             /* 1 / factor, in (0, inf) */
    double ext_factor;             /* >= 0: 1 for YaRN, 0 for linear */
    double corr_low, corr_high;    /* YaRN's correction dims (pair indices) */
    double mscale;                 /* > 0: the magnitude of cos and sin */
} fd_rope_scaling_t;

/* The rotary embedding (read on the host during the call): the first rope_dim dims of each head rotate, pair
   j = (j, j + rope_dim / 2) if neox else (2j, 2j + 1), by angle = pos * theta^(-2j / rope_dim), or as
   `scaling` says. FD_E_ARG unless rope_dim is even, 2 <= rope_dim <= head_dim, theta > 0, scaling valid. */
typedef struct {
    int rope_dim;
    float theta;
    int neox;
    const fd_rope_scaling_t* scaling;     /* NULL: the plain rope */
    float* table;      /* fd_attention_decode_rope, fd_rope_kv_write (mode 1) and fd_attention_masked_rope (mode 2) */
    int table_mode;    /* only (others ignore both): NULL, or floats on the device -- 0: unused; 1: cos / sin
                          computed and stored there; 2: read from there (below) */
} fd_rope_t;

/* The RoPE table (table_mode 1 / 2): the new position's cos and sin of pair j at table[2j], table[2j + 1], the same
   float64 arithmetic either way, so the same bits. Every layer of a decode step rotates by the same position, and
   each block of a launch computes them before its wait (float64 pow and sincos: about a microsecond on the late blocks
   of a split launch at depth -- bench/NOTES.md session 40); the caller stores them with its first layer (mode 1) and
   reads them in the later ones (mode 2). Mode 2's caller promises that a mode-1 launch of the same position and rope
   ran two or more launches earlier on the stream (every kernel of this library triggers its dependents only after
   its own wait, so that launch has completed when a mode-2 one starts). A quantized K (its rotated table) ignores
   both. FD_E_ARG for a mode outside 0..2 or a mode without a table.
   Rows (ABI 31): fd_rope_kv_write with mode 1 stores token i's at table + i * rope_dim (n * rope_dim floats), the
   table fd_attention_masked_rope reads (mode 2, required there) for the same positions. */

/* ---- RoPE and the K/V cache write (rope.cu) ----------------------------------------------- */
/* Rotates q (n, n_heads, head_dim) and k (n, n_kv_heads, head_dim) in place at positions[i] (RoPE; then, for a
   quantized k_type, the Hadamard rotation above, head_dim <= 512 or FD_E_SHAPE), then stores k and v (n,
   n_kv_heads, head_dim) into the cache slots *n_past + i in shape->k_type / v_type: float16 (round to nearest
   even), or q8_0 / q4_0 codes and scales bit for bit ggml's quantize_row_q8_0_ref / quantize_row_q4_0_ref of
   the rotated float32 row. q may be NULL (K/V only). k_offset (a quantized K only; NULL: none): subtracted
   after RoPE, before the rotation (above); k is left holding the rotated k - k_offset. */
int fd_rope_kv_write(float* q, float* k, const float* v, void* k_cache, void* v_cache, const float* k_offset,
                     const int32_t* positions, const int32_t* n_past, int n, const fd_attention_shape_t* shape, const fd_rope_t* rope,
                     void* stream);

/* ---- attention over the cache (attention_decode.cu, attention_prefill.cu, attention_masked.cu) */
/* Decode and masked attention split each row's keys in chunks of chunk_len slots (a multiple of 64) and
   reduce the splits in a fixed order (attention_splitk.cuh); the workspace holds the partial results.
   fd_attention_decode_workspace_bytes: enough for a one-token launch whatever the split count (an upper
   bound over the device and its tuning); fd_attention_workspace_bytes: the exact need of a launch over
   n_tokens new tokens on this device (decode: 1; masked: n). 0 if none is needed or an argument is
   invalid. A row whose keys span at most fd_tuning_t.attn_single_chunks chunks is not split (one block per KV
   head attends it whole, in key order): decode and masked rows alike, so the bitwise agreements below hold. */
size_t fd_attention_decode_workspace_bytes(const fd_attention_shape_t* shape, int chunk_len);
size_t fd_attention_workspace_bytes(int n_tokens, const fd_attention_shape_t* shape, int chunk_len);
/* One new token (q (1, n_heads, head_dim), rotated): attends slots [0, *n_past] (its K/V already stored at
   slot *n_past). */
int fd_attention_decode(float* o, const float* q, const void* k_cache, const void* v_cache, const int32_t* n_past,
                        const fd_attention_shape_t* shape, int chunk_len, void* workspace, void* stream);
/* fd_attention_decode with the new token's RoPE and K/V write fused in (the one-row decode step, instead of
   fd_rope_kv_write + fd_attention_decode, bit for bit the same o and cache rows): q (1, n_heads, head_dim)
   and k, v (1, n_kv_heads, head_dim) float32 as projected (unrotated; not modified); positions: device
   int32, the RoPE position. Rotates q (RoPE, and for a quantized K the Hadamard rotation, bit for bit
   fd_rope_kv_write's), attends slots [0, *n_past] with slot *n_past's K/V taken from k (rotated alike) and v, and stores them into slot *n_past (if 0 <= *n_past < max_ctx) in shape's k_type / v_type,
   attending a quantized row as stored (bit for bit fd_rope_kv_write + fd_attention_decode). head_dim in
   {64, 128, 256}; workspace as fd_attention_decode. k_offset: as fd_rope_kv_write's. Ordering (PDL): the cache
   rows before slot *n_past, *n_past and *positions are read before the previous kernel on the stream has
   finished, so that kernel must not write them (the decode step's previous kernel is the QKV projection; on
   a GPU without PDL, or after a copy, a memset or an event wait, nothing overlaps); q, k and v may be its. */
int fd_attention_decode_rope(float* o, const float* q, const float* k, const float* v, void* k_cache, void* v_cache,
                             const float* k_offset, const int32_t* positions, const int32_t* n_past, const fd_attention_shape_t* shape,
                             const fd_rope_t* rope, int chunk_len, void* workspace, void* stream);
/* n new tokens at slots *n_past + i, causal: token i attends slots [0, *n_past + i]. Tensor cores.
   head_dim in {64, 128, 256}; FD_E_SHAPE where the device's per-block shared memory cannot hold the head_dim's
   tiles (head_dim 256 with a quantized K or V needs 101-148 KB: sm_80 or sm_90). */
int fd_attention_prefill(float* o, const float* q, const void* k_cache, const void* v_cache, const int32_t* n_past,
                         int n, const fd_attention_shape_t* shape, void* stream);
/* n new tokens (n <= 256) at slots *n_past + i with an explicit mask over the new tokens: token i
   attends every slot < *n_past and slot *n_past + j iff mask[i * n + j] != 0 (uint8, (n, n)).
   Split over the context like fd_attention_decode with the same chunk_len: a token whose visible new
   slots are its tree path gets bitwise the decode result at its position. workspace_bytes >=
   fd_attention_workspace_bytes(n, ...) (FD_E_ARG otherwise). */
int fd_attention_masked(float* o, const float* q, const void* k_cache, const void* v_cache, const uint8_t* mask,
                        const int32_t* n_past, int n, const fd_attention_shape_t* shape, int chunk_len,
                        void* workspace, size_t workspace_bytes, void* stream);
/* fd_attention_masked with the new tokens' RoPE and K/V write fused in (ABI 31; a verify forward's layers, instead
   of fd_rope_kv_write + fd_attention_masked, bit for bit the same o and cache rows): q (n, n_heads, head_dim) and k,
   v (n, n_kv_heads, head_dim) float32 as projected (unrotated; not modified; k and v 16-byte aligned); row i's cos /
   sin in rope->table (table_mode 2: rows, above -- stored by an fd_rope_kv_write of the same positions and rope two
   or more launches earlier). Each token's visible new rows are RoPE'd in the blocks that attend them, and token i's
   own row is stored at slot *n_past + i (if inside [0, max_ctx)) as fd_rope_kv_write stores it. float16 K and V, no
   window, head_dim 64 or 128, rope_dim a multiple of 8, n <= FD_ATTENTION_MASKED_ROPE_MAX_NEW (FD_E_SHAPE otherwise:
   the caller runs the two launches); FD_E_SHAPE also where the device's per-block shared memory cannot hold the
   kernel's (~102 KB at head_dim 128: sm_80 / sm_90). o_codes as fd_attention_masked's. Ordering (PDL): the mask,
   *n_past, the table and the cache rows before slot *n_past are read before the previous kernel on the stream has
   finished (as fd_attention_decode_rope's); q, k and v may be its. */
#define FD_ATTENTION_MASKED_ROPE_MAX_NEW 48
int fd_attention_masked_rope(float* o, const float* q, const float* k, const float* v, void* k_cache, void* v_cache,
                             const uint8_t* mask, const int32_t* n_past, int n, const fd_attention_shape_t* shape,
                             const fd_rope_t* rope, int chunk_len, void* workspace, size_t workspace_bytes,
                             void* stream);

/* ---- speculative decoding (kv_compact.cu) ------------------------------------------------- */
/* Commit a verified tree path: in every layer, K and V, every KV head, for i = 0 .. n_keep-1 in
   ascending order, cache slot *n_past + src_offsets[i] is copied to slot *n_past + i. cache is
   the whole KV allocation: 2 * n_layers planes (K of layer l = plane 2l, V = 2l+1), each float16
   [n_kv_heads][max_ctx][head_dim]. src_offsets (device int32, n_keep) must be strictly increasing
   with src_offsets[i] >= i; slots past max_ctx are skipped. head_dim must be even. */
int fd_kv_compact(void* cache, const int32_t* src_offsets, const int32_t* n_past, int n_keep,
                  int n_layers, int n_kv_heads, int max_ctx, int head_dim, void* stream);
/* The same moves over any rows: n_planes planes, plane p at base + p * plane_stride bytes, each
   [n_kv_heads][max_ctx] rows of row_bytes bytes (even; base and plane_stride even) -- a quantized cache's
   codes, or its scales, of every layer (one call per such group). */
int fd_kv_compact_rows(void* base, size_t plane_stride, int n_planes, int n_kv_heads, int max_ctx, int row_bytes,
                       const int32_t* src_offsets, const int32_t* n_past, int n_keep, void* stream);
/* The same moves over window rings (flashd_attention.h's window): n_planes rings, ring p at base + p *
   plane_stride bytes, each [n_kv_heads][ring_slots] rows of row_bytes bytes, slot s in row s % ring_slots:
   row (*n_past + src_offsets[i]) % ring_slots -> row (*n_past + i) % ring_slots, i ascending (src_offsets[n_keep
   - 1] < ring_slots: no wrapped row is read after it is written). */
int fd_kv_compact_ring(void* base, size_t plane_stride, int n_planes, int n_kv_heads, int ring_slots, int row_bytes,
                       const int32_t* src_offsets, const int32_t* n_past, int n_keep, void* stream);

/* --- cdef end --- */
#endif /* FLASHD_ATTENTION_H */
