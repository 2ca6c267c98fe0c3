// dequant.cu -- whole weights to float16 (fd_dequant_f16, for prefill GEMMs) and rows of a quantized
// table to float32 (fd_embed, the token embedding), with the decoders of quant.cuh: the values are
// exactly gguf.quants.dequantize's float32 (then rounded to f16 by fd_dequant_f16, round to nearest
// even, as numpy's astype(float16)).
//
// Work is split into "steps" of a few KB of weight bytes (a chunk of consecutive blocks):
//   dequant: the tensor as one flat stream of blocks (rows are whole blocks, so block k's elements
//            are the flat output elements k*BE ..); float formats as a flat stream of 16-byte
//            virtual blocks, the last one partial;
//   embed:   (output row i, chunk c of table row ids[i]); ids outside [0, n_table_rows) write NaN
//            rows (nothing can be reported from the device).
// Each warp double-buffers its steps in shared memory (16-byte cp.async, quant_stage.cuh warp_stage) and
// decodes piece by piece: lane p of a step takes block p / LPB, piece p % LPB and stores each run
// of 4 columns (f16: 8-byte stores; f32: 16-byte stores when the output row is 16-aligned).
// Launch: CTAs of 8 warps, about 35 KB of shared memory each (no opt-in needed), grid-stride.
#include "quant.cuh"

namespace fd {
namespace {

using namespace fd::q;

constexpr int DQ_WARPS = 8;
constexpr int DQ_CHUNK_BYTES = 2048;   // target staged bytes per step

struct DqArgs {
    const uint8_t* w;
    int qtype;
    int64_t cols;            // elements per row (embed) / unused (dequant)
    int64_t row_bytes;       // embed: bytes per table row
    int64_t total_elems;     // dequant: rows * cols
    int64_t total_blocks;    // dequant: blocks in the flat stream; embed: blocks per row
    int chunk_blocks;        // blocks per step
    int chunks_per_row;      // embed
    int64_t n_steps;
    int stage_bytes;
    __half* dst16;           // dequant output (rows, cols)
    float* dst32;            // embed output (n_ids, cols)
    const int32_t* ids;
    int64_t n_table_rows;
    bool vec_out;            // embed: float4 stores are aligned
};

// Where step s reads: source pointer, bytes, and the first block index within its stream.
struct DqStep {
    const uint8_t* src;
    int64_t n_bytes;
    int64_t blk0;      // dequant: flat block index; embed: block index within the row
    int n_blocks;
    int64_t out_row;   // embed: output row i; -1 for dequant
    bool nan_row;      // embed: id out of range
};

template <bool EMBED>
__device__ __forceinline__ DqStep dq_step(const DqArgs& a, int64_t s) {
    DqStep st;
    if (EMBED) {
        const int64_t i = s / a.chunks_per_row;
        const int c = (int)(s - i * a.chunks_per_row);
        const int64_t id = a.ids[i];
        st.out_row = i;
        st.nan_row = id < 0 || id >= a.n_table_rows;
        st.blk0 = (int64_t)c * a.chunk_blocks;
        st.src = a.w + (st.nan_row ? 0 : id) * a.row_bytes;
    } else {
        st.out_row = -1;
        st.nan_row = false;
        st.blk0 = s * a.chunk_blocks;
        st.src = a.w;
    }
    st.n_blocks = (int)min((int64_t)a.chunk_blocks, a.total_blocks - st.blk0);
    st.n_bytes = 0;   // set by DqOps::span
    return st;
}

template <int QT, bool EMBED>
struct DqOps {
    using F = Fmt<QT>;

    // bytes of blocks [blk0, blk0 + n_blocks) of the step's stream (float formats: clipped to the data)
    __device__ static void span(const DqArgs& a, DqStep& st) {
        const int64_t begin = st.blk0 * F::BB;
        int64_t end = (st.blk0 + st.n_blocks) * F::BB;
        const int64_t limit = EMBED ? a.row_bytes : (F::IS_FLOAT ? a.total_elems * (F::BB / F::BE) : a.total_blocks * F::BB);
        if (end > limit) end = limit;
        st.src += begin;
        st.n_bytes = end - begin;
    }

    __device__ static void issue(const DqArgs& a, int64_t s, uint8_t* buf, int lane) {
        DqStep st = dq_step<EMBED>(a, s);
        if (st.nan_row) return;
        span(a, st);
        warp_stage(buf, st.src, st.n_bytes, lane);
    }

    __device__ static void compute(const DqArgs& a, int64_t s, const uint8_t* buf, int lane) {
        DqStep st = dq_step<EMBED>(a, s);
        const int64_t n_valid_total = EMBED ? a.cols : a.total_elems;   // elements in the stream
        if (st.nan_row) {   // the step's columns of output row i
            const int64_t c0 = st.blk0 * F::BE;
            const int64_t c1 = min(c0 + (int64_t)st.n_blocks * F::BE, a.cols);
            float* out = a.dst32 + st.out_row * a.cols;
            for (int64_t c = c0 + lane; c < c1; c += 32) out[c] = __int_as_float(0x7fc00000);
            return;
        }
        span(a, st);
        const uint8_t* base = buf + (reinterpret_cast<uintptr_t>(st.src) & 15);
        const int j = lane % F::LPB;
        for (int p = lane; p < st.n_blocks * F::LPB; p += 32) {
            const int blk = p / F::LPB;
            const int64_t e0 = (st.blk0 + blk) * F::BE;   // first element of the block in the stream
            typename F::Raw raw;
            F::template load<false>(base + (int64_t)blk * F::BB, j, raw);
            const int64_t n_valid = n_valid_total - e0;
            if constexpr (F::IS_FLOAT) F::mask(raw, n_valid < F::BE ? (int)n_valid : F::BE);
            float pa[F::PARTS], pb[F::PARTS];
            F::params(raw, j, pa, pb);
#pragma unroll
            for (int run = 0; run < F::RUNS; ++run) {
                float v[4];
                decode_run<QT>(raw, j, run, pa, pb, v);   // gguf's float32 values, bit for bit
                const int64_t e = e0 + F::col(j, run);
                const bool full = !F::IS_FLOAT || n_valid - F::col(j, run) >= 4;
                if (EMBED) {
                    float* out = a.dst32 + st.out_row * a.cols + e;
                    if (full && a.vec_out) {
                        *reinterpret_cast<float4*>(out) = make_float4(v[0], v[1], v[2], v[3]);
                    } else {
#pragma unroll
                        for (int i = 0; i < 4; ++i)
                            if (!F::IS_FLOAT || F::col(j, run) + i < n_valid) out[i] = v[i];
                    }
                } else {
                    __half* out = a.dst16 + e;
                    if (full) {
                        const __half2 h01 = __floats2half2_rn(v[0], v[1]), h23 = __floats2half2_rn(v[2], v[3]);
                        uint2 packed;
                        packed.x = *reinterpret_cast<const uint32_t*>(&h01);
                        packed.y = *reinterpret_cast<const uint32_t*>(&h23);
                        *reinterpret_cast<uint2*>(out) = packed;
                    } else {
#pragma unroll
                        for (int i = 0; i < 4; ++i)
                            if (F::col(j, run) + i < n_valid) out[i] = __float2half_rn(v[i]);
                    }
                }
            }
        }
    }
};

template <bool EMBED>
struct DqIssue {
    const DqArgs& a; int64_t s; uint8_t* buf; int lane;
    template <int QT> __device__ __forceinline__ void run() { DqOps<QT, EMBED>::issue(a, s, buf, lane); }
};
template <bool EMBED>
struct DqCompute {
    const DqArgs& a; int64_t s; const uint8_t* buf; int lane;
    template <int QT> __device__ __forceinline__ void run() { DqOps<QT, EMBED>::compute(a, s, buf, lane); }
};

template <bool EMBED>
__global__ void __launch_bounds__(DQ_WARPS * 32) dequant_kernel(const DqArgs a) {
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t stride = (int64_t)gridDim.x * DQ_WARPS;
    uint8_t* stage = smem + (size_t)warp * 2 * a.stage_bytes;
    const int64_t s0 = (int64_t)blockIdx.x * DQ_WARPS + warp;

    if (s0 < a.n_steps) { DqIssue<EMBED> f{a, s0, stage, lane}; dispatch_qtype(a.qtype, f); }
    cp_async_commit();
    int it = 0;
    for (int64_t s = s0; s < a.n_steps; s += stride, ++it) {
        const int64_t next = s + stride;
        if (next < a.n_steps) {
            DqIssue<EMBED> f{a, next, stage + ((it + 1) & 1) * a.stage_bytes, lane};
            dispatch_qtype(a.qtype, f);
        }
        cp_async_commit();
        cp_async_wait<1>();   // this lane's copies of step s are done ...
        __syncwarp();         // ... and every lane's are visible
        DqCompute<EMBED> f{a, s, stage + (it & 1) * a.stage_bytes, lane};
        dispatch_qtype(a.qtype, f);
        __syncwarp();         // buffer it & 1 is refilled two iterations on
    }
    cp_async_wait<0>();
}

int n_sms_of_current_device(int* n_sms) {
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(n_sms, cudaDevAttrMultiProcessorCount, dev);
    return (int)err;
}

// blocks per step: about DQ_CHUNK_BYTES, a multiple of 32 / LPB (every lane gets whole pieces)
int chunk_blocks_of(const FmtInfo& f) {
    const int unit = 32 / f.lanes_per_block;
    int n = DQ_CHUNK_BYTES / f.block_bytes / unit * unit;
    return n < unit ? unit : n;
}

int dq_launch(DqArgs& a, bool embed, cudaStream_t stream) {
    int n_sms = 0;
    if (int st = n_sms_of_current_device(&n_sms)) return st;
    FmtInfo f;
    fmt_info(a.qtype, &f);
    a.stage_bytes = (int)stage_range_bytes((int64_t)a.chunk_blocks * f.block_bytes);
    const size_t smem = (size_t)DQ_WARPS * 2 * a.stage_bytes;   // <= 8 * 2 * 2.1 KB: no opt-in needed
    int64_t ctas = (a.n_steps + DQ_WARPS - 1) / DQ_WARPS;
    const int64_t max_ctas = (int64_t)n_sms * 6;
    if (ctas > max_ctas) ctas = max_ctas;
    if (ctas < 1) return 0;
    if (embed) dequant_kernel<true><<<(int)ctas, DQ_WARPS * 32, smem, stream>>>(a);
    else dequant_kernel<false><<<(int)ctas, DQ_WARPS * 32, smem, stream>>>(a);
    return FD_LAUNCH_STATUS();
}

}  // namespace
}  // namespace fd

extern "C" {

int fd_dequant_f16(void* dst, const void* w, int qtype, int64_t rows, int64_t cols, void* stream) {
    using namespace fd;
    FD_CHECK_ARG(dst != nullptr && w != nullptr && rows >= 1 && cols >= 1);
    q::FmtInfo f;
    if (!q::fmt_info(qtype, &f)) return FD_E_QTYPE;
    if (!f.is_float && cols % f.block_elems != 0) return FD_E_SHAPE;
    FD_CHECK_ARG(reinterpret_cast<uintptr_t>(w) % (uintptr_t)f.align == 0);
    FD_CHECK_ARG(reinterpret_cast<uintptr_t>(dst) % 8 == 0);   // 4 halves per store
    DqArgs a{};
    a.w = static_cast<const uint8_t*>(w);
    a.qtype = qtype;
    a.total_elems = rows * cols;
    a.total_blocks = (a.total_elems + f.block_elems - 1) / f.block_elems;
    a.chunk_blocks = chunk_blocks_of(f);
    a.n_steps = (a.total_blocks + a.chunk_blocks - 1) / a.chunk_blocks;
    a.dst16 = static_cast<__half*>(dst);
    return dq_launch(a, false, (cudaStream_t)stream);
}

int fd_embed(float* dst, const void* table, int qtype, int64_t n_table_rows, int64_t cols, const int32_t* ids,
             int n_ids, void* stream) {
    using namespace fd;
    FD_CHECK_ARG(dst != nullptr && table != nullptr && ids != nullptr && n_table_rows >= 1 && cols >= 1 && n_ids >= 0);
    q::FmtInfo f;
    if (!q::fmt_info(qtype, &f)) return FD_E_QTYPE;
    if (!f.is_float && cols % f.block_elems != 0) return FD_E_SHAPE;
    FD_CHECK_ARG(reinterpret_cast<uintptr_t>(table) % (uintptr_t)f.align == 0);
    if (n_ids == 0) return 0;
    DqArgs a{};
    a.w = static_cast<const uint8_t*>(table);
    a.qtype = qtype;
    a.cols = cols;
    a.row_bytes = q::row_bytes(f, cols);
    a.total_blocks = (cols + f.block_elems - 1) / f.block_elems;   // per row
    a.chunk_blocks = chunk_blocks_of(f);
    if (a.chunk_blocks > a.total_blocks) {   // whole rows per step, still whole pieces per lane
        const int unit = 32 / f.lanes_per_block;
        a.chunk_blocks = (int)((a.total_blocks + unit - 1) / unit * unit);
    }
    a.chunks_per_row = (int)((a.total_blocks + a.chunk_blocks - 1) / a.chunk_blocks);
    a.n_steps = (int64_t)n_ids * a.chunks_per_row;
    a.dst32 = dst;
    a.ids = ids;
    a.n_table_rows = n_table_rows;
    a.vec_out = reinterpret_cast<uintptr_t>(dst) % 16 == 0 && (cols % 4) == 0;
    return dq_launch(a, true, (cudaStream_t)stream);
}

}  // extern "C"
