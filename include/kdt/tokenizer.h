/* Tokenizers: text <-> token ids for the models the engine runs.
 *
 * Two formats, found by what the folder holds (docs/tokenizer.md):
 * - tokenizer.json (Hugging Face byte-level BPE: DeepSeek-V3, GLM, GPT-2 style), with an optional
 *   tokenizer_config.json (add_bos_token, bos/eos tokens, chat_template);
 * - tiktoken.model (base64 token and rank per line) with tokenizer_config.json (Kimi K2: its
 *   added_tokens_decoder gives the special tokens; the split pattern is Kimi's unless the config
 *   has a "pat_str").
 * The ids equal those of the `tokenizers` and `tiktoken` Python libraries.
 *
 * Text is UTF-8. encode refuses invalid UTF-8 with KDT_ERR_INVALID_ARG and a message naming the
 * byte offset of the first bad byte (nothing is encoded). decode never fails on a valid id: bytes
 * that do not form valid UTF-8 come out as U+FFFD, one per maximal invalid subpart, as Python's
 * bytes.decode("utf-8", "replace") and Rust's from_utf8_lossy do.
 *
 * Thread safety: a loaded tokenizer is read-only; encode, decode and the getters may be called from
 * several threads at once (each call has its own regex match data). A detok stream belongs to one
 * thread at a time. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kdt_tokenizer kdt_tokenizer;

/* dir holds tokenizer.json (+ optional tokenizer_config.json) or tiktoken.model +
 * tokenizer_config.json. Errors name the file and the field (or line) at fault. */
KDT_API kdt_status kdt_tokenizer_load(const char *dir, kdt_tokenizer **out);
KDT_API void       kdt_tokenizer_free(kdt_tokenizer *t);

/* ids: malloc'd, the caller frees with free(). Special and added tokens in text are matched as
 * tokens. add_special: 1 prepends BOS when tokenizer_config.json says add_bos_token (or the
 * post_processor's template starts with a special token); 0 never adds anything. */
KDT_API kdt_status kdt_tokenizer_encode(const kdt_tokenizer *t, const char *text, size_t len, int add_special,
                                        int32_t **ids, size_t *n_ids);
/* text: malloc'd, NUL-terminated, the caller frees with free(); special tokens come out as their
 * text. An id outside 0 .. vocab_size - 1, or one with no token, is KDT_ERR_INVALID_ARG. */
KDT_API kdt_status kdt_tokenizer_decode(const kdt_tokenizer *t, const int32_t *ids, size_t n, char **text,
                                        size_t *len);
KDT_API int32_t     kdt_tokenizer_vocab_size(const kdt_tokenizer *t);  /* highest id + 1, specials included */
/* The id of an exact token string, -1 if none: added / special tokens by their text; model tokens as
 * tokenizer.json spells them (byte-level characters, "\u0120the" for " the"), tiktoken's by their bytes. */
KDT_API int32_t     kdt_tokenizer_token_id(const kdt_tokenizer *t, const char *token);
KDT_API int32_t     kdt_tokenizer_bos_id(const kdt_tokenizer *t);      /* -1 if none */
KDT_API int32_t     kdt_tokenizer_eos_id(const kdt_tokenizer *t);      /* -1 if none */
KDT_API const char *kdt_tokenizer_chat_template(const kdt_tokenizer *t); /* tokenizer_config.json's, or NULL */

/* Incremental decoding for streaming: never emits a partial UTF-8 character. */
typedef struct kdt_detok_stream kdt_detok_stream;
KDT_API kdt_status kdt_detok_stream_create(const kdt_tokenizer *t, kdt_detok_stream **out);
/* Appends one id; text and len: the newly complete text (may be empty), valid until the next call
 * on s. Bytes that can no longer become valid UTF-8 come out as U+FFFD at once. */
KDT_API kdt_status kdt_detok_stream_push(kdt_detok_stream *s, int32_t id, const char **text, size_t *len);
/* End of stream: what is held back (an incomplete character becomes U+FFFD, as the Python
 * libraries do); the stream can then be reused from empty. */
KDT_API kdt_status kdt_detok_stream_flush(kdt_detok_stream *s, const char **text, size_t *len);
KDT_API void       kdt_detok_stream_free(kdt_detok_stream *s);

#ifdef __cplusplus
}
#endif
