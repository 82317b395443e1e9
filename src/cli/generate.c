/* kdt generate (docs/interfaces.md section 3): decoding with the target model, plain or speculative
 * (kdt_spec_generate). Generated ids go to stdout, one line per prompt, or with a text prompt the
 * text as it is produced (generate_text.c); progress and statistics go to stderr. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/generate_text.h"
#include "cli/options.h"
#include "cli/ranks.h"
#include "kdt/spec.h"

#define BUILTIN_SEED 0x4B44542D4B324DULL /* the built-in model of `kdt generate --model builtin` */
#define MAX_PROMPTS 64

int kdt_cmd_generate(int argc, char **argv);

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A decimal integer in [lo, hi], the whole string. */
static int parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* A finite decimal number in [lo, hi], the whole string. */
static int parse_real(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

/* "1,2,3" into a malloc'd array. */
static int parse_ids(const char *s, int32_t **ids, int32_t *n) {
    *n = 0;
    *ids = malloc((strlen(s) / 2 + 1) * sizeof **ids);
    if (!*ids) return -1;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end != ',' && *end)) return -1;
        (*ids)[(*n)++] = (int32_t)v;
        if (!*end) return 0;
        p = end + 1;
    }
}

static int fail(const char *what, kdt_status s) {
    fprintf(stderr, "kdt generate: %s: %s (%s)\n", what, kdt_last_error(), kdt_status_name(s));
    return 1;
}

#define USAGE                                                                                           \
    "usage: kdt generate [--model DIR] --prompt-ids 1,2,3 [--prompt-ids ...] --max-new N\n"             \
    "       kdt generate [--model DIR] --prompt TEXT | --prompt-file F [--max-new N]\n"               \
    "                    [--backend cpu|cuda] [--eos ID] [--spec none|lookup|model|dflash|mtp]\n"       \
    "                    [--depth D] [--topk K] [--budget N] [--draft-layers L] [--draft-model DIR]\n"  \
    "                    [--temperature T] [--top-k K] [--top-p P] [--seed S] [--gpus N]\n"            \
    "  Greedy decoding by default; the generated ids go to stdout, one line per prompt (several --prompt-ids\n"    \
    "  decode as one batch). --prompt / --prompt-file: text through the model's tokenizer (BOS as its\n" \
    "  config says); the generated text is printed as it is produced (--max-new default 128, --eos\n"   \
    "  default the tokenizer's). Without --model, the shipped model (models/" KDT_SHIPPED_MODEL "); --model\n" \
    "  builtin: a small random built-in model (ids only). --backend: cuda where a CUDA device\n"       \
    "  is present (bf16), else cpu (f32). --eos: a token that ends its request once emitted.\n"         \
    "  --spec: speculative decoding with greedy acceptance, the same output as none, faster when the\n" \
    "  drafter guesses well. lookup: n-grams of the prompt and output so far; model: a draft model\n"   \
    "  run D steps ahead. Each step drafts D positions of K candidates, verifies the best N nodes\n"    \
    "  (default D=4, K=4, N=16) in one forward and keeps the longest confirmed path plus one token.\n"  \
    "  --draft-layers L: the model drafter is the target's first L layers (needs --model; 0, the\n"    \
    "  default, is the whole target: every draft token is right, the upper bound of acceptance).\n"    \
    "  --draft-model DIR: another checkpoint with the target's vocabulary as the draft model.\n"       \
    "  dflash: a DFlash block drafter (--draft-model DIR: z-lab's checkpoint format, read with the\n"  \
    "  target's hidden states; D <= block_size - 1; docs/spec.md).\n"                             \
    "  mtp: the checkpoint's next-token (MTP) layer chained D times (--draft-model DIR, default the\n" \
    "  target's folder).\n"                                                                           \
    "  --temperature T > 0 samples (0, the default, is greedy) from softmax(logits / T) after keeping\n" \
    "  the --top-k largest logits (0: off) and then the smallest set reaching probability --top-p\n"  \
    "  (1: off); speculative decoding then accepts by rejection sampling and gives the same\n"       \
    "  distribution (docs/sampling.md). --seed S (default 0): the same seed, the same output.\n"      \
    "  --gpus N: the model's routed experts split over N ranks, one thread each (docs/multi_gpu.md):\n" \
    "  N GPUs on cuda (one GPU only so far), threads on cpu; the same output as one.\n"               \
    "  Statistics on stderr: mean accepted length (draft tokens kept per request and step), tokens/s\n" \
    "  and the time per step split into draft, tree build, verify forward, accept and commit (on\n"    \
    "  CUDA exact only with KDT_SPEC_PROFILE=1, which synchronizes after each phase and also times\n"  \
    "  each step's target forward with CUDA events).\n"

static int usage_error(const char *msg, const char *arg) { return kdt_cli_usage_error("generate", USAGE, msg, arg); }

typedef struct opts {
    const char *model_dir, *draft_dir, *spec;
    const char *prompt_text, *prompt_file; /* a text prompt instead of --prompt-ids */
    char shipped[4096];
    const char *prompts[MAX_PROMPTS];
    int n_prompts;
    long max_new, depth, topk, budget, draft_layers, eos, top_k;
    double temperature, top_p;
    unsigned long long seed;
    kdt_backend backend;
    int gpus;
} opts;

static int parse_opts(int argc, char **argv, opts *o) {
    *o = (opts){.spec = "none", .max_new = -1, .depth = 4, .topk = 4, .budget = 16, .eos = -1, .top_p = 1.0,
                .backend = (kdt_backend)-1, .gpus = 1};
    for (int i = 0; i < argc; i++) {
        const char *a, *v;
        const int done = kdt_cli_next_option("generate", USAGE, argc, argv, &i, &a, &v);
        if (done >= 0) return done;
        if (strcmp(a, "--model") == 0) o->model_dir = v;
        else if (strcmp(a, "--prompt") == 0) o->prompt_text = v;
        else if (strcmp(a, "--prompt-file") == 0) o->prompt_file = v;
        else if (strcmp(a, "--draft-model") == 0) o->draft_dir = v;
        else if (strcmp(a, "--prompt-ids") == 0) {
            if (o->n_prompts == MAX_PROMPTS) return usage_error("at most 64 --prompt-ids, not more:", v);
            o->prompts[o->n_prompts++] = v;
        } else if (strcmp(a, "--max-new") == 0) {
            if (parse_int(v, 0, 1 << 20, &o->max_new)) return usage_error("--max-new takes an integer in 0 .. 1048576, not", v);
        } else if (strcmp(a, "--backend") == 0) {
            if (kdt_cli_backend("generate", USAGE, v, &o->backend)) return 2;
        } else if (strcmp(a, "--spec") == 0) {
            if (strcmp(v, "none") && strcmp(v, "lookup") && strcmp(v, "model") && strcmp(v, "dflash") && strcmp(v, "mtp"))
                return usage_error("--spec takes none, lookup, model, dflash or mtp, not", v);
            o->spec = v;
        } else if (strcmp(a, "--depth") == 0) {
            if (parse_int(v, 1, 64, &o->depth)) return usage_error("--depth takes an integer in 1 .. 64, not", v);
        } else if (strcmp(a, "--topk") == 0) {
            if (parse_int(v, 1, 64, &o->topk)) return usage_error("--topk takes an integer in 1 .. 64, not", v);
        } else if (strcmp(a, "--budget") == 0) {
            if (parse_int(v, 1, 1024, &o->budget)) return usage_error("--budget takes an integer in 1 .. 1024, not", v);
        } else if (strcmp(a, "--draft-layers") == 0) {
            if (parse_int(v, 0, 4096, &o->draft_layers)) return usage_error("--draft-layers takes an integer in 0 .. 4096, not", v);
        } else if (strcmp(a, "--temperature") == 0) {
            if (parse_real(v, 0.0, 1e6, &o->temperature)) return usage_error("--temperature takes a number in 0 .. 1e6, not", v);
        } else if (strcmp(a, "--top-p") == 0) {
            if (parse_real(v, 1e-9, 1.0, &o->top_p)) return usage_error("--top-p takes a number in (0, 1], not", v);
        } else if (strcmp(a, "--top-k") == 0) {
            if (parse_int(v, 0, INT32_MAX, &o->top_k)) return usage_error("--top-k takes an integer >= 0 (0: off), not", v);
        } else if (strcmp(a, "--seed") == 0) {
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (errno || end == v || *end || *v == '-') return usage_error("--seed takes an integer in 0 .. 2^64 - 1, not", v);
        } else if (strcmp(a, "--gpus") == 0) {
            if (kdt_cli_gpus("generate", USAGE, v, &o->gpus)) return 2;
        } else if (strcmp(a, "--eos") == 0) {
            if (parse_int(v, 0, INT32_MAX, &o->eos)) return usage_error("--eos takes a token id, not", v);
        } else {
            return usage_error("unknown option", a);
        }
    }
    if ((int)o->backend < 0) o->backend = kdt_cuda_available() ? KDT_BACKEND_CUDA : KDT_BACKEND_CPU; /* starts CUDA: not for --help */
    const int text = o->prompt_text || o->prompt_file;
    if (!o->n_prompts && !text) return usage_error("--prompt-ids, --prompt or --prompt-file is required", NULL);
    if ((o->n_prompts && text) || (o->prompt_text && o->prompt_file))
        return usage_error("give one of --prompt-ids, --prompt and --prompt-file", NULL);
    if (o->max_new < 0 && text) o->max_new = 128;
    if (o->max_new < 0) return usage_error("--max-new is required", NULL);
    if (o->model_dir && strcmp(o->model_dir, "builtin") == 0) o->model_dir = NULL;
    else if (!o->model_dir && !(o->model_dir = kdt_cli_shipped_model(o->shipped, sizeof o->shipped)))
        fprintf(stderr, "kdt generate: no shipped model at %s; using the built-in random model (--model builtin)\n", o->shipped);
    if (text && !o->model_dir) return usage_error("a text prompt needs a model folder with a tokenizer (--model DIR)", NULL);
    if (o->draft_layers && !o->model_dir) return usage_error("--draft-layers needs --model (the built-in model has no checkpoint to cut)", NULL);
    if (o->draft_layers && o->draft_dir) return usage_error("give --draft-layers or --draft-model, not both", NULL);
    if (strcmp(o->spec, "dflash") == 0 && (!o->draft_dir || o->draft_layers))
        return usage_error("--spec dflash needs --draft-model DIR (a DFlash checkpoint) and no --draft-layers", NULL);
    if (strcmp(o->spec, "mtp") == 0 && (o->draft_layers || (!o->draft_dir && !o->model_dir)))
        return usage_error("--spec mtp reads the MTP layer of --draft-model DIR or --model DIR, and takes no --draft-layers", NULL);
    return -1; /* go on */
}

/* The draft model of --spec model: another checkpoint, the target's first layers, or the
 * target itself. */
static kdt_status load_draft(const opts *o, kdt_model *target, kdt_model **draft) {
    *draft = NULL;
    if (o->draft_dir) return kdt_model_load(o->draft_dir, o->backend, draft);
    if (o->draft_layers) return kdt_draft_model_load(o->model_dir, (int32_t)o->draft_layers, o->backend, draft);
    *draft = target;
    return KDT_OK;
}

/* Streams ids to stdout as the loop emits them: a single request token by token; a batch line by
 * line in prompt order, each line as soon as its request and every earlier one have finished. */
typedef struct printer {
    const kdt_spec_request *reqs;
    int B, next;              /* next: the first request whose line is not printed yet */
    int32_t eos, *count;      /* count: tokens seen per request */
    kdt_cli_text_out *text;   /* a text prompt: the text is streamed instead */
} printer;

static void print_line(const kdt_spec_request *r) {
    for (int32_t i = 0; i < r->n_out; i++) printf("%s%d", i ? " " : "", r->out[i]);
    printf("\n");
}

static void on_tokens(void *user, int32_t b, const int32_t *toks, int32_t n) {
    printer *pr = user;
    if (pr->text) {
        kdt_cli_print_tokens(pr->text, b, toks, n);
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        const int32_t c = ++pr->count[b];
        if (pr->B == 1) printf("%s%d", c > 1 ? " " : "", toks[i]);
    }
    while (pr->B > 1 && pr->next < pr->B && (pr->count[pr->next] == pr->reqs[pr->next].max_new ||
                                 (pr->count[pr->next] && pr->reqs[pr->next].out[pr->count[pr->next] - 1] == pr->eos)))
        print_line(&pr->reqs[pr->next++]);
    fflush(stdout);
}

/* "n tokens in t s (r tokens/s)", the rate left out where no time was measured. */
static void fmt_rate(char *buf, size_t size, int64_t n, double t) {
    int k = snprintf(buf, size, "%lld tokens in %.3f s", (long long)n, t);
    if (n > 0 && t >= 1e-6 && k > 0 && (size_t)k < size) snprintf(buf + k, size - (size_t)k, " (%.1f tokens/s)", (double)n / t);
}

/* later: the tokens after each request's first (which the prefill gives). */
static void print_stats(const opts *o, const kdt_spec_stats *st, int64_t prompt_tokens, int64_t later) {
    const double decode = st->t_draft + st->t_tree + st->t_verify + st->t_accept + st->t_commit;
    if (o->max_new == 0) {
        fprintf(stderr, "kdt generate: --max-new 0: nothing generated\n");
        return;
    }
    char pre[96], dec[96];
    fmt_rate(pre, sizeof pre, prompt_tokens, st->t_prefill);
    fmt_rate(dec, sizeof dec, later, decode);
    fprintf(stderr, "kdt generate: prefill %s; decode %s\n", pre, dec);
    if (st->t_forward_dev > 0 && st->steps > 0) {
        const int64_t one = st->steps - st->forwards_multi;
        fprintf(stderr, "kdt generate: profile: %lld steps, %.1f us a step, of which the target forward %.1f us on the device "
                        "(CUDA events), the rest %.1f us; forwards of 1 row: %lld, %.1f us each, of more: %lld, %.1f us each\n",
                (long long)st->steps, 1e6 * decode / (double)st->steps, 1e6 * st->t_forward_dev / (double)st->steps,
                1e6 * (decode - st->t_forward_dev) / (double)st->steps, (long long)one,
                one ? 1e6 * (st->t_forward_dev - st->t_forward_dev_multi) / (double)one : 0.0, (long long)st->forwards_multi,
                st->forwards_multi ? 1e6 * st->t_forward_dev_multi / (double)st->forwards_multi : 0.0);
    }
    if (strcmp(o->spec, "none") == 0 || st->steps == 0) return;
    const double ms = 1e3 / (double)st->steps;
    fprintf(stderr, "kdt generate: spec %s D=%ld K=%ld N=%ld: %lld steps, mean accepted length %.2f, %.2f tokens per request "
                    "and step, %.1f tree nodes verified per request and step\n",
            o->spec, o->depth, o->topk, o->budget, (long long)st->steps, (double)st->accepted / (double)st->request_steps,
            (double)later / (double)st->request_steps, (double)st->drafted / (double)st->request_steps);
    fprintf(stderr, "kdt generate: time per step: draft %.3f ms, tree build %.3f ms, verify forward %.3f ms, accept %.3f ms, "
                    "commit %.3f ms\n",
            st->t_draft * ms, st->t_tree * ms, st->t_verify * ms, st->t_accept * ms, st->t_commit * ms);
}

int kdt_cmd_generate(int argc, char **argv) {
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc >= 0) return rc;
    rc = 0;
    const int B = o.n_prompts ? o.n_prompts : 1;
    kdt_spec_request req[MAX_PROMPTS] = {0};
    int32_t *ids[MAX_PROMPTS] = {0};
    kdt_model *m = NULL, *draft = NULL;
    kdt_cli_ranks *ranks = NULL;
    kdt_drafter *dr = NULL;
    int64_t prompt_tokens = 0;
    kdt_tokenizer *tok = NULL;
    kdt_cli_text_out text = {0};
    if (o.prompt_text || o.prompt_file) {
        int32_t P = 0;
        if (kdt_cli_prompt_text("kdt generate", o.model_dir, o.prompt_text, o.prompt_file, &tok, &ids[0], &P)) { rc = 1; goto done; }
        if (o.eos < 0) o.eos = kdt_tokenizer_eos_id(tok);
        if (kdt_detok_stream_create(tok, &text.stream) != KDT_OK) { rc = fail("detok stream", KDT_ERR_NOMEM); goto done; }
        req[0] = (kdt_spec_request){.prompt = ids[0], .prompt_len = P, .max_new = (int32_t)o.max_new,
                                    .out = malloc(((size_t)o.max_new + 1) * sizeof(int32_t)),
                                    .temperature = (float)o.temperature, .top_k = (int32_t)o.top_k,
                                    .top_p = (float)o.top_p, .seed = (uint64_t)o.seed};
        prompt_tokens = P;
        if (!req[0].out) { fprintf(stderr, "kdt generate: out of memory\n"); rc = 1; goto done; }
    }
    for (int b = 0; b < B && !tok; b++) {
        int32_t P = 0;
        if (parse_ids(o.prompts[b], &ids[b], &P)) {
            rc = usage_error("--prompt-ids takes comma-separated non-negative integers, not", o.prompts[b]);
            goto done;
        }
        req[b] = (kdt_spec_request){.prompt = ids[b], .prompt_len = P, .max_new = (int32_t)o.max_new,
                                    .out = malloc(((size_t)o.max_new + 1) * sizeof(int32_t)),
                                    .temperature = (float)o.temperature, .top_k = (int32_t)o.top_k,
                                    .top_p = (float)o.top_p, .seed = (uint64_t)o.seed};
        prompt_tokens += P;
        if (!req[b].out) { fprintf(stderr, "kdt generate: out of memory\n"); rc = 1; goto done; }
    }
    double t0 = now_s();
    kdt_status s = kdt_cli_load_model(o.model_dir, BUILTIN_SEED, o.backend, o.gpus, &m, &ranks);
    if (s != KDT_OK) { rc = fail(o.model_dir ? o.model_dir : "built-in model", s); goto done; }
    const kdt_model_config *cf = kdt_model_get_config(m);
    fprintf(stderr, "kdt generate: %s: %d layers, hidden %d, %d heads, %d experts, vocab %d, %s backend, loaded in %.2f s\n",
            o.model_dir ? o.model_dir : "built-in model", cf->num_hidden_layers, cf->hidden_size, cf->num_attention_heads,
            cf->n_routed_experts, cf->vocab_size, kdt_backend_name(o.backend), now_s() - t0);
    if (o.gpus > 1) fprintf(stderr, "kdt generate: experts split over %d ranks (%s)\n", o.gpus, o.backend == KDT_BACKEND_CUDA ? "NCCL" : "threads");
    if (o.eos >= cf->vocab_size) {
        fprintf(stderr, "kdt generate: --eos %ld is outside the model's vocabulary (0 .. %d)\n", o.eos, cf->vocab_size - 1);
        rc = 2;
        goto done;
    }
    for (int b = 0; b < B; b++)
        if ((int64_t)req[b].prompt_len + o.max_new > cf->max_position_embeddings)
            fprintf(stderr, "kdt generate: warning: request %d reaches %lld tokens (prompt + --max-new), past the model's "
                            "max_position_embeddings %d\n", b, (long long)req[b].prompt_len + o.max_new, cf->max_position_embeddings);
    if (strcmp(o.spec, "lookup") == 0) s = kdt_drafter_lookup(&dr);
    else if (strcmp(o.spec, "model") == 0) {
        if ((s = load_draft(&o, m, &draft)) != KDT_OK) { rc = fail("draft model", s); goto done; }
        fprintf(stderr, "kdt generate: draft model: %s, %d layers\n",
                o.draft_dir ? o.draft_dir : draft == m ? "the target itself" : "the target's first layers",
                kdt_model_get_config(draft)->num_hidden_layers);
        s = kdt_drafter_model(draft, &dr);
    } else if (strcmp(o.spec, "dflash") == 0) {
        s = kdt_drafter_dflash(m, o.draft_dir, &dr);
    } else if (strcmp(o.spec, "mtp") == 0) {
        s = kdt_drafter_mtp(o.draft_dir ? o.draft_dir : o.model_dir, o.backend, &dr);
    }
    if (s != KDT_OK) { rc = fail("drafter", s); goto done; }
    printer pr = {.reqs = req, .B = B, .eos = (int32_t)o.eos, .count = calloc((size_t)B, sizeof(int32_t)),
                  .text = tok ? &text : NULL};
    if (!pr.count) { fprintf(stderr, "kdt generate: out of memory\n"); rc = 1; goto done; }
    const kdt_spec_params p = {.depth = (int32_t)o.depth, .topk = (int32_t)o.topk, .budget = (int32_t)o.budget,
                               .eos = (int32_t)o.eos, .pad_tree = o.backend == KDT_BACKEND_CUDA,
                               .on_tokens = on_tokens, .user = &pr};
    kdt_spec_stats st = {0};
    s = kdt_spec_generate(m, dr, &p, B, req, &st, NULL);
    if (st.t_forward_dev > 0) {
        int64_t replays = 0, captures = 0;
        kdt_model_graph_counts(m, &replays, &captures);
        fprintf(stderr, "kdt generate: profile: the target's CUDA graphs: %lld replays, %lld captures; %lld step forwards "
                        "not replayed (first sights, captures) took %.3f ms\n", (long long)replays, (long long)captures,
                (long long)st.forwards_cold, 1e3 * st.t_forward_cold);
    }
    if (tok && s == KDT_OK) s = kdt_cli_print_end(&text);
    if (!tok && B == 1 && (s == KDT_OK || pr.count[0])) printf("\n");
    for (; s == KDT_OK && !tok && B > 1 && pr.next < B; pr.next++) print_line(&req[pr.next]); /* max_new 0 emits nothing */
    fflush(stdout);
    free(pr.count);
    if (s != KDT_OK) { rc = fail("generate", s); goto done; }
    int64_t later = 0;
    for (int b = 0; b < B; b++) later += req[b].n_out > 1 ? req[b].n_out - 1 : 0;
    print_stats(&o, &st, prompt_tokens, later);
done:
    kdt_detok_stream_free(text.stream);
    kdt_tokenizer_free(tok);
    kdt_drafter_free(dr);
    if (draft != m) kdt_model_free(draft);
    kdt_model_free(m);
    kdt_cli_ranks_end(ranks);
    for (int b = 0; b < B; b++) {
        free(ids[b]);
        free(req[b].out);
    }
    return rc;
}
