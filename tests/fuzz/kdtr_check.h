/* The checks the KDTR fuzz target (fuzz_kdtr.c) and its plain-C replayer (test_kdtr_corpus.c)
 * run on one input: open it; if it opens, read every tensor, find each by name, write them all
 * again through the writer and check that the re-read file holds the same tensors. */
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kdt/kdtr.h"

static int kdtr_check_same(const kdt_tensor_view *a, const kdt_tensor_view *b) {
    if (strcmp(a->name, b->name) != 0 || a->dtype != b->dtype || a->ndim != b->ndim || a->nbytes != b->nbytes ||
        a->numel != b->numel)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->dims[d] != b->dims[d]) return 0;
    return a->nbytes == 0 || memcmp(a->data, b->data, (size_t)a->nbytes) == 0;
}

/* One opened file's views are self-consistent. NULL when fine, else what is wrong. */
static const char *kdtr_check_views(const kdt_kdtr *r) {
    for (uint32_t i = 0; i < kdt_kdtr_count(r); i++) {
        kdt_tensor_view v, f;
        if (kdt_kdtr_get(r, i, &v) != KDT_OK) return "get failed on an opened file";
        size_t len = strlen(v.name), esize = kdt_dtype_size(v.dtype);
        if (len < 1 || len > 255) return "name length outside 1 .. 255";
        if (esize == 0 || v.ndim < 0 || v.ndim > KDTR_MAX_NDIM) return "bad dtype or ndim";
        uint64_t numel = 1;
        for (int d = 0; d < v.ndim; d++) numel *= v.dims[d];
        if (numel != v.numel || numel * esize != v.nbytes) return "numel or nbytes inconsistent";
        if ((uintptr_t)v.data % KDTR_ALIGN) return "data not 64-byte aligned";
        volatile unsigned char sink = 0; /* read every byte, so the sanitizers see any stray view */
        for (uint64_t k = 0; k < v.nbytes; k++) sink ^= ((const unsigned char *)v.data)[k];
        (void)sink;
        if (kdt_kdtr_find(r, v.name, &f) != KDT_OK || f.data != v.data || f.name != v.name) return "find by name disagrees with get";
    }
    return NULL;
}

/* Writes every tensor of r through the writer into *buf (free with free()). */
static const char *kdtr_check_rewrite(const kdt_kdtr *r, void **buf, size_t *size) {
    kdt_kdtr_writer *w = NULL;
    if (kdt_kdtr_writer_create(&w) != KDT_OK) return "writer_create failed";
    const char *err = NULL;
    for (uint32_t i = 0; i < kdt_kdtr_count(r) && !err; i++) {
        kdt_tensor_view v;
        kdt_kdtr_get(r, i, &v);
        if (kdt_kdtr_writer_add(w, v.name, v.dtype, v.ndim, v.dims, v.data) != KDT_OK) err = "writer rejected a tensor the reader accepted";
    }
    if (!err && kdt_kdtr_writer_to_memory(w, buf, size) != KDT_OK) err = "writer_to_memory failed";
    kdt_kdtr_writer_free(w);
    return err;
}

/* The whole check on one input; *status gets what open_memory returned. */
static const char *kdtr_check_input(const uint8_t *data, size_t size, kdt_status *status) {
    kdt_kdtr *r = (kdt_kdtr *)1;
    kdt_status st = *status = kdt_kdtr_open_memory(data, size, &r);
    if (st != KDT_OK) {
        const char *msg = kdt_last_error();
        if (r != NULL) return "failed open left a handle";
        if (st < KDT_ERR_KDTR_TRUNCATED || st > KDT_ERR_KDTR_PADDING) return "failed open with a status outside the KDTR rules";
        if (!msg[0] || strchr(msg, '\n')) return "error message empty or not one line";
        return NULL;
    }
    const char *err = kdtr_check_views(r);
    void *buf = NULL, *buf2 = NULL;
    size_t n = 0, n2 = 0;
    kdt_kdtr *r2 = NULL, *r3 = NULL;
    if (!err) err = kdtr_check_rewrite(r, &buf, &n);
    if (!err && kdt_kdtr_open_memory(buf, n, &r2) != KDT_OK) err = "the reader rejected the writer's file";
    if (!err && kdt_kdtr_count(r2) != kdt_kdtr_count(r)) err = "re-read count differs";
    for (uint32_t i = 0; !err && i < kdt_kdtr_count(r); i++) {
        kdt_tensor_view a, b;
        kdt_kdtr_get(r, i, &a);
        kdt_kdtr_get(r2, i, &b);
        if (!kdtr_check_same(&a, &b)) err = "re-read tensor differs";
    }
    /* The writer's layout is canonical: writing the re-read file again gives the same bytes. */
    if (!err) err = kdtr_check_rewrite(r2, &buf2, &n2);
    if (!err && (n != n2 || memcmp(buf, buf2, n) != 0)) err = "second rewrite gives different bytes";
    if (!err && kdt_kdtr_open_memory(buf2, n2, &r3) != KDT_OK) err = "the reader rejected the second rewrite";
    kdt_kdtr_close(r3);
    kdt_kdtr_close(r2);
    kdt_kdtr_close(r);
    free(buf);
    free(buf2);
    return err;
}
