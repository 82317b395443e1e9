/* KDTR writer (docs/interfaces.md section 1): tensors in insertion order, each at a 64-aligned offset with
 * zero padding, so that every reader accepts the result. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"
#include "kdt/kdtr.h"
#include "kdtr/rules.h"

#define MAX_DIM (1ull << 40)

typedef struct entry {
    char *name;
    kdt_dtype dtype;
    int ndim;
    uint64_t dims[KDTR_MAX_NDIM];
    uint64_t nbytes;
    void *data;
} entry;

struct kdt_kdtr_writer {
    entry *e;
    uint32_t n, cap;
    kdtr_index index;
    uint64_t table_bytes; /* sum of the table records' sizes */
    uint64_t data_bytes;  /* data region so far, each tensor padded to 64 bytes */
};

static uint64_t align64(uint64_t n) { return (n + KDTR_ALIGN - 1) / KDTR_ALIGN * KDTR_ALIGN; }

static const char *entry_name(const void *ctx, uint32_t i) { return ((const kdt_kdtr_writer *)ctx)->e[i].name; }

kdt_status kdt_kdtr_writer_create(kdt_kdtr_writer **out) {
    if (!out) return kdt_fail(KDT_ERR_INVALID_ARG, "kdtr writer: out is NULL");
    *out = calloc(1, sizeof **out);
    return *out ? KDT_OK : kdt_fail(KDT_ERR_NOMEM, "kdtr writer: out of memory");
}

void kdt_kdtr_writer_free(kdt_kdtr_writer *w) {
    if (!w) return;
    for (uint32_t i = 0; i < w->n; i++) {
        free(w->e[i].name);
        free(w->e[i].data);
    }
    free(w->e);
    kdtr_index_free(&w->index);
    free(w);
}

/* Checks a tensor against every rule of the format before it is added; *nbytes its byte count. */
static kdt_status check_tensor(const kdt_kdtr_writer *w, const char *name, kdt_dtype dtype, int ndim,
                               const uint64_t *dims, uint64_t *nbytes) {
    if (!w || !name) return kdt_fail(KDT_ERR_INVALID_ARG, "kdtr writer: add: NULL writer or name");
    size_t len = strlen(name), bad = 0;
    char qn[300];
    kdtr_quote((const unsigned char *)name, len, 0, qn, sizeof qn);
    if (len < 1 || len > 255)
        return kdt_fail(KDT_ERR_KDTR_NAME_LEN, "kdtr writer: tensor '%s': name is %zu bytes, outside 1 .. 255", qn, len);
    if (kdtr_name_check((const unsigned char *)name, len, &bad) != KDT_OK) {
        kdtr_quote((const unsigned char *)name, len, 1, qn, sizeof qn);
        return kdt_fail(KDT_ERR_KDTR_NAME, "kdtr writer: tensor '%s': name is not valid UTF-8 at byte %zu", qn, bad);
    }
    if (kdtr_index_find(&w->index, name, entry_name, w) != UINT32_MAX)
        return kdt_fail(KDT_ERR_KDTR_NAME_DUP, "kdtr writer: tensor '%s' was already added", qn);
    if (w->n == KDTR_MAX_TENSORS)
        return kdt_fail(KDT_ERR_KDTR_N_TENSORS, "kdtr writer: tensor '%s': a file holds at most 65535 tensors", qn);
    size_t esize = kdt_dtype_size(dtype);
    if (esize == 0) return kdt_fail(KDT_ERR_KDTR_DTYPE, "kdtr writer: tensor '%s': unknown dtype code %d", qn, (int)dtype);
    if (ndim < 0 || ndim > KDTR_MAX_NDIM)
        return kdt_fail(KDT_ERR_KDTR_NDIM, "kdtr writer: tensor '%s': ndim %d outside 0 .. 8", qn, ndim);
    if (ndim > 0 && !dims) return kdt_fail(KDT_ERR_INVALID_ARG, "kdtr writer: tensor '%s': dims is NULL", qn);
    uint64_t numel = 0, n = 0;
    for (int d = 0; d < ndim; d++)
        if (dims[d] > MAX_DIM)
            return kdt_fail(KDT_ERR_KDTR_DIM, "kdtr writer: tensor '%s': dims[%d] = %llu > 2^40", qn, d, (unsigned long long)dims[d]);
    if (!kdtr_byte_count(dims, ndim, esize, &numel, &n))
        return kdt_fail(KDT_ERR_KDTR_DIM, "kdtr writer: tensor '%s': its byte count overflows 64 bits", qn);
    if (n > SIZE_MAX - KDTR_ALIGN || w->data_bytes + align64(n) < w->data_bytes)
        return kdt_fail(KDT_ERR_KDTR_DIM, "kdtr writer: tensor '%s': %llu bytes is too large", qn, (unsigned long long)n);
    *nbytes = n;
    return KDT_OK;
}

/* Appends a checked tensor with zeroed data. */
static kdt_status append(kdt_kdtr_writer *w, const char *name, kdt_dtype dtype, int ndim, const uint64_t *dims,
                         uint64_t nbytes, entry **out) {
    if (w->n == w->cap) {
        uint32_t cap = w->cap ? 2 * w->cap : 16;
        entry *e = realloc(w->e, (size_t)cap * sizeof *e);
        if (!e) return kdt_fail(KDT_ERR_NOMEM, "kdtr writer: out of memory");
        w->e = e;
        w->cap = cap;
    }
    kdt_status st = kdtr_index_reserve(&w->index, w->n + 1, w->n, entry_name, w);
    if (st != KDT_OK) return st;
    size_t len = strlen(name);
    entry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->name = malloc(len + 1);
    e->data = calloc(1, nbytes ? (size_t)nbytes : 1);
    if (!e->name || !e->data) {
        free(e->name);
        free(e->data);
        return kdt_fail(KDT_ERR_NOMEM, "kdtr writer: tensor '%s': out of memory for %llu bytes", name, (unsigned long long)nbytes);
    }
    memcpy(e->name, name, len + 1);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int d = 0; d < ndim; d++) e->dims[d] = dims[d];
    e->nbytes = nbytes;
    kdtr_index_insert(&w->index, e->name, w->n);
    w->n++;
    w->table_bytes += 2 + len + 2 + 8 * (uint64_t)ndim + 16;
    w->data_bytes += align64(nbytes);
    *out = e;
    return KDT_OK;
}

kdt_status kdt_kdtr_writer_add(kdt_kdtr_writer *w, const char *name, kdt_dtype dtype, int ndim, const uint64_t *dims,
                               const void *data) {
    uint64_t nbytes = 0;
    entry *e = NULL;
    kdt_status st = check_tensor(w, name, dtype, ndim, dims, &nbytes);
    if (st != KDT_OK) return st;
    if (nbytes && !data) return kdt_fail(KDT_ERR_INVALID_ARG, "kdtr writer: tensor '%s': data is NULL", name);
    if ((st = append(w, name, dtype, ndim, dims, nbytes, &e)) != KDT_OK) return st;
    if (nbytes) memcpy(e->data, data, (size_t)nbytes);
    return KDT_OK;
}

kdt_status kdt_kdtr_writer_add_alloc(kdt_kdtr_writer *w, const char *name, kdt_dtype dtype, int ndim,
                                     const uint64_t *dims, void **data) {
    uint64_t nbytes = 0;
    entry *e = NULL;
    if (!data) return kdt_fail(KDT_ERR_INVALID_ARG, "kdtr writer: add_alloc: data is NULL");
    *data = NULL;
    kdt_status st = check_tensor(w, name, dtype, ndim, dims, &nbytes);
    if (st == KDT_OK) st = append(w, name, dtype, ndim, dims, nbytes, &e);
    if (st == KDT_OK) *data = e->data;
    return st;
}

/* Serialization goes through an emitter, so that files are streamed and buffers filled alike. */
typedef int (*emit_fn)(void *ctx, const void *p, size_t n);

static uint64_t data_offset_of(const kdt_kdtr_writer *w) { return align64(KDTR_HEADER_SIZE + w->table_bytes); }

static void put(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static int emit_zeros(emit_fn emit, void *ctx, uint64_t n) {
    static const unsigned char zeros[KDTR_ALIGN];
    return n == 0 || emit(ctx, zeros, (size_t)n);
}

static int serialize(const kdt_kdtr_writer *w, emit_fn emit, void *ctx) {
    uint64_t data_offset = data_offset_of(w);
    unsigned char h[KDTR_HEADER_SIZE] = {'K', 'D', 'T', 'R'};
    put(h + 4, 1, 4);
    put(h + 8, w->n, 4);
    put(h + 16, data_offset, 8);
    put(h + 24, data_offset + w->data_bytes, 8);
    if (!emit(ctx, h, sizeof h)) return 0;
    uint64_t offset = 0;
    for (uint32_t i = 0; i < w->n; i++) {
        const entry *e = &w->e[i];
        unsigned char rec[2 + 255 + 2 + 8 * KDTR_MAX_NDIM + 16];
        size_t len = strlen(e->name), k = 0;
        put(rec, len, 2);
        memcpy(rec + 2, e->name, len);
        k = 2 + len;
        rec[k++] = (unsigned char)e->dtype;
        rec[k++] = (unsigned char)e->ndim;
        for (int d = 0; d < e->ndim; d++, k += 8) put(rec + k, e->dims[d], 8);
        put(rec + k, offset, 8);
        put(rec + k + 8, e->nbytes, 8);
        if (!emit(ctx, rec, k + 16)) return 0;
        offset += align64(e->nbytes);
    }
    if (!emit_zeros(emit, ctx, data_offset - KDTR_HEADER_SIZE - w->table_bytes)) return 0;
    for (uint32_t i = 0; i < w->n; i++) {
        const entry *e = &w->e[i];
        if (e->nbytes && !emit(ctx, e->data, (size_t)e->nbytes)) return 0;
        if (!emit_zeros(emit, ctx, align64(e->nbytes) - e->nbytes)) return 0;
    }
    return 1;
}

static int emit_file(void *ctx, const void *p, size_t n) { return fwrite(p, 1, n, (FILE *)ctx) == n; }

typedef struct membuf {
    unsigned char *p;
    size_t used;
} membuf;

static int emit_mem(void *ctx, const void *p, size_t n) {
    membuf *m = ctx;
    memcpy(m->p + m->used, p, n);
    m->used += n;
    return 1;
}

/* Where save may write: a new path, or a regular file the caller may write (the mode's write bits
 * are honoured even for root, so a read-only output stays read-only). A symlink is followed to its
 * target, which must itself qualify; the link stays a link. Anything else (a device, a FIFO, a
 * socket, a folder, a dangling link) is refused untouched. *target is the path to replace (malloc'd),
 * *mode the mode the new file gets. */
static kdt_status save_target(const char *path, char **target, mode_t *mode, int *exists) {
    struct stat st;
    *target = NULL;
    *exists = 0;
    if (lstat(path, &st) != 0) {
        if (errno != ENOENT) return kdt_fail(KDT_ERR_IO, "kdtr writer: cannot write '%s': %s", path, strerror(errno));
        *target = strdup(path);
        *mode = 0666; /* open() applies the umask, as for any new file */
        return *target ? KDT_OK : kdt_fail(KDT_ERR_NOMEM, "kdtr writer: out of memory");
    }
    if (S_ISLNK(st.st_mode)) {
        char *real = realpath(path, NULL);
        if (!real || stat(real, &st) != 0) {
            free(real);
            return kdt_fail(KDT_ERR_IO, "kdtr writer: '%s' is a symlink to a missing file; refusing to write it", path);
        }
        *target = real;
    }
    const char *kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISCHR(st.st_mode) ? "a character device"
                     : S_ISBLK(st.st_mode) ? "a block device" : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket" : S_ISREG(st.st_mode) ? NULL : "not a regular file";
    kdt_status s = KDT_OK;
    if (kind) s = kdt_fail(KDT_ERR_IO, "kdtr writer: '%s' is %s, not a regular file; refusing to replace it", path, kind);
    else if (!(st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) || faccessat(AT_FDCWD, *target ? *target : path, W_OK, AT_EACCESS) != 0)
        s = kdt_fail(KDT_ERR_IO, "kdtr writer: '%s' is read-only; refusing to replace it", path);
    else if (!*target && !(*target = strdup(path)))
        s = kdt_fail(KDT_ERR_NOMEM, "kdtr writer: out of memory");
    if (s != KDT_OK) {
        free(*target);
        *target = NULL;
        return s;
    }
    *mode = st.st_mode & 07777;
    *exists = 1;
    return KDT_OK;
}

/* A new file beside target with a name no one else uses (O_EXCL; retried on a clash), so a stale
 * or concurrent temporary is never written through. */
static int create_temp(const char *target, mode_t mode, char **tmp) {
    static _Atomic unsigned counter;
    size_t len = strlen(target) + 48;
    if (!(*tmp = malloc(len))) return -1;
    for (int tries = 0; tries < 100; tries++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        snprintf(*tmp, len, "%s.%ld.%u.%lx.tmp", target, (long)getpid(), counter++, (unsigned long)ts.tv_nsec);
        int fd = open(*tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

/* The folder holding path, so that a rename is made durable by syncing it. */
static void sync_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    int fd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (fd >= 0) fsync(fd), close(fd);
    free(dir);
}

kdt_status kdt_kdtr_writer_save(const kdt_kdtr_writer *w, const char *path) {
    if (!w || !path) return kdt_fail(KDT_ERR_INVALID_ARG, "kdtr writer: save: NULL writer or path");
    char *target = NULL, *tmp = NULL;
    mode_t mode = 0;
    int exists = 0;
    kdt_status st = save_target(path, &target, &mode, &exists);
    if (st != KDT_OK) return st;
    int fd = create_temp(target, mode, &tmp);
    if (fd < 0) {
        st = kdt_fail(KDT_ERR_IO, "kdtr writer: cannot write '%s': cannot create a temporary file beside it: %s", path,
                      strerror(errno));
        free(tmp);
        free(target);
        return st;
    }
    /* An existing file keeps its mode exactly (open() applied the umask to it). */
    int ok = !exists || fchmod(fd, mode) == 0, err = errno;
    FILE *f = ok ? fdopen(fd, "wb") : NULL;
    if (!f) {
        ok = 0, err = errno;
        close(fd);
    } else {
        ok = serialize(w, emit_file, f);
        err = errno;
        if (ok && (fflush(f) != 0 || fsync(fileno(f)) != 0)) ok = 0, err = errno;
        if (fclose(f) != 0 && ok) ok = 0, err = errno;
    }
    if (ok && rename(tmp, target) != 0) ok = 0, err = errno;
    if (ok) sync_parent(target);
    else {
        unlink(tmp);
        st = kdt_fail(KDT_ERR_IO, "kdtr writer: cannot write '%s': %s", path, strerror(err));
    }
    free(tmp);
    free(target);
    return st;
}

kdt_status kdt_kdtr_writer_to_memory(const kdt_kdtr_writer *w, void **buf, size_t *size) {
    if (!w || !buf || !size) return kdt_fail(KDT_ERR_INVALID_ARG, "kdtr writer: to_memory: NULL argument");
    *buf = NULL;
    *size = 0;
    uint64_t total = data_offset_of(w) + w->data_bytes;
    if (total > SIZE_MAX) return kdt_fail(KDT_ERR_NOMEM, "kdtr writer: %llu bytes do not fit in memory", (unsigned long long)total);
    membuf m = {malloc((size_t)total), 0};
    if (!m.p) return kdt_fail(KDT_ERR_NOMEM, "kdtr writer: out of memory for %llu bytes", (unsigned long long)total);
    serialize(w, emit_mem, &m);
    *buf = m.p;
    *size = m.used;
    return KDT_OK;
}
