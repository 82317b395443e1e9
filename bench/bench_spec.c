/* bench_spec: the speculative loop end to end (kdt_spec_generate) on a model with Kimi K2's
 * per-layer dims and random bf16 weights: tokens/s for batch 1, 8 and 32 with plain greedy
 * decoding against each drafter at a few (D, K, N), the mean accepted length and the time per
 * step split into draft, tree build, verify forward, accept and commit.
 *
 *   build/bench/bench_spec [--out FILE] [--layers 4] [--experts 16] [--vocab 163840] [--batches 1,8,32]
 *                          [--prompt 64] [--new 96] [--f32] [--backend cuda|cpu] [--drafters oracle,lookup,model]
 *                          [--no-sync]
 *
 * The model is bench/bench_model.cu's, made by the model's device builder
 * (kdt_model_random_cuda: uniform weights, scale 1 / sqrt(fan_in), each tensor from its own
 * stream of the seed): hidden 7168, 64 heads, q_lora 1536, kv_lora 512, rope 64, nope 128, v 128,
 * a dense first layer of intermediate 18432, then MoE layers of --experts experts of 2048 with top
 * 8 and one shared expert, YaRN as Kimi K2's; here Kimi K2's own vocabulary (163840) by default,
 * since the LM head over every tree row is part of what a step costs, and 4 layers. The builder
 * makes the tensors in a fixed order, so the same seed with num_hidden_layers = 1 is the target's
 * first layer with its embedding and LM head: the "first layer" draft model. --backend cpu runs
 * the built-in model instead (a check of this program, without the first-layer rows). --drafters
 * keeps the runs of the drafters it names (the first word of each; plain greedy always runs).
 *
 * Random weights make a draft model's acceptance meaningless, so the table reads as follows:
 * - lookup: prompts are a 16-token phrase repeated; the random target falls into loops of its
 *   own, which lookup picks up. Its acceptance is what it is on this model.
 * - oracle: replays the greedy output of the same batch (known from the plain run): every draft
 *   token is right at rank 0 and drafting costs nothing, so its tokens/s is the ceiling of the
 *   loop at that (D, K, N) with a perfect, free drafter.
 * - model (itself): the target as its own draft model: every greedy chain token is right (bf16:
 *   nearly), the upper bound of a model drafter's acceptance, paying D full forwards to draft.
 * - model (first layer): the target's first layer as the draft: a real neural draft at its real
 *   cost; with random weights it guesses little.
 * Every speculative output is compared with the plain greedy output of the same batch; in bf16
 * they may part where two logits nearly tie (the verify forward and the decode forward round
 * differently), which the "= greedy" column reports. Timing: host clock; the loop synchronizes
 * after each phase (sync_timing; --no-sync: only where the loop itself waits, so the split is not
 * exact but the total is what a caller sees), a warm-up run precedes each batch size. With
 * KDT_SPEC_PROFILE=1 the last column is each step's target forward timed by CUDA events. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "common/device.h"
#include "kdt/spec.h"
#include "model/internal.h"

static FILE *g_out;

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { return bench_splitmix64(&g_rng); }

/* ---- the model ---- */

#define SEED 7

/* ---- the oracle drafter: replays the plain greedy output of the same batch ---- */

typedef struct oracle {
    kdt_draft_setup set;
    const int32_t *const *seq;  /* [slots] prompt then greedy output */
    const int32_t *seq_len;     /* [slots] */
    float *sc;
    int32_t *tk;
} oracle;

static kdt_status or_begin(void *state, const kdt_draft_setup *set) {
    oracle *o = state;
    o->set = *set;
    free(o->sc);
    free(o->tk);
    const size_t n = (size_t)set->slots * set->D * set->K;
    o->sc = malloc(n * sizeof *o->sc);
    o->tk = malloc(n * sizeof *o->tk);
    return o->sc && o->tk ? KDT_OK : KDT_ERR_NOMEM;
}

static kdt_status or_observe(void *state, const kdt_draft_ctx *ctx, const kdt_draft_feedback *fb) {
    (void)state, (void)ctx, (void)fb;
    return KDT_OK;
}

static void or_destroy(void *state) {
    oracle *o = state;
    free(o->sc);
    free(o->tk);
}

/* Rank 0: the true token (score 0); the others: decoys with scores below. Host memory on every
 * backend (host_candidates). */
static kdt_status or_propose(void *state, const kdt_draft_ctx *ctx, float *scores, int32_t *tokens) {
    oracle *o = state;
    const int32_t D = o->set.D, K = o->set.K, V = o->set.vocab_size;
    for (int32_t b = 0; b < ctx->B; b++) {
        const int32_t s = ctx->slot[b], h = ctx->hist_len[b];
        for (int32_t d = 0; d < D; d++) {
            const int32_t truth = h + d < o->seq_len[s] ? o->seq[s][h + d] : 0;
            for (int32_t k = 0; k < K; k++) {
                const size_t i = ((size_t)b * D + d) * K + k;
                o->tk[i] = k == 0 ? truth : (truth + k) % V;
                o->sc[i] = k == 0 ? 0.0f : -4.0f - (float)k;
            }
        }
    }
    const size_t n = (size_t)ctx->B * D * K;
    memcpy(scores, o->sc, n * sizeof *scores);
    memcpy(tokens, o->tk, n * sizeof *tokens);
    return KDT_OK;
}

/* ---- runs ---- */

typedef struct run {
    const char *drafter;
    int D, K, N;
} run;

typedef struct batch {
    int B, P, NEW;
    int32_t **prompt, **out, **ref, **seq;
    int32_t *seq_len;
} batch;

static double decode_time(const kdt_spec_stats *st) { return st->t_draft + st->t_tree + st->t_verify + st->t_accept + st->t_commit; }

/* One run; fills out and returns the stats. */
static int g_sync = 1;

static kdt_spec_stats run_once(kdt_model *m, kdt_drafter *dr, const run *r, batch *bt, int32_t **out) {
    kdt_spec_request *req = calloc((size_t)bt->B, sizeof *req);
    for (int b = 0; b < bt->B; b++)
        req[b] = (kdt_spec_request){.prompt = bt->prompt[b], .prompt_len = bt->P, .max_new = bt->NEW, .out = out[b]};
    const kdt_spec_params p = {.depth = r->D, .topk = r->K, .budget = r->N, .eos = -1, .pad_tree = 1, .sync_timing = g_sync};
    kdt_spec_stats st;
    KCK(kdt_spec_generate(m, dr, &p, bt->B, req, &st, NULL));
    free(req);
    return st;
}

/* Whether the comma-separated list names drafter (its first word). */
static int named(const char *list, const char *drafter) {
    const size_t n = strcspn(drafter, " ");
    for (const char *p = list; *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
        if (strcspn(p, ",") == n && !strncmp(p, drafter, n)) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *out_path = NULL, *batches_arg = "1,8,32", *drafters_arg = NULL;
    int layers = 4, experts = 16, vocab = 163840, P = 64, NEW = 96;
    kdt_backend be = KDT_BACKEND_CUDA;
    kdt_dtype dt = KDT_BF16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--f32")) { dt = KDT_F32; continue; }
        if (!strcmp(a, "--no-sync")) { g_sync = 0; continue; }
        if (!v) { fprintf(stderr, "bench_spec: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--out")) out_path = v;
        else if (!strcmp(a, "--batches")) batches_arg = v;
        else if (!strcmp(a, "--drafters")) drafters_arg = v;
        else if (!strcmp(a, "--layers")) layers = atoi(v);
        else if (!strcmp(a, "--experts")) experts = atoi(v);
        else if (!strcmp(a, "--vocab")) vocab = atoi(v);
        else if (!strcmp(a, "--prompt")) P = atoi(v);
        else if (!strcmp(a, "--new")) NEW = atoi(v);
        else if (!strcmp(a, "--backend")) be = !strcmp(v, "cpu") ? KDT_BACKEND_CPU : KDT_BACKEND_CUDA;
        else { fprintf(stderr, "bench_spec: unknown option %s\n", a); return 2; }
    }
    if (layers < 2 || experts < 8 || vocab < 1024 || P < 16 || NEW < 8) {
        fprintf(stderr, "bench_spec: need --layers >= 2, --experts >= 8, --vocab >= 1024, --prompt >= 16, --new >= 8\n");
        return 2;
    }
    if (be == KDT_BACKEND_CUDA && !kdt_cuda_available()) { fprintf(stderr, "bench_spec: no CUDA device (--backend cpu runs the built-in model)\n"); return 1; }
    if (out_path && !(g_out = fopen(out_path, "w"))) { fprintf(stderr, "bench_spec: %s: %s\n", out_path, strerror(errno)); return 1; }
    kdt_model *target = NULL, *first = NULL;
    if (be == KDT_BACKEND_CUDA) {
        kdt_model_config cfg;
        bench_kimi_config(layers, experts, vocab, &cfg);
        KCK(kdt_model_random_cuda(&cfg, SEED, dt, &target));
        cfg.num_hidden_layers = 1;
        KCK(kdt_model_random_cuda(&cfg, SEED, dt, &first));
    } else {
        KCK(kdt_model_builtin(SEED, be, &target));
    }
    const kdt_model_config *cf = kdt_model_get_config(target);
    kdt_drafter *lookup = NULL, *self = NULL, *small = NULL;
    KCK(kdt_drafter_lookup(&lookup));
    KCK(kdt_drafter_model(target, &self));
    if (first) KCK(kdt_drafter_model(first, &small));
    oracle orc = {0};
    kdt_drafter ord = {.name = "oracle", .state = &orc, .host_candidates = 1, .begin = or_begin, .propose = or_propose, .observe = or_observe,
                       .destroy = or_destroy};
    const run runs[] = {{"none", 1, 1, 1},   {"oracle", 4, 1, 4},  {"oracle", 4, 4, 16}, {"oracle", 8, 2, 16},
                        {"lookup", 4, 1, 4}, {"lookup", 4, 4, 16}, {"lookup", 8, 2, 16}, {"model (itself)", 4, 1, 4},
                        {"model (itself)", 4, 4, 16}, {"model (first layer)", 4, 1, 4}, {"model (first layer)", 4, 4, 16}};
    const int n_runs = (int)(sizeof runs / sizeof runs[0]);

    bench_emit(g_out,
               "# bench_spec: %s, %s backend, %s; %d layers (the first dense), %d experts (top %d), vocab %d, hidden %d\n\n",
               be == KDT_BACKEND_CUDA ? "Kimi K2 per-layer dims, random weights" : "the built-in model", kdt_backend_name(be),
               kdt_dtype_name(kdt_model_dtype(target)), cf->num_hidden_layers, cf->n_routed_experts, cf->num_experts_per_tok,
               cf->vocab_size, cf->hidden_size);
    bench_emit(g_out,
               "Prompts: %d tokens (a 16-token phrase repeated), %d new tokens per request. tokens/s counts the generated\n"
               "tokens after each request's first (the prefill's) over the decode time. accepted: mean draft tokens kept per\n"
               "request and step; tok/step: tokens emitted per request and step. Step split in ms per step (%s);\n"
               "fwd dev: the target forward's device time per step (CUDA events, with KDT_SPEC_PROFILE=1; else 0).\n"
               "oracle: replays the greedy output (a perfect, free drafter: the loop's ceiling); model (itself): the target\n"
               "drafting for itself (acceptance upper bound, D target forwards to draft); model (first layer): the target's\n"
               "first layer as the draft (its real cost; random weights make its guesses poor).\n\n",
               P, NEW, g_sync ? "synchronized" : "not synchronized: --no-sync");
    bench_emit(g_out, "| batch | drafter | D | K | N | tokens/s | vs none | accepted | tok/step | = greedy | draft | tree | verify "
                      "| accept | commit | fwd dev |\n");
    bench_emit(g_out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");

    char list[256];
    snprintf(list, sizeof list, "%s", batches_arg);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        batch bt = {.B = atoi(tok), .P = P, .NEW = NEW};
        if (bt.B < 1) continue;
        bt.prompt = calloc((size_t)bt.B, sizeof *bt.prompt);
        bt.out = calloc((size_t)bt.B, sizeof *bt.out);
        bt.ref = calloc((size_t)bt.B, sizeof *bt.ref);
        bt.seq = calloc((size_t)bt.B, sizeof *bt.seq);
        bt.seq_len = calloc((size_t)bt.B, sizeof *bt.seq_len);
        for (int b = 0; b < bt.B; b++) {
            bt.prompt[b] = malloc((size_t)P * sizeof(int32_t));
            bt.out[b] = malloc((size_t)NEW * sizeof(int32_t));
            bt.ref[b] = malloc((size_t)NEW * sizeof(int32_t));
            bt.seq[b] = malloc((size_t)(P + NEW) * sizeof(int32_t));
            for (int i = 0; i < P; i++) bt.prompt[b][i] = i < 16 ? (int32_t)(rnd() % (uint64_t)cf->vocab_size) : bt.prompt[b][i - 16];
        }
        run_once(target, NULL, &runs[0], &bt, bt.out); /* warm-up */
        double base = 0;
        for (int r = 0; r < n_runs; r++) {
            if (strstr(runs[r].drafter, "first") && !small) continue;
            if (r > 0 && drafters_arg && !named(drafters_arg, runs[r].drafter)) continue;
            kdt_drafter *dr = !strcmp(runs[r].drafter, "none")     ? NULL
                              : !strcmp(runs[r].drafter, "oracle") ? &ord
                              : !strcmp(runs[r].drafter, "lookup") ? lookup
                              : strstr(runs[r].drafter, "itself")  ? self
                                                                   : small;
            const kdt_spec_stats st = run_once(target, dr, &runs[r], &bt, r == 0 ? bt.ref : bt.out);
            int64_t later = 0;
            int parted = 0, first_part = NEW;
            for (int b = 0; b < bt.B; b++) {
                later += NEW - 1;
                if (r == 0) {
                    memcpy(bt.seq[b], bt.prompt[b], (size_t)P * sizeof(int32_t));
                    memcpy(bt.seq[b] + P, bt.ref[b], (size_t)NEW * sizeof(int32_t));
                    bt.seq_len[b] = P + NEW;
                    continue;
                }
                int i = 0;
                while (i < NEW && bt.out[b][i] == bt.ref[b][i]) i++;
                if (i < NEW) parted++, first_part = i < first_part ? i : first_part;
            }
            if (r == 0) {
                orc.seq = (const int32_t *const *)bt.seq;
                orc.seq_len = bt.seq_len;
            }
            const double dt = decode_time(&st), tps = (double)later / (dt > 0 ? dt : 1e-9), ms = 1e3 / (double)st.steps;
            if (r == 0) base = tps;
            char same[64];
            if (r == 0) snprintf(same, sizeof same, "(reference)");
            else if (!parted) snprintf(same, sizeof same, "yes");
            else snprintf(same, sizeof same, "%d/%d part (from token %d)", parted, bt.B, first_part);
            bench_emit(g_out,
                       "| %d | %s | %d | %d | %d | %.1f | %.2fx | %.2f | %.2f | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", bt.B,
                       runs[r].drafter, r ? runs[r].D : 0, r ? runs[r].K : 0, r ? runs[r].N : 0, tps, tps / base,
                       (double)st.accepted / (double)st.request_steps, (double)later / (double)st.request_steps, same,
                       st.t_draft * ms, st.t_tree * ms, st.t_verify * ms, st.t_accept * ms, st.t_commit * ms,
                       st.t_forward_dev * ms);
        }
        for (int b = 0; b < bt.B; b++) free(bt.prompt[b]), free(bt.out[b]), free(bt.ref[b]), free(bt.seq[b]);
        free(bt.prompt), free(bt.out), free(bt.ref), free(bt.seq), free(bt.seq_len);
    }
    kdt_drafter_free(lookup);
    kdt_drafter_free(self);
    kdt_drafter_free(small);
    or_destroy(&orc);
    kdt_model_free(first);
    kdt_model_free(target);
    if (g_out) fclose(g_out);
    return 0;
}
