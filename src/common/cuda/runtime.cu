/* Device memory helpers behind src/common/device.h, and kdt_cuda_available. */
#include "common/device.h"
#include "common/cuda/cuda_common.cuh"

extern "C" int kdt_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}

extern "C" int kdt_cuda_available(void) { return kdt_cuda_device_count() > 0; }

extern "C" kdt_status kdt_dev_alloc(void **ptr, size_t nbytes) {
    *ptr = NULL;
    if (nbytes == 0) nbytes = 1; /* a valid, unique pointer for empty tensors */
    cudaError_t e = cudaMalloc(ptr, nbytes);
    if (e != cudaSuccess) {
        *ptr = NULL;
        return kdt_fail(e == cudaErrorMemoryAllocation ? KDT_ERR_NOMEM : KDT_ERR_CUDA,
                        "cudaMalloc(%zu bytes): %s", nbytes, cudaGetErrorString(e));
    }
    return KDT_OK;
}

extern "C" void kdt_dev_free(void *ptr) {
    if (ptr) (void)cudaFree(ptr);
}

extern "C" kdt_status kdt_dev_h2d(void *dst, const void *src, size_t n) {
    if (n) KDT_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
    return KDT_OK;
}

extern "C" kdt_status kdt_dev_d2h(void *dst, const void *src, size_t n) {
    if (n) KDT_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
    return KDT_OK;
}

extern "C" kdt_status kdt_dev_sync(void) {
    KDT_CUDA_CHECK(cudaDeviceSynchronize());
    KDT_CUDA_CHECK(cudaGetLastError());
    return KDT_OK;
}
