/* flashd_runtime.h -- devices, memory, streams, events and graphs (runtime.cu).
   Part of the C ABI: include flashd.h (its conventions hold here), not this file. */
#ifndef FLASHD_RUNTIME_H
#define FLASHD_RUNTIME_H
#ifndef FLASHD_H
#error "include flashd.h, which includes this header"
#endif
/* --- cdef begin --- */

int fd_abi_version(void);
const char* fd_status_string(int status);
int fd_device_count(int* n_devices);
int fd_set_device(int device);
int fd_device_info(int device, char* name, int name_len, int* cc_major, int* cc_minor,
                   int* n_sms, size_t* total_bytes, int* clock_khz, int* mem_bus_bits);
int fd_mem_info(size_t* free_bytes, size_t* total_bytes);
int fd_malloc(void** ptr, size_t n_bytes);
int fd_free(void* ptr);
int fd_host_alloc(void** host_ptr, size_t n_bytes);          /* pinned, mapped into the device */
int fd_host_free(void* host_ptr);
int fd_memcpy_h2d(void* dst, const void* host_src, size_t n_bytes, void* stream);
int fd_memcpy_d2h(void* host_dst, const void* src, size_t n_bytes, void* stream);
int fd_memcpy_d2d(void* dst, const void* src, size_t n_bytes, void* stream);
int fd_memset(void* dst, int byte_value, size_t n_bytes, void* stream);
int fd_stream_create(void** stream);
int fd_stream_destroy(void* stream);                          /* (a Device's stream lives as long as the process) */
int fd_stream_synchronize(void* stream);
int fd_event_create(void** event, int with_timing);
int fd_event_destroy(void* event);
int fd_event_record(void* event, void* stream);
/* in graph capture: a node that records the event at replay (profiling) */
int fd_event_record_external(void* event, void* stream);
int fd_event_synchronize(void* event);
int fd_event_elapsed_ms(float* ms, void* start_event, void* end_event);
int fd_graph_begin_capture(void* stream);
int fd_graph_end_capture(void* stream, void** graph_exec);
int fd_graph_launch(void* graph_exec, void* stream);
int fd_graph_destroy(void* graph_exec);

/* --- cdef end --- */
#endif /* FLASHD_RUNTIME_H */
