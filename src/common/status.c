/* Status names, the thread-local error message, dtype tables. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/internal.h"

static _Thread_local char last_error[512];

kdt_status kdt_fail(kdt_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

const char *kdt_last_error(void) { return last_error; }

const char *kdt_status_name(kdt_status s) {
    switch (s) {
#define X(name) case name: return #name;
        X(KDT_OK) X(KDT_ERR_INVALID_ARG) X(KDT_ERR_NOT_FOUND) X(KDT_ERR_DTYPE) X(KDT_ERR_SHAPE)
        X(KDT_ERR_IO) X(KDT_ERR_NOMEM) X(KDT_ERR_NO_CUDA) X(KDT_ERR_CUDA) X(KDT_ERR_UNSUPPORTED)
        X(KDT_ERR_INTERNAL) X(KDT_ERR_COMM) X(KDT_ERR_KDTR_TRUNCATED) X(KDT_ERR_KDTR_MAGIC) X(KDT_ERR_KDTR_VERSION)
        X(KDT_ERR_KDTR_N_TENSORS) X(KDT_ERR_KDTR_FLAGS) X(KDT_ERR_KDTR_DATA_OFFSET)
        X(KDT_ERR_KDTR_FILE_SIZE) X(KDT_ERR_KDTR_NAME_LEN) X(KDT_ERR_KDTR_NAME)
        X(KDT_ERR_KDTR_NAME_DUP) X(KDT_ERR_KDTR_DTYPE) X(KDT_ERR_KDTR_NDIM) X(KDT_ERR_KDTR_DIM)
        X(KDT_ERR_KDTR_NBYTES) X(KDT_ERR_KDTR_OFFSET_ALIGN) X(KDT_ERR_KDTR_BOUNDS)
        X(KDT_ERR_KDTR_OVERLAP) X(KDT_ERR_KDTR_PADDING)
#undef X
    }
    return "KDT_ERR_UNKNOWN";
}

static const struct { kdt_dtype t; const char *name; size_t size; } dtypes[] = {
    {KDT_F32, "f32", 4}, {KDT_F64, "f64", 8}, {KDT_F16, "f16", 2}, {KDT_BF16, "bf16", 2},
    {KDT_I8, "i8", 1},   {KDT_U8, "u8", 1},   {KDT_I16, "i16", 2}, {KDT_I32, "i32", 4},
    {KDT_I64, "i64", 8}, {KDT_U32, "u32", 4}, {KDT_U64, "u64", 8},
};

size_t kdt_dtype_size(kdt_dtype t) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].t == t) return dtypes[i].size;
    return 0;
}

const char *kdt_dtype_name(kdt_dtype t) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].t == t) return dtypes[i].name;
    return "?";
}

int kdt_dtype_from_name(const char *name, kdt_dtype *out) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtypes[i].name, name) == 0) { *out = dtypes[i].t; return 0; }
    return -1;
}

const char *kdt_backend_name(kdt_backend b) { return b == KDT_BACKEND_CUDA ? "cuda" : "cpu"; }
