/* CUDA graphs of the model's forward (model_graph.cu), keyed by everything the captured work
 * depends on besides the contents of its input buffers: shapes, the attention calls, the cache's
 * and the outputs' addresses. Internal to src/cuda/. */
#pragma once

#include <cuda_runtime.h>

#include "kdt/kdt.h"

struct kdt_graphs; /* a model's captured forwards */

/* Queues one forward's device work on stream s; returns KDT_OK once it is queued. */
typedef kdt_status (*kdt_graph_body)(void *arg, cudaStream_t s);

/* Runs body's work in the order of stream s: directly the first time key [n_key] is seen, on
 * stream cap between s's work (lazy loading and one-time setup for cap happen outside any
 * capture), captured on cap and launched on s the second time, replayed on s after that. A shape
 * whose capture fails runs directly on s from then on. *g is made on first use. */
kdt_status kdt_graphs_run(kdt_graphs **g, const int64_t *key, int32_t n_key, cudaStream_t cap, cudaStream_t s,
                          kdt_graph_body body, void *arg);
/* Forgets every graph (after the scratch they captured moved); _free also frees g. */
void kdt_graphs_clear(kdt_graphs *g);
void kdt_graphs_free(kdt_graphs *g);
/* Replays so far and captures made (tests, benches). */
void kdt_graphs_counts(const kdt_graphs *g, int64_t *replays, int64_t *captures);
