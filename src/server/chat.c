/* /v1/chat/completions' messages into prompt text through the model's chat template
 * (kdt_chat_render: the known families rendered built in; any other template is a 400). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kdt/chat.h"
#include "server/server.h"

static int bad(char **err, const char *msg) {
    *err = srv_error_json(msg, "invalid_request_error", "messages", NULL);
    return 400;
}

/* content: a string, or a list of {"type": "text", "text": ...} parts, joined (malloc'd). */
static char *content_text(const cJSON *c) {
    if (cJSON_IsString(c)) return strdup(c->valuestring);
    if (!cJSON_IsArray(c)) return NULL;
    size_t n = 1;
    for (const cJSON *p = c->child; p; p = p->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type"), *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text)) return NULL;
        n += strlen(text->valuestring);
    }
    char *s = malloc(n);
    if (!s) return NULL;
    s[0] = 0;
    for (const cJSON *p = c->child; p; p = p->next) strcat(s, cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring);
    return s;
}

int srv_chat_render(const char *tmpl, const void *messages, char **text, char **err) {
    const cJSON *msgs = messages;
    *text = NULL;
    if (!msgs) return bad(err, "messages: missing");
    const int n = cJSON_IsArray(msgs) ? cJSON_GetArraySize(msgs) : 0;
    if (n == 0) return bad(err, "messages: expected a non-empty list");
    kdt_chat_message *m = calloc((size_t)n, sizeof *m);
    char **owned = calloc((size_t)n, sizeof *owned);
    int st = m && owned ? 0 : 500, i = 0;
    char msg[160];
    for (const cJSON *e = msgs->child; e && !st; e = e->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
        if (!cJSON_IsObject(e) || !cJSON_IsString(role)) {
            snprintf(msg, sizeof msg, "messages[%d]: expected an object with a role", i);
            st = bad(err, msg);
        } else if (!(owned[i] = content_text(cJSON_GetObjectItemCaseSensitive(e, "content")))) {
            snprintf(msg, sizeof msg, "messages[%d].content: expected a string or a list of text parts", i);
            st = bad(err, msg);
        }
        if (!st) m[i] = (kdt_chat_message){.role = role->valuestring, .content = owned[i]};
    }
    if (!st) {
        const kdt_status s = kdt_chat_render(tmpl, m, n, text);
        if (s == KDT_ERR_NOMEM) st = 500;
        else if (s != KDT_OK) st = bad(err, kdt_last_error());
    }
    if (st == 500 && !*err) *err = srv_error_json("out of memory", "server_error", NULL, NULL);
    for (int k = 0; owned && k < n; k++) free(owned[k]);
    free(owned);
    free(m);
    return st;
}
