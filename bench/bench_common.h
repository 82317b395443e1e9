/* Helpers shared by the bench programs (header-only; each bench is one translation unit).
 * The portable part serves .c and .cu benches alike; the CUDA part (check macro, launch timer,
 * device report header) only .cu ones, since .c benches are also built without CUDA's headers
 * (KDT_CUDA=0). Benches, unlike the library, exit on a failed call: there is no caller to tell. */
#pragma once

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kdt/kdt.h"
#include "kdt/model.h"

#ifdef __CUDACC__
#include <cuda_runtime.h>
#define BENCH_HD __host__ __device__
#else
#define BENCH_HD
#endif

#if defined(__GNUC__)
#define BENCH_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define BENCH_PRINTF(f, a)
#endif

/* Exits 1 when a library call fails, naming the call, its status and the library's message. */
#define KCK(call)                                                                                      \
    do {                                                                                               \
        kdt_status s_ = (call);                                                                        \
        if (s_ != KDT_OK) {                                                                            \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, kdt_status_name(s_),     \
                    kdt_last_error());                                                                 \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

/* Kimi K2's per-layer dims (bench/bench_model.cu's), with the layer, expert and vocabulary counts given. */
static inline void bench_kimi_config(int layers, int experts, int vocab, kdt_model_config *cfg) {
    char json[2048];
    snprintf(json, sizeof json,
             "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"vocab_size\": %d, \"hidden_size\": 7168,"
             "\"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"num_hidden_layers\": %d, \"num_attention_heads\": 64,"
             "\"q_lora_rank\": 1536, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,"
             "\"n_routed_experts\": %d, \"n_shared_experts\": 1, \"num_experts_per_tok\": 8, \"n_group\": 1, \"topk_group\": 1,"
             "\"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"norm_topk_prob\": true, \"routed_scaling_factor\": 2.827,"
             "\"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-06, \"rope_theta\": 50000.0,"
             "\"rope_scaling\": {\"beta_fast\": 1.0, \"beta_slow\": 1.0, \"factor\": 32.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0,"
             "\"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}, \"tie_word_embeddings\": false}",
             vocab, layers, experts);
    KCK(kdt_model_config_parse(json, strlen(json), "Kimi K2 dims", cfg));
}

/* Prints to stdout and to out (the --out file, or NULL); stdout flushed so a long run shows progress. */
static inline BENCH_PRINTF(2, 3) void bench_emit(FILE *out, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    if (out) {
        va_start(ap, fmt);
        vfprintf(out, fmt, ap);
        va_end(ap);
    }
    fflush(stdout);
}

/* A CUDA bench's start: checks for a device and opens --out (out_path NULL: none). Returns 0, or
 * 1 having said why as "prog: ...". */
static inline int bench_open(const char *prog, const char *out_path, FILE **out) {
    if (!kdt_cuda_available()) {
        fprintf(stderr, "%s: no CUDA device\n", prog);
        return 1;
    }
    if (out_path && !(*out = fopen(out_path, "w"))) {
        fprintf(stderr, "%s: cannot write %s\n", prog, out_path);
        return 1;
    }
    return 0;
}

/* splitmix64's output function: a well-mixed 64-bit value of z (host and device). */
BENCH_HD static inline uint64_t bench_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* splitmix64: the next value of the stream *state. */
static inline uint64_t bench_splitmix64(uint64_t *state) { return bench_mix64(*state += 0x9E3779B97F4A7C15ull); }

static inline int bench_cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[n] (the upper one of the middle two when n is even); sorts v. */
static inline float bench_median(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_float);
    return v[n / 2];
}

/* The current UTC time, "2026-01-31 12:34:56 UTC". */
static inline void bench_date(char *buf, size_t n) {
    const time_t now = time(NULL);
    strftime(buf, n, "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
}

/* argv joined by spaces (cut at n - 1 characters). */
static inline void bench_command(char *buf, size_t n, int argc, char **argv) {
    buf[0] = '\0';
    for (int i = 0, k = 0; i < argc && k < (int)n - 1; i++)
        k += snprintf(buf + k, n - (size_t)k, "%s%s", i ? " " : "", argv[i]);
}

#ifdef __CUDACC__

/* Exits 1 when a CUDA call fails, naming the call and CUDA's message. */
#define CK(call)                                                                                       \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));     \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

/* Device copy bandwidth: 1 GiB device to device, read + written bytes, the median of 5. */
static inline double bench_copy_bw(void) {
    const size_t n = 1ull << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t[5];
    CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    for (int i = 0; i < 5; i++) {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[i], e0, e1));
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * n / (bench_median(t, 5) * 1e-3);
}

/* A report's first lines: "# title", then the GPU, the date and the command line. */
static inline void bench_report_header(FILE *out, const char *title, const cudaDeviceProp *prop, int argc, char **argv) {
    char date[64], cmd[1024];
    bench_date(date, sizeof date);
    bench_command(cmd, sizeof cmd, argc, argv);
    bench_emit(out, "# %s\n\n- GPU: %s (%d SMs)\n- date: %s\n- command: `%s`\n", title, prop->name,
               prop->multiProcessorCount, date, cmd);
}

typedef void (*bench_launch_fn)(void *ctx, cudaStream_t s);

#define BENCH_MAX_BATCHES 64

/* Median over batches (1 .. BENCH_MAX_BATCHES) of (time of iters launches of fn) / iters, in
 * microseconds, after one warm-up batch; graph != 0 captures the iters launches in a CUDA graph
 * and times the graph. */
static inline float bench_time_launches(bench_launch_fn fn, void *ctx, cudaStream_t s, int graph, int iters, int batches) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    cudaGraphExec_t exec = NULL;
    if (graph) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < iters; i++) fn(ctx, s);
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&exec, g, 0));
        CK(cudaGraphDestroy(g));
    }
    float t[BENCH_MAX_BATCHES];
    for (int k = -1; k < batches; k++) { /* k = -1 warms up */
        CK(cudaEventRecord(e0, s));
        if (graph) CK(cudaGraphLaunch(exec, s));
        else
            for (int i = 0; i < iters; i++) fn(ctx, s);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (k >= 0) t[k] = ms * 1000.0f / iters;
    }
    if (exec) CK(cudaGraphExecDestroy(exec));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return bench_median(t, batches);
}

#ifdef __cplusplus
/* Median time (us) of reps runs of fn() on the default stream, each timed with CUDA events after
 * the L2 is flushed (a 256 MB memset, allocated on first use and kept). */
template <typename F>
static inline double bench_flushed_us(F fn, int reps) {
    static void *flush = NULL;
    const size_t flush_bytes = (size_t)256 << 20;
    if (!flush) CK(cudaMalloc(&flush, flush_bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double *t = (double *)malloc(sizeof(double) * (size_t)(reps > 0 ? reps : 1));
    for (int r = 0; r < reps; r++) {
        CK(cudaMemsetAsync(flush, r & 0xFF, flush_bytes, 0));
        CK(cudaEventRecord(e0, 0));
        fn();
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t[r] = ms * 1e3;
        for (int j = r; j > 0 && t[j] < t[j - 1]; j--) { /* insertion sort as they come */
            const double x = t[j];
            t[j] = t[j - 1], t[j - 1] = x;
        }
    }
    const double med = reps > 0 ? t[reps / 2] : 0.0;
    free(t);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return med;
}
#endif

#endif /* __CUDACC__ */
