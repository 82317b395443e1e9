#include <stdlib.h>

#include "greedy_ref.h"
#include "harness.h"

kdt_status kt_greedy_ref(kdt_model *m, int32_t *seq, int32_t P, int32_t n, float *hidden) {
    const kdt_model_config *cf = kdt_model_get_config(m);
    kdt_cache *c = NULL;
    float *logits = malloc((size_t)cf->vocab_size * sizeof *logits);
    kdt_status s = logits ? kdt_cache_create(m, 1, P + n, 0, &c) : KDT_ERR_NOMEM;
    const int32_t req = 0;
    for (int32_t i = 0, fed = 0; s == KDT_OK && i < n; i++) {
        const int32_t rows = i == 0 ? P : 1;
        const kdt_batch b = {.B = 1, .req = &req, .n_rows = &rows, .tokens = seq + fed, .logits_rows = KDT_LOGITS_LAST};
        s = kdt_model_forward(m, c, &b, logits, hidden ? hidden + (size_t)fed * cf->hidden_size : NULL, NULL);
        fed += rows;
        seq[P + i] = kt_argmax(logits, cf->vocab_size);
    }
    kdt_cache_free(c);
    free(logits);
    return s;
}
