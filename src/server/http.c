/* HTTP on libmicrohttpd, one thread per connection (a connection may block on its job): routes,
 * Bearer auth, the body limit, and the completion routes' waits. A completion queues its job,
 * waits until it is admitted (so that a refusal still gets its status), then answers at the end
 * (JSON) or as the tokens come (server-sent events through a content-reader callback). While it
 * waits it watches its socket: a client that hangs up cancels its job, which frees its slot. */
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "server/server.h"

typedef struct conn {
    int route, post;
    char *body;
    size_t len, cap;
    int too_big;
} conn;

/* ---- responses ---- */

static enum MHD_Result respond(server *S, struct MHD_Connection *c, int route, int status, char *body, const char *type) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    const enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    srv_metrics_request(S, route, status);
    return ok;
}

static enum MHD_Result respond_json(server *S, struct MHD_Connection *c, int route, int status, char *json) {
    return json ? respond(S, c, route, status, json, "application/json") : MHD_NO;
}

static enum MHD_Result respond_error(server *S, struct MHD_Connection *c, int route, int status, const char *msg,
                                     const char *type, const char *code) {
    return respond_json(S, c, route, status, srv_error_json(msg, type, NULL, code));
}

/* ---- following a job: its tokens, their text, stop strings ---- */

typedef struct track {
    server *S;
    srv_job *j;
    int32_t n_seen, n_sent;     /* tokens turned into text; token ids streamed */
    kdt_detok_stream *ds;
    char *text;
    size_t len, cap, sent;      /* text so far; bytes of it streamed */
    size_t max_stop;
    int stopped, done, first, finished;
    char *pend;                 /* SSE bytes not yet written */
    size_t pend_len, pend_off;
} track;

static void text_add(track *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        while (cap < t->len + n + 1) cap *= 2;
        char *p = realloc(t->text, cap);
        if (!p) return; /* the text loses this piece; the ids stay whole */
        t->text = p;
        t->cap = cap;
    }
    memcpy(t->text + t->len, s, n);
    t->len += n;
    t->text[t->len] = 0;
}

/* The first stop string in the text (searching only where new text could complete one). */
static void check_stop(track *t, size_t from) {
    const srv_job *j = t->j;
    from = from > t->max_stop ? from - t->max_stop : 0;
    size_t best = (size_t)-1;
    for (int i = 0; i < j->n_stop; i++) {
        const char *hit = t->len ? strstr(t->text + from, j->stop[i]) : NULL;
        if (hit && (size_t)(hit - t->text) < best) best = (size_t)(hit - t->text);
    }
    if (best == (size_t)-1) return;
    t->len = best;
    t->text[best] = 0;
    t->stopped = 1;
}

static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return 1;
    char ch;
    return (p.revents & POLLIN) && recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static void cancel(track *t) {
    pthread_mutex_lock(&t->S->mu);
    t->j->cancelled = 1;
    pthread_cond_signal(&t->S->sched_cv);
    pthread_mutex_unlock(&t->S->mu);
}

/* Waits (a bounded while) for news of the job, then takes its new tokens into the text. Returns
 * -1 when the client has gone. */
static int pull(track *t) {
    server *S = t->S;
    srv_job *j = t->j;
    if (peer_gone(j->fd)) return -1;
    pthread_mutex_lock(&S->mu);
    if (j->state != JOB_DONE && j->n_ready == t->n_seen) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 50000000;
        if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&j->cv, &S->mu, &until);
    }
    const int32_t n = j->n_ready;
    const int done = j->state == JOB_DONE, eos = j->eos;
    pthread_mutex_unlock(&S->mu);
    /* Token by token, so that a stop string ends the tokens too at the one that completed it. */
    while (t->n_seen < n && !t->stopped) {
        const int32_t id = j->req.out[t->n_seen++];
        if (eos && t->n_seen == n) continue; /* the eos token has no text */
        const size_t at = t->len;
        const char *piece;
        size_t plen;
        if (t->ds && kdt_detok_stream_push(t->ds, id, &piece, &plen) == KDT_OK) text_add(t, piece, plen);
        if (j->n_stop && t->len > at) check_stop(t, at);
    }
    if (done && t->ds && !t->stopped) {
        const size_t at = t->len;
        const char *piece;
        size_t plen;
        if (kdt_detok_stream_flush(t->ds, &piece, &plen) == KDT_OK) text_add(t, piece, plen);
        if (j->n_stop && t->len > at) check_stop(t, at);
    }
    if (t->stopped) cancel(t);
    t->done = done || t->stopped;
    return 0;
}

static const char *finish_reason(const track *t) { return t->stopped || t->j->eos ? "stop" : "length"; }

static int track_init(track *t, server *S, srv_job *j) {
    *t = (track){.S = S, .j = j, .first = 1};
    for (int i = 0; i < j->n_stop; i++)
        if (strlen(j->stop[i]) > t->max_stop) t->max_stop = strlen(j->stop[i]);
    return S->tok ? (kdt_detok_stream_create(S->tok, &t->ds) == KDT_OK ? 0 : -1) : 0;
}

static void track_free(track *t) {
    kdt_detok_stream_free(t->ds);
    free(t->text);
    free(t->pend);
    pthread_mutex_lock(&t->S->mu);
    srv_job_unref(t->S, t->j);
    pthread_mutex_unlock(&t->S->mu);
}

/* ---- streaming: one SSE event per batch of new tokens ---- */

static void sse(track *t, char *json) {
    if (!json) return;
    const size_t n = strlen(json);
    char *p = realloc(t->pend, n + 9);
    if (p) {
        t->pend = p;
        t->pend_len = (size_t)snprintf(p, n + 9, "data: %s\n\n", json);
        t->pend_off = 0;
    }
    free(json);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    track *t = cls;
    while (t->pend_off == t->pend_len) {
        if (t->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        if (t->done) {
            /* The end: any text held back for the stop strings, the finish reason, [DONE]. */
            if (t->j->http_status) {
                char *e = srv_error_json(t->j->error, "server_error", NULL, NULL);
                sse(t, e);
            } else {
                sse(t, srv_chunk_json(t->S, t->j, t->n_sent, t->n_seen, t->text ? t->text + t->sent : "", finish_reason(t), t->first));
            }
            const size_t n = t->pend_len;
            char *p = realloc(t->pend, n + 15);
            if (p) {
                memcpy(p + n, "data: [DONE]\n\n", 14);
                t->pend = p;
                t->pend_len = n + 14;
            }
            t->finished = 1;
            break;
        }
        if (pull(t) < 0) {
            cancel(t);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (t->done) continue;
        /* Text that a stop string could still take back is held. */
        size_t safe = t->len > t->sent + t->max_stop ? t->len - t->max_stop : t->sent;
        while (safe > t->sent && ((unsigned char)t->text[safe] & 0xC0) == 0x80) safe--; /* whole UTF-8 characters */
        if (t->n_seen == t->n_sent && safe == t->sent && !(t->first && t->j->chat)) continue;
        char save = 0;
        if (t->text) {
            save = t->text[safe];
            t->text[safe] = 0;
        }
        sse(t, srv_chunk_json(t->S, t->j, t->n_sent, t->n_seen, t->text ? t->text + t->sent : "", NULL, t->first));
        if (t->text) t->text[safe] = save;
        t->first = 0;
        t->sent = safe;
        t->n_sent = t->n_seen;
    }
    const size_t n = t->pend_len - t->pend_off < max ? t->pend_len - t->pend_off : max;
    memcpy(buf, t->pend + t->pend_off, n);
    t->pend_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    track *t = cls;
    if (!t->finished) cancel(t);
    track_free(t);
    free(t);
}

/* ---- completions ---- */

static enum MHD_Result completion(server *S, struct MHD_Connection *c, conn *k) {
    const int chat = k->route == ROUTE_CHAT;
    pthread_mutex_lock(&S->mu);
    const int loaded = S->loaded && !S->draining;
    pthread_mutex_unlock(&S->mu);
    if (!loaded) return respond_error(S, c, k->route, 503, "the model is loading or the server is shutting down", "server_error", NULL);
    if (k->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the body is larger than the limit of %ld bytes", S->o.max_body);
        return respond_error(S, c, k->route, 413, msg, "invalid_request_error", "body_too_large");
    }
    srv_job *j = NULL;
    char *err = NULL;
    int st = srv_job_from_body(S, chat, k->body ? k->body : "", k->len, &j, &err);
    if (st) return respond_json(S, c, k->route, st, err);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    track *t = calloc(1, sizeof *t);
    if (!t || track_init(t, S, j) != 0) {
        free(t);
        pthread_mutex_lock(&S->mu);
        srv_job_unref(S, j);
        pthread_mutex_unlock(&S->mu);
        return respond_error(S, c, k->route, 500, "out of memory", "server_error", NULL);
    }
    if ((st = srv_enqueue(S, j, &err))) {
        track_free(t);
        free(t);
        return respond_json(S, c, k->route, st, err);
    }
    /* Admission first: a job refused or timed out in the queue gets its own status. */
    for (;;) {
        pthread_mutex_lock(&S->mu);
        const srv_job_state state = j->state;
        const int failed = j->http_status;
        if (state == JOB_QUEUED) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 50000000;
            if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&j->cv, &S->mu, &until);
        }
        pthread_mutex_unlock(&S->mu);
        if (failed) {
            const enum MHD_Result r = respond_error(S, c, k->route, failed, j->error, failed < 500 ? "invalid_request_error" : "server_error",
                                                    NULL);
            track_free(t);
            free(t);
            return r;
        }
        if (state != JOB_QUEUED) break;
        if (peer_gone(j->fd)) {
            cancel(t);
            track_free(t);
            free(t);
            return MHD_NO;
        }
    }
    if (j->stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, t, stream_free);
        if (!r) {
            stream_free(t);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        const enum MHD_Result ok = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        srv_metrics_request(S, k->route, 200);
        return ok;
    }
    while (!t->done)
        if (pull(t) < 0) {
            cancel(t);
            track_free(t);
            free(t);
            return MHD_NO;
        }
    enum MHD_Result r;
    if (j->http_status) r = respond_error(S, c, k->route, j->http_status, j->error, "server_error", NULL);
    else r = respond_json(S, c, k->route, 200, srv_response_json(S, j, t->n_seen, t->text, finish_reason(t)));
    track_free(t);
    free(t);
    return r;
}

/* ---- routes ---- */

static int route_of(const char *url) {
    if (strcmp(url, "/v1/completions") == 0 || strcmp(url, "/completions") == 0) return ROUTE_COMPLETIONS;
    if (strcmp(url, "/v1/chat/completions") == 0 || strcmp(url, "/chat/completions") == 0) return ROUTE_CHAT;
    if (strcmp(url, "/v1/models") == 0 || strcmp(url, "/models") == 0) return ROUTE_MODELS;
    if (strcmp(url, "/health") == 0) return ROUTE_HEALTH;
    if (strcmp(url, "/metrics") == 0) return ROUTE_METRICS;
    return ROUTE_OTHER;
}

/* Bearer auth; the comparison takes the same time wherever the key differs. */
static int authorized(const server *S, struct MHD_Connection *c) {
    if (!S->o.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    const size_t n = strlen(S->o.api_key);
    if (strlen(h) != n) return 0;
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(h[i] ^ S->o.api_key[i]);
    return diff == 0;
}

static char *models_json(const server *S) {
    cJSON *r = cJSON_CreateObject(), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "data"), m);
    cJSON_AddStringToObject(m, "id", S->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "kdt");
    cJSON_AddNumberToObject(m, "context_length", S->ctx);
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                              const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    server *S = cls;
    conn *k = *con_cls;
    if (!k) {
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        k->route = route_of(url);
        k->post = strcmp(method, "POST") == 0;
        *con_cls = k;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!k->too_big && k->len + *upload_size > (size_t)S->o.max_body) {
            k->too_big = 1;
            free(k->body);
            k->body = NULL;
            k->len = k->cap = 0;
        }
        if (!k->too_big) {
            if (k->len + *upload_size + 1 > k->cap) {
                size_t cap = k->cap ? k->cap * 2 : 4096;
                while (cap < k->len + *upload_size + 1) cap *= 2;
                char *p = realloc(k->body, cap);
                if (!p) return MHD_NO;
                k->body = p;
                k->cap = cap;
            }
            memcpy(k->body + k->len, upload, *upload_size);
            k->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->route == ROUTE_OTHER) {
        char msg[160];
        snprintf(msg, sizeof msg, "no route %s %.100s", method, url);
        return respond_error(S, c, k->route, 404, msg, "invalid_request_error", "not_found");
    }
    const int want_post = k->route == ROUTE_COMPLETIONS || k->route == ROUTE_CHAT;
    if (want_post != k->post || (!k->post && strcmp(method, "GET") && strcmp(method, "HEAD")))
        return respond_error(S, c, k->route, 405, want_post ? "use POST" : "use GET", "invalid_request_error", "method_not_allowed");
    if (k->route != ROUTE_HEALTH && !authorized(S, c))
        return respond_error(S, c, k->route, 401, "invalid or missing API key (Authorization: Bearer KEY)", "invalid_request_error",
                             "invalid_api_key");
    switch (k->route) {
    case ROUTE_HEALTH: {
        pthread_mutex_lock(&S->mu);
        const int ok = S->loaded && !S->draining;
        pthread_mutex_unlock(&S->mu);
        return ok ? respond_json(S, c, k->route, 200, strdup("{\"status\":\"ok\"}"))
                  : respond_error(S, c, k->route, 503, "loading the model, or shutting down", "server_error", "unavailable");
    }
    case ROUTE_MODELS: return respond_json(S, c, k->route, 200, models_json(S));
    case ROUTE_METRICS: {
        char *m = srv_metrics_text(S);
        return m ? respond(S, c, k->route, 200, m, "text/plain; version=0.0.4") : MHD_NO;
    }
    default: return completion(S, c, k);
    }
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)cls, (void)c, (void)why;
    conn *k = *con_cls;
    if (k) free(k->body);
    free(k);
    *con_cls = NULL;
}

struct MHD_Daemon *srv_http_start(server *S, int *port) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)S->o.port)};
    if (inet_pton(AF_INET, S->o.host, &addr.sin_addr) != 1) {
        fprintf(stderr, "kdt serve: --host %s: not an IPv4 address\n", S->o.host);
        return NULL;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, handle, S,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)S->o.io_timeout,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)(4 * (S->o.max_batch + S->o.max_queue) + 16), MHD_OPTION_NOTIFY_COMPLETED,
        completed, S, MHD_OPTION_END);
    if (!d) return NULL;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port = info ? info->port : S->o.port;
    return d;
}
