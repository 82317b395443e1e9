/* The tokenizer's shared state and helpers (not installed). */
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "common/internal.h"
#include "kdt/tokenizer.h"

#define TOK_MAX_SPLITS 8

/* An added token (HF added_tokens, tiktoken specials): matched in the text before splitting. */
typedef struct tok_added {
    char *text;
    size_t len;
    int32_t id;
    uint8_t lstrip, rstrip;  /* the match swallows whitespace on its left / right */
} tok_added;

/* A merge: adjacent ids (a, b) become id with priority rank (lower merges first). */
typedef struct tok_pair {
    uint64_t key;  /* ((uint64)a << 32 | b) + 1; 0 marks an empty slot */
    uint32_t rank;
    int32_t id;
} tok_pair;

struct kdt_tokenizer {
    /* ids 0 .. n_ids - 1: the bytes each id decodes to (len UINT32_MAX: no token has this id) */
    int32_t n_ids;
    char *arena;
    size_t arena_len, arena_cap;
    uint32_t *tok_off, *tok_len;
    /* model vocabulary (added tokens excluded): bytes -> id, open addressing, slot holds id + 1 */
    uint32_t *vslot;
    size_t vcap;
    tok_pair *pairs;
    size_t pcap, n_pairs;
    int32_t byte_id[256];    /* the id of each single byte, -1 if none */
    int byte_level;          /* tokenizer.json: vocabulary spelled in GPT-2's byte-level characters */
    int ignore_merges;       /* a piece that is a whole token is that token (tiktoken, HF ignore_merges) */
    /* pre-tokenizer: splits applied in order; keep_gaps 0 drops unmatched text (tiktoken) */
    pcre2_code *split[TOK_MAX_SPLITS];
    int n_split, keep_gaps;
    tok_added *added;        /* sorted by first byte, then longest first */
    int32_t n_added;
    int32_t added_first[257]; /* added[added_first[c] .. added_first[c + 1]) start with byte c */
    int32_t bos, eos;
    int add_bos;
    char *chat_template;
};

/* Growable id list. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
int tok_ids_push(tok_ids *a, int32_t id);  /* 0 ok, -1 out of memory */

/* vocab.c */
kdt_status tok_vocab_init(kdt_tokenizer *t, size_t n_tokens, int32_t n_ids);
/* Sets id's bytes (decode) and, when in_model, the bytes -> id entry (encode). */
kdt_status tok_vocab_set(kdt_tokenizer *t, int32_t id, const void *bytes, size_t n, int in_model);
int32_t tok_vocab_find(const kdt_tokenizer *t, const void *bytes, size_t n); /* -1 if none */
kdt_status tok_pairs_init(kdt_tokenizer *t, size_t n);
kdt_status tok_pair_add(kdt_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id);
/* BPE of one pre-token's bytes, appended to out; scratch is the caller's (per call). */
typedef struct tok_scratch tok_scratch;
tok_scratch *tok_scratch_new(void);
void tok_scratch_free(tok_scratch *s);
kdt_status tok_bpe(const kdt_tokenizer *t, const uint8_t *p, size_t n, tok_scratch *s, tok_ids *out);

/* GPT-2's byte-level mapping (each byte spelled as one code point): a token's characters back
 * into bytes at out; -1 when a character is not one of the 256. */
long tok_bytelevel_decode(const char *s, size_t n, uint8_t *out);

/* utf8.c */
/* Offset of the first byte that is not valid UTF-8, or n when all is valid. */
size_t tok_utf8_check(const uint8_t *p, size_t n);
/* Length of the valid or incomplete-but-possibly-valid prefix at p: >0 a whole character of that
 * length, 0 an incomplete character that runs to the end of the buffer, -k k bytes that are a
 * maximal invalid subpart (one U+FFFD). */
int tok_utf8_step(const uint8_t *p, size_t n);

/* load_hf.c, load_tiktoken.c, tokenizer.c */
kdt_status tok_load_hf(kdt_tokenizer *t, const char *path);
kdt_status tok_load_tiktoken(kdt_tokenizer *t, const char *path, const char *config_path);
kdt_status tok_compile(kdt_tokenizer *t, const char *pattern, int literal, const char *where);
kdt_status tok_add_special(kdt_tokenizer *t, const char *text, int32_t id, int lstrip, int rstrip);
kdt_status tok_read_file(const char *path, char **buf, size_t *len);
