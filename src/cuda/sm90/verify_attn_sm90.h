/* verify_attn on Hopper (issue 6): the fast path behind kdt_verify_attn_cuda for bf16 inputs
 * with Dv = 512, Dr = 64 on a device of compute capability 9.x. Internal (not installed). */
#pragma once

#include <stddef.h>

#include "kdt/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Kernel variants, by the engine of each product (S = Q K^T, then O += P V):
 *   1: mma.sync for both (sm_80 instructions; the reference design)
 *   2: wgmma for both, warpgroup 0 computes S and the softmax, cp.async loads
 *   3: wgmma for S, mma.sync for P V;  4: mma.sync for S, wgmma for P V
 *   5: wgmma, the two warpgroups in ping-pong (each S of its own key tile, FlashMLA's schedule),
 *      TMA loads; block size 16, 32 or a multiple of 64, or contiguous (else it runs variant 2)
 *   6: variant 2's schedule with TMA loads (same block sizes as 5, else variant 2): the default
 * 3 and 4 exist to localize a wgmma layout fault from one test run; docs/perf/verify_attn_sm90.md
 * has the times of each. */
#define KDT_VA_SM90_VARIANTS 6
#define KDT_VA_SM90_DEFAULT 6 /* the fastest variant that passed on an H200 */

typedef struct kdt_va_sm90_config {
    int variant; /* 0: from $KDT_VA_SM90 (unset: KDT_VA_SM90_DEFAULT); 1 .. KDT_VA_SM90_VARIANTS */
    int parts;   /* 0: the scheduler chooses; else KV parts per row tile (split-KV), >= 1 */
    int no_pdl;  /* 1: launch the combine kernel without programmatic dependent launch */
} kdt_va_sm90_config;

/* What a call ran: for tests and the bench. */
typedef struct kdt_va_sm90_info {
    int variant;            /* the variant that ran: 1 .. KDT_VA_SM90_VARIANTS */
    int m_tiles;            /* row tiles of 64 (tree row, head) pairs per request */
    int parts;              /* KV parts per row tile; > 1 launches the combine kernel */
    int grid;               /* CTAs of the main kernel: m_tiles * parts */
    int smem_bytes;         /* dynamic shared memory per CTA */
    size_t workspace_bytes; /* split-KV partials (0 when parts == 1) */
    int pdl;                /* 1: the combine kernel went out with programmatic dependent launch */
} kdt_va_sm90_info;

/* The hook kdt_verify_attn_cuda calls first. Sets *handled = 0 and returns KDT_OK when the call is
 * not its case (dtype, dims, device, alignment, $KDT_VA_SM90=0); else queues the work on `stream`
 * (a cudaStream_t) and sets *handled = 1. Params are validated by the caller. */
kdt_status kdt_verify_attn_sm90(const kdt_verify_attn_params *p, void *stream, int *handled);

/* Same, with an explicit variant / split count (cfg may be NULL) and a report of what ran (info may
 * be NULL). $KDT_VA_SM90=0 does not disable this entry. */
kdt_status kdt_verify_attn_sm90_ex(const kdt_verify_attn_params *p, void *stream, const kdt_va_sm90_config *cfg,
                                   kdt_va_sm90_info *info, int *handled);

#ifdef __cplusplus
}
#endif
