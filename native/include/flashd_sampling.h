/* flashd_sampling.h -- token selection: argmax, sampling, the decode loop's bookkeeping.
   Part of the C ABI: include flashd.h (its conventions hold here), not this file. */
#ifndef FLASHD_SAMPLING_H
#define FLASHD_SAMPLING_H
#ifndef FLASHD_H
#error "include flashd.h, which includes this header"
#endif
/* --- cdef begin --- */

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

/* Per-row top-K with log-probabilities (topk.cu; the DFlash drafter's per-depth candidates):
   x = logits[r] / temperature in double, lp = x - max(x) - log(sum(exp(x - max(x)))); ids[r, 0..k)
   the k largest logits, the lower id first among equal ones, logprobs[r, j] = lp[ids[r, j]]
   (daemon/speculative/dflash_topk.py: the same ids, log-probs to ~1e-15). ids (n_rows, k) int32,
   logprobs (n_rows, k) double; NaN logits are never picked (ids -1, logprobs -inf pad a short row).
   1 <= k <= n_vocab, temperature > 0. No workspace. */
int fd_topk_logprobs(int32_t* ids, double* logprobs, const float* logits, int n_rows, int n_vocab, int k,
                     double temperature, void* stream);

/* The DDTree on the device (ddtree.cu; daemon/speculative/tree.py build_tree is the definition): from the
   per-depth candidates ids / logprobs (n_depth, k) (fd_topk_logprobs' output; each row is sorted by log-prob,
   stable, NaN last, first), the best-first tree of at most `budget` drafted nodes (chain_seed 1: the top-1
   chain first), the same nodes in the same order as build_tree. Writes the verify forward's inputs for
   n_nodes = budget + 1 rows into tree_inputs (daemon/backends/cuda/tree_inputs.py's block for trees of up to
   n_tree nodes: ids, positions n_past + depth, n_past, the n_nodes x n_nodes ancestor mask; node 0 = root;
   rows past the built tree are padding: token root, position n_past, masked to themselves) and the walk's
   block walk (1 + 4 n_tree int32): [n_built | tokens | parents (root: -1) | depths | ranks], each n_tree
   long; scores (n_tree doubles: cumulative log-probs) may be NULL. root and n_past are plain arguments (the
   launch is per step, outside graphs). 0 <= n_depth <= 16, 1 <= k <= 16, n_nodes <= n_tree <= 256. */
int fd_ddtree_build(int32_t* tree_inputs, int32_t* walk, double* scores, const int32_t* ids, const double* logprobs,
                    int n_depth, int k, int budget, int chain_seed, int root, int n_past, int n_tree, int n_nodes,
                    void* stream);

/* --- cdef end --- */
#endif /* FLASHD_SAMPLING_H */
