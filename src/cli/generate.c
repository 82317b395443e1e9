/* kdt generate (SPEC section 3): greedy decoding with the target model. Generated ids go to
 * stdout on one line; progress and statistics go to stderr. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kdt/model.h"

#define BUILTIN_SEED 0x4B44542D4B324DULL /* the built-in model of `kdt generate` without --model */

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

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int fail(const char *what, kdt_status s) {
    fprintf(stderr, "kdt generate: %s: %s (%s)\n", what, kdt_last_error(), kdt_status_name(s));
    return 1;
}

#define USAGE                                                                                           \
    "usage: kdt generate [--model DIR] --prompt-ids 1,2,3 --max-new N [--backend cpu|cuda]\n"           \
    "                    [--spec none|lookup|model] [--depth D] [--topk K] [--budget N]\n"              \
    "  Greedy decoding; the generated ids go to stdout on one line. Without --model, the built-in\n"    \
    "  model. --backend: cpu (the default until the model's CUDA backend lands). --spec other than\n"   \
    "  none: not implemented yet (issue 9).\n"

static int usage_error(const char *msg, const char *arg) {
    fprintf(stderr, "kdt generate: %s%s%s\n%s", msg, arg ? " " : "", arg ? arg : "", USAGE);
    return 2;
}

int kdt_cmd_generate(int argc, char **argv) {
    const char *model_dir = NULL, *ids_arg = NULL, *spec = "none";
    long max_new = -1, depth = 4, topk = 4, budget = 16; /* speculation settings, for issue 9 */
    kdt_backend backend = KDT_BACKEND_CPU; /* the model's CUDA backend is not written yet */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("%s", USAGE);
            return 0;
        }
        if (strncmp(a, "--", 2) != 0) return usage_error("unexpected argument", a);
        if (i + 1 == argc) return usage_error("option needs a value:", a);
        const char *v = argv[++i];
        if (strcmp(a, "--model") == 0) model_dir = v;
        else if (strcmp(a, "--prompt-ids") == 0) ids_arg = v;
        else if (strcmp(a, "--max-new") == 0) {
            if (parse_int(v, 0, 1 << 20, &max_new)) return usage_error("--max-new takes an integer in 0 .. 1048576, not", v);
        } else if (strcmp(a, "--backend") == 0) {
            if (strcmp(v, "cpu") == 0) backend = KDT_BACKEND_CPU;
            else if (strcmp(v, "cuda") == 0) backend = KDT_BACKEND_CUDA;
            else return usage_error("--backend takes cpu or cuda, not", v);
        } else if (strcmp(a, "--spec") == 0) {
            if (strcmp(v, "none") && strcmp(v, "lookup") && strcmp(v, "model"))
                return usage_error("--spec takes none, lookup or model, not", v);
            spec = v;
        } else if (strcmp(a, "--depth") == 0) {
            if (parse_int(v, 1, 64, &depth)) return usage_error("--depth takes an integer in 1 .. 64, not", v);
        } else if (strcmp(a, "--topk") == 0) {
            if (parse_int(v, 1, 64, &topk)) return usage_error("--topk takes an integer in 1 .. 64, not", v);
        } else if (strcmp(a, "--budget") == 0) {
            if (parse_int(v, 1, 1024, &budget)) return usage_error("--budget takes an integer in 1 .. 1024, not", v);
        } else {
            return usage_error("unknown option", a);
        }
    }
    if (!ids_arg) return usage_error("--prompt-ids is required", NULL);
    if (max_new < 0) return usage_error("--max-new is required", NULL);
    if (strcmp(spec, "none") != 0) {
        fprintf(stderr, "kdt generate: --spec %s (depth %ld, topk %ld, budget %ld): speculative decoding is not implemented "
                        "yet (issue 9); use --spec none\n", spec, depth, topk, budget);
        return 1;
    }
    int32_t *ids = NULL, P = 0;
    if (parse_ids(ids_arg, &ids, &P)) {
        free(ids);
        return usage_error("--prompt-ids takes comma-separated non-negative integers, not", ids_arg);
    }

    kdt_model *m = NULL;
    kdt_cache *c = NULL;
    float *logits = NULL;
    int32_t *out = malloc(((size_t)max_new + 1) * sizeof *out);
    int rc = 0;
    double t0 = now_s();
    kdt_status s = model_dir ? kdt_model_load(model_dir, backend, &m) : kdt_model_builtin(BUILTIN_SEED, backend, &m);
    if (s != KDT_OK) { rc = fail(model_dir ? model_dir : "built-in model", s); goto done; }
    const kdt_model_config *cf = kdt_model_get_config(m);
    fprintf(stderr, "kdt generate: %s: %d layers, hidden %d, %d heads, %d experts, vocab %d, %s backend, loaded in %.2f s\n",
            model_dir ? model_dir : "built-in model", cf->num_hidden_layers, cf->hidden_size, cf->num_attention_heads,
            cf->n_routed_experts, cf->vocab_size, kdt_backend_name(backend), now_s() - t0);
    if ((s = kdt_cache_create(m, 1, P + (int32_t)max_new, 0, &c)) != KDT_OK) { rc = fail("cache", s); goto done; }
    if (!out || !(logits = malloc((size_t)cf->vocab_size * sizeof *logits))) {
        fprintf(stderr, "kdt generate: out of memory\n");
        rc = 1;
        goto done;
    }
    const int32_t req = 0;
    double t_prefill = 0, t_decode = 0;
    int32_t n = P;
    const int32_t *rows = ids;
    for (long i = 0; i < max_new; i++) {
        kdt_batch b = {.B = 1, .req = &req, .n_rows = &n, .tokens = rows, .logits_rows = KDT_LOGITS_LAST};
        const double t = now_s();
        if ((s = kdt_model_forward(m, c, &b, logits, NULL, NULL)) != KDT_OK) { rc = fail(i ? "decode" : "prefill", s); goto done; }
        *(i ? &t_decode : &t_prefill) += now_s() - t;
        out[i] = argmax(logits, cf->vocab_size);
        rows = &out[i];
        n = 1;
    }
    for (long i = 0; i < max_new; i++) printf("%s%d", i ? " " : "", out[i]);
    printf("\n");
    fflush(stdout);
    if (max_new > 0)
        fprintf(stderr, "kdt generate: prefill %d tokens in %.3f s (%.1f tokens/s); decode %ld tokens in %.3f s (%.1f tokens/s)\n",
                P, t_prefill, P / (t_prefill > 0 ? t_prefill : 1e-9), max_new - 1, t_decode,
                (double)(max_new - 1) / (t_decode > 0 ? t_decode : 1e-9));
done:
    free(ids);
    free(out);
    free(logits);
    kdt_cache_free(c);
    kdt_model_free(m);
    return rc;
}
