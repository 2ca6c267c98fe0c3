// attention_splitk.cuh -- the split-K flash-attention core of attention_decode.cu (one new token)
// and attention_masked.cu (n new tokens under a mask: speculative tree verification), over the
// float16 KV cache [n_kv_heads][max_ctx][head_dim] -- or a q8_0 / q4_0 K or V (kv_quant.cuh planes),
// staged as stored by cp.async and dequantized to float16 tiles in shared memory (splitk_kernel's QKV variant,
// attention_splitk_qstage.cuh; no dequantized copy in global memory).
//
// The ops it serves, by name through every layer (ARCHITECTURE.md, "Ops"): fd_attention_decode,
// fd_attention_decode_rope and fd_attention_masked -> CudaOps.attention_decode / attention_decode_rope /
// attention_masked (daemon/backends/cuda/attention_ops.py) -> tests/gpu/test_attention_decode.py,
// test_attention_decode_rope.py, test_attention_masked.py (and tests/emulation/test_decode_attention_emulation.py)
// -> bench/bench_attention_decode.py (decode and masked), bench_attention_decode_rope.py.
//
// A block owns one new token, one KV head, one tile of ROWS = 16 of that KV head's G = n_heads /
// n_kv_heads query heads (G <= 16: one tile) and one split of the token's visible keys:
//   visible keys  a token sees the committed slots [0, n_past) and, in masked mode, the new slots
//               n_past + j with mask[token, j] != 0, j ascending; decode sees [0, n_past]. These
//               are numbered as a virtual sequence v = 0 .. L-1: v < n_past is slot v, and v =
//               n_past + k is the k-th visible new slot (the block keeps that list in shared
//               memory). For a tree node the list is its root-to-node path, so node i reads exactly
//               the keys, in exactly the order, that a decode step at its position reads once the
//               accepted path is compacted into consecutive slots.
//   splits      the virtual sequence is cut into chunks of chunk_len; split s takes chunks s, s +
//               n_splits, ...; n_splits depends only on the model shape and max_ctx (never on n or
//               on the mask), so every (token, head) row is reduced in the same order as decode's.
//               A row of at most fd_tuning_t.attn_single_chunks chunks is not split: split 0 takes all
//               its chunks in order and writes the output, the other splits and the combine skip it
//               (a function of the row's key count, so decode and masked rows still agree).
//   tiles       a split's chunks are streamed in tiles of TILE = 64 keys through a STAGES-deep
//               cp.async pipeline of shared memory (K and V rows padded to HD + 8 halves so the
//               ldmatrix row reads of 8 consecutive rows hit distinct banks).
//   warps       4 warps; warp w takes keys [16w, 16w + 16) of every tile and keeps its own online
//               softmax state (running max m, sum l, o[16][HD]) -- no synchronisation per tile
//               beyond the pipeline's one __syncthreads. At the end the 4 states are merged in
//               shared memory, and the block writes either the normalised output (one split) or
//               the split's partial (m, l, unnormalised o) to the workspace for combine_kernel.
//
// Fused rope (splitk_kernel<HD, true>, fd_attention_decode_rope): the decode kernel with the new
// token's RoPE of q and k and its K/V cache write folded in (rope_stage and the new-key override in
// splitk_kernel); bit for bit fd_rope_kv_write followed by the plain kernel. Its plan, first tile
// copies and cos / sin run before pdl_wait (their inputs are earlier steps'; splitk_kernel says why).
//
// Batch invariance: a row's arithmetic depends only on its q, its key sequence, chunk_len and
// n_splits. Speculative verification therefore reproduces plain decoding bit for bit (given
// bitwise-equal q/K/V, which the row-invariant GEMVs provide): tests/gpu/test_attention_masked.py.
//
// Warp math (FD_ATTN_MMA, sm_80+): tensor-core mma.m16n8k16 (f16 in, f32 accumulate) with the 16
// query rows as M. QK^T: A = q, B = K rows via ldmatrix; PV: A = P from the score fragments, B =
// V via ldmatrix.trans. To keep float32 accuracy, q (pre-multiplied by scale * log2 e) and P are
// each split into f16 hi + lo parts and multiplied twice (K and V are f16 already, so products
// are exact and the error is the ~2^-22 of the split plus f32 accumulation). Softmax runs in the
// log2 domain (exp2f). Without tensor cores (HIP, or -DFD_ATTENTION_SIMT to test) a SIMT warp
// step with the same inputs and merge layout is used.
//
// Launch latency: both kernels here are launched with programmatic dependent launch on sm_90
// (launch_pdl): pdl_wait() orders each kernel after the previous kernel's writes (at the top, except
// in the fused rope kernel, which first does the work that needs none of them).
//
// Numerical contract: o = softmax(q k^T * scale) v over the visible keys, with the f16 cache
// values as given; a row that sees no key at all (masked mode, n_past = 0 and an empty mask row)
// comes out NaN, like the reference's softmax of all -inf.
//
// Files: attention_splitk_params.cuh (block shape, shared-memory plan, Params, visible keys),
// attention_splitk_warp.cuh (pipeline primitives, the tensor-core and SIMT warp steps),
// attention_splitk_qstage.cuh (the cp.async staging and dequantizing of quantized rows, a window's tiles),
// attention_splitk_rope.cuh / attention_splitk_rope_rot.cuh (the fused rope's staging: float16 / quantized K),
// attention_splitk_kernel.cuh (splitk_kernel), attention_splitk_combine.cuh
// (combine_kernel), attention_splitk_plan.cuh (host: split count, workspace, parameters, launch); this
// file includes them all.
#pragma once

#include "attention_splitk_params.cuh"
#include "attention_splitk_warp.cuh"
#include "attention_splitk_qstage.cuh"
#include "attention_splitk_kernel.cuh"
#include "attention_splitk_combine.cuh"
#include "attention_splitk_plan.cuh"
