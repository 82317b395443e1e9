/* kdt_sgemm's int4 kernels (stream_gemm.cuh), a translation unit of their own so that the formats compile in parallel. */
#include "cuda/stream_gemm.cuh"

kdt_status kdt_sgemm_launch_int4(KDT_SGEMM_LAUNCH_ARGS) {
    return kdt_sgemm_impl::launch_fmt<KDT_SGEMM_INT4>(cfg, x, w, scale, y, M, N, K, flags, st, what);
}
