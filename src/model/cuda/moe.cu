/* The MoE's routed experts for small batches (decode, verification): one kernel per product
 * that streams each active expert's weights once for all the rows routed to it, reading the
 * routing (perm, counts, offsets from kdt_mk_moe_plan) from device memory. The same kernel with
 * one "expert" of all the rows is the small-batch product of the dense projections. The grid is
 * fixed by the shapes alone (experts x output tiles), blocks of an expert with no rows exit at
 * once, so the host never waits for the counts and the launch can be captured in a CUDA graph.
 *
 * A block owns kWarps * kW weight rows of one expert, a warp kW; the block stages up to kRows of
 * the expert's input rows, kChunkBytes of each at a time, in shared memory, and every
 * lane accumulates 8-element slices of its weight rows against them (f32, fixed order: slice
 * lane, lane + 32, ... then a butterfly over the warp). So each output has one summation order,
 * whatever the timing: the kernels are deterministic. More than kRows rows stream the weights
 * again (from L2 for the most part); an expert's rows are cut in slices of kSliceRows, a block
 * each (grid z), so that prefill-sized batches of small experts spread over the SMs. kRows is the
 * least of 1, 4, 16 that covers the batch's rows (an expert has at most one assignment per row):
 * fewer accumulators, more blocks per SM, more loads in flight at decode. The kernel itself is in moe.cuh (run on CPU threads by
 * tests/test_model_moe_emu.cc). */
#include "common/cuda/cuda_common.cuh"
#include "model/cuda/kernels.h"
#include "model/cuda/linear.h"
#include "model/cuda/moe_quant.h"
#include "model/cuda/pdl.cuh"

namespace {

#include "model/cuda/moe.cuh"

typedef __nv_bfloat16 bf16;

/* Row slices of R rows: an expert has at most one assignment per row. */
unsigned slices(int64_t R) { return (unsigned)((R + kSliceRows - 1) / kSliceRows); }

/* shared: the functors carry the shared expert as expert E (WShared), run as one more grid row
 * whose R assignments follow the R * K routed ones. */
template <typename T, int kRows, typename WG, typename WD>
kdt_status launch(int64_t R, const void *x, const int32_t *perm, int32_t K, const int32_t *counts, const int32_t *offs, WG w_gu,
                  WD w_down, int32_t E, int32_t hid, int32_t I, void *act, float *ye, bool shared, cudaStream_t s) {
    const int gu_cols = kWarps * kW / 2, down_cols = kWarps * kW, sh_off = shared ? (int)(R * K) : -1;
    const unsigned ge = (unsigned)E + (shared ? 1u : 0u);
    KDT_CUDA_CHECK(kdt_pdl_launch(moe_small_kernel<T, true, kRows, WG>, dim3((unsigned)((I + gu_cols - 1) / gu_cols), ge, slices(R)),
                                  dim3(kThreads), 0, s, (const T *)x, perm, K, counts, offs, w_gu, hid, I, act, (int)R, false, NormIn{},
                                  sh_off));
    KDT_CUDA_CHECK_LAUNCH("moe_small gate_up");
    KDT_CUDA_CHECK(kdt_pdl_launch(moe_small_kernel<T, false, kRows, WD>,
                                  dim3((unsigned)((hid + down_cols - 1) / down_cols), ge, slices(R)), dim3(kThreads), 0, s,
                                  (const T *)act, perm, K, counts, offs, w_down, I, hid, ye, (int)R, false, NormIn{}, sh_off));
    KDT_CUDA_CHECK_LAUNCH("moe_small down");
    return KDT_OK;
}

template <typename T, int kRows>
kdt_status launch_dense(int32_t R, const void *x, const void *w, int32_t K, int32_t N, int gate_up, void *y, int accumulate,
                        const NormIn &nin, cudaStream_t s) {
    if (gate_up) {
        const int cols = kWarps * kW / 2;
        KDT_CUDA_CHECK(kdt_pdl_launch(moe_small_kernel<T, true, kRows, WPlain<T>>, dim3((unsigned)((N + cols - 1) / cols), 1, slices(R)),
                                      dim3(kThreads), 0, s, (const T *)x, nullptr, 1, nullptr, nullptr, WPlain<T>{(const T *)w}, K, N,
                                      y, R, false, nin, -1));
    } else {
        const int cols = kWarps * kW;
        KDT_CUDA_CHECK(kdt_pdl_launch(moe_small_kernel<T, false, kRows, WPlain<T>>, dim3((unsigned)((N + cols - 1) / cols), 1, slices(R)),
                                      dim3(kThreads), 0, s, (const T *)x, nullptr, 1, nullptr, nullptr, WPlain<T>{(const T *)w}, K, N,
                                      y, R, accumulate != 0, nin, -1));
    }
    KDT_CUDA_CHECK_LAUNCH("dense_small");
    return KDT_OK;
}

template <typename T>
kdt_status dense_rows(int32_t R, const void *x, const void *w, int32_t K, int32_t N, int gate_up, void *y, int accumulate,
                      const NormIn &nin, cudaStream_t s) {
    if (R <= 1) return launch_dense<T, 1>(R, x, w, K, N, gate_up, y, accumulate, nin, s);
    if (R <= 4) return launch_dense<T, 4>(R, x, w, K, N, gate_up, y, accumulate, nin, s);
    return launch_dense<T, kMaxRows>(R, x, w, K, N, gate_up, y, accumulate, nin, s);
}

template <typename T, typename WG, typename WD>
kdt_status launch_rows(int64_t R, const void *x, const int32_t *perm, int32_t K, const int32_t *counts, const int32_t *offs,
                       WG w_gu, WD w_down, int32_t E, int32_t hid, int32_t I, void *act, float *ye, cudaStream_t s,
                       bool shared = false) {
    if (R <= 1) return launch<T, 1>(R, x, perm, K, counts, offs, w_gu, w_down, E, hid, I, act, ye, shared, s);
    if (R <= 4) return launch<T, 4>(R, x, perm, K, counts, offs, w_gu, w_down, E, hid, I, act, ye, shared, s);
    return launch<T, kMaxRows>(R, x, perm, K, counts, offs, w_gu, w_down, E, hid, I, act, ye, shared, s);
}

/* The plain experts, with the shared expert as expert E where sh_gu is given. */
template <typename T>
kdt_status plain_rows(int64_t R, const void *x, const int32_t *perm, int32_t K, const int32_t *counts, const int32_t *offs,
                      const void *w_gate_up, const void *w_down, const void *sh_gu, const void *sh_down, int32_t E, int32_t hid,
                      int32_t I, void *act, float *ye, cudaStream_t s) {
    if (!sh_gu)
        return launch_rows<T>(R, x, perm, K, counts, offs, WPlain<T>{(const T *)w_gate_up}, WPlain<T>{(const T *)w_down}, E, hid, I,
                              act, ye, s);
    return launch_rows<T>(R, x, perm, K, counts, offs, WShared<T>{(const T *)w_gate_up, (const T *)sh_gu, E},
                          WShared<T>{(const T *)w_down, (const T *)sh_down, E}, E, hid, I, act, ye, s, true);
}

} // namespace

extern "C" kdt_status kdt_mk_dense_small(int32_t R, const void *x, const void *w, int32_t K, int32_t N, int gate_up, void *y,
                                         int accumulate, const kdt_mk_norm *norm, kdt_dtype dt, cudaStream_t s) {
    if (R < 1 || K % 8 != 0) return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: small-batch product of %d rows, K = %d", R, K);
    const NormIn nin = norm ? NormIn{norm->x, norm->w, norm->rows, norm->eps} : NormIn{};
    if (dt == KDT_BF16) return dense_rows<bf16>(R, x, w, K, N, gate_up, y, accumulate, nin, s);
    if (dt == KDT_F32) return dense_rows<float>(R, x, w, K, N, gate_up, y, accumulate, nin, s);
    return kdt_fail(KDT_ERR_DTYPE, "model cuda: activation dtype %s, expected f32 or bf16", kdt_dtype_name(dt));
}

extern "C" int kdt_mk_moe_small_fits(int32_t hid, int32_t I) { return hid % 8 == 0 && I % 8 == 0 && hid > 0 && I > 0; }

extern "C" kdt_status kdt_mk_moe_small(int64_t R, const void *x, const int32_t *perm, int32_t K, const int32_t *counts,
                                       const int32_t *offs, const void *w_gate_up, const void *w_down, const void *shared_gate_up,
                                       const void *shared_down, int32_t E, int32_t hid, int32_t I, void *act, float *ye, kdt_dtype dt,
                                       cudaStream_t s) {
    if (!kdt_mk_moe_small_fits(hid, I))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: small-batch MoE needs hidden and intermediate sizes that are multiples of 8");
    if (dt == KDT_BF16)
        return plain_rows<bf16>(R, x, perm, K, counts, offs, w_gate_up, w_down, shared_gate_up, shared_down, E, hid, I, act, ye, s);
    if (dt == KDT_F32)
        return plain_rows<float>(R, x, perm, K, counts, offs, w_gate_up, w_down, shared_gate_up, shared_down, E, hid, I, act, ye, s);
    return kdt_fail(KDT_ERR_DTYPE, "model cuda: activation dtype %s, expected f32 or bf16", kdt_dtype_name(dt));
}

extern "C" kdt_status kdt_lin_moe_small(int64_t R, const void *x, const int32_t *perm, int32_t K, const int32_t *counts,
                                        const int32_t *offs, const kdt_dlin *gate_up, const kdt_dlin *down, int32_t hid, int32_t I,
                                        void *act, float *ye, kdt_dtype dt, cudaStream_t s) {
    const int32_t E = gate_up->n;
    if (gate_up->fmt == KDT_WFMT_DENSE && down->fmt == KDT_WFMT_DENSE)
        return kdt_mk_moe_small(R, x, perm, K, counts, offs, gate_up->w[0], down->w[0], nullptr, nullptr, E, hid, I, act, ye, dt, s);
    if (gate_up->fmt != down->fmt || dt != KDT_BF16 || !kdt_mk_moe_small_fits(hid, I) ||
        (gate_up->fmt == KDT_WFMT_INT4 && (hid % 32 || I % 32)))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: quantized experts need one format for gate/up and down, bf16 activations "
                        "and hidden, intermediate sizes that are multiples of 8 (FP8) or 32 (INT4): hidden %d, intermediate %d",
                        hid, I);
    if (kdt_moe_quant_fits(gate_up, down, hid, I)) /* the tensor-core grouped kernels (moe_quant.cu) */
        return kdt_moe_quant(R, x, perm, K, counts, offs, gate_up, down, hid, I, act, ye, s);
    if (gate_up->fmt == KDT_WFMT_INT4)
        return launch_rows<bf16>(R, x, perm, K, counts, offs, wquant<true>(gate_up), wquant<true>(down), E, hid, I, act, ye, s);
    return launch_rows<bf16>(R, x, perm, K, counts, offs, wquant<false>(gate_up), wquant<false>(down), E, hid, I, act, ye, s);
}
