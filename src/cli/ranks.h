/* --gpus N of kdt generate and kdt serve (docs/multi_gpu.md): the model over N ranks of one
 * process, one thread per rank, no launcher. */
#pragma once

#include "kdt/model.h"

typedef struct kdt_cli_ranks kdt_cli_ranks;

/* The model of dir (NULL: the built-in one of seed) in the backend's default dtype, over n ranks:
 * rank 0's in *m (the caller's thread drives it), ranks 1 .. n-1 in threads that serve their
 * experts until *m is freed. The CPU backend runs the ranks on the local communicator; CUDA
 * needs n devices (NCCL). n = 1: kdt_model_load / kdt_model_builtin, *ranks NULL. After
 * kdt_model_free(*m), kdt_cli_ranks_end(*ranks) joins the threads. */
kdt_status kdt_cli_load_model(const char *dir, uint64_t seed, kdt_backend backend, int n, kdt_model **m, kdt_cli_ranks **ranks);
void       kdt_cli_ranks_end(kdt_cli_ranks *r);
/* --gpus's value: 0, or 2 after a usage error. */
int        kdt_cli_gpus(const char *cmd, const char *usage, const char *value, int *n);
