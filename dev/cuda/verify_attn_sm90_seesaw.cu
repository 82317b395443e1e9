/* verify_attn on Hopper, experiment: the "seesaw" schedule, where warpgroup 1's half of the value
 * product of tile k - 1 runs on the tensor cores while warpgroup 0 computes the softmax of tile k
 * (docs/perf/verify_attn_sm90.md, "Seesaw design": budgets, the prediction). It reuses the
 * library's tiles, softmax, epilogue, split walk and combine (src/cuda/sm90/), checks its output
 * against the library's shipped TMA kernel on the issue's 7 shapes and on tree masks of other
 * shapes (same split, o NaN-poisoned first, cache rows past kv_len NaN), and on the small cases
 * against the library's CPU reference too (test_verify_attn_fast's tolerances: o rel L2 1e-2, lse
 * 1e-3), then times both with CUDA events (median, L2 flushed before each run). The arithmetic is
 * the shipped kernel's in the same order, so the outputs are expected to match it bit for bit.
 *
 *   make dev                                   (builds $(BUILD)/dev/verify_attn_sm90_seesaw)
 *   nvcc -O3 -std=c++17 -Iinclude -Isrc -DKDT_HAVE_CUDA=1 --expt-relaxed-constexpr \
 *        -gencode arch=compute_90a,code=sm_90a dev/cuda/verify_attn_sm90_seesaw.cu build/libkdt.a \
 *        -lcjson -lpcre2-8 -o build/dev/verify_attn_sm90_seesaw
 *   build/dev/verify_attn_sm90_seesaw [--reps N] [--check-only | --no-check] [--shape I] [--parts P]
 *
 * --shape I: the I-th issue shape alone (0-based); --parts P: force P parts on both kernels.
 * Prints a PASS / FAIL line per check case (rel L2, max |d|, differing elements, NaN; "bit-identical"
 * when no element differs), a summary line, then a table row per timed shape (shipped us, seesaw
 * us, ratio); exits 1 on any failed case.
 *
 * Schedule (per key tile k of a segment; the shipped kernel's building blocks otherwise):
 *   warpgroup 0: S(k) done -> arrive "S done" -> softmax(k), O_left *= alpha(k) -> (P slot free)
 *                -> P(k), alpha(k) to shared memory -> arrive "P ready" -> issue O_left += P(k) V(k)
 *                (P from shared memory) -> issue S(k + 1) blocks 0..3 -> wait for O_left's product: TMA of tile k + 2's
 *                blocks 0..3 and 8 into tile k's buffer -> issue S(k + 1) blocks 4..8 -> wait.
 *   warpgroup 1: (tile k landed; the request's last tile: zero V past kv_len) -> wait "S done"
 *                -> arrive "P slot free" -> O_right *= alpha(k - 1); issue O_right += P(k - 1) V(k - 1)
 *                (under warpgroup 0's softmax) -> wait: TMA of tile k + 1's blocks 4..7 into
 *                tile k - 1's buffer -> wait "P ready" -> P(k), alpha(k) into registers.
 * Each key buffer has two mbarriers: blocks 0..3 + 8 (free once warpgroup 0's S and P V of the
 * tile are done) and blocks 4..7 (free once warpgroup 1's P V is done). The named barriers strictly
 * alternate (each side's next arrival waits on the other side's last), so none can be lapped. */
#include "verify_attn_dev_harness.cuh"

using namespace kdt_va_sm90;
using namespace kdt_va_dev;

namespace {

/* mbarriers after the schedule's scratch: Q, then per buffer j: early (8 + 16 j), late (16 + 16 j). */
constexpr uint32_t kOffBarS = kOffSched + 128;
constexpr uint32_t kSmemS = kOffBarS + 5 * 8 + 1024;
constexpr uint32_t kEarlyCols = 0x10Fu, kLateCols = 0x0F0u; /* column-block masks: 0..3 + 8, 4..7 */
enum { kBarSDone = 1, kBarPFree, kBarPReady, kBarWg0 };

/* TMA loads of the column blocks in mask cols of key tile kt (block-table entries e) into buffer
 * buf, completing on bar; one thread. */
__device__ __forceinline__ void load_cols(const Args &a, int b, int n, int kt, const int (&e)[4], uint32_t buf, uint32_t bar,
                                          uint32_t cols) {
    int y[4];
    tile_rows(a, b, n, kt, e, y);
    mbar_arrive_expect_tx(bar, (uint32_t)__popc(cols) * kColBlock);
    for (int c = 0; c < kDqk / 64; c++)
        if (cols >> c & 1u)
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (k * a.kv_box < kBN) tma_load_2d(buf + c * kColBlock + k * a.kv_box * 128, &a.tm_kv, 64 * c, y[k], bar);
}

/* S += Q K^T over column blocks [C0, C1) (the shipped kernel's k order); one commit group. */
template <int C0, int C1>
__device__ __forceinline__ void scores_cols(float (&s)[32], uint32_t sq, uint32_t sk) {
    const uint32_t lq = desc_lo(sq, 16), lk = desc_lo(sk, 16);
    wgmma_fence();
#pragma unroll
    for (int kk = 4 * C0; kk < 4 * C1; kk++) {
        const uint32_t off = ((uint32_t)(kk >> 2) * kColBlock + (uint32_t)(kk & 3) * 32) >> 4;
        wgmma_m64n64k16_ss(s, desc_from(lq + off, 1024), desc_from(lk + off, 1024));
    }
    wgmma_commit();
}

/* O += P V over a tile's 64 keys, V the 256 dims of this warpgroup's half (4 column blocks from
 * v0, N-major); one commit group. P from registers (warpgroup 1), or (kSmemP) from the swizzled
 * [64 rows, 64 keys] tile at sp (warpgroup 0: its P registers are then free while S(k + 1) runs). */
template <bool kSmemP>
__device__ __forceinline__ void pv_async(float (&o)[128], const uint32_t (&p)[4][4], uint32_t v0, uint32_t sp) {
    const uint32_t lv = desc_lo(v0, kColBlock), lp = desc_lo(sp, 16);
    wgmma_fence();
    if constexpr (kSmemP) {
#pragma unroll
        for (int kk = 0; kk < kBN / 16; kk++) wgmma_m64n256k16_ss(o, desc_from(lp + kk * 2, 1024), desc_from(lv + kk * 128, 1024));
    } else {
#pragma unroll
        for (int kk = 0; kk < kBN / 16; kk++) wgmma_m64n256k16_rs(o, p[kk], desc_from(lv + kk * 128, 1024));
    }
    wgmma_commit();
}

__device__ __forceinline__ void scale_o(float (&o)[128], float a0, float a1) {
    if (a0 != 1.f || a1 != 1.f) {
#pragma unroll
        for (int j = 0; j < 32; j++) o[4 * j] *= a0, o[4 * j + 1] *= a0, o[4 * j + 2] *= a1, o[4 * j + 3] *= a1;
    }
}

/* P back from the swizzled tile store_p writes: the same A fragments. */
__device__ __forceinline__ void load_p(const uint8_t *tile, uint32_t (&p)[4][4], int r0, int r1, int t4) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        p[j >> 1][(j & 1) * 2] = *(const uint32_t *)(tile + r0 * 128 + ((j ^ (r0 & 7)) << 4) + t4 * 4);
        p[j >> 1][(j & 1) * 2 + 1] = *(const uint32_t *)(tile + r1 * 128 + ((j ^ (r1 & 7)) << 4) + t4 * 4);
    }
}

/* One segment: rows [64 mt, 64 mt + 64) of request b against its key tiles [tb, te). q_phase: parity
 * of the Q barrier; k_phase: bit 2 j + g, of buffer j's barrier g (0 early, 1 late). */
__device__ __forceinline__ void run_segment_seesaw(const Args &a, uint8_t *smem, uint32_t sbase, int b, int mt, int tb, int te,
                                                   int slot, uint32_t &q_phase, uint32_t &k_phase) {
    const int tid = threadIdx.x, lane = tid & 31, w4 = (tid >> 5) & 3;
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0); /* provably warp-uniform: wgmma stays async */
    const int g = lane >> 2, t4 = lane & 3;
    const int m0 = mt * kBM, rows_valid = min(kBM, a.rows - m0);
    const int n = req_keys(a, b), prefix = n - a.Q;
    const int r0 = 16 * w4 + g, r1 = r0 + 8;
    float *s_scale = (float *)(smem + kOffScale);
    const uint32_t sq = sbase + kOffQ, buf0 = sbase + kOffK;
    const uint32_t bar_q = sbase + kOffBarS, bars = bar_q + 8; /* buffer j, group g: bars + 16 j + 8 g */
    auto buf = [&](int kt) { return buf0 + (uint32_t)((kt - tb) & 1) * kTileBytes; };
    auto bar = [&](int kt, int grp) { return bars + 16u * (uint32_t)((kt - tb) & 1) + 8u * (uint32_t)grp; };
    auto wait_tile = [&](int kt, int grp) { /* this thread's wait on a group of tile kt; flips its parity bit */
        const int bit = 2 * ((kt - tb) & 1) + grp;
        mbar_wait(bar(kt, grp), (k_phase >> bit) & 1u);
        k_phase ^= 1u << bit;
    };

    fence_proxy_async(); /* this thread's generic accesses to the buffers (last staging) before the TMA below */
    __syncthreads();
    if (tid == 0) {
        mbar_arrive_expect_tx(bar_q, kTileBytes);
        for (int c = 0; c < kDqk / 64; c++) tma_load_2d(sq + c * kColBlock, &a.tm_q, 64 * c, b * a.rows + m0, bar_q);
        for (int kt = tb; kt < te && kt < tb + 2; kt++) {
            int e[4];
            tile_blocks(a, b, n, kt, e);
            load_cols(a, b, n, kt, e, buf(kt), bar(kt, 0), kEarlyCols);
            load_cols(a, b, n, kt, e, buf(kt), bar(kt, 1), kLateCols);
        }
    }
    int e_next[4]; /* threads 0 and 128: block-table entries of the next tile each loads (tb + 2 first) */
    if (tid == 0 || tid == 128) tile_blocks(a, b, n, tb + 2 < te ? tb + 2 : tb, e_next);

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    uint32_t p[4][4];
    RowState st = {{-INFINITY, -INFINITY}, {0.f, 0.f}}; /* warpgroup 0's */
    mbar_wait(bar_q, q_phase);
    q_phase ^= 1;

    if (wg == 0) {
        /* Tree mask rows of the thread's rows (padding rows past Q * H read the last tree row). */
        const uint8_t *mrow0 = a.tree_mask + ((long long)b * a.Q + min((m0 + r0) / a.H, a.Q - 1)) * a.Q;
        const uint8_t *mrow1 = a.tree_mask + ((long long)b * a.Q + min((m0 + r1) / a.H, a.Q - 1)) * a.Q;
        float s[32];
#pragma unroll
        for (int i = 0; i < 32; i++) s[i] = 0.f;
        fence_regs(s);
        wait_tile(tb, 0);
        scores_cols<0, 4>(s, sq, buf(tb));
        wait_tile(tb, 1);
        scores_cols<4, 9>(s, sq, buf(tb));
        wgmma_wait0();
        fence_regs(s);
        for (int kt = tb; kt < te; kt++) {
            bar_arrive(kBarSDone, 256);
            float alpha[2];
            softmax_tile(s, st, alpha, p, a.scale_log2, (kt + 1) * kBN > prefix, kt * kBN, n, prefix, mrow0, mrow1, t4);
            scale_o(o, alpha[0], alpha[1]);
            bar_sync(kBarPFree, 256); /* warpgroup 1 has P(k - 1) in registers and V(k) zeroed past kv_len */
            store_p(smem + kOffP, p, r0, r1, t4);
            if (t4 == 0) s_scale[r0] = alpha[0], s_scale[r1] = alpha[1];
            fence_proxy_async(); /* P is read by this warpgroup's wgmma */
            bar_sync(kBarWg0, 128);
            bar_arrive(kBarPReady, 256);
            fence_regs(o);
            pv_async<true>(o, p, buf(kt), sbase + kOffP); /* O_left += P(k) V(k)_left */
            if (kt + 1 < te) {
#pragma unroll
                for (int i = 0; i < 32; i++) s[i] = 0.f;
                fence_regs(s);
                wait_tile(kt + 1, 0);
                scores_cols<0, 4>(s, sq, buf(kt + 1));
                wgmma_wait<1>(); /* O_left's product is done: tile k's blocks 0..3 and 8 are free */
                if (tid == 0 && kt + 2 < te) {
                    load_cols(a, b, n, kt + 2, e_next, buf(kt), bar(kt, 0), kEarlyCols);
                    tile_blocks(a, b, n, kt + 3 < te ? kt + 3 : kt, e_next);
                }
                wait_tile(kt + 1, 1);
                scores_cols<4, 9>(s, sq, buf(kt + 1));
            }
            wgmma_wait0();
            fence_regs(o);
            fence_regs(s);
        }
    } else {
        float alpha[2] = {1.f, 1.f};
        for (int kt = tb; kt < te; kt++) {
            wait_tile(kt, 0);
            wait_tile(kt, 1);
            if ((kt + 1) * kBN > n) { /* the request's last tile: keys past kv_len */
                zero_v_rows(smem + kOffK + (uint32_t)((kt - tb) & 1) * kTileBytes, max(n - kt * kBN, 0), tid & 127);
                fence_proxy_async();
            }
            bar_sync(kBarSDone, 256); /* S(k) is done: the tensor cores are ours while warpgroup 0 runs the softmax */
            bar_arrive(kBarPFree, 256);
            if (kt > tb) {
                scale_o(o, alpha[0], alpha[1]);
                fence_regs(o);
                pv_async<false>(o, p, buf(kt - 1) + 4 * kColBlock, 0); /* O_right += P(k - 1) V(k - 1)_right */
                wgmma_wait0();
                fence_regs(o);
                fence_regs(p);
                if (tid == 128 && kt + 1 < te) { /* tile k - 1's blocks 4..7 are free */
                    load_cols(a, b, n, kt + 1, e_next, buf(kt - 1), bar(kt - 1, 1), kLateCols);
                    tile_blocks(a, b, n, kt + 2 < te ? kt + 2 : kt, e_next);
                }
            }
            bar_sync(kBarPReady, 256);
            load_p(smem + kOffP, p, r0, r1, t4);
            alpha[0] = s_scale[r0], alpha[1] = s_scale[r1];
        }
        scale_o(o, alpha[0], alpha[1]);
        fence_regs(o);
        pv_async<false>(o, p, buf(te - 1) + 4 * kColBlock, 0);
        wgmma_wait0();
        fence_regs(o);
    }
    end_segment(a, smem, o, st, b, m0, rows_valid, slot, wg, r0, r1, t4);
}

__global__ void __launch_bounds__(kThreads, 1) seesaw_kernel(const __grid_constant__ Args a) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    const uint32_t sbase = smem_u32(smem);
    uint32_t q_phase = 0, k_phase = 0;
    if (threadIdx.x == 0) { /* used after the segment's first __syncthreads */
        for (int i = 0; i < 5; i++) mbar_init(sbase + kOffBarS + 8 * i, 1);
        fence_mbar_init();
    }
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); /* the combine kernel may start */
    walk_segments(a, smem, [&](int b, int tb, int te, int slot) {
        run_segment_seesaw(a, smem, sbase, b, blockIdx.x, tb, te, slot, q_phase, k_phase);
    });
}

/* The seesaw kernel's Args for run r with `parts` parts, scaled to kv_len as the shipped call's
 * unless forced (its own workspace; output to o2, lse2). */
int setup_seesaw(Run *r, int parts, int forced) {
    kdt_verify_attn_params q = r->p;
    q.o = r->o2, q.lse = r->lse2;
    if (!make_args(&q, &r->a) || !setup_tma(&q, &r->a)) return 0;
    r->a.parts = parts;
    r->a.exact_parts = forced;
    r->m_tiles = (r->a.rows + kBM - 1) / kBM;
    cudaFree(r->ws);
    r->ws = nullptr;
    if (parts > 1) {
        const size_t slot_rows = (size_t)2 * parts * (size_t)r->a.rows;
        CK(cudaMalloc(&r->ws, slot_rows * (kDv * 2 + 4)));
        r->a.o_part = (bf16 *)r->ws;
        r->a.lse_part = (float *)(r->a.o_part + slot_rows * kDv);
    }
    return 1;
}

void run_seesaw(const Run &r) {
    seesaw_kernel<<<dim3((unsigned)r.m_tiles, (unsigned)r.a.parts), kThreads, kSmemS>>>(r.a);
    CK(cudaPeekAtLastError());
    int pdl = 0;
    if (r.a.parts > 1) CK(launch_combine(r.a, 0, 0, &pdl));
}

/* Both kernels with the same split into NaN-poisoned outputs, and for small cases the CPU
 * reference; prints one line; 1 when the seesaw output agrees with both. */
int check(const Case &c, const char *what, int parts_req) {
    Run r;
    make_case(c, &r);
    const size_t rows = (size_t)c.B * c.Q * c.H, on = rows * kDv;
    kdt_va_sm90_info info;
    memset(&info, 0, sizeof info);
    CK(cudaMemset(r.p.o, 0xFF, on * 2));
    CK(cudaMemset(r.o2, 0xFF, on * 2));
    run_shipped(r, parts_req, &info);
    if (!setup_seesaw(&r, info.parts, parts_req > 0)) {
        printf("FAIL  seesaw check %s: the call does not fit the TMA maps\n", what);
        free_case(&r);
        return 0;
    }
    run_seesaw(r);
    CK(cudaDeviceSynchronize());
    uint16_t *ha = (uint16_t *)malloc(on * 2), *hb = (uint16_t *)malloc(on * 2);
    float *la = (float *)malloc(rows * 4), *lb = (float *)malloc(rows * 4);
    CK(cudaMemcpy(ha, r.p.o, on * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb, r.o2, on * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(la, r.p.lse, rows * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lb, r.lse2, rows * 4, cudaMemcpyDeviceToHost));
    Diff d = diff_bf16(hb, ha, on);
    size_t lse_nan = 0;
    const double lse_d = diff_lse(lb, la, rows, &lse_nan);
    int ok = d.nan == 0 && lse_nan == 0 && d.rel <= 1e-3 && lse_d <= 1e-4;
    char ref_s[160] = "";
    if ((double)c.B * c.Q * c.H * (c.prefix + c.Q) <= 2.5e6) { /* the CPU reference: the test's tolerances */
        uint16_t *hr = (uint16_t *)malloc(on * 2);
        float *lr = (float *)malloc(rows * 4);
        cpu_reference(c, r, hr, lr);
        const Diff dr = diff_bf16(hb, hr, on);
        size_t rn = 0;
        const double rl = diff_lse(lb, lr, rows, &rn);
        const Diff ds = diff_bf16(ha, hr, on); /* the shipped kernel's, for scale */
        ok = ok && dr.nan == 0 && rn == 0 && dr.rel <= 1e-2 && rl <= 1e-3;
        snprintf(ref_s, sizeof ref_s, "; vs CPU reference: rel_l2 %.2e (shipped %.2e), lse max|d| %.2e, NaN %zu", dr.rel, ds.rel, rl,
                 dr.nan + rn);
        free(hr), free(lr);
    }
    printf("%s  seesaw check %s B=%d H=%d Q=%d prefix=%d BS=%d tree=%d ragged=%d parts=%d: vs shipped: rel_l2 %.2e max|d| %.3g "
           "differing %zu of %zu, lse max|d| %.2e, NaN %zu%s%s\n",
           ok ? "PASS" : "FAIL", what, c.B, c.H, c.Q, c.prefix, c.BS, c.tree, c.ragged, info.parts, d.rel, d.max_abs, d.differ, on,
           lse_d, d.nan + lse_nan, d.differ == 0 && d.nan == 0 ? " (bit-identical)" : "", ref_s);
    free(ha), free(hb), free(la), free(lb);
    free_case(&r);
    return ok;
}

const Case kIssue[] = {
    {1, 64, 33, 32768, 64, 0, 0}, {16, 64, 17, 4096, 64, 0, 0}, {32, 64, 9, 8192, 64, 0, 0}, {1, 64, 257, 8192, 64, 0, 0},
    {2, 16, 17, 2048, 64, 0, 0},  {64, 8, 17, 8192, 64, 0, 0},  {128, 8, 9, 16384, 64, 0, 0},
};
constexpr int kNumIssue = (int)(sizeof kIssue / sizeof *kIssue);

} // namespace

int main(int argc, char **argv) {
    int reps = 30, check_only = 0, no_check = 0, only = -1, parts_force = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--check-only")) check_only = 1;
        else if (!strcmp(argv[i], "--no-check")) no_check = 1;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) only = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--parts") && i + 1 < argc) parts_force = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--reps N] [--check-only | --no-check] [--shape I] [--parts P]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    int n_dev = 0, major = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0 || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) ||
        major != 9) {
        printf("SKIP  verify_attn_sm90_seesaw: no compute capability 9.x device\n");
        return 0;
    }
    CK(cudaFuncSetAttribute(seesaw_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemS));

    /* Correctness: the issue's shapes with the scheduler's split, then masks, ragged lengths, block
     * sizes 16 and 32 and forced splits (1: one segment per request; 3 and 7: requests cut across parts). */
    int fails = 0, cases = 0;
    for (int i = 0; i < kNumIssue && !no_check; i++)
        if (only < 0 || only == i) fails += !check(kIssue[i], "issue", parts_force), cases++;
    if (only < 0 && !no_check) {
        const Case extra[] = {
            {4, 16, 33, 1000, 64, 1, 1}, {4, 16, 33, 1000, 64, 2, 1}, {3, 64, 17, 130, 64, 0, 1}, {2, 16, 17, 300, 16, 0, 1},
            {2, 16, 17, 300, 32, 1, 1},  {1, 64, 5, 0, 64, 0, 0},     {5, 8, 9, 64, 64, 2, 1},    {1, 128, 64, 700, 64, 0, 0},
        };
        for (const Case &c : extra) fails += !check(c, "mask", parts_force), cases++;
        for (int pf : {1, 3, 7}) fails += !check(Case{6, 16, 17, 2000, 64, 0, 1}, "split", pf), cases++;
    }
    if (!no_check) printf("%s  seesaw: %d of %d cases failed\n", fails ? "FAIL" : "PASS", fails, cases);
    if (check_only) return fails ? 1 : 0;

    /* Timing: the whole call of each (main kernel + combine), the shipped kernel's split for both. */
    printf("\n| B, H, Q, prefix | parts | shipped us | seesaw us | seesaw / shipped |\n|---|---:|---:|---:|---:|\n");
    for (int i = 0; i < kNumIssue; i++) {
        if (only >= 0 && only != i) continue;
        const Case &c = kIssue[i];
        Run r;
        make_case(c, &r);
        kdt_va_sm90_info info;
        run_shipped(r, parts_force, &info);
        if (!setup_seesaw(&r, info.parts, parts_force > 0)) {
            free_case(&r);
            continue;
        }
        run_seesaw(r);
        CK(cudaDeviceSynchronize());
        const double t_ship = bench_flushed_us([&] { run_shipped(r, parts_force, nullptr); }, reps);
        const double t_ss = bench_flushed_us([&] { run_seesaw(r); }, reps);
        const double t_ship2 = bench_flushed_us([&] { run_shipped(r, parts_force, nullptr); }, reps); /* drift check */
        printf("| %d, %d, %d, %d | %d | %.1f (again %.1f) | %.1f | %.3f |\n", c.B, c.H, c.Q, c.prefix, info.parts, t_ship, t_ship2,
               t_ss, t_ss / (0.5 * (t_ship + t_ship2)));
        free_case(&r);
    }
    return fails ? 1 : 0;
}
