/* Request bodies into jobs (every field checked, the error naming it), jobs into response JSON. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "server/server.h"

#define DEFAULT_MAX_TOKENS 16   /* OpenAI's default for /v1/completions */

char *srv_error_json(const char *message, const char *type, const char *param, const char *code) {
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* Sets *err to an invalid_request_error about param and returns status. */
static int bad(char **err, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int bad(char **err, int status, const char *param, const char *code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    *err = srv_error_json(msg, "invalid_request_error", param, code);
    return status;
}

static void job_free(srv_job *j) {
    if (!j) return;
    free(j->prompt);
    free(j->req.out);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void srv_job_unref(server *S, srv_job *j) {
    (void)S;
    if (j && --j->refs == 0) job_free(j);
}

/* An integer-valued JSON number in [lo, hi]. */
static int get_int(const cJSON *v, double lo, double hi, long long *out) {
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return -1;
    *out = (long long)v->valuedouble;
    return 0;
}

/* prompt: text, ids, or a list of one of those (n = 1). */
static int parse_prompt(server *S, const cJSON *p, srv_job *j, char **err) {
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && (cJSON_IsString(p->child) || cJSON_IsArray(p->child))) p = p->child;
    else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 1 && !cJSON_IsNumber(p->child))
        return bad(err, 400, "prompt", NULL, "prompt: one prompt per request is supported, not %d", cJSON_GetArraySize(p));
    if (cJSON_IsString(p)) {
        if (!S->tok) return bad(err, 400, "prompt", NULL, "prompt: model '%s' has no tokenizer; send token ids", S->model_name);
        size_t n = 0;
        if (kdt_tokenizer_encode(S->tok, p->valuestring, strlen(p->valuestring), 1, &j->prompt, &n) != KDT_OK)
            return bad(err, 400, "prompt", NULL, "prompt: %s", kdt_last_error());
        j->prompt_len = (int32_t)(n > (size_t)S->ctx ? (size_t)S->ctx + 1 : n);
        return 0;
    }
    if (!cJSON_IsArray(p)) return bad(err, 400, "prompt", NULL, "prompt: expected a string or a list of token ids");
    const int n = cJSON_GetArraySize(p);
    if (n > S->ctx) return bad(err, 400, "prompt", NULL, "prompt: %d tokens, more than the context of %d", n, S->ctx);
    j->prompt = malloc(((size_t)n + 1) * sizeof *j->prompt);
    if (!j->prompt) return bad(err, 500, NULL, NULL, "out of memory");
    int i = 0;
    for (const cJSON *v = p->child; v; v = v->next, i++) {
        long long id;
        if (get_int(v, 0, (double)S->vocab - 1, &id))
            return bad(err, 400, "prompt", NULL, "prompt: item %d is not a token id in 0 .. %d", i, S->vocab - 1);
        j->prompt[i] = (int32_t)id;
    }
    j->prompt_len = n;
    return 0;
}

static int parse_stop(server *S, const cJSON *v, srv_job *j, char **err) {
    if (!v || cJSON_IsNull(v)) return 0;
    const cJSON *item = cJSON_IsString(v) ? v : cJSON_IsArray(v) ? v->child : NULL;
    if (!item && !cJSON_IsArray(v)) return bad(err, 400, "stop", NULL, "stop: expected a string or a list of strings");
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > SRV_MAX_STOP)
        return bad(err, 400, "stop", NULL, "stop: at most %d sequences", SRV_MAX_STOP);
    for (; item; item = cJSON_IsString(v) ? NULL : item->next) {
        if (!cJSON_IsString(item) || !item->valuestring[0])
            return bad(err, 400, "stop", NULL, "stop: every sequence must be a non-empty string");
        if (!S->tok) return bad(err, 400, "stop", NULL, "stop: model '%s' has no tokenizer, so no text to stop on", S->model_name);
        if (!(j->stop[j->n_stop++] = strdup(item->valuestring))) return bad(err, 500, NULL, NULL, "out of memory");
    }
    return 0;
}

/* The sampling fields and the switches this server does not have (n, echo, logprobs, best_of). */
static int parse_options(const cJSON *b, srv_job *j, char **err) {
    const cJSON *v;
    long long x;
    j->req.top_p = 1.0f;
    if ((v = cJSON_GetObjectItemCaseSensitive(b, "temperature")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 2))
            return bad(err, 400, "temperature", NULL, "temperature: expected a number in 0 .. 2");
        j->req.temperature = (float)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(b, "top_p")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble <= 1))
            return bad(err, 400, "top_p", NULL, "top_p: expected a number in (0, 1]");
        j->req.top_p = (float)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(b, "top_k")) && !cJSON_IsNull(v)) {
        if (get_int(v, 0, 1 << 30, &x)) return bad(err, 400, "top_k", NULL, "top_k: expected an integer >= 0");
        j->req.top_k = (int32_t)x;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(b, "seed")) && !cJSON_IsNull(v)) {
        /* u64: beyond long long, so not through get_int */
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 18446744073709551616.0) ||
            v->valuedouble != floor(v->valuedouble))
            return bad(err, 400, "seed", NULL, "seed: expected an integer in 0 .. 2^64 - 1");
        j->req.seed = (uint64_t)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(b, "stream")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) return bad(err, 400, "stream", NULL, "stream: expected true or false");
        j->stream = cJSON_IsTrue(v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(b, "n")) && !cJSON_IsNull(v) && (get_int(v, 1, 1, &x)))
        return bad(err, 400, "n", NULL, "n: only 1 completion per request is supported");
    if ((v = cJSON_GetObjectItemCaseSensitive(b, "best_of")) && !cJSON_IsNull(v) && (get_int(v, 1, 1, &x)))
        return bad(err, 400, "best_of", NULL, "best_of: only 1 is supported");
    if ((v = cJSON_GetObjectItemCaseSensitive(b, "echo")) && !cJSON_IsNull(v) && !cJSON_IsFalse(v))
        return bad(err, 400, "echo", NULL, "echo: not supported");
    if ((v = cJSON_GetObjectItemCaseSensitive(b, "logprobs")) && !cJSON_IsNull(v) && !cJSON_IsFalse(v))
        return bad(err, 400, "logprobs", NULL, "logprobs: not supported");
    return 0;
}

static int parse_body(server *S, int chat, const cJSON *b, srv_job *j, char **err) {
    if (!cJSON_IsObject(b)) return bad(err, 400, NULL, NULL, "the body must be a JSON object");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, "model");
    if (v && !cJSON_IsNull(v) && !cJSON_IsString(v)) return bad(err, 400, "model", NULL, "model: expected a string");
    if (cJSON_IsString(v) && strcmp(v->valuestring, S->model_name) != 0)
        return bad(err, 404, "model", "model_not_found", "model: '%.200s' does not exist; this server has '%s'", v->valuestring,
                   S->model_name);
    int st = parse_options(b, j, err);
    if (st) return st;
    if (chat) {
        if (!S->tok) return bad(err, 400, "messages", NULL, "messages: model '%s' has no tokenizer, so no chat", S->model_name);
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(b, "messages");
        char *text = NULL;
        if ((st = srv_chat_render(kdt_tokenizer_chat_template(S->tok), m, &text, err))) return st;
        size_t n = 0;
        const kdt_status s = kdt_tokenizer_encode(S->tok, text, strlen(text), 0, &j->prompt, &n);
        free(text);
        if (s != KDT_OK) return bad(err, 400, "messages", NULL, "messages: %s", kdt_last_error());
        j->prompt_len = (int32_t)(n > (size_t)S->ctx ? (size_t)S->ctx + 1 : n);
    } else {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(b, "prompt");
        if (!p) return bad(err, 400, "prompt", NULL, "prompt: missing");
        if ((st = parse_prompt(S, p, j, err))) return st;
    }
    const char *what = chat ? "messages" : "prompt";
    if (j->prompt_len < 1) return bad(err, 400, what, NULL, "%s: empty", what);
    if (j->prompt_len >= S->ctx)
        return bad(err, 400, what, "context_length_exceeded", "%s: %d tokens leave no room in the context of %d", what,
                   j->prompt_len, S->ctx);
    v = cJSON_GetObjectItemCaseSensitive(b, "max_tokens");
    if (chat && (!v || cJSON_IsNull(v))) v = cJSON_GetObjectItemCaseSensitive(b, "max_completion_tokens");
    long long max_new = chat ? S->ctx - j->prompt_len : DEFAULT_MAX_TOKENS;
    if (v && !cJSON_IsNull(v) && get_int(v, 1, 1e9, &max_new))
        return bad(err, 400, "max_tokens", NULL, "max_tokens: expected an integer >= 1");
    if (j->prompt_len + max_new > S->ctx)
        return bad(err, 400, "max_tokens", "context_length_exceeded", "max_tokens: %lld plus the %s's %d tokens exceed the context of %d",
                   max_new, what, j->prompt_len, S->ctx);
    j->max_new = (int32_t)max_new;
    if ((st = parse_stop(S, cJSON_GetObjectItemCaseSensitive(b, "stop"), j, err))) return st;
    j->req = (kdt_spec_request){.prompt = j->prompt, .prompt_len = j->prompt_len, .max_new = j->max_new,
                                .temperature = j->req.temperature, .top_k = j->req.top_k, .top_p = j->req.top_p,
                                .seed = j->req.seed, .out = malloc(((size_t)j->max_new + 1) * sizeof(int32_t))};
    if (!j->req.out) return bad(err, 500, NULL, NULL, "out of memory");
    /* The library's own check (sampling included) is the last word. */
    const kdt_status s = kdt_spec_session_check(S->sess, &j->req);
    if (s != KDT_OK) {
        const char *msg = kdt_last_error();
        const char *param = strncmp(msg, "temperature", 11) == 0 ? "temperature" : strncmp(msg, "max_new", 7) == 0 ? "max_tokens" : what;
        return bad(err, 400, param, NULL, "%s", msg);
    }
    return 0;
}

int srv_job_from_body(server *S, int chat, const char *body, size_t len, srv_job **out, char **err) {
    *out = NULL;
    cJSON *b = cJSON_ParseWithLength(body, len);
    if (!b) return bad(err, 400, NULL, NULL, "the body is not valid JSON");
    srv_job *j = calloc(1, sizeof *j);
    if (!j) {
        cJSON_Delete(b);
        return bad(err, 500, NULL, NULL, "out of memory");
    }
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->chat = chat;
    j->created = (long long)time(NULL);
    static unsigned long long counter;
    snprintf(j->id, sizeof j->id, "%s-%llx%04llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)j->created,
             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) & 0xFFFF);
    const int st = parse_body(S, chat, b, j, err);
    cJSON_Delete(b);
    if (st) {
        job_free(j);
        return st;
    }
    *out = j;
    return 0;
}

static cJSON *ids_array(const srv_job *j, int32_t from, int32_t to) {
    return cJSON_CreateIntArray(j->req.out + from, to - from);
}

static cJSON *envelope(const server *S, const srv_job *j, const char *object) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", j->id);
    cJSON_AddStringToObject(r, "object", object);
    cJSON_AddNumberToObject(r, "created", (double)j->created);
    cJSON_AddStringToObject(r, "model", S->model_name);
    return r;
}

static void add_usage(cJSON *r, const srv_job *j, int32_t n) {
    cJSON *u = cJSON_AddObjectToObject(r, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", j->prompt_len);
    cJSON_AddNumberToObject(u, "completion_tokens", n);
    cJSON_AddNumberToObject(u, "total_tokens", j->prompt_len + n);
}

static char *print_free(cJSON *r) {
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}

char *srv_response_json(const server *S, const srv_job *j, int32_t n, const char *text, const char *finish) {
    cJSON *r = envelope(S, j, j->chat ? "chat.completion" : "text_completion");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    if (j->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text ? text : "");
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
        cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddItemToObject(c, "token_ids", ids_array(j, 0, n));
    cJSON_AddStringToObject(c, "finish_reason", finish);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "choices"), c);
    add_usage(r, j, n);
    return print_free(r);
}

char *srv_chunk_json(const server *S, const srv_job *j, int32_t from, int32_t to, const char *text, const char *finish, int first) {
    cJSON *r = envelope(S, j, j->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    if (j->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (first) cJSON_AddStringToObject(d, "role", "assistant");
        if (text && *text) cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
        cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddItemToObject(c, "token_ids", ids_array(j, from, to));
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "choices"), c);
    if (finish) add_usage(r, j, to);
    return print_free(r);
}
