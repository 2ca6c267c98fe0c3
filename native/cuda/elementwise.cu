// elementwise.cu -- float32 elementwise ops over flat arrays of n elements (flashd_linear.h: fd_add,
// fd_swiglu, fd_mul, fd_silu, fd_sigmoid, fd_sigmoid_mul) and the column slice copy fd_copy_cols.
//
//   fd_add:         y[i] = a[i] + b[i]
//   fd_swiglu:      y[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i]
//   fd_mul:         y[i] = a[i] * b[i]
//   fd_silu:        y[i] = silu(x[i])                  (the bits of fd_swiglu(x, ones): * 1.0f is exact)
//   fd_sigmoid:     y[i] = sigmoid(x[i])
//   fd_sigmoid_mul: y[i] = x[i] * sigmoid(gate[i])     (a gated attention output: one launch, the bits of
//                                                       fd_sigmoid then fd_mul)
//   fd_copy_cols:   y (rows, cols) = x[:, col0 : col0 + cols] of x (rows, x_cols): bit copies (a split)
//
// sigmoid is the reference backend's float32 formula, 0.5 (1 + tanh(x / 2)) (backends/reference.py), each step
// rounded to float32 with explicit _rn intrinsics (no contraction); tanh is computed in double and rounded once
// (the correctly rounded float32 tanh but for rare double-rounding cases), where numpy's float32 tanh is within
// an ulp or two of it: the result is within 2^-24.6 of the exact formula and 2^-23 of the reference (most
// elements bit for bit; tests/gpu/test_hybrid_gates.py).
//
// y may alias any input (fd_copy_cols: y must not overlap x): every element is read and written by the same
// thread. Launch: a grid-stride loop of 256-thread blocks (at most MAX_BLOCKS, enough to fill any current GPU
// several times over), float4 accesses when all pointers are 16-byte aligned, a scalar tail.
// silu: x / (1 + e^-x) stays finite for large |x| (e^-x -> inf gives -0, like the reference's
// tanh form), and __expf's ~2 ulp error is far below the activations' own rounding.
#include "common.cuh"

namespace {

constexpr int EW_THREADS = 256;
constexpr int64_t MAX_BLOCKS = 4096;

struct AddOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

struct SwigluOp {
    __device__ __forceinline__ float operator()(float gate, float up) const { return fd::silu(gate) * up; }
};

struct MulOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return __fmul_rn(a, b); }
};

// 0.5 (1 + tanh(0.5 x)) as numpy evaluates it in float32: x / 2 (exact), tanh rounded once, 1 + t, times 0.5
__device__ __forceinline__ float sigmoid_ref(float x) {
    const float t = (float)tanh((double)__fmul_rn(0.5f, x));
    return __fmul_rn(0.5f, __fadd_rn(1.0f, t));
}

struct SigmoidMulOp {
    __device__ __forceinline__ float operator()(float x, float gate) const { return __fmul_rn(x, sigmoid_ref(gate)); }
};

struct SiluOp {
    __device__ __forceinline__ float operator()(float x) const { return fd::silu(x); }   // = fd_swiglu(x, 1.0f)
};

struct SigmoidOp {
    __device__ __forceinline__ float operator()(float x) const { return sigmoid_ref(x); }
};

template <class Op>
__global__ void __launch_bounds__(EW_THREADS)
binary_vec4_kernel(float* y, const float* a, const float* b, int64_t n, Op op) {
    const int64_t n4 = n / 4;
    const int64_t stride = (int64_t)gridDim.x * EW_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x; i < n4; i += stride) {
        const float4 va = reinterpret_cast<const float4*>(a)[i];
        const float4 vb = reinterpret_cast<const float4*>(b)[i];
        reinterpret_cast<float4*>(y)[i] = make_float4(op(va.x, vb.x), op(va.y, vb.y), op(va.z, vb.z), op(va.w, vb.w));
    }
    // tail: the last n % 4 elements, one thread each
    const int64_t t = n4 * 4 + (int64_t)blockIdx.x * EW_THREADS + threadIdx.x;
    if (t < n) y[t] = op(a[t], b[t]);
}

template <class Op>
__global__ void __launch_bounds__(EW_THREADS)
binary_scalar_kernel(float* y, const float* a, const float* b, int64_t n, Op op) {
    const int64_t stride = (int64_t)gridDim.x * EW_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x; i < n; i += stride) y[i] = op(a[i], b[i]);
}

template <class Op>
__global__ void __launch_bounds__(EW_THREADS)
unary_vec4_kernel(float* y, const float* x, int64_t n, Op op) {
    const int64_t n4 = n / 4;
    const int64_t stride = (int64_t)gridDim.x * EW_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x; i < n4; i += stride) {
        const float4 v = reinterpret_cast<const float4*>(x)[i];
        reinterpret_cast<float4*>(y)[i] = make_float4(op(v.x), op(v.y), op(v.z), op(v.w));
    }
    const int64_t t = n4 * 4 + (int64_t)blockIdx.x * EW_THREADS + threadIdx.x;
    if (t < n) y[t] = op(x[t]);
}

template <class Op>
__global__ void __launch_bounds__(EW_THREADS)
unary_scalar_kernel(float* y, const float* x, int64_t n, Op op) {
    const int64_t stride = (int64_t)gridDim.x * EW_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x; i < n; i += stride) y[i] = op(x[i]);
}

// y (rows, cols) <- x[:, col0 : col0 + cols], x (rows, x_cols); one thread per output element, grid-stride
__global__ void __launch_bounds__(EW_THREADS)
copy_cols_kernel(float* y, const float* x, int64_t rows, int64_t x_cols, int64_t col0, int64_t cols) {
    const int64_t n = rows * cols;
    const int64_t stride = (int64_t)gridDim.x * EW_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x; i < n; i += stride) {
        const int64_t r = i / cols, c = i - r * cols;
        y[i] = x[r * x_cols + col0 + c];
    }
}

int blocks_for(int64_t work) {
    return (int)(work < MAX_BLOCKS * EW_THREADS ? (work + EW_THREADS - 1) / EW_THREADS : MAX_BLOCKS);
}

bool aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

template <class Op>
int launch_binary(float* y, const float* a, const float* b, int64_t n, void* stream) {
    FD_CHECK_ARG(y && a && b && n >= 0);
    if (n == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (aligned16(y) && aligned16(a) && aligned16(b)) {
        const int64_t work = n / 4 > 0 ? n / 4 : 1;   // the tail (< 4 elements) fits in block 0
        const int blocks = (int)(work < MAX_BLOCKS * EW_THREADS ? (work + EW_THREADS - 1) / EW_THREADS : MAX_BLOCKS);
        binary_vec4_kernel<<<blocks, EW_THREADS, 0, s>>>(y, a, b, n, Op{});
    } else {
        const int blocks = (int)(n < MAX_BLOCKS * EW_THREADS ? (n + EW_THREADS - 1) / EW_THREADS : MAX_BLOCKS);
        binary_scalar_kernel<<<blocks, EW_THREADS, 0, s>>>(y, a, b, n, Op{});
    }
    return FD_LAUNCH_STATUS();
}

template <class Op>
int launch_unary(float* y, const float* x, int64_t n, void* stream) {
    FD_CHECK_ARG(y && x && n >= 0);
    if (n == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (aligned16(y) && aligned16(x)) {
        unary_vec4_kernel<<<blocks_for(n / 4 > 0 ? n / 4 : 1), EW_THREADS, 0, s>>>(y, x, n, Op{});
    } else {
        unary_scalar_kernel<<<blocks_for(n), EW_THREADS, 0, s>>>(y, x, n, Op{});
    }
    return FD_LAUNCH_STATUS();
}

}  // namespace

extern "C" int fd_add(float* y, const float* a, const float* b, int64_t n, void* stream) {
    return launch_binary<AddOp>(y, a, b, n, stream);
}

extern "C" int fd_swiglu(float* y, const float* gate, const float* up, int64_t n, void* stream) {
    return launch_binary<SwigluOp>(y, gate, up, n, stream);
}

extern "C" int fd_mul(float* y, const float* a, const float* b, int64_t n, void* stream) {
    return launch_binary<MulOp>(y, a, b, n, stream);
}

extern "C" int fd_sigmoid_mul(float* y, const float* x, const float* gate, int64_t n, void* stream) {
    return launch_binary<SigmoidMulOp>(y, x, gate, n, stream);
}

extern "C" int fd_silu(float* y, const float* x, int64_t n, void* stream) {
    return launch_unary<SiluOp>(y, x, n, stream);
}

extern "C" int fd_sigmoid(float* y, const float* x, int64_t n, void* stream) {
    return launch_unary<SigmoidOp>(y, x, n, stream);
}

extern "C" int fd_copy_cols(float* y, const float* x, int64_t rows, int64_t x_cols, int64_t col0, int64_t cols,
                            void* stream) {
    FD_CHECK_ARG(y && x && rows >= 0 && cols >= 0 && col0 >= 0 && col0 + cols <= x_cols);
    if (rows == 0 || cols == 0) return 0;
    copy_cols_kernel<<<blocks_for(rows * cols), EW_THREADS, 0, (cudaStream_t)stream>>>(y, x, rows, x_cols, col0,
                                                                                         cols);
    return FD_LAUNCH_STATUS();
}
