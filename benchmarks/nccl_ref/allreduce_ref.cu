// A bare NCCL all-reduce loop timed the way nccl-tests' all_reduce_perf times it: the reference that
// benchmarks/bench_allreduce_small.py measures gpumon burn against, in the same run, on a host where
// nccl-tests is not installed. No torch: the CUDA runtime and NCCL only.
//
//   allreduce_ref threads NGPUS SIZE_BYTES...   one process drives every GPU (all_reduce_perf -g NGPUS)
//   allreduce_ref procs   NGPUS SIZE_BYTES...   one process per GPU (as gpumon burn and torch run)
//
// Per size: in-place bf16 sum, 20 warm-up all-reduces, then back-to-back all-reduces for about half a
// second, wall time from before the first launch to after every stream has synchronised, divided by the
// count (nccl-tests' default, eager launches); then the same loop captured as CUDA graphs of GRAPH_OPS
// all-reduces (all_reduce_perf -G), replayed and timed the same way. busbw = size / time * 2(n-1)/n.
// Prints one JSON object per size on stdout (rank 0 in procs mode); exits non-zero on any error.
//
// Build (bench_allreduce_small.py does it): nvcc -O2 -o allreduce_ref allreduce_ref.cu -lnccl
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_GPUS 16
#define MAX_SIZES 32
#define WARMUP 20
#define GRAPH_OPS 50
#define TARGET_SECONDS 0.5

#define CUDA(call)                                                                             \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));    \
      exit(3);                                                                                 \
    }                                                                                          \
  } while (0)
#define NCCL(call)                                                                             \
  do {                                                                                         \
    ncclResult_t r_ = (call);                                                                  \
    if (r_ != ncclSuccess) {                                                                   \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_));    \
      exit(4);                                                                                 \
    }                                                                                          \
  } while (0)

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The GPUs this process drives: one (procs mode) or all (threads mode).
typedef struct {
  int count;
  int device[MAX_GPUS];
  ncclComm_t comm[MAX_GPUS];
  cudaStream_t stream[MAX_GPUS];
  void* buf[MAX_GPUS];
} Local;

static void launch(Local* l, size_t elements, int ops) {
  for (int op = 0; op < ops; op++) {
    NCCL(ncclGroupStart());
    for (int i = 0; i < l->count; i++) {
      NCCL(ncclAllReduce(l->buf[i], l->buf[i], elements, ncclBfloat16, ncclSum, l->comm[i], l->stream[i]));
    }
    NCCL(ncclGroupEnd());
  }
}

static void sync_all(Local* l) {
  for (int i = 0; i < l->count; i++) {
    CUDA(cudaSetDevice(l->device[i]));
    CUDA(cudaStreamSynchronize(l->stream[i]));
  }
}

// Every rank must run the same number of all-reduces: in procs mode the count is agreed by an
// all-reduce (max) of each rank's own estimate, carried in the first element of the buffer.
static long agree(Local* l, long mine, int procs) {
  if (!procs) return mine;
  float value = (float)mine;
  CUDA(cudaSetDevice(l->device[0]));
  float* scratch;
  CUDA(cudaMalloc(&scratch, sizeof(float)));
  CUDA(cudaMemcpy(scratch, &value, sizeof(float), cudaMemcpyHostToDevice));
  NCCL(ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclMax, l->comm[0], l->stream[0]));
  CUDA(cudaStreamSynchronize(l->stream[0]));
  CUDA(cudaMemcpy(&value, scratch, sizeof(float), cudaMemcpyDeviceToHost));
  CUDA(cudaFree(scratch));
  return (long)value;
}

static double time_eager(Local* l, size_t elements, int procs) {
  launch(l, elements, WARMUP);
  sync_all(l);
  double t = now_seconds();
  launch(l, elements, 10);
  sync_all(l);
  double each = (now_seconds() - t) / 10;
  long iters = agree(l, (long)(TARGET_SECONDS / each) > 20 ? (long)(TARGET_SECONDS / each) : 20, procs);
  sync_all(l);
  t = now_seconds();
  launch(l, elements, (int)iters);
  sync_all(l);
  return (now_seconds() - t) / iters;
}

// Returns 0 where capture is not possible (the JSON then says so).
static double time_graph(Local* l, size_t elements, int procs) {
  cudaGraphExec_t exec[MAX_GPUS];
  for (int i = 0; i < l->count; i++) {
    CUDA(cudaSetDevice(l->device[i]));
    CUDA(cudaStreamBeginCapture(l->stream[i], cudaStreamCaptureModeThreadLocal));
  }
  launch(l, elements, GRAPH_OPS);
  cudaGraph_t graph[MAX_GPUS];
  for (int i = 0; i < l->count; i++) {  // every capture ends before any instantiation (not allowed while capturing)
    CUDA(cudaSetDevice(l->device[i]));
    CUDA(cudaStreamEndCapture(l->stream[i], &graph[i]));
  }
  for (int i = 0; i < l->count; i++) {
    CUDA(cudaSetDevice(l->device[i]));
    CUDA(cudaGraphInstantiate(&exec[i], graph[i], 0));
    CUDA(cudaGraphDestroy(graph[i]));
  }
  for (int w = 0; w < 2; w++) {
    for (int i = 0; i < l->count; i++) {
      CUDA(cudaSetDevice(l->device[i]));
      CUDA(cudaGraphLaunch(exec[i], l->stream[i]));
    }
  }
  sync_all(l);
  double t = now_seconds();
  for (int i = 0; i < l->count; i++) {
    CUDA(cudaSetDevice(l->device[i]));
    CUDA(cudaGraphLaunch(exec[i], l->stream[i]));
  }
  sync_all(l);
  double each = now_seconds() - t;
  long replays = agree(l, (long)(TARGET_SECONDS / each) > 5 ? (long)(TARGET_SECONDS / each) : 5, procs);
  sync_all(l);
  t = now_seconds();
  for (long r = 0; r < replays; r++) {
    for (int i = 0; i < l->count; i++) {
      CUDA(cudaSetDevice(l->device[i]));
      CUDA(cudaGraphLaunch(exec[i], l->stream[i]));
    }
  }
  sync_all(l);
  double per_op = (now_seconds() - t) / (replays * GRAPH_OPS);
  for (int i = 0; i < l->count; i++) CUDA(cudaGraphExecDestroy(exec[i]));
  return per_op;
}

static void run_sizes(Local* l, int world, int report, int procs, int nsizes, size_t* sizes) {
  int version = 0;
  NCCL(ncclGetVersion(&version));
  size_t largest = 0;
  for (int s = 0; s < nsizes; s++) largest = sizes[s] > largest ? sizes[s] : largest;
  for (int i = 0; i < l->count; i++) {
    CUDA(cudaSetDevice(l->device[i]));
    CUDA(cudaStreamCreateWithFlags(&l->stream[i], cudaStreamNonBlocking));
    CUDA(cudaMalloc(&l->buf[i], largest));
    CUDA(cudaMemset(l->buf[i], 0, largest));
  }
  for (int s = 0; s < nsizes; s++) {
    size_t elements = sizes[s] / 2;
    double eager = time_eager(l, elements, procs);
    double graph = time_graph(l, elements, procs);
    double factor = 2.0 * (world - 1) / world;
    if (report) {
      printf("{\"mode\": \"%s\", \"gpus\": %d, \"nccl_version\": %d, \"bytes\": %zu, "
             "\"eager_seconds\": %.9f, \"eager_busbw_bytes_per_second\": %.1f, "
             "\"graph_seconds\": %.9f, \"graph_busbw_bytes_per_second\": %.1f}\n",
             procs ? "procs" : "threads", world, version, sizes[s], eager, sizes[s] / eager * factor, graph,
             sizes[s] / graph * factor);
      fflush(stdout);
    }
  }
  for (int i = 0; i < l->count; i++) {
    CUDA(cudaSetDevice(l->device[i]));
    CUDA(cudaFree(l->buf[i]));
    NCCL(ncclCommDestroy(l->comm[i]));
  }
}

static int one_rank(int rank, int world, const char* id_path, int nsizes, size_t* sizes) {
  ncclUniqueId id;
  if (rank == 0) {
    NCCL(ncclGetUniqueId(&id));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", id_path);
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, id_path) != 0) {
      perror("writing the NCCL id");
      return 5;
    }
  } else {
    FILE* f = NULL;
    for (int tries = 0; !f && tries < 3000; tries++) {
      f = fopen(id_path, "rb");
      if (!f) usleep(10000);
    }
    if (!f || fread(&id, sizeof id, 1, f) != 1) {
      fprintf(stderr, "rank %d: no NCCL id at %s\n", rank, id_path);
      return 5;
    }
    fclose(f);
  }
  Local l;
  memset(&l, 0, sizeof l);
  l.count = 1;
  l.device[0] = rank;
  CUDA(cudaSetDevice(rank));
  NCCL(ncclCommInitRank(&l.comm[0], world, id, rank));
  run_sizes(&l, world, rank == 0, 1, nsizes, sizes);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 4 || (strcmp(argv[1], "threads") != 0 && strcmp(argv[1], "procs") != 0)) {
    fprintf(stderr, "usage: %s threads|procs NGPUS SIZE_BYTES...\n", argv[0]);
    return 2;
  }
  int world = atoi(argv[2]);
  int nsizes = argc - 3;
  size_t sizes[MAX_SIZES];
  if (world < 2 || world > MAX_GPUS || nsizes > MAX_SIZES) {
    fprintf(stderr, "NGPUS must be 2..%d and at most %d sizes\n", MAX_GPUS, MAX_SIZES);
    return 2;
  }
  for (int s = 0; s < nsizes; s++) sizes[s] = strtoull(argv[3 + s], NULL, 10);
  if (strcmp(argv[1], "threads") == 0) {
    Local l;
    memset(&l, 0, sizeof l);
    l.count = world;
    for (int i = 0; i < world; i++) l.device[i] = i;
    NCCL(ncclCommInitAll(l.comm, world, l.device));
    run_sizes(&l, world, 1, 0, nsizes, sizes);
    return 0;
  }
  // procs: fork before any CUDA call; rank 0 writes the NCCL id to a file the others read.
  char id_path[4096];
  snprintf(id_path, sizeof id_path, "/tmp/allreduce_ref.%d.id", (int)getpid());
  unlink(id_path);
  pid_t child[MAX_GPUS];
  for (int rank = 0; rank < world; rank++) {
    child[rank] = fork();
    if (child[rank] < 0) {
      perror("fork");
      return 5;
    }
    if (child[rank] == 0) _exit(one_rank(rank, world, id_path, nsizes, sizes));
  }
  int failed = 0;
  for (int rank = 0; rank < world; rank++) {
    int status = 0;
    waitpid(child[rank], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  unlink(id_path);
  return failed ? 6 : 0;
}
