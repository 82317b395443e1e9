/* The ops' table-driven tensor adapter (io.h), and staging through device memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/device.h"
#include "common/internal.h"
#include "ops/io.h"

/* Adds output `name` to w and fills it with 0xFF bytes (NaN for floats, -1 for signed ints),
 * so that an element the op never writes is caught by every comparison. */
static kdt_status io_output(kdt_kdtr_writer *w, const char *name, kdt_dtype dtype, int ndim, const uint64_t *dims,
                            void **data) {
    kdt_status s = kdt_kdtr_writer_add_alloc(w, name, dtype, ndim, dims, data);
    if (s != KDT_OK) return s;
    uint64_t n = kdt_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) n *= dims[i]; /* add_alloc already checked for overflow */
    memset(*data, 0xFF, (size_t)n);
    return KDT_OK;
}

/* The reader's state besides the kdt_io: which dims are bound, and by what. */
typedef struct io_run {
    kdt_io io;
    int bound[KDT_IO_MAX_DIMS];
    const char *by[KDT_IO_MAX_DIMS]; /* the tensor that bound it */
    int T_bound;
    const char *T_by;
    uint64_t nbytes[KDT_IO_MAX_TENSORS];
    int ndim[KDT_IO_MAX_TENSORS];
    uint64_t dims[KDT_IO_MAX_TENSORS][KDTR_MAX_NDIM];
} io_run;

static int dim_index(const kdt_io_op *op, const char *name, size_t len) {
    for (int d = 0; d < KDT_IO_MAX_DIMS && op->dims[d].name; d++)
        if (strlen(op->dims[d].name) == len && strncmp(op->dims[d].name, name, len) == 0) return d;
    return -1;
}

/* A shape string's dims as indices into op->dims. */
static kdt_status parse_shape(const kdt_io_op *op, const kdt_io_tensor *t, int *idx, int *ndim) {
    *ndim = 0;
    for (const char *c = t->shape; *c;) {
        if (*c == ' ') {
            c++;
            continue;
        }
        size_t len = strcspn(c, " ");
        const int d = dim_index(op, c, len);
        if (d < 0 || *ndim == KDTR_MAX_NDIM)
            return kdt_fail(KDT_ERR_INTERNAL, "%s: tensor '%s': shape \"%s\" names a dim the op does not declare", op->name,
                            t->name, t->shape);
        idx[(*ndim)++] = d;
        c += len;
    }
    return KDT_OK;
}

/* "[B, Q, H, Dqk]" (names) or "[2, 5, 2, 40]" (values). */
static void fmt_dims(char *buf, size_t cap, int n, const kdt_io_op *op, const int *idx, const uint64_t *val) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int a = 0; a < n && k < cap; a++) {
        if (op) k += (size_t)snprintf(buf + k, cap - k, "%s%s", a ? ", " : "", op->dims[idx[a]].name);
        else k += (size_t)snprintf(buf + k, cap - k, "%s%llu", a ? ", " : "", (unsigned long long)val[a]);
    }
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* "f32 or bf16" */
static void fmt_dtypes(char *buf, size_t cap, unsigned set) {
    size_t k = 0;
    buf[0] = '\0';
    for (int t = 0; t < 32 && k < cap; t++)
        if (set & KDT_IO_DT(t)) k += (size_t)snprintf(buf + k, cap - k, "%s%s", k ? " or " : "", kdt_dtype_name((kdt_dtype)t));
}

static kdt_status bind_dim(io_run *r, int d, int64_t v, const char *tensor, int axis) {
    const kdt_io_dim *dim = &r->io.op->dims[d];
    if (v < dim->lo || v > dim->hi) {
        if (axis < 0)
            return kdt_fail(KDT_ERR_INVALID_ARG, "scalar '%s' = %lld outside %lld .. %lld", tensor, (long long)v,
                            (long long)dim->lo, (long long)dim->hi);
        return kdt_fail(KDT_ERR_SHAPE, "tensor '%s': dim %d (%s) = %lld outside %lld .. %lld", tensor, axis, dim->name,
                        (long long)v, (long long)dim->lo, (long long)dim->hi);
    }
    r->io.dim[d] = v;
    r->bound[d] = 1;
    r->by[d] = tensor;
    return KDT_OK;
}

static kdt_status check_dtype(io_run *r, const kdt_io_tensor *t, kdt_dtype got) {
    char want[64];
    if ((t->flags & KDT_IO_T) && r->T_bound) {
        if (got != r->io.T)
            return kdt_fail(KDT_ERR_DTYPE, "tensor '%s': dtype %s, expected %s (the dtype of '%s')", t->name,
                            kdt_dtype_name(got), kdt_dtype_name(r->io.T), r->T_by);
        return KDT_OK;
    }
    if ((unsigned)got >= 32 || !(t->dtypes & KDT_IO_DT(got))) {
        fmt_dtypes(want, sizeof want, t->dtypes);
        return kdt_fail(KDT_ERR_DTYPE, "tensor '%s': expected dtype %s, got %s", t->name, want, kdt_dtype_name(got));
    }
    if (t->flags & KDT_IO_T) r->io.T = got, r->T_bound = 1, r->T_by = t->name;
    return KDT_OK;
}

/* Input i: found (or absent, if it may be), dtype and shape checked, dims bound. */
static kdt_status read_input(io_run *r, const kdt_kdtr *in, int i) {
    const kdt_io_op *op = r->io.op;
    const kdt_io_tensor *t = &op->tensors[i];
    kdt_tensor_view v;
    kdt_status s;
    if (t->with || (t->flags & (KDT_IO_OPTIONAL | KDT_IO_ONE_OF))) {
        if (t->with && kdt_kdtr_find(in, t->with, &v) != KDT_OK) return KDT_OK; /* not needed */
        if (!t->with && kdt_kdtr_find(in, t->name, &v) != KDT_OK) return KDT_OK; /* absent */
    }
    if ((s = kdt_kdtr_find(in, t->name, &v)) != KDT_OK) {
        if (t->with) return kdt_fail(s, "tensor '%s' not found ('%s' needs it)", t->name, t->with);
        return s;
    }
    if ((s = check_dtype(r, t, v.dtype)) != KDT_OK) return s;
    int idx[KDTR_MAX_NDIM], n;
    char want[160], got[160];
    if ((s = parse_shape(op, t, idx, &n)) != KDT_OK) return s;
    if (v.ndim != n) {
        fmt_dims(want, sizeof want, n, op, idx, NULL);
        fmt_dims(got, sizeof got, v.ndim, NULL, NULL, v.dims);
        if (n == 0) return kdt_fail(KDT_ERR_SHAPE, "tensor '%s': expected a scalar, got shape %s", t->name, got);
        return kdt_fail(KDT_ERR_SHAPE, "tensor '%s': expected %d dims %s, got %s", t->name, n, want, got);
    }
    for (int a = 0; a < n; a++) {
        const int d = idx[a];
        if (!r->bound[d]) {
            if ((s = bind_dim(r, d, (int64_t)v.dims[a], t->name, a)) != KDT_OK) return s; /* dims <= 2^40 (KDTR) */
        } else if ((uint64_t)r->io.dim[d] != v.dims[a]) {
            uint64_t exp[KDTR_MAX_NDIM];
            for (int b = 0; b < n; b++) exp[b] = r->bound[idx[b]] ? (uint64_t)r->io.dim[idx[b]] : v.dims[b];
            char vals[160];
            fmt_dims(want, sizeof want, n, op, idx, NULL);
            fmt_dims(vals, sizeof vals, n, NULL, NULL, exp);
            fmt_dims(got, sizeof got, n, NULL, NULL, v.dims);
            return kdt_fail(KDT_ERR_SHAPE, "tensor '%s': shape %s, expected %s = %s (%s from '%s')", t->name, got, want, vals,
                            op->dims[d].name, r->by[d]);
        }
    }
    if (t->bind) { /* an i32 scalar whose value is a dim */
        const int d = dim_index(op, t->bind, strlen(t->bind));
        int32_t x;
        memcpy(&x, v.data, sizeof x);
        if (d < 0) return kdt_fail(KDT_ERR_INTERNAL, "%s: tensor '%s' binds dim '%s', which the op does not declare", op->name,
                                   t->name, t->bind);
        if (r->bound[d] && r->io.dim[d] != x)
            return kdt_fail(KDT_ERR_SHAPE, "scalar '%s' = %d differs from %s = %lld (from '%s')", t->name, x, t->bind,
                            (long long)r->io.dim[d], r->by[d]);
        if (!r->bound[d] && (s = bind_dim(r, d, x, t->name, -1)) != KDT_OK) return s;
    }
    r->io.present[i] = 1;
    r->io.host[i] = (void *)v.data;
    r->nbytes[i] = v.nbytes;
    r->ndim[i] = n;
    memcpy(r->dims[i], v.dims, sizeof v.dims);
    return KDT_OK;
}

/* Alternatives (KDT_IO_ONE_OF): exactly one present, checked before any is read. */
static kdt_status check_one_of(const kdt_io_op *op, const kdt_kdtr *in) {
    char names[256] = "";
    size_t k = 0;
    int n = 0;
    kdt_tensor_view v;
    for (int i = 0; i < KDT_IO_MAX_TENSORS && op->tensors[i].name; i++) {
        if (!(op->tensors[i].flags & KDT_IO_ONE_OF)) continue;
        n += kdt_kdtr_find(in, op->tensors[i].name, &v) == KDT_OK;
        if (k < sizeof names) k += (size_t)snprintf(names + k, sizeof names - k, "%s'%s'", k ? ", " : "", op->tensors[i].name);
    }
    if (k == 0 || n == 1) return KDT_OK;
    if (n == 0) return kdt_fail(KDT_ERR_NOT_FOUND, "none of the tensors %s is present: give one", names);
    return kdt_fail(KDT_ERR_INVALID_ARG, "%d of the tensors %s are present: give one", n, names);
}

/* Output i: its shape from the bound dims (an in/out tensor keeps its input's), poisoned, or a
 * copy of the input for in/out. */
static kdt_status make_output(io_run *r, kdt_kdtr_writer *out, int i) {
    const kdt_io_op *op = r->io.op;
    const kdt_io_tensor *t = &op->tensors[i];
    kdt_status s;
    const void *src = r->io.host[i];
    kdt_dtype dt = r->io.T;
    if (!(t->flags & KDT_IO_T))
        for (dt = (kdt_dtype)0; dt < 31 && !(t->dtypes & KDT_IO_DT(dt)); dt = (kdt_dtype)(dt + 1)) {} /* its one dtype */
    if (!(t->flags & KDT_IO_INOUT)) {
        int idx[KDTR_MAX_NDIM];
        if ((s = parse_shape(op, t, idx, &r->ndim[i])) != KDT_OK) return s;
        for (int a = 0; a < r->ndim[i]; a++) {
            if (!r->bound[idx[a]])
                return kdt_fail(KDT_ERR_INTERNAL, "%s: output '%s' uses dim %s, which no input binds", op->name, t->name,
                                op->dims[idx[a]].name);
            r->dims[i][a] = (uint64_t)r->io.dim[idx[a]];
        }
    }
    if ((s = io_output(out, t->name, dt, r->ndim[i], r->dims[i], &r->io.host[i])) != KDT_OK) return s;
    r->nbytes[i] = kdt_dtype_size(dt);
    for (int a = 0; a < r->ndim[i]; a++) r->nbytes[i] *= r->dims[i][a];
    if (t->flags & KDT_IO_INOUT) memcpy(r->io.host[i], src, r->nbytes[i]);
    r->io.present[i] = 1;
    return KDT_OK;
}

kdt_status kdt_io_run(const kdt_io_op *op, const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend) {
    io_run *r = calloc(1, sizeof *r);
    if (!r) return kdt_fail(KDT_ERR_NOMEM, "%s: out of host memory", op->name);
    r->io.op = op;
    int n = 0;
    while (n < KDT_IO_MAX_TENSORS && op->tensors[n].name) n++;
    kdt_status s = check_one_of(op, in);
    for (int i = 0; s == KDT_OK && i < n; i++)
        if (!(op->tensors[i].flags & KDT_IO_OUT)) s = read_input(r, in, i);
    for (int d = 0; s == KDT_OK && d < KDT_IO_MAX_DIMS && op->dims[d].name; d++) { /* derived dims */
        const kdt_io_dim *dim = &op->dims[d];
        if (!dim->from) continue;
        const int f = dim_index(op, dim->from, strlen(dim->from));
        if (f < 0 || !r->bound[f]) continue;
        r->io.dim[d] = r->io.dim[f] + dim->add;
        r->bound[d] = 1;
        r->by[d] = r->by[f];
    }
    for (int i = 0; s == KDT_OK && i < n; i++)
        if (op->tensors[i].flags & (KDT_IO_OUT | KDT_IO_INOUT)) s = make_output(r, out, i);
    if (s == KDT_OK && op->check) s = op->check(&r->io);

    kdt_stage st;
    kdt_stage_init(&st, backend);
    for (int i = 0; s == KDT_OK && i < n; i++) {
        const kdt_io_tensor *t = &op->tensors[i];
        if (!r->io.present[i]) continue;
        if (r->ndim[i] == 0) r->io.ptr[i] = r->io.host[i]; /* scalars: read by value on the host */
        else if (t->flags & (KDT_IO_OUT | KDT_IO_INOUT))
            s = kdt_stage_out(&st, t->name, r->io.host[i], r->nbytes[i], &r->io.ptr[i]);
        else {
            const void *dev = NULL;
            s = kdt_stage_in(&st, t->name, r->io.host[i], r->nbytes[i], &dev);
            r->io.ptr[i] = (void *)dev;
        }
    }
    if (s == KDT_OK) s = op->call(&r->io, backend);
    if (s == KDT_OK) s = kdt_stage_finish(&st);
    kdt_stage_release(&st);
    free(r);
    return s;
}

int32_t kdt_io_i32(const kdt_io *io, int i) {
    int32_t x;
    memcpy(&x, io->host[i], sizeof x);
    return x;
}

float kdt_io_f32(const kdt_io *io, int i) {
    float x;
    memcpy(&x, io->host[i], sizeof x);
    return x;
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
