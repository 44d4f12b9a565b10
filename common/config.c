/* config.c: the key table and the inih-driven loader.
 * Unknown keys, bad types and out-of-range values fail with file:line: key: reason. */
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <stdbool.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include "common/config.h"
#include "common/fileio.h"
#include "common/text.h"

#define OFF(sec, field) offsetof(struct dflash_cfg, sec.field)
#define I(sec, k, mn, mx, d, h)  { #sec, #k, CFG_INT, mn, mx, d, OFF(sec, k), h, 0 }
#define D(sec, k, mn, mx, d, h)  { #sec, #k, CFG_DOUBLE, mn, mx, d, OFF(sec, k), h, 0 }
#define S(sec, k, d, h)          { #sec, #k, CFG_STR, 0, sizeof(((struct dflash_cfg *)0)->sec.k), d, OFF(sec, k), h, 0 }
#define P(sec, k, d, h)          { #sec, #k, CFG_STR, 0, sizeof(((struct dflash_cfg *)0)->sec.k), d, OFF(sec, k), h, 1 }

const struct cfg_key cfg_keys[] = {
    S(cluster, name, "dflash", "cluster id; names the shm ring (/dflash-<name>) and the socket"),
    P(cluster, runtime_dir, "/run/dflash", "sockets and lock files"),
    P(cluster, state_dir, "/var/lib/dflash", "ledger, checkpoints, metrics"),
    P(cluster, socket, "", "control socket path; empty = <runtime_dir>/<name>.sock"),
    S(cluster, group, "", "group allowed to use the socket and ring; empty = owner only"),
    S(cluster, tcp_listen, "", "host:port (IPv4, [IPv6]:port or a name) of an optional TCP listener for dflashctl; empty = none"),
    P(cluster, tcp_token_file, "", "with tcp_listen: file holding the shared secret (16-256 bytes, mode 0600) TCP peers must present"),
    S(cluster, log_level, "info", "error | warn | notice | info | debug"),

    I(ring, slots, 2, 4096, "16", "slots in the shared-memory ring"),
    I(ring, max_tokens, 16, 1 << 20, "16384", "tokens per slot (packed batch capacity; the GPU kernels' grids bound it); at least data.token_budget"),
    I(ring, max_seqs, 1, 65535, "256", "sequences per slot; at most max_tokens"),
    I(ring, stuck_writing_ms, 100, 86400000, "600000", "report a slot WRITING longer than this"),

    P(model, path, "", "target model dir (config.json + *.safetensors)"),
    S(model, capture_layers, "", "captured layer ids, comma separated; empty = DFlash default"),
    I(model, draft_layers, 1, 64, "5", "drafter layers; sets the default capture ids"),

    P(data, path, "", "dataset file written by dflash-data"),
    I(data, token_budget, 16, 1 << 24, "16384", "tokens per packed batch; at least max_seq_len, at most ring.max_tokens"),
    I(data, max_seq_len, 2, 1 << 22, "4096", "longer samples are truncated; at most token_budget"),
    I(data, epochs, 1, CFG_MAX_EPOCHS, "1", "epochs to train"),
    I(data, seed, 0, 4294967295.0, "1234", "shuffle seed"),
    I(data, bucket_width, 1, 1 << 20, "256", "tokens per length bucket"),

    I(coordinator, heartbeat_ms, 10, 600000, "500", "heartbeat period asked of daemons"),
    I(coordinator, dead_after_ms, 50, 3600000, "5000", "a daemon silent this long is dead (at least 3 x heartbeat_ms)"),
    I(coordinator, watchdog_ms, 0, 3600000, "0", "ignored, kept so older files load: the watchdog interval is the units' WatchdogSec="),
    P(coordinator, ledger, "", "SQLite ledger file; empty = <state_dir>/<name>-ledger.db"),
    I(coordinator, ring_hidden, 0, 1 << 20, "0", "ring slot hidden size; 0 = the target model's hidden_size (with model.path set: 0 or that size)"),
    I(coordinator, recovery_ms, 0, 3600000, "2000", "after a restart, wait this long for peers to reconnect before re-leasing their batches"),
    I(coordinator, min_free_mb, 0, 1 << 30, "1024", "pause the cluster while the ledger's or the checkpoints' filesystem has less free (MiB), resume at twice that; 0 = off"),

    S(target, backend, "cpu", "cpu | cuda"),
    I(target, prefetch, 1, 64, "2", "batch leases held ahead"),
    I(target, threads, 1, 1024, "1", "CPU backend threads"),
    I(target, devices, 1, 1024, "8", "instance index must be below this"),
    I(target, gpu_timeout_ms, 1000, 3600000, "120000", "CUDA: a batch on the GPU this long means a hung GPU: exit 1, restarted"),
    I(target, debug_nan_batch, -1, 1e15, "-1", "debug: poison this batch's states with NaN"),
    I(target, debug_stall_batch, -1, 1e15, "-1", "debug (CUDA): hang the GPU on this batch"),

    S(drafter, backend, "cpu", "cpu | cuda"),
    I(drafter, min_ready, 1, 4096, "1", "READY slots wanted before picking (more than 1 mixes the targets' batches)"),
    S(drafter, pick, "oldest", "oldest | random"),
    I(drafter, ready_timeout_ms, 0, 3600000, "200", "pick anyway after waiting this long for min_ready slots (counted from the first look)"),
    I(drafter, world_size, 1, 1024, "1", "drafters in the data-parallel group"),
    I(drafter, block_size, 2, 128, "16", "draft block size"),
    I(drafter, num_anchors, 1, 1 << 20, "512", "anchors per sequence per step"),
    D(drafter, gamma, 0.01, 1e6, "7", "loss decay: weight exp(-(k-1)/gamma)"),
    I(drafter, mask_token_id, -1, 1 << 30, "-1", "MASK token id; -1 = last vocab id"),
    I(drafter, num_heads, 0, 1024, "0", "0 = target's"),
    I(drafter, num_kv_heads, 0, 1024, "0", "0 = target's"),
    I(drafter, head_dim, 0, 1024, "0", "0 = target's"),
    I(drafter, intermediate_size, 0, 1 << 20, "0", "0 = target's"),
    D(drafter, lr, 0, 10, "6e-4", "peak learning rate"),
    D(drafter, min_lr_ratio, 0, 1, "0.1", "cosine floor as a fraction of lr"),
    I(drafter, warmup_steps, 0, 1 << 30, "100", "linear warmup steps"),
    I(drafter, total_steps, 0, 1 << 30, "0", "cosine schedule horizon; 0 = the run's batches (all epochs) / world_size, rounded up"),
    D(drafter, weight_decay, 0, 10, "0.01", "AdamW weight decay"),
    D(drafter, beta1, 0, 0.9999999, "0.9", "AdamW beta1 (1 makes the bias correction divide by 0)"),
    D(drafter, beta2, 0, 0.9999999, "0.95", "AdamW beta2 (1 makes the bias correction divide by 0)"),
    D(drafter, adam_eps, 1e-30, 1, "1e-8", "AdamW epsilon (above 0: a parameter whose gradient stays 0 divides 0 by it; a float holds it)"),
    D(drafter, grad_clip, 0, 1e9, "1.0", "global gradient norm clip (0 = off)"),
    I(drafter, checkpoint_every, 1, 1 << 30, "1000", "steps between checkpoints"),
    I(drafter, checkpoint_timeout_ms, 1000, 86400000, "600000", "a checkpoint write waited on this long (a stop's waits together): the storage hangs, exit 1; keep the drafter and coordinator units' TimeoutStopSec above it"),
    P(drafter, checkpoint_dir, "", "empty = <state_dir>/checkpoints"),
    P(drafter, metrics_path, "", "empty = <state_dir>/metrics-rank<N>.jsonl; set: every rank appends its lines (each names its rank) to this one file"),
    I(drafter, seed, 0, 4294967295.0, "42", "init and anchor seed"),
    I(drafter, threads, 1, 1024, "1", "CPU backend threads"),
    I(drafter, devices, 1, 1024, "8", "instance index must be below this"),
    I(drafter, debug_nan_step, -1, 1e15, "-1", "debug: make the loss NaN at this step"),
    I(drafter, collective_timeout_ms, 100, 86400000, "120000", "a peer that keeps a collective waiting this long fails the group"),
    I(drafter, keep_checkpoints, 0, 1 << 20, "3", "newest checkpoints kept on disk (the one written counts); never pruned: the one a restart would load and any newer up to the one written; 0 = all"),
    I(drafter, debug_ckpt_delay_ms, 0, 600000, "0", "debug: a background checkpoint write waits this long first"),
};
const size_t cfg_nkeys = sizeof cfg_keys / sizeof cfg_keys[0];

static const struct cfg_key *cfg_find(const char *section, const char *key)
{
    for (size_t i = 0; i < cfg_nkeys; i++)
        if (!strcmp(cfg_keys[i].section, section) && !strcmp(cfg_keys[i].key, key))
            return &cfg_keys[i];
    return NULL;
}

static int section_known(const char *section)
{
    for (size_t i = 0; i < cfg_nkeys; i++)
        if (!strcmp(cfg_keys[i].section, section))
            return 1;
    return 0;
}

/* Parse a comma list of layer ids: every item a decimal id in [0, 2^20], no empty items, no
 * id twice (a duplicate would capture one layer into two ring planes). Returns the count, or
 * <0 with the reason in why (-E2BIG: more than max ids). */
static int parse_ids(const char *s, int *out, int max, char *why, size_t whylen)
{
    int n = 0;
    for (int item = 1;; item++) {
        while (*s == ' ' || *s == '\t')
            s++;
        if (*s < '0' || *s > '9') {
            if (!*s || *s == ',')
                snprintf(why, whylen, "empty item %d", item);
            else
                snprintf(why, whylen, "item %d is not a layer id", item);
            return -EINVAL;
        }
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || v > 1 << 20) {
            snprintf(why, whylen, "layer id %.*s is out of range [0, %d]", (int)(end - s > 20 ? 20 : end - s), s,
                     1 << 20);
            return -ERANGE;
        }
        for (int i = 0; i < n; i++)
            if (out[i] == (int)v) {
                snprintf(why, whylen, "layer id %ld given twice", v);
                return -EINVAL;
            }
        if (n == max) {
            snprintf(why, whylen, "more than %d layer ids", max);
            return -E2BIG;
        }
        out[n++] = (int)v;
        s = end;
        while (*s == ' ' || *s == '\t')
            s++;
        if (!*s)
            return n;
        if (*s != ',') {
            snprintf(why, whylen, "item %d is not a layer id", item);
            return -EINVAL;
        }
        s++;
    }
}

/* Checked when the file or -o sets it, so every daemon reads a list cfg_parse_int_list takes. */
static int check_capture_layers(const char *val, char *why, size_t whylen)
{
    int ids[CFG_MAX_LAYER_IDS];
    char r[160];
    if (!*val)
        return 0; /* empty: the DFlash default for model.draft_layers */
    int n = parse_ids(val, ids, CFG_MAX_LAYER_IDS, r, sizeof r);
    if (n == -E2BIG)
        snprintf(why, whylen, "%s", r); /* the value itself would be long: the count says it */
    else if (n < 0)
        snprintf(why, whylen, "'%s': %s", val, r);
    return n < 0 ? n : 0;
}

/* The name goes into file names (lock files, the socket, the ledger) and POSIX shm names
 * ("/dflash-<name>", "/dflash-<name>-coll"): no '/', no spaces, no "." or "..", and short
 * enough for every name built from it. */
static int check_cluster_name(const char *val, char *why, size_t whylen)
{
    size_t n = strlen(val);
    int ok = n >= 1 && n <= CFG_CLUSTER_NAME_MAX && val[0] != '.';
    for (size_t i = 0; ok && i < n; i++) {
        unsigned char ch = (unsigned char)val[i];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
             ch == '_' || ch == '-' || ch == '.';
    }
    if (ok)
        return 0;
    snprintf(why, whylen, "'%s': not a cluster name: 1-%d characters (letters, digits, '_', '-', '.'; "
             "not starting with '.')", val, CFG_CLUSTER_NAME_MAX);
    return -EINVAL;
}

/* One of the words in `words` (a NULL-ended list), else "'val': expected a, b or c". */
static int check_word(const char *val, const char *const *words, char *why, size_t whylen)
{
    size_t n = 0;
    for (; words[n]; n++)
        if (!strcmp(val, words[n]))
            return 0;
    int k = snprintf(why, whylen, "'%s': expected ", val);
    for (size_t i = 0; i < n && k >= 0 && (size_t)k < whylen; i++)
        k += snprintf(why + k, whylen - (size_t)k, "%s%s", i == 0 ? "" : i + 1 < n ? ", " : " or ", words[i]);
    return -EINVAL;
}

/* Enumerated values are checked here, by every program that loads the file (the coordinator's
 * -t, dflashctl), not only by the daemon that uses the key. */
static int check_backend(const char *val, char *why, size_t whylen)
{
    static const char *const w[] = { "cpu", "cuda", NULL };
    return check_word(val, w, why, whylen);
}

static int check_pick(const char *val, char *why, size_t whylen)
{
    static const char *const w[] = { "oldest", "random", NULL };
    return check_word(val, w, why, whylen);
}

static int check_log_level(const char *val, char *why, size_t whylen)
{
    static const char *const w[] = { "error", "warn", "notice", "info", "debug", NULL };
    return check_word(val, w, why, whylen);
}

/* String keys whose values have a syntax of their own. */
static const struct {
    size_t offset;
    int (*check)(const char *val, char *why, size_t whylen);
} str_checks[] = {
    { OFF(cluster, name), check_cluster_name },
    { OFF(cluster, log_level), check_log_level },
    { OFF(model, capture_layers), check_capture_layers },
    { OFF(target, backend), check_backend },
    { OFF(drafter, backend), check_backend },
    { OFF(drafter, pick), check_pick },
};

/* The shortest decimal that reads back as v: 0.9, not 0.90000000000000002; whole numbers as
 * integers (10, not 1e+01). A value that is not finite, or one below the smallest normal
 * double (an underflow: the text may say 1e-320 and be read as 0), is shown as `text` said it. */
static void fmt_double(char *buf, size_t len, const char *text, double v)
{
    if (text && (!isfinite(v) || (v != 0 && fabs(v) < DBL_MIN) || (v == 0 && strpbrk(text, "123456789")))) {
        snprintf(buf, len, "%.24s", text);
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, len, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
}

/* Store one value; on failure write the reason (without location) into err. */
static int cfg_store(struct dflash_cfg *cfg, const struct cfg_key *k, const char *val, const char *base,
                     char *err, size_t errlen)
{
    char *p = (char *)cfg + k->offset;
    char *end;
    switch (k->type) {
    case CFG_INT: {
        errno = 0;
        long long v = strtoll(val, &end, 10);     /* base 10: "010" is ten, not eight */
        if (errno == ERANGE && end != val && !*end) {
            snprintf(err, errlen, "%s out of range [%.0f, %.0f]", val, k->min, k->max);
            return -ERANGE;
        }
        if (errno || end == val || *end) {
            snprintf(err, errlen, "not an integer: '%s'", val);
            return -EINVAL;
        }
        if ((double)v < k->min || (double)v > k->max) {
            snprintf(err, errlen, "%lld out of range [%.0f, %.0f]", v, k->min, k->max);
            return -ERANGE;
        }
        *(int64_t *)p = v;
        return 0;
    }
    case CFG_DOUBLE: {
        errno = 0;
        double v = strtod(val, &end);
        /* ERANGE on underflow still gives a number (tiny or 0): the range check judges it */
        if (end == val || *end || isnan(v)) {
            snprintf(err, errlen, "not a number: '%s'", val);
            return -EINVAL;
        }
        if (!isfinite(v) || v < k->min || v > k->max) {
            char a[32], lo[32], hi[32];
            fmt_double(a, sizeof a, val, v);
            fmt_double(lo, sizeof lo, NULL, k->min);
            fmt_double(hi, sizeof hi, NULL, k->max);
            snprintf(err, errlen, "%s out of range [%s, %s]", a, lo, hi);
            return -ERANGE;
        }
        *(double *)p = v;
        return 0;
    }
    case CFG_BOOL:
        if (!strcasecmp(val, "true") || !strcasecmp(val, "yes") || !strcmp(val, "1"))
            *(int *)p = 1;
        else if (!strcasecmp(val, "false") || !strcasecmp(val, "no") || !strcmp(val, "0"))
            *(int *)p = 0;
        else {
            snprintf(err, errlen, "not a boolean: '%s'", val);
            return -EINVAL;
        }
        return 0;
    case CFG_STR:
        if (strlen(val) >= (size_t)k->max) {
            snprintf(err, errlen, "longer than %.0f bytes", k->max - 1);
            return -ERANGE;
        }
        /* the ini syntax has no quotes: a quoted value would keep them, a quoted path become
         * a relative one */
        size_t vl = strlen(val);
        if (vl >= 2 && (val[0] == '"' || val[0] == '\'') && val[vl - 1] == val[0]) {
            snprintf(err, errlen, "%s: in quotes: write the value without them (they would be part of it)", val);
            return -EINVAL;
        }
        /* paths and names reach logs, the protocol and dflashctl's terminal: none needs one */
        long at = cfg_control_char(val);
        if (at >= 0) {
            snprintf(err, errlen, "a control character (0x%02x) at byte %ld", (unsigned char)val[at], at);
            return -EINVAL;
        }
        /* nor C1's (U+0080..U+009F), nor bytes that are no UTF-8: the status JSON would be invalid */
        size_t d = text_plain_len(val);
        if (val[d]) {
            const unsigned char *u = (const unsigned char *)val + d;
            if (u[0] == 0xc2 && u[1] >= 0x80 && u[1] < 0xa0)
                snprintf(err, errlen, "a control character (U+%04X) at byte %zu", (unsigned)u[1], d);
            else
                snprintf(err, errlen, "not UTF-8 text (byte 0x%02x at byte %zu)", (unsigned)u[0], d);
            return -EINVAL;
        }
        for (size_t i = 0; i < sizeof str_checks / sizeof str_checks[0]; i++) {
            int r = str_checks[i].offset == k->offset ? str_checks[i].check(val, err, errlen) : 0;
            if (r < 0)
                return r;
        }
        if (k->path && base && val[0] && val[0] != '/') {
            /* relative: from `base`, so a daemon under systemd (started in /) and one started
             * by hand read the same file, and a path the coordinator hands out means one thing.
             * Its leading "./" and "../" are taken off (the path is kept, and must not depend on
             * the folder it was given in), a "../" against base as the kernel would take it:
             * with its symbolic links resolved (else the "../" stays). */
            char b[PATH_MAX];
            snprintf(b, sizeof b, "%s", base);
            const char *v = val;
            int resolved = 0;       /* base's links resolved for a "../": 1 done, -1 not possible */
            for (;;) {
                size_t dots = v[0] == '.' && (v[1] == '/' || !v[1]) ? 1
                            : v[0] == '.' && v[1] == '.' && (v[2] == '/' || !v[2]) ? 2 : 0;
                if (dots == 2 && !resolved && (resolved = realpath(base, b) ? 1 : -1) < 0)
                    snprintf(b, sizeof b, "%s", base);
                if (!dots || (dots == 2 && resolved < 0))
                    break;
                if (dots == 2) {
                    char *last = strrchr(b, '/');
                    if (last)
                        *(last == b ? last + 1 : last) = 0;
                }
                for (v += dots; *v == '/'; v++)
                    ;
            }
            /* and its "." parts within ("a/./b", "a/."; a ".." within stays: "link/.." is not ".") */
            char rest[CFG_STR_MAX], *w = rest;
            for (const char *c = v; *c;) {
                if (c[0] == '.' && c > v && c[-1] == '/' && c[1] == '/') {
                    for (c++; *c == '/'; c++)
                        ;
                } else if (c[0] == '.' && c > v && c[-1] == '/' && !c[1]) {
                    w--;        /* (the '/' before it goes too) */
                    break;
                } else {
                    *w++ = *c++;
                }
            }
            *w = 0;
            const char *sep = !rest[0] || !strcmp(b, "/") ? "" : "/";
            int n = snprintf(p, (size_t)k->max, "%s%s%s", b, sep, rest);
            if (n < 0 || n >= (int)k->max) {
                snprintf(err, errlen, "'%s' taken from %s is longer than %.0f bytes", val, base, k->max - 1);
                p[0] = 0;
                return -ERANGE;
            }
            return 0;
        }
        strcpy(p, val);
        return 0;
    }
    return -EINVAL;
}

struct load_ctx {
    struct dflash_cfg *cfg;
    const char *path;
    char *err;
    size_t errlen;
    int failed;
    const char *text;   /* the whole file, read up front (NUL-free, checked) */
    size_t len, pos;
    int lineno;     /* Debian's inih has no line numbers in the handler: count here */
    int fail_line;
    int *set_line;  /* per cfg_keys[] entry: the file line that set it (0 = not yet) */
    const char *base;   /* the file's folder, absolute: relative path values start there */
    const char *only;   /* cfg_load_section: the one section read, errors elsewhere passed over */
    bool only_seen;     /* its header is in the file */
    char cur[64];       /* the section of the line being read */
};

#define CFG_MAX_LINE 4096   /* inih's line buffer (heap); a longer line is an error, never split */
#define CFG_MAX_FILE (1 << 20) /* a config file is a few KB: anything this big is not one */

static void fail_at(struct load_ctx *c, int lineno, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The first failure wins: inih reports the first bad line, and so does the message. */
static void fail_at(struct load_ctx *c, int lineno, int code, const char *fmt, ...)
{
    if (c->failed || (c->only && strcmp(c->cur, c->only)))
        return;
    int n = snprintf(c->err, c->errlen, "%s:%d: ", c->path, lineno);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < c->errlen)
        vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    c->failed = code;
    c->fail_line = lineno;
}

/* A "[section]" line (a first line's BOM skipped by the caller) with more after its ']' than
 * blanks and a comment: -EINVAL with the reason in why. inih drops that text unseen, so
 * "[ring] slots = 4" would leave ring.slots at its default without a word. */
static int check_section_line(const char *line, char *why, size_t whylen)
{
    line += strspn(line, " \t\r\n\v\f");
    const char *close = line[0] == '[' ? strchr(line, ']') : NULL;
    if (!close)
        return 0;   /* no section line, or one without ']': inih's syntax error */
    const char *tail = close + 1 + strspn(close + 1, " \t\r\n\v\f");
    int name = (int)(close + 1 - line), n = (int)strcspn(tail, "\r\n");
    int len = (int)(close - line - 1);
    char section[64];
    snprintf(section, sizeof section, "%.*s", len, line + 1);
    if (len >= (int)sizeof section || !section_known(section)) {
        /* the keys of an unknown section are refused; an empty one (a misspelt header above
         * keys commented out) would pass unseen */
        snprintf(why, whylen, "%.*s: unknown section", name < 70 ? name : 70, line);
        return -EINVAL;
    }
    if (!*tail || *tail == ';' || *tail == '#')
        return 0;
    snprintf(why, whylen, "%.*s: '%.*s' after the section name (a key goes on a line of its own)",
             name < 60 ? name : 60, line, n < 60 ? n : 60, tail);
    return -EINVAL;
}

/* In a cfg_load_section read inih's syntax errors are passed over, since they may be in another
 * section: those of the section read are found here, as inih finds them (a key line with no '='
 * or ':' before an inline "; comment"). NULL for a line inih takes. */
static const char *syntax_error(const char *line)
{
    line += strspn(line, " \t\r\n\v\f");
    if (!*line || *line == ';' || *line == '#')
        return NULL;
    if (*line == '[')
        return strchr(line, ']') ? NULL : "a '[' line without ']'";
    for (const char *p = line; *p && *p != '\n'; p++) {
        if (*p == '=' || *p == ':')
            return NULL;
        if (*p == ';' && (p[-1] == ' ' || p[-1] == '\t'))
            break;
    }
    return "syntax error: no '=' or ':' in it";
}

/* A failure in a cfg_load_section read wherever the line is: which section it is in cannot be
 * told (a header cut short, or one too long to read). */
static void fail_anywhere(struct load_ctx *c, const char *why)
{
    if (c->only)
        snprintf(c->cur, sizeof c->cur, "%s", c->only);
    fail_at(c, c->lineno, -EINVAL, "%s", why);
}

/* inih reads one line per call, so the line count at handler time is its line. A line that
 * does not fit inih's buffer would come back in pieces, the tail parsed as a line of its own
 * (a commented-out setting could come alive): it ends the parse with an error instead, but in a
 * cfg_load_section read of another section, where it is passed over whole. */
static char *ini_read_line(char *buf, int size, void *stream)
{
    struct load_ctx *c = stream;
    if (c->pos >= c->len || size < 2)
        return NULL;
    const char *s = c->text + c->pos;
    size_t left = c->len - c->pos, room = (size_t)size - 1;
    const char *nl = memchr(s, '\n', left < room ? left : room);
    size_t n = nl ? (size_t)(nl - s) + 1 : (left < room ? left : room);
    c->lineno++;
    if (!nl && n == room && n < left) {
        const char *t = s + strspn(s, " \t\r\v\f");
        if (c->only && strcmp(c->cur, c->only) && *t != '[') {
            const char *end = memchr(s, '\n', left);
            c->pos += end ? (size_t)(end - s) + 1 : left;
            snprintf(buf, (size_t)size, "\n");
            return buf;
        }
        char why[64];
        snprintf(why, sizeof why, "line longer than %d bytes", size - 2);
        fail_anywhere(c, why);
        return NULL;
    }
    memcpy(buf, s, n);
    buf[n] = 0;
    c->pos += n;
    const char *line = c->lineno == 1 && !strncmp(buf, "\xef\xbb\xbf", 3) ? buf + 3 : buf;   /* (a BOM: inih skips it) */
    const char *t = line + strspn(line, " \t\r\n\v\f");
    const char *close = *t == '[' ? strchr(t, ']') : NULL;
    if (close) {
        snprintf(c->cur, sizeof c->cur, "%.*s", (int)(close - t - 1), t + 1);
        c->only_seen |= c->only && !strcmp(c->cur, c->only);
    }
    const char *bad = c->only ? syntax_error(line) : NULL;
    if (bad && *t == '[')
        fail_anywhere(c, bad);
    else if (bad)
        fail_at(c, c->lineno, -EINVAL, "%s", bad);
    char why[160];
    if (check_section_line(line, why, sizeof why) < 0) {
        fail_at(c, c->lineno, -EINVAL, "%s", why);
        if (!c->only)
            return NULL;
    }
    return buf;
}

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
    struct load_ctx *c = user;
    int lineno = c->lineno;
    char why[512];
    if (!name || (c->only && strcmp(section, c->only))) /* a bare [section] line: checked as read */
        return 1;
    const struct cfg_key *k = cfg_find(section, name);
    if (!k) {
        if (!section[0])
            fail_at(c, lineno, -EINVAL, "%s: a key outside any [section]", name);
        else
            fail_at(c, lineno, -EINVAL, "%s.%s: %s", section, name,
                    section_known(section) ? "unknown key" : "unknown section");
        return 0;
    }
    /* The last one winning silently hides an edit that had no effect; -o is for overriding. */
    int *first = &c->set_line[k - cfg_keys];
    if (*first) {
        fail_at(c, lineno, -EINVAL, "%s.%s: set twice (first at line %d)", section, name, *first);
        return 0;
    }
    *first = lineno;
    int r = cfg_store(c->cfg, k, value, c->base, why, sizeof why);
    if (r < 0) {
        fail_at(c, lineno, r, "%s.%s: %s", section, name, why);
        return 0;
    }
    return 1;
}

/* Read the whole of `path` into a NUL-terminated heap buffer. Only a regular file: a directory
 * would read as empty and a FIFO or /dev/zero never ends. The check and the read share one fd. */
static int read_config_file(const char *path, char **text, size_t *len, char *err, size_t errlen)
{
    int fd = fileio_open_regular(path, NULL);
    if (fd < 0) {
        if (fd == -EINVAL)
            snprintf(err, errlen, "%s: not a regular file", path);
        else
            snprintf(err, errlen, "%s: cannot open: %s", path, strerror(-fd));
        return fd;
    }
    /* Read to EOF rather than trusting st_size (the file may grow); one byte past the cap
     * tells "too big" from "exactly the cap". */
    char *buf = malloc(CFG_MAX_FILE + 2);
    if (!buf) {
        close(fd);
        snprintf(err, errlen, "%s: out of memory", path);
        return -ENOMEM;
    }
    long got = fileio_read_upto(fd, buf, CFG_MAX_FILE + 1);
    close(fd);
    if (got < 0) {
        snprintf(err, errlen, "%s: read error: %s", path, strerror((int)-got));
        free(buf);
        return (int)got;
    }
    size_t n = (size_t)got;
    if (n > CFG_MAX_FILE) {
        snprintf(err, errlen, "%s: larger than %d bytes: not a config file", path, CFG_MAX_FILE);
        free(buf);
        return -EFBIG;
    }
    buf[n] = 0;
    /* inih works on C strings: a NUL would end the value or line there, the rest unseen. */
    const char *nul = memchr(buf, 0, n);
    if (nul) {
        int line = 1;
        for (const char *q = buf; q < nul; q++)
            line += *q == '\n';
        snprintf(err, errlen, "%s:%d: NUL byte", path, line);
        free(buf);
        return -EINVAL;
    }
    *text = buf;
    *len = n;
    return 0;
}

/* Whether a path has a "." or ".." part. */
static bool has_dot_part(const char *p)
{
    for (const char *c = p; *c;) {
        size_t n = strcspn(c, "/");
        if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
            return true;
        c += n + strspn(c + n, "/");
    }
    return false;
}

/* The absolute folder of `path` (the current folder joined with its dirname when relative),
 * without a trailing '/', and without "." or ".." parts: the paths made from it are kept (the
 * ledger keeps the checkpoints'), and "run/../state" would stop meaning "state" once "run" is
 * renamed or removed. (One named without dot parts is kept as written, symbolic links and all.) */
static int file_folder(const char *path, char *out, size_t len)
{
    const char *slash = strrchr(path, '/');
    char cwd[CFG_STR_MAX];
    if (path[0] != '/' && !getcwd(cwd, sizeof cwd))
        return -errno;
    int n;
    if (path[0] == '/')
        n = snprintf(out, len, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    else if (slash)     /* (from "/": no "//") */
        n = snprintf(out, len, "%s/%.*s", strcmp(cwd, "/") ? cwd : "", (int)(slash - path), path);
    else
        n = snprintf(out, len, "%s", cwd);
    if (n < 0 || (size_t)n >= len)
        return -ENAMETOOLONG;
    for (size_t k = strlen(out); k > 1 && out[k - 1] == '/'; k--)
        out[k - 1] = 0;         /* ("-c /etc/dflash//x.ini") */
    char real[PATH_MAX];
    if (has_dot_part(out) && realpath(out, real)) {     /* (it holds the file just read: it is there) */
        if (strlen(real) >= len)
            return -ENAMETOOLONG;
        strcpy(out, real);
    }
    return 0;
}

static int load(struct dflash_cfg *cfg, const char *path, const char *only, bool *only_seen, char *err,
                size_t errlen)
{
    char why[512];
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < cfg_nkeys; i++)
        if (cfg_store(cfg, &cfg_keys[i], cfg_keys[i].def, NULL, why, sizeof why) < 0) {
            snprintf(err, errlen, "built-in default %s.%s: %s", cfg_keys[i].section, cfg_keys[i].key, why);
            return -EINVAL;
        }
    if (!path)
        return 0;
    char *text = NULL;
    size_t len = 0;
    int r = read_config_file(path, &text, &len, err, errlen);
    if (r < 0)
        return r;
    char base[CFG_STR_MAX];
    if ((r = file_folder(path, base, sizeof base)) < 0) {
        snprintf(err, errlen, "%s: its folder: %s", path, strerror(-r));
        free(text);
        return r;
    }
    int set_line[sizeof cfg_keys / sizeof cfg_keys[0]] = { 0 };
    struct load_ctx c = { .cfg = cfg, .path = path, .err = err, .errlen = errlen, .text = text, .len = len,
                          .set_line = set_line, .base = base, .only = only };
    /* Debian's inih takes these at run time: a heap line buffer of CFG_MAX_LINE bytes, and no
     * continuation lines (an indented "key = value" would be glued to the key before it). */
    ini_use_stack = false;
    ini_allow_realloc = false;
    ini_initial_alloc = CFG_MAX_LINE;
    ini_max_line = CFG_MAX_LINE;
    ini_allow_multiline = false;
    r = ini_parse_stream(ini_read_line, &c, on_ini, &c);
    free(text);
    if (only_seen)
        *only_seen = c.only_seen;
    /* inih reports the first bad line; a syntax error before the key we refused wins. */
    if (c.failed && (only || !(r > 0 && r < c.fail_line)))
        return c.failed;
    if (r > 0 && !only) {
        snprintf(err, errlen, "%s:%d: syntax error", path, r);
        return -EINVAL;
    }
    if (r < 0) {
        snprintf(err, errlen, "%s: read error", path);
        return -EIO;
    }
    return 0;
}

int cfg_load(struct dflash_cfg *cfg, const char *path, char *err, size_t errlen)
{
    return load(cfg, path, NULL, NULL, err, errlen);
}

int cfg_load_section(struct dflash_cfg *cfg, const char *path, const char *section, bool *present, char *err,
                     size_t errlen)
{
    if (present)
        *present = false;
    return load(cfg, path, section, present, err, errlen);
}

int cfg_set(struct dflash_cfg *cfg, const char *assignment, char *err, size_t errlen)
{
    char buf[512], why[512];
    if (strlen(assignment) >= sizeof buf) {
        snprintf(err, errlen, "override %.*s: longer than %zu bytes", (int)strcspn(assignment, "="),
                 assignment, sizeof buf - 1);
        return -EINVAL;
    }
    strcpy(buf, assignment);
    char *eq = strchr(buf, '='), *dot = strchr(buf, '.');
    if (!eq || !dot || dot > eq) {
        snprintf(err, errlen, "override '%s': expected section.key=value", assignment);
        return -EINVAL;
    }
    *eq = *dot = 0;
    /* "key = value" as in the file: the blanks around the section, the key and the value are
     * not theirs */
    char *sec = buf + strspn(buf, " \t"), *key = dot + 1 + strspn(dot + 1, " \t"), *val = eq + 1;
    for (char *e = dot; e > sec && (e[-1] == ' ' || e[-1] == '\t');)
        *--e = 0;
    for (char *e = eq; e > key && (e[-1] == ' ' || e[-1] == '\t');)
        *--e = 0;
    val += strspn(val, " \t");
    for (char *e = val + strlen(val); e > val && (e[-1] == ' ' || e[-1] == '\t');)
        *--e = 0;
    const struct cfg_key *k = cfg_find(sec, key);
    if (!k) {
        snprintf(err, errlen, "override %s.%s: %s", sec, key, section_known(sec) ? "unknown key" : "unknown section");
        return -EINVAL;
    }
    char cwd[CFG_STR_MAX];
    bool relative = k->path && val[0] && val[0] != '/';   /* only then is the current folder asked */
    if (relative && !getcwd(cwd, sizeof cwd)) {
        int e = errno;
        snprintf(err, errlen, "override %s.%s: the current folder: %s", sec, key, strerror(e));
        return -e;
    }
    int r = cfg_store(cfg, k, val, relative ? cwd : NULL, why, sizeof why);
    if (r < 0)
        snprintf(err, errlen, "override %s.%s: %s", sec, key, why);
    return r;
}


void cfg_print(const struct dflash_cfg *cfg, FILE *f, const char *section)
{
    for (size_t i = 0; i < cfg_nkeys; i++) {
        const struct cfg_key *k = &cfg_keys[i];
        if (section && strcmp(section, k->section))
            continue;
        const char *p = (const char *)cfg + k->offset;
        switch (k->type) {
        case CFG_INT: fprintf(f, "%s.%s = %lld\n", k->section, k->key, (long long)*(const int64_t *)p); break;
        case CFG_DOUBLE: {
            char v[32];
            fmt_double(v, sizeof v, NULL, *(const double *)p);
            fprintf(f, "%s.%s = %s\n", k->section, k->key, v);
            break;
        }
        case CFG_BOOL: fprintf(f, "%s.%s = %s\n", k->section, k->key, *(const int *)p ? "true" : "false"); break;
        case CFG_STR: fprintf(f, "%s.%s = %s\n", k->section, k->key, p); break;
        }
    }
}

int cfg_ledger_path(const struct dflash_cfg *cfg, char *buf, size_t len)
{
    int n = cfg->coordinator.ledger[0]
                ? snprintf(buf, len, "%s", cfg->coordinator.ledger)
                : snprintf(buf, len, "%s/%s-ledger.db", cfg->cluster.state_dir, cfg->cluster.name);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int cfg_checkpoint_dir(const struct dflash_cfg *cfg, char *buf, size_t len)
{
    int n = cfg->drafter.checkpoint_dir[0] ? snprintf(buf, len, "%s", cfg->drafter.checkpoint_dir)
                                           : snprintf(buf, len, "%s/checkpoints", cfg->cluster.state_dir);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int cfg_parse_int_list(const char *s, int *out, int max)
{
    char why[160];
    if (!*s)
        return 0;
    return parse_ids(s, out, max, why, sizeof why);
}

long cfg_control_char(const char *s)
{
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        if (*c < 0x20 || *c == 0x7f)
            return (long)(c - (const unsigned char *)s);
    return -1;
}
