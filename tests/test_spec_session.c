/* Sessions (kdt_spec_session_*, continuous batching) against kdt_spec_generate: requests join
 * empty slots at random steps, prefill in chunks of random sizes, leave when they end or are
 * cancelled at random, and slots are reused; every request that runs to its end must give
 * exactly the tokens of kdt_spec_generate on it alone (greedy), and a cancelled one a prefix of
 * them. With no drafter, prompt lookup and the model drafter, on the built-in model (CPU), with a
 * cache of few blocks so that adds are refused and requests wait. Also: bad requests are refused
 * with the field named and change nothing, and every block comes back once the slots are empty.
 * KDT_SEED replays a run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "kdt/spec.h"

#define NREQ 12
#define SLOTS 4
#define MAX_LEN 64

static uint64_t rng_state;

static uint64_t rnd(void) { return kt_splitmix64(&rng_state); }
static int32_t rnd_below(int32_t n) { return (int32_t)(rnd() % (uint64_t)n); }

typedef struct job {
    int32_t prompt[MAX_LEN], P, max_new;
    int32_t ref[MAX_LEN], n_ref;     /* kdt_spec_generate alone */
    int32_t out[MAX_LEN];
    kdt_spec_request req;
    int32_t slot;                    /* -1: waiting or over */
    int over, cancel_at;             /* cancel_at: tokens after which it is cancelled; -1 never */
} job;

static int make_drafter(const char *kind, kdt_model *draft, kdt_drafter **dr) {
    *dr = NULL;
    if (strcmp(kind, "lookup") == 0) return kdt_drafter_lookup(dr);
    if (strcmp(kind, "model") == 0) return kdt_drafter_model(draft, dr);
    return KDT_OK;
}

/* One schedule with a fresh drafter: returns 1 when every request matched. */
static int run_schedule(kdt_model *m, kdt_model *draft, const char *kind, job *jobs, int32_t chunk, int32_t blocks, char *msg,
                        size_t cap) {
    const kdt_spec_params p = {.depth = 3, .topk = 2, .budget = 6, .eos = -1, .prefill_chunk = chunk};
    kdt_drafter *dr = NULL;
    kdt_spec_session *S = NULL;
    kdt_status s = make_drafter(kind, draft, &dr);
    if (s == KDT_OK) s = kdt_spec_session_create(m, dr, &p, SLOTS, MAX_LEN, blocks, NULL, &S);
    int ok = s == KDT_OK, refused = 0;
    for (int j = 0; j < NREQ; j++) {
        jobs[j].slot = -1;
        jobs[j].over = 0;
        jobs[j].cancel_at = rnd_below(5) == 0 ? rnd_below(jobs[j].max_new + 1) : -1;
    }
    int32_t emitted[SLOTS];
    for (int iter = 0; ok && iter < 2000; iter++) {
        int left = 0;
        for (int j = 0; j < NREQ; j++) left += !jobs[j].over;
        if (!left) break;
        /* Joins: each waiting request, in turn, takes a free slot half of the time, if it fits. */
        for (int j = 0; ok && j < NREQ; j++) {
            job *J = &jobs[j];
            if (J->over || J->slot >= 0 || rnd_below(2)) continue;
            int32_t slot = -1;
            for (int32_t t = 0; t < SLOTS && slot < 0; t++) {
                int taken = 0;
                for (int k = 0; k < NREQ; k++) taken |= jobs[k].slot == t;
                if (!taken) slot = t;
            }
            if (slot < 0) break;
            J->req = (kdt_spec_request){.prompt = J->prompt, .prompt_len = J->P, .max_new = J->max_new, .out = J->out};
            if (!kdt_spec_session_fits(S, J->P, J->max_new)) {
                if ((s = kdt_spec_session_add(S, slot, &J->req)) != KDT_ERR_NOMEM) {
                    snprintf(msg, cap, "request %d does not fit but add gave %s", j, kdt_status_name(s));
                    ok = 0;
                }
                refused++;
                continue;
            }
            if ((s = kdt_spec_session_add(S, slot, &J->req)) != KDT_OK) {
                snprintf(msg, cap, "add request %d to slot %d: %s", j, slot, kdt_last_error());
                ok = 0;
            }
            J->slot = slot;
        }
        if (!ok) break;
        if ((s = kdt_spec_session_step(S, emitted)) != KDT_OK) {
            snprintf(msg, cap, "step %d: %s", iter, kdt_last_error());
            ok = 0;
            break;
        }
        /* Leaves: finished requests are checked, cancelled ones checked as a prefix. */
        for (int j = 0; ok && j < NREQ; j++) {
            job *J = &jobs[j];
            if (J->slot < 0) continue;
            const int fin = kdt_spec_session_finished(S, J->slot);
            const int cancel = !fin && J->cancel_at >= 0 && J->req.n_out >= J->cancel_at;
            if (!fin && !cancel) continue;
            const int32_t n = J->req.n_out;
            if ((fin && n != J->n_ref) || n > J->n_ref || memcmp(J->out, J->ref, (size_t)n * sizeof *J->out) != 0) {
                int32_t i = 0;
                while (i < n && i < J->n_ref && J->out[i] == J->ref[i]) i++;
                snprintf(msg, cap, "request %d (prompt %d, max_new %d, %s): %d tokens vs %d alone, first difference at %d", j, J->P,
                         J->max_new, fin ? "finished" : "cancelled", n, J->n_ref, i);
                ok = 0;
            }
            if ((s = kdt_spec_session_remove(S, J->slot)) != KDT_OK) {
                snprintf(msg, cap, "remove slot %d: %s", J->slot, kdt_last_error());
                ok = 0;
            }
            J->slot = -1;
            J->over = 1;
        }
    }
    for (int j = 0; ok && j < NREQ; j++)
        if (!jobs[j].over) {
            snprintf(msg, cap, "request %d never ended", j);
            ok = 0;
        }
    int32_t used = -1, reserved = -1, total = 0;
    kdt_spec_session_blocks(S, &used, &reserved, &total);
    if (ok && (used != 0 || reserved != 0)) {
        snprintf(msg, cap, "every slot empty, yet %d blocks used and %d reserved of %d", used, reserved, total);
        ok = 0;
    }
    if (ok) snprintf(msg, cap, "%d requests, chunk %d, %d blocks, %d adds refused for want of cache", NREQ, chunk, total, refused);
    kdt_spec_session_free(S);
    kdt_drafter_free(dr);
    return ok;
}

/* Bad requests: refused with the field named; the session still serves. */
static void check_refusals(kdt_model *m) {
    const kdt_spec_params p = {.depth = 2, .topk = 2, .budget = 4, .eos = -1};
    kdt_spec_session *S = NULL;
    if (kdt_spec_session_create(m, NULL, &p, 2, 16, 0, NULL, &S) != KDT_OK) {
        kt_fail("session refusals: create: %s", kdt_last_error());
        return;
    }
    int32_t prompt[4] = {1, 2, 3, 4}, out[16];
    const int32_t V = kdt_model_get_config(m)->vocab_size;
    struct {
        const char *what, *field;
        kdt_spec_request r;
        kdt_status want;
    } cases[] = {
        {"empty prompt", "prompt", {.prompt = prompt, .prompt_len = 0, .max_new = 2, .out = out}, KDT_ERR_INVALID_ARG},
        {"token past the vocabulary", "vocabulary", {.prompt = (int32_t[]){1, V}, .prompt_len = 2, .max_new = 2, .out = out},
         KDT_ERR_INVALID_ARG},
        {"negative token", "vocabulary", {.prompt = (int32_t[]){-1}, .prompt_len = 1, .max_new = 2, .out = out}, KDT_ERR_INVALID_ARG},
        {"longer than the context", "context", {.prompt = prompt, .prompt_len = 4, .max_new = 13, .out = out}, KDT_ERR_INVALID_ARG},
        {"a negative temperature", "temperature", {.prompt = prompt, .prompt_len = 4, .max_new = 2, .out = out, .temperature = -0.5f},
         KDT_ERR_INVALID_ARG},
        {"a NaN temperature", "temperature", {.prompt = prompt, .prompt_len = 4, .max_new = 2, .out = out, .temperature = NAN},
         KDT_ERR_INVALID_ARG},
        {"a negative top_k", "top_k", {.prompt = prompt, .prompt_len = 4, .max_new = 2, .out = out, .temperature = 0.7f, .top_k = -1},
         KDT_ERR_INVALID_ARG},
        {"top_p above 1", "top_p", {.prompt = prompt, .prompt_len = 4, .max_new = 2, .out = out, .temperature = 0.7f, .top_p = 1.5f},
         KDT_ERR_INVALID_ARG},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const kdt_status s = kdt_spec_session_add(S, 0, &cases[i].r);
        kt_check(s == cases[i].want && strstr(kdt_last_error(), cases[i].field) != NULL, "session refuses %s: %s (%s)",
                 cases[i].what, kdt_status_name(s), kdt_last_error());
    }
    kdt_spec_request ok = {.prompt = prompt, .prompt_len = 4, .max_new = 3, .out = out};
    kdt_status s = kdt_spec_session_add(S, 0, &ok);
    kdt_spec_request again = ok;
    const kdt_status taken = s == KDT_OK ? kdt_spec_session_add(S, 0, &again) : KDT_OK;
    while (s == KDT_OK && kdt_spec_session_pending(S) > 0) s = kdt_spec_session_step(S, NULL);
    kt_check(s == KDT_OK && taken == KDT_ERR_INVALID_ARG && ok.n_out == 3,
             "session serves after the refusals and refuses a taken slot: %s, %d tokens", kdt_status_name(s), ok.n_out);
    kdt_spec_session_free(S);
    /* A pool too small for any request: add refuses, nothing crashes. */
    if (kdt_spec_session_create(m, NULL, &p, 2, 16, 1, NULL, &S) == KDT_OK) {
        kdt_spec_request big = {.prompt = prompt, .prompt_len = 4, .max_new = 12, .out = out};
        kdt_spec_request r2 = {.prompt = prompt, .prompt_len = 4, .max_new = 12, .out = out};
        const kdt_status s1 = kdt_spec_session_add(S, 0, &big);
        const kdt_status s2 = s1 == KDT_OK ? kdt_spec_session_add(S, 1, &r2) : KDT_OK;
        kt_check(s1 == KDT_OK && s2 == KDT_ERR_NOMEM && !kdt_spec_session_fits(S, 4, 12),
                 "session: a second request past a one-block cache is refused (%s): %s", kdt_status_name(s2), kdt_last_error());
        kdt_spec_session_free(S);
    }
}

int main(void) {
    const char *seed_env = getenv("KDT_SEED");
    const uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL);
    rng_state = seed;
    printf("test_spec_session: random seed %llu (KDT_SEED replays it)\n", (unsigned long long)seed);
    kdt_model *m = NULL, *other = NULL;
    if (kdt_model_builtin(7, KDT_BACKEND_CPU, &m) != KDT_OK || kdt_model_builtin(8, KDT_BACKEND_CPU, &other) != KDT_OK) {
        kt_fail("builtin model: %s", kdt_last_error());
        return kt_exit_code();
    }
    const int32_t V = kdt_model_get_config(m)->vocab_size;
    check_refusals(m);
    job *jobs = calloc(NREQ, sizeof *jobs);
    const char *kinds[] = {"none", "lookup", "model", "model"};
    for (int k = 0; k < 4; k++) {
        kdt_model *draft = k == 2 ? m : other;
        /* Prompts with repeats, so that lookup finds n-grams; the references alone. */
        int ok = 1;
        for (int j = 0; j < NREQ && ok; j++) {
            job *J = &jobs[j];
            J->P = 1 + rnd_below(30);
            J->max_new = rnd_below(MAX_LEN - J->P - 8);
            for (int32_t i = 0; i < J->P; i++) J->prompt[i] = i >= 4 && rnd_below(2) ? J->prompt[i - 4] : rnd_below(V);
            const kdt_spec_params p = {.depth = 3, .topk = 2, .budget = 6, .eos = -1};
            kdt_spec_request r = {.prompt = J->prompt, .prompt_len = J->P, .max_new = J->max_new, .out = J->ref};
            kdt_drafter *dr = NULL;
            ok = make_drafter(kinds[k], draft, &dr) == KDT_OK && kdt_spec_generate(m, dr, &p, 1, &r, NULL, NULL) == KDT_OK;
            kdt_drafter_free(dr);
            J->n_ref = r.n_out;
        }
        if (!ok) {
            kt_fail("session %s: reference: %s", kinds[k], kdt_last_error());
            continue;
        }
        const int32_t chunks[3] = {0, 1 + rnd_below(8), 16};
        for (int c = 0; c < 3; c++) {
            /* Two blocks: room for two requests at once (each needs one), the others wait. */
            const int32_t blocks = c == 1 ? 2 : 0;
            char msg[256];
            const int pass = run_schedule(m, draft, kinds[k], jobs, chunks[c], blocks, msg, sizeof msg);
            kt_check(pass, "session %s%s: %s", kinds[k], k == 3 ? " (another model)" : "", msg);
        }
    }
    free(jobs);
    kdt_model_free(other);
    kdt_model_free(m);
    return kt_exit_code();
}
