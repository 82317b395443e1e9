/* bench_lookup_replay: the prompt-lookup drafter's acceptance on recorded greedy outputs, without
 * the model. Each PROMPT OUT pair of files (token ids, separated by anything not a digit: the
 * prompt, and kdt generate's output for it) is replayed as the loop would run it: the drafter's
 * proposal, tree_build, then tree_accept with target_pred taken from the recorded output (the node
 * whose path matches it predicts the next recorded token, every other node nothing). Greedy
 * acceptance makes that exactly the loop's run on the model that produced the output.
 *
 *   build/bench/bench_lookup_replay D K N PROMPT OUT [PROMPT OUT ...] [--cost A,B]
 *
 * Prints the steps, the steps that drafted, tokens per step and a modelled speedup over plain
 * decoding: tokens / (steps without a draft + C x steps with one), C = A + B x (N + 1) the cost of a
 * verify step of N + 1 rows in plain steps (default 2,0.1: docs/perf/spec.md). */

#include "bench_common.h"
#include "kdt/ops.h"
#include "kdt/spec.h"

#define MAX_TOKENS 8192

static int read_ids(const char *path, int32_t *buf, int max) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0, c = fgetc(f);
    while (c != EOF && n < max) {
        if (c < '0' || c > '9') {
            c = fgetc(f);
            continue;
        }
        int64_t v = 0;
        for (; c >= '0' && c <= '9' && v < INT32_MAX; c = fgetc(f)) v = v * 10 + (c - '0');
        buf[n++] = (int32_t)v;
    }
    fclose(f);
    return n;
}

typedef struct tally {
    int64_t tokens, steps, drafted;
} tally;

/* Replays seq [T] (prompt P, then the output): steps until the history holds all of it. */
static void replay(int32_t D, int32_t K, int32_t N, const int32_t *seq, int32_t P, int32_t T, tally *t) {
    const int32_t Q = N + 1;
    kdt_drafter *dr = NULL;
    KCK(kdt_drafter_lookup(&dr));
    const kdt_draft_setup set = {.slots = 1, .max_len = T + Q, .D = D, .K = K, .vocab_size = INT32_MAX, .backend = KDT_BACKEND_CPU};
    KCK(dr->begin(dr->state, &set));
    int32_t slot = 0, len = P + 1, n_new = P + 1, acc = 0;
    const int32_t *hist = seq;
    const kdt_draft_ctx ctx = {.B = 1, .slot = &slot, .history = &hist, .hist_len = &len};
    kdt_draft_feedback fb = {.prefill = 1, .n_new = &n_new, .accept_len = &acc};
    KCK(dr->observe(dr->state, &ctx, &fb));
    fb.prefill = 0;
    float *sc = malloc((size_t)D * K * sizeof *sc), *node_score = malloc((size_t)Q * sizeof *node_score);
    int32_t *buf = malloc((size_t)(D * K + 14 * Q) * sizeof *buf);
    uint8_t *mask = malloc((size_t)Q * Q);
    int32_t *tk = buf, *tok = tk + D * K, *par = tok + Q, *dep = par + Q, *cand = dep + Q, *fc = cand + Q, *ns = fc + Q;
    int32_t *pos = ns + Q, *pred = pos + Q, *idx = pred + Q, *atok = idx + Q, root[2], num = 0, alen = 0, st = 0;
    while (len < T) {
        KCK(dr->propose(dr->state, &ctx, sc, tk));
        root[0] = seq[len - 1];
        root[1] = len - 1;
        const kdt_tree_build_params bp = {.B = 1, .D = D, .K = K, .budget = N, .scores = sc, .tokens = tk, .root_token = root,
                                          .seq_len = root + 1, .num_nodes = &num, .node_token = tok, .node_parent = par,
                                          .node_depth = dep, .node_cand = cand, .node_score = node_score, .positions = pos,
                                          .tree_mask = mask, .first_child = fc, .next_sibling = ns};
        KCK(kdt_tree_build(&bp, KDT_BACKEND_CPU, NULL));
        for (int32_t i = 0; i < Q; i++) { /* node i predicts the recorded token after it, if its path is recorded */
            int ok = i <= num && len + dep[i] < T;
            for (int32_t j = i; ok && j > 0; j = par[j]) ok = tok[j] == seq[len - 1 + dep[j]];
            pred[i] = ok ? seq[len + dep[i]] : -1;
        }
        const kdt_tree_accept_params ap = {.B = 1, .Q = Q, .node_token = tok, .node_parent = par, .num_nodes = &num,
                                           .target_pred = pred, .accept_len = &alen, .accept_index = idx,
                                           .accept_tokens = atok, .status = &st};
        KCK(kdt_tree_accept(&ap, KDT_BACKEND_CPU, NULL));
        n_new = alen + 1 < T - len ? alen + 1 : T - len;
        acc = alen;
        len += n_new;
        t->steps++;
        t->drafted += num > 0;
        KCK(dr->observe(dr->state, &ctx, &fb));
    }
    t->tokens += T - P - 1;
    free(sc), free(node_score), free(buf), free(mask);
    kdt_drafter_free(dr);
}

int main(int argc, char **argv) {
    double A = 2.0, Bc = 0.1;
    int n_files = 0;
    const char *files[256];
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--cost") && i + 1 < argc) {
            if (sscanf(argv[++i], "%lf,%lf", &A, &Bc) != 2) { fprintf(stderr, "bench_lookup_replay: --cost A,B\n"); return 2; }
        } else if (n_files < 256) {
            files[n_files++] = argv[i];
        }
    }
    const int32_t D = argc > 3 ? atoi(argv[1]) : 0, K = argc > 3 ? atoi(argv[2]) : 0, N = argc > 3 ? atoi(argv[3]) : 0;
    if (D < 1 || K < 1 || N < 1 || n_files < 2 || n_files % 2) {
        fprintf(stderr, "usage: bench_lookup_replay D K N PROMPT OUT [PROMPT OUT ...] [--cost A,B]\n");
        return 2;
    }
    static int32_t seq[MAX_TOKENS];
    tally t = {0};
    for (int f = 0; f < n_files; f += 2) {
        const int P = read_ids(files[f], seq, MAX_TOKENS), n = P < 1 ? -1 : read_ids(files[f + 1], seq + P, MAX_TOKENS - P);
        if (P < 1 || n < 0) { fprintf(stderr, "bench_lookup_replay: cannot read %s or %s\n", files[f], files[f + 1]); return 1; }
        if (n > 1) replay(D, K, N, seq, P, P + n, &t);
    }
    const double C = A + Bc * (N + 1), cost = (double)(t.steps - t.drafted) + C * (double)t.drafted;
    printf("lookup D=%d K=%d N=%d: %lld tokens in %lld steps (%lld drafted): %.2f tokens a step; modelled %.2fx plain (C = %.2f)\n",
           D, K, N, (long long)t.tokens, (long long)t.steps, (long long)t.drafted, (double)t.tokens / (double)(t.steps ? t.steps : 1),
           cost > 0 ? (double)t.tokens / cost : 0.0, C);
    return 0;
}
