/* tree_accept CUDA (docs/interfaces.md 2.3). The library runs the warp-per-request kernel: the warp copies
 * the request's Q rows of target_pred, node_token and node_parent into shared memory in one
 * round trip, checks every parent, and records for each node its lowest-index child c with
 * node_token[c] == target_pred[parent] (a shared atomicMin); the greedy walk is then a chase
 * through that table by one lane, at most num_nodes steps, and the warp writes the outputs.
 * The ballot and thread-per-request variants exist for bench/bench_accept.cu.
 *
 * Safe on any input: every read is inside the request's [Q] rows; parents are range-checked
 * before they index anything; the walk reads only nodes 0 .. num_nodes of a checked tree. */
#include <climits>

#include "common/cuda/cuda_common.cuh"
#include "cuda/tree_accept.h"
#include "ops/backends.h"

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kNoChild = INT_MAX;
constexpr int kMaxWarpsPerBlock = 4;
constexpr int kStageUnroll = 8;
constexpr size_t kSmemLimit = 48 * 1024; /* dynamic shared memory without an opt-in */

/* Per warp: target_pred, node_token, node_parent and an aux row, Q ints each. */
__host__ __device__ size_t smem_per_warp(int Q) { return 4 * sizeof(int) * (size_t)Q; }

/* Status codes, the same in the CPU reference and the numpy generator. */
constexpr int kBadNumNodes = 1, kBadParent = 2;

/* Copies request b's rows into shared memory and checks the tree. Returns the status (the
 * same in every lane); *nn is num_nodes, or 0 for a malformed tree. With best != NULL, also
 * fills best[p] = lowest child c of p with tok[c] == pred[p] (kNoChild if none). */
__device__ int stage_tree(const kdt_tree_accept_params &p, int b, int lane, int *pred, int *tok, int *par,
                          int *best, int *nn) {
    const int Q = p.Q;
    const size_t row = (size_t)b * Q;
    const int n = __ldg(p.num_nodes + b);
    for (int c0 = lane; c0 < Q; c0 += 32 * kStageUnroll) { /* kStageUnroll rows' loads in flight */
        int vp[kStageUnroll], vt[kStageUnroll], vq[kStageUnroll];
#pragma unroll
        for (int u = 0; u < kStageUnroll; u++) {
            const int c = c0 + 32 * u;
            if (c >= Q) continue;
            vp[u] = __ldg(p.target_pred + row + c);
            vt[u] = __ldg(p.node_token + row + c);
            vq[u] = __ldg(p.node_parent + row + c);
        }
#pragma unroll
        for (int u = 0; u < kStageUnroll; u++) {
            const int c = c0 + 32 * u;
            if (c >= Q) continue;
            pred[c] = vp[u];
            tok[c] = vt[u];
            par[c] = vq[u];
        }
    }
    if (best)
        for (int c = lane; c < Q; c += 32) best[c] = kNoChild;
    __syncwarp();
    const int n_ok = n >= 0 && n <= Q - 1;
    const int n_checked = n_ok ? n : 0;
    int bad = 0;
    for (int c = 1 + lane; c <= n_checked; c += 32) {
        const int pc = par[c];
        if (pc < 0 || pc >= c) bad = 1;
        else if (best && tok[c] == pred[pc]) atomicMin(best + pc, c);
    }
    const int any_bad = __any_sync(kFull, bad);
    __syncwarp();
    const int status = !n_ok ? kBadNumNodes : any_bad ? kBadParent : 0;
    *nn = status ? 0 : n;
    return status;
}

/* path[0 .. len] are the accepted nodes; rows past them get -1. */
__device__ void write_outputs(const kdt_tree_accept_params &p, int b, int lane, int len, int status,
                              const int *path, const int *tok, const int *pred) {
    const int Q = p.Q;
    const size_t row = (size_t)b * Q;
    for (int i = lane; i < Q; i += 32) {
        p.accept_index[row + i] = i <= len ? path[i] : -1;
        p.accept_tokens[row + i] = i < len ? tok[path[i + 1]] : i == len ? pred[path[len]] : -1;
    }
    if (lane == 0) {
        p.accept_len[b] = len;
        p.status[b] = status;
    }
}

__global__ void tree_accept_warp(kdt_tree_accept_params p, int warps_per_block) {
    extern __shared__ int smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long b = (long long)blockIdx.x * warps_per_block + warp;
    if (b >= p.B) return; /* the whole warp: no block-wide barrier follows */
    int *pred = smem + (size_t)warp * 4 * p.Q, *tok = pred + p.Q, *par = tok + p.Q, *best = par + p.Q;
    int nn;
    const int status = stage_tree(p, (int)b, lane, pred, tok, par, best, &nn);
    int *path = par; /* parents are not needed after the check */
    int len = 0;
    if (lane == 0) {
        int cur = 0;
        path[0] = 0;
        for (int step = 0; step < nn; step++) { /* best[cur] > cur, so this ends sooner anyway */
            const int next = best[cur];
            if (next == kNoChild) break;
            path[++len] = cur = next;
        }
    }
    len = __shfl_sync(kFull, len, 0);
    __syncwarp();
    write_outputs(p, (int)b, lane, len, status, path, tok, pred);
}

__global__ void tree_accept_ballot(kdt_tree_accept_params p, int warps_per_block) {
    extern __shared__ int smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long b = (long long)blockIdx.x * warps_per_block + warp;
    if (b >= p.B) return;
    int *pred = smem + (size_t)warp * 4 * p.Q, *tok = pred + p.Q, *par = tok + p.Q, *path = par + p.Q;
    int nn;
    const int status = stage_tree(p, (int)b, lane, pred, tok, par, NULL, &nn);
    int cur = 0, len = 0; /* the same in every lane */
    if (lane == 0) path[0] = 0;
    for (int step = 0; step < nn; step++) {
        const int target = pred[cur];
        int next = -1;
        for (int base = cur + 1; base <= nn; base += 32) { /* children lie above their parent */
            const int c = base + lane;
            const unsigned m = __ballot_sync(kFull, c <= nn && par[c] == cur && tok[c] == target);
            if (m) {
                next = base + __ffs((int)m) - 1;
                break;
            }
        }
        if (next < 0) break;
        cur = next;
        len++;
        if (lane == 0) path[len] = cur;
    }
    __syncwarp();
    write_outputs(p, (int)b, lane, len, status, path, tok, pred);
}

__global__ void tree_accept_thread(kdt_tree_accept_params p) {
    const long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= p.B) return;
    const int Q = p.Q;
    const size_t row = (size_t)b * Q;
    const int *tok = p.node_token + row, *par = p.node_parent + row, *pred = p.target_pred + row;
    int *idx = p.accept_index + row, *out = p.accept_tokens + row;
    const int n = p.num_nodes[b];
    int status = n < 0 || n > Q - 1 ? kBadNumNodes : 0;
    for (int c = 1; status == 0 && c <= n; c++)
        if (par[c] < 0 || par[c] >= c) status = kBadParent;
    int cur = 0, len = 0;
    idx[0] = 0;
    for (int step = 0; status == 0 && step < n; step++) {
        int next = -1;
        for (int c = cur + 1; c <= n && next < 0; c++)
            if (par[c] == cur && tok[c] == pred[cur]) next = c;
        if (next < 0) break;
        out[len++] = tok[next];
        idx[len] = cur = next;
    }
    out[len] = pred[cur];
    for (int i = len + 1; i < Q; i++) idx[i] = out[i] = -1;
    p.accept_len[b] = len;
    p.status[b] = status;
}

} // namespace

extern "C" const char *kdt_tree_accept_variant_name(int variant) {
    switch (variant) {
    case KDT_TREE_ACCEPT_WARP: return "warp";
    case KDT_TREE_ACCEPT_WARP1: return "warp1";
    case KDT_TREE_ACCEPT_BALLOT: return "ballot";
    case KDT_TREE_ACCEPT_THREAD: return "thread";
    default: return "?";
    }
}

extern "C" kdt_status kdt_tree_accept_cuda_variant(const kdt_tree_accept_params *p, void *stream, int variant) {
    cudaStream_t s = (cudaStream_t)stream;
    if (p->B <= 0) return KDT_OK;
    const size_t per_warp = smem_per_warp(p->Q);
    int wpb = (int)(kSmemLimit / per_warp);
    if (wpb > kMaxWarpsPerBlock) wpb = kMaxWarpsPerBlock;
    if (wpb < 1) return kdt_fail(KDT_ERR_INVALID_ARG, "tree_accept: Q = %d too large for the CUDA kernel", p->Q);
    if (variant == KDT_TREE_ACCEPT_WARP1) wpb = 1;
    switch (variant) {
    case KDT_TREE_ACCEPT_WARP:
    case KDT_TREE_ACCEPT_WARP1:
        tree_accept_warp<<<(unsigned)(((long long)p->B + wpb - 1) / wpb), 32 * wpb, wpb * per_warp, s>>>(*p, wpb);
        break;
    case KDT_TREE_ACCEPT_BALLOT:
        tree_accept_ballot<<<(unsigned)(((long long)p->B + wpb - 1) / wpb), 32 * wpb, wpb * per_warp, s>>>(*p, wpb);
        break;
    case KDT_TREE_ACCEPT_THREAD:
        tree_accept_thread<<<(unsigned)(((long long)p->B + 127) / 128), 128, 0, s>>>(*p);
        break;
    default: return kdt_fail(KDT_ERR_INVALID_ARG, "tree_accept: unknown CUDA variant %d", variant);
    }
    KDT_CUDA_CHECK_LAUNCH("tree_accept");
    return KDT_OK;
}

extern "C" kdt_status kdt_tree_accept_cuda(const kdt_tree_accept_params *p, void *stream) {
    return kdt_tree_accept_cuda_variant(p, stream, KDT_TREE_ACCEPT_WARP);
}
