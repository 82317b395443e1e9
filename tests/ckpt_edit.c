#include "ckpt_edit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *kt_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    if (b) { b[n] = 0; *len = (size_t)n; }
    return b;
}

int kt_spit(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(data, 1, len, f) == len;
    return fclose(f) == 0 && ok;
}

cJSON *kt_st_header(const char *path, char **file, size_t *len, uint64_t *hlen) {
    char *b = kt_slurp(path, len);
    if (!b || *len < 8) { free(b); return NULL; }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | (unsigned char)b[i];
    cJSON *h = cJSON_ParseWithLength(b + 8, (size_t)n);
    if (!h) { free(b); return NULL; }
    *file = b;
    *hlen = n;
    return h;
}

int kt_st_rewrite(const char *path, const cJSON *h, const char *file, size_t len, uint64_t hlen) {
    char *text = cJSON_PrintUnformatted(h);
    const size_t tn = strlen(text), data = len - 8 - (size_t)hlen;
    char *out = malloc(8 + tn + data);
    for (int i = 0; i < 8; i++) out[i] = (char)((uint64_t)tn >> (8 * i));
    memcpy(out + 8, text, tn);
    memcpy(out + 8 + tn, file + 8 + hlen, data);
    int ok = kt_spit(path, out, 8 + tn + data);
    free(text);
    free(out);
    return ok;
}

int kt_edit_config(const char *dir, const char *key, const char *value) {
    char path[1024], k[256];
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(k, sizeof k, "%s", key);
    char *b = kt_slurp(path, &len);
    cJSON *c = b ? cJSON_Parse(b) : NULL, *o = c;
    free(b);
    char *leaf = k;
    for (char *dot; o && (dot = strchr(leaf, '.')); leaf = dot + 1) {
        *dot = 0;
        o = cJSON_GetObjectItemCaseSensitive(o, leaf);
    }
    if (!o) { cJSON_Delete(c); return 0; }
    cJSON_DeleteItemFromObjectCaseSensitive(o, leaf);
    if (value) cJSON_AddItemToObject(o, leaf, cJSON_Parse(value));
    char *text = cJSON_Print(c);
    int ok = kt_spit(path, text, strlen(text));
    free(text);
    cJSON_Delete(c);
    return ok;
}
