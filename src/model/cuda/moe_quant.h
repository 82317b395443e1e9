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

/* The packed layout of INT4 experts on the device (kdt_dlin.packed; issue 23), made for the grouped
 * kernel's warps: a matrix [N, K] (N % 16 == 0, K % 128 == 0) is cut into blocks of 16 rows (a tile, the
 * mma's A) by 128 k (a step, 4 groups of 32), block b = tile * (K / 128) + step. Each block keeps the
 * byte span the checkpoint's layout gives its tile's rows, so matrix e and part p are where they were:
 *   codes: the block's 1024 bytes at 1024 b, 256 words [h 2][lane 32][G 4]: lane = 4g + t holds in word
 *     G the values k = 128 step + 32 G + 8 t + j (j = 0 .. 7) of row 16 tile + g + 8 h, value j in nibble
 *     j / 2 (j even) or 4 + j / 2 (odd), each as code + 8 (as in the checkpoint);
 *   scales: the block's 64 bf16 at 64 b, [g 8][G 4][h 2]: group G of the step, rows g + 8 h.
 * A warp's step of a tile is then two 512-byte loads of codes (lane: 16 bytes, the A registers of 8 mmas
 * after one lop3 a register) and one 128-byte load of scales (a quad's 4 lanes the same 16 bytes). */
int kdt_moe_quant_int4_packable(int32_t N, int32_t K);

/* Rows [rows, K] of INT4 codes (the checkpoint's [rows, K / 2] bytes) and bf16 scales [rows, K / 32], the
 * first row a tile's, into the packed layout at dst_w, dst_s (the same sizes; not in place). */
kdt_status kdt_moe_quant_int4_pack(void *dst_w, void *dst_s, const void *src_w, const void *src_s, int64_t rows, int32_t K,
                                   cudaStream_t s);

/* bf16 out [N, K] of matrix e of a packed INT4 linear (all its parts), rounded as kdt_dequant_int4_bf16
 * rounds the checkpoint's layout: the per-expert products (kdt_lin) on packed experts. */
kdt_status kdt_moe_quant_int4_dequant(const kdt_dlin *d, int64_t e, void *out, cudaStream_t s);

/* The experts with rows summed over the layers kdt_moe_quant ran on the current device since the last
 * call (its gate/up kernel adds each launch's count to a device counter), then zeroed: the experts whose
 * weights those steps read, for a bench's floor. Waits for the device. */
kdt_status kdt_moe_quant_experts_read(int64_t *n);

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
