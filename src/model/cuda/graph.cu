/* CUDA graphs of the model's forward: a small table from key to executable graph. A key is seen
 * once (run directly), then captured (thread-local capture mode: a call that is not capturable
 * fails the capture instead of running), then replayed. The table holds at most kMaxGraphs;
 * when full it starts over, which only costs captures. */
#include <cstdlib>
#include <cstring>

#include "common/cuda/cuda_common.cuh"
#include "model/cuda/graph.h"

namespace {

constexpr int kMaxGraphs = 64;

enum State { kSeen, kCaptured, kDirect };

struct Entry {
    int64_t *key;
    int32_t n_key;
    State state;
    cudaGraphExec_t exec;
};

} // namespace

struct kdt_graphs {
    Entry e[kMaxGraphs];
    int n;
    int64_t replays, captures;
    cudaEvent_t ev[2];           /* orders a direct run on the capture stream after s, and s after it */
};

namespace {

Entry *find(kdt_graphs *g, const int64_t *key, int32_t n_key) {
    for (int i = 0; i < g->n; i++)
        if (g->e[i].n_key == n_key && !memcmp(g->e[i].key, key, (size_t)n_key * sizeof *key)) return &g->e[i];
    return nullptr;
}

/* Captures body on cap into e->exec; false when anything fails (the caller then runs the work
 * directly, where a real fault shows again; kdt_last_error says why the capture failed). Capture
 * errors are not sticky. */
bool capture(Entry *e, cudaStream_t cap, kdt_graph_body body, void *arg) {
    e->exec = nullptr;
    cudaError_t eb = cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal), ee = cudaSuccess, ei = cudaSuccess;
    kdt_status s = KDT_OK;
    cudaGraph_t graph = nullptr;
    if (eb == cudaSuccess) {
        s = body(arg, cap);
        ee = cudaStreamEndCapture(cap, &graph);
        if (s == KDT_OK && ee == cudaSuccess && graph && (ei = cudaGraphInstantiate(&e->exec, graph, 0)) != cudaSuccess)
            e->exec = nullptr;
        if (graph) (void)cudaGraphDestroy(graph);
    }
    if (e->exec) return true;
    (void)cudaGetLastError();
    if (s == KDT_OK)
        (void)kdt_fail(KDT_ERR_CUDA, "forward graph not captured: begin %s, end %s, instantiate %s", cudaGetErrorString(eb),
                       cudaGetErrorString(ee), cudaGetErrorString(ei));
    return false;
}

/* A shape's first run goes on the capture stream, ordered between the caller's work on s: so the
 * libraries' one-time setup for that stream (cuBLAS's included) happens outside any capture. */
kdt_status run_on_cap(kdt_graphs *g, cudaStream_t cap, cudaStream_t s, kdt_graph_body body, void *arg) {
    for (int i = 0; i < 2; i++)
        if (!g->ev[i]) KDT_CUDA_CHECK(cudaEventCreateWithFlags(&g->ev[i], cudaEventDisableTiming));
    KDT_CUDA_CHECK(cudaEventRecord(g->ev[0], s));
    KDT_CUDA_CHECK(cudaStreamWaitEvent(cap, g->ev[0], 0));
    const kdt_status st = body(arg, cap);
    KDT_CUDA_CHECK(cudaEventRecord(g->ev[1], cap));
    KDT_CUDA_CHECK(cudaStreamWaitEvent(s, g->ev[1], 0));
    return st;
}

} // namespace

kdt_status kdt_graphs_run(kdt_graphs **gp, const int64_t *key, int32_t n_key, cudaStream_t cap, cudaStream_t s,
                          kdt_graph_body body, void *arg) {
    if (!*gp && !(*gp = (kdt_graphs *)calloc(1, sizeof(kdt_graphs)))) return kdt_fail(KDT_ERR_NOMEM, "forward: out of memory");
    kdt_graphs *g = *gp;
    Entry *e = find(g, key, n_key);
    if (!e) {
        if (g->n == kMaxGraphs) kdt_graphs_clear(g);
        e = &g->e[g->n];
        if (!(e->key = (int64_t *)malloc((size_t)n_key * sizeof *key))) return kdt_fail(KDT_ERR_NOMEM, "forward: out of memory");
        memcpy(e->key, key, (size_t)n_key * sizeof *key);
        e->n_key = n_key;
        e->state = kSeen;
        e->exec = nullptr;
        g->n++;
        return run_on_cap(g, cap, s, body, arg);
    }
    if (e->state == kSeen) {
        const bool made = capture(e, cap, body, arg);
        e->state = made ? kCaptured : kDirect;
        if (made) g->captures++;
    }
    if (e->state == kDirect) return body(arg, s);
    KDT_CUDA_CHECK(cudaGraphLaunch(e->exec, s));
    g->replays++;
    return KDT_OK;
}

void kdt_graphs_clear(kdt_graphs *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) {
        if (g->e[i].exec) (void)cudaGraphExecDestroy(g->e[i].exec);
        free(g->e[i].key);
    }
    g->n = 0;
}

void kdt_graphs_free(kdt_graphs *g) {
    kdt_graphs_clear(g);
    for (int i = 0; g && i < 2; i++)
        if (g->ev[i]) (void)cudaEventDestroy(g->ev[i]);
    free(g);
}

void kdt_graphs_counts(const kdt_graphs *g, int64_t *replays, int64_t *captures) {
    *replays = g ? g->replays : 0;
    *captures = g ? g->captures : 0;
}
