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

/* ---- the decay of the gated delta rule (delta_decay.cu, ABI 13) ------------------------------ */
/* g (n, Hv) = softplus(alpha + dt_bias) * a, alpha (n, Hv), dt_bias and a (Hv,): the log decay fd_gated_delta_rule_*
   take. softplus(z) = z for z > 20, else log1p(exp(z)); the reference backend's float32 steps (exp and log1p each
   rounded once). g may alias alpha. */
int fd_delta_decay(float* g, const float* alpha, const float* dt_bias, const float* a, int n_tokens, int n_v_heads,
                   void* stream);

/* --- cdef end --- */
#endif /* FLASHD_RECURRENT_H */
