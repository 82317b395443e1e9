/* The MoE router of a small batch in one launch (route.cu): scores, each row's experts and the
 * grouping by expert, in place of the router GEMM, kdt_mk_route and kdt_mk_moe_plan's two
 * kernels. Outputs as theirs (kernels.h), deterministic and, for a row, the same bits whatever
 * else is in the batch. */
#pragma once

#include <cuda_runtime.h>

#include "kdt/kdt.h"
#include "model/cuda/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether kdt_mk_route_plan takes R rows of E experts in G groups, K per row; with_scores: also
 * the router's scores from h and w of width hid (small routers in the one block; larger ones, hid a
 * multiple of 4 and at most 16 rows, over the GPU). */
int kdt_mk_route_plan_fits(int64_t R, int32_t E, int32_t G, int32_t K, int32_t hid, int with_scores);

/* h [R, hid] f32 and w [E, hid] f32 (16-byte aligned): logits [R, E] f32 = h . w^T (h NULL: logits
 * are read, as written by the router GEMM); then idx [R, K], wt [R, K] as kdt_mk_route, counts
 * [E], offs [E], perm [R * K], pos [R * K] as kdt_mk_moe_plan. With in_norm (and h): h [R, hid]
 * f32 and hn [R, hid] (dt) = the RMSNorm of in_norm's rows (rows NULL) are written first, with the
 * bits of kdt_mk_rmsnorm (in the launch that routes, or for a large router and more than 4 rows by
 * kdt_mk_rmsnorm's launch before). ticket: one int of device memory, zero, that the wide router's
 * blocks count on (left zero); NULL where the router is small or h NULL. A row's results have the
 * same bits whatever the batch. */
kdt_status kdt_mk_route_plan(const float *h, const float *w, int32_t hid, float *logits, const float *bias, int64_t R, int32_t E,
                             int32_t G, int32_t topk_group, int32_t K, int norm, float scale, int32_t *idx, float *wt,
                             int32_t *counts, int32_t *offs, int32_t *perm, int32_t *pos, const kdt_mk_norm *in_norm, void *hn,
                             kdt_dtype dt, int32_t *ticket, cudaStream_t s);

#ifdef __cplusplus
}
#endif
