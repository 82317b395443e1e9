/* Pipelined plain decoding (src/spec/decode.c: the next forward queued before the host reads this
 * one's token) against greedy decoding through the model API alone (greedy_ref.c) and against the
 * unpipelined loop (sync_timing), token for token: a batch with different prompts and max_new; eos
 * at the first token, at the first decoded one, at max_new and where the forward run ahead opens a
 * new cache block (the cache must end as plain greedy's, block for block); a session whose requests
 * join while a forward is in flight and leave before they end; KDT_SPEC_PROFILE's timing. On the
 * CPU (the same steps, run synchronously) always; on CUDA (the built-in model in f32) where a
 * device is present, against the unpipelined loop on the same device (the same forwards, bit for
 * bit) and the model API's greedy where the batch is one request. KDT_SEED replays the prompts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "greedy_ref.h"
#include "harness.h"
#include "kdt/spec.h"

#define B 3
#define NP (B + 4)  /* the batch's prompts, then four of 60 .. 63 tokens: their run-ahead rows reach row 64 */
#define MAXP 64
#define NEW 64
#define POISON (-7)

static uint64_t rng_state;

static int32_t rnd_below(int32_t n) { return (int32_t)(kt_splitmix64(&rng_state) % (uint64_t)n); }

typedef struct prompts {
    int32_t P[NP], tok[NP][MAXP];
    int32_t ref[NP][MAXP + NEW];   /* prompt, then the reference's NEW greedy tokens */
} prompts;

static const char *be_name(kdt_backend be) { return be == KDT_BACKEND_CUDA ? "cuda" : "cpu"; }

/* n_out tokens of out equal the reference's first n_out, and n_out is what eos and max_new make of it. */
static int same_as_ref(const prompts *pp, int32_t b, const kdt_spec_request *r, int32_t eos, char *msg, size_t cap) {
    const int32_t *ref = pp->ref[b] + pp->P[b];
    int32_t want = r->max_new;
    for (int32_t i = 0; i < r->max_new; i++)
        if (ref[i] == eos) {
            want = i + 1;
            break;
        }
    if (r->n_out != want) return snprintf(msg, cap, "request %d: %d tokens, want %d", b, r->n_out, want), 0;
    for (int32_t i = 0; i < want; i++)
        if (r->out[i] != ref[i]) return snprintf(msg, cap, "request %d: token %d is %d, want %d", b, i, r->out[i], ref[i]), 0;
    return 1;
}

/* Whether request b's reference token k occurs first there (so that as eos it ends the request at k). */
static int first_time(const prompts *pp, int32_t b, int32_t k) {
    const int32_t *ref = pp->ref[b] + pp->P[b];
    for (int32_t i = 0; i < k; i++)
        if (ref[i] == ref[k]) return 0;
    return 1;
}

/* kdt_spec_generate over requests [n] of pp (max_new[b]), pipelined or not; outs poisoned first. */
static kdt_status generate(kdt_model *m, const prompts *pp, int32_t n, const int32_t *max_new, int32_t eos, int sync,
                           int32_t (*outs)[NEW], kdt_spec_request *req, kdt_spec_stats *st) {
    for (int32_t b = 0; b < n; b++) {
        for (int32_t i = 0; i < NEW; i++) outs[b][i] = POISON;
        req[b] = (kdt_spec_request){.prompt = pp->tok[b], .prompt_len = pp->P[b], .max_new = max_new[b], .out = outs[b]};
    }
    const kdt_spec_params p = {.eos = eos, .sync_timing = sync};
    return kdt_spec_generate(m, NULL, &p, n, req, st, NULL);
}

/* A batch of B requests, eos off: pipelined equals the unpipelined loop and, where cmp_ref, the reference. */
static void check_batch(kdt_model *m, kdt_backend be, const prompts *pp, int cmp_ref) {
    const int32_t max_new[B] = {NEW, NEW - 7, 5};
    int32_t got[B][NEW], want[B][NEW];
    kdt_spec_request rg[B], rw[B];
    kdt_spec_stats st;
    char msg[200] = "";
    kdt_status s = generate(m, pp, B, max_new, -1, 0, got, rg, &st);
    if (s == KDT_OK) s = generate(m, pp, B, max_new, -1, 1, want, rw, NULL);
    if (s != KDT_OK) {
        kt_fail("pipelined plain decoding [%s] batch of %d: %s", be_name(be), B, kdt_last_error());
        return;
    }
    int ok = st.tokens == NEW + NEW - 7 + 5;
    for (int32_t b = 0; b < B && ok; b++) {
        ok = rg[b].n_out == rw[b].n_out && !memcmp(got[b], want[b], (size_t)rg[b].n_out * sizeof **got);
        if (!ok) snprintf(msg, sizeof msg, "request %d differs from the unpipelined loop", b);
        else if (cmp_ref) ok = same_as_ref(pp, b, &rg[b], -1, msg, sizeof msg);
    }
    kt_check(ok, "pipelined plain decoding [%s] batch of %d (max_new %d, %d, %d): equals the unpipelined loop%s; %lld tokens %s",
             be_name(be), B, max_new[0], max_new[1], max_new[2], cmp_ref ? " and greedy through the model API" : "",
             (long long)st.tokens, msg);
}

/* One request in a session until it ends: its outputs and the cache blocks it holds then. */
static kdt_status session_run(kdt_model *m, const prompts *pp, int32_t b, int32_t max_new, int32_t eos, int sync,
                              kdt_spec_request *r, int32_t *out, int32_t *blocks) {
    for (int32_t i = 0; i < NEW; i++) out[i] = POISON;
    *r = (kdt_spec_request){.prompt = pp->tok[b], .prompt_len = pp->P[b], .max_new = max_new, .out = out};
    const kdt_spec_params p = {.eos = eos, .sync_timing = sync};
    kdt_spec_session *S = NULL;
    kdt_status s = kdt_spec_session_create(m, NULL, &p, 1, pp->P[b] + max_new, 0, NULL, &S);
    if (s == KDT_OK) s = kdt_spec_session_add(S, 0, r);
    while (s == KDT_OK && kdt_spec_session_pending(S) > 0) s = kdt_spec_session_step(S, NULL);
    int32_t reserved = 0, total = 0;
    if (S) kdt_spec_session_blocks(S, blocks, &reserved, &total);
    kdt_spec_session_free(S);
    return s;
}

/* eos at token k of request b's reference (the first occurrence of that token ends it): outputs
 * as the reference's, and the cache blocks held at the end as the unpipelined loop's and as P + k
 * rows need (the history without its last token). */
static void check_eos(kdt_model *m, kdt_backend be, const prompts *pp, int32_t b, int32_t k, int32_t max_new, const char *what) {
    const int32_t eos = pp->ref[b][pp->P[b] + k];
    kdt_spec_request rg, rw;
    int32_t got[NEW], want[NEW], bg = -1, bw = -1;
    char msg[200] = "";
    kdt_status s = session_run(m, pp, b, max_new, eos, 0, &rg, got, &bg);
    if (s == KDT_OK) s = session_run(m, pp, b, max_new, eos, 1, &rw, want, &bw);
    if (s != KDT_OK) {
        kt_fail("pipelined plain decoding [%s] eos %s: %s", be_name(be), what, kdt_last_error());
        return;
    }
    int ok = same_as_ref(pp, b, &rg, eos, msg, sizeof msg) && same_as_ref(pp, b, &rw, eos, msg, sizeof msg);
    const int32_t rows = pp->P[b] + rg.n_out - 1, need = (rows + KDT_CACHE_BLOCK - 1) / KDT_CACHE_BLOCK;
    if (ok && (bg != bw || bg != need))
        ok = 0, snprintf(msg, sizeof msg, "cache blocks held %d, unpipelined %d, %d rows need %d", bg, bw, rows, need);
    kt_check(ok, "pipelined plain decoding [%s] eos %s (prompt %d, token %d, max_new %d): %d tokens as greedy's, %d cache blocks %s",
             be_name(be), what, pp->P[b], k, max_new, rg.n_out, bg, msg);
}

/* A session of B slots: requests 0 and 1 start, 2 joins at step 3 (its prefill queued behind a
 * forward in flight), 1 leaves at step 6 before it ends (the forward in flight holds its next row);
 * 0 and 2 run to their end. 0's and 2's outputs equal the unpipelined schedule's (and, where
 * cmp_ref, greedy's); 1 has more tokens when it leaves (the pipelined steps read one more forward
 * at the step 2 joins), which agree with the unpipelined ones; the cache blocks held at the end
 * are the same. */
static int session_schedule(kdt_model *m, const prompts *pp, int sync, int32_t (*out)[NEW], kdt_spec_request *r, int32_t *blocks) {
    const kdt_spec_params p = {.eos = -1, .sync_timing = sync};
    kdt_spec_session *S = NULL;
    kdt_status s = kdt_spec_session_create(m, NULL, &p, B, MAXP + NEW, 0, NULL, &S);
    for (int32_t b = 0; b < B; b++) {
        for (int32_t i = 0; i < NEW; i++) out[b][i] = POISON;
        r[b] = (kdt_spec_request){.prompt = pp->tok[b], .prompt_len = pp->P[b], .max_new = NEW - 10 * b, .out = out[b]};
    }
    for (int32_t b = 0; s == KDT_OK && b < 2; b++) s = kdt_spec_session_add(S, b, &r[b]);
    for (int32_t step = 0; s == KDT_OK && (step < 7 || kdt_spec_session_pending(S) > 0); step++) {
        if (step == 3) s = kdt_spec_session_add(S, 2, &r[2]);
        if (step == 6 && s == KDT_OK) s = kdt_spec_session_remove(S, 1);
        if (s == KDT_OK) s = kdt_spec_session_step(S, NULL);
    }
    int32_t reserved = 0, total = 0;
    if (S) kdt_spec_session_blocks(S, blocks, &reserved, &total);
    kdt_spec_session_free(S);
    return s == KDT_OK;
}

static void check_session(kdt_model *m, kdt_backend be, const prompts *pp, int cmp_ref) {
    int32_t got[B][NEW], want[B][NEW], bg = -1, bw = -1;
    kdt_spec_request rg[B], rw[B];
    char msg[200] = "";
    if (!session_schedule(m, pp, 0, got, rg, &bg) || !session_schedule(m, pp, 1, want, rw, &bw)) {
        kt_fail("pipelined plain decoding [%s] session: %s", be_name(be), kdt_last_error());
        return;
    }
    int ok = bg == bw && rg[1].n_out < rg[1].max_new && rw[1].n_out <= rg[1].n_out;
    if (!ok) snprintf(msg, sizeof msg, "blocks %d / %d, request 1 has %d / %d tokens", bg, bw, rg[1].n_out, rw[1].n_out);
    for (int32_t b = 0; b < B && ok; b++) {
        ok = (b == 1 || rg[b].n_out == rw[b].n_out) && !memcmp(got[b], want[b], (size_t)rw[b].n_out * sizeof **got);
        if (!ok) snprintf(msg, sizeof msg, "request %d differs from the unpipelined schedule", b);
        for (int32_t i = 0; ok && cmp_ref && i < rg[b].n_out; i++)
            if (got[b][i] != pp->ref[b][pp->P[b] + i]) ok = 0, snprintf(msg, sizeof msg, "request %d token %d differs from greedy's", b, i);
    }
    ok = ok && rg[0].n_out == rg[0].max_new && rg[2].n_out == rg[2].max_new;
    kt_check(ok, "pipelined plain decoding [%s] session (a request joins behind a forward in flight, one leaves before its end): "
             "outputs and %d cache blocks as the unpipelined schedule%s %s", be_name(be), bg, cmp_ref ? " and greedy" : "", msg);
}

/* KDT_SPEC_PROFILE (the loop then waits for each forward): the forwards' device time is measured,
 * and the tokens stay the same. */
static void check_profile(kdt_model *m, const prompts *pp) {
    const int32_t max_new[B] = {NEW, NEW - 7, 5};
    int32_t got[B][NEW], want[B][NEW];
    kdt_spec_request rg[B], rw[B];
    kdt_spec_stats st;
    setenv("KDT_SPEC_PROFILE", "1", 1);
    kdt_status s = generate(m, pp, B, max_new, -1, 0, got, rg, &st);
    unsetenv("KDT_SPEC_PROFILE");
    if (s == KDT_OK) s = generate(m, pp, B, max_new, -1, 0, want, rw, NULL);
    int ok = s == KDT_OK && st.t_forward_dev > 0.0 && st.t_verify > 0.0;
    for (int32_t b = 0; b < B && ok; b++) ok = rg[b].n_out == rw[b].n_out && !memcmp(got[b], want[b], (size_t)rg[b].n_out * sizeof **got);
    kt_check(ok, "pipelined plain decoding [cuda] KDT_SPEC_PROFILE: forwards' device time %.3f ms, verify %.3f ms, tokens as pipelined %s",
             1e3 * st.t_forward_dev, 1e3 * st.t_verify, s == KDT_OK ? "" : kdt_last_error());
}

static void check_backend(kdt_backend be, prompts *pp) {
    kdt_model *m = NULL;
    if (kdt_model_builtin_as(5, be, KDT_F32, &m) != KDT_OK) {
        kt_fail("pipelined plain decoding [%s]: %s", be_name(be), kdt_last_error());
        return;
    }
    for (int32_t b = 0; b < NP; b++) {
        memcpy(pp->ref[b], pp->tok[b], (size_t)pp->P[b] * sizeof **pp->ref);
        if (kt_greedy_ref(m, pp->ref[b], pp->P[b], NEW, NULL) != KDT_OK) {
            kt_fail("pipelined plain decoding [%s]: the greedy reference: %s", be_name(be), kdt_last_error());
            kdt_model_free(m);
            return;
        }
    }
    /* Batches of one request take the reference's forwards on CUDA too; larger ones other shapes. */
    const int cpu = be == KDT_BACKEND_CPU;
    check_batch(m, be, pp, cpu);
    check_eos(m, be, pp, 0, 0, NEW, "at the first token (the prefill's)");
    check_eos(m, be, pp, 0, 1, NEW, "at the first decoded token");
    check_eos(m, be, pp, 1, 20, 21, "at max_new");
    /* The forward run ahead holds the first row of a new cache block (d = 0), or the old one's last:
     * eos at token k = 64 - P + d of a long prompt, which ends the request there if the token did not
     * come earlier (greedy loops of random models repeat tokens soon; four prompts to choose from). */
    for (int32_t d = -1; d <= 0; d++) {
        int32_t b = B, k = 0;
        while (b < NP && !((k = KDT_CACHE_BLOCK - pp->P[b] + d) >= 1 && k < NEW && first_time(pp, b, k))) b++;
        if (b == NP) kt_skip("pipelined plain decoding [%s] eos at a cache block's edge: every candidate token occurs earlier", be_name(be));
        else check_eos(m, be, pp, b, k, NEW, d ? "where the forward run ahead fills a cache block" : "where the forward run ahead opens a cache block");
    }
    check_session(m, be, pp, cpu);
    if (!cpu) check_profile(m, pp);
    kdt_model_free(m);
}

int main(void) {
    const char *env = getenv("KDT_SEED");
    rng_state = env && *env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
    printf("test_spec_pipe: random seed %llu (KDT_SEED replays it)\n", (unsigned long long)rng_state);
    prompts pp;
    for (int32_t b = 0; b < NP; b++) {
        pp.P[b] = b < B ? 6 + rnd_below(8) + 12 * b : KDT_CACHE_BLOCK - 4 + (b - B);
        for (int32_t i = 0; i < pp.P[b]; i++) pp.tok[b][i] = rnd_below(512);
    }
    check_backend(KDT_BACKEND_CPU, &pp);
    if (kt_backend_usable(KDT_BACKEND_CUDA, "pipelined plain decoding")) check_backend(KDT_BACKEND_CUDA, &pp);
    return kt_exit_code();
}
