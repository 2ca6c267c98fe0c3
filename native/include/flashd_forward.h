/* flashd_forward.h -- the persistent forward: every layer of a decode / verify forward in one launch.
   Part of the C ABI: include flashd.h (its conventions hold here), not this file. */
#ifndef FLASHD_FORWARD_H
#define FLASHD_FORWARD_H
#ifndef FLASHD_H
#error "include flashd.h, which includes this header"
#endif
/* --- cdef begin --- */

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
#endif /* FLASHD_FORWARD_H */
