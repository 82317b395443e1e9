/* verify_attn sm90: compile-time traits (tile sizes, shared-memory layouts) and the kernel
 * arguments, shared by the kernel, the combine kernel, the launcher and dev/cuda's experiments.
 * The design is in verify_attn_sm90_kernel.cu. */
#pragma once

#include <cuda.h> /* CUtensorMap; the encoder is reached through the runtime (no -lcuda) */

#include "common/cuda/cuda_common.cuh"
#include "kdt/ops.h"
#include "cuda/sm90/sm90_ptx.cuh"

namespace kdt_va_sm90 {

using namespace kdt_sm90;

typedef __nv_bfloat16 bf16;

constexpr int kDv = 512, kDr = 64, kDqk = kDv + kDr;
constexpr int kBM = 64;            /* rows per tile */
constexpr int kBN = 64;            /* keys per tile */
constexpr int kThreads = 256;
constexpr int kChunks = kDqk / 8;  /* 16-byte chunks per key row: 72 */
constexpr int kOverhead = 2;       /* a segment's fixed cost (Q load, epilogue) in key tiles */
constexpr int kStride = kDv + 8;   /* output staging row stride in bf16 elements */
constexpr uint32_t kColBlock = kBM * 128;        /* one 64-dim column block of a 64-row tile */
constexpr uint32_t kTileBytes = kBM * kDqk * 2;  /* 73728 */

/* Shared memory, from a 1024-byte aligned base. The key buffers also stage the output. */
constexpr uint32_t kOffQ = 0;
constexpr uint32_t kOffK = kTileBytes;                  /* 2 buffers */
constexpr uint32_t kOffP = 3 * kTileBytes;              /* [64 rows, 64 keys] bf16, swizzled */
constexpr uint32_t kOffScale = kOffP + kBM * 128;       /* float[64]: this tile's row rescale */
constexpr uint32_t kOffM = kOffScale + kBM * 4;         /* float[64]: row max (log2 units) */
constexpr uint32_t kOffL = kOffM + kBM * 4;             /* float[64]: row sum */
constexpr uint32_t kOffSched = kOffL + kBM * 4;         /* long long[8] + long long + int */
constexpr uint32_t kSmemBytes = kOffSched + 128 + 1024; /* + alignment slack */
static_assert(kBM * kStride * 2 <= 2 * kTileBytes, "the output staging must fit the key buffers");

/* The TMA kernel's mbarriers (Q, buffer 0, buffer 1) after the schedule's scratch. */
constexpr uint32_t kOffBarT = kOffSched + 128;
constexpr uint32_t kSmemT = kOffBarT + 3 * 8 + 1024;

struct Args {
    CUtensorMap tm_q;           /* TMA kernel: q as [B * rows, 576]; boxes [64 rows, 64 dims], 128B swizzle */
    CUtensorMap tm_kv;          /* TMA kernel: the cache as [kv_rows, 576]; boxes [kv_box rows, 64 dims] */
    int kv_rows;                /* rows of tm_kv: a box starting here reads zeros */
    int kv_box;                 /* rows per box: 64, or the block size when it is 16 or 32 */
    const bf16 *q;              /* [B, Q, H, 576] */
    const bf16 *kv;             /* paged [NB, BS, 576] or contiguous [B, L, 576] */
    const int32_t *block_table; /* [B, MB]; NULL when contiguous */
    const int32_t *kv_len;      /* [B] */
    const uint8_t *tree_mask;   /* [B, Q, Q] */
    bf16 *o;                    /* [B, Q, H, 512] */
    float *lse;                 /* [B, Q, H] */
    bf16 *o_part;               /* [2 * parts, Q * H, 512] normalized partials of split requests */
    float *lse_part;            /* [2 * parts, Q * H] */
    long long L;                /* contiguous: key rows per request */
    int NB, BS, MB;
    int B, Q, H, rows;          /* rows = Q * H per request */
    int cap;                    /* keys the cache holds per request */
    int parts;                  /* gridDim.y: the most parts; the kernels use part_count's (sched.cuh) */
    int exact_parts;            /* 1: parts is exact (a forced split), 0: scaled to the real kv_len */
    float scale_log2;           /* sm_scale * log2(e) */
};

/* Host side of each kernel file: sets the shared-memory attribute and launches on `stream`, with
 * programmatic dependent launch unless no_pdl (or refused: then a plain launch); *pdl says which.
 * launch_main: the TMA kernel (tma = 1; a.tm_q and a.tm_kv set up) or the cp.async kernel, grid
 * (m_tiles, a.parts); *smem gets its dynamic shared memory. It waits for the kernel before it
 * (griddepcontrol.wait) before it reads or writes global memory, so its launch and prologue overlap
 * that kernel's end. launch_combine: the merge of split requests after it. */
cudaError_t launch_main(const Args &a, int tma, int m_tiles, int no_pdl, cudaStream_t stream, int *smem, int *pdl);
cudaError_t launch_combine(const Args &a, int no_pdl, cudaStream_t stream, int *pdl);

/* kernel(a) on grid x 256 threads with smem bytes of dynamic shared memory, as above. */
template <typename Kernel>
cudaError_t launch_pdl(Kernel kernel, dim3 grid, size_t smem, const Args &a, int no_pdl, cudaStream_t stream, int *pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = no_pdl ? 0 : 1;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, a);
    if (e != cudaSuccess && cfg.numAttrs) { /* programmatic launch refused here: a plain launch */
        (void)cudaGetLastError();
        cfg.numAttrs = 0;
        e = cudaLaunchKernelEx(&cfg, kernel, a);
    }
    *pdl = cfg.numAttrs;
    return e;
}

/* The launcher's (verify_attn_sm90.cu), for dev/cuda's experiments too. make_args: a call's Args
 * with no split (parts 0, no workspace) and no tensor maps; 0 when Q * H is past the kernels'
 * range. setup_tma: the TMA kernel's tensor maps; 0 when the call does not fit them. */
int make_args(const kdt_verify_attn_params *p, Args *a);
int setup_tma(const kdt_verify_attn_params *p, Args *a);

} // namespace kdt_va_sm90
