/* KDTR reader (docs/interfaces.md section 1): checks every rule of the file before handing out a tensor,
 * reading through a cursor that knows the bytes left, with overflow-checked sizes. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/internal.h"
#include "kdt/kdtr.h"
#include "kdtr/rules.h"

/* Under AddressSanitizer the padding of open_memory's rounded-up copy is poisoned, so that a
 * read past the file's last byte is caught (the fuzz target relies on this). */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#endif
#endif
#ifndef POISON
#define POISON(p, n) ((void)(p), (void)(n))
#endif

#define MAX_DIM (1ull << 40)
#define MIN_RECORD 21u /* name_len + 1-byte name + dtype + ndim + offset + nbytes */

struct kdt_kdtr {
    const unsigned char *base; /* the file: mmap'd, or a 64-byte-aligned copy */
    size_t size;
    int mapped;
    uint32_t n;
    kdt_tensor_view *t;        /* [n] in table order */
    char *names;               /* the names, NUL-terminated, back to back */
    kdtr_index index;
};

typedef struct cursor {
    const unsigned char *p;
    size_t left;
} cursor;

static const unsigned char *take(cursor *c, size_t n) {
    if (c->left < n) return NULL;
    const unsigned char *p = c->p;
    c->p += n;
    c->left -= n;
    return p;
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static const char *view_name(const void *ctx, uint32_t i) { return ((const kdt_kdtr *)ctx)->t[i].name; }

/* A tensor's name, printable, for messages. */
static const char *q(const kdt_tensor_view *v, char *buf, size_t cap) {
    kdtr_quote((const unsigned char *)v->name, strlen(v->name), 0, buf, cap);
    return buf;
}

static kdt_status parse_header(const kdt_kdtr *r, uint32_t *n, uint64_t *data_offset) {
    const unsigned char *h = r->base;
    if (r->size < KDTR_HEADER_SIZE)
        return kdt_fail(KDT_ERR_KDTR_TRUNCATED, "kdtr: truncated: %zu bytes, shorter than the 32-byte header", r->size);
    if (memcmp(h, "KDTR", 4) != 0)
        return kdt_fail(KDT_ERR_KDTR_MAGIC, "kdtr: magic is %02x %02x %02x %02x, not \"KDTR\"", h[0], h[1], h[2], h[3]);
    uint64_t version = le(h + 4, 4), count = le(h + 8, 4), flags = le(h + 12, 4);
    uint64_t doff = le(h + 16, 8), file_size = le(h + 24, 8);
    if (version != 1) return kdt_fail(KDT_ERR_KDTR_VERSION, "kdtr: version %llu, this reader knows 1", (unsigned long long)version);
    if (count > KDTR_MAX_TENSORS)
        return kdt_fail(KDT_ERR_KDTR_N_TENSORS, "kdtr: n_tensors %llu > 65535", (unsigned long long)count);
    if (flags) return kdt_fail(KDT_ERR_KDTR_FLAGS, "kdtr: flags 0x%llx has a set bit; version 1 defines none", (unsigned long long)flags);
    if (file_size != r->size)
        return kdt_fail(KDT_ERR_KDTR_FILE_SIZE, "kdtr: file_size %llu in the header, but the file has %zu bytes",
                        (unsigned long long)file_size, r->size);
    if (doff % KDTR_ALIGN)
        return kdt_fail(KDT_ERR_KDTR_DATA_OFFSET, "kdtr: data_offset %llu is not a multiple of 64", (unsigned long long)doff);
    if (doff > file_size)
        return kdt_fail(KDT_ERR_KDTR_DATA_OFFSET, "kdtr: data_offset %llu is past the end of the file (%llu bytes)",
                        (unsigned long long)doff, (unsigned long long)file_size);
    if (count > (r->size - KDTR_HEADER_SIZE) / MIN_RECORD)
        return kdt_fail(KDT_ERR_KDTR_TRUNCATED, "kdtr: truncated: %llu table records need at least %llu bytes, the file has %zu after the header",
                        (unsigned long long)count, (unsigned long long)count * MIN_RECORD, r->size - KDTR_HEADER_SIZE);
    *n = (uint32_t)count;
    *data_offset = doff;
    return KDT_OK;
}

static kdt_status truncated(uint32_t i, uint32_t n, const char *field) {
    return kdt_fail(KDT_ERR_KDTR_TRUNCATED, "kdtr: truncated: tensor %u (of %u): %s runs past the end of the file", i, n, field);
}

/* One table record: fills r->t[i], its name at *names (advanced past the NUL). data_offset is
 * already known to be <= the file's size; that it lies past the table is checked after. */
static kdt_status parse_record(kdt_kdtr *r, cursor *c, uint32_t i, uint64_t data_offset, char **names) {
    kdt_tensor_view *v = &r->t[i];
    uint64_t data_bytes = r->size - data_offset;
    char qn[300];
    const unsigned char *p = take(c, 2);
    if (!p) return truncated(i, r->n, "name_len");
    size_t len = (size_t)le(p, 2);
    if (len < 1 || len > 255) return kdt_fail(KDT_ERR_KDTR_NAME_LEN, "kdtr: tensor %u: name_len %zu outside 1 .. 255", i, len);
    const unsigned char *raw = take(c, len);
    if (!raw) return truncated(i, r->n, "name");
    size_t bad = 0;
    if (kdtr_name_check(raw, len, &bad) != KDT_OK) {
        kdtr_quote(raw, len, 1, qn, sizeof qn);
        return kdt_fail(KDT_ERR_KDTR_NAME, "kdtr: tensor %u: name '%s' %s at byte %zu", i, qn,
                        raw[bad] == 0 ? "holds a NUL" : "is not valid UTF-8", bad);
    }
    memcpy(*names, raw, len);
    (*names)[len] = '\0';
    v->name = *names;
    *names += len + 1;
    uint32_t prev = kdtr_index_find(&r->index, v->name, view_name, r);
    if (prev != UINT32_MAX)
        return kdt_fail(KDT_ERR_KDTR_NAME_DUP, "kdtr: tensor %u: name '%s' is already used by tensor %u", i, q(v, qn, sizeof qn), prev);
    kdtr_index_insert(&r->index, v->name, i);

    if (!(p = take(c, 2))) return truncated(i, r->n, "dtype/ndim");
    size_t esize = kdt_dtype_size((kdt_dtype)p[0]);
    if (esize == 0) return kdt_fail(KDT_ERR_KDTR_DTYPE, "kdtr: tensor %u '%s': unknown dtype code %u", i, q(v, qn, sizeof qn), p[0]);
    v->dtype = (kdt_dtype)p[0];
    if (p[1] > KDTR_MAX_NDIM) return kdt_fail(KDT_ERR_KDTR_NDIM, "kdtr: tensor %u '%s': ndim %u > 8", i, q(v, qn, sizeof qn), p[1]);
    v->ndim = p[1];
    if (!(p = take(c, 8 * (size_t)v->ndim))) return truncated(i, r->n, "dims");
    for (int d = 0; d < v->ndim; d++) {
        v->dims[d] = le(p + 8 * d, 8);
        if (v->dims[d] > MAX_DIM)
            return kdt_fail(KDT_ERR_KDTR_DIM, "kdtr: tensor %u '%s': dims[%d] = %llu > 2^40", i, q(v, qn, sizeof qn), d,
                            (unsigned long long)v->dims[d]);
    }
    uint64_t numel = 0, nbytes = 0;
    if (!kdtr_byte_count(v->dims, v->ndim, esize, &numel, &nbytes))
        return kdt_fail(KDT_ERR_KDTR_DIM, "kdtr: tensor %u '%s': product(dims) * size(%s) overflows 64 bits", i,
                        q(v, qn, sizeof qn), kdt_dtype_name(v->dtype));
    v->numel = numel;
    if (!(p = take(c, 16))) return truncated(i, r->n, "offset/nbytes");
    uint64_t offset = le(p, 8);
    v->nbytes = le(p + 8, 8);
    if (v->nbytes != nbytes)
        return kdt_fail(KDT_ERR_KDTR_NBYTES, "kdtr: tensor %u '%s': nbytes %llu, but product(dims) * size(%s) = %llu", i,
                        q(v, qn, sizeof qn), (unsigned long long)v->nbytes, kdt_dtype_name(v->dtype), (unsigned long long)nbytes);
    if (offset % KDTR_ALIGN)
        return kdt_fail(KDT_ERR_KDTR_OFFSET_ALIGN, "kdtr: tensor %u '%s': offset %llu is not a multiple of 64", i,
                        q(v, qn, sizeof qn), (unsigned long long)offset);
    if (offset > data_bytes || nbytes > data_bytes - offset)
        return kdt_fail(KDT_ERR_KDTR_BOUNDS, "kdtr: tensor %u '%s': offset %llu + nbytes %llu runs past the %llu data bytes of the file",
                        i, q(v, qn, sizeof qn), (unsigned long long)offset, (unsigned long long)nbytes, (unsigned long long)data_bytes);
    v->data = r->base + data_offset + offset;
    return KDT_OK;
}

typedef struct span {
    uint64_t start, end;
    uint32_t index;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* No two non-empty tensors overlap and the bytes between consecutive ones are zero. */
static kdt_status check_spans(const kdt_kdtr *r, uint64_t data_offset) {
    span *s = malloc(((size_t)r->n + 1) * sizeof *s);
    if (!s) return kdt_fail(KDT_ERR_NOMEM, "kdtr: out of memory checking %u tensors", r->n);
    uint32_t m = 0;
    for (uint32_t i = 0; i < r->n; i++) {
        if (r->t[i].nbytes == 0) continue; /* an empty tensor occupies no bytes */
        uint64_t start = (uint64_t)((const unsigned char *)r->t[i].data - r->base) - data_offset;
        s[m++] = (span){start, start + r->t[i].nbytes, i};
    }
    qsort(s, m, sizeof *s, cmp_span);
    kdt_status st = KDT_OK;
    char qa[300], qb[300];
    for (uint32_t k = 1; k < m && st == KDT_OK; k++) {
        const kdt_tensor_view *a = &r->t[s[k - 1].index], *b = &r->t[s[k].index];
        if (s[k].start < s[k - 1].end) {
            st = kdt_fail(KDT_ERR_KDTR_OVERLAP, "kdtr: tensors %u '%s' [%llu, %llu) and %u '%s' [%llu, %llu) overlap",
                          s[k - 1].index, q(a, qa, sizeof qa), (unsigned long long)s[k - 1].start, (unsigned long long)s[k - 1].end,
                          s[k].index, q(b, qb, sizeof qb), (unsigned long long)s[k].start, (unsigned long long)s[k].end);
            break;
        }
        const unsigned char *gap = r->base + data_offset;
        for (uint64_t j = s[k - 1].end; j < s[k].start; j++)
            if (gap[j]) {
                st = kdt_fail(KDT_ERR_KDTR_PADDING, "kdtr: non-zero padding byte 0x%02x at data offset %llu, between tensors %u '%s' and %u '%s'",
                              gap[j], (unsigned long long)j, s[k - 1].index, q(a, qa, sizeof qa), s[k].index, q(b, qb, sizeof qb));
                break;
            }
    }
    free(s);
    return st;
}

static kdt_status validate(kdt_kdtr *r) {
    uint32_t n = 0;
    uint64_t data_offset = 0;
    kdt_status st = parse_header(r, &n, &data_offset);
    if (st != KDT_OK) return st;
    r->n = n;
    /* parse_header bounded n by the file's length, so these are at most a few times its size. */
    r->t = calloc((size_t)n + 1, sizeof *r->t);
    r->names = malloc(r->size - KDTR_HEADER_SIZE + n + 1);
    if (!r->t || !r->names) return kdt_fail(KDT_ERR_NOMEM, "kdtr: out of memory for a table of %u tensors", n);
    if ((st = kdtr_index_reserve(&r->index, n, 0, view_name, r)) != KDT_OK) return st;
    cursor c = {r->base + KDTR_HEADER_SIZE, r->size - KDTR_HEADER_SIZE};
    char *names = r->names;
    for (uint32_t i = 0; i < n; i++)
        if ((st = parse_record(r, &c, i, data_offset, &names)) != KDT_OK) return st;
    size_t table_end = r->size - c.left;
    if (data_offset < table_end)
        return kdt_fail(KDT_ERR_KDTR_DATA_OFFSET, "kdtr: data_offset %llu lies inside the table, which ends at byte %zu",
                        (unsigned long long)data_offset, table_end);
    return check_spans(r, data_offset);
}

/* Takes ownership of base (freed or unmapped by kdt_kdtr_close) and validates. */
static kdt_status finish_open(const unsigned char *base, size_t size, int mapped, kdt_kdtr **out) {
    kdt_kdtr *r = calloc(1, sizeof *r);
    if (!r) {
        if (mapped) munmap((void *)base, size);
        else free((void *)base);
        return kdt_fail(KDT_ERR_NOMEM, "kdtr: out of memory");
    }
    r->base = base;
    r->size = size;
    r->mapped = mapped;
    kdt_status st = validate(r);
    if (st != KDT_OK) {
        kdt_kdtr_close(r);
        return st;
    }
    *out = r;
    return KDT_OK;
}

kdt_status kdt_kdtr_open_memory(const void *buf, size_t size, kdt_kdtr **out) {
    if (!out) return kdt_fail(KDT_ERR_INVALID_ARG, "kdtr: open_memory: out is NULL");
    *out = NULL;
    if (!buf && size) return kdt_fail(KDT_ERR_INVALID_ARG, "kdtr: open_memory: buf is NULL");
    if (size > SIZE_MAX - KDTR_ALIGN) return kdt_fail(KDT_ERR_NOMEM, "kdtr: open_memory: %zu bytes is too large", size);
    unsigned char *copy = NULL;
    if (size) {
        /* A 64-byte-aligned copy, so that every tensor's data is aligned for typed access. */
        size_t rounded = (size + KDTR_ALIGN - 1) / KDTR_ALIGN * KDTR_ALIGN;
        copy = aligned_alloc(KDTR_ALIGN, rounded);
        if (!copy) return kdt_fail(KDT_ERR_NOMEM, "kdtr: out of memory copying %zu bytes", size);
        memcpy(copy, buf, size);
        POISON(copy + size, rounded - size);
    }
    return finish_open(copy, size, 0, out);
}

kdt_status kdt_kdtr_open_file(const char *path, kdt_kdtr **out) {
    if (!out || !path) return kdt_fail(KDT_ERR_INVALID_ARG, "kdtr: open_file: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kdt_fail(KDT_ERR_IO, "kdtr: cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return kdt_fail(KDT_ERR_IO, "kdtr: cannot stat '%s': %s", path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return kdt_fail(KDT_ERR_IO, "kdtr: '%s' is not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    void *base = NULL;
    if (size) { /* a 0-byte file cannot be mapped; it is simply truncated */
        base = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (base == MAP_FAILED) {
            int err = errno;
            close(fd);
            return kdt_fail(KDT_ERR_IO, "kdtr: cannot mmap '%s': %s", path, strerror(err));
        }
    }
    close(fd);
    return finish_open(base, size, size != 0, out);
}

void kdt_kdtr_close(kdt_kdtr *r) {
    if (!r) return;
    if (r->mapped) munmap((void *)r->base, r->size);
    else free((void *)r->base);
    free(r->t);
    free(r->names);
    kdtr_index_free(&r->index);
    free(r);
}

uint32_t kdt_kdtr_count(const kdt_kdtr *r) { return r ? r->n : 0; }

kdt_status kdt_kdtr_get(const kdt_kdtr *r, uint32_t index, kdt_tensor_view *out) {
    if (!r || !out) return kdt_fail(KDT_ERR_INVALID_ARG, "kdtr: get: NULL argument");
    if (index >= r->n) return kdt_fail(KDT_ERR_INVALID_ARG, "kdtr: tensor index %u out of range (the file has %u)", index, r->n);
    *out = r->t[index];
    return KDT_OK;
}

kdt_status kdt_kdtr_find(const kdt_kdtr *r, const char *name, kdt_tensor_view *out) {
    if (!r || !name || !out) return kdt_fail(KDT_ERR_INVALID_ARG, "kdtr: find: NULL argument");
    uint32_t i = kdtr_index_find(&r->index, name, view_name, r);
    if (i == UINT32_MAX) {
        char qn[300];
        kdtr_quote((const unsigned char *)name, strlen(name), 0, qn, sizeof qn);
        return kdt_fail(KDT_ERR_NOT_FOUND, "tensor '%s' not found", qn);
    }
    *out = r->t[i];
    return KDT_OK;
}

/* "[4, 7, 8]"; dims < 0 print as "?". */
static void fmt_shape(char *buf, size_t cap, int ndim, const uint64_t *udims, const int64_t *sdims) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++) {
        const char *sep = d ? ", " : "";
        if (udims) n += (size_t)snprintf(buf + n, cap - n, "%s%llu", sep, (unsigned long long)udims[d]);
        else if (sdims && sdims[d] >= 0) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", sep, (long long)sdims[d]);
        else n += (size_t)snprintf(buf + n, cap - n, "%s?", sep);
    }
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

kdt_status kdt_kdtr_find_typed(const kdt_kdtr *r, const char *name, kdt_dtype dtype, int ndim, const int64_t *dims,
                               kdt_tensor_view *out) {
    kdt_tensor_view v;
    kdt_status st = kdt_kdtr_find(r, name, &v);
    if (st != KDT_OK) return st;
    char qn[300], want[200], got[200];
    kdtr_quote((const unsigned char *)name, strlen(name), 0, qn, sizeof qn);
    if (v.dtype != dtype)
        return kdt_fail(KDT_ERR_DTYPE, "tensor '%s': expected dtype %s, got %s", qn, kdt_dtype_name(dtype), kdt_dtype_name(v.dtype));
    int ok = v.ndim == ndim;
    for (int d = 0; ok && dims && d < ndim; d++)
        if (dims[d] >= 0 && (uint64_t)dims[d] != v.dims[d]) ok = 0;
    if (!ok) {
        fmt_shape(want, sizeof want, ndim < 0 ? 0 : ndim > KDTR_MAX_NDIM ? KDTR_MAX_NDIM : ndim, NULL, dims);
        fmt_shape(got, sizeof got, v.ndim, v.dims, NULL);
        return kdt_fail(KDT_ERR_SHAPE, "tensor '%s': expected shape %s, got %s", qn, want, got);
    }
    if (out) *out = v;
    return KDT_OK;
}

kdt_status kdt_kdtr_scalar_i32(const kdt_kdtr *r, const char *name, int32_t *out) {
    kdt_tensor_view v;
    kdt_status st = kdt_kdtr_find_typed(r, name, KDT_I32, 0, NULL, &v);
    if (st == KDT_OK && out) memcpy(out, v.data, sizeof *out);
    return st;
}

kdt_status kdt_kdtr_scalar_f32(const kdt_kdtr *r, const char *name, float *out) {
    kdt_tensor_view v;
    kdt_status st = kdt_kdtr_find_typed(r, name, KDT_F32, 0, NULL, &v);
    if (st == KDT_OK && out) memcpy(out, v.data, sizeof *out);
    return st;
}
