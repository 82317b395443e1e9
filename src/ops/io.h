/* What every op's tensor adapter (the `run` of kdt_op_desc) shares. An op describes its tensors
 * once, in a kdt_io_op table (name, dtypes, shape in named dims, role); kdt_io_run reads and checks
 * the inputs against it, binds the dims, allocates the outputs poisoned, stages everything through
 * device memory for the CUDA backend (guard bytes around outputs) and calls the op.
 * Adding an op: its table, a `call` that builds the params from the bound dims and pointers, and
 * a `check` for the rules on values that shapes cannot say (docs/DEVELOPING.md). */
#pragma once

#include "kdt/ops.h"

#define KDT_IO_MAX_TENSORS 20
#define KDT_IO_MAX_DIMS 12

#define KDT_IO_DT(t) (1u << (t)) /* a dtype set: KDT_IO_DT(KDT_F32) | KDT_IO_DT(KDT_BF16) */

enum {
    KDT_IO_OUT = 1,      /* an output: allocated by the adapter and filled with 0xFF bytes */
    KDT_IO_INOUT = 2,    /* an input that is also written back, as the output of the same name */
    KDT_IO_OPTIONAL = 4, /* an input that may be absent (its pointers are then NULL) */
    KDT_IO_ONE_OF = 8,   /* one of the inputs so flagged is present, exactly (alternative layouts) */
    KDT_IO_T = 16,       /* has the dtype T shared by every tensor so flagged, bound by the first present */
};

/* A named dim and the range of its value. A dim with `from` is derived, from + add, once `from`
 * is bound; the others are bound by the first tensor that names them. */
typedef struct kdt_io_dim {
    const char *name;
    int64_t lo, hi;
    const char *from;
    int64_t add;
} kdt_io_dim;

/* One tensor of an op. shape: its dims by name, separated by spaces ("B Q H Dqk"); "" is a scalar.
 * bind: for an i32 scalar, the dim its value binds (or must equal). with: read only when the
 * named tensor is present, and then required. */
typedef struct kdt_io_tensor {
    const char *name;
    unsigned dtypes; /* KDT_IO_DT set; with KDT_IO_T the set T must be in */
    const char *shape;
    unsigned flags;
    const char *bind;
    const char *with;
} kdt_io_tensor;

struct kdt_io;

typedef struct kdt_io_op {
    const char *name;
    kdt_io_dim dims[KDT_IO_MAX_DIMS];          /* ends at the first without a name */
    kdt_io_tensor tensors[KDT_IO_MAX_TENSORS]; /* ends at the first without a name */
    /* Rules on the values, on host data once the outputs exist (io->host); NULL: none. */
    kdt_status (*check)(const struct kdt_io *io);
    /* Runs the op on io->ptr (host or device copies, as the backend needs). */
    kdt_status (*call)(const struct kdt_io *io, kdt_backend backend);
} kdt_io_op;

/* A call in progress. Tensors and dims are indexed as in the op's table. */
typedef struct kdt_io {
    const kdt_io_op *op;
    int64_t dim[KDT_IO_MAX_DIMS];
    kdt_dtype T;
    int present[KDT_IO_MAX_TENSORS];
    void *host[KDT_IO_MAX_TENSORS]; /* inputs as read, outputs as allocated; NULL when absent */
    void *ptr[KDT_IO_MAX_TENSORS];  /* what the backend sees: host memory, or device copies */
} kdt_io;

kdt_status kdt_io_run(const kdt_io_op *op, const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend);

/* The i32 or f32 value of scalar tensor i (host). */
int32_t kdt_io_i32(const kdt_io *io, int i);
float   kdt_io_f32(const kdt_io *io, int i);

#define KDT_STAGE_MAX 24
#define KDT_STAGE_GUARD 256 /* guard bytes on each side of a device output */

/* Host buffers seen by the op: on CPU the host pointers themselves; on CUDA device copies.
 * Outputs are copied in too (they hold the poison, or the old contents of in/out tensors),
 * get guard bytes before and after, and are copied back by kdt_stage_finish. */
typedef struct kdt_stage {
    kdt_backend backend;
    int n;
    struct {
        void *host;
        char *dev;      /* allocation start; the tensor begins at dev + KDT_STAGE_GUARD for outputs */
        size_t nbytes;
        int is_output;
        const char *name;
    } buf[KDT_STAGE_MAX];
} kdt_stage;

void       kdt_stage_init(kdt_stage *s, kdt_backend backend);
kdt_status kdt_stage_in(kdt_stage *s, const char *name, const void *host, size_t nbytes, const void **ptr);
kdt_status kdt_stage_out(kdt_stage *s, const char *name, void *host, size_t nbytes, void **ptr);
/* CUDA: synchronizes, checks every guard, copies outputs back. CPU: nothing. */
kdt_status kdt_stage_finish(kdt_stage *s);
void       kdt_stage_release(kdt_stage *s);
