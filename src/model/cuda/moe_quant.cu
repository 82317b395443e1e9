/* The routed experts of a MoE layer on quantized weights at decode and verify sizes
 * (moe_quant.h; docs/perf/quant.md, "Grouped quantized experts"): two launches a layer, gate/up
 * with SiLU . mul, then down, each over every expert with rows, weights streamed once from DRAM
 * and dequantized in registers onto the tensor cores.
 *
 * Grid (output tiles, expert slots). The experts with rows are not known on the host (the routing
 * stays on the device, so the launch can be captured in a graph): slot j takes the j-th expert with
 * rows in expert order, found by each warp from counts [E] (all E read at once, one round trip);
 * there are min(E, R K) slots, and slots past the active experts exit. A warp owns 16 output
 * columns of its expert (gate/up: the 16 gate rows and the matching 16 up rows, two mma A tiles, so
 * SiLU . mul pairs registers of the same lane) against 8 of its rows at a time (the mma's B), over
 * its part of K (kSplit warps of a block split it; their partials are summed in part order) in
 * 128-k steps: quant_mma.cuh's fp8_step / int4_step_tiles. Each lane loads its pieces of the step
 * (INT4 experts as the loader packs them, moe_quant.h: 16 contiguous bytes a row half, a warp's
 * step of a tile 1 KB of codes and 128 bytes of scales) kU steps ahead into registers, 2-4 KB a
 * warp in flight; a step's token rows (x, from L2 mostly) are read at once at its start. Each
 * output is one warp's sum (or its parts' in order): deterministic. */
#include <algorithm>
#include <type_traits>

#include "common/cuda/cuda_common.cuh"
#include "cuda/quant_mma.cuh"
#include "model/cuda/moe_quant.h"
#include "model/cuda/pdl.cuh" /* moe.cuh's kernel starts with kdt_pdl_begin */

namespace {

#include "model/cuda/moe.cuh" /* WQuant (the rows' and scales' addresses), silu */

typedef __nv_bfloat16 bf16;

constexpr int kQWarps = 4;   /* a block: 4 warps, 64 output columns */
constexpr int kQCols = 16;   /* output columns a warp */
constexpr int kQStep = 128;  /* k per step: one FP8 block column, four INT4 groups */
constexpr int kScan = 12;    /* expert counts a lane reads per round: 384 experts in one round trip */

/* The j-th expert with rows (counts [E] > 0) in expert order, or -1, its count in *cnt (so the block's
 * branch on it waits for no second load) and the experts with rows in *active; every lane gets them. */
__device__ int nth_active(const int32_t *__restrict__ counts, int E, int j, int *cnt, int *active) {
    const int lane = threadIdx.x & 31;
    int seen = 0, found = -1;
    for (int base = 0; base < E; base += 32 * kScan) {
        int c[kScan];
#pragma unroll
        for (int q = 0; q < kScan; q++) c[q] = base + 32 * q + lane < E ? counts[base + 32 * q + lane] : 0;
#pragma unroll
        for (int q = 0; q < kScan; q++) {
            unsigned m = __ballot_sync(0xffffffffu, c[q] > 0);
            const int n = __popc(m);
            if (found < 0 && j < seen + n) {
                for (int r = j - seen; r > 0; r--) m &= m - 1;
                found = base + 32 * q + __ffs((int)m) - 1;
                *cnt = __shfl_sync(0xffffffffu, c[q], found - base - 32 * q);
            }
            seen += n;
        }
    }
    *active = seen;
    return found;
}

/* Experts with rows, summed over the gate/up launches since kdt_moe_quant_experts_read last read it. */
__device__ unsigned long long g_experts_read;

/* Variants (kV bits; the dev bench times them, docs/perf/quant.md): kDirect (INT4): each lane loads 4 bytes
 * of each of the step's 4 groups, the words int4_step_tiles needs, in place of 16 bytes and the quad's
 * transpose; kDown2: down's warps own 32 columns (warp_cols); kPacked (INT4): the weights in moe_quant.h's
 * packed layout (kdt_moe_quant_int4_pack), a warp's step of a tile two 512-byte loads of codes and one
 * 128-byte load of its 16 rows' scales, already in the mma's order (no shuffle, no x permute). Measured and
 * left (docs/perf/quant.md): kSmem, kBulk (rings of steps in shared memory, by per-lane cp.async or by bulk
 * copies), the joint packed layout (scales after codes). */
constexpr int kDirect = 2, kDown2 = 8, kPacked = 32;

/* Output columns a warp of the kernel owns: gate/up 16 (two A tiles, gate and up rows); down 16, or 32
 * with kDown2 (two A tiles of adjacent columns: half the warps, so that at batch 1 a layer's down is one
 * wave of resident warps instead of 1.7). */
template <bool kGateUp, int kV> constexpr int warp_cols() { return kGateUp || !(kV & kDown2) ? 16 : 32; }

/* T at p + kOff, for a step wholly inside K (no bounds check): ld.global.nc with the 256-byte L2 prefetch,
 * L1 bypassed (kL1: through L1, for the scales, which a row's next steps read again). The immediate offset
 * keeps one address register for a row's pieces. */
template <class T, bool kL1 = false, int kOff = 0>
__device__ __forceinline__ T ldw(const uint8_t *p) {
    if constexpr (sizeof(T) == 16) {
        uint4 v;
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4+%5];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "n"(kOff));
        return v;
    } else if constexpr (sizeof(T) == 4 && kL1) {
        uint32_t v;
        asm volatile("ld.global.nc.L2::256B.u32 %0, [%1+%2];" : "=r"(v) : "l"(p), "n"(kOff));
        return v;
    } else if constexpr (sizeof(T) == 4) {
        uint32_t v;
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1+%2];" : "=r"(v) : "l"(p), "n"(kOff));
        return v;
    } else {
        static_assert(sizeof(T) == 2 && kL1, "ldw: 16 / 4-byte weights, 4 / 2-byte scales");
        unsigned short v;
        asm volatile("ld.global.nc.L2::256B.u16 %0, [%1+%2];" : "=h"(v) : "l"(p), "n"(kOff));
        return v;
    }
}
/* ldw where the step is wholly inside K (kFull: in is true), else the piece at p + kOff or zeros where !in (the
 * last step of an odd K). */
template <bool kFull, class T, bool kL1 = false, int kOff = 0>
__device__ __forceinline__ T ldp(const uint8_t *p, bool in) {
    if constexpr (kFull) return ldw<T, kL1, kOff>(p);
    else return in ? __ldcs((const T *)(p + kOff)) : T{};
}

/* What a lane holds of one step, per A tile a: rows g and g + 8 (h), INT4 bytes 16t .. 16t + 15 of the
 * row's 64-byte step (group t), FP8 bytes 16t .. and 64 + 16t .. of its 128-byte step; s: INT4 group
 * t's bf16 scales of rows g (low half) and g + 8 (high), FP8 the tile's block scale (f32 bits). */
template <bool kInt4, int kA, bool kPk> struct QStage {
    uint4 w[kA][2][kInt4 ? 1 : 2];
    std::conditional_t<kPk, uint4, uint32_t> s[kA]; /* kPk: word G = group G's scales of rows g (low half), g + 8 */
};

/* One warp: columns col0 .. col0 + 15 (down with kDown2: + 31, two A tiles) of expert e against its rows r_beg .. r_beg + 7 (those below cnt;
 * the mma's 8 columns), at assignment places off + row, over part ks of kSplit of the 128-k steps (the
 * kSplit warps of a column group sum their partials through red in part order, and part 0 writes).
 * kGateUp: in = x [*, n_in] (row perm[place] / topk), out = act [*, n_out] bf16; else in = act
 * [*, n_in] (row = place), out = ye [*, n_out] f32. kLaneBytes: weight bytes a lane keeps in flight.
 * n_out % 16 == 0: a live tile's 16 columns are all in range (a dead one, past n_out, reads the last
 * 16 and writes nothing), so rows g + 8 are rows g's plus 8 rows. */
template <bool kInt4, bool kGateUp, int kSplit, int kLaneBytes, int kV>
__device__ __forceinline__ void expert_cols(const bf16 *__restrict__ in, const int32_t *__restrict__ perm, int topk, const WQuant<kInt4> &w,
                                            int e, int off, int r_beg, int cnt, int n_in, int n_out, int col0, int ks, float *red,
                                            void *out) {
    constexpr int kA = kGateUp ? 2 : warp_cols<kGateUp, kV>() / 16, kMT = 1;
    constexpr int kStepBytes = kA * 2 * (kInt4 ? 16 : 32); /* a lane's weight bytes of one step */
    constexpr int kU = 1 + (kLaneBytes / kStepBytes > 1 ? kLaneBytes / kStepBytes : 1); /* ring: in flight + the computed one */
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int nsteps = (n_in + kQStep - 1) / kQStep, ng = n_in / 32;
    const int s_beg = ks * nsteps / kSplit, s_end = (ks + 1) * nsteps / kSplit;
    const size_t w8 = (size_t)8 * (kInt4 ? n_in / 2 : n_in), s8 = (size_t)8 * (n_in / 32) * 2; /* 8 rows of codes, INT4 scales */
    constexpr bool kPk = kInt4 && (kV & kPacked);
    const uint8_t *wr[kA], *sr[kA]; /* row g's codes and scales (FP8: its block row's); kPk: the tile's */
#pragma unroll
    for (int a = 0; a < kA; a++) {
        const int col = min(col0 + (kGateUp ? 0 : 16 * a), n_out - kQCols) + (kPk ? 0 : g);
        const size_t row = kGateUp && a ? n_out + col : col;
        const typename WQuant<kInt4>::Row r = w.row(e, 0, row, 0);
        wr[a] = r.w, sr[a] = r.s;
    }
    const int xrow = r_beg + g;
    const bf16 *xr = xrow < cnt ? in + (size_t)(kGateUp && perm ? perm[off + xrow] / topk : off + xrow) * n_in : nullptr;

    /* The lane's pieces of step s: rows (a, h) at pw[a][h] + s * kRowStep (+ 16 G: INT4 kDirect's group G;
     * + 64: FP8's second piece), INT4 scales at ps[a][h] + 8 s (group 4 s + t), FP8's at ps[a][0] + 4 s.
     * Steps past the part are not loaded (never computed); past K (a step of an odd K) they are zeros. */
    constexpr int kRowStep = kInt4 ? kQStep / 2 : kQStep;
    constexpr bool kDir = kInt4 && (kV & kDirect);
    const int s_full = n_in / kQStep; /* steps wholly inside K */
    const uint8_t *pw[kA][2], *ps[kA][2];
#pragma unroll
    for (int a = 0; a < kA; a++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if constexpr (kPk) pw[a][h] = wr[a] + 512 * h + 16 * lane, ps[a][h] = sr[a] + 16 * g; /* step s at + 1024 s, + 128 s */
            else pw[a][h] = wr[a] + h * w8 + (kDir ? 4 : 16) * t, ps[a][h] = kInt4 ? sr[a] + h * s8 + 2 * t : sr[a];
        }
    auto load_step = [&](auto full, QStage<kInt4, kA, kPk> &st, int s) { /* full: std::true_type where s < s_full */
        constexpr bool kFull = decltype(full)::value;
        const int o = s * kRowStep, lim = kInt4 ? n_in / 2 : n_in; /* lim: bytes of a row */
#pragma unroll
        for (int a = 0; a < kA; a++) {
            uint32_t sc = 0;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint8_t *p = pw[a][h] + o;
                if constexpr (kDir)
                    st.w[a][h][0] = make_uint4(ldp<kFull, uint32_t>(p, o < lim), ldp<kFull, uint32_t, false, 16>(p, o + 16 < lim),
                                               ldp<kFull, uint32_t, false, 32>(p, o + 32 < lim), ldp<kFull, uint32_t, false, 48>(p, o + 48 < lim));
                else st.w[a][h][0] = ldp<kFull, uint4>(p, o + 16 * t < lim);
                if constexpr (!kInt4) st.w[a][h][1] = ldp<kFull, uint4, false, 64>(p, o + 64 + 16 * t < lim);
                if constexpr (kInt4) sc |= (uint32_t)ldp<kFull, unsigned short, true>(ps[a][h] + 8 * s, 4 * s + t < n_in / 32) << (16 * h);
            }
            if constexpr (!kInt4) sc = ldp<kFull, uint32_t, true>(ps[a][0] + 4 * s, true);
            if constexpr (!kPk) st.s[a] = sc; /* kPk: load's own branch */
        }
    };
    auto load = [&](QStage<kInt4, kA, kPk> &st, int s) {
        if (s >= s_end) return;
        if constexpr (kPk) { /* K % 128 == 0: every step is full */
#pragma unroll
            for (int a = 0; a < kA; a++) {
                st.w[a][0][0] = ldw<uint4>(pw[a][0] + 1024 * s), st.w[a][1][0] = ldw<uint4>(pw[a][1] + 1024 * s);
                st.s[a] = ldw<uint4>(ps[a][0] + 128 * s);
            }
        } else if (s < s_full) load_step(std::true_type(), st, s);
        else load_step(std::false_type(), st, s);
    };
    float acc[kA][kMT][4] = {};
    auto compute = [&](const QStage<kInt4, kA, kPk> &st, int s) {
        const int kb = s * kQStep;
        /* x chunk u: INT4 k kb + 32u + 8t .. + 7; FP8 kb + 64 (u / 2) + 16t + 8 (u % 2) ... All four read at
         * once, for both tiles: x mostly comes from L2 (written by the kernel before), and a round trip
         * per group (H200, 12:20 run: loads inside int4_step) made a step last ~8 L2 latencies. */
        uint4 xv[kMT][4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int k = kb + (kInt4 ? 32 * u + 8 * t : 64 * (u / 2) + 16 * t + 8 * (u % 2));
            xv[0][u] = xr && k < n_in ? __ldg((const uint4 *)(xr + k)) : make_uint4(0, 0, 0, 0);
        }
        auto xat = [&](int i, int u) { return xv[i][u]; };
        if constexpr (kPk) {
            uint4 v0[kA], v1[kA];
#pragma unroll
            for (int a = 0; a < kA; a++) v0[a] = st.w[a][0][0], v1[a] = st.w[a][1][0];
            int4_step_tiles<kMT, kA, kInt4Packed>(acc, v0, v1, t, 4, xat, [&](int a, int G, int h) {
                const uint32_t wd = G == 0 ? st.s[a].x : G == 1 ? st.s[a].y : G == 2 ? st.s[a].z : st.s[a].w;
                return __uint_as_float(h ? wd & 0xFFFF0000u : wd << 16);
            });
        } else if constexpr (kInt4) {
            uint32_t sw[kA][4]; /* tile a's group G scales, from lane G of the quad */
            uint4 v0[kA], v1[kA];
#pragma unroll
            for (int a = 0; a < kA; a++) {
                v0[a] = st.w[a][0][0], v1[a] = st.w[a][1][0];
#pragma unroll
                for (int G = 0; G < 4; G++) sw[a][G] = __shfl_sync(0xffffffffu, st.s[a], (lane & ~3) | G);
            }
            int4_step_tiles<kMT, kA, kDir ? kInt4Words : kInt4Groups>(acc, v0, v1, t, ng - kb / 32, xat, [&](int a, int G, int h) {
                return bf16_bits((uint16_t)(h ? sw[a][G] >> 16 : sw[a][G]));
            });
        } else {
#pragma unroll
            for (int a = 0; a < kA; a++) {
                const uint4(&p)[2] = st.w[a][0], (&q)[2] = st.w[a][1];
                const uint32_t q0[8] = {p[0].x, p[0].y, p[0].z, p[0].w, p[1].x, p[1].y, p[1].z, p[1].w};
                const uint32_t q1[8] = {q[0].x, q[0].y, q[0].z, q[0].w, q[1].x, q[1].y, q[1].z, q[1].w};
                fp8_step<kMT>(acc[a], q0, q1, __uint_as_float(st.s[a]), xat);
            }
        }
    };

    /* A slot is refilled as soon as its step is computed (no copy of it: the registers are the ring's). */
    QStage<kInt4, kA, kPk> ring[kU];
#pragma unroll
    for (int u = 0; u < kU; u++) load(ring[u], s_beg + u);
    for (int s0 = s_beg; s0 < s_end; s0 += kU) {
#pragma unroll
        for (int u = 0; u < kU; u++) {
            if (s0 + u >= s_end) break;
            compute(ring[u], s0 + u);
            load(ring[u], s0 + u + kU);
        }
    }

    if constexpr (kSplit > 1) { /* red [warp][kA 4][lane]: parts 1 .. kSplit - 1 to part 0, added in part order */
        constexpr int kAcc = kA * 4;
        float *flat = &acc[0][0][0];
        const int warp = threadIdx.x / 32;
        if (ks)
#pragma unroll
            for (int v = 0; v < kAcc; v++) red[(warp * kAcc + v) * 32 + lane] = flat[v];
        __syncthreads();
        if (!ks)
            for (int q = 1; q < kSplit; q++)
#pragma unroll
                for (int v = 0; v < kAcc; v++) flat[v] += red[((warp + q) * kAcc + v) * 32 + lane];
        __syncthreads(); /* red is free for the block's next pass */
        if (ks) return;
    }
    /* c0, c1: row g, x rows 2t, 2t + 1 of the tile; c2, c3: row g + 8. */
#pragma unroll
    for (int a = 0; a < (kGateUp ? 1 : kA); a++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int col = col0 + 16 * a + g + (c >= 2 ? 8 : 0), row = r_beg + 2 * t + (c & 1);
            if (col >= n_out || row >= cnt) continue;
            const size_t p = (size_t)off + row;
            if constexpr (kGateUp) ((bf16 *)out)[p * n_out + col] = __float2bfloat16_rn(silu(acc[0][0][c]) * acc[1][0][c]);
            else ((float *)out)[p * n_out + col] = acc[a][0][c];
        }
}

/* Grid (ceil(n_out / (warp_cols kQWarps / kSplit)), slots): block (x, j) runs the j-th expert with rows (see
 * expert_cols; warp w: column group w / kSplit, part w % kSplit), its rows 8 at a time (the weights read
 * again for each 8 past the first: rare at decode sizes, where an expert mostly has 1 or 2).
 * kGateUp: w [E, 2 n_out, n_in]; else [E, n_out, n_in]. 4 blocks an SM (at most 128 registers a
 * thread): 16 warps. */
template <bool kInt4, bool kGateUp, int kSplit, int kLaneBytes, int kV>
__global__ void __launch_bounds__(32 * kQWarps, 4) moe_quant_kernel(const bf16 *__restrict__ in, const int32_t *__restrict__ perm, int topk,
                                                                const int32_t *__restrict__ counts, const int32_t *__restrict__ offs,
                                                                int E, const WQuant<kInt4> w, int n_in, int n_out, void *out) {
    __shared__ float red[kSplit > 1 ? kQWarps * (kGateUp ? 2 : warp_cols<kGateUp, kV>() / 16) * 4 * 32 : 1];
    const int warp = threadIdx.x / 32, ks = warp % kSplit;
    const int col0 = (blockIdx.x * (kQWarps / kSplit) + warp / kSplit) * warp_cols<kGateUp, kV>();
    if (kSplit == 1 && col0 >= n_out) return;
    int cnt = 0, active = 0;
    const int e = nth_active(counts, E, blockIdx.y, &cnt, &active);
    if (kGateUp && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) atomicAdd(&g_experts_read, (unsigned long long)active);
    if (e < 0) return;
    const int off = offs[e];
    for (int r = 0; r < cnt; r += 8) expert_cols<kInt4, kGateUp, kSplit, kLaneBytes, kV>(in, perm, topk, w, e, off, r, cnt, n_in, n_out, col0, ks, red, out);
}

/* Both launches; kSplitGU / kSplitDown: warps that split the K of gate/up (K = hidden) and down (K = I). */
template <bool kInt4, int kSplitGU, int kSplitDown, int kLaneBytes, int kV>
kdt_status launch(int64_t R, const bf16 *x, const int32_t *perm, int32_t K, const int32_t *counts, const int32_t *offs, const kdt_dlin *gu,
                  const kdt_dlin *dn, int32_t hid, int32_t I, void *act, float *ye, cudaStream_t s) {
    const int32_t E = gu->n;
    const int gu_cols = kQWarps / kSplitGU * kQCols, dn_cols = kQWarps / kSplitDown * warp_cols<false, kV>();
    const unsigned slots = (unsigned)(R * K < E ? R * K : E);
    moe_quant_kernel<kInt4, true, kSplitGU, kLaneBytes, (kV & ~kDown2)><<<dim3((unsigned)((I + gu_cols - 1) / gu_cols), slots), 32 * kQWarps, 0, s>>>(
        x, perm, K, counts, offs, E, wquant<kInt4>(gu), hid, I, act);
    KDT_CUDA_CHECK_LAUNCH("moe_quant gate_up");
    moe_quant_kernel<kInt4, false, kSplitDown, kLaneBytes, kV><<<dim3((unsigned)((hid + dn_cols - 1) / dn_cols), slots), 32 * kQWarps, 0, s>>>(
        (const bf16 *)act, nullptr, K, counts, offs, E, wquant<kInt4>(dn), I, hid, ye);
    KDT_CUDA_CHECK_LAUNCH("moe_quant down");
    return KDT_OK;
}

/* Where packed code word i of a span of rows [rows, K] (K / 128 = S steps) lies in the checkpoint's layout:
 * *row and its word *kw (values k = 8 kw .. 8 kw + 7). moe_quant.h has the layout. */
__device__ __forceinline__ void packed_word(int64_t i, int64_t S, int64_t *row, int64_t *kw) {
    const int64_t b = i / 256; /* block b: tile b / S, step b % S; its words [h 2][lane 32][G 4] */
    const int q = (int)(i % 256), h = q / 128, lane = q / 4 % 32, G = q % 4;
    *row = 16 * (b / S) + lane / 4 + 8 * h, *kw = 16 * (b % S) + 4 * G + lane % 4;
}
/* Where packed scale j of the span lies in the checkpoint's layout: *row and its group *grp. */
__device__ __forceinline__ void packed_scale(int64_t j, int64_t S, int64_t *row, int64_t *grp) {
    const int64_t b = j / 64; /* block b's 64 scales: [g 8][G 4][h 2] */
    const int q = (int)(j % 64), g = q / 8, G = q / 2 % 4, h = q % 2;
    *row = 16 * (b / S) + g + 8 * h, *grp = 4 * (b % S) + G;
}
/* Nibble n of a packed word holds value j = pk_val(n) of its 8 (moe_quant.h: value j in nibble j / 2 or 4 + j / 2). */
__device__ __forceinline__ int pk_val(int n) { return n < 4 ? 2 * n : 2 * n - 7; }

/* The packed layout from the checkpoint's: thread i writes packed code word i (i < rows K / 8) or scale
 * i - rows K / 8 of the span. */
__global__ void int4_pack_kernel(uint32_t *__restrict__ dw, uint16_t *__restrict__ ds, const uint32_t *__restrict__ sw,
                                 const uint16_t *__restrict__ ss, int64_t rows, int K) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nw = rows * (K / 8), S = K / 128;
    int64_t row, c;
    if (i < nw) {
        packed_word(i, S, &row, &c);
        const uint32_t v = sw[row * (K / 8) + c]; /* value j in nibble j */
        uint32_t o = 0;
#pragma unroll
        for (int n = 0; n < 8; n++) o |= (v >> (4 * pk_val(n)) & 15u) << (4 * n);
        dw[i] = o;
    } else if (i < nw + rows * (K / 32)) {
        packed_scale(i - nw, S, &row, &c);
        ds[i - nw] = ss[row * (K / 32) + c];
    }
}

/* bf16 out [rows, K] from a packed span, as quant_gemm.cu's dequantizer rounds the checkpoint's layout:
 * thread i the 8 values of packed word i. */
__global__ void int4_unpack_bf16_kernel(const uint32_t *__restrict__ dw, const uint16_t *__restrict__ ds, bf16 *__restrict__ out,
                                        int64_t rows, int K) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, S = K / 128;
    if (i >= rows * (K / 8)) return;
    int64_t row, c;
    packed_word(i, S, &row, &c);
    const uint32_t v = dw[i];
    /* the scale's packed index: block (row / 16) S + c / 16, place [g][G][h] */
    const float sc = bf16_bits(ds[((row / 16) * S + c / 16) * 64 + row % 8 * 8 + c % 16 / 4 * 2 + row % 16 / 8]);
    float f[8];
#pragma unroll
    for (int n = 0; n < 8; n++) f[pk_val(n)] = (float)((int)(v >> (4 * n) & 15u) - 8);
    uint4 o;
    uint32_t *ow = &o.x;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const __nv_bfloat162 r = __floats2bfloat162_rn(f[2 * q] * sc, f[2 * q + 1] * sc);
        ow[q] = *(const uint32_t *)&r;
    }
    *(uint4 *)(out + row * K + 8 * c) = o;
}

} // namespace

extern "C" int kdt_moe_quant_int4_packable(int32_t N, int32_t K) { return N > 0 && K > 0 && N % 16 == 0 && K % 128 == 0; }

extern "C" kdt_status kdt_moe_quant_int4_pack(void *dst_w, void *dst_s, const void *src_w, const void *src_s, int64_t rows, int32_t K,
                                              cudaStream_t s) {
    if (!dst_w || !dst_s || !src_w || !src_s)
        return kdt_fail(KDT_ERR_INVALID_ARG, "model cuda: INT4 pack: a codes or scales pointer is NULL");
    if (rows < 1 || rows % 16 || !kdt_moe_quant_int4_packable(16, K))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: INT4 pack of %lld rows of K = %d: rows must be a multiple of 16, K of 128",
                        (long long)rows, K);
    const int64_t n = rows * (K / 8) + rows * (K / 32);
    int4_pack_kernel<<<(unsigned)((n + 255) / 256), 256, 0, s>>>((uint32_t *)dst_w, (uint16_t *)dst_s, (const uint32_t *)src_w,
                                                                 (const uint16_t *)src_s, rows, K);
    KDT_CUDA_CHECK_LAUNCH("moe_quant int4 pack");
    return KDT_OK;
}

/* Matrix e of part p of an INT4 linear: its codes and scales. */
static void part_at(const kdt_dlin *d, int p, int64_t e, const uint8_t **w, const uint8_t **sc) {
    const int64_t r = kdt_dlin_rows(d, p), K = d->K;
    *w = (const uint8_t *)d->w[p] + e * r * (K / 2);
    *sc = (const uint8_t *)d->scale[p] + e * r * (K / 16);
}

extern "C" kdt_status kdt_moe_quant_int4_dequant(const kdt_dlin *d, int64_t e, void *out, cudaStream_t s) {
    if (d->fmt != KDT_WFMT_INT4 || !d->packed)
        return kdt_fail(KDT_ERR_INVALID_ARG, "model cuda: packed INT4 dequantize of a linear that is not packed INT4");
    for (int p = 0, row = 0; p < d->parts; row += kdt_dlin_rows(d, p), p++) {
        const uint8_t *w, *sc;
        part_at(d, p, e, &w, &sc);
        const int64_t n = (int64_t)kdt_dlin_rows(d, p) * (d->K / 8);
        int4_unpack_bf16_kernel<<<(unsigned)((n + 255) / 256), 256, 0, s>>>((const uint32_t *)w, (const uint16_t *)sc,
                                                                            (bf16 *)out + (size_t)row * d->K, kdt_dlin_rows(d, p), d->K);
        KDT_CUDA_CHECK_LAUNCH("moe_quant int4 dequantize");
    }
    return KDT_OK;
}

extern "C" kdt_status kdt_cuda_pack_experts(kdt_dlin *gate_up, kdt_dlin *down) {
    const int32_t I = gate_up->N / 2, hid = down->N;
    if (gate_up->fmt != KDT_WFMT_INT4 || down->fmt != KDT_WFMT_INT4 || gate_up->packed || down->packed || gate_up->N % 2 ||
        gate_up->K != hid || down->K != I || !kdt_moe_quant_fits(gate_up, down, hid, I) || !kdt_moe_quant_int4_packable(I, hid) ||
        !kdt_moe_quant_int4_packable(hid, I))
        return KDT_OK; /* stays in the checkpoint's layout */
    /* in place, a matrix at a time: its codes and scales copied aside, then packed back */
    size_t most = 0;
    for (const kdt_dlin *d : {gate_up, down})
        for (int p = 0; p < d->parts; p++) most = std::max(most, (size_t)kdt_dlin_rows(d, p) * (d->K / 2 + d->K / 16));
    uint8_t *tmp = nullptr;
    KDT_CUDA_CHECK(cudaMalloc(&tmp, most));
    auto pack_all = [&]() -> kdt_status {
        for (const kdt_dlin *d : {gate_up, down})
            for (int p = 0; p < d->parts; p++)
                for (int64_t e = 0; e < d->n; e++) {
                    const uint8_t *w, *sc;
                    part_at(d, p, e, &w, &sc);
                    const size_t rows = (size_t)kdt_dlin_rows(d, p), cb = rows * (d->K / 2);
                    KDT_CUDA_CHECK(cudaMemcpyAsync(tmp, w, cb, cudaMemcpyDeviceToDevice, 0));
                    KDT_CUDA_CHECK(cudaMemcpyAsync(tmp + cb, sc, rows * (d->K / 16), cudaMemcpyDeviceToDevice, 0));
                    KDT_TRY(kdt_moe_quant_int4_pack((void *)w, (void *)sc, tmp, tmp + cb, (int64_t)rows, d->K, 0));
                }
        KDT_CUDA_CHECK(cudaDeviceSynchronize());
        return KDT_OK;
    };
    const kdt_status st = pack_all();
    const cudaError_t freed = cudaFree(tmp);
    if (st != KDT_OK) return st; /* the experts are left half packed: the load fails */
    KDT_CUDA_CHECK(freed);
    gate_up->packed = down->packed = 1;
    return KDT_OK;
}

extern "C" kdt_status kdt_moe_quant_experts_read(int64_t *n) {
    unsigned long long v = 0;
    KDT_CUDA_CHECK(cudaMemcpyFromSymbol(&v, g_experts_read, sizeof v));
    const unsigned long long zero = 0;
    KDT_CUDA_CHECK(cudaMemcpyToSymbol(g_experts_read, &zero, sizeof zero));
    *n = (int64_t)v;
    return KDT_OK;
}

extern "C" int kdt_moe_quant_fits(const kdt_dlin *gate_up, const kdt_dlin *down, int32_t hid, int32_t I) {
    const int m = gate_up->fmt == KDT_WFMT_INT4 ? 32 : 16;
    return gate_up->fmt == down->fmt && (gate_up->fmt == KDT_WFMT_INT4 || gate_up->fmt == KDT_WFMT_FP8) && hid > 0 && I > 0 &&
           hid % m == 0 && I % m == 0;
}

extern "C" kdt_status kdt_moe_quant(int64_t R, const void *x, const int32_t *perm, int32_t K, const int32_t *counts, const int32_t *offs,
                                    const kdt_dlin *gate_up, const kdt_dlin *down, int32_t hid, int32_t I, void *act, float *ye,
                                    cudaStream_t s) {
    if (!kdt_moe_quant_fits(gate_up, down, hid, I))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: quantized experts need one format (FP8 or INT4) for gate/up and down and "
                        "hidden, intermediate sizes that are multiples of 16 (FP8) or 32 (INT4): hidden %d, intermediate %d", hid, I);
    if (R < 1 || K < 1) return KDT_OK;
    if (gate_up->packed != down->packed || (gate_up->packed && (gate_up->fmt != KDT_WFMT_INT4 || hid % 128 || I % 128)))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: packed INT4 experts need gate/up and down both packed and hidden, "
                        "intermediate sizes that are multiples of 128: hidden %d, intermediate %d", hid, I);
    if (gate_up->packed) {
        /* gate/up's K split over 2 warps where its unsplit blocks would not fill the GPU's 4 a SM once (R = 1:
         * 256 blocks; H200, 17:12 run: 47.6 against 50.9 us), unsplit past that (R = 8: 263.5 against 282.6 us) */
        int dev = 0, sms = 0;
        KDT_CUDA_CHECK(cudaGetDevice(&dev));
        KDT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        const bool split = (R * K < gate_up->n ? R * K : gate_up->n) * ((I + 63) / 64) < 4 * (int64_t)sms;
        const bf16 *xb = (const bf16 *)x;
        return split ? launch<true, 2, 1, 64, kPacked | kDown2>(R, xb, perm, K, counts, offs, gate_up, down, hid, I, act, ye, s)
                     : launch<true, 1, 1, 64, kPacked | kDown2>(R, xb, perm, K, counts, offs, gate_up, down, hid, I, act, ye, s);
    }
    if (gate_up->fmt == KDT_WFMT_INT4)
        return launch<true, 2, 1, 64, kDirect>(R, (const bf16 *)x, perm, K, counts, offs, gate_up, down, hid, I, act, ye, s);
    return launch<false, 1, 1, 128, kDown2>(R, (const bf16 *)x, perm, K, counts, offs, gate_up, down, hid, I, act, ye, s);
}
