/* Backend entry points behind the public ops. Validation happens once, in src/ops/<op>.c,
 * before either backend is called; backends may assume valid dims and non-NULL pointers. */
#pragma once

#include "kdt/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

kdt_status kdt_tree_build_cpu(const kdt_tree_build_params *p);
kdt_status kdt_tree_build_cuda(const kdt_tree_build_params *p, void *stream);

kdt_status kdt_verify_attn_cpu(const kdt_verify_attn_params *p);
kdt_status kdt_verify_attn_cuda(const kdt_verify_attn_params *p, void *stream);

kdt_status kdt_tree_accept_cpu(const kdt_tree_accept_params *p);
kdt_status kdt_tree_accept_cuda(const kdt_tree_accept_params *p, void *stream);

kdt_status kdt_tree_sample_accept_cpu(const kdt_tree_sample_accept_params *p);
kdt_status kdt_tree_sample_accept_cuda(const kdt_tree_sample_accept_params *p, void *stream);
/* The same with the filters by radix selects over the whole row (the path before the coarse
 * pass; the same bits, slower): for bench_sample_accept's before / after. CUDA builds only. */
kdt_status kdt_tree_sample_accept_cuda_radix(const kdt_tree_sample_accept_params *p, void *stream);

kdt_status kdt_kv_commit_cpu(const kdt_kv_commit_params *p);
kdt_status kdt_kv_commit_cuda(const kdt_kv_commit_params *p, void *stream);

/* Each op's tensor adapter, listed in src/ops/op_table.c. */
kdt_status kdt_tree_build_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend);
kdt_status kdt_verify_attn_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend);
kdt_status kdt_tree_accept_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend);
kdt_status kdt_tree_sample_accept_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend);
kdt_status kdt_kv_commit_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend);

#ifdef __cplusplus
}
#endif
