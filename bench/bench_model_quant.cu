/* Decoding with weights kept quantized on the device: Kimi K2.6's layout and DeepSeek-V3's.
 *
 *   build/bench/bench_model_quant [--out FILE] [--gb 120] [--decode 16] [--only int4|fp8|bf16] [--batch B]
 *
 * Models (random weights made on the device, no files; real per-layer dims, vocabulary 32000):
 *   K2.6 INT4: hidden 7168, 64 heads, q_lora 1536, kv_lora 512, a dense first layer of 18432, then
 *     MoE layers of 384 routed experts of 2048 (top 8, n_group 1) in INT4 groups of 32 and one
 *     shared expert; attention, shared expert and dense MLP in bf16, as K2.6 ships them;
 *   V3 FP8: DeepSeek-V3's dims (256 experts, n_group 8, topk_group 4), every linear but kv_b in FP8
 *     128x128 blocks, as V3 ships them (kv_b is dequantized for the per-head GEMMs);
 *   K2.6 bf16: the same as the first in bf16, 3 layers: the per-layer baseline.
 * As many layers as fit in --gb GB (a 2-layer model is made first to measure a dense and a MoE layer).
 * Each model: the device bytes per layer by part against bf16, then decode steps of one token per
 * request at batch 1, 8, 32 after a 16-token prompt, the median of --decode steps timed with CUDA
 * events around kdt_model_forward (logits of the last rows to the host) after a warm-up, against
 * the floor (--batch: that batch size alone): the bytes a step reads at least over the device-copy bandwidth measured in this run
 * (and over 4.8 TB/s, the H200's HBM3e): every weight once, except routed experts, of which a
 * step reads the ones its routing chose: the experts with rows, counted by the grouped kernels
 * (kdt_moe_quant_experts_read) over the timed steps, their mean a step; the router and the
 * embedding rows; the cache is left out. Where nothing counts them (bf16 experts, or a library
 * without the counter) the floor takes the uniform-routing estimate, E (1 - (1 - k/E)^B) experts a
 * layer, and says so; the last columns compare every step with that estimate (the random routers
 * send a batch's rows to fewer experts than uniform routing would).
 * The timed decode steps run between cudaProfilerStart and Stop: `ncu --profile-from-start off`
 * (graphs off: KDT_MODEL_FLAGS) lists their kernels alone, without the weight fills and prompts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "bench_common.h"
#include "kdt/model.h"
#include "model/internal.h"

/* moe_quant.h's counter of the experts the grouped kernels read; weak, so that a baseline library
 * without it links (NULL there). */
extern "C" __attribute__((weak)) kdt_status kdt_moe_quant_experts_read(int64_t *n);

namespace {

#define KIMI_ATTN                                                                                                              \
    "\"vocab_size\": 32000, \"hidden_size\": 7168, \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048,"              \
    "\"num_attention_heads\": 64, \"q_lora_rank\": 1536, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128,"                    \
    "\"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"n_shared_experts\": 1, \"num_experts_per_tok\": 8,"                      \
    "\"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"norm_topk_prob\": true, \"max_position_embeddings\": 131072,"      \
    "\"rms_norm_eps\": 1e-06, \"rope_scaling\": {\"beta_fast\": 1.0, \"beta_slow\": 1.0, \"factor\": 32.0, \"mscale\": 1.0,"  \
    "\"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}, \"tie_word_embeddings\": false,"
const char *kK26 = "{\"architectures\": [\"DeepseekV3ForCausalLM\"], " KIMI_ATTN
                   "\"n_routed_experts\": 384, \"n_group\": 1, \"topk_group\": 1, \"routed_scaling_factor\": 2.827,"
                   "\"rope_theta\": 50000.0, \"num_hidden_layers\": %d}";
const char *kV3 = "{\"architectures\": [\"DeepseekV3ForCausalLM\"], " KIMI_ATTN
                  "\"n_routed_experts\": 256, \"n_group\": 8, \"topk_group\": 4, \"routed_scaling_factor\": 2.5,"
                  "\"rope_theta\": 10000.0, \"num_hidden_layers\": %d}";

constexpr int kBatches[] = {1, 8, 32};
constexpr int kMaxB = 32, kPrompt = 16;
constexpr double kSpecBw = 4.8e12;
FILE *g_out;
int g_batch;                    /* --batch: the only batch size; 0: all of kBatches */
double g_copy_bw;               /* bytes/s, measured */

uint64_t g_rng = 99;
uint32_t rnd() {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 33);
}

kdt_model *make(const char *fmt, int layers, kdt_wfmt experts, kdt_wfmt others) {
    char json[2048];
    snprintf(json, sizeof json, fmt, layers);
    kdt_model_config cfg;
    KCK(kdt_model_config_parse(json, strlen(json), "bench config", &cfg));
    kdt_model *m = NULL;
    KCK(kdt_model_random_cuda_q(&cfg, 7, KDT_BF16, experts, others, &m));
    return m;
}

/* MoE layers of m. */
int moe_layers(const kdt_model *m) {
    int n = 0;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) n += m->dlayers[l].is_moe;
    return n;
}

/* Bytes a decode step of B rows reads at least (see the header): experts, the routed experts it reads
 * summed over its MoE layers; < 0: uniform routing's estimate, E (1 - (1 - k/E)^B) a layer. */
double floor_bytes(const kdt_model *m, int B, double experts) {
    const kdt_model_config *c = &m->cfg;
    const double E = c->n_routed_experts, k = c->num_experts_per_tok;
    double total = 2.0 * c->vocab_size * c->hidden_size + 2.0 * B * c->hidden_size; /* LM head, embedding rows */
    for (int l = 0; l < c->num_hidden_layers; l++) {
        size_t now[4], bf[4];
        kdt_model_layer_bytes(m, l, now, bf);
        total += (double)now[0] + now[2] + now[3];
        if (!m->dlayers[l].is_moe) continue;
        total += E * c->hidden_size * 4.0; /* the f32 router */
        /* every MoE layer has the same experts: now[1] / E bytes each */
        total += now[1] / E * (experts >= 0 ? experts / moe_layers(m) : E * (1.0 - pow(1.0 - k / E, B)));
    }
    return total;
}

void memory_table(const kdt_model *m, const char *what) {
    static const char *part[4] = {"attention (q_a, q_b, kv_a, kv_b, o)", "routed experts", "shared expert", "dense MLP"};
    bench_emit(g_out, "\n| %s: layer part | bf16 GB | as held GB | ratio |\n|---|---:|---:|---:|\n", what);
    for (int l = 0; l < 2 && l < m->cfg.num_hidden_layers; l++) {
        size_t now[4], bf[4];
        kdt_model_layer_bytes(m, l, now, bf);
        for (int i = 0; i < 4; i++)
            if (bf[i]) bench_emit(g_out, "| layer %d %s | %.3f | %.3f | %.3f |\n", l, part[i], bf[i] / 1e9, now[i] / 1e9, (double)now[i] / bf[i]);
    }
}

/* Bytes of the top (embedding, LM head) and of layer l. */
double layer_gb(const kdt_model *m, int l) {
    size_t now[4], bf[4];
    kdt_model_layer_bytes(m, l, now, bf);
    return (double)(now[0] + now[1] + now[2] + now[3]) / 1e9;
}

void decode(const char *name, kdt_model *m, int D) {
    const kdt_model_config *c = &m->cfg;
    double gb = 4.0 * c->vocab_size * c->hidden_size / 1e9;
    for (int l = 0; l < c->num_hidden_layers; l++) gb += layer_gb(m, l);
    kdt_cache *cache;
    KCK(kdt_cache_create(m, kMaxB, kPrompt + 2 * D + 8, 0, &cache));
    cudaStream_t s;
    cudaEvent_t e0, e1;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    int32_t req[kMaxB], rows[kMaxB], tok[kMaxB * kPrompt];
    float *logits = (float *)malloc((size_t)kMaxB * c->vocab_size * sizeof(float)), *t = (float *)malloc((size_t)D * sizeof(float));
    bench_emit(g_out, "\n## %s: %d layers, %.1f GB of weights\n\n| B | decode ms | tok/s | floor GB | floor ms (copy %.2f TB/s) | x floor "
                      "| floor ms (4.8 TB/s) | x floor | experts a MoE layer | uniform routing ms (copy) | x uniform |\n"
                      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
               name, c->num_hidden_layers, gb, g_copy_bw / 1e12);
    for (int B : kBatches) {
        if (g_batch && B != g_batch) continue;
        for (int i = 0; i < B; i++) {
            req[i] = i;
            KCK(kdt_cache_reset(cache, i));
        }
        for (int i = 0; i < B * kPrompt; i++) tok[i] = (int32_t)(rnd() % (uint32_t)c->vocab_size);
        kdt_batch bt = {};
        bt.B = B;
        bt.req = req;
        bt.n_rows = rows;
        bt.tokens = tok;
        bt.logits_rows = KDT_LOGITS_LAST;
        for (int i = 0; i < B; i++) rows[i] = kPrompt;
        KCK(kdt_model_forward(m, cache, &bt, logits, NULL, s));
        for (int i = 0; i < B; i++) rows[i] = 1;
        for (int i = 0; i < 2; i++) KCK(kdt_model_forward(m, cache, &bt, logits, NULL, s)); /* warm-up, graph capture */
        int64_t nexp = 0;
        if (kdt_moe_quant_experts_read) KCK(kdt_moe_quant_experts_read(&nexp)); /* from 0 for the timed steps */
        CK(cudaProfilerStart());
        for (int i = 0; i < D; i++) {
            CK(cudaEventRecord(e0, s));
            KCK(kdt_model_forward(m, cache, &bt, logits, NULL, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&t[i], e0, e1));
        }
        CK(cudaProfilerStop());
        if (kdt_moe_quant_experts_read) KCK(kdt_moe_quant_experts_read(&nexp));
        const double experts = nexp > 0 ? (double)nexp / D : -1; /* a step, over its MoE layers */
        const double ms = bench_median(t, D), fb = floor_bytes(m, B, experts), f1 = fb / g_copy_bw * 1e3, f2 = fb / kSpecBw * 1e3;
        const double fu = floor_bytes(m, B, -1) / g_copy_bw * 1e3;
        char read[32];
        if (experts >= 0) snprintf(read, sizeof read, "%.1f", experts / moe_layers(m));
        else snprintf(read, sizeof read, "uniform estimate");
        bench_emit(g_out, "| %d | %.3f | %.0f | %.2f | %.3f | %.2f | %.3f | %.2f | %s | %.3f | %.2f |\n", B, ms, B / (ms * 1e-3), fb / 1e9, f1,
                   ms / f1, f2, ms / f2, read, fu, ms / fu);
    }
    int64_t replays = 0, captures = 0;
    kdt_model_graph_counts(m, &replays, &captures);
    bench_emit(g_out, "\n%lld decode forwards replayed from %lld CUDA graphs (options %u).\n", (long long)replays, (long long)captures,
               kdt_model_flags(m));
    kdt_cache_free(cache);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaStreamDestroy(s));
    free(logits);
    free(t);
}

/* Measures a dense and a MoE layer on a 2-layer model, then runs as many layers as fit in gb. */
void run(const char *name, const char *fmt, kdt_wfmt experts, kdt_wfmt others, double gb, int max_layers, int D) {
    kdt_model *m = make(fmt, 2, experts, others);
    memory_table(m, name);
    const double top = 4.0 * m->cfg.vocab_size * m->cfg.hidden_size / 1e9, l0 = layer_gb(m, 0), l1 = layer_gb(m, 1);
    kdt_model_free(m);
    int layers = 1 + (int)((gb - top - l0) / l1);
    layers = layers < 2 ? 2 : layers > max_layers ? max_layers : layers;
    m = make(fmt, layers, experts, others);
    decode(name, m, D);
    kdt_model_free(m);
}

} // namespace

int main(int argc, char **argv) {
    const char *out_path = NULL, *only = NULL;
    double gb = 120;
    int D = 16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
        else if (!strcmp(argv[i], "--gb") && i + 1 < argc) gb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) D = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) g_batch = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_model_quant [--out FILE] [--gb 120] [--decode 16] [--only int4|fp8|bf16] [--batch 1|8|32]\n");
            return 2;
        }
    }
    if (D < 1 || D > 1000 || gb < 1 || (g_batch && g_batch != 1 && g_batch != 8 && g_batch != 32)) {
        fprintf(stderr, "bench_model_quant: --decode 1 .. 1000, --gb >= 1, --batch 1, 8 or 32\n");
        return 2;
    }
    if (bench_open("bench_model_quant", out_path, &g_out)) return 1;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    g_copy_bw = bench_copy_bw();
    bench_emit(g_out, "# Quantized decode on %s: device copy %.2f TB/s (read + written), decode steps after a %d-token prompt, median of %d\n",
               prop.name, g_copy_bw / 1e12, kPrompt, D);
    if (!only || !strcmp(only, "int4")) run("K2.6 layout, INT4 routed experts", kK26, KDT_WFMT_INT4, KDT_WFMT_DENSE, gb, 61, D);
    if (!only || !strcmp(only, "fp8")) run("DeepSeek-V3 layout, FP8", kV3, KDT_WFMT_FP8, KDT_WFMT_FP8, gb, 61, D);
    if (!only || !strcmp(only, "bf16")) run("K2.6 layout in bf16 (baseline)", kK26, KDT_WFMT_DENSE, KDT_WFMT_DENSE, gb, 3, D);
    if (g_out) fclose(g_out);
    return 0;
}
