/* The ops `kdt run` knows, by name. */
#include <string.h>

#include "common/internal.h"
#include "ops/backends.h"

static const kdt_op_desc ops[] = {
    {"tree_build", "best-first draft tree from top-K candidates per depth (docs/interfaces.md 2.1)", kdt_tree_build_run},
    {"verify_attn", "tree-verify attention, absorbed MLA, contiguous or paged KV (docs/interfaces.md 2.2)", kdt_verify_attn_run},
    {"tree_accept", "greedy acceptance of the longest confirmed path (docs/interfaces.md 2.3)", kdt_tree_accept_run},
    {"tree_sample_accept", "lossless acceptance when sampling: temperature, top-k, top-p, seed (docs/interfaces.md 2.4)",
     kdt_tree_sample_accept_run},
    {"kv_commit", "move the accepted path's KV rows right after the prefix (docs/interfaces.md 2.5)", kdt_kv_commit_run},
};

const kdt_op_desc *kdt_op_at(size_t index) {
    return index < sizeof ops / sizeof ops[0] ? &ops[index] : NULL;
}

const kdt_op_desc *kdt_op_find(const char *name) {
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(ops[i].name, name) == 0) return &ops[i];
    return NULL;
}

kdt_status kdt_op_run(const char *name, const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend) {
    const kdt_op_desc *op = kdt_op_find(name);
    if (!op) return kdt_fail(KDT_ERR_UNSUPPORTED, "unknown op '%s' (see kdt --help)", name);
    return op->run(in, out, backend);
}
