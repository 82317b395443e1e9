/* tree_build's threshold path (src/cuda/tree_build_thr.cuh, the device code the CUDA kernel runs)
 * executed on CPU threads: one std::thread per CUDA thread of a block, __syncthreads a barrier,
 * warp votes and shuffles through a per-warp exchange, shared atomics as std::atomic_ref. Each
 * case's outputs (thr_select, then thr_write) are checked against the CPU backend (kdt_tree_build,
 * KDT_BACKEND_CPU), every tensor bit for bit, from poisoned arrays. So the path's logic is tested on
 * every machine, with or without a GPU (a GPU run proves the compiled kernel: test_tree_build).
 * Inputs ($KDT_SEED, else the clock): log-probabilities of random softmaxes, the bench's scores
 * (quantized: sums collide, so the tie walk runs), few-level ties, -inf/NaN tails, all zeros
 * (a pool that outgrows its room: the kernel's fallback, counted and checked as such), and a
 * confident drafter's long chains (D 16 .. 64: many narrow levels, some pools outgrow theirs). */
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>
#include <vector>

#include <unistd.h>

#include "kdt/ops.h"

/* ---- the CUDA subset tree_build_thr.cuh uses ---- */

struct int4 {
    int x, y, z, w;
};
struct uint4 {
    unsigned x, y, z, w;
};
static inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
using std::isfinite;
using std::max;
using std::min;

static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __fadd_rn(float a, float b) {
    volatile float s = a + b; /* one rounding, never contracted */
    return s;
}
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)((uint64_t)a * b >> 32); }

constexpr int kEmuWarps = 16; /* kThrWarps, checked below */
#include "cuda_emu.h"

static inline void __syncwarp(unsigned = 0xffffffffu) { g_blk->warp[threadIdx.x >> 5]->arrive_and_wait(); }
static inline bool __any_sync(unsigned mask, bool p) { return __ballot_sync(mask, p) != 0; }
static inline int __shfl_sync(unsigned, int v, int src) { return (int)(uint32_t)exchange((uint32_t)v, src); }
static inline int __shfl_up_sync(unsigned, int v, int d) {
    const int lane = (int)threadIdx.x & 31;
    const int r = (int)(uint32_t)exchange((uint32_t)v, lane >= d ? lane - d : lane);
    return lane >= d ? r : v;
}
static inline int atomicAdd(int32_t *p, int v) { return std::atomic_ref<int32_t>(*p).fetch_add(v); }
static inline int atomicOr(int32_t *p, int v) { return std::atomic_ref<int32_t>(*p).fetch_or(v); }

#include "cuda/tree_build_thr.cuh"

static_assert(kThrWarps == kEmuWarps, "the emulated block is kThrWarps warps");

/* ---- one request through thr_select and thr_write, as tree_build_thr_kernel runs them ---- */

/* A request's input and output arrays (B = 1), filled for the CPU backend or the emulated path. */
struct request {
    int32_t root = 1, seq = 0, num = 0;
    std::vector<int32_t> tok, par, dep, cand, pos, fch, nsib, ntok;
    std::vector<float> score;
    std::vector<uint8_t> mbuf; /* the mask at mbuf + off: the kernel's request masks start anywhere */
    uint8_t *mask;
    size_t mlen;
    kdt_tree_build_params p = {};
    request(const float *sc, int D, int K, int N, int off)
        : tok((size_t)D * K), mbuf((size_t)(N + 1) * (N + 1) + 16, 0xAB), mask(mbuf.data() + off),
          mlen((size_t)(N + 1) * (N + 1)) {
        const int Q = N + 1;
        for (auto *v : {&par, &dep, &cand, &pos, &fch, &nsib, &ntok}) v->assign(Q, -7); /* poison */
        score.assign(Q, NAN);
        for (size_t i = 0; i < tok.size(); i++) tok[i] = (int32_t)(i * 2654435761u % 163840);
        p.B = 1, p.D = D, p.K = K, p.budget = N;
        p.scores = sc, p.tokens = tok.data(), p.root_token = &root, p.seq_len = &seq;
        p.num_nodes = &num, p.node_token = ntok.data(), p.node_parent = par.data(), p.node_depth = dep.data();
        p.node_cand = cand.data(), p.node_score = score.data(), p.positions = pos.data(), p.tree_mask = mask;
        p.first_child = fch.data(), p.next_sibling = nsib.data();
    }
};

/* Runs the path on one emulated block; returns thr_select's n (-1: the pool outgrew its room, the
 * kernel then runs the sequential path), -2 when the threads disagree. Like the kernel: the
 * staged rows with a zero pad row, first_child set to -1 (the mask is left poisoned). */
static int run_thr(request &q, int D, int K, int N) {
    const int M = thr_capacity(K, N);
    std::vector<float> sc((size_t)(D + 1) * K, 0.0f);
    memcpy(sc.data(), q.p.scores, sizeof(float) * D * K);
    std::fill(q.fch.begin(), q.fch.end(), -1);
    std::vector<uint8_t> pool(thr_smem_bytes(M, N + 1) + 16);
    const thr_smem h = thr_carve(pool.data() + 4, M); /* not 16-aligned, like the kernel's base */
    thr_init(h, 0, 1);

    std::vector<int> ret(32 * kEmuWarps);
    emu_run_block([&](int t) {
        int size = 0;
        if (t >= 32) thr_mask_zero(h, N + 1, t - 32, 32 * kEmuWarps - 32); /* as the kernel */
        const int n = ret[t] = thr_select(sc.data(), D, K, N, M, h, &size);
        if (n >= 0) thr_write(q.p, 0, h, q.tok.data(), n, size, q.seq, q.root, t, 32 * kEmuWarps);
    });
    for (int t = 1; t < 32 * kEmuWarps; t++)
        if (ret[t] != ret[0]) return -2; /* every thread must agree */
    return ret[0];
}

/* ---- inputs ---- */

static uint64_t g_rng;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
static float uniform(void) { return (float)(rnd() & 0xffffff) / 16777216.0f; }

enum { KIND_LOGPROB, KIND_BENCH, KIND_TIES, KIND_TAILS, KIND_ZEROS, KIND_DEEP, N_KINDS };
static const char *kind_name[N_KINDS] = {"logprob", "bench", "ties", "tails", "zeros", "deep"};

static void fill_row(float *row, int K, int kind) {
    if (kind == KIND_BENCH) { /* bench/bench_tree_build.cu's rule */
        float v = -0.05f * (float)(rnd() % 64);
        for (int k = 0; k < K; k++) {
            row[k] = v;
            v -= 0.02f + (float)(rnd() % 1000) / 400.0f;
        }
        return;
    }
    if (kind == KIND_DEEP) { /* a confident drafter: one candidate near 0, so long narrow chains */
        float v = -0.05f * uniform();
        for (int k = 0; k < K; k++) {
            row[k] = v;
            v -= 0.5f + 3.0f * uniform();
        }
        return;
    }
    if (kind == KIND_ZEROS) {
        for (int k = 0; k < K; k++) row[k] = rnd() % 2 ? 0.0f : -0.0f;
        return;
    }
    if (kind == KIND_TIES) {
        static const float lv[] = {0.0f, -0.5f, -1.0f, -0.6931472f, -2.0f};
        for (int k = 0; k < K; k++) row[k] = lv[rnd() % 5];
    } else { /* top-K log-probabilities of a random softmax over 4 K logits */
        const int V = 4 * K;
        std::vector<float> lg(V);
        const float temp = 0.5f + 2.5f * uniform();
        float mx = -INFINITY, z = 0.0f;
        for (int i = 0; i < V; i++) mx = std::max(mx, lg[i] = temp * (uniform() + uniform() + uniform() - 1.5f) * 2.0f);
        for (int i = 0; i < V; i++) z += std::exp(lg[i] - mx);
        for (int i = 0; i < V; i++) lg[i] = lg[i] - mx - std::log(z);
        std::sort(lg.begin(), lg.end(), [](float a, float b) { return a > b; });
        for (int k = 0; k < K; k++) row[k] = std::min(lg[k], 0.0f);
    }
    std::sort(row, row + K, [](float a, float b) { return a > b; });
    if (kind == KIND_TAILS && rnd() % 3 == 0)
        for (int k = (int)(rnd() % (K + 1)); k < K; k++) row[k] = rnd() % 2 ? -INFINITY : NAN;
}

/* ---- checks ---- */

static int g_fail;
static char g_first[200]; /* the first failure of a kind */

/* The first output where the emulated path differs from the CPU backend, bit for bit; NULL if none. */
static const char *compare(const request &e, const request &c, int N) {
    const int Q = N + 1;
    if (e.num != c.num) return "num_nodes";
    if (memcmp(e.score.data(), c.score.data(), sizeof(float) * Q)) return "node_score";
    const struct {
        const std::vector<int32_t> &a, &b;
        const char *name;
    } ints[] = {{e.ntok, c.ntok, "node_token"}, {e.par, c.par, "node_parent"},  {e.dep, c.dep, "node_depth"},
                {e.cand, c.cand, "node_cand"},  {e.pos, c.pos, "positions"},     {e.fch, c.fch, "first_child"},
                {e.nsib, c.nsib, "next_sibling"}};
    for (const auto &t : ints)
        if (t.a != t.b) return t.name;
    if (memcmp(e.mask, c.mask, e.mlen)) return "tree_mask";
    return e.mbuf != c.mbuf ? "bytes beside tree_mask" : NULL;
}

/* Whether the path's first bound falls beyond its bins: the N-th best of the trie's nodes down to
 * the first depth where they number N (S before any bound) is in the last bin, which prunes
 * nothing (the bench's rule at K = 24 does that). */
static bool first_bound_unbinned(const std::vector<float> &sc, int D, int K, int N) {
    std::vector<float> level{0.0f}, all;
    for (int t = 0; t < D && (int)all.size() < N; t++) {
        std::vector<float> next;
        for (float p : level)
            for (int k = 0; k < K; k++) {
                const float c = __fadd_rn(p, sc[(size_t)t * K + k]);
                if (std::isfinite(c)) next.push_back(c);
            }
        all.insert(all.end(), next.begin(), next.end());
        level.swap(next);
    }
    if ((int)all.size() < N) return false;
    std::nth_element(all.begin(), all.begin() + (N - 1), all.end(), [](float a, float b) { return a > b; });
    return score_bin(all[N - 1]) == kBins - 1;
}

static void check_case(int kind, int D, int K, int N, int *fallbacks) {
    std::vector<float> sc((size_t)D * K);
    for (int d = 0; d < D; d++) fill_row(&sc[(size_t)d * K], K, kind);
    const int off = (int)(rnd() % 16);
    request c(sc.data(), D, K, N, off), e(sc.data(), D, K, N, off);
    c.seq = e.seq = (int32_t)(rnd() % 100000);
    const kdt_status s = kdt_tree_build(&c.p, KDT_BACKEND_CPU, NULL);
    const int n = run_thr(e, D, K, N);
    const char *bad = s != KDT_OK ? "cpu backend failed" : n == -2 ? "threads disagree on the result" : NULL;
    if (!bad && n == -1) {
        /* The pool outgrew its room: ties can (every score in few bins), trees deeper than 16
         * levels, and a first bound beyond the bins' 32 nats (docs/perf/tree_build.md); distinct
         * scores otherwise must not. */
        ++*fallbacks;
        if ((kind == KIND_LOGPROB || kind == KIND_BENCH || kind == KIND_TAILS) && !first_bound_unbinned(sc, D, K, N))
            bad = "the pool outgrew its room on distinct scores";
    } else if (!bad) {
        bad = n != c.num ? "num_nodes (returned)" : compare(e, c, N);
    }
    if (bad && !g_fail++) snprintf(g_first, sizeof g_first, "  first: D=%d K=%d budget=%d: %s", D, K, N, bad);
}

int main(void) {
    const char *env = getenv("KDT_SEED");
    const uint64_t seed = env && *env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    g_rng = seed * 2654435761u + 1;
    int failed = 0;
    for (int kind = 0; kind < N_KINDS; kind++) {
        g_fail = 0;
        int fallbacks = 0, cases = 0;
        for (int i = 0; i < 12; i++, cases++) {
            const int N = 33 + (int)(rnd() % 224), D = kind == KIND_DEEP ? 16 + (int)(rnd() % 49) : 1 + (int)(rnd() % 16);
            const int K = i == 0 ? 1 : i == 1 ? 24 : 2 + (int)(rnd() % 11);
            check_case(kind, D, K, N, &fallbacks);
        }
        printf("%s  tree_build threshold path (emulated on CPU threads) %s: %d cases, %d failed, %d took the fallback, "
               "seed=%llu%s\n", g_fail ? "FAIL" : "PASS", kind_name[kind], cases, g_fail, fallbacks,
               (unsigned long long)seed, g_fail ? g_first : "");
        failed += g_fail != 0;
    }
    return failed ? 1 : 0;
}
