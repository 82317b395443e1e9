/* KDTR container (docs/interfaces.md section 1): a reader that validates every rule before handing out a
 * tensor, and a writer that produces files every reader accepts. */
#pragma once

#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KDTR_MAX_NDIM 8
#define KDTR_MAX_TENSORS 65535u
#define KDTR_ALIGN 64u
#define KDTR_HEADER_SIZE 32u

typedef struct kdt_kdtr kdt_kdtr;               /* an opened, validated file (read-only) */
typedef struct kdt_kdtr_writer kdt_kdtr_writer; /* tensors collected for writing */

/* A tensor inside an opened file; valid until kdt_kdtr_close. data is 64-byte aligned. */
typedef struct kdt_tensor_view {
    const char *name;               /* NUL-terminated copy of the name */
    kdt_dtype dtype;
    int ndim;                       /* 0 .. 8; 0 is a scalar */
    uint64_t dims[KDTR_MAX_NDIM];
    uint64_t numel;                 /* product(dims); 1 for a scalar */
    uint64_t nbytes;
    const void *data;
} kdt_tensor_view;

/* Opening validates the whole file; on failure *out is NULL and the status names the rule. */
KDT_API kdt_status kdt_kdtr_open_file(const char *path, kdt_kdtr **out);          /* mmap */
KDT_API kdt_status kdt_kdtr_open_memory(const void *buf, size_t size, kdt_kdtr **out); /* copies buf */
KDT_API void       kdt_kdtr_close(kdt_kdtr *r);

KDT_API uint32_t   kdt_kdtr_count(const kdt_kdtr *r);
KDT_API kdt_status kdt_kdtr_get(const kdt_kdtr *r, uint32_t index, kdt_tensor_view *out);
KDT_API kdt_status kdt_kdtr_find(const kdt_kdtr *r, const char *name, kdt_tensor_view *out); /* KDT_ERR_NOT_FOUND */

/* Typed lookup: dtype must match; ndim must match; each dims[i] >= 0 must match (-1: any).
 * dims may be NULL to accept any shape of that rank. Messages name the tensor. */
KDT_API kdt_status kdt_kdtr_find_typed(const kdt_kdtr *r, const char *name, kdt_dtype dtype,
                                       int ndim, const int64_t *dims, kdt_tensor_view *out);
/* A 0-d scalar of the given dtype (i32 or f32 are what ops use). */
KDT_API kdt_status kdt_kdtr_scalar_i32(const kdt_kdtr *r, const char *name, int32_t *out);
KDT_API kdt_status kdt_kdtr_scalar_f32(const kdt_kdtr *r, const char *name, float *out);

/* Writer. add copies data; add_alloc returns zeroed space of nbytes to fill before saving. */
KDT_API kdt_status kdt_kdtr_writer_create(kdt_kdtr_writer **out);
KDT_API void       kdt_kdtr_writer_free(kdt_kdtr_writer *w);
KDT_API kdt_status kdt_kdtr_writer_add(kdt_kdtr_writer *w, const char *name, kdt_dtype dtype,
                                       int ndim, const uint64_t *dims, const void *data);
KDT_API kdt_status kdt_kdtr_writer_add_alloc(kdt_kdtr_writer *w, const char *name, kdt_dtype dtype,
                                             int ndim, const uint64_t *dims, void **data);
/* Writes a temporary file with a unique name beside PATH, syncs it and renames it over PATH, so a
 * failed write never leaves a half file at PATH and the temporary is removed on every failure.
 * PATH must be a new path or a regular file with a write bit that the caller may write (root
 * included); a symlink is followed and its target replaced under the same rules (the link stays).
 * Devices, FIFOs, sockets, folders, read-only files and dangling links are refused untouched with
 * KDT_ERR_IO. A replaced file keeps its mode; a new one gets 0666 less the umask. */
KDT_API kdt_status kdt_kdtr_writer_save(const kdt_kdtr_writer *w, const char *path);
/* Serializes into a malloc'd buffer the caller frees with free(). */
KDT_API kdt_status kdt_kdtr_writer_to_memory(const kdt_kdtr_writer *w, void **buf, size_t *size);

#ifdef __cplusplus
}
#endif
