/* Shared by the checkpoint tests (test_model.c, test_quant.c): the file edits that make a copy of
 * a fixture broken in one known way. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

/* The whole file at path, NUL-terminated (*len bytes before the NUL); NULL when unreadable. */
char *kt_slurp(const char *path, size_t *len);
/* Writes data [len] as the whole file at path; 1 when written. */
int kt_spit(const char *path, const void *data, size_t len);

/* The parsed header of the safetensors file at path (cJSON_Delete it), with the file's bytes in
 * *file [*len] (free them) and the header's length in *hlen; NULL, nothing to free, when the file
 * is unreadable, shorter than 8 bytes or its header is not JSON. */
cJSON *kt_st_header(const char *path, char **file, size_t *len, uint64_t *hlen);
/* Writes the safetensors file at path as header h followed by the data region of file [len]
 * (as kt_st_header read it, header length hlen); 1 when written. */
int kt_st_rewrite(const char *path, const cJSON *h, const char *file, size_t len, uint64_t hlen);

/* Sets the field at dotted key (objects only) of dir/config.json to the JSON value (NULL: removes
 * it); 1 when written. */
int kt_edit_config(const char *dir, const char *key, const char *value);
