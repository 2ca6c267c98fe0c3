// sampling.cu -- token selection on the device (flashd.h: fd_argmax, fd_sample,
// fd_sample_workspace_bytes, fd_decode_advance).
//
// Files: sampling_argmax.cuh (fd_argmax's kernels), sampling_sample.cuh (fd_sample's kernel: what it
// computes, its launch, determinism and workspace), sampling_select.cuh (fd_sample's radix selection and
// candidate lists), sampling_common.cuh (the block shape and the batched pass both share); this file
// holds the C entry points and the decode loop's bookkeeping.
//
// fd_argmax: out[r] = argmax of logits row r (n_rows, n_vocab), the lowest id on ties.
// fd_sample: one token drawn from the logits for temperature > 0 (flashd.daemon.sampling.sample's
// semantics, in float32), with fd_sample_workspace_bytes of workspace.
//
// fd_decode_advance: one thread appends the chosen token to the history and the pinned ring and
// advances step, position and n_past (flashd.h).
#include "sampling_argmax.cuh"
#include "sampling_sample.cuh"

namespace {

__global__ void decode_advance_kernel(const int32_t* token, int32_t* history, int32_t* n_history, int32_t* ring,
                                      int ring_len, int32_t* step, int32_t* positions, int32_t* n_past) {
    const int32_t t = token[0];
    history[n_history[0]] = t;
    n_history[0] += 1;
    const int32_t s = step[0];
    ring[((s % ring_len) + ring_len) % ring_len] = t;
    step[0] = s + 1;
    positions[0] += 1;
    n_past[0] += 1;
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

extern "C" {

int fd_argmax(int32_t* out, const float* logits, int n_rows, int n_vocab, void* stream) {
    FD_CHECK_ARG(out && logits && n_rows >= 0 && n_vocab > 0);
    if (n_rows == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (n_vocab % 4 == 0 && ((uintptr_t)logits & 15u) == 0) return launch_argmax<true>(out, logits, n_rows, n_vocab, s);
    return launch_argmax<false>(out, logits, n_rows, n_vocab, s);
}

size_t fd_sample_workspace_bytes(int n_vocab) {
    if (n_vocab <= 0) return 0;
    const size_t n = align_up((size_t)n_vocab, 64);    // each array 256-byte aligned
    return n * (sizeof(float) + 2 * sizeof(int32_t));
}

int fd_sample(int32_t* out, const float* logits, int n_vocab, const int32_t* history, const int32_t* n_history,
              int repeat_last_n, float repeat_penalty, float frequency_penalty, float presence_penalty,
              float temperature, int top_k, float top_p, float min_p, uint64_t seed, const int32_t* step,
              void* workspace, void* stream) {
    FD_CHECK_ARG(out && logits && step && workspace);
    FD_CHECK_ARG(n_vocab > 0 && n_vocab <= MAX_VOCAB);
    FD_CHECK_ARG(temperature > 0.0f && isfinite(temperature));
    FD_CHECK_ARG(top_k >= 0 && top_p > 0.0f && top_p <= 1.0f && min_p >= 0.0f && min_p < 1.0f);
    FD_CHECK_ARG(repeat_last_n >= 0 && repeat_penalty > 0.0f);
    FD_CHECK_ARG(((uintptr_t)workspace & 15u) == 0);
    const bool penalties = repeat_last_n > 0 &&
                           (repeat_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f);
    FD_CHECK_ARG(!penalties || (history && n_history));

    SampleArgs a;
    a.out = out;
    a.logits = logits;
    a.n_vocab = n_vocab;
    a.history = history;
    a.n_history = n_history;
    a.repeat_last_n = repeat_last_n;
    a.repeat_penalty = repeat_penalty;
    a.frequency_penalty = frequency_penalty;
    a.presence_penalty = presence_penalty;
    a.penalties = penalties ? 1 : 0;
    a.log2e_over_t = (float)(1.4426950408889634 / (double)temperature);
    a.top_k = (top_k > 0 && top_k < n_vocab) ? top_k : 0;
    a.top_p = top_p;
    a.min_p = min_p;
    a.seed = seed;
    a.step = step;
    const size_t n = align_up((size_t)n_vocab, 64);
    a.x = (float*)workspace;
    a.count = (int32_t*)((char*)workspace + n * sizeof(float));
    a.slot = a.count + n;

    cudaStream_t s = (cudaStream_t)stream;
    const size_t smem = sizeof(Smem);
    if (n_vocab % 4 == 0 && ((uintptr_t)logits & 15u) == 0) {
        cudaFuncSetAttribute(sample_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        sample_kernel<true><<<1, ST, smem, s>>>(a);
    } else {
        cudaFuncSetAttribute(sample_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        sample_kernel<false><<<1, ST, smem, s>>>(a);
    }
    return FD_LAUNCH_STATUS();
}

int fd_decode_advance(const int32_t* token, int32_t* history, int32_t* n_history, int32_t* ring, int ring_len,
                      int32_t* step, int32_t* positions, int32_t* n_past, void* stream) {
    FD_CHECK_ARG(token && history && n_history && ring && step && positions && n_past && ring_len > 0);
    decode_advance_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(token, history, n_history, ring, ring_len, step,
                                                              positions, n_past);
    return FD_LAUNCH_STATUS();
}

}  // extern "C"
