/* verify_attn on Hopper, experiment (variant 7, "narrow"): calls of at most 16 rows (Q H <= 16: the
 * small model's decode, 4 heads) with the products swapped, so the tensor cores do not compute 64
 * rows for 4. The shipped kernel computes S = Q K^T as m64n64 (M = 64 rows, 60 of them padding at 4
 * heads) and O += P V as m64n256; here S^T = K Q^T is m64n16 (M = the tile's 64 keys, N = 16 rows)
 * and O^T += V^T P^T is 4 m64n16 per warpgroup (M = 64 output dims each, V^T read MN-major from the
 * same swizzled tile, imm-trans-a). Per key tile: 36 + 16 + 16 wgmma of n16 against 36 n64 + 8 n256,
 * i.e. the shared-memory reads of K and V (~1100 cycles) instead of ~2200 cycles of tensor work.
 * The softmax runs over keys spread across the 4 warps of warpgroup 0 (row maxima through shared
 * memory and a named barrier); loads (TMA, block table a tile ahead), the split walk, the
 * partials' format and the combine are the shipped kernel's (src/cuda/sm90/).
 *
 * Checked against the shipped kernel (same split; different summation order, so rel L2 ~1e-3, not
 * bit-identical) and the library's CPU reference, o NaN-poisoned first, cache rows past kv_len NaN;
 * then timed beside it (median, L2 flushed; and per call of 20 in one CUDA graph).
 *
 *   make dev                                   (builds $(BUILD)/dev/verify_attn_sm90_narrow)
 *   build/dev/verify_attn_sm90_narrow [--reps N] [--check-only]
 *
 * Prints a PASS / FAIL line per check case, a summary line, then a table row per timed shape;
 * exits 1 on any failed case. */
#include "verify_attn_dev_harness.cuh"

using namespace kdt_va_sm90;
using namespace kdt_va_dev;

namespace {

constexpr int kNR = 16; /* rows (N of the swapped products) */
enum { kBarWg0 = 1 };   /* named barrier of warpgroup 0's 128 threads */

#define KDT_F8 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
/* d[64x16] += A[64x16] B[16x16], both in shared memory; B K-major, A K-major (trans_a 0) or
 * M-major (trans_a 1). */
template <int kTransA>
__device__ __forceinline__ void wgmma_m64n16k16_ss(float (&d)[8], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
                 : KDT_F8
                 : "l"(da), "l"(db), "r"(1), "n"(kTransA));
}
#undef KDT_F8

/* Accumulator element i of an m64n16 product (thread of warp w4, lane g * 4 + t4): M index
 * 16 w4 + g + 8 ((i & 3) >> 1), N index 8 (i >> 2) + 2 t4 + (i & 1). Here N is the row (query)
 * and M the key (S^T) or the output dim (O^T); a thread's rows are qr(i) = 8 (i >> 2) + 2 t4 + (i & 1),
 * four of them: slot qs(i) = 2 (i >> 2) + (i & 1). */
__device__ __forceinline__ int row_of(int i, int t4) { return 8 * (i >> 2) + 2 * t4 + (i & 1); }
__device__ __forceinline__ int slot_of(int i) { return 2 * (i >> 2) + (i & 1); }
__device__ __forceinline__ int slot_row(int k, int t4) { return 8 * (k >> 1) + 2 * t4 + (k & 1); } /* row of slot k */

/* One segment: the call's rows (<= 16) of request b against its key tiles [tb, te). */
__device__ __forceinline__ void run_segment_narrow(const Args &a, uint8_t *smem, uint32_t sbase, int b, int tb, int te, int slot,
                                                   uint32_t &q_phase, uint32_t &k_phase) {
    const int tid = threadIdx.x, lane = tid & 31, w4 = (tid >> 5) & 3;
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int g = lane >> 2, t4 = lane & 3;
    const int rows_valid = a.rows;
    const int n = req_keys(a, b), prefix = n - a.Q;
    float *s_alpha = (float *)(smem + kOffScale);         /* [16] this tile's rescale per row */
    float *s_red = (float *)(smem + kOffM);               /* [4 warps][16] tile maxima, then row sums */
    float *s_fin = (float *)(smem + kOffL);               /* [16] max (log2), [16..31] sum */
    const uint32_t sq = sbase + kOffQ, sp = sbase + kOffP, buf0 = sbase + kOffK;
    const uint32_t bar_q = sbase + kOffBarT, bar0 = bar_q + 8;

    int e_next[4];
    tma_segment_start(a, b, n, 0, tb, te, sq, buf0, bar_q, bar0, e_next);

    const uint8_t *mrow[4]; /* mask rows of the thread's 4 rows (padding rows read the last tree row) */
#pragma unroll
    for (int k = 0; k < 4; k++)
        mrow[k] = a.tree_mask + ((long long)b * a.Q + min(slot_row(k, t4) / a.H, a.Q - 1)) * a.Q;
    float o[32]; /* O^T: 4 column blocks of 64 dims (256 wg + 64 mb ..) x the 16 rows */
#pragma unroll
    for (int i = 0; i < 32; i++) o[i] = 0.f;
    float m[4], l[4]; /* per row slot: running max (log2 units), this thread's partial sum */
#pragma unroll
    for (int k = 0; k < 4; k++) m[k] = -INFINITY, l[k] = 0.f;
    mbar_wait(bar_q, q_phase);
    q_phase ^= 1;

    for (int kt = tb; kt < te; kt++) {
        const uint32_t sk = tma_tile_top(a, b, n, kt, tb, te, buf0, bar0, k_phase, e_next), j = (uint32_t)(kt - tb) & 1;
        if (wg == 0) {
            float s[8];
#pragma unroll
            for (int i = 0; i < 8; i++) s[i] = 0.f;
            fence_regs(s);
            const uint32_t lq = desc_lo(sq, 16), lk = desc_lo(sk, 16);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kDqk / 16; kk++) wgmma_m64n16k16_ss<0>(s, desc_from(lk + kstep_off(kk), 1024), desc_from(lq + kstep_off(kk), 1024));
            wgmma_commit();
            wgmma_wait0();
            fence_regs(s);
            const bool masked = (kt + 1) * kBN > prefix;
            float tmax[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int key = kt * kBN + 16 * w4 + g + 8 * ((i & 3) >> 1), k = slot_of(i);
                float v = s[i] * a.scale_log2;
                if (masked && !(key < n && (key < prefix || mrow[k][key - prefix] != 0))) v = -INFINITY;
                s[i] = v;
                tmax[k] = fmaxf(tmax[k], v);
            }
#pragma unroll
            for (int k = 0; k < 4; k++) { /* over the 8 lanes of a row slot (g), then the 4 warps */
                tmax[k] = fmaxf(tmax[k], __shfl_xor_sync(0xffffffffu, tmax[k], 4));
                tmax[k] = fmaxf(tmax[k], __shfl_xor_sync(0xffffffffu, tmax[k], 8));
                tmax[k] = fmaxf(tmax[k], __shfl_xor_sync(0xffffffffu, tmax[k], 16));
                if (g == 0) s_red[16 * w4 + slot_row(k, t4)] = tmax[k];
            }
            bar_sync(kBarWg0, 128);
            float alpha[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int r = slot_row(k, t4);
                const float mx = fmaxf(fmaxf(s_red[r], s_red[16 + r]), fmaxf(s_red[32 + r], s_red[48 + r]));
                const float m_new = fmaxf(m[k], mx), base = m_new == -INFINITY ? 0.f : m_new;
                alpha[k] = ex2(m[k] - base);
                m[k] = m_new;
                l[k] *= alpha[k];
                tmax[k] = base;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) { /* P^T to shared memory as [row, key]: the B operand, K-major */
                const int k = slot_of(i), r = row_of(i, t4), key = 16 * w4 + g + 8 * ((i & 3) >> 1);
                const float p = ex2(s[i] - tmax[k]);
                l[k] += p;
                *(bf16 *)(smem + kOffP + r * 128 + (((key >> 3) ^ (r & 7)) << 4) + (key & 7) * 2) = __float2bfloat16_rn(p);
            }
            if (w4 == 0 && g == 0)
#pragma unroll
                for (int k = 0; k < 4; k++) s_alpha[slot_row(k, t4)] = alpha[k];
            fence_proxy_async();
        } else if ((kt + 1) * kBN > n) {
            zero_v_rows(smem + kOffK + j * kTileBytes, max(n - kt * kBN, 0), tid & 127);
            fence_proxy_async();
        }
        __syncthreads(); /* P^T, the rescale and the zeroed keys are in shared memory; s_red is read */
#pragma unroll
        for (int i = 0; i < 32; i++) o[i] *= s_alpha[row_of(i & 7, t4)];
        fence_regs(o);
        wgmma_fence();
        const uint32_t lp = desc_lo(sp, 16);
#pragma unroll
        for (int mb = 0; mb < 4; mb++) {
            const uint32_t lv = desc_lo(sk + (uint32_t)(4 * wg + mb) * kColBlock, kColBlock);
            float(&d)[8] = *reinterpret_cast<float(*)[8]>(o + 8 * mb);
#pragma unroll
            for (int kk = 0; kk < kBN / 16; kk++)
                wgmma_m64n16k16_ss<1>(d, desc_from(lv + kk * 128, 1024), desc_from(lp + kk * 2, 1024));
        }
        wgmma_commit();
        wgmma_wait0();
        fence_regs(o);
    }

    /* The end: row sums over the keys of all 4 warps, then O^T / l staged as [row, 512] and written. */
    if (wg == 0) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float v = l[k];
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            l[k] = v;
        }
    }
    __syncthreads(); /* every thread's last P V is done, s_red's maxima read: the buffers are free */
    if (wg == 0 && g == 0)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int r = slot_row(k, t4);
            s_red[16 * w4 + r] = l[k];
            if (w4 == 0) s_fin[r] = m[k];
        }
    __syncthreads();
    if (tid < kNR) s_fin[16 + tid] = s_red[tid] + s_red[16 + tid] + s_red[32 + tid] + s_red[48 + tid];
    __syncthreads();
    bf16 *stage = (bf16 *)(smem + kOffK);
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int r = row_of(i & 7, t4), dim = 256 * wg + 64 * (i >> 3) + 16 * w4 + g + 8 * ((i & 3) >> 1);
        const float lr = s_fin[16 + r];
        stage[r * kStride + dim] = __float2bfloat16_rn(lr > 0.f ? o[i] / lr : 0.f);
    }
    __syncthreads();
    const long long row0 = (slot < 0 ? (long long)b : (long long)slot) * a.rows;
    bf16 *dst = slot < 0 ? a.o : a.o_part;
    for (int i = tid; i < rows_valid * (kDv / 8); i += kThreads) {
        const int r = i / (kDv / 8), c = i % (kDv / 8);
        *(uint4 *)(dst + (row0 + r) * kDv + 8 * c) = *(const uint4 *)(stage + r * kStride + 8 * c);
    }
    if (tid < rows_valid) {
        const float lr = s_fin[16 + tid];
        (slot < 0 ? a.lse : a.lse_part)[row0 + tid] = lr > 0.f ? s_fin[tid] * 0.69314718055994531f + logf(lr) : -INFINITY;
    }
}

__global__ void __launch_bounds__(kThreads, 1) narrow_kernel(const __grid_constant__ Args a) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    const uint32_t sbase = smem_u32(smem);
    uint32_t q_phase = 0, k_phase = 0;
    if (threadIdx.x == 0) {
        for (int i = 0; i < 3; i++) mbar_init(sbase + kOffBarT + 8 * i, 1);
        fence_mbar_init();
    }
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    walk_segments(a, smem, [&](int b, int tb, int te, int slot) { run_segment_narrow(a, smem, sbase, b, tb, te, slot, q_phase, k_phase); });
}

/* ---- the harness ---- */

struct Narrow { /* the narrow kernel's Args for a run, its workspace and outputs (o2, lse2 of the Run) */
    Args a;
    void *ws;
};

/* parts, forced: as the shipped call ran (info.parts, exact when forced). */
int setup_narrow(const Run &r, int parts, int forced, Narrow *nw) {
    kdt_verify_attn_params q = r.p;
    q.o = r.o2, q.lse = r.lse2;
    memset(nw, 0, sizeof *nw);
    if (!make_args(&q, &nw->a) || nw->a.rows > kNR || !setup_tma(&q, &nw->a)) return 0;
    nw->a.parts = parts;
    nw->a.exact_parts = forced;
    if (parts > 1) {
        const size_t slot_rows = (size_t)2 * parts * (size_t)nw->a.rows;
        CK(cudaMalloc(&nw->ws, slot_rows * (kDv * 2 + 4)));
        nw->a.o_part = (bf16 *)nw->ws;
        nw->a.lse_part = (float *)(nw->a.o_part + slot_rows * kDv);
    }
    return 1;
}

void run_narrow(const Narrow &nw, cudaStream_t st) {
    int pdl = 0;
    CK(launch_pdl(narrow_kernel, dim3(1, (unsigned)nw.a.parts), kSmemT, nw.a, 0, st, &pdl));
    if (nw.a.parts > 1) CK(launch_combine(nw.a, 0, st, &pdl));
}

struct NCase {
    Case c;
    int cap, parts; /* cache keys per request (0: kv_len's); forced parts (0: the scheduler's) */
};

/* Both kernels into NaN-poisoned outputs; the narrow one against the shipped one and the CPU reference. */
int check(const NCase &nc) {
    const Case &c = nc.c;
    Run r;
    make_case(c, &r, nc.cap);
    const size_t rows = (size_t)c.B * c.Q * c.H, on = rows * kDv;
    kdt_va_sm90_info info;
    memset(&info, 0, sizeof info);
    CK(cudaMemset(r.p.o, 0xFF, on * 2));
    CK(cudaMemset(r.o2, 0xFF, on * 2));
    run_shipped(r, nc.parts, &info);
    Narrow nw;
    if (!setup_narrow(r, info.parts, nc.parts > 0, &nw)) {
        printf("FAIL  narrow check B=%d H=%d Q=%d: not a narrow call\n", c.B, c.H, c.Q);
        free_case(&r);
        return 0;
    }
    run_narrow(nw, 0);
    CK(cudaDeviceSynchronize());
    uint16_t *ha = (uint16_t *)malloc(on * 2), *hb = (uint16_t *)malloc(on * 2), *hr = (uint16_t *)malloc(on * 2);
    float *la = (float *)malloc(rows * 4), *lb = (float *)malloc(rows * 4), *lr = (float *)malloc(rows * 4);
    CK(cudaMemcpy(ha, r.p.o, on * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb, r.o2, on * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(la, r.p.lse, rows * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lb, r.lse2, rows * 4, cudaMemcpyDeviceToHost));
    cpu_reference(c, r, hr, lr);
    const Diff d = diff_bf16(hb, ha, on), dr = diff_bf16(hb, hr, on), ds = diff_bf16(ha, hr, on);
    size_t ln = 0, rn = 0;
    const double ld = diff_lse(lb, la, rows, &ln), rl = diff_lse(lb, lr, rows, &rn);
    const int ok = d.nan == 0 && ln == 0 && dr.nan == 0 && rn == 0 && dr.rel <= 1e-2 && rl <= 1e-3 && d.rel <= 2e-2;
    printf("%s  narrow check B=%d H=%d Q=%d prefix=%d cap=%d BS=%d tree=%d ragged=%d parts=%d: vs CPU reference rel_l2 %.2e "
           "(shipped %.2e), lse max|d| %.2e; vs shipped rel_l2 %.2e max|d| %.3g, lse max|d| %.2e, NaN %zu\n",
           ok ? "PASS" : "FAIL", c.B, c.H, c.Q, c.prefix, nc.cap, c.BS, c.tree, c.ragged, info.parts, dr.rel, ds.rel, rl, d.rel,
           d.max_abs, ld, d.nan + ln + dr.nan + rn);
    free(ha), free(hb), free(hr), free(la), free(lb), free(lr);
    cudaFree(nw.ws);
    free_case(&r);
    return ok;
}

/* Per call of 20 calls captured in one CUDA graph (fn(stream) makes one call). */
template <typename F>
double graph_call_us(F fn, int reps) {
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 20; i++) fn(st);
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    const double us = bench_flushed_us([&] { CK(cudaGraphLaunch(ge, st)); }, reps) / 20;
    cudaGraphExecDestroy(ge), cudaGraphDestroy(gr), cudaStreamDestroy(st);
    return us;
}

} // namespace

int main(int argc, char **argv) {
    int reps = 30, check_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--check-only")) check_only = 1;
        else {
            fprintf(stderr, "usage: %s [--reps N] [--check-only]\n", argv[0]);
            return 2;
        }
    }
    int n_dev = 0, major = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0 || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) ||
        major != 9) {
        printf("SKIP  verify_attn_sm90_narrow: no compute capability 9.x device\n");
        return 0;
    }
    CK(cudaFuncSetAttribute(narrow_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemT));
    /* {B, H, Q, prefix, BS, tree, ragged}, cap, parts */
    const NCase cases[] = {
        {{1, 4, 1, 16, 64, 0, 0}, 2048, 0},   {{1, 4, 1, 64, 64, 0, 0}, 2048, 0},  {{1, 4, 1, 256, 64, 0, 0}, 2048, 0},
        {{8, 4, 1, 256, 64, 0, 1}, 2048, 0},  {{1, 4, 1, 300, 64, 0, 0}, 0, 1},    {{2, 8, 2, 500, 64, 1, 1}, 0, 0},
        {{3, 16, 1, 700, 16, 0, 1}, 0, 3},    {{2, 4, 4, 200, 32, 2, 1}, 0, 0},    {{1, 8, 1, 16384, 64, 0, 0}, 0, 0},
        {{4, 1, 9, 0, 64, 0, 0}, 0, 0},
    };
    int fails = 0;
    for (const NCase &nc : cases) fails += !check(nc);
    const int n_cases = (int)(sizeof cases / sizeof *cases);
    printf("%s  narrow: %d of %d cases failed\n", fails ? "FAIL" : "PASS", fails, n_cases);
    if (check_only || fails) return fails ? 1 : 0;

    /* Timing: the small model's decode calls, and 8-row calls as a tail tile of the 8-head shapes sees them. */
    const NCase timed[] = {
        {{1, 4, 1, 16, 64, 0, 0}, 2048, 0}, {{1, 4, 1, 64, 64, 0, 0}, 2048, 0},   {{1, 4, 1, 256, 64, 0, 0}, 2048, 0},
        {{8, 4, 1, 256, 64, 0, 0}, 2048, 0}, {{128, 8, 1, 16384, 64, 0, 0}, 0, 0}, {{64, 8, 1, 8192, 64, 0, 0}, 0, 0},
    };
    printf("\n| B, H, Q, prefix (cache) | parts | shipped us | narrow us | narrow / shipped | graph: shipped us/call | narrow us/call |\n"
           "|---|---:|---:|---:|---:|---:|---:|\n");
    for (const NCase &nc : timed) {
        const Case &c = nc.c;
        Run r;
        make_case(c, &r, nc.cap);
        kdt_va_sm90_info info;
        run_shipped(r, 0, &info);
        Narrow nw;
        if (!setup_narrow(r, info.parts, 0, &nw)) {
            free_case(&r);
            continue;
        }
        run_narrow(nw, 0);
        CK(cudaDeviceSynchronize());
        const kdt_va_sm90_config cfg = {KDT_VA_SM90_TMA, 0, 0};
        auto shipped = [&](cudaStream_t st) {
            int handled = 0;
            KCK(kdt_verify_attn_sm90_ex(&r.p, st, &cfg, NULL, &handled));
        };
        const double t_s = bench_flushed_us([&] { shipped(0); }, reps), t_n = bench_flushed_us([&] { run_narrow(nw, 0); }, reps);
        const double g_s = graph_call_us(shipped, reps), g_n = graph_call_us([&](cudaStream_t st) { run_narrow(nw, st); }, reps);
        printf("| %d, %d, %d, %d (%d) | %d | %.1f | %.1f | %.3f | %.2f | %.2f |\n", c.B, c.H, c.Q, c.prefix, r.p.MB * c.BS, info.parts, t_s,
               t_n, t_n / t_s, g_s, g_n);
        cudaFree(nw.ws);
        free_case(&r);
    }
    return 0;
}
