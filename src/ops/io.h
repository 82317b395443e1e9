/* What every op's tensor adapter (the `run` of kdt_op_desc) shares: poisoned outputs and
 * staging of host tensors through device memory for the CUDA backend. */
#pragma once

#include "kdt/ops.h"

/* Adds output `name` to w and fills it with 0xFF bytes (NaN for floats, -1 for signed ints),
 * so that an element the op never writes is caught by every comparison. */
kdt_status kdt_io_output(kdt_kdtr_writer *w, const char *name, kdt_dtype dtype, int ndim,
                         const uint64_t *dims, void **data);

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
