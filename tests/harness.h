/* Test harness shared by tests/test_*.c: result lines, bundle discovery, running an op on a
 * bundle, comparing outputs with the bundle's `expected.<name>` tensors.
 *
 * Every test prints one line per check, starting with "PASS  ", "FAIL  " or "SKIP  ";
 * scripts/run_tests.sh counts them. A test binary exits 1 when any check failed. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kdt/kdtr.h"
#include "kdt/ops.h"

void kt_pass(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kt_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kt_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* PASS or FAIL depending on cond; returns cond. */
int kt_check(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int kt_exit_code(void);       /* 1 if any FAIL was printed */

/* splitmix64: the next number of the sequence that *state walks (the tests' seeded random data). */
uint64_t kt_splitmix64(uint64_t *state);

/* Index of the largest of x [n], the first one on ties. */
int32_t kt_argmax(const float *x, int32_t n);
/* Upper tail of chi-square with df degrees of freedom (Wilson-Hilferty). */
double kt_chi2_sf(double x, int df);
/* CLOCK_MONOTONIC in seconds. */
double kt_now_s(void);
/* |got - want| / |want| in L2 over n values (|got - want| when want is all zero), in double. */
double kt_rel_l2(const float *got, const float *want, size_t n);
/* malloc of n floats, every byte 0xFF (NaN): an output the code under test must overwrite; NULL when out of memory. */
float *kt_poisoned(size_t n);

/* Folder of generated bundles: $KDT_TEST_DATA, else build/data. */
const char *kt_data_dir(void);
/* Sorted paths of <data_dir>/<prefix>*.kdtr; returns the count (0 if none). Free with kt_free_list. */
size_t kt_list_bundles(const char *prefix, char ***paths);
void   kt_free_list(char **paths, size_t n);
const char *kt_basename(const char *path);

/* The backends to check: cpu always, then cuda when a device is present. A test that runs
 * cuda when none is present prints one SKIP line per bundle via kt_backend_usable. */
int kt_backend_usable(kdt_backend b, const char *what);

/* Runs op on `in` and opens its outputs as a reader (*out; close with kdt_kdtr_close). */
kdt_status kt_run_op(const char *op, const kdt_kdtr *in, kdt_backend backend, kdt_kdtr **out);

/* Exact byte comparison of output `name` against `expected.name` in bundle: same dtype,
 * shape and bytes. On mismatch writes where (flat index, got, expected) into msg. */
int kt_compare_exact(const kdt_kdtr *got, const kdt_kdtr *bundle, const char *name, char *msg, size_t cap);

/* kt_compare_exact for every name of outputs[0 .. n), and no output beyond them: 1 when all
 * match, else 0 with the first difference in msg. */
int kt_compare_outputs(const kdt_kdtr *got, const kdt_kdtr *bundle, const char *const *outputs, size_t n,
                       char *msg, size_t cap);

/* Float comparison statistics of output `name` (f32 or bf16) against `expected.name` (f32 or f64). */
typedef struct kt_err {
    double max_abs, max_rel, rel_l2, ref_max_abs;
    size_t nonfinite_mismatch; /* elements where got is NaN/Inf but expected is not, or vice versa */
} kt_err;
int kt_compare_float(const kdt_kdtr *got, const kdt_kdtr *bundle, const char *name, kt_err *err,
                     char *msg, size_t cap);
