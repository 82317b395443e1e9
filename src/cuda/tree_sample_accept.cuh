/* tree_sample_accept's device code (docs/interfaces.md 2.4; docs/sampling.md), included by
 * src/cuda/tree_sample_accept.cu and by tests/test_tree_sample_accept_emu.cc, which runs it on
 * CPU threads. It includes only plain C headers; the includer supplies the CUDA subset it uses
 * (shuffles, ballots, barriers, shared atomics, __ldg). One block of kThreads threads walks one
 * request: see tree_sample_accept.cu for the design. */
#pragma once

#include "common/sample_math.h"
#include "kdt/ops.h"

namespace tsa {
namespace { /* internal linkage: the library's kernel and the emulated test both define these */

constexpr int kThreads = 1024, kWarps = kThreads / 32, kMaxQ = KDT_TREE_MAX_BUDGET + 1;
constexpr unsigned kFull = 0xffffffffu;
/* The filters' coarse bins: kBins - 1 of width 32 / (kBins - 1) over m - key in [0, 32), then one
 * for the rest (weight 0 there: e^-32 * 2^32 < 1); kCap keys of one bin resolved exactly. */
constexpr int kBins = 1024, kCap = 2048;
typedef unsigned long long u64;


struct Smem {
    int tok[kMaxQ], par[kMaxQ], first_child[kMaxQ], next_sib[kMaxQ];
    int path_idx[kMaxQ], path_tok[kMaxQ];
    int rej[kMaxQ];      /* tokens rejected at the current node (deterministic children) */
    double chain[kMaxQ]; /* Z / Qz of each rejection at the current node (sampled children) */
    u64 hist_w[256];
    unsigned hist_n[256];
    /* The filters' coarse pass: per bin of (m - key), counts and weights; one bin's keys. */
    u64 cbin_w[kBins];
    unsigned cbin_n[kBins];
    float buf[kCap];
    unsigned n_buf;
    int cut_bin, coarse_ok;
    u64 cut_above, cut_need;
    u64 red[kWarps];
    float redf[kWarps];
    u64 Z, Zr, Qz, target;
    float m;
    unsigned tau, prefix;
    int n_rej, n_chain, next, token, seg_warp, status;
};

/* One node's filtered distribution: weight of token v (0 below the threshold). */
struct Dist {
    const float *row;
    float T, m;
    unsigned tau;
    __device__ u64 w_of_key(float k) const { return kdt_key_order(k) >= tau ? kdt_sample_weight(k, m) : 0; }
    __device__ u64 w_of(float logit) const { return w_of_key(kdt_sample_key(logit, T)); }
    __device__ u64 w(int v) const { return w_of(__ldg(row + v)); }
};

/* f(v, x[v], y[v]) for this thread's elements v = threadIdx.x + i * kThreads of x [V] (and y [V]
 * when kTwo), kUnroll loads a row issued before any is used (one SM pulls a row: the loads in flight
 * set its bandwidth). The order of the calls is not the token order; every use here is order-free
 * (max, u64 sums). */
constexpr int kUnroll = 8;
template <bool kTwo, typename F> __device__ void for_rows(const float *x, const float *y, int V, F f) {
    int v = threadIdx.x;
    for (; v + (kUnroll - 1) * kThreads < V; v += kUnroll * kThreads) {
        float r[kUnroll], q[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) r[u] = __ldg(x + v + u * kThreads);
#pragma unroll
        for (int u = 0; u < kUnroll; u++) q[u] = kTwo ? __ldg(y + v + u * kThreads) : 0.0f;
#pragma unroll
        for (int u = 0; u < kUnroll; u++) f(v + u * kThreads, r[u], q[u]);
    }
    for (; v < V; v += kThreads) f(v, __ldg(x + v), kTwo ? __ldg(y + v) : 0.0f);
}

template <typename F> __device__ void for_row(const float *x, int V, F f) {
    for_rows<false>(x, x, V, [&](int v, float a, float) { f(v, a); });
}

__device__ u64 warp_sum(u64 x) {
    for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
    return x;
}

/* Block-wide sums and maxima; every thread gets the result. */
__device__ u64 block_sum(Smem &s, u64 x) {
    x = warp_sum(x);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s.red[threadIdx.x >> 5] = x;
    __syncthreads();
    return warp_sum(s.red[threadIdx.x & 31]);
}

__device__ float block_max(Smem &s, float x) {
    for (int o = 16; o; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s.redf[threadIdx.x >> 5] = x;
    __syncthreads();
    x = s.redf[threadIdx.x & 31];
    for (int o = 16; o; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
    return x;
}

__device__ u64 block_max_u64(Smem &s, u64 x) {
    for (int o = 16; o; o >>= 1) x = max(x, (u64)__shfl_xor_sync(kFull, x, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s.red[threadIdx.x >> 5] = x;
    __syncthreads();
    x = s.red[threadIdx.x & 31];
    for (int o = 16; o; o >>= 1) x = max(x, (u64)__shfl_xor_sync(kFull, x, o));
    return x;
}

/* The loop's argmax (src/spec/rows.c): NaN below everything, -0 == +0, ties to the lowest id. */
__device__ int block_argmax(Smem &s, const float *row, int V) {
    u64 best = 0;
    for_row(row, V, [&](int v, float x) {
        const unsigned o = x != x ? 0u : kdt_key_order(x == 0.0f ? 0.0f : x);
        best = max(best, (u64)o << 32 | (0xFFFFFFFFu - (unsigned)v));
    });
    return (int)(0xFFFFFFFFu - (unsigned)block_max_u64(s, best));
}

/* Radix select over the key orders of the keys that each(f) visits (f(key) once per key), 8 bits a
 * pass from the top. By count (weighted = false): the order of the need-th largest key. By weight:
 * the largest order t whose keys >= t (and >= d.tau) weigh at least `need`, and s.Z = that weight. */
template <typename Each> __device__ unsigned radix_select(Smem &s, const Dist &d, u64 need, bool weighted, Each each) {
    unsigned prefix = 0;
    u64 above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += kThreads) s.hist_w[i] = 0, s.hist_n[i] = 0;
        __syncthreads();
        const unsigned hi_mask = shift == 24 ? 0u : ~0u << (shift + 8);
        each([&](float k) {
            const unsigned o = kdt_key_order(k);
            if ((o & hi_mask) != (prefix & hi_mask)) return;
            const unsigned bin = (o >> shift) & 255u;
            if (weighted) {
                const u64 w = o >= d.tau ? kdt_sample_weight(k, d.m) : 0;
                if (w) atomicAdd(&s.hist_w[bin], w);
            } else {
                atomicAdd(&s.hist_n[bin], 1u);
            }
        });
        __syncthreads();
        if (threadIdx.x == 0) {
            u64 cum = above;
            int bin = 255;
            for (; bin > 0; bin--) {
                const u64 h = weighted ? s.hist_w[bin] : s.hist_n[bin];
                if (cum + h >= need) break;
                cum += h;
            }
            above = cum;
            s.prefix = prefix | (unsigned)bin << shift;
            if (shift == 0) s.Z = above + (weighted ? s.hist_w[bin] : s.hist_n[bin]);
        }
        __syncthreads();
        prefix = s.prefix; /* `above` matters to thread 0 alone, which carries it to the next pass */
    }
    return prefix;
}

/* The radix select over the whole row (four passes of 640 KB at Kimi's vocabulary). */
__device__ unsigned row_select(Smem &s, const Dist &d, int V, u64 need, bool weighted) {
    return radix_select(s, d, need, weighted,
                        [&](auto f) { for_row(d.row, V, [&](int, float x) { f(kdt_sample_key(x, d.T)); }); });
}

/* The coarse bin of a key: monotone (a larger key never gets a larger bin), so every key of a
 * lower bin is larger than every key of a higher one. m finite. */
__device__ int coarse_bin(float k, float m) {
    const float x = KDT_FMUL(KDT_FSUB(m, k), (float)(kBins - 1) / 32.0f);
    return (int)fminf(x, (float)(kBins - 1));
}

/* The keys of coarse bin `bin` into s.buf (s.n_buf of them; the caller checked they fit). */
__device__ void collect_bin(Smem &s, const Dist &d, int V, int bin) {
    if (threadIdx.x == 0) s.n_buf = 0;
    __syncthreads();
    for_row(d.row, V, [&](int, float x) {
        const float k = kdt_sample_key(x, d.T);
        if (coarse_bin(k, d.m) == bin) s.buf[atomicAdd(&s.n_buf, 1u)] = k;
    });
    __syncthreads();
}

__device__ unsigned buf_select(Smem &s, const Dist &d, u64 need, bool weighted) {
    return radix_select(s, d, need, weighted, [&](auto f) {
        for (unsigned i = threadIdx.x; i < s.n_buf; i += kThreads) f(s.buf[i]);
    });
}

/* The first bin below `end` at which the running count (weight) of the bins reaches need (else
 * end - 1), found by warp 0 (a scan of per-lane sums, then one lane's bins): s.cut_bin, s.cut_above
 * what the bins before it hold, s.cut_need what is left to find in it. s.coarse_ok = 0 where that
 * bin is the last (its keys unbounded) or holds more keys than s.buf takes. */
__device__ void coarse_cut(Smem &s, u64 need, bool weighted, int end) {
    constexpr int per = kBins / 32;
    const int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
        u64 mine = 0;
        for (int i = lane * per; i < lane * per + per && i < end; i++) mine += weighted ? s.cbin_w[i] : s.cbin_n[i];
        u64 incl = mine;
        for (int o = 1; o < 32; o <<= 1) {
            const u64 y = __shfl_up_sync(kFull, incl, o);
            if (lane >= o) incl += y;
        }
        const unsigned hit = __ballot_sync(kFull, incl >= need);
        const int at = hit ? __ffs(hit) - 1 : (end - 1) / per;
        if (lane == at) {
            u64 cum = incl - mine;
            int bin = lane * per;
            for (; bin < end - 1; bin++) {
                const u64 h = weighted ? s.cbin_w[bin] : s.cbin_n[bin];
                if (cum + h >= need) break;
                cum += h;
            }
            s.cut_bin = bin, s.cut_above = cum, s.cut_need = need - cum;
            if (bin == kBins - 1 || s.cbin_n[bin] > (unsigned)kCap) s.coarse_ok = 0;
        }
    }
    __syncthreads();
}

/* top-k and top-p in two or three passes over the row (docs/perf/tree_sample_accept.md): one
 * histogram of counts and weights over coarse bins of m - key, then the keys of the bin where the
 * cut falls, selected exactly in shared memory (a second bin's keys where top-p cuts above the top-k
 * bin). The thresholds are those of the radix select over the row, bit for bit. Sets d.tau and
 * returns Z, the kept weight; returns 0 with s.coarse_ok = 0 where it cannot (m = -inf, the cut in
 * the last bin, a bin of more than kCap keys): the caller then takes the radix select. */
__device__ u64 coarse_filter(Smem &s, Dist &d, int V, int K, bool fk, float P, bool fp) {
    for (int i = threadIdx.x; i < kBins; i += kThreads) s.cbin_w[i] = 0, s.cbin_n[i] = 0;
    if (threadIdx.x == 0) s.coarse_ok = d.m > -INFINITY;
    __syncthreads();
    if (!s.coarse_ok) return 0;
    u64 last_w = 0, last_n = 0; /* the last bin, the crowded one for peaked rows, in registers */
    for_row(d.row, V, [&](int, float x) {
        const float k = kdt_sample_key(x, d.T);
        const int bin = coarse_bin(k, d.m);
        const u64 w = kdt_sample_weight(k, d.m);
        if (bin == kBins - 1) {
            last_w += w, last_n++;
        } else {
            atomicAdd(&s.cbin_n[bin], 1u);
            if (w) atomicAdd(&s.cbin_w[bin], w);
        }
    });
    last_w = block_sum(s, last_w);
    last_n = block_sum(s, last_n);
    if (threadIdx.x == 0) s.cbin_w[kBins - 1] = last_w, s.cbin_n[kBins - 1] = (unsigned)last_n;
    __syncthreads();
    u64 Z = 0;
    int kbin = kBins; /* top-k's bin: the bins before it are kept whole */
    if (fk) {
        coarse_cut(s, (u64)K, false, kBins);
        if (!s.coarse_ok) return 0;
        kbin = s.cut_bin;
        collect_bin(s, d, V, kbin);
        d.tau = buf_select(s, d, s.cut_need, false);
        u64 part = 0;
        for (unsigned i = threadIdx.x; i < s.n_buf; i += kThreads) part += d.w_of_key(s.buf[i]);
        const u64 in_bin = block_sum(s, part);
        part = 0;
        for (int i = threadIdx.x; i < kbin; i += kThreads) part += s.cbin_w[i];
        Z = block_sum(s, part) + in_bin;
        if (threadIdx.x == 0) s.cbin_w[kbin] = in_bin; /* the bin's kept weight, for top-p's scan */
        __syncthreads();
    } else {
        u64 part = 0;
        for (int i = threadIdx.x; i < kBins; i += kThreads) part += s.cbin_w[i];
        Z = block_sum(s, part);
    }
    if (!fp) return Z;
    coarse_cut(s, kdt_top_p_need(P, Z), true, kbin < kBins ? kbin + 1 : kBins);
    if (!s.coarse_ok) return 0;
    const u64 above = s.cut_above;
    if (s.cut_bin != kbin) collect_bin(s, d, V, s.cut_bin);
    d.tau = buf_select(s, d, s.cut_need, true);
    return above + s.Z;
}

/* Residual weight of token v at the current node: the rejected tokens removed (deterministic),
 * or each rejection's draft share taken off (sampled). */
__device__ u64 residual_w(const Smem &s, const Dist &d, const float *qrow, int v) {
    u64 r = d.w(v);
    if (!r) return 0;
    for (int i = 0; i < s.n_rej; i++)
        if (s.rej[i] == v) return 0;
    if (s.n_chain) {
        const u64 qw = kdt_draft_weight(__ldg(qrow + v));
        for (int i = 0; i < s.n_chain && r; i++) r = kdt_residual_step(r, qw, s.chain[i]);
    }
    return r;
}

/* Inverse CDF of the residual at s.target (< its sum): the token, written to s.token. */
__device__ void sample_residual(Smem &s, const Dist &d, const float *qrow, int V) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, seg = (V + kWarps - 1) / kWarps;
    const int lo = min(V, warp * seg), hi = min(V, lo + seg);
    u64 part = 0;
    for (int v = lo + lane; v < hi; v += 32) part += residual_w(s, d, qrow, v);
    part = warp_sum(part);
    __syncthreads();
    if (lane == 0) s.red[warp] = part;
    __syncthreads();
    if (threadIdx.x == 0) { /* the segment holding the target, and the weight before it */
        u64 cum = 0;
        int w = 0;
        for (; w < kWarps - 1 && cum + s.red[w] <= s.target; w++) cum += s.red[w];
        s.seg_warp = w;
        s.target -= cum;
    }
    __syncthreads();
    if (warp == s.seg_warp) {
        u64 before = 0;
        int found = -1;
        for (int v0 = lo; v0 < hi && found < 0; v0 += 32) {
            const int v = v0 + lane;
            u64 x = v < hi ? residual_w(s, d, qrow, v) : 0, incl = x;
            for (int o = 1; o < 32; o <<= 1) {
                const u64 y = __shfl_up_sync(kFull, incl, o);
                if (lane >= o) incl += y;
            }
            const unsigned hit = __ballot_sync(kFull, before + incl > s.target);
            if (hit) found = v0 + __ffs(hit) - 1;
            before += __shfl_sync(kFull, incl, 31);
        }
        if (lane == 0) s.token = found >= 0 ? found : hi - 1;
    }
    __syncthreads();
}

/* The children of the current node, tried in index order by thread 0 with the whole block
 * joining each sampled rejection's pass. Leaves s.next (-1: none accepted) and s.Zr. */
__device__ void try_children(Smem &s, const Dist &d, const float *qrow, int cur, int depth, int b, u64 seed, int V) {
    int j = 0;
    for (int c = s.first_child[cur]; c >= 0; c = s.next_sib[c], j++) {
        __syncthreads(); /* every thread has read the last try's s.next and s.Zr */
        if (threadIdx.x == 0) {
            const int x = s.tok[c];
            const double u = kdt_sample_uniform(seed, (uint32_t)b, (uint32_t)depth, (uint32_t)j, KDT_SAMPLE_STREAM_ACCEPT);
            const bool in = x >= 0 && x < V;
            const u64 r = in ? residual_w(s, d, qrow, x) : 0;
            if (s.Qz > 0) {
                const u64 qw = in ? kdt_draft_weight(__ldg(qrow + x)) : 0;
                if (kdt_accept_sampled(u, r, s.Zr, qw, s.Qz)) s.next = c;
                else s.chain[s.n_chain++] = KDT_DDIV(KDT_U2D(s.Zr), KDT_U2D(s.Qz));
            } else if (s.Zr > 0 && kdt_accept_det(u, r, s.Zr)) {
                s.next = c;
            } else if (r > 0) {
                s.rej[s.n_rej++] = x;
                s.Zr -= r;
            }
        }
        __syncthreads();
        if (s.next >= 0) return;
        if (s.Qz > 0) { /* the new residual's sum */
            u64 part = 0;
            for (int v = threadIdx.x; v < V; v += kThreads) part += residual_w(s, d, qrow, v);
            part = block_sum(s, part);
            if (threadIdx.x == 0) s.Zr = part;
            __syncthreads();
        }
    }
}

/* Request b, by the whole block; s is the block's shared memory. */
/* coarse: the filters' coarse pass and the draft row read in the max pass (else the radix selects
 * over the row and a pass of its own for the draft row: the previous kernel, kept for the bench's
 * before / after; both give the same bits). */
__device__ void tsa_request(const kdt_tree_sample_accept_params &p, Smem &s, int b, bool coarse = true) {
    const int Q = p.Q, V = p.V, tid = threadIdx.x;
    const size_t row0 = (size_t)b * Q;
    const int n = p.num_nodes[b];
    const float T = p.temperature[b], P = p.top_p[b];
    const int K = p.top_k[b];
    const u64 seed = p.seed[b];
    for (int c = tid; c < Q; c += kThreads) {
        s.tok[c] = p.node_token[row0 + c];
        s.par[c] = p.node_parent[row0 + c];
        s.first_child[c] = s.next_sib[c] = -1;
    }
    __syncthreads();
    int bad = 0; /* status codes as tree_accept: 1 num_nodes out of range, 2 a bad parent */
    if (n >= 0 && n <= Q - 1)
        for (int c = 1 + tid; c <= n; c += kThreads) bad |= s.par[c] < 0 || s.par[c] >= c;
    const int status = n < 0 || n > Q - 1 ? 1 : __syncthreads_or(bad) ? 2 : 0;
    const int nn = status ? 0 : n;
    for (int c = 1 + tid; c <= nn; c += kThreads) { /* child lists in index order */
        atomicMin((unsigned *)&s.first_child[s.par[c]], (unsigned)c); /* -1 is the largest unsigned */
        for (int c2 = c + 1; c2 <= nn; c2++)
            if (s.par[c2] == s.par[c]) { s.next_sib[c] = c2; break; }
    }
    __syncthreads();

    int cur = 0, len = 0;
    for (;;) {
        const float *row = p.target_logits + (row0 + cur) * V;
        if (tid == 0) s.next = -1, s.n_rej = 0, s.n_chain = 0;
        if (!(T > 0.0f)) { /* greedy: docs/interfaces.md 2.3 on the row's argmax */
            const int pred = block_argmax(s, row, V);
            if (tid == 0) {
                for (int c = s.first_child[cur]; c >= 0 && s.next < 0; c = s.next_sib[c])
                    if (s.tok[c] == pred) s.next = c;
                s.token = pred;
            }
            __syncthreads();
        } else {
            Dist d = {row, T, 0.0f, 0u};
            float m = -INFINITY;
            const float *qrow = p.draft_probs ? p.draft_probs + (row0 + cur) * V : nullptr;
            const bool with_q = qrow && status == 0, fused = with_q && coarse;
            u64 qpart = 0; /* the draft row's weights, read beside the logits when fused */
            if (fused)
                for_rows<true>(row, qrow, V, [&](int, float x, float q) {
                    m = fmaxf(m, kdt_sample_key(x, T));
                    qpart += kdt_draft_weight(q);
                });
            else
                for_row(row, V, [&](int, float x) { m = fmaxf(m, kdt_sample_key(x, T)); });
            d.m = block_max(s, m);
            const bool fk = K > 0 && K < V, fp = P < 1.0f;
            u64 Z = 0, part = 0;
            if ((fk || fp) && coarse) Z = coarse_filter(s, d, V, K, fk, P, fp);
            if (!Z) { /* no filter, or the radix selects over the row */
                d.tau = fk ? row_select(s, d, V, (u64)K, false) : 0u;
                for_row(row, V, [&](int, float x) { part += d.w_of(x); });
                Z = block_sum(s, part);
                if (fp) {
                    d.tau = row_select(s, d, V, kdt_top_p_need(P, Z), true);
                    Z = s.Z;
                }
            }
            u64 Qz = 0;
            if (with_q) {
                if (!fused) for_row(qrow, V, [&](int, float x) { qpart += kdt_draft_weight(x); });
                Qz = block_sum(s, qpart);
            }
            if (tid == 0) s.Qz = Qz, s.Zr = Z;
            __syncthreads();
            try_children(s, d, qrow, cur, len, b, seed, V);
            if (s.next < 0) {
                if (tid == 0) {
                    if (s.Zr == 0) s.n_rej = s.n_chain = 0, s.Zr = Z; /* residual used up: the full distribution */
                    const double u = kdt_sample_uniform(seed, (uint32_t)b, (uint32_t)len, KDT_SAMPLE_DRAW_BONUS,
                                                        KDT_SAMPLE_STREAM_ACCEPT);
                    s.target = kdt_sample_target(u, s.Zr);
                }
                __syncthreads();
                sample_residual(s, d, qrow, V);
            }
        }
        const int next = s.next;
        if (tid == 0) {
            s.path_idx[len] = cur;
            s.path_tok[len] = next >= 0 ? s.tok[next] : s.token;
        }
        __syncthreads();
        if (next < 0) break;
        cur = next;
        len++;
    }
    int *idx = p.accept_index + row0, *out = p.accept_tokens + row0;
    for (int i = tid; i < Q; i += kThreads) {
        idx[i] = i <= len ? s.path_idx[i] : -1;
        out[i] = i <= len ? s.path_tok[i] : -1;
    }
    if (tid == 0) {
        p.accept_len[b] = len;
        p.status[b] = status;
    }
}

} // namespace
} // namespace tsa
