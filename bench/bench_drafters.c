/* bench_drafters: acceptance and speed of the drafters on real weights. Loads a
 * trained target (and a draft model) once, reads prompts as token ids, and for each drafter and
 * (D, K, N) of a grid, at each batch size, generates greedily with kdt_spec_generate and reports
 * the mean accepted length, tokens/s and how many outputs equal plain greedy decoding.
 *
 *   build/bench/bench_drafters --model DIR [--draft-model DIR] [--prompts FILE] [--limit 200]
 *        [--limits 16,64,200] [--batches 1,8,32] [--max-new 96] [--grid small|full]
 *        [--prefix-layers 1,2] [--drafters none,lookup,model,prefix-1,dflash,mtp,...] [--backend cpu|cuda]
 *        [--dflash DIR] [--mtp DIR] [--temperature T] [--top-p P] [--seed S] [--csv FILE] [--out FILE]
 *        [--time-budget S]
 *
 * Prompts: FILE holds one prompt per line, token ids separated by spaces (python/train_small_model.py
 * writes models/kdt-small/heldout_prompts.ids so). --limit caps how many are read; --limits, one per
 * batch size, how many each batch size runs (batch 1 is the slow one), in batches of B in file order.
 * Drafters: none (plain greedy, the reference), lookup (n-grams of prompt and output), model (the
 * --draft-model checkpoint), prefix-L (the target's first L layers, kdt_draft_model_load), dflash (a DFlash
 * checkpoint, --dflash DIR) and mtp (an MTP layer, --mtp DIR); --drafters picks some (none always runs: it
 * is the reference). The CPU forward is single-threaded, so a machine
 * with many cores runs one process per drafter and batch size (scripts/gpu_drafters.sh does).
 * Grid (D, K, N): small: (4,1,4) (8,1,8) (4,2,8) (8,2,16) (8,4,32); full: D in {4, 8}, K in {1, 2, 4},
 * N in {8, 16, 32}; one: (8,2,16); ct: chain against tree verification at the same verify budget N: (4,1,4) (4,4,4)
 * (7,1,7) (7,4,7), then trees past a block's reach (7,4,16) (7,8,32) (D <= 7: DFlash's block of 8).
 * A (D, K, N) a drafter refuses (a depth past its block) is reported as skipped.
 * --temperature T > 0: every request samples (with --top-p P, default 1; prompt i's seed is S + i, --seed
 * default 0; the model drafter draws its children: docs/sampling.md); the "= greedy" column then
 * compares with the none run at the same temperature and seeds, which a drafter changes (sampling
 * is lossless in distribution, not token for token: docs/sampling.md).
 * The backend's default precision: CUDA bf16, CPU f32. tokens/s: generated tokens (the prefill's
 * first included) over the whole kdt_spec_generate calls, prefill included, no per-phase
 * synchronization; a warm-up run precedes each batch size. "= greedy": requests whose output equals
 * the none run's token for token; "parts at": the earliest position where one differs.
 * --time-budget S: runs still to do once S seconds have passed are skipped (and said so). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kdt/kdt.h"
#include "kdt/model.h"
#include "kdt/spec.h"
#include "bench_prompts.h"

#define MAX_PREFIX 4

static void die(const char *what, kdt_status s) {
    fprintf(stderr, "bench_drafters: %s: %s (%s)\n", what, kdt_last_error(), kdt_status_name(s));
    exit(1);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- drafters and the grid ---- */

typedef struct cfg {
    int D, K, N;
} cfg;

static const cfg GRID_SMALL[] = {{4, 1, 4}, {8, 1, 8}, {4, 2, 8}, {8, 2, 16}, {8, 4, 32}};
static const cfg GRID_CT[] = {{4, 1, 4}, {4, 4, 4}, {7, 1, 7}, {7, 4, 7}, {7, 4, 16}, {7, 8, 32}};

typedef struct drafter_entry {
    char name[32];
    kdt_drafter *d;  /* NULL: none */
} drafter_entry;

/* Totals of one (batch, drafter, D, K, N) over its prompts. */
typedef struct totals {
    int64_t request_steps, accepted, tokens;
    double seconds;
    int equal, parted, first_part;
} totals;

static int parse_list(const char *arg, int *out, int max) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", arg);
    int n = 0;
    for (char *t = strtok(buf, ","); t && n < max; t = strtok(NULL, ",")) out[n++] = atoi(t);
    return n;
}

static float g_top_p = 1.0f; /* --top-p and --seed of every sampling request */
static uint64_t g_seed = 0;

/* Runs prompts [0, n) in batches of B; outputs go to out[i] (max_new each). A failure (a setting the
 * drafter refuses) comes back in *st. */
static totals run_all(kdt_model *m, kdt_drafter *d, const cfg *c, int B, const prompts *p, int n, int max_new, float temp,
                      int32_t **out, int32_t *n_out, kdt_status *st_out) {
    totals t = {0};
    *st_out = KDT_OK;
    kdt_spec_request *req = calloc((size_t)B, sizeof *req);
    const kdt_spec_params par = {.depth = c->D, .topk = c->K, .budget = c->N, .eos = -1,
                                 .pad_tree = kdt_model_backend(m) == KDT_BACKEND_CUDA, .sync_timing = 0};
    for (int i0 = 0; i0 < n; i0 += B) {
        const int nb = n - i0 < B ? n - i0 : B;
        for (int b = 0; b < nb; b++)
            req[b] = (kdt_spec_request){.prompt = p->ids[i0 + b], .prompt_len = p->len[i0 + b], .max_new = max_new,
                                        .out = out[i0 + b], .temperature = temp, .top_p = g_top_p,
                                        .seed = g_seed + (uint64_t)(i0 + b)};
        kdt_spec_stats st;
        kdt_status s = kdt_spec_generate(m, d, &par, nb, req, &st, NULL);
        if (s != KDT_OK && d) { *st_out = s; break; }
        if (s != KDT_OK) die("kdt_spec_generate", s);
        for (int b = 0; b < nb; b++) n_out[i0 + b] = req[b].n_out;
        t.request_steps += st.request_steps;
        t.accepted += st.accepted;
        t.tokens += st.tokens;
        t.seconds += st.t_total;
    }
    free(req);
    return t;
}

int main(int argc, char **argv) {
    const char *dflash_dir = NULL, *mtp_dir = NULL;
    float temp = 0.0f;
    const char *model_dir = NULL, *draft_dir = NULL, *prompts_path = NULL, *csv_path = NULL, *md_path = NULL;
    const char *grid = "small", *batches_arg = "1,8,32", *limits_arg = NULL, *prefix_arg = "1,2", *pick = NULL;
    int limit = 200, max_new = 96;
    double budget = 0;
    int be_given = 0;  /* without --backend: cuda where a device is; asking touches CUDA, so only then */
    kdt_backend be = KDT_BACKEND_CPU;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "bench_drafters: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--model")) model_dir = v;
        else if (!strcmp(a, "--draft-model")) draft_dir = v;
        else if (!strcmp(a, "--dflash")) dflash_dir = v;
        else if (!strcmp(a, "--mtp")) mtp_dir = v;
        else if (!strcmp(a, "--temperature")) temp = (float)atof(v);
        else if (!strcmp(a, "--prompts")) prompts_path = v;
        else if (!strcmp(a, "--limit")) limit = atoi(v);
        else if (!strcmp(a, "--limits")) limits_arg = v;
        else if (!strcmp(a, "--batches")) batches_arg = v;
        else if (!strcmp(a, "--max-new")) max_new = atoi(v);
        else if (!strcmp(a, "--grid")) grid = v;
        else if (!strcmp(a, "--prefix-layers")) prefix_arg = v;
        else if (!strcmp(a, "--drafters")) pick = v;
        else if (!strcmp(a, "--csv")) csv_path = v;
        else if (!strcmp(a, "--out")) md_path = v;
        else if (!strcmp(a, "--time-budget")) budget = atof(v);
        else if (!strcmp(a, "--top-p")) g_top_p = (float)atof(v);
        else if (!strcmp(a, "--seed")) g_seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--backend")) {
            be_given = 1;
            if (!strcmp(v, "cpu")) be = KDT_BACKEND_CPU;
            else if (!strcmp(v, "cuda")) be = KDT_BACKEND_CUDA;
            else { fprintf(stderr, "bench_drafters: --backend takes cpu or cuda, not %s\n", v); return 2; }
        } else { fprintf(stderr, "bench_drafters: unknown option %s\n", a); return 2; }
    }
    if (!model_dir || limit < 1 || max_new < 1 || !(temp >= 0.0f) || !(g_top_p > 0.0f && g_top_p <= 1.0f) ||
        (strcmp(grid, "small") && strcmp(grid, "full") && strcmp(grid, "ct") && strcmp(grid, "one"))) {
        fprintf(stderr, "usage: bench_drafters --model DIR [--draft-model DIR] [--prompts FILE] [--limit N] [--limits 16,64,200]\n"
                        "       [--batches 1,8,32] [--max-new 96] [--grid small|full|ct] [--prefix-layers 1,2]\n"
                        "       [--drafters none,lookup,model,prefix-1,dflash,mtp,...] [--dflash DIR] [--mtp DIR] [--temperature T]\n"
                        "       [--top-p P] [--seed S]\n"
                        "       [--backend cpu|cuda] [--csv FILE] [--out FILE] [--time-budget S]\n");
        return 2;
    }
    char default_prompts[1024];
    if (!prompts_path) {
        snprintf(default_prompts, sizeof default_prompts, "%s/heldout_prompts.ids", model_dir);
        prompts_path = default_prompts;
    }
    if (!be_given && kdt_cuda_available()) be = KDT_BACKEND_CUDA;
    if (be == KDT_BACKEND_CUDA && !kdt_cuda_available()) { fprintf(stderr, "bench_drafters: no CUDA device\n"); return 1; }
    const double t0 = now_s();

    kdt_model *target = NULL, *draft = NULL, *prefix[MAX_PREFIX] = {0};
    kdt_status s = kdt_model_load(model_dir, be, &target);
    if (s != KDT_OK) die(model_dir, s);
    const kdt_model_config *tc = kdt_model_get_config(target);
    if (draft_dir && (s = kdt_model_load(draft_dir, be, &draft)) != KDT_OK) die(draft_dir, s);
    int prefix_layers[MAX_PREFIX], n_prefix = parse_list(prefix_arg, prefix_layers, MAX_PREFIX);
    for (int i = 0; i < n_prefix; i++) {
        if (prefix_layers[i] < 1 || prefix_layers[i] >= tc->num_hidden_layers) { n_prefix = i; break; }
        if ((s = kdt_draft_model_load(model_dir, prefix_layers[i], be, &prefix[i])) != KDT_OK) die("target prefix", s);
    }

    drafter_entry dr[5 + MAX_PREFIX];
    int n_dr = 0;
    dr[n_dr++] = (drafter_entry){"none", NULL};
    snprintf(dr[n_dr].name, sizeof dr[n_dr].name, "lookup");
    if ((s = kdt_drafter_lookup(&dr[n_dr++].d)) != KDT_OK) die("lookup drafter", s);
    if (draft) {
        snprintf(dr[n_dr].name, sizeof dr[n_dr].name, "model");
        if ((s = kdt_drafter_model(draft, &dr[n_dr++].d)) != KDT_OK) die("draft model", s);
    }
    for (int i = 0; i < n_prefix; i++) {
        snprintf(dr[n_dr].name, sizeof dr[n_dr].name, "prefix-%d", prefix_layers[i]);
        if ((s = kdt_drafter_model(prefix[i], &dr[n_dr++].d)) != KDT_OK) die("prefix drafter", s);
    }
    if (dflash_dir) {
        snprintf(dr[n_dr].name, sizeof dr[n_dr].name, "dflash");
        if ((s = kdt_drafter_dflash(target, dflash_dir, &dr[n_dr++].d)) != KDT_OK) die(dflash_dir, s);
    }
    if (mtp_dir) {
        snprintf(dr[n_dr].name, sizeof dr[n_dr].name, "mtp");
        if ((s = kdt_drafter_mtp(mtp_dir, be, &dr[n_dr++].d)) != KDT_OK) die(mtp_dir, s);
    }

    if (pick) {  /* keep none and the drafters named */
        int kept = 1;
        for (int i = 1; i < n_dr; i++) {
            char want[300];
            snprintf(want, sizeof want, ",%s,", dr[i].name);
            char have[300];
            snprintf(have, sizeof have, ",%s,", pick);
            if (strstr(have, want)) dr[kept++] = dr[i];
            else kdt_drafter_free(dr[i].d);
        }
        n_dr = kept;
    }

    cfg full[18];
    int n_full = 0;
    for (int D = 4; D <= 8; D += 4)
        for (int K = 1; K <= 4; K *= 2)
            for (int N = 8; N <= 32; N *= 2) full[n_full++] = (cfg){D, K, N};
    const cfg *gr = !strcmp(grid, "full") ? full : !strcmp(grid, "ct") ? GRID_CT : !strcmp(grid, "one") ? &GRID_SMALL[3] : GRID_SMALL;
    const int n_gr = !strcmp(grid, "full") ? n_full
                     : !strcmp(grid, "ct")  ? (int)(sizeof GRID_CT / sizeof GRID_CT[0])
                     : !strcmp(grid, "one") ? 1
                                            : (int)(sizeof GRID_SMALL / sizeof GRID_SMALL[0]);

    prompts p = {0};
    if (read_prompts("bench_drafters", prompts_path, limit, tc->vocab_size, &p) || !p.n) {
        fprintf(stderr, "bench_drafters: no prompts from %s\n", prompts_path);
        return 1;
    }
    int batches[16], n_b = parse_list(batches_arg, batches, 16), limits[16];
    int n_l = limits_arg ? parse_list(limits_arg, limits, 16) : 0;
    int32_t **ref = malloc((size_t)p.n * sizeof *ref), **out = malloc((size_t)p.n * sizeof *out);
    int32_t *ref_n = calloc((size_t)p.n, sizeof *ref_n), *out_n = calloc((size_t)p.n, sizeof *out_n);
    for (int i = 0; i < p.n; i++) {
        ref[i] = calloc((size_t)max_new, sizeof **ref);
        out[i] = calloc((size_t)max_new, sizeof **out);
    }

    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL, *md = md_path ? fopen(md_path, "w") : NULL;
    if ((csv_path && !csv) || (md_path && !md)) { fprintf(stderr, "bench_drafters: cannot write the outputs\n"); return 1; }
    if (csv)
        fprintf(csv, "backend,dtype,batch,drafter,D,K,N,prompts,tokens,seconds,tokens_per_s,speedup,mean_accepted,"
                     "tokens_per_step,equal_greedy,parted,first_part,verify,temperature\n");
    char head[8192], temp_desc[64] = "greedy";
    if (temp > 0) snprintf(temp_desc, sizeof temp_desc, "temperature %.2f top_p %.2f seeds %llu + i", temp, g_top_p, (unsigned long long)g_seed);
    snprintf(head, sizeof head,
             "# bench_drafters: %s, %s backend, %s\n\nTarget %s: %d layers, hidden %d, %d experts (top %d), vocab %d. Draft "
             "model: %s. DFlash: %s. MTP: %s. Prompts: %s (%d read), %d new tokens each, %s. Grid: %s.\n\n"
             "| batch | drafter | verify | D | K | N | prompts | tokens/s | vs none | accepted | tok/step | = none | parts at |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
             model_dir, kdt_backend_name(be), kdt_dtype_name(kdt_model_dtype(target)), model_dir, tc->num_hidden_layers,
             tc->hidden_size, tc->n_routed_experts, tc->num_experts_per_tok, tc->vocab_size, draft_dir ? draft_dir : "none",
             dflash_dir ? dflash_dir : "none", mtp_dir ? mtp_dir : "none", prompts_path, p.n, max_new, temp_desc, grid);
    fputs(head, stdout);
    if (md) fputs(head, md);

    char best[16][512];
    int skipped = 0;
    for (int bi = 0; bi < n_b; bi++) {
        const int B = batches[bi];
        int n = bi < n_l && limits[bi] > 0 ? limits[bi] : p.n;
        if (n > p.n) n = p.n;
        if (B < 1) continue;
        double best_tps = 0;
        snprintf(best[bi], sizeof best[bi], "batch %d: none", B);
        const cfg plain = {1, 1, 1};
        int warm = B < n ? B : n;
        kdt_status rs;
        run_all(target, NULL, &plain, B, &p, warm, max_new, temp, out, out_n, &rs);  /* warm-up */
        double base = 0;
        for (int di = 0; di < n_dr; di++) {
            for (int gi = 0; gi < (di ? n_gr : 1); gi++) {
                const cfg *c = di ? &gr[gi] : &plain;
                if (budget > 0 && now_s() - t0 > budget) { skipped++; continue; }
                totals t = run_all(target, dr[di].d, c, B, &p, n, max_new, temp, di ? out : ref, di ? out_n : ref_n, &rs);
                const char *verify = !di ? "-" : c->K == 1 ? "chain" : "tree";
                if (rs != KDT_OK) {
                    char row[768];
                    snprintf(row, sizeof row, "| %d | %s | %s | %d | %d | %d | - | skipped: %.120s |\n", B, dr[di].name, verify, c->D,
                             c->K, c->N, kdt_last_error());
                    fputs(row, stdout);
                    if (md) fputs(row, md);
                    continue;
                }
                t.first_part = max_new;
                for (int i = 0; i < n; i++) {
                    if (!di) { t.equal++; continue; }
                    int j = 0;
                    const int m = out_n[i] < ref_n[i] ? out_n[i] : ref_n[i];
                    while (j < m && out[i][j] == ref[i][j]) j++;
                    if (j == m && out_n[i] == ref_n[i]) t.equal++;
                    else { t.parted++; t.first_part = j < t.first_part ? j : t.first_part; }
                }
                const double tps = (double)t.tokens / (t.seconds > 0 ? t.seconds : 1e-9);
                if (!di) base = tps;
                const double acc = t.request_steps ? (double)t.accepted / (double)t.request_steps : 0;
                const double tok_step = t.request_steps ? (double)(t.tokens - n) / (double)t.request_steps : 1;
                char parts[32] = "-";
                if (t.parted) snprintf(parts, sizeof parts, "%d", t.first_part);
                char row[512];
                snprintf(row, sizeof row, "| %d | %s | %s | %d | %d | %d | %d | %.1f | %.2fx | %.2f | %.2f | %d/%d | %s |\n", B,
                         dr[di].name, verify, di ? c->D : 0, di ? c->K : 0, di ? c->N : 0, n, tps, base > 0 ? tps / base : 0, acc,
                         tok_step, t.equal, n, parts);
                fputs(row, stdout);
                fflush(stdout);
                if (md) fputs(row, md);
                if (csv)
                    fprintf(csv, "%s,%s,%d,%s,%d,%d,%d,%d,%lld,%.4f,%.2f,%.4f,%.4f,%.4f,%d,%d,%d,%s,%.2f\n", kdt_backend_name(be),
                            kdt_dtype_name(kdt_model_dtype(target)), B, dr[di].name, di ? c->D : 0, di ? c->K : 0,
                            di ? c->N : 0, n, (long long)t.tokens, t.seconds, tps, base > 0 ? tps / base : 0, acc, tok_step,
                            t.equal, t.parted, t.parted ? t.first_part : -1, verify, temp);
                if (tps > best_tps) {
                    best_tps = tps;
                    snprintf(best[bi], sizeof best[bi], "batch %d: %s (D=%d K=%d N=%d), %.1f tokens/s, %.2fx none", B,
                             dr[di].name, di ? c->D : 0, di ? c->K : 0, di ? c->N : 0, tps, base > 0 ? tps / base : 0);
                }
            }
        }
    }
    char tail[4096];
    int k = snprintf(tail, sizeof tail, "\nFastest per batch size:\n");
    for (int bi = 0; bi < n_b && k < (int)sizeof tail; bi++) k += snprintf(tail + k, sizeof tail - (size_t)k, "- %s\n", best[bi]);
    if (skipped && k < (int)sizeof tail)
        k += snprintf(tail + k, sizeof tail - (size_t)k, "\n%d runs skipped: past --time-budget %.0f s.\n", skipped, budget);
    if (k < (int)sizeof tail) snprintf(tail + k, sizeof tail - (size_t)k, "\nTotal %.1f s.\n", now_s() - t0);
    fputs(tail, stdout);
    if (md) fputs(tail, md);
    if (csv) fclose(csv);
    if (md) fclose(md);

    for (int i = 0; i < n_dr; i++)
        if (dr[i].d) kdt_drafter_free(dr[i].d);
    for (int i = 0; i < n_prefix; i++) kdt_model_free(prefix[i]);
    kdt_model_free(draft);
    kdt_model_free(target);
    for (int i = 0; i < p.n; i++) free(p.ids[i]), free(ref[i]), free(out[i]);
    free(p.ids), free(p.len), free(ref), free(out), free(ref_n), free(out_n);
    return skipped ? 3 : 0;
}
