/* Chat templates of the known families (include/kdt/chat.h). */
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "kdt/chat.h"

typedef struct buf {
    char *p;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const char *s) {
    const size_t n = strlen(s);
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n + 1);
    b->n += n;
}

kdt_chat_family kdt_chat_detect(const char *tmpl) {
    if (!tmpl) return KDT_CHAT_UNKNOWN;
    if (strstr(tmpl, "<|im_assistant|>") && strstr(tmpl, "<|im_middle|>")) return KDT_CHAT_KIMI_K2;
    if (strstr(tmpl, "<｜Assistant｜>") && strstr(tmpl, "<｜User｜>")) return KDT_CHAT_DEEPSEEK_V3;
    return KDT_CHAT_UNKNOWN;
}

kdt_status kdt_chat_render(const char *tmpl, const kdt_chat_message *msgs, int32_t n, char **text) {
    if (!text) return kdt_fail(KDT_ERR_INVALID_ARG, "chat: text is NULL");
    *text = NULL;
    if (!msgs || n < 1) return kdt_fail(KDT_ERR_INVALID_ARG, "messages: %d of them; a chat needs at least one", n);
    const kdt_chat_family f = kdt_chat_detect(tmpl);
    if (f == KDT_CHAT_UNKNOWN)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "messages: the model's chat template is none this build knows (DeepSeek-V3, Kimi K2)");
    for (int32_t i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) || !msgs[i].content)
            return kdt_fail(KDT_ERR_INVALID_ARG, "messages[%d]: role '%s' (need system, user or assistant) or no content", i,
                            r ? r : "(none)");
    }
    buf b = {0};
    if (f == KDT_CHAT_DEEPSEEK_V3) {
        put(&b, "<｜begin▁of▁sentence｜>");
        for (int32_t i = 0, sys = 0; i < n; i++)
            if (strcmp(msgs[i].role, "system") == 0) {
                if (sys++) put(&b, "\n\n");
                put(&b, msgs[i].content);
            }
        for (int32_t i = 0; i < n; i++) {
            if (strcmp(msgs[i].role, "system") == 0) continue;
            const int user = strcmp(msgs[i].role, "user") == 0;
            put(&b, user ? "<｜User｜>" : "<｜Assistant｜>");
            put(&b, msgs[i].content);
            if (!user) put(&b, "<｜end▁of▁sentence｜>");
        }
        put(&b, "<｜Assistant｜>");
    } else {
        if (strcmp(msgs[0].role, "system") != 0) put(&b, "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>");
        for (int32_t i = 0; i < n; i++) {
            put(&b, "<|im_");
            put(&b, msgs[i].role[0] == 'a' ? "assistant" : msgs[i].role[0] == 'u' ? "user" : "system");
            put(&b, "|>");
            put(&b, msgs[i].role);
            put(&b, "<|im_middle|>");
            put(&b, msgs[i].content);
            put(&b, "<|im_end|>");
        }
        put(&b, "<|im_assistant|>assistant<|im_middle|>");
    }
    if (b.oom) {
        free(b.p);
        return kdt_fail(KDT_ERR_NOMEM, "chat: out of memory");
    }
    *text = b.p;
    return KDT_OK;
}
