/* tests/sample_device.h: tree_sample_accept on the device for host params. */
#include <stdlib.h>
#include <string.h>

#include "common/device.h"
#include "sample_device.h"

kdt_status kt_sample_accept_on_device(const kdt_tree_sample_accept_params *h) {
    const size_t bq = (size_t)h->B * h->Q * 4, bqv = bq * h->V, b4 = (size_t)h->B * 4;
    const void *src[9] = {h->node_token, h->node_parent, h->num_nodes, h->target_logits, h->draft_probs,
                          h->temperature, h->top_k, h->top_p, h->seed};
    const size_t n[9] = {bq, bq, b4, bqv, bqv, b4, b4, b4, b4 * 2}, on[4] = {b4, bq, bq, b4};
    int32_t *host_out[4] = {h->accept_len, h->accept_index, h->accept_tokens, h->status};
    void *d[13] = {0};
    kdt_status s = KDT_OK;
    for (int i = 0; i < 9 && s == KDT_OK; i++)
        if (src[i] && (s = kdt_dev_alloc(&d[i], n[i])) == KDT_OK) s = kdt_dev_h2d(d[i], src[i], n[i]);
    for (int i = 0; i < 4 && s == KDT_OK; i++) {
        memset(host_out[i], 0x5A, on[i]); /* poison: 0x5A5A5A5A is no token, length or status */
        if ((s = kdt_dev_alloc(&d[9 + i], on[i])) == KDT_OK) s = kdt_dev_h2d(d[9 + i], host_out[i], on[i]);
    }
    kdt_tree_sample_accept_params p = {h->B, h->Q, h->V, d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8],
                                       d[9], d[10], d[11], d[12]};
    if (s == KDT_OK) s = kdt_tree_sample_accept(&p, KDT_BACKEND_CUDA, NULL);
    if (s == KDT_OK) s = kdt_dev_sync();
    for (int i = 0; i < 4 && s == KDT_OK; i++) s = kdt_dev_d2h(host_out[i], d[9 + i], on[i]);
    for (int i = 0; i < 13; i++) kdt_dev_free(d[i]);
    return s;
}
