// gated_delta_rule_fused.cu -- a Gated DeltaNet layer's core in one launch (flashd_recurrent.h, ABI 15:
// fd_gated_delta_rule_fused, fd_gated_delta_rule_fused_tree; numpy: daemon/backends/base.py
// HybridFusedDefaults.gated_delta_rule_fused, which composes the reference's primitive ops).
//
// Per token t and value head h (key head h % Hk), from the raw projections:
//     q, k   <- x / sqrt(sum(x^2) + l2_eps)                     (L2 norm of the conv's raw q and k, d_k each)
//     g      =  softplus(alpha + dt_bias[h]) * a[h]             (fd_delta_decay's float32 steps, bit for bit)
//     beta   =  sigmoid(beta_raw)                               (fd_sigmoid's steps, bit for bit)
//     M <- exp(g) M;  delta = (v - M^T k) * beta;  M <- M + k delta^T;  o = (M^T q) * scale
//     out    =  o / sqrt(mean(o^2) + norm_eps) * norm_w * silu(z)   (the gated output norm, per head of d_v)
// i.e. l2_norm(q), l2_norm(k), delta_decay, sigmoid, gated_delta_rule, rmsnorm(o) and silu(z) * that: seven
// launches of a decode step in one.
//
// Layout: a block owns one value head (grid Hv) and all its d_v <= 128 columns, so the output norm's sum over the
// head is a block reduction. TILES = ceil(d_v / 32) column tiles of 8 warps each (blockDim = TILES * 256 <= 1024);
// within a tile the state is held exactly as gated_delta_rule.cu holds it (lane = column, warp w of the tile holds
// rows i = w, w + 8, ... in registers, RPT = ceil(d_k / 8) <= 16 of them) and the column dot products are per-warp
// fmaf chains added over the tile's 8 warps in warp order: the delta rule's arithmetic is gated_delta_rule.cu's.
// Every reduction here (the two L2 sums over d_k, the norm's sum over d_v) is fd::warp_sum's fixed butterfly and
// the warps' partials added in ascending order, independent of n and of the form, so decode (n = 1), prefill (n
// tokens in order, the state on chip) and the tree (a state per node) give the same bits for the same row and
// state: a tree verify row equals the decode step at its position, and a prefilled state equals the decode steps'.
//
// Why one block per head and not gated_delta_rule.cu's block per 32 columns: the output norm needs the whole
// head. The cost: Hv blocks instead of Hv * d_v / 32 (16 on the 0.8B shape, 48 on the 27B); each reads its head's
// 64 KiB of state (d 128). Prefill keeps the token-by-token recurrent form, 5 block barriers per token.
//
// exp and log1p of the decay are computed in double and rounded once (as delta_decay.cu and gated_delta_rule.cu:
// --use_fast_math would make expf the ~2-ulp __expf); the square roots and divisions are the _rn intrinsics
// (correctly rounded, not the fast-math approximations); silu is fd::silu (fd_silu's bits).
#include "common.cuh"

#if FD_HAS_MMA
#include <cooperative_groups.h>
#endif

// Cluster form (sm_90, CUDA): the head's TILES column tiles run as TILES blocks of 256 threads, one thread-block
// cluster a head (grid Hv * TILES), so a decode step's state traffic (64 KiB a head read and written at d 128)
// spreads over 4x the SMs and a thread may hold 255 registers (the 1024-thread block has 64). Each block repeats
// the token's L2 norms, decay and sigmoid with the same arithmetic (the same warps hold the same q and k
// elements: d_k <= 128 < 256 threads), so every tile sees the same bits; the one cross-tile sum, the output
// norm's over d_v, gathers the tiles' warp sums through distributed shared memory into every block and adds
// them in tile order as the one-block form does. Every form (decode, prefill, tree) takes it where it can:
// same bits as the one-block form, which stays for HIP, pre-sm_90 devices, d_v <= 32 (one tile) and
// fd_tuning_t.delta_cluster = 0 (an A/B and test switch, read at each launch).
// Both forms are launched with programmatic dependent launch (fd::launch_pdl, or its attribute beside the cluster
// one): pdl_wait before the first read of the rows and the state, then the next kernel (the output projection's
// GEMV) may start streaming its weights under this one.
#if FD_HAS_MMA && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)
#define FD_FZ_CLUSTER_OK 1
#else
#define FD_FZ_CLUSTER_OK 0
#endif

namespace {

constexpr int FZ_WARPS = 8;                        // warps per column tile (the row split of gated_delta_rule.cu)
constexpr int FZ_COLS = FD_WARP;                   // columns per tile: one per lane
constexpr int FZ_TILE_THREADS = FZ_WARPS * FZ_COLS;
constexpr int FZ_MAX_TILES = FD_DELTA_FUSED_MAX_DV / FZ_COLS;   // 4: 1024 threads
constexpr int FZ_MAX_THREADS = FZ_MAX_TILES * FZ_TILE_THREADS;

struct FusedArgs {
    float* out;                                    // (n, Hv, d_v): the gated, normed output
    const float* q;                                // (n, Hk, d_k) raw, rows `row_stride` floats apart
    const float* k;                                // (n, Hk, d_k) raw, same row stride
    const float* v;                                // (n, Hv, d_v), same row stride
    const float* alpha;                            // (n, Hv) raw decay projection
    const float* beta;                             // (n, Hv) raw, before the sigmoid
    const float* z;                                // (n, Hv, d_v) the output gate, before the silu
    const float* dt_bias;                          // (Hv,)
    const float* a;                                // (Hv,) = -exp(A_log)
    const float* norm_w;                           // (d_v,) the output norm's weight
    float* state;                                  // (Hv, d_k, d_v): updated (sequential) / read only (tree)
    const int32_t* parents;                        // (n,) tree only
    float* node_state;                             // (>= n, Hv, d_k, d_v) tree only
    int64_t row_stride;                            // floats between token rows of q, k, v (a split's views)
    int n, n_k_heads, n_v_heads, d_k, d_v;
    float scale, l2_eps, norm_eps;
};

// One token's inputs for this thread: raw q, k elements (threads < d_k), the lane's v and z columns, alpha, beta.
struct FusedIn {
    float q, k, v, z, alpha, beta;
};

__device__ __forceinline__ FusedIn load_fused(const FusedArgs& a, int t, int h, int j) {
    const int tid = (int)threadIdx.x;
    FusedIn in{0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const size_t row = (size_t)t * a.row_stride;
    if (tid < a.d_k) {
        const size_t qk = row + (size_t)(h % a.n_k_heads) * a.d_k + tid;
        in.q = a.q[qk];
        in.k = a.k[qk];
    }
    if (j < a.d_v) {
        in.v = a.v[row + (size_t)h * a.d_v + j];
        in.z = a.z[((size_t)t * a.n_v_heads + h) * a.d_v + j];
    }
    in.alpha = a.alpha[(size_t)t * a.n_v_heads + h];
    in.beta = a.beta[(size_t)t * a.n_v_heads + h];
    return in;
}

// delta_decay.cu's float32 steps: exp(softplus(alpha + dt_bias) * a), exp and log1p in double, rounded once.
__device__ __forceinline__ float fused_decay(float alpha, float dt_bias, float a) {
    const float z = __fadd_rn(alpha, dt_bias);
    float sp = z;
    if (!(z > 20.0f)) sp = (float)log1p((double)(float)exp((double)z));
    return (float)exp((double)__fmul_rn(sp, a));
}

// elementwise.cu's sigmoid_ref: 0.5 (1 + tanh(0.5 x)) as numpy evaluates it in float32.
__device__ __forceinline__ float fused_sigmoid(float x) {
    const float t = (float)tanh((double)__fmul_rn(0.5f, x));
    return __fmul_rn(0.5f, __fadd_rn(1.0f, t));
}

template <int RPT>
__device__ __forceinline__ void rows_in(float (&m)[RPT], const float* base, int d_k, int d_v, int j, int w,
                                        bool poison) {
#pragma unroll
    for (int p = 0; p < RPT; ++p) {
        const int i = w + FZ_WARPS * p;
        m[p] = (i < d_k && j < d_v) ? (poison ? NAN : base[(size_t)i * d_v + j]) : 0.0f;
    }
}

template <int RPT>
__device__ __forceinline__ void rows_out(const float (&m)[RPT], float* base, int d_k, int d_v, int j, int w) {
#pragma unroll
    for (int p = 0; p < RPT; ++p) {
        const int i = w + FZ_WARPS * p;
        if (i < d_k && j < d_v) base[(size_t)i * d_v + j] = m[p];
    }
}

// The sum over the tile's 8 warps of each lane's partial, in warp order (gated_delta_rule.cu's warps_sum).
// part: this tile's [warp][lane] slots. The cluster form's two sums of a token use two buffers, so one barrier
// each suffices (a buffer is rewritten only after the other sum's barrier, which every reader of it has
// passed); the one-block form keeps one buffer and a barrier between the sums (fewer registers).
__device__ __forceinline__ float tile_sum(float partial, float (*part)[FZ_COLS], int w, int lane) {
    part[w][lane] = partial;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int x = 0; x < FZ_WARPS; ++x) total += part[x][lane];
    return total;
}

// One-block form: grid (Hv), TILES * 256 threads. CLUSTER: grid (Hv * TILES), 256 threads, clusters of TILES
// blocks (block b: head b / TILES, tile b % TILES = its rank). TREE: a.parents / a.node_state; else a.state
// updated in place.
template <int RPT, bool TREE, bool CLUSTER>
__global__ void __launch_bounds__(CLUSTER ? FZ_TILE_THREADS : FZ_MAX_THREADS)
gated_delta_rule_fused_kernel(FusedArgs a) {
    constexpr int BLOCK_TILES = CLUSTER ? 1 : FZ_MAX_TILES;    // column tiles held by this block
    __shared__ float sk[FD_DELTA_FUSED_MAX_DK], sq[FD_DELTA_FUSED_MAX_DK];
    __shared__ float red_q[FD_DELTA_FUSED_MAX_DK / FD_WARP], red_k[FD_DELTA_FUSED_MAX_DK / FD_WARP];
    __shared__ float red_o[2][FZ_MAX_TILES];       // [token parity][tile]: the cluster's writes alternate
    __shared__ float sgb[2];                       // exp(g), beta of the current token
    __shared__ float part[CLUSTER ? 2 : 1][BLOCK_TILES][FZ_WARPS][FZ_COLS];
    const int tid = (int)threadIdx.x, lane = tid % FD_WARP, warp = tid / FD_WARP, w = warp % FZ_WARPS;
    const int n_tiles = CLUSTER ? (a.d_v + FZ_COLS - 1) / FZ_COLS : (int)blockDim.x / FZ_TILE_THREADS;
    const int qk_warps = (a.d_k + FD_WARP - 1) / FD_WARP;
    const int h = CLUSTER ? (int)blockIdx.x / n_tiles : (int)blockIdx.x;
    const int tile = CLUSTER ? (int)blockIdx.x % n_tiles : warp / FZ_WARPS, j = tile * FZ_COLS + lane;
    const int bt = CLUSTER ? 0 : tile;             // this warp's tile among the block's
    // cluster form: the decay and the sigmoid (double-precision chains) on two threads of warps 6 and 7, which
    // hold no q or k element (d_k <= 128: warps 0-3), so they run beside the L2 sums rather than after them
    // (the one-block form keeps both on thread 0: its 64-register build spills more otherwise)
    const int decay_tid = CLUSTER ? FZ_TILE_THREADS - 2 * FD_WARP : 0;
    const int sigmoid_tid = CLUSTER ? FZ_TILE_THREADS - FD_WARP : 0;
    const size_t head_elems = (size_t)a.d_k * a.d_v, head_off = (size_t)h * head_elems;
    const size_t node_elems = (size_t)a.n_v_heads * head_elems;
    const float norm_w = j < a.d_v ? a.norm_w[j] : 0.0f;
    const float dt_bias = a.dt_bias[h], a_h = a.a[h];
    // The state's loads are issued before pdl_wait: its last writer is this layer's kernel of an earlier step or
    // chunk (or a copy stream-ordered before the step), never the kernel just before this one, and every kernel of
    // the library triggers its dependents only after its own pdl_wait, so that writer has completed (common.cuh).
    // 64 KiB a head from DRAM, in flight while the previous kernel finishes.
    float m[RPT];
    rows_in(m, a.state + head_off, a.d_k, a.d_v, j, w, false);
    fd::pdl_wait();                                // the rows are the previous kernels' (weights above)
    fd::pdl_launch_dependents();                   // the next kernel (a GEMV) may start streaming its weights
    FusedIn next = load_fused(a, 0, h, j);
    for (int t = 0; t < a.n; ++t) {
        if (TREE) {
            const int parent = a.parents[t];
            if (parent != t - 1) {                 // not a chain step: start from the parent's memory
                const bool valid = parent >= -1 && parent < t;
                const float* src = parent < 0 ? a.state : a.node_state + (size_t)parent * node_elems;
                rows_in(m, src + head_off, a.d_k, a.d_v, j, w, !valid);
            }
        }
        const FusedIn cur = next;
        __syncthreads();                           // the previous token's reads of shared memory are done
        if (warp < qk_warps) {                     // the L2 sums: threads >= d_k hold 0
            const float sq_sum = fd::warp_sum(cur.q * cur.q), sk_sum = fd::warp_sum(cur.k * cur.k);
            if (lane == 0) {
                red_q[warp] = sq_sum;
                red_k[warp] = sk_sum;
            }
        }
        if (tid == decay_tid) sgb[0] = fused_decay(cur.alpha, dt_bias, a_h);
        if (tid == sigmoid_tid) sgb[1] = fused_sigmoid(cur.beta);
        if (t + 1 < a.n) next = load_fused(a, t + 1, h, j);   // in flight while this token computes
        __syncthreads();
        if (tid < a.d_k) {
            float ssq = 0.0f, ssk = 0.0f;
            for (int x = 0; x < qk_warps; ++x) {
                ssq += red_q[x];
                ssk += red_k[x];
            }
            sq[tid] = __fdiv_rn(cur.q, __fsqrt_rn(__fadd_rn(ssq, a.l2_eps)));
            sk[tid] = __fdiv_rn(cur.k, __fsqrt_rn(__fadd_rn(ssk, a.l2_eps)));
        }
        __syncthreads();
        // the delta rule step (gated_delta_rule.cu's token_step, per tile)
        const float decay = sgb[0], beta = sgb[1];
        float kv = 0.0f;
#pragma unroll
        for (int p = 0; p < RPT; ++p) {
            const int i = w + FZ_WARPS * p;
            if (i < a.d_k) {
                m[p] *= decay;
                kv = fmaf(m[p], sk[i], kv);
            }
        }
        const float delta = (cur.v - tile_sum(kv, part[0][bt], w, lane)) * beta;
        float oq = 0.0f;
#pragma unroll
        for (int p = 0; p < RPT; ++p) {
            const int i = w + FZ_WARPS * p;
            if (i < a.d_k) {
                m[p] = fmaf(sk[i], delta, m[p]);
                oq = fmaf(m[p], sq[i], oq);
            }
        }
        if (!CLUSTER) __syncthreads();             // one buffer: every lane has read part (M^T k)
        const float o = tile_sum(oq, part[CLUSTER ? 1 : 0][bt], w, lane) * a.scale;
        // the gated output norm over the head's d_v columns: tiles' sums in tile order
        float* const red = red_o[CLUSTER ? t & 1 : 0];  // one block: the loop's first barrier guards red_o
        if (w == 0) {
            const float oo = fd::warp_sum(j < a.d_v ? o * o : 0.0f);   // the same bits in every lane
            if (!CLUSTER && lane == 0) red[tile] = oo;
#if FD_FZ_CLUSTER_OK
            // lane r stores the tile's sum into block r's red[tile]. Token t + 1 writes the other parity; token
            // t + 2 writes this one again only after token t + 1's cluster barrier, which every block reaches
            // after reading token t's sums.
            if (CLUSTER && lane < n_tiles) cooperative_groups::this_cluster().map_shared_rank(red, lane)[tile] = oo;
#endif
        }
        if constexpr (CLUSTER) {
#if FD_FZ_CLUSTER_OK
            cooperative_groups::this_cluster().sync();   // every tile's sum stored and visible (release / acquire)
#elif FD_HAS_MMA
            __trap();                              // the launcher runs the cluster form only on sm_90 binaries
#endif
        } else {
            __syncthreads();
        }
        if (w == 0 && j < a.d_v) {
            float ss = 0.0f;
            for (int x = 0; x < n_tiles; ++x) ss += red[x];
            const float rms = __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)a.d_v), a.norm_eps));
            const float y = __fmul_rn(__fdiv_rn(o, rms), norm_w);
            a.out[((size_t)t * a.n_v_heads + h) * a.d_v + j] = __fmul_rn(fd::silu(cur.z), y);
        }
        if (TREE) rows_out(m, a.node_state + (size_t)t * node_elems + head_off, a.d_k, a.d_v, j, w);
    }
    if (!TREE) rows_out(m, a.state + head_off, a.d_k, a.d_v, j, w);
}

template <int RPT, bool TREE>
int launch_block(const FusedArgs& a, cudaStream_t s) {
    const int threads = fd::ceil_div(a.d_v, FZ_COLS) * FZ_TILE_THREADS;
    return fd::launch_pdl(gated_delta_rule_fused_kernel<RPT, TREE, false>, dim3(a.n_v_heads), dim3(threads), 0, s,
                          a);
}

// Whether the cluster form can run: this build compiled it for sm_90 or later and the device is sm_90 or later.
template <int RPT, bool TREE>
bool cluster_available() {
#if FD_HAS_MMA
    static const int binary_version = [] {                 // fixed per build: the target the kernel compiled for
        cudaFuncAttributes attrs;
        const bool ok = cudaFuncGetAttributes(&attrs, gated_delta_rule_fused_kernel<RPT, TREE, true>) == cudaSuccess;
        (void)cudaGetLastError();                         // a failed query leaves no error for a later launch
        return ok ? attrs.binaryVersion : 0;
    }();
    int device = 0, major = 0;
    return binary_version >= 90 && cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
#else
    return false;
#endif
}

// The cluster form (cluster_available() true): grid Hv * TILES in clusters of TILES blocks of 256 threads.
template <int RPT, bool TREE>
int launch_cluster(const FusedArgs& a, cudaStream_t s) {
#if FD_HAS_MMA
    const int n_tiles = fd::ceil_div(a.d_v, FZ_COLS);
    const cudaError_t err =                               // cluster of n_tiles <= 4: a portable cluster size
        fd::launch_cluster(gated_delta_rule_fused_kernel<RPT, TREE, true>, dim3((unsigned)(a.n_v_heads * n_tiles)),
                           dim3(FZ_TILE_THREADS), 0, s, dim3(n_tiles), fd::pdl_enabled(), a);
    return err != cudaSuccess ? (int)err : FD_LAUNCH_STATUS();
#else
    (void)a, (void)s;
    return FD_E_UNSUPPORTED;                              // not reached: cluster_available() is false
#endif
}

template <int RPT, bool TREE>
int launch_rpt(const FusedArgs& a, cudaStream_t s) {
    if (a.d_v > FZ_COLS && fd::tuning_now().delta_cluster != 0 && cluster_available<RPT, TREE>())
        return launch_cluster<RPT, TREE>(a, s);
    return launch_block<RPT, TREE>(a, s);
}

template <bool TREE>
int launch_fused(const FusedArgs& a, cudaStream_t s) {
    const int rows = fd::ceil_div(a.d_k, FZ_WARPS);        // registers of state per thread
    if (rows <= 2) return launch_rpt<2, TREE>(a, s);
    if (rows <= 4) return launch_rpt<4, TREE>(a, s);
    if (rows <= 8) return launch_rpt<8, TREE>(a, s);
    return launch_rpt<16, TREE>(a, s);
}

// FD_E_ARG for a null pointer, a non-positive size, Hv not a multiple of Hk, a row stride shorter than the
// q | k | v row, or a bad scale / eps; FD_E_SHAPE for d_k over FD_DELTA_FUSED_MAX_DK or d_v over
// FD_DELTA_FUSED_MAX_DV (the caller composes the primitive ops instead).
int check_fused(const FusedArgs& a) {
    if (!(a.out && a.q && a.k && a.v && a.alpha && a.beta && a.z && a.dt_bias && a.a && a.norm_w && a.state))
        return FD_E_ARG;
    if (a.n < 0 || a.n_k_heads <= 0 || a.n_v_heads <= 0 || a.n_v_heads % a.n_k_heads || a.d_k <= 0 || a.d_v <= 0)
        return FD_E_ARG;
    if (a.row_stride < (int64_t)a.n_k_heads * a.d_k || a.row_stride < (int64_t)a.n_v_heads * a.d_v) return FD_E_ARG;
    if (!(a.scale > 0.0f) || !isfinite(a.scale) || !(a.l2_eps >= 0.0f) || !(a.norm_eps >= 0.0f)) return FD_E_ARG;
    if (a.d_k > FD_DELTA_FUSED_MAX_DK || a.d_v > FD_DELTA_FUSED_MAX_DV) return FD_E_SHAPE;
    return 0;
}

}  // namespace

extern "C" int fd_gated_delta_rule_fused(float* out, const float* q, const float* k, const float* v,
                                         int64_t row_stride, const float* alpha, const float* beta, const float* z,
                                         const float* dt_bias, const float* a, const float* norm_w, float* state,
                                         int n_tokens, int n_k_heads, int n_v_heads, int d_k, int d_v, float scale,
                                         float l2_eps, float norm_eps, void* stream) {
    const FusedArgs args{out, q, k, v, alpha, beta, z, dt_bias, a, norm_w, state, nullptr, nullptr, row_stride,
                         n_tokens, n_k_heads, n_v_heads, d_k, d_v, scale, l2_eps, norm_eps};
    if (int st = check_fused(args)) return st;
    if (args.n == 0) return 0;
    return launch_fused<false>(args, (cudaStream_t)stream);
}

extern "C" int fd_gated_delta_rule_fused_tree(float* out, const float* q, const float* k, const float* v,
                                              int64_t row_stride, const float* alpha, const float* beta,
                                              const float* z, const float* dt_bias, const float* a,
                                              const float* norm_w, const float* state, const int32_t* parents,
                                              float* node_state, int n_nodes, int n_k_heads, int n_v_heads, int d_k,
                                              int d_v, float scale, float l2_eps, float norm_eps, void* stream) {
    const FusedArgs args{out, q, k, v, alpha, beta, z, dt_bias, a, norm_w, const_cast<float*>(state), parents,
                         node_state, row_stride, n_nodes, n_k_heads, n_v_heads, d_k, d_v, scale, l2_eps,
                         norm_eps};                // the tree kernel never writes args.state
    if (int st = check_fused(args)) return st;
    FD_CHECK_ARG(parents && node_state);
    if (args.n == 0) return 0;
    return launch_fused<true>(args, (cudaStream_t)stream);
}
