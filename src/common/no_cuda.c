/* Device helpers of a CPU-only build (KDT_CUDA=0): every CUDA request is a clear error. */
#include "common/device.h"
#include "common/internal.h"

kdt_status kdt_no_cuda(const char *what) {
    return kdt_fail(KDT_ERR_NO_CUDA, "%s: this build has no CUDA backend (built with KDT_CUDA=0)", what);
}

#if !KDT_HAVE_CUDA
int kdt_cuda_available(void) { return 0; }
int kdt_cuda_device_count(void) { return 0; }
kdt_status kdt_dev_alloc(void **ptr, size_t nbytes) { (void)nbytes; *ptr = NULL; return kdt_no_cuda("device allocation"); }
void kdt_dev_free(void *ptr) { (void)ptr; }
kdt_status kdt_dev_h2d(void *dst, const void *src, size_t n) { (void)dst; (void)src; (void)n; return kdt_no_cuda("copy to device"); }
kdt_status kdt_dev_d2h(void *dst, const void *src, size_t n) { (void)dst; (void)src; (void)n; return kdt_no_cuda("copy from device"); }
kdt_status kdt_dev_sync(void) { return kdt_no_cuda("device synchronize"); }
#endif
