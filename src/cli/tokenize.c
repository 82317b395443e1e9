/* kdt tokenize / kdt detokenize (docs/interfaces.md section 3): text <-> ids with a model folder's tokenizer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdt/tokenizer.h"

int kdt_cmd_tokenize(int argc, char **argv);
int kdt_cmd_detokenize(int argc, char **argv);

/* The whole of f, malloc'd and NUL-terminated; NULL when out of memory or on a read error. */
char *kdt_cli_read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (ferror(f)) break;
        if (feof(f)) {
            buf[n] = 0;
            *len = n;
            return buf;
        }
        char *b = realloc(buf, cap *= 2);
        if (!b) break;
        buf = b;
    }
    free(buf);
    return NULL;
}

static int load(const char *cmd, const char *dir, kdt_tokenizer **t) {
    kdt_status s = kdt_tokenizer_load(dir, t);
    if (s == KDT_OK) return 0;
    fprintf(stderr, "kdt %s: %s (%s)\n", cmd, kdt_last_error(), kdt_status_name(s));
    return 1;
}

int kdt_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    for (int i = 0; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0) model = argv[i + 1];
        else if (strcmp(argv[i], "--file") == 0) file = argv[i + 1];
        else { model = NULL; break; }
    }
    if (!model || argc % 2) {
        fprintf(stderr, "usage: kdt tokenize --model DIR [--file F]\n"
                        "  prints the token ids of F's text (else stdin's) on one line, adding no special tokens\n");
        return 2;
    }
    FILE *f = file ? fopen(file, "rb") : stdin;
    if (!f) { fprintf(stderr, "kdt tokenize: %s: %s\n", file, strerror(errno)); return 1; }
    size_t len = 0;
    char *text = kdt_cli_read_all(f, &len);
    if (file) fclose(f);
    if (!text) { fprintf(stderr, "kdt tokenize: %s: read failed\n", file ? file : "stdin"); return 1; }
    kdt_tokenizer *t = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = load("tokenize", model, &t);
    kdt_status s;
    if (!rc && (s = kdt_tokenizer_encode(t, text, len, 0, &ids, &n)) != KDT_OK) {
        fprintf(stderr, "kdt tokenize: %s: %s (%s)\n", file ? file : "stdin", kdt_last_error(), kdt_status_name(s));
        rc = 1;
    }
    for (size_t i = 0; !rc && i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    if (!rc) printf("\n");
    free(ids), free(text);
    kdt_tokenizer_free(t);
    return rc;
}

int kdt_cmd_detokenize(int argc, char **argv) {
    if (argc != 2 || strcmp(argv[0], "--model") != 0) {
        fprintf(stderr, "usage: kdt detokenize --model DIR\n  reads token ids (spaces or commas) on stdin, writes their text\n");
        return 2;
    }
    size_t len = 0, n = 0;
    char *in = kdt_cli_read_all(stdin, &len);
    int32_t *ids = in ? malloc((len / 2 + 1) * sizeof *ids) : NULL;
    if (!ids) { free(in); fprintf(stderr, "kdt detokenize: cannot read stdin\n"); return 1; }
    for (char *p = in;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && !strchr(", \t\r\n", *end))) {
            fprintf(stderr, "kdt detokenize: stdin byte %zu: '%.16s' is not a token id\n", (size_t)(p - in), p);
            free(in), free(ids);
            return 1;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    kdt_tokenizer *t = NULL;
    char *text = NULL;
    size_t tl = 0;
    int rc = load("detokenize", argv[1], &t);
    kdt_status s;
    if (!rc && (s = kdt_tokenizer_decode(t, ids, n, &text, &tl)) != KDT_OK) {
        fprintf(stderr, "kdt detokenize: %s (%s)\n", kdt_last_error(), kdt_status_name(s));
        rc = 1;
    }
    if (!rc) fwrite(text, 1, tl, stdout);
    free(text), free(ids), free(in);
    kdt_tokenizer_free(t);
    return rc;
}
