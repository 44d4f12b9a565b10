/* dflashctl: command-line client of the coordinator's control socket (or of its TCP listener,
 * --connect with --token-file). Read commands print a table or, with --json, the JSON document. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common/config.h"
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
    const char *socket;
    const char *connect;        /* host:port of cluster.tcp_listen */
    const char *token_file;
};

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static const cJSON *obj(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* Ask, and either print the JSON as-is or hand the parsed document to show(). */
static int query(struct ctx *x, enum proto_query_what what, void (*show)(const cJSON *))
{
    char *json = NULL, err[512];
    int status = 0;
    int r = client_query(x->c, what, x->limit, &json, &status, err, sizeof err);
    if (r < 0) {
        fprintf(stderr, "dflashctl: %s\n", err);
        return EX_FAIL;
    }
    if (x->json) {
        puts(json);
    } else if (status < 0) {    /* e.g. a reply too large for one frame: say why, not a table */
        cJSON *doc = cJSON_Parse(json);
        const cJSON *e = doc ? obj(doc, "error") : NULL;
        fprintf(stderr, "dflashctl: %s\n", cJSON_IsString(e) ? e->valuestring : "the coordinator refused the query");
        cJSON_Delete(doc);
    } else {
        cJSON *doc = cJSON_Parse(json);
        if (!doc) {
            fprintf(stderr, "dflashctl: the coordinator sent malformed JSON\n");
            free(json);
            return EX_FAIL;
        }
        show(doc);
        cJSON_Delete(doc);
    }
    free(json);
    return status < 0 ? EX_FAIL : EX_OK;
}

static void show_daemon_rows(const cJSON *daemons)
{
    printf("%-8s %4s %8s %-5s %-9s %s\n", "ROLE", "GPU", "PID", "ALIVE", "STATE", "DETAIL");
    const cJSON *d;
    cJSON_ArrayForEach(d, daemons) {
        int alive = cJSON_IsTrue(obj(d, "alive"));
        char detail[384];
        if (!alive)
            snprintf(detail, sizeof detail, "left: %s", str(d, "left_reason"));
        else if (!strcmp(str(d, "role"), "target"))
            snprintf(detail, sizeof detail, "leases %.0f, published %.0f since connect, forward %.1f ms, slot wait %.1f ms,"
                     " write %.1f ms, %.0f tok/s", num(d, "leases"), num(d, "published"), num(d, "forward_ms"),
                     num(d, "wait_ms"), num(d, "write_ms"), num(d, "tokens_per_s"));
        else if (num(d, "rank") < 0)
            snprintf(detail, sizeof detail, "no rank: %s, step %.0f",
                     cJSON_IsTrue(obj(d, "joined")) ? "waiting for the group to form" : "not in the group",
                     num(d, "step"));
        else {
            int n = snprintf(detail, sizeof detail, "rank %.0f, step %.0f (%.0f ms), loss %.4g, acc %.3f, group %.0f tok/s,"
                             " idle %.0f%%", num(d, "rank"), num(d, "step"), num(d, "step_ms"), num(d, "loss"),
                             num(d, "accuracy"), num(d, "tokens_per_s"), 100 * num(d, "idle_frac"));
            if (num(d, "h2d_ms") > 0 && n > 0 && (size_t)n < sizeof detail)   /* CUDA: the slot's copy */
                n += snprintf(detail + n, sizeof detail - (size_t)n, ", h2d %.2f ms", num(d, "h2d_ms"));
            if (num(d, "ckpt_write_ms") > 0 && n > 0 && (size_t)n < sizeof detail)
                snprintf(detail + n, sizeof detail - (size_t)n, ", ckpt pause %.0f ms + write %.0f ms",
                         num(d, "ckpt_pause_ms"), num(d, "ckpt_write_ms"));
        }
        size_t n = strlen(detail);
        if (alive && cJSON_IsTrue(obj(d, "silent")) && n < sizeof detail)
            snprintf(detail + n, sizeof detail - n, " (silent for %.1f s: as last heard)", num(d, "heartbeat_age_ms") / 1000);
        printf("%-8s %4.0f %8.0f %-5s %-9s %s\n", str(d, "role"), num(d, "gpu"), num(d, "pid"), alive ? "yes" : "no",
               alive ? str(d, "state") : "-", detail);
    }
}

static void show_counts(const cJSON *b)
{
    printf("batches of the epochs scheduled so far: %.0f: pending %.0f, leased %.0f, published %.0f, trained %.0f, checkpointed %.0f"
           " (re-queued %.0f, duplicates %.0f, extra copies retracted %.0f)\n", num(b, "total"), num(b, "pending"),
           num(b, "leased"), num(b, "published"), num(b, "trained"), num(b, "checkpointed"), num(b, "requeued"),
           num(b, "duplicates"), num(b, "retracted"));
}

static void show_errors_rows(const cJSON *errors)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, errors) {
        time_t t = (time_t)(num(e, "wall_ms") / 1000);
        char when[32];
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
        printf("  %s %s@%.0f pid %.0f %s%s\n", when, str(e, "role"), num(e, "gpu"), num(e, "pid"),
               cJSON_IsTrue(obj(e, "fatal")) ? "FATAL: " : "", str(e, "message"));
    }
}

static void show_status(const cJSON *s)
{
    const cJSON *ep = obj(s, "epoch"), *ring = obj(s, "ring"), *g = obj(s, "group"), *dr = obj(s, "drafter");
    int why = *str(s, "reason") != 0;
    printf("state: %s%s%s%s   cluster %s, run %s, up %.1f s%s\n", str(s, "state"), why ? " (" : "", str(s, "reason"),
           why ? ")" : "", str(s, "cluster"), str(s, "run"), num(s, "uptime_s"),
           cJSON_IsTrue(obj(s, "recovering")) ? ", recovering" : "");
    /* Epochs are counted from 1 here and from 0 in batch ids ("3:797" is in epoch 4), as in the logs. */
    double cur = num(ep, "current"), in_epoch = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, obj(ep, "per_epoch"))
        if (num(e, "epoch") == cur && num(e, "batches") > 0)
            in_epoch = 100 * num(e, "checkpointed") / num(e, "batches");
    char part[48] = "";
    if (in_epoch >= 0)
        snprintf(part, sizeof part, ": %.1f%% of it checkpointed", in_epoch);
    printf("epoch %.0f of %.0f (batch ids %.0f:*)%s; the run: %.1f%% (%.0f of about %.0f batches checkpointed)\n",
           cur + 1, num(ep, "epochs"), cur, part, 100 * num(ep, "progress"), num(ep, "done_batches"),
           num(ep, "total_batches"));
    show_counts(obj(s, "batches"));
    const cJSON *ls = obj(s, "listen");
    printf("listening on %s%s%s\n", str(ls, "socket"), *str(ls, "tcp") ? " and TCP " : "", str(ls, "tcp"));
    const cJSON *tm = obj(s, "coordinator");
    printf("coordinator: %.0f ledger commits, last %.2f ms (max %.1f); periodic checks %.2f ms (max %.1f); "
           "loop held up %.0f times (longest %.0f ms)\n",
           num(tm, "commits"), num(tm, "commit_ms"), num(tm, "commit_ms_max"), num(tm, "check_ms"),
           num(tm, "check_ms_max"), num(tm, "stalls"), num(tm, "stall_ms_max"));
    printf("ring %s: %.0f slots: free %.0f, writing %.0f, ready %.0f, reading %.0f (stuck %.0f)\n", str(ring, "name"),
           num(ring, "slots"), num(ring, "free"), num(ring, "writing"), num(ring, "ready"), num(ring, "reading"),
           num(ring, "stuck_writing"));
    const cJSON *ck = obj(g, "checkpoint");
    char waiting[48] = "";
    if (num(g, "drafters_waiting") > 0)
        snprintf(waiting, sizeof waiting, " (%.0f drafter%s waiting to join)", num(g, "drafters_waiting"),
                 num(g, "drafters_waiting") == 1 ? "" : "s");
    printf("drafter group: generation %.0f, %s, %.0f/%.0f ranks%s; checkpoint %s (step %.0f)\n", num(g, "generation"),
           cJSON_IsTrue(obj(g, "active")) ? "running" : "not formed", num(g, "ranks_connected"), num(g, "world_size"),
           waiting, *str(ck, "dir") ? str(ck, "dir") : "none", num(ck, "step"));
    if (!isnan(num(dr, "step")))
        printf("training: step %.0f, loss %.4g, accuracy %.3f, accept %.2f, grad norm %.3g, lr %.3g, %.0f tok/s;"
               " targets %.0f tok/s\n", num(dr, "step"), num(dr, "loss"), num(dr, "accuracy"), num(dr, "accept_len"),
               num(dr, "grad_norm"), num(dr, "lr"), num(dr, "tokens_per_s"), num(dr, "target_tokens_per_s"));
    show_daemon_rows(obj(s, "daemons"));
    printf("errors: %.0f (%.0f fatal)\n", num(s, "error_count"), num(s, "fatal_count"));
    show_errors_rows(obj(s, "errors"));
}

static const char *num_or_dash(char *buf, size_t n, double v, int have)
{
    if (have)
        snprintf(buf, n, "%.0f", v);
    else
        snprintf(buf, n, "-");
    return buf;
}

static void show_ring(const cJSON *r)
{
    printf("ring %s: %.0f slots of %.0f tokens (hidden %.0f x %.0f layers): free %.0f, writing %.0f, ready %.0f, reading %.0f\n",
           str(r, "name"), num(r, "slots"), num(r, "max_tokens"), num(r, "hidden"), num(r, "layers"), num(r, "free"),
           num(r, "writing"), num(r, "ready"), num(r, "reading"));
    printf("%5s %-8s %8s %10s %12s %8s %10s\n", "SLOT", "STATE", "OWNER", "SEQ", "BATCH", "TOKENS", "AGE");
    const cJSON *s;
    cJSON_ArrayForEach(s, obj(r, "slot_list")) {
        char batch[32] = "-", owner[16] = "-", seq[24], tokens[16];
        /* A slot's seq, batch and tokens are those of the last payload published in it: a WRITING
         * slot's are of the one before the payload being written, whose batch is not known yet. */
        int writing = !strcmp(str(s, "state"), "WRITING");
        if (!writing && (num(s, "seq") > 0 || strcmp(str(s, "state"), "FREE")))
            snprintf(batch, sizeof batch, "%.0f:%.0f", num(s, "epoch"), num(s, "index"));
        if (num(s, "pid") > 0)
            snprintf(owner, sizeof owner, "%.0f", num(s, "pid"));
        printf("%5.0f %-8s %8s %10s %12s %8s %8.1f s%s\n", num(s, "slot"), str(s, "state"), owner,
               num_or_dash(seq, sizeof seq, num(s, "seq"), !writing), batch,
               num_or_dash(tokens, sizeof tokens, num(s, "tokens"), !writing), num(s, "age_ms") / 1000,
               cJSON_IsTrue(obj(s, "stuck")) ? " STUCK" : "");
    }
}

static void show_daemons(const cJSON *d) { show_daemon_rows(obj(d, "daemons")); }

static void show_batches(const cJSON *b)
{
    show_counts(obj(b, "batches"));
    const cJSON *e;
    cJSON_ArrayForEach(e, obj(obj(b, "epoch"), "per_epoch"))
        printf("epoch %.0f (batch ids %.0f:*): %.0f of %.0f batches checkpointed\n", num(e, "epoch") + 1, num(e, "epoch"),
               num(e, "checkpointed"), num(e, "batches"));
    printf("%-12s %-12s %7s %7s %6s %6s %8s %6s %8s\n", "BATCH", "STATE", "SAMPLES", "TOKENS", "LEASES", "SLOT", "HOLDER",
           "GEN", "STEP");
    cJSON_ArrayForEach(e, obj(b, "in_flight")) {
        char id[32], slot[16], holder[16], gen[24], step[24];
        snprintf(id, sizeof id, "%.0f:%.0f", num(e, "epoch"), num(e, "index"));
        /* not in a slot, not held, not trained yet: "-" */
        int trained = !strcmp(str(e, "state"), "trained");
        printf("%-12s %-12s %7.0f %7.0f %6.0f %6s %8s %6s %8s\n", id, str(e, "state"), num(e, "samples"),
               num(e, "tokens"), num(e, "leases"), num_or_dash(slot, sizeof slot, num(e, "slot"), num(e, "slot") >= 0),
               num_or_dash(holder, sizeof holder, num(e, "holder_pid"), num(e, "holder_pid") > 0),
               num_or_dash(gen, sizeof gen, num(e, "generation"), trained),
               num_or_dash(step, sizeof step, num(e, "step"), trained));
    }
}

static void show_errors(const cJSON *e)
{
    printf("errors: %.0f (%.0f fatal)\n", num(e, "count"), num(e, "fatal"));
    show_errors_rows(obj(e, "errors"));
}

static int cmd_status(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return query(x, PROTO_Q_STATUS, show_status); }
static int cmd_ring(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return query(x, PROTO_Q_RING, show_ring); }
static int cmd_daemons(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return query(x, PROTO_Q_DAEMONS, show_daemons); }
static int cmd_batches(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return query(x, PROTO_Q_BATCHES, show_batches); }
static int cmd_errors(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return query(x, PROTO_Q_ERRORS, show_errors); }

static void show_checkpoints(const cJSON *c)
{
    const cJSON *h = obj(c, "head"), *e;
    if (cJSON_IsObject(h))
        printf("lineage head: step %.0f (generation %.0f) %s\n", num(h, "step"), num(h, "generation"), str(h, "dir"));
    else
        printf("lineage head: none (the group starts from scratch)\n");
    printf("%8s %6s %-20s %-8s %s\n", "STEP", "GEN", "WRITTEN (UTC)", "LINEAGE", "DIR");
    cJSON_ArrayForEach(e, obj(c, "checkpoints")) {
        char when[32] = "-";
        time_t t = (time_t)(num(e, "written_ms") / 1000.0);
        struct tm tm;
        if (t > 0 && gmtime_r(&t, &tm))
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
        const cJSON *d = obj(e, "dropped");
        int head = cJSON_IsObject(h) && num(h, "step") == num(e, "step") && !strcmp(str(h, "dir"), str(e, "dir"));
        printf("%8.0f %6.0f %-20s %-8s %s\n", num(e, "step"), num(e, "generation"), when,
               cJSON_IsString(d) ? "dropped" : head ? "head" : "yes", str(e, "dir"));
        if (cJSON_IsString(d))
            printf("%8s %6s   %s\n", "", "", d->valuestring);
    }
}
static int cmd_checkpoints(struct ctx *x, int argc, char **argv) { (void)argc, (void)argv; return query(x, PROTO_Q_CHECKPOINTS, show_checkpoints); }

static int control(struct ctx *x, enum proto_control_cmd cmd, int argc, char **argv)
{
    char reason[PROTO_TEXT_MAX] = "";
    size_t n = 0;
    for (int i = 0; i < argc && n < sizeof reason - 1; i++)
        n += (size_t)snprintf(reason + n, sizeof reason - n, "%s%s", i ? " " : "", argv[i]);
    char *json = NULL, err[512];
    int status = 0;
    if (client_control(x->c, cmd, reason, &json, &status, err, sizeof err) < 0) {
        fprintf(stderr, "dflashctl: %s\n", err);
        return EX_FAIL;
    }
    cJSON *doc = cJSON_Parse(json);
    if (x->json)
        puts(json);
    else if (!doc)
        fprintf(stderr, "dflashctl: the coordinator sent malformed JSON\n");
    else if (status < 0)
        fprintf(stderr, "dflashctl: %s: %s\n", proto_control_name(cmd), str(doc, "error"));
    else
        printf("%s: cluster is %s\n", proto_control_name(cmd), str(doc, "state"));
    cJSON_Delete(doc);
    free(json);
    return status < 0 ? EX_FAIL : EX_OK;
}

static int cmd_pause(struct ctx *x, int argc, char **argv) { return control(x, PROTO_CTL_PAUSE, argc, argv); }
static int cmd_resume(struct ctx *x, int argc, char **argv) { return control(x, PROTO_CTL_RESUME, argc, argv); }
static int cmd_drain(struct ctx *x, int argc, char **argv) { return control(x, PROTO_CTL_DRAIN, argc, argv); }
static int cmd_stop(struct ctx *x, int argc, char **argv) { return control(x, PROTO_CTL_STOP, argc, argv); }

static const struct cmd_entry {
    const char *name;
    const char *usage;
    int min_args, max_args;
    int (*fn)(struct ctx *, int, char **);
} commands[] = {
    { "status", "cluster state, progress, ring, daemons, errors", 0, 0, cmd_status },
    { "ring", "every ring slot: state, owner, seq, batch, tokens, age", 0, 0, cmd_ring },
    { "daemons", "registered daemons with their timings", 0, 0, cmd_daemons },
    { "batches", "batch counts per state and epoch, batches in flight", 0, 0, cmd_batches },
    { "errors", "errors reported by the daemons", 0, 0, cmd_errors },
    { "checkpoints", "the ledger's checkpoints, newest first: the lineage head, those dropped and why", 0, 0, cmd_checkpoints },
    { "pause", "[REASON]: stop leasing, pause targets and drafters", 0, 64, cmd_pause },
    { "resume", "[REASON]: continue after a pause", 0, 64, cmd_resume },
    { "drain", "[REASON]: finish in-flight work, final checkpoint, stop", 0, 64, cmd_drain },
    { "stop", "[REASON]: stop every daemon now", 0, 64, cmd_stop },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dflashctl [-s SOCKET | -c CONFIG | --connect HOST:PORT --token-file PATH] [--json] [-n LIMIT]\n"
               "                 COMMAND [ARGS]\n"
               "  -s SOCKET  the coordinator's control socket\n"
               "  -c CONFIG  take the socket from this dflash.ini (default $DFLASH_CONFIG, else the\n"
               "             DFLASH_CONFIG of /etc/default/dflash, else /etc/dflash/dflash.ini)\n"
               "  --connect HOST:PORT  the coordinator's TCP listener (cluster.tcp_listen; [IPv6]:PORT)\n"
               "  --token-file PATH    its shared secret (a copy of cluster.tcp_token_file, mode 0600)\n"
               "  --json     print the coordinator's JSON document (read commands)\n"
               "  -n LIMIT   rows for batches / errors / checkpoints (default 100; errors keeps the newest 64)\n"
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
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return EX_OK;
        } else if ((!strcmp(a, "--connect") || !strcmp(a, "--token-file")) && i + 1 < argc) {
            if (a[2] == 'c')
                x.connect = argv[++i];
            else
                x.token_file = argv[++i];
        } else if ((!strcmp(a, "-s") || !strcmp(a, "-c") || !strcmp(a, "-n")) && i + 1 < argc) {
            const char *v = argv[++i];
            if (a[1] == 's') {
                x.socket = v;
            } else if (a[1] == 'c') {
                config = v;
            } else {
                char *end;
                errno = 0;
                unsigned long n = strtoul(v, &end, 10);
                if (errno || end == v || *end || v[0] == '-' || n < 1 || n > 1000000) {
                    fprintf(stderr, "dflashctl: -n %s: not a count in [1, 1000000]\n", v);
                    return EX_USAGE;
                }
                x.limit = (uint32_t)n;
            }
        } else if (!strcmp(a, "--connect") || !strcmp(a, "--token-file") || !strcmp(a, "-s") || !strcmp(a, "-c") ||
                   !strcmp(a, "-n")) {
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
        fprintf(stderr, "dflashctl: %s: wrong number of arguments (%s)\n", ce->name, ce->usage);
        return EX_USAGE;
    }

    char path[CFG_STR_MAX + 80];
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
        if (cfg_load(&cfg, config, err, sizeof err) < 0) {
            /* A mistake elsewhere in the file (an edit for the next run) must not keep the
             * operator from the running cluster: the socket from [cluster] as it stands. */
            char err2[512];
            if (cfg_load_section(&cfg, config, "cluster", err2, sizeof err2) < 0) {
                fprintf(stderr, "dflashctl: %s\n", err);
                return EX_FAIL;
            }
            fprintf(stderr, "dflashctl: warning: %s (the socket taken from its [cluster] section)\n", err);
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
        fprintf(stderr, "dflashctl: %s\n", err);
        char why[512];
        if (x.socket && stop_note_read(x.socket, why, sizeof why) == 1)   /* the cluster ended: say how */
            fprintf(stderr, "dflashctl: the coordinator ended the cluster (%s.stopped): %s\n", x.socket, why);
        return EX_FAIL;
    }
    int rc = ce->fn(&x, nargs, words + 1);
    client_free(x.c);
    return rc;
}
