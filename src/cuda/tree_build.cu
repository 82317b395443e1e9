/* tree_build CUDA (SPEC 2.1): one block of 4 warps per request; one launch writes every output.
 *
 * Selection (one warp): rows are sorted, so under each selected node only its best unselected
 * child can be next; that child is the node's "slot". Popping slot p = candidate (p, depth t, k)
 * makes node n, moves slot p to (p, t, k + 1) and opens slot n at (n, t + 1, first k). Slot i
 * lives in lane i % 32, register i / 32, as a 64-bit key whose unsigned order is the SPEC's
 * order. A step is two warp reductions (redux.sync: max of the high words, then min of the
 * tie-break words among the lanes holding that max), one shared-memory load for the new slot
 * and O(N / 32) register work per lane (docs/perf/tree_build.md).
 * Meanwhile the other three warps zero this request's tree_mask and stage its tokens; after a
 * barrier all four write the node outputs and the mask's ones (each row's ancestors).
 *
 * Bit-exact with the CPU: sums are the same single f32 additions (parent score + scores[b][d][k],
 * no FMA possible), and the key orders finite scores exactly as float comparison does. -0.0
 * never occurs: the root is +0.0 and an f32 sum is -0.0 only when both terms are.
 * Any scores are safe: every index is bounded by D, K and N whatever the values; unsorted rows
 * (refused by the adapter) only give a different tree. */
#include <stdint.h>

#include "cuda/cuda_common.cuh"
#include "ops/backends.h"

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr unsigned kFull = 0xffffffffu;

/* A candidate's key: its unsigned order is the SPEC's order; 0 = no candidate.
 *   high word: the score's bits mapped so that unsigned order is float order (finite scores);
 *   low word:  ~tie with tie = depth << 17 | parent << 6 | k: lower depth, then lower parent,
 *              win. k never decides (one candidate per parent is pending); it rides along. */
__device__ __forceinline__ uint32_t score_order(float f) {
    const uint32_t u = __float_as_uint(f);
    const uint32_t o = u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u); /* ~u if negative */
    return isfinite(f) ? o : 0; /* -inf, NaN and an overflowed +inf are never selected */
}

__device__ __forceinline__ uint32_t score_bits_from_order(uint32_t h) {
    return h ^ ((uint32_t)((int32_t)~h >> 31) | 0x80000000u);
}

__device__ __forceinline__ float score_from_order(uint32_t h) { return __uint_as_float(score_bits_from_order(h)); }

__device__ __forceinline__ uint64_t make_key(uint32_t order, uint32_t tie) {
    return order ? (uint64_t)order << 32 | ~tie : 0;
}

__device__ __forceinline__ uint32_t make_tie(int depth, int parent, int k) {
    return (uint32_t)depth << 17 | (uint32_t)parent << 6 | (uint32_t)k;
}

/* The best child of a node of score s, on its sorted row [K]: sums are non-increasing along the
 * row, so the first that is not +inf (a +inf score or an overflowing sum) is the best. Returns
 * its k; *order and *next get its score order and the following candidate's. */
__device__ __forceinline__ int row_head(float s, const float *row, int K, uint32_t *order, uint32_t *next) {
    int k = 0;
    float c = s + row[0];
    while (c == INFINITY && k + 1 < K) c = s + row[++k];
    *order = score_order(c);
    *next = k + 1 < K ? score_order(s + row[k + 1]) : 0;
    return k;
}

/* Node i's record, one 16-byte word: x = its tie word (depth, parent, cand), y = its score's
 * bits; z, w = its slot's state: the score order of the candidate after the slot's current one
 * (0 none) and its last child so far (-1 none). During selection a record is touched only by
 * lane i % 32, the owner of slot i. */

/* Runs on one whole warp; returns the number of draft nodes. R = slots per lane >= ceil(N / 32).
 * sc has D + 1 rows, the last a pad, so that a leaf's row index is valid. A step: two warp
 * reductions pick the best key; every lane scores the new node's best child (one shared-memory
 * load); the popped slot's owner moves it to its next candidate, whose score was worked out
 * one pop ahead, and scores the one after; each lane takes the max of its R slots.
 * Apart from the reductions, each lane reads the read-only scores, its registers and the
 * records of its own slots; fc and ns are written once each and read after the barrier. */
template <int R>
__device__ int select_nodes(const float *sc, int D, int K, int N, int lane, uint4 *rec, short *fc, short *ns) {
    uint64_t key[R]; /* slot lane + 32 j: its candidate's key, 0 when none is left */
#pragma unroll
    for (int j = 0; j < R; j++) key[j] = 0;
    if (lane == 0) {
        uint32_t order, next;
        const int k0 = row_head(0.0f, sc, K, &order, &next);
        key[0] = make_key(order, make_tie(1, 0, k0));
        rec[0] = make_uint4(0, __float_as_uint(0.0f), next, ~0u);
    }
    uint64_t best = key[0]; /* the best of this lane's slots */
    int n = 0;
    while (n < N) {
        const uint32_t hi = (uint32_t)(best >> 32), tie = ~(uint32_t)best;
        const uint32_t HI = __reduce_max_sync(kFull, hi);
        if (HI == 0) break; /* no finite candidate left */
        const uint32_t LO = __reduce_min_sync(kFull, hi == HI ? tie : ~0u);
        const int t = (int)(LO >> 17), p = (int)(LO >> 6) & 2047, k = (int)(LO & 63);
        ++n;
        const bool own_p = lane == (p & 31), own_n = lane == (n & 31);
        const float s = score_from_order(HI);

        /* Node n's slot: its best child, on row t (every lane, the same values). */
        const float *crow = sc + t * K;
        const float c0 = s + crow[0];
        uint32_t c_order = score_order(c0), c_next = score_order(s + crow[K > 1 ? 1 : 0]) & (K > 1 ? ~0u : 0u);
        int c_k = 0;
        if (c0 == INFINITY) c_k = row_head(s, crow, K, &c_order, &c_next); /* a +inf head: rare */
        const uint64_t child = make_key(t < D && n < N ? c_order : 0, make_tie(t + 1, n, c_k));

        /* Slot p moves to (p, t, k + 1), scored one pop ahead. */
        uint4 r = make_uint4(0, 0, 0, ~0u);
        if (own_p) r = rec[p];
        const float v_after = sc[min((t - 1) * K + k + 2, D * K - 1)]; /* loaded early, used below */
        const uint64_t moved = make_key(r.z, LO + 1);
        const int jp = own_p ? p >> 5 : -1, jn = own_n ? n >> 5 : -1;
        best = 0;
#pragma unroll
        for (int j = 0; j < R; j++) { /* register arrays stay in registers only if never indexed */
            key[j] = j == jp ? moved : j == jn ? child : key[j];
            best = key[j] > best ? key[j] : best;
        }

        /* The candidate after slot p's new one, the children lists, node n's record. */
        if (own_p) {
            const float after = __uint_as_float(r.y) + v_after;
            *(uint2 *)&rec[p].z = make_uint2(r.z && k + 2 < K ? score_order(after) : 0, n);
            ((int)r.w < 0 ? fc[p] : ns[r.w]) = (short)n;
        }
        if (own_n) rec[n] = make_uint4(LO, __float_as_uint(s), c_next, ~0u);
    }
    return n;
}

/* Zeroes len bytes at dst with 16-byte stores where aligned; thread i of `stride` threads. */
__device__ void zero_bytes(uint8_t *dst, size_t len, int i, int stride) {
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > len) head = len;
    const size_t body = (len - head) / 16;
    for (size_t j = i; j < head; j += stride) dst[j] = 0;
    uint4 *v = (uint4 *)(dst + head);
    for (size_t j = i; j < body; j += stride) v[j] = make_uint4(0, 0, 0, 0);
    for (size_t j = head + body * 16 + i; j < len; j += stride) dst[j] = 0;
}

/* Grid: one block per request. Dynamic shared memory, 20 Q + 4 (2 D + 1) K bytes: rec [Q],
 * scores [D + 1, K] (a zero pad row), tokens [D, K], first child and next sibling [Q]. At most
 * 53524 bytes (N = 1024, D = K = 64). */
template <int R>
__global__ void __launch_bounds__(kThreads) tree_build_kernel(kdt_tree_build_params p) {
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int n_nodes;
    const int b = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int D = p.D, K = p.K, N = p.budget, Q = N + 1;
    uint4 *rec = (uint4 *)smem;                  /* [Q] node records (select_nodes) */
    float *sc = (float *)(rec + Q);              /* [D + 1, K] this request's scores, a pad row */
    int32_t *tk = (int32_t *)(sc + (D + 1) * K); /* [D, K] its tokens */
    short *fc = (short *)(tk + D * K);           /* [Q] first child */
    short *ns = fc + Q;                          /* [Q] next sibling */

    const size_t bdk = (size_t)b * D * K;
    const int32_t seq = p.seq_len[b], root = p.root_token[b]; /* used at the end */
    for (int i = tid; i < (D + 1) * K; i += kThreads) sc[i] = i < D * K ? p.scores[bdk + i] : 0.0f;
    for (int i = tid; i < Q; i += kThreads) fc[i] = ns[i] = -1;
    __syncthreads();

    /* Rotating the selecting warp spreads it over the SM's schedulers when blocks share an SM. */
    const int sel = b & (kWarps - 1);
    uint8_t *mask = p.tree_mask + (size_t)b * Q * Q; /* [Q, Q] */
    if (warp == sel) {
        const int n = select_nodes<R>(sc, D, K, N, lane, rec, fc, ns);
        if (lane == 0) n_nodes = n;
    } else {
        const int h = tid - (warp > sel ? 32 : 0); /* 0 .. 95 among the helper warps */
        zero_bytes(mask, (size_t)Q * Q, h, kThreads - 32);
        for (int i = h; i < D * K; i += kThreads - 32) tk[i] = p.tokens[bdk + i];
    }
    __syncthreads(); /* orders the zeroes before the ones below */

    const int n = n_nodes;
    const size_t o = (size_t)b * Q;
    for (int i = tid; i < Q; i += kThreads) {
        int32_t tok = root, par = -1, dep = 0, cand = -1, pos = seq, f = fc[i], s = -1;
        float score = 0.0f;
        if (i > n) {
            tok = dep = pos = f = -1;
            score = -INFINITY;
        } else if (i > 0) {
            const uint4 r = rec[i];
            par = (int)(r.x >> 6) & 2047;
            dep = (int)(r.x >> 17);
            cand = (int)(r.x & 63);
            score = __uint_as_float(r.y);
            tok = tk[(dep - 1) * K + cand];
            pos = (int32_t)((uint32_t)seq + (uint32_t)dep); /* wraps, never UB, on a bad seq_len */
            s = ns[i];
        }
        p.node_token[o + i] = tok;
        p.node_parent[o + i] = par;
        p.node_depth[o + i] = dep;
        p.node_cand[o + i] = cand;
        p.node_score[o + i] = score;
        p.positions[o + i] = pos;
        p.first_child[o + i] = f;
        p.next_sibling[o + i] = s;
        if (i <= n) /* ones at i and its ancestors; parents come before children */
            for (int j = i; j > 0; j = (int)(rec[j].x >> 6) & 2047) mask[(size_t)i * Q + j] = 1;
        if (i <= n) mask[(size_t)i * Q] = 1;
    }
    if (tid == 0) p.num_nodes[b] = n;
}

template <int R>
kdt_status launch(const kdt_tree_build_params *p, cudaStream_t stream) {
    const size_t smem = (size_t)20 * (p->budget + 1) + (size_t)4 * (2 * p->D + 1) * p->K;
    if (smem > 48 * 1024) /* only the largest shapes; the default limit is 48 KB */
        KDT_CUDA_CHECK(cudaFuncSetAttribute(tree_build_kernel<R>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    tree_build_kernel<R><<<p->B, kThreads, smem, stream>>>(*p);
    KDT_CUDA_CHECK_LAUNCH("tree_build");
    return KDT_OK;
}

} // namespace

extern "C" kdt_status kdt_tree_build_cuda(const kdt_tree_build_params *p, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    const int N = p->budget;
    if (N <= 32) return launch<1>(p, s);
    if (N <= 64) return launch<2>(p, s);
    if (N <= 128) return launch<4>(p, s);
    if (N <= 256) return launch<8>(p, s);
    if (N <= 512) return launch<16>(p, s);
    return launch<32>(p, s);
}
