/* tree_accept (docs/interfaces.md 2.3) against the numpy bundles of python/gen_tree_accept.py, every output
 * exact, on cpu and (where a device is present) cuda, the bench's other CUDA variants too;
 * then the errors the op must report. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#if KDT_HAVE_CUDA
#include "common/device.h"
#include "cuda/tree_accept.h"
#endif

static const char *const outputs[] = {"accept_len", "accept_index", "accept_tokens", "status"};

static void check_bundle(const char *path, kdt_backend be) {
    const char *name = kt_basename(path);
    if (!kt_backend_usable(be, name)) return;
    kdt_kdtr *in = NULL, *got = NULL;
    kdt_tensor_view tok;
    kdt_status s = kdt_kdtr_open_file(path, &in);
    if (s == KDT_OK) s = kdt_kdtr_find(in, "node_token", &tok);
    if (s == KDT_OK) s = kt_run_op("tree_accept", in, be, &got);
    if (s != KDT_OK) {
        kt_fail("%s [%s]  %s: %s", name, kdt_backend_name(be), kdt_status_name(s), kdt_last_error());
    } else {
        char msg[256] = "";
        int ok = kt_compare_outputs(got, in, outputs, sizeof outputs / sizeof outputs[0], msg, sizeof msg);
        kt_check(ok, "%s [%s]  B=%llu Q=%llu%s%s", name, kdt_backend_name(be), (unsigned long long)tok.dims[0],
                 (unsigned long long)tok.dims[1], ok ? "" : "  ", msg);
    }
    kdt_kdtr_close(got);
    kdt_kdtr_close(in);
}

#if KDT_HAVE_CUDA
/* The non-default variants of src/cuda/tree_accept.h, which bench_accept times, on the same
 * bundle: inputs copied to the device, outputs poisoned, then compared with expected.*. */
static void check_variants(const char *path) {
    const char *name = kt_basename(path), *in_names[4] = {"node_token", "node_parent", "num_nodes", "target_pred"};
    const char *out_names[4] = {"accept_len", "accept_index", "accept_tokens", "status"};
    kdt_kdtr *in = NULL;
    kdt_tensor_view iv[4], ev[4];
    void *dev[8] = {0}, *host = NULL;
    kdt_status s = kdt_kdtr_open_file(path, &in);
    for (int i = 0; i < 4 && s == KDT_OK; i++) {
        char ename[64];
        snprintf(ename, sizeof ename, "expected.%s", out_names[i]);
        if ((s = kdt_kdtr_find(in, in_names[i], &iv[i])) == KDT_OK) s = kdt_kdtr_find(in, ename, &ev[i]);
        if (s == KDT_OK) s = kdt_dev_alloc(&dev[i], iv[i].nbytes);
        if (s == KDT_OK) s = kdt_dev_h2d(dev[i], iv[i].data, iv[i].nbytes);
        if (s == KDT_OK) s = kdt_dev_alloc(&dev[4 + i], ev[i].nbytes);
    }
    if (s != KDT_OK) kt_fail("%s [cuda variants]  %s: %s", name, kdt_status_name(s), kdt_last_error());
    for (int v = 1; s == KDT_OK && v < KDT_TREE_ACCEPT_N_VARIANTS; v++) {
        kdt_tree_accept_params p = {(int32_t)iv[0].dims[0], (int32_t)iv[0].dims[1], dev[0], dev[1], dev[2], dev[3],
                                    dev[4], dev[5], dev[6], dev[7]};
        char msg[256] = "";
        int ok = 1;
        for (int i = 0; i < 4 && s == KDT_OK; i++) { /* poison: -1 everywhere */
            free(host);
            host = malloc(ev[i].nbytes + 1);
            memset(host, 0xFF, ev[i].nbytes);
            s = kdt_dev_h2d(dev[4 + i], host, ev[i].nbytes);
        }
        if (s == KDT_OK) s = kdt_tree_accept_cuda_variant(&p, NULL, v);
        if (s == KDT_OK) s = kdt_dev_sync();
        for (int i = 0; i < 4 && s == KDT_OK && ok; i++) {
            free(host);
            host = malloc(ev[i].nbytes + 1);
            if ((s = kdt_dev_d2h(host, dev[4 + i], ev[i].nbytes)) != KDT_OK) break;
            for (uint64_t j = 0; ok && j < ev[i].numel; j++) {
                int32_t got = ((const int32_t *)host)[j], want = ((const int32_t *)ev[i].data)[j];
                if (got != want) {
                    snprintf(msg, sizeof msg, "  '%s'[%llu]: got %d, expected %d", out_names[i], (unsigned long long)j, got, want);
                    ok = 0;
                }
            }
        }
        if (s != KDT_OK) kt_fail("%s [cuda:%s]  %s: %s", name, kdt_tree_accept_variant_name(v), kdt_status_name(s), kdt_last_error());
        else kt_check(ok, "%s [cuda:%s]  B=%llu Q=%llu%s", name, kdt_tree_accept_variant_name(v),
                      (unsigned long long)iv[0].dims[0], (unsigned long long)iv[0].dims[1], msg);
    }
    free(host);
    for (int i = 0; i < 8; i++) kdt_dev_free(dev[i]);
    kdt_kdtr_close(in);
}
#endif

/* Runs tree_accept on a made-up input: tokens of shape [B, Q] (dtype tok_dtype), and
 * target_pred unless drop_pred. Returns the op's status. */
static kdt_status run_made_up(uint64_t B, uint64_t Q, kdt_dtype tok_dtype, int drop_pred) {
    int32_t *zeros = calloc(B * Q + 1, sizeof *zeros);
    const uint64_t bq[2] = {B, Q}, b1[1] = {B};
    kdt_kdtr_writer *w = NULL;
    kdt_kdtr *in = NULL, *got = NULL;
    void *buf = NULL;
    size_t size = 0;
    kdt_status s = kdt_kdtr_writer_create(&w);
    if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "node_token", tok_dtype, 2, bq, zeros);
    if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "node_parent", KDT_I32, 2, bq, zeros);
    if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "num_nodes", KDT_I32, 1, b1, zeros);
    if (s == KDT_OK && !drop_pred) s = kdt_kdtr_writer_add(w, "target_pred", KDT_I32, 2, bq, zeros);
    if (s == KDT_OK) s = kdt_kdtr_writer_to_memory(w, &buf, &size);
    if (s == KDT_OK) s = kdt_kdtr_open_memory(buf, size, &in);
    if (s == KDT_OK) s = kt_run_op("tree_accept", in, KDT_BACKEND_CPU, &got);
    kdt_kdtr_close(got);
    kdt_kdtr_close(in);
    free(buf);
    kdt_kdtr_writer_free(w);
    free(zeros);
    return s;
}

static void check_errors(void) {
    kdt_status s;
    s = run_made_up(2, 3, KDT_I32, 1);
    kt_check(s == KDT_ERR_NOT_FOUND, "tree_accept errors: missing target_pred -> %s (%s)", kdt_status_name(s), kdt_last_error());
    s = run_made_up(2, 3, KDT_F32, 0);
    kt_check(s == KDT_ERR_DTYPE, "tree_accept errors: f32 node_token -> %s (%s)", kdt_status_name(s), kdt_last_error());
    s = run_made_up(1, KDT_TREE_MAX_BUDGET + 2, KDT_I32, 0);
    kt_check(s == KDT_ERR_SHAPE, "tree_accept errors: Q = %d -> %s (%s)", KDT_TREE_MAX_BUDGET + 2, kdt_status_name(s),
             kdt_last_error());
    s = run_made_up(0, 5, KDT_I32, 0);
    kt_check(s == KDT_OK, "tree_accept errors: B = 0 runs -> %s", kdt_status_name(s));
    kdt_tree_accept_params p = {.B = 1, .Q = 4};
    s = kdt_tree_accept(&p, KDT_BACKEND_CPU, NULL);
    kt_check(s == KDT_ERR_INVALID_ARG, "tree_accept errors: NULL pointers -> %s (%s)", kdt_status_name(s), kdt_last_error());
    s = kdt_tree_accept(NULL, KDT_BACKEND_CPU, NULL);
    kt_check(s == KDT_ERR_INVALID_ARG, "tree_accept errors: NULL params -> %s", kdt_status_name(s));
}

int main(void) {
    char **paths = NULL;
    size_t n = kt_list_bundles("tree_accept_", &paths);
    if (n == 0) kt_fail("tree_accept: no tree_accept_*.kdtr in %s (run python/gen_tree_accept.py)", kt_data_dir());
    for (size_t i = 0; i < n; i++) {
        check_bundle(paths[i], KDT_BACKEND_CPU);
        check_bundle(paths[i], KDT_BACKEND_CUDA);
#if KDT_HAVE_CUDA
        if (kdt_cuda_available()) check_variants(paths[i]);
#endif
    }
    kt_free_list(paths, n);
    check_errors();
    return kt_exit_code();
}
