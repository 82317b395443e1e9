/* The routed experts of a MoE layer on quantized weights (FP8 128x128 blocks, INT4 groups of 32) at
 * decode and verify sizes: one grouped launch for gate/up (+ SiLU . mul) and one for down over
 * every expert with rows, on the tensor cores (moe_quant.cu). */
#pragma once

#include <cuda_runtime.h>

#include "model/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether kdt_moe_quant takes these experts: gate/up and down both FP8 or both INT4, hidden and
 * intermediate sizes multiples of 16 (FP8) or 32 (INT4). */
int kdt_moe_quant_fits(const kdt_dlin *gate_up, const kdt_dlin *down, int32_t hid, int32_t I);

/* kdt_lin_moe_small's contract (linear.h) for quantized experts and bf16 activations: x [R, hid]
 * bf16; the grouping of the R x K assignments by expert (kdt_mk_moe_plan: counts [E], offs [E],
 * perm [R K], read on the device); act [R K, I] bf16 = silu(gate) * up at each assignment's
 * place, ye [R K, hid] f32 = act . down^T. No host wait; deterministic. */
kdt_status kdt_moe_quant(int64_t R, const void *x, const int32_t *perm, int32_t K, const int32_t *counts, const int32_t *offs,
                         const kdt_dlin *gate_up, const kdt_dlin *down, int32_t hid, int32_t I, void *act, float *ye,
                         cudaStream_t s);

#ifdef __cplusplus
}
#endif
