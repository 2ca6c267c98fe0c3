/* flashd_recurrent.h -- a hybrid model's recurrent layers (Gated DeltaNet, qwen35): the short causal convolution
   with its state, and the gated delta rule -- decode (one token), prefill (n tokens, sequential), and a draft
   tree's nodes (a state per node from its parent's) -- and the rule's decay (fd_delta_decay).
   Part of the C ABI: include flashd.h (its conventions hold here), not this file.

   The numpy definitions are daemon/backends/reference_recurrent.py (decode and prefill) and
   reference_recurrent_tree.py (the tree forms). Everything is float32; states are float32 and updated in place
   (the tree forms read the committed state and write node buffers). Shapes, row-major:
     n tokens (or tree nodes); C conv channels, K taps (2 <= K <= FD_CONV_MAX_K)
     Hk query/key heads, Hv value heads (Hv % Hk == 0; value head h reads key head h % Hk), d_k key / query
     head size (1 <= d_k <= FD_DELTA_MAX_DK), d_v value head size; the state of value head h is d_k x d_v,
     indexed [key i][value j]. */
#ifndef FLASHD_RECURRENT_H
#define FLASHD_RECURRENT_H
#ifndef FLASHD_H
#error "include flashd.h, which includes this header"
#endif
/* --- cdef begin --- */

#define FD_CONV_MAX_K 8       /* taps of fd_causal_conv1d* (FD_E_SHAPE above) */
#define FD_DELTA_MAX_DK 256   /* d_k of fd_gated_delta_rule_* (FD_E_SHAPE above) */
#define FD_DELTA_FUSED_MAX_DK 128   /* d_k of fd_gated_delta_rule_fused* (FD_E_SHAPE above; ABI 15) */
#define FD_DELTA_FUSED_MAX_DV 128   /* d_v of fd_gated_delta_rule_fused*: a block holds a whole head (ABI 15) */

/* ---- short causal convolution with state (causal_conv1d.cu) -------------------------------- */
/* x (n, C), weight (C, K), conv_state (K - 1, C): the K - 1 inputs before x. With u = concat(conv_state, x):
     y[t, c] = sum_k u[t + k, c] * weight[c, k]            (k = 0 .. K-1 in order; y (n, C))
   then conv_state <- the last K - 1 rows of u. n = 1 is a decode step; any n >= 0 a prefill, each output
   computed with the decode step's arithmetic (the same bits). y must not alias x or conv_state. */
int fd_causal_conv1d(float* y, const float* x, const float* weight, float* conv_state, int n, int channels,
                     int kernel, void* stream);
/* A draft tree of n nodes (parents (n,) int32: parents[i] < i, or -1 for the committed context), in one pass:
   node i's window is its parent's last K - 1 inputs (node_conv[parents[i]], or conv_state for -1) then x[i];
   y[i] is the decode step's output over that window and node_conv[i] (K - 1, C) its last K - 1 inputs.
   conv_state is read only; node_conv (>= n, K - 1, C). A parent outside [-1, i) gives NaN for that node. */
int fd_causal_conv1d_tree(float* y, const float* x, const float* weight, const float* conv_state,
                          const int32_t* parents, float* node_conv, int n, int channels, int kernel, void* stream);
/* The same two with y = silu(conv output) (ABI 15): the bits of fd_causal_conv1d* then fd_silu, one launch. The
   state and node_conv hold the raw inputs, as above. */
int fd_causal_conv1d_silu(float* y, const float* x, const float* weight, float* conv_state, int n, int channels,
                          int kernel, void* stream);
int fd_causal_conv1d_silu_tree(float* y, const float* x, const float* weight, const float* conv_state,
                               const int32_t* parents, float* node_conv, int n, int channels, int kernel,
                               void* stream);

/* ---- gated delta rule (gated_delta_rule.cu) ------------------------------------------------- */
/* q, k (n, Hk, d_k) L2-normalized by the caller, v (n, Hv, d_v), g (n, Hv) the log decay (<= 0), beta (n, Hv),
   state (Hv, d_k, d_v). For each token t in order and value head h (M = state[h], key head h % Hk):
     M <- exp(g) M;  delta = (v - M^T k) * beta;  M <- M + k delta^T;  out[t, h] = (M^T q) * scale
   out (n, Hv, d_v); scale is 1/sqrt(head size) as the model defines it. out must not alias the inputs. */
int fd_gated_delta_rule_decode(float* out, const float* q, const float* k, const float* v, const float* g,
                               const float* beta, float* state, int n_k_heads, int n_v_heads, int d_k, int d_v,
                               float scale, void* stream);
/* The same over n tokens, one after another with the state kept on chip: every token's arithmetic is the
   decode step's, so the outputs and the final state are bit for bit n decode calls. */
int fd_gated_delta_rule_prefill(float* out, const float* q, const float* k, const float* v, const float* g,
                                const float* beta, float* state, int n_tokens, int n_k_heads, int n_v_heads,
                                int d_k, int d_v, float scale, void* stream);
/* A draft tree of n nodes (parents as fd_causal_conv1d_tree): node i's memory is its parent's
   (node_state[parents[i]], or state for -1) updated by node i's token with the decode step's arithmetic;
   out[i] as the decode step's and node_state[i] (Hv, d_k, d_v) its memory. state is read only; node_state
   (>= n, Hv, d_k, d_v). A parent outside [-1, i) gives NaN for that node. */
int fd_gated_delta_rule_tree(float* out, const float* q, const float* k, const float* v, const float* g,
                             const float* beta, const float* state, const int32_t* parents, float* node_state,
                             int n_nodes, int n_k_heads, int n_v_heads, int d_k, int d_v, float scale, void* stream);

/* ---- the fused gated delta rule (gated_delta_rule_fused.cu, ABI 15) ------------------------------ */
/* A Gated DeltaNet layer's core from the raw projections, one launch: per token t and value head h (key head
   h % Hk), q and k L2-normed (x / sqrt(sum(x^2) + l2_eps)), g = softplus(alpha + dt_bias) * a (fd_delta_decay's
   steps), beta = sigmoid(beta_raw) (fd_sigmoid's steps), the delta rule step as fd_gated_delta_rule_decode states
   it, then out[t, h] = o / sqrt(mean(o^2 over d_v) + norm_eps) * norm_w * silu(z[t, h]) (the gated output norm).
   q, k (n, Hk, d_k) and v (n, Hv, d_v) are read with rows row_stride floats apart (views of the conv output's
   q | k | v row; row_stride >= Hk d_k and >= Hv d_v); alpha, beta (n, Hv), z and out (n, Hv, d_v) contiguous;
   dt_bias, a (Hv,); norm_w (d_v,); state (Hv, d_k, d_v) updated. d_k <= FD_DELTA_FUSED_MAX_DK and
   d_v <= FD_DELTA_FUSED_MAX_DV, else FD_E_SHAPE. n = 1 is a decode step; more run one after another with the
   state on chip and every token's arithmetic the decode step's (bit for bit n decode calls). Its bits are its
   own: equal to the unfused chain within float32 rounding, not bitwise. out must not alias the inputs. The state
   (here and in the tree form) is read before the launch waits for the kernel just before it on the stream
   (programmatic dependent launch): that kernel must not be the state's writer (a model's layers always have others
   between two steps of one layer; a copy or a synchronize between them also does). */
int fd_gated_delta_rule_fused(float* out, const float* q, const float* k, const float* v, int64_t row_stride,
                              const float* alpha, const float* beta, const float* z, const float* dt_bias,
                              const float* a, const float* norm_w, float* state, int n_tokens, int n_k_heads,
                              int n_v_heads, int d_k, int d_v, float scale, float l2_eps, float norm_eps,
                              void* stream);
/* A draft tree of n nodes (parents as fd_gated_delta_rule_tree): node i's memory is its parent's updated by node
   i's token with the decode step's fused arithmetic; out[i] is bit for bit fd_gated_delta_rule_fused's one-token
   output from that memory, node_state[i] its memory. state is read only; node_state (>= n, Hv, d_k, d_v). */
int fd_gated_delta_rule_fused_tree(float* out, const float* q, const float* k, const float* v, int64_t row_stride,
                                   const float* alpha, const float* beta, const float* z, const float* dt_bias,
                                   const float* a, const float* norm_w, const float* state, const int32_t* parents,
                                   float* node_state, int n_nodes, int n_k_heads, int n_v_heads, int d_k, int d_v,
                                   float scale, float l2_eps, float norm_eps, void* stream);

/* ---- the decay of the gated delta rule (delta_decay.cu, ABI 13) ------------------------------ */
/* g (n, Hv) = softplus(alpha + dt_bias) * a, alpha (n, Hv), dt_bias and a (Hv,): the log decay fd_gated_delta_rule_*
   take. softplus(z) = z for z > 20, else log1p(exp(z)); the reference backend's float32 steps (exp and log1p each
   rounded once). g may alias alpha. */
int fd_delta_decay(float* g, const float* alpha, const float* dt_bias, const float* a, int n_tokens, int n_v_heads,
                   void* stream);

/* --- cdef end --- */
#endif /* FLASHD_RECURRENT_H */
