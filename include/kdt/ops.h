/* kdtree-engine ops (docs/interfaces.md section 2). Each op has a params struct of dims and pointers, one
 * entry point that validates the params and runs on the chosen backend, and the interface's
 * tensor names in the shape comments.
 *
 * Backend KDT_BACKEND_CPU: every pointer is host memory, the call is synchronous.
 * Backend KDT_BACKEND_CUDA: every pointer is device memory, the work is queued on `stream`
 * (a cudaStream_t; NULL is the legacy default stream) and the call returns after the launch.
 * Threads: the ops keep no data between calls, and the CPU backend may be called from several
 * threads at once on different buffers. On CUDA a launch above 48 KB of shared memory first sets
 * the kernel's process-wide limit to its own need, so two threads running one op with different
 * shapes at once may race (one lowers the limit the other just raised): serialize such calls.
 * On CUDA the pointers must belong to the calling thread's current device. */
#pragma once

#include "kdt/kdt.h"
#include "kdt/kdtr.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KDT_TREE_MAX_BUDGET 1024
#define KDT_TREE_MAX_DEPTH 64
#define KDT_TREE_MAX_TOPK 64

/* ---- tree_build (docs/interfaces.md 2.1): best-first draft tree. Q = budget + 1. ---- */
typedef struct kdt_tree_build_params {
    int32_t B, D, K;            /* requests, draft depth (1..64), candidates per depth (1..64) */
    int32_t budget;             /* N, 1 .. 1024 */
    const float *scores;        /* [B, D, K] log-probs, non-increasing within each (b, d) */
    const int32_t *tokens;      /* [B, D, K] */
    const int32_t *root_token;  /* [B] */
    const int32_t *seq_len;     /* [B] */
    int32_t *num_nodes;         /* [B] out */
    int32_t *node_token;        /* [B, Q] out */
    int32_t *node_parent;       /* [B, Q] out */
    int32_t *node_depth;        /* [B, Q] out */
    int32_t *node_cand;         /* [B, Q] out */
    float *node_score;          /* [B, Q] out */
    int32_t *positions;         /* [B, Q] out */
    uint8_t *tree_mask;         /* [B, Q, Q] out */
    int32_t *first_child;       /* [B, Q] out */
    int32_t *next_sibling;      /* [B, Q] out */
} kdt_tree_build_params;

KDT_API kdt_status kdt_tree_build(const kdt_tree_build_params *p, kdt_backend backend, void *stream);

/* ---- verify_attn (docs/interfaces.md 2.2): tree-verify attention, absorbed MLA. Dqk = Dv + Dr. ---- */
typedef struct kdt_verify_attn_params {
    int32_t B, Q, H;            /* requests, tree rows, query heads */
    int32_t Dv, Dr;             /* latent (value) dims, rope dims */
    kdt_dtype dtype;            /* KDT_F32 or KDT_BF16: q, kv / kv_cache and o */
    const void *q;              /* [B, Q, H, Dqk] */
    /* Contiguous layout: kv != NULL, kv_cache == NULL. */
    const void *kv;             /* [B, L, Dqk] */
    int64_t L;
    /* Paged layout: kv_cache != NULL, kv == NULL. */
    const void *kv_cache;       /* [NB, BS, Dqk] */
    int32_t NB, BS;             /* blocks, rows per block */
    const int32_t *block_table; /* [B, MB] */
    int32_t MB;                 /* blocks per request */
    const int32_t *kv_len;      /* [B]; Q <= kv_len[b] <= L (or MB * BS) */
    const uint8_t *tree_mask;   /* [B, Q, Q] */
    float sm_scale;
    void *o;                    /* [B, Q, H, Dv] out, dtype */
    float *lse;                 /* [B, Q, H] out */
} kdt_verify_attn_params;

KDT_API kdt_status kdt_verify_attn(const kdt_verify_attn_params *p, kdt_backend backend, void *stream);

/* ---- tree_accept (docs/interfaces.md 2.3): greedy acceptance. ---- */
typedef struct kdt_tree_accept_params {
    int32_t B, Q;
    const int32_t *node_token;  /* [B, Q] */
    const int32_t *node_parent; /* [B, Q] */
    const int32_t *num_nodes;   /* [B] */
    const int32_t *target_pred; /* [B, Q] */
    int32_t *accept_len;        /* [B] out */
    int32_t *accept_index;      /* [B, Q] out */
    int32_t *accept_tokens;     /* [B, Q] out */
    int32_t *status;            /* [B] out: 0 ok, non-zero malformed tree */
} kdt_tree_accept_params;

KDT_API kdt_status kdt_tree_accept(const kdt_tree_accept_params *p, kdt_backend backend, void *stream);

/* ---- tree_sample_accept (docs/interfaces.md 2.4, docs/sampling.md): lossless acceptance when sampling. ----
 * Per request: temperature <= 0 (or NaN) is greedy and gives tree_accept's result on the argmax
 * of each row; top_k <= 0 or >= V is off; top_p >= 1 (or NaN) is off. kdt run checks that every
 * temperature is finite and >= 0, top_k >= 0 and top_p in (0, 1]; the kernels take any value. */
#define KDT_SAMPLE_MAX_VOCAB (1 << 24)
typedef struct kdt_tree_sample_accept_params {
    int32_t B, Q, V;
    const int32_t *node_token;   /* [B, Q] */
    const int32_t *node_parent;  /* [B, Q] */
    const int32_t *num_nodes;    /* [B] */
    const float *target_logits;  /* [B, Q, V] */
    const float *draft_probs;    /* [B, Q, V], or NULL: deterministic (top-K) children */
    const float *temperature;    /* [B] */
    const int32_t *top_k;        /* [B] */
    const float *top_p;          /* [B] */
    const uint64_t *seed;        /* [B] */
    int32_t *accept_len;         /* [B] out */
    int32_t *accept_index;       /* [B, Q] out */
    int32_t *accept_tokens;      /* [B, Q] out */
    int32_t *status;             /* [B] out: 0 ok, non-zero malformed tree (as tree_accept) */
} kdt_tree_sample_accept_params;

KDT_API kdt_status kdt_tree_sample_accept(const kdt_tree_sample_accept_params *p, kdt_backend backend,
                                          void *stream);

/* ---- kv_commit (docs/interfaces.md 2.5): move the accepted path's KV rows right after the prefix. ---- */
typedef struct kdt_kv_commit_params {
    int32_t B, Q;               /* requests, tree rows the cache holds after the prefix */
    int32_t NB, BS, Dqk;        /* cache blocks, rows per block, row width */
    kdt_dtype dtype;            /* KDT_F32 or KDT_BF16 */
    void *kv_cache;             /* [NB, BS, Dqk] in/out */
    const int32_t *block_table; /* [B, MB] */
    int32_t MB;
    const int32_t *kv_len;      /* [B] prefix + Q */
    const int32_t *accept_index;/* [B, Q] root first */
    const int32_t *accept_len;  /* [B] */
    int32_t *new_kv_len;        /* [B] out */
    int32_t *status;            /* [B] out: 0 ok, non-zero malformed request (left unmoved) */
} kdt_kv_commit_params;

KDT_API kdt_status kdt_kv_commit(const kdt_kv_commit_params *p, kdt_backend backend, void *stream);

/* ---- Ops on named tensors: what `kdt run` and the test runner call. ----
 * run reads the op's input tensors from `in` (the names of docs/interfaces.md; extra tensors ignored), checks
 * dtype, shape and values, runs on the backend (staging through device memory for CUDA) and
 * adds the output tensors to `out`. */
typedef struct kdt_op_desc {
    const char *name;           /* "tree_build" */
    const char *summary;        /* one line for --help */
    kdt_status (*run)(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend);
} kdt_op_desc;

KDT_API const kdt_op_desc *kdt_op_find(const char *name);   /* NULL if unknown */
KDT_API const kdt_op_desc *kdt_op_at(size_t index);         /* NULL past the last op */
KDT_API kdt_status kdt_op_run(const char *name, const kdt_kdtr *in, kdt_kdtr_writer *out,
                              kdt_backend backend);

#ifdef __cplusplus
}
#endif
