/* tree_sample_accept CUDA (docs/interfaces.md 2.4; docs/sampling.md). One block of 1024 threads per request
 * walks the tree; each visited node's logits row is read by V-parallel passes: its largest key,
 * the top-k and top-p thresholds (radix selects, 8 bits a pass, only where the filter is on),
 * the sum of weights, and for the bonus token an inverse-CDF pass (per-warp segment sums, then
 * one warp scans its segment). Every decision uses the integer weights and draws of
 * common/sample_math.h, so the outputs equal the CPU reference's bit for bit: sums of u64 weights
 * are exact in any order. The tree (tokens, parents, child lists) sits in shared memory.
 *
 * Safe on any input: parents are range-checked before any use, the walk takes at most num_nodes
 * steps (each moves to a higher node index), tokens outside [0, V) weigh 0 and are never read. */
#include "common/cuda/cuda_common.cuh"
#include "cuda/tree_sample_accept.cuh"
#include "ops/backends.h"

namespace {

__global__ void __launch_bounds__(tsa::kThreads, 1) tree_sample_accept_kernel(const kdt_tree_sample_accept_params p) {
    __shared__ tsa::Smem s;
    tsa::tsa_request(p, s, blockIdx.x);
}

} // namespace

extern "C" kdt_status kdt_tree_sample_accept_cuda(const kdt_tree_sample_accept_params *p, void *stream) {
    if (p->B <= 0) return KDT_OK;
    tree_sample_accept_kernel<<<(unsigned)p->B, tsa::kThreads, 0, (cudaStream_t)stream>>>(*p);
    KDT_CUDA_CHECK_LAUNCH("tree_sample_accept");
    return KDT_OK;
}
