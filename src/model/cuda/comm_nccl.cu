/* The NCCL backend of kdt/comm.h: libnccl.so.2 of the PyPI wheel nvidia-nccl-cu13, opened with
 * dlopen, so that the build needs no NCCL and a machine without it says so when asked for it.
 * Only the entry points used here are declared, as the wheel's include/nccl.h (2.32) states them.
 * A collective queues on the caller's stream, then this thread polls the stream, NCCL's error
 * state, the world's abort flag and the deadline: a peer that died or aborted ends the wait with
 * ncclCommAbort and a message, never a hang. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cuda/cuda_common.cuh"
#include "common/internal.h"
#include "model/comm_internal.h"

#ifndef KDT_NCCL_LIB
#define KDT_NCCL_LIB ""
#endif

namespace {

/* From nccl.h: the values and signatures used here. */
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef int ncclResult_t;        /* ncclSuccess 0, ncclInProgress 7 */
typedef int ncclDataType_t;      /* ncclInt8 0, ncclUint8 1, ncclInt32 2, ncclInt64 4, ncclFloat16 6, ncclFloat32 7,
                                    ncclFloat64 8, ncclBfloat16 9 */
constexpr ncclResult_t kSuccess = 0, kInProgress = 7;
constexpr int kSum = 0;

struct Nccl {
    void *lib;
    ncclUniqueId id;
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*CommAbort)(ncclComm_t);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
    const char *(*GetErrorString)(ncclResult_t);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
};

struct Rank {
    ncclComm_t comm;
    int *d_one;                  /* [1] the barrier's all-reduce */
};

/* Byte moves go as ncclUint8 scaled by the element size; sums need NCCL's type. */
int nccl_type(kdt_dtype dt, size_t *scale) {
    *scale = 1;
    switch (dt) {
    case KDT_F32: return 7;
    case KDT_F64: return 8;
    case KDT_I32: return 2;
    case KDT_I64: return 4;
    case KDT_F16: return 6;
    case KDT_BF16: return 9;
    default: *scale = kdt_dtype_size(dt); return 1;
    }
}

double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

} // namespace

extern "C" kdt_status kdt_nccl_world_init(kdt_comm_world *w) {
    const char *env = getenv("KDT_NCCL_LIB");
    const char *paths[3] = {env && *env ? env : nullptr, *KDT_NCCL_LIB ? KDT_NCCL_LIB : nullptr, "libnccl.so.2"};
    Nccl *n = (Nccl *)calloc(1, sizeof(Nccl));
    if (!n) return kdt_fail(KDT_ERR_NOMEM, "comm: out of memory");
    const char *err = "no path tried";
    for (int i = 0; i < 3 && !n->lib; i++)
        if (paths[i] && !(n->lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL))) err = dlerror();
    if (!n->lib) {
        free(n);
        return kdt_fail(KDT_ERR_UNSUPPORTED, "comm: NCCL is unavailable (%s): install the wheel nvidia-nccl-cu13 and point "
                        "$KDT_NCCL_LIB (or make NCCL_LIB=...) at its nvidia/nccl/lib/libnccl.so.2", err);
    }
    int missing = 0;
#define SYM(f) missing |= !(*(void **)&n->f = dlsym(n->lib, "nccl" #f))
    SYM(GetUniqueId); SYM(CommInitRank); SYM(CommDestroy); SYM(CommAbort); SYM(CommGetAsyncError); SYM(GetErrorString);
    SYM(AllReduce); SYM(AllGather); SYM(ReduceScatter); SYM(Broadcast); SYM(Send); SYM(Recv); SYM(GroupStart); SYM(GroupEnd);
#undef SYM
    ncclResult_t r = missing ? kSuccess : n->GetUniqueId(&n->id);
    if (missing || r != kSuccess) {
        kdt_status s =
            kdt_fail(KDT_ERR_COMM, "comm: NCCL %s", missing ? "lacks an entry point this build uses" : n->GetErrorString(r));
        dlclose(n->lib);
        free(n);
        return s;
    }
    w->nccl = n;
    return KDT_OK;
}

extern "C" void kdt_nccl_world_free(kdt_comm_world *w) {
    Nccl *n = (Nccl *)w->nccl;
    /* The library stays loaded: NCCL keeps threads and atexit handlers that must find its code. */
    free(n);
    w->nccl = nullptr;
}

extern "C" kdt_status kdt_nccl_init(kdt_comm *c) {
    Nccl *n = (Nccl *)c->w->nccl;
    int ndev = 0;
    KDT_CUDA_CHECK(cudaGetDeviceCount(&ndev));
    if (c->rank >= ndev)
        return kdt_fail(KDT_ERR_INVALID_ARG, "comm: rank %d needs CUDA device %d; this machine has %d", c->rank, c->rank, ndev);
    KDT_CUDA_CHECK(cudaSetDevice(c->rank));
    Rank *rk = (Rank *)calloc(1, sizeof(Rank));
    if (!rk) return kdt_fail(KDT_ERR_NOMEM, "comm: out of memory");
    cudaError_t e = cudaMalloc(&rk->d_one, sizeof(int));
    ncclResult_t r = e == cudaSuccess ? n->CommInitRank(&rk->comm, c->w->size, n->id, c->rank) : kSuccess;
    if (e != cudaSuccess || r != kSuccess) {
        if (rk->d_one) cudaFree(rk->d_one);
        free(rk);
        return kdt_fail(KDT_ERR_COMM, "comm: rank %d: %s", c->rank,
                        e != cudaSuccess ? cudaGetErrorString(e) : n->GetErrorString(r));
    }
    c->nccl = rk;
    return KDT_OK;
}

extern "C" void kdt_nccl_free(kdt_comm *c) {
    Nccl *n = (Nccl *)c->w->nccl;
    Rank *rk = (Rank *)c->nccl;
    /* NULL once wait_done aborted it; after any abort a peer may be gone, and destroy would wait for it. */
    if (rk->comm) (kdt_comm_aborted(c->w) ? n->CommAbort : n->CommDestroy)(rk->comm);
    cudaFree(rk->d_one);
    free(rk);
    c->nccl = nullptr;
}

/* Waits for the stream, ending the wait (and the communicator) on an NCCL error, an abort by any
 * rank, or the timeout. */
static kdt_status wait_done(kdt_comm *c, cudaStream_t st, const char *what) {
    Nccl *n = (Nccl *)c->w->nccl;
    Rank *rk = (Rank *)c->nccl;
    const double t0 = now_ms();
    for (;;) {
        cudaError_t e = cudaStreamQuery(st);
        if (e == cudaSuccess) return KDT_OK;
        if (e != cudaErrorNotReady) return kdt_comm_fail_world(c->w, "%s on rank %d: %s", what, c->rank, cudaGetErrorString(e));
        ncclResult_t async = kSuccess;
        n->CommGetAsyncError(rk->comm, &async);
        kdt_status s = KDT_OK;
        if (async != kSuccess && async != kInProgress)
            s = kdt_comm_fail_world(c->w, "%s on rank %d: NCCL: %s", what, c->rank, n->GetErrorString(async));
        else if (c->timeout_ms && now_ms() - t0 > c->timeout_ms)
            s = kdt_comm_fail_world(c->w, "%s: rank %d waited %d ms for the other ranks", what, c->rank, c->timeout_ms);
        else
            s = kdt_comm_check(c->w);
        if (s != KDT_OK) {
            n->CommAbort(rk->comm); /* ends the kernels waiting for peers; the communicator is gone */
            rk->comm = nullptr;
            return s;
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, nullptr);
    }
}

extern "C" kdt_status kdt_nccl_run(kdt_comm *c, const kdt_comm_call *call) {
    Nccl *n = (Nccl *)c->w->nccl;
    Rank *rk = (Rank *)c->nccl;
    if (!rk->comm) return kdt_fail(KDT_ERR_COMM, "comm: rank %d's NCCL communicator was aborted", c->rank);
    cudaStream_t st = (cudaStream_t)call->stream;
    size_t k = 1;
    const int dt = nccl_type(call->dtype, &k);
    const size_t cnt = call->count * k;
    ncclResult_t r = kSuccess;
    switch (call->op) {
    case KDT_COMM_OP_BARRIER: r = n->AllReduce(rk->d_one, rk->d_one, 1, 2, kSum, rk->comm, st); break;
    case KDT_COMM_OP_ALL_REDUCE: r = n->AllReduce(call->send, call->recv, cnt, dt, kSum, rk->comm, st); break;
    case KDT_COMM_OP_ALL_GATHER: r = n->AllGather(call->send, call->recv, cnt, dt, rk->comm, st); break;
    case KDT_COMM_OP_REDUCE_SCATTER: r = n->ReduceScatter(call->send, call->recv, cnt, dt, kSum, rk->comm, st); break;
    case KDT_COMM_OP_BROADCAST: r = n->Broadcast(call->send, call->recv, cnt, dt, call->root, rk->comm, st); break;
    case KDT_COMM_OP_ALL_TO_ALL: {
        const size_t es = kdt_dtype_size(call->dtype);
        r = n->GroupStart();
        for (int32_t p = 0; p < c->w->size && r == kSuccess; p++) {
            if (call->send_counts[p])
                r = n->Send((const char *)call->send + call->send_offs[p] * es, call->send_counts[p] * es, 1, p, rk->comm, st);
            if (r == kSuccess && call->recv_counts[p])
                r = n->Recv((char *)call->recv + call->recv_offs[p] * es, call->recv_counts[p] * es, 1, p, rk->comm, st);
        }
        ncclResult_t end = n->GroupEnd();
        if (r == kSuccess) r = end;
        break;
    }
    }
    const char *what = kdt_comm_op_name(call->op);
    if (r != kSuccess && r != kInProgress)
        return kdt_comm_fail_world(c->w, "%s on rank %d: NCCL: %s", what, c->rank, n->GetErrorString(r));
    return wait_done(c, st, what);
}
