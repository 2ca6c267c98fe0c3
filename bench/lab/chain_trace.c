// chain_trace.c -- a CUPTI kernel tracer for a decode step's kernel chain (bench/lab; not part of the library).
//
// LD_PRELOAD=chain_trace.so CHAIN_TRACE_OUT=trace.tsv <any command that runs CUDA kernels>
// writes one line per kernel: start_ns end_ns grid_x block_x graph_node_id name (mangled), in completion
// order of CUPTI's buffers. With programmatic dependent launch a kernel starts before its predecessor ends,
// so what a kernel adds to a step is end[k] - end[k-1] (bench/lab/chain_report.py prints that per kernel).
// CONCURRENT_KERNEL records come from hardware timestamps and do not serialize kernels.
//
// Build: gcc -O2 -shared -fPIC -I$CUDA/include chain_trace.c -L$CUDA/lib -lcupti -o chain_trace.so
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE* out;
#define BUF_BYTES (8u << 20)

static void CUPTIAPI buf_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = (uint8_t*)aligned_alloc(8, BUF_BYTES);
    *size = BUF_BYTES;
    *max_records = 0;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity* rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)rec;
            if (out)
                fprintf(out, "%llu\t%llu\t%d\t%d\t%llu\t%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                        k->gridX * k->gridY * k->gridZ, k->blockX, (unsigned long long)k->graphNodeId,
                        k->name ? k->name : "?");
        }
    }
    if (out) fflush(out);
    free(buffer);
}

static void finish(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
    out = NULL;
}

__attribute__((constructor)) static void start(void) {
    const char* path = getenv("CHAIN_TRACE_OUT");
    out = fopen(path ? path : "chain_trace.tsv", "w");
    if (cuptiActivityRegisterCallbacks(buf_requested, buf_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "chain_trace: CUPTI activity setup failed\n");
        return;
    }
    cuptiActivityFlushPeriod(200);   // ms: records reach the file while the process runs
    atexit(finish);
}
