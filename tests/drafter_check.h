/* Shared by the drafter tests (test_spec_dflash.c, test_spec_mtp.c): a drafter's proposal from a
 * fresh prefill of one history, and the check that speculative decoding with the drafter equals
 * plain greedy while every proposal inside the loop equals a fresh one. */
#pragma once

#include <stddef.h>

#include "kdt/spec.h"

/* Prefills a begun-anew drafter dr on backend be with history hist [len] (hidden: the target's features
 * of its first len - 1 tokens, as the drafter wants them) and takes its D x K proposal (hidden, scores
 * and tokens in be's memory). */
kdt_status kt_draft_fresh(kdt_drafter *dr, const kdt_model_config *cf, kdt_backend be, const int32_t *hist, int32_t len,
                          int32_t D, int32_t K, const float *hidden, float *scores, int32_t *tokens);

/* The target's states of tokens [n] as drafter dr wants them (its layers, or the final norm's
 * output), from a forward in a fresh cache: hidden [n, W] in the target's backend memory. Leaves
 * the drafter's layers set on m (what the loop that may be running on m has set). */
kdt_status kt_target_states(kdt_model *m, const kdt_drafter *dr, const int32_t *tokens, int32_t n, float *hidden);

/* A fresh drafter's proposal for one history, over a fresh target forward of it. */
typedef kdt_status (*kt_fresh_propose)(kdt_model *m, const int32_t *hist, int32_t len, int32_t D, int32_t K, float *scores,
                                       int32_t *tokens);
/* A new drafter under test (the loop's, wrapped so that each of its proposals is checked). */
typedef kdt_status (*kt_make_drafter)(kdt_model *m, kdt_drafter **dr);

/* For each (D, K, N) of cases [n_cases]: speculative decoding of the B prompts (prompts[b] [plen[b]],
 * max_new tokens each) equals plain greedy, and every proposal equals fresh()'s. name starts the lines.
 * Returns 0 when the plain greedy reference itself failed (nothing else was checked). */
int kt_check_lossless(kdt_model *m, const char *name, kt_make_drafter make, kt_fresh_propose fresh, const int32_t (*cases)[3],
                       size_t n_cases, int32_t B, const int32_t *const *prompts, const int32_t *plen, int32_t max_new);
