/* flashd_flashprefill.h -- PFlash's FlashPrefill: block scoring, selection, block-sparse attention
   and the tail attention maxima.
   Part of the C ABI: include flashd.h (its conventions hold here), not this file. */
#ifndef FLASHD_FLASHPREFILL_H
#define FLASHD_FLASHPREFILL_H
#ifndef FLASHD_H
#error "include flashd.h, which includes this header"
#endif
/* --- cdef begin --- */

/* ---- FlashPrefill block scoring (flashprefill.cu) and block-sparse attention (attention_sparse.cu) ----
   A prefill chunk of n new tokens at cache slots [p0, p0 + n) with p0 % FD_FLASHPREFILL_BLOCK == 0 (p0
   is a host int: these run in prefill only, never inside a captured graph); its keys are slots
   [0, p0 + n) of this layer's cache. Blocks are FD_FLASHPREFILL_BLOCK slots: Nk = ceil((p0 + n) / 128) key
   blocks, Mq = ceil(n / 128) query blocks, query block mq has absolute index m = p0 / 128 + mq.
   q (n, n_heads, head_dim) f32 (rotated), the caches and `shape` as in flashd_attention.h; head_dim in
   {64, 128} unless stated. */
#define FD_FLASHPREFILL_BLOCK 128
#define FD_MASK_DENSE 0        /* head attends every key block kb <= m (causal attention) */
#define FD_MASK_STREAMING -1   /* any value < 0: kb < sink_blocks or m - kb < local_blocks */
#define FD_MASK_LISTS 1        /* any value > 0: the blocks listed in block_idx / block_cnt */
/* mean_k (Nk, n_kv_heads, head_dim) f32: mean of each key block's real rows (slots < n_keys); head_dim <= 256 */
int fd_flashprefill_mean_k(float* mean_k, const void* k_cache, int n_keys, const fd_attention_shape_t* shape,
                           void* stream);
/* score (Mq, n_heads, Nk) f32: with a[j, kb] = q_j . mean_k[kb, h's kv head] * scale over the rows j of
   block m and kb <= m, and M = max of a over all of them: s[kb] = sum_j exp(a[j, kb] - M), normalised
   so that sum_kb s[kb] = 1; 0 for kb > m. */
int fd_flashprefill_score(float* score, const float* q, const float* mean_k, int p0, int n,
                          const fd_attention_shape_t* shape, void* stream);
/* idx (Mq, n_heads, Nk) int32: the kept key blocks of each (query block, head), ascending, -1 padded;
   cnt (Mq, n_heads) their number. Keep kb <= m iff score >= alpha * max_kb score, kb < sink_blocks,
   m - kb < window_blocks, or m >= first_full_block. */
int fd_flashprefill_select(int32_t* idx, int32_t* cnt, const float* score, int p0, int n, int n_heads, float alpha,
                           int sink_blocks, int window_blocks, int first_full_block, void* stream);
/* acc (n_tail, n_keys) f32 = max(acc, max over heads of P[h, t, j]), P the dense causal softmax
   (scale q k^T) of tail token t -- q_tail (n_tail, n_heads, head_dim), at slot n_keys - n_tail + t --
   over keys j <= its slot; other entries unchanged. workspace: 2 * n_tail * n_heads floats. */
int fd_flashprefill_tail_max_probs(float* acc, const float* q_tail, const void* k_cache, int n_keys, int n_tail,
                                   const fd_attention_shape_t* shape, float* workspace, void* stream);
/* Block-sparse causal attention: token i, head h attends slot j iff j <= p0 + i and key block j / 128 is in
   the block set of (its query block, h), chosen by head_mask_type[h] (device, n_heads entries; NULL = all
   FD_MASK_LISTS): lists are block_idx[(mq * n_heads + h) * Nk + e] for e < block_cnt[mq * n_heads + h]
   (fd_flashprefill_select's output). o (n, n_heads * head_dim) f32; a row attending nothing is 0. Tensor
   cores: FD_E_SHAPE on devices without mma.sync m16n8k16 (sm_80) or with misaligned pointers;
   FD_E_UNSUPPORTED in the HIP build (no SIMT fallback). */
int fd_attention_block_sparse(float* o, const float* q, const void* k_cache, const void* v_cache, int p0, int n,
                              const fd_attention_shape_t* shape, const int32_t* head_mask_type,
                              const int32_t* block_idx, const int32_t* block_cnt, int sink_blocks, int local_blocks,
                              void* stream);
/* FlashPrefill's sparse attention (the anchor's sparse_fwd): fd_attention_block_sparse with every head
   FD_MASK_LISTS, over fd_flashprefill_select's lists. */
int fd_flashprefill_sparse_attention(float* o, const float* q, const void* k_cache, const void* v_cache, int p0,
                                     int n, const fd_attention_shape_t* shape, const int32_t* block_idx,
                                     const int32_t* block_cnt, void* stream);

/* --- cdef end --- */
#endif /* FLASHD_FLASHPREFILL_H */
