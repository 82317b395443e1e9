/* kdt generate's text side: where the shipped model is, the prompt through the model's tokenizer,
 * and the generated ids streamed to stdout as text while the loop runs. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/generate_text.h"

char *kdt_cli_read_all(FILE *f, size_t *len); /* tokenize.c */

const char *kdt_cli_shipped_model(char *buf, size_t cap) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return NULL;
    *slash = 0;
    /* build/kdt -> ../models/kdt-small; an installed bin/kdt -> ../share/kdt/models/kdt-small */
    static const char *const rel[] = {"/../models/" KDT_SHIPPED_MODEL, "/../share/kdt/models/" KDT_SHIPPED_MODEL};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
        snprintf(buf, cap, "%s%s/config.json", exe, rel[i]);
        if (access(buf, R_OK) == 0) {
            snprintf(buf, cap, "%s%s", exe, rel[i]);
            return buf;
        }
    }
    snprintf(buf, cap, "%s/../models/" KDT_SHIPPED_MODEL, exe);
    return NULL;
}

int kdt_cli_prompt_text(const char *cmd, const char *model_dir, const char *text, const char *file,
                        kdt_tokenizer **tok, int32_t **ids, int32_t *n) {
    *tok = NULL, *ids = NULL, *n = 0;
    size_t len = text ? strlen(text) : 0, n_ids = 0;
    char *buf = NULL;
    if (file) {
        FILE *f = fopen(file, "rb");
        if (!f || !(buf = kdt_cli_read_all(f, &len))) {
            fprintf(stderr, "%s: --prompt-file %s: cannot read it\n", cmd, file);
            if (f) fclose(f);
            return 1;
        }
        fclose(f);
        text = buf;
    }
    kdt_status s = kdt_tokenizer_load(model_dir, tok);
    if (s == KDT_OK) s = kdt_tokenizer_encode(*tok, text, len, 1, ids, &n_ids);
    free(buf);
    if (s == KDT_OK && (n_ids == 0 || n_ids > INT32_MAX)) s = KDT_ERR_INVALID_ARG;
    if (s != KDT_OK) {
        fprintf(stderr, "%s: prompt: %s (%s)\n", cmd, n_ids ? kdt_last_error() : "the prompt encodes to no tokens",
                kdt_status_name(s));
        return 1;
    }
    *n = (int32_t)n_ids;
    return 0;
}

void kdt_cli_print_tokens(void *user, int32_t req, const int32_t *toks, int32_t n) {
    kdt_cli_text_out *o = user;
    (void)req;
    for (int32_t i = 0; i < n && o->status == KDT_OK; i++) {
        const char *text;
        size_t len;
        if ((o->status = kdt_detok_stream_push(o->stream, toks[i], &text, &len)) != KDT_OK) return;
        fwrite(text, 1, len, stdout);
    }
    fflush(stdout);
}

kdt_status kdt_cli_print_end(kdt_cli_text_out *o) {
    const char *text;
    size_t len;
    if (o->status == KDT_OK) o->status = kdt_detok_stream_flush(o->stream, &text, &len);
    if (o->status == KDT_OK) fwrite(text, 1, len, stdout);
    printf("\n");
    fflush(stdout);
    return o->status;
}
