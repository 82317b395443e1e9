/* The model's CUDA forward: prefill, decode and tree-verification throughput.
 *
 *   build/bench/bench_model [--out FILE] [--prompt 256] [--decode 32] [--reps 3] [--f32] [--only kimi|builtin]
 *                           [--batches 1,8,32]
 *
 * Models: the built-in one (Kimi K2's layout scaled down), and one with Kimi K2's per-layer dims
 * (hidden 7168, 64 heads, q_lora 1536, kv_lora 512, rope 64, nope 128, v 128, a dense first layer
 * of intermediate 18432, then a MoE layer of 16 experts of 2048 with top 8 and one shared
 * expert, YaRN as Kimi K2's) but 2 layers and a 32000-token vocabulary: random bf16 weights made
 * on the device (about 3.6 GB), no files (--only runs one of the two). Batches of 1, 8 and 32 requests
 * (--batches: a subset):
 *   prefill: every request's prompt of --prompt tokens in one forward (last-row logits);
 *   decode:  --decode steps of one token per request after the prefill (the median step);
 *   verify:  a tree of 16 rows per request after the prefill (the median of --decode runs, each
 *            truncated back), what a speculative step costs the target.
 * Times are CUDA events around kdt_model_forward on a stream of its own (the call returns once
 * its logits are on the host), the median of --reps runs after a warm-up; tokens/s counts the
 * rows the forward turns into cache rows (prefill, decode) or the rows verified. Memory: device
 * memory in use after loading the model and the peak after the runs. Floors (decode, verify): the
 * bytes of every weight the forward reads, each once, routed experts counted as min(E, rows x
 * top-k) per MoE layer, over the device copy bandwidth measured in the same process (read + written
 * bytes, bench_copy_bw: what a kernel streaming the weights can reach) and over kPeakBw (the H200's
 * HBM3e as specified); the cache's few MB are left out. The
 * forward's options come from $KDT_MODEL_FLAGS (include/kdt/model.h). The timed decode steps run between
 * cudaProfilerStart and Stop (`ncu --profile-from-start off`: one decode step's kernels with --decode 1). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "bench_common.h"
#include "kdt/model.h"
#include "model/internal.h"

namespace {

const char *kKimiDims =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"vocab_size\": 32000, \"hidden_size\": 7168,"
    "\"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"num_hidden_layers\": 2, \"num_attention_heads\": 64,"
    "\"q_lora_rank\": 1536, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,"
    "\"n_routed_experts\": 16, \"n_shared_experts\": 1, \"num_experts_per_tok\": 8, \"n_group\": 1, \"topk_group\": 1,"
    "\"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"norm_topk_prob\": true, \"routed_scaling_factor\": 2.827,"
    "\"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-06, \"rope_theta\": 50000.0,"
    "\"rope_scaling\": {\"beta_fast\": 1.0, \"beta_slow\": 1.0, \"factor\": 32.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0,"
    "\"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}, \"tie_word_embeddings\": false}";

constexpr int kMaxB = 32, kTree = 16;
int g_batches[3] = {1, 8, 32}, g_nbatches = 3;
constexpr double kPeakBw = 4.8e12; /* bytes/s */
double g_copy_bw;                  /* bytes/s: the device copy measured in this process */

FILE *g_out;

uint64_t g_rng = 12345;
uint32_t rnd() {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 33);
}

double used_gb() {
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    return (double)(total_b - free_b) / 1e9;
}

struct Bench {
    kdt_model *m;
    kdt_cache *c;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    int32_t V, P, D, reps;
    int32_t req[kMaxB], *tokens;
    float *logits;
};

/* Milliseconds of one forward of B requests of n rows each (tokens from b.tokens). */
float timed(Bench &b, int B, int n, const int32_t *pos, const uint8_t *mask) {
    int32_t rows[kMaxB];
    for (int i = 0; i < B; i++) rows[i] = n;
    kdt_batch bt = {};
    bt.B = B;
    bt.req = b.req;
    bt.n_rows = rows;
    bt.tokens = b.tokens;
    bt.positions = pos;
    bt.tree_mask = mask;
    bt.logits_rows = KDT_LOGITS_LAST;
    CK(cudaEventRecord(b.e0, b.s));
    KCK(kdt_model_forward(b.m, b.c, &bt, b.logits, NULL, b.s));
    CK(cudaEventRecord(b.e1, b.s));
    CK(cudaEventSynchronize(b.e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, b.e0, b.e1));
    return ms;
}

/* Bytes of weights a forward over `rows` rows reads at least (see the header). */
double floor_bytes(const kdt_model *m, int64_t rows) {
    const kdt_model_config *c = kdt_model_get_config(m);
    const double es = kdt_dtype_size(kdt_model_dtype(m)), hid = c->hidden_size, H = c->num_attention_heads;
    const double qk = c->qk_nope_head_dim + c->qk_rope_head_dim, Dqk = c->kv_lora_rank + c->qk_rope_head_dim;
    const double qw = c->q_lora_rank ? c->q_lora_rank : H * qk;
    double attn = (qw + Dqk) * hid + H * (c->qk_nope_head_dim + c->v_head_dim) * c->kv_lora_rank + hid * H * c->v_head_dim;
    if (c->q_lora_rank) attn += H * qk * c->q_lora_rank;
    double total = (double)c->vocab_size * hid + (double)rows * hid; /* LM head, embedding rows */
    for (int l = 0; l < c->num_hidden_layers; l++) {
        total += attn;
        if (!kdt_layer_is_moe(c, l)) {
            total += 3.0 * c->intermediate_size * hid;
            continue;
        }
        const int64_t E = c->n_routed_experts, used = rows * c->num_experts_per_tok < E ? rows * c->num_experts_per_tok : E;
        total += 3.0 * c->moe_intermediate_size * hid * ((double)used + c->n_shared_experts) + E * hid * 4.0 / es;
    }
    return total * es;
}

void reset(Bench &b, int B) {
    for (int i = 0; i < B; i++) KCK(kdt_cache_reset(b.c, b.req[i]));
}

/* One random tree of kTree rows per request after its cache: positions and masks. */
void make_trees(Bench &b, int B, int32_t *pos, uint8_t *mask) {
    memset(mask, 0, (size_t)B * kTree * kTree);
    for (int r = 0; r < B; r++) {
        int32_t parent[kTree], depth[kTree];
        const int32_t base = kdt_cache_len(b.c, b.req[r]);
        for (int i = 0; i < kTree; i++) {
            parent[i] = i ? (int32_t)(rnd() % (uint32_t)i) : -1;
            depth[i] = i ? depth[parent[i]] + 1 : 0;
            pos[r * kTree + i] = base + depth[i];
            for (int a = i; a >= 0; a = parent[a]) mask[((size_t)r * kTree + i) * kTree + a] = 1;
        }
    }
}

void run_model(const char *name, kdt_model *m, double weights_gb, int32_t P, int32_t D, int reps) {
    Bench b = {};
    b.m = m;
    b.P = P;
    b.D = D;
    b.reps = reps;
    b.V = kdt_model_get_config(m)->vocab_size;
    for (int i = 0; i < kMaxB; i++) b.req[i] = i;
    b.tokens = (int32_t *)malloc((size_t)kMaxB * P * sizeof(int32_t));
    b.logits = (float *)malloc((size_t)kMaxB * b.V * sizeof(float));
    for (int i = 0; i < kMaxB * P; i++) b.tokens[i] = (int32_t)(rnd() % (uint32_t)b.V);
    CK(cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&b.e0));
    CK(cudaEventCreate(&b.e1));
    KCK(kdt_cache_create(m, kMaxB, P + D + kTree + 64, 0, &b.c));
    int32_t *pos = (int32_t *)malloc((size_t)kMaxB * kTree * sizeof(int32_t));
    uint8_t *mask = (uint8_t *)malloc((size_t)kMaxB * kTree * kTree);
    float *t = (float *)malloc((size_t)(reps > D ? reps : D) * sizeof(float));
    bench_emit(g_out, "\n## %s: %.2f GB of weights\n\n", name, weights_gb);
    bench_emit(g_out, "|  B | prefill tokens | prefill ms | prefill tok/s | decode ms | decode tok/s | verify ms | verify rows/s "
                      "| decode floor ms | x floor | verify floor ms | x floor | decode floor ms (copy) | x floor (copy) "
                      "| verify floor ms (copy) | x floor (copy) |\n");
    bench_emit(g_out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int bi = 0; bi < g_nbatches; bi++) {
        const int B = g_batches[bi];
        /* Warm-up: scratch sized and cuBLAS's choices made for this batch. */
        reset(b, B);
        timed(b, B, P, NULL, NULL);
        timed(b, B, 1, NULL, NULL);
        make_trees(b, B, pos, mask);
        timed(b, B, kTree, pos, mask);
        for (int r = 0; r < reps; r++) {
            reset(b, B);
            t[r] = timed(b, B, P, NULL, NULL);
        }
        const float prefill = bench_median(t, reps);
        CK(cudaProfilerStart()); /* the decode steps alone: `ncu --profile-from-start off` lists their kernels */
        for (int i = 0; i < D; i++) t[i] = timed(b, B, 1, NULL, NULL);
        CK(cudaProfilerStop());
        const float decode = bench_median(t, D);
        for (int i = 0; i < D; i++) {
            make_trees(b, B, pos, mask);
            const int32_t keep = kdt_cache_len(b.c, b.req[0]);
            t[i] = timed(b, B, kTree, pos, mask);
            for (int r = 0; r < B; r++) KCK(kdt_cache_truncate(b.c, b.req[r], keep));
        }
        const float verify = bench_median(t, D);
        const double db = floor_bytes(b.m, B), vb = floor_bytes(b.m, (int64_t)B * kTree);
        const double dfloor = db / kPeakBw * 1e3, vfloor = vb / kPeakBw * 1e3, dcopy = db / g_copy_bw * 1e3, vcopy = vb / g_copy_bw * 1e3;
        bench_emit(g_out,
                   "| %2d | %6d | %9.2f | %10.0f | %8.3f | %8.0f | %8.3f | %9.0f | %7.3f | %5.2f | %7.3f | %5.2f | %7.3f | %5.2f | %7.3f "
                   "| %5.2f |\n",
                   B, B * P, prefill, B * P / (prefill * 1e-3), decode, B / (decode * 1e-3), verify, B * kTree / (verify * 1e-3), dfloor,
                   decode / dfloor, vfloor, verify / vfloor, dcopy, decode / dcopy, vcopy, verify / vcopy);
    }
    int64_t replays = 0, captures = 0;
    kdt_model_graph_counts(b.m, &replays, &captures);
    bench_emit(g_out, "\nForward options %u; %lld forwards replayed from %lld CUDA graphs. Floors at %.1f TB/s and at the device "
                      "copy's %.2f TB/s (this process): batch 1 decode reads %.3f GB, a 16-row verify %.3f GB.\n",
               kdt_model_flags(b.m), (long long)replays, (long long)captures, kPeakBw / 1e12, g_copy_bw / 1e12, floor_bytes(b.m, 1) / 1e9,
               floor_bytes(b.m, kTree) / 1e9);
    bench_emit(g_out, "\nDevice memory in use after the runs (weights, cache, scratch): %.1f GB\n", used_gb());
    reset(b, kMaxB);
    kdt_cache_free(b.c);
    CK(cudaEventDestroy(b.e0));
    CK(cudaEventDestroy(b.e1));
    CK(cudaStreamDestroy(b.s));
    free(b.tokens);
    free(b.logits);
    free(pos);
    free(mask);
    free(t);
}

} // namespace

int main(int argc, char **argv) {
    const char *out_path = NULL;
    int P = 256, D = 32, reps = 3, only = 0; /* 1: built-in, 2: Kimi dims */
    kdt_dtype dt = KDT_BF16;
    const char *usage = "usage: bench_model [--out FILE] [--prompt 256] [--decode 32] [--reps 3] [--f32] [--only kimi|builtin] "
                        "[--batches 1,8,32]\n";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) D = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--f32")) dt = KDT_F32;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && (!strcmp(argv[i + 1], "builtin") || !strcmp(argv[i + 1], "kimi")))
            only = strcmp(argv[++i], "builtin") ? 2 : 1;
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) {
            g_nbatches = 0;
            for (char *p = argv[++i], *e; *p && g_nbatches < 3; p = *e ? e + 1 : e) {
                const long v = strtol(p, &e, 10);
                if (e == p || (v != 1 && v != 8 && v != 32)) { fprintf(stderr, "bench_model: --batches takes 1, 8 or 32\n"); return 2; }
                g_batches[g_nbatches++] = (int)v;
            }
        } else {
            fprintf(stderr, "%s", usage);
            return 2;
        }
    }
    if (P < 1 || P > 4096 || D < 1 || D > 4096 || reps < 1 || reps > 100) {
        fprintf(stderr, "bench_model: --prompt 1 .. 4096, --decode 1 .. 4096, --reps 1 .. 100\n");
        return 2;
    }
    if (bench_open("bench_model", out_path, &g_out)) return 1;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    g_copy_bw = bench_copy_bw();
    bench_emit(g_out,
               "# kdt_model_forward on %s, %s weights and activations; prompt %d tokens, %d decode steps, trees of %d rows; "
               "device copy %.2f TB/s (read + written)\n",
               prop.name, kdt_dtype_name(dt), P, D, kTree, g_copy_bw / 1e12);
    double before = used_gb();
    kdt_model *m = NULL;
    if (only != 2) {
        KCK(kdt_model_builtin_as(0x4B44542D4B324DULL, KDT_BACKEND_CUDA, dt, &m));
        run_model("built-in model", m, used_gb() - before, P, D, reps);
        kdt_model_free(m);
    }
    if (only == 1) {
        if (g_out) fclose(g_out);
        return 0;
    }
    kdt_model_config cfg;
    KCK(kdt_model_config_parse(kKimiDims, strlen(kKimiDims), "Kimi K2 dims", &cfg));
    before = used_gb();
    KCK(kdt_model_random_cuda(&cfg, 7, dt, &m));
    run_model("Kimi K2 per-layer dims, 2 layers (dense, MoE of 16 experts, top 8), vocab 32000", m, used_gb() - before, P, D,
              reps);
    kdt_model_free(m);
    if (g_out) fclose(g_out);
    return 0;
}
