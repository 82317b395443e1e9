/* kv_commit CUDA (docs/interfaces.md 2.5). One block per request: the block checks the request, works
 * out every move's source and destination cache row, then copies the path's rows in order, a
 * chunk of rows at a time: the whole chunk is read into registers before any of it is written.
 * That is enough for overlapping moves: move t's destination (slot base + t) can be the source
 * of an earlier move (base + i_t' with t' < t), which is read before t writes it (same chunk:
 * the barrier between the reads and the writes; earlier chunk: the barrier that ends it), but
 * never the source of a later move, since i_t'' >= t'' > t. */
#include "common/cuda/cuda_common.cuh"
#include "ops/backends.h"

namespace {

constexpr int kThreads = 256, kVecsPerThread = 4;
constexpr unsigned kChunk = kThreads * kVecsPerThread; /* vectors the block holds at once */
constexpr int kMaxMoves = KDT_TREE_MAX_BUDGET;         /* accept_len <= Q - 1 <= 1024 */

/* Status codes, checked in this order (the CPU reference and the numpy generator agree). */
constexpr int kBadAcceptLen = 1, kBadKvLen = 2, kBadPath = 3, kBadBlock = 4;

/* Cache row of the request's slot j (j / BS < MB), or -1 if its block is out of [0, NB). */
__device__ long long slot_row(const int32_t *table, long long j, int BS, int NB) {
    const int blk = __ldg(table + j / BS);
    return blk < 0 || blk >= NB ? -1 : (long long)blk * BS + j % BS;
}

/* V: the widest of uint4 / unsigned / unsigned short that divides a row and its alignment. */
template <typename V>
__global__ void __launch_bounds__(kThreads) kv_commit_kernel(kdt_kv_commit_params p, unsigned row_vecs) {
    __shared__ long long s_src[kMaxMoves], s_dst[kMaxMoves]; /* move t at [t - 1]; s_src -1: nothing to move */
    const int b = blockIdx.x, tid = threadIdx.x, Q = p.Q;
    const int len = __ldg(p.accept_len + b), kv_len = __ldg(p.kv_len + b);
    const int32_t *path = p.accept_index + (size_t)b * Q, *table = p.block_table + (size_t)b * p.MB;
    const int scalar_status = len < 0 || len > Q - 1                                    ? kBadAcceptLen
                              : kv_len < Q || (long long)kv_len > (long long)p.MB * p.BS ? kBadKvLen
                                                                                          : 0;
    const long long base = (long long)kv_len - Q;
    int bad_path = 0, bad_block = 0;
    for (int t = tid; t < Q; t += kThreads) {
        /* loaded before the scalars are known (always in range), so both share a round trip */
        const int it = __ldg(path + t), prev = t ? __ldg(path + t - 1) : -1;
        if (scalar_status || t > len) break;
        if (t == 0) {
            bad_path |= it != 0;
            continue;
        }
        /* it >= t holds on a good path; testing it here keeps the table reads in range */
        if (it <= prev || it < t || it > Q - 1) {
            bad_path = 1;
            continue;
        }
        long long src = -1, dst = -1;
        if (it != t) {
            src = slot_row(table, base + it, p.BS, p.NB);
            dst = slot_row(table, base + t, p.BS, p.NB);
            if (src < 0 || dst < 0) bad_block = 1;
        }
        s_src[t - 1] = src;
        s_dst[t - 1] = dst;
    }
    bad_path = __syncthreads_or(bad_path);
    bad_block = __syncthreads_or(bad_block);
    const int status = scalar_status ? scalar_status : bad_path ? kBadPath : bad_block ? kBadBlock : 0;
    if (tid == 0) {
        p.status[b] = status;
        p.new_kv_len[b] = status ? kv_len : kv_len - Q + len + 1;
    }
    if (status) return;

    V *cache = (V *)p.kv_cache;
    const int rows = row_vecs >= kChunk ? 1 : (int)(kChunk / row_vecs); /* rows per chunk */
    for (int t0 = 1; t0 <= len; t0 += rows) {
        const unsigned n_el = (unsigned)min(rows, len + 1 - t0) * row_vecs;
        for (unsigned e0 = 0; e0 < n_el; e0 += kChunk) { /* more than one pass only when rows == 1 */
            V v[kVecsPerThread];
#pragma unroll
            for (int k = 0; k < kVecsPerThread; k++) {
                const unsigned e = e0 + tid + k * kThreads;
                if (e >= n_el) continue;
                const long long src = s_src[t0 - 1 + e / row_vecs];
                if (src >= 0) v[k] = cache[src * row_vecs + e % row_vecs];
            }
            if (rows > 1) __syncthreads(); /* a row of this chunk may overwrite an earlier row's source */
#pragma unroll
            for (int k = 0; k < kVecsPerThread; k++) {
                const unsigned e = e0 + tid + k * kThreads;
                if (e >= n_el) continue;
                const int m = t0 - 1 + (int)(e / row_vecs);
                if (s_src[m] >= 0) cache[s_dst[m] * row_vecs + e % row_vecs] = v[k];
            }
        }
        __syncthreads(); /* the next chunk may overwrite this chunk's sources */
    }
}

} // namespace

extern "C" kdt_status kdt_kv_commit_cuda(const kdt_kv_commit_params *p, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    const size_t row_bytes = (size_t)p->Dqk * kdt_dtype_size(p->dtype);
    const uintptr_t addr = (uintptr_t)p->kv_cache;
    if (addr % kdt_dtype_size(p->dtype))
        return kdt_fail(KDT_ERR_INVALID_ARG, "kv_commit: kv_cache is not aligned to its dtype");
    if (row_bytes % 16 == 0 && addr % 16 == 0)
        kv_commit_kernel<uint4><<<p->B, kThreads, 0, s>>>(*p, (unsigned)(row_bytes / 16));
    else if (row_bytes % 4 == 0 && addr % 4 == 0)
        kv_commit_kernel<unsigned><<<p->B, kThreads, 0, s>>>(*p, (unsigned)(row_bytes / 4));
    else
        kv_commit_kernel<unsigned short><<<p->B, kThreads, 0, s>>>(*p, (unsigned)(row_bytes / 2));
    KDT_CUDA_CHECK_LAUNCH("kv_commit");
    return KDT_OK;
}
