/* A timeline of any CUDA program without nsys (not installed on our GPU machine): a CUPTI injection
 * library. The CUDA driver loads it at cuInit when CUDA_INJECTION64_PATH names it and calls
 * InitializeInjection, which turns on CUPTI's activity records (kernels, including those a CUDA graph
 * launches; memcpys, memsets; runtime and driver API calls; stream and context synchronizations). At
 * exit the records are written as a Chrome trace (JSON, through cJSON), which Perfetto or
 * chrome://tracing open and bench/trace_steps.py summarises per step:
 *
 *   CUDA_INJECTION64_PATH=$PWD/build/dev/libkdt_trace.so KDT_TRACE_OUT=trace.json build/kdt generate ...
 *
 * Host events (API calls, one row per thread; synchronisation waits, one row per stream) are on pid 1
 * ("host"), device events (kernels, copies, one row per stream) on pid 0 ("gpu"); times in microseconds from the first record; args.corr ties a kernel to the API call that
 * launched it (a graph's kernels share their cudaGraphLaunch's). KDT_TRACE_MAX caps the records kept
 * (default 4,000,000; the rest are counted and dropped). A development tool: not part of the library. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cupti.h>

enum lane { LANE_KERNEL, LANE_MEMCPY, LANE_MEMSET, LANE_RUNTIME, LANE_DRIVER, LANE_SYNC };
static const char *const lane_cat[] = {"kernel", "memcpy", "memset", "runtime", "driver", "sync"};

typedef struct event {
    uint64_t start, end;
    char *name; /* owned */
    uint32_t row, corr, graph;
    uint8_t lane;
} event;

static event *g_ev;
static size_t g_n, g_cap, g_max = 4000000, g_dropped;
static const char *g_out;

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        CUptiResult r_ = (call);                                                                                       \
        if (r_ != CUPTI_SUCCESS) {                                                                                     \
            const char *m_ = "?";                                                                                      \
            cuptiGetResultString(r_, &m_);                                                                             \
            fprintf(stderr, "kdt_trace: %s failed: %s; no trace\n", #call, m_);                                        \
            return 0;                                                                                                  \
        }                                                                                                              \
    } while (0)

static void push(uint8_t lane, const char *name, uint64_t start, uint64_t end, uint32_t row, uint32_t corr,
                 uint32_t graph) {
    if (g_n == g_max) {
        g_dropped++;
        return;
    }
    if (g_n == g_cap) {
        size_t cap = g_cap ? 2 * g_cap : 65536;
        event *p = realloc(g_ev, cap * sizeof *p);
        if (!p) {
            g_dropped++;
            return;
        }
        g_ev = p;
        g_cap = cap;
    }
    char *copy = strdup(name ? name : "?");
    if (!copy) {
        g_dropped++;
        return;
    }
    g_ev[g_n++] = (event){start, end, copy, row, corr, graph, lane};
}

static const char *api_name(CUpti_CallbackDomain dom, CUpti_CallbackId cbid) {
    const char *n = NULL;
    return cuptiGetCallbackName(dom, cbid, &n) == CUPTI_SUCCESS && n ? n : "api";
}

static const char *memcpy_name(uint8_t kind) {
    switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    default: return "memcpy";
    }
}

static void record(const CUpti_Activity *a) {
    switch (a->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)a;
        push(LANE_KERNEL, k->name, k->start, k->end, k->streamId, k->correlationId, k->graphId);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)a;
        push(LANE_MEMCPY, memcpy_name(m->copyKind), m->start, m->end, m->streamId, m->correlationId, m->graphId);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)a;
        push(LANE_MEMSET, "memset", m->start, m->end, m->streamId, m->correlationId, m->graphId);
        break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
        const CUpti_ActivityAPI *p = (const CUpti_ActivityAPI *)a;
        const int rt = a->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
        push(rt ? LANE_RUNTIME : LANE_DRIVER,
             api_name(rt ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, p->cbid), p->start, p->end,
             p->threadId, p->correlationId, 0);
        break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
        const CUpti_ActivitySynchronization2 *s = (const CUpti_ActivitySynchronization2 *)a;
        static const char *const names[] = {"sync unknown", "sync event", "sync stream wait event", "sync stream",
                                            "sync context"};
        const unsigned t = (unsigned)s->type;
        push(LANE_SYNC, t < 5 ? names[t] : "sync", s->start, s->end, s->streamId, s->correlationId, 0);
        break;
    }
    default: break;
    }
}

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    enum { SIZE = 8 << 20 };
    *buf = aligned_alloc(8, SIZE);
    *size = *buf ? SIZE : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *a = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &a) == CUPTI_SUCCESS) record(a);
    free(buf);
}

static cJSON *add_event(cJSON *arr, const char *name, const char *cat, const char *ph, double ts, double dur, int pid,
                        double tid) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", name);
    if (cat) cJSON_AddStringToObject(e, "cat", cat);
    cJSON_AddStringToObject(e, "ph", ph);
    cJSON_AddNumberToObject(e, "ts", ts);
    if (dur >= 0) cJSON_AddNumberToObject(e, "dur", dur);
    cJSON_AddNumberToObject(e, "pid", pid);
    cJSON_AddNumberToObject(e, "tid", tid);
    cJSON_AddItemToArray(arr, e);
    return e;
}

static int write_trace(void) {
    uint64_t t0 = UINT64_MAX;
    for (size_t i = 0; i < g_n; i++)
        if (g_ev[i].start && g_ev[i].start < t0) t0 = g_ev[i].start;
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "traceEvents");
    static const char *const pids[] = {"gpu", "host"};
    for (int p = 0; p < 2; p++)
        cJSON_AddStringToObject(cJSON_AddObjectToObject(add_event(arr, "process_name", NULL, "M", 0, -1, p, 0), "args"),
                                "name", pids[p]);
    for (size_t i = 0; i < g_n; i++) {
        const event *e = &g_ev[i];
        if (!e->start || e->end < e->start) continue;
        const int host = e->lane >= LANE_RUNTIME; /* API calls and the host's waits in synchronisations */
        cJSON *j = add_event(arr, e->name, lane_cat[e->lane], "X", (double)(e->start - t0) / 1e3,
                             (double)(e->end - e->start) / 1e3, host, (double)e->row);
        cJSON *args = cJSON_AddObjectToObject(j, "args");
        cJSON_AddNumberToObject(args, "corr", e->corr);
        if (e->graph) cJSON_AddNumberToObject(args, "graph", e->graph);
    }
    cJSON_AddNumberToObject(root, "kdt_dropped", (double)g_dropped);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) {
        fprintf(stderr, "kdt_trace: out of memory printing %zu events\n", g_n);
        return 1;
    }
    FILE *f = fopen(g_out, "w");
    int ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0) ok = 0;
    free(text);
    if (!ok) {
        fprintf(stderr, "kdt_trace: cannot write %s\n", g_out);
        return 1;
    }
    fprintf(stderr, "kdt_trace: %zu events (%zu dropped) -> %s\n", g_n, g_dropped, g_out);
    return 0;
}

static void at_exit(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    write_trace();
    for (size_t i = 0; i < g_n; i++) free(g_ev[i].name);
    free(g_ev);
}

__attribute__((visibility("default"))) int InitializeInjection(void) {
    g_out = getenv("KDT_TRACE_OUT");
    if (!g_out || !*g_out) g_out = "kdt_trace.json";
    const char *mx = getenv("KDT_TRACE_MAX");
    if (mx && atoll(mx) > 0) g_max = (size_t)atoll(mx);
    CK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                               CUPTI_ACTIVITY_KIND_MEMSET,            CUPTI_ACTIVITY_KIND_RUNTIME,
                                               CUPTI_ACTIVITY_KIND_DRIVER,            CUPTI_ACTIVITY_KIND_SYNCHRONIZATION};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) CK(cuptiActivityEnable(kinds[i]));
    if (atexit(at_exit) != 0) {
        fprintf(stderr, "kdt_trace: atexit failed; no trace\n");
        return 0;
    }
    return 1;
}
