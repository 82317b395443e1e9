/* The speculative decoding loop (include/kdt/spec.h, docs/spec.md).
 *
 * Per step, for the unfinished requests (Ba of them, in slot order): propose -> tree_build ->
 * one target forward over the tree rows -> argmax -> tree_accept -> emit -> cache commit ->
 * observe. The drafter's candidates, the tree, the logits, target_pred and the acceptance live
 * in the backend's memory and every op runs on the model's backend. The model API takes its
 * rows (tokens, positions, mask) and the cache commit its accepted paths from host memory, so
 * on CUDA a step makes two copies to the host: the tree block (num_nodes, node_token, positions,
 * tree_mask) before the forward, and the acceptance block (accept_len, status, accept_tokens,
 * accept_index) after tree_accept, which also brings the emitted tokens. A host drafter's greedy
 * step keeps its tree on the host instead (host_tree): one copy, target_pred.
 *
 * The session API over this is session.c. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/device.h"
#include "common/internal.h"
#include "common/sample_math.h"
#include "kdt/ops.h"
#include "spec/internal.h"
#include "spec/loop.h"

double kdt_spec_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Adds the time since *t to *acc (after the stream drains, when asked to) and restarts *t. */
static kdt_status lap(loop *L, double *t, double *acc) {
    if (L->be == KDT_BACKEND_CUDA && (L->p.sync_timing || L->profile)) {
        kdt_status s = kdt_spec_stream_sync(L->stream);
        if (s != KDT_OK) return s;
    }
    const double t1 = kdt_spec_now();
    *acc += t1 - *t;
    *t = t1;
    return KDT_OK;
}

/* ---- buffers ---- */

static void *be_alloc(loop *L, size_t n, kdt_status *s) {
    if (*s != KDT_OK) return NULL;
    void *p = NULL;
    if (L->be == KDT_BACKEND_CPU) {
        if (!(p = malloc(n ? n : 1))) *s = kdt_fail(KDT_ERR_NOMEM, "speculative loop: out of memory (%zu bytes)", n);
    } else {
        *s = kdt_dev_alloc(&p, n);
    }
    return p;
}

static void be_free(const loop *L, void *p) {
    if (L->be == KDT_BACKEND_CPU) free(p);
    else kdt_dev_free(p);
}

/* Host memory; on CPU the backend buffer itself when one is given. */
static void *host_alloc(loop *L, void *same, size_t n, kdt_status *s) {
    if (*s != KDT_OK) return NULL;
    if (same && L->be == KDT_BACKEND_CPU) return same;
    void *p = malloc(n ? n : 1);
    if (!p) *s = kdt_fail(KDT_ERR_NOMEM, "speculative loop: out of memory (%zu bytes)", n);
    return p;
}

static void host_free(const loop *L, void *p, void *same) {
    if (p != same || L->be != KDT_BACKEND_CPU) free(p);
}

static kdt_status to_backend(loop *L, void *dst, const void *src, size_t n) {
    return L->be == KDT_BACKEND_CPU ? KDT_OK : kdt_spec_copy(dst, src, n, KDT_SPEC_H2D, L->stream);
}

static kdt_status to_host(loop *L, void *dst, const void *src, size_t n) {
    return L->be == KDT_BACKEND_CPU ? KDT_OK : kdt_spec_copy(dst, src, n, KDT_SPEC_D2H, L->stream);
}

void kdt_spec_loop_free(loop *L) {
    if (L->fly && L->be == KDT_BACKEND_CUDA) (void)kdt_spec_stream_sync(L->stream); /* a forward of pipelined decoding */
    be_free(L, L->pick); free(L->h_picks); free(L->fly_slot); kdt_spec_readback_free(L->rb[0]); kdt_spec_readback_free(L->rb[1]);
    be_free(L, L->scores); be_free(L, L->dtok); be_free(L, L->roots); be_free(L, L->tree_io); be_free(L, L->tree_aux);
    be_free(L, L->pred); be_free(L, L->acc); be_free(L, L->logits); be_free(L, L->hidden); be_free(L, L->d_rows);
    be_free(L, L->samp); be_free(L, L->one); be_free(L, L->probs); be_free(L, L->draft_probs); be_free(L, L->gidx);
    host_free(L, L->h_gidx, L->gidx); free(L->h_dtemp); free(L->h_dseed); host_free(L, L->h_samp, L->samp); host_free(L, L->h_one, L->one);
    host_free(L, L->h_tree_io, L->tree_io); host_free(L, L->h_roots, L->roots); host_free(L, L->h_pred, L->pred);
    host_free(L, L->h_acc, L->acc);
    free(L->h_scores); free(L->h_dtok); free(L->h_aux);
    kdt_spec_span_free(L->span);
    free(L->f_tok); free(L->f_pos); free(L->f_mask);
    free(L->c_req); free(L->c_len); free(L->c_idx);
    for (int32_t b = 0; L->hist && b < L->B; b++) free(L->hist[b]);
    free(L->hist); free(L->hist_len); free(L->done); free(L->reqs); free(L->filled); free(L->reserved); free(L->used);
    free(L->act); free(L->act_len); free(L->n_new); free(L->n_rows); free(L->row_start); free(L->act_hist);
    kdt_cache_free(L->cache);
}

static size_t tree_io_bytes(int32_t B, int32_t Q) { return (size_t)B * (1 + 2 * (size_t)Q) * 4 + (size_t)B * Q * Q; }

kdt_status kdt_spec_loop_alloc(loop *L, int32_t num_blocks) {
    const size_t B = (size_t)L->B, Q = (size_t)L->Q, dk = (size_t)L->D * L->K, rows = L->dr ? B * Q : B;
    /* The cache holds a history without its root, plus the tree rows being verified. */
    kdt_status s = kdt_cache_create(L->m, L->B, L->max_len + L->Q, num_blocks, &L->cache);
    L->hist = s == KDT_OK ? calloc(B, sizeof *L->hist) : NULL;
    L->hist_len = calloc(B, sizeof *L->hist_len);
    L->done = calloc(B, sizeof *L->done);
    L->reqs = calloc(B, sizeof *L->reqs);
    L->filled = calloc(B, sizeof *L->filled);
    L->reserved = calloc(B, sizeof *L->reserved);
    L->used = calloc(B, sizeof *L->used);
    L->act = malloc(B * sizeof *L->act);
    L->act_len = malloc(B * sizeof *L->act_len);
    L->n_new = malloc(B * sizeof *L->n_new);
    L->n_rows = malloc(B * sizeof *L->n_rows);
    L->row_start = malloc(B * sizeof *L->row_start);
    L->act_hist = malloc(B * sizeof *L->act_hist);
    L->f_tok = malloc(rows * sizeof *L->f_tok);
    L->f_pos = malloc(rows * sizeof *L->f_pos);
    L->logits = be_alloc(L, rows * (size_t)L->V * sizeof(float), &s);
    L->d_rows = be_alloc(L, 2 * B * sizeof(int32_t), &s);
    L->pred = be_alloc(L, B * Q * sizeof(int32_t), &s);
    L->h_pred = host_alloc(L, L->pred, B * Q * sizeof(int32_t), &s);
    if (s == KDT_OK && (!L->hist || !L->hist_len || !L->done || !L->reqs || !L->filled || !L->reserved || !L->used ||
                        !L->act || !L->act_len || !L->n_new || !L->n_rows || !L->row_start || !L->act_hist || !L->f_tok ||
                        !L->f_pos))
        s = kdt_fail(KDT_ERR_NOMEM, "speculative loop: out of memory for %zu rows of %d logits", rows, L->V);
    L->samp = be_alloc(L, B * 20, &s);
    L->one = be_alloc(L, 7 * B * sizeof(int32_t), &s);
    L->h_samp = host_alloc(L, L->samp, B * 20, &s);
    L->h_one = host_alloc(L, L->one, 7 * B * sizeof(int32_t), &s);
    if (L->pipe) {
        L->pick = be_alloc(L, B * sizeof(int32_t), &s);
        L->h_picks = L->be == KDT_BACKEND_CPU ? malloc(2 * B * sizeof *L->h_picks) : NULL;
        if (s == KDT_OK && (!(L->fly_slot = malloc(B * sizeof *L->fly_slot)) || (L->be == KDT_BACKEND_CPU && !L->h_picks)))
            s = kdt_fail(KDT_ERR_NOMEM, "speculative loop: out of memory");
    }
    for (int32_t b = 0; s == KDT_OK && b < L->B; b++)
        if (!(L->hist[b] = malloc((size_t)L->max_len * sizeof **L->hist)))
            s = kdt_fail(KDT_ERR_NOMEM, "speculative loop: out of memory for slot %d's history", b);
    if (!L->dr || s != KDT_OK) return s;
    if (L->dr->wants_hidden) L->hidden = be_alloc(L, rows * (size_t)L->hid * sizeof(float), &s);
    L->f_mask = malloc(B * Q * Q);
    L->c_req = malloc(B * sizeof *L->c_req);
    L->c_len = malloc(B * sizeof *L->c_len);
    L->c_idx = malloc(B * Q * sizeof *L->c_idx);
    if (!L->f_mask || !L->c_req || !L->c_len || !L->c_idx) return kdt_fail(KDT_ERR_NOMEM, "speculative loop: out of memory");
    L->scores = be_alloc(L, B * dk * sizeof(float), &s);
    L->dtok = be_alloc(L, B * dk * sizeof(int32_t), &s);
    L->roots = be_alloc(L, 2 * B * sizeof(int32_t), &s);
    L->tree_io = be_alloc(L, tree_io_bytes(L->B, L->Q), &s);
    L->tree_aux = be_alloc(L, 6 * B * Q * sizeof(int32_t), &s);
    L->acc = be_alloc(L, (2 * B + 2 * B * Q) * sizeof(int32_t), &s);
    L->h_tree_io = host_alloc(L, L->tree_io, tree_io_bytes(L->B, L->Q), &s);
    L->h_roots = host_alloc(L, L->roots, 2 * B * sizeof(int32_t), &s);
    L->h_acc = host_alloc(L, L->acc, (2 * B + 2 * B * Q) * sizeof(int32_t), &s);
    if (L->host_tree) {
        L->h_scores = host_alloc(L, NULL, B * dk * sizeof(float), &s);
        L->h_dtok = host_alloc(L, NULL, B * dk * sizeof(int32_t), &s);
        L->h_aux = host_alloc(L, NULL, 6 * B * Q * sizeof(int32_t), &s);
    }
    return s;
}

/* ---- requests ---- */

void kdt_spec_push(loop *L, int32_t s, int32_t tok) {
    kdt_spec_request *r = L->reqs[s];
    L->hist[s][L->hist_len[s]++] = tok;
    r->out[r->n_out++] = tok;
    if (L->p.on_tokens) L->p.on_tokens(L->p.user, s, &tok, 1);
    if (r->n_out == r->max_new || tok == L->p.eos) L->done[s] = 1;
}

static int prefilled(const loop *L, int32_t s) { return L->filled[s] == L->reqs[s]->prompt_len; }

/* Whether some request of this step's active set samples (temperature > 0): then acceptance is
 * tree_sample_accept, whose temperature-0 requests follow tree_accept exactly. */
static void set_sampling(loop *L) {
    L->sampling = 0;
    for (int32_t a = 0; a < L->Ba; a++) L->sampling |= L->reqs[L->act[a]]->temperature > 0.0f;
}

/* The unfinished requests past their prefill, in slot order. */
static void gather_active(loop *L) {
    L->Ba = 0;
    for (int32_t s = 0; s < L->B; s++)
        if (L->reqs[s] && !L->done[s] && prefilled(L, s)) {
            L->act[L->Ba] = s;
            L->act_hist[L->Ba] = L->hist[s];
            L->act_len[L->Ba] = L->hist_len[s];
            L->Ba++;
        }
    set_sampling(L);
}

static kdt_draft_ctx ctx_of(const loop *L) {
    return (kdt_draft_ctx){.B = L->Ba, .slot = L->act, .history = L->act_hist, .hist_len = L->act_len};
}

/* timed: a step's forward, whose device time KDT_SPEC_PROFILE measures. pick (CUDA, may be NULL):
 * each logits row's argmax, made inside the forward, which then returns without waiting for it. */
static kdt_status forward(loop *L, const int32_t *tokens, const int32_t *pos, const uint8_t *mask, kdt_logits_rows rows,
                          float *hidden, int timed, int32_t *pick) {
    const kdt_batch bt = {.B = L->Ba, .req = L->act, .n_rows = L->n_rows, .tokens = tokens, .positions = pos,
                          .tree_mask = mask, .logits_rows = rows, .argmax = pick, .no_wait = pick != NULL};
    timed = timed && L->profile;
    int64_t replays = 0, captures = 0, replays1 = 0, captures1 = 0;
    double dev = 0.0;
    const double t0 = timed ? kdt_spec_now() : 0.0;
    if (timed) kdt_model_graph_counts(L->m, &replays, &captures);
    kdt_status s = timed ? kdt_spec_span_begin(&L->span, L->stream) : KDT_OK;
    if (s == KDT_OK) s = kdt_model_forward(L->m, L->cache, &bt, L->logits, hidden, L->stream);
    if (s != KDT_OK || !timed) return s;
    s = kdt_spec_span_end(L->span, L->stream, &dev);
    kdt_model_graph_counts(L->m, &replays1, &captures1);
    kdt_spec_stats *st = L->st;
    st->t_forward_dev += dev;
    int multi = 0;
    for (int32_t a = 0; a < L->Ba; a++) multi |= L->n_rows[a] > 1;
    if (multi) st->forwards_multi++, st->t_forward_dev_multi += dev;
    if (replays1 == replays || captures1 != captures) /* not a replay: a shape's first sight, its capture, no graph */
        st->forwards_cold++, st->t_forward_cold += kdt_spec_now() - t0;
    return s;
}

/* target_pred [Ba, Q] (backend memory) from the logits: request a's row i is row
 * row_start[a] + i for i < n_rows[a] (packed), or row a * Q + i of Q each; -1 past its rows. */
static kdt_status argmax(loop *L, int32_t Q, int packed) {
    const int32_t Ba = L->Ba;
    if (L->be == KDT_BACKEND_CPU) {
        for (int32_t a = 0; a < Ba; a++) {
            const int32_t n = packed ? L->n_rows[a] : Q;
            int32_t *pred = L->pred + (size_t)a * Q;
            kdt_spec_argmax_host(L->logits + (int64_t)(packed ? L->row_start[a] : a * Q) * L->V, n, L->V, pred);
            for (int32_t i = n; i < Q; i++) pred[i] = -1;
        }
        return KDT_OK;
    }
    kdt_status s;
    if (packed && ((s = to_backend(L, L->d_rows, L->row_start, (size_t)Ba * sizeof(int32_t))) ||
                   (s = to_backend(L, L->d_rows + Ba, L->n_rows, (size_t)Ba * sizeof(int32_t)))))
        return s;
    return kdt_spec_argmax_cuda(L->logits, L->V, Ba, Q, packed ? L->d_rows : NULL, L->pred, L->stream);
}

/* The sampling parameters of the active requests and this step's seeds, to the backend. */
static kdt_status sample_params(loop *L, kdt_tree_sample_accept_params *p) {
    const int32_t Ba = L->Ba;
    uint64_t *seed = L->h_samp;
    float *temp = (float *)(seed + Ba), *topp = temp + 2 * (size_t)Ba;
    int32_t *topk = (int32_t *)(temp + Ba);
    for (int32_t a = 0; a < Ba; a++) {
        const kdt_spec_request *r = L->reqs[L->act[a]];
        seed[a] = kdt_sample_step_seed(r->seed, (uint32_t)L->act_len[a]);
        temp[a] = r->temperature;
        topk[a] = r->top_k;
        topp[a] = r->top_p > 0.0f ? r->top_p : 1.0f;
    }
    uint64_t *d = L->samp;
    p->seed = d;
    p->temperature = (const float *)(d + Ba);
    p->top_k = (const int32_t *)(p->temperature + Ba);
    p->top_p = p->temperature + 2 * (size_t)Ba;
    return to_backend(L, L->samp, L->h_samp, (size_t)Ba * 20);
}

/* The next token of each request from the last row of a forward with KDT_LOGITS_LAST: the
 * argmax, or when sampling tree_sample_accept over trees of just the root. */
static kdt_status next_tokens(loop *L) {
    const int32_t Ba = L->Ba;
    if (!L->sampling) {
        kdt_status s = argmax(L, 1, 0);
        return s == KDT_OK ? to_host(L, L->h_pred, L->pred, (size_t)Ba * sizeof(int32_t)) : s;
    }
    for (int32_t a = 0; a < Ba; a++) L->h_one[a] = L->h_one[Ba + a] = -1, L->h_one[2 * Ba + a] = 0;
    int32_t *o = L->one;
    kdt_tree_sample_accept_params p = {.B = Ba, .Q = 1, .V = L->V, .node_token = o, .node_parent = o + Ba,
                                       .num_nodes = o + 2 * Ba, .target_logits = L->logits, .accept_len = o + 3 * Ba,
                                       .status = o + 4 * Ba, .accept_index = o + 5 * Ba, .accept_tokens = o + 6 * Ba};
    kdt_status s = to_backend(L, L->one, L->h_one, 3 * (size_t)Ba * sizeof(int32_t));
    if (s == KDT_OK) s = sample_params(L, &p);
    if (s == KDT_OK) s = kdt_tree_sample_accept(&p, L->be, L->stream);
    if (s == KDT_OK && L->be == KDT_BACKEND_CPU) memcpy(L->h_pred, o + 6 * Ba, (size_t)Ba * sizeof(int32_t));
    else if (s == KDT_OK) s = to_host(L, L->h_pred, o + 6 * Ba, (size_t)Ba * sizeof(int32_t));
    return s;
}

/* The next prompt chunk of each request still prefilling (slot order, prefill_chunk rows over
 * all of them), in one forward; a request whose prompt is then all cached gets its first token
 * from its last row, and the drafter observes its prefill. */
static kdt_status prefill(loop *L) {
    int64_t R = 0, left = L->p.prefill_chunk > 0 && !L->hidden ? L->p.prefill_chunk : INT64_MAX;
    L->Ba = 0;
    for (int32_t s = 0; s < L->B && left > 0; s++) {
        if (!L->reqs[s] || L->done[s] || prefilled(L, s)) continue;
        const int64_t n = L->reqs[s]->prompt_len - L->filled[s] < left ? L->reqs[s]->prompt_len - L->filled[s] : left;
        L->act[L->Ba] = s;
        L->act_len[L->Ba] = L->hist_len[s]; /* the seed of a sampled first token (sample_params) */
        L->row_start[L->Ba] = (int32_t)R;
        L->n_rows[L->Ba++] = (int32_t)n;
        R += n;
        left -= n;
    }
    if (L->Ba == 0) return KDT_OK;
    set_sampling(L);
    kdt_status s = KDT_OK;
    int32_t *tok = malloc((size_t)R * sizeof *tok);
    float *hidden = L->hidden ? be_alloc(L, (size_t)R * L->hid * sizeof(float), &s) : NULL;
    if (!tok || s != KDT_OK) {
        free(tok);
        be_free(L, hidden);
        return s != KDT_OK ? s : kdt_fail(KDT_ERR_NOMEM, "speculative loop: out of memory for %lld prompt rows", (long long)R);
    }
    for (int32_t a = 0; a < L->Ba; a++)
        memcpy(tok + L->row_start[a], L->reqs[L->act[a]]->prompt + L->filled[L->act[a]], (size_t)L->n_rows[a] * sizeof *tok);
    s = forward(L, tok, NULL, NULL, KDT_LOGITS_LAST, hidden, 0, NULL);
    free(tok);
    if (s == KDT_OK) s = next_tokens(L);
    /* Keeps only the requests whose prompt is now cached, with their first token. */
    int32_t Bf = 0;
    for (int32_t a = 0; s == KDT_OK && a < L->Ba; a++) {
        const int32_t slot = L->act[a];
        if ((L->filled[slot] += L->n_rows[a]) < L->reqs[slot]->prompt_len) continue;
        kdt_spec_push(L, slot, L->h_pred[a]);
        L->act[Bf] = slot;
        L->act_hist[Bf] = L->hist[slot];
        L->act_len[Bf] = L->hist_len[slot];
        L->row_start[Bf] = L->row_start[a];
        L->n_rows[Bf] = L->n_rows[a];
        L->n_new[Bf++] = 1;
    }
    L->Ba = Bf;
    if (s == KDT_OK && L->dr && Bf > 0) {
        memset(L->c_len, 0, (size_t)Bf * sizeof *L->c_len);
        const kdt_draft_feedback fb = {.prefill = 1, .n_new = L->n_new, .accept_len = L->c_len, .hidden = hidden,
                                       .row_start = L->row_start, .n_rows = L->n_rows};
        const kdt_draft_ctx ctx = ctx_of(L);
        s = L->dr->observe(L->dr->state, &ctx, &fb);
    }
    be_free(L, hidden);
    L->st->tokens += Bf;
    return s;
}

/* ---- one speculative step ---- */

/* Whether this step's tree carries draft_probs: some request samples and the drafter samples too. */
static int sampled_children(const loop *L) { return L->sampling && L->dr->sampled; }

static kdt_status draft(loop *L) {
    kdt_draft_ctx ctx = ctx_of(L);
    if (sampled_children(L)) {
        kdt_status s = KDT_OK;
        const size_t B = (size_t)L->B, Q = (size_t)L->Q, V = (size_t)L->V;
        if (!L->probs) { /* the first step that samples */
            L->probs = be_alloc(L, B * L->D * V * sizeof(float), &s);
            L->draft_probs = be_alloc(L, B * Q * V * sizeof(float), &s);
            L->gidx = be_alloc(L, B * Q * sizeof(int32_t), &s);
            L->h_gidx = host_alloc(L, L->gidx, B * Q * sizeof(int32_t), &s);
            L->h_dtemp = host_alloc(L, NULL, B * sizeof(float), &s);
            L->h_dseed = host_alloc(L, NULL, B * sizeof(uint64_t), &s);
            if (s != KDT_OK) return s;
        }
        for (int32_t a = 0; a < L->Ba; a++) {
            const kdt_spec_request *r = L->reqs[L->act[a]];
            L->h_dtemp[a] = r->temperature;
            L->h_dseed[a] = kdt_sample_step_seed(r->seed, (uint32_t)L->act_len[a]); /* the op's; the drafter draws on its own stream */
        }
        ctx.temperature = L->h_dtemp;
        ctx.seed = L->h_dseed;
        ctx.probs = L->probs;
    }
    if (!L->host_tree) return L->dr->propose(L->dr->state, &ctx, L->scores, L->dtok);
    kdt_status s = L->dr->propose(L->dr->state, &ctx, L->h_scores, L->h_dtok);
    if (s != KDT_OK || !L->sampling) return s;
    const size_t n = (size_t)L->Ba * L->D * L->K; /* a sampled step builds and accepts on the device */
    if ((s = to_backend(L, L->scores, L->h_scores, n * sizeof(float))) != KDT_OK) return s;
    return to_backend(L, L->dtok, L->h_dtok, n * sizeof(int32_t));
}

/* Whether this step's tree is built and accepted on the host (host_tree, greedy). */
static int host_step(const loop *L) { return L->host_tree && !L->sampling; }

/* Per-step views of the backend blocks, laid out for Ba requests. */
typedef struct views {
    int32_t *num_nodes, *node_token, *positions;
    uint8_t *mask;
    int32_t *accept_len, *status, *accept_tokens, *accept_index;
} views;

static views tree_views(const loop *L, void *tree_io, int32_t *acc) {
    const size_t Ba = (size_t)L->Ba, Q = (size_t)L->Q;
    int32_t *t = tree_io;
    return (views){.num_nodes = t, .node_token = t + Ba, .positions = t + Ba + Ba * Q, .mask = (uint8_t *)(t + Ba + 2 * Ba * Q),
                   .accept_len = acc, .status = acc + Ba, .accept_tokens = acc + 2 * Ba, .accept_index = acc + 2 * Ba + Ba * Q};
}

static kdt_status build_tree(loop *L) {
    const int32_t Ba = L->Ba, Q = L->Q;
    for (int32_t a = 0; a < Ba; a++) {
        L->h_roots[a] = L->act_hist[a][L->act_len[a] - 1];
        L->h_roots[Ba + a] = L->act_len[a] - 1;
    }
    const int host = host_step(L);
    kdt_status s = host ? KDT_OK : to_backend(L, L->roots, L->h_roots, 2 * (size_t)Ba * sizeof(int32_t));
    if (s != KDT_OK) return s;
    const views v = host ? tree_views(L, L->h_tree_io, L->h_acc) : tree_views(L, L->tree_io, L->acc);
    int32_t *aux = host ? L->h_aux : L->tree_aux, *roots = host ? L->h_roots : L->roots;
    const size_t bq = (size_t)Ba * Q;
    const kdt_tree_build_params p = {.B = Ba, .D = L->D, .K = L->K, .budget = L->N, .scores = host ? L->h_scores : L->scores,
                                     .tokens = host ? L->h_dtok : L->dtok, .root_token = roots, .seq_len = roots + Ba,
                                     .num_nodes = v.num_nodes, .node_token = v.node_token, .node_parent = aux, .node_depth = aux + bq,
                                     .node_cand = aux + 2 * bq, .node_score = (float *)(aux + 5 * bq), .positions = v.positions,
                                     .tree_mask = v.mask, .first_child = aux + 3 * bq, .next_sibling = aux + 4 * bq};
    return kdt_tree_build(&p, host ? KDT_BACKEND_CPU : L->be, L->stream);
}

/* Rows per request of a padded verify. Sampling: Q (tree_sample_accept reads Q rows per request).
 * Greedy: 1 when no request of the step has a draft (the step costs about a plain one), else Q.
 * Two shapes only: each new shape costs a direct run and a capture (a few ms), which sized buckets
 * (1, 2, 4, 8, 16, Q) paid more than they saved over 256 tokens (H200, 2026-12-02: --spec lookup on
 * the shipped model 6,537 -> 4,568 tokens/s on prompt 1). */
static int32_t pad_rows(const loop *L, const int32_t *num_nodes) {
    if (L->sampling) return L->Q;
    for (int32_t a = 0; a < L->Ba; a++)
        if (num_nodes[a] > 0) return L->Q;
    return 1;
}

/* The forward over each request's tree rows (num_nodes + 1, or pad_rows with pad_tree or when
 * sampling: a fill row holds the root token at the root's position and sees only itself), then
 * target_pred (greedy only). Padded to Q, the rows are Q per request back to back, which the argmax
 * and tree_sample_accept take as they are; else the argmax reads each request's rows where they are. */
static kdt_status verify(loop *L) {
    const int32_t Ba = L->Ba, Q = L->Q, pad = L->p.pad_tree || L->sampling;
    kdt_status s = host_step(L) ? KDT_OK : to_host(L, L->h_tree_io, L->tree_io, tree_io_bytes(Ba, Q));
    if (s != KDT_OK) return s;
    const views v = tree_views(L, L->h_tree_io, L->h_acc);
    for (int32_t a = 0; a < Ba; a++)
        if (v.num_nodes[a] < 0 || v.num_nodes[a] > L->N)
            return kdt_fail(KDT_ERR_INTERNAL, "speculative loop: tree_build gave request %d %d nodes", L->act[a], v.num_nodes[a]);
    const int32_t rows = pad ? pad_rows(L, v.num_nodes) : 0;
    int64_t R = 0, moff = 0;
    for (int32_t a = 0; a < Ba; a++) {
        const int32_t nodes = v.num_nodes[a], n = pad ? rows : nodes + 1;
        L->n_rows[a] = n;
        L->row_start[a] = (int32_t)R;
        for (int32_t i = 0; i < n; i++) {
            const int real = i <= nodes;
            L->f_tok[R + i] = real ? v.node_token[(size_t)a * Q + i] : L->h_roots[a];
            L->f_pos[R + i] = real ? v.positions[(size_t)a * Q + i] : L->h_roots[Ba + a];
            const uint8_t *src = v.mask + ((size_t)a * Q + i) * Q;
            uint8_t *dst = L->f_mask + moff + (int64_t)i * n;
            memcpy(dst, src, (size_t)n);
            if (!real) dst[i] = 1;
        }
        R += n;
        moff += (int64_t)n * n;
    }
    /* A host step of one row each needs no row table on the device: target_pred [Ba] (accept spreads it). */
    L->pred_q = host_step(L) && rows == 1 ? 1 : Q;
    /* Where the forward's rows are target_pred's (Q per request, or one in a host step), the argmax
     * runs inside the forward (its CUDA graph), and the step's one wait is for what accept reads. */
    const int in_forward = L->be == KDT_BACKEND_CUDA && !L->sampling && (rows == Q || L->pred_q == 1);
    if ((s = forward(L, L->f_tok, L->f_pos, L->f_mask, KDT_LOGITS_ALL, L->hidden, 1, in_forward ? L->pred : NULL)) != KDT_OK)
        return s;
    for (int32_t a = 0; a < Ba; a++) L->st->drafted += v.num_nodes[a];
    if (L->sampling || in_forward) return KDT_OK;
    return L->pred_q == 1 ? argmax(L, 1, 0) : argmax(L, Q, rows != Q);
}

/* draft_probs [Ba, Q, V]: node i of request a (depth t = position - seq_len) gets the drafter's
 * row (a, t), the distribution its children were drawn from; nodes at depth D and fill rows zeros. */
static kdt_status gather_draft_probs(loop *L) {
    const int32_t Ba = L->Ba, Q = L->Q, D = L->D;
    const views v = tree_views(L, L->h_tree_io, L->h_acc);
    for (int32_t a = 0; a < Ba; a++)
        for (int32_t i = 0; i < Q; i++) {
            const int32_t t = i <= v.num_nodes[a] ? v.positions[(size_t)a * Q + i] - L->h_roots[Ba + a] : -1;
            L->h_gidx[(size_t)a * Q + i] = t >= 0 && t < D ? a * D + t : -1;
        }
    const size_t row = (size_t)L->V * sizeof(float);
    if (L->be == KDT_BACKEND_CPU) {
        for (size_t i = 0; i < (size_t)Ba * Q; i++) {
            float *dst = L->draft_probs + i * L->V;
            if (L->h_gidx[i] >= 0) memcpy(dst, L->probs + (size_t)L->h_gidx[i] * L->V, row);
            else memset(dst, 0, row);
        }
        return KDT_OK;
    }
    kdt_status s = to_backend(L, L->gidx, L->h_gidx, (size_t)Ba * Q * sizeof(int32_t));
    return s == KDT_OK ? kdt_spec_gather_rows_cuda(L->probs, L->V, L->gidx, (int64_t)Ba * Q, L->draft_probs, L->stream) : s;
}

/* tree_accept (tree_sample_accept when sampling), then the emitted tokens (accept_len + 1 per
 * request) onto the histories. */
static kdt_status accept(loop *L) {
    const int32_t Ba = L->Ba, Q = L->Q;
    const views v = tree_views(L, L->tree_io, L->acc);
    kdt_status s;
    if (L->sampling) {
        kdt_tree_sample_accept_params p = {.B = Ba, .Q = Q, .V = L->V, .node_token = v.node_token,
                                           .node_parent = L->tree_aux, .num_nodes = v.num_nodes, .target_logits = L->logits,
                                           .accept_len = v.accept_len, .accept_index = v.accept_index,
                                           .accept_tokens = v.accept_tokens, .status = v.status};
        s = sample_params(L, &p);
        if (s == KDT_OK && sampled_children(L)) {
            s = gather_draft_probs(L);
            p.draft_probs = L->draft_probs;
        }
        if (s == KDT_OK) s = kdt_tree_sample_accept(&p, L->be, L->stream);
    } else if (host_step(L)) { /* target_pred is the one copy to the host */
        const views h = tree_views(L, L->h_tree_io, L->h_acc);
        const kdt_tree_accept_params p = {.B = Ba, .Q = Q, .node_token = h.node_token, .node_parent = L->h_aux,
                                          .num_nodes = h.num_nodes, .target_pred = L->h_pred, .accept_len = h.accept_len,
                                          .accept_index = h.accept_index, .accept_tokens = h.accept_tokens, .status = h.status};
        s = to_host(L, L->h_pred, L->pred, (size_t)Ba * L->pred_q * sizeof(int32_t));
        for (int32_t a = Ba - 1; L->pred_q == 1 && a >= 0; a--) /* [Ba] -> [Ba, Q], backwards: in place */
            for (int32_t i = Q - 1; i >= 0; i--) L->h_pred[(size_t)a * Q + i] = i ? -1 : L->h_pred[a];
        if (s == KDT_OK) s = kdt_tree_accept(&p, KDT_BACKEND_CPU, NULL);
    } else {
        const kdt_tree_accept_params p = {.B = Ba, .Q = Q, .node_token = v.node_token, .node_parent = L->tree_aux,
                                          .num_nodes = v.num_nodes, .target_pred = L->pred, .accept_len = v.accept_len,
                                          .accept_index = v.accept_index, .accept_tokens = v.accept_tokens, .status = v.status};
        s = kdt_tree_accept(&p, L->be, L->stream);
    }
    if (s == KDT_OK && !host_step(L)) s = to_host(L, L->h_acc, L->acc, (2 * (size_t)Ba + 2 * (size_t)Ba * Q) * sizeof(int32_t));
    if (s != KDT_OK) return s;
    const views h = tree_views(L, L->h_tree_io, L->h_acc);
    for (int32_t a = 0; a < Ba; a++) {
        const int32_t slot = L->act[a], len = h.accept_len[a];
        if (h.status[a] != 0 || len < 0 || len >= L->n_rows[a])
            return kdt_fail(KDT_ERR_INTERNAL, "speculative loop: tree_accept gave request %d status %d, accept_len %d", slot,
                            h.status[a], len);
        kdt_spec_request *r = L->reqs[slot];
        r->steps++;
        r->accepted += len;
        L->st->accepted += len;
        L->n_new[a] = 0;
        for (int32_t t = 0; t <= len && !L->done[slot]; t++, L->n_new[a]++) kdt_spec_push(L, slot, h.accept_tokens[(size_t)a * Q + t]);
        L->act_len[a] = L->hist_len[slot];
        L->st->tokens += L->n_new[a];
    }
    return KDT_OK;
}

/* Whether request a's kept rows are already in place: accept_index[t] == t along the path (a chain
 * always is, and so is a tree's best path while tree_build numbered it first). */
static int kept_in_place(const loop *L, const views *h, int32_t a) {
    const int32_t *idx = h->accept_index + (size_t)a * L->Q;
    for (int32_t t = 0; t <= h->accept_len[a]; t++)
        if (idx[t] != t) return 0;
    return 1;
}

/* The cache keeps each request's root and accepted rows. Rows already in place need no move, only
 * the length cut (kv_commit would copy nothing, and on CUDA it costs blocking copies and a launch
 * per layer); the others go through kdt_cache_commit once per distinct row count. */
static kdt_status commit(loop *L) {
    const int32_t Ba = L->Ba, Q = L->Q;
    const views h = tree_views(L, L->h_tree_io, L->h_acc);
    for (int32_t a = 0; a < Ba; a++) {
        const int32_t n = L->n_rows[a];
        if (kept_in_place(L, &h, a)) {
            const int32_t slot = L->act[a];
            kdt_status s = kdt_cache_truncate(L->cache, slot, kdt_cache_len(L->cache, slot) - n + 1 + h.accept_len[a]);
            if (s != KDT_OK) return s;
            continue;
        }
        int first = 1;
        for (int32_t e = 0; e < a && first; e++) first = L->n_rows[e] != n || kept_in_place(L, &h, e);
        if (!first) continue;
        int32_t Bg = 0;
        for (int32_t e = a; e < Ba; e++) {
            if (L->n_rows[e] != n || kept_in_place(L, &h, e)) continue;
            L->c_req[Bg] = L->act[e];
            L->c_len[Bg] = h.accept_len[e];
            memcpy(L->c_idx + (size_t)Bg * n, h.accept_index + (size_t)e * Q, (size_t)n * sizeof *L->c_idx);
            Bg++;
        }
        kdt_status s = kdt_cache_commit(L->cache, Bg, L->c_req, n, L->c_idx, L->c_len);
        if (s != KDT_OK) return s;
    }
    return KDT_OK;
}

static kdt_status observe(loop *L) {
    const views h = tree_views(L, L->h_tree_io, L->h_acc);
    const kdt_draft_feedback fb = {.n_new = L->n_new, .accept_len = h.accept_len, .hidden = L->hidden,
                                   .row_start = L->hidden ? L->row_start : NULL, .n_rows = L->hidden ? L->n_rows : NULL,
                                   .accept_index = L->hidden ? h.accept_index : NULL, .Q = L->Q};
    const kdt_draft_ctx ctx = ctx_of(L);
    return L->dr->observe(L->dr->state, &ctx, &fb);
}

static kdt_status spec_step(loop *L) {
    kdt_spec_stats *st = L->st;
    double t = kdt_spec_now();
    kdt_status s;
    if ((s = draft(L)) || (s = lap(L, &t, &st->t_draft)) || (s = build_tree(L)) || (s = lap(L, &t, &st->t_tree)) ||
        (s = verify(L)) || (s = lap(L, &t, &st->t_verify)) || (s = accept(L)) || (s = lap(L, &t, &st->t_accept)) ||
        (s = commit(L)) || (s = lap(L, &t, &st->t_commit)) || (s = observe(L)) || (s = lap(L, &t, &st->t_draft)))
        return s;
    return KDT_OK;
}

/* Plain greedy decoding: one row per request. */
static kdt_status greedy_step(loop *L) {
    double t = kdt_spec_now();
    for (int32_t a = 0; a < L->Ba; a++) L->n_rows[a] = 1;
    for (int32_t a = 0; a < L->Ba; a++) L->f_tok[a] = L->act_hist[a][L->act_len[a] - 1];
    kdt_status s = forward(L, L->f_tok, NULL, NULL, KDT_LOGITS_LAST, NULL, 1, NULL);
    if (s == KDT_OK) s = next_tokens(L);
    if (s != KDT_OK) return s;
    for (int32_t a = 0; a < L->Ba; a++) {
        L->reqs[L->act[a]]->steps++;
        kdt_spec_push(L, L->act[a], L->h_pred[a]);
    }
    L->st->tokens += L->Ba;
    return lap(L, &t, &L->st->t_verify);
}

kdt_status kdt_spec_loop_step(loop *L) {
    kdt_spec_stats *st = L->st;
    double t = kdt_spec_now();
    kdt_status s = prefill(L);
    if (s == KDT_OK && L->Ba > 0) s = lap(L, &t, &st->t_prefill);
    gather_active(L);
    if (s == KDT_OK && L->Ba > 0) {
        st->steps++;
        st->request_steps += L->Ba;
        if (L->dr) s = spec_step(L);
        else if (L->pipe && !L->sampling) s = kdt_spec_decode_step(L);
        else if ((s = kdt_spec_decode_settle(L)) == KDT_OK && L->Ba > 0) s = greedy_step(L); /* sampling */
    }
    return s;
}
