// ktrace.c: a kernel timeline of any CUDA program, for the GPU machine,
// where Nsight Systems is not installed. The CUDA driver loads it into the
// program through CUDA_INJECTION64_PATH and calls InitializeInjection,
// which turns on CUPTI's kernel activity records; each kernel's execution
// (graph nodes included, so every kernel of a replayed decode step), and
// each memory copy and set, is written to $KTRACE_OUT as one CSV line: start and end (ns, the GPU's
// clock), stream, the graph and node it ran from (0 outside graphs), the
// launch's correlation id, grid, block, dynamic shared memory, registers
// and the kernel's name (a copy's or set's line has only the times, the
// stream, the correlation id and a name such as "[memcpy HtoD 16]").
// ktrace_summary.py reads it.
//
// The records are flushed every KTRACE_FLUSH_MS (default 100) by a thread
// of this library, not at exit: a Go program leaves through exit_group,
// which runs no atexit handler, so the last interval can be lost (trace a
// few steps more than you need).
//
// Build on the GPU machine (the record's type is the newest the toolkit's
// CUPTI headers define; session.sh's ktrace part tries them in turn):
//
//   gcc -O2 -shared -fPIC -DKREC=CUpti_ActivityKernel10 -DMREC=CUpti_ActivityMemcpy6 \
//     -DSREC=CUpti_ActivityMemset4 -I<CUPTI include>
//     -o /tmp/ktrace.so tools/gpu/probes/ktrace.c <libcupti.so> -lpthread
//   CUDA_INJECTION64_PATH=/tmp/ktrace.so KTRACE_OUT=/tmp/k.csv .gpu/trigon bench latency ...
#include <cupti.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifndef KREC
#define KREC CUpti_ActivityKernel10
#endif
#ifndef MREC
#define MREC CUpti_ActivityMemcpy6
#endif
#ifndef SREC
#define SREC CUpti_ActivityMemset4
#endif

static const char* copy_kind(int k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    default: return "other";
  }
}

#define BUFFER_BYTES (32u << 20)

static FILE* out;
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long dropped;

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = BUFFER_BYTES;
  *buffer = (uint8_t*)aligned_alloc(8, BUFFER_BYTES);
  *max_records = 0;  // as many as fit
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
  (void)size;
  CUpti_Activity* rec = NULL;
  pthread_mutex_lock(&out_mu);
  while (buffer && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    // Copies and sets: graph and node unknown (0); the name says what
    // they were and how many bytes.
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const MREC* m = (const MREC*)rec;
      fprintf(out, "%llu,%llu,%u,0,0,%u,0,0,0,0,0,0,[memcpy %s %llu]\n", (unsigned long long)m->start,
              (unsigned long long)m->end, m->streamId, m->correlationId, copy_kind(m->copyKind),
              (unsigned long long)m->bytes);
      continue;
    }
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const SREC* m = (const SREC*)rec;
      fprintf(out, "%llu,%llu,%u,0,0,%u,0,0,0,0,0,0,[memset %llu]\n", (unsigned long long)m->start,
              (unsigned long long)m->end, m->streamId, m->correlationId, (unsigned long long)m->bytes);
      continue;
    }
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const KREC* k = (const KREC*)rec;
    fprintf(out, "%llu,%llu,%u,%u,%llu,%u,%d,%d,%d,%d,%d,%u,%s\n", (unsigned long long)k->start,
            (unsigned long long)k->end, k->streamId, k->graphId, (unsigned long long)k->graphNodeId, k->correlationId,
            k->gridX, k->gridY, k->gridZ, k->blockX, k->dynamicSharedMemory, (unsigned)k->registersPerThread,
            k->name ? k->name : "?");
  }
  size_t lost = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream, &lost) == CUPTI_SUCCESS) dropped += lost;
  fflush(out);
  pthread_mutex_unlock(&out_mu);
  free(buffer);
}

// flusher hands CUPTI's partly filled buffers to buffer_completed every
// interval, so the CSV holds all but the last interval whenever the
// program ends.
static void* flusher(void* arg) {
  long ms = (long)(intptr_t)arg;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  for (;;) {
    nanosleep(&ts, NULL);
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&out_mu);
    if (dropped) {
      fprintf(stderr, "ktrace: %llu kernel records dropped so far\n", dropped);
      dropped = 0;
    }
    pthread_mutex_unlock(&out_mu);
  }
  return NULL;
}

// InitializeInjection is the entry point the CUDA driver calls once it has
// loaded this library (CUDA_INJECTION64_PATH). Returning 0 reports failure.
int InitializeInjection(void) {
  const char* path = getenv("KTRACE_OUT");
  out = fopen(path && *path ? path : "ktrace.csv", "w");
  if (!out) {
    perror("ktrace: KTRACE_OUT");
    return 0;
  }
  fprintf(out, "start_ns,end_ns,stream,graph,graph_node,correlation,grid_x,grid_y,grid_z,block_x,dyn_smem,regs,name\n");
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS) {
    fprintf(stderr, "ktrace: CUPTI refused the kernel activity records\n");
    return 0;
  }
  const char* every = getenv("KTRACE_FLUSH_MS");
  long ms = every ? atol(every) : 100;
  pthread_t t;
  if (pthread_create(&t, NULL, flusher, (void*)(intptr_t)(ms > 0 ? ms : 100)) != 0) {
    fprintf(stderr, "ktrace: no flush thread\n");
    return 0;
  }
  pthread_detach(t);
  fprintf(stderr, "ktrace: tracing kernels into %s\n", path && *path ? path : "ktrace.csv");
  return 1;
}
