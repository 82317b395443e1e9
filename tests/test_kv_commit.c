/* kv_commit (docs/interfaces.md 2.5) against the numpy bundles of python/gen_kv_commit.py, every output
 * exact (the whole cache after the moves), on cpu and (where a device is present) cuda; then
 * the errors the op must report. */
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

static const char *const outputs[] = {"kv_cache", "new_kv_len", "status"};

static void check_bundle(const char *path, kdt_backend be) {
    const char *name = kt_basename(path);
    if (!kt_backend_usable(be, name)) return;
    kdt_kdtr *in = NULL, *got = NULL;
    kdt_tensor_view cache, idx;
    kdt_status s = kdt_kdtr_open_file(path, &in);
    if (s == KDT_OK) s = kdt_kdtr_find(in, "kv_cache", &cache);
    if (s == KDT_OK) s = kdt_kdtr_find(in, "accept_index", &idx);
    if (s == KDT_OK) s = kt_run_op("kv_commit", in, be, &got);
    if (s != KDT_OK) {
        kt_fail("%s [%s]  %s: %s", name, kdt_backend_name(be), kdt_status_name(s), kdt_last_error());
    } else {
        char msg[256] = "";
        int ok = kt_compare_outputs(got, in, outputs, sizeof outputs / sizeof outputs[0], msg, sizeof msg);
        kt_check(ok, "%s [%s]  %s B=%llu Q=%llu BS=%llu Dqk=%llu%s%s", name, kdt_backend_name(be),
                 kdt_dtype_name(cache.dtype), (unsigned long long)idx.dims[0], (unsigned long long)idx.dims[1],
                 (unsigned long long)cache.dims[1], (unsigned long long)cache.dims[2], ok ? "" : "  ", msg);
    }
    kdt_kdtr_close(got);
    kdt_kdtr_close(in);
}

/* Runs kv_commit on a made-up input of one request, Q = 4, cache [2, 4, 8] of cache_dtype,
 * with the scalar Q = q_scalar when it is >= 0. Returns the op's status. */
static kdt_status run_made_up(kdt_dtype cache_dtype, int32_t q_scalar) {
    static float cache[2 * 4 * 8];
    const int32_t table[2] = {1, 0}, kv_len[1] = {6}, idx[4] = {0, 2, -1, -1}, alen[1] = {1};
    const uint64_t dc[3] = {2, 4, 8}, dt[2] = {1, 2}, d1[1] = {1}, dq[2] = {1, 4};
    kdt_kdtr_writer *w = NULL;
    kdt_kdtr *in = NULL, *got = NULL;
    void *buf = NULL;
    size_t size = 0;
    kdt_status s = kdt_kdtr_writer_create(&w);
    if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "kv_cache", cache_dtype, 3, dc, cache);
    if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "block_table", KDT_I32, 2, dt, table);
    if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "kv_len", KDT_I32, 1, d1, kv_len);
    if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "accept_index", KDT_I32, 2, dq, idx);
    if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "accept_len", KDT_I32, 1, d1, alen);
    if (s == KDT_OK && q_scalar >= 0) s = kdt_kdtr_writer_add(w, "Q", KDT_I32, 0, NULL, &q_scalar);
    if (s == KDT_OK) s = kdt_kdtr_writer_to_memory(w, &buf, &size);
    if (s == KDT_OK) s = kdt_kdtr_open_memory(buf, size, &in);
    if (s == KDT_OK) s = kt_run_op("kv_commit", in, KDT_BACKEND_CPU, &got);
    kdt_kdtr_close(got);
    kdt_kdtr_close(in);
    free(buf);
    kdt_kdtr_writer_free(w);
    return s;
}

static void check_errors(void) {
    kdt_status s;
    s = run_made_up(KDT_F32, 4);
    kt_check(s == KDT_OK, "kv_commit errors: a good made-up input runs -> %s (%s)", kdt_status_name(s),
             s ? kdt_last_error() : "");
    s = run_made_up(KDT_F32, 5);
    kt_check(s == KDT_ERR_SHAPE, "kv_commit errors: scalar Q disagrees -> %s (%s)", kdt_status_name(s), kdt_last_error());
    s = run_made_up(KDT_I32, -1);
    kt_check(s == KDT_ERR_DTYPE, "kv_commit errors: i32 kv_cache -> %s (%s)", kdt_status_name(s), kdt_last_error());
    kdt_kv_commit_params p = {.B = 1, .Q = 4, .NB = 2, .BS = 0, .Dqk = 8, .dtype = KDT_F32, .MB = 2};
    s = kdt_kv_commit(&p, KDT_BACKEND_CPU, NULL);
    kt_check(s == KDT_ERR_SHAPE, "kv_commit errors: BS = 0 -> %s (%s)", kdt_status_name(s), kdt_last_error());
    p.BS = 4;
    s = kdt_kv_commit(&p, KDT_BACKEND_CPU, NULL);
    kt_check(s == KDT_ERR_INVALID_ARG, "kv_commit errors: NULL pointers -> %s (%s)", kdt_status_name(s), kdt_last_error());
    p.dtype = KDT_F16;
    s = kdt_kv_commit(&p, KDT_BACKEND_CPU, NULL);
    kt_check(s == KDT_ERR_DTYPE, "kv_commit errors: f16 cache -> %s (%s)", kdt_status_name(s), kdt_last_error());
}

int main(void) {
    char **paths = NULL;
    size_t n = kt_list_bundles("kv_commit_", &paths);
    if (n == 0) kt_fail("kv_commit: no kv_commit_*.kdtr in %s (run python/gen_kv_commit.py)", kt_data_dir());
    for (size_t i = 0; i < n; i++) {
        check_bundle(paths[i], KDT_BACKEND_CPU);
        check_bundle(paths[i], KDT_BACKEND_CUDA);
    }
    kt_free_list(paths, n);
    check_errors();
    return kt_exit_code();
}
