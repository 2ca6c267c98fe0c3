// causal_conv1d.cu -- the short causal convolution of a Gated DeltaNet layer with its state (flashd_recurrent.h:
// fd_causal_conv1d, fd_causal_conv1d_tree, and with the SiLU fused fd_causal_conv1d_silu, fd_causal_conv1d_silu_tree;
// numpy: daemon/backends/reference_recurrent.py causal_conv1d and reference_recurrent_tree.py causal_conv1d_tree).
//
//   u = concat(conv_state (K - 1, C), x (n, C));  y[t, c] = sum_{k=0..K-1} u[t + k, c] * weight[c, k]
//   conv_state <- u's last K - 1 rows
//
// Every output is one fmaf chain over k = 0 .. K-1 from 0 (conv_out below), whatever the launch shape, so a
// prefill's rows, a decode step and a tree node over the same window give the same bits. Channels are
// independent: a thread owns one channel (its K taps in registers) and the warp's 32 lanes read 32 consecutive
// channels of a row (128-byte coalesced). The work is tiny (K FMAs per element, memory bound: x read K times
// from L1/L2, y written once), so the shapes below only aim at enough blocks to spread over the SMs.
//
// Launch (fd_causal_conv1d): 256 threads per block; a decode step (n = 1) gives each block 256 channels, a
// prefill gives it 32 channels x 8 token slots (slot s takes tokens s, s + 8, ...). The block owns all n
// tokens of its channels, so after one __syncthreads (every read of the old state done) slot 0 writes the new
// state: row r <- u[n + r], in ascending r, which reads old-state row n + r > r before anything overwrites it
// (n < K - 1 keeps part of the old state, shifted). A decode step (SLOTS = 1, n = 1) has one thread per
// channel and its window u already in registers: the new state rows are u[1 .. K-1], stored with no barrier
// and no second read of the old state (the reads-then-writes above are one L2 round trip per row, in order,
// since conv_state may alias itself); the same values, so the same bits.
//
// Every form is launched with programmatic dependent launch (fd::launch_pdl): the taps (weights) load before
// pdl_wait, x and the state after it, and the next kernel (the fused delta rule) may then become resident early.
//
// The _silu entries (ABI 15) apply fd::silu to each output before the store: the bits of fd_causal_conv1d then
// fd_silu (elementwise.cu's SiluOp is the same fd::silu), one launch instead of two (the decode step's conv).
//
// The tree form: one thread per channel walks the nodes in order (parents precede children); node i's window
// is read from its parent's node_conv row (written earlier by this same thread: no synchronisation needed) or
// from the committed conv_state, which is never written.
#include "common.cuh"

namespace {

constexpr int CONV_THREADS = 256;
constexpr int CONV_SLOTS = 8;          // token slots per block in a prefill

// The K taps of channel c, zero beyond K (K <= FD_CONV_MAX_K: fully unrolled loops, registers only).
__device__ __forceinline__ void load_taps(float (&w)[FD_CONV_MAX_K], const float* weight, int c, int K) {
#pragma unroll
    for (int k = 0; k < FD_CONV_MAX_K; ++k) w[k] = k < K ? weight[(size_t)c * K + k] : 0.0f;
}

// One output: the fmaf chain over the window u[0 .. K-1] (u[K-1] the newest input). Shared by both kernels.
__device__ __forceinline__ float conv_out(const float (&u)[FD_CONV_MAX_K], const float (&w)[FD_CONV_MAX_K], int K) {
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < FD_CONV_MAX_K; ++k)
        if (k < K) acc = fmaf(u[k], w[k], acc);
    return acc;
}

// SiLU epilogue of the _silu entries: the same fd::silu as fd_silu, so the bits of the two launches it replaces.
template <bool SILU>
__device__ __forceinline__ float conv_act(float y) { return SILU ? fd::silu(y) : y; }

// SLOTS = 1 (decode: 256 channels per block) or CONV_SLOTS (prefill: 32 channels x 8 token slots).
template <int SLOTS, bool SILU>
__global__ void __launch_bounds__(CONV_THREADS)
causal_conv1d_kernel(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ weight,
                     float* conv_state, int n, int C, int K) {
    constexpr int CW = CONV_THREADS / SLOTS;              // channels per block
    const int c = blockIdx.x * CW + (int)threadIdx.x % CW;
    const int slot = (int)threadIdx.x / CW;
    const bool live = c < C;
    float w[FD_CONV_MAX_K];
    if (live) load_taps(w, weight, c, K);
    fd::pdl_wait();                                       // x and the state are earlier kernels' (the taps: weights)
    fd::pdl_launch_dependents();
    if (SLOTS == 1 && n == 1) {                           // a decode step: the window, then its last K - 1 rows
        if (!live) return;
        float u[FD_CONV_MAX_K];
#pragma unroll
        for (int k = 0; k < FD_CONV_MAX_K; ++k)
            u[k] = k >= K ? 0.0f : k < K - 1 ? conv_state[(size_t)k * C + c] : x[c];
        y[c] = conv_act<SILU>(conv_out(u, w, K));
#pragma unroll
        for (int r = 0; r + 1 < FD_CONV_MAX_K; ++r)
            if (r + 1 < K) conv_state[(size_t)r * C + c] = u[r + 1];
        return;
    }
    for (int t = slot; live && t < n; t += SLOTS) {
        float u[FD_CONV_MAX_K];
#pragma unroll
        for (int k = 0; k < FD_CONV_MAX_K; ++k) {
            const int row = t + k - (K - 1);              // x row of u[t + k]; < 0: a conv_state row
            u[k] = k >= K ? 0.0f : row < 0 ? conv_state[(size_t)(t + k) * C + c] : x[(size_t)row * C + c];
        }
        y[(size_t)t * C + c] = conv_act<SILU>(conv_out(u, w, K));
    }
    __syncthreads();                                      // every read of the old state is done
    if (!live || slot != 0) return;
    for (int r = 0; r < K - 1; ++r) {                     // ascending r: reads row n + r > r before it is written
        const int row = n + r - (K - 1);
        conv_state[(size_t)r * C + c] = row < 0 ? conv_state[(size_t)(n + r) * C + c] : x[(size_t)row * C + c];
    }
}

template <bool SILU>
__global__ void __launch_bounds__(CONV_THREADS)
causal_conv1d_tree_kernel(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ weight,
                          const float* __restrict__ conv_state, const int32_t* __restrict__ parents,
                          float* node_conv, int n, int C, int K) {
    const int c = blockIdx.x * CONV_THREADS + (int)threadIdx.x;
    if (c >= C) return;
    float w[FD_CONV_MAX_K];
    load_taps(w, weight, c, K);
    fd::pdl_wait();                                       // as causal_conv1d_kernel
    fd::pdl_launch_dependents();
    const size_t node_stride = (size_t)(K - 1) * C;       // one node's (K - 1, C) window
    for (int i = 0; i < n; ++i) {
        const int parent = parents[i];
        const bool valid = parent >= -1 && parent < i;
        const float* src = parent < 0 ? conv_state : node_conv + (size_t)parent * node_stride;
        float u[FD_CONV_MAX_K];
#pragma unroll
        for (int k = 0; k < FD_CONV_MAX_K; ++k)
            u[k] = k >= K ? 0.0f : !valid ? NAN : k < K - 1 ? src[(size_t)k * C + c] : x[(size_t)i * C + c];
        y[(size_t)i * C + c] = conv_act<SILU>(conv_out(u, w, K));
        float* dst = node_conv + (size_t)i * node_stride;
#pragma unroll
        for (int k = 1; k < FD_CONV_MAX_K; ++k)           // the window's last K - 1 inputs
            if (k < K) dst[(size_t)(k - 1) * C + c] = u[k];
    }
}

// FD_E_ARG for a null pointer or a non-positive size, FD_E_SHAPE for more taps than the registers hold.
int check_conv(const void* y, const void* x, const void* weight, const void* state, int n, int C, int K) {
    if (!(y && x && weight && state) || n < 0 || C <= 0 || K < 2) return FD_E_ARG;
    if (K > FD_CONV_MAX_K) return FD_E_SHAPE;
    return 0;
}

template <bool SILU>
int launch_conv(float* y, const float* x, const float* weight, float* conv_state, int n, int channels, int kernel,
                void* stream) {
    if (int st = check_conv(y, x, weight, conv_state, n, channels, kernel)) return st;
    if (n == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (n == 1)
        return fd::launch_pdl(causal_conv1d_kernel<1, SILU>, dim3(fd::ceil_div(channels, CONV_THREADS)),
                              dim3(CONV_THREADS), 0, s, y, x, weight, conv_state, n, channels, kernel);
    return fd::launch_pdl(causal_conv1d_kernel<CONV_SLOTS, SILU>,
                          dim3(fd::ceil_div(channels, CONV_THREADS / CONV_SLOTS)), dim3(CONV_THREADS), 0, s, y, x,
                          weight, conv_state, n, channels, kernel);
}

template <bool SILU>
int launch_conv_tree(float* y, const float* x, const float* weight, const float* conv_state, const int32_t* parents,
                     float* node_conv, int n, int channels, int kernel, void* stream) {
    if (int st = check_conv(y, x, weight, conv_state, n, channels, kernel)) return st;
    FD_CHECK_ARG(parents && node_conv);
    if (n == 0) return 0;
    return fd::launch_pdl(causal_conv1d_tree_kernel<SILU>, dim3(fd::ceil_div(channels, CONV_THREADS)),
                          dim3(CONV_THREADS), 0, (cudaStream_t)stream, y, x, weight, conv_state, parents, node_conv,
                          n, channels, kernel);
}

}  // namespace

extern "C" int fd_causal_conv1d(float* y, const float* x, const float* weight, float* conv_state, int n,
                                int channels, int kernel, void* stream) {
    return launch_conv<false>(y, x, weight, conv_state, n, channels, kernel, stream);
}

extern "C" int fd_causal_conv1d_silu(float* y, const float* x, const float* weight, float* conv_state, int n,
                                     int channels, int kernel, void* stream) {
    return launch_conv<true>(y, x, weight, conv_state, n, channels, kernel, stream);
}

extern "C" int fd_causal_conv1d_tree(float* y, const float* x, const float* weight, const float* conv_state,
                                     const int32_t* parents, float* node_conv, int n, int channels, int kernel,
                                     void* stream) {
    return launch_conv_tree<false>(y, x, weight, conv_state, parents, node_conv, n, channels, kernel, stream);
}

extern "C" int fd_causal_conv1d_silu_tree(float* y, const float* x, const float* weight, const float* conv_state,
                                          const int32_t* parents, float* node_conv, int n, int channels, int kernel,
                                          void* stream) {
    return launch_conv_tree<true>(y, x, weight, conv_state, parents, node_conv, n, channels, kernel, stream);
}
