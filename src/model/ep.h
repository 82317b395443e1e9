/* Expert parallel inside the model (ep.c): which experts a rank holds, the MoE layer's hook, and
 * the partial loaders that kdt_model_load_ranked / kdt_model_builtin_ranked call. */
#pragma once

#include "model/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets m's communicator (NULL for a world of one) and its experts [e_lo, e_lo + e_n). */
void       kdt_ep_assign(kdt_model *m, kdt_comm *comm);
/* 1 on rank 0 or without a communicator: the rank that holds everything but the other ranks' experts. */
int        kdt_ep_driver(const kdt_model *m);
/* The MoE layer's routed experts, from rank 0's forward: xin [R, hidden], gi and gw [R, K] (the
 * routing); slots [R * K, hidden], zeroed by the caller, gets every (row, choice)'s expert output
 * times its weight, whichever rank holds the expert. */
kdt_status kdt_ep_moe(const kdt_model *m, int32_t l, int64_t R, const float *xin, const int32_t *gi, const float *gw,
                      float *slots);
/* Rank 0's model is being freed: the other ranks leave kdt_model_serve_experts. */
void       kdt_ep_stop(kdt_model *m);
/* This rank's own experts only (forward_cpu.c): the slots of the choices that fall in [e_lo, e_lo + e_n). */
kdt_status kdt_moe_experts_cpu(const kdt_model *m, const kdt_layer_w *L, int64_t R, const float *xin, const int32_t *gi,
                               const float *gw, float *slots);
/* The loaders with m's experts cut to the rank's (weights.c, builtin.c); the caller agrees on the outcome. */
kdt_status kdt_model_load_part(const char *dir, kdt_backend backend, kdt_dtype dtype, kdt_comm *comm, kdt_model **out);
kdt_status kdt_model_builtin_part(uint64_t seed, kdt_backend backend, kdt_dtype dtype, kdt_comm *comm, kdt_model **out);

#ifdef __cplusplus
}
#endif
