// gemv_scratch.cuh -- StreamScratch: the per-(device, stream) device buffers of the GEMV pre-passes (gemv.cu's
// xq_image_scratch, gemv_rows_plan.cuh's rows_scratch). Its own header because gemv.cu includes gemv_rows_plan.cuh
// only where FD_HAS_MMA, while the x-image pre-pass also runs under HIP.
#pragma once

#include "common.cuh"

#include <map>
#include <mutex>
#include <utility>

namespace fd {
namespace {

// A device buffer per (device, stream) for a GEMV pre-pass's output: gemv_rows_plan.cuh's rows_scratch and gemv.cu's
// xq_image_scratch each keep a StreamScratch of their own, so they never share memory. get() allocates the buffer on
// the first call on that stream, with that call's size, and keeps it for the process (never grown or freed), so a
// caller asks for one fixed size (a per-device constant). Per stream, so calls on different streams never share it
// (a graph replays on its captured stream's buffer: replay it on that stream, or on none that runs GEMVs at the same
// time). A first call inside graph capture allocates in relaxed capture mode (cudaThreadExchangeStreamCaptureMode,
// the documented way for a library to cudaMalloc there). A failed cudaMalloc returns its error and caches nothing,
// so a later call tries again.
class StreamScratch {
  public:
    int get(cudaStream_t stream, size_t bytes, void** out) {
        int dev = 0;
        if (cudaError_t e = cudaGetDevice(&dev)) return (int)e;
        std::lock_guard<std::mutex> lock(mu_);
        void*& buf = bufs_[{dev, stream}];
        if (buf == nullptr) {
            void* p = nullptr;
            cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
            (void)cudaThreadExchangeStreamCaptureMode(&mode);
            const cudaError_t e = cudaMalloc(&p, bytes);
            (void)cudaThreadExchangeStreamCaptureMode(&mode);   // back to the caller's mode
            if (e != cudaSuccess) return (int)e;
            buf = p;
        }
        *out = buf;
        return 0;
    }

  private:
    std::mutex mu_;
    std::map<std::pair<int, cudaStream_t>, void*> bufs_;
};

}  // namespace
}  // namespace fd
