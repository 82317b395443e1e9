/* kv_commit CPU reference (docs/interfaces.md 2.5): each request's accepted path moves, in path order,
 * to the slots right after its prefix. Path order makes overlapping moves safe: move t's
 * destination may be an earlier move's source (already copied), never a later one's. */
#include <string.h>

#include "ops/backends.h"

/* Status codes, checked in this order (the CUDA kernel and the numpy generator agree). */
enum { BAD_ACCEPT_LEN = 1, BAD_KV_LEN = 2, BAD_PATH = 3, BAD_BLOCK = 4 };

/* Cache row (block * BS + row in block) of slot j of a request, or -1 if its block is out of range. */
static int64_t slot_row(const kdt_kv_commit_params *p, const int32_t *table, int64_t j) {
    int32_t blk = table[j / p->BS];
    return blk < 0 || blk >= p->NB ? -1 : (int64_t)blk * p->BS + j % p->BS;
}

static int32_t check(const kdt_kv_commit_params *p, int32_t b) {
    const int32_t Q = p->Q, len = p->accept_len[b], kv_len = p->kv_len[b];
    const int32_t *path = p->accept_index + (size_t)b * Q, *table = p->block_table + (size_t)b * p->MB;
    if (len < 0 || len > Q - 1) return BAD_ACCEPT_LEN;
    if (kv_len < Q || (int64_t)kv_len > (int64_t)p->MB * p->BS) return BAD_KV_LEN;
    if (path[0] != 0) return BAD_PATH;
    for (int32_t t = 1; t <= len; t++)
        if (path[t] <= path[t - 1] || path[t] > Q - 1) return BAD_PATH;
    const int64_t base = (int64_t)kv_len - Q;
    for (int32_t t = 1; t <= len; t++)
        if (path[t] != t && (slot_row(p, table, base + path[t]) < 0 || slot_row(p, table, base + t) < 0))
            return BAD_BLOCK;
    return 0;
}

kdt_status kdt_kv_commit_cpu(const kdt_kv_commit_params *p) {
    const size_t row_bytes = (size_t)p->Dqk * kdt_dtype_size(p->dtype);
    char *cache = (char *)p->kv_cache;
    for (int32_t b = 0; b < p->B; b++) {
        const int32_t status = check(p, b), len = p->accept_len[b], kv_len = p->kv_len[b];
        p->status[b] = status;
        p->new_kv_len[b] = status ? kv_len : kv_len - p->Q + len + 1;
        if (status) continue;
        const int32_t *path = p->accept_index + (size_t)b * p->Q, *table = p->block_table + (size_t)b * p->MB;
        const int64_t base = (int64_t)kv_len - p->Q;
        for (int32_t t = 1; t <= len; t++) {
            if (path[t] == t) continue;
            const int64_t src = slot_row(p, table, base + path[t]), dst = slot_row(p, table, base + t);
            memcpy(cache + (size_t)dst * row_bytes, cache + (size_t)src * row_bytes, row_bytes);
        }
    }
    return KDT_OK;
}
