/* The routed experts of a MoE layer on bf16 weights at decode and verify sizes (moe_bf16.h;
 * docs/perf/model.md, "Grouped bf16 experts"): two launches a layer, gate/up with SiLU . mul, then
 * down, each over every expert with rows (and the shared expert, as one more), the weights streamed
 * once from DRAM onto the tensor cores, whatever the rows an expert (1 to 32 in one pass).
 *
 * Grid (output tiles, expert slots), fixed by the shapes: slot j takes the j-th expert with rows in
 * expert order, found on the device from counts [E] (the host never waits, so the launches are
 * captured in graphs); min(E, R K) slots, then the shared expert's. A warp owns 16 output columns
 * a tile, kA tiles (gate/up: the 16 gate rows and the matching 16 up rows, so SiLU . mul pairs
 * registers of one lane; down: 1, or 2 adjacent ones), as the mma's A operand, against 8 kMT of the
 * expert's rows as B, over all of K in 32-k steps: lane (g, t) loads 16 bytes at k 8t of weight rows
 * g and g + 8 of each tile and of x rows g (+ 8 i), and mma.m16n8k16 pairs k 8t .. 8t + 3 then
 * 8t + 4 .. 8t + 7 (any k order serves, the same for A and B). The ring keeps kU steps of weights
 * and x in registers, loaded kU steps ahead of their mmas. Each output is one lane's f32 chain over
 * the steps in k order: the bits depend on K alone, not on the other rows, kMT or the timing. */
#include "common/cuda/cuda_common.cuh"
#include "cuda/mma_frag.cuh"
#include "model/cuda/moe_bf16.h"
#include "model/cuda/pdl.cuh"

namespace {

typedef __nv_bfloat16 bf16;

constexpr int kBStep = 32;  /* k per step: a quad's 4 lanes x 8 values of a row */

/* 16 bytes of streamed weights, not kept in L1; kPf (0, 128 or 256): the L2 asked for that many bytes of
 * the row at once (this step's and the next ones'), so that more of a warp's bytes are on their way than
 * its registers hold. */
template <int kPf>
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 v;
    if constexpr (kPf == 256)
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else if constexpr (kPf == 128)
        asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

/* The j-th expert with rows (counts [E] > 0) in expert order, or -1; its count in *cnt. Every lane
 * gets both; 4 x 32 counts a round trip. */
__device__ int slot_expert(const int32_t *__restrict__ counts, int E, int j, int *cnt) {
    const int lane = threadIdx.x & 31;
    for (int base = 0; base < E; base += 128) {
        int c[4];
#pragma unroll
        for (int q = 0; q < 4; q++) c[q] = base + 32 * q + lane < E ? counts[base + 32 * q + lane] : 0;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            unsigned m = __ballot_sync(0xffffffffu, c[q] > 0);
            if (j < __popc(m)) {
                for (; j > 0; j--) m &= m - 1; /* drop the j lowest */
                const int src = __ffs((int)m) - 1;
                *cnt = __shfl_sync(0xffffffffu, c[q], src);
                return base + 32 * q + src;
            }
            j -= __popc(m);
        }
    }
    return -1;
}

template <int kA, int kMT> struct Stage {
    uint4 w[kA][2]; /* tile a's rows g (h = 0) and g + 8 */
    uint4 x[kMT];   /* x row g + 8 i */
};

/* One pass of a warp: its kA tiles of expert weights we against the expert's rows r_beg .. r_beg +
 * 8 kMT - 1 (those below cnt) at places off + row. kGateUp: we [2 n_out, n_in], x row perm[place] / topk
 * (the shared expert: row itself), out act [*, n_out] bf16; else we [n_out, n_in], in = act, out ye
 * [*, n_out] f32. */
template <bool kGateUp, int kA, int kMT, int kU, int kPf>
__device__ __forceinline__ void expert_pass(const bf16 *__restrict__ in, const int32_t *__restrict__ perm, int topk, bool shared,
                                            const bf16 *__restrict__ we, int off, int r_beg, int cnt, int n_in, int n_out, int col0,
                                            void *out) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, nsteps = n_in / kBStep;
    const uint4 *wr[kA][2], *xr[kMT];
#pragma unroll
    for (int a = 0; a < kA; a++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = (kGateUp ? a * n_out : 16 * a) + col0 + g + 8 * h;
            wr[a][h] = (const uint4 *)(we + (size_t)row * n_in) + t;
        }
#pragma unroll
    for (int i = 0; i < kMT; i++) {
        const int r = r_beg + 8 * i + g;
        const int src = r >= cnt ? -1 : !kGateUp ? off + r : shared ? r : perm[off + r] / topk;
        xr[i] = src < 0 ? nullptr : (const uint4 *)(in + (size_t)src * n_in) + t;
    }
    auto load = [&](Stage<kA, kMT> &st, int s) {
        if (s >= nsteps) return;
#pragma unroll
        for (int a = 0; a < kA; a++) st.w[a][0] = ld_stream<kPf>(wr[a][0] + 4 * s), st.w[a][1] = ld_stream<kPf>(wr[a][1] + 4 * s);
#pragma unroll
        for (int i = 0; i < kMT; i++) st.x[i] = xr[i] ? __ldg(xr[i] + 4 * s) : make_uint4(0, 0, 0, 0);
    };
    float acc[kA][kMT][4] = {};
    auto compute = [&](const Stage<kA, kMT> &st) {
#pragma unroll
        for (int a = 0; a < kA; a++)
#pragma unroll
            for (int i = 0; i < kMT; i++) {
                const uint4 &p = st.w[a][0], &q = st.w[a][1], &x = st.x[i];
                kdt_frag::mma(acc[a][i], p.x, q.x, p.y, q.y, x.x, x.y);
                kdt_frag::mma(acc[a][i], p.z, q.z, p.w, q.w, x.z, x.w);
            }
    };
    Stage<kA, kMT> ring[kU];
#pragma unroll
    for (int u = 0; u < kU; u++) load(ring[u], u);
    for (int s0 = 0; s0 < nsteps; s0 += kU) {
#pragma unroll
        for (int u = 0; u < kU; u++) {
            if (s0 + u >= nsteps) break;
            compute(ring[u]);
            load(ring[u], s0 + u + kU);
        }
    }
    /* c0, c1: weight row g, x rows 2t, 2t + 1 of tile i; c2, c3: weight row g + 8. */
#pragma unroll
    for (int a = 0; a < (kGateUp ? 1 : kA); a++)
#pragma unroll
        for (int i = 0; i < kMT; i++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int col = col0 + 16 * a + g + (c >= 2 ? 8 : 0), row = r_beg + 8 * i + 2 * t + (c & 1);
                if (row >= cnt) continue;
                const size_t p = (size_t)(off + row) * n_out + col;
                if constexpr (kGateUp) {
                    const float gt = acc[0][i][c];
                    ((bf16 *)out)[p] = __float2bfloat16_rn(gt / (1.0f + expf(-gt)) * acc[1][i][c]);
                } else ((float *)out)[p] = acc[a][i][c];
            }
}

/* Grid (ceil(n_out / (16 (gate/up) or 16 kA (down) x kW)), slots (+ 1 with the shared expert ws)): block
 * (x, j) of kW warps runs slot j's expert, warp w the block's w-th column group, the expert's rows 8 kMT at a time
 * (the weights read again for each 8 kMT past the first: an expert with more rows than the batch's kMT
 * was chosen for). kGateUp: w [E, 2 n_out, n_in], ws [2 n_out, n_in]; else [E, n_out, n_in], [n_out, n_in]. */
template <bool kGateUp, int kA, int kMT, int kU, int kPf, int kW>
__global__ void __launch_bounds__(32 * kW, 16 / kW) moe_bf16_kernel(const bf16 *__restrict__ in, const int32_t *__restrict__ perm, int topk,
                                                                 const int32_t *__restrict__ counts, const int32_t *__restrict__ offs, int E,
                                                                 int R, const bf16 *__restrict__ w, const bf16 *__restrict__ ws, int n_in,
                                                                 int n_out, void *out) {
    kdt_pdl_begin();
    const int col0 = (blockIdx.x * kW + threadIdx.x / 32) * 16 * (kGateUp ? 1 : kA);
    if (col0 >= n_out) return;
    const bool shared = ws && blockIdx.y == gridDim.y - 1;
    int cnt = R, off = R * topk;
    const bf16 *we = ws;
    if (!shared) {
        const int e = slot_expert(counts, E, blockIdx.y, &cnt);
        if (e < 0) return;
        off = offs[e];
        we = w + (size_t)e * (kGateUp ? 2 : 1) * n_out * n_in;
    }
    for (int r = 0; r < cnt; r += 8 * kMT)
        expert_pass<kGateUp, kA, kMT, kU, kPf>(in, perm, topk, shared, we, off, r, cnt, n_in, n_out, col0, out);
}

/* A product's shape: tiles a warp (kA), ring depth (kU), L2 prefetch bytes (kPf), warps a block (kW); none
 * changes a row's bits (each output is one lane's chain over K in k order). */
template <int kA, int kU, int kPf = 256, int kW = 1> struct Cfg {};

/* One product over the slots: gate/up (in x [R, n_in], w [E, 2 n_out, n_in], out act) or down (in act, w
 * [E, n_out, n_in], out ye); ws: the shared expert's matrix (NULL: none). Up to 8 rows (R <= 8) shape c1,
 * else c2 with 16, 24 or 32 rows a pass: an expert (the shared one: R rows) in one pass up to R = 32. */
template <bool kGateUp, int kA1, int kU1, int kPf1, int kA2, int kU2, int kPf2, int kW>
kdt_status product(Cfg<kA1, kU1, kPf1, kW>, Cfg<kA2, kU2, kPf2, kW>, int64_t R, const bf16 *in, const int32_t *perm, int32_t K, const int32_t *counts,
                   const int32_t *offs, const bf16 *w, const bf16 *ws, int32_t E, int32_t n_in, int32_t n_out, void *out, cudaStream_t s) {
    const unsigned slots = (unsigned)(R * K < E ? R * K : E) + (ws ? 1u : 0u);
    const int cols = 16 * kW * (kGateUp ? 1 : R <= 8 ? kA1 : kA2);
    const dim3 grid((unsigned)((n_out + cols - 1) / cols), slots), block(32 * kW);
    auto go = [&](auto kern) { return kdt_pdl_launch(kern, grid, block, 0, s, in, perm, (int)K, counts, offs, (int)E, (int)R, w, ws, (int)n_in,
                                                     (int)n_out, out); };
    KDT_CUDA_CHECK(R <= 8    ? go(moe_bf16_kernel<kGateUp, kA1, 1, kU1, kPf1, kW>)
                   : R <= 16 ? go(moe_bf16_kernel<kGateUp, kA2, 2, kU2, kPf2, kW>)
                   : R <= 24 ? go(moe_bf16_kernel<kGateUp, kA2, 3, kU2, kPf2, kW>)
                             : go(moe_bf16_kernel<kGateUp, kA2, 4, kU2, kPf2, kW>));
    KDT_CUDA_CHECK_LAUNCH(kGateUp ? "moe_bf16 gate_up" : "moe_bf16 down");
    return KDT_OK;
}
template <bool kGateUp, class C>
kdt_status product(C c, int64_t R, const bf16 *in, const int32_t *perm, int32_t K, const int32_t *counts, const int32_t *offs, const bf16 *w,
                   const bf16 *ws, int32_t E, int32_t n_in, int32_t n_out, void *out, cudaStream_t s) {
    return product<kGateUp>(c, c, R, in, perm, K, counts, offs, w, ws, E, n_in, n_out, out, s);
}

/* The library's shapes (docs/perf/model.md, "Grouped bf16 experts": the dev bench's variants, H200), the L2
 * asked for 256 bytes a load, blocks of one warp: an SM's bytes per second are capped near the DRAM's over
 * the SMs, so the SMs must get equal work, and 4-warp blocks of 9 or 17 experts (decode, verify with the
 * shared one) gave some SMs 3 blocks where most had 2 (decode), or left a second wave (verify); one-warp
 * blocks spread within a warp an SM and all fit at once (<= 128 registers: 16 an SM). gate/up: 2 tiles
 * (gate, up), a ring of 3 steps up to 8 rows, of 2 past that; down: a ring of 3, 2 tiles up to 8 rows (a
 * decode step's 2,016 warps fit at once), 1 past that (94-95% of copy against 2 tiles' 87-91%). */
typedef Cfg<2, 3> GateUp1;
typedef Cfg<2, 2> GateUp2;
typedef Cfg<2, 3> Down1;
typedef Cfg<1, 3> Down2;

} // namespace

extern "C" int kdt_moe_bf16_fits(int32_t hid, int32_t I) { return hid > 0 && I > 0 && hid % 32 == 0 && I % 32 == 0; }

extern "C" kdt_status kdt_moe_bf16(int64_t R, const void *x, const int32_t *perm, int32_t K, const int32_t *counts, const int32_t *offs,
                                   const void *w_gate_up, const void *w_down, const void *shared_gate_up, const void *shared_down, int32_t E,
                                   int32_t hid, int32_t I, void *act, float *ye, cudaStream_t s) {
    if (!kdt_moe_bf16_fits(hid, I))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: bf16 grouped experts need hidden and intermediate sizes that are multiples of 32: "
                        "hidden %d, intermediate %d", hid, I);
    if (R < 1 || K < 1) return KDT_OK;
    if (R > INT32_MAX / (K + 1)) return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: bf16 grouped experts of %lld rows", (long long)R);
    if (!shared_gate_up != !shared_down) return kdt_fail(KDT_ERR_INVALID_ARG, "model cuda: shared expert's gate/up without its down, or back");
    const bf16 *sg = (const bf16 *)shared_gate_up, *sd = (const bf16 *)shared_down;
    KDT_TRY(product<true>(GateUp1{}, GateUp2{}, R, (const bf16 *)x, perm, K, counts, offs, (const bf16 *)w_gate_up, sg, E, hid, I, act, s));
    return product<false>(Down1{}, Down2{}, R, (const bf16 *)act, perm, K, counts, offs, (const bf16 *)w_down, sd, E, I, hid, ye, s);
}
