/* The ops' CUDA backend (src/cuda/, declared in ops/backends.h) in a CPU-only build (KDT_CUDA=0):
 * each entry point is a clear error. */
#include "common/device.h"
#include "ops/backends.h"

#if !KDT_HAVE_CUDA
kdt_status kdt_tree_build_cuda(const kdt_tree_build_params *p, void *stream) {
    (void)p; (void)stream;
    return kdt_no_cuda("tree_build");
}
kdt_status kdt_verify_attn_cuda(const kdt_verify_attn_params *p, void *stream) {
    (void)p; (void)stream;
    return kdt_no_cuda("verify_attn");
}
kdt_status kdt_tree_accept_cuda(const kdt_tree_accept_params *p, void *stream) {
    (void)p; (void)stream;
    return kdt_no_cuda("tree_accept");
}
kdt_status kdt_kv_commit_cuda(const kdt_kv_commit_params *p, void *stream) {
    (void)p; (void)stream;
    return kdt_no_cuda("kv_commit");
}
kdt_status kdt_tree_sample_accept_cuda(const kdt_tree_sample_accept_params *p, void *stream) {
    (void)p; (void)stream;
    return kdt_no_cuda("tree_sample_accept");
}
#endif
