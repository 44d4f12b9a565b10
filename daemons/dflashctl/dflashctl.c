/* dflashctl: command-line client of the coordinator's control socket (or of its TCP listener,
 * --connect with --token-file, or, --ledger, a reader of its ledger file without it). Read
 * commands print a table or, with --json, the JSON document. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common/config.h"
#include "common/jsonutil.h"
#include "common/err.h"
#include "common/timeutil.h"
#include "daemons/dflashctl/ledger_view.h"
#include "daemons/dflashctl/show.h"
#include "ipc/client.h"
#include "ipc/stopnote.h"
#include "ipc/net.h"

#define EX_OK 0
#define EX_FAIL 1
#define EX_USAGE 64

struct ctx {
    struct client *c;
    int json;
    uint32_t limit;
    bool limit_given;
    const char *socket;
    const char *connect;        /* host:port of cluster.tcp_listen */
    const char *token_file;
    int wait;                   /* --wait: drain / stop return once the cluster has ended */
    const char *ledger;         /* --ledger: read this ledger file, no coordinator asked */
    char reason[PROTO_REASON_MAX + 1];  /* a control's words joined (their length checked first) */
};

/* Ask, and either print the JSON (as it came, or as amend(x, doc) completed it) or hand the
 * parsed document to show(). */
/* --json: the reply as parsed by ctl_parse (NULL: malformed), its strings made plain, whatever
 * endpoint sent it (a --connect endpoint's raw ESC or invalid UTF-8 would reach the terminal, or a
 * reader's parser). 0, or -1 with a line on stderr. */
static int print_json(const cJSON *doc)
{
    char *out = doc ? cJSON_PrintUnformatted(doc) : NULL;
    if (!out) {
        fprintf(stderr, "dflashctl: the coordinator sent malformed JSON (or no memory for it)\n");
        return -1;
    }
    puts(out);
    free(out);
    return 0;
}

static int query_amended(struct ctx *x, enum proto_query_what what, void (*show)(FILE *, const cJSON *),
                         void (*amend)(const struct ctx *, cJSON *))
{
    char *json = NULL, err[512];
    int status = 0;
    int r = client_query(x->c, what, x->limit, &json, &status, err, sizeof err);
    if (r < 0) {
        fprintf(stderr, "dflashctl: %s\n", err);
        return EX_FAIL;
    }
    if (amend && status >= 0) {
        cJSON *doc = ctl_parse(json);
        char *out = NULL;
        if (doc) {
            amend(x, doc);
            out = cJSON_PrintUnformatted(doc);
            cJSON_Delete(doc);
        }
        if (!out) {
            fprintf(stderr, "dflashctl: the coordinator sent malformed JSON (or no memory for it)\n");
            free(json);
            return EX_FAIL;
        }
        free(json);
        json = out;
    }
    if (x->json) {
        cJSON *doc = ctl_parse(json);
        int printed = print_json(doc);
        cJSON_Delete(doc);
        if (printed < 0) {
            free(json);
            return EX_FAIL;
        }
    } else if (status < 0) {    /* e.g. a reply too large for one frame: say why, not a table */
        cJSON *doc = ctl_parse(json);
        const cJSON *e = doc ? cJSON_GetObjectItemCaseSensitive(doc, "error") : NULL;
        fprintf(stderr, "dflashctl: %s\n", cJSON_IsString(e) ? e->valuestring : "the coordinator refused the query");
        cJSON_Delete(doc);
    } else {
        cJSON *doc = ctl_parse(json);
        if (!doc) {
            fprintf(stderr, "dflashctl: the coordinator sent malformed JSON\n");
            free(json);
            return EX_FAIL;
        }
        show(stdout, doc);
        cJSON_Delete(doc);
    }
    free(json);
    return status < 0 ? EX_FAIL : EX_OK;
}

static int query(struct ctx *x, enum proto_query_what what, void (*show)(FILE *, const cJSON *))
{
    return query_amended(x, what, show, NULL);
}

static int cmd_status(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return query(x, PROTO_Q_STATUS, ctl_show_status); }
static int cmd_ring(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return query(x, PROTO_Q_RING, ctl_show_ring); }
static int cmd_daemons(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return query(x, PROTO_Q_DAEMONS, ctl_show_daemons); }
static int cmd_batches(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return query(x, PROTO_Q_BATCHES, ctl_show_batches); }
static int cmd_errors(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return query(x, PROTO_Q_ERRORS, ctl_show_errors); }

/* Whether each checkpoint folder is still there (pruned, removed) is this process's look, not the
 * coordinator's: a stat on its event loop would hold the whole cluster on a storage that hangs.
 * Over TCP (another host, perhaps) it cannot be told: null. */
static void add_on_disk(const struct ctx *x, cJSON *doc)
{
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "checkpoints")) {
        const cJSON *dir = cJSON_GetObjectItemCaseSensitive(e, "dir");
        cJSON_DeleteItemFromObjectCaseSensitive(e, "on_disk");
        if (x->connect || !cJSON_IsString(dir))
            cJSON_AddNullToObject(e, "on_disk");
        else
            json_add_on_disk(e, dir->valuestring);
    }
}

static int cmd_checkpoints(struct ctx *x, int argc, char **argv)
{
    (void)argc, (void)argv;
    return query_amended(x, PROTO_Q_CHECKPOINTS, ctl_show_checkpoints, add_on_disk);
}

/* s as one word of a shell command line: as it is when it is plain, else in single quotes. */
static void shell_word(FILE *f, const char *s)
{
    if (*s && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/._-+=:@%,") == strlen(s)) {
        fputs(s, f);
        return;
    }
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputs("'\\''", f);    /* end the quote, a quoted ', quote again */
        else
            fputc(*s, f);
    }
    fputc('\'', f);
}

/* How --wait saw the run end, as one line: the text, or (--json) {"state", "reason", "ended",
 * "checkpoint": {"step", "dir"} or null}. ended: every target and drafter had left (what they
 * write at the stop is in the lineage head); else the coordinator left first (a daemon that did
 * not, coordinator.dead_after_ms after the stop) or the end was not seen at all (state "unknown").
 * 0 when the run stopped and ended, else 1. */
static int report_end(const struct ctx *x, enum proto_control_cmd cmd, const char *state, const char *reason,
                      bool ended, bool head_known, const cJSON *ck)
{
    if (x->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "state", state);
        cJSON_AddStringToObject(o, "reason", reason);
        cJSON_AddBoolToObject(o, "ended", ended);
        if (cJSON_IsObject(ck))
            cJSON_AddItemToObject(o, "checkpoint", cJSON_Duplicate(ck, 1));
        else
            cJSON_AddNullToObject(o, "checkpoint");
        char *text = cJSON_PrintUnformatted(o);
        if (text)
            puts(text);
        free(text);
        cJSON_Delete(o);
    } else if (!strcmp(state, "unknown")) {
        fprintf(stderr, "dflashctl: %s: the coordinator went away before the cluster ended (%s)\n",
                proto_control_name(cmd), reason);
    } else {
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(ck, "step");
        printf("%s: the cluster is %s%s%s", proto_control_name(cmd), state, *reason ? ": " : "", reason);
        if (head_known)
            printf("; lineage head: step %.0f %s", cJSON_IsNumber(step) ? step->valuedouble : 0,
                   *ctl_str(ck, "dir") ? ctl_str(ck, "dir") : "(none)");
        if (!ended)
            printf("; the coordinator left before every daemon had: what they write at the stop may be missing");
        putchar('\n');
    }
    return ended && !strcmp(state, "stopped") ? EX_OK : EX_FAIL;
}

/* --wait after a drain or stop: poll the status until the run has ended (STOPPED or FAILED, no
 * target or drafter left) or the coordinator is gone (then its stop note, or over TCP the last
 * status seen, says how far it got); report_end says how. A coordinator that does not answer
 * on a connection that stands is taken as gone at the first reply timeout past WAIT_SILENCE_MAX_MS
 * since its last answer (60-70 s). */
#define WAIT_SILENCE_MAX_MS 60000
static int wait_end(struct ctx *x, enum proto_control_cmd cmd)
{
    char last_state[32] = "unknown", last_reason[PROTO_TEXT_MAX] = "";
    uint64_t answered_ms = mono_ms();
    bool said = false;
    for (;;) {
        char *json = NULL, err[512];
        int status = 0, r = client_query(x->c, PROTO_Q_STATUS, 1, &json, &status, err, sizeof err);
        if (r == -DF_ETIMEOUT && mono_ms() - answered_ms < WAIT_SILENCE_MAX_MS) {
            /* slow, not gone (the connection stands: its ledger's fsync behind a checkpoint's
             * data, a pause): asked again, the late answer skipped */
            if (!said)
                fprintf(stderr, "dflashctl: %s: %s: still waiting\n", proto_control_name(cmd), err);
            said = true;
            continue;
        }
        if (r < 0) {
            /* gone: its stop note says how the cluster ended ("STATE: REASON[; STOP_NOTE_NOT_LEFT]") */
            char why[512];
            if (x->socket && stop_note_read(x->socket, why, sizeof why) == 1) {
                bool ended = !strstr(why, STOP_NOTE_NOT_LEFT);
                char *sep = strstr(why, ": ");
                if (sep)
                    *sep = '\0';
                return report_end(x, cmd, why, sep ? sep + 2 : "", ended, false, NULL);
            }
            bool stopped = !strcmp(last_state, "stopped") || !strcmp(last_state, "failed");
            return report_end(x, cmd, stopped ? last_state : "unknown", stopped ? last_reason : err, false, false, NULL);
        }
        answered_ms = mono_ms();
        said = false;
        cJSON *doc = ctl_parse(json);
        free(json);
        const char *state = ctl_str(doc, "state");
        snprintf(last_state, sizeof last_state, "%s", state);
        snprintf(last_reason, sizeof last_reason, "%s", ctl_str(doc, "reason"));
        const cJSON *ended = cJSON_GetObjectItemCaseSensitive(doc, "ended");
        if (cJSON_IsBool(ended) ? cJSON_IsTrue(ended) : !strcmp(state, "stopped") || !strcmp(state, "failed")) {
            const cJSON *ck = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "group"), "checkpoint");
            int rc = report_end(x, cmd, state, last_reason, true, true, cJSON_IsObject(ck) ? ck : NULL);
            cJSON_Delete(doc);
            return rc;
        }
        cJSON_Delete(doc);
        usleep(250000);
    }
}

/* A control's words, joined by spaces, into reason (PROTO_REASON_MAX + 1 bytes): the length of
 * the whole, which is in reason only when at most PROTO_REASON_MAX. */
static size_t join_reason(int argc, char **argv, char *reason)
{
    size_t n = 0;
    reason[0] = 0;
    for (int i = 0; i < argc; i++) {
        n += strlen(argv[i]) + (i > 0);
        if (n <= PROTO_REASON_MAX)
            strcat(strcat(reason, i ? " " : ""), argv[i]);
    }
    return n;
}

static int control(struct ctx *x, enum proto_control_cmd cmd)
{
    char *json = NULL, err[512];
    int status = 0;
    if (client_control(x->c, cmd, x->reason, &json, &status, err, sizeof err) < 0) {
        fprintf(stderr, "dflashctl: %s\n", err);
        return EX_FAIL;
    }
    cJSON *doc = ctl_parse(json);
    if (x->json)
        print_json(doc);
    else if (!doc)
        fprintf(stderr, "dflashctl: the coordinator sent malformed JSON\n");
    else if (status < 0)
        fprintf(stderr, "dflashctl: %s: %s\n", proto_control_name(cmd), ctl_str(doc, "error"));
    else    /* the reason the cluster is in that state: a second pause shows the first one's */
        printf("%s: cluster is %s%s%s\n", proto_control_name(cmd), ctl_str(doc, "state"),
               *ctl_str(doc, "reason") ? ": " : "", ctl_str(doc, "reason"));
    cJSON_Delete(doc);
    free(json);
    if (status < 0)
        return EX_FAIL;
    if (x->wait && (cmd == PROTO_CTL_DRAIN || cmd == PROTO_CTL_STOP)) {
        fflush(stdout);
        return wait_end(x, cmd);
    }
    return EX_OK;
}

static int cmd_pause(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return control(x, PROTO_CTL_PAUSE); }
static int cmd_resume(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return control(x, PROTO_CTL_RESUME); }
static int cmd_drain(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return control(x, PROTO_CTL_DRAIN); }
static int cmd_stop(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return control(x, PROTO_CTL_STOP); }

static const struct cmd_entry {
    const char *name;
    const char *usage;
    int min_args, max_args;
    int (*fn)(struct ctx *, int, char **);
    enum ledger_view_what offline;              /* what --ledger reads for it (NONE: not kept there) */
    void (*offline_show)(FILE *, const cJSON *);
} commands[] = {
    { "status", "cluster state, progress, ring, daemons, errors", 0, 0, cmd_status, LEDGER_VIEW_STATUS,
      ctl_show_ledger_status },
    { "ring", "every ring slot: state, owner, seq, batch, tokens, age", 0, 0, cmd_ring, LEDGER_VIEW_NONE, NULL },
    { "daemons", "registered daemons with their timings", 0, 0, cmd_daemons, LEDGER_VIEW_NONE, NULL },
    { "batches", "batch counts per state and epoch, batches in flight (--ledger: those changed last)", 0, 0,
      cmd_batches, LEDGER_VIEW_BATCHES, ctl_show_ledger_batches },
    { "errors", "errors reported by the daemons", 0, 0, cmd_errors, LEDGER_VIEW_ERRORS, ctl_show_errors },
    { "checkpoints", "the ledger's checkpoints, newest first: the lineage head, those dropped and why", 0, 0,
      cmd_checkpoints, LEDGER_VIEW_CHECKPOINTS, ctl_show_checkpoints },
    { "pause", "[REASON]: stop leasing, pause targets and drafters", 0, 64, cmd_pause, LEDGER_VIEW_NONE, NULL },
    { "resume", "[REASON]: continue after a pause", 0, 64, cmd_resume, LEDGER_VIEW_NONE, NULL },
    { "drain", "[REASON]: finish in-flight work, final checkpoint, stop", 0, 64, cmd_drain, LEDGER_VIEW_NONE, NULL },
    { "stop", "[REASON]: stop every daemon now", 0, 64, cmd_stop, LEDGER_VIEW_NONE, NULL },
};

/* --ledger: the command's document read from the ledger file, printed as the coordinator's are. */
static int offline(struct ctx *x, const struct cmd_entry *ce)
{
    if (ce->offline == LEDGER_VIEW_NONE) {
        fprintf(stderr, "dflashctl: %s: not kept in the ledger (--ledger reads status, batches, errors, checkpoints)\n",
                ce->name);
        return EX_USAGE;
    }
    cJSON *doc = NULL;
    char err[1024];
    if (ledger_view_read(x->ledger, ce->offline, x->limit, &doc, err, sizeof err) < 0) {
        fprintf(stderr, "dflashctl: %s: %s\n", x->ledger, err);
        return EX_FAIL;
    }
    ctl_clean(doc);
    int rc = EX_OK;
    if (x->json) {
        char *json = cJSON_PrintUnformatted(doc);
        if (json)
            puts(json);
        else
            fprintf(stderr, "dflashctl: %s: out of memory\n", x->ledger);
        rc = json ? EX_OK : EX_FAIL;
        free(json);
    } else {
        ce->offline_show(stdout, doc);
    }
    cJSON_Delete(doc);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: dflashctl [-s SOCKET | -c CONFIG | --connect HOST:PORT --token-file PATH] [--json] [-n LIMIT]\n"
               "                 COMMAND [ARGS]\n"
               "       dflashctl --ledger PATH [--json] [-n LIMIT] status|batches|errors|checkpoints\n"
               "  -s SOCKET  the coordinator's control socket\n"
               "  -c CONFIG  take the socket from this dflash.ini (default $DFLASH_CONFIG, else the\n"
               "             DFLASH_CONFIG of /etc/default/dflash, else /etc/dflash/dflash.ini)\n"
               "  --connect HOST:PORT  the coordinator's TCP listener (cluster.tcp_listen; [IPv6]:PORT)\n"
               "  --token-file PATH    its shared secret (a copy of cluster.tcp_token_file, mode 0600)\n"
               "  --ledger PATH        no coordinator: read the run from its ledger file (coordinator.ledger),\n"
               "                       read-only, whether its coordinator has stopped or still runs\n"
               "  --json     print the coordinator's JSON document (read commands)\n"
               "  -n LIMIT   rows for batches / errors / checkpoints (default 100; errors keeps the newest 64,\n"
               "             --ledger has every one)\n"
               "  --wait     drain / stop: return once the cluster has ended (exit 0 stopped, 1 failed)\n"
               "options may also follow the command; after \"--\" every word is the command's (a REASON\n"
               "starting with '-')\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].usage);
}

/* DFLASH_CONFIG as the units' EnvironmentFile (/etc/default/dflash, or $DFLASH_DEFAULTS) sets
 * it: a line DFLASH_CONFIG=PATH, the value maybe quoted. 1 with it in out, else 0. */
static int defaults_config(char *out, size_t cap)
{
    const char *path = getenv("DFLASH_DEFAULTS");
    FILE *f = fopen(path && *path ? path : "/etc/default/dflash", "re");
    if (!f)
        return 0;
    char line[512];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        char *p = line + strspn(line, " \t");
        if (strncmp(p, "DFLASH_CONFIG=", 14))
            continue;
        p += 14;
        p[strcspn(p, "\r\n")] = 0;
        size_t n = strlen(p);
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
            p[--n] = 0;
        if (n >= 2 && (p[0] == '"' || p[0] == '\'') && p[n - 1] == p[0]) {
            p[n - 1] = 0;
            p++;
        }
        found = *p && snprintf(out, cap, "%s", p) < (int)cap;   /* (the last line wins, as systemd's) */
    }
    fclose(f);
    return found;
}

int main(int argc, char **argv)
{
    struct ctx x = { .limit = 100 };
    const char *config = NULL;
    /* Options go anywhere (`dflashctl status --json`); "--" ends them, for a reason that starts
     * with '-'. The words left, in order: the command and its arguments. */
    char **words = argv + 1;    /* gathered in place: words[k] is never past the argument read */
    int n_words = 0, opts_done = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (opts_done || a[0] != '-' || !a[1]) {
            words[n_words++] = argv[i];
            continue;
        }
        if (!strcmp(a, "--")) {
            opts_done = 1;
            continue;
        }
        if (!strcmp(a, "--json")) {
            x.json = 1;
        } else if (!strcmp(a, "--wait")) {
            x.wait = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return EX_OK;
        } else if ((!strcmp(a, "--connect") || !strcmp(a, "--token-file") || !strcmp(a, "--ledger") ||
                    !strcmp(a, "-s") || !strcmp(a, "-c") || !strcmp(a, "-n")) && i + 1 < argc) {
            const char *v = argv[++i], **slot = a[1] == 's' ? &x.socket : a[1] == 'c' ? &config
                                              : a[2] == 'c' ? &x.connect : a[2] == 't' ? &x.token_file
                                              : a[2] == 'l' ? &x.ledger : NULL;
            if (slot ? *slot != NULL : x.limit_given) {
                fprintf(stderr, "dflashctl: %s given twice\n", a);
                return EX_USAGE;
            }
            if (slot) {
                *slot = v;
            } else {
                char *end;
                errno = 0;
                unsigned long n = strtoul(v, &end, 10);
                if (errno || end == v || *end || v[0] < '0' || v[0] > '9' || n < 1 || n > 1000000) {
                    fprintf(stderr, "dflashctl: -n %s: not a count in [1, 1000000]\n", v);
                    return EX_USAGE;
                }
                x.limit = (uint32_t)n;
                x.limit_given = true;
            }
        } else if (!strcmp(a, "--connect") || !strcmp(a, "--token-file") || !strcmp(a, "--ledger") ||
                   !strcmp(a, "-s") || !strcmp(a, "-c") || !strcmp(a, "-n")) {
            fprintf(stderr, "dflashctl: %s needs a value\n", a);
            return EX_USAGE;
        } else {
            fprintf(stderr, "dflashctl: unknown option '%s' (dflashctl -h lists them)\n", a);
            return EX_USAGE;
        }
    }
    if (n_words == 0) {
        usage(stderr);
        return EX_USAGE;
    }
    if (x.ledger && (x.socket || config || x.connect || x.token_file || x.wait)) {
        fprintf(stderr, "dflashctl: --ledger reads a file, no coordinator: it goes without -s / -c / --connect / "
                "--token-file / --wait\n");
        return EX_USAGE;
    }
    if (x.connect && (x.socket || config)) {
        fprintf(stderr, "dflashctl: --connect goes without -s / -c\n");
        return EX_USAGE;
    }
    if (x.socket && config) {
        fprintf(stderr, "dflashctl: -s and -c name the socket twice: give one\n");
        return EX_USAGE;
    }
    if (!x.connect != !x.token_file) {
        fprintf(stderr, "dflashctl: --connect and --token-file go together\n");
        return EX_USAGE;
    }
    const struct cmd_entry *ce = NULL;
    for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
        if (!strcmp(words[0], commands[k].name))
            ce = &commands[k];
    if (!ce) {
        fprintf(stderr, "dflashctl: unknown command '%s' (dflashctl -h lists them)\n", words[0]);
        return EX_USAGE;
    }
    int nargs = n_words - 1;
    if (nargs < ce->min_args || nargs > ce->max_args) {
        if (!ce->max_args)
            fprintf(stderr, "dflashctl: %s takes no arguments ('%s' is one; dflashctl -h lists the options)\n",
                    ce->name, words[1]);
        else
            fprintf(stderr, "dflashctl: %s: wrong number of arguments (%s %s)\n", ce->name, ce->name, ce->usage);
        return EX_USAGE;
    }
    size_t reason_len = !strncmp(ce->usage, "[REASON]", 8) ? join_reason(nargs, words + 1, x.reason) : 0;
    if (reason_len > PROTO_REASON_MAX) {     /* said, not cut (perhaps inside a UTF-8 character) */
        fprintf(stderr, "dflashctl: %s: the reason is %zu bytes, at most %d are kept: shorten it\n", ce->name,
                reason_len, PROTO_REASON_MAX);
        return EX_USAGE;
    }
    if (x.ledger)
        return offline(&x, ce);

    char path[CFG_STR_MAX + 80];
    char ledger[CFG_STR_MAX + 80] = "";     /* the config's coordinator.ledger, where it is known */
    uint8_t token[PROTO_AUTH_TOKEN_MAX];
    size_t token_len = 0;
    if (x.connect) {
        char err[512];
        if (net_token_load(x.token_file, token, sizeof token, PROTO_AUTH_TOKEN_MIN, &token_len, err, sizeof err) < 0) {
            fprintf(stderr, "dflashctl: --token-file %s\n", err);
            return EX_FAIL;
        }
    } else if (!x.socket) {
        static struct dflash_cfg cfg;
        char err[512];
        static char from_defaults[CFG_STR_MAX];
        if (!config && getenv("DFLASH_CONFIG") && *getenv("DFLASH_CONFIG"))
            config = getenv("DFLASH_CONFIG");
        if (!config && defaults_config(from_defaults, sizeof from_defaults))
            config = from_defaults;                 /* as the units take it */
        if (!config && access("/etc/dflash/dflash.ini", R_OK) == 0)
            config = "/etc/dflash/dflash.ini";
        if (cfg_load(&cfg, config, err, sizeof err) >= 0) {
            if (cfg_ledger_path(&cfg, ledger, sizeof ledger) < 0)
                ledger[0] = 0;
        } else {
            /* A mistake elsewhere in the file (an edit for the next run) must not keep the
             * operator from the running cluster: the socket from [cluster] as it stands. */
            char err2[512];
            bool has_cluster;
            if (cfg_load_section(&cfg, config, "cluster", &has_cluster, err2, sizeof err2) < 0) {
                /* what keeps it from the socket first: the file's first error may be elsewhere */
                if (strcmp(err, err2))
                    fprintf(stderr, "dflashctl: %s (the socket's [cluster] section; the file also: %s)\n", err2, err);
                else
                    fprintf(stderr, "dflashctl: %s\n", err);
                return EX_FAIL;
            }
            if (!has_cluster) {
                /* (its [cluster] header misspelt, say: the default socket is another cluster's) */
                fprintf(stderr, "dflashctl: %s (and the file has no [cluster] section to take the socket from: mend "
                        "it, or give -s)\n", err);
                return EX_FAIL;
            }
            fprintf(stderr, "dflashctl: warning: %s (the socket taken from its [cluster] section)\n", err);
            /* the ledger's path too, where [coordinator] reads (coordinator.ledger, else from [cluster]) */
            static struct dflash_cfg co;
            if (cfg_load_section(&co, config, "coordinator", NULL, err2, sizeof err2) >= 0) {
                memcpy(cfg.coordinator.ledger, co.coordinator.ledger, sizeof cfg.coordinator.ledger);
                if (cfg_ledger_path(&cfg, ledger, sizeof ledger) < 0)
                    ledger[0] = 0;
            }
        }
        if (cfg.cluster.socket[0])
            snprintf(path, sizeof path, "%s", cfg.cluster.socket);
        else
            snprintf(path, sizeof path, "%s/%s.sock", cfg.cluster.runtime_dir, cfg.cluster.name);
        x.socket = path;
    }
    struct client_opts o = { .socket_path = x.socket, .tcp_address = x.connect, .auth_token = token,
                             .auth_token_len = token_len, .role = PROTO_ROLE_CTL, .device = -1, .name = "dflashctl",
                             .reply_timeout_ms = 10000 };
    char err[512];
    int r = client_open(&x.c, &o, err, sizeof err);
    explicit_bzero(token, sizeof token);
    if (r < 0) {
        const char *where = x.socket ? x.socket : x.connect;
        if (where && !strstr(err, where))     /* (a protocol error does not say where) */
            fprintf(stderr, "dflashctl: %s: %s\n", where, err);
        else
            fprintf(stderr, "dflashctl: %s\n", err);
        char why[512];
        if (x.socket && stop_note_read(x.socket, why, sizeof why) == 1) {     /* the cluster ended: say how */
            fprintf(stderr, "dflashctl: the coordinator ended the cluster (%s.stopped): %s\n", x.socket, why);
            if (ledger[0]) {
                fputs("dflashctl: the run's record: dflashctl --ledger ", stderr);
                shell_word(stderr, ledger);
                fprintf(stderr, " %s\n", ce->offline != LEDGER_VIEW_NONE ? ce->name : "status");
            }
        }
        return EX_FAIL;
    }
    int rc = ce->fn(&x, nargs, words + 1);
    client_free(x.c);
    return rc;
}
