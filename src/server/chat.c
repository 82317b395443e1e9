/* Chat templates. Models ship theirs as Jinja in tokenizer_config.json; rather than a Jinja
 * engine, the families this engine runs are recognised by their special tokens and rendered by
 * hand, as their templates do for plain text messages (no tools). Anything else is a clear 400. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/server.h"

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

typedef enum family { FAMILY_UNKNOWN, FAMILY_DEEPSEEK_V3, FAMILY_KIMI_K2 } family;

static family detect(const char *tmpl) {
    if (!tmpl) return FAMILY_UNKNOWN;
    if (strstr(tmpl, "<|im_assistant|>") && strstr(tmpl, "<|im_middle|>")) return FAMILY_KIMI_K2;
    if (strstr(tmpl, "<｜Assistant｜>") && strstr(tmpl, "<｜User｜>")) return FAMILY_DEEPSEEK_V3;
    return FAMILY_UNKNOWN;
}

static int bad(char **err, const char *param, const char *msg) {
    *err = srv_error_json(msg, "invalid_request_error", param, NULL);
    return 400;
}

/* content: a string, or a list of {"type": "text", "text": ...} parts, joined. */
static int content_text(const cJSON *c, buf *out) {
    if (cJSON_IsString(c)) {
        put(out, c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c)) return -1;
    for (const cJSON *part = c->child; part; part = part->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type"), *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text)) return -1;
        put(out, text->valuestring);
    }
    return 0;
}

int srv_chat_render(const char *tmpl, const void *messages, char **text, char **err) {
    const cJSON *msgs = messages;
    *text = NULL;
    if (!msgs) return bad(err, "messages", "messages: missing");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) return bad(err, "messages", "messages: expected a non-empty list");
    const family f = detect(tmpl);
    if (f == FAMILY_UNKNOWN)
        return bad(err, "messages", "messages: the model's chat template is none this server knows (DeepSeek-V3, Kimi K2); "
                                    "use /v1/completions with a rendered prompt");
    int i = 0, has_system = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role) ||
            (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant"))) {
            char msg[128];
            snprintf(msg, sizeof msg, "messages[%d]: expected an object with role system, user or assistant", i);
            return bad(err, "messages", msg);
        }
        has_system |= strcmp(role->valuestring, "system") == 0;
    }
    buf out = {0}, content = {0};
    /* DeepSeek-V3: BOS, the system prompts joined by blank lines, then the turns. Kimi K2: a
     * default system turn when none is given. */
    if (f == FAMILY_DEEPSEEK_V3) {
        put(&out, "<｜begin▁of▁sentence｜>");
        int n_sys = 0;
        for (const cJSON *m = msgs->child; m; m = m->next) {
            if (strcmp(cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring, "system")) continue;
            if (n_sys++) put(&out, "\n\n");
            if (content_text(cJSON_GetObjectItemCaseSensitive(m, "content"), &out)) goto bad_content;
        }
    } else if (!has_system) {
        put(&out, "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>");
    }
    i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        const char *role = cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring;
        content.n = 0;
        if (content.p) content.p[0] = 0;
        if (content_text(cJSON_GetObjectItemCaseSensitive(m, "content"), &content)) goto bad_content;
        const char *c = content.p ? content.p : "";
        if (f == FAMILY_DEEPSEEK_V3) {
            if (strcmp(role, "system") == 0) continue;
            put(&out, strcmp(role, "user") == 0 ? "<｜User｜>" : "<｜Assistant｜>");
            put(&out, c);
            if (strcmp(role, "assistant") == 0) put(&out, "<｜end▁of▁sentence｜>");
        } else {
            put(&out, strcmp(role, "system") == 0 ? "<|im_system|>" : strcmp(role, "user") == 0 ? "<|im_user|>" : "<|im_assistant|>");
            put(&out, role);
            put(&out, "<|im_middle|>");
            put(&out, c);
            put(&out, "<|im_end|>");
        }
    }
    put(&out, f == FAMILY_DEEPSEEK_V3 ? "<｜Assistant｜>" : "<|im_assistant|>assistant<|im_middle|>");
    free(content.p);
    if (out.oom) {
        free(out.p);
        *err = srv_error_json("out of memory", "server_error", NULL, NULL);
        return 500;
    }
    *text = out.p;
    return 0;
bad_content:
    free(content.p);
    free(out.p);
    char msg[128];
    snprintf(msg, sizeof msg, "messages[%d].content: expected a string or a list of text parts", i);
    return bad(err, "messages", msg);
}
