/* Host-side device memory helpers, the one place the C files touch the CUDA runtime.
 * In a CPU-only build each returns KDT_ERR_NO_CUDA (src/common/no_cuda.c). */
#pragma once

#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

kdt_status kdt_dev_alloc(void **ptr, size_t nbytes);
void       kdt_dev_free(void *ptr);
kdt_status kdt_dev_h2d(void *dst, const void *src, size_t nbytes);
kdt_status kdt_dev_d2h(void *dst, const void *src, size_t nbytes);
kdt_status kdt_dev_sync(void);
kdt_status kdt_no_cuda(const char *what); /* the error a CPU-only build gives for CUDA work */

#ifdef __cplusplus
}
#endif
