/* Prompts as token ids for the benches on real weights (bench_drafters, bench_argmax): one prompt
 * per line, as python/train_small_model.py writes models/kdt-small/heldout_prompts.ids. */
#pragma once

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct prompts {
    int32_t **ids;
    int32_t *len;
    int n;
} prompts;

/* One prompt per non-empty line; ids separated by spaces or commas. */
static int read_prompts(const char *prog, const char *path, int limit, int32_t vocab, prompts *p) {
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno)); return -1; }
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0;
    while (p->n < limit && getline(&line, &cap, f) > 0) {
        lineno++;
        int32_t *ids = NULL;
        int n = 0, room = 0;
        for (char *s = line, *end; *s;) {
            if (*s == ' ' || *s == ',' || *s == '\t' || *s == '\n' || *s == '\r') { s++; continue; }
            long v = strtol(s, &end, 10);
            if (end == s || v < 0 || v >= vocab) {
                fprintf(stderr, "%s: %s:%d: not a token id below %d: %.20s\n", prog, path, lineno, (int)vocab, s);
                free(ids), free(line), fclose(f);
                return -1;
            }
            if (n == room) ids = realloc(ids, (size_t)(room = room ? 2 * room : 64) * sizeof *ids);
            ids[n++] = (int32_t)v;
            s = end;
        }
        if (!n) continue;
        p->ids = realloc(p->ids, (size_t)(p->n + 1) * sizeof *p->ids);
        p->len = realloc(p->len, (size_t)(p->n + 1) * sizeof *p->len);
        p->ids[p->n] = ids;
        p->len[p->n++] = n;
    }
    free(line);
    fclose(f);
    return 0;
}
