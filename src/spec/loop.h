/* The speculative loop's state, shared by loop.c (buffers, prefill, one step) and session.c (the
 * session API and kdt_spec_generate). Internal to src/spec/. */
#pragma once

#include "kdt/spec.h"

typedef struct kdt_spec_session loop;

struct kdt_spec_session {
    kdt_model *m;
    kdt_drafter *dr;
    kdt_spec_params p;
    kdt_backend be;
    void *stream;
    kdt_spec_stats *st;         /* -> stats */
    kdt_spec_stats stats;
    int32_t B, D, K, N, Q, V, hid;
    int32_t max_len;            /* longest request, prompt + max_new */
    kdt_cache *cache;
    /* Requests, by slot (host): the request (NULL: empty slot), its history, whether it ended,
     * its prompt rows in the cache so far, its reserved cache blocks, whether the slot was ever
     * used (the drafter must then forget it before reuse). */
    kdt_spec_request **reqs;
    int32_t **hist, *hist_len, *done, *filled, *reserved, *used;
    int32_t n_reserved;
    /* Requests of the current step (host): slot, history, length, tokens added, rows. */
    int32_t Ba, *act, *act_len, *n_new, *n_rows, *row_start;
    const int32_t **act_hist;
    /* Backend memory. tree_io: num_nodes [Ba], node_token [Ba, Q], positions [Ba, Q] (int32),
     * then tree_mask [Ba, Q, Q] (u8), laid out for Ba so that one copy brings all of it. acc:
     * accept_len [Ba], status [Ba], accept_tokens [Ba, Q], accept_index [Ba, Q], likewise. */
    float *scores;              /* [B, D, K] */
    int32_t *dtok;              /* [B, D, K] */
    int32_t *roots;             /* [2, B]: root_token [Ba], then seq_len [Ba] */
    void *tree_io;
    int32_t *tree_aux;          /* [6, B, Q]: node_parent, node_depth, node_cand, first_child, next_sibling, node_score */
    int32_t *pred;              /* [B, Q] */
    /* A drafter with host_candidates on CUDA: its candidates, the tree (tree_aux's host twin) and the
     * acceptance stay on the host in a greedy step; only target_pred comes back (host_tree). */
    int host_tree;
    float *h_scores;            /* [B, D, K] */
    int32_t *h_dtok;            /* [B, D, K] */
    int32_t *h_aux;             /* [6, B, Q] */
    int32_t pred_q;             /* target_pred's row stride this step: Q, or 1 (a host step of one row each) */
    /* KDT_SPEC_PROFILE: CUDA events around each forward (stats t_forward_dev). */
    void *span;
    int profile;
    int32_t *acc;
    float *logits;              /* [B * Q, V] */
    float *hidden;              /* [B * Q, hidden] when the drafter wants it */
    int32_t *d_rows;            /* [2, B] row_start, n_rows of the forward (CUDA argmax) */
    /* Host mirrors (the same memory on CPU) and the forward's inputs and outputs. */
    void *h_tree_io;
    int32_t *h_roots, *h_pred, *h_acc;
    int32_t *f_tok, *f_pos;     /* [B * Q] */
    uint8_t *f_mask;            /* [B * Q * Q] */
    int32_t *c_req, *c_len, *c_idx; /* [B], [B], [B * Q]: one commit group */
    /* Sampling (some request of this step has temperature > 0). samp: this step's seed u64 [Ba], then
     * temperature f32, top_k i32, top_p f32 [Ba] each; one: the root-only trees of plain decoding,
     * node_token, node_parent, num_nodes, accept_len, status, accept_index, accept_tokens [Ba] each. */
    int sampling;
    /* A sampled drafter's distributions, made at the first step that samples: probs [B, D, V]
     * (what propose writes), draft_probs [B, Q, V] (per tree node, as tree_sample_accept reads
     * them), gidx [B * Q] (each node's row of probs, -1: none); host: the drafter's temperatures and
     * seeds [B] and gidx's host side. */
    float *probs, *draft_probs;
    int32_t *gidx, *h_gidx;
    float *h_dtemp;
    uint64_t *h_dseed;
    int hidden_layers;          /* the model was asked for the drafter's target layers (undone at free) */
    void *samp, *h_samp;
    int32_t *one, *h_one;
    /* Pipelined plain decoding (decode.c): on without a drafter unless sync_timing or KDT_SPEC_PROFILE
     * asks for each step's time. pick [B] (backend memory): the last forward's picks, the next one's
     * tokens; rb: the readbacks of two forwards in a row (CUDA), h_picks [2, B] their host copies (CPU).
     * fly forwards (0 .. 2) are queued and not yet read, the oldest's picks in readback fly_half; all
     * of them are for the requests fly_slot [fly_B]. */
    int pipe;
    int32_t *pick, *h_picks;
    void *rb[2];
    int32_t fly, fly_half, fly_B, *fly_slot;
};

double     kdt_spec_now(void);                                  /* monotonic seconds */
kdt_status kdt_spec_loop_alloc(loop *L, int32_t num_blocks);    /* L's buffers and cache, for its B, Q, D, K, V */
void       kdt_spec_loop_free(loop *L);                         /* what kdt_spec_loop_alloc made (L itself stays) */
/* One session step: the prefill chunk of the requests still prefilling, then one speculative (or
 * plain) step over those decoding, with the statistics. */
kdt_status kdt_spec_loop_step(loop *L);
/* Appends tok to slot s's history and output; ends the request at max_new or eos. */
void       kdt_spec_push(loop *L, int32_t s, int32_t tok);

/* Pipelined plain decoding (decode.c). step: one greedy step of the active requests (no sampling):
 * queues the next forward, then reads the oldest in flight. settle: reads every forward in flight
 * and drops the active requests that ended. cancel: waits for the forwards in flight and drops
 * them, their cache rows cut (a request leaves the session). */
kdt_status kdt_spec_decode_step(loop *L);
kdt_status kdt_spec_decode_settle(loop *L);
kdt_status kdt_spec_decode_cancel(loop *L);
