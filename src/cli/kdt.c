/* kdt: the command-line front end (docs/interfaces.md section 3). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdt/kdtr.h"
#include "kdt/ops.h"

int kdt_cmd_generate(int argc, char **argv); /* generate.c */
int kdt_cmd_tokenize(int argc, char **argv);   /* tokenize.c */
int kdt_cmd_detokenize(int argc, char **argv); /* tokenize.c */
int kdt_cmd_serve(int argc, char **argv);    /* src/server/serve.c */

static void usage(FILE *f) {
    fprintf(f,
            "kdt " KDT_VERSION_STRING ": tree speculative decoding ops for MLA models\n"
            "\n"
            "usage:\n"
            "  kdt run OP IN.kdtr -o OUT.kdtr [--backend cpu|cuda]   run one op on IN's tensors\n"
            "  kdt info FILE.kdtr                                    list a file's tensors\n"
            "  kdt generate [--model DIR] --prompt-ids 1,2,3 --max-new N [--backend cpu|cuda]\n"
            "               [--spec none|lookup|model] [--depth D] [--topk K] [--budget N]\n"
            "                                                        greedy decoding (kdt generate --help)\n"
            "  kdt tokenize --model DIR [--file F]                   text (F or stdin) -> token ids on one line\n"
            "  kdt detokenize --model DIR                            token ids on stdin -> text\n"
            "  kdt serve [--model DIR] [--host H] [--port P] [--spec none|lookup|model] ...\n"
            "                                                        OpenAI-compatible HTTP server (kdt serve --help)\n"
            "  kdt --help                                            this text\n"
            "\n"
            "options:\n"
            "  -o, --output FILE   where `run` writes the op's outputs (nothing is written on error)\n"
            "  --backend B         cpu, or cuda; default cuda where a CUDA device is present, else cpu\n"
            "\n"
            "ops:\n");
    for (size_t i = 0; kdt_op_at(i); i++) fprintf(f, "  %-12s %s\n", kdt_op_at(i)->name, kdt_op_at(i)->summary);
    fprintf(f, "\nEach op's tensors and rules, the KDTR format and this command line: docs/interfaces.md\n");
}

/* "kdt: WHAT: message"; WHAT is left out where the message already starts with it (the op
 * validators name their op). */
static int fail(const char *what, kdt_status s) {
    const char *msg = kdt_last_error();
    const size_t n = strlen(what);
    if (strncmp(msg, what, n) == 0 && msg[n] == ':') fprintf(stderr, "kdt: %s (%s)\n", msg, kdt_status_name(s));
    else fprintf(stderr, "kdt: %s: %s (%s)\n", what, msg, kdt_status_name(s));
    return 1;
}

static int is_help(const char *a) { return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0; }

#define INFO_USAGE "usage: kdt info FILE.kdtr\n  Lists the file's tensors: name, dtype, shape.\n"
#define RUN_USAGE                                                                                   \
    "usage: kdt run OP IN.kdtr -o OUT.kdtr [--backend cpu|cuda]\n"                                  \
    "  Runs OP on IN's tensors and writes its outputs to OUT (kdt --help lists the ops). OUT must\n" \
    "  be a new path or a writable regular file (a symlink's target is replaced); it is written\n"  \
    "  whole or not at all. --backend: cuda where a CUDA device is present, else cpu.\n"

static int cmd_info(int argc, char **argv) {
    if (argc >= 1 && is_help(argv[0])) {
        printf(INFO_USAGE);
        return 0;
    }
    if (argc != 1) {
        fprintf(stderr, "kdt: info takes one file\n" INFO_USAGE);
        return 2;
    }
    kdt_kdtr *r = NULL;
    kdt_status s = kdt_kdtr_open_file(argv[0], &r);
    if (s != KDT_OK) return fail(argv[0], s);
    printf("%s: %u tensors\n", argv[0], kdt_kdtr_count(r));
    for (uint32_t i = 0; i < kdt_kdtr_count(r); i++) {
        kdt_tensor_view v;
        if ((s = kdt_kdtr_get(r, i, &v)) != KDT_OK) {
            kdt_kdtr_close(r);
            return fail(argv[0], s);
        }
        char shape[256];
        int n = snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < v.ndim && n < (int)sizeof shape; d++)
            n += snprintf(shape + n, sizeof shape - n, "%s%llu", d ? ", " : "", (unsigned long long)v.dims[d]);
        if (n < (int)sizeof shape) snprintf(shape + n, sizeof shape - n, "]");
        printf("  %-32s %-5s %s\n", v.name, kdt_dtype_name(v.dtype), shape);
    }
    kdt_kdtr_close(r);
    return 0;
}

static int parse_backend(const char *s, kdt_backend *out) {
    if (strcmp(s, "cpu") == 0) *out = KDT_BACKEND_CPU;
    else if (strcmp(s, "cuda") == 0) *out = KDT_BACKEND_CUDA;
    else return -1;
    return 0;
}

static int cmd_run(int argc, char **argv) {
    const char *op = NULL, *in_path = NULL, *out_path = NULL;
    kdt_backend backend = KDT_BACKEND_CPU;
    int backend_given = 0;
    for (int i = 0; i < argc; i++) {
        if (is_help(argv[i])) {
            printf(RUN_USAGE);
            return 0;
        }
        if (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0) {
            if (++i == argc) { fprintf(stderr, "kdt: %s needs a file\n", argv[i - 1]); return 2; }
            out_path = argv[i];
        } else if (strcmp(argv[i], "--backend") == 0) {
            if (++i == argc || parse_backend(argv[i], &backend) != 0) {
                fprintf(stderr, "kdt: --backend takes cpu or cuda\n");
                return 2;
            }
            backend_given = 1;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "kdt: unknown option '%s' (see kdt --help)\n", argv[i]);
            return 2;
        } else if (!op) op = argv[i];
        else if (!in_path) in_path = argv[i];
        else { fprintf(stderr, "kdt: unexpected argument '%s'\n", argv[i]); return 2; }
    }
    if (!op || !in_path || !out_path) {
        fprintf(stderr, "kdt: run needs OP, IN and -o OUT\n" RUN_USAGE);
        return 2;
    }
    if (!kdt_op_find(op)) {
        fprintf(stderr, "kdt: unknown op '%s' (ops: ", op);
        for (size_t i = 0; kdt_op_at(i); i++) fprintf(stderr, "%s%s", i ? ", " : "", kdt_op_at(i)->name);
        fprintf(stderr, ")\n");
        return 2;
    }
    if (!backend_given && kdt_cuda_available()) backend = KDT_BACKEND_CUDA; /* asked only now: it starts CUDA */
    if (backend == KDT_BACKEND_CUDA && !kdt_cuda_available()) {
        fprintf(stderr, "kdt: --backend cuda: no CUDA device is available to this build\n");
        return 1;
    }
    kdt_kdtr *in = NULL;
    kdt_kdtr_writer *out = NULL;
    kdt_status s = kdt_kdtr_open_file(in_path, &in);
    if (s != KDT_OK) return fail(in_path, s);
    int rc = 0;
    if ((s = kdt_kdtr_writer_create(&out)) != KDT_OK) rc = fail("output", s);
    else if ((s = kdt_op_run(op, in, out, backend)) != KDT_OK) rc = fail(op, s);
    else if ((s = kdt_kdtr_writer_save(out, out_path)) != KDT_OK) rc = fail(out_path, s);
    kdt_kdtr_writer_free(out);
    kdt_kdtr_close(in);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("kdt %s (%s backend built)\n", KDT_VERSION_STRING, KDT_HAVE_CUDA ? "cpu + cuda" : "cpu");
        return 0;
    }
    if (strcmp(argv[1], "info") == 0) return cmd_info(argc - 2, argv + 2);
    if (strcmp(argv[1], "run") == 0) return cmd_run(argc - 2, argv + 2);
    if (strcmp(argv[1], "generate") == 0) return kdt_cmd_generate(argc - 2, argv + 2);
    if (strcmp(argv[1], "tokenize") == 0) return kdt_cmd_tokenize(argc - 2, argv + 2);
    if (strcmp(argv[1], "detokenize") == 0) return kdt_cmd_detokenize(argc - 2, argv + 2);
    if (strcmp(argv[1], "serve") == 0) return kdt_cmd_serve(argc - 2, argv + 2);
    fprintf(stderr, "kdt: unknown command '%s' (see kdt --help)\n", argv[1]);
    return 2;
}
