/* The reference of the loop's tests: greedy decoding of one request through the model API alone
 * (a fresh cache, the prompt, then one row at a time, the argmax of the host logits). */
#pragma once

#include "kdt/model.h"

/* seq [P + n]: the prompt (already there), then n greedy tokens; hidden [P + n - 1, hid] (may
 * be NULL): the final hidden state of every row fed. */
kdt_status kt_greedy_ref(kdt_model *m, int32_t *seq, int32_t P, int32_t n, float *hidden);
