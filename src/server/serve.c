/* kdt serve (docs/interfaces.md section 3): options, then the HTTP daemon and the scheduler; the main thread
 * waits for SIGTERM / SIGINT, then drains: no new requests, those running get drain_timeout
 * seconds to finish, the rest are cancelled, and the process exits 0. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <microhttpd.h>

#include "cli/generate_text.h"
#include "cli/options.h"
#include "cli/ranks.h"
#include "server/server.h"

int kdt_cmd_serve(int argc, char **argv);

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define USAGE                                                                                                   \
    "usage: kdt serve [--model DIR] [--host 127.0.0.1] [--port 8000] [--backend cpu|cuda]\n"                    \
    "                 [--spec none|lookup|model] [--depth D] [--topk K] [--budget N] [--draft-model DIR]\n"     \
    "                 [--api-key KEY] [--max-batch N] [--max-queue N] [--ctx N] [--prefill-chunk N]\n"          \
    "                 [--queue-timeout S] [--drain-timeout S] [--timeout S] [--max-body BYTES]\n"               \
    "                 [--random-config CONFIG.json] [--gpus N]\n"                                               \
    "  An OpenAI-compatible HTTP server (docs/serve.md): POST /v1/completions, /v1/chat/completions,\n"         \
    "  GET /v1/models, /health, /metrics. Without --model, the shipped model (models/kdt-small);\n"             \
    "  --model builtin: the built-in random model (token id prompts).\n"             \
    "  --port 0 picks a free port; the line `listening on http://HOST:PORT` on stderr names it.\n"              \
    "  --max-batch: requests decoded together (slots, default 32); --max-queue: requests waiting for\n"       \
    "  a slot (default 256; past it 429); --queue-timeout: the longest wait for a slot and cache (default\n"     \
    "  60 s; then 503); --ctx: the longest prompt + max_tokens (default the model's, at most 4096);\n"          \
    "  --prefill-chunk: prompt rows per step over all requests (default 512); --timeout: seconds a\n"           \
    "  connection may sit idle or half-sent (default 15); --max-body: request bytes (default 1 MiB, then\n"     \
    "  413); --drain-timeout: seconds requests get to finish after SIGTERM (default 10).\n"                   \
    "  --random-config: instead of --model, that config's model with random bf16 weights on the GPU\n"        \
    "  (load tests at real dims; served as `random`).\n"                                                       \
    "  --gpus N: the model's routed experts split over N ranks, one thread each (docs/multi_gpu.md): N GPUs\n" \
    "  on cuda (one GPU only so far), threads on cpu; the same completions as one.\n"

static int usage_error(const char *msg, const char *arg) { return kdt_cli_usage_error("serve", USAGE, msg, arg); }

static int parse_num(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

static int parse_opts(int argc, char **argv, srv_options *o) {
    *o = (srv_options){.host = "127.0.0.1", .port = 8000, .spec = "none", .max_batch = 32, .max_queue = 256, .depth = 4,
                       .topk = 4, .budget = 16, .prefill_chunk = 512, .queue_timeout = 60, .drain_timeout = 10, .io_timeout = 15,
                       .max_body = 1 << 20, .backend = (kdt_backend)-1, .gpus = 1};
    for (int i = 0; i < argc; i++) {
        const char *a, *v;
        const int done = kdt_cli_next_option("serve", USAGE, argc, argv, &i, &a, &v);
        if (done >= 0) return done;
        double x = 0;
        struct { const char *name; double lo, hi; } const num[] = {
            {"--port", 0, 65535}, {"--max-batch", 1, 1024}, {"--max-queue", 0, 1 << 20}, {"--ctx", 2, 1 << 24},
            {"--depth", 1, 64}, {"--topk", 1, 64}, {"--budget", 1, 1024}, {"--prefill-chunk", 0, 1 << 24},
            {"--queue-timeout", 0, 86400}, {"--drain-timeout", 0, 86400}, {"--timeout", 1, 86400}, {"--max-body", 64, 1 << 30}};
        int k = -1;
        for (int n = 0; n < (int)(sizeof num / sizeof *num); n++)
            if (strcmp(a, num[n].name) == 0) k = n;
        if (k >= 0) {
            if (parse_num(v, num[k].lo, num[k].hi, &x)) {
                fprintf(stderr, "kdt serve: %s takes a number in %g .. %g, not %s\n", a, num[k].lo, num[k].hi, v);
                return 2;
            }
            const int integral = k < 8 || k == 11;
            if (integral && x != (double)(long)x) return usage_error("an integer is needed, not", v);
            switch (k) {
            case 0: o->port = (int)x; break;
            case 1: o->max_batch = (int)x; break;
            case 2: o->max_queue = (int)x; break;
            case 3: o->ctx = (int)x; break;
            case 4: o->depth = (int)x; break;
            case 5: o->topk = (int)x; break;
            case 6: o->budget = (int)x; break;
            case 7: o->prefill_chunk = (int)x; break;
            case 8: o->queue_timeout = x; break;
            case 9: o->drain_timeout = x; break;
            case 10: o->io_timeout = x; break;
            default: o->max_body = (long)x; break;
            }
        } else if (strcmp(a, "--model") == 0) o->model_dir = v;
        else if (strcmp(a, "--random-config") == 0) o->random_config = v;
        else if (strcmp(a, "--gpus") == 0) {
            if (kdt_cli_gpus("serve", USAGE, v, &o->gpus)) return 2;
        } else if (strcmp(a, "--draft-model") == 0) o->draft_dir = v;
        else if (strcmp(a, "--host") == 0) o->host = v;
        else if (strcmp(a, "--api-key") == 0) o->api_key = v;
        else if (strcmp(a, "--backend") == 0) {
            if (kdt_cli_backend("serve", USAGE, v, &o->backend)) return 2;
        } else if (strcmp(a, "--spec") == 0) {
            if (strcmp(v, "none") && strcmp(v, "lookup") && strcmp(v, "model")) return usage_error("--spec takes none, lookup or model, not", v);
            o->spec = v;
        } else {
            return usage_error("unknown option", a);
        }
    }
    if (o->draft_dir && strcmp(o->spec, "model") != 0) return usage_error("--draft-model needs --spec model", NULL);
    if ((int)o->backend < 0) o->backend = kdt_cuda_available() ? KDT_BACKEND_CUDA : KDT_BACKEND_CPU; /* starts CUDA: not for --help */
    if (o->random_config && o->gpus > 1) return usage_error("--random-config runs on one GPU (--gpus 1)", NULL);
    if (o->random_config && (o->model_dir || o->backend != KDT_BACKEND_CUDA))
        return usage_error("--random-config takes the place of --model and needs --backend cuda", NULL);
    /* As kdt generate: no --model is the shipped model, --model builtin the built-in random one. */
    if (o->model_dir && strcmp(o->model_dir, "builtin") == 0) o->model_dir = NULL;
    else if (!o->model_dir && !o->random_config && !(o->model_dir = kdt_cli_shipped_model(o->shipped, sizeof o->shipped)))
        fprintf(stderr, "kdt serve: no shipped model at %s; serving the built-in random model (--model builtin)\n", o->shipped);
    return -1;
}

/* The name clients give as "model": the folder's last component. */
static void name_model(server *S) {
    const char *d = S->o.model_dir;
    if (!d) {
        snprintf(S->model_name, sizeof S->model_name, "%s", S->o.random_config ? "random" : "kdt-builtin");
        return;
    }
    size_t n = strlen(d);
    while (n > 1 && d[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && d[b - 1] != '/') b--;
    snprintf(S->model_name, sizeof S->model_name, "%.*s", (int)(n - b), d + b);
}

/* Under no lock: 1 once no job is queued or running. */
static int idle(server *S) {
    pthread_mutex_lock(&S->mu);
    int busy = S->queued;
    for (int i = 0; S->slots && i < S->o.max_batch; i++) busy += S->slots[i] != NULL;
    pthread_mutex_unlock(&S->mu);
    return !busy;
}

static void cancel_all(server *S) {
    pthread_mutex_lock(&S->mu);
    for (srv_job *j = S->queue_head; j; j = j->next) j->cancelled = 1;
    for (int i = 0; S->slots && i < S->o.max_batch; i++)
        if (S->slots[i]) S->slots[i]->cancelled = 1;
    pthread_cond_signal(&S->sched_cv);
    pthread_mutex_unlock(&S->mu);
}

int kdt_cmd_serve(int argc, char **argv) {
    server S = {0};
    int rc = parse_opts(argc, argv, &S.o);
    if (rc >= 0) return rc;
    name_model(&S);
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.sched_cv, NULL);
    /* Every thread made from here on inherits the mask: only sigwait below sees these. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    int port = 0;
    struct MHD_Daemon *d = srv_http_start(&S, &port);
    if (!d) {
        fprintf(stderr, "kdt serve: cannot listen on %s:%d\n", S.o.host, S.o.port);
        return 1;
    }
    if (srv_sched_start(&S) != 0) {
        fprintf(stderr, "kdt serve: cannot start the scheduler\n");
        MHD_stop_daemon(d);
        return 1;
    }
    fprintf(stderr, "listening on http://%s:%d\n", S.o.host, port);
    int sig = 0;
    sigwait(&sigs, &sig);
    pthread_mutex_lock(&S.mu);
    const int failed = S.load_failed;
    S.draining = 1;
    pthread_mutex_unlock(&S.mu);
    if (!failed) fprintf(stderr, "kdt serve: %s: draining (up to %.0f s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM", S.o.drain_timeout);
    const double t0 = srv_now();
    while (!failed && !idle(&S) && srv_now() - t0 < S.o.drain_timeout) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    cancel_all(&S);
    srv_sched_stop(&S);
    MHD_stop_daemon(d);
    kdt_spec_session_free(S.sess);
    kdt_drafter_free(S.drafter);
    if (S.draft != S.model) kdt_model_free(S.draft);
    kdt_model_free(S.model);
    kdt_cli_ranks_end(S.ranks);
    kdt_tokenizer_free(S.tok);
    free(S.slots);
    if (!failed) fprintf(stderr, "kdt serve: stopped\n");
    return failed ? 1 : 0;
}
