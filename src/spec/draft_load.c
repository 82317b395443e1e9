/* kdt_draft_model_load: a checkpoint's first layers as a draft model, through the public loader.
 * The loader reads what config.json calls for and ignores other tensors, so a temporary folder
 * with an edited config.json and links to the weight files is that checkpoint cut short. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/internal.h"
#include "kdt/spec.h"

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
        if (fread(buf, 1, (size_t)n, f) == (size_t)n) buf[n] = 0;
        else { free(buf); buf = NULL; }
    }
    fclose(f);
    return buf;
}

/* config.json of dir with num_hidden_layers = L (first_k_dense_replace capped to L and GLM's
 * mlp_layer_types cut to L, so the kept layers stay dense or MoE as they were); in text_config
 * when the checkpoint nests the language model (Kimi K2.5, K2.6, Kimi-VL). */
static kdt_status edited_config(const char *dir, int32_t L, char **out) {
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: path too long", dir);
    char *text = read_file(path);
    if (!text) return kdt_fail(KDT_ERR_IO, "%s: cannot read", path);
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) { cJSON_Delete(root); return kdt_fail(KDT_ERR_INVALID_ARG, "%s: not a JSON object", path); }
    cJSON *lm = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!cJSON_IsObject(lm)) lm = root;
    const cJSON *have = cJSON_GetObjectItemCaseSensitive(lm, "num_hidden_layers");
    kdt_status s = KDT_OK;
    if (!cJSON_IsNumber(have)) s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'num_hidden_layers' is missing or not a number", path);
    else if (L < 1 || L > have->valuedouble)
        s = kdt_fail(KDT_ERR_INVALID_ARG, "draft layers = %d: the checkpoint %s has %g layers", L, dir, have->valuedouble);
    cJSON *fk = cJSON_GetObjectItemCaseSensitive(lm, "first_k_dense_replace");
    if (s == KDT_OK && cJSON_IsNumber(fk) && fk->valuedouble > L) cJSON_SetNumberValue(fk, L);
    cJSON *types = cJSON_GetObjectItemCaseSensitive(lm, "mlp_layer_types");
    while (s == KDT_OK && cJSON_IsArray(types) && cJSON_GetArraySize(types) > L) cJSON_DeleteItemFromArray(types, L);
    if (s == KDT_OK) cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(lm, "num_hidden_layers"), L);
    if (s == KDT_OK && !(*out = cJSON_Print(root))) s = kdt_fail(KDT_ERR_NOMEM, "draft model: out of memory");
    cJSON_Delete(root);
    return s;
}

/* Removes the files of the temporary folder, then the folder. */
static void remove_tmp(const char *tmp) {
    DIR *d = opendir(tmp);
    struct dirent *e;
    char path[PATH_MAX];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            (size_t)snprintf(path, sizeof path, "%s/%s", tmp, e->d_name) < sizeof path)
            unlink(path);
    if (d) closedir(d);
    rmdir(tmp);
}

/* Links every file of dir but config.json into tmp and writes the edited config there. */
static kdt_status fill_tmp(const char *dir, const char *tmp, const char *config) {
    char src[PATH_MAX], dst[PATH_MAX], abs_dir[PATH_MAX];
    if (!realpath(dir, abs_dir)) return kdt_fail(KDT_ERR_IO, "%s: cannot resolve the folder", dir);
    DIR *d = opendir(abs_dir);
    if (!d) return kdt_fail(KDT_ERR_IO, "%s: cannot list the folder", dir);
    kdt_status s = KDT_OK;
    struct dirent *e;
    while (s == KDT_OK && (e = readdir(d))) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "config.json") == 0) continue;
        if ((size_t)snprintf(src, sizeof src, "%s/%s", abs_dir, e->d_name) >= sizeof src ||
            (size_t)snprintf(dst, sizeof dst, "%s/%s", tmp, e->d_name) >= sizeof dst)
            s = kdt_fail(KDT_ERR_INVALID_ARG, "%s/%s: path too long", abs_dir, e->d_name);
        else if (symlink(src, dst) != 0)
            s = kdt_fail(KDT_ERR_IO, "%s: cannot link %s", dst, src);
    }
    closedir(d);
    if (s == KDT_OK && (size_t)snprintf(dst, sizeof dst, "%s/config.json", tmp) >= sizeof dst)
        s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: path too long", tmp);
    FILE *f = s == KDT_OK ? fopen(dst, "wb") : NULL;
    if (s == KDT_OK && (!f || fputs(config, f) < 0)) s = kdt_fail(KDT_ERR_IO, "%s: cannot write", dst);
    if (f && fclose(f) != 0 && s == KDT_OK) s = kdt_fail(KDT_ERR_IO, "%s: cannot write", dst);
    return s;
}

kdt_status kdt_draft_model_load(const char *dir, int32_t num_layers, kdt_backend backend, kdt_model **out) {
    if (!out || !dir) return kdt_fail(KDT_ERR_INVALID_ARG, "draft_model_load: dir or out is NULL");
    *out = NULL;
    char *config = NULL;
    kdt_status s = edited_config(dir, num_layers, &config);
    if (s != KDT_OK) return s;
    const char *base = getenv("TMPDIR");
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s/kdt_draft_XXXXXX", base && *base ? base : "/tmp") >= sizeof tmp || !mkdtemp(tmp)) {
        free(config);
        return kdt_fail(KDT_ERR_IO, "%s: cannot make a temporary folder for the draft model", tmp);
    }
    s = fill_tmp(dir, tmp, config);
    if (s == KDT_OK) s = kdt_model_load(tmp, backend, out);
    free(config);
    remove_tmp(tmp);
    if (s != KDT_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", kdt_last_error());
        return kdt_fail(s, "draft model (%s, first %d layers): %s", dir, num_layers, msg);
    }
    return KDT_OK;
}
