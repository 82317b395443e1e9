/* tree_build CUDA (SPEC 2.1): one block of 4 warps per request; one launch writes every output.
 *
 * Selection (one warp): rows are sorted, so under each selected node only its best unselected
 * child can be next; that child is the node's "slot". Popping slot p = candidate (p, depth t, k)
 * makes node n, moves slot p to (p, t, k + 1) and opens slot n at (n, t + 1, first k). Slot i
 * lives in lane i % 32, register i / 32, as a 64-bit key whose unsigned order is the SPEC's
 * order. A step is: two warp reductions (redux.sync: max of the high words, then min of the
 * tie-break words among the lanes holding that max); three shuffles from the winning lane,
 * which worked out under the first reduction the slot its candidate opens; O(N / 32) register
 * work. No memory access is on a step's critical path (docs/perf/tree_build.md).
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
 *   low word:  ~(depth << 17 | parent << 6 | k): lower depth, then lower parent, win. k never
 *              decides (one candidate per parent is pending); it rides along for the decode. */
__device__ __forceinline__ uint32_t score_order(float f) {
    if (!isfinite(f)) return 0; /* -inf, NaN and an overflowed +inf are never selected */
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float score_from_order(uint32_t h) {
    return __uint_as_float((h & 0x80000000u) ? (h & 0x7fffffffu) : ~h);
}

__device__ __forceinline__ uint64_t make_key(uint32_t order, int depth, int parent, int k) {
    const uint32_t lo = (uint32_t)depth << 17 | (uint32_t)parent << 6 | (uint32_t)k;
    return order ? (uint64_t)order << 32 | ~lo : 0;
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

/* Shared-memory node records; par/fc/ns fit in 16 bits since Q <= 1025. */
struct nodes_smem {
    float *score;         /* [Q] */
    short *par, *fc, *ns; /* [Q] parent, first child, next sibling */
    uint8_t *dep, *cand;  /* [Q] */
};

/* Runs on one whole warp; returns the number of draft nodes. R = slots per lane >= ceil(N / 32).
 * Each lane reads only the read-only scores and its own registers, and writes records no other
 * lane writes, so the only cross-lane traffic is the reductions and shuffles. */
template <int R>
__device__ int select_nodes(const float *sc, int D, int K, int N, int lane, nodes_smem nd) {
    uint64_t key[R];    /* the slot's candidate, 0 when none is left */
    uint32_t nexthi[R]; /* score order of the candidate after it in its row, 0 none */
    float pscore[R];    /* the slot's node score */
    int last[R];        /* the slot's last child so far, -1 none */
#pragma unroll
    for (int j = 0; j < R; j++) {
        key[j] = 0;
        nexthi[j] = 0;
        pscore[j] = 0.0f;
        last[j] = -1;
    }
    if (lane == 0) {
        uint32_t order, next;
        const int k0 = row_head(0.0f, sc, K, &order, &next);
        key[0] = make_key(order, 1, 0, k0);
        nexthi[0] = next;
    }
    uint64_t best = key[0]; /* the best of this lane's slots */
    int n = 0;
    while (n < N) {
        const uint32_t hi = (uint32_t)(best >> 32), lo = ~(uint32_t)best;
        const uint32_t HI = __reduce_max_sync(kFull, hi);
        /* Under that reduction: the slot this lane's best would open if it won, should its row's
         * first sum not be +inf (garbage, never used, for a lane without a candidate or with a
         * leaf). Branch-free, so that it overlaps the reduction. */
        const float *srow = sc + min((int)(lo >> 17), D - 1) * K;
        const float sb = score_from_order(hi), c0 = sb + srow[0];
        const uint32_t sp_order = score_order(c0), sp_next = K > 1 ? score_order(sb + srow[1]) : 0;
        const int sp_inf = c0 == INFINITY;
        if (HI == 0) break; /* no finite candidate left */
        const uint32_t LO = __reduce_min_sync(kFull, hi == HI ? lo : ~0u);
        const float s = score_from_order(HI);
        const int t = (int)(LO >> 17), p = (int)(LO >> 6) & 2047, k = (int)(LO & 63), w = p & 31;
        ++n;
        const bool own_p = lane == w, own_n = lane == (n & 31);
        const int jp = p >> 5, jn = n >> 5;
        /* Loaded early, used late: the score after slot p's next candidate, when it exists. */
        const float v_after = sc[min((t - 1) * K + k + 2, D * K - 1)];

        /* Node n's slot, from the winning lane; a +inf head (rare) is walked here. */
        uint32_t c_order = __shfl_sync(kFull, sp_order, w), c_next = __shfl_sync(kFull, sp_next, w);
        int c_k = 0;
        if (__shfl_sync(kFull, sp_inf, w)) c_k = row_head(s, sc + min(t, D - 1) * K, K, &c_order, &c_next);
        const uint64_t child = t < D && n < N ? make_key(c_order, t + 1, n, c_k) : 0;

        /* Slot p moves to (p, t, k + 1), scored one pop ahead; the one after it is scored now. */
        uint32_t nh = 0;
        float ps = 0.0f;
        int lastc = -1;
#pragma unroll
        for (int j = 0; j < R; j++)
            if (j == jp) {
                nh = nexthi[j];
                ps = pscore[j];
                lastc = last[j];
            }
        const uint64_t moved = nh ? (uint64_t)nh << 32 | ~(LO + 1) : 0;
        const uint32_t after = nh && k + 2 < K ? score_order(ps + v_after) : 0;

        if (own_p) {
            nd.score[n] = s;
            nd.par[n] = (short)p;
            nd.dep[n] = (uint8_t)t;
            nd.cand[n] = (uint8_t)k;
            if (lastc < 0) nd.fc[p] = (short)n;
            else nd.ns[lastc] = (short)n;
        }
        uint64_t rest = 0; /* this lane's best without slot n, which is still empty */
#pragma unroll
        for (int j = 0; j < R; j++) {
            if (own_p && j == jp) {
                key[j] = moved;
                nexthi[j] = after;
                last[j] = n;
            }
            rest = key[j] > rest ? key[j] : rest;
        }
        best = own_n && child > rest ? child : rest;
#pragma unroll
        for (int j = 0; j < R; j++)
            if (own_n && j == jn) {
                key[j] = child;
                nexthi[j] = c_next;
                pscore[j] = s;
            }
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

/* Grid: one block per request. Dynamic shared memory: 8 D K + 12 Q bytes (<= 44.1 KB). */
template <int R>
__global__ void __launch_bounds__(kThreads) tree_build_kernel(kdt_tree_build_params p) {
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int n_nodes;
    const int b = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int D = p.D, K = p.K, N = p.budget, Q = N + 1;
    float *sc = (float *)smem;              /* [D, K] this request's scores */
    int32_t *tk = (int32_t *)(sc + D * K);  /* [D, K] its tokens */
    nodes_smem nd;
    nd.score = (float *)(tk + D * K);
    nd.par = (short *)(nd.score + Q);
    nd.fc = nd.par + Q;
    nd.ns = nd.fc + Q;
    nd.dep = (uint8_t *)(nd.ns + Q);
    nd.cand = nd.dep + Q;

    const size_t bdk = (size_t)b * D * K;
    const int32_t seq = p.seq_len[b], root = p.root_token[b]; /* used at the end */
    for (int i = tid; i < D * K; i += kThreads) sc[i] = p.scores[bdk + i];
    for (int i = tid; i < Q; i += kThreads) nd.par[i] = nd.fc[i] = nd.ns[i] = -1;
    __syncthreads();

    /* Rotating the selecting warp spreads it over the SM's schedulers when blocks share an SM. */
    const int sel = b & (kWarps - 1);
    uint8_t *mask = p.tree_mask + (size_t)b * Q * Q; /* [Q, Q] */
    if (warp == sel) {
        const int n = select_nodes<R>(sc, D, K, N, lane, nd);
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
        int32_t tok = -1, par = -1, dep = -1, cand = -1, pos = -1, fc = -1, ns = -1;
        float score = -INFINITY;
        if (i == 0) {
            tok = root;
            dep = 0;
            score = 0.0f;
            pos = seq;
            fc = nd.fc[0];
        } else if (i <= n) {
            par = nd.par[i];
            dep = nd.dep[i];
            cand = nd.cand[i];
            score = nd.score[i];
            tok = tk[(dep - 1) * K + cand];
            pos = (int32_t)((uint32_t)seq + (uint32_t)dep); /* wraps, never UB, on a bad seq_len */
            fc = nd.fc[i];
            ns = nd.ns[i];
        }
        p.node_token[o + i] = tok;
        p.node_parent[o + i] = par;
        p.node_depth[o + i] = dep;
        p.node_cand[o + i] = cand;
        p.node_score[o + i] = score;
        p.positions[o + i] = pos;
        p.first_child[o + i] = fc;
        p.next_sibling[o + i] = ns;
        if (i <= n)
            for (int j = i; j >= 0; j = nd.par[j]) mask[(size_t)i * Q + j] = 1; /* par[j] < j */
    }
    if (tid == 0) p.num_nodes[b] = n;
}

template <int R>
kdt_status launch(const kdt_tree_build_params *p, cudaStream_t stream) {
    /* At most 8 * 64 * 64 + 12 * 1025 = 45068 bytes: under 48 KB, no opt-in needed. */
    const size_t smem = (size_t)8 * p->D * p->K + (size_t)12 * (p->budget + 1);
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
