/* The routed experts of a MoE layer on bf16 weights at decode and verify sizes: one grouped launch
 * for gate/up (+ SiLU . mul) and one for down over every expert with rows, on the tensor cores
 * (moe_bf16.cu; docs/perf/model.md, "Grouped bf16 experts"). */
#pragma once

#include <cuda_runtime.h>

#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether kdt_moe_bf16 takes experts of these sizes: hidden and intermediate multiples of 32. */
int kdt_moe_bf16_fits(int32_t hid, int32_t I);

/* kdt_mk_moe_small's contract (kernels.h) for bf16 activations and weights: x [R, hid]; the grouping
 * of the R x K assignments by expert (kdt_mk_moe_plan: counts [E], offs [E], perm [R K], read on the
 * device); w_gate_up [E, 2I, hid] (gate rows, then up rows), w_down [E, hid, I]; act [R K, I] =
 * silu(gate) * up and ye [R K, hid] f32 = act . down^T at each assignment's place. shared_gate_up
 * [2I, hid], shared_down [hid, I] (NULL: none): the layer's shared expert in the same launches, its
 * R rows at places R K + r (act and ye sized R (K + 1)). No host wait; deterministic, and a row's
 * outputs do not depend on the other rows of the batch. */
kdt_status kdt_moe_bf16(int64_t R, const void *x, const int32_t *perm, int32_t K, const int32_t *counts, const int32_t *offs,
                        const void *w_gate_up, const void *w_down, const void *shared_gate_up, const void *shared_down, int32_t E,
                        int32_t hid, int32_t I, void *act, float *ye, cudaStream_t s);

#ifdef __cplusplus
}
#endif
