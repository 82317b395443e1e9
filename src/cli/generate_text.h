/* kdt generate's text side (generate_text.c). */
#pragma once

#include <stdint.h>
#include <stdio.h>

#include "kdt/tokenizer.h"

#define KDT_SHIPPED_MODEL "kdt-small" /* models/<this>: what generate runs without --model */

/* The shipped model folder found from the executable's place (<exe dir>/../models/kdt-small), in
 * buf; NULL when absent (buf then holds the path looked at, for the message). */
const char *kdt_cli_shipped_model(char *buf, size_t cap);

/* Encodes text (or the contents of file, when not NULL) with model_dir's tokenizer, BOS added as
 * its config says; *ids malloc'd. Prints the error under cmd's name and returns 1 on failure. */
int kdt_cli_prompt_text(const char *cmd, const char *model_dir, const char *text, const char *file,
                        kdt_tokenizer **tok, int32_t **ids, int32_t *n);

/* Streaming text to stdout: kdt_cli_print_tokens is the loop's on_tokens (user: this struct). */
typedef struct kdt_cli_text_out {
    kdt_detok_stream *stream;
    kdt_status status; /* the first failure of a push */
} kdt_cli_text_out;
void kdt_cli_print_tokens(void *user, int32_t req, const int32_t *toks, int32_t n);
/* What the stream held back, then a newline. */
kdt_status kdt_cli_print_end(kdt_cli_text_out *o);
