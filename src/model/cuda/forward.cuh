/* The CUDA forward's internals shared by forward.cu (inputs, scratch, graphs, the run) and layers.cu
 * (the layers: attention, the dense MLP, the MoE): the dispatch constants, the context, the batch's
 * attention plan, the buffers, the dims and one forward's state. */
#pragma once

#include <climits>
#include <cstdlib>
#include <cstring>

#include <cublas_v2.h>

#include "common/cuda/cuda_common.cuh"
#include "model/cuda/graph.h"
#include "kdt/ops.h"
#include "model/cuda.h"
#include "model/cuda/kernels.h"
#include "model/cuda/linear.h"
#include "model/cuda/moe_bf16.h"
#include "model/cuda/pick.cuh"
#include "model/cuda/route.h"

/* The q_a and kv_a norms use transformers' default eps, as on the CPU. */
#define LORA_NORM_EPS 1e-6f

/* cuBLAS gets a workspace of ours, set with every stream change: the same one in direct runs and
 * captures, so both choose the same kernels, and no allocation happens inside a capture. */
#define BLAS_WS_BYTES (32u << 20)

/* MoE layers run the small-batch kernels while the mean rows per expert stay at or below this
 * (moe.cu stages 16 rows per pass); with KDT_MODEL_GEMV, projections of at most this many
 * rows run them too. */
#define MOE_SMALL_ROWS_PER_EXPERT 16
/* Large experts leave the launch-bound regime sooner: above 2 rows per expert, cuBLAS's
 * per-expert GEMMs beat the device kernels on Kimi's 7168 x 2048 experts (H200, bench_model,
 * 2026-12-02: 4 rows per expert 1.64 ms against 1.46, 16 rows 3.02 against 1.83; 0.5 rows 0.89
 * against 1.14), while the small models' forwards are launch-bound at every size measured. */
#define MOE_LARGE_EXPERT_BYTES (32ull << 20)
#define MOE_LARGE_ROWS_PER_EXPERT 2
/* Large dense bf16 experts past MOE_LARGE_ROWS_PER_EXPERT rows per expert (verify sizes) run
 * moe_bf16.cu's grouped tensor-core kernels instead of cuBLAS per expert, up to this many rows per
 * expert (docs/perf/model.md, "Grouped bf16 experts"); prefill sizes keep cuBLAS. Decode sizes keep
 * moe.cu's kernels: with the grouped ones a batch-1 decode step was slower (H200, 2026-12-02 17:46:
 * Kimi dims 0.800 against 0.753 ms; bench_spec's plain 523.9 against 554.5 tokens/s), so a row's
 * expert output differs in its last bits between a decode step and a tree, as it did with cuBLAS. */
#define MOE_BF16_ROWS_PER_EXPERT 16
#define GEMV_MAX_ROWS 16
/* With KDT_MODEL_FUSED, experts under MOE_LARGE_EXPERT_BYTES take moe.cu's kernels at any batch
 * whose routed products stay under this many multiply-adds (CUDA cores, about 100 us): a
 * prefill of the small models then has no host wait and no per-expert GEMMs. */
#define MOE_DEVICE_MAX_MACS (1ll << 30)
/* With KDT_MODEL_FUSED, products of at most FUSED_MAX_ROWS rows with weights up to this size run
 * moe.cu's small-batch kernel (every projection of the shipped model; none of Kimi's), and the
 * query absorb of at most GEMV_MAX_ROWS rows is one kernel. One row: the kernel of 16 rows is
 * 10 to 18 k instructions and took 26 to 44 us a launch under ncu (H200, 2026-12-02, a 16-row verify
 * of the shipped model) against 4.4 us for one row, so a tree's rows go to cuBLAS. */
#define GEMV_SMALL_WEIGHT_BYTES (8ull << 20)
#define FUSED_MAX_ROWS 1
/* KDT_MODEL_PDL in forwards run directly (not captured) of at most this many rows. */
#define PDL_MAX_ROWS 64

struct kdt_cuda_ctx {
    cublasHandle_t blas;
    void *ws;                    /* device scratch of a forward */
    size_t ws_bytes;
    void *hin, *din;             /* a forward's inputs: pinned host staging, device copy */
    size_t hin_bytes, din_bytes;
    int32_t *h_counts;           /* pinned [E]: rows per expert of one MoE layer */
    void *blas_ws;               /* [BLAS_WS_BYTES] cuBLAS workspace */
    cudaStream_t cap;            /* where graphs are captured (never run on) */
    kdt_graphs *graphs;
    cudaEvent_t staged;          /* recorded after each upload from hin: hin may be rewritten once it is reached */
    bool queued;                 /* the last forward returned before its work ran (kdt_batch.no_wait) */
};

namespace kdt_fwd {

/* One verify_attn call: B requests of Q rows each, consecutive in the batch. */
struct Call {
    int32_t B, Q;
    int32_t entry;               /* first of its B entries (kv_len and block-table row) */
    int64_t row;                 /* first row */
    int64_t mask_off;            /* its [B, Q, Q] mask in the forward's mask bytes */
    int whole;                   /* each request's rows are all in this call (can take more requests) */
};

/* The attention calls of a batch. A tree is one call per request; a chain is cut in chunks of at
 * most KDT_MODEL_MAX_TREE rows, each seeing the rows before it. Requests with the same row count,
 * next to each other and not chunked, share a call (decode steps, equal trees). */
struct Plan {
    Call *calls;
    int32_t n_calls;
    int32_t *entry_req, *entry_len; /* [n_entries] cache slot, kv_len */
    int32_t n_entries;
    int64_t mask_bytes;          /* tree: the batch's masks; chain: causal masks of every chunk */
};

/* Device pointers of a forward's inputs and scratch. */
struct Bufs {
    /* inputs */
    int32_t *tokens, *pos, *last, *kv_len, *tables;
    int64_t *slots;
    uint8_t *masks;
    /* scratch */
    float *x, *hf, *cs, *sn, *a_out, *q, *lse, *gu, *ye, *rlog, *gw, *logits, *lt;
    void *hn, *qa, *qn, *qabs, *olat, *ov, *act, *xe;
    void *cat;                   /* MTP model: [R, 2 * hidden] (dt), eh_proj's input */
    int32_t *gi, *counts, *offs, *perm, *posa;
    int32_t *ticket;             /* the wide router's (route.cu): zero between launches; first, so it stays put */
};

struct Dims {
    int64_t R, RL;               /* rows; logit rows (R or B) */
    int32_t B, hid, H, nope, rope, half, qk, Dv, Dqk, vd, ql, qw, Wa, E, K, V, MB;
    size_t es;                   /* bytes per activation */
    int mtp;                     /* an MTP model (kdt_model_load_mtp): rows start from eh_proj */
    kdt_dtype dt;
    cudaDataType ct;             /* the same as a cuBLAS type */
};

struct Fwd {
    kdt_model *m;
    kdt_cache *c;
    kdt_cuda_ctx *x;
    const Plan *plan;
    Dims d;
    Bufs u;
    cudaStream_t s;
    kdt_lin_ctx lc;              /* the linears' stream, cuBLAS handle and scratch (linear.h) */
    bool moe_small;              /* MoE layers run moe.cu's kernels: no host wait */
    bool moe_bf16;               /* ... and their routed experts moe_bf16.cu's (with moe_small) */
    bool gemv;                   /* projections run moe.cu's small-batch kernel (KDT_MODEL_GEMV) */
    bool fused;                  /* KDT_MODEL_FUSED: route.cu's one-launch router where it fits */
    bool pdl;                    /* KDT_MODEL_PDL: the model's kernels with programmatic dependent launch */
    bool all;                    /* logits of every row (else of each request's last row) */
    float *log_out, *hid_out;    /* where the device work writes logits and hidden; NULL: not wanted */
    int32_t *pick;               /* kdt_batch.argmax [RL] (device); NULL: not wanted */
    const int32_t *tok_in;       /* kdt_batch.dev_tokens [R] (device), else the upload's tokens */
    const float *mtp_h;          /* an MTP model's mtp_hidden [R, hidden] (device) */
};

/* y [M, N] f32 (+)= x [M, K] (dt) . W^T (layers.cu). */
kdt_status proj(Fwd &f, int64_t M, const kdt_dlin &W, const void *x, float *y, float beta, bool any_size = true);
/* y [M, N] f32 = the norm's M rows . W^T. */
kdt_status proj_normed(Fwd &f, int64_t M, const kdt_dlin &W, const kdt_mk_norm &n, float *y, bool any_size);
/* MLA attention of layer l: x += o_proj(attention(attention norm of x)). */
kdt_status attention(Fwd &f, int32_t l);
/* x += the dense SiLU-gated MLP of the rows (u.hn, or norm's rows). */
kdt_status mlp(Fwd &f, const kdt_mlp_dw *w, const kdt_mk_norm *norm);
/* x += the MoE layer l on the ffn norm of x. */
kdt_status moe(Fwd &f, int32_t l);

} // namespace kdt_fwd
