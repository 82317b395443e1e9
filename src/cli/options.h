/* The command lines of kdt generate and kdt serve: `--name value` pairs after the subcommand. */
#pragma once

#include "kdt/kdt.h"

/* "kdt <cmd>: msg[ arg]" and the usage text on stderr; returns 2, a usage error's exit status. */
int kdt_cli_usage_error(const char *cmd, const char *usage, const char *msg, const char *arg);

/* The option at argv[*i] into *name and its value into *value (*i then at the value). Returns -1
 * to go on; 0 after printing usage for --help or -h; 2 after a usage error (not an option, or no
 * value after it). */
int kdt_cli_next_option(const char *cmd, const char *usage, int argc, char **argv, int *i, const char **name,
                        const char **value);

/* --backend's value (cpu or cuda) into *b: 0, or 2 after a usage error. */
int kdt_cli_backend(const char *cmd, const char *usage, const char *value, kdt_backend *b);
