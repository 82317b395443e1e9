/* KDTR container (docs/interfaces.md section 1): writer -> reader round trips of every dtype, shape and name
 * kind, typed lookups and their messages, the writer's refusals, the file python/gen_kdtr.py
 * writes, and one handcrafted corrupt file per rule, each with the exact status it must get.
 *
 *   build/tests/test_kdtr                      run the checks
 *   build/tests/test_kdtr --write-corpus DIR   write the handcrafted files (fuzz seed corpus) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static const kdt_dtype ALL_DTYPES[] = {KDT_F32, KDT_F64, KDT_F16, KDT_BF16, KDT_I8, KDT_U8,
                                       KDT_I16, KDT_I32, KDT_I64, KDT_U32, KDT_U64};
#define N_DTYPES (sizeof ALL_DTYPES / sizeof ALL_DTYPES[0])

static uint64_t rng_state;
static uint64_t rng(void) { return kt_splitmix64(&rng_state); }

/* ---------------------------------------------------------------- round trips */

typedef struct spec {
    char name[256];
    kdt_dtype dtype;
    int ndim;
    uint64_t dims[KDTR_MAX_NDIM];
    uint64_t nbytes;
    unsigned char *data;
} spec;

static void add_spec(spec *s, size_t *n, const char *name, kdt_dtype t, int ndim, const uint64_t *dims) {
    spec *p = &s[(*n)++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->dtype = t;
    p->ndim = ndim;
    p->nbytes = kdt_dtype_size(t);
    for (int d = 0; d < ndim; d++) p->dims[d] = dims[d], p->nbytes *= dims[d];
    p->data = malloc(p->nbytes ? p->nbytes : 1);
    for (uint64_t i = 0; i < p->nbytes; i++) p->data[i] = (unsigned char)rng();
}

static int same_views(const kdt_kdtr *r, const spec *s, size_t n, char *why, size_t cap) {
    if (kdt_kdtr_count(r) != n) return snprintf(why, cap, "count %u, expected %zu", kdt_kdtr_count(r), n), 0;
    for (size_t i = 0; i < n; i++) {
        kdt_tensor_view v, f;
        if (kdt_kdtr_get(r, (uint32_t)i, &v) != KDT_OK) return snprintf(why, cap, "get(%zu) failed", i), 0;
        uint64_t numel = 1;
        for (int d = 0; d < s[i].ndim; d++) numel *= s[i].dims[d];
        int ok = strcmp(v.name, s[i].name) == 0 && v.dtype == s[i].dtype && v.ndim == s[i].ndim &&
                 v.nbytes == s[i].nbytes && v.numel == numel && (uintptr_t)v.data % 64 == 0 &&
                 memcmp(v.data, s[i].data, s[i].nbytes) == 0;
        for (int d = 0; ok && d < v.ndim; d++) ok = v.dims[d] == s[i].dims[d];
        if (!ok) return snprintf(why, cap, "tensor %zu '%s' differs (name, dtype, dims, bytes or alignment)", i, s[i].name), 0;
        if (kdt_kdtr_find(r, s[i].name, &f) != KDT_OK || f.data != v.data)
            return snprintf(why, cap, "find('%s') disagrees with get(%zu)", s[i].name, i), 0;
    }
    return 1;
}

static char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(n > 0 ? (size_t)n : 1);
    *size = fread(buf, 1, (size_t)n, f);
    fclose(f);
    return buf;
}

static void tmp_path(char *buf, size_t cap, const char *name) {
    mkdir(kt_data_dir(), 0755);
    snprintf(buf, cap, "%s/test_kdtr_%ld_%s", kt_data_dir(), (long)getpid(), name);
}

static void test_round_trip(void) {
    spec s[64];
    size_t n = 0;
    char name[256];
    for (size_t k = 0; k < N_DTYPES; k++) {
        kdt_dtype t = ALL_DTYPES[k];
        uint64_t d3[3] = {1 + rng() % 4, 1 + rng() % 5, 1 + rng() % 3}, e2[2] = {rng() % 3, 0};
        snprintf(name, sizeof name, "t_%s", kdt_dtype_name(t));
        add_spec(s, &n, name, t, 3, d3);
        snprintf(name, sizeof name, "scalar_%s", kdt_dtype_name(t));
        add_spec(s, &n, name, t, 0, NULL);
        snprintf(name, sizeof name, "empty_%s", kdt_dtype_name(t));
        add_spec(s, &n, name, t, 2, e2);
    }
    const uint64_t d8[8] = {2, 1, 3, 1, 2, 1, 1, 2}, d1[1] = {5}, huge_empty[4] = {1ull << 40, 1ull << 40, 1ull << 40, 0};
    add_spec(s, &n, "eight_dims", KDT_I16, 8, d8);
    add_spec(s, &n, "h\xc3\xa9llo_w\xc3\xb6rld", KDT_F32, 1, d1);                          /* 2-byte UTF-8 */
    add_spec(s, &n, "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", KDT_U8, 1, d1);              /* 3-byte */
    add_spec(s, &n, "emoji_\xf0\x9f\x98\x80", KDT_BF16, 1, d1);                           /* 4-byte */
    add_spec(s, &n, "zero_dim_last", KDT_F32, 4, huge_empty); /* product 0 although a prefix overflows */
    memset(name, 0, sizeof name);
    for (int i = 0; i < 127; i++) memcpy(name + 2 * i, "\xc3\xa9", 2);
    name[254] = 'x';                                                                       /* 255 bytes */
    add_spec(s, &n, name, KDT_I32, 1, d1);

    kdt_kdtr_writer *w = NULL;
    int ok = kdt_kdtr_writer_create(&w) == KDT_OK;
    for (size_t i = 0; ok && i < n; i++) {
        if (i % 2) {
            ok = kdt_kdtr_writer_add(w, s[i].name, s[i].dtype, s[i].ndim, s[i].dims, s[i].data) == KDT_OK;
            continue;
        }
        void *p = NULL;
        ok = kdt_kdtr_writer_add_alloc(w, s[i].name, s[i].dtype, s[i].ndim, s[i].dims, &p) == KDT_OK && p;
        for (uint64_t b = 0; ok && b < s[i].nbytes; b++) ok = ((unsigned char *)p)[b] == 0;
        if (ok) memcpy(p, s[i].data, s[i].nbytes);
    }
    kt_check(ok, "kdtr writer: add / add_alloc (zeroed) of %zu tensors: every dtype, 0-d, empty, 8-d, UTF-8 names%s%s",
             n, ok ? "" : ": ", ok ? "" : kdt_last_error());

    void *buf = NULL;
    size_t size = 0;
    kdt_kdtr *r = NULL;
    char why[512] = "";
    kdt_status st = kdt_kdtr_writer_to_memory(w, &buf, &size);
    if (st == KDT_OK) st = kdt_kdtr_open_memory(buf, size, &r);
    ok = st == KDT_OK && same_views(r, s, n, why, sizeof why);
    kt_check(ok, "kdtr round trip writer -> memory -> reader (%zu bytes)%s%s", size, ok ? "" : ": ",
             ok ? "" : st ? kdt_last_error() : why);
    kdt_kdtr_close(r);
    r = NULL;
    const unsigned char *h = buf;
    uint64_t doff = 0, fsize = 0;
    for (int i = 7; h && i >= 0; i--) doff = doff << 8 | h[16 + i], fsize = fsize << 8 | h[24 + i];
    kt_check(h && memcmp(h, "KDTR\x01\0\0\0", 8) == 0 && h[8] == (n & 0xFF) && h[9] == (n >> 8) && !h[12] && !h[13] &&
                 doff % 64 == 0 && fsize == size,
             "kdtr writer: header magic, version 1, n_tensors %zu, flags 0, data_offset %llu aligned, file_size %llu",
             n, (unsigned long long)doff, (unsigned long long)fsize);

    char path[512], tmp[520];
    tmp_path(path, sizeof path, "round_trip.kdtr");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    st = kdt_kdtr_writer_save(w, path);
    if (st == KDT_OK) st = kdt_kdtr_open_file(path, &r);
    ok = st == KDT_OK && same_views(r, s, n, why, sizeof why);
    kt_check(ok, "kdtr round trip writer -> file -> reader (mmap)%s%s", ok ? "" : ": ", ok ? "" : st ? kdt_last_error() : why);
    kdt_kdtr_close(r);
    size_t fsz = 0;
    char *fbytes = slurp(path, &fsz);
    kt_check(fbytes && fsz == size && memcmp(fbytes, buf, size) == 0 && access(tmp, F_OK) != 0,
             "kdtr writer: saved file equals to_memory bytes, no .tmp left");
    free(fbytes);
    unlink(path);
    free(buf);
    kdt_kdtr_writer_free(w);
    for (size_t i = 0; i < n; i++) free(s[i].data);
}

/* ---------------------------------------------------------------- lookups */

static void expect(kdt_status got, kdt_status want, const char *msg_want, const char *what) {
    int ok = got == want && (!msg_want || strcmp(kdt_last_error(), msg_want) == 0);
    kt_check(ok, "%s -> %s%s%s%s%s", what, kdt_status_name(want), msg_want ? " \"" : "", msg_want ? msg_want : "",
             msg_want ? "\"" : "", ok ? "" : " (got something else)");
    if (!ok) printf("      got %s: %s\n", kdt_status_name(got), kdt_last_error());
}

static void test_lookup(void) {
    kdt_kdtr_writer *w = NULL;
    kdt_kdtr_writer_create(&w);
    const uint64_t ds[3] = {4, 7, 8}, dt[2] = {4, 7};
    void *p;
    float scale = 0.13086f;
    int32_t budget = 63;
    kdt_kdtr_writer_add_alloc(w, "scores", KDT_F32, 3, ds, &p);
    kdt_kdtr_writer_add_alloc(w, "tokens", KDT_I32, 2, dt, &p);
    kdt_kdtr_writer_add(w, "budget", KDT_I32, 0, NULL, &budget);
    kdt_kdtr_writer_add(w, "sm_scale", KDT_F32, 0, NULL, &scale);
    void *buf = NULL;
    size_t size = 0;
    kdt_kdtr *r = NULL;
    kdt_kdtr_writer_to_memory(w, &buf, &size);
    kdt_kdtr_writer_free(w);
    if (kdt_kdtr_open_memory(buf, size, &r) != KDT_OK) {
        kt_fail("kdtr lookup: cannot open the test file: %s", kdt_last_error());
        free(buf);
        return;
    }
    free(buf);
    kdt_tensor_view v;
    const int64_t want3[3] = {4, 7, 8}, any2[2] = {4, -1}, bad2[2] = {4, 6}, anyq[3] = {-1, 7, -1};
    expect(kdt_kdtr_find_typed(r, "scores", KDT_F32, 3, want3, &v), KDT_OK, NULL, "find_typed scores f32 [4, 7, 8]");
    expect(kdt_kdtr_find_typed(r, "scores", KDT_I32, 3, want3, &v), KDT_ERR_DTYPE,
           "tensor 'scores': expected dtype i32, got f32", "find_typed scores as i32");
    expect(kdt_kdtr_find_typed(r, "tokens", KDT_I32, 3, want3, &v), KDT_ERR_SHAPE,
           "tensor 'tokens': expected shape [4, 7, 8], got [4, 7]", "find_typed tokens rank 3");
    expect(kdt_kdtr_find_typed(r, "tokens", KDT_I32, 2, any2, &v), KDT_OK, NULL, "find_typed tokens [4, -1]");
    expect(kdt_kdtr_find_typed(r, "tokens", KDT_I32, 2, NULL, &v), KDT_OK, NULL, "find_typed tokens rank 2, dims NULL");
    expect(kdt_kdtr_find_typed(r, "tokens", KDT_I32, 2, bad2, &v), KDT_ERR_SHAPE,
           "tensor 'tokens': expected shape [4, 6], got [4, 7]", "find_typed tokens [4, 6]");
    expect(kdt_kdtr_find_typed(r, "scores", KDT_F32, 3, anyq, &v), KDT_OK, NULL, "find_typed scores [-1, 7, -1]");
    expect(kdt_kdtr_find_typed(r, "budget", KDT_I32, 1, NULL, &v), KDT_ERR_SHAPE,
           "tensor 'budget': expected shape [?], got []", "find_typed budget rank 1");
    expect(kdt_kdtr_find(r, "budget2", &v), KDT_ERR_NOT_FOUND, "tensor 'budget2' not found", "find budget2");
    expect(kdt_kdtr_scalar_i32(r, "missing", &budget), KDT_ERR_NOT_FOUND, "tensor 'missing' not found", "scalar_i32 missing");
    int32_t b = 0;
    float f = 0;
    int ok = kdt_kdtr_scalar_i32(r, "budget", &b) == KDT_OK;
    kt_check(ok && b == 63, "scalar_i32 budget = 63 (got %d)", b);
    ok = kdt_kdtr_scalar_f32(r, "sm_scale", &f) == KDT_OK;
    kt_check(ok && f == 0.13086f, "scalar_f32 sm_scale = 0.13086 (got %g)", f);
    expect(kdt_kdtr_scalar_i32(r, "sm_scale", &b), KDT_ERR_DTYPE, "tensor 'sm_scale': expected dtype i32, got f32",
           "scalar_i32 sm_scale");
    expect(kdt_kdtr_scalar_i32(r, "tokens", &b), KDT_ERR_SHAPE, "tensor 'tokens': expected shape [], got [4, 7]",
           "scalar_i32 tokens");
    expect(kdt_kdtr_get(r, 4, &v), KDT_ERR_INVALID_ARG, NULL, "get index 4 of 4");
    kdt_kdtr_close(r);
}

/* ---------------------------------------------------------------- writer refusals */

static void test_writer_rejects(void) {
    kdt_kdtr_writer *w = NULL;
    kdt_kdtr_writer_create(&w);
    const uint64_t one[1] = {1}, big[1] = {(1ull << 40) + 1}, edge[2] = {1ull << 40, 0}, over[3] = {1ull << 40, 1ull << 40, 1ull << 40};
    const uint64_t d9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    char n256[257], n255[256];
    memset(n256, 'a', 256), n256[256] = 0;
    memset(n255, 'b', 255), n255[255] = 0;
    void *p;
    expect(kdt_kdtr_writer_add(w, "x", KDT_U8, 1, one, "\x01"), KDT_OK, NULL, "writer add 'x'");
    expect(kdt_kdtr_writer_add(w, "", KDT_U8, 1, one, "\x01"), KDT_ERR_KDTR_NAME_LEN, NULL, "writer name of 0 bytes");
    expect(kdt_kdtr_writer_add(w, n256, KDT_U8, 1, one, "\x01"), KDT_ERR_KDTR_NAME_LEN, NULL, "writer name of 256 bytes");
    expect(kdt_kdtr_writer_add(w, n255, KDT_U8, 1, one, "\x01"), KDT_OK, NULL, "writer name of 255 bytes");
    const char *bad_utf8[] = {"\xff", "a\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe6\x97", "\x80"};
    for (size_t i = 0; i < sizeof bad_utf8 / sizeof bad_utf8[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "writer invalid UTF-8 name #%zu", i);
        expect(kdt_kdtr_writer_add(w, bad_utf8[i], KDT_U8, 1, one, "\x01"), KDT_ERR_KDTR_NAME, NULL, what);
    }
    expect(kdt_kdtr_writer_add(w, "x", KDT_U8, 1, one, "\x01"), KDT_ERR_KDTR_NAME_DUP, NULL, "writer duplicate 'x'");
    expect(kdt_kdtr_writer_add(w, "d0", (kdt_dtype)0, 1, one, "\x01"), KDT_ERR_KDTR_DTYPE, NULL, "writer dtype 0");
    expect(kdt_kdtr_writer_add(w, "d12", (kdt_dtype)12, 1, one, "\x01"), KDT_ERR_KDTR_DTYPE, NULL, "writer dtype 12");
    expect(kdt_kdtr_writer_add(w, "n9", KDT_U8, 9, d9, "\x01"), KDT_ERR_KDTR_NDIM, NULL, "writer ndim 9");
    expect(kdt_kdtr_writer_add(w, "nm", KDT_U8, -1, d9, "\x01"), KDT_ERR_KDTR_NDIM, NULL, "writer ndim -1");
    expect(kdt_kdtr_writer_add_alloc(w, "big", KDT_U8, 1, big, &p), KDT_ERR_KDTR_DIM, NULL, "writer dim 2^40 + 1");
    expect(kdt_kdtr_writer_add_alloc(w, "over", KDT_F32, 3, over, &p), KDT_ERR_KDTR_DIM, NULL, "writer dims [2^40]*3 overflow");
    expect(kdt_kdtr_writer_add_alloc(w, "edge", KDT_F32, 2, edge, &p), KDT_OK, NULL, "writer dims [2^40, 0] (empty)");
    expect(kdt_kdtr_writer_add(w, "nodata", KDT_U8, 1, one, NULL), KDT_ERR_INVALID_ARG, NULL, "writer data NULL");
    expect(kdt_kdtr_writer_add(w, "nodims", KDT_U8, 1, NULL, "\x01"), KDT_ERR_INVALID_ARG, NULL, "writer dims NULL");

    /* The refused adds left no trace: the file holds exactly x, the 255-byte name and edge. */
    void *buf = NULL;
    size_t size = 0;
    kdt_kdtr *r = NULL;
    int ok = kdt_kdtr_writer_to_memory(w, &buf, &size) == KDT_OK && kdt_kdtr_open_memory(buf, size, &r) == KDT_OK &&
             kdt_kdtr_count(r) == 3;
    kt_check(ok, "writer after refusals still writes a valid file of 3 tensors");
    kdt_kdtr_close(r);
    free(buf);

    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/no_such_dir_%ld/out.kdtr", kt_data_dir(), (long)getpid());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    expect(kdt_kdtr_writer_save(w, path), KDT_ERR_IO, NULL, "writer save into a missing folder");
    kt_check(access(path, F_OK) != 0 && access(tmp, F_OK) != 0, "writer failed save leaves neither file nor .tmp");
    tmp_path(path, sizeof path, "overwrite.kdtr");
    FILE *f = fopen(path, "wb");
    if (f) fputs("old contents", f), fclose(f);
    ok = kdt_kdtr_writer_save(w, path) == KDT_OK && kdt_kdtr_open_file(path, &r) == KDT_OK && kdt_kdtr_count(r) == 3;
    kt_check(ok, "writer save replaces an existing file");
    kdt_kdtr_close(r);
    unlink(path);
    kdt_kdtr_writer_free(w);
}

/* 65535 tensors: duplicate detection and lookup are not quadratic, and the 65536th is refused. */
static void test_many_tensors(void) {
    kdt_kdtr_writer *w = NULL;
    kdt_kdtr_writer_create(&w);
    clock_t t0 = clock();
    int ok = 1;
    char name[32];
    const uint64_t one[1] = {1};
    for (uint32_t i = 0; ok && i < KDTR_MAX_TENSORS; i++) {
        unsigned char v = (unsigned char)(i * 7);
        snprintf(name, sizeof name, "t%u", i);
        ok = kdt_kdtr_writer_add(w, name, KDT_U8, 1, one, &v) == KDT_OK;
    }
    kt_check(ok, "writer adds 65535 tensors");
    expect(kdt_kdtr_writer_add(w, "one_more", KDT_U8, 1, one, "\x01"), KDT_ERR_KDTR_N_TENSORS, NULL, "writer 65536th tensor");
    void *buf = NULL;
    size_t size = 0;
    kdt_kdtr *r = NULL;
    ok = kdt_kdtr_writer_to_memory(w, &buf, &size) == KDT_OK && kdt_kdtr_open_memory(buf, size, &r) == KDT_OK &&
         kdt_kdtr_count(r) == KDTR_MAX_TENSORS;
    for (uint32_t i = 0; ok && i < KDTR_MAX_TENSORS; i += 997) {
        kdt_tensor_view v;
        snprintf(name, sizeof name, "t%u", i);
        ok = kdt_kdtr_find(r, name, &v) == KDT_OK && *(const unsigned char *)v.data == (unsigned char)(i * 7);
    }
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    kt_check(ok && secs < 5, "reader opens 65535 tensors and finds them by name (%.2f s, %zu bytes)", secs, size);
    kdt_kdtr_close(r);
    free(buf);
    kdt_kdtr_writer_free(w);
}

/* ---------------------------------------------------------------- python/gen_kdtr.py's file */

/* The generator's pattern (python/gen_kdtr.py documents it): element i of the tensor with salt s. */
static uint64_t pattern(uint64_t seed, uint64_t salt, uint64_t i) {
    uint64_t x = (seed + (salt << 32) + i) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    return x ^ (x >> 32);
}

static double half_to_double(uint16_t h) { /* IEEE binary16, written out independently of numpy */
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? m / 1024.0 / 16384.0 : (1 + m / 1024.0) * (double)(1u << e) / 32768.0;
    return h >> 15 ? -v : v;
}

/* The value the generator stores at element i (exact in every float dtype), as a double. */
static double expected_value(kdt_dtype t, uint64_t x) {
    switch (t) {
    case KDT_F32: return (double)((int64_t)(x >> 40) - (1 << 23)) / 64.0;
    case KDT_F64: return (double)((int64_t)(x >> 11) - (1ll << 52)) / 1073741824.0;
    case KDT_F16: return (double)((int64_t)(x >> 53) - 1024) / 16.0;
    case KDT_BF16: return (double)((int64_t)(x >> 56) - 128) / 4.0;
    default: return 0;
    }
}

/* Compares element i of v against the pattern; 1 when equal. */
static int element_ok(const kdt_tensor_view *v, uint64_t i, uint64_t x) {
    const unsigned char *p = (const unsigned char *)v->data + i * kdt_dtype_size(v->dtype);
    float f;
    double d;
    uint16_t h;
    uint32_t bits;
    switch (v->dtype) {
    case KDT_F32: memcpy(&f, p, 4); return f == expected_value(v->dtype, x);
    case KDT_F64: memcpy(&d, p, 8); return d == expected_value(v->dtype, x);
    case KDT_F16: memcpy(&h, p, 2); return half_to_double(h) == expected_value(v->dtype, x);
    case KDT_BF16: memcpy(&h, p, 2); bits = (uint32_t)h << 16; memcpy(&f, &bits, 4); return f == expected_value(v->dtype, x);
    case KDT_I8: return *(const int8_t *)p == (int8_t)(uint8_t)x;
    case KDT_U8: return *p == (uint8_t)x;
    case KDT_I16: { int16_t a; memcpy(&a, p, 2); return a == (int16_t)(uint16_t)x; }
    case KDT_I32: { int32_t a; memcpy(&a, p, 4); return a == (int32_t)(uint32_t)x; }
    case KDT_I64: { int64_t a; memcpy(&a, p, 8); return a == (int64_t)x; }
    case KDT_U32: { uint32_t a; memcpy(&a, p, 4); return a == (uint32_t)x; }
    case KDT_U64: { uint64_t a; memcpy(&a, p, 8); return a == x; }
    }
    return 0;
}

/* Tensor `name` has dtype t, shape dims and the pattern of salt. */
static void check_pattern(const kdt_kdtr *r, const char *name, kdt_dtype t, int ndim, const int64_t *dims,
                          uint64_t seed, uint64_t salt) {
    kdt_tensor_view v;
    if (kdt_kdtr_find_typed(r, name, t, ndim, dims, &v) != KDT_OK) {
        kt_fail("kdtr python -> C: %s", kdt_last_error());
        return;
    }
    uint64_t bad = UINT64_MAX;
    for (uint64_t i = 0; i < v.numel && bad == UINT64_MAX; i++)
        if (!element_ok(&v, i, pattern(seed, salt, i))) bad = i;
    kt_check(bad == UINT64_MAX, "kdtr python -> C: '%s' %s, %llu values%s", name, kdt_dtype_name(t),
             (unsigned long long)v.numel, bad == UINT64_MAX ? "" : " (mismatch)");
    if (bad != UINT64_MAX) printf("      first mismatch at flat index %llu\n", (unsigned long long)bad);
}

static void test_python_file(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/kdtr_interop.kdtr", kt_data_dir());
    if (access(path, F_OK) != 0) {
        kt_skip("kdtr python -> C: %s missing (run python/gen_kdtr.py, or scripts/run_tests.sh)", path);
        return;
    }
    kdt_kdtr *r = NULL;
    if (kdt_kdtr_open_file(path, &r) != KDT_OK) {
        kt_fail("kdtr python -> C: %s: %s", path, kdt_last_error());
        return;
    }
    kdt_tensor_view v;
    uint64_t seed = 0;
    if (kdt_kdtr_find_typed(r, "seed", KDT_U64, 0, NULL, &v) != KDT_OK) {
        kt_fail("kdtr python -> C: %s", kdt_last_error());
        kdt_kdtr_close(r);
        return;
    }
    memcpy(&seed, v.data, 8);
    for (size_t k = 0; k < N_DTYPES; k++) {
        kdt_dtype t = ALL_DTYPES[k];
        char name[64];
        const int64_t shape[3] = {2, 3, (int64_t)t}, empty[2] = {(int64_t)t, 0};
        snprintf(name, sizeof name, "t_%s", kdt_dtype_name(t));
        check_pattern(r, name, t, 3, shape, seed, (uint64_t)t);
        snprintf(name, sizeof name, "s_%s", kdt_dtype_name(t));
        check_pattern(r, name, t, 0, NULL, seed, 100 + (uint64_t)t);
        snprintf(name, sizeof name, "e_%s", kdt_dtype_name(t));
        int ok = kdt_kdtr_find_typed(r, name, t, 2, empty, &v) == KDT_OK && v.nbytes == 0;
        kt_check(ok, "kdtr python -> C: '%s' %s [%d, 0] empty%s%s", name, kdt_dtype_name(t), (int)t, ok ? "" : ": ",
                 ok ? "" : kdt_last_error());
    }
    const int64_t d8[8] = {2, 2, 2, 2, 2, 2, 2, 2};
    check_pattern(r, "\xc3\xbcn\xc3\xaf\x63\xc3\xb8\x64\xc3\xa9/\xe5\x90\x8d\xe5\x89\x8d/\xf0\x9f\x98\x80", KDT_I32, 8, d8, seed, 200);
    kdt_kdtr_close(r);
}

/* ---------------------------------------------------------------- corrupt files */

/* A file described field by field, so each case can break exactly one rule. */
typedef struct rec {
    unsigned name_len;          /* bytes of name used */
    const char *name;
    unsigned dtype, ndim;
    uint64_t dims[9];
    uint64_t offset, nbytes;
} rec;

typedef struct file {
    char magic[5];
    uint32_t version, n_tensors, flags;
    uint64_t data_offset, file_size; /* UINT64_MAX: computed */
    int n_rec;
    rec r[3];
    size_t data_len;                 /* bytes of data region */
    unsigned char data[256];
    int cut_on;                      /* keep only `cut` bytes */
    size_t cut;
} file;

static size_t put(unsigned char *b, size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; i++) b[at + i] = (unsigned char)(v >> (8 * i));
    return at + n;
}

static size_t build(const file *f, unsigned char *b) {
    size_t at = 32;
    for (int i = 0; i < f->n_rec; i++) {
        const rec *r = &f->r[i];
        at = put(b, at, r->name_len, 2);
        memcpy(b + at, r->name, r->name_len);
        at += r->name_len;
        b[at++] = (unsigned char)r->dtype;
        b[at++] = (unsigned char)r->ndim;
        for (unsigned d = 0; d < r->ndim; d++) at = put(b, at, r->dims[d], 8);
        at = put(b, at, r->offset, 8);
        at = put(b, at, r->nbytes, 8);
    }
    size_t doff = (at + 63) / 64 * 64;
    memset(b + at, 0, doff - at);
    memcpy(b + doff, f->data, f->data_len);
    size_t size = doff + f->data_len;
    if (f->cut_on) size = f->cut;
    memcpy(b, f->magic, 4);
    put(b, 4, f->version, 4);
    put(b, 8, f->n_tensors == UINT32_MAX ? (uint64_t)f->n_rec : f->n_tensors, 4);
    put(b, 12, f->flags, 4);
    put(b, 16, f->data_offset == UINT64_MAX ? doff : f->data_offset, 8);
    put(b, 24, f->file_size == UINT64_MAX ? size : f->file_size, 8);
    return size;
}

/* Valid base: 'a' f32 [2, 3] at 0, 'b' i32 [4] at 64, 128 data bytes. */
static file base(void) {
    file f = {"KDTR", 1, UINT32_MAX, 0, UINT64_MAX, UINT64_MAX, 2,
              {{1, "a", KDT_F32, 2, {2, 3}, 0, 24}, {1, "b", KDT_I32, 1, {4}, 64, 16}},
              128, {0}, 0, 0};
    for (int i = 0; i < 24; i++) f.data[i] = (unsigned char)(i + 1);
    for (int i = 64; i < 80; i++) f.data[i] = (unsigned char)(i + 1);
    return f;
}

typedef struct ccase {
    const char *name;
    kdt_status want;
    const char *word; /* the message must name the rule: it holds this word */
    file f;
} ccase;

static size_t corrupt_cases(ccase *c) {
    size_t n = 0;
    static char n255s[256], n256s[257];
    memset(n255s, 'n', 255);
    memset(n256s, 'n', 256);
#define CASE(nm, st, w) (c[n] = (ccase){nm, st, w, base()}, &c[n++].f)
    file *f;
    CASE("valid", KDT_OK, NULL);
    f = CASE("valid_empty_file", KDT_OK, NULL), f->n_rec = 0, f->data_len = 0;
    f = CASE("valid_name_255", KDT_OK, NULL), f->r[0].name = n255s, f->r[0].name_len = 255;
    f = CASE("valid_utf8_name", KDT_OK, NULL), f->r[0].name = "\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80", f->r[0].name_len = 9;
    f = CASE("valid_empty_tensor_at_end", KDT_OK, NULL), f->r[1] = (rec){1, "b", KDT_I32, 2, {4, 0}, 128, 0}, memset(f->data + 64, 0, 16);
    f = CASE("valid_zero_dim_after_huge", KDT_OK, NULL), f->r[1] = (rec){1, "b", KDT_F64, 3, {1ull << 40, 1ull << 40, 0}, 64, 0}, memset(f->data + 64, 0, 16);
    f = CASE("magic", KDT_ERR_KDTR_MAGIC, "magic"), memcpy(f->magic, "KDTX", 4);
    f = CASE("version_0", KDT_ERR_KDTR_VERSION, "version"), f->version = 0;
    f = CASE("version_2", KDT_ERR_KDTR_VERSION, "version"), f->version = 2;
    f = CASE("flags_bit0", KDT_ERR_KDTR_FLAGS, "flags"), f->flags = 1;
    f = CASE("flags_bit31", KDT_ERR_KDTR_FLAGS, "flags"), f->flags = 0x80000000u;
    f = CASE("truncated_header_31", KDT_ERR_KDTR_TRUNCATED, "header"), f->cut_on = 1, f->cut = 31;
    f = CASE("truncated_header_0", KDT_ERR_KDTR_TRUNCATED, "header"), f->cut_on = 1, f->cut = 0;
    f = CASE("truncated_table", KDT_ERR_KDTR_TRUNCATED, "truncated"), f->cut_on = 1, f->cut = 32 + 37 + 20, f->data_offset = 0;
    f = CASE("truncated_table_count", KDT_ERR_KDTR_TRUNCATED, "truncated"), f->n_tensors = 1000;
    f = CASE("n_tensors_65536", KDT_ERR_KDTR_N_TENSORS, "n_tensors"), f->n_tensors = 65536;
    f = CASE("n_tensors_max_u32", KDT_ERR_KDTR_N_TENSORS, "n_tensors"), f->n_tensors = 0xFFFFFFFEu;
    f = CASE("file_size_larger", KDT_ERR_KDTR_FILE_SIZE, "file_size"), f->file_size = 128 + 128 + 1;
    f = CASE("file_size_smaller", KDT_ERR_KDTR_FILE_SIZE, "file_size"), f->file_size = 128 + 128 - 1;
    f = CASE("name_len_0", KDT_ERR_KDTR_NAME_LEN, "name_len"), f->r[1].name_len = 0;
    f = CASE("name_len_256", KDT_ERR_KDTR_NAME_LEN, "name_len"), f->r[0].name = n256s, f->r[0].name_len = 256;
    f = CASE("name_dup", KDT_ERR_KDTR_NAME_DUP, "already used"), f->r[1].name = "a";
    f = CASE("name_nul", KDT_ERR_KDTR_NAME, "NUL"), f->r[1].name = "b\0c", f->r[1].name_len = 3;
    f = CASE("name_utf8_ff", KDT_ERR_KDTR_NAME, "UTF-8"), f->r[1].name = "b\xff", f->r[1].name_len = 2;
    f = CASE("name_utf8_overlong", KDT_ERR_KDTR_NAME, "UTF-8"), f->r[1].name = "\xe0\x80\xaf", f->r[1].name_len = 3;
    f = CASE("name_utf8_overlong_nul", KDT_ERR_KDTR_NAME, "UTF-8"), f->r[1].name = "\xc0\x80", f->r[1].name_len = 2;
    f = CASE("name_utf8_surrogate", KDT_ERR_KDTR_NAME, "UTF-8"), f->r[1].name = "\xed\xa0\x80", f->r[1].name_len = 3;
    f = CASE("name_utf8_past_10ffff", KDT_ERR_KDTR_NAME, "UTF-8"), f->r[1].name = "\xf4\x90\x80\x80", f->r[1].name_len = 4;
    f = CASE("name_utf8_cut", KDT_ERR_KDTR_NAME, "UTF-8"), f->r[1].name = "b\xe6\x97", f->r[1].name_len = 3;
    f = CASE("dtype_0", KDT_ERR_KDTR_DTYPE, "dtype"), f->r[1].dtype = 0;
    f = CASE("dtype_12", KDT_ERR_KDTR_DTYPE, "dtype"), f->r[1].dtype = 12;
    f = CASE("ndim_9", KDT_ERR_KDTR_NDIM, "ndim"), f->r[1] = (rec){1, "b", KDT_I32, 9, {4, 1, 1, 1, 1, 1, 1, 1, 1}, 64, 16};
    f = CASE("dim_over_2e40", KDT_ERR_KDTR_DIM, "2^40"), f->r[1] = (rec){1, "b", KDT_U8, 2, {(1ull << 40) + 1, 0}, 64, 0};
    f = CASE("dims_product_overflow", KDT_ERR_KDTR_DIM, "overflows"), f->r[1] = (rec){1, "b", KDT_U8, 2, {1ull << 40, 1ull << 24}, 64, 0};
    f = CASE("dims_bytes_overflow", KDT_ERR_KDTR_DIM, "overflows"), f->r[1] = (rec){1, "b", KDT_F64, 2, {1ull << 40, 1ull << 21}, 64, 0};
    f = CASE("nbytes_smaller", KDT_ERR_KDTR_NBYTES, "nbytes"), f->r[0].nbytes = 20;
    f = CASE("nbytes_larger", KDT_ERR_KDTR_NBYTES, "nbytes"), f->r[1].nbytes = 20;
    f = CASE("offset_misaligned", KDT_ERR_KDTR_OFFSET_ALIGN, "multiple of 64"), f->r[1].offset = 65;
    f = CASE("data_offset_misaligned", KDT_ERR_KDTR_DATA_OFFSET, "data_offset"), f->data_offset = 128 + 8;
    f = CASE("data_offset_inside_table", KDT_ERR_KDTR_DATA_OFFSET, "inside the table"), f->data_offset = 64;
    f = CASE("data_offset_past_end", KDT_ERR_KDTR_DATA_OFFSET, "past the end"), f->data_offset = 256 + 64;
    f = CASE("overlap_same_offset", KDT_ERR_KDTR_OVERLAP, "overlap"), f->r[1].offset = 0;
    f = CASE("overlap_partial", KDT_ERR_KDTR_OVERLAP, "overlap"), f->r[0] = (rec){1, "a", KDT_U8, 1, {100}, 0, 100};
    f = CASE("tensor_past_end", KDT_ERR_KDTR_BOUNDS, "data bytes"), f->r[1].offset = 128;
    f = CASE("tensor_offset_huge", KDT_ERR_KDTR_BOUNDS, "data bytes"), f->r[1].offset = 1ull << 63;
    f = CASE("empty_tensor_past_end", KDT_ERR_KDTR_BOUNDS, "data bytes"), f->r[1] = (rec){1, "b", KDT_I32, 1, {0}, 192, 0};
    f = CASE("padding_nonzero", KDT_ERR_KDTR_PADDING, "padding"), f->data[40] = 7;
#undef CASE
    return n;
}

static void test_corrupt(void) {
    ccase c[64];
    size_t n = corrupt_cases(c);
    unsigned char buf[1024];
    char path[512];
    tmp_path(path, sizeof path, "corrupt.kdtr");
    for (size_t i = 0; i < n; i++) {
        size_t size = build(&c[i].f, buf);
        kdt_kdtr *r = (kdt_kdtr *)&buf; /* must come back NULL on failure */
        kdt_status st = kdt_kdtr_open_memory(buf, size, &r);
        const char *msg = kdt_last_error();
        int ok = st == c[i].want && (st == KDT_OK ? r != NULL : r == NULL && strstr(msg, c[i].word) && !strchr(msg, '\n'));
        if (st == KDT_OK && r) kdt_kdtr_close(r);
        /* The mmap path gives the same verdict. */
        FILE *f = fopen(path, "wb");
        if (f) fwrite(buf, 1, size, f), fclose(f);
        r = NULL;
        kdt_status st2 = kdt_kdtr_open_file(path, &r);
        kdt_kdtr_close(r);
        ok = ok && st2 == st;
        kt_check(ok, "kdtr corrupt %-28s -> %s%s%s", c[i].name, kdt_status_name(c[i].want), st ? ": " : "", st ? msg : "");
        if (!ok) printf("      got %s (file: %s): %s\n", kdt_status_name(st), kdt_status_name(st2), msg);
    }
    unlink(path);
}

static int write_corpus(const char *dir) {
    ccase c[64];
    size_t n = corrupt_cases(c);
    unsigned char buf[1024];
    char path[512];
    for (size_t i = 0; i < n; i++) {
        size_t size = build(&c[i].f, buf);
        snprintf(path, sizeof path, "%s/%s%s.kdtr", dir, c[i].want ? "corrupt_" : "", c[i].name);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(buf, 1, size, f) != size || fclose(f) != 0) {
            fprintf(stderr, "test_kdtr: cannot write %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    printf("wrote %zu files to %s\n", n, dir);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0) return write_corpus(argv[2]);
    const char *env = getenv("KDT_SEED");
    rng_state = env && *env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
    printf("test_kdtr: random seed %llu (KDT_SEED replays it)\n", (unsigned long long)rng_state);
    test_round_trip();
    test_lookup();
    test_writer_rejects();
    test_many_tensors();
    test_python_file();
    test_corrupt();
    return kt_exit_code();
}
