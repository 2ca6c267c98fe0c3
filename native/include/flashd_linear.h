/* flashd_linear.h -- weights and projections: dequantization, embedding lookup, GEMV, GEMM,
   norms and elementwise ops.
   Part of the C ABI: include flashd.h (its conventions hold here), not this file. */
#ifndef FLASHD_LINEAR_H
#define FLASHD_LINEAR_H
#ifndef FLASHD_H
#error "include flashd.h, which includes this header"
#endif
/* --- cdef begin --- */

/* ---- weights: dequantization and embedding lookup (dequant.cu) --------------------------- */
/* dst (rows, cols) float16 = the weight, exactly as gguf.quants.dequantize defines it (rounded to f16) */
int fd_dequant_f16(void* dst, const void* w, int qtype, int64_t rows, int64_t cols, void* stream);
/* dst (n_ids, cols) float32 = rows ids[i] of table (n_table_rows, cols); ids outside the table -> FD_E_ARG is
   not checkable on the device: such rows are written as NaN */
int fd_embed(float* dst, const void* table, int qtype, int64_t n_table_rows, int64_t cols,
             const int32_t* ids, int n_ids, void* stream);

/* ---- decode projections: quantized GEMV (gemv.cu) ----------------------------------------- */
/* For each of n_x input rows i (1 <= n_x <= 8; 1 <= n_x <= 32 where the tuning's gemv_rows is on and every
   matrix of the call is Q4_K, Q6_K or Q8_0 with cols <= 65536 -- flashd_tuning.h):
     xn = norm_w ? rmsnorm(x[i]) * norm_w : x[i]                    (x: (n_x, cols))
     y[i, r] = dot(W[r, :], xn) (+ bias[r]) (+ residual[i, r])      (y: (n_x, rows))
   y may alias residual. */
int fd_gemv(float* y, const void* w, int qtype, int rows, int cols, const float* x, int n_x,
            const float* norm_w, float eps, const float* bias, const float* residual, void* stream);
/* fd_gemv without a norm, x's int8 codes given as well (ABI 30): xq (n_x, cols) int8 and xsc[(c / 128) * 32 + i],
   the codes and scales x_codes.cuh defines for x (fd_attention_shape_t.o_codes writes them; n_x <= 32). Where the
   call runs on gemv_rows with a scale per 128 columns (the tuning's gemv_rows and gemv_rows_formats; Q4_K / Q6_K
   matrices) the kernel reads the codes instead of quantizing x itself -- no pre-pass, one fewer round trip; anywhere
   else it is fd_gemv on x. The caller promises that xq / xsc are x's codes, so the result is fd_gemv's, bit for
   bit, either way. The kernels read xq in tiles of 8 rows: rows n_x .. (n_x rounded up to 8) - 1 must be readable
   (their results are never written). FD_E_ARG where xq or xsc is NULL, xq is not 16-byte aligned (its rows are
   copied 16 bytes at a time) or n_x is not 1 .. 32. */
int fd_gemv_xq(float* y, const void* w, int qtype, int rows, int cols, const float* x, const int8_t* xq,
               const float* xsc, int n_x, const float* bias, const float* residual, void* stream);
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
/* ABI 13 (a hybrid model's gates, elementwise.cu; n elements, y may alias an input):
     fd_mul          y = a * b
     fd_silu         y = silu(x), the bits of fd_swiglu(y, x, ones)
     fd_sigmoid      y = 0.5 (1 + tanh(x / 2)), the reference backend's float32 steps (tanh rounded once)
     fd_sigmoid_mul  y = x * sigmoid(gate): the bits of fd_sigmoid then fd_mul, one launch */
int fd_mul(float* y, const float* a, const float* b, int64_t n, void* stream);
int fd_silu(float* y, const float* x, int64_t n, void* stream);
int fd_sigmoid(float* y, const float* x, int64_t n, void* stream);
int fd_sigmoid_mul(float* y, const float* x, const float* gate, int64_t n, void* stream);
/* y (rows, cols) = x[:, col0 : col0 + cols] of x (rows, x_cols): bit copies (a tensor's split along its last
   axis). 0 <= col0, col0 + cols <= x_cols (FD_E_ARG); y must not overlap x. */
int fd_copy_cols(float* y, const float* x, int64_t rows, int64_t x_cols, int64_t col0, int64_t cols, void* stream);
/* ABI 15 (gated_qk_norm.cu): a gated attention layer's head norms and gate split in one launch. q_gate (n, H, 2d) holds
   each head's [query | output gate]; q_out (n, H, d) = rmsnorm(query) * wq, gate_out (n, H, d) = the gate (bit
   copies), k_out (n, Hkv, d) = rmsnorm(k (n, Hkv, d)) * wk; rmsnorm(x) = x / sqrt(mean(x^2) + eps) per head row,
   each row's arithmetic independent of n. wq, wk (d,). Outputs must not overlap the inputs. */
int fd_gated_qk_norm(float* q_out, float* gate_out, float* k_out, const float* q_gate, const float* k,
                     const float* wq, const float* wk, int n, int n_heads, int n_kv_heads, int head_dim, float eps,
                     void* stream);

/* --- cdef end --- */
#endif /* FLASHD_LINEAR_H */
