/* kdt_sgemm (src/cuda/stream_gemm.h): the arguments checked, the cfg picked, then the format's launcher
 * (stream_gemm_<fmt>.cu; the kernels and their design: stream_gemm.cuh). */
#include "cuda/stream_gemm.cuh"

/* From the H200's bench_quant_gemm (docs/perf/quant.md): int4 1 x 8 with the shared-memory transpose up to
 * 8 rows, 2 x 4 past them; fp8 1 x 4; bf16 2 x 4 (gemv_split_bench at Kimi's 8 projection shapes, M = 1, 4, 16:
 * the fastest at 18 of 24; 1 x 4 at the other 6, the three smallest at M <= 4, by 7-15%). */
extern "C" int kdt_sgemm_auto_cfg(kdt_sgemm_fmt fmt, int32_t M) {
    if (fmt == KDT_SGEMM_INT4) return M <= 8 ? 3 : 4;
    if (fmt == KDT_SGEMM_FP8) return 1;
    (void)M;
    return 2;
}

extern "C" kdt_status kdt_sgemm_cfg(int cfg, kdt_sgemm_fmt fmt, const void *x, const void *w, const void *scale, void *y, int32_t M,
                                    int32_t N, int32_t K, unsigned flags, void *stream) {
    static const char *const names[] = {"sgemm bf16", "sgemm fp8", "sgemm int4"};
    if ((unsigned)fmt > KDT_SGEMM_INT4) return kdt_fail(KDT_ERR_INVALID_ARG, "sgemm: format %d is not bf16, fp8 or int4", (int)fmt);
    const char *what = names[fmt];
    const int kmult = fmt == KDT_SGEMM_BF16 ? 8 : fmt == KDT_SGEMM_FP8 ? 16 : 32;
    if (cfg < 0 || cfg >= KDT_SGEMM_CFGS) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: cfg %d is not 0 .. %d", what, cfg, KDT_SGEMM_CFGS - 1);
    if (M < 0 || M > KDT_SGEMM_MAX_ROWS || N < 1 || K < 1 || K % kmult)
        return kdt_fail(KDT_ERR_SHAPE, "%s: M %d, N %d, K %d: M must be 0 .. %d and K a positive multiple of %d", what, M, N, K,
                        KDT_SGEMM_MAX_ROWS, kmult);
    if (((uintptr_t)x | (uintptr_t)w) % 16 || (uintptr_t)scale % (fmt == KDT_SGEMM_FP8 ? 4 : fmt == KDT_SGEMM_INT4 ? 2 : 1) ||
        (fmt != KDT_SGEMM_BF16 && !scale))
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: x and w must be 16-byte aligned, the scales present and aligned to their type", what);
    if ((flags & KDT_SGEMM_GLU) && (fmt != KDT_SGEMM_BF16 || (flags & KDT_SGEMM_ACCUMULATE) || N % 2))
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: GLU needs bf16 weights of an even N (%d) and no accumulate", what, N);
    if (M == 0) return KDT_OK;
    if (!cfg) cfg = kdt_sgemm_auto_cfg(fmt, M);
    if (flags & KDT_SGEMM_GLU) cfg = 2; /* a gate and an up row tile a warp */
    const cudaStream_t st = (cudaStream_t)stream;
    switch (fmt) {
    case KDT_SGEMM_BF16: return kdt_sgemm_launch_bf16(cfg, x, w, scale, y, M, N, K, flags, st, what);
    case KDT_SGEMM_FP8: return kdt_sgemm_launch_fp8(cfg, x, w, scale, y, M, N, K, flags, st, what);
    default: return kdt_sgemm_launch_int4(cfg, x, w, scale, y, M, N, K, flags, st, what);
    }
}

extern "C" kdt_status kdt_sgemm(kdt_sgemm_fmt fmt, const void *x, const void *w, const void *scale, void *y, int32_t M, int32_t N,
                                int32_t K, unsigned flags, void *stream) {
    return kdt_sgemm_cfg(0, fmt, x, w, scale, y, M, N, K, flags, stream);
}
