/* tree_build CUDA (docs/interfaces.md 2.1): one block per request; one launch writes every output. Budgets up to
 * kSmallN run every request on the sequential path in a block of 4 warps; larger ones use a block
 * of 16 warps, where each request takes a parallel path or the sequential one, chosen inside the
 * kernel from its scores. Log-probability requests (every row sorted, no score above 0): a
 * child's key (-score, depth, ...) never precedes its parent's, so best-first selection equals
 * the trie's global order truncated to N, which two parallel paths build:
 *
 * Threshold path (budgets up to kThrMaxN, when S fits shared memory): level by level, every node
 * above a bound expands its children above the bound (a prefix of its sorted row) into a pool S;
 * a histogram of S's scores by value bins lowers the bound to the bin holding the N-th best node.
 * S then holds the best N and a few more; a counting sort by bin and a comparison within each
 * bin rank them, and every output is written from S. Levels with a narrow frontier run on one
 * warp without block barriers. A pool that outgrows its room (heavy ties) sends the request down
 * the sequential path.
 *
 * Merge path (larger budgets): a running list G of the best N nodes so far; each depth ranks the
 * children of G's newest nodes (the frontier: K sorted columns, one per k) by binary searches,
 * one thread per candidate or G element, and merges them into G.
 *
 * Sequential path (any other request): rows are sorted, so under each selected node only its
 * best unselected child can be next; that child is the node's "slot". Popping slot p =
 * candidate (p, depth t, k) makes node n, moves slot p to (p, t, k + 1) and opens slot n at
 * (n, t + 1, first k). Slot i lives in lane i % 32, register i / 32, as a 64-bit key whose
 * unsigned order is the order of docs/interfaces.md 2.1. A step is two warp reductions (redux.sync: max of the high
 * words, then min of the tie-break words among the lanes holding that max), one shared-memory
 * load for the new slot and O(N / 32) register work per lane. Meanwhile the other warps zero
 * this request's tree_mask. (Scores and tokens are staged in one global round trip, before.)
 * After a barrier all warps write the node outputs and the mask's ones (each row's ancestors).
 * Proofs, costs and measurements: docs/perf/tree_build.md.
 *
 * Bit-exact with the CPU: sums are the same single f32 additions (parent score + scores[b][d][k],
 * no FMA possible), and every path orders finite scores exactly as float comparison does. -0.0
 * never occurs: the root is +0.0 and an f32 sum is -0.0 only when both terms are.
 * Any scores are safe: every index is bounded by D, K and N whatever the values; unsorted rows
 * (refused by the adapter) take the sequential path and only give a different tree. */
#include <stdint.h>

#include "common/cuda/cuda_common.cuh"
#include "ops/backends.h"

namespace {

constexpr int kWarps = 16; /* a block per request (8 warps measured slower at every shape) */

#include "cuda/tree_build_thr.cuh" /* kFull, score_order and the threshold path */

__device__ __forceinline__ uint32_t score_bits_from_order(uint32_t h) {
    return h ^ ((uint32_t)((int32_t)~h >> 31) | 0x80000000u);
}

__device__ __forceinline__ float score_from_order(uint32_t h) { return __uint_as_float(score_bits_from_order(h)); }

/* A candidate's key: its unsigned order is the order of docs/interfaces.md 2.1; 0 = no candidate.
 *   high word: score_order(score);
 *   low word:  ~tie with tie = depth << 17 | parent << 6 | k: lower depth, then lower parent,
 *              win. k never decides (one candidate per parent is pending); it rides along. */
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

/* ---- merge path ---- */

__device__ __forceinline__ bool is_bottom(float v) { return v != v || v == -INFINITY; }

/* The merge path's shared arrays (docs/perf/tree_build.md). G is the best N nodes so far in
 * selection order, double-buffered by depth parity: score, meta = (parent + 1) << 16 | depth << 8
 * | k with parent a G position (-1 the root), and the G position of the previous sibling (-1
 * none). F is the frontier, G's nodes of the newest depth in G order: score and G position. */
struct merge_smem {
    float *gs;      /* [2, N] */
    uint32_t *gm;   /* [2, N] */
    int32_t *gv;    /* [2, N] */
    float *fs;      /* [2, N] */
    int32_t *fg;    /* [2, N] */
    int32_t *gsh;   /* [N] candidates that precede G[g] */
    int32_t *cpos;  /* [cmax] a candidate's position in the merged list */
    int32_t *cq;    /* [cmax] its G predecessors | j << 11 | k << 22 */
    int32_t *lens;  /* [K] surviving candidates of column k (a prefix of the frontier) */
    int32_t *off;   /* [K] first flat index of column k */
    int32_t *ctr;   /* [2] frontier size of the next depth, by depth parity */
};

/* Bytes of merge_smem for (N, K); cmax bounds the candidates of one depth: a survivor (j, k)
 * has (j + 1)(k + 1) <= N, so column k holds at most N / (k + 1). */
__host__ __device__ inline int merge_cmax(int N, int K) {
    int c = 0;
    for (int k = 0; k < K; k++) c += N / (k + 1);
    return c;
}

__host__ __device__ inline size_t merge_smem_bytes(int N, int K) {
    return (size_t)4 * (11 * N + 2 * merge_cmax(N, K) + 2 * K + 2);
}

__device__ merge_smem merge_carve(uint8_t *base, int N, int K) {
    merge_smem m;
    m.gs = (float *)base;
    m.gm = (uint32_t *)(m.gs + 2 * N);
    m.gv = (int32_t *)(m.gm + 2 * N);
    m.fs = (float *)(m.gv + 2 * N);
    m.fg = (int32_t *)(m.fs + 2 * N);
    m.gsh = m.fg + 2 * N;
    m.cpos = m.gsh + N;
    m.cq = m.cpos + merge_cmax(N, K);
    m.lens = m.cq + merge_cmax(N, K);
    m.off = m.lens + K;
    m.ctr = m.off + K;
    return m;
}

/* The merge path's state before depth 0 (the root alone in the frontier); thread 0, before the
 * prologue's barrier. */
__device__ void merge_init(uint8_t *base, int N, int K) {
    const merge_smem m = merge_carve(base, N, K);
    m.fs[0] = 0.0f;
    m.fg[0] = -1;
}

/* Runs on the whole block after merge_init and a barrier; returns the number of draft
 * nodes and leaves node i + 1 in rec[i + 1] and the children lists in fc / ns. Rows must be
 * sorted and no score above 0. Depth t (the candidates of draft depth t, tree depth t + 1), three
 * barriers:
 *  1. lens: column k's survivors, a prefix of the frontier: finite, above G's N-th score when G
 *     is full, and fewer than N nodes provably before them (G up to the parent, and the (j + 1)
 *     (k + 1) - 1 candidates (j' <= j, k' <= k)). Then every warp scans lens in registers (off,
 *     C); C = 0 ends the selection.
 *  2. ranks, one thread per candidate or G element, no atomics: a candidate's position = its G
 *     predecessors (binary search on G's scores) + j + per other column l its predecessors there
 *     (binary search; (c, j, l) order); a G element's shift = per column the candidates with a
 *     higher score. The searches of CH columns (and G) run in lockstep, for memory parallelism.
 *  3. scatter into the other buffer, positions >= N dropped; parents and previous siblings
 *     remapped through the shifts; the survivors in rank order are the next frontier. */
template <int CH>
__device__ int merge_select(const float *sc, int D, int K, int N, uint8_t *base, uint4 *rec, short *fc, short *ns) {
    constexpr int T = 32 * kWarps;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const merge_smem m = merge_carve(base, N, K);
    const int top = K > 1 ? 1 << (31 - __clz(K - 1)) : 0; /* the column search's first step */
    int nG = 0, nF = 1, cur = 0;
    for (int t = 0; t < D && nF > 0; t++, cur ^= 1) {
        const float *x = sc + t * K;
        const float *gs = m.gs + cur * N, *fs = m.fs + cur * N;
        const uint32_t *gm = m.gm + cur * N;
        const int32_t *gv = m.gv + cur * N, *fg = m.fg + cur * N;
        const bool full = nG == N;
        const float theta = full ? gs[N - 1] : 0.0f;

        /* 1. lens (ctr[cur] was last read two depths ago) */
        for (int k = warp; k < K; k += kWarps) {
            const float xk = x[k];
            int len = 0;
            for (int j0 = 0;; j0 += 32) {
                const int j = j0 + lane;
                bool ok = false;
                if (j < nF) {
                    const float c = __fadd_rn(fs[j], xk);
                    ok = isfinite(c) && (!full || c > theta) && fg[j] + (j + 1) * (k + 1) < N;
                }
                const unsigned bal = __ballot_sync(kFull, ok);
                if (bal != kFull) {
                    len += __ffs(~bal) - 1; /* the prefix only, whatever the rest */
                    break;
                }
                len += 32;
            }
            if (lane == 0) m.lens[k] = len;
        }
        if (tid == 0) m.ctr[cur] = 0;
        __syncthreads();

        /* off (exclusive scan, columns lane and lane + 32) and C, in every warp */
        int a = lane < K ? m.lens[lane] : 0, a2 = lane + 32 < K ? m.lens[lane + 32] : 0;
        const int la = a, la2 = a2;
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(kFull, a, o), v2 = __shfl_up_sync(kFull, a2, o);
            if (lane >= o) {
                a += v;
                a2 += v2;
            }
        }
        a2 += __shfl_sync(kFull, a, 31);
        const int C = __shfl_sync(kFull, a2, 31);
        if (C == 0) break; /* nothing joins: G is final (every thread, same C) */
        const int offA = a - la, offB = a2 - la2;
        if (warp == 0) {
            if (lane < K) m.off[lane] = offA;
            if (lane + 32 < K) m.off[lane + 32] = offB;
        }

        /* 2. ranks: item e < C is candidate e, else G element e - C (those before the first
         * frontier node never move: shift 0, no search) */
        const int g0 = fg[0] + 1;
        for (int e0 = warp * 32; e0 < C + nG; e0 += T) { /* warp-uniform: the shuffles below */
            const int e = e0 + lane;
            int k = 0, ok0 = 0; /* column of e: the last k with off[k] <= e (empty columns only trail) */
            for (int step = top; step; step >>= 1) {
                const int q = k + step;
                const int v1 = __shfl_sync(kFull, offA, q & 31), v2 = K > 32 ? __shfl_sync(kFull, offB, q & 31) : 0;
                const int v = q < 32 ? v1 : v2;
                if (q < K && v <= e) {
                    k = q;
                    ok0 = v;
                }
            }
            const int g = e - C;
            if (e >= C + nG || (e >= C && g < g0)) {
                if (e < C + nG) m.gsh[g] = 0;
                continue;
            }
            /* A candidate (j, k, c), or G element g as j = -1, k = K, c = its score: then every
             * column counts its candidates with a higher score. */
            const bool cand = e < C;
            const int j = cand ? e - ok0 : -1, kk = cand ? k : K;
            const float c = cand ? __fadd_rn(fs[j], x[k]) : gs[g];
            int glo = cand ? min(max(fg[j] + 1, 0), nG) : 0; /* G with a score >= c */
            int glen = cand ? nG - glo : 0;
            int sum = 0;
            for (int l0 = 0; l0 < K; l0 += CH) {
                int lo[CH], len[CH], mx = glen;
                float xl[CH];
                bool ge[CH];
#pragma unroll
                for (int i = 0; i < CH; i++) {
                    const int l = l0 + i;
                    lo[i] = len[i] = 0;
                    xl[i] = 0.0f;
                    ge[i] = l > kk; /* l > k: (c', j') precedes iff c' >= c (j' < j); l < k: c' > c */
                    if (l < K && l != kk) {
                        const int L = m.lens[l];
                        lo[i] = l < kk ? j + 1 : 0; /* l < k: every j' <= j precedes; l > k: no j' >= j */
                        len[i] = max((l < kk ? L : min(j, L)) - lo[i], 0);
                        xl[i] = x[l];
                    }
                    mx = max(mx, len[i]);
                }
                for (; mx; mx >>= 1) { /* each range at least halves a round */
#pragma unroll
                    for (int i = 0; i < CH; i++)
                        if (len[i]) {
                            const int h = len[i] >> 1, mid = lo[i] + h;
                            const float cm = __fadd_rn(fs[mid], xl[i]);
                            if (cm > c || (ge[i] && cm == c)) {
                                lo[i] = mid + 1;
                                len[i] -= h + 1;
                            } else {
                                len[i] = h;
                            }
                        }
                    if (glen) {
                        const int h = glen >> 1, mid = glo + h;
                        if (gs[mid] >= c) { /* ties: G has the lower depth */
                            glo = mid + 1;
                            glen -= h + 1;
                        } else {
                            glen = h;
                        }
                    }
                }
#pragma unroll
                for (int i = 0; i < CH; i++) sum += lo[i];
            }
            if (cand) {
                const int pos = glo + j + sum;
                m.cpos[e] = pos;
                m.cq[e] = glo | j << 11 | k << 22;
                if (pos < N) atomicAdd(&m.ctr[cur], 1);
            } else {
                m.gsh[g] = sum;
            }
        }
        __syncthreads();

        /* 3. scatter */
        float *gs_n = m.gs + (cur ^ 1) * N, *fs_n = m.fs + (cur ^ 1) * N;
        uint32_t *gm_n = m.gm + (cur ^ 1) * N;
        int32_t *gv_n = m.gv + (cur ^ 1) * N, *fg_n = m.fg + (cur ^ 1) * N;
        for (int f = tid; f < C; f += T) {
            const int pos = m.cpos[f];
            if (pos >= N) continue;
            /* Indices read from shared memory are clamped: harmless when the ranks are exact (always,
             * docs/perf/tree_build.md), and memory-safe whatever happens. */
            const uint32_t q = (uint32_t)m.cq[f];
            const int k = min((int)(q >> 22), K - 1), j = min((int)(q >> 11 & 2047u), N - 1);
            const int gp = min(fg[j], N - 1), r = pos - (int)(q & 2047u);
            const float c = __fadd_rn(fs[j], x[k]);
            gs_n[pos] = c;
            gm_n[pos] = (uint32_t)(gp < 0 ? 0 : gp + m.gsh[gp] + 1) << 16 | (uint32_t)(t + 1) << 8 | (uint32_t)k;
            gv_n[pos] = k ? m.cpos[min(m.off[k - 1] + j, f)] : -1; /* (j, k - 1) precedes it: kept */
            if ((unsigned)r < (unsigned)N) {
                fs_n[r] = c;
                fg_n[r] = pos;
            }
        }
        for (int g = tid; g < nG; g += T) {
            const int np = g + m.gsh[g];
            if (np >= N) continue;
            const uint32_t mt = gm[g];
            const int par = min((int)(mt >> 16), g) - 1, v = min(gv[g], g - 1);
            gs_n[np] = gs[g];
            gm_n[np] = (uint32_t)(par < 0 ? 0 : par + m.gsh[par] + 1) << 16 | (mt & 0xffffu);
            gv_n[np] = v < 0 ? -1 : v + m.gsh[v];
        }
        nG = min(N, nG + C);
        __syncthreads();
        nF = m.ctr[cur];
    }

    /* Node i = G[i - 1]; children lists: the children of a node are its k = 0, 1, ... in index
     * order (a child (p, k + 1) never precedes (p, k)), so k = 0 heads the list and every other
     * child follows its previous sibling. fc and ns are -1 already. */
    const float *gs = m.gs + cur * N;
    const uint32_t *gm = m.gm + cur * N;
    const int32_t *gv = m.gv + cur * N;
    for (int g = tid; g < nG; g += T) {
        const uint32_t mt = gm[g];
        const int par = min((int)(mt >> 16), g), k = (int)(mt & 63), i = g + 1, v = gv[g];
        rec[i] = make_uint4((mt >> 8 & 127u) << 17 | (uint32_t)par << 6 | (uint32_t)k, __float_as_uint(gs[g]), 0, 0);
        if (k == 0) fc[par] = (short)i;
        else if ((unsigned)v < (unsigned)g) ns[v + 1] = (short)i;
    }
    return nG;
}

/* A request's shared arrays, 20 Q + 4 (2 D + 1) K bytes from the dynamic shared memory's base:
 * node records, its scores with a zero pad row (a leaf's child row index stays valid), its
 * tokens, first child and next sibling; then the merge path's arrays, when it has room. */
struct request_smem {
    uint4 *rec;    /* [Q] node records */
    float *sc;     /* [D + 1, K] */
    int32_t *tk;   /* [D, K] */
    short *fc;     /* [Q] first child */
    short *ns;     /* [Q] next sibling */
    uint8_t *rest; /* the merge path's arrays */
};

__device__ request_smem request_carve(uint8_t *smem, int D, int K, int Q) {
    request_smem m;
    m.rec = (uint4 *)smem;
    m.sc = (float *)(m.rec + Q);
    m.tk = (int32_t *)(m.sc + (D + 1) * K);
    m.fc = (short *)(m.tk + D * K);
    m.ns = m.fc + Q;
    m.rest = (uint8_t *)(m.ns + Q);
    return m;
}

/* One global round trip: the request's scores, tokens and each score's left neighbour are loaded
 * together; the lists are emptied. Returns nonzero (for this thread's share) when the request
 * cannot take the merge path: it needs log-probabilities in sorted rows (the order of docs/interfaces.md 2.1: -inf
 * and NaN only trail a row). T threads, tid of them. */
__device__ int stage_request(const kdt_tree_build_params &p, const request_smem &m, int b, int tid, int T) {
    const int D = p.D, K = p.K, Q = p.budget + 1;
    const size_t bdk = (size_t)b * D * K;
    int other = 0;
#pragma unroll 1
    for (int i = tid; i < (D + 1) * K; i += T) {
        float v = 0.0f;
        if (i < D * K) {
            v = p.scores[bdk + i];
            m.tk[i] = p.tokens[bdk + i];
            const float u = i % K ? p.scores[bdk + i - 1] : 0.0f;
            other |= v > 0.0f || (i % K && !is_bottom(v) && (is_bottom(u) || v > u));
        }
        m.sc[i] = v;
    }
#pragma unroll 1
    for (int i = tid; i < Q; i += T) m.fc[i] = m.ns[i] = -1;
    return other;
}

/* After the selection (n nodes in rec, fc, ns) and a barrier that orders the mask's zeroes before
 * its ones: every node output, the fills, and each mask row's ones (the row's ancestors). */
__device__ void write_request(const kdt_tree_build_params &p, const request_smem &m, int b, int n, int seq, int root, int tid, int T) {
    const int K = p.K, Q = p.budget + 1;
    uint8_t *mask = p.tree_mask + (size_t)b * Q * Q; /* [Q, Q] */
    const size_t o = (size_t)b * Q;
    for (int i = tid; i < Q; i += T) {
        int32_t tok = root, par = -1, dep = 0, cand = -1, pos = seq, f = m.fc[i], s = -1;
        float score = 0.0f;
        if (i > n) {
            tok = dep = pos = f = -1;
            score = -INFINITY;
        } else if (i > 0) {
            const uint4 r = m.rec[i];
            par = (int)(r.x >> 6) & 2047;
            dep = (int)(r.x >> 17);
            cand = (int)(r.x & 63);
            score = __uint_as_float(r.y);
            tok = m.tk[(dep - 1) * K + cand];
            pos = (int32_t)((uint32_t)seq + (uint32_t)dep); /* wraps, never UB, on a bad seq_len */
            s = m.ns[i];
        }
        p.node_token[o + i] = tok;
        p.node_parent[o + i] = par;
        p.node_depth[o + i] = dep;
        p.node_cand[o + i] = cand;
        p.node_score[o + i] = score;
        p.positions[o + i] = pos;
        p.first_child[o + i] = f;
        p.next_sibling[o + i] = s;
        if (i <= n) /* ones at i and its ancestors; a parent's index is below its child's */
            for (int j = i; j > 0; j = min((int)(m.rec[j].x >> 6) & 2047, j - 1)) mask[(size_t)i * Q + j] = 1;
        if (i <= n) mask[(size_t)i * Q] = 1;
    }
    if (tid == 0) p.num_nodes[b] = n;
}

/* The sequential path in a block of W warps: one warp selects (rotated by request, which spreads
 * it over the SM's schedulers when blocks share an SM) while, when `zero`, the others zero the
 * mask (len bytes); the selecting warp's lane 0 writes *n_nodes. */
template <int R, int W>
__device__ __forceinline__ void select_sequential(const request_smem &m, int D, int K, int N, int b, uint8_t *mask,
                                                  size_t len, bool zero, int *n_nodes) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, sel = b & (W - 1);
    if (warp == sel) {
        const int n = select_nodes<R>(m.sc, D, K, N, lane, m.rec, m.fc, m.ns);
        if (lane == 0) *n_nodes = n;
    } else if (zero) {
        zero_bytes(mask, len, tid - (warp > sel ? 32 : 0), 32 * W - 32); /* the helper warps */
    }
}

/* Grid: one block of kWarps warps per request. Dynamic shared memory: request_smem, then, when
 * `merge` (the launcher found room), merge_smem_bytes(N, K) for the merge path. */
template <int R, int CH>
__global__ void __launch_bounds__(32 * kWarps) tree_build_kernel(kdt_tree_build_params p, int merge) {
    constexpr int T = 32 * kWarps;
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int n_nodes;
    const int b = blockIdx.x, tid = threadIdx.x;
    const int D = p.D, K = p.K, N = p.budget, Q = N + 1;
    const request_smem m = request_carve(smem, D, K, Q);
    const int32_t seq = p.seq_len[b], root = p.root_token[b]; /* used at the end */
    const int other = stage_request(p, m, b, tid, T);
    if (merge && tid == 0) merge_init(m.rest, N, K);
    const bool use_merge = merge && !__syncthreads_or(other);

    uint8_t *mask = p.tree_mask + (size_t)b * Q * Q; /* [Q, Q] */
    if (use_merge) {
        zero_bytes(mask, (size_t)Q * Q, tid, T);
        const int n = merge_select<CH>(m.sc, D, K, N, m.rest, m.rec, m.fc, m.ns);
        if (tid == 0) n_nodes = n;
    } else {
        select_sequential<R, kWarps>(m, D, K, N, b, mask, (size_t)Q * Q, true, &n_nodes);
    }
    __syncthreads(); /* orders the zeroes before the ones below */
    write_request(p, m, b, n_nodes, seq, root, tid, T);
}

/* The threshold kernel's sequential path: requests it cannot take, or whose pool outgrew its
 * room. Inlined: out of line (__noinline__) it ran the sequential rows 6 to 13% slower and the
 * threshold rows 1 to 5% slower (H200, docs/perf/tree_build.md). */
template <int R>
__device__ __forceinline__ void thr_fallback(const kdt_tree_build_params p, const request_smem m, int b, int *n_nodes) {
    const int N = p.budget, Q = N + 1, tid = threadIdx.x;
    select_sequential<R, kThrWarps>(m, p.D, p.K, N, b, p.tree_mask + (size_t)b * Q * Q, (size_t)Q * Q, true, n_nodes);
    __syncthreads(); /* orders the zeroes before the ones below */
    write_request(p, m, b, *n_nodes, p.seq_len[b], p.root_token[b], tid, 32 * kThrWarps);
}

/* Grid: one block of kThrWarps warps per request; dynamic shared memory: request_smem, then
 * thr_smem_bytes(M, Q). Log-probability requests take the threshold path; the others, and any whose
 * S outgrows M (heavy ties), the sequential path. */
template <int R>
__global__ void __launch_bounds__(32 * kThrWarps) tree_build_thr_kernel(kdt_tree_build_params p, int M) {
    constexpr int T = 32 * kThrWarps;
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int n_nodes;
    const int b = blockIdx.x, tid = threadIdx.x;
    const int D = p.D, K = p.K, N = p.budget, Q = N + 1;
    const request_smem m = request_carve(smem, D, K, Q);
    const thr_smem h = thr_carve(m.rest, M);
    const int32_t seq = p.seq_len[b], root = p.root_token[b];
    const int other = stage_request(p, m, b, tid, T);
    thr_init(h, tid, T);
    const bool thr = !__syncthreads_or(other);
    if (thr) { /* block-uniform, as is n */
        static_assert(kKeeper == 0, "the warps past the keeper zero the mask");
        if (tid >= 32) { /* while the keeper runs the first levels */
            thr_mask_zero(h, Q, tid - 32, T - 32);
#pragma unroll 1
            for (int i = tid - 32; i < Q; i += T - 32) p.first_child[(size_t)b * Q + i] = -1;
        }
        int size;
        const int n = thr_select(m.sc, D, K, N, M, h, &size); /* its barriers order the fills above first */
        if (n >= 0) {
            thr_write(p, b, h, m.tk, n, size, seq, root, tid, T);
            return;
        }
    }
    thr_fallback<R>(p, m, b, &n_nodes);
}

/* Small budgets (N <= kSmallN): every request on the sequential path, in a block of kSmallWarps
 * warps: one selects while the others zero the mask, then all write. The threshold path's levels
 * cost more than N sequential steps there (B = 1, N = 12: 8.5 us vs 5.1), less from N = 64 on
 * (B = 64: 12.9 vs 17.3; docs/perf/tree_build.md). */
constexpr int kSmallN = 32, kSmallWarps = 4;
constexpr int kThrMaxN = 256; /* the threshold path's largest budget */

template <int R>
__global__ void __launch_bounds__(32 * kSmallWarps) tree_build_small_kernel(kdt_tree_build_params p) {
    constexpr int T = 32 * kSmallWarps;
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int n_nodes;
    const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
    const int D = p.D, K = p.K, N = p.budget, Q = N + 1;
    const request_smem m = request_carve(smem, D, K, Q);
    const int32_t seq = p.seq_len[b], root = p.root_token[b];
    stage_request(p, m, b, tid, T);
    __syncthreads();
    if (tid < 32) {
        const int n = select_nodes<R>(m.sc, D, K, N, lane, m.rec, m.fc, m.ns);
        if (lane == 0) n_nodes = n;
    } else {
        zero_bytes(p.tree_mask + (size_t)b * Q * Q, (size_t)Q * Q, tid - 32, T - 32);
    }
    __syncthreads(); /* orders the zeroes before the ones below */
    write_request(p, m, b, n_nodes, seq, root, tid, T);
}

/* Shared memory of the merge path too, when it fits the device's limit (always, within the
 * the limits of docs/interfaces.md 2.1 on an H200: at most ~128 KB, N = 1024 with D = K = 64). */
constexpr size_t kMaxSmem = 200 * 1024;

size_t base_smem(int D, int K, int N) { return (size_t)20 * (N + 1) + (size_t)4 * (2 * D + 1) * K; }

template <int R, int CH>
kdt_status launch(const kdt_tree_build_params *p, cudaStream_t stream) {
    const size_t base = base_smem(p->D, p->K, p->budget), full = base + merge_smem_bytes(p->budget, p->K);
    const int merge = full <= kMaxSmem;
    const size_t smem = merge ? full : base;
    if (smem > 48 * 1024) /* the default limit is 48 KB */
        KDT_CUDA_CHECK(cudaFuncSetAttribute(tree_build_kernel<R, CH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    tree_build_kernel<R, CH><<<p->B, 32 * kWarps, smem, stream>>>(*p, merge);
    KDT_CUDA_CHECK_LAUNCH("tree_build");
    return KDT_OK;
}

/* CH = 4 searches in lockstep is the fastest while each request has an SM to itself; beyond
 * that, CH = 2 (64 registers, two blocks an SM, where CH = 4's 72 allow one). Measured on the H200:
 * docs/perf/tree_build.md. */
template <int R>
kdt_status launch_ch(const kdt_tree_build_params *p, cudaStream_t s) {
    int dev = 0, sms = 0;
    KDT_CUDA_CHECK(cudaGetDevice(&dev));
    KDT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return p->B <= sms ? launch<R, 4>(p, s) : launch<R, 2>(p, s);
}

template <int R>
kdt_status launch_small(const kdt_tree_build_params *p, cudaStream_t stream) {
    const size_t smem = base_smem(p->D, p->K, p->budget);
    if (smem > 48 * 1024)
        KDT_CUDA_CHECK(cudaFuncSetAttribute(tree_build_small_kernel<R>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    tree_build_small_kernel<R><<<p->B, 32 * kSmallWarps, smem, stream>>>(*p);
    KDT_CUDA_CHECK_LAUNCH("tree_build");
    return KDT_OK;
}

template <int R>
kdt_status launch_thr(const kdt_tree_build_params *p, cudaStream_t stream) {
    const int M = thr_capacity(p->K, p->budget);
    const size_t smem = base_smem(p->D, p->K, p->budget) + thr_smem_bytes(M, p->budget + 1);
    if (smem > 48 * 1024)
        KDT_CUDA_CHECK(cudaFuncSetAttribute(tree_build_thr_kernel<R>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    tree_build_thr_kernel<R><<<p->B, 32 * kThrWarps, smem, stream>>>(*p, M);
    KDT_CUDA_CHECK_LAUNCH("tree_build");
    return KDT_OK;
}


/* Which kernel path log-probability requests of this shape take: 0 sequential (the small
 * kernel), 1 threshold, 2 merge. */
int path_of(int D, int K, int N) {
    if (N <= kSmallN) return 0;
    const int M = thr_capacity(K, N);
    if (N <= kThrMaxN && base_smem(D, K, N) + thr_smem_bytes(M, N + 1) <= kMaxSmem &&
        (size_t)4 * (N + 1) * thr_row_words(N + 1) <= (size_t)8 * M) /* the mask's bit rows fit the key array */
        return 1;
    return base_smem(D, K, N) + merge_smem_bytes(N, K) <= kMaxSmem ? 2 : 0;
}

} // namespace

/* The path log-probability requests of this shape take (for tests and benches): 0 sequential,
 * 1 threshold, 2 merge. */
extern "C" int kdt_tree_build_cuda_path(int D, int K, int N) { return path_of(D, K, N); }

extern "C" kdt_status kdt_tree_build_cuda(const kdt_tree_build_params *p, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    const int N = p->budget, path = path_of(p->D, p->K, N);
    static_assert(kSmallN <= 64, "R = 2 slots a lane hold 64 nodes");
    if (path == 0 && N <= 64) return N <= 32 ? launch_small<1>(p, s) : launch_small<2>(p, s);
    static_assert(kThrMaxN <= 256, "R = 8 slots a lane hold 256 nodes");
    if (path == 1) return N <= 64 ? launch_thr<2>(p, s) : N <= 128 ? launch_thr<4>(p, s) : launch_thr<8>(p, s);
    if (N <= 128) return launch_ch<4>(p, s);
    if (N <= 256) return launch_ch<8>(p, s);
    if (N <= 512) return launch_ch<16>(p, s);
    return launch_ch<32>(p, s);
}
