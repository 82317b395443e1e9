/* What a DFlash step costs beside the verify forward it feeds, at Kimi K2's dims, per layer so that
 * it extrapolates to the 61-layer model.
 *
 *   build/bench/bench_dflash_cost [--out FILE] [--layers 4] [--experts 384] [--ctx 512] [--reps 20]
 *        [--draft-layers 6] [--heads 64] [--kv-heads 8] [--head-dim 128] [--inter 18432] [--block 8]
 *
 * Target: Kimi K2's per-layer dims (hidden 7168, MLA with q_lora 1536 / kv_lora 512, a dense first
 * layer of intermediate 18432, then MoE layers of --experts experts of 2048, top 8, one shared
 * expert; vocabulary 163840), --layers layers (4: about 107 GB of random bf16 weights made on the
 * device, what fits an H200 beside the drafter). Drafter: z-lab's DFlash layout at hidden 7168
 * (assumed dims, flags: 6 Qwen3-style layers of 64 query heads, 8 KV heads of 128, MLP 18432, block
 * 8, fc over 6 target layers: about 7 GB in bf16, the size of their published Kimi drafters), random
 * weights, sharing the target's embedding and LM head (src/spec/cuda/dflash.cu).
 * For each batch B in 1, 8, 32, every request with --ctx tokens of context:
 *   verify: one target forward of a 16-row tree per request (what a step of N = 15 verifies),
 *           with all --layers layers and with the dense first layer alone; their difference over
 *           the MoE layers is the time per MoE layer, and 61 layers ~ the first + 60 x that;
 *   propose: one drafter forward (B blocks of --block rows, D = block - 1 depths, top-8 of each);
 *           with 6 layers and with 1, whose difference over 5 is the time per drafter layer;
 *   observe: 4 new context rows per request (an accepted path) through fc and every layer's K/V.
 * CUDA events on a stream of its own around each call, the median of --reps runs after a warm-up. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "bench_common.h"
#include "kdt/model.h"
#include "model/cuda.h"
#include "model/internal.h"
#include "spec/dflash.h"

namespace {

constexpr int kBatches[] = {1, 8, 32};
constexpr int kMaxB = 32, kRows = 16, kObs = 4, kK = 8, kKimiLayers = 61;

struct Timer {
    cudaStream_t s;
    cudaEvent_t e0, e1;
    void start() { CK(cudaEventRecord(e0, s)); }
    float stop() {
        float ms = 0;
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        return ms;
    }
};

/* Median ms of one target forward of B requests of kRows tree rows (a chain's mask) after their
 * context, with the model cut to `layers` layers; each run truncated back. */
float verify_ms(kdt_model *m, kdt_cache *c, Timer &t, int B, int layers, int reps, const int32_t *tokens) {
    const int32_t L0 = m->cfg.num_hidden_layers;
    m->cfg.num_hidden_layers = layers; /* the cache keeps every layer; the forward runs the first `layers` */
    int32_t req[kMaxB], rows[kMaxB], pos[kMaxB * kRows], keep = kdt_cache_len(c, 0);
    static uint8_t mask[kMaxB * kRows * kRows];
    for (int b = 0; b < B; b++) {
        req[b] = b, rows[b] = kRows;
        for (int i = 0; i < kRows; i++) {
            pos[b * kRows + i] = keep + i;
            for (int j = 0; j < kRows; j++) mask[(b * kRows + i) * kRows + j] = j <= i;
        }
    }
    kdt_batch bt = {};
    bt.B = B, bt.req = req, bt.n_rows = rows, bt.tokens = tokens, bt.positions = pos, bt.tree_mask = mask;
    bt.logits_rows = KDT_LOGITS_ALL;
    float *logits = nullptr, *ts = (float *)malloc((size_t)(reps + 1) * sizeof(float));
    CK(cudaMalloc(&logits, (size_t)B * kRows * m->cfg.vocab_size * sizeof(float)));
    for (int r = 0; r <= reps; r++) {
        t.start();
        KCK(kdt_model_forward(m, c, &bt, logits, nullptr, t.s));
        ts[r] = t.stop();
        for (int b = 0; b < B; b++) KCK(kdt_cache_truncate(c, b, keep));
    }
    const float med = bench_median(ts + 1, reps); /* the first is the warm-up */
    m->cfg.num_hidden_layers = L0;
    CK(cudaFree(logits));
    free(ts);
    return med;
}

struct Drafter {
    dfl_dev *g;
    int32_t slot[kMaxB], root[kMaxB], n_ctx[kMaxB];
};

/* Median ms of propose and of observe (kObs rows per request) at batch B. */
void draft_ms(Drafter &d, Timer &t, int B, int ctx, int reps, const float *hidden, float *scores, int32_t *tokens,
              float *prop, float *obs) {
    int32_t rows[kMaxB * kObs], slot[kMaxB * kObs], pos[kMaxB * kObs];
    for (int b = 0; b < B; b++) {
        d.slot[b] = b, d.root[b] = 7 + b, d.n_ctx[b] = ctx;
        for (int i = 0; i < kObs; i++) rows[b * kObs + i] = b * kObs + i, slot[b * kObs + i] = b, pos[b * kObs + i] = ctx + i;
    }
    float *tp = (float *)malloc((size_t)(reps + 1) * sizeof(float)), *to = (float *)malloc((size_t)(reps + 1) * sizeof(float));
    for (int r = 0; r <= reps; r++) {
        t.start();
        KCK(dfl_dev_propose(d.g, B, d.slot, d.root, d.n_ctx, kK, scores, tokens, t.s));
        tp[r] = t.stop();
        t.start();
        KCK(dfl_dev_observe(d.g, B * kObs, hidden, rows, slot, pos, t.s)); /* rows past ctx: rewritten each run */
        to[r] = t.stop();
    }
    *prop = bench_median(tp + 1, reps);
    *obs = bench_median(to + 1, reps);
    free(tp), free(to);
}

} // namespace

int main(int argc, char **argv) {
    const char *out_path = NULL;
    int L = 4, E = 384, ctx = 512, reps = 20;
    dfl_config c = {};
    c.L = 6, c.H = 64, c.KV = 8, c.hd = 128, c.I = 18432, c.bs = 8, c.nT = 6;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i];
        const int v = atoi(argv[i + 1]);
        if (!strcmp(a, "--out")) out_path = argv[i + 1];
        else if (!strcmp(a, "--layers")) L = v;
        else if (!strcmp(a, "--experts")) E = v;
        else if (!strcmp(a, "--ctx")) ctx = v;
        else if (!strcmp(a, "--reps")) reps = v;
        else if (!strcmp(a, "--draft-layers")) c.L = v;
        else if (!strcmp(a, "--heads")) c.H = v;
        else if (!strcmp(a, "--kv-heads")) c.KV = v;
        else if (!strcmp(a, "--head-dim")) c.hd = v;
        else if (!strcmp(a, "--inter")) c.I = v;
        else if (!strcmp(a, "--block")) c.bs = v;
        else { fprintf(stderr, "bench_dflash_cost: unknown option %s\n", a); return 2; }
    }
    if (argc % 2 == 0 || L < 2 || E < 8 || ctx < 1 || reps < 1 || c.L < 2 || c.bs < 2 || c.bs > 16 || c.H < 1 || c.KV < 1) {
        fprintf(stderr, "usage: bench_dflash_cost [--out FILE] [--layers >= 2] [--experts >= 8] [--ctx N] [--reps N] [--draft-layers >= 2]\n"
                        "       [--heads 64] [--kv-heads 8] [--head-dim 128] [--inter 18432] [--block 2 .. 16]\n");
        return 2;
    }
    FILE *out = NULL;
    if (bench_open("bench_dflash_cost", out_path, &out)) return 1;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    kdt_model_config cfg;
    bench_kimi_config(L, E, 163840, &cfg);
    kdt_model *m = NULL;
    KCK(kdt_model_random_cuda(&cfg, 11, KDT_BF16, &m));
    const int32_t hid = cfg.hidden_size, V = cfg.vocab_size, D = c.bs - 1;
    c.hid = hid, c.V = V, c.mask = V - 2, c.eps = 1e-6f, c.emb_scale = 1.0f, c.out_mult = 1.0f, c.theta = 1e6;
    for (int i = 0; i < c.nT; i++) c.target_layers[i] = i;
    Drafter full = {}, one = {};
    dfl_config c1 = c;
    c1.L = 1;
    KCK(dfl_dev_create(NULL, &c, 21, m->d_embed, m->d_lm_head, KDT_BF16, kMaxB, ctx + kObs + 1, D, &full.g));
    KCK(dfl_dev_create(NULL, &c1, 22, m->d_embed, m->d_lm_head, KDT_BF16, kMaxB, ctx + kObs + 1, D, &one.g));
    bench_emit(out,
               "# DFlash drafter against the verify forward on %s, bf16, random weights\n\nTarget: Kimi K2 dims, %d layers (1 dense, "
               "%d MoE of %d experts, top 8), vocabulary %d. Drafter: %d layers, %d heads / %d KV heads of %d, MLP %d, block %d "
               "(D = %d, top %d), fc over %d target layers. Context %d tokens per request; verify: %d tree rows per request; "
               "observe: %d rows per request. Medians of %d runs (ms).\n\n",
               prop.name, L, L - 1, E, V, c.L, c.H, c.KV, c.hd, c.I, c.bs, D, kK, c.nT, ctx, kRows, kObs, reps);
    bench_emit(out, "| B | verify %d layers | first layer + head | per MoE layer | verify 61 layers (est.) | propose %d layers | per drafter "
                    "layer | observe | draft / verify-61 |\n|---|---|---|---|---|---|---|---|---|\n", L, c.L);
    Timer t = {};
    CK(cudaStreamCreateWithFlags(&t.s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&t.e0));
    CK(cudaEventCreate(&t.e1));
    kdt_cache *cache = NULL;
    KCK(kdt_cache_create(m, kMaxB, ctx + kRows + 8, 0, &cache));
    int32_t *tokens = (int32_t *)malloc((size_t)kMaxB * ctx * sizeof(int32_t));
    for (int i = 0; i < kMaxB * ctx; i++) tokens[i] = (int32_t)((i * 2654435761u) % (uint32_t)V);
    float *hidden = NULL, *scores = NULL;
    int32_t *dtok = NULL;
    const size_t W = (size_t)c.nT * hid;
    CK(cudaMalloc(&hidden, (size_t)kMaxB * kObs * W * sizeof(float)));
    CK(cudaMalloc(&scores, (size_t)kMaxB * D * kK * sizeof(float)));
    CK(cudaMalloc(&dtok, (size_t)kMaxB * D * kK * sizeof(int32_t)));
    KCK(kdt_cuda_fill_uniform(hidden, KDT_F32, (size_t)kMaxB * kObs * W, 5, 0.0f, 1.0f));
    /* Every slot's context: ctx rows observed once (the rows' contents do not change the cost). */
    int32_t *rows = (int32_t *)malloc((size_t)ctx * sizeof(int32_t)), *slot = (int32_t *)malloc((size_t)ctx * sizeof(int32_t)),
            *pos = (int32_t *)malloc((size_t)ctx * sizeof(int32_t));
    for (int b = 0; b < kMaxB; b++) {
        for (int i = 0; i < ctx; i++) rows[i] = i % (kMaxB * kObs), slot[i] = b, pos[i] = i;
        KCK(dfl_dev_observe(full.g, ctx, hidden, rows, slot, pos, t.s));
        KCK(dfl_dev_observe(one.g, ctx, hidden, rows, slot, pos, t.s));
    }
    for (int bi = 0; bi < (int)(sizeof kBatches / sizeof kBatches[0]); bi++) {
        const int B = kBatches[bi];
        for (int b = 0; b < B; b++) { /* the context in the target's cache, a request at a time (small scratch) */
            const int32_t req = b, n = ctx;
            kdt_batch pre = {};
            pre.B = 1, pre.req = &req, pre.n_rows = &n, pre.tokens = tokens + (size_t)b * ctx, pre.logits_rows = KDT_LOGITS_LAST;
            KCK(kdt_cache_reset(cache, b));
            KCK(kdt_model_forward(m, cache, &pre, NULL, NULL, t.s));
        }
        const float vL = verify_ms(m, cache, t, B, L, reps, tokens), v1 = verify_ms(m, cache, t, B, 1, reps, tokens);
        const float per_moe = (vL - v1) / (float)(L - 1), v61 = v1 + per_moe * (kKimiLayers - 1);
        float pf, of, p1, o1;
        draft_ms(full, t, B, ctx, reps, hidden, scores, dtok, &pf, &of);
        draft_ms(one, t, B, ctx, reps, hidden, scores, dtok, &p1, &o1);
        const float per_dl = (pf - p1) / (float)(c.L - 1);
        bench_emit(out, "| %d | %.3f | %.3f | %.3f | %.2f | %.3f | %.3f | %.3f | %.3f |\n", B, vL, v1, per_moe, v61, pf, per_dl, of,
                   (pf + of) / v61);
    }
    bench_emit(out, "\nverify 61 layers = first layer + head + 60 x per MoE layer (Kimi K2: layer 0 dense, 60 MoE layers of 384 "
                    "experts). A DFlash step costs propose + observe; the last column is that over the estimated verify.\n");
    dfl_dev_free(full.g);
    dfl_dev_free(one.g);
    kdt_cache_free(cache);
    kdt_model_free(m);
    CK(cudaFree(hidden));
    CK(cudaFree(scores));
    CK(cudaFree(dtok));
    free(tokens), free(rows), free(slot), free(pos);
    if (out) fclose(out);
    return 0;
}
