/* safetensors reader. A file is an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}), then the
 * data region. Rules checked (those of the format's reference reader): N within the file and at
 * most 100 MB; the header one JSON object; each tensor a known dtype, at most 8 dims, integer
 * fields, product(shape) * size == end - begin without overflow; names unique; the tensors'
 * byte ranges tile the data region exactly (no overlap, no gap, nothing past the end). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/internal.h"
#include "model/safetensors.h"

#define ST_MAX_HEADER 100000000ull
#define ST_MAX_INT 9007199254740992.0 /* 2^53: JSON numbers past this are not exact */

typedef struct st_map {
    char *path;
    void *base;
    size_t size;
} st_map;

struct kdt_st {
    st_map *maps;
    size_t n_maps;
    kdt_st_tensor *t;            /* sorted by name */
    size_t n;
    char **strings;              /* names and dtype names the tensors point to */
    size_t n_strings;
};

static const struct { const char *name; kdt_dtype dtype; unsigned size; } st_dtypes[] = {
    {"F64", KDT_F64, 8}, {"F32", KDT_F32, 4}, {"F16", KDT_F16, 2}, {"BF16", KDT_BF16, 2},
    {"I64", KDT_I64, 8}, {"I32", KDT_I32, 4}, {"I16", KDT_I16, 2}, {"I8", KDT_I8, 1},
    {"U64", KDT_U64, 8}, {"U32", KDT_U32, 4}, {"U16", 0, 2},       {"U8", KDT_U8, 1},
    {"BOOL", 0, 1},      {"F8_E4M3", 0, 1},   {"F8_E5M2", 0, 1},
};

static char *keep(kdt_st *st, const char *s) {
    char *c = strdup(s);
    if (!c) return NULL;
    char **grown = realloc(st->strings, (st->n_strings + 1) * sizeof *grown);
    if (!grown) { free(c); return NULL; }
    st->strings = grown;
    st->strings[st->n_strings++] = c;
    return c;
}

void kdt_st_close(kdt_st *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n_maps; i++) {
        if (st->maps[i].base) munmap(st->maps[i].base, st->maps[i].size);
        free(st->maps[i].path);
    }
    for (size_t i = 0; i < st->n_strings; i++) free(st->strings[i]);
    free(st->maps);
    free(st->t);
    free(st->strings);
    free(st);
}

static kdt_status map_file(const char *path, st_map *m) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kdt_fail(KDT_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return kdt_fail(KDT_ERR_IO, "%s: not a regular file", path);
    }
    m->size = (size_t)sb.st_size;
    if (m->size < 8) {
        close(fd);
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: truncated: %zu bytes, shorter than the 8-byte header length", path, m->size);
    }
    m->base = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m->base == MAP_FAILED) {
        m->base = NULL;
        return kdt_fail(KDT_ERR_IO, "%s: mmap failed (%s)", path, strerror(errno));
    }
    return KDT_OK;
}

/* A non-negative integer JSON number, exact as a double. */
static int get_u64(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > ST_MAX_INT || v->valuedouble != (double)(uint64_t)v->valuedouble)
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

/* One tensor entry of a header. */
static kdt_status parse_entry(kdt_st *st, const char *path, const cJSON *e, kdt_st_tensor *t) {
    const char *name = e->string;
    if (!cJSON_IsObject(e)) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: tensor '%s': header entry is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt)) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: tensor '%s': 'dtype' missing or not a string", path, name);
    unsigned size = 0;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(dt->valuestring, st_dtypes[i].name) == 0) {
            size = st_dtypes[i].size;
            t->dtype = st_dtypes[i].dtype;
            t->dtype_name = st_dtypes[i].name;
        }
    if (!size) return kdt_fail(KDT_ERR_DTYPE, "%s: tensor '%s': unknown dtype \"%.32s\"", path, name, dt->valuestring);
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > KDT_ST_MAX_NDIM)
        return kdt_fail(KDT_ERR_SHAPE, "%s: tensor '%s': 'shape' missing, not an array, or more than %d dims", path, name,
                        KDT_ST_MAX_NDIM);
    t->ndim = 0;
    t->numel = 1;
    const cJSON *d;
    cJSON_ArrayForEach(d, shape) {
        uint64_t v;
        if (!get_u64(d, &v)) return kdt_fail(KDT_ERR_SHAPE, "%s: tensor '%s': shape entry is not a non-negative integer", path, name);
        if (!kdt_mul_u64(t->numel, v, &t->numel))
            return kdt_fail(KDT_ERR_SHAPE, "%s: tensor '%s': product of the shape overflows", path, name);
        t->dims[t->ndim++] = v;
    }
    if (!kdt_mul_u64(t->numel, size, &t->nbytes))
        return kdt_fail(KDT_ERR_SHAPE, "%s: tensor '%s': byte count overflows", path, name);
    uint64_t b, en;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !get_u64(cJSON_GetArrayItem(offs, 0), &b) ||
        !get_u64(cJSON_GetArrayItem(offs, 1), &en) || en < b)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: tensor '%s': 'data_offsets' must be [begin, end] integers with begin <= end",
                        path, name);
    if (en - b != t->nbytes)
        return kdt_fail(KDT_ERR_SHAPE, "%s: tensor '%s': data_offsets span %llu bytes, shape and dtype %s need %llu", path, name,
                        (unsigned long long)(en - b), t->dtype_name, (unsigned long long)t->nbytes);
    t->begin = b;
    if (!(t->name = keep(st, name))) return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", path);
    return KDT_OK;
}

static int by_begin(const void *a, const void *b) {
    const kdt_st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int by_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int by_name(const void *a, const void *b) {
    return strcmp(((const kdt_st_tensor *)a)->name, ((const kdt_st_tensor *)b)->name);
}

/* Parses and checks the header of map m, appending its tensors to st->t. */
static kdt_status parse_file(kdt_st *st, const st_map *m) {
    const char *path = m->path;
    const unsigned char *p = m->base;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | p[i];
    if (n > m->size - 8)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: truncated: header length %llu runs past the end of the %zu-byte file", path,
                        (unsigned long long)n, m->size);
    if (n > ST_MAX_HEADER)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: header length %llu is above the format's 100 MB limit", path, (unsigned long long)n);
    const char *json = (const char *)p + 8, *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)n, &end, 0);
    if (!root) {
        size_t at = end && end >= json && end <= json + n ? (size_t)(end - json) : 0;
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: header is not valid JSON (error near byte %zu of the header)", path, at);
    }
    kdt_status s = KDT_OK;
    for (const char *q = end; q < json + n && s == KDT_OK; q++)
        if (!*q || !strchr(" \t\r\n", *q))
            s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: header has bytes after its JSON object (byte %zu)", path, (size_t)(q - json));
    if (s == KDT_OK && !cJSON_IsObject(root)) s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: header is not a JSON object", path);
    size_t first = st->n, count = 0;
    const cJSON *e;
    if (s == KDT_OK) {
        cJSON_ArrayForEach(e, root) count++;
        kdt_st_tensor *grown = realloc(st->t, (st->n + count + 1) * sizeof *grown);
        if (!grown) s = kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", path);
        else st->t = grown;
    }
    const char *file = s == KDT_OK ? keep(st, path) : NULL;
    if (s == KDT_OK && !file) s = kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", path);
    for (e = s == KDT_OK ? root->child : NULL; e && s == KDT_OK; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: '__metadata__' is not an object", path);
            for (const cJSON *v = cJSON_IsObject(e) ? e->child : NULL; v && s == KDT_OK; v = v->next)
                if (!cJSON_IsString(v)) s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: '__metadata__' entry '%s' is not a string", path, v->string);
            continue;
        }
        if (!e->string[0]) { s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: a tensor has an empty name", path); break; }
        kdt_st_tensor *t = &st->t[st->n];
        memset(t, 0, sizeof *t);
        t->file = file;
        if ((s = parse_entry(st, path, e, t)) == KDT_OK) st->n++;
    }
    cJSON_Delete(root);
    if (s != KDT_OK) return s;

    qsort(st->t + first, st->n - first, sizeof *st->t, by_name);
    for (size_t i = first + 1; i < st->n; i++)
        if (strcmp(st->t[i].name, st->t[i - 1].name) == 0)
            return kdt_fail(KDT_ERR_INVALID_ARG, "%s: tensor '%s' appears twice in the header", path, st->t[i].name);
    /* The byte ranges must tile [0, data size): sorted by begin, each starts where the last ended. */
    const uint64_t data_size = m->size - 8 - n;
    const uint64_t data_at = 8 + n;
    qsort(st->t + first, st->n - first, sizeof *st->t, by_begin);
    uint64_t at = 0;
    for (size_t i = first; i < st->n; i++) {
        kdt_st_tensor *t = &st->t[i];
        if (t->begin < at)
            return kdt_fail(KDT_ERR_INVALID_ARG, "%s: tensor '%s': data_offsets [%llu, %llu) overlap tensor '%s'", path, t->name,
                            (unsigned long long)t->begin, (unsigned long long)(t->begin + t->nbytes), st->t[i - 1].name);
        if (t->begin > at)
            return kdt_fail(KDT_ERR_INVALID_ARG, "%s: tensor '%s': data_offsets begin at %llu, leaving a gap after byte %llu", path,
                            t->name, (unsigned long long)t->begin, (unsigned long long)at);
        if (t->nbytes > data_size - at)
            return kdt_fail(KDT_ERR_INVALID_ARG, "%s: truncated: tensor '%s' data_offsets [%llu, %llu) run past the %llu-byte data region",
                            path, t->name, (unsigned long long)t->begin, (unsigned long long)(t->begin + t->nbytes),
                            (unsigned long long)data_size);
        t->data = (const unsigned char *)m->base + data_at + t->begin;
        at += t->nbytes;
    }
    if (at != data_size)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: %llu bytes of the data region belong to no tensor", path,
                        (unsigned long long)(data_size - at));
    return KDT_OK;
}

static kdt_status add_file(kdt_st *st, const char *path) {
    st_map *grown = realloc(st->maps, (st->n_maps + 1) * sizeof *grown);
    if (!grown) return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", path);
    st->maps = grown;
    st_map *m = &st->maps[st->n_maps];
    memset(m, 0, sizeof *m);
    if (!(m->path = strdup(path))) return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", path);
    st->n_maps++;
    kdt_status s = map_file(path, m);
    return s != KDT_OK ? s : parse_file(st, m);
}

/* Sorts by name and rejects a name given twice (in one file or across shards). */
static kdt_status finish(kdt_st *st) {
    qsort(st->t, st->n, sizeof *st->t, by_name);
    for (size_t i = 1; i < st->n; i++)
        if (strcmp(st->t[i].name, st->t[i - 1].name) == 0)
            return kdt_fail(KDT_ERR_INVALID_ARG, "tensor '%s' appears twice (in %s and %s)", st->t[i].name, st->t[i - 1].file,
                            st->t[i].file);
    return KDT_OK;
}

kdt_status kdt_st_open_file(const char *path, kdt_st **out) {
    *out = NULL;
    kdt_st *st = calloc(1, sizeof *st);
    if (!st) return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", path);
    kdt_status s = add_file(st, path);
    if (s == KDT_OK) s = finish(st);
    if (s != KDT_OK) { kdt_st_close(st); return s; }
    *out = st;
    return KDT_OK;
}

kdt_status kdt_read_text(const char *path, char **buf, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return kdt_fail(KDT_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    *buf = NULL;
    *len = 0;
    size_t cap = 0;
    for (;;) {
        if (*len == cap) {
            char *g = cap > (256u << 20) ? NULL : realloc(*buf, cap = cap ? 2 * cap : 65536);
            if (!g) { fclose(f); free(*buf); return kdt_fail(KDT_ERR_NOMEM, "%s: too large or out of memory", path); }
            *buf = g;
        }
        size_t got = fread(*buf + *len, 1, cap - *len, f);
        *len += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) { free(*buf); return kdt_fail(KDT_ERR_IO, "%s: read failed", path); }
    return KDT_OK;
}

/* A shard name from the index: a relative path inside the folder (no "..", not absolute). */
static int safe_name(const char *s) {
    if (!s[0] || s[0] == '/') return 0;
    for (const char *p = s; *p; p++)
        if (p[0] == '.' && p[1] == '.' && (p == s || p[-1] == '/') && (p[2] == '/' || !p[2])) return 0;
    return 1;
}

static kdt_status open_index(kdt_st *st, const char *dir, const char *ipath) {
    char *text = NULL;
    size_t len = 0;
    kdt_status s = kdt_read_text(ipath, &text, &len);
    if (s != KDT_OK) return s;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        free(text);
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: not valid JSON (error near byte %zu)", ipath, at);
    }
    free(text);
    const cJSON *map = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(map)) s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'weight_map' missing or not an object", ipath);
    const cJSON *e;
    size_t n_names = 0;
    const char **names = NULL;
    if (s == KDT_OK) {
        cJSON_ArrayForEach(e, map) n_names++;
        if (!(names = malloc((n_names + 1) * sizeof *names))) s = kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", ipath);
    }
    n_names = 0;
    for (e = s == KDT_OK ? map->child : NULL; e && s == KDT_OK; e = e->next) {
        if (!cJSON_IsString(e) || !safe_name(e->valuestring))
            s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: weight_map entry '%s' is not a file name inside the folder", ipath, e->string);
        else names[n_names++] = e->valuestring;
    }
    /* Each distinct shard is opened once. */
    if (s == KDT_OK) qsort(names, n_names, sizeof *names, by_str);
    for (size_t i = 0; i < n_names && s == KDT_OK; i++) {
        if (i && strcmp(names[i], names[i - 1]) == 0) continue;
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, names[i]) >= sizeof path) {
            s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: shard path too long", ipath);
        } else if ((s = add_file(st, path)) != KDT_OK) {
            char msg[600];
            snprintf(msg, sizeof msg, "%s", kdt_last_error());
            s = kdt_fail(s, "%s (a shard listed in %s)", msg, ipath);
        }
    }
    free(names);
    if (s == KDT_OK) s = finish(st);
    /* Every tensor of the map lies in the shard the map names. */
    for (e = map && s == KDT_OK ? map->child : NULL; e && s == KDT_OK; e = e->next) {
        const kdt_st_tensor *t = kdt_st_find(st, e->string);
        if (!t || strcmp(t->file + strlen(dir) + 1, e->valuestring) != 0)
            s = kdt_fail(KDT_ERR_NOT_FOUND, "%s: tensor '%s' is mapped to %s, which does not hold it", ipath, e->string,
                         e->valuestring);
    }
    cJSON_Delete(root);
    return s;
}

kdt_status kdt_st_open_dir(const char *dir, kdt_st **out) {
    *out = NULL;
    char ipath[4096], fpath[4096];
    if ((size_t)snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir) >= sizeof ipath ||
        (size_t)snprintf(fpath, sizeof fpath, "%s/model.safetensors", dir) >= sizeof fpath)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: path too long", dir);
    kdt_st *st = calloc(1, sizeof *st);
    if (!st) return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", dir);
    kdt_status s;
    if (access(ipath, F_OK) == 0) s = open_index(st, dir, ipath);
    else if (access(fpath, F_OK) == 0) {
        s = add_file(st, fpath);
        if (s == KDT_OK) s = finish(st);
    } else {
        s = kdt_fail(KDT_ERR_NOT_FOUND, "%s: neither model.safetensors nor model.safetensors.index.json is there", dir);
    }
    if (s != KDT_OK) { kdt_st_close(st); return s; }
    *out = st;
    return KDT_OK;
}

size_t kdt_st_count(const kdt_st *st) { return st->n; }
const kdt_st_tensor *kdt_st_at(const kdt_st *st, size_t i) { return i < st->n ? &st->t[i] : NULL; }

const kdt_st_tensor *kdt_st_find(const kdt_st *st, const char *name) {
    size_t lo = 0, hi = st->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->t[mid].name, name);
        if (c == 0) return &st->t[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}
