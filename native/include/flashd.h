/* flashd.h -- the whole C ABI of libflashd_cuda (and libflashd_hip, from the same sources).
 *
 * Conventions
 *   - Every function returns an int status: 0 ok, > 0 a cudaError_t (hipError_t) value,
 *     < 0 a flashd argument error (FD_E_*). fd_status_string() names any status.
 *   - Every kernel launcher takes the stream last (void*, NULL = the legacy default stream) and is
 *     asynchronous; none allocates memory or synchronizes, so all are safe inside graph capture.
 *   - Pointers are device pointers unless named host_*. Activations are float32 row-major; the KV
 *     cache is float16 laid out [n_kv_heads][max_ctx][head_dim] per layer.
 *   - Weights are GGUF tensors as stored: (rows, cols) row-major, each row cols / block_size blocks
 *     of the format `qtype` (GGML type ids: FD_Q_*). Weight pointers must be 16-byte aligned for
 *     the K-quants, 4-byte for F32 and Q4_1, 2-byte otherwise (FD_E_ARG if not); allocations
 *     from fd_malloc always are.
 *   - Outputs never alias inputs unless the function says so (y may alias residual).
 *   - Scalars that change between decode steps (positions, n_past, the step counter) are read
 *     from device memory (const int* ...), so a captured graph can be replayed every step.
 *
 * This file is read by cffi's cdef, so the part between the markers is plain declarations only:
 * no #include, no #if, no macros other than integer constants.
 */
#ifndef FLASHD_H
#define FLASHD_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
/* --- cdef begin --- */

#define FD_ABI_VERSION 1

#define FD_E_ARG -1          /* a size, pointer or shape argument is invalid */
#define FD_E_QTYPE -2        /* weight format not supported by this kernel */
#define FD_E_SHAPE -3        /* shape not supported by this kernel (e.g. head_dim, cols % block) */
#define FD_E_UNSUPPORTED -4  /* not available in this build (libflashd_hip: an NVIDIA-only path, README "AMD / HIP") */

#define FD_Q_F32 0
#define FD_Q_F16 1
#define FD_Q_Q4_0 2
#define FD_Q_Q4_1 3
#define FD_Q_Q5_0 6
#define FD_Q_Q8_0 8
#define FD_Q_Q4_K 12
#define FD_Q_Q5_K 13
#define FD_Q_Q6_K 14
#define FD_Q_BF16 30

/* ---- runtime: devices, memory, streams, events, graphs (runtime.cu) ---------------------- */
int fd_abi_version(void);
const char* fd_status_string(int status);
int fd_device_count(int* n_devices);
int fd_set_device(int device);
int fd_device_info(int device, char* name, int name_len, int* cc_major, int* cc_minor,
                   int* n_sms, size_t* total_bytes, int* clock_khz, int* mem_bus_bits);
int fd_mem_info(size_t* free_bytes, size_t* total_bytes);
int fd_malloc(void** ptr, size_t n_bytes);
int fd_free(void* ptr);
int fd_host_alloc(void** host_ptr, size_t n_bytes);          /* pinned, mapped into the device */
int fd_host_free(void* host_ptr);
int fd_memcpy_h2d(void* dst, const void* host_src, size_t n_bytes, void* stream);
int fd_memcpy_d2h(void* host_dst, const void* src, size_t n_bytes, void* stream);
int fd_memcpy_d2d(void* dst, const void* src, size_t n_bytes, void* stream);
int fd_memset(void* dst, int byte_value, size_t n_bytes, void* stream);
int fd_stream_create(void** stream);
int fd_stream_destroy(void* stream);
int fd_stream_synchronize(void* stream);
int fd_event_create(void** event, int with_timing);
int fd_event_destroy(void* event);
int fd_event_record(void* event, void* stream);
int fd_event_record_external(void* event, void* stream);   /* in graph capture: a node that records at replay (profiling) */
int fd_event_synchronize(void* event);
int fd_event_query(void* event);                             /* 0 done, FD_NOT_READY pending */
int fd_event_elapsed_ms(float* ms, void* start_event, void* end_event);
int fd_graph_begin_capture(void* stream);
int fd_graph_end_capture(void* stream, void** graph_exec);
int fd_graph_launch(void* graph_exec, void* stream);
int fd_graph_destroy(void* graph_exec);
int fd_not_ready_status(void);                               /* the status fd_event_query returns while pending */

/* ---- weights: dequantization and embedding lookup (dequant.cu) --------------------------- */
/* dst (rows, cols) float16 = the weight, exactly as gguf.quants.dequantize defines it (rounded to f16) */
int fd_dequant_f16(void* dst, const void* w, int qtype, int64_t rows, int64_t cols, void* stream);
/* dst (n_ids, cols) float32 = rows ids[i] of table (n_table_rows, cols); ids outside the table -> FD_E_ARG is
   not checkable on the device: such rows are written as NaN */
int fd_embed(float* dst, const void* table, int qtype, int64_t n_table_rows, int64_t cols,
             const int32_t* ids, int n_ids, void* stream);

/* ---- decode projections: quantized GEMV (gemv.cu) ----------------------------------------- */
/* For each of n_x input rows i (1 <= n_x <= 8):
     xn = norm_w ? rmsnorm(x[i]) * norm_w : x[i]                    (x: (n_x, cols))
     y[i, r] = dot(W[r, :], xn) (+ bias[r]) (+ residual[i, r])      (y: (n_x, rows))
   y may alias residual. */
int fd_gemv(float* y, const void* w, int qtype, int rows, int cols, const float* x, int n_x,
            const float* norm_w, float eps, const float* bias, const float* residual, void* stream);
/* Up to 4 matrices sharing one input (e.g. q, k, v): y_j = W_j xn (+ bias_j), one launch.
   Host arrays of n_mats entries; bias_j may be NULL. */
int fd_gemv_multi(int n_mats, float* const* y, const void* const* w, const int* qtype, const int* rows,
                  const float* const* bias, int cols, const float* x, int n_x, const float* norm_w,
                  float eps, void* stream);
/* y[i, r] = silu(dot(Wg[r], xn)) * dot(Wu[r], xn)  (the SwiGLU MLP's first half), y: (n_x, rows) */
int fd_gemv_swiglu(float* y, const void* w_gate, int qtype_gate, const void* w_up, int qtype_up,
                   int rows, int cols, const float* x, int n_x, const float* norm_w, float eps,
                   void* stream);

/* ---- prefill projections: tensor-core GEMM (gemm.cu) -------------------------------------- */
/* y (m, n) = x (m, k) float32 @ w (n, k) float16 ^T (+ bias[n]) (+ residual (m, n)); f32 accumulate.
   y may alias residual. k % 8 == 0. */
int fd_gemm_f16(float* y, const float* x, const void* w_f16, int m, int n, int k, const float* bias,
                const float* residual, void* stream);
/* y (m, n) = silu(x @ wg^T) * (x @ wu^T), both weights (n, k) float16 */
int fd_gemm_swiglu_f16(float* y, const float* x, const void* wg_f16, const void* wu_f16, int m, int n,
                       int k, void* stream);

/* ---- norms and elementwise (norm.cu, elementwise.cu) -------------------------------------- */
/* y (rows, cols) = x * rsqrt(mean(x^2) + eps) * w; y may alias x */
int fd_rmsnorm(float* y, const float* x, const float* w, int rows, int cols, float eps, void* stream);
int fd_add(float* y, const float* a, const float* b, int64_t n, void* stream);
int fd_swiglu(float* y, const float* gate, const float* up, int64_t n, void* stream);

/* ---- RoPE and the KV cache (rope.cu) ------------------------------------------------------ */
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
/* Rotates q (n, n_heads, head_dim) and k (n, n_kv_heads, head_dim) in place at positions[i]
   (first rope_dim dims of each head; neox: pairs (j, j + rope_dim/2), else (2j, 2j+1);
   angle = pos * theta^(-2j/rope_dim), or as `scaling` says), then stores k and v (n, n_kv_heads,
   head_dim) as float16 into the cache slots *n_past + i. */
int fd_rope_kv_write(float* q, float* k, const float* v, void* k_cache, void* v_cache,
                     const int32_t* positions, const int32_t* n_past, int n, int n_heads,
                     int n_kv_heads, int head_dim, int rope_dim, float theta, int neox,
                     const fd_rope_scaling_t* scaling, int max_ctx, void* stream);
/* Copies cache slots src[i] -> dst[i] for i < n_moves in every head of one layer (speculative commit). */
int fd_kv_move(void* k_cache, void* v_cache, const int32_t* src_slots, const int32_t* dst_slots,
               int n_moves, int n_kv_heads, int head_dim, int max_ctx, void* stream);

/* ---- attention (attention_decode.cu, attention_prefill.cu, attention_masked.cu) ------------
   q (n, n_heads, head_dim) float32 (already rotated), o (n, n_heads * head_dim) float32.
   Query head h reads KV head h / (n_heads / n_kv_heads). scale is usually 1/sqrt(head_dim). */
/* n = 1: attends slots [0, *n_past] (the new token's K/V already stored at slot *n_past).
   Split over the context in chunks of chunk_len slots; workspace holds the partial results:
   fd_attention_decode_workspace_bytes() bytes. */
size_t fd_attention_decode_workspace_bytes(int n_heads, int head_dim, int max_ctx, int chunk_len);
/* The exact workspace of a launch over n_tokens new tokens (decode: 1; masked: n); 0 if it needs none
   or an argument is invalid. */
size_t fd_attention_workspace_bytes(int n_tokens, int n_heads, int n_kv_heads, int head_dim, int max_ctx,
                                    int chunk_len);
int fd_attention_decode(float* o, const float* q, const void* k_cache, const void* v_cache,
                        const int32_t* n_past, int n_heads, int n_kv_heads, int head_dim, int max_ctx,
                        int chunk_len, float scale, void* workspace, void* stream);
/* fd_attention_decode with the new token's RoPE and K/V write fused in (the one-row decode step,
   instead of fd_rope_kv_write + fd_attention_decode, bit for bit the same o and cache rows): q
   (1, n_heads, head_dim) and k, v (1, n_kv_heads, head_dim) float32 as projected (unrotated; not
   modified); positions: device int32, the RoPE position; rope_dim, theta, neox, scaling as fd_rope_kv_write.
   Rotates q, attends slots [0, *n_past] with slot *n_past's K/V taken from k (rotated) and v, and
   stores them as float16 into slot *n_past (if 0 <= *n_past < max_ctx). head_dim in {64, 128, 256};
   workspace as fd_attention_decode. */
int fd_attention_decode_rope(float* o, const float* q, const float* k, const float* v, void* k_cache,
                             void* v_cache, const int32_t* positions, const int32_t* n_past, int n_heads,
                             int n_kv_heads, int head_dim, int max_ctx, int chunk_len, float scale,
                             int rope_dim, float theta, int neox, const fd_rope_scaling_t* scaling,
                             void* workspace, void* stream);
/* n new tokens at slots *n_past + i, causal: token i attends slots [0, *n_past + i]. Tensor cores.
   head_dim in {64, 128}. */
int fd_attention_prefill(float* o, const float* q, const void* k_cache, const void* v_cache,
                         const int32_t* n_past, int n, int n_heads, int n_kv_heads, int head_dim,
                         int max_ctx, float scale, void* stream);
/* n new tokens (n <= 256) at slots *n_past + i with an explicit mask over the new tokens: token i
   attends every slot < *n_past and slot *n_past + j iff mask[i * n + j] != 0 (uint8, (n, n)).
   Split over the context like fd_attention_decode with the same chunk_len: a token whose visible new
   slots are its tree path gets bitwise the decode result at its position. workspace_bytes >=
   fd_attention_workspace_bytes(n, ...) (FD_E_ARG otherwise). */
int fd_attention_masked(float* o, const float* q, const void* k_cache, const void* v_cache,
                        const uint8_t* mask, const int32_t* n_past, int n, int n_heads, int n_kv_heads,
                        int head_dim, int max_ctx, int chunk_len, float scale, void* workspace,
                        size_t workspace_bytes, void* stream);

/* ---- FlashPrefill block scoring (flashprefill.cu) and block-sparse attention (attention_sparse.cu)
   A prefill chunk of n new tokens at cache slots [p0, p0 + n) with p0 % FD_FLASHPREFILL_BLOCK == 0 (p0
   is a host int: these run in prefill only, never inside a captured graph); its keys are slots
   [0, p0 + n) of this layer's cache. Blocks are FD_FLASHPREFILL_BLOCK slots: Nk = ceil((p0 + n) / 128) key
   blocks, Mq = ceil(n / 128) query blocks, query block mq has absolute index m = p0 / 128 + mq.
   q (n, n_heads, head_dim) f32 (rotated), caches as above; head_dim in {64, 128} unless stated. */
#define FD_FLASHPREFILL_BLOCK 128
#define FD_MASK_DENSE 0        /* head attends every key block kb <= m (causal attention) */
#define FD_MASK_STREAMING -1   /* any value < 0: kb < sink_blocks or m - kb < local_blocks */
#define FD_MASK_LISTS 1        /* any value > 0: the blocks listed in block_idx / block_cnt */
/* mean_k (Nk, n_kv_heads, head_dim) f32: mean of each key block's real rows (slots < n_keys); head_dim <= 256 */
int fd_flashprefill_mean_k(float* mean_k, const void* k_cache, int n_keys, int n_kv_heads, int head_dim, int max_ctx,
                           void* stream);
/* score (Mq, n_heads, Nk) f32: with a[j, kb] = q_j . mean_k[kb, h's kv head] * scale over the rows j of
   block m and kb <= m, and M = max of a over all of them: s[kb] = sum_j exp(a[j, kb] - M), normalised
   so that sum_kb s[kb] = 1; 0 for kb > m. */
int fd_flashprefill_score(float* score, const float* q, const float* mean_k, int p0, int n, int n_heads,
                          int n_kv_heads, int head_dim, float scale, void* stream);
/* idx (Mq, n_heads, Nk) int32: the kept key blocks of each (query block, head), ascending, -1 padded;
   cnt (Mq, n_heads) their number. Keep kb <= m iff score >= alpha * max_kb score, kb < sink_blocks,
   m - kb < window_blocks, or m >= first_full_block. */
int fd_flashprefill_select(int32_t* idx, int32_t* cnt, const float* score, int p0, int n, int n_heads, float alpha,
                           int sink_blocks, int window_blocks, int first_full_block, void* stream);
/* acc (n_tail, n_keys) f32 = max(acc, max over heads of P[h, t, j]), P the dense causal softmax
   (scale q k^T) of tail token t -- q_tail (n_tail, n_heads, head_dim), at slot n_keys - n_tail + t --
   over keys j <= its slot; other entries unchanged. workspace: 2 * n_tail * n_heads floats. */
int fd_flashprefill_tail_max_probs(float* acc, const float* q_tail, const void* k_cache, int n_keys, int n_tail,
                                   int n_heads, int n_kv_heads, int head_dim, int max_ctx, float scale,
                                   float* workspace, void* stream);
/* Block-sparse causal attention: token i, head h attends slot j iff j <= p0 + i and key block j / 128 is in
   the block set of (its query block, h), chosen by head_mask_type[h] (device, n_heads entries; NULL = all
   FD_MASK_LISTS): lists are block_idx[(mq * n_heads + h) * Nk + e] for e < block_cnt[mq * n_heads + h]
   (fd_flashprefill_select's output). o (n, n_heads * head_dim) f32; a row attending nothing is 0. Tensor
   cores: FD_E_SHAPE on devices without mma.sync m16n8k16 (sm_80) or with misaligned pointers;
   FD_E_UNSUPPORTED in the HIP build (no SIMT fallback). */
int fd_attention_block_sparse(float* o, const float* q, const void* k_cache, const void* v_cache, int p0, int n,
                              int n_heads, int n_kv_heads, int head_dim, int max_ctx, float scale,
                              const int32_t* head_mask_type, const int32_t* block_idx, const int32_t* block_cnt,
                              int sink_blocks, int local_blocks, void* stream);
/* FlashPrefill's sparse attention (the anchor's sparse_fwd): fd_attention_block_sparse with every head
   FD_MASK_LISTS, over fd_flashprefill_select's lists. */
int fd_flashprefill_sparse_attention(float* o, const float* q, const void* k_cache, const void* v_cache, int p0,
                                     int n, int n_heads, int n_kv_heads, int head_dim, int max_ctx, float scale,
                                     const int32_t* block_idx, const int32_t* block_cnt, void* stream);

/* ---- token selection (sampling.cu) -------------------------------------------------------- */
/* out[r] = argmax of logits row r (n_rows, n_vocab); the lowest id wins ties */
int fd_argmax(int32_t* out, const float* logits, int n_rows, int n_vocab, void* stream);
/* One token from logits (n_vocab,) following flashd.daemon.sampling exactly: penalties over
   history[0 .. *n_history) (the last repeat_last_n of them), temperature, top_k, top_p, min_p,
   u = uniform(seed, *step) (SplitMix64), walk kept ids in ascending order. temperature must be > 0
   (greedy uses fd_argmax). workspace: fd_sample_workspace_bytes(n_vocab) bytes. */
size_t fd_sample_workspace_bytes(int n_vocab);
int fd_sample(int32_t* out, const float* logits, int n_vocab, const int32_t* history,
              const int32_t* n_history, int repeat_last_n, float repeat_penalty, float frequency_penalty,
              float presence_penalty, float temperature, int top_k, float top_p, float min_p,
              uint64_t seed, const int32_t* step, void* workspace, void* stream);
/* The decode loop's bookkeeping after a token is chosen, on the device (one thread):
     history[*n_history] = *token; *n_history += 1; ring[*step % ring_len] = *token (ring is pinned
     host memory mapped into the device); *step += 1; positions[0] += 1; *n_past += 1.  */
int fd_decode_advance(const int32_t* token, int32_t* history, int32_t* n_history, int32_t* ring,
                      int ring_len, int32_t* step, int32_t* positions, int32_t* n_past, void* stream);

/* ---- speculative decoding (kv_compact.cu) ------------------------------------------------- */
/* Commit a verified tree path: in every layer, K and V, every KV head, for i = 0 .. n_keep-1 in
   ascending order, cache slot *n_past + src_offsets[i] is copied to slot *n_past + i. cache is
   the whole KV allocation: 2 * n_layers planes (K of layer l = plane 2l, V = 2l+1), each float16
   [n_kv_heads][max_ctx][head_dim]. src_offsets (device int32, n_keep) must be strictly increasing
   with src_offsets[i] >= i; slots past max_ctx are skipped. head_dim must be even. */
int fd_kv_compact(void* cache, const int32_t* src_offsets, const int32_t* n_past, int n_keep,
                  int n_layers, int n_kv_heads, int max_ctx, int head_dim, void* stream);

/* ---- the persistent forward (forward.cu) --------------------------------------------------- */
/* Every layer of a dense decoder (llama, qwen2, qwen3) over n <= max_rows rows in one launch: QKV,
   rope + K/V cache write, split-K attention, O, SwiGLU MLP per layer, then the lm_head with each row's
   argmax. A plan owns the activations (its hidden rows are the input: embed into them), the logits and
   the schedule; the weights and the KV cache stay the caller's and must outlive it. */
typedef struct {
    const void* attn_q; const void* attn_k; const void* attn_v; const void* attn_output;
    const void* ffn_gate; const void* ffn_up; const void* ffn_down;
    int qtype_q, qtype_k, qtype_v, qtype_output, qtype_gate, qtype_up, qtype_down;
    const float* attn_norm; const float* ffn_norm;         /* (hidden,) */
    const float* bias_q; const float* bias_k; const float* bias_v;   /* qwen2, else NULL */
    const float* q_norm; const float* k_norm;              /* qwen3 per-head norms (head_dim,), else NULL */
    void* k_cache; void* v_cache;                          /* float16 [n_kv_heads][max_ctx][head_dim] */
} fd_layer_weights_t;
typedef struct {
    int n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab, max_ctx;
    int rope_dim, rope_neox;
    float rope_theta, rms_eps;
    const fd_layer_weights_t* layers;                      /* host array of n_layers */
    const float* output_norm;
    const void* output;                                    /* lm_head (vocab, hidden) */
    int qtype_output;
    const fd_rope_scaling_t* rope_scaling;                 /* NULL: none; copied by fd_forward_create */
} fd_forward_model_t;
/* Tuning is data: bench/ and the per-architecture table in flashd.daemon.backends.cuda.tuning */
typedef struct {
    int max_rows;        /* rows per launch wanted (1..8); the plan may hold fewer (fd_forward_info) */
    int step_bytes;      /* target weight bytes of one GEMV step (G rows of a matrix) */
    int ring_min_steps;  /* each warp's weight ring holds at least this many of the largest step (>= 1) */
    int attn_splits;     /* most attention splits of a row (chunks of 64 keys) */
    int n_ctas;          /* CTAs of the grid; 0 = one per SM */
} fd_forward_tuning_t;
typedef struct {
    int max_rows, n_ctas, n_warps, smem_bytes, ring_bytes, max_step_bytes, n_splits, n_stages;   /* n = 1 */
    float* hidden;       /* (max_rows, hidden) float32: the rows to forward (embedded), then the residual stream */
    float* logits;       /* (max_rows, vocab) float32 */
    float* capture;      /* (n_layers, max_rows, hidden) float32: layer outputs fd_forward was asked to keep */
    unsigned long long* stamps;   /* profiling: (n_stages, n_ctas, 4) globaltimer ns: reached, began, staged, finished */
} fd_forward_info_t;
int fd_forward_create(void** plan, const fd_forward_model_t* model, const fd_forward_tuning_t* tuning);
int fd_forward_destroy(void* plan);
int fd_forward_info(void* plan, fd_forward_info_t* info);
/* on != 0: launches captured or enqueued from now on stamp every stage (info.stamps); 0: off (the default) */
int fd_forward_profile(void* plan, int on);
/* Forward rows hidden[0 .. n) at positions[i] (device, n entries); their K/V go to cache slots *n_past + row0 + i.
   mask NULL: row i attends slots [0, *n_past + row0 + i]; else (mask_n, mask_n) uint8 like fd_attention_masked,
   the rows being rows row0 .. row0 + n - 1 of it. argmax (device, n) or NULL: each row's argmax of the logits
   (lowest id on ties). host_capture (host, n_layers flags) or NULL: the output rows of each flagged layer are
   kept in info.capture[layer] (speculative decoding's target features). Not reentrant: one launch of a plan
   at a time per stream. */
int fd_forward(void* plan, const int32_t* positions, const int32_t* n_past, const uint8_t* mask, int mask_n,
               int row0, int n, int32_t* argmax, const uint8_t* host_capture, void* stream);

/* --- cdef end --- */
#ifdef __cplusplus
}
#endif
#endif /* FLASHD_H */
