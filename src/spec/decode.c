/* Pipelined plain decoding (issue 21, docs/spec.md "Pipelined plain decoding"): greedy steps with
 * the host off the GPU's critical path.
 *
 * A plain step's input is the previous step's argmax, so the next forward can be queued before the
 * host has read this one's token: each forward takes its tokens from the device (kdt_batch.dev_tokens)
 * and writes the next ones over them inside its own work (kdt_batch.argmax, the same buffer: one
 * graph for every step), and returns without waiting (no_wait); a pinned copy of the picks queued
 * behind it, with an event (a readback, two of them in turn), is what the host waits for. A step
 * queues forward t + 1, then reads token t, so the GPU always has the next forward while the host
 * handles this one's token.
 *
 * Lossless: forward t + 1 is queued only while every request of the step has room for its token
 * (max_new); a request that ends at token t on eos has forward t + 1 in flight, whose row is cut
 * from the cache as soon as that is known and whose token is never read. The outputs and the cache
 * are plain greedy's. On the CPU the same steps run synchronously (pick in host memory, the
 * readbacks plain copies), which tests the bookkeeping. */
#include <string.h>

#include "common/internal.h"
#include "spec/internal.h"
#include "spec/loop.h"

/* Queues one forward of the active requests, one row each, on the tokens in pick: the newest
 * forward in flight's picks, or (from_host) the last of their histories, copied there first. Its
 * picks replace them, and a readback (the one after the newest's) takes them to the host. */
static kdt_status launch(loop *L, int from_host) {
    const int32_t Ba = L->Ba, half = L->fly ? (L->fly_half + L->fly) % 2 : 0;
    const size_t bytes = (size_t)Ba * sizeof *L->pick;
    const int cuda = L->be == KDT_BACKEND_CUDA;
    for (int32_t a = 0; a < Ba; a++) L->n_rows[a] = 1;
    for (int32_t a = 0; from_host && a < Ba; a++) L->f_tok[a] = L->act_hist[a][L->act_len[a] - 1];
    kdt_status s = !from_host ? KDT_OK : cuda ? kdt_spec_copy(L->pick, L->f_tok, bytes, KDT_SPEC_H2D, L->stream)
                                              : (memcpy(L->pick, L->f_tok, bytes), KDT_OK);
    kdt_batch bt = {.B = Ba, .req = L->act, .n_rows = L->n_rows, .tokens = cuda ? NULL : L->pick, .logits_rows = KDT_LOGITS_LAST};
    if (cuda) {
        bt.dev_tokens = L->pick;
        bt.argmax = L->pick;
        bt.no_wait = 1;
    }
    if (s == KDT_OK) s = kdt_model_forward(L->m, L->cache, &bt, L->logits, NULL, L->stream);
    if (s == KDT_OK && cuda) s = kdt_spec_readback_start(&L->rb[half], L->pick, bytes, (size_t)L->B * sizeof *L->pick, L->stream);
    if (s == KDT_OK && !cuda) {
        kdt_spec_argmax_host(L->logits, Ba, L->V, L->pick);
        memcpy(L->h_picks + (size_t)half * L->B, L->pick, bytes);
    }
    if (s != KDT_OK) return s;
    if (!L->fly) {
        L->fly_half = half;
        L->fly_B = Ba;
        memcpy(L->fly_slot, L->act, (size_t)Ba * sizeof *L->act);
    }
    L->fly++;
    return KDT_OK;
}

/* Reads the oldest forward in flight and appends its tokens to the requests that have not ended
 * (one that ended at an earlier token had this row cut already). A request that ends now while a
 * later forward holds its next row loses that row. */
static kdt_status settle(loop *L) {
    const void *host = L->h_picks + (size_t)L->fly_half * L->B;
    kdt_status s = L->be == KDT_BACKEND_CUDA ? kdt_spec_readback_wait(L->rb[L->fly_half], &host) : KDT_OK;
    if (s != KDT_OK) return s;
    const int32_t *tok = host;
    L->fly--;
    L->fly_half = (L->fly_half + 1) % 2;
    for (int32_t a = 0; a < L->fly_B; a++) {
        const int32_t slot = L->fly_slot[a];
        if (L->done[slot]) continue;
        if (tok[a] < 0 || tok[a] >= L->V)
            return kdt_fail(KDT_ERR_INTERNAL, "plain decoding: request %d got token %d, outside the vocabulary", slot, tok[a]);
        L->reqs[slot]->steps++;
        kdt_spec_push(L, slot, tok[a]);
        L->st->tokens++;
        if (L->done[slot] && L->fly && (s = kdt_cache_truncate(L->cache, slot, kdt_cache_len(L->cache, slot) - 1)) != KDT_OK)
            return s;
    }
    return KDT_OK;
}

/* Whether the forward in flight is for exactly this step's requests. */
static int same_requests(const loop *L) {
    return L->fly_B == L->Ba && !memcmp(L->fly_slot, L->act, (size_t)L->Ba * sizeof *L->act);
}

/* The active requests that have not ended, their history lengths as of now. */
static void refresh(loop *L) {
    int32_t n = 0;
    for (int32_t a = 0; a < L->Ba; a++) {
        const int32_t slot = L->act[a];
        if (L->done[slot]) continue;
        L->act[n] = slot;
        L->act_hist[n] = L->hist[slot];
        L->act_len[n++] = L->hist_len[slot];
    }
    L->Ba = n;
}

kdt_status kdt_spec_decode_settle(loop *L) {
    kdt_status s = KDT_OK;
    while (s == KDT_OK && L->fly) s = settle(L);
    refresh(L);
    return s;
}

kdt_status kdt_spec_decode_step(loop *L) {
    const double t0 = kdt_spec_now();
    kdt_status s = L->fly && !same_requests(L) ? kdt_spec_decode_settle(L) : KDT_OK;
    if (s != KDT_OK || L->Ba == 0) return s;
    if (!L->fly && (s = launch(L, 1)) != KDT_OK) return s;
    int room = 1; /* every request takes another token after the one in flight */
    for (int32_t a = 0; a < L->Ba; a++) room &= L->reqs[L->act[a]]->n_out + 2 <= L->reqs[L->act[a]]->max_new;
    if (room && (s = launch(L, 0)) != KDT_OK) return s;
    if ((s = settle(L)) != KDT_OK) return s;
    L->st->t_verify += kdt_spec_now() - t0;
    return KDT_OK;
}

kdt_status kdt_spec_decode_cancel(loop *L) {
    kdt_status s = L->fly && L->be == KDT_BACKEND_CUDA ? kdt_spec_stream_sync(L->stream) : KDT_OK;
    for (; s == KDT_OK && L->fly; L->fly--)
        for (int32_t a = 0; s == KDT_OK && a < L->fly_B; a++) {
            const int32_t slot = L->fly_slot[a];
            if (L->reqs[slot] && !L->done[slot]) s = kdt_cache_truncate(L->cache, slot, kdt_cache_len(L->cache, slot) - 1);
        }
    return s;
}
