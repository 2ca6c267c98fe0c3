// runtime.cu -- the ABI's device, memory, stream, event and graph functions: thin wrappers over
// the CUDA runtime so Python never links against it directly. Each returns the cudaError_t.
#include "common.cuh"

#include <string.h>

extern "C" {

int fd_abi_version(void) { return FD_ABI_VERSION; }

const char* fd_status_string(int status) {
    switch (status) {
        case 0: return "ok";
        case FD_E_ARG: return "invalid argument (size, pointer or shape)";
        case FD_E_QTYPE: return "weight format not supported by this kernel";
        case FD_E_SHAPE: return "shape not supported by this kernel";
        case FD_E_UNSUPPORTED: return "not available in this build (NVIDIA-only path; see the README's AMD / HIP)";
        default: return status > 0 ? cudaGetErrorString((cudaError_t)status) : "unknown flashd status";
    }
}

int fd_device_count(int* n_devices) { return (int)cudaGetDeviceCount(n_devices); }

int fd_set_device(int device) { return (int)cudaSetDevice(device); }

int fd_device_info(int device, char* name, int name_len, int* cc_major, int* cc_minor, int* n_sms,
                   size_t* total_bytes, int* clock_khz, int* mem_bus_bits) {
    cudaDeviceProp prop;
    cudaError_t err = cudaGetDeviceProperties(&prop, device);
    if (err != cudaSuccess) return (int)err;
    if (name && name_len > 0) {
        strncpy(name, prop.name, (size_t)name_len - 1);
        name[name_len - 1] = '\0';
    }
    *cc_major = prop.major;
    *cc_minor = prop.minor;
    *n_sms = prop.multiProcessorCount;
    *total_bytes = prop.totalGlobalMem;
    int value = 0;
    cudaDeviceGetAttribute(&value, cudaDevAttrMemoryClockRate, device);
    *clock_khz = value;
    cudaDeviceGetAttribute(&value, cudaDevAttrGlobalMemoryBusWidth, device);
    *mem_bus_bits = value;
    return 0;
}

int fd_mem_info(size_t* free_bytes, size_t* total_bytes) { return (int)cudaMemGetInfo(free_bytes, total_bytes); }

int fd_malloc(void** ptr, size_t n_bytes) { return (int)cudaMalloc(ptr, n_bytes); }

int fd_free(void* ptr) { return (int)cudaFree(ptr); }

int fd_host_alloc(void** host_ptr, size_t n_bytes) {
    return (int)cudaHostAlloc(host_ptr, n_bytes, cudaHostAllocMapped);
}

int fd_host_free(void* host_ptr) { return (int)cudaFreeHost(host_ptr); }

int fd_memcpy_h2d(void* dst, const void* host_src, size_t n_bytes, void* stream) {
    return (int)cudaMemcpyAsync(dst, host_src, n_bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream);
}

int fd_memcpy_d2h(void* host_dst, const void* src, size_t n_bytes, void* stream) {
    return (int)cudaMemcpyAsync(host_dst, src, n_bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream);
}

int fd_memcpy_d2d(void* dst, const void* src, size_t n_bytes, void* stream) {
    return (int)cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
}

int fd_memset(void* dst, int byte_value, size_t n_bytes, void* stream) {
    return (int)cudaMemsetAsync(dst, byte_value, n_bytes, (cudaStream_t)stream);
}

int fd_stream_create(void** stream) {
    return (int)cudaStreamCreateWithFlags((cudaStream_t*)stream, cudaStreamNonBlocking);
}

int fd_stream_destroy(void* stream) { return (int)cudaStreamDestroy((cudaStream_t)stream); }

int fd_stream_synchronize(void* stream) { return (int)cudaStreamSynchronize((cudaStream_t)stream); }

int fd_event_create(void** event, int with_timing) {
    return (int)cudaEventCreateWithFlags((cudaEvent_t*)event, with_timing ? cudaEventDefault : cudaEventDisableTiming);
}

int fd_event_destroy(void* event) { return (int)cudaEventDestroy((cudaEvent_t)event); }

int fd_event_record(void* event, void* stream) { return (int)cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream); }
// During stream capture a plain record only orders work inside the graph; the external flag makes it
// an event-record node that records at every replay (how bench/profile_decode.py times each kernel).
int fd_event_record_external(void* event, void* stream) {
#if FD_HAS_MMA
    return (int)cudaEventRecordWithFlags((cudaEvent_t)event, (cudaStream_t)stream, cudaEventRecordExternal);
#else
    return (int)cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream);
#endif
}

int fd_event_synchronize(void* event) { return (int)cudaEventSynchronize((cudaEvent_t)event); }

int fd_event_elapsed_ms(float* ms, void* start_event, void* end_event) {
    return (int)cudaEventElapsedTime(ms, (cudaEvent_t)start_event, (cudaEvent_t)end_event);
}

int fd_graph_begin_capture(void* stream) {
    return (int)cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal);
}

int fd_graph_end_capture(void* stream, void** graph_exec) {
    cudaGraph_t graph;
    cudaError_t err = cudaStreamEndCapture((cudaStream_t)stream, &graph);
    if (err != cudaSuccess) return (int)err;
    err = cudaGraphInstantiate((cudaGraphExec_t*)graph_exec, graph, 0);
    cudaGraphDestroy(graph);
    return (int)err;
}

int fd_graph_launch(void* graph_exec, void* stream) {
    return (int)cudaGraphLaunch((cudaGraphExec_t)graph_exec, (cudaStream_t)stream);
}

int fd_graph_destroy(void* graph_exec) { return (int)cudaGraphExecDestroy((cudaGraphExec_t)graph_exec); }

}  // extern "C"
