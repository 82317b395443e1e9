/* Test harness (see harness.h). */
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

static int n_failed;

static void line(const char *tag, const char *fmt, va_list ap) {
    fputs(tag, stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    fflush(stdout);
}

void kt_pass(const char *fmt, ...) { va_list ap; va_start(ap, fmt); line("PASS  ", fmt, ap); va_end(ap); }
void kt_skip(const char *fmt, ...) { va_list ap; va_start(ap, fmt); line("SKIP  ", fmt, ap); va_end(ap); }
void kt_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    line("FAIL  ", fmt, ap);
    va_end(ap);
    n_failed++;
}

int kt_check(int cond, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    line(cond ? "PASS  " : "FAIL  ", fmt, ap);
    va_end(ap);
    if (!cond) n_failed++;
    return cond;
}

int kt_exit_code(void) { return n_failed ? 1 : 0; }

const char *kt_data_dir(void) {
    const char *d = getenv("KDT_TEST_DATA");
    return d && *d ? d : "build/data";
}

uint64_t kt_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int32_t kt_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

double kt_chi2_sf(double x, int df) {
    const double k = df, z = (cbrt(x / k) - (1 - 2 / (9 * k))) / sqrt(2 / (9 * k));
    return 0.5 * erfc(z / sqrt(2.0));
}

double kt_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double kt_rel_l2(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

float *kt_poisoned(size_t n) {
    float *p = malloc(n * sizeof(float));
    if (p) memset(p, 0xFF, n * sizeof(float));
    return p;
}

const char *kt_basename(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

size_t kt_list_bundles(const char *prefix, char ***paths) {
    *paths = NULL;
    DIR *dir = opendir(kt_data_dir());
    if (!dir) return 0;
    size_t n = 0, cap = 0, plen = strlen(prefix);
    struct dirent *e;
    while ((e = readdir(dir))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, prefix, plen) != 0 || len < 5 || strcmp(e->d_name + len - 5, ".kdtr") != 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            *paths = realloc(*paths, cap * sizeof **paths);
        }
        size_t sz = strlen(kt_data_dir()) + len + 2;
        (*paths)[n] = malloc(sz);
        snprintf((*paths)[n++], sz, "%s/%s", kt_data_dir(), e->d_name);
    }
    closedir(dir);
    if (n) qsort(*paths, n, sizeof **paths, cmp_str);
    return n;
}

void kt_free_list(char **paths, size_t n) {
    for (size_t i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

int kt_backend_usable(kdt_backend b, const char *what) {
    if (b == KDT_BACKEND_CPU || kdt_cuda_available()) return 1;
    kt_skip("%s [cuda]  no CUDA device on this machine", what);
    return 0;
}

kdt_status kt_run_op(const char *op, const kdt_kdtr *in, kdt_backend backend, kdt_kdtr **out) {
    *out = NULL;
    kdt_kdtr_writer *w = NULL;
    void *buf = NULL;
    size_t size = 0;
    kdt_status s = kdt_kdtr_writer_create(&w);
    if (s == KDT_OK) s = kdt_op_run(op, in, w, backend);
    if (s == KDT_OK) s = kdt_kdtr_writer_to_memory(w, &buf, &size);
    if (s == KDT_OK) s = kdt_kdtr_open_memory(buf, size, out);
    free(buf);
    kdt_kdtr_writer_free(w);
    return s;
}

static int same_shape(const kdt_tensor_view *a, const kdt_tensor_view *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

static int lookup_pair(const kdt_kdtr *got, const kdt_kdtr *bundle, const char *name,
                       kdt_tensor_view *g, kdt_tensor_view *e, char *msg, size_t cap) {
    char ename[300];
    snprintf(ename, sizeof ename, "expected.%s", name);
    if (kdt_kdtr_find(got, name, g) != KDT_OK) { snprintf(msg, cap, "output '%s' missing", name); return 0; }
    if (kdt_kdtr_find(bundle, ename, e) != KDT_OK) { snprintf(msg, cap, "bundle lacks '%s'", ename); return 0; }
    if (!same_shape(g, e)) { snprintf(msg, cap, "'%s': shape differs from expected", name); return 0; }
    return 1;
}

int kt_compare_exact(const kdt_kdtr *got, const kdt_kdtr *bundle, const char *name, char *msg, size_t cap) {
    kdt_tensor_view g, e;
    if (!lookup_pair(got, bundle, name, &g, &e, msg, cap)) return 0;
    if (g.dtype != e.dtype) { snprintf(msg, cap, "'%s': dtype %s, expected %s", name, kdt_dtype_name(g.dtype), kdt_dtype_name(e.dtype)); return 0; }
    if (memcmp(g.data, e.data, g.nbytes) == 0) return 1;
    size_t es = kdt_dtype_size(g.dtype);
    for (uint64_t i = 0; i < g.numel; i++) {
        const unsigned char *a = (const unsigned char *)g.data + i * es, *b = (const unsigned char *)e.data + i * es;
        if (memcmp(a, b, es) == 0) continue;
        if (g.dtype == KDT_I32) snprintf(msg, cap, "'%s'[%llu]: got %d, expected %d", name, (unsigned long long)i, *(const int32_t *)a, *(const int32_t *)b);
        else if (g.dtype == KDT_F32) snprintf(msg, cap, "'%s'[%llu]: got %.9g, expected %.9g", name, (unsigned long long)i, *(const float *)a, *(const float *)b);
        else if (g.dtype == KDT_U8) snprintf(msg, cap, "'%s'[%llu]: got %u, expected %u", name, (unsigned long long)i, *a, *b);
        else snprintf(msg, cap, "'%s'[%llu]: bytes differ", name, (unsigned long long)i);
        return 0;
    }
    return 1;
}

int kt_compare_outputs(const kdt_kdtr *got, const kdt_kdtr *bundle, const char *const *outputs, size_t n,
                       char *msg, size_t cap) {
    if (kdt_kdtr_count(got) != n) {
        snprintf(msg, cap, "%u outputs, expected %zu", kdt_kdtr_count(got), n);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (!kt_compare_exact(got, bundle, outputs[i], msg, cap)) return 0;
    return 1;
}

static double load(const kdt_tensor_view *v, uint64_t i) {
    switch (v->dtype) {
    case KDT_F32: return ((const float *)v->data)[i];
    case KDT_F64: return ((const double *)v->data)[i];
    case KDT_BF16: {
        uint32_t bits = (uint32_t)((const uint16_t *)v->data)[i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    default: return NAN;
    }
}

int kt_compare_float(const kdt_kdtr *got, const kdt_kdtr *bundle, const char *name, kt_err *err,
                     char *msg, size_t cap) {
    kdt_tensor_view g, e;
    memset(err, 0, sizeof *err);
    if (!lookup_pair(got, bundle, name, &g, &e, msg, cap)) return 0;
    double num = 0, den = 0;
    for (uint64_t i = 0; i < g.numel; i++) {
        double a = load(&g, i), b = load(&e, i);
        if (isfinite(a) != isfinite(b) || (isnan(a) != isnan(b)) || (isinf(b) && a != b)) {
            if (!err->nonfinite_mismatch++) snprintf(msg, cap, "'%s'[%llu]: got %g, expected %g", name, (unsigned long long)i, a, b);
            continue;
        }
        if (!isfinite(b)) continue;
        double d = fabs(a - b);
        if (d > err->max_abs) err->max_abs = d;
        if (fabs(b) > err->ref_max_abs) err->ref_max_abs = fabs(b);
        if (d / (fabs(b) + 1e-30) > err->max_rel && fabs(b) > 1e-6) err->max_rel = d / fabs(b);
        num += d * d;
        den += b * b;
    }
    err->rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    return err->nonfinite_mismatch == 0;
}
