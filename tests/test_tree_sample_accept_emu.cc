/* tree_sample_accept's CUDA device code (src/cuda/tree_sample_accept.cuh, what the kernel runs)
 * executed on CPU threads: one std::thread per CUDA thread of the 1024-thread block, __syncthreads
 * a barrier, warp shuffles and ballots through a per-warp exchange, shared atomics as
 * std::atomic_ref, shared memory poisoned. Each request's outputs are checked against the CPU
 * backend bit for bit, from poisoned arrays: random trees (malformed ones too) whose children the
 * rows favour, temperatures 0 to 1.7, top-k and top-p on and off, deterministic and sampled
 * children, rows with ties, -inf and NaN, tokens outside the vocabulary, V not a multiple of 4 and
 * below 32. So the kernel's logic (barriers, reductions, radix selects, the inverse CDF, the walk)
 * is tested on every machine; the arithmetic here is the C side of common/sample_math.h, and the
 * GPU run (test_tree_sample_accept) proves the compiled kernel's intrinsics give the same bits.
 * Inputs from $KDT_SEED, else the clock. */
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <thread>
#include <vector>

#include "kdt/ops.h"

/* ---- the CUDA subset tree_sample_accept.cuh uses ---- */

constexpr int kEmuThreads = 1024, kEmuWarps = kEmuThreads / 32;
#include "cuda_emu.h"

using std::max;
using std::min;

static std::atomic<int> g_orv; /* __syncthreads_or's vote (one block runs at a time) */
static inline int __syncthreads_or(int v) {
    g_blk->block->arrive_and_wait(); /* the last call's readers are done */
    if (threadIdx.x == 0) g_orv.store(0);
    g_blk->block->arrive_and_wait();
    if (v) g_orv.fetch_or(1);
    g_blk->block->arrive_and_wait();
    return g_orv.load();
}

static inline unsigned long long __shfl_xor_sync(unsigned, unsigned long long v, int m) {
    return exchange(v, (int)(threadIdx.x & 31) ^ m);
}
static inline float __shfl_xor_sync(unsigned, float v, int m) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (uint32_t)exchange(u, (int)(threadIdx.x & 31) ^ m);
    memcpy(&v, &u, 4);
    return v;
}
static inline unsigned long long __shfl_up_sync(unsigned, unsigned long long v, int d) {
    const int lane = (int)threadIdx.x & 31;
    const unsigned long long r = exchange(v, lane >= d ? lane - d : lane);
    return lane >= d ? r : v;
}
static inline unsigned long long __shfl_sync(unsigned, unsigned long long v, int src) { return exchange(v, src); }
static inline float __ldg(const float *p) { return *p; }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
static inline unsigned atomicMin(unsigned *p, unsigned v) {
    std::atomic_ref<unsigned> a(*p);
    unsigned old = a.load();
    while (v < old && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}

#include "cuda/tree_sample_accept.cuh"

static_assert(tsa::kThreads == kEmuThreads, "the emulated block is the kernel's");

/* Runs request b of p on one emulated block (shared memory poisoned, as CUDA leaves it). */
static void run_block(const kdt_tree_sample_accept_params &p, int b) {
    auto s = std::make_unique<tsa::Smem>();
    memset((void *)s.get(), 0xA5, sizeof *s);
    emu_run_block([&](int) { tsa::tsa_request(p, *s, b); });
}

/* ---- inputs ---- */

static uint64_t g_rng;
static uint64_t rnd() { /* splitmix64 */
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double unit() { return (double)(rnd() >> 11) * 0x1p-53; }

struct batch {
    int B, Q, V;
    std::vector<int32_t> tok, par, num, topk;
    std::vector<float> lg, q, temp, topp;
    std::vector<uint64_t> seed;
    std::vector<int32_t> out[4];
    kdt_tree_sample_accept_params p() {
        return {B, Q, V, tok.data(), par.data(), num.data(), lg.data(), q.empty() ? nullptr : q.data(), temp.data(),
                topk.data(), topp.data(), seed.data(), out[0].data(), out[1].data(), out[2].data(), out[3].data()};
    }
};

static batch make(int B, int Q, int V, bool sampled) {
    batch t;
    t.B = B, t.Q = Q, t.V = V;
    const size_t bq = (size_t)B * Q, bqv = bq * V;
    t.tok.assign(bq, -1), t.par.assign(bq, -1), t.num.resize(B), t.topk.resize(B), t.seed.resize(B);
    t.lg.resize(bqv), t.temp.resize(B), t.topp.resize(B);
    if (sampled) t.q.resize(bqv);
    static const float temps[] = {0.0f, 0.5f, 1.0f, 1.0f, 1.7f}, topps[] = {1.0f, 1.0f, 0.9f, 0.5f, 0.0f};
    const int32_t topks[] = {0, 0, 1, 5, V - 1, V + 3};
    for (int b = 0; b < B; b++) {
        const int n = (int)(rnd() % (uint64_t)Q);
        t.num[b] = n, t.temp[b] = temps[rnd() % 5], t.topp[b] = topps[rnd() % 5], t.topk[b] = topks[rnd() % 6];
        t.seed[b] = rnd();
        const int kind = (int)(rnd() % 4); /* 0 plain, 1 quantized (ties), 2 -inf/NaN, 3 a malformed tree */
        for (size_t i = (size_t)b * Q * V; i < (size_t)(b + 1) * Q * V; i++) {
            float x = (float)(3.0 * (unit() - 0.5));
            if (kind == 1) x = std::round(x * 2.0f) / 2.0f;
            if (kind == 2 && rnd() % 7 == 0) x = rnd() % 2 ? -INFINITY : NAN;
            t.lg[i] = x;
            if (sampled) t.q[i] = (float)unit() * 2.0f / (float)V;
        }
        for (int c = 1; c <= n; c++) {
            int32_t *tok = t.tok.data() + (size_t)b * Q, *par = t.par.data() + (size_t)b * Q;
            tok[c] = (int32_t)(rnd() % (uint64_t)(V + 2)) - 1;
            par[c] = unit() < 0.6 ? c - 1 : (int32_t)(rnd() % (uint64_t)c);
            if (tok[c] >= 0 && tok[c] < V) t.lg[((size_t)b * Q + par[c]) * V + tok[c]] += 5.0f;
        }
        if (kind == 3 && n >= 2) t.par[(size_t)b * Q + 1 + rnd() % (uint64_t)n] = n + 1;
    }
    for (auto &o : t.out) o.assign(bq, -7);
    return t;
}

static int g_fail;

static void check(int B, int Q, int V, bool sampled) {
    batch t = make(B, Q, V, sampled);
    kdt_tree_sample_accept_params p = t.p();
    std::vector<int32_t> want[4];
    kdt_status s = kdt_tree_sample_accept(&p, KDT_BACKEND_CPU, nullptr);
    for (int i = 0; i < 4; i++) want[i] = t.out[i], t.out[i].assign(t.out[i].size(), -7);
    for (int b = 0; s == KDT_OK && b < B; b++) run_block(p, b);
    int bad = -1;
    size_t at = 0;
    const size_t len[4] = {(size_t)B, (size_t)B * Q, (size_t)B * Q, (size_t)B};
    for (int i = 0; i < 4 && bad < 0; i++)
        for (size_t j = 0; j < len[i] && bad < 0; j++)
            if (t.out[i][j] != want[i][j]) bad = i, at = j;
    static const char *names[4] = {"accept_len", "accept_index", "accept_tokens", "status"};
    long acc = 0;
    for (int b = 0; b < B; b++) acc += want[0][b];
    if (s != KDT_OK || bad >= 0) g_fail = 1;
    if (s != KDT_OK)
        printf("FAIL  tree_sample_accept emulated block B=%d Q=%d V=%d: cpu reference: %s\n", B, Q, V, kdt_last_error());
    else if (bad >= 0)
        printf("FAIL  tree_sample_accept emulated block B=%d Q=%d V=%d %s: %s[%zu] emulated %d cpu %d\n", B, Q, V,
               sampled ? "sampled" : "deterministic", names[bad], at, t.out[bad][at], want[bad][at]);
    else
        printf("PASS  tree_sample_accept emulated block B=%d Q=%d V=%d %s: every output equals the cpu's (%ld accepted)\n",
               B, Q, V, sampled ? "sampled" : "deterministic", acc);
}

int main() {
    const char *env = getenv("KDT_SEED");
    g_rng = env ? strtoull(env, nullptr, 10) : (uint64_t)time(nullptr);
    setvbuf(stdout, nullptr, _IOLBF, 0);
    printf("inputs: splitmix64 state %llu (KDT_SEED replays)\n", (unsigned long long)g_rng);
    check(2, 9, 8197, false); /* V past 8 x 1024: the unrolled loads; a block is ~1 to 4 s here */
    check(2, 9, 8197, true);  /* the same with the draft row read beside the logits */
    check(3, 17, 61, true);
    check(2, 33, 1027, false);
    check(2, 9, 300, true);
    return g_fail;
}
