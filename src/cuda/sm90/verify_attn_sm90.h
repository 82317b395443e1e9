/* verify_attn on Hopper: the fast path behind kdt_verify_attn_cuda for bf16 inputs
 * with Dv = 512, Dr = 64 on a device of compute capability 9.x. Internal (not installed). */
#pragma once

#include <stddef.h>

#include "kdt/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The two kernels (verify_attn_sm90_kernel.cu). Both compute S = Q K^T and the softmax in
 * warpgroup 0 and O += P V in both warpgroups, by wgmma, and give bit-identical outputs; they differ
 * in how key tiles reach shared memory. docs/perf/verify_attn_sm90.md has their times. */
typedef enum kdt_va_sm90_kernel {
    KDT_VA_SM90_AUTO = 0,     /* TMA where the call fits it, else cp.async */
    KDT_VA_SM90_TMA = 1,      /* TMA boxes; block size 16, 32 or a multiple of 64, or contiguous */
    KDT_VA_SM90_CP_ASYNC = 2, /* 16-byte cp.async from warpgroup 1; any block size */
} kdt_va_sm90_kernel;

typedef struct kdt_va_sm90_config {
    int kernel;  /* a kdt_va_sm90_kernel; TMA asked of a call it does not fit runs cp.async */
    int parts;   /* 0: the scheduler chooses; else KV parts per row tile (split-KV), >= 1 */
    int no_pdl;  /* 1: launch the kernels without programmatic dependent launch */
} kdt_va_sm90_config;

/* What a call ran: for tests and the bench. */
typedef struct kdt_va_sm90_info {
    int kernel;             /* the kernel that ran: KDT_VA_SM90_TMA or KDT_VA_SM90_CP_ASYNC */
    int m_tiles;            /* row tiles of 64 (tree row, head) pairs per request */
    int parts;              /* KV parts per row tile; > 1 launches the combine kernel */
    int grid;               /* CTAs of the main kernel: m_tiles * parts */
    int smem_bytes;         /* dynamic shared memory per CTA */
    size_t workspace_bytes; /* split-KV partials (0 when parts == 1) */
    int pdl;                /* 1: the kernels (main, and combine when split) went out with programmatic dependent launch */
} kdt_va_sm90_info;

/* The hook kdt_verify_attn_cuda calls first. Sets *handled = 0 and returns KDT_OK when the call is
 * not its case (dtype, dims, device, alignment, $KDT_VA_SM90=0); else queues the work on `stream`
 * (a cudaStream_t) and sets *handled = 1. Params are validated by the caller. */
kdt_status kdt_verify_attn_sm90(const kdt_verify_attn_params *p, void *stream, int *handled);

/* Same, with an explicit kernel / split count (cfg may be NULL) and a report of what ran (info may
 * be NULL). $KDT_VA_SM90=0 does not disable this entry. */
kdt_status kdt_verify_attn_sm90_ex(const kdt_verify_attn_params *p, void *stream, const kdt_va_sm90_config *cfg,
                                   kdt_va_sm90_info *info, int *handled);

#ifdef __cplusplus
}
#endif
