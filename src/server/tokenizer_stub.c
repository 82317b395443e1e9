/* TEMPORARY (i20-serve): stands in for the tokenizer library (i18-tok) until it is merged; delete
 * this file then. Loading always fails, so the server runs without text (token id prompts only)
 * and never reaches the other functions. */
#include "common/internal.h"
#include "kdt/tokenizer.h"

kdt_status kdt_tokenizer_load(const char *dir, kdt_tokenizer **out) {
    *out = NULL;
    return kdt_fail(KDT_ERR_UNSUPPORTED, "tokenizer: %s: this build has no tokenizer library", dir);
}
void kdt_tokenizer_free(kdt_tokenizer *t) { (void)t; }
kdt_status kdt_tokenizer_encode(const kdt_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids, size_t *n) {
    (void)t; (void)text; (void)len; (void)add_special; *ids = NULL; *n = 0;
    return kdt_fail(KDT_ERR_UNSUPPORTED, "tokenizer: not in this build");
}
kdt_status kdt_tokenizer_decode(const kdt_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len) {
    (void)t; (void)ids; (void)n; *text = NULL; *len = 0;
    return kdt_fail(KDT_ERR_UNSUPPORTED, "tokenizer: not in this build");
}
int32_t kdt_tokenizer_vocab_size(const kdt_tokenizer *t) { (void)t; return 0; }
int32_t kdt_tokenizer_token_id(const kdt_tokenizer *t, const char *token) { (void)t; (void)token; return -1; }
int32_t kdt_tokenizer_bos_id(const kdt_tokenizer *t) { (void)t; return -1; }
int32_t kdt_tokenizer_eos_id(const kdt_tokenizer *t) { (void)t; return -1; }
const char *kdt_tokenizer_chat_template(const kdt_tokenizer *t) { (void)t; return NULL; }
kdt_status kdt_detok_stream_create(const kdt_tokenizer *t, kdt_detok_stream **out) {
    (void)t; *out = NULL;
    return kdt_fail(KDT_ERR_UNSUPPORTED, "tokenizer: not in this build");
}
kdt_status kdt_detok_stream_push(kdt_detok_stream *s, int32_t id, const char **text, size_t *len) {
    (void)s; (void)id; *text = ""; *len = 0;
    return kdt_fail(KDT_ERR_UNSUPPORTED, "tokenizer: not in this build");
}
kdt_status kdt_detok_stream_flush(kdt_detok_stream *s, const char **text, size_t *len) {
    (void)s; *text = ""; *len = 0;
    return kdt_fail(KDT_ERR_UNSUPPORTED, "tokenizer: not in this build");
}
void kdt_detok_stream_free(kdt_detok_stream *s) { (void)s; }
