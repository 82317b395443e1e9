/* tree_accept CUDA kernel variants, for bench/bench_accept.cu to compare (the library runs
 * KDT_TREE_ACCEPT_WARP). Params must already be valid (kdt_tree_accept validates them). */
#pragma once

#include "kdt/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kdt_tree_accept_variant {
    KDT_TREE_ACCEPT_WARP = 0,    /* warp per request, 4 warps a block: best child by shared atomicMin, then a chase */
    KDT_TREE_ACCEPT_WARP1 = 1,   /* the same, 1 warp a block (more SMs, smaller blocks) */
    KDT_TREE_ACCEPT_BALLOT = 2,  /* warp per request (4 a block), each step scans the candidates with a ballot */
    KDT_TREE_ACCEPT_THREAD = 3,  /* thread per request, straight from global memory (the CPU loop) */
    KDT_TREE_ACCEPT_N_VARIANTS = 4,
} kdt_tree_accept_variant;

kdt_status kdt_tree_accept_cuda_variant(const kdt_tree_accept_params *p, void *stream, int variant);
const char *kdt_tree_accept_variant_name(int variant);

#ifdef __cplusplus
}
#endif
