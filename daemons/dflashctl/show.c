/* show.c: dflashctl's tables, made from the coordinator's JSON replies (and, at the end, from the
 * documents of a ledger read by ledger_view.c). A reply is outside input (--connect may reach any
 * endpoint): a field missing or of another type prints as "nan", "" or "-", never as undefined
 * behaviour (tests/fuzz/fuzz_ctl.c). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "common/text.h"
#include "daemons/dflashctl/show.h"

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

const char *ctl_str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

void ctl_clean(cJSON *doc)
{
    for (cJSON *c = doc; c; c = c->next) {
        if (c->string)
            text_clean(c->string);
        if (cJSON_IsString(c) && c->valuestring)
            text_clean(c->valuestring);
        ctl_clean(c->child);
    }
}

cJSON *ctl_parse(const char *json)
{
    cJSON *doc = cJSON_Parse(json);
    ctl_clean(doc);
    return doc;
}

static const cJSON *obj(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static void show_daemon_rows(FILE *out, const cJSON *daemons)
{
    fprintf(out, "%-8s %4s %8s %-5s %-9s %s\n", "ROLE", "GPU", "PID", "ALIVE", "STATE", "DETAIL");
    const cJSON *d;
    cJSON_ArrayForEach(d, daemons) {
        int alive = cJSON_IsTrue(obj(d, "alive"));
        char detail[384];
        if (!alive && cJSON_IsNumber(obj(d, "back_as")))   /* (the same process, connected again) */
            snprintf(detail, sizeof detail, "left: %s; connected again since", ctl_str(d, "left_reason"));
        else if (!alive)
            snprintf(detail, sizeof detail, "left: %s", ctl_str(d, "left_reason"));
        else if (!strcmp(ctl_str(d, "role"), "target"))
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
        fprintf(out, "%-8s %4.0f %8.0f %-5s %-9s %s\n", ctl_str(d, "role"), num(d, "gpu"), num(d, "pid"), alive ? "yes" : "no",
               alive ? ctl_str(d, "state") : "-", detail);
    }
}

static void show_counts(FILE *out, const cJSON *b)
{
    fprintf(out, "batches of the epochs scheduled so far: %.0f: pending %.0f, leased %.0f, published %.0f, trained %.0f, checkpointed %.0f"
           " (re-queued %.0f, duplicates %.0f, extra copies retracted %.0f)\n", num(b, "total"), num(b, "pending"),
           num(b, "leased"), num(b, "published"), num(b, "trained"), num(b, "checkpointed"), num(b, "requeued"),
           num(b, "duplicates"), num(b, "retracted"));
}

/* A wall clock time in ms since the epoch as "YYYY-mm-dd HH:MM:SS" (local or UTC) into when;
 * "-" for what is no such time (not a number, negative, past year 9999: a foreign reply). */
static void fmt_wall(char *when, size_t len, double ms, int utc)
{
    snprintf(when, len, "-");
    if (!isfinite(ms) || ms <= 0 || ms >= 253402300800000.0)
        return;
    time_t t = (time_t)(ms / 1000.0);
    struct tm tm;
    if (utc ? gmtime_r(&t, &tm) != NULL : localtime_r(&t, &tm) != NULL)
        strftime(when, len, "%Y-%m-%d %H:%M:%S", &tm);
}

static void show_errors_rows(FILE *out, const cJSON *errors)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, errors) {
        char when[32];
        fmt_wall(when, sizeof when, num(e, "wall_ms"), 0);
        /* Who: the coordinator by its name; a daemon by role@gpu and pid (a GPU unknown: without
         * it), or not at all when the message begins by naming this very daemon, pid and all
         * ("target-d@0 (pid 7) died ...", "drafter-d (pid 9) died while away ..."). */
        const char *role = ctl_str(e, "role"), *msg = ctl_str(e, "message");
        double gpu = num(e, "gpu"), pid = num(e, "pid");
        char who[96], named[96];
        if (!strcmp(role, "coordinator"))
            snprintf(who, sizeof who, "coordinator ");
        else if (gpu < 0)
            snprintf(who, sizeof who, "%s pid %.0f ", role, pid);
        else
            snprintf(who, sizeof who, "%s@%.0f pid %.0f ", role, gpu, pid);
        if (gpu < 0)
            snprintf(named, sizeof named, "%s-d (pid %.0f)", role, pid);
        else
            snprintf(named, sizeof named, "%s-d@%.0f (pid %.0f)", role, gpu, pid);
        if (strcmp(role, "coordinator") && !strncmp(msg, named, strlen(named)))
            who[0] = 0;
        fprintf(out, "  %s %s%s%s\n", when, who, cJSON_IsTrue(obj(e, "fatal")) ? "FATAL: " : "", msg);
    }
}

void ctl_show_status(FILE *out, const cJSON *s)
{
    const cJSON *ep = obj(s, "epoch"), *ring = obj(s, "ring"), *g = obj(s, "group"), *dr = obj(s, "drafter");
    int why = *ctl_str(s, "reason") != 0;
    fprintf(out, "state: %s%s%s%s   cluster %s, run %s, up %.1f s%s\n", ctl_str(s, "state"), why ? " (" : "", ctl_str(s, "reason"),
           why ? ")" : "", ctl_str(s, "cluster"), ctl_str(s, "run"), num(s, "uptime_s"),
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
    fprintf(out, "epoch %.0f of %.0f (batch ids %.0f:*)%s; the run: %.1f%% (%.0f of about %.0f batches checkpointed)\n",
           cur + 1, num(ep, "epochs"), cur, part, 100 * num(ep, "progress"), num(ep, "done_batches"),
           num(ep, "total_batches"));
    show_counts(out, obj(s, "batches"));
    const cJSON *ls = obj(s, "listen");
    fprintf(out, "listening on %s%s%s\n", ctl_str(ls, "socket"), *ctl_str(ls, "tcp") ? " and TCP " : "", ctl_str(ls, "tcp"));
    const cJSON *tm = obj(s, "coordinator");
    fprintf(out, "coordinator: %.0f ledger commit%s, last %.2f ms (max %.2f ms); periodic checks %.2f ms (max %.2f ms); "
           "loop held up %.0f time%s (longest %.0f ms)\n",
           num(tm, "commits"), num(tm, "commits") == 1 ? "" : "s", num(tm, "commit_ms"), num(tm, "commit_ms_max"),
           num(tm, "check_ms"), num(tm, "check_ms_max"), num(tm, "stalls"), num(tm, "stalls") == 1 ? "" : "s",
           num(tm, "stall_ms_max"));
    const cJSON *sp = obj(s, "space");
    if (num(sp, "min_free_mb") > 0 && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(sp, "free_mb")))
        fprintf(out, "space: %.0f MiB free in %s (pauses below %.0f MiB)%s\n", num(sp, "free_mb"), ctl_str(sp, "where"),
                num(sp, "min_free_mb"), cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sp, "paused")) ?
                ", paused until twice that" : "");
    fprintf(out, "ring %s: %.0f slots: free %.0f, writing %.0f, ready %.0f, reading %.0f (stuck %.0f)\n", ctl_str(ring, "name"),
           num(ring, "slots"), num(ring, "free"), num(ring, "writing"), num(ring, "ready"), num(ring, "reading"),
           num(ring, "stuck_writing"));
    const cJSON *ck = obj(g, "checkpoint");
    char waiting[48] = "";
    if (num(g, "drafters_waiting") > 0)
        snprintf(waiting, sizeof waiting, " (%.0f drafter%s waiting to join)", num(g, "drafters_waiting"),
                 num(g, "drafters_waiting") == 1 ? "" : "s");
    fprintf(out, "drafter group: generation %.0f, %s, %.0f/%.0f ranks%s; checkpoint %s (step %.0f)\n", num(g, "generation"),
           !cJSON_IsTrue(obj(g, "active")) ? "not formed"
           : num(g, "ranks_connected") < num(g, "world_size") ? "formed, waiting for its ranks to come back"
           : !strcmp(ctl_str(s, "state"), "paused") ? "formed, paused" : "running",
           num(g, "ranks_connected"), num(g, "world_size"),
           waiting, *ctl_str(ck, "dir") ? ctl_str(ck, "dir") : "none", num(ck, "step"));
    if (!isnan(num(dr, "step")))
        fprintf(out, "training%s: step %.0f, loss %.4g, accuracy %.3f, accept %.2f, grad norm %.3g, lr %.3g, %.0f tok/s;"
               " targets %.0f tok/s\n", cJSON_IsTrue(obj(dr, "silent")) ? " (as last heard: no drafter heard from lately)" : "",
               num(dr, "step"), num(dr, "loss"), num(dr, "accuracy"), num(dr, "accept_len"),
               num(dr, "grad_norm"), num(dr, "lr"), num(dr, "tokens_per_s"), num(dr, "target_tokens_per_s"));
    show_daemon_rows(out, obj(s, "daemons"));
    fprintf(out, "errors: %.0f (%.0f fatal)\n", num(s, "error_count"), num(s, "fatal_count"));
    show_errors_rows(out, obj(s, "errors"));
}

static const char *num_or_dash(char *buf, size_t n, double v, int have)
{
    if (have)
        snprintf(buf, n, "%.0f", v);
    else
        snprintf(buf, n, "-");
    return buf;
}

void ctl_show_ring(FILE *out, const cJSON *r)
{
    fprintf(out, "ring %s: %.0f slots of %.0f tokens (hidden %.0f x %.0f layers): free %.0f, writing %.0f, ready %.0f, reading %.0f\n",
           ctl_str(r, "name"), num(r, "slots"), num(r, "max_tokens"), num(r, "hidden"), num(r, "layers"), num(r, "free"),
           num(r, "writing"), num(r, "ready"), num(r, "reading"));
    fprintf(out, "%5s %-8s %8s %10s %12s %8s %10s\n", "SLOT", "STATE", "OWNER", "SEQ", "BATCH", "TOKENS", "AGE");
    const cJSON *s;
    cJSON_ArrayForEach(s, obj(r, "slot_list")) {
        char batch[32] = "-", owner[16] = "-", seq[24], tokens[16];
        /* A slot's seq, batch and tokens are those of the last payload published in it: a WRITING
         * slot's are of the one before the payload being written, whose batch is not known yet. */
        int writing = !strcmp(ctl_str(s, "state"), "WRITING");
        if (!writing && (num(s, "seq") > 0 || strcmp(ctl_str(s, "state"), "FREE")))
            snprintf(batch, sizeof batch, "%.0f:%.0f", num(s, "epoch"), num(s, "index"));
        if (num(s, "pid") > 0)
            snprintf(owner, sizeof owner, "%.0f", num(s, "pid"));
        fprintf(out, "%5.0f %-8s %8s %10s %12s %8s %8.1f s%s\n", num(s, "slot"), ctl_str(s, "state"), owner,
               num_or_dash(seq, sizeof seq, num(s, "seq"), !writing), batch,
               num_or_dash(tokens, sizeof tokens, num(s, "tokens"), !writing), num(s, "age_ms") / 1000,
               cJSON_IsTrue(obj(s, "stuck")) ? " STUCK" : "");
    }
}

void ctl_show_daemons(FILE *out, const cJSON *d) { show_daemon_rows(out, obj(d, "daemons")); }

static void show_per_epoch(FILE *out, const cJSON *ep);

void ctl_show_batches(FILE *out, const cJSON *b)
{
    show_counts(out, obj(b, "batches"));
    show_per_epoch(out, obj(b, "epoch"));
    const cJSON *e;
    fprintf(out, "%-12s %-12s %7s %7s %6s %6s %8s %6s %8s\n", "BATCH", "STATE", "SAMPLES", "TOKENS", "LEASES", "SLOT", "HOLDER",
           "GEN", "STEP");
    cJSON_ArrayForEach(e, obj(b, "in_flight")) {
        char id[32], slot[16], holder[16], gen[24], step[24];
        snprintf(id, sizeof id, "%.0f:%.0f", num(e, "epoch"), num(e, "index"));
        /* not in a slot, not held, not trained yet: "-" */
        int trained = !strcmp(ctl_str(e, "state"), "trained");
        fprintf(out, "%-12s %-12s %7.0f %7.0f %6.0f %6s %8s %6s %8s\n", id, ctl_str(e, "state"), num(e, "samples"),
               num(e, "tokens"), num(e, "leases"), num_or_dash(slot, sizeof slot, num(e, "slot"), num(e, "slot") >= 0),
               num_or_dash(holder, sizeof holder, num(e, "holder_pid"), num(e, "holder_pid") > 0),
               num_or_dash(gen, sizeof gen, num(e, "generation"), trained),
               num_or_dash(step, sizeof step, num(e, "step"), trained));
    }
}

void ctl_show_errors(FILE *out, const cJSON *e)
{
    fprintf(out, "errors: %.0f (%.0f fatal)\n", num(e, "count"), num(e, "fatal"));
    show_errors_rows(out, obj(e, "errors"));
}

void ctl_show_checkpoints(FILE *out, const cJSON *c)
{
    const cJSON *h = obj(c, "head"), *e;
    if (cJSON_IsObject(h))
        fprintf(out, "lineage head: step %.0f (generation %.0f) %s\n", num(h, "step"), num(h, "generation"), ctl_str(h, "dir"));
    else
        fprintf(out, "lineage head: none (the group starts from scratch)\n");
    fprintf(out, "%8s %6s %-20s %-8s %-7s %s\n", "STEP", "GEN", "WRITTEN (UTC)", "LINEAGE", "ON DISK", "DIR");
    cJSON_ArrayForEach(e, obj(c, "checkpoints")) {
        char when[32];
        fmt_wall(when, sizeof when, num(e, "written_ms"), 1);
        const cJSON *d = obj(e, "dropped");
        int head = cJSON_IsObject(h) && num(h, "step") == num(e, "step") && !strcmp(ctl_str(h, "dir"), ctl_str(e, "dir"));
        const cJSON *disk = obj(e, "on_disk");     /* no: pruned (drafter.keep_checkpoints) or removed */
        fprintf(out, "%8.0f %6.0f %-20s %-8s %-7s %s\n", num(e, "step"), num(e, "generation"), when,
               cJSON_IsString(d) ? "dropped" : head ? "head" : "yes",
               cJSON_IsTrue(disk) ? "yes" : cJSON_IsFalse(disk) ? "no" : "?", ctl_str(e, "dir"));
        if (cJSON_IsString(d))
            fprintf(out, "%8s %6s   %s\n", "", "", d->valuestring);
    }
}

/* ---- dflashctl --ledger: the documents of ledger_view.c ---- */

static void show_ledger_counts(FILE *out, const cJSON *b, const char *tail)
{
    char other[48] = "";
    if (num(b, "other") > 0)    /* rows of a state no coordinator writes */
        snprintf(other, sizeof other, ", of no known state %.0f", num(b, "other"));
    fprintf(out, "batches of the epochs scheduled: %.0f: pending %.0f, leased %.0f, published %.0f, trained %.0f, "
            "checkpointed %.0f%s%s\n", num(b, "total"), num(b, "pending"), num(b, "leased"), num(b, "published"),
            num(b, "trained"), num(b, "checkpointed"), other, tail);
}

/* An epoch a line, those with every batch checkpointed counted in one (a long run has hundreds). */
static void show_per_epoch(FILE *out, const cJSON *ep)
{
    const cJSON *e;
    int done = 0;
    cJSON_ArrayForEach(e, obj(ep, "per_epoch"))
        done += num(e, "batches") > 0 && num(e, "checkpointed") == num(e, "batches");
    if (done > 1)
        fprintf(out, "%d epochs with every batch checkpointed\n", done);
    cJSON_ArrayForEach(e, obj(ep, "per_epoch"))
        if (done <= 1 || !(num(e, "batches") > 0 && num(e, "checkpointed") == num(e, "batches")))
            fprintf(out, "epoch %.0f (batch ids %.0f:*): %.0f of %.0f batches checkpointed\n", num(e, "epoch") + 1,
                    num(e, "epoch"), num(e, "checkpointed"), num(e, "batches"));
}

void ctl_show_ledger_status(FILE *out, const cJSON *s)
{
    const cJSON *fl = obj(s, "flags"), *ep = obj(s, "epoch"), *g = obj(s, "group"), *ck = obj(g, "checkpoint");
    const cJSON *tr = obj(s, "trains"), *cks = obj(s, "checkpoints");
    char when[32];
    fmt_wall(when, sizeof when, num(s, "created_ms"), 1);
    fprintf(out, "ledger %s (schema %.0f): run %s, created %s UTC, dataset %s\n", ctl_str(s, "ledger"), num(s, "schema"),
            *ctl_str(s, "run") ? ctl_str(s, "run") : "(none)", when,
            *ctl_str(s, "dataset") ? ctl_str(s, "dataset") : "(none)");
    /* The state a coordinator saved last: a coordinator that crashed (or still runs) left it as it was. */
    const char *state = ctl_str(s, "state");
    char notes[640] = "";
    size_t n = 0;
    if (cJSON_IsTrue(obj(fl, "fatal")) && strcmp(state, "failed"))
        n += (size_t)snprintf(notes + n, sizeof notes - n, "; a fatal error: the run ends failed");
    if (cJSON_IsTrue(obj(fl, "space_paused")) && n < sizeof notes)
        n += (size_t)snprintf(notes + n, sizeof notes - n, "; paused for want of disk space");
    if (cJSON_IsTrue(obj(fl, "nan_pending")) && n < sizeof notes)
        n += (size_t)snprintf(notes + n, sizeof notes - n, "; a non-finite loss (step %.0f) waits for a resume",
                              num(fl, "nan_step"));
    if (cJSON_IsTrue(obj(fl, "failed_open")) && n < sizeof notes)
        snprintf(notes + n, sizeof notes - n, "; its coordinator's exit is not recorded (a start ends the run "
                 "failed again)");
    int why = *ctl_str(s, "reason") != 0;
    fprintf(out, "state: %s%s%s%s, as its coordinator last recorded it%s\n", *state ? state : "none recorded",
            why ? " (" : "", ctl_str(s, "reason"), why ? ")" : "", notes);
    /* the count of a ledger that says its epochs, else the estimate of the first group's forming */
    if (cJSON_IsNumber(obj(ep, "total_batches")) && num(ep, "total_batches") > 0)
        fprintf(out, "epochs scheduled: %.0f of %.0f; the run: %.1f%% (%.0f of %s%.0f batches checkpointed)\n",
                num(ep, "scheduled"), num(ep, "epochs"), 100 * num(ep, "done_batches") / num(ep, "total_batches"),
                num(ep, "done_batches"), num(ep, "scheduled") == num(ep, "epochs") ? "" : "about ",
                num(ep, "total_batches"));
    else if (cJSON_IsNumber(obj(ep, "run_batches")) && num(ep, "run_batches") > 0)
        fprintf(out, "epochs scheduled: %.0f; the run: %.1f%% (%.0f of about %.0f batches checkpointed)\n",
                num(ep, "scheduled"), 100 * num(ep, "done_batches") / num(ep, "run_batches"), num(ep, "done_batches"),
                num(ep, "run_batches"));
    else
        fprintf(out, "epochs scheduled: %.0f; %.0f batches checkpointed\n", num(ep, "scheduled"), num(ep, "done_batches"));
    show_per_epoch(out, ep);
    char tail[64] = "";
    if (cJSON_IsNumber(obj(s, "last_change_ms"))) {
        fmt_wall(when, sizeof when, num(s, "last_change_ms"), 1);
        snprintf(tail, sizeof tail, "; last change %s UTC", when);
    }
    show_ledger_counts(out, obj(s, "batches"), tail);
    char ranks[32] = "";
    if (cJSON_IsNumber(obj(g, "world_size")))
        snprintf(ranks, sizeof ranks, " (%.0f rank%s)", num(g, "world_size"), num(g, "world_size") == 1 ? "" : "s");
    if (*ctl_str(ck, "dir"))
        fprintf(out, "drafter group: generation %.0f%s, %s; lineage head: step %.0f (generation %.0f) %s\n",
                cJSON_IsNumber(obj(g, "generation")) ? num(g, "generation") : 0, ranks,
                cJSON_IsTrue(obj(g, "active")) ? "formed" : "not formed", num(ck, "step"), num(ck, "generation"),
                ctl_str(ck, "dir"));
    else
        fprintf(out, "drafter group: generation %.0f%s, %s; lineage head: none (a group starts from scratch)\n",
                cJSON_IsNumber(obj(g, "generation")) ? num(g, "generation") : 0, ranks,
                cJSON_IsTrue(obj(g, "active")) ? "formed" : "not formed");
    fprintf(out, "checkpoints: %.0f written, %.0f dropped from the lineage\n", num(cks, "count"), num(cks, "dropped"));
    fprintf(out, "trainings: %.0f recorded, %.0f rolled back; batches trained more than once in the lineage: %.0f; "
            "checkpointed batches not trained exactly once: %.0f\n", num(tr, "rows"), num(tr, "rolled_back"),
            num(tr, "trained_twice"), num(tr, "checkpointed_not_once"));
    fprintf(out, "errors: %.0f (%.0f fatal)\n", num(s, "error_count"), num(s, "fatal_count"));
    show_errors_rows(out, obj(s, "errors"));
}

void ctl_show_ledger_batches(FILE *out, const cJSON *b)
{
    show_ledger_counts(out, obj(b, "batches"), "");
    show_per_epoch(out, obj(b, "epoch"));
    fprintf(out, "%-12s %-12s %7s %7s %6s %6s %6s %8s %6s %s\n", "BATCH", "STATE", "SAMPLES", "TOKENS", "LEASES", "SLOT",
            "GEN", "STEP", "TRAINS", "CHANGED (UTC)");
    const cJSON *e;
    cJSON_ArrayForEach(e, obj(b, "recent")) {
        char id[32], slot[16], gen[24], step[24], when[32];
        snprintf(id, sizeof id, "%.0f:%.0f", num(e, "epoch"), num(e, "index"));
        /* a slot only while published; a generation and step once trained */
        int published = !strcmp(ctl_str(e, "state"), "published");
        int trained = !strcmp(ctl_str(e, "state"), "trained") || !strcmp(ctl_str(e, "state"), "checkpointed");
        fmt_wall(when, sizeof when, num(e, "updated_ms"), 1);
        fprintf(out, "%-12s %-12s %7.0f %7.0f %6.0f %6s %6s %8s %6.0f %s\n", id, ctl_str(e, "state"), num(e, "samples"),
                num(e, "tokens"), num(e, "leases"),
                num_or_dash(slot, sizeof slot, num(e, "slot"), published && num(e, "slot") >= 0),
                num_or_dash(gen, sizeof gen, num(e, "generation"), trained),
                num_or_dash(step, sizeof step, num(e, "step"), trained), num(e, "trains"), when);
    }
}
