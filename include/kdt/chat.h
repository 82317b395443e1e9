/* Chat templates: a conversation as the prompt text a model's chat template makes of it.
 *
 * Models ship their template as Jinja in tokenizer_config.json. Rather than a Jinja engine, the
 * families this engine runs are recognised from their template's special tokens and rendered
 * here as their templates render plain text messages (no tools, no thinking blocks):
 * - DeepSeek-V3: BOS, every system message joined by a blank line, then `<｜User｜>` + content
 *   and `<｜Assistant｜>` + content + `<｜end▁of▁sentence｜>` turns, then `<｜Assistant｜>`.
 * - Kimi K2: `<|im_ROLE|>ROLE<|im_middle|>` + content + `<|im_end|>` per message (role system,
 *   user, assistant), after Kimi's default system message when the first is not a system one, then
 *   `<|im_assistant|>assistant<|im_middle|>`.
 * The text carries the special tokens as text: encode it without adding special tokens. */
#pragma once

#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kdt_chat_family {
    KDT_CHAT_UNKNOWN = 0,
    KDT_CHAT_DEEPSEEK_V3 = 1,
    KDT_CHAT_KIMI_K2 = 2,
} kdt_chat_family;

typedef struct kdt_chat_message {
    const char *role;           /* "system", "user" or "assistant" */
    const char *content;        /* UTF-8 */
} kdt_chat_message;

KDT_API kdt_chat_family kdt_chat_detect(const char *tmpl);   /* tmpl may be NULL */
/* The prompt text of msgs [n] (n >= 1) under the template tmpl, ending with the assistant's turn
 * opened: *text is malloc'd. KDT_ERR_UNSUPPORTED for a template of no known family,
 * KDT_ERR_INVALID_ARG naming messages[i] for a bad role or a NULL content. */
KDT_API kdt_status kdt_chat_render(const char *tmpl, const kdt_chat_message *msgs, int32_t n, char **text);

#ifdef __cplusplus
}
#endif
