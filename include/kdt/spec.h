/* Speculative decoding: the loop and its drafters.
 *
 * Each step, for every unfinished request of a batch: a drafter proposes D positions of K
 * candidates (scores / tokens [B, D, K], docs/interfaces.md 2.1's inputs), kdt_tree_build keeps the N best
 * nodes, the target model runs once over the tree rows (root + nodes, tree_build's positions
 * and mask), the greedy argmax of each row's logits is the target's prediction, kdt_tree_accept
 * keeps the longest confirmed path plus the bonus token and kdt_cache_commit compacts the cache.
 * Greedy acceptance is lossless: the output is the target's greedy decoding, token for token,
 * whatever the drafter proposes (docs/spec.md gives the argument).
 *
 * Threads. kdt_spec_generate runs on the caller's thread and uses the target model (and a draft
 * model) for the whole call: no other call may use those models meanwhile (include/kdt/model.h).
 * A drafter serves one run at a time. on_token is called on the caller's thread. */
#pragma once

#include "kdt/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Drafters ----
 * A drafter is a struct of function pointers and its state; the loop calls begin once per run,
 * then for each step propose and observe. Requests live in slots 0 .. slots - 1 for the whole
 * run. The loop owns each request's history (host tokens: the prompt, then what was generated;
 * the last token is the root, already decided, not yet in the target's cache). */

typedef struct kdt_draft_setup {
    int32_t slots;              /* requests of the run */
    int32_t max_len;            /* longest history any request reaches */
    int32_t D, K;               /* draft depth, candidates per depth */
    int32_t vocab_size;         /* the target's: every proposed token is below it */
    int32_t hidden_size;        /* the target's (what its hidden states hold) */
    kdt_backend backend;        /* where propose writes and where hidden states live */
    void *stream;               /* CUDA stream of the run (NULL on CPU) */
} kdt_draft_setup;

/* The requests of one step. Host memory. */
typedef struct kdt_draft_ctx {
    int32_t B;                      /* requests this step, 1 .. slots */
    const int32_t *slot;            /* [B] */
    const int32_t *const *history;  /* [B] each request's tokens, host */
    const int32_t *hist_len;        /* [B] >= 1; the root is history[b][hist_len[b] - 1] */
    /* Sampling, given to a drafter with `sampled` when some request of the step samples (else NULL):
     * each request's temperature [B] (0: greedy) and this step's seed [B] (host), and probs
     * [B, D, V] (backend memory) to write: see kdt_drafter.sampled. */
    const float *temperature;
    const uint64_t *seed;
    float *probs;
} kdt_draft_ctx;

/* What a step (or the prefill) added, given to observe with the ctx of that step, hist_len
 * updated. The hidden-state fields are set only for a drafter with wants_hidden (else NULL):
 * the target's final hidden states (after the last norm) of every row it ran, backend memory.
 * At the prefill the rows are the prompt (all kept); at a step they are the tree rows, of which
 * the accepted path's (accept_index) are kept: the last kept row's state predicted the bonus. */
typedef struct kdt_draft_feedback {
    int32_t prefill;                /* 1 after the prefill, 0 after a step */
    const int32_t *n_new;           /* [B] tokens appended to the history (prefill: the first token) */
    const int32_t *accept_len;      /* [B] draft tokens accepted (0 at the prefill) */
    const float *hidden;            /* [R, hidden_size] ([R, n_hidden_layers * hidden_size] when set) */
    const int32_t *row_start;       /* [B] host: request b's rows start here */
    const int32_t *n_rows;          /* [B] host */
    const int32_t *accept_index;    /* [B, Q] host: kept tree rows, root first; NULL at the prefill */
    int32_t Q;                      /* accept_index's row stride */
} kdt_draft_feedback;

typedef struct kdt_drafter {
    const char *name;
    void *state;
    int32_t wants_hidden;           /* 1: the loop asks the target for hidden states for observe */
    /* With wants_hidden and n_hidden_layers > 0: the hidden states are those of the target layers
     * hidden_layers[0 .. n - 1] (kdt_model_set_hidden_layers), hidden [R, n * hidden_size]. */
    int32_t n_hidden_layers;
    const int32_t *hidden_layers;   /* [n_hidden_layers], the drafter's memory */
    /* 0: the candidates are deterministic picks (top-K, n-gram counts): tree_sample_accept's rule for
     * deterministic children, lossless whatever they are. 1: for a request with temperature > 0,
     * propose draws depth d's K candidates i.i.d. from a distribution q_d that it writes to
     * ctx->probs[b][d] (each row sums to 1; the loop hands it to tree_sample_accept as the
     * draft_probs of every node of depth d), with scores that do not depend on the tokens drawn
     * (tree_build must not choose among draws by their value); greedy requests get top-K as before.
     * Lossless with sampled children (docs/sampling.md 4), and accepted more often at T > 0. */
    int32_t sampled;
    /* 0: propose writes scores and tokens to backend memory. 1: to host memory on every backend (a
     * drafter that computes them there, such as lookup): on CUDA the loop then builds and accepts a
     * greedy step's tree on the host (kdt_tree_build / kdt_tree_accept's CPU backend, bit for bit
     * the CUDA one), so that the step's one copy to the host is target_pred. */
    int32_t host_candidates;
    /* A new run: every slot starts empty. May be called again for a later run. */
    kdt_status (*begin)(void *state, const kdt_draft_setup *setup);
    /* Writes scores f32 [B, D, K] (log-probabilities, non-increasing within each (b, d); -inf
     * trails a row with fewer than K candidates) and tokens i32 [B, D, K] in backend memory:
     * candidate k of depth d is a guess of the token d + 1 places after the root. */
    kdt_status (*propose)(void *state, const kdt_draft_ctx *ctx, float *scores, int32_t *tokens);
    kdt_status (*observe)(void *state, const kdt_draft_ctx *ctx, const kdt_draft_feedback *fb);
    /* The request in slot left (a session reuses slots): the slot starts empty again. NULL: the
     * drafter keeps nothing per slot. */
    kdt_status (*reset)(void *state, int32_t slot);
    void (*destroy)(void *state);
} kdt_drafter;

/* Prompt lookup, model-free: the last n-gram of history + the draft path so far (n = 4, 3, 2, 1:
 * the longest that occurred before) is looked up in the history; the tokens that followed it,
 * ranked by how often (then by how recently), are depth d's K candidates with log(count / matches)
 * as scores; the top one extends the path for depth d + 1. No draft when depth 0's match is a
 * single token. Computed on the host, written to host memory (host_candidates). */
KDT_API kdt_status kdt_drafter_lookup(kdt_drafter **out);

/* A draft model of the target's vocabulary run for D steps over its own paged cache (rolled back
 * to the accepted tokens after each step): depth d's candidates are the top K of its logits with
 * log-softmax scores; for a request that samples (sampled = 1), K draws from softmax(logits / T)
 * at the request's temperature, the first one fed to the next depth. `draft` stays the caller's;
 * it must outlive the drafter. */
KDT_API kdt_status kdt_drafter_model(kdt_model *draft, kdt_drafter **out);

/* DFlash (z-lab's DFlashDraftModel checkpoint in dir; docs/spec.md): one forward of the block
 * [root, mask x (block_size - 1)] over the target's hidden states of target_layer_ids drafts
 * depths 1 .. D (D <= block_size - 1), each one's top K as log-softmax scores. It shares the
 * target's embedding and LM head (target must outlive the drafter). CPU and CUDA backends. */
KDT_API kdt_status kdt_drafter_dflash(kdt_model *target, const char *dir, kdt_drafter **out);

/* MTP: the next-token layer of the checkpoint in dir (kdt_model_load_mtp; normally the target's
 * own folder) run D times in a chain per step over its own cache, fed the target's final hidden
 * states; depth d's candidates are the top K of its d-th logits (docs/spec.md). backend: the loop's (the
 * layer loads there; bf16 on CUDA). */
KDT_API kdt_status kdt_drafter_mtp(const char *dir, kdt_backend backend, kdt_drafter **out);

KDT_API void kdt_drafter_free(kdt_drafter *d);   /* destroy(state), then the struct */

/* Loads the checkpoint folder dir as kdt_model_load does, keeping only its first num_layers
 * layers (num_hidden_layers overridden, first_k_dense_replace capped to it; the embedding, final
 * norm and LM head are the checkpoint's): the target with fewer layers, as a draft model. Goes
 * through a temporary folder holding the edited config.json and links to the weight files. */
KDT_API kdt_status kdt_draft_model_load(const char *dir, int32_t num_layers, kdt_backend backend, kdt_model **out);

/* ---- The loop ---- */

typedef struct kdt_spec_request {
    const int32_t *prompt;      /* [prompt_len] host */
    int32_t prompt_len;         /* >= 1 */
    int32_t max_new;            /* tokens to generate, >= 0 */
    float temperature;          /* 0: greedy (bit for bit the greedy loop); > 0: sampling (docs/sampling.md) */
    int32_t top_k;              /* 0: off */
    float top_p;                /* 0 or 1: off */
    uint64_t seed;              /* the same seed gives the same output run to run on one backend */
    int32_t *out;               /* [max_new] host, out: the generated tokens */
    int32_t n_out;              /* out: tokens written (< max_new when eos ended the request) */
    int32_t steps;              /* out: verification steps the request took part in */
    int32_t accepted;           /* out: draft tokens it accepted over those steps */
} kdt_spec_request;

typedef struct kdt_spec_params {
    int32_t depth, topk, budget;  /* D (1 .. 64), K (1 .. 64), N (1 .. 1024); unused without a drafter */
    int32_t eos;                  /* a token that ends its request once emitted; -1: none */
    int32_t pad_tree;             /* 0: each request verifies num_nodes + 1 rows; 1: N + 1 rows, or 1
                                     in a greedy step where no request has a draft (fill rows see only
                                     themselves; two shapes) */
    int32_t sync_timing;          /* CUDA: synchronize after each phase so that the split is exact */
    /* Optional (NULL: none): called on the host for each token as it is emitted, in order, req being
     * the request's index in reqs; lets a caller stream text before the run ends. */
    void (*on_tokens)(void *user, int32_t req, const int32_t *toks, int32_t n);
    void *user;                   /* on_tokens's first argument */
    int32_t prefill_chunk;        /* most prompt rows one step prefills, over all requests; 0: no limit
                                     (a drafter that wants hidden states gets whole prompts) */
} kdt_spec_params;

/* Times in seconds, host clock (after a synchronize on CUDA when sync_timing or $KDT_SPEC_PROFILE is
 * set and not "0"). */
typedef struct kdt_spec_stats {
    int64_t steps;              /* loop iterations after the prefill */
    int64_t request_steps;      /* sum over steps of the requests in them */
    int64_t tokens;             /* tokens emitted, prefill's first tokens included */
    int64_t accepted;           /* draft tokens accepted: mean accepted length = accepted / request_steps */
    int64_t drafted;            /* tree nodes verified (root excluded) */
    double t_prefill;           /* prompt forward, first tokens, the drafter's first observe */
    double t_draft;             /* propose + observe */
    double t_tree;              /* tree_build */
    double t_verify;            /* target forward over the tree rows + argmax */
    double t_accept;            /* tree_accept + reading the emitted tokens */
    double t_commit;            /* cache commit */
    double t_total;             /* the whole call */
    /* With $KDT_SPEC_PROFILE on CUDA (else 0): the steps' target forwards timed by CUDA events around
     * each (device time, launch gaps included); of them, those with more than one row per request
     * (count, device time), and those that were not plain graph replays (a shape's first sight, its
     * capture, or a forward that cannot be captured: count, host time). */
    double t_forward_dev;
    int64_t forwards_multi;
    double t_forward_dev_multi;
    int64_t forwards_cold;
    double t_forward_cold;
} kdt_spec_stats;

/* Generates for B requests with the target m: speculative with `drafter`, plain decoding (one
 * row per request and step) when drafter is NULL. When any request samples (temperature > 0),
 * acceptance is kdt_tree_sample_accept over the full logits rows of the tree (padded to N + 1
 * rows a request), and plain decoding and the first token sample through it with a tree of just
 * the root; the op's seed at a step is derived from the request's seed and its history length. Creates and frees its own cache. Every
 * request pointer is host memory; stream is the CUDA stream (NULL on CPU). stats may be NULL. */
KDT_API kdt_status kdt_spec_generate(kdt_model *m, kdt_drafter *drafter, const kdt_spec_params *p, int32_t B,
                                     kdt_spec_request *reqs, kdt_spec_stats *stats, void *stream);

/* ---- Sessions: the loop one step at a time, requests joining and leaving between steps ----
 * (continuous batching). Slots 0 .. max_slots - 1 each hold at most one request. A request added
 * to a slot is prefilled over the next steps (at most prefill_chunk prompt rows per step over all
 * requests, so that a long prompt does not stall the others), then takes part in every step until
 * it ends (max_new tokens or eos); its tokens are those of kdt_spec_generate on it alone. Each
 * request's worst case of cache blocks is reserved when it is added, so a step never runs out of
 * cache: a request that does not fit is refused by add (KDT_ERR_NOMEM) and can wait. One thread at
 * a time per session; kdt_spec_session_check and _fits only read what create fixed. */
typedef struct kdt_spec_session kdt_spec_session;

/* max_len: the longest request (prompt_len + max_new); num_blocks: the target's cache blocks of
 * KDT_CACHE_BLOCK rows (0: enough for every slot at max_len). The drafter (NULL: plain greedy
 * decoding) is begun for max_slots slots and must outlive the session. */
KDT_API kdt_status kdt_spec_session_create(kdt_model *m, kdt_drafter *drafter, const kdt_spec_params *p, int32_t max_slots,
                                           int32_t max_len, int32_t num_blocks, void *stream, kdt_spec_session **out);
KDT_API void       kdt_spec_session_free(kdt_spec_session *s);
/* Whether req could be added: prompt and lengths, token ids below the vocabulary, sampling. The
 * message of a failure names the field at fault. */
KDT_API kdt_status kdt_spec_session_check(const kdt_spec_session *s, const kdt_spec_request *req);
/* 1 when a request of these lengths fits the cache blocks not yet reserved, else 0. */
KDT_API int        kdt_spec_session_fits(const kdt_spec_session *s, int32_t prompt_len, int32_t max_new);
/* Puts req in an empty slot; req (and its prompt and out) stay the caller's and must live until
 * the slot is removed. Its outputs (out, n_out, steps, accepted) grow as steps run. */
KDT_API kdt_status kdt_spec_session_add(kdt_spec_session *s, int32_t slot, kdt_spec_request *req);
/* One step: prefill chunks of the requests still prefilling, then one speculative (or plain)
 * step over those decoding. emitted [max_slots] (may be NULL): the tokens each slot's request
 * gained. A failed step leaves the session unusable but safe to free. */
KDT_API kdt_status kdt_spec_session_step(kdt_spec_session *s, int32_t *emitted);
/* Empties a slot (finished or not) and gives its cache blocks back at once. */
KDT_API kdt_status kdt_spec_session_remove(kdt_spec_session *s, int32_t slot);
KDT_API int32_t    kdt_spec_session_pending(const kdt_spec_session *s);    /* requests not yet finished */
KDT_API int        kdt_spec_session_finished(const kdt_spec_session *s, int32_t slot); /* 1: ended (max_new or eos) */
KDT_API const kdt_spec_stats *kdt_spec_session_stats(const kdt_spec_session *s);   /* since create */
KDT_API void       kdt_spec_session_blocks(const kdt_spec_session *s, int32_t *used, int32_t *reserved, int32_t *total);

#ifdef __cplusplus
}
#endif
