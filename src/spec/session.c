/* The session API over the loop (include/kdt/spec.h, docs/spec.md "Sessions"): requests join
 * empty slots between steps, are prefilled in chunks, then decode until they end; each request
 * reserves its worst case of cache blocks when it is added. kdt_spec_generate is a session holding
 * its whole batch from the start. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "kdt/ops.h"
#include "spec/loop.h"

/* ---- the session ---- */

static int32_t blocks_for(int64_t rows) { return (int32_t)((rows + KDT_CACHE_BLOCK - 1) / KDT_CACHE_BLOCK); }

/* A request's worst case: its history without the root, plus one tree being verified. */
static int32_t request_blocks(const loop *L, int32_t prompt_len, int32_t max_new) {
    return blocks_for((int64_t)prompt_len + max_new + L->Q);
}

kdt_status kdt_spec_session_create(kdt_model *m, kdt_drafter *dr, const kdt_spec_params *p, int32_t max_slots, int32_t max_len,
                                   int32_t num_blocks, void *stream, kdt_spec_session **out) {
    if (!out) return kdt_fail(KDT_ERR_INVALID_ARG, "spec_session_create: out is NULL");
    *out = NULL;
    if (!m || !p || max_slots < 1 || max_len < 1 || num_blocks < 0 || p->prefill_chunk < 0)
        return kdt_fail(KDT_ERR_INVALID_ARG, "spec_session_create: model or params missing, max_slots %d, max_len %d (need >= 1), "
                        "num_blocks %d or prefill_chunk %d negative", max_slots, max_len, num_blocks, p ? p->prefill_chunk : 0);
    if (dr) {
        if (p->depth < 1 || p->depth > KDT_TREE_MAX_DEPTH || p->topk < 1 || p->topk > KDT_TREE_MAX_TOPK || p->budget < 1 ||
            p->budget > KDT_TREE_MAX_BUDGET || p->budget + 1 > KDT_MODEL_MAX_TREE)
            return kdt_fail(KDT_ERR_INVALID_ARG, "spec_session: depth %d, topk %d, budget %d: need 1 .. %d, 1 .. %d, 1 .. %d",
                            p->depth, p->topk, p->budget, KDT_TREE_MAX_DEPTH, KDT_TREE_MAX_TOPK, KDT_TREE_MAX_BUDGET);
        if (!dr->begin || !dr->propose || !dr->observe)
            return kdt_fail(KDT_ERR_INVALID_ARG, "spec_session: drafter '%s' lacks begin, propose or observe", dr->name ? dr->name : "?");
    }
    if ((int64_t)max_len + p->budget + 1 > INT32_MAX / 2)
        return kdt_fail(KDT_ERR_INVALID_ARG, "spec_session_create: max_len %d is too long", max_len);
    loop *L = calloc(1, sizeof *L);
    if (!L) return kdt_fail(KDT_ERR_NOMEM, "spec_session_create: out of memory");
    const kdt_model_config *cf = kdt_model_get_config(m);
    /* A drafter that reads several target layers gets them side by side: [R, n_layers * hidden]. */
    const int32_t n_layers = dr && dr->wants_hidden ? dr->n_hidden_layers : 0;
    *L = (loop){.m = m, .dr = dr, .p = *p, .be = kdt_model_backend(m), .stream = stream, .B = max_slots, .max_len = max_len,
                .D = dr ? p->depth : 1, .K = dr ? p->topk : 1, .N = dr ? p->budget : 1, .V = cf->vocab_size,
                .hid = cf->hidden_size * (n_layers > 0 ? n_layers : 1), .hidden_layers = n_layers > 0};
    L->st = &L->stats;
    L->Q = L->N + 1;
    L->host_tree = dr && dr->host_candidates && L->be == KDT_BACKEND_CUDA;
    L->profile = L->be == KDT_BACKEND_CUDA && getenv("KDT_SPEC_PROFILE") && strcmp(getenv("KDT_SPEC_PROFILE"), "0") != 0;
    const char *pipe = getenv("KDT_SPEC_PIPELINE"); /* "0": plain decoding unpipelined, to compare */
    L->pipe = !dr && !p->sync_timing && !L->profile && !(pipe && strcmp(pipe, "0") == 0);
    kdt_status s = kdt_spec_loop_alloc(L, num_blocks);
    if (s == KDT_OK && n_layers > 0) s = kdt_model_set_hidden_layers(m, n_layers, dr->hidden_layers);
    if (s == KDT_OK && dr) {
        const kdt_draft_setup set = {.slots = max_slots, .max_len = max_len, .D = L->D, .K = L->K, .vocab_size = L->V,
                                     .hidden_size = cf->hidden_size, .backend = L->be, .stream = stream};
        s = dr->begin(dr->state, &set);
    }
    if (s != KDT_OK) {
        kdt_spec_session_free(L);
        return s;
    }
    *out = L;
    return KDT_OK;
}

void kdt_spec_session_free(kdt_spec_session *L) {
    if (!L) return;
    if (L->hidden_layers) kdt_model_set_hidden_layers(L->m, 0, NULL);
    kdt_spec_loop_free(L);
    free(L);
}

/* Every rule a request must meet, in one place (kdt serve turns a refusal into its 400). */
kdt_status kdt_spec_session_check(const kdt_spec_session *L, const kdt_spec_request *r) {
    if (!L || !r) return kdt_fail(KDT_ERR_INVALID_ARG, "spec_session: session or request is NULL");
    if (!r->prompt || r->prompt_len < 1)
        return kdt_fail(KDT_ERR_INVALID_ARG, "prompt: %d tokens; a request needs at least one", r ? r->prompt_len : 0);
    if (r->max_new < 0 || (r->max_new > 0 && !r->out))
        return kdt_fail(KDT_ERR_INVALID_ARG, "max_new: %d (need >= 0, and an output array)", r->max_new);
    if ((int64_t)r->prompt_len + r->max_new > L->max_len)
        return kdt_fail(KDT_ERR_INVALID_ARG, "max_new: the prompt's %d tokens plus %d new exceed the context of %d", r->prompt_len,
                        r->max_new, L->max_len);
    for (int32_t i = 0; i < r->prompt_len; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= L->V)
            return kdt_fail(KDT_ERR_INVALID_ARG, "prompt: token %d at position %d is outside the vocabulary (0 .. %d)", r->prompt[i],
                            i, L->V - 1);
    if (!isfinite(r->temperature) || r->temperature < 0.0f)
        return kdt_fail(KDT_ERR_INVALID_ARG, "temperature: %g (need finite, >= 0)", (double)r->temperature);
    if (r->top_k < 0) return kdt_fail(KDT_ERR_INVALID_ARG, "top_k: %d (need >= 0; 0 is off)", r->top_k);
    if (!(r->top_p >= 0.0f && r->top_p <= 1.0f)) return kdt_fail(KDT_ERR_INVALID_ARG, "top_p: %g (need 0 .. 1)", (double)r->top_p);
    return KDT_OK;
}

int kdt_spec_session_fits(const kdt_spec_session *L, int32_t prompt_len, int32_t max_new) {
    return L && L->n_reserved + request_blocks(L, prompt_len, max_new) <= kdt_cache_num_blocks(L->cache);
}

kdt_status kdt_spec_session_add(kdt_spec_session *L, int32_t slot, kdt_spec_request *r) {
    kdt_status s = kdt_spec_session_check(L, r);
    if (s != KDT_OK) return s;
    if (slot < 0 || slot >= L->B || L->reqs[slot])
        return kdt_fail(KDT_ERR_INVALID_ARG, "spec_session_add: slot %d is %s", slot, slot < 0 || slot >= L->B ? "out of range" : "taken");
    const int32_t need = request_blocks(L, r->prompt_len, r->max_new), total = kdt_cache_num_blocks(L->cache);
    if (L->n_reserved + need > total)
        return kdt_fail(KDT_ERR_NOMEM, "spec_session_add: the request needs %d cache blocks, %d of %d are free", need,
                        total - L->n_reserved, total);
    if (L->used[slot] && L->dr) {
        if (!L->dr->reset)
            return kdt_fail(KDT_ERR_UNSUPPORTED, "spec_session_add: drafter '%s' cannot reuse slot %d (no reset)", L->dr->name, slot);
        if ((s = L->dr->reset(L->dr->state, slot)) != KDT_OK) return s;
    }
    r->n_out = r->steps = r->accepted = 0;
    memcpy(L->hist[slot], r->prompt, (size_t)r->prompt_len * sizeof **L->hist);
    L->hist_len[slot] = r->prompt_len;
    L->filled[slot] = 0;
    L->done[slot] = r->max_new == 0;
    L->reserved[slot] = need;
    L->n_reserved += need;
    L->used[slot] = 1;
    L->reqs[slot] = r;
    return KDT_OK;
}

kdt_status kdt_spec_session_remove(kdt_spec_session *L, int32_t slot) {
    if (!L || slot < 0 || slot >= L->B)
        return kdt_fail(KDT_ERR_INVALID_ARG, "spec_session_remove: slot %d out of range", slot);
    if (!L->reqs[slot]) return KDT_OK;
    kdt_status s = kdt_spec_decode_cancel(L); /* a forward in flight may hold the slot's next row */
    if (s != KDT_OK) return s;
    L->reqs[slot] = NULL;
    L->n_reserved -= L->reserved[slot];
    L->reserved[slot] = 0;
    return kdt_cache_reset(L->cache, slot);
}

kdt_status kdt_spec_session_step(kdt_spec_session *L, int32_t *emitted) {
    if (!L) return kdt_fail(KDT_ERR_INVALID_ARG, "spec_session_step: session is NULL");
    for (int32_t s = 0; emitted && s < L->B; s++) emitted[s] = L->reqs[s] ? -L->reqs[s]->n_out : 0;
    const kdt_status s = kdt_spec_loop_step(L);
    for (int32_t b = 0; emitted && b < L->B; b++) emitted[b] += L->reqs[b] ? L->reqs[b]->n_out : 0;
    return s;
}

int32_t kdt_spec_session_pending(const kdt_spec_session *L) {
    int32_t n = 0;
    for (int32_t s = 0; L && s < L->B; s++) n += L->reqs[s] && !L->done[s];
    return n;
}

int kdt_spec_session_finished(const kdt_spec_session *L, int32_t slot) {
    return L && slot >= 0 && slot < L->B && L->reqs[slot] && L->done[slot];
}

const kdt_spec_stats *kdt_spec_session_stats(const kdt_spec_session *L) { return L ? L->st : NULL; }

void kdt_spec_session_blocks(const kdt_spec_session *L, int32_t *used, int32_t *reserved, int32_t *total) {
    *total = L ? kdt_cache_num_blocks(L->cache) : 0;
    *used = L ? *total - kdt_cache_free_blocks(L->cache) : 0;
    *reserved = L ? L->n_reserved : 0;
}

/* ---- the batch call: a session holding every request from the start ---- */

kdt_status kdt_spec_generate(kdt_model *m, kdt_drafter *dr, const kdt_spec_params *p, int32_t B, kdt_spec_request *reqs,
                             kdt_spec_stats *stats, void *stream) {
    if (!m || !p || !reqs || B < 1) return kdt_fail(KDT_ERR_INVALID_ARG, "spec_generate: model, params or requests missing, or B = %d < 1", B);
    const double t0 = kdt_spec_now();
    int32_t max_len = 1;
    for (int32_t b = 0; b < B; b++) {
        const kdt_spec_request *r = &reqs[b];
        if (!r->prompt || r->prompt_len < 1 || r->max_new < 0 || (r->max_new > 0 && !r->out))
            return kdt_fail(KDT_ERR_INVALID_ARG, "spec_generate: request %d: prompt_len %d (need >= 1), max_new %d (>= 0) or a NULL pointer",
                            b, r->prompt_len, r->max_new);
        if ((int64_t)r->prompt_len + r->max_new + p->budget + 1 > INT32_MAX / 2)
            return kdt_fail(KDT_ERR_INVALID_ARG, "spec_generate: request %d is too long", b);
        if (r->prompt_len + r->max_new > max_len) max_len = r->prompt_len + r->max_new;
    }
    kdt_spec_session *S = NULL;
    kdt_status s = kdt_spec_session_create(m, dr, p, B, max_len, 0, stream, &S);
    for (int32_t b = 0; s == KDT_OK && b < B; b++)
        if ((s = kdt_spec_session_add(S, b, &reqs[b])) != KDT_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", kdt_last_error());
            kdt_fail(s, "spec_generate: request %d: %s", b, why);
        }
    while (s == KDT_OK && kdt_spec_session_pending(S) > 0) s = kdt_spec_session_step(S, NULL);
    if (stats) {
        *stats = S ? S->stats : (kdt_spec_stats){0};
        stats->t_total = kdt_spec_now() - t0;
    }
    kdt_spec_session_free(S);
    return s;
}
