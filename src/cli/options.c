#include "cli/options.h"

#include <stdio.h>
#include <string.h>

int kdt_cli_usage_error(const char *cmd, const char *usage, const char *msg, const char *arg) {
    fprintf(stderr, "kdt %s: %s%s%s\n%s", cmd, msg, arg ? " " : "", arg ? arg : "", usage);
    return 2;
}

int kdt_cli_next_option(const char *cmd, const char *usage, int argc, char **argv, int *i, const char **name,
                        const char **value) {
    const char *a = argv[*i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
        printf("%s", usage);
        return 0;
    }
    if (strncmp(a, "--", 2) != 0) return kdt_cli_usage_error(cmd, usage, "unexpected argument", a);
    if (*i + 1 == argc) return kdt_cli_usage_error(cmd, usage, "option needs a value:", a);
    *name = a;
    *value = argv[++*i];
    return -1;
}

int kdt_cli_backend(const char *cmd, const char *usage, const char *value, kdt_backend *b) {
    if (strcmp(value, "cpu") == 0) *b = KDT_BACKEND_CPU;
    else if (strcmp(value, "cuda") == 0) *b = KDT_BACKEND_CUDA;
    else return kdt_cli_usage_error(cmd, usage, "--backend takes cpu or cuda, not", value);
    return 0;
}
