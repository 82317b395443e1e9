/* A strict reader of safetensors files (memory-mapped) and of sharded checkpoints
 * (model.safetensors.index.json). Headers are untrusted: every rule of the format is checked
 * before a tensor is handed out, with a message naming the file and the tensor. */
#pragma once

#include "kdt/kdt.h"

#define KDT_ST_MAX_NDIM 8

typedef struct kdt_st_tensor {
    const char *name;
    const char *file;            /* the file it lives in, for messages */
    const char *dtype_name;      /* "F32", "BF16", ... as in the header */
    kdt_dtype dtype;             /* 0 for dtypes with no kdt code (BOOL, F8_*) */
    int ndim;
    uint64_t dims[KDT_ST_MAX_NDIM];
    uint64_t numel, nbytes;
    const void *data;            /* inside the mapping; no alignment guaranteed */
    uint64_t begin;              /* offset in the data region */
} kdt_st_tensor;

typedef struct kdt_st kdt_st;

/* Opens dir/model.safetensors.index.json and its shards when the index exists, else
 * dir/model.safetensors. */
kdt_status kdt_st_open_dir(const char *dir, kdt_st **out);
/* Opens one file. */
kdt_status kdt_st_open_file(const char *path, kdt_st **out);
void       kdt_st_close(kdt_st *st);

size_t               kdt_st_count(const kdt_st *st);
const kdt_st_tensor *kdt_st_at(const kdt_st *st, size_t i);        /* sorted by name */
const kdt_st_tensor *kdt_st_find(const kdt_st *st, const char *name); /* NULL if absent */

/* Reads a whole (JSON) file into a malloc'd buffer; at most 256 MB. */
kdt_status kdt_read_text(const char *path, char **buf, size_t *len);
