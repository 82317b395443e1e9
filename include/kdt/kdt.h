/* kdtree-engine: status codes, dtypes and backends shared by every part of the C API. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define KDT_API __declspec(dllexport)
#else
#define KDT_API __attribute__((visibility("default")))
#endif

#define KDT_VERSION_STRING "0.1.0"

/* Every library call returns a status; on failure kdt_last_error() holds a one-line message
 * that names the tensor, field or rule at fault. */
typedef enum kdt_status {
    KDT_OK = 0,
    KDT_ERR_INVALID_ARG = 1,  /* a parameter or tensor value breaks the op's contract */
    KDT_ERR_NOT_FOUND = 2,    /* a named tensor is missing */
    KDT_ERR_DTYPE = 3,        /* a tensor has the wrong dtype */
    KDT_ERR_SHAPE = 4,        /* a tensor has the wrong rank or dims */
    KDT_ERR_IO = 5,           /* open/read/write/mmap failed */
    KDT_ERR_NOMEM = 6,        /* host or device allocation failed */
    KDT_ERR_NO_CUDA = 7,      /* built without CUDA, or no CUDA device present */
    KDT_ERR_CUDA = 8,         /* a CUDA call or launch failed */
    KDT_ERR_UNSUPPORTED = 9,  /* valid input this build cannot run (unknown op, ...) */
    KDT_ERR_INTERNAL = 10,    /* a bug: guard bytes overwritten, impossible state */
    KDT_ERR_COMM = 11,        /* a collective failed: a rank aborted or timed out, or NCCL failed (kdt/comm.h) */

    /* KDTR container rules (docs/interfaces.md section 1), one code per rule. */
    KDT_ERR_KDTR_TRUNCATED = 100,     /* header or table runs past the end of the buffer */
    KDT_ERR_KDTR_MAGIC = 101,         /* magic is not "KDTR" */
    KDT_ERR_KDTR_VERSION = 102,       /* version is not 1 */
    KDT_ERR_KDTR_N_TENSORS = 103,     /* n_tensors > 65535 */
    KDT_ERR_KDTR_FLAGS = 104,         /* flags has a set bit */
    KDT_ERR_KDTR_DATA_OFFSET = 105,   /* data_offset not a multiple of 64, inside the table, or past the end */
    KDT_ERR_KDTR_FILE_SIZE = 106,     /* file_size differs from the buffer length */
    KDT_ERR_KDTR_NAME_LEN = 107,      /* name_len outside 1 .. 255 */
    KDT_ERR_KDTR_NAME = 108,          /* name holds a NUL byte or is not valid UTF-8 */
    KDT_ERR_KDTR_NAME_DUP = 109,      /* two tensors share a name */
    KDT_ERR_KDTR_DTYPE = 110,         /* unknown dtype code */
    KDT_ERR_KDTR_NDIM = 111,          /* ndim > 8 */
    KDT_ERR_KDTR_DIM = 112,           /* a dim > 2^40, or the byte count overflows */
    KDT_ERR_KDTR_NBYTES = 113,        /* nbytes != product(dims) * size(dtype) */
    KDT_ERR_KDTR_OFFSET_ALIGN = 114,  /* tensor offset not a multiple of 64 */
    KDT_ERR_KDTR_BOUNDS = 115,        /* tensor bytes outside [data_offset, file_size) */
    KDT_ERR_KDTR_OVERLAP = 116,       /* two tensors' bytes overlap */
    KDT_ERR_KDTR_PADDING = 117,       /* a non-zero byte between two tensors */
} kdt_status;

/* dtype codes are the KDTR codes of docs/interfaces.md section 1. */
typedef enum kdt_dtype {
    KDT_F32 = 1,
    KDT_F64 = 2,
    KDT_F16 = 3,
    KDT_BF16 = 4,
    KDT_I8 = 5,
    KDT_U8 = 6,
    KDT_I16 = 7,
    KDT_I32 = 8,
    KDT_I64 = 9,
    KDT_U32 = 10,
    KDT_U64 = 11,
} kdt_dtype;

typedef enum kdt_backend {
    KDT_BACKEND_CPU = 0,
    KDT_BACKEND_CUDA = 1,
} kdt_backend;

KDT_API const char *kdt_status_name(kdt_status s);   /* "KDT_ERR_SHAPE" */
KDT_API const char *kdt_last_error(void);            /* thread-local message of the last failure */
KDT_API size_t      kdt_dtype_size(kdt_dtype t);     /* bytes per element; 0 for an unknown code */
KDT_API const char *kdt_dtype_name(kdt_dtype t);     /* "f32", "bf16", ...; "?" if unknown */
KDT_API int         kdt_dtype_from_name(const char *name, kdt_dtype *out); /* 0 on success */
KDT_API const char *kdt_backend_name(kdt_backend b); /* "cpu" | "cuda" */

/* 1 when the library was built with CUDA and a device is visible. */
KDT_API int kdt_cuda_available(void);
/* CUDA devices visible to this build (0 without CUDA or a device). */
KDT_API int kdt_cuda_device_count(void);

#ifdef __cplusplus
}
#endif
