/* The communicator's shared pieces: the world both backends use for rendezvous and aborts, one
 * collective as a call record, and the NCCL backend's entry points (cuda/comm_nccl.cu; stubs in
 * no_cuda.c). */
#pragma once

#include <pthread.h>

#include "kdt/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kdt_comm_op {
    KDT_COMM_OP_BARRIER, KDT_COMM_OP_ALL_REDUCE, KDT_COMM_OP_ALL_GATHER, KDT_COMM_OP_REDUCE_SCATTER,
    KDT_COMM_OP_BROADCAST, KDT_COMM_OP_ALL_TO_ALL,
} kdt_comm_op;

/* One rank's arguments to one collective (what the local backend posts for the others to read). */
typedef struct kdt_comm_call {
    kdt_comm_op op;
    const void *send;
    void *recv;
    size_t count;
    kdt_dtype dtype;
    int32_t root;
    const size_t *send_counts, *send_offs, *recv_counts, *recv_offs; /* all-to-all: [size] each */
    void *stream;
} kdt_comm_call;

struct kdt_comm_world {
    kdt_comm_backend backend;
    int32_t size, timeout_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t gen;                /* rendezvous completed */
    int32_t arrived;             /* ranks inside the current one */
    uint64_t *entered;           /* [size]: rendezvous each rank has entered */
    int aborted;                 /* set once; why holds the first message */
    char why[512];
    kdt_comm_call *posted;       /* [size] */
    void *nccl;                  /* NCCL: the library and the unique id (comm_nccl.cu) */
};

struct kdt_comm {
    kdt_comm_world *w;
    int32_t rank, timeout_ms;
    void *nccl;                  /* NCCL: this rank's communicator (comm_nccl.cu) */
};

/* Records the first abort (under no lock) and wakes every waiter; returns KDT_ERR_COMM with the message. */
kdt_status kdt_comm_fail_world(kdt_comm_world *w, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
const char *kdt_comm_op_name(kdt_comm_op op); /* "all_reduce", ... */
/* KDT_ERR_COMM with the world's abort message when it was aborted, else KDT_OK. */
kdt_status kdt_comm_check(kdt_comm_world *w);
/* 1 once the world was aborted; leaves kdt_last_error() alone. */
int        kdt_comm_aborted(kdt_comm_world *w);

kdt_status kdt_nccl_world_init(kdt_comm_world *w);
void       kdt_nccl_world_free(kdt_comm_world *w);
kdt_status kdt_nccl_init(kdt_comm *c);
void       kdt_nccl_free(kdt_comm *c);
kdt_status kdt_nccl_run(kdt_comm *c, const kdt_comm_call *call);

#ifdef __cplusplus
}
#endif
