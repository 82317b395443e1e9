/* The one-block router (src/model/cuda/route.cuh, launched by route.cu) executed on CPU threads
 * (tests/cuda_emu.h: a std::thread per CUDA thread, barriers, warp exchanges), against a
 * reference written here from DeepSeek-V3's routing: scores in double, sigmoid, the groups'
 * two best biased scores, top-k groups, top-K experts, normalized weights times the scale, and
 * the grouping by expert (counts, offsets, each expert's assignments in order, their places).
 * Cases: grouped and ungrouped, scores computed by the block or given, more rows than warps (and
 * than the warps allowed to route), Kimi K2's 384 experts and DeepSeek-V3's groups, up to 64 rows, a
 * tie. Also: a row's results have the same bits alone and in a batch (the scores' order
 * does not depend on the batch). And the wide router (route_wide_block: blocks run one after another,
 * each on its threads): teams of 4 and 8 warps, the layer's norm in the launch (within 1e-6 of a
 * double norm) or h given, the last block's choice and grouping against the reference, the ticket
 * back at zero, row 0's bits the same alone (norm in the launch) and in a batch (h given). */
#pragma GCC optimize("no-strict-aliasing")

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

constexpr int kEmuWarps = 8;
#include "cuda_emu.h"

/* ---- the rest of the CUDA subset route.cuh uses ---- */
struct emu_dim {
    unsigned x;
};
static const emu_dim blockDim = {32 * kEmuWarps};
static emu_dim blockIdx, gridDim; /* the wide router's grid: its blocks run one after another */
static inline void __threadfence() {}
static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
struct float4 {
    float x, y, z, w;
};
struct __nv_bfloat16 {
    uint16_t bits;
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { /* round to nearest even (no NaN here) */
    uint32_t u;
    memcpy(&u, &f, 4);
    return {(uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}
static inline void __syncwarp() { g_blk->warp[threadIdx.x >> 5]->arrive_and_wait(); }
static inline float __shfl_xor_sync(unsigned, float v, int mask) {
    uint32_t u;
    memcpy(&u, &v, 4);
    const uint32_t r = (uint32_t)exchange(u, (int)(threadIdx.x & 31) ^ mask);
    float f;
    memcpy(&f, &r, 4);
    return f;
}
static inline int __shfl_xor_sync(unsigned, int v, int mask) {
    return (int)(int64_t)exchange((uint64_t)(int64_t)v, (int)(threadIdx.x & 31) ^ mask);
}
static inline int __shfl_up_sync(unsigned, int v, int delta) { /* lanes below delta get their own */
    const int lane = (int)(threadIdx.x & 31);
    return (int)(int64_t)exchange((uint64_t)(int64_t)v, lane >= delta ? lane - delta : lane);
}
static inline unsigned long long atomicOr(unsigned long long *p, unsigned long long v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
static inline float __ldcg(const float *p) { return *p; }
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
/* The warp's largest (or smallest) v: every lane posts, then reads all 32. */
static inline unsigned emu_reduce(unsigned v, bool largest) {
    const int w = (int)threadIdx.x >> 5;
    g_blk->xchg[w][threadIdx.x & 31] = v;
    g_blk->warp[w]->arrive_and_wait();
    unsigned r = v;
    for (int i = 0; i < 32; i++) {
        const unsigned o = (unsigned)g_blk->xchg[w][i];
        r = largest ? std::max(r, o) : std::min(r, o);
    }
    g_blk->warp[w]->arrive_and_wait();
    return r;
}
static inline unsigned __reduce_max_sync(unsigned, unsigned v) { return emu_reduce(v, true); }
static inline unsigned __reduce_min_sync(unsigned, unsigned v) { return emu_reduce(v, false); }

#include "model/cuda/norm.cuh"
#include "model/cuda/route.cuh"

static uint64_t g_rng = 0x524F5554;
static uint32_t rnd() {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 32);
}
static float uni() { return (float)rnd() * (2.0f / 4294967296.0f) - 1.0f; }

static int g_fail;

struct Out {
    std::vector<float> logits, wt;
    std::vector<int32_t> idx, counts, offs, perm, pos;
};

/* Outputs for R rows, E experts, top K, poisoned (NaN, -7) so that an unwritten one shows. */
static Out poisoned_out(int R, int E, int K) {
    Out o;
    o.logits.assign((size_t)R * E, NAN);
    o.wt.assign((size_t)R * K, NAN);
    o.idx.assign((size_t)R * K, -7);
    o.counts.assign(E, -7);
    o.offs.assign(E, -7);
    o.perm.assign((size_t)R * K, -7);
    o.pos.assign((size_t)R * K, -7);
    return o;
}

/* The kernel on R rows (h [R, hid], w [E, hid], bias [E]); scores: the block computes them,
 * else they are given (logits_in). */
static Out run_kernel(const std::vector<float> &h, const std::vector<float> &w, const std::vector<float> &bias,
                      const std::vector<float> &logits_in, int R, int E, int G, int tg, int K, int hid, bool scores, int most = 0) {
    Out o = poisoned_out(R, E, K);
    if (!scores) o.logits = logits_in;
    RoutePlanArgs a = {scores ? h.data() : nullptr, w.data(), o.logits.data(), bias.data(), R, E, G, tg, K, hid, 1, 2.5f,
                       o.idx.data(), o.wt.data(), o.counts.data(), o.offs.data(), o.perm.data(), o.pos.data(), most};
    std::vector<unsigned long long> smem((size_t)route_plan_smem_bytes(route_warps(kEmuWarps, R, most), E, G, K) / 8 + 1, 0xA5A5A5A5A5A5A5A5ull);
    emu_run_block([&](int) { route_plan_block(a, (unsigned char *)smem.data()); });
    return o;
}

/* Checks o against the reference; returns the largest weight error. */
static bool check(const char *name, const Out &o, const std::vector<float> &h, const std::vector<float> &w,
                  const std::vector<float> &bias, int R, int E, int G, int tg, int K, int hid, bool scores) {
    bool ok = true;
    double err_logit = 0, err_wt = 0;
    const int per = E / G;
    std::vector<int> counts(E, 0);
    for (int r = 0; r < R; r++) {
        std::vector<double> s(E), c(E);
        for (int e = 0; e < E; e++) {
            double l = 0;
            for (int i = 0; i < hid; i++) l += (double)h[(size_t)r * hid + i] * w[(size_t)e * hid + i];
            if (scores) err_logit = std::max(err_logit, fabs(l - o.logits[(size_t)r * E + e]));
            else l = o.logits[(size_t)r * E + e]; /* given: the reference starts from the same scores */
            s[e] = 1.0 / (1.0 + exp(-l));
            c[e] = s[e] + bias[e];
        }
        std::vector<std::pair<double, int>> gs;
        for (int g = 0; g < G; g++) {
            std::vector<double> m(c.begin() + g * per, c.begin() + (g + 1) * per);
            std::sort(m.rbegin(), m.rend());
            gs.push_back({-(per >= 2 ? m[0] + m[1] : m[0]), g});
        }
        std::sort(gs.begin(), gs.end());
        std::vector<std::pair<double, int>> cand;
        for (int i = 0; i < tg; i++)
            for (int e = gs[i].second * per; e < (gs[i].second + 1) * per; e++) cand.push_back({-c[e], e});
        std::sort(cand.begin(), cand.end());
        double sum = 0;
        for (int k = 0; k < K; k++) sum += s[cand[k].second];
        for (int k = 0; k < K; k++) {
            const int e = cand[k].second;
            ok &= o.idx[(size_t)r * K + k] == e;
            err_wt = std::max(err_wt, fabs(s[e] / (sum + 1e-20) * 2.5 - o.wt[(size_t)r * K + k]));
            counts[e]++;
        }
    }
    for (int e = 0, off = 0; e < E; off += counts[e], e++) {
        ok &= o.counts[e] == counts[e] && o.offs[e] == off;
        for (int i = 0, j = 0; i < counts[e]; i++, j++) { /* expert e's assignments, increasing */
            while (o.idx[j] != e) j++;
            ok &= o.perm[off + i] == j && o.pos[j] == off + i;
        }
    }
    ok &= err_logit <= 1e-5 && err_wt <= 1e-5;
    g_fail += !ok;
    printf("%s  route_plan (emulated) %s: R %d E %d G %d topk_group %d K %d hid %d%s: experts and grouping %s, scores %.1e, "
           "weights %.1e (<= 1e-5)\n",
           ok ? "PASS" : "FAIL", name, R, E, G, tg, K, hid, scores ? ", scores in the block" : "", ok ? "exact" : "WRONG",
           err_logit, err_wt);
    return ok;
}

static void run_case(const char *name, int R, int E, int G, int tg, int K, int hid, bool scores, Out *keep = nullptr, int most = 0) {
    g_rng = 0x524F5554 + (uint64_t)R * 131 + (uint64_t)E;
    std::vector<float> h((size_t)R * hid), w((size_t)E * hid), bias(E), logits((size_t)R * E);
    for (auto &v : w) v = uni() * 0.3f;
    for (auto &v : bias) v = uni() * 0.05f;
    for (auto &v : h) v = uni();
    for (auto &v : logits) v = uni() * 3.0f;
    if (!scores && R > 1) { /* experts 0 and 1 tie on row 1: the lower index goes first */
        bias[1] = bias[0];
        logits[E + 1] = logits[E] = 2.5f;
    }
    Out o = run_kernel(h, w, bias, logits, R, E, G, tg, K, hid, scores, most);
    check(name, o, h, w, bias, R, E, G, tg, K, hid, scores);
    if (keep) *keep = o;
}

/* The wide router (route_wide_block) over its grid, team warps per expert, on R rows: with fold the
 * layer's norm of x [R, hid] (weights nw) first, else h is given. Its outputs in an Out, h in *h_out. */
static Out run_wide(const std::vector<float> &x, const std::vector<float> &nw, const std::vector<float> &h_in,
                    const std::vector<float> &w, const std::vector<float> &bias, int R, int E, int G, int tg, int K, int hid, int team,
                    bool fold, std::vector<float> *h_out, int *ticket_left) {
    Out o = poisoned_out(R, E, K);
    h_out->assign((size_t)R * hid, NAN);
    std::vector<__nv_bfloat16> hn((size_t)R * hid);
    RoutePlanArgs a = {fold ? h_out->data() : h_in.data(), w.data(), o.logits.data(), bias.data(), R, E, G, tg, K, hid, 1, 2.5f,
                       o.idx.data(), o.wt.data(), o.counts.data(), o.offs.data(), o.perm.data(), o.pos.data(), kEmuWarps};
    const RouteNorm n = {x.data(), nw.data(), 1e-6f, h_out->data(), hn.data(), 1};
    std::vector<unsigned long long> smem((size_t)route_plan_smem_bytes(route_warps(kEmuWarps, R, kEmuWarps), E, G, K) / 8 + 1);
    RouteWideShared sh;
    int ticket = 0;
    const int per = kEmuWarps / team;
    gridDim.x = (unsigned)((E + per - 1) / per);
    for (blockIdx.x = 0; blockIdx.x < gridDim.x; blockIdx.x++)
        emu_run_block([&](int) {
            if (fold) route_wide_block<true>(a, n, team, &ticket, (unsigned char *)smem.data(), sh);
            else route_wide_block<false>(a, n, team, &ticket, (unsigned char *)smem.data(), sh);
        });
    if (!fold) *h_out = h_in;
    *ticket_left = ticket;
    return o;
}

/* The wide router on one row (its norm in the launch) and on R rows (h given, row 0 the first run's h):
 * each against the reference; the norm within 1e-6 of a double one; row 0's scores and choice the
 * same bits in both; the ticket back at zero. */
static void wide_case(int R, int E, int G, int tg, int K, int hid, int team) {
    g_rng = 0x57494445 + (uint64_t)R * 131 + (uint64_t)E;
    std::vector<float> x((size_t)R * hid), nw(hid), w((size_t)E * hid), bias(E), h1, hR, h_in;
    for (auto &v : x) v = 2.0f * uni();
    for (auto &v : nw) v = 1.0f + 0.3f * uni();
    for (auto &v : w) v = uni() * 0.3f;
    for (auto &v : bias) v = uni() * 0.05f;
    int left1 = -1, leftR = -1;
    const Out one = run_wide(x, nw, {}, w, bias, 1, E, G, tg, K, hid, team, true, &h1, &left1);
    double err_h = 0, ss = 0;
    for (int i = 0; i < hid; i++) ss += (double)x[i] * x[i];
    for (int i = 0; i < hid; i++) {
        const double want = nw[i] * x[i] / sqrt(ss / hid + 1e-6);
        err_h = std::max(err_h, fabs(h1[i] - want) / (fabs(want) + 1e-3));
    }
    const bool ok1 = check("wide, 1 row, norm in the launch", one, h1, w, bias, 1, E, G, tg, K, hid, true) && err_h <= 1e-6 && left1 == 0;
    h_in.assign((size_t)R * hid, 0.f);
    for (auto &v : h_in) v = uni();
    std::copy(h1.begin(), h1.end(), h_in.begin());
    const Out all = run_wide(x, nw, h_in, w, bias, R, E, G, tg, K, hid, team, false, &hR, &leftR);
    const bool okR = check("wide, h given", all, h_in, w, bias, R, E, G, tg, K, hid, true) && leftR == 0;
    const bool same = !memcmp(one.logits.data(), all.logits.data(), (size_t)E * 4) && !memcmp(one.idx.data(), all.idx.data(), (size_t)K * 4) &&
                      !memcmp(one.wt.data(), all.wt.data(), (size_t)K * 4);
    g_fail += !(ok1 && okR && same);
    printf("%s  route_wide (emulated, %d blocks of %d warps, teams of %d): E %d hid %d: norm %.1e (<= 1e-6), tickets left %d %d, row 0 "
           "alone (norm in the launch) and in %d rows (h given): %s\n",
           ok1 && okR && same ? "PASS" : "FAIL", (E + kEmuWarps / team - 1) / (kEmuWarps / team), kEmuWarps, team, E, hid, err_h, left1,
           leftR, R, same ? "the same bits" : "DIFFERENT");
}

int main() {
    run_case("decode", 1, 8, 1, 1, 2, 256, true);
    run_case("tree", 16, 8, 1, 1, 2, 40, true);
    run_case("grouped", 5, 16, 4, 2, 4, 24, true);
    run_case("scores given, rows past the warps", 20, 64, 8, 4, 8, 8, false);
    run_case("scores given, a tie", 3, 32, 1, 1, 6, 8, false);
    run_case("Kimi K2 decode", 1, 384, 1, 1, 8, 8, false);
    run_case("Kimi K2, 64 rows (the most)", 64, 384, 1, 1, 8, 8, false);
    run_case("DeepSeek-V3 tree", 16, 256, 8, 4, 8, 8, false);
    run_case("Kimi K2 tree, 3 warps route", 16, 384, 1, 1, 8, 8, false, nullptr, 3);
    wide_case(5, 64, 1, 1, 8, 1024, 4);
    wide_case(16, 32, 4, 2, 6, 512, 8);
    wide_case(17, 16, 1, 1, 8, 2048, 8); /* a 17-row tree of a 16-expert router: past 4-row chunks by one */
    wide_case(64, 384, 1, 1, 8, 512, 8);  /* Kimi K2's experts, the most rows */
    /* Row 0 alone and first in a batch of 12 rows: same scores and choice, bit for bit. */
    Out alone, batch;
    run_case("row 0 alone", 1, 16, 4, 2, 4, 72, true, &alone);
    { /* the single case's seed, so that row 0 and the weights are the same */
        const int R = 12, E = 16, hid = 72;
        g_rng = 0x524F5554 + 1 * 131 + (uint64_t)E;
        std::vector<float> h((size_t)R * hid), w((size_t)E * hid), bias(E), logits;
        for (auto &v : w) v = uni() * 0.3f;
        for (auto &v : bias) v = uni() * 0.05f;
        for (auto &v : h) v = uni();
        batch = run_kernel(h, w, bias, logits, R, E, 4, 2, 4, hid, true);
        check("row 0 in a batch of 12", batch, h, w, bias, R, E, 4, 2, 4, hid, true);
    }
    const bool same = !memcmp(alone.logits.data(), batch.logits.data(), 16 * sizeof(float)) &&
                      !memcmp(alone.wt.data(), batch.wt.data(), 4 * sizeof(float)) &&
                      !memcmp(alone.idx.data(), batch.idx.data(), 4 * sizeof(int32_t));
    g_fail += !same;
    printf("%s  route_plan (emulated): row 0's scores, experts and weights have the same bits alone and in a batch of 12\n",
           same ? "PASS" : "FAIL");
    return g_fail ? 1 : 0;
}
