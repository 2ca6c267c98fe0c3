// ddtree.cu -- fd_ddtree_build: the DDTree built on the device from the drafter's per-depth top-K
// (flashd_sampling.h), so a speculative step need not read the candidates back, build the tree on the
// host and upload it before the verify forward can start. daemon/speculative/tree.py build_tree is the
// definition; this kernel gives the same nodes in the same order (tests/gpu/test_ddtree_build_gpu.py
// compares every field, scores bit for bit, on random proposals).
//
// Inputs: ids / logprobs (n_depth, k), row d = depth d + 1's candidates. Each row is first sorted by
// log-prob, descending and stable (NaN last, as numpy's argsort of -lp puts it), which leaves the rows of
// fd_topk_logprobs as they are. A node at depth d takes the candidate of rank r there; its score is its
// parent's plus lp[d - 1][r] (double, in path order: the host's Python float sums). Nodes are inserted
// best-first under key = (-score, depth, rank path); the path is packed 4 bits a depth, depth 1 in the top
// nibble, so equal-depth paths compare as integers (k <= 16, n_depth <= 16). A chain seed inserts the
// top-1 chain first. Candidates whose log-prob is not finite are never inserted.
//
// One warp, one CTA: lane 0 inserts, the warp finds the frontier's best entry (each lane its strided
// entries, then a shuffle reduction), so a pop is a few shuffles rather than a heap walk on one thread.
//
// Outputs, for a verify forward of n_nodes rows (1 + budget, budget >= the nodes the build inserts):
//   tree_inputs  the verify's int32 block (daemon/backends/cuda/tree_inputs.py): ids (n_tree) | positions
//                (n_tree) | n_past (1) | mask bytes (n_nodes x n_nodes, row-major); node 0 is `root`.
//                Rows past the built tree (the frontier ran dry) are padding: token root, position n_past,
//                their mask row only themselves, so they change no built node's logits.
//   walk         int32 (1 + 4 n_tree): [n_built | tokens (n_tree) | parents (n_tree) | depths (n_tree) |
//                ranks (n_tree)], n_built = 1 + the inserted nodes; the root's parent is -1.
//   scores       double (n_tree) or NULL: each node's cumulative log-prob (0 for the root).
#include "common.cuh"

namespace {

constexpr int DT_MAX_DEPTH = 16;      // 4-bit ranks x 16 depths = 64 path bits
constexpr int DT_MAX_K = 16;
constexpr int DT_MAX_NODES = 256;     // root included
constexpr int DT_MAX_FRONTIER = DT_MAX_NODES + DT_MAX_DEPTH + 1;   // the seed's pushes, then +1 a pop at most

struct DtEntry {                      // a frontier candidate: the node (parent, depth, rank) would be
    double score;
    unsigned long long path;
    int parent, depth, rank;
};

// a sorts before b in build_tree's stable argsort of -lp (NaN last)
__device__ __forceinline__ bool dt_lp_before(double a, double b) {
    if (isnan(a)) return false;
    if (isnan(b)) return true;
    return -a < -b;
}

// (score, depth, path) pops before (s2, d2, p2): key (-score, depth, path) smaller
__device__ __forceinline__ bool dt_key_before(double s, int d, unsigned long long p, double s2, int d2,
                                              unsigned long long p2) {
    if (-s != -s2) return -s < -s2;
    if (d != d2) return d < d2;
    return p < p2;
}

__device__ __forceinline__ unsigned long long dt_path_with(unsigned long long path, int depth, int rank) {
    return path | ((unsigned long long)rank << (4 * (DT_MAX_DEPTH - depth)));
}

__global__ void __launch_bounds__(FD_WARP) ddtree_build_kernel(
        int32_t* tree_inputs, int32_t* walk, double* scores_out, const int32_t* ids, const double* logprobs,
        int n_depth, int k, int budget, int chain_seed, int root, int n_past, int n_tree, int n_nodes) {
    __shared__ int s_tok[DT_MAX_DEPTH * DT_MAX_K];
    __shared__ double s_lp[DT_MAX_DEPTH * DT_MAX_K];
    __shared__ int n_tok[DT_MAX_NODES], n_parent[DT_MAX_NODES], n_depth_of[DT_MAX_NODES], n_rank[DT_MAX_NODES];
    __shared__ double n_score[DT_MAX_NODES];
    __shared__ unsigned long long n_path[DT_MAX_NODES];
    __shared__ DtEntry frontier[DT_MAX_FRONTIER];
    __shared__ int s_n, s_front;
    const int lane = threadIdx.x;

    // each depth's row, sorted by log-prob (stable insertion sort, one lane a row)
    for (int d = lane; d < n_depth; d += FD_WARP) {
        int* t = s_tok + d * k;
        double* l = s_lp + d * k;
        for (int j = 0; j < k; ++j) {
            const int tj = ids[d * k + j];
            const double lj = logprobs[d * k + j];
            int i = j;
            for (; i > 0 && dt_lp_before(lj, l[i - 1]); --i) {
                t[i] = t[i - 1];
                l[i] = l[i - 1];
            }
            t[i] = tj;
            l[i] = lj;
        }
    }
    if (lane == 0) {
        n_tok[0] = root; n_parent[0] = -1; n_depth_of[0] = 0; n_rank[0] = 0; n_score[0] = 0.0; n_path[0] = 0ull;
        s_n = 1;
        s_front = 0;
    }
    __syncwarp();

    if (lane == 0) {
        // push(parent, depth, rank): the candidate if it exists and its log-prob is finite
        auto push = [&](int parent, int depth, int rank) {
            if (depth > n_depth || rank >= k) return;
            const double lp = s_lp[(depth - 1) * k + rank];
            if (!isfinite(lp)) return;
            DtEntry& e = frontier[s_front++];
            e.score = n_score[parent] + lp;
            e.path = dt_path_with(n_path[parent], depth, rank);
            e.parent = parent; e.depth = depth; e.rank = rank;
        };
        auto insert = [&](int parent, int depth, int rank) {
            const int i = s_n++;
            n_tok[i] = s_tok[(depth - 1) * k + rank];
            n_parent[i] = parent; n_depth_of[i] = depth; n_rank[i] = rank;
            n_score[i] = n_score[parent] + s_lp[(depth - 1) * k + rank];
            n_path[i] = dt_path_with(n_path[parent], depth, rank);
            return i;
        };
        if (chain_seed) {
            int tip = 0;
            for (int d = 1; d <= n_depth; ++d) {
                if (s_n - 1 >= budget || !isfinite(s_lp[(d - 1) * k])) break;
                tip = insert(tip, d, 0);
            }
            for (int i = 1; i <= tip; ++i) push(i - 1, i, 1);     // the spine is nodes 0..tip: siblings
            push(tip, tip + 1, 0);                                 // the tip's first child
        } else {
            push(0, 1, 0);
        }
    }
    __syncwarp();

    // best-first: the warp finds the best frontier entry, lane 0 inserts it and pushes its successors
    while (s_front > 0 && s_n - 1 < budget) {
        int best = -1;
        double bs = 0.0;
        int bd = 0;
        unsigned long long bp = 0ull;
        for (int i = lane; i < s_front; i += FD_WARP) {
            const DtEntry& e = frontier[i];
            if (best < 0 || dt_key_before(e.score, e.depth, e.path, bs, bd, bp)) {
                best = i; bs = e.score; bd = e.depth; bp = e.path;
            }
        }
        for (int o = FD_WARP / 2; o > 0; o >>= 1) {
            const int ob = __shfl_xor_sync(0xffffffffu, best, o);
            const double os = __shfl_xor_sync(0xffffffffu, bs, o);
            const int od = __shfl_xor_sync(0xffffffffu, bd, o);
            const unsigned long long op = __shfl_xor_sync(0xffffffffu, bp, o);
            if (ob >= 0 && (best < 0 || dt_key_before(os, od, op, bs, bd, bp))) {
                best = ob; bs = os; bd = od; bp = op;
            }
        }
        if (lane == 0) {
            const DtEntry e = frontier[best];
            frontier[best] = frontier[--s_front];                  // the frontier is a set: order is free
            const int i = s_n++;
            n_tok[i] = s_tok[(e.depth - 1) * k + e.rank];
            n_parent[i] = e.parent; n_depth_of[i] = e.depth; n_rank[i] = e.rank;
            n_score[i] = e.score; n_path[i] = e.path;
            // next sibling, then first child (pushed as build_tree pushes them; the order does not matter)
            if (e.rank + 1 < k && isfinite(s_lp[(e.depth - 1) * k + e.rank + 1])) {
                DtEntry& s = frontier[s_front++];
                s.score = n_score[e.parent] + s_lp[(e.depth - 1) * k + e.rank + 1];
                s.path = dt_path_with(n_path[e.parent], e.depth, e.rank + 1);
                s.parent = e.parent; s.depth = e.depth; s.rank = e.rank + 1;
            }
            if (e.depth + 1 <= n_depth && isfinite(s_lp[e.depth * k])) {
                DtEntry& c = frontier[s_front++];
                c.score = e.score + s_lp[e.depth * k];
                c.path = dt_path_with(e.path, e.depth + 1, 0);
                c.parent = i; c.depth = e.depth + 1; c.rank = 0;
            }
        }
        __syncwarp();
    }

    // the verify's inputs and the walk's block; rows [n_built, n_nodes) are padding (see the header)
    const int n_built = s_n;
    int32_t* ids_out = tree_inputs;
    int32_t* pos_out = tree_inputs + n_tree;
    unsigned char* mask = reinterpret_cast<unsigned char*>(tree_inputs + 2 * n_tree + 1);
    if (lane == 0) {
        tree_inputs[2 * n_tree] = n_past;
        walk[0] = n_built;
    }
    for (int i = lane; i < n_nodes; i += FD_WARP) {
        const bool built = i < n_built;
        ids_out[i] = built ? n_tok[i] : root;
        pos_out[i] = n_past + (built ? n_depth_of[i] : 0);
        unsigned char* row = mask + (size_t)i * n_nodes;
        for (int j = 0; j < n_nodes; ++j) row[j] = 0;
        if (built) {
            for (int a = i; a >= 0; a = n_parent[a]) row[a] = 1;
        } else {
            row[i] = 1;
        }
    }
    for (int i = lane; i < n_built; i += FD_WARP) {
        walk[1 + i] = n_tok[i];
        walk[1 + n_tree + i] = n_parent[i];
        walk[1 + 2 * n_tree + i] = n_depth_of[i];
        walk[1 + 3 * n_tree + i] = n_rank[i];
        if (scores_out) scores_out[i] = n_score[i];
    }
}

}  // namespace

extern "C" {

int fd_ddtree_build(int32_t* tree_inputs, int32_t* walk, double* scores, const int32_t* ids, const double* logprobs,
                    int n_depth, int k, int budget, int chain_seed, int root, int n_past, int n_tree, int n_nodes,
                    void* stream) {
    FD_CHECK_ARG(tree_inputs && walk && (ids || n_depth == 0) && (logprobs || n_depth == 0));
    FD_CHECK_ARG(n_depth >= 0 && n_depth <= DT_MAX_DEPTH && k >= 1 && k <= DT_MAX_K);
    FD_CHECK_ARG(budget >= 0 && n_nodes == budget + 1 && n_nodes <= n_tree && n_tree <= DT_MAX_NODES);
    FD_CHECK_ARG(n_past >= 0 && (chain_seed == 0 || chain_seed == 1));
    ddtree_build_kernel<<<1, FD_WARP, 0, (cudaStream_t)stream>>>(tree_inputs, walk, scores, ids, logprobs, n_depth,
                                                                 k, budget, chain_seed, root, n_past, n_tree, n_nodes);
    return FD_LAUNCH_STATUS();
}

}  // extern "C"
