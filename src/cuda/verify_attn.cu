/* verify_attn CUDA, the general kernel (docs/interfaces.md 2.2): f32 or bf16, contiguous or paged KV, any H
 * and Q, Dv <= 512, Dr as far as shared memory allows; the fallback behind any faster kernel.
 *
 * A (request, tree row, head) triple is a "pair"; pair m = i * H + h, so the heads of one tree
 * row are neighbours. A block owns 32 pairs of one request (8 warps x 4 pairs) and one split of
 * that request's keys. It walks the split in tiles of 32 keys: the tile goes to shared memory
 * once and serves all 32 pairs, so the latent KV is read from device memory once per 32 pairs,
 * not once per head. Per tile, lane j of a warp scores key j against the warp's 4 pairs, the warp
 * updates an online softmax (f32), and then every lane accumulates 4 x Dv/32 output dims from
 * the tile's value rows (the first Dv dims of each key), taking the probabilities by shuffle.
 *
 * Small grids split the keys: each split writes a normalized partial output and its log-sum-exp
 * to a workspace and a second kernel merges the splits by log-sum-exp.
 *
 * Safety without host checks: kv_len is clamped to the cache, a key whose block-table entry is
 * outside [0, NB) is skipped (zero in shared memory, probability 0), and the mask is read only
 * for tree keys, at columns inside [0, Q). */
#include <climits>

#include "common/cuda/cuda_common.cuh"
#include "cuda/sm90/verify_attn_sm90.h"
#include "ops/backends.h"

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kPairsPerWarp = 4;
constexpr int kPairs = kWarps * kPairsPerWarp; /* pairs sharing each key tile */
constexpr int kTileKeys = 32;                  /* one key per lane when scoring */
constexpr int kMaxDv = 512;                    /* 16 output dims per lane */
constexpr int kMinSplitKeys = 256;             /* a split shorter than this costs more than it gains */
constexpr int kMaxSplits = 64;

struct Args {
    const void *q;                 /* [B, Q, H, Dqk] */
    const void *kv;                /* [B, L, Dqk], or NULL when paged */
    const void *kv_cache;          /* [NB, BS, Dqk], or NULL when contiguous */
    const int32_t *block_table;    /* [B, MB] */
    const int32_t *kv_len;         /* [B] */
    const uint8_t *tree_mask;      /* [B, Q, Q] */
    void *o;                       /* [B, Q, H, Dv] when splits == 1 */
    float *lse;                    /* [B, Q, H] when splits == 1 */
    float *part_o;                 /* [splits, B * Q * H, Dv] when splits > 1 */
    float *part_lse;               /* [splits, B * Q * H] when splits > 1 */
    long long L;
    int NB, BS, MB;
    int B, Q, H, Dv, Dqk;
    int cap;                       /* keys the cache holds per request, clamped to INT_MAX */
    int qstride;                   /* Dqk rounded up to 16 bytes: elements per q row in shared memory */
    int kstride;                   /* qstride + one word: elements per key row in shared memory */
    int groups;                    /* blocks per request and split: ceil(Q * H / kPairs) */
    int split_keys, splits;        /* split s covers keys [s * split_keys, (s + 1) * split_keys) */
    float sm_scale;
};

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/* Dims per 16-byte chunk: the score loop's step. q rows and key rows are zero-padded to a
 * multiple of it in shared memory. */
template <typename T> constexpr int vec_dims() { return 16 / (int)sizeof(T); }

/* 16 bytes at p (16-byte aligned) as floats: a broadcast load of 4 (f32) or 8 (bf16) q dims. */
__device__ __forceinline__ void load16(const float *p, float (&f)[4]) {
    const float4 v = *(const float4 *)p;
    f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
}
__device__ __forceinline__ void load16(const __nv_bfloat16 *p, float (&f)[8]) {
    const uint4 v = *(const uint4 *)p;
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = __bfloat1622float2(*(const __nv_bfloat162 *)&w[i]);
        f[2 * i] = t.x, f[2 * i + 1] = t.y;
    }
}
/* The same dims of a key row, which is only 4-byte aligned (odd word stride): word loads. */
__device__ __forceinline__ void load_words(const float *p, float (&f)[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) f[i] = p[i];
}
__device__ __forceinline__ void load_words(const __nv_bfloat16 *p, float (&f)[8]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = __bfloat1622float2(((const __nv_bfloat162 *)p)[i]);
        f[2 * i] = t.x, f[2 * i + 1] = t.y;
    }
}

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* Key j (< kv_len) of request b: [Dqk], or NULL when its block-table entry is out of range. */
template <typename T>
__device__ __forceinline__ const T *key_row(const Args &a, int b, int j) {
    if (a.kv) return (const T *)a.kv + ((long long)b * a.L + j) * a.Dqk;
    const int blk = a.block_table[(long long)b * a.MB + j / a.BS];
    if (blk < 0 || blk >= a.NB) return nullptr;
    return (const T *)a.kv_cache + ((long long)blk * a.BS + j % a.BS) * a.Dqk;
}

/* Shared memory: key_ok [kTileKeys] ints, q [kPairs, qstride], the key tile [kTileKeys, kstride]. */
template <typename T>
size_t smem_bytes(int qstride, int kstride) {
    return kTileKeys * sizeof(int) + ((size_t)kPairs * qstride + (size_t)kTileKeys * kstride) * sizeof(T);
}

/* Copies keys t0 .. t0 + 31 (those below key_end) into the tile, zeros elsewhere; warp w copies
 * rows w, w + 8, ...; each lane keeps kRows x kBatch loads in flight before storing. */
template <typename T>
__device__ __forceinline__ void load_tile(const Args &a, int b, int t0, int key_end, T *sk, int *key_ok) {
    constexpr int kRows = kTileKeys / kWarps, kBatch = 2;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const T *src[kRows];
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        const int kr = warp + kWarps * r, j = t0 + kr;
        src[r] = j < key_end ? key_row<T>(a, b, j) : nullptr;
        if (lane == 0) key_ok[kr] = src[r] != nullptr;
    }
    for (int c0 = 0; c0 < a.qstride; c0 += 32 * kBatch) {
        T v[kRows][kBatch];
#pragma unroll
        for (int r = 0; r < kRows; r++)
#pragma unroll
            for (int u = 0; u < kBatch; u++) {
                const int d = c0 + 32 * u + lane;
                v[r][u] = src[r] && d < a.Dqk ? src[r][d] : from_f32<T>(0.f);
            }
#pragma unroll
        for (int r = 0; r < kRows; r++)
#pragma unroll
            for (int u = 0; u < kBatch; u++) {
                const int d = c0 + 32 * u + lane;
                if (d < a.qstride) sk[(warp + kWarps * r) * a.kstride + d] = v[r][u];
            }
    }
}

/* f32 tiles at Dv 512 fill shared memory with one block per SM; the others fit two or more, so
 * their registers are capped for two. */
template <typename T, int kDvPerLane>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 2 || kDvPerLane <= 4 ? 2 : 1) verify_attn_kernel(const Args a) {
    constexpr int kVec = vec_dims<T>();
    extern __shared__ __align__(16) unsigned char smem[];
    int *key_ok = (int *)smem;
    T *sq = (T *)(smem + kTileKeys * sizeof(int)); /* 16-byte aligned rows */
    T *sk = sq + kPairs * a.qstride;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.x / a.groups, pair0 = (blockIdx.x % a.groups) * kPairs, split = blockIdx.y;
    const int pairs = a.Q * a.H; /* per request */
    const int n = min(max(a.kv_len[b], 0), a.cap);
    const int prefix = n - a.Q; /* key prefix + i is tree node i */
    const int key_begin = (int)min((long long)split * a.split_keys, (long long)n);
    const int key_end = (int)min((long long)key_begin + a.split_keys, (long long)n);

    for (int e = threadIdx.x; e < kPairs * a.qstride; e += kThreads) {
        const int m = pair0 + e / a.qstride, d = e % a.qstride;
        sq[e] = m < pairs && d < a.Dqk ? ((const T *)a.q)[((long long)b * pairs + m) * a.Dqk + d] : from_f32<T>(0.f);
    }

    int row[kPairsPerWarp];
    bool active[kPairsPerWarp];
    float m_run[kPairsPerWarp], l_run[kPairsPerWarp], acc[kPairsPerWarp][kDvPerLane];
#pragma unroll
    for (int r = 0; r < kPairsPerWarp; r++) {
        const int m = pair0 + warp * kPairsPerWarp + r;
        active[r] = m < pairs;
        row[r] = active[r] ? m / a.H : 0;
        m_run[r] = -INFINITY;
        l_run[r] = 0.f;
#pragma unroll
        for (int k = 0; k < kDvPerLane; k++) acc[r][k] = 0.f;
    }
    const T *my_q = sq + warp * kPairsPerWarp * a.qstride;

    for (int t0 = key_begin; t0 < key_end; t0 += kTileKeys) {
        __syncthreads(); /* q is in place; the previous tile is no longer read */
        load_tile<T>(a, b, t0, key_end, sk, key_ok);
        __syncthreads();

        /* Scores: lane = key, 4 pairs per lane, 16 bytes of dims per step. */
        const T *k_row = sk + lane * a.kstride;
        float s[kPairsPerWarp] = {};
        for (int d0 = 0; d0 < a.qstride; d0 += kVec) {
            float kf[kVec];
            load_words(k_row + d0, kf);
#pragma unroll
            for (int r = 0; r < kPairsPerWarp; r++) {
                float qf[kVec];
                load16(my_q + r * a.qstride + d0, qf);
#pragma unroll
                for (int v = 0; v < kVec; v++) s[r] = fmaf(qf[v], kf[v], s[r]);
            }
        }
        const int j = t0 + lane;
        const bool ok = key_ok[lane] != 0; /* false past key_end and for a bad block */
        float p[kPairsPerWarp];
#pragma unroll
        for (int r = 0; r < kPairsPerWarp; r++) {
            const bool seen = active[r] && ok &&
                              (j < prefix || a.tree_mask[((long long)b * a.Q + row[r]) * a.Q + (j - prefix)] != 0);
            const float sc = seen ? s[r] * a.sm_scale : -INFINITY;
            const float m_new = fmaxf(m_run[r], warp_max(sc));
            p[r] = m_new == -INFINITY ? 0.f : expf(sc - m_new);
            const float corr = m_run[r] == -INFINITY ? 0.f : expf(m_run[r] - m_new);
            l_run[r] = l_run[r] * corr + warp_sum(p[r]);
            m_run[r] = m_new;
#pragma unroll
            for (int k = 0; k < kDvPerLane; k++) acc[r][k] *= corr;
        }

        /* Values: lane owns dims lane + 32 k; the probability of key jj comes from lane jj. */
        for (int jj = 0; jj < kTileKeys; jj++) {
            float pj[kPairsPerWarp];
#pragma unroll
            for (int r = 0; r < kPairsPerWarp; r++) pj[r] = __shfl_sync(0xffffffffu, p[r], jj);
            const T *v_row = sk + jj * a.kstride;
#pragma unroll
            for (int k = 0; k < kDvPerLane; k++) {
                const int d = lane + 32 * k;
                if (d < a.Dv) {
                    const float v = to_f32(v_row[d]);
#pragma unroll
                    for (int r = 0; r < kPairsPerWarp; r++) acc[r][k] = fmaf(pj[r], v, acc[r][k]);
                }
            }
        }
    }

    const long long all_pairs = (long long)a.B * pairs;
#pragma unroll
    for (int r = 0; r < kPairsPerWarp; r++) {
        if (!active[r]) continue;
        const long long pair = (long long)b * pairs + pair0 + warp * kPairsPerWarp + r;
        const float inv = l_run[r] > 0.f ? 1.f / l_run[r] : 0.f; /* a pair that sees no key: o = 0 */
        const float lse = l_run[r] > 0.f ? m_run[r] + logf(l_run[r]) : -INFINITY;
        if (a.splits == 1) {
            T *o = (T *)a.o + pair * a.Dv;
#pragma unroll
            for (int k = 0; k < kDvPerLane; k++)
                if (lane + 32 * k < a.Dv) o[lane + 32 * k] = from_f32<T>(acc[r][k] * inv);
            if (lane == 0) a.lse[pair] = lse;
        } else {
            const long long slot = split * all_pairs + pair;
            float *o = a.part_o + slot * a.Dv;
#pragma unroll
            for (int k = 0; k < kDvPerLane; k++)
                if (lane + 32 * k < a.Dv) o[lane + 32 * k] = acc[r][k] * inv;
            if (lane == 0) a.part_lse[slot] = lse;
        }
    }
}

/* Merges the splits of one pair per block: weights exp(lse_s - lse) over normalized partials. */
template <typename T>
__global__ void __launch_bounds__(128) verify_attn_combine(const float *part_o, const float *part_lse, int splits,
                                                           long long all_pairs, int Dv, T *o, float *lse) {
    __shared__ float w[kMaxSplits];
    const long long pair = blockIdx.x;
    float mx = -INFINITY;
    for (int s = 0; s < splits; s++) mx = fmaxf(mx, part_lse[s * all_pairs + pair]);
    float sum = 0.f;
    if (mx != -INFINITY)
        for (int s = 0; s < splits; s++) sum += expf(part_lse[s * all_pairs + pair] - mx);
    const float total = mx == -INFINITY ? -INFINITY : mx + logf(sum);
    for (int s = threadIdx.x; s < splits; s += blockDim.x)
        w[s] = total == -INFINITY ? 0.f : expf(part_lse[s * all_pairs + pair] - total);
    __syncthreads();
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        float v = 0.f;
        for (int s = 0; s < splits; s++) v = fmaf(w[s], part_o[(s * all_pairs + pair) * Dv + d], v);
        o[pair * Dv + d] = from_f32<T>(v);
    }
    if (threadIdx.x == 0) lse[pair] = total;
}

/* Splits so that the grid fills the device about once, each split at least kMinSplitKeys long. */
long long lmin(long long x, long long y) { return x < y ? x : y; }

void choose_splits(Args &a, long long blocks, long long resident) {
    const long long keys = a.cap > 0 ? a.cap : 1;
    long long splits = blocks < resident ? (resident + blocks - 1) / blocks : 1;
    splits = lmin(lmin(splits, kMaxSplits), keys / kMinSplitKeys);
    if (splits < 1) splits = 1;
    const long long split_keys = ((keys + splits - 1) / splits + kTileKeys - 1) / kTileKeys * kTileKeys;
    a.split_keys = (int)lmin(split_keys, INT_MAX);
    a.splits = (int)((keys + a.split_keys - 1) / a.split_keys);
}

template <typename T, int kDvPerLane>
kdt_status launch_splits(const Args &a, long long blocks, size_t smem, cudaStream_t stream) {
    verify_attn_kernel<T, kDvPerLane><<<dim3((unsigned)blocks, (unsigned)a.splits), kThreads, smem, stream>>>(a);
    KDT_CUDA_CHECK_LAUNCH("verify_attn_kernel");
    if (a.splits > 1) {
        const long long all_pairs = (long long)a.B * a.Q * a.H;
        verify_attn_combine<T><<<(unsigned)all_pairs, 128, 0, stream>>>(a.part_o, a.part_lse, a.splits, all_pairs, a.Dv,
                                                                        (T *)a.o, a.lse);
        KDT_CUDA_CHECK_LAUNCH("verify_attn_combine");
    }
    return KDT_OK;
}

template <typename T, int kDvPerLane>
kdt_status launch(const kdt_verify_attn_params *p, cudaStream_t stream) {
    Args a = {};
    a.q = p->q;
    a.kv = p->kv;
    a.kv_cache = p->kv_cache;
    a.block_table = p->block_table;
    a.kv_len = p->kv_len;
    a.tree_mask = p->tree_mask;
    a.o = p->o;
    a.lse = p->lse;
    a.L = p->L;
    a.NB = p->NB, a.BS = p->BS, a.MB = p->MB;
    a.B = p->B, a.Q = p->Q, a.H = p->H, a.Dv = p->Dv, a.Dqk = p->Dv + p->Dr;
    a.sm_scale = p->sm_scale;
    const long long cap = p->kv ? p->L : (long long)p->MB * p->BS;
    a.cap = (int)lmin(cap, INT_MAX);
    a.qstride = (a.Dqk + vec_dims<T>() - 1) / vec_dims<T>() * vec_dims<T>();
    /* One word more than qstride: an odd word stride, so the 32 lanes reading the same dims of 32
     * keys hit 32 banks. */
    a.kstride = a.qstride + 4 / (int)sizeof(T);
    a.groups = (a.Q * a.H + kPairs - 1) / kPairs;
    const long long blocks = (long long)a.groups * p->B, all_pairs = (long long)p->B * a.Q * a.H;
    if (all_pairs > INT_MAX)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "verify_attn cuda: B * Q * H = %lld is above %d", all_pairs, INT_MAX);

    auto kernel = verify_attn_kernel<T, kDvPerLane>;
    const size_t smem = smem_bytes<T>(a.qstride, a.kstride);
    int dev = 0, max_smem = 0, sms = 0, per_sm = 0;
    KDT_CUDA_CHECK(cudaGetDevice(&dev));
    KDT_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    KDT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (smem > (size_t)max_smem)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "verify_attn cuda: Dqk = %d needs %zu bytes of shared memory, the device has %d",
                        a.Dqk, smem, max_smem);
    if (smem > 48 * 1024) KDT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    KDT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    choose_splits(a, blocks, (long long)sms * (per_sm > 0 ? per_sm : 1));

    void *ws = nullptr;
    if (a.splits > 1) {
        const size_t n = (size_t)a.splits * (size_t)all_pairs;
        KDT_CUDA_CHECK(cudaMallocAsync(&ws, n * ((size_t)a.Dv + 1) * sizeof(float), stream));
        a.part_o = (float *)ws;
        a.part_lse = a.part_o + n * (size_t)a.Dv;
    }
    kdt_status st = launch_splits<T, kDvPerLane>(a, blocks, smem, stream);
    if (ws) {
        const cudaError_t e = cudaFreeAsync(ws, stream);
        if (st == KDT_OK && e != cudaSuccess)
            st = kdt_fail(KDT_ERR_CUDA, "verify_attn cuda: cudaFreeAsync: %s", cudaGetErrorString(e));
    }
    return st;
}

template <typename T>
kdt_status launch_dtype(const kdt_verify_attn_params *p, cudaStream_t stream) {
    return p->Dv <= 128 ? launch<T, 4>(p, stream) : launch<T, kMaxDv / 32>(p, stream);
}

} // namespace

/* The CUDA dispatch point: a kernel for a narrower case (sm_90a, bf16, Dv 512 / Dr 64)
 * goes first, here; the general kernel of this file takes every call it leaves. */
extern "C" kdt_status kdt_verify_attn_cuda(const kdt_verify_attn_params *p, void *stream) {
    int handled = 0;
    kdt_status st = kdt_verify_attn_sm90(p, stream, &handled);
    if (st != KDT_OK || handled) return st;
    if (p->Dv > kMaxDv)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "verify_attn cuda: Dv = %d, the general kernel takes at most %d", p->Dv, kMaxDv);
    cudaStream_t s = (cudaStream_t)stream;
    return p->dtype == KDT_BF16 ? launch_dtype<__nv_bfloat16>(p, s) : launch_dtype<float>(p, s);
}
