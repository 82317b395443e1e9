/* TEMPORARY (i20-serve): a declaration-only copy of the tokenizer API agreed with i18-tok, so that
 * the server compiles before the tokenizer library is merged. The real header and implementation
 * (src/tokenizer) replace this file and src/server/tokenizer_stub.c. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kdt_tokenizer kdt_tokenizer;
typedef struct kdt_detok_stream kdt_detok_stream;

KDT_API kdt_status kdt_tokenizer_load(const char *dir, kdt_tokenizer **out);
KDT_API void       kdt_tokenizer_free(kdt_tokenizer *t);
/* ids malloc'd; add_special 1 prepends BOS per tokenizer_config */
KDT_API kdt_status kdt_tokenizer_encode(const kdt_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
                                        size_t *n_ids);
KDT_API kdt_status kdt_tokenizer_decode(const kdt_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len);
KDT_API int32_t    kdt_tokenizer_vocab_size(const kdt_tokenizer *t);
KDT_API int32_t    kdt_tokenizer_token_id(const kdt_tokenizer *t, const char *token);
KDT_API int32_t    kdt_tokenizer_bos_id(const kdt_tokenizer *t);
KDT_API int32_t    kdt_tokenizer_eos_id(const kdt_tokenizer *t);
KDT_API const char *kdt_tokenizer_chat_template(const kdt_tokenizer *t);
KDT_API kdt_status kdt_detok_stream_create(const kdt_tokenizer *t, kdt_detok_stream **out);
/* never emits partial UTF-8 */
KDT_API kdt_status kdt_detok_stream_push(kdt_detok_stream *s, int32_t id, const char **text, size_t *len);
KDT_API kdt_status kdt_detok_stream_flush(kdt_detok_stream *s, const char **text, size_t *len);
KDT_API void       kdt_detok_stream_free(kdt_detok_stream *s);

#ifdef __cplusplus
}
#endif
