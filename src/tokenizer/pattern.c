/* Split patterns: the `regex` crate's (tiktoken) and Oniguruma's (tokenizers) syntax translated
 * into PCRE2's, then compiled once (UTF + UCP, JIT where available). Two differences matter for
 * the patterns these models ship (docs/tokenizer.md):
 * - \s: with UCP, PCRE2 also matches U+180E MONGOLIAN VOWEL SEPARATOR, which is not White_Space
 *   in Unicode 6.3 and later, as both libraries know it; \s and \S are spelled out as the
 *   White_Space set.
 * - script names: both read \p{Han} as the Script property; PCRE2 (10.40 on) reads Script_Extensions,
 *   where U+3002 IDEOGRAPHIC FULL STOP is Han too. A name longer than two letters (not a general
 *   category; "Any" aside) becomes \p{sc:NAME}.
 * - class intersection [A&&[^B]] (Kimi K2's pattern): PCRE2 has none and would read "&&" as two
 *   '&'; it becomes (?:(?![B])[A]), one character in A and not in B, which is what it means. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/internal.h"

/* Unicode's White_Space property, as a class body. */
static const char WS[] = "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

typedef struct out {
    char *p;
    size_t n;
} out;

static void put(out *o, const char *s, size_t n) {
    memcpy(o->p + o->n, s, n);
    o->n += n;
}

static void puts_(out *o, const char *s) { put(o, s, strlen(s)); }

/* Copies one escape at in[*i] ('\\'); in_class says where it stands. -1 when \S stands in a
 * class (no class body can say "not White_Space" next to other items). */
static int escape(const char *in, size_t n, size_t *i, out *o, int in_class) {
    const char c = *i + 1 < n ? in[*i + 1] : 0;
    if (c == 's') {
        if (!in_class) puts_(o, "[");
        puts_(o, WS);
        if (!in_class) puts_(o, "]");
        *i += 2;
        return 0;
    }
    if (c == 'S') {
        if (in_class) return -1;
        puts_(o, "[^"), puts_(o, WS), puts_(o, "]");
        *i += 2;
        return 0;
    }
    size_t k = *i + 2;
    if ((c == 'p' || c == 'P' || c == 'x') && k < n && in[k] == '{') { /* \p{...}, \x{...} whole */
        const char *e = memchr(in + k, '}', n - k);
        k = e ? (size_t)(e - in) + 1 : n;
        const size_t name = *i + 3, len = k - 1 - name;
        if (c != 'x' && e && len > 2 && !memchr(in + name, ':', len) && !memchr(in + name, '=', len) &&
            !(len == 3 && strncmp(in + name, "Any", 3) == 0)) {
            put(o, in + *i, 3), puts_(o, "sc:"), put(o, in + name, len + 1);
            *i = k;
            return 0;
        }
    }
    if (k > n) k = n;
    put(o, in + *i, k - *i);
    *i = k;
    return 0;
}

/* A class body from in[*i] up to (not including) its ']' or an "&&"; returns 0, or -1 on a
 * construct this translation does not know (a nested class, \S inside). */
static int class_body(const char *in, size_t n, size_t *i, out *o) {
    if (*i < n && in[*i] == '^') put(o, "^", 1), (*i)++;
    if (*i < n && in[*i] == ']') put(o, "\\]", 2), (*i)++; /* a leading ']' is a literal */
    while (*i < n && in[*i] != ']') {
        if (in[*i] == '&' && *i + 1 < n && in[*i + 1] == '&') return 0;
        if (in[*i] == '[') return -1;
        if (in[*i] == '\\') {
            if (escape(in, n, i, o, 1)) return -1;
        } else put(o, in + (*i)++, 1);
    }
    return 0;
}

static kdt_status translate(const char *in, char **res, const char *where) {
    const size_t n = strlen(in);
    out o = {malloc(n * (sizeof WS + 8) + 16), 0};
    char *tmp = malloc(n * (sizeof WS + 8) + 16);
    if (!o.p || !tmp) {
        free(o.p), free(tmp);
        return kdt_fail(KDT_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t i = 0;
    while (i < n) {
        if (in[i] == '\\') {
            escape(in, n, &i, &o, 0);
            continue;
        }
        if (in[i] != '[') {
            put(&o, in + i++, 1);
            continue;
        }
        const size_t at = i++;
        out a = {tmp, 0};
        if (class_body(in, n, &i, &a)) goto bad;
        if (i >= n) goto bad;
        if (in[i] == ']') { /* a plain class */
            put(&o, "[", 1), put(&o, a.p, a.n), put(&o, "]", 1);
            i++;
            continue;
        }
        /* [A&&[^B]] */
        if (a.n == 0 || a.p[0] == '^' || strncmp(in + i, "&&[^", 4) != 0) goto bad;
        i += 4;
        out b = {tmp + a.n, 0};
        if (class_body(in, n, &i, &b) || i + 1 >= n || in[i] != ']' || in[i + 1] != ']' || b.n == 0) goto bad;
        i += 2;
        puts_(&o, "(?:(?![");
        put(&o, b.p, b.n);
        puts_(&o, "])[");
        put(&o, a.p, a.n);
        puts_(&o, "])");
        continue;
    bad:
        free(o.p), free(tmp);
        return kdt_fail(KDT_ERR_UNSUPPORTED,
                        "%s: the character class at offset %zu is not supported (nested classes other than [A&&[^B]], or \\S in a class)",
                        where, at);
    }
    o.p[o.n] = 0;
    free(tmp);
    *res = o.p;
    return KDT_OK;
}

kdt_status tok_compile(kdt_tokenizer *t, const char *pattern, int literal, const char *where) {
    if (t->n_split == TOK_MAX_SPLITS) return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: more than %d splits", where, TOK_MAX_SPLITS);
    char *pcre = NULL;
    kdt_status s = literal ? KDT_OK : translate(pattern, &pcre, where);
    if (s != KDT_OK) return s;
    int err;
    PCRE2_SIZE off;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)(literal ? pattern : pcre), PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &err, &off, NULL);
    free(pcre);
    if (!c) {
        char msg[160];
        pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: regex error: %s (offset %zu of the PCRE2 form)", where, msg, (size_t)off);
    }
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE); /* where JIT is unavailable, the interpreter runs */
    t->split[t->n_split++] = c;
    return KDT_OK;
}
