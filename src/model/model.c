/* Model lifetime, the paged latent KV cache, and the forward's validation and dispatch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/device.h"
#include "common/internal.h"
#include "kdt/ops.h"
#include "model/cuda.h"
#include "model/ep.h"

#define MAX_ROWS (1 << 24) /* rows of one forward */

/* Limits of the CUDA kernels: the router keeps a row's expert scores in shared memory and the
 * MoE combine a row's choices; verify_attn's general kernel takes Dv <= 512. */
#define CUDA_MAX_EXPERTS 4096
#define CUDA_MAX_TOPK 64
#define CUDA_MAX_DV 512

#define KNOWN_FLAGS (KDT_MODEL_MOE_DEVICE | KDT_MODEL_GRAPHS | KDT_MODEL_GEMV | KDT_MODEL_FUSED | KDT_MODEL_PDL)
/* A model's flags without $KDT_MODEL_FLAGS: the device MoE and CUDA graphs (tests/test_model_graph
 * passed on the H200, 2026-12-02: graphs bit for bit, the device MoE within 1e-4 of cuBLAS's in f32;
 * the built-in model's decode at batch 1 went from 580 to 2,323 tokens/s), the fused router (issue 21:
 * scripts/gpu_forward2.sh ran it beside flags 3), and PDL in decode- and verify-sized forwards (scripts/gpu_step.sh,
 * 2026-12-02: plain decoding of the shipped model 2,976 -> 3,206 tokens/s on 2 prompts, graphs and direct
 * runs bit for bit as without). $KDT_MODEL_FLAGS=0 turns them off. */
#define DEFAULT_FLAGS (KDT_MODEL_MOE_DEVICE | KDT_MODEL_GRAPHS | KDT_MODEL_FUSED | KDT_MODEL_PDL)

static kdt_status check_cuda(const kdt_model_config *c, kdt_dtype dtype) {
    if (dtype != KDT_BF16 && dtype != KDT_F32)
        return kdt_fail(KDT_ERR_DTYPE, "model: the CUDA backend computes in bf16 or f32, not %s", kdt_dtype_name(dtype));
    if (!kdt_cuda_available())
        return kdt_fail(KDT_ERR_NO_CUDA, "model: no CUDA device is available to this build (use --backend cpu)");
    if (c->n_routed_experts > CUDA_MAX_EXPERTS || c->num_experts_per_tok > CUDA_MAX_TOPK)
        return kdt_fail(KDT_ERR_UNSUPPORTED,
                        "model: the CUDA backend takes at most %d routed experts and %d per token (config: %d, %d)",
                        CUDA_MAX_EXPERTS, CUDA_MAX_TOPK, c->n_routed_experts, c->num_experts_per_tok);
    if (c->router_softmax)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model: field 'scoring_func' softmax (DeepSeek-V2 routing) runs on the CPU backend only");
    if (c->kv_lora_rank > CUDA_MAX_DV)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model: kv_lora_rank = %d: the CUDA attention takes at most %d", c->kv_lora_rank,
                        CUDA_MAX_DV);
    return KDT_OK;
}

kdt_status kdt_model_alloc(kdt_model **out, const kdt_model_config *cfg, kdt_backend backend, kdt_dtype dtype) {
    *out = NULL;
    if (backend != KDT_BACKEND_CPU && backend != KDT_BACKEND_CUDA)
        return kdt_fail(KDT_ERR_INVALID_ARG, "model: unknown backend %d", (int)backend);
    if (backend == KDT_BACKEND_CPU && dtype != KDT_F32 && dtype != KDT_BF16)
        return kdt_fail(KDT_ERR_DTYPE, "model: the CPU backend computes in f32 (or bf16, emulated), not %s",
                        kdt_dtype_name(dtype));
    kdt_status s;
    if (backend == KDT_BACKEND_CUDA && (s = check_cuda(cfg, dtype)) != KDT_OK) return s;
    kdt_model *m = calloc(1, sizeof *m);
    if (!m) return kdt_fail(KDT_ERR_NOMEM, "model: out of memory");
    m->cfg = *cfg;
    m->backend = backend;
    m->dtype = dtype;
    m->e_n = cfg->n_routed_experts;
    const char *flags = getenv("KDT_MODEL_FLAGS");
    m->flags = flags && *flags ? (uint32_t)strtoul(flags, NULL, 0) & KNOWN_FLAGS : DEFAULT_FLAGS;
    m->layers = calloc((size_t)cfg->num_hidden_layers, sizeof *m->layers);
    if (backend == KDT_BACKEND_CUDA) m->dlayers = calloc((size_t)cfg->num_hidden_layers, sizeof *m->dlayers);
    if (!m->layers || (backend == KDT_BACKEND_CUDA && !m->dlayers)) {
        kdt_model_free(m);
        return kdt_fail(KDT_ERR_NOMEM, "model: out of memory");
    }
    *out = m;
    return KDT_OK;
}

float *kdt_model_buf(kdt_model *m, size_t n) {
    if (m->n_allocs == m->cap_allocs) {
        size_t cap = m->cap_allocs ? 2 * m->cap_allocs : 64;
        void **g = realloc(m->allocs, cap * sizeof *g);
        if (!g) return NULL;
        m->allocs = g;
        m->cap_allocs = cap;
    }
    if (n > SIZE_MAX / sizeof(float)) return NULL;
    float *p = calloc(n ? n : 1, sizeof(float));
    if (p) m->allocs[m->n_allocs++] = p;
    return p;
}

void kdt_model_release_bufs(kdt_model *m, size_t from) {
    for (size_t i = from; i < m->n_allocs; i++) free(m->allocs[i]);
    if (from < m->n_allocs) m->n_allocs = from;
}

void kdt_model_free(kdt_model *m) {
    if (!m) return;
    kdt_ep_stop(m);
    kdt_cuda_ctx_free(m->ctx);
    kdt_model_free_device(m);
    kdt_model_release_bufs(m, 0);
    free(m->allocs);
    free(m->layers);
    free(m->dlayers);
    free(m);
}

const kdt_model_config *kdt_model_get_config(const kdt_model *m) { return m ? &m->cfg : NULL; }
kdt_backend kdt_model_backend(const kdt_model *m) { return m->backend; }
kdt_dtype kdt_model_dtype(const kdt_model *m) { return m->dtype; }

kdt_status kdt_model_set_flags(kdt_model *m, uint32_t flags) {
    if (!m) return kdt_fail(KDT_ERR_INVALID_ARG, "model: NULL");
    if (flags & ~KNOWN_FLAGS)
        return kdt_fail(KDT_ERR_INVALID_ARG, "model: unknown flags 0x%x", (unsigned)(flags & ~KNOWN_FLAGS));
    m->flags = flags;
    return KDT_OK;
}

uint32_t kdt_model_flags(const kdt_model *m) { return m ? m->flags : 0; }

void kdt_model_graph_counts(const kdt_model *m, int64_t *replays, int64_t *captures) {
    *replays = *captures = 0;
    if (m && m->backend == KDT_BACKEND_CUDA) kdt_cuda_graph_counts(m->ctx, replays, captures);
}

int kdt_layer_is_moe(const kdt_model_config *c, int32_t layer) {
    return c->n_routed_experts > 0 && layer >= c->first_k_dense_replace && layer % c->moe_layer_freq == 0;
}

/* transformers' YaRN: find_correction_dim of the number of rotations. */
static double correction_dim(double rot, int dim, double base, double max_pos) {
    return dim * log(max_pos / (rot * 2 * M_PI)) / (2 * log(base));
}

/* inv_freq as transformers computes it (float32 results): default rope, or YaRN's blend of
 * interpolated and extrapolated frequencies along a linear ramp over [low, high]. */
kdt_status kdt_model_finish(kdt_model *m) {
    const kdt_model_config *c = &m->cfg;
    const int dim = c->qk_rope_head_dim, half = dim / 2;
    if (!(m->inv_freq = kdt_model_buf(m, (size_t)half))) return kdt_fail(KDT_ERR_NOMEM, "model: out of memory");
    double low = 0, high = 0;
    if (c->rope_yarn) {
        const double omax = c->yarn_original_max_position_embeddings;
        low = correction_dim(c->yarn_beta_fast, dim, c->rope_theta, omax);
        high = correction_dim(c->yarn_beta_slow, dim, c->rope_theta, omax);
        if (c->yarn_truncate) { low = floor(low); high = ceil(high); }
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;
    }
    for (int i = 0; i < half; i++) {
        const float pos_freq = (float)pow(c->rope_theta, (double)(float)(2.0 * i / dim));
        const float extra = 1.0f / pos_freq;
        if (!c->rope_yarn) { m->inv_freq[i] = extra; continue; }
        const float inter = 1.0f / ((float)c->yarn_factor * pos_freq);
        float ramp = (float)(((float)i - (float)low) / (float)(high - low));
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        const float ef = 1.0f - ramp; /* extrapolation weight */
        m->inv_freq[i] = inter * (1.0f - ef) + extra * ef;
    }
    if (m->backend == KDT_BACKEND_CPU && m->dtype == KDT_BF16) kdt_round_weights_bf16(m);
    if (m->backend != KDT_BACKEND_CUDA) return KDT_OK;
    kdt_status s = kdt_model_dbuf(m, (size_t)half * sizeof(float), (void **)&m->d_inv_freq);
    if (s == KDT_OK) s = kdt_dev_h2d(m->d_inv_freq, m->inv_freq, (size_t)half * sizeof(float));
    if (s == KDT_OK) s = kdt_dev_sync(); /* the uploads are done before a forward on any stream */
    return s;
}

/* ---- cache ---- */

static int on_cuda(const kdt_cache *c) { return c->model->backend == KDT_BACKEND_CUDA; }

/* The pools' dtype: the model's on CUDA; f32 on the CPU, whose bf16 emulation stores rounded values. */
static kdt_dtype cache_dtype(const kdt_cache *c) { return on_cuda(c) ? c->model->dtype : KDT_F32; }

/* CUDA: the device pools (poisoned with NaN, so that a read of a row never written shows), the
 * device copies of the block table and lengths, and kdt_cache_commit's scratch. */
static kdt_status cache_alloc_cuda(kdt_cache *c, uint64_t pool_elems) {
    const int32_t L = c->model->cfg.num_hidden_layers;
    const size_t es = kdt_dtype_size(cache_dtype(c)), R = (size_t)c->max_requests, MB = (size_t)c->MB;
    if (!(c->dpool = calloc((size_t)L, sizeof *c->dpool))) return kdt_fail(KDT_ERR_NOMEM, "cache: out of memory");
    kdt_status s = KDT_OK;
    for (int32_t l = 0; l < L && s == KDT_OK; l++) {
        s = kdt_dev_alloc(&c->dpool[l], (size_t)pool_elems * es);
        if (s == KDT_OK) s = kdt_cuda_fill_bytes(c->dpool[l], 0xFF, (size_t)pool_elems * es);
    }
    if (s == KDT_OK) s = kdt_dev_alloc((void **)&c->d_block_table, R * MB * sizeof(int32_t));
    if (s == KDT_OK) s = kdt_dev_alloc((void **)&c->d_kv_len, R * sizeof(int32_t));
    /* commit: table [R, MB], kv_len, accept_len, new_len, status [R] each, accept_index [R, max tree] */
    if (s == KDT_OK) s = kdt_dev_alloc((void **)&c->d_commit, R * (MB + 4 + KDT_MODEL_MAX_TREE) * sizeof(int32_t));
    return s;
}

/* After the host changed the block table or lengths: the device copies are brought up to date
 * by the next kdt_cache_layer, their only reader (the forward and the commit take their rows from
 * the host), so that a forward does not pay two blocking copies and a device-wide wait. */
static kdt_status cache_sync(kdt_cache *c) {
    c->dev_stale = on_cuda(c);
    return KDT_OK;
}

static kdt_status cache_sync_device(kdt_cache *c) {
    kdt_status s = kdt_dev_h2d(c->d_block_table, c->block_table, (size_t)c->max_requests * c->MB * sizeof(int32_t));
    if (s == KDT_OK) s = kdt_dev_h2d(c->d_kv_len, c->kv_len, (size_t)c->max_requests * sizeof(int32_t));
    if (s == KDT_OK) s = kdt_dev_sync(); /* landed before work on any stream reads them */
    if (s == KDT_OK) c->dev_stale = 0;
    return s;
}

kdt_status kdt_cache_create(const kdt_model *m, int32_t max_requests, int32_t max_len, int32_t num_blocks, kdt_cache **out) {
    *out = NULL;
    if (!m) return kdt_fail(KDT_ERR_INVALID_ARG, "cache: model is NULL");
    if (max_requests < 1 || max_len < 1)
        return kdt_fail(KDT_ERR_INVALID_ARG, "cache: max_requests = %d and max_len = %d must be >= 1", max_requests, max_len);
    const int64_t MB = ((int64_t)max_len + KDT_CACHE_BLOCK - 1) / KDT_CACHE_BLOCK;
    const int64_t NB = num_blocks > 0 ? num_blocks : MB * max_requests;
    if (num_blocks < 0 || NB > INT32_MAX || MB * max_requests > INT32_MAX)
        return kdt_fail(KDT_ERR_INVALID_ARG, "cache: num_blocks = %d invalid or the cache is too large", num_blocks);
    const int32_t Dqk = m->cfg.kv_lora_rank + m->cfg.qk_rope_head_dim, L = m->cfg.num_hidden_layers;
    const int cuda = m->backend == KDT_BACKEND_CUDA;
    uint64_t pool_floats;
    if (!kdt_mul_u64((uint64_t)NB * KDT_CACHE_BLOCK, (uint64_t)Dqk, &pool_floats) || pool_floats > SIZE_MAX / sizeof(float))
        return kdt_fail(KDT_ERR_NOMEM, "cache: %lld blocks of %d x %d floats do not fit in memory", (long long)NB,
                        KDT_CACHE_BLOCK, Dqk);
    kdt_cache *c = calloc(1, sizeof *c);
    if (!c) return kdt_fail(KDT_ERR_NOMEM, "cache: out of memory");
    c->model = m;
    c->max_requests = max_requests;
    c->max_len = max_len;
    c->NB = (int32_t)NB;
    c->MB = (int32_t)MB;
    c->Dqk = Dqk;
    c->pool = calloc((size_t)L, sizeof *c->pool);
    c->block_table = malloc((size_t)MB * max_requests * sizeof(int32_t));
    c->kv_len = calloc((size_t)max_requests, sizeof(int32_t));
    c->free_blocks = malloc((size_t)NB * sizeof(int32_t));
    int ok = c->pool && c->block_table && c->kv_len && c->free_blocks;
    for (int32_t l = 0; ok && !cuda && l < L; l++) ok = (c->pool[l] = calloc((size_t)pool_floats, sizeof(float))) != NULL;
    if (!ok) {
        kdt_cache_free(c);
        return kdt_fail(KDT_ERR_NOMEM, "cache: out of memory for %lld blocks x %d layers", (long long)NB, L);
    }
    for (int64_t i = 0; i < MB * max_requests; i++) c->block_table[i] = -1;
    for (int32_t i = 0; i < c->NB; i++) c->free_blocks[i] = c->NB - 1 - i; /* block 0 on top */
    c->n_free = c->NB;
    kdt_status s = cuda ? cache_alloc_cuda(c, pool_floats) : KDT_OK;
    if (s == KDT_OK) s = cache_sync(c);
    if (s != KDT_OK) {
        kdt_cache_free(c);
        return s;
    }
    *out = c;
    return KDT_OK;
}

void kdt_cache_free(kdt_cache *c) {
    if (!c) return;
    for (int32_t l = 0; l < c->model->cfg.num_hidden_layers; l++) {
        if (c->pool) free(c->pool[l]);
        if (c->dpool) kdt_dev_free(c->dpool[l]);
    }
    free(c->pool);
    free(c->dpool);
    kdt_dev_free(c->d_block_table);
    kdt_dev_free(c->d_kv_len);
    kdt_dev_free(c->d_commit);
    free(c->block_table);
    free(c->kv_len);
    free(c->free_blocks);
    free(c);
}

static int32_t blocks_for(int32_t len) { return (int32_t)(((int64_t)len + KDT_CACHE_BLOCK - 1) / KDT_CACHE_BLOCK); }

int32_t kdt_cache_len(const kdt_cache *c, int32_t req) {
    return c && req >= 0 && req < c->max_requests ? c->kv_len[req] : -1;
}

int32_t kdt_cache_num_blocks(const kdt_cache *c) { return c ? c->NB : 0; }
int32_t kdt_cache_free_blocks(const kdt_cache *c) { return c ? c->n_free : 0; }

/* Shortens req to len rows, giving back the blocks past them. */
static void shrink(kdt_cache *c, int32_t req, int32_t len) {
    int32_t *table = c->block_table + (size_t)req * c->MB;
    for (int32_t t = blocks_for(len); t < blocks_for(c->kv_len[req]); t++) {
        c->free_blocks[c->n_free++] = table[t];
        table[t] = -1;
    }
    c->kv_len[req] = len;
}

/* Grows req to len rows (the caller checked that enough blocks are free). */
static void grow(kdt_cache *c, int32_t req, int32_t len) {
    int32_t *table = c->block_table + (size_t)req * c->MB;
    for (int32_t t = blocks_for(c->kv_len[req]); t < blocks_for(len); t++) table[t] = c->free_blocks[--c->n_free];
    c->kv_len[req] = len;
}

kdt_status kdt_cache_truncate(kdt_cache *c, int32_t req, int32_t len) {
    if (!c || req < 0 || req >= c->max_requests)
        return kdt_fail(KDT_ERR_INVALID_ARG, "cache: request %d outside 0 .. %d", req, c ? c->max_requests - 1 : -1);
    if (len < 0 || len > c->kv_len[req])
        return kdt_fail(KDT_ERR_INVALID_ARG, "cache: request %d: truncate to %d rows, it holds %d", req, len, c->kv_len[req]);
    shrink(c, req, len);
    return cache_sync(c);
}

kdt_status kdt_cache_reset(kdt_cache *c, int32_t req) { return kdt_cache_truncate(c, req, 0); }

kdt_status kdt_cache_layer(const kdt_cache *c, int32_t layer, kdt_cache_layer_view *out) {
    if (!c || layer < 0 || layer >= c->model->cfg.num_hidden_layers)
        return kdt_fail(KDT_ERR_INVALID_ARG, "cache: layer %d out of range", layer);
    const int cuda = on_cuda(c);
    kdt_status s = c->dev_stale ? cache_sync_device((kdt_cache *)c) : KDT_OK; /* the device copies are a cache of the host's */
    if (s != KDT_OK) return s;
    *out = (kdt_cache_layer_view){.kv_cache = cuda ? c->dpool[layer] : (void *)c->pool[layer], .dtype = cache_dtype(c),
                                  .NB = c->NB, .BS = KDT_CACHE_BLOCK, .Dqk = c->Dqk, .Dv = c->model->cfg.kv_lora_rank,
                                  .block_table = cuda ? c->d_block_table : c->block_table, .MB = c->MB,
                                  .kv_len = cuda ? c->d_kv_len : c->kv_len};
    return KDT_OK;
}

/* Request ids of a batch: each in range and none twice. */
static kdt_status check_reqs(const kdt_cache *c, int32_t B, const int32_t *req, const char *what) {
    if (B < 1 || B > c->max_requests)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: B = %d outside 1 .. %d (the cache's max_requests)", what, B, c->max_requests);
    if (!req) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: req is NULL", what);
    for (int32_t b = 0; b < B; b++) {
        if (req[b] < 0 || req[b] >= c->max_requests)
            return kdt_fail(KDT_ERR_INVALID_ARG, "%s: req[%d] = %d outside 0 .. %d", what, b, req[b], c->max_requests - 1);
        for (int32_t a = 0; a < b; a++)
            if (req[a] == req[b]) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: request %d appears twice (req[%d], req[%d])", what, req[b], a, b);
    }
    return KDT_OK;
}

/* kv_commit on every layer: host arrays on the CPU; on CUDA copied to the cache's scratch, the
 * moves run on the device and new_len and status come back. */
static kdt_status commit_layers(kdt_cache *c, kdt_kv_commit_params p, int32_t *new_len, int32_t *status) {
    const int32_t L = c->model->cfg.num_hidden_layers, B = p.B;
    kdt_status s = KDT_OK;
    if (!on_cuda(c)) {
        for (int32_t l = 0; l < L && s == KDT_OK; l++) {
            p.kv_cache = c->pool[l];
            s = kdt_kv_commit(&p, KDT_BACKEND_CPU, NULL);
        }
        return s;
    }
    int32_t *d_table = c->d_commit, *d_len = d_table + (size_t)B * c->MB, *d_alen = d_len + B, *d_new = d_alen + B;
    int32_t *d_status = d_new + B, *d_idx = d_status + B;
    if ((s = kdt_dev_h2d(d_table, p.block_table, (size_t)B * c->MB * sizeof(int32_t))) ||
        (s = kdt_dev_h2d(d_len, p.kv_len, (size_t)B * sizeof(int32_t))) ||
        (s = kdt_dev_h2d(d_alen, p.accept_len, (size_t)B * sizeof(int32_t))) ||
        (s = kdt_dev_h2d(d_idx, p.accept_index, (size_t)B * p.Q * sizeof(int32_t))))
        return s;
    p.block_table = d_table;
    p.kv_len = d_len;
    p.accept_len = d_alen;
    p.accept_index = d_idx;
    p.new_kv_len = d_new;
    p.status = d_status;
    for (int32_t l = 0; l < L && s == KDT_OK; l++) {
        p.kv_cache = c->dpool[l];
        s = kdt_kv_commit(&p, KDT_BACKEND_CUDA, NULL);
    }
    if (s == KDT_OK) s = kdt_dev_d2h(new_len, d_new, (size_t)B * sizeof(int32_t));
    if (s == KDT_OK) s = kdt_dev_d2h(status, d_status, (size_t)B * sizeof(int32_t));
    return s;
}

kdt_status kdt_cache_commit(kdt_cache *c, int32_t B, const int32_t *req, int32_t Q, const int32_t *accept_index,
                            const int32_t *accept_len) {
    if (!c) return kdt_fail(KDT_ERR_INVALID_ARG, "cache_commit: cache is NULL");
    kdt_status s = check_reqs(c, B, req, "cache_commit");
    if (s != KDT_OK) return s;
    if (Q < 1 || Q > KDT_MODEL_MAX_TREE || !accept_index || !accept_len)
        return kdt_fail(KDT_ERR_INVALID_ARG, "cache_commit: Q = %d outside 1 .. %d or a NULL input", Q, KDT_MODEL_MAX_TREE);
    int32_t *table = malloc((size_t)B * c->MB * sizeof(int32_t)), *len = malloc((size_t)B * 3 * sizeof(int32_t));
    if (!table || !len) { free(table); free(len); return kdt_fail(KDT_ERR_NOMEM, "cache_commit: out of memory"); }
    int32_t *new_len = len + B, *status = len + 2 * B;
    for (int32_t b = 0; b < B; b++) {
        memcpy(table + (size_t)b * c->MB, c->block_table + (size_t)req[b] * c->MB, (size_t)c->MB * sizeof(int32_t));
        len[b] = c->kv_len[req[b]];
    }
    const kdt_kv_commit_params p = {.B = B, .Q = Q, .NB = c->NB, .BS = KDT_CACHE_BLOCK, .Dqk = c->Dqk,
                                    .dtype = cache_dtype(c), .block_table = table, .MB = c->MB, .kv_len = len,
                                    .accept_index = accept_index, .accept_len = accept_len, .new_kv_len = new_len,
                                    .status = status};
    if ((s = commit_layers(c, p, new_len, status)) != KDT_OK) {
        free(table);
        free(len);
        return s;
    }
    for (int32_t b = 0; b < B && s == KDT_OK; b++) {
        if (status[b] != 0 || new_len[b] < 0 || new_len[b] > len[b])
            s = kdt_fail(KDT_ERR_INVALID_ARG, "cache_commit: request %d: kv_commit status %d (its rows were left as they were)",
                         req[b], status[b]);
    }
    /* Requests that committed are shortened even when another one was malformed. */
    for (int32_t b = 0; b < B; b++)
        if (status[b] == 0 && new_len[b] >= 0 && new_len[b] <= len[b]) shrink(c, req[b], new_len[b]);
    free(table);
    free(len);
    kdt_status sync = cache_sync(c);
    return s != KDT_OK ? s : sync;
}

/* ---- forward ---- */

static kdt_status check_batch(const kdt_model *m, const kdt_cache *c, const kdt_batch *bt, int64_t *R_out) {
    kdt_status s = check_reqs(c, bt->B, bt->req, "forward");
    if (s != KDT_OK) return s;
    if (!bt->n_rows || (!bt->tokens && !bt->dev_tokens)) return kdt_fail(KDT_ERR_INVALID_ARG, "forward: n_rows or tokens is NULL");
    if ((bt->dev_tokens || bt->argmax || bt->no_wait) && m->backend != KDT_BACKEND_CUDA)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "forward: dev_tokens, argmax and no_wait are for the CUDA backend");
    if (bt->logits_rows != KDT_LOGITS_ALL && bt->logits_rows != KDT_LOGITS_LAST)
        return kdt_fail(KDT_ERR_INVALID_ARG, "forward: logits_rows = %d is not KDT_LOGITS_ALL or KDT_LOGITS_LAST", (int)bt->logits_rows);
    int64_t R = 0, blocks = 0, mask_off = 0;
    for (int32_t b = 0; b < bt->B; b++) {
        const int32_t n = bt->n_rows[b], have = c->kv_len[bt->req[b]];
        if (n < 1) return kdt_fail(KDT_ERR_INVALID_ARG, "forward: n_rows[%d] = %d, need >= 1", b, n);
        if (bt->tree_mask && n > KDT_MODEL_MAX_TREE)
            return kdt_fail(KDT_ERR_INVALID_ARG, "forward: request %d: a tree of %d rows, at most %d", bt->req[b], n, KDT_MODEL_MAX_TREE);
        if ((int64_t)have + n > c->max_len)
            return kdt_fail(KDT_ERR_INVALID_ARG, "forward: request %d: %d + %d rows exceed the cache's max_len %d", bt->req[b], have,
                            n, c->max_len);
        blocks += blocks_for(have + n) - blocks_for(have);
        for (int32_t i = 0; i < n; i++) {
            const int32_t tok = bt->dev_tokens ? 0 : bt->tokens[R + i]; /* device tokens: an argmax's, in range */
            if (tok < 0 || tok >= m->cfg.vocab_size)
                return kdt_fail(KDT_ERR_INVALID_ARG, "forward: token %d of request %d is %d, outside 0 .. %d", i, bt->req[b], tok,
                                m->cfg.vocab_size - 1);
            if (bt->positions && bt->positions[R + i] < 0)
                return kdt_fail(KDT_ERR_INVALID_ARG, "forward: position %d of request %d is %d, negative", i, bt->req[b],
                                bt->positions[R + i]);
        }
        if (bt->tree_mask) {
            for (int64_t k = 0; k < (int64_t)n * n; k++)
                if (bt->tree_mask[mask_off + k] > 1)
                    return kdt_fail(KDT_ERR_INVALID_ARG, "forward: tree_mask of request %d: row %lld column %lld is %u, not 0 or 1",
                                    bt->req[b], (long long)(k / n), (long long)(k % n), bt->tree_mask[mask_off + k]);
            mask_off += (int64_t)n * n;
        }
        R += n;
        if (R > MAX_ROWS) return kdt_fail(KDT_ERR_INVALID_ARG, "forward: more than %d rows in one call", MAX_ROWS);
    }
    if (blocks > c->n_free)
        return kdt_fail(KDT_ERR_NOMEM, "forward: the rows need %lld more cache blocks, %d are free", (long long)blocks, c->n_free);
    *R_out = R;
    return KDT_OK;
}

kdt_status kdt_model_forward(kdt_model *m, kdt_cache *c, const kdt_batch *bt, float *logits, float *hidden, void *stream) {
    if (!m || !c || !bt) return kdt_fail(KDT_ERR_INVALID_ARG, "forward: model, cache or batch is NULL");
    if (c->model != m) return kdt_fail(KDT_ERR_INVALID_ARG, "forward: the cache was made for another model");
    if (!kdt_ep_driver(m)) return kdt_fail(KDT_ERR_INVALID_ARG, "forward: a rank > 0 of an expert-parallel model only serves experts");
    int64_t R = 0;
    kdt_status s = check_batch(m, c, bt, &R);
    if (s != KDT_OK) return s;
    if ((m->mtp_eh || m->d_mtp_eh) && !bt->mtp_hidden) return kdt_fail(KDT_ERR_INVALID_ARG, "forward: an MTP model needs the batch's mtp_hidden");
    int32_t *start = malloc((size_t)bt->B * sizeof *start), *pos = malloc((size_t)R * sizeof *pos);
    if (!start || !pos) { free(start); free(pos); return kdt_fail(KDT_ERR_NOMEM, "forward: out of memory"); }
    for (int32_t b = 0, r = 0; b < bt->B; b++) {
        start[b] = c->kv_len[bt->req[b]];
        for (int32_t i = 0; i < bt->n_rows[b]; i++, r++) pos[r] = bt->positions ? bt->positions[r] : start[b] + i;
        grow(c, bt->req[b], start[b] + bt->n_rows[b]);
    }
    s = m->backend == KDT_BACKEND_CUDA ? kdt_forward_cuda(m, c, bt, start, pos, logits, hidden, stream)
                                       : kdt_forward_cpu(m, c, bt, start, pos, logits, hidden);
    if (s != KDT_OK)
        for (int32_t b = 0; b < bt->B; b++) shrink(c, bt->req[b], start[b]);
    free(start);
    free(pos);
    kdt_status sync = cache_sync(c);
    return s != KDT_OK ? s : sync;
}

kdt_status kdt_model_set_hidden_layers(kdt_model *m, int32_t n, const int32_t *layers) {
    if (!m || n < 0 || n > KDT_MODEL_MAX_HIDDEN_LAYERS || (n > 0 && !layers))
        return kdt_fail(KDT_ERR_INVALID_ARG, "set_hidden_layers: n = %d, want 0 .. %d layers", n, KDT_MODEL_MAX_HIDDEN_LAYERS);
    for (int32_t i = 0; i < n; i++)
        if (layers[i] < 0 || layers[i] >= m->cfg.num_hidden_layers)
            return kdt_fail(KDT_ERR_INVALID_ARG, "set_hidden_layers: layer %d is outside 0 .. %d", layers[i],
                            m->cfg.num_hidden_layers - 1);
    for (int32_t i = 0; i < n; i++) m->hid_layers[i] = layers[i];
    m->n_hid_layers = n;
    return KDT_OK;
}

kdt_status kdt_model_embeddings(const kdt_model *m, const void **embed, const void **lm_head) {
    if (!m || !embed || !lm_head) return kdt_fail(KDT_ERR_INVALID_ARG, "embeddings: NULL argument");
    *embed = m->backend == KDT_BACKEND_CUDA ? m->d_embed : (const void *)m->embed;
    *lm_head = m->backend == KDT_BACKEND_CUDA ? m->d_lm_head : (const void *)m->lm_head;
    if (!*embed || !*lm_head) return kdt_fail(KDT_ERR_UNSUPPORTED, "embeddings: the model holds no embedding or LM head");
    return KDT_OK;
}
