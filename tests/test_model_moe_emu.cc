/* The small-batch MoE kernel (src/model/cuda/moe.cuh, the device code moe.cu launches)
 * executed on CPU threads: one std::thread per CUDA thread of a block (the block's threads walk the
 * grid together), __syncthreads a barrier, shuffles through a per-warp exchange. Checked against
 * a double-precision reference of the same products (bf16 inputs as the kernel reads them): the
 * routed form (gate/up with the SiLU product, then down) and the dense form (one "expert" of all
 * rows, down added to its output), in f32 and bf16, with partial column tiles, rows longer than
 * one staged chunk, experts with more rows than one pass holds or one block's slice (grid z); and a row's outputs have the same
 * bits alone and inside a batch. A GPU run proves the compiled kernel (test_model_graph). */
/* The kernel reads bf16 and f32 arrays through uint4 / float4 lvalues, as CUDA code does. */
#pragma GCC optimize("no-strict-aliasing")

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

/* ---- the CUDA subset moe.cuh uses ---- */

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__

using std::min;
struct dim3 {
    unsigned x, y, z;
};
struct float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
static float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
struct __nv_bfloat16 {
    uint16_t bits;
};
struct __nv_bfloat162 {
    __nv_bfloat16 lo, hi;
};
static float bf16_to_f32(__nv_bfloat16 b) {
    const uint32_t u = (uint32_t)b.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static __nv_bfloat16 __float2bfloat16_rn(float f) { /* finite inputs only */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return {(uint16_t)(u >> 16)};
}
static float2 __bfloat1622float2(__nv_bfloat162 v) { return {bf16_to_f32(v.lo), bf16_to_f32(v.hi)}; }

static thread_local dim3 threadIdx, blockIdx, gridDim;
static std::barrier<> *g_block, *g_warp[8];
static float g_xchg[8][32];
static void __syncthreads() { g_block->arrive_and_wait(); }
static float __shfl_xor_sync(unsigned, float v, int mask) {
    const int w = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    g_xchg[w][lane] = v;
    g_warp[w]->arrive_and_wait();
    const float r = g_xchg[w][lane ^ mask];
    g_warp[w]->arrive_and_wait();
    return r;
}

static void kdt_pdl_begin() {} /* programmatic dependent launch: nothing to wait for here */

#include "model/cuda/moe.cuh"
#include "model/quant.h"

/* ---- emulated launches ---- */

/* Runs kern() as a grid (gx, gy, gz) of kThreads-thread blocks, one block at a time. */
template <typename F>
static void launch(unsigned gx, unsigned gy, unsigned gz, F kern) {
    std::barrier<> block(kThreads);
    g_block = &block;
    for (int w = 0; w < kWarps; w++) g_warp[w] = new std::barrier<>(32);
    std::vector<std::thread> th;
    for (unsigned t = 0; t < (unsigned)kThreads; t++)
        th.emplace_back([=, &block] {
            threadIdx = {t, 0, 0};
            gridDim = {gx, gy, gz};
            for (unsigned bz = 0; bz < gz; bz++)
                for (unsigned by = 0; by < gy; by++)
                    for (unsigned bx = 0; bx < gx; bx++) {
                        blockIdx = {bx, by, bz};
                        kern();
                        block.arrive_and_wait(); /* the block is over before the next one stages */
                    }
        });
    for (auto &x : th) x.join();
    for (int w = 0; w < kWarps; w++) delete g_warp[w];
}

typedef __nv_bfloat16 bf16;
static float to_f(float v) { return v; }
static float to_f(bf16 v) { return bf16_to_f32(v); }

static uint64_t g_rng = 0x4D4F45;
static uint32_t rnd() {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 32); /* all 32 bits: with >> 33, uni() was [-1, 0) only */
}
static float uni() { return (float)rnd() * (2.0f / 4294967296.0f) - 1.0f; } /* [-1, 1) */

static int g_fail;

/* One case: R rows, each routed to K distinct of E experts (dense: one expert, all rows), hidden
 * hid, expert width I. Returns the outputs (act then out) for the bit comparison. */
/* Quantized experts as the forward holds them (kdt_dlin) and their dequantization by the CPU's
 * dequantizers (src/model/quant.c), the reference: gate/up E x [2I, hid] in two parts when FP8's
 * 128-row blocks cannot span the stack (I % 128 != 0), down E x [hid, I]. */
struct QExperts {
    std::vector<uint8_t> w[3], s[3]; /* gate/up parts 0 and 1, down */
    std::vector<float> gu, d;        /* dequantized [E, 2I, hid], [E, hid, I] */
};

/* n matrices [rows, cols] of random codes and scales, dequantized into out (matrix stride `stride`
 * rows of cols, from row `at`). FP8 codes keep |v| < 2 (top exponent bit clear). */
static void q_make(bool int4, int n, int rows, int cols, std::vector<uint8_t> &w, std::vector<uint8_t> &s, float *out,
                   int stride, int at) {
    const size_t rb = int4 ? cols / 2 : cols, sb = int4 ? (size_t)rows * (cols / 32) * 2 : (size_t)((rows + 127) / 128) * ((cols + 127) / 128) * 4;
    w.resize(n * rows * rb);
    s.resize(n * sb);
    for (auto &b : w) b = (uint8_t)(rnd() & (int4 ? 0xFF : 0xBF));
    for (size_t i = 0; i < s.size(); i += int4 ? 2 : 4) {
        const float v = (0.05f + 0.02f * uni()) * (int4 ? 0.1f : 1.0f);
        if (int4) {
            const bf16 h = from_f32<bf16>(v);
            memcpy(&s[i], &h, 2);
        } else {
            memcpy(&s[i], &v, 4);
        }
    }
    std::vector<float> tmp((size_t)rows * cols);
    for (int e = 0; e < n; e++) {
        if (int4) kdt_dequant_int4(&w[e * rows * rb], &s[e * sb], rows, cols, 32, tmp.data());
        else kdt_dequant_fp8(&w[e * rows * rb], &s[e * sb], rows, cols, 128, 128, tmp.data());
        memcpy(out + ((size_t)e * stride + at) * cols, tmp.data(), tmp.size() * sizeof(float));
    }
}

static QExperts q_experts(bool int4, int E, int hid, int I) {
    QExperts q;
    q.gu.resize((size_t)E * 2 * I * hid);
    q.d.resize((size_t)E * hid * I);
    if (int4 || I % 128 == 0) {
        q_make(int4, E, 2 * I, hid, q.w[0], q.s[0], q.gu.data(), 2 * I, 0);
    } else {
        q_make(int4, E, I, hid, q.w[0], q.s[0], q.gu.data(), 2 * I, 0);
        q_make(int4, E, I, hid, q.w[1], q.s[1], q.gu.data(), 2 * I, I);
    }
    q_make(int4, E, hid, I, q.w[2], q.s[2], q.d.data(), hid, 0);
    return q;
}

template <bool kInt4> static WQuant<kInt4> q_reader(const QExperts &q, int p0, int p1, int N, int N0, int K) {
    return {{q.w[p0].data(), q.w[p1].data()}, {q.s[p0].data(), q.s[p1].data()}, N, N0, K};
}

/* kFmt: 0 weights in T, 1 FP8, 2 INT4 (T bf16). */
template <typename T, int kRows, int kFmt = 0>
static std::vector<float> run_case(const char *name, int R, int K, int E, int hid, int I, bool dense,
                                   const std::vector<int> *fixed_route = nullptr) {
    g_rng = 0x4D4F45; /* the same weights and first rows in every case of one shape */
    std::vector<T> x((size_t)R * hid), wgu((size_t)E * 2 * I * hid), wd((size_t)E * hid * I);
    for (auto &v : wgu) v = from_f32<T>(uni() * 0.2f);
    for (auto &v : wd) v = from_f32<T>(uni() * 0.2f);
    const QExperts q = kFmt ? q_experts(kFmt == 2, E, hid, I) : QExperts{};
    std::vector<float> rgu(wgu.size()), rd(wd.size()); /* the reference's weights */
    for (size_t i = 0; i < wgu.size(); i++) rgu[i] = kFmt ? q.gu[i] : to_f(wgu[i]);
    for (size_t i = 0; i < wd.size(); i++) rd[i] = kFmt ? q.d[i] : to_f(wd[i]);
    for (auto &v : x) v = from_f32<T>(uni());
    std::vector<int> idx((size_t)R * K);
    for (int r = 0; r < R; r++) {
        std::vector<int> e(E);
        for (int i = 0; i < E; i++) e[i] = i;
        for (int k = 0; k < K; k++) {
            std::swap(e[k], e[k + (int)(rnd() % (uint32_t)(E - k))]);
            idx[(size_t)r * K + k] = fixed_route && r == 0 ? (*fixed_route)[k] : e[k];
        }
    }
    const int n = R * K;
    std::vector<int> counts(E, 0), offs(E), perm(n);
    for (int j = 0; j < n; j++) counts[idx[j]]++;
    for (int e = 0, o = 0; e < E; o += counts[e], e++) offs[e] = o;
    std::vector<int> fill(offs);
    for (int j = 0; j < n; j++) perm[fill[idx[j]]++] = j;
    std::vector<T> act((size_t)n * I);
    std::vector<float> out((size_t)n * hid, dense ? 0.5f : NAN);
    const T *xp = x.data(), *wg = wgu.data(), *wdp = wd.data();
    const int *pp = dense ? nullptr : perm.data(), *cp = dense ? nullptr : counts.data(), *op = offs.data();
    T *ap = act.data();
    float *yp = out.data();
    const unsigned gy = dense ? 1u : (unsigned)E, gu_cols = kWarps * kW / 2, down_cols = kWarps * kW;
    const unsigned gz = (unsigned)((R + kSliceRows - 1) / kSliceRows); /* as moe.cu's slices() */
    if (kFmt) {
        const int N0 = q.w[1].empty() ? 2 * I : I;
        const WQuant<kFmt == 2> qg = q_reader<kFmt == 2>(q, 0, N0 == I, 2 * I, N0, hid), qd = q_reader<kFmt == 2>(q, 2, 2, hid, hid, I);
        launch((I + gu_cols - 1) / gu_cols, gy, gz, [=] { moe_small_kernel<T, true, kRows>(xp, pp, K, cp, op, qg, hid, I, ap, R, false); });
        launch((hid + down_cols - 1) / down_cols, gy, gz,
               [=] { moe_small_kernel<T, false, kRows>(ap, pp, K, cp, op, qd, I, hid, yp, R, dense); });
    } else {
        launch((I + gu_cols - 1) / gu_cols, gy, gz,
               [=] { moe_small_kernel<T, true, kRows>(xp, pp, K, cp, op, WPlain<T>{wg}, hid, I, ap, R, false); });
        launch((hid + down_cols - 1) / down_cols, gy, gz,
               [=] { moe_small_kernel<T, false, kRows>(ap, pp, K, cp, op, WPlain<T>{wdp}, I, hid, yp, R, dense); });
    }
    double err_act = 0, err_out = 0;
    for (int p = 0; p < n; p++) {
        const int e = idx[perm[p]], row = perm[p] / K;
        for (int c = 0; c < I; c++) {
            double g = 0, u = 0;
            for (int i = 0; i < hid; i++) {
                g += (double)to_f(x[(size_t)row * hid + i]) * rgu[((size_t)e * 2 * I + c) * hid + i];
                u += (double)to_f(x[(size_t)row * hid + i]) * rgu[((size_t)e * 2 * I + I + c) * hid + i];
            }
            const double a = g / (1.0 + exp(-g)) * u;
            err_act = std::max(err_act, fabs(a - to_f(act[(size_t)p * I + c])) / (fabs(a) + 1e-2));
        }
        for (int c = 0; c < hid; c++) {
            double y = dense ? 0.5 : 0.0;
            for (int i = 0; i < I; i++) y += (double)to_f(act[(size_t)p * I + i]) * rd[((size_t)e * hid + c) * I + i];
            err_out = std::max(err_out, fabs(y - out[(size_t)p * hid + c]) / (fabs(y) + 1e-2));
        }
    }
    const double tol_act = sizeof(T) == 2 ? 8e-3 : 1e-5; /* bf16: act is rounded to bf16 */
    const bool ok = err_act <= tol_act && err_out <= 1e-5;
    g_fail += !ok;
    printf("%s  moe kernel (emulated) %s %s%s, %d rows/pass: R %d K %d E %d hid %d I %d: act %.1e (<= %.0e), out %.1e (<= 1e-5)\n",
           ok ? "PASS" : "FAIL", name, sizeof(T) == 2 ? "bf16" : "f32", kFmt == 1 ? ", FP8 experts" : kFmt == 2 ? ", INT4 experts" : "",
           kRows, R, K, E, hid, I, err_act, tol_act, err_out);
    std::vector<float> res;
    for (int p = 0; p < n; p++) /* row 0's outputs in choice order, for the batch check */
        if (perm[p] / K == 0)
            for (int c = 0; c < hid; c++) res.push_back(out[(size_t)p * hid + c]);
    return res;
}

/* kernels.cu's rmsnorm of row x [n] as that kernel sums it (256 threads, lane-strided fmaf, a
 * butterfly per warp, one over the 8 warps' sums), the output rounded to T. */
template <typename T> static void rmsnorm_ref(const float *x, const float *w, int n, float eps, T *out) {
    float lane[256], part[32] = {};
    for (int t = 0; t < 256; t++) {
        lane[t] = 0.f;
        for (int j = t; j < n; j += 256) lane[t] = fmaf(x[j], x[j], lane[t]);
    }
    auto butterfly = [](float *v) {
        for (int o = 16; o > 0; o >>= 1) {
            float nv[32];
            for (int l = 0; l < 32; l++) nv[l] = v[l] + v[l ^ o];
            memcpy(v, nv, sizeof nv);
        }
    };
    for (int w = 0; w < 8; w++) {
        butterfly(lane + 32 * w);
        part[w] = lane[32 * w];
    }
    butterfly(part);
    const float inv = 1.0f / sqrtf(part[0] / (float)n + eps);
    for (int j = 0; j < n; j++) out[j] = from_f32<T>(w[j] * (x[j] * inv));
}

/* The dense product with its input normalized while staged (NormIn, rows picked by index) against
 * the same product of rows normalized first as kernels.cu's rmsnorm does: the same bits. */
template <typename T, int kRows> static void run_norm_case(int R, int n_in, int N) {
    std::vector<float> x((size_t)(R + 3) * n_in), nw(n_in), y0((size_t)R * N, NAN), y1((size_t)R * N, NAN);
    std::vector<T> w((size_t)N * n_in), xn((size_t)R * n_in);
    std::vector<int32_t> rows(R);
    for (auto &v : x) v = uni() * 3.0f;
    for (auto &v : nw) v = 1.0f + 0.5f * uni();
    for (auto &v : w) v = from_f32<T>(uni() * 0.2f);
    for (int r = 0; r < R; r++) {
        rows[r] = (r * 7 + 2) % (R + 3);
        rmsnorm_ref<T>(&x[(size_t)rows[r] * n_in], nw.data(), n_in, 1e-6f, &xn[(size_t)r * n_in]);
    }
    const unsigned gx = (unsigned)((N + kWarps * kW - 1) / (kWarps * kW)), gz = (unsigned)((R + kSliceRows - 1) / kSliceRows);
    const T *xp = xn.data(), *wp = w.data();
    float *p0 = y0.data(), *p1 = y1.data();
    const NormIn nin = {x.data(), nw.data(), rows.data(), 1e-6f};
    launch(gx, 1, gz, [=] { moe_small_kernel<T, false, kRows>(xp, nullptr, 1, nullptr, nullptr, WPlain<T>{wp}, n_in, N, p0, R, false); });
    launch(gx, 1, gz, [=] { moe_small_kernel<T, false, kRows>(nullptr, nullptr, 1, nullptr, nullptr, WPlain<T>{wp}, n_in, N, p1, R, false, nin); });
    const bool ok = !memcmp(y0.data(), y1.data(), y0.size() * sizeof(float)) && !std::isnan(y1[0]);
    g_fail += !ok;
    printf("%s  moe kernel (emulated) dense %s, %d rows/pass: R %d K %d N %d, the norm made while staging (rows by index) = "
           "kernels.cu's rmsnorm first, bit for bit\n", ok ? "PASS" : "FAIL", sizeof(T) == 2 ? "bf16" : "f32", kRows, R, n_in, N);
}

/* A MoE layer's shared expert as one more grid row of the routed experts' launches (WShared,
 * shared_off) against the routed experts alone and the shared expert as a dense product: the same
 * bits, rows R * K + r for the shared expert. */
template <typename T, int kRows> static void run_shared_case(int R, int K, int E, int hid, int I) {
    std::vector<T> x((size_t)R * hid), wgu((size_t)E * 2 * I * hid), wd((size_t)E * hid * I), sgu((size_t)2 * I * hid), sd((size_t)hid * I);
    for (auto *v : {&x, &wgu, &wd, &sgu, &sd})
        for (auto &e : *v) e = from_f32<T>(uni() * 0.5f);
    const int n = R * K;
    std::vector<int> idx(n), counts(E, 0), offs(E), perm(n);
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) idx[(size_t)r * K + k] = (r + 3 * k) % E; /* distinct per row while K <= E / 3 */
    for (int j = 0; j < n; j++) counts[idx[j]]++;
    for (int e = 0, o = 0; e < E; o += counts[e], e++) offs[e] = o;
    std::vector<int> fill(offs);
    for (int j = 0; j < n; j++) perm[fill[idx[j]]++] = j;
    std::vector<T> act((size_t)(n + R) * I), act_r((size_t)n * I), act_s((size_t)R * I);
    std::vector<float> ye((size_t)(n + R) * hid, NAN), ye_r((size_t)n * hid, NAN), ye_s((size_t)R * hid, NAN);
    const T *xp = x.data(), *g = wgu.data(), *d = wd.data(), *sg = sgu.data(), *sdp = sd.data();
    const int *pp = perm.data(), *cp = counts.data(), *op = offs.data();
    T *a = act.data(), *ar = act_r.data(), *as = act_s.data();
    float *y = ye.data(), *yr = ye_r.data(), *ys = ye_s.data();
    const unsigned gu = (unsigned)((I + kWarps * kW / 2 - 1) / (kWarps * kW / 2)), dn = (unsigned)((hid + kWarps * kW - 1) / (kWarps * kW));
    const WShared<T> wsg = {g, sg, E}, wsd = {d, sdp, E};
    launch(gu, E + 1, 1, [=] { moe_small_kernel<T, true, kRows>(xp, pp, K, cp, op, wsg, hid, I, a, R, false, NormIn{}, n); });
    launch(dn, E + 1, 1, [=] { moe_small_kernel<T, false, kRows>(a, pp, K, cp, op, wsd, I, hid, y, R, false, NormIn{}, n); });
    launch(gu, E, 1, [=] { moe_small_kernel<T, true, kRows>(xp, pp, K, cp, op, WPlain<T>{g}, hid, I, ar, R, false); });
    launch(dn, E, 1, [=] { moe_small_kernel<T, false, kRows>(ar, pp, K, cp, op, WPlain<T>{d}, I, hid, yr, R, false); });
    launch(gu, 1, 1, [=] { moe_small_kernel<T, true, kRows>(xp, nullptr, 1, nullptr, nullptr, WPlain<T>{sg}, hid, I, as, R, false); });
    launch(dn, 1, 1, [=] { moe_small_kernel<T, false, kRows>(as, nullptr, 1, nullptr, nullptr, WPlain<T>{sdp}, I, hid, ys, R, false); });
    const bool ok = !memcmp(act.data(), act_r.data(), act_r.size() * sizeof(T)) &&
                    !memcmp(act.data() + act_r.size(), act_s.data(), act_s.size() * sizeof(T)) &&
                    !memcmp(ye.data(), ye_r.data(), ye_r.size() * sizeof(float)) &&
                    !memcmp(ye.data() + ye_r.size(), ye_s.data(), ye_s.size() * sizeof(float)) && !std::isnan(ye.back());
    g_fail += !ok;
    printf("%s  moe kernel (emulated) routed + shared expert in one launch %s, %d rows/pass: R %d K %d E %d hid %d I %d: = the two "
           "apart, bit for bit\n", ok ? "PASS" : "FAIL", sizeof(T) == 2 ? "bf16" : "f32", kRows, R, K, E, hid, I);
}

/* Sizes: blocks of experts with no rows return at once, so a case costs its active blocks; small
 * grids keep the run short on two cores. */
int main() {
    run_case<float, 1>("routed", 1, 2, 4, 40, 24, false);
    run_case<bf16, 1>("routed, gate/up rows of 2 chunks", 1, 1, 3, 1040, 24, false);
    run_case<float, 4>("routed, down rows of 2 chunks", 4, 1, 2, 40, 520, false);
    run_case<bf16, 16>("routed, 2 passes", 20, 1, 1, 64, 24, false);
    run_case<bf16, 16>("routed, 2 row slices", kSliceRows + 3, 1, 1, 16, 8, false);
    run_case<bf16, 4>("dense", 3, 1, 1, 48, 24, true);
    run_case<float, 16>("dense", 16, 1, 1, 64, 40, true);
    run_norm_case<bf16, 1>(1, 264, 40);
    run_norm_case<bf16, 16>(11, 1040, 32);
    run_norm_case<float, 4>(3, 80, 36);
    run_shared_case<bf16, 1>(1, 2, 8, 64, 24);
    run_shared_case<bf16, 16>(9, 2, 8, 1040, 16);
    /* Quantized experts against the CPU's dequantizers: FP8 gate/up in two parts (I % 128 != 0) and
     * in one (with a partial K block), INT4 (several groups per row, rows of 2 chunks). */
    run_case<bf16, 4, 1>("routed", 3, 2, 4, 48, 24, false);
    run_case<bf16, 1, 1>("routed", 1, 1, 2, 264, 128, false);
    run_case<bf16, 16, 2>("routed", 5, 2, 3, 64, 32, false);
    run_case<bf16, 1, 2>("routed, gate/up rows of 2 chunks", 1, 1, 2, 1056, 32, false);
    /* Row 0 routed to the same expert alone and in a batch of 12 (other rows share it). */
    const std::vector<int> route = {1};
    const std::vector<float> alone = run_case<bf16, 1>("row 0 alone", 1, 1, 2, 64, 24, false, &route);
    const std::vector<float> batch = run_case<bf16, 16>("row 0 in a batch", 12, 1, 2, 64, 24, false, &route);
    const bool same = alone.size() == batch.size() && !memcmp(alone.data(), batch.data(), alone.size() * sizeof(float));
    g_fail += !same;
    printf("%s  moe kernel (emulated): a row's outputs have the same bits alone and in a batch of 12\n", same ? "PASS" : "FAIL");
    return g_fail ? 1 : 0;
}
