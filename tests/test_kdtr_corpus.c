/* Replays the KDTR fuzz corpus (tests/fuzz/corpus, run from the repository root) through the
 * checks of the fuzz target (tests/fuzz/kdtr_check.h) without libFuzzer: every input either
 * is rejected with a KDTR status and a one-line message, or opens, reads back consistently and
 * survives a rewrite through the writer. One FAIL line per bad input, one PASS line per folder. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/kdtr_check.h"
#include "harness.h"

#define CORPUS "tests/fuzz/corpus"

static unsigned char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n == cap && !(buf = realloc(buf, cap = cap ? 2 * cap : 4096))) break;
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got);
    fclose(f);
    *size = n;
    return buf;
}

int main(void) {
    DIR *dir = opendir(CORPUS);
    if (!dir) {
        kt_fail("kdtr corpus: cannot open %s (run from the repository root)", CORPUS);
        return kt_exit_code();
    }
    size_t files = 0, opened = 0, bad = 0;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(dir))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", CORPUS, e->d_name);
        size_t size = 0;
        unsigned char *buf = slurp(path, &size);
        if (!buf) {
            kt_fail("kdtr corpus: cannot read %s", path);
            bad++;
            continue;
        }
        kdt_status st;
        const char *err = kdtr_check_input(buf, size, &st);
        free(buf);
        files++;
        opened += st == KDT_OK;
        if (err) {
            kt_fail("kdtr corpus %s: %s (open gave %s: %s)", e->d_name, err, kdt_status_name(st), kdt_last_error());
            bad++;
        }
    }
    closedir(dir);
    if (!bad)
        kt_check(files > 0, "kdtr corpus %s: %zu inputs through the fuzz checks (%zu open, %zu rejected)", CORPUS,
                 files, opened, files - opened);
    return kt_exit_code();
}
