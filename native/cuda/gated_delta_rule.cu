// gated_delta_rule.cu -- the gated delta rule of a Gated DeltaNet layer (flashd_recurrent.h:
// fd_gated_delta_rule_decode, _prefill, _tree; numpy: daemon/backends/reference_recurrent.py
// delta_rule_recurrent and reference_recurrent_tree.py delta_rule_tree).
//
// Per value head h with memory M (d_k x d_v, [key i][value j]) and key head h % Hk, for each token:
//     M <- exp(g) M;  delta = (v - M^T k) * beta;  M <- M + k delta^T;  o = (M^T q) * scale
// Column j of M is independent of every other column: its decay, its delta_j = (v_j - M[:, j] . k) beta and
// its update need only that column and the token's k. So a block owns one value head and a tile of 32 columns
// (lane = column, coalesced 128-byte rows of the state), and its 8 warps split the d_k rows: warp w holds rows
// i = w, w + 8, w + 16, ... of its lane's column in registers (RPT = ceil(d_k / 8) of them, <= 32), for the
// whole call. The two column dot products (M^T k, M^T q) are per-warp partial sums (fmaf over the warp's rows
// in ascending i) added over the 8 warps in warp order through shared memory: a fixed reduction order, the
// same in every launch, so decode, prefill and tree give the same bits for the same token and state.
//
// Prefill (form chosen for a first version): the tokens run one after another in the same block with M on
// chip, instead of the chunked form (reference_recurrent.py delta_rule_chunked). Reasons: it is the recurrent
// form itself, so a prefilled state is bit for bit the decode steps' (no second rounding behaviour to keep
// apart for prefix reuse, ARCHITECTURE.md), it needs no workspace and no triangular solve, and it reads the
// state once per call rather than once per token; it costs 4 block barriers per token and leaves the SMs
// underused for small Hv x d_v (Hv * d_v / 32 blocks), which a chunked tensor-core form would fix later
// (bench/NOTES.md). The next token's q, k, v, g, beta are loaded into registers while the current one is
// computed, so global latency is off the per-token critical path.
//
// Tree: the same loop over nodes in order; before node i the block's registers hold node i - 1's memory, which
// is node i's start when parents[i] == i - 1 (a chain), else it reloads its parent's (node_state[parent], or
// the committed state for -1: read only). Every thread reads back only elements it wrote itself, so no
// barrier is needed between writing node_state[p] and reading it. Each node's memory is stored to
// node_state[i].
//
// The decay exp(g) is computed once per token in double and rounded to float (numpy's float32 exp is within an
// ulp of that; --use_fast_math would make expf the ~2-ulp __expf); everything else is float32.
#include "common.cuh"

namespace {

constexpr int DR_WARPS = 8;
constexpr int DR_COLS = FD_WARP;                   // value columns per block: one per lane
constexpr int DR_THREADS = DR_WARPS * DR_COLS;     // 256 >= FD_DELTA_MAX_DK: one thread stages each q/k element

struct DeltaArgs {
    float* out;                                    // (n, Hv, d_v)
    const float* q;                                // (n, Hk, d_k)
    const float* k;                                // (n, Hk, d_k)
    const float* v;                                // (n, Hv, d_v)
    const float* g;                                // (n, Hv) log decay
    const float* beta;                             // (n, Hv)
    float* state;                                  // (Hv, d_k, d_v): updated (sequential) / read only (tree)
    const int32_t* parents;                        // (n,) tree only
    float* node_state;                             // (>= n, Hv, d_k, d_v) tree only
    int n, n_k_heads, n_v_heads, d_k, d_v;
    float scale;
};

// One token's inputs for this block: a q and k element (threads < d_k), the lane's v column, g and beta.
struct TokenIn {
    float q, k, v, g, beta;
};

__device__ __forceinline__ TokenIn load_token(const DeltaArgs& a, int t, int h, int j) {
    const int tid = (int)threadIdx.x;
    const int hk = h % a.n_k_heads;
    TokenIn in{0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (tid < a.d_k) {
        const size_t qk = ((size_t)t * a.n_k_heads + hk) * a.d_k + tid;
        in.q = a.q[qk];
        in.k = a.k[qk];
    }
    if (j < a.d_v) in.v = a.v[((size_t)t * a.n_v_heads + h) * a.d_v + j];
    in.g = a.g[(size_t)t * a.n_v_heads + h];
    in.beta = a.beta[(size_t)t * a.n_v_heads + h];
    return in;
}

// The lane's column rows i = warp + DR_WARPS * p of head h's d_k x d_v memory at `base`, into / out of registers.
template <int RPT>
__device__ __forceinline__ void load_rows(float (&m)[RPT], const float* base, int d_k, int d_v, int j, bool poison) {
    const int warp = (int)threadIdx.x / FD_WARP;
#pragma unroll
    for (int p = 0; p < RPT; ++p) {
        const int i = warp + DR_WARPS * p;
        m[p] = (i < d_k && j < d_v) ? (poison ? NAN : base[(size_t)i * d_v + j]) : 0.0f;
    }
}

template <int RPT>
__device__ __forceinline__ void store_rows(const float (&m)[RPT], float* base, int d_k, int d_v, int j) {
    const int warp = (int)threadIdx.x / FD_WARP;
#pragma unroll
    for (int p = 0; p < RPT; ++p) {
        const int i = warp + DR_WARPS * p;
        if (i < d_k && j < d_v) base[(size_t)i * d_v + j] = m[p];
    }
}

// The sum over the 8 warps of each lane's partial, in warp order (every thread gets its lane's total).
__device__ __forceinline__ float warps_sum(float partial, float (*part)[DR_COLS]) {
    const int lane = (int)threadIdx.x % FD_WARP, warp = (int)threadIdx.x / FD_WARP;
    part[warp][lane] = partial;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < DR_WARPS; ++w) total += part[w][lane];
    return total;
}

// One token on the registers m (the lane's column, the warp's rows): the decode step's arithmetic.
// sk / sq: the token's k and q in shared memory. Returns the lane's (M^T q)_j, unscaled; every warp gets it.
template <int RPT>
__device__ __forceinline__ float token_step(float (&m)[RPT], const float* sk, const float* sq, float decay, float beta,
                                            float v, int d_k, float (*part)[DR_COLS]) {
    const int warp = (int)threadIdx.x / FD_WARP;
    float kv = 0.0f;                               // this warp's rows of (M^T k)_j after the decay
#pragma unroll
    for (int p = 0; p < RPT; ++p) {
        const int i = warp + DR_WARPS * p;
        if (i < d_k) {
            m[p] *= decay;
            kv = fmaf(m[p], sk[i], kv);
        }
    }
    const float delta = (v - warps_sum(kv, part)) * beta;
    float o = 0.0f;
#pragma unroll
    for (int p = 0; p < RPT; ++p) {
        const int i = warp + DR_WARPS * p;
        if (i < d_k) {
            m[p] = fmaf(sk[i], delta, m[p]);
            o = fmaf(m[p], sq[i], o);
        }
    }
    __syncthreads();                               // every lane has read part (M^T k) before it is overwritten
    return warps_sum(o, part);
}

// grid (ceil(d_v / 32), Hv), DR_THREADS threads. TREE: a.parents / a.node_state; else a.state updated in place.
template <int RPT, bool TREE>
__global__ void __launch_bounds__(DR_THREADS) gated_delta_rule_kernel(DeltaArgs a) {
    __shared__ float sk[FD_DELTA_MAX_DK], sq[FD_DELTA_MAX_DK];
    __shared__ float sgb[2];                       // exp(g), beta of the current token
    __shared__ float part[DR_WARPS][DR_COLS];
    const int h = blockIdx.y, lane = (int)threadIdx.x % FD_WARP, warp = (int)threadIdx.x / FD_WARP;
    const int j = blockIdx.x * DR_COLS + lane;
    const size_t head_elems = (size_t)a.d_k * a.d_v, head_off = (size_t)h * head_elems;
    const size_t node_elems = (size_t)a.n_v_heads * head_elems;
    float m[RPT];
    load_rows(m, a.state + head_off, a.d_k, a.d_v, j, false);
    TokenIn next = load_token(a, 0, h, j);
    for (int t = 0; t < a.n; ++t) {
        if (TREE) {
            const int parent = a.parents[t];
            if (parent != t - 1) {                 // not a chain step: start from the parent's memory
                const bool valid = parent >= -1 && parent < t;
                const float* src = parent < 0 ? a.state : a.node_state + (size_t)parent * node_elems;
                load_rows(m, src + head_off, a.d_k, a.d_v, j, !valid);
            }
        }
        const TokenIn cur = next;
        __syncthreads();                           // the previous token's reads of sk, sq, sgb, part are done
        if ((int)threadIdx.x < a.d_k) {
            sk[threadIdx.x] = cur.k;
            sq[threadIdx.x] = cur.q;
        }
        if (threadIdx.x == 0) {
            sgb[0] = (float)exp((double)cur.g);   // once per token: numpy's float32 exp, not __expf's ~2 ulp
            sgb[1] = cur.beta;
        }
        if (t + 1 < a.n) next = load_token(a, t + 1, h, j);   // in flight while this token computes
        __syncthreads();
        const float o = token_step(m, sk, sq, sgb[0], sgb[1], cur.v, a.d_k, part);
        if (warp == 0 && j < a.d_v) a.out[((size_t)t * a.n_v_heads + h) * a.d_v + j] = o * a.scale;
        if (TREE) store_rows(m, a.node_state + (size_t)t * node_elems + head_off, a.d_k, a.d_v, j);
    }
    if (!TREE) store_rows(m, a.state + head_off, a.d_k, a.d_v, j);
}

template <bool TREE>
int launch(const DeltaArgs& a, cudaStream_t s) {
    const dim3 grid(fd::ceil_div(a.d_v, DR_COLS), a.n_v_heads);
    const int rows = fd::ceil_div(a.d_k, DR_WARPS);        // registers of state per thread
    if (rows <= 2) gated_delta_rule_kernel<2, TREE><<<grid, DR_THREADS, 0, s>>>(a);
    else if (rows <= 4) gated_delta_rule_kernel<4, TREE><<<grid, DR_THREADS, 0, s>>>(a);
    else if (rows <= 8) gated_delta_rule_kernel<8, TREE><<<grid, DR_THREADS, 0, s>>>(a);
    else if (rows <= 16) gated_delta_rule_kernel<16, TREE><<<grid, DR_THREADS, 0, s>>>(a);
    else gated_delta_rule_kernel<32, TREE><<<grid, DR_THREADS, 0, s>>>(a);
    return FD_LAUNCH_STATUS();
}

// FD_E_ARG for a null pointer, a non-positive size, Hv not a multiple of Hk or a bad scale; FD_E_SHAPE for a d_k
// over FD_DELTA_MAX_DK or more value heads than a grid's y dimension.
int check_delta(const DeltaArgs& a) {
    if (!(a.out && a.q && a.k && a.v && a.g && a.beta && a.state)) return FD_E_ARG;
    if (a.n < 0 || a.n_k_heads <= 0 || a.n_v_heads <= 0 || a.n_v_heads % a.n_k_heads || a.d_k <= 0 || a.d_v <= 0)
        return FD_E_ARG;
    if (!(a.scale > 0.0f) || !isfinite(a.scale)) return FD_E_ARG;
    if (a.d_k > FD_DELTA_MAX_DK || a.n_v_heads > 65535) return FD_E_SHAPE;
    return 0;
}

DeltaArgs make_args(float* out, const float* q, const float* k, const float* v, const float* g, const float* beta,
                    float* state, int n, int n_k_heads, int n_v_heads, int d_k, int d_v, float scale) {
    return DeltaArgs{out, q, k, v, g, beta, state, nullptr, nullptr, n, n_k_heads, n_v_heads, d_k, d_v, scale};
}

}  // namespace

extern "C" int fd_gated_delta_rule_prefill(float* out, const float* q, const float* k, const float* v, const float* g,
                                           const float* beta, float* state, int n_tokens, int n_k_heads,
                                           int n_v_heads, int d_k, int d_v, float scale, void* stream) {
    const DeltaArgs a = make_args(out, q, k, v, g, beta, state, n_tokens, n_k_heads, n_v_heads, d_k, d_v, scale);
    if (int st = check_delta(a)) return st;
    if (a.n == 0) return 0;
    return launch<false>(a, (cudaStream_t)stream);
}

extern "C" int fd_gated_delta_rule_decode(float* out, const float* q, const float* k, const float* v, const float* g,
                                          const float* beta, float* state, int n_k_heads, int n_v_heads, int d_k,
                                          int d_v, float scale, void* stream) {
    return fd_gated_delta_rule_prefill(out, q, k, v, g, beta, state, 1, n_k_heads, n_v_heads, d_k, d_v, scale,
                                       stream);
}

extern "C" int fd_gated_delta_rule_tree(float* out, const float* q, const float* k, const float* v, const float* g,
                                        const float* beta, const float* state, const int32_t* parents,
                                        float* node_state, int n_nodes, int n_k_heads, int n_v_heads, int d_k,
                                        int d_v, float scale, void* stream) {
    DeltaArgs a = make_args(out, q, k, v, g, beta, const_cast<float*>(state), n_nodes, n_k_heads, n_v_heads, d_k,
                            d_v, scale);               // the tree kernel never writes a.state
    if (int st = check_delta(a)) return st;
    FD_CHECK_ARG(parents && node_state);
    a.parents = parents;
    a.node_state = node_state;
    if (a.n == 0) return 0;
    return launch<true>(a, (cudaStream_t)stream);
}
