/* flashd.h -- the C ABI of libflashd_cuda (and libflashd_hip, from the same sources): the conventions,
 * status codes and weight formats here, then one header per part, each included at the end:
 *
 *   flashd_runtime.h       devices, memory, streams, events, graphs           (runtime.cu)
 *   flashd_tuning.h        the launch tuning table per GPU architecture       (tuning.cu)
 *   flashd_linear.h        dequantization, embedding, GEMV, GEMM, norms        (dequant.cu, gemv.cu, gemm.cu, ...)
 *   flashd_attention.h     the attention shape, RoPE + K/V write, decode / prefill / masked attention,
 *                          the speculative commit                              (rope.cu, attention_*.cu, kv_compact.cu)
 *   flashd_flashprefill.h  PFlash's block scoring and block-sparse attention   (flashprefill.cu, attention_sparse.cu)
 *   flashd_sampling.h      argmax, sampling, the decode loop's bookkeeping     (sampling.cu)
 *   flashd_forward.h       the persistent forward                              (forward.cu)
 *   flashd_recurrent.h     hybrid models' recurrent layers: causal conv1d, gated delta rule and its decay
 *                                                      (causal_conv1d.cu, gated_delta_rule.cu, delta_decay.cu)
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
 *   - Shapes the kernels cannot check on the device are checked by the Python wrappers before the call
 *     (flashd.daemon.backends.cuda), and again here where they are plain arguments (FD_E_ARG).
 *
 * cffi reads the part between the cdef markers of this file and of each header it includes, in include
 * order (flashd.daemon.backends.cuda.lib.cdef_source), so those parts are plain declarations only: no
 * #include, no #if, no macros other than integer constants.
 */
#ifndef FLASHD_H
#define FLASHD_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
/* --- cdef begin --- */
#define FD_ABI_VERSION 31   /* 2: attention entry points take fd_attention_shape_t / fd_rope_t; fd_kv_move,
                              fd_event_query and fd_not_ready_status removed; 3: fd_tuning_t (flashd_tuning.h);
                              4: fd_tuning_t.gemv_mma_rows; 5: fd_attention_shape_t.k_type / v_type (FD_KV_*),
                              fd_kv_plane_bytes, fd_kv_compact_rows; 6: fd_topk_logprobs; 7: a q8_0 / q4_0 K
                              cache holds Hadamard-rotated keys, q rotated alike (flashd_attention.h); 8:
                              fd_tuning_t.gemv_rows (fd_gemv* take n_x up to 32 where it applies); 9:
                              fd_tuning_t.gemv_rows_fuse_nx; 10: a key offset (k_offset) for a quantized K in
                              fd_rope_kv_write and fd_attention_decode_rope; 11:
                              fd_tuning_t.weights_evict_first; 12: flashd_recurrent.h (fd_causal_conv1d*,
                              fd_gated_delta_rule_*); 13: fd_tuning_t.attn_single_chunks;
                              14: a hybrid's gates on the device:
                              fd_mul, fd_silu, fd_sigmoid, fd_sigmoid_mul, fd_copy_cols (flashd_linear.h),
                              fd_delta_decay (flashd_recurrent.h); 15: a hybrid's fused ops:
                              fd_causal_conv1d_silu, fd_causal_conv1d_silu_tree, fd_gated_delta_rule_fused,
                              fd_gated_delta_rule_fused_tree (flashd_recurrent.h), fd_gated_qk_norm
                              (flashd_linear.h); 16: fd_tuning_t.delta_cluster; 17: fd_tuning_t.gemv_prewait; 18:
                              fd_tuning_t.gemv_prewait removed (lost), gemv_xq_prepass_cols, gemv_xq_prepass_norm_cols,
                              gemv_swiglu_stage_bytes; 19: fd_tuning_t.gemv_swiglu_pair; 20:
                              fd_tuning_t.gemv_xq_direct, gemv_split_cols; 21: the KV window
                              (fd_attention_shape_t.window / window_slots, fd_kv_window_offset,
                              fd_kv_compact_ring); 22: fd_tuning_t.gemv_rows_tma; 23:
                              fd_ddtree_build (flashd_sampling.h); 24: fd_tuning_t.gemv_rows_formats; 25: fd_tuning_t.gemv_rows_dp4a; 26:
                              fd_tuning_t.gemv_rows_tma_split, gemv_rows_stage_x; 27: fd_tuning_t.gemv_rows_tma_warps;
                              28: fd_attention_shape_t.max_keys; 29: fd_rope_t.table / table_mode; 30:
                              fd_attention_shape_t.o_codes / o_scales, fd_gemv_xq, fd_tuning_t.attn_o_codes; 31:
                              fd_attention_masked_rope, fd_rope_kv_write's table_mode 1 (a row a token),
                              fd_tuning_t.attn_masked_rope */

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

/* --- cdef end --- */

#include "flashd_runtime.h"
#include "flashd_tuning.h"
#include "flashd_linear.h"
#include "flashd_attention.h"
#include "flashd_flashprefill.h"
#include "flashd_sampling.h"
#include "flashd_forward.h"
#include "flashd_recurrent.h"

#ifdef __cplusplus
}
#endif
#endif /* FLASHD_H */
