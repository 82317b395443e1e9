/* cuBLAS, loaded on first use. Linking libcublas maps it and libcublasLt (about 200 MB resident,
 * a second of start-up when cold) into every process, `kdt --help` and CPU runs included. These
 * definitions of the few entry points the library uses stand in for it at link time and open the
 * real library with dlopen the first time one is called (libkdt's run path finds it). */
#if KDT_HAVE_CUDA
#include <cublas_v2.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define STR_(x) #x
#define STR(x) STR_(x)
#define CUBLAS_SONAME "libcublas.so." STR(CUBLAS_VER_MAJOR)

static struct {
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
    cublasStatus_t (*set_workspace)(cublasHandle_t, void *, size_t);
    const char *(*status_string)(cublasStatus_t);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                              const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                              const void *, const void *, cudaDataType, int, long long, const void *,
                                              cudaDataType, int, long long, const void *, void *, cudaDataType, int,
                                              long long, int, cublasComputeType_t, cublasGemmAlgo_t);
    int ok;
    char error[256];  /* why loading failed, given back by cublasGetStatusString */
} lib;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
    void *h = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(lib.error, sizeof lib.error, "cannot load %s: %s", CUBLAS_SONAME, dlerror());
        return;
    }
    /* Through void * into each pointer: POSIX's dlsym contract for function pointers. */
    const struct { void *slot; const char *name; } syms[] = {
        {&lib.create, "cublasCreate_v2"},         {&lib.destroy, "cublasDestroy_v2"},
        {&lib.set_stream, "cublasSetStream_v2"},  {&lib.set_math_mode, "cublasSetMathMode"},
        {&lib.status_string, "cublasGetStatusString"}, {&lib.gemm_ex, "cublasGemmEx"},
        {&lib.gemm_strided_batched_ex, "cublasGemmStridedBatchedEx"}, {&lib.set_workspace, "cublasSetWorkspace_v2"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *f = dlsym(h, syms[i].name);
        if (!f) {
            snprintf(lib.error, sizeof lib.error, "%s has no %s", CUBLAS_SONAME, syms[i].name);
            return;
        }
        *(void **)syms[i].slot = f;
    }
    lib.ok = 1;
}

static int loaded(void) {
    pthread_once(&once, load);
    return lib.ok;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    return loaded() ? lib.create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    return loaded() ? lib.destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    return loaded() ? lib.set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    return loaded() ? lib.set_math_mode(handle, mode) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t bytes) {
    return loaded() ? lib.set_workspace(handle, workspace, bytes) : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char *cublasGetStatusString(cublasStatus_t status) {
    return loaded() ? lib.status_string(status) : lib.error;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
    if (!loaded()) return CUBLAS_STATUS_NOT_INITIALIZED;
    return lib.gemm_ex(h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          long long sa, const void *B, cudaDataType bt, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType ct, int ldc, long long sc, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    if (!loaded()) return CUBLAS_STATUS_NOT_INITIALIZED;
    return lib.gemm_strided_batched_ex(h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc,
                                       batch, compute, algo);
}
#endif
