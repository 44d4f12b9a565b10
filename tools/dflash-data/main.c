/* dflash-data: builds, checks and shows dflash dataset files.
 * build: JSONL {"input_ids": [...], "loss_mask": [...]} -> dataset; synth: structured random data. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/dataset.h"
#include "common/decimal.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/jsonutil.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: dflash-data build -o OUT [-v VOCAB] [--end-line] [INPUT.jsonl ...]   (no input or '-' = stdin)\n"
        "       dflash-data synth -o OUT [-n SAMPLES] [-v VOCAB] [--min-len N] [--max-len N] [--seed S]\n"
        "                         (defaults: 1000 samples, vocab 1024, lengths 16-256, seed 1)\n"
        "       dflash-data info [--json] FILE\n"
        "       dflash-data verify FILE\n"
        "       dflash-data dump [-n N] FILE          (the first N samples, default all, as JSONL)\n"
        "build reads one JSON object per line: input_ids (token ids) and loss_mask (0/1, same\n"
        "length) or Hugging Face style labels (-100 = not learned, else the token itself); neither =\n"
        "every token learned. Other keys are ignored. VOCAB defaults to the largest id + 1.\n"
        "--end-line: the input's last line is {\"end\": N}, N the number of records before it; an\n"
        "input that ends without it (its writer stopped part way) writes nothing.\n");
}

/* The temp file of the build in progress, where it has a name (a file system without O_TMPFILE):
 * an interrupted build (of many GB perhaps) must not leave it beside the output. The handlers
 * read only this copy (async-signal-safe). */
static char temp_path[1024];
static volatile sig_atomic_t have_temp;

static void on_stop_signal(int sig)
{
    if (have_temp)
        unlink(temp_path);
    raise(sig);     /* SA_RESETHAND: the default action, once this handler returns */
}

static const int stop_signals[] = { SIGINT, SIGTERM, SIGHUP };

/* One ignored when we started (nohup, a background job of a script) stays ignored. */
static void catch_stop_signals(void)
{
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++) {
        struct sigaction sa = { .sa_handler = on_stop_signal, .sa_flags = SA_RESETHAND }, old;
        sigemptyset(&sa.sa_mask);
        if (sigaction(stop_signals[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(stop_signals[i], &sa, NULL);
    }
}

/* The stop signals held off (their handlers see the temp path as it was), the mask before in *old. */
static void hold_stop_signals(sigset_t *old)
{
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
        sigaddset(&set, stop_signals[i]);
    sigprocmask(SIG_BLOCK, &set, old);
}

/* dataset_writer_open with its temp path noted for the handlers, no signal in between. */
static int writer_open(struct dataset_writer **w, const char *out, uint32_t vocab, char *err, size_t errlen)
{
    sigset_t old;
    hold_stop_signals(&old);
    int r = dataset_writer_open(w, out, vocab, err, errlen);
    if (r == 0) {
        snprintf(temp_path, sizeof temp_path, "%s", dataset_writer_temp_path(*w));
        have_temp = temp_path[0] != 0;     /* (none: the temp has no name until it is renamed) */
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    return r;
}

/* dataset_writer_finish, its commit with the stop signals held off: the name it gives the temp
 * just before the rename (O_TMPFILE) is not in the handlers' copy, and must not be left by a
 * stop in between. The flush (the long part: the mask copied in, the fsync) is not held up. */
static int writer_finish(struct dataset_writer *w, char *err, size_t errlen)
{
    int r = dataset_writer_flush(w, err, errlen);
    if (r < 0)
        return r;
    sigset_t old;
    hold_stop_signals(&old);
    r = dataset_writer_commit(w, err, errlen);
    if (r == 0)
        have_temp = 0;      /* (renamed into place: a stop now leaves the new output) */
    sigprocmask(SIG_SETMASK, &old, NULL);
    return r;
}

/* After dataset_writer_finish renamed the temp into place, or to drop it (NULL is fine). A signal
 * between the two lines unlinks a name already gone. */
static void writer_free(struct dataset_writer *w)
{
    dataset_writer_free(w);
    have_temp = 0;
}

#define MAX_SAMPLE_LEN (1u << 24)     /* synth's --min-len and --max-len */

struct buf { uint32_t *tok; uint8_t *mask; size_t cap; };

static int grow(struct buf *b, size_t n)
{
    if (n <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < n)
        cap *= 2;
    uint32_t *t = realloc(b->tok, cap * 4);
    if (!t)
        return -ENOMEM;
    b->tok = t;
    uint8_t *m = realloc(b->mask, cap);
    if (!m)
        return -ENOMEM;
    b->mask = m;
    b->cap = cap;
    return 0;
}

/* cJSON's allocations, watched: a parse that fails for want of memory (a huge line: one object
 * holding a whole dataset, as pandas' to_json writes it) is told as that, not as bad JSON. */
static int g_json_oom;

static void *json_malloc(size_t n)
{
    void *p = malloc(n);
    if (!p)
        g_json_oom = 1;
    return p;
}

/* One JSONL line into b; returns token count or -1 with the reason in why. With end_n (--end-line),
 * an {"end": N} line returns -2 and N in *end_n. */
static long parse_line(const char *line, struct buf *b, uint64_t *end_n, char *why, size_t whylen)
{
    /* An object or nothing: a JSON array file (one line holding every record) is refused before
     * a tree many times its size is built of it. */
    const char *p = line;
    if (!strncmp(p, "\xef\xbb\xbf", 3))
        p += 3;                             /* a BOM, as cJSON skips it */
    while (*p && (unsigned char)*p <= ' ')  /* cJSON's blanks */
        p++;
    char first = *p;
    if (first != '{') {
        snprintf(why, whylen, "%s: one object per line is read (JSON Lines)%s", first == '[' ? "a JSON array, not "
                 "an object" : "not a JSON object", first == '[' ? "; a file of one array: jq -c '.[]' makes it one" : "");
        return -1;
    }
    const char *end = NULL;
    g_json_oom = 0;
    cJSON *j = cJSON_ParseWithOpts(line, &end, 0);
    long n = -1;
    if (!j) {
        if (g_json_oom)
            snprintf(why, whylen, "out of memory reading a line of %zu bytes (one object per sample is read: JSON "
                     "Lines)", strlen(line));
        else
            snprintf(why, whylen, "not valid JSON");
        return -1;
    }
    end += strspn(end, " \t\r\n");
    if (*end) {
        snprintf(why, whylen, "more after the JSON object (one object per line)");
        goto out;
    }
    if (!cJSON_IsObject(j)) {
        snprintf(why, whylen, "not a JSON object");
        goto out;
    }
    char dup[64];
    if (json_duplicate_key(j, dup, sizeof dup)) {
        snprintf(why, whylen, "%s: appears twice (JSON readers differ on which one counts)", dup);
        goto out;
    }
    const cJSON *endj = end_n ? cJSON_GetObjectItemCaseSensitive(j, "end") : NULL;
    if (endj) {
        double v = cJSON_IsNumber(endj) ? endj->valuedouble : -1;
        if (cJSON_GetArraySize(j) != 1 || v < 0 || v >= 18446744073709551616.0 || v != (double)(uint64_t)v) {
            snprintf(why, whylen, "end line: not {\"end\": N}, N the number of records before it");
            goto out;
        }
        *end_n = (uint64_t)v;
        n = -2;
        goto out;
    }
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "input_ids");
    const cJSON *mask = cJSON_GetObjectItemCaseSensitive(j, "loss_mask");
    if (!cJSON_IsArray(ids)) {
        snprintf(why, whylen, "input_ids: missing or not an array");
        goto out;
    }
    int cnt = cJSON_GetArraySize(ids);
    if (cnt == 0) {
        snprintf(why, whylen, "input_ids: empty");
        goto out;
    }
    if (mask && (!cJSON_IsArray(mask) || cJSON_GetArraySize(mask) != cnt)) {
        snprintf(why, whylen, "loss_mask: not an array of the same length as input_ids (%d)", cnt);
        goto out;
    }
    const cJSON *labels = cJSON_GetObjectItemCaseSensitive(j, "labels");
    if (labels && mask) {
        snprintf(why, whylen, "both loss_mask and labels: give one");
        goto out;
    }
    if (labels && (!cJSON_IsArray(labels) || cJSON_GetArraySize(labels) != cnt)) {
        snprintf(why, whylen, "labels: not an array of the same length as input_ids (%d)", cnt);
        goto out;
    }
    /* A per-token mask under another name (assistant_masks, as a chat template writes it; a typo),
     * a list of 0/1 as long as input_ids, is not read: without loss_mask or labels the sample
     * would be learned whole, prompts included, without a word. An attention_mask says which
     * tokens are padding: a 0 before the last 1 (left padding, a hole) would be taken as context;
     * trailing 0s (right padding) are harmless where the loss there is 0; values past 1 pack
     * several sequences into one line, which would attend across each other. */
    const cJSON *k;
    cJSON_ArrayForEach(k, j) {
        if (!cJSON_IsArray(k) || cJSON_GetArraySize(k) != cnt)
            continue;
        if (!strcmp(k->string, "attention_mask")) {
            int at = 0, last_one = -1, first_zero = -1;
            const cJSON *v;
            cJSON_ArrayForEach(v, k) {
                double x = cJSON_IsNumber(v) ? v->valuedouble : cJSON_IsBool(v) ? cJSON_IsTrue(v) : -1;
                if (x != 0 && x != 1) {
                    snprintf(why, whylen, "attention_mask[%d]: %s: one sequence per line is read (packed sequences "
                             "would attend across each other)", at, x > 1 ? "past 1" : "not 0 or 1");
                    goto out;
                }
                if (x == 1)
                    last_one = at;
                else if (first_zero < 0)
                    first_zero = at;
                at++;
            }
            if (first_zero >= 0 && first_zero < last_one) {
                snprintf(why, whylen, "attention_mask[%d]: 0 before a 1: padding (or a hole) would be read as context: "
                         "strip the pad tokens", first_zero);
                goto out;
            }
            if (first_zero >= 0 && !mask && !labels) {
                snprintf(why, whylen, "attention_mask[%d]: 0: the padding from there would be learned (no loss_mask or "
                         "labels): strip the pad tokens, or give one", first_zero);
                goto out;
            }
            continue;
        }
        if (mask || labels || !strcmp(k->string, "input_ids") || !(strcasestr(k->string, "mask") ||
                                                                  strcasestr(k->string, "label")))
            continue;
        bool flags = true;
        const cJSON *v;
        cJSON_ArrayForEach(v, k)
            flags = flags && ((cJSON_IsNumber(v) && (v->valuedouble == 0 || v->valuedouble == 1)) || cJSON_IsBool(v));
        if (flags) {
            snprintf(why, whylen, "%.64s: not read (the loss is taken where loss_mask is 1, or labels is not -100; "
                     "without either, on every token): name it loss_mask, or drop it", k->string);
            goto out;
        }
    }
    if (grow(b, (size_t)cnt) < 0) {
        snprintf(why, whylen, "out of memory");
        goto out;
    }
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ids) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (v < 0 || v > 4294967295.0 || v != (double)(uint32_t)v) {
            snprintf(why, whylen, "input_ids[%d]: not a token id", i);
            goto out;
        }
        b->tok[i++] = (uint32_t)v;
    }
    i = 0;
    if (mask) {
        cJSON_ArrayForEach(e, mask) {
            double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
            if (v != 0 && v != 1) {
                snprintf(why, whylen, "loss_mask[%d]: not 0 or 1", i);
                goto out;
            }
            b->mask[i++] = (uint8_t)v;
        }
    } else if (labels) {
        /* Hugging Face style: -100 where no loss is taken, else the position's own token (the
         * model shifts them). Shifted labels would train the wrong positions: refused. */
        cJSON_ArrayForEach(e, labels) {
            if (!cJSON_IsNumber(e)) {
                snprintf(why, whylen, "labels[%d]: not a number", i);
                goto out;
            }
            double v = e->valuedouble;
            if (v != -100 && v != (double)b->tok[i]) {
                snprintf(why, whylen, "labels[%d]: %g is neither -100 nor input_ids[%d] (%u): shifted labels? give "
                         "loss_mask instead", i, v, i, b->tok[i]);
                goto out;
            }
            b->mask[i++] = v != -100;
        }
    } else {
        memset(b->mask, 1, (size_t)cnt);
    }
    n = cnt;
out:
    cJSON_Delete(j);
    return n;
}

static int cmd_build(const char *out, uint32_t vocab, int end_line, char **inputs, int n_inputs)
{
    char err[512];
    struct dataset_writer *w;
    if (writer_open(&w, out, vocab, err, sizeof err) < 0) {
        fprintf(stderr, "dflash-data: %s\n", err);
        return 1;
    }
    static char *stdin_name[] = { "-" };
    if (n_inputs == 0) {
        inputs = stdin_name;
        n_inputs = 1;
    }
    for (int f = 0; f < n_inputs; f++) {   /* before a byte is read: the output replaces no input */
        struct stat st;
        bool std = !strcmp(inputs[f], "-");
        if (!std && stat(inputs[f], &st) < 0) {    /* (not after hours on the inputs before it) */
            fprintf(stderr, "dflash-data: %s: cannot open: %s: nothing written\n", inputs[f], strerror(errno));
            dataset_writer_free(w);
            return 1;
        }
        if ((std ? fstat(0, &st) : 0) == 0 && dataset_writer_is_output(w, &st)) {
            fprintf(stderr, "dflash-data: %s: is the output (-o %s) too: refused, nothing written\n",
                    std ? "<stdin>" : inputs[f], out);
            dataset_writer_free(w);
            return 1;
        }
    }
    struct buf b = { 0 };
    char *line = NULL;
    size_t cap = 0;
    int rc = 1, ended = 0;
    const char *name = "<stdin>";
    for (int f = 0; f < n_inputs; f++) {
        name = strcmp(inputs[f], "-") ? inputs[f] : "<stdin>";
        FILE *in = strcmp(inputs[f], "-") ? fopen(inputs[f], "r") : stdin;
        if (!in) {
            fprintf(stderr, "dflash-data: %s: cannot open: %s\n", name, strerror(errno));
            goto done;
        }
        long lineno = 0;
        ssize_t len;
        while ((len = getline(&line, &cap, in)) >= 0) {
            lineno++;
            if (strspn(line, " \t\r\n") == (size_t)len)
                continue;
            char why[256];
            uint64_t end_n = 0;
            long n = -1;
            /* the parser reads a C string: a record after a NUL (a damaged file) would go unseen */
            const char *nul = memchr(line, 0, (size_t)len);
            const char *packed = lineno == 1 ? fileio_compressed(line, (size_t)len) : NULL;
            if (packed)
                snprintf(why, sizeof why, "%s-compressed, not JSON Lines: decompress it on the way in "
                         "(e.g. %s -dc FILE | dflash-data build -o OUT -)", packed, packed);
            else if (ended)
                snprintf(why, sizeof why, "a line after the end line (--end-line)");
            else if (nul)
                snprintf(why, sizeof why, "a NUL byte at column %zu: not a JSON line", (size_t)(nul - line) + 1);
            else
                n = parse_line(line, &b, end_line ? &end_n : NULL, why, sizeof why);
            if (n == -2) {      /* the end line */
                if (end_n == dataset_writer_samples(w)) {
                    ended = 1;
                    continue;
                }
                snprintf(why, sizeof why, "the end line counts %llu records, %llu came before it: nothing written",
                         (unsigned long long)end_n, (unsigned long long)dataset_writer_samples(w));
                n = -1;
            }
            if (n < 0) {
                fprintf(stderr, "dflash-data: %s:%ld: %s\n", name, lineno, why);
                if (in != stdin)
                    fclose(in);
                goto done;
            }
            int r = dataset_writer_add(w, b.tok, b.mask, (uint32_t)n, err, sizeof err);
            if (r == -DF_ERANGE || r == -DF_EFORMAT) {      /* the record's fault: named by its line */
                size_t skip = strncmp(err, out, strlen(out)) ? 0 : strlen(out) + 2;  /* "<out>: " */
                fprintf(stderr, "dflash-data: %s:%ld: %s\n", name, lineno, err + (skip < strlen(err) ? skip : 0));
                if (in != stdin)
                    fclose(in);
                goto done;
            }
            if (r < 0) {    /* the output's (a full disk, an I/O error, memory): named by its path */
                fprintf(stderr, "dflash-data: %s (at %s:%ld): nothing written\n", err, name, lineno);
                if (in != stdin)
                    fclose(in);
                goto done;
            }
        }
        if (ferror(in)) {       /* not the end of the input: a partial dataset must not replace the output */
            fprintf(stderr, "dflash-data: %s:%ld: read error: %s\n", name, lineno + 1, strerror(errno));
            if (in != stdin)
                fclose(in);
            goto done;
        }
        if (in != stdin)
            fclose(in);
    }
    /* A clean end of the input is all a killed writer leaves (a pipe closes the same way): only
     * its end line says the input is whole. */
    if (end_line && !ended) {
        fprintf(stderr, "dflash-data: %s: the input ended without its end line {\"end\": N} (--end-line): "
                "incomplete, nothing written\n", name);
        goto done;
    }
    if (!dataset_writer_samples(w)) {
        fprintf(stderr, "dflash-data: %s%s: no record (empty, or blank lines only): nothing written\n", name,
                n_inputs > 1 ? " and the inputs before it" : "");
        goto done;
    }
    /* Such a file would train nothing, step after step (a mask inverted or every label -100). */
    if (dataset_writer_samples(w) && !dataset_writer_masked_tokens(w)) {
        fprintf(stderr, "dflash-data: %s: no token is in the loss (every loss_mask 0 or label -100): nothing to "
                "learn, nothing written\n", out);
        goto done;
    }
    if (dataset_writer_samples(w) && !dataset_writer_anchor_pairs(w)) {
        fprintf(stderr, "dflash-data: %s: no sample has two tokens in the loss in a row (a block's anchor and its "
                "first label): nothing to learn, nothing written\n", out);
        goto done;
    }
    if (writer_finish(w, err, sizeof err) < 0) {
        fprintf(stderr, "dflash-data: %s\n", err);
        goto done;
    }
    printf("%s: %llu samples\n", out, (unsigned long long)dataset_writer_samples(w));
    rc = 0;
done:
    writer_free(w);
    free(line);
    free(b.tok);
    free(b.mask);
    return rc;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Structured synthetic samples: a "prompt" of random tokens (mask 0) then an "answer"
 * that follows a fixed per-token successor table with a little noise (mask 1), so a
 * drafter has something learnable. */
static int cmd_synth(const char *out, uint64_t n, uint32_t vocab, uint32_t min_len, uint32_t max_len, uint64_t seed)
{
    char err[512];
    if (vocab < 4 || min_len < 3 || max_len < min_len) {
        /* (3: a token of prompt, then two in the loss, a block's anchor and its first label) */
        fprintf(stderr, "dflash-data: synth: need vocab >= 4 and 3 <= min-len <= max-len\n");
        return 1;
    }
    struct dataset_writer *w;
    if (writer_open(&w, out, vocab, err, sizeof err) < 0) {
        fprintf(stderr, "dflash-data: %s\n", err);
        return 1;
    }
    uint32_t *succ = malloc(vocab * 4ull), *tok = malloc(max_len * 4ull);
    uint8_t *mask = malloc(max_len);
    int rc = 1;
    if (!succ || !tok || !mask) {
        fprintf(stderr, "dflash-data: synth: out of memory for a vocabulary of %u and sequences of up to %u tokens\n",
                vocab, max_len);
        goto done;
    }
    uint64_t s = seed;
    for (uint32_t v = 0; v < vocab; v++)
        succ[v] = (uint32_t)(rng_next(&s) % vocab);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t len = min_len + (uint32_t)(rng_next(&s) % (max_len - min_len + 1));
        uint32_t prompt = 1 + (uint32_t)(rng_next(&s) % (len / 3 + 1));
        if (prompt > len - 2)
            prompt = len - 2;   /* two tokens in the loss at least: something to learn in every sample */
        for (uint32_t t = 0; t < len; t++) {
            if (t < prompt || rng_next(&s) % 16 == 0)
                tok[t] = (uint32_t)(rng_next(&s) % vocab);
            else
                tok[t] = succ[tok[t - 1]];
            mask[t] = t >= prompt;
        }
        if (dataset_writer_add(w, tok, mask, len, err, sizeof err) < 0) {
            fprintf(stderr, "dflash-data: %s\n", err);
            goto done;
        }
    }
    if (writer_finish(w, err, sizeof err) < 0) {
        fprintf(stderr, "dflash-data: %s\n", err);
        goto done;
    }
    printf("%s: %llu samples\n", out, (unsigned long long)n);
    rc = 0;
done:
    writer_free(w);
    free(succ);
    free(tok);
    free(mask);
    return rc;
}

static int open_or_report(struct dataset *ds, const char *path)
{
    char err[512];
    if (dataset_open(ds, path, 0, err, sizeof err) < 0) {
        fprintf(stderr, "dflash-data: %s\n", err);
        return -1;
    }
    return 0;
}

/* s as a JSON string: a path may hold '"', '\\' or control characters. */
static void put_json_string(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

static int cmd_info(const char *path, int json)
{
    struct dataset ds;
    if (open_or_report(&ds, path) < 0)
        return 1;
    const struct dataset_header *h = ds.hdr;
    if (json) {
        fputs("{\"path\":", stdout);
        put_json_string(path);
        printf(",\"samples\":%llu,\"tokens\":%llu,\"masked_tokens\":%llu,\"vocab_size\":%u,\"max_len\":%u,"
               "\"checksum\":\"%016llx\"}\n", (unsigned long long)h->n_samples, (unsigned long long)h->n_tokens,
               (unsigned long long)h->masked_tokens, h->vocab_size, h->max_len, (unsigned long long)h->checksum);
    } else
        printf("%s: %llu samples, %llu tokens (%llu in the loss), vocab %u, longest %u, mean %.1f, checksum %016llx\n",
               path, (unsigned long long)h->n_samples, (unsigned long long)h->n_tokens,
               (unsigned long long)h->masked_tokens, h->vocab_size, h->max_len,
               (double)h->n_tokens / (double)h->n_samples, (unsigned long long)h->checksum);
    dataset_close(&ds);
    return 0;
}

static int cmd_dump(const char *path, uint64_t n)
{
    struct dataset ds;
    if (open_or_report(&ds, path) < 0)
        return 1;
    for (uint64_t i = 0; i < ds.n_samples && i < n; i++) {
        uint32_t len = dataset_sample_len(&ds, i);
        const uint32_t *t = dataset_sample_tokens(&ds, i);
        const uint8_t *m = dataset_sample_mask(&ds, i);
        fputs("{\"input_ids\":[", stdout);
        for (uint32_t k = 0; k < len; k++)
            printf(k ? ",%u" : "%u", t[k]);
        fputs("],\"loss_mask\":[", stdout);
        for (uint32_t k = 0; k < len; k++)
            printf(k ? ",%u" : "%u", m[k]);
        fputs("]}\n", stdout);
    }
    dataset_close(&ds);
    return 0;
}

int main(int argc, char **argv)
{
    cJSON_InitHooks(&(cJSON_Hooks){ .malloc_fn = json_malloc, .free_fn = free });
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "dflash-data: a command is needed: build, synth, info, verify or dump (try -h)\n");
        return 64;
    }
    const char *cmd = argv[1];
    const char *out = NULL;
    uint64_t vocab = 0, n = 0, min_len = 16, max_len = 256, seed = 1;
    int json = 0, have_n = 0, end_line = 0;
    static const struct option opts[] = {
        { "min-len", required_argument, 0, 1 }, { "max-len", required_argument, 0, 2 },
        { "seed", required_argument, 0, 3 }, { "json", no_argument, 0, 4 }, { "end-line", no_argument, 0, 5 },
        { 0, 0, 0, 0 },
    };
    optind = 2;
    opterr = 0;     /* one line of ours instead of getopt's and the usage */
    /* the options each command takes (bits of `given`): one given to another is refused, not
     * silently ignored (`build --seed 3` shuffles nothing) */
    enum { O_OUT = 1, O_VOCAB = 2, O_N = 4, O_MIN = 8, O_MAX = 16, O_SEED = 32, O_JSON = 64, O_END = 128 };
    static const char *const opt_names[] = { "-o", "-v", "-n", "--min-len", "--max-len", "--seed", "--json",
                                             "--end-line" };
    unsigned given = 0;
    int c;
    while ((c = getopt_long(argc, argv, "o:v:n:h", opts, NULL)) != -1) {
        uint64_t *dst = NULL;
        switch (c) {
        case 'o': out = optarg; given |= O_OUT; break;
        case 'v': dst = &vocab; given |= O_VOCAB; break;
        case 'n': dst = &n; have_n = 1; given |= O_N; break;
        case 1: dst = &min_len; given |= O_MIN; break;
        case 2: dst = &max_len; given |= O_MAX; break;
        case 3: dst = &seed; given |= O_SEED; break;
        case 4: json = 1; given |= O_JSON; break;
        case 5: end_line = 1; given |= O_END; break;
        case 'h': usage(stdout); return 0;
        default:
            if (optopt >= 1 && optopt <= 3)     /* a long option's val: --min-len, --max-len, --seed */
                fprintf(stderr, "dflash-data: %s: %s needs a value (try -h)\n", cmd, argv[optind - 1]);
            else if (optopt && strchr("ovn", optopt))
                fprintf(stderr, "dflash-data: %s: -%c needs a value (try -h)\n", cmd, optopt);
            else
                fprintf(stderr, "dflash-data: %s: unknown option '%s' (try -h)\n", cmd, argv[optind - 1]);
            return 64;
        }
        if (dst && !decimal_parse(optarg, dst)) {
            fprintf(stderr, "dflash-data: -%c: not a number: '%s'\n", c < 32 ? '-' : c, optarg);
            return 64;
        }
    }
    unsigned takes = !strcmp(cmd, "build") ? O_OUT | O_VOCAB | O_END
                   : !strcmp(cmd, "synth") ? O_OUT | O_VOCAB | O_N | O_MIN | O_MAX | O_SEED
                   : !strcmp(cmd, "info") ? O_JSON : !strcmp(cmd, "dump") ? O_N : !strcmp(cmd, "verify") ? 0 : ~0u;
    for (unsigned k = 0; k < sizeof opt_names / sizeof opt_names[0]; k++)
        if (given & ~takes & (1u << k)) {
            fprintf(stderr, "dflash-data: %s: %s is not an option of %s (try -h)\n", cmd, opt_names[k], cmd);
            return 64;
        }
    if (vocab > DATASET_MAX_VOCAB) {
        fprintf(stderr, "dflash-data: -v: %llu is above the largest vocabulary, %u\n", (unsigned long long)vocab,
                DATASET_MAX_VOCAB);
        return 64;
    }
    if (min_len > MAX_SAMPLE_LEN || max_len > MAX_SAMPLE_LEN) {
        int is_min = min_len > MAX_SAMPLE_LEN;
        fprintf(stderr, "dflash-data: --%s-len: %llu is above the limit, %u\n", is_min ? "min" : "max",
                (unsigned long long)(is_min ? min_len : max_len), MAX_SAMPLE_LEN);
        return 64;
    }
    if (!strcmp(cmd, "build") || !strcmp(cmd, "synth")) {
        if (!out || !*out) {
            fprintf(stderr, "dflash-data: %s: -o OUT is required%s\n", cmd, out ? " (an empty path was given)" : "");
            return 64;
        }
        catch_stop_signals();
        if (!strcmp(cmd, "build"))
            return cmd_build(out, (uint32_t)vocab, end_line, argv + optind, argc - optind);
        return cmd_synth(out, have_n ? n : 1000, vocab ? (uint32_t)vocab : 1024, (uint32_t)min_len,
                         (uint32_t)max_len, seed);
    }
    if (strcmp(cmd, "info") && strcmp(cmd, "verify") && strcmp(cmd, "dump")) {
        fprintf(stderr, "dflash-data: unknown command '%s': build, synth, info, verify or dump (try -h)\n", cmd);
        return 64;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "dflash-data: %s: %s (try -h)\n", cmd, optind == argc ? "a dataset FILE is needed" :
                "one dataset FILE only");
        return 64;
    }
    if (!strcmp(cmd, "info"))
        return cmd_info(argv[optind], json);
    if (!strcmp(cmd, "verify")) {
        struct dataset ds;
        if (open_or_report(&ds, argv[optind]) < 0)
            return 1;
        printf("%s: ok\n", argv[optind]);
        dataset_close(&ds);
        return 0;
    }
    return cmd_dump(argv[optind], have_n ? n : UINT64_MAX);
}
