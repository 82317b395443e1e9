/* Output allocation and device staging for the ops' tensor adapters. */
#include <stdlib.h>
#include <string.h>

#include "common/device.h"
#include "common/internal.h"
#include "ops/io.h"

kdt_status kdt_io_output(kdt_kdtr_writer *w, const char *name, kdt_dtype dtype, int ndim,
                         const uint64_t *dims, void **data) {
    kdt_status s = kdt_kdtr_writer_add_alloc(w, name, dtype, ndim, dims, data);
    if (s != KDT_OK) return s;
    uint64_t n = kdt_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) n *= dims[i]; /* add_alloc already checked for overflow */
    memset(*data, 0xFF, (size_t)n);
    return KDT_OK;
}

void kdt_stage_init(kdt_stage *s, kdt_backend backend) {
    memset(s, 0, sizeof *s);
    s->backend = backend;
}

static kdt_status stage_add(kdt_stage *s, const char *name, void *host, size_t nbytes,
                            int is_output, void **ptr) {
    if (s->backend == KDT_BACKEND_CPU) {
        *ptr = host;
        return KDT_OK;
    }
    if (s->n == KDT_STAGE_MAX) return kdt_fail(KDT_ERR_INTERNAL, "stage: more than %d tensors", KDT_STAGE_MAX);
    size_t guard = is_output ? KDT_STAGE_GUARD : 0;
    char *dev = NULL;
    kdt_status st = kdt_dev_alloc((void **)&dev, nbytes + 2 * guard);
    if (st != KDT_OK) return st;
    s->buf[s->n].host = host;
    s->buf[s->n].dev = dev;
    s->buf[s->n].nbytes = nbytes;
    s->buf[s->n].is_output = is_output;
    s->buf[s->n].name = name;
    s->n++;
    if (guard) {
        unsigned char pattern[KDT_STAGE_GUARD];
        memset(pattern, 0xA5, sizeof pattern);
        if ((st = kdt_dev_h2d(dev, pattern, guard)) != KDT_OK) return st;
        if ((st = kdt_dev_h2d(dev + guard + nbytes, pattern, guard)) != KDT_OK) return st;
    }
    if ((st = kdt_dev_h2d(dev + guard, host, nbytes)) != KDT_OK) return st;
    *ptr = dev + guard;
    return KDT_OK;
}

kdt_status kdt_stage_in(kdt_stage *s, const char *name, const void *host, size_t nbytes, const void **ptr) {
    void *p = NULL;
    kdt_status st = stage_add(s, name, (void *)host, nbytes, 0, &p);
    *ptr = p;
    return st;
}

kdt_status kdt_stage_out(kdt_stage *s, const char *name, void *host, size_t nbytes, void **ptr) {
    return stage_add(s, name, host, nbytes, 1, ptr);
}

kdt_status kdt_stage_finish(kdt_stage *s) {
    if (s->backend == KDT_BACKEND_CPU) return KDT_OK;
    kdt_status st = kdt_dev_sync();
    if (st != KDT_OK) return st;
    for (int i = 0; i < s->n; i++) {
        if (!s->buf[i].is_output) continue;
        unsigned char guard[2][KDT_STAGE_GUARD];
        char *dev = s->buf[i].dev;
        if ((st = kdt_dev_d2h(guard[0], dev, KDT_STAGE_GUARD)) != KDT_OK) return st;
        if ((st = kdt_dev_d2h(guard[1], dev + KDT_STAGE_GUARD + s->buf[i].nbytes, KDT_STAGE_GUARD)) != KDT_OK)
            return st;
        for (int g = 0; g < 2; g++)
            for (int j = 0; j < KDT_STAGE_GUARD; j++)
                if (guard[g][j] != 0xA5)
                    return kdt_fail(KDT_ERR_INTERNAL, "output '%s': the kernel wrote %s its buffer",
                                    s->buf[i].name, g == 0 ? "before" : "past");
        if ((st = kdt_dev_d2h(s->buf[i].host, dev + KDT_STAGE_GUARD, s->buf[i].nbytes)) != KDT_OK) return st;
    }
    return KDT_OK;
}

void kdt_stage_release(kdt_stage *s) {
    for (int i = 0; i < s->n; i++) kdt_dev_free(s->buf[i].dev);
    s->n = 0;
}
