/* kdt serve: an OpenAI-compatible HTTP server over the speculative loop (docs/serve.md).
 *
 * Roles, one file each: http.c (libmicrohttpd routes, auth, body limits, streaming responses),
 * request.c (request bodies into jobs, jobs into response JSON), chat.c (chat templates),
 * sched.c (the scheduler thread: owns the model and a kdt_spec_session; admits queued jobs into
 * slots, steps, publishes tokens), metrics.c (Prometheus text), serve.c (options, start, signals,
 * drain). HTTP threads never touch the model: they queue a job and wait on it. */
#pragma once

#include <pthread.h>
#include <stdint.h>

#include "kdt/spec.h"
#include "kdt/tokenizer.h"

#define SRV_MAX_STOP 4
#define SRV_ID_LEN 48

typedef enum srv_job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE } srv_job_state;

/* One completion request, shared by its HTTP connection and the scheduler (refcounted). */
typedef struct srv_job {
    /* Fixed before the job is queued. */
    int chat, stream;
    int32_t *prompt, prompt_len, max_new;
    char *stop[SRV_MAX_STOP];
    int n_stop;
    char id[SRV_ID_LEN];
    long long created;
    int fd;                     /* the client's socket, watched for a hang-up */
    kdt_spec_request req;       /* req.out [max_new]: written by the scheduler only */
    /* Guarded by server.mu. */
    srv_job_state state;
    int32_t n_ready;            /* req.out[0 .. n_ready) are published */
    int eos;                    /* ended on the model's eos (finish_reason "stop") */
    int cancelled;              /* the client left, a stop string matched, or the server drains */
    int http_status;            /* != 0: failed before its first token, with this status */
    char error[256];
    double t_queued;
    int refs;
    pthread_cond_t cv;
    struct srv_job *next;       /* in the queue */
} srv_job;

typedef struct srv_options {
    const char *model_dir, *draft_dir, *random_config, *host, *api_key, *spec;
    int port, max_batch, max_queue, ctx, depth, topk, budget, prefill_chunk;
    int gpus;                /* --gpus: ranks the experts are split over (docs/multi_gpu.md) */
    double queue_timeout, drain_timeout, io_timeout;
    long max_body;
    kdt_backend backend;
    char shipped[4096];      /* where the shipped model was looked for (no --model) */
} srv_options;

/* Counters for /metrics, guarded by server.mu. */
enum { ROUTE_COMPLETIONS, ROUTE_CHAT, ROUTE_MODELS, ROUTE_HEALTH, ROUTE_METRICS, ROUTE_OTHER, ROUTE_N };
typedef struct srv_metrics {
    long long status_count[ROUTE_N][600]; /* by exact status */
    long long prompt_tokens, generated_tokens, cancelled;
    long long steps, request_steps, accepted;
    double tokens_per_s, rate_t0;
    long long rate_tokens0;
    int batch;                          /* requests in the last step */
} srv_metrics;

typedef struct server {
    srv_options o;
    char model_name[128];
    pthread_mutex_t mu;
    pthread_cond_t sched_cv;            /* wakes the scheduler: a job arrived, one was cancelled, stop */
    /* Set by the scheduler once loaded (under mu); read-only afterwards. */
    int loaded, load_failed;
    int32_t vocab, ctx, eos;
    kdt_tokenizer *tok;                 /* NULL: token id prompts only */
    kdt_model *model, *draft;
    struct kdt_cli_ranks *ranks;        /* --gpus > 1: the other ranks' threads (cli/ranks.h) */
    kdt_drafter *drafter;
    kdt_spec_session *sess;
    /* Under mu. */
    srv_job *queue_head, *queue_tail;
    int queued, draining, stopping;
    srv_job **slots;                    /* [max_batch] */
    int32_t blocks_used, blocks_total;
    srv_metrics met;
    pthread_t sched;
} server;

/* request.c: jobs from bodies. On a bad body: returns the HTTP status (400, 404, ...) with an
 * OpenAI-style error JSON in *err (malloc'd); 0 and *out otherwise. */
int   srv_job_from_body(server *S, int chat, const char *body, size_t len, srv_job **out, char **err);
void  srv_job_unref(server *S, srv_job *j);         /* under S->mu */
char *srv_error_json(const char *message, const char *type, const char *param, const char *code);
/* The JSON of a finished job's n tokens (non-streaming), or one SSE chunk's JSON for tokens
 * [from, to) and text (may be NULL: no tokenizer); finish NULL until the last chunk (whose usage
 * counts `to` tokens). Token counts come from the connection's own snapshot, never n_ready. */
char *srv_response_json(const server *S, const srv_job *j, int32_t n, const char *text, const char *finish);
char *srv_chunk_json(const server *S, const srv_job *j, int32_t from, int32_t to, const char *text, const char *finish, int first);

/* chat.c: the prompt text of messages (a cJSON array) under the chat template tmpl (kdt_chat_render). 0, or
 * an HTTP status with *err (malloc'd JSON). */
int srv_chat_render(const char *tmpl, const void *messages, char **text, char **err);

/* sched.c */
int  srv_sched_start(server *S);
/* Queues j (refs for the scheduler taken here); 0, or 429 / 503 with *err. Under no lock. */
int  srv_enqueue(server *S, srv_job *j, char **err);
void srv_sched_stop(server *S);

/* metrics.c */
void  srv_metrics_request(server *S, int route, int status);   /* under no lock */
char *srv_metrics_text(server *S);                             /* malloc'd */

/* http.c */
struct MHD_Daemon;
struct MHD_Daemon *srv_http_start(server *S, int *port);

double srv_now(void);
