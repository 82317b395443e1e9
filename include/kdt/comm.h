/* Communicators: a world of N ranks and the collectives that the expert-parallel model needs
 * (docs/multi_gpu.md). One thread per rank, all in one process; no launcher.
 *
 * Backends:
 *   KDT_COMM_LOCAL: the ranks are threads sharing host memory; buffers are host memory. Every rank
 *     computes its output from all ranks' inputs in rank order, so a sum is the same bits on every
 *     rank and for every N where the math allows (s_0 + s_1 + ... in that order). For CPU runs and tests.
 *   KDT_COMM_NCCL: NCCL opened at run time (dlopen) from the `nvidia-nccl-cu13` wheel's
 *     lib/libnccl.so.2: $KDT_NCCL_LIB, else the path the build was given (make NCCL_LIB=...), else
 *     the loader's search for libnccl.so.2. Rank r uses CUDA device r; buffers are device memory;
 *     the calls queue on `stream` and return once the collective finished. A build without CUDA, or
 *     a machine without the library, says so (KDT_ERR_UNSUPPORTED) and never falls back silently.
 *
 * Faults: a collective that waits more than the rank's timeout for the others, or any rank's
 * kdt_comm_abort, ends that collective and every later one on every rank with KDT_ERR_COMM and a
 * message naming the rank at fault and why (NCCL: the communicator is aborted). Nothing hangs
 * unless the timeout is 0 (wait for ever), which still ends on an abort.
 *
 * Counts are elements of dtype. Every rank passes the same count (and root) to a collective;
 * a mismatch is an error on every rank (local backend). In-place calls (send == recv) are allowed. */
#pragma once

#include <stddef.h>

#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kdt_comm_backend { KDT_COMM_LOCAL = 0, KDT_COMM_NCCL = 1 } kdt_comm_backend;

typedef struct kdt_comm_world kdt_comm_world;   /* what the ranks share; made once, before the ranks */
typedef struct kdt_comm kdt_comm;               /* one rank's handle, used by its own thread only */

/* timeout_ms: a collective's longest wait; 0: $KDT_COMM_TIMEOUT_MS where set, else 300000. */
KDT_API kdt_status kdt_comm_world_create(kdt_comm_backend backend, int32_t size, int32_t timeout_ms, kdt_comm_world **out);
/* After every rank's kdt_comm_free. */
KDT_API void       kdt_comm_world_free(kdt_comm_world *w);
/* Rank `rank`'s handle, from its own thread (NCCL: blocks until every rank has called it). */
KDT_API kdt_status kdt_comm_init(kdt_comm_world *w, int32_t rank, kdt_comm **out);
KDT_API void       kdt_comm_free(kdt_comm *c);
KDT_API int32_t    kdt_comm_rank(const kdt_comm *c);
KDT_API int32_t    kdt_comm_size(const kdt_comm *c);
KDT_API kdt_comm_backend kdt_comm_get_backend(const kdt_comm *c);
/* This rank's wait limit from now on; 0: no limit (an abort still ends the wait). */
KDT_API void       kdt_comm_set_timeout(kdt_comm *c, int32_t timeout_ms);
/* Ends every rank's current and later collectives with KDT_ERR_COMM, the message naming this
 * rank and `why`; the first abort's message is the one every rank sees. */
KDT_API void       kdt_comm_abort(kdt_comm *c, const char *why);

/* The collectives. dtype: any for the moves; f32, f64, i32 or i64 for the sums (NCCL: bf16, f16 too). */
KDT_API kdt_status kdt_comm_barrier(kdt_comm *c);
/* recv [count] = sum over ranks of send [count]. */
KDT_API kdt_status kdt_comm_all_reduce(kdt_comm *c, const void *send, void *recv, size_t count, kdt_dtype dtype,
                                       void *stream);
/* recv [size, count]: rank r's send [count] in row r. */
KDT_API kdt_status kdt_comm_all_gather(kdt_comm *c, const void *send, void *recv, size_t count, kdt_dtype dtype,
                                       void *stream);
/* recv [count] = sum over ranks of their send [size, count]'s row `rank`. */
KDT_API kdt_status kdt_comm_reduce_scatter(kdt_comm *c, const void *send, void *recv, size_t count, kdt_dtype dtype,
                                           void *stream);
/* buf [count]: the root's values on every rank. */
KDT_API kdt_status kdt_comm_broadcast(kdt_comm *c, void *buf, size_t count, kdt_dtype dtype, int32_t root, void *stream);
/* Rank r sends send_counts[p] elements from send + send_offs[p] to rank p, which receives them at
 * recv + recv_offs[r]; recv_counts[r] must equal rank r's send_counts[p]. Arrays [size]. No in-place. */
KDT_API kdt_status kdt_comm_all_to_all_v(kdt_comm *c, const void *send, const size_t *send_counts, const size_t *send_offs,
                                         void *recv, const size_t *recv_counts, const size_t *recv_offs, kdt_dtype dtype,
                                         void *stream);

#ifdef __cplusplus
}
#endif
