/* verify_attn on Hopper: the launcher behind kdt_verify_attn_sm90 (verify_attn_sm90.h). It turns
 * the op's params into the kernels' Args, picks the kernel (TMA where the tensor maps describe
 * the call, else cp.async) and the split (choose_parts), takes the split's workspace from a pool
 * and launches the main kernel, then the combine kernel when the call is split. The kernels'
 * design is in verify_attn_sm90_kernel.cu. */
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/sm90/verify_attn_sm90.h"
#include "cuda/sm90/verify_attn_sm90_sched.cuh"

using namespace kdt_va_sm90;

namespace {

/* Workspace comes from a pool of our own that keeps freed memory (up to kPoolKeep), so a call per
 * layer does not map and unmap device memory each time; stream-ordered, so concurrent calls on
 * different streams are safe. */
constexpr int kMaxDevices = 64;
constexpr uint64_t kPoolKeep = 512ull << 20;
pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;
cudaMemPool_t g_pool[kMaxDevices];

kdt_status workspace_pool(int dev, cudaMemPool_t *pool) {
    if (dev < 0 || dev >= kMaxDevices) {
        KDT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(pool, dev));
        return KDT_OK;
    }
    pthread_mutex_lock(&g_pool_mu);
    cudaError_t e = cudaSuccess;
    if (!g_pool[dev]) {
        cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = dev;
        cudaMemPool_t p = nullptr;
        e = cudaMemPoolCreate(&p, &props);
        uint64_t keep = kPoolKeep;
        if (e == cudaSuccess) e = cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep);
        if (e == cudaSuccess) g_pool[dev] = p;
        else if (p) (void)cudaMemPoolDestroy(p);
    }
    *pool = g_pool[dev];
    pthread_mutex_unlock(&g_pool_mu);
    KDT_CUDA_CHECK(e);
    return KDT_OK;
}

/* cuTensorMapEncodeTiled, reached through the runtime's driver entry point (no -lcuda). */
pthread_once_t g_encode_once = PTHREAD_ONCE_INIT;
PFN_cuTensorMapEncodeTiled_v12000 g_encode;

void find_encode(void) {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        g_encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    else
        (void)cudaGetLastError();
}

/* A bf16 map over `rows` rows of 576 elements: boxes [box_rows, 64 elements] with the 128-byte
 * swizzle (the tiles' shared layout); reads outside the rows give zeros. */
int encode_rows(CUtensorMap *m, const void *base, long long rows, int box_rows) {
    const cuuint64_t dim[2] = {(cuuint64_t)kDqk, (cuuint64_t)rows};
    const cuuint64_t stride[1] = {(cuuint64_t)kDqk * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
    const cuuint32_t estride[2] = {1, 1};
    return g_encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dim, stride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                    CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int hook_off(void) { /* $KDT_VA_SM90=0 switches the hook off (the general kernel runs) */
    const char *s = getenv("KDT_VA_SM90");
    return s && !strcmp(s, "0");
}

int aligned(const void *p, uintptr_t n) { return ((uintptr_t)p % n) == 0; }

const char *kernel_name(int kernel) { return kernel == KDT_VA_SM90_CP_ASYNC ? "cp.async" : "TMA"; }

kdt_status launch(const kdt_verify_attn_params *p, cudaStream_t stream, int kernel, int parts_req, int no_pdl,
                  kdt_va_sm90_info *info, int *handled) {
    int dev = 0, major = 0, sms = 0, max_smem = 0;
    KDT_CUDA_CHECK(cudaGetDevice(&dev));
    KDT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major != 9) return KDT_OK;
    KDT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    KDT_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if ((int)kSmemT > max_smem) return KDT_OK; /* the larger of the two kernels */
    Args a;

    if (!make_args(p, &a)) return KDT_OK;
    const long long rows = a.rows;
    const int m_tiles = (int)((rows + kBM - 1) / kBM);
    const long long nt = (a.cap + kBN - 1) / kBN > 0 ? (a.cap + kBN - 1) / kBN : 1;
    int parts = parts_req > 0 ? parts_req : choose_parts(a.B, m_tiles, nt, sms, a.rows);
    if (parts > 65535) parts = 65535;
    if (a.B > 65535) parts = 1; /* the combine grid's y dimension */
    a.parts = parts;
    a.exact_parts = parts_req > 0;

    size_t ws_bytes = 0;
    void *ws = nullptr;
    if (parts > 1) {
        const size_t slot_rows = (size_t)2 * parts * (size_t)rows;
        ws_bytes = slot_rows * (kDv * sizeof(bf16) + sizeof(float));
        cudaMemPool_t pool;
        kdt_status s = workspace_pool(dev, &pool);
        if (s != KDT_OK) return s;
        KDT_CUDA_CHECK(cudaMallocFromPoolAsync(&ws, ws_bytes, pool, stream));
        a.o_part = (bf16 *)ws;
        a.lse_part = (float *)(a.o_part + slot_rows * kDv);
    }

    if (kernel == KDT_VA_SM90_AUTO) kernel = KDT_VA_SM90_TMA;
    if (kernel == KDT_VA_SM90_TMA && !setup_tma(p, &a)) kernel = KDT_VA_SM90_CP_ASYNC;
    int smem = 0, pdl = 0, pdl_combine = 1;
    cudaError_t e = launch_main(a, kernel == KDT_VA_SM90_TMA, m_tiles, no_pdl, stream, &smem, &pdl);
    if (e == cudaSuccess && parts > 1) e = launch_combine(a, no_pdl, stream, &pdl_combine);
    if (ws) {
        const cudaError_t ef = cudaFreeAsync(ws, stream);
        if (e == cudaSuccess) e = ef;
    }
    if (e != cudaSuccess)
        return kdt_fail(KDT_ERR_CUDA, "verify_attn sm90 (%s kernel, %d x %d CTAs): %s", kernel_name(kernel), m_tiles, parts,
                        cudaGetErrorString(e));
    if (info) {
        info->kernel = kernel;
        info->m_tiles = m_tiles;
        info->parts = parts;
        info->grid = m_tiles * parts;
        info->smem_bytes = smem;
        info->workspace_bytes = ws_bytes;
        info->pdl = pdl && pdl_combine;
    }
    *handled = 1;
    return KDT_OK;
}

} // namespace

namespace kdt_va_sm90 {

int make_args(const kdt_verify_attn_params *p, Args *a) {
    const int paged = p->kv_cache != NULL;
    const long long rows = (long long)p->Q * p->H, cap = paged ? (long long)p->MB * p->BS : p->L;
    if (rows > INT_MAX / 2) return 0;
    memset(a, 0, sizeof *a);
    a->q = (const bf16 *)p->q;
    a->kv = (const bf16 *)(paged ? p->kv_cache : p->kv);
    a->block_table = paged ? p->block_table : nullptr;
    a->kv_len = p->kv_len;
    a->tree_mask = p->tree_mask;
    a->o = (bf16 *)p->o;
    a->lse = p->lse;
    a->L = p->L;
    a->NB = p->NB, a->BS = p->BS, a->MB = p->MB;
    a->B = p->B, a->Q = p->Q, a->H = p->H, a->rows = (int)rows;
    a->cap = (int)(cap < INT_MAX ? cap : INT_MAX);
    a->scale_log2 = p->sm_scale * 1.4426950408889634f;
    return 1;
}

/* The TMA kernel's tensor maps; 0 when the call does not fit them (block size not 16, 32 or a
 * multiple of 64, row coordinates past int32, no encoder): the caller runs the cp.async kernel. */
int setup_tma(const kdt_verify_attn_params *p, Args *a) {
    pthread_once(&g_encode_once, find_encode);
    if (!g_encode) return 0;
    const long long lim = INT_MAX - 64; /* a box starting at kv_rows stays in int32 */
    int box = 64;
    long long kv_rows = (long long)p->B * p->L;
    if (p->kv_cache) {
        if (p->BS % 64 != 0 && p->BS != 16 && p->BS != 32) return 0;
        box = p->BS % 64 == 0 ? 64 : p->BS;
        kv_rows = (long long)p->NB * p->BS;
    }
    const long long q_rows = (long long)p->B * p->Q * p->H;
    if (kv_rows < 1 || kv_rows > lim || q_rows > lim) return 0;
    if (!encode_rows(&a->tm_q, p->q, q_rows, 64) || !encode_rows(&a->tm_kv, a->kv, kv_rows, box)) return 0;
    a->kv_rows = (int)kv_rows;
    a->kv_box = box;
    return 1;
}

} // namespace kdt_va_sm90

extern "C" kdt_status kdt_verify_attn_sm90_ex(const kdt_verify_attn_params *p, void *stream, const kdt_va_sm90_config *cfg,
                                              kdt_va_sm90_info *info, int *handled) {
    *handled = 0;
    if (!p || p->dtype != KDT_BF16 || p->Dv != kDv || p->Dr != kDr || p->B < 1 || p->Q < 1 || p->H < 1) return KDT_OK;
    const void *kv = p->kv_cache ? p->kv_cache : p->kv;
    if (!aligned(p->q, 16) || !aligned(kv, 16) || !aligned(p->o, 16) || !aligned(p->lse, 4)) return KDT_OK;
    const int kernel = cfg ? cfg->kernel : KDT_VA_SM90_AUTO;
    if (kernel < KDT_VA_SM90_AUTO || kernel > KDT_VA_SM90_CP_ASYNC)
        return kdt_fail(KDT_ERR_INVALID_ARG, "verify_attn sm90: config kernel %d is not a kdt_va_sm90_kernel (0 .. 2)", kernel);
    if (cfg && cfg->parts < 0) return kdt_fail(KDT_ERR_INVALID_ARG, "verify_attn sm90: parts %d is negative", cfg->parts);
    return launch(p, (cudaStream_t)stream, kernel, cfg ? cfg->parts : 0, cfg ? cfg->no_pdl : 0, info, handled);
}

extern "C" kdt_status kdt_verify_attn_sm90(const kdt_verify_attn_params *p, void *stream, int *handled) {
    *handled = 0;
    if (hook_off()) return KDT_OK;
    return kdt_verify_attn_sm90_ex(p, stream, NULL, NULL, handled);
}
