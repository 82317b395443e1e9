/* The scheduler thread: loads the model, then owns it and the session. Between steps it drops
 * cancelled jobs (their slots and cache blocks free at once), admits queued jobs in arrival order
 * while a slot and the cache reservation allow, fails those that waited past the queue timeout
 * (503), runs one step unlocked, then publishes each job's new tokens and wakes its connection. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/internal.h"
#include "model/internal.h"
#include "cli/ranks.h"
#include "server/server.h"

#define BUILTIN_SEED 0x4B44542D4B324DULL /* the built-in model of `kdt generate` without --model */

static void job_fail(srv_job *j, int status, const char *msg) {
    j->http_status = status;
    snprintf(j->error, sizeof j->error, "%s", msg);
    j->state = JOB_DONE;
    pthread_cond_broadcast(&j->cv);
}

/* --random-config: a config.json's model with random weights on the device, for load tests at
 * real dims without a checkpoint. */
static kdt_status load_random(const char *path, kdt_model **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return kdt_fail(KDT_ERR_IO, "--random-config %s: cannot open", path);
    char text[65536];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    kdt_model_config cfg;
    kdt_status s = kdt_model_config_parse(text, n, path, &cfg);
    return s == KDT_OK ? kdt_model_random_cuda(&cfg, BUILTIN_SEED, KDT_BF16, out) : s;
}

static kdt_status load(server *S) {
    const srv_options *o = &S->o;
    kdt_status s = o->random_config ? load_random(o->random_config, &S->model)
                                    : kdt_cli_load_model(o->model_dir, BUILTIN_SEED, o->backend, o->gpus, &S->model, &S->ranks);
    if (s != KDT_OK) return s;
    const kdt_model_config *cf = kdt_model_get_config(S->model);
    if (o->model_dir && kdt_tokenizer_load(o->model_dir, &S->tok) != KDT_OK) {
        fprintf(stderr, "kdt serve: %s: no tokenizer (%s); token id prompts only\n", o->model_dir, kdt_last_error());
        S->tok = NULL;
    }
    if (strcmp(o->spec, "lookup") == 0) s = kdt_drafter_lookup(&S->drafter);
    else if (strcmp(o->spec, "model") == 0) {
        if (o->draft_dir) s = kdt_model_load(o->draft_dir, o->backend, &S->draft);
        else S->draft = S->model; /* the target itself: the upper bound of acceptance */
        if (s == KDT_OK) s = kdt_drafter_model(S->draft, &S->drafter);
    }
    if (s != KDT_OK) return s;
    const int32_t ctx = o->ctx > 0 ? o->ctx : cf->max_position_embeddings < 4096 ? cf->max_position_embeddings : 4096;
    const kdt_spec_params p = {.depth = o->depth, .topk = o->topk, .budget = o->budget, .prefill_chunk = o->prefill_chunk,
                               .eos = S->tok ? kdt_tokenizer_eos_id(S->tok) : -1, .pad_tree = o->backend == KDT_BACKEND_CUDA};
    if ((s = kdt_spec_session_create(S->model, S->drafter, &p, o->max_batch, ctx, 0, NULL, &S->sess)) != KDT_OK) return s;
    pthread_mutex_lock(&S->mu);
    S->vocab = cf->vocab_size;
    S->ctx = ctx;
    S->eos = p.eos;
    int32_t reserved;
    kdt_spec_session_blocks(S->sess, &S->blocks_used, &reserved, &S->blocks_total);
    S->loaded = 1;
    pthread_mutex_unlock(&S->mu);
    fprintf(stderr, "kdt serve: %s loaded: %d layers, vocab %d, context %d, %d slots, %d cache blocks, spec %s%s\n",
            S->model_name, cf->num_hidden_layers, cf->vocab_size, ctx, o->max_batch, S->blocks_total, o->spec,
            S->tok ? ", tokenizer" : "");
    return KDT_OK;
}

static int free_slot(const server *S) {
    for (int i = 0; i < S->o.max_batch; i++)
        if (!S->slots[i]) return i;
    return -1;
}

static void leave(server *S, int slot) {
    kdt_spec_session_remove(S->sess, slot);
    srv_job_unref(S, S->slots[slot]);
    S->slots[slot] = NULL;
}

/* Under mu: cancellations, timeouts, admissions. Returns the jobs running. */
static int admit(server *S) {
    const double now = srv_now();
    for (int i = 0; i < S->o.max_batch; i++)
        if (S->slots[i] && S->slots[i]->cancelled) {
            S->slots[i]->state = JOB_DONE;
            pthread_cond_broadcast(&S->slots[i]->cv);
            S->met.cancelled++;
            leave(S, i);
        }
    srv_job **pp = &S->queue_head, *last = NULL;
    int blocked = 0;
    while (*pp) {
        srv_job *j = *pp;
        int slot = -1, gone = 0;
        if (j->cancelled || S->stopping) {
            gone = 1;
            job_fail(j, 503, "the request was cancelled while queued");
        } else if (now - j->t_queued > S->o.queue_timeout) {
            gone = 1;
            job_fail(j, 503, "the server is busy: the request waited too long for a slot and cache");
        } else if (!blocked && (slot = free_slot(S)) >= 0 && kdt_spec_session_fits(S->sess, j->prompt_len, j->max_new)) {
            gone = 1;
            const kdt_status s = kdt_spec_session_add(S->sess, slot, &j->req);
            if (s != KDT_OK) job_fail(j, s == KDT_ERR_UNSUPPORTED || s == KDT_ERR_INVALID_ARG ? 400 : 500, kdt_last_error());
            else {
                j->state = JOB_RUNNING;
                S->slots[slot] = j;
                j->refs++;
                S->met.prompt_tokens += j->prompt_len;
                pthread_cond_broadcast(&j->cv);
            }
        } else {
            blocked = 1; /* first come, first served: later jobs wait behind this one */
        }
        if (gone) {
            *pp = j->next;
            S->queued--;
            srv_job_unref(S, j);
        } else {
            last = j;
            pp = &j->next;
        }
    }
    S->queue_tail = last;
    int32_t reserved;
    kdt_spec_session_blocks(S->sess, &S->blocks_used, &reserved, &S->blocks_total);
    int running = 0;
    for (int i = 0; i < S->o.max_batch; i++) running += S->slots[i] != NULL;
    return running;
}

/* Under mu, after a step: new tokens out, finished jobs done and gone. */
static void publish(server *S, const int32_t *emitted) {
    int batch = 0;
    for (int i = 0; i < S->o.max_batch; i++) {
        srv_job *j = S->slots[i];
        if (!j) continue;
        batch += emitted[i] > 0 || j->n_ready < j->req.n_out;
        S->met.generated_tokens += j->req.n_out - j->n_ready;
        j->n_ready = j->req.n_out;
        if (kdt_spec_session_finished(S->sess, i)) {
            j->eos = j->n_ready > 0 && j->req.out[j->n_ready - 1] == S->eos;
            j->state = JOB_DONE;
            leave(S, i);
        }
        pthread_cond_broadcast(&j->cv);
    }
    const kdt_spec_stats *st = kdt_spec_session_stats(S->sess);
    S->met.steps = st->steps;
    S->met.request_steps = st->request_steps;
    S->met.accepted = st->accepted;
    S->met.batch = batch;
    const double now = srv_now();
    if (now - S->met.rate_t0 >= 1.0) {
        S->met.tokens_per_s = (double)(S->met.generated_tokens - S->met.rate_tokens0) / (now - S->met.rate_t0);
        S->met.rate_t0 = now;
        S->met.rate_tokens0 = S->met.generated_tokens;
    }
}

static void *sched_main(void *arg) {
    server *S = arg;
    if (load(S) != KDT_OK) {
        fprintf(stderr, "kdt serve: loading %s failed: %s\n", S->model_name, kdt_last_error());
        pthread_mutex_lock(&S->mu);
        S->load_failed = 1;
        pthread_mutex_unlock(&S->mu);
        kill(getpid(), SIGTERM); /* the main thread waits for signals; it exits 1 on load_failed */
        return NULL;
    }
    int32_t *emitted = calloc((size_t)S->o.max_batch, sizeof *emitted);
    pthread_mutex_lock(&S->mu);
    S->met.rate_t0 = srv_now();
    for (;;) {
        int running = admit(S);
        if (S->stopping && !running && !S->queue_head) break;
        if (!running) {
            /* Queued jobs that cannot run yet are checked for their timeout now and then. */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 100000000;
            if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&S->sched_cv, &S->mu, &until);
            continue;
        }
        pthread_mutex_unlock(&S->mu);
        const kdt_status s = emitted ? kdt_spec_session_step(S->sess, emitted) : KDT_ERR_NOMEM;
        pthread_mutex_lock(&S->mu);
        if (s != KDT_OK) {
            /* A failed step leaves the session unusable: fail what runs, and stop serving. */
            fprintf(stderr, "kdt serve: step failed: %s\n", kdt_last_error());
            for (int i = 0; i < S->o.max_batch; i++)
                if (S->slots[i]) {
                    job_fail(S->slots[i], 500, "the server failed while generating; see its log");
                    srv_job_unref(S, S->slots[i]);
                    S->slots[i] = NULL;
                }
            S->stopping = 1;
            S->load_failed = 1;
            pthread_mutex_unlock(&S->mu);
            kill(getpid(), SIGTERM);
            pthread_mutex_lock(&S->mu);
            continue;
        }
        publish(S, emitted);
    }
    pthread_mutex_unlock(&S->mu);
    free(emitted);
    return NULL;
}

int srv_sched_start(server *S) {
    S->slots = calloc((size_t)S->o.max_batch, sizeof *S->slots);
    return S->slots && pthread_create(&S->sched, NULL, sched_main, S) == 0 ? 0 : -1;
}

int srv_enqueue(server *S, srv_job *j, char **err) {
    pthread_mutex_lock(&S->mu);
    int st = 0;
    if (S->draining || S->stopping) {
        st = 503;
        *err = srv_error_json("the server is shutting down", "server_error", NULL, NULL);
    } else if (S->queued >= S->o.max_queue) {
        st = 429;
        *err = srv_error_json("the server is busy: the queue is full", "server_error", NULL, "queue_full");
    } else {
        j->t_queued = srv_now();
        j->state = JOB_QUEUED;
        j->refs++;
        j->next = NULL;
        if (S->queue_tail) S->queue_tail->next = j;
        else S->queue_head = j;
        S->queue_tail = j;
        S->queued++;
        pthread_cond_signal(&S->sched_cv);
    }
    pthread_mutex_unlock(&S->mu);
    return st;
}

/* Ends the thread once every job has left (the caller cancelled what must not finish). */
void srv_sched_stop(server *S) {
    pthread_mutex_lock(&S->mu);
    S->stopping = 1;
    pthread_cond_signal(&S->sched_cv);
    pthread_mutex_unlock(&S->mu);
    pthread_join(S->sched, NULL);
}
