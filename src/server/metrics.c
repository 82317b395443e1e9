/* /metrics in Prometheus' text format (version 0.0.4). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

static const char *const route_names[ROUTE_N] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics",
                                                 "other"};

void srv_metrics_request(server *S, int route, int status) {
    if (route < 0 || route >= ROUTE_N || status < 100 || status >= 600) return;
    pthread_mutex_lock(&S->mu);
    S->met.status_count[route][status]++;
    pthread_mutex_unlock(&S->mu);
}

typedef struct out {
    char *p;
    size_t n, cap;
} out;

static void emit(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(out *o, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        const int n = vsnprintf(o->p ? o->p + o->n : NULL, o->p ? o->cap - o->n : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (o->p && o->n + (size_t)n < o->cap) {
            o->n += (size_t)n;
            return;
        }
        size_t cap = o->cap ? o->cap * 2 : 4096;
        while (cap < o->n + (size_t)n + 1) cap *= 2;
        char *p = realloc(o->p, cap);
        if (!p) return;
        o->p = p;
        o->cap = cap;
    }
}

static void metric(out *o, const char *name, const char *type, const char *help) {
    emit(o, "# HELP kdt_%s %s\n# TYPE kdt_%s %s\n", name, help, name, type);
}

char *srv_metrics_text(server *S) {
    out o = {0};
    pthread_mutex_lock(&S->mu);
    const srv_metrics *m = &S->met;
    metric(&o, "requests_total", "counter", "HTTP requests answered, by route and status.");
    for (int r = 0; r < ROUTE_N; r++)
        for (int st = 100; st < 600; st++)
            if (m->status_count[r][st])
                emit(&o, "kdt_requests_total{route=\"%s\",status=\"%d\"} %lld\n", route_names[r], st, m->status_count[r][st]);
    metric(&o, "prompt_tokens_total", "counter", "Prompt tokens of the requests admitted.");
    emit(&o, "kdt_prompt_tokens_total %lld\n", m->prompt_tokens);
    metric(&o, "generated_tokens_total", "counter", "Tokens generated.");
    emit(&o, "kdt_generated_tokens_total %lld\n", m->generated_tokens);
    metric(&o, "cancelled_total", "counter", "Requests cancelled while running (client gone, stop string).");
    emit(&o, "kdt_cancelled_total %lld\n", m->cancelled);
    metric(&o, "tokens_per_second", "gauge", "Tokens generated per second over the last second or more of work.");
    /* Refreshed by steps; five quiet seconds mean nothing is being generated. */
    emit(&o, "kdt_tokens_per_second %.3f\n", srv_now() - m->rate_t0 > 5 ? 0.0 : m->tokens_per_s);
    metric(&o, "steps_total", "counter", "Decoding steps (speculative or plain).");
    emit(&o, "kdt_steps_total %lld\n", m->steps);
    metric(&o, "mean_accepted_length", "gauge", "Draft tokens accepted per request and step, since the start.");
    emit(&o, "kdt_mean_accepted_length %.4f\n", m->request_steps ? (double)m->accepted / (double)m->request_steps : 0.0);
    metric(&o, "batch_size", "gauge", "Requests that gained tokens in the last step.");
    emit(&o, "kdt_batch_size %d\n", m->batch);
    int running = 0;
    for (int i = 0; S->slots && i < S->o.max_batch; i++) running += S->slots[i] != NULL;
    metric(&o, "requests_running", "gauge", "Requests holding a slot.");
    emit(&o, "kdt_requests_running %d\n", running);
    metric(&o, "queue_depth", "gauge", "Requests waiting for a slot.");
    emit(&o, "kdt_queue_depth %d\n", S->queued);
    metric(&o, "cache_blocks_used", "gauge", "KV cache blocks holding rows.");
    emit(&o, "kdt_cache_blocks_used %d\n", S->blocks_used);
    metric(&o, "cache_blocks_total", "gauge", "KV cache blocks in the pool.");
    emit(&o, "kdt_cache_blocks_total %d\n", S->blocks_total);
    pthread_mutex_unlock(&S->mu);
    return o.p;
}
