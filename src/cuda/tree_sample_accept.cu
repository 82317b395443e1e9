/* tree_sample_accept CUDA (docs/interfaces.md 2.4; docs/sampling.md). One block of 1024 threads per
 * request walks the tree; each visited node's logits row is read by V-parallel passes: its largest
 * key, then, only where a filter is on, a histogram of counts and weights over coarse bins of m - key
 * and one or two passes that gather the keys of the bin where a cut falls, whose exact threshold a
 * radix select in shared memory finds (the radix selects over the whole row, 8 bits a pass, where a
 * bin overflows: kdt_tree_sample_accept_cuda_radix takes them always, for the bench); else the sum of
 * weights; with draft_probs, the draft row's weights read in the max pass; and for the bonus token an
 * inverse-CDF pass (per-warp segment sums, then one warp scans its segment). Every decision uses the
 * integer weights and draws of common/sample_math.h, so the outputs equal the CPU reference's bit for
 * bit: sums of u64 weights are exact in any order. The tree (tokens, parents, child lists) sits in
 * shared memory.
 *
 * Safe on any input: parents are range-checked before any use, the walk takes at most num_nodes
 * steps (each moves to a higher node index), tokens outside [0, V) weigh 0 and are never read. */
#include "common/cuda/cuda_common.cuh"
#include "cuda/tree_sample_accept.cuh"
#include "ops/backends.h"

namespace {

template <bool kCoarse>
__global__ void __launch_bounds__(tsa::kThreads, 1) tree_sample_accept_kernel(const kdt_tree_sample_accept_params p) {
    extern __shared__ __align__(16) unsigned char smem[]; /* tsa::Smem is past the 48 KB of static shared memory */
    tsa::tsa_request(p, *reinterpret_cast<tsa::Smem *>(smem), blockIdx.x, kCoarse);
}

template <bool kCoarse> kdt_status launch(const kdt_tree_sample_accept_params *p, void *stream) {
    if (p->B <= 0) return KDT_OK;
    KDT_CUDA_CHECK(cudaFuncSetAttribute(tree_sample_accept_kernel<kCoarse>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)sizeof(tsa::Smem)));
    tree_sample_accept_kernel<kCoarse><<<(unsigned)p->B, tsa::kThreads, sizeof(tsa::Smem), (cudaStream_t)stream>>>(*p);
    KDT_CUDA_CHECK_LAUNCH("tree_sample_accept");
    return KDT_OK;
}

} // namespace

extern "C" kdt_status kdt_tree_sample_accept_cuda(const kdt_tree_sample_accept_params *p, void *stream) {
    return launch<true>(p, stream);
}

extern "C" kdt_status kdt_tree_sample_accept_cuda_radix(const kdt_tree_sample_accept_params *p, void *stream) {
    return launch<false>(p, stream);
}
