/* Internal helpers shared by the library's C files (not installed). */
#pragma once

#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records a printf-style message for kdt_last_error() and returns `s`, so that failures read
 * `return kdt_fail(KDT_ERR_SHAPE, "tensor 'q': expected 4 dims, got %d", nd);`. */
kdt_status kdt_fail(kdt_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Overflow-checked a * b; returns 0 and leaves *out alone on overflow. */
static inline int kdt_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

#ifdef __cplusplus
}
#endif
