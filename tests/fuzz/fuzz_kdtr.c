/* libFuzzer target for the KDTR reader and writer: `make fuzz`, then
 *   build/fuzz/fuzz_kdtr -dict=tests/fuzz/kdtr.dict -max_total_time=600 CORPUS_DIR tests/fuzz/corpus
 * (a scratch CORPUS_DIR first keeps new inputs out of the repository's seed corpus). Each input
 * goes through kdtr_check_input (kdtr_check.h); any disagreement traps, as do the sanitizers. */
#include <stdio.h>

#include "kdtr_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kdt_status st;
    const char *err = kdtr_check_input(data, size, &st);
    if (err) {
        fprintf(stderr, "kdtr fuzz: %s (open gave %s: %s)\n", err, kdt_status_name(st), kdt_last_error());
        __builtin_trap();
    }
    return 0;
}
