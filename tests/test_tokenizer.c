/* Tokenizer (include/kdt/tokenizer.h) on small handmade folders: BPE merges by rank, added tokens,
 * the tiktoken rule, streaming decode at character boundaries, and every refusal with the status
 * and the words its message must have (missing files, bad JSON fields, bad base64, unsupported
 * normalizer / pre-tokenizer / pattern, ids out of range, invalid UTF-8 with its byte offset).
 * python/tests/test_tokenizer.py checks real tokenizers against the Python libraries. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "kdt/tokenizer.h"

static char root[64];

static void write_file(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) { kt_fail("cannot write %s", path); return; }
    fputs(text, f);
    fclose(f);
}

/* A fresh folder <root>/<name> holding one file (and a second when name2 is set). */
static const char *folder(const char *name, const char *file, const char *text, const char *file2, const char *text2) {
    static char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    mkdir(dir, 0700);
    write_file(dir, file, text);
    if (file2) write_file(dir, file2, text2);
    return dir;
}

static int ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* Loading dir must fail with status s and a message holding `words`. */
static void refuse(const char *dir, kdt_status want, const char *words, const char *what) {
    kdt_tokenizer *t = (kdt_tokenizer *)1;
    kdt_status s = kdt_tokenizer_load(dir, &t);
    kt_check(s == want && t == NULL && strstr(kdt_last_error(), words) != NULL, "refuses %s: %s (%s)", what, kdt_last_error(),
             kdt_status_name(s));
}

#define HF_HEAD "{\"added_tokens\": [{\"id\": 8, \"content\": \"<s>\", \"special\": true}],"
#define HF_VOCAB "\"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"abc\": 4, \"\\u0120\": 5, \"\\u0120a\": 6, \"z\": 7}"
#define HF_PRE "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}"

/* Several threads encode and decode with one tokenizer at once; each must get the serial result. */
typedef struct job {
    const kdt_tokenizer *t;
    const char *text;
    const int32_t *want;
    size_t n_want;
    int ok;
} job;

static void *encode_many(void *arg) {
    job *j = arg;
    j->ok = 1;
    for (int r = 0; r < 200 && j->ok; r++) {
        int32_t *ids = NULL;
        char *back = NULL;
        size_t n = 0, len = 0;
        j->ok = kdt_tokenizer_encode(j->t, j->text, strlen(j->text), 0, &ids, &n) == KDT_OK && ids_equal(ids, n, j->want, j->n_want) &&
                kdt_tokenizer_decode(j->t, ids, n, &back, &len) == KDT_OK && strcmp(back, j->text) == 0;
        free(ids), free(back);
    }
    return NULL;
}

static void test_threads(const kdt_tokenizer *t) {
    char text[2048] = "";
    for (int i = 0; i < 60; i++) strcat(text, i % 3 ? "abc ab<s>c " : "cab  ba z ");
    int32_t *want = NULL;
    size_t n = 0;
    if (!kt_check(kdt_tokenizer_encode(t, text, strlen(text), 0, &want, &n) == KDT_OK, "threads: serial encode")) return;
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){t, text, want, n, 0};
        pthread_create(&th[i], NULL, encode_many, &jobs[i]);
    }
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ok &= jobs[i].ok;
    }
    kt_check(ok, "threads: 4 threads x 200 encode + decode on one tokenizer give the serial ids and text");
    free(want);
}

static void test_hf(void) {
    const char *dir = folder("hf", "tokenizer.json",
                             HF_HEAD HF_PRE ", \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", " HF_VOCAB
                                     ", \"merges\": [\"a b\", [\"ab\", \"c\"], \"\\u0120 a\"]}}",
                             "tokenizer_config.json",
                             "{\"add_bos_token\": true, \"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"z\", \"chat_template\": \"T\"}");
    kdt_tokenizer *t = NULL;
    kdt_status s = kdt_tokenizer_load(dir, &t);
    if (!kt_check(s == KDT_OK, "hf: loads%s%s", s ? ": " : "", s ? kdt_last_error() : "")) return;
    int32_t *ids = NULL;
    size_t n = 0;
    /* "abc" -> a b c -> ab c -> abc; " ab": (a,b) ranks below (Ġ,a) -> Ġ ab; <s> matched first */
    const int32_t want[] = {4, 5, 3, 8, 2};
    s = kdt_tokenizer_encode(t, "abc ab<s>c", 10, 0, &ids, &n);
    kt_check(s == KDT_OK && ids_equal(ids, n, want, 5), "hf: merges by rank, leftmost first; added token matched before splitting");
    free(ids);
    s = kdt_tokenizer_encode(t, "ab", 2, 1, &ids, &n);
    kt_check(s == KDT_OK && n == 2 && ids[0] == 8 && ids[1] == 3, "hf: add_special prepends BOS (add_bos_token)");
    free(ids);
    s = kdt_tokenizer_encode(t, "", 0, 0, &ids, &n);
    kt_check(s == KDT_OK && n == 0 && ids != NULL, "hf: empty text gives no ids and a freeable array");
    free(ids);
    char *text = NULL;
    size_t len = 0;
    s = kdt_tokenizer_decode(t, want, 5, &text, &len);
    kt_check(s == KDT_OK && len == 10 && strcmp(text, "abc ab<s>c") == 0, "hf: decode maps byte-level characters back");
    free(text);
    kt_check(kdt_tokenizer_vocab_size(t) == 9 && kdt_tokenizer_bos_id(t) == 8 && kdt_tokenizer_eos_id(t) == 7 &&
                 kdt_tokenizer_token_id(t, "\xC4\xA0" "a") == 6 && kdt_tokenizer_token_id(t, "<s>") == 8 &&
                 kdt_tokenizer_token_id(t, "q") == -1 && strcmp(kdt_tokenizer_chat_template(t), "T") == 0,
             "hf: vocab size, bos / eos from tokenizer_config.json, token ids, chat template");
    const char bad[] = "ab\xC0\x80";
    s = kdt_tokenizer_encode(t, bad, 4, 0, &ids, &n);
    kt_check(s == KDT_ERR_INVALID_ARG && ids == NULL && strstr(kdt_last_error(), "byte offset 2"), "hf: invalid UTF-8 names byte offset 2: %s",
             kdt_last_error());
    s = kdt_tokenizer_encode(t, "a\xE6\x97", 3, 0, &ids, &n);
    kt_check(s == KDT_ERR_INVALID_ARG && strstr(kdt_last_error(), "byte offset 1"), "hf: a truncated character at the end is refused");
    const int32_t out_of_range[] = {1, 99};
    s = kdt_tokenizer_decode(t, out_of_range, 2, &text, &len);
    kt_check(s == KDT_ERR_INVALID_ARG && text == NULL && strstr(kdt_last_error(), "id 99 at position 1"), "hf: decode refuses id 99: %s",
             kdt_last_error());
    const int32_t negative[] = {-1};
    kt_check(kdt_tokenizer_decode(t, negative, 1, &text, &len) == KDT_ERR_INVALID_ARG, "hf: decode refuses a negative id");
    test_threads(t);
    kdt_tokenizer_free(t);
}

/* base64: a YQ==, b Yg==, ab YWI=, ' ' IA==, E6 97 5pc=, A5 pQ==, FF /w== */
#define TIK_MODEL "YQ== 0\nYg== 1\nYWI= 2\nIA== 3\n5pc= 4\npQ== 5\n/w== 6\n"

static void test_tiktoken(void) {
    const char *dir = folder("tik", "tiktoken.model", TIK_MODEL, "tokenizer_config.json",
                             "{\"added_tokens_decoder\": {\"10\": {\"content\": \"[EOS]\", \"special\": true}}, "
                             "\"eos_token\": \"[EOS]\", \"pat_str\": \"\\\\S+|\\\\s+\"}");
    kdt_tokenizer *t = NULL;
    kdt_status ls = kdt_tokenizer_load(dir, &t);
    if (!kt_check(ls == KDT_OK, "tiktoken: loads%s%s", ls ? ": " : "", ls ? kdt_last_error() : "")) return;
    int32_t *ids = NULL;
    size_t n = 0;
    const int32_t want[] = {2, 3, 2, 10, 1, 0};
    kdt_status s = kdt_tokenizer_encode(t, "ab ab[EOS]ba", 12, 1, &ids, &n);
    kt_check(s == KDT_OK && ids_equal(ids, n, want, 6), "tiktoken: pieces of pat_str, special token, no BOS");
    free(ids);
    kt_check(kdt_tokenizer_vocab_size(t) == 11 && kdt_tokenizer_eos_id(t) == 10 && kdt_tokenizer_bos_id(t) == -1,
             "tiktoken: vocab size includes the special token; eos from the config, no bos");
    char *text = NULL;
    size_t len = 0;
    const int32_t hole[] = {7};
    s = kdt_tokenizer_decode(t, hole, 1, &text, &len);
    kt_check(s == KDT_ERR_INVALID_ARG && strstr(kdt_last_error(), "id 7"), "tiktoken: an id between ranks and specials is no token");
    const int32_t lossy[] = {4, 0, 6, 4, 5, 4};
    s = kdt_tokenizer_decode(t, lossy, 6, &text, &len);
    kt_check(s == KDT_OK && strcmp(text, "\xEF\xBF\xBD" "a\xEF\xBF\xBD\xE6\x97\xA5\xEF\xBF\xBD") == 0,
             "tiktoken: decode gives U+FFFD per maximal invalid subpart");
    free(text);

    kdt_detok_stream *st = NULL;
    const char *p;
    size_t pl;
    kt_check(kdt_detok_stream_create(t, &st) == KDT_OK, "stream: created");
    int ok = kdt_detok_stream_push(st, 4, &p, &pl) == KDT_OK && pl == 0;        /* E6 97: held back */
    ok &= kdt_detok_stream_push(st, 5, &p, &pl) == KDT_OK && pl == 3 && memcmp(p, "\xE6\x97\xA5", 3) == 0;
    ok &= kdt_detok_stream_push(st, 4, &p, &pl) == KDT_OK && pl == 0;
    ok &= kdt_detok_stream_push(st, 0, &p, &pl) == KDT_OK && pl == 4 && memcmp(p, "\xEF\xBF\xBD" "a", 4) == 0;
    ok &= kdt_detok_stream_push(st, 6, &p, &pl) == KDT_OK && pl == 3 && memcmp(p, "\xEF\xBF\xBD", 3) == 0;
    ok &= kdt_detok_stream_push(st, 4, &p, &pl) == KDT_OK && pl == 0;
    ok &= kdt_detok_stream_flush(st, &p, &pl) == KDT_OK && pl == 3 && memcmp(p, "\xEF\xBF\xBD", 3) == 0;
    ok &= kdt_detok_stream_flush(st, &p, &pl) == KDT_OK && pl == 0;
    kt_check(ok, "stream: holds back a split character, U+FFFD once it cannot complete, flush ends the held bytes");
    kt_check(kdt_detok_stream_push(st, 99, &p, &pl) == KDT_ERR_INVALID_ARG, "stream: refuses id 99");
    kdt_detok_stream_free(st);
    kdt_tokenizer_free(t);
}

static void test_refusals(void) {
    char missing[128];
    snprintf(missing, sizeof missing, "%s/none", root);
    refuse(missing, KDT_ERR_NOT_FOUND, "no tokenizer.json or tiktoken.model", "a folder without tokenizer files");
    refuse(folder("j1", "tokenizer.json", "{\"model\": ", NULL, NULL), KDT_ERR_INVALID_ARG, "not valid JSON", "truncated JSON");
    refuse(folder("j2", "tokenizer.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", NULL, NULL), KDT_ERR_UNSUPPORTED,
           "model.type 'Unigram'", "a Unigram model");
    refuse(folder("j3", "tokenizer.json", "{" HF_PRE ", \"model\": {" HF_VOCAB ", \"merges\": [\"a q\"]}}", NULL, NULL),
           KDT_ERR_INVALID_ARG, "model.merges[0]: 'q' is not in model.vocab", "a merge of an unknown token");
    refuse(folder("j4", "tokenizer.json", "{" HF_PRE ", \"model\": {" HF_VOCAB ", \"merges\": [7]}}", NULL, NULL),
           KDT_ERR_INVALID_ARG, "model.merges[0] is neither", "a merge that is a number");
    refuse(folder("j5", "tokenizer.json", "{\"normalizer\": {\"type\": \"NFC\"}, " HF_PRE ", \"model\": {" HF_VOCAB ", \"merges\": []}}",
                  NULL, NULL),
           KDT_ERR_UNSUPPORTED, "normalizer 'NFC'", "an NFC normalizer");
    refuse(folder("j6", "tokenizer.json",
                  "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
                  "\"behavior\": \"Removed\"}]}, \"model\": {" HF_VOCAB ", \"merges\": []}}",
                  NULL, NULL),
           KDT_ERR_UNSUPPORTED, "behavior 'Removed'", "a Split that removes");
    refuse(folder("j7", "tokenizer.json", "{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {" HF_VOCAB ", \"merges\": []}}", NULL,
                  NULL),
           KDT_ERR_UNSUPPORTED, "pre_tokenizer type 'Whitespace'", "a Whitespace pre-tokenizer");
    refuse(folder("j8", "tokenizer.json",
                  "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, "
                  "\"behavior\": \"Isolated\"}]}, \"model\": {" HF_VOCAB ", \"merges\": []}}",
                  NULL, NULL),
           KDT_ERR_INVALID_ARG, "j8/tokenizer.json: pre_tokenizer Split pattern: regex error", "a broken regex");
    refuse(folder("j9", "tokenizer.json", "{\"model\": {" HF_VOCAB ", \"merges\": []}}", NULL, NULL), KDT_ERR_UNSUPPORTED,
           "no ByteLevel step", "no byte-level pre-tokenizer");
    refuse(folder("j10", "tokenizer.json", "{" HF_PRE ", \"model\": {\"vocab\": {\"a\": \"x\"}, \"merges\": []}}", NULL, NULL),
           KDT_ERR_INVALID_ARG, "model.vocab['a'] is not a token id", "a vocabulary id that is a string");
    refuse(folder("j11", "tokenizer.json", "{" HF_PRE ", \"model\": {" HF_VOCAB ", \"merges\": []}}", "tokenizer_config.json",
                  "{\"add_bos_token\": \"yes\"}"),
           KDT_ERR_INVALID_ARG, "add_bos_token", "add_bos_token that is a string");
    refuse(folder("j12", "tokenizer.json", "{" HF_PRE ", \"model\": {" HF_VOCAB ", \"merges\": []}}", "tokenizer_config.json",
                  "{\"bos_token\": \"<nope>\"}"),
           KDT_ERR_INVALID_ARG, "bos_token '<nope>' is not a token", "a bos_token that is no token");
    refuse(folder("t1", "tiktoken.model", "YQ== 0\nY!== 1\n", "tokenizer_config.json", "{}"), KDT_ERR_INVALID_ARG,
           "rank 1 is not valid base64", "bad base64");
    refuse(folder("t2", "tiktoken.model", "YQ== 0\nYg==\n", "tokenizer_config.json", "{}"), KDT_ERR_INVALID_ARG, "line 2",
           "a line without a rank");
    refuse(folder("t3", "tiktoken.model", "YQ== 0\nYg== 0\n", "tokenizer_config.json", "{}"), KDT_ERR_INVALID_ARG, "rank 0 appears twice",
           "a rank given twice");
    refuse(folder("t4", "tiktoken.model", TIK_MODEL, NULL, NULL), KDT_ERR_NOT_FOUND, "needs tokenizer_config.json",
           "tiktoken.model alone");
    refuse(folder("t5", "tiktoken.model", TIK_MODEL, "tokenizer_config.json", "{\"pat_str\": \"[a&&b]\"}"), KDT_ERR_UNSUPPORTED,
           "t5/tokenizer_config.json: pat_str: the character class at offset 0", "an intersection other than [A&&[^B]]");
    refuse(folder("t6", "tiktoken.model", TIK_MODEL, "tokenizer_config.json", "{\"added_tokens_decoder\": {\"x\": {\"content\": \"q\"}}}"),
           KDT_ERR_INVALID_ARG, "added_tokens_decoder['x']", "a special token without an id");
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/kdt_test_tokenizer_XXXXXX");
    if (!mkdtemp(root)) {
        kt_fail("cannot make a temporary folder");
        return 1;
    }
    test_hf();
    test_tiktoken();
    test_refusals();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) kt_skip("could not remove %s", root);
    return kt_exit_code();
}
