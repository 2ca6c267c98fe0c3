/* flashd_tuning.h -- the launch tuning in effect (tuning.cu): one table entry per GPU architecture, chosen
   for the current device on first use, readable and replaceable through the ABI (benchmarks record it and
   A/B it; nothing is read from the environment). gemv_rounds, pdl, gemv_mma_rows, gemv_rows_fuse_nx,
   weights_evict_first, delta_cluster, gemv_xq_prepass_(norm_)cols, gemv_swiglu_pair, gemv_xq_direct, gemv_rows_tma(_split),
   gemv_rows_stage_x, gemv_rows_dp4a, gemv_rows_tma_warps, attn_o_codes and attn_masked_rope change only how kernels are launched or cached, never a result; gemv_stage_bytes, gemv_swiglu_stage_bytes and gemv_split_cols may change a GEMV's lanes per row (a row's
   summation order), gemv_int8_x its activation precision and gemv_rows and gemv_rows_formats the kernel (and chunking) of Q4_K / Q6_K / Q8_0 / Q5_0 GEMVs and
   attn_single_chunks the summation order of short attention rows --
   under any tuning a row's bits do not depend on the rows beside it.
   Part of the C ABI: include flashd.h (its conventions hold here), not this file. */
#ifndef FLASHD_TUNING_H
#define FLASHD_TUNING_H
#ifndef FLASHD_H
#error "include flashd.h, which includes this header"
#endif
/* --- cdef begin --- */

typedef struct {
    int gemv_int8_x;        /* 1: GEMV launches whose matrices are all quantized stage x as int8 hi + lo codes;
                               0: float32 activations everywhere (accuracy A/B) */
    int gemv_stage_bytes;   /* target bytes of one GEMV step's shared-memory buffer, 256 .. 65536 */
    int gemv_rounds;        /* 2 .. 16: large launches run persistent double-buffered warps with that many steps
                               each; 0: one single-buffered step a warp wherever the grid can hold them */
    int pdl;                /* 1: programmatic dependent launch where the GPU has it (sm_90 and later); 0: off */
    int gemv_mma_rows;      /* 2 .. 8: GEMV passes of at least that many x rows (int8 activations) run on int8 tensor
                               cores where the GPU has them (sm_80 and later), bit for bit the one-row kernel's rows;
                               0: never (every table entry: not yet faster) */
    int gemv_rows;          /* 1 .. 8: GEMVs whose matrices are all Q4_K, Q6_K, Q8_0 or Q5_0 run one int8 tensor-core kernel
                               for every n_x (1 .. 32; sm_80 and later, FD_E_ARG elsewhere), a row cut into chunks of
                               that many x 256 columns (the chunk size changes the bits; n_x never does), x quantized
                               to int8 with a scale per 128 columns; 0: gemv.cuh's kernels (n_x <= 8) */
    int gemv_rows_fuse_nx;  /* 0 .. 8: gemv_rows calls of at most that many x rows quantize x inside the GEMV kernel
                               (each CTA its own copy: no pre-pass launch) -- on sm_90's bulk-copy kernel every
                               such launch, on the cp.async kernel where it has more than 2 tiles of 16 rows an SM;
                               more rows, or 0: a pre-pass launch. The same codes either way, so it never changes a
                               result */
    int weights_evict_first; /* 1: the decode GEMVs (gemv.cuh, gemv_rows.cuh) stream their weights with an L2
                               evict-first hint (sm_80 and later), so the ~1 GB a step reads does not push the
                               activations, the KV cache and the kernels' code out of L2; 0: default caching */
    int attn_single_chunks; /* 0 .. 64: a decode or masked attention row whose keys span at most this many chunks
                               (chunk_len keys each) is attended by one CTA per (KV head, row tile) over all its
                               keys: no split partials and no combine (no combine launch at all where max_ctx holds
                               that few chunks); 0: every row is split. It changes those rows' summation order (their
                               bits), the same way for decode and masked rows, so a tree row still equals its
                               one-row step */
    int delta_cluster;      /* 1: fd_gated_delta_rule_fused(_tree) runs a value head's 32-column tiles as one thread-block
                               cluster, a block a tile (sm_90 builds on sm_90 and later devices; elsewhere, and for
                               d_v <= 32, the one-block form whatever this says); 0: one block a head. Same bits either
                               way (the tiles' output-norm sums are added in tile order in both) */
    int gemv_xq_prepass_cols; /* int8-activation GEMV launches of the one-row kernels (n_x <= 8, gemv.cuh) without a
                               fused RMSNorm and with at least this many columns quantize x once in a small launch
                               before the GEMV (x's int8 image in a per-stream buffer) instead of in every CTA; 0: never.
                               The same bytes either way, so never changes a result */
    int gemv_xq_prepass_norm_cols; /* the same for launches with a fused RMSNorm (norm_w), whose CTAs also pass over x
                               for its sum of squares first */
    int gemv_swiglu_stage_bytes; /* fd_gemv_swiglu's step buffer bytes (256 .. 65536), 0: gemv_stage_bytes; like it, may
                               change the launch's lanes per row (a row's summation order), never row invariance */
    int gemv_swiglu_pair;   /* 1: one-row int8 fd_gemv_swiglu launches whose gate and up share a format compute both rows'
                               dots in one loop (each x code loaded once for both); 0: one loop each. Same bits */
    int gemv_xq_direct;     /* 1: one-row (n_x = 1) launches that take the x pre-pass read x's int8 image where the
                               pre-pass wrote it (global memory, through L1) instead of copying it into each CTA's
                               shared memory first; 0: copy. The same bytes either way, so never changes a result */
    int gemv_split_cols;    /* one-matrix int8-activation GEMV launches (fd_gemv; one-row kernels, n_x <= 8) of at least
                               this many columns whose rows take a whole warp compute each row on a pair of warps, each
                               over half the row's blocks, summed in slice order; 0: never. It changes those rows'
                               summation order (their bits), the same way for every n_x: never row invariance */
    int gemv_rows_tma;      /* 0 .. 8: gemv_rows calls (gemv_rows > 0) stage their weights as whole 16-row tiles by bulk
                               copies (sm_90 and later; a copy warp, the other warps compute) with this many tiles in
                               flight beyond those landed (at least 4 for calls of more than 8 x rows, 2 for
                               launches of many tiles a CTA), where the shapes
                               allow (gemv_rows_tma.cuh); 0: every warp
                               copies its own items (cp.async). The same arithmetic either way, so never changes a
                               result */
    int gemv_rows_formats;  /* 0 .. 15: the weight formats gemv_rows runs, a bit each -- 1 Q4_K, 2 Q6_K, 4 Q8_0, 8 Q5_0;
                               a GEMV launch takes gemv_rows only where every matrix's format is in the mask (so a
                               matrix's kernel depends on its format, never on n_x), the others gemv.cuh's kernels */
    int gemv_rows_dp4a;     /* 0 or 1: one-row gemv_rows launches of Q4_K / Q6_K weights (one format or mixed) whose CTAs quantize x themselves, on the
                               bulk-copy kernel (gemv_rows_tma), compute their items on dp4a lanes (gemv_rows_dp4a.cuh)
                               instead of int8 mma: the same integer group sums and float steps, so the same bits --
                               row invariance holds across the two kernels */
    int gemv_rows_tma_split; /* 0 .. 64: bulk-copy gemv_rows launches whose CTAs have one 16-row tile each copy it in
                               pieces of this many chunks (columns), each on its own barrier, so its first items start
                               before the whole tile has landed (a row of more chunks than this); 0: whole tiles. The
                               same arithmetic, so never changes a result */
    int gemv_rows_stage_x;  /* 0 .. 1 << 20: bulk-copy gemv_rows launches of 2 .. 8 x rows that take the x pre-pass and
                               whose codes (n_x x cols bytes) are at most this many copy them and their scales into
                               every CTA's shared memory before their items read them (instead of each item reading
                               them through L1); 0: never. The same codes, so never changes a result */
    int gemv_rows_tma_warps; /* 4 .. 31: computing warps at most (the copy warp comes on top) of a bulk-copy gemv_rows
                               launch of at most 8 x rows -- at most 19 where its items run on int8 mma (their
                               registers), up to 31 for one-row launches on dp4a lanes (gemv_rows_dp4a); a CTA's items
                               go to its warps round-robin, so e.g. ffn_down's 35 chunk items a CTA (1.5B) take 3 rounds
                               on 16 warps and 2 on 18. A launch shape, so never changes a result */
    int attn_o_codes;       /* 0 / 1: a forward of 2 or more rows (a verify tree) has its attention write o's int8
                               codes (fd_attention_shape_t.o_codes) for the output projection (fd_gemv_xq) where
                               head_dim is 128; read by the Python runner, never changes a result */
    int attn_masked_rope;   /* 0 .. 48: a verify forward of at most this many rows runs fd_attention_masked_rope (RoPE
                               and the K/V write inside the attention) in its layers after the first, instead of
                               fd_rope_kv_write + fd_attention_masked, where it applies (float16 K and V, head_dim 64 /
                               128, rope_dim % 8 == 0); 0: never. Read by the Python runner, never changes a result */
} fd_tuning_t;

/* The table's entry for compute capability major.minor (the closest entry at or below it). */
int fd_tuning_default(int cc_major, int cc_minor, fd_tuning_t* out);
/* The tuning in effect on the current device (its table entry until fd_tuning_set). */
int fd_tuning_get(fd_tuning_t* out);
/* Replace the current device's tuning (FD_E_ARG if a value is out of range: nothing changes). Launches
   issued, and graphs captured, after the call use it; graphs captured before keep their launches. */
int fd_tuning_set(const fd_tuning_t* tuning);

/* --- cdef end --- */
#endif /* FLASHD_TUNING_H */
