/* coord_json.c: the JSON documents dflashctl reads (status, ring, daemons, batches, errors, checkpoints).
 * Keys are an interface: dflashctl, `make demo` and the tests read them. */
#include <errno.h>
#include <sys/stat.h>
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/jsonutil.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "daemons/coordinator/coord.h"
#include "ipc/ring.h"

/* Heard from too long ago for its figures to be current: two heartbeats missed, and a third of
 * the way to being taken for dead (a daemon's waits and steps send them up to that late). */
static bool coord_silent(const struct coord *co, const struct member *m, uint64_t now)
{
    uint64_t hb2 = 2 * (uint64_t)co->cfg->coordinator.heartbeat_ms, dead3 = (uint64_t)co->cfg->coordinator.dead_after_ms / 3;
    return now - m->last_seen_ms > (hb2 > dead3 ? hb2 : dead3);
}

static void add_timings(cJSON *o, int role, const struct proto_heartbeat *hb)
{
    if (role == PROTO_ROLE_TARGET) {
        cJSON_AddNumberToObject(o, "forward_ms", hb->forward_ms);
        cJSON_AddNumberToObject(o, "wait_ms", hb->wait_ms);
        cJSON_AddNumberToObject(o, "write_ms", hb->write_ms);
        cJSON_AddNumberToObject(o, "tokens_per_s", hb->tokens_per_s);
        cJSON_AddNumberToObject(o, "batches_done", (double)hb->batches_done);
    } else if (role == PROTO_ROLE_DRAFTER) {
        cJSON_AddNumberToObject(o, "step", (double)hb->step);
        cJSON_AddNumberToObject(o, "loss", hb->loss);   /* NaN prints as null */
        cJSON_AddNumberToObject(o, "accuracy", hb->accuracy);
        cJSON_AddNumberToObject(o, "accept_len", hb->accept_len);
        cJSON_AddNumberToObject(o, "grad_norm", hb->grad_norm);
        cJSON_AddNumberToObject(o, "lr", hb->lr);
        cJSON_AddNumberToObject(o, "tokens_per_s", hb->tokens_per_s);
        cJSON_AddNumberToObject(o, "idle_frac", hb->idle_frac);
        cJSON_AddNumberToObject(o, "step_ms", hb->step_ms);
        cJSON_AddNumberToObject(o, "h2d_ms", hb->h2d_ms);
        cJSON_AddNumberToObject(o, "ckpt_pause_ms", hb->ckpt_pause_ms);
        cJSON_AddNumberToObject(o, "ckpt_write_ms", hb->ckpt_write_ms);
        cJSON_AddNumberToObject(o, "batches_done", (double)hb->batches_done);
    }
}

static cJSON *daemons_json(struct coord *co)
{
    cJSON *a = cJSON_CreateArray();
    uint64_t now = mono_ms();
    for (struct member *m = co->members; m; m = m->next) {
        if (!m->role || m->role == PROTO_ROLE_CTL || m->closing)
            continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", (double)m->id);
        cJSON_AddStringToObject(o, "role", proto_role_name((unsigned)m->role));
        cJSON_AddNumberToObject(o, "gpu", m->device);
        cJSON_AddNumberToObject(o, "pid", m->pid);
        cJSON_AddStringToObject(o, "name", m->name);
        cJSON_AddBoolToObject(o, "alive", 1);
        /* A daemon that joined while a restarted coordinator was STARTING (its recovery window) is
         * told no RUNNING (nothing changes for it: it works the same in both) and keeps reporting
         * "starting": shown as the cluster is. */
        unsigned st = m->have_hb ? m->hb.state : PROTO_STATE_STARTING;
        if (st == PROTO_STATE_STARTING && co->state == PROTO_STATE_RUNNING && m->have_hb)
            st = PROTO_STATE_RUNNING;
        cJSON_AddStringToObject(o, "state", proto_state_name(st));
        cJSON_AddNumberToObject(o, "connected_s", (double)(now - m->connected_ms) / 1000.0);
        cJSON_AddNumberToObject(o, "heartbeat_age_ms", (double)(now - m->last_seen_ms));
        cJSON_AddBoolToObject(o, "silent", coord_silent(co, m, now));
        if (m->role == PROTO_ROLE_TARGET) {
            cJSON_AddNumberToObject(o, "leases", m->leases);
            cJSON_AddNumberToObject(o, "published", (double)m->published);
        } else {
            cJSON_AddNumberToObject(o, "rank", m->rank);
            cJSON_AddBoolToObject(o, "joined", m->joined);     /* asked for a place in the group */
            cJSON_AddNumberToObject(o, "trained", (double)m->trained);
        }
        add_timings(o, m->role, &m->hb);
        cJSON_AddItemToArray(a, o);
    }
    for (size_t k = 0; k < co->n_departed; k++) {
        const struct departed *d = &co->departed[(co->departed_next + COORD_DEPARTED_MAX - 1 - k) % COORD_DEPARTED_MAX];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "role", proto_role_name((unsigned)d->role));
        cJSON_AddNumberToObject(o, "gpu", d->device);
        cJSON_AddNumberToObject(o, "pid", d->pid);
        cJSON_AddStringToObject(o, "name", d->name);
        cJSON_AddBoolToObject(o, "alive", 0);
        cJSON_AddStringToObject(o, "left_reason", d->reason);
        cJSON_AddNumberToObject(o, "left_wall_ms", (double)d->left_wall_ms);
        /* The same process connected again (closed for its silence, then back): which member it is */
        for (const struct member *m = co->members; m; m = m->next)
            if (m->role == d->role && !m->closing && m->token == d->token) {
                cJSON_AddNumberToObject(o, "back_as", (double)m->id);
                break;
            }
        add_timings(o, d->role, &d->hb);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

static cJSON *ring_json(struct coord *co, int slots)
{
    cJSON *o = cJSON_CreateObject();
    const struct ring_layout *lay = ring_layout(co->ring);
    struct ring_slot_stat *ss = slots ? calloc(lay->nslots, sizeof *ss) : NULL;
    struct ring_stats st;
    ring_stats(co->ring, &st, ss);
    cJSON_AddStringToObject(o, "name", co->ring_name);
    cJSON_AddNumberToObject(o, "slots", st.nslots);
    cJSON_AddNumberToObject(o, "free", st.count[RING_FREE]);
    cJSON_AddNumberToObject(o, "writing", st.count[RING_WRITING]);
    cJSON_AddNumberToObject(o, "ready", st.count[RING_READY]);
    cJSON_AddNumberToObject(o, "reading", st.count[RING_READING]);
    cJSON_AddNumberToObject(o, "stuck_writing", st.stuck_writing);
    cJSON_AddNumberToObject(o, "published", (double)st.published);
    cJSON_AddNumberToObject(o, "consumed", (double)st.consumed);
    cJSON_AddNumberToObject(o, "aborted", (double)st.aborted);
    cJSON_AddNumberToObject(o, "retracted", (double)st.retracted);
    cJSON_AddNumberToObject(o, "reclaimed_writing", (double)st.reclaimed_writing);
    cJSON_AddNumberToObject(o, "reclaimed_reading", (double)st.reclaimed_reading);
    cJSON_AddNumberToObject(o, "writers_waiting", st.writers_waiting);
    cJSON_AddNumberToObject(o, "readers_waiting", st.readers_waiting);
    cJSON_AddNumberToObject(o, "max_tokens", lay->max_tokens);
    cJSON_AddNumberToObject(o, "hidden", lay->hidden);
    cJSON_AddNumberToObject(o, "layers", lay->n_layers);
    if (ss) {
        cJSON *a = cJSON_AddArrayToObject(o, "slot_list");
        for (uint32_t i = 0; i < lay->nslots; i++) {
            cJSON *s = cJSON_CreateObject();
            cJSON_AddNumberToObject(s, "slot", i);
            cJSON_AddStringToObject(s, "state", ring_state_name(ss[i].state));
            cJSON_AddNumberToObject(s, "pid", ss[i].pid);
            char owner[24];     /* a token is 62 bits: a JSON number (a double) would round it */
            snprintf(owner, sizeof owner, "%" PRIu64, ss[i].owner);
            cJSON_AddStringToObject(s, "owner", owner);
            cJSON_AddNumberToObject(s, "seq", (double)ss[i].seq);
            cJSON_AddNumberToObject(s, "batch", (double)ss[i].batch_id);
            cJSON_AddNumberToObject(s, "epoch", sched_batch_epoch(ss[i].batch_id));
            cJSON_AddNumberToObject(s, "index", sched_batch_index(ss[i].batch_id));
            cJSON_AddNumberToObject(s, "tokens", ss[i].n_tokens);
            cJSON_AddNumberToObject(s, "age_ms", (double)ss[i].age_ms);
            cJSON_AddBoolToObject(s, "stuck", ss[i].stuck);
            cJSON_AddItemToArray(a, s);
        }
        free(ss);
    }
    return o;
}

static cJSON *counts_json(struct coord *co)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "total", (double)co->total_batches);
    for (int s = 0; s < BATCH_NSTATES; s++)
        cJSON_AddNumberToObject(o, batch_state_name(s), (double)co->counts[s]);
    cJSON_AddNumberToObject(o, "requeued", (double)co->requeues);
    cJSON_AddNumberToObject(o, "duplicates", (double)co->duplicates);
    cJSON_AddNumberToObject(o, "retracted", (double)co->retracted);
    return o;
}

static cJSON *epoch_json(struct coord *co)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *per = cJSON_CreateArray();
    uint32_t current = co->epochs, scheduled = 0;
    for (uint32_t e = 0; e < co->epochs; e++) {
        if (!co->ep[e].built) {
            if (current == co->epochs)
                current = e;
            continue;
        }
        scheduled++;
        uint64_t done = co->ep[e].done;
        if (done < co->ep[e].s.n_batches && current == co->epochs)
            current = e;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "epoch", e);
        cJSON_AddNumberToObject(x, "batches", co->ep[e].s.n_batches);
        cJSON_AddNumberToObject(x, "checkpointed", (double)done);
        cJSON_AddItemToArray(per, x);
    }
    uint64_t est_total = coord_est_batches(co);
    cJSON_AddNumberToObject(o, "epochs", co->epochs);
    cJSON_AddNumberToObject(o, "current", current < co->epochs ? current : co->epochs - 1);
    cJSON_AddNumberToObject(o, "scheduled", scheduled);
    cJSON_AddNumberToObject(o, "done_batches", (double)co->counts[BATCH_CHECKPOINTED]);
    cJSON_AddNumberToObject(o, "total_batches", (double)est_total);
    cJSON_AddNumberToObject(o, "progress", est_total ? (double)co->counts[BATCH_CHECKPOINTED] / (double)est_total : 0);
    cJSON_AddItemToObject(o, "per_epoch", per);
    return o;
}

static cJSON *group_json(struct coord *co)
{
    struct dgroup *g = &co->grp;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "generation", (double)g->gen);
    cJSON_AddBoolToObject(o, "active", g->active);
    cJSON_AddNumberToObject(o, "world_size", g->world);
    uint32_t present = 0;
    for (uint32_t r = 0; r < g->world; r++)
        present += g->active && g->rank_member[r];
    cJSON_AddNumberToObject(o, "ranks_connected", present);
    uint32_t waiting = 0;      /* joined, in no generation yet (the group forms with world_size of them) */
    for (const struct member *m = co->members; m; m = m->next)
        waiting += m->role == PROTO_ROLE_DRAFTER && m->joined && m->rank < 0;
    cJSON_AddNumberToObject(o, "drafters_waiting", waiting);
    cJSON *ck = cJSON_AddObjectToObject(o, "checkpoint");
    cJSON_AddNumberToObject(ck, "generation", (double)g->ckpt_gen);
    cJSON_AddNumberToObject(ck, "step", (double)g->ckpt_step);
    cJSON_AddStringToObject(ck, "dir", g->ckpt_dir);
    return o;
}

/* Whether drafter a is the better one to show: one with a rank in the group first (one waiting to
 * join has no group numbers), then one heard from lately, then the furthest along (rank 0 on a tie). */
static bool better_drafter(struct coord *co, const struct member *a, const struct member *b, uint64_t now)
{
    if ((a->rank >= 0) != (b->rank >= 0))
        return a->rank >= 0;
    bool as = coord_silent(co, a, now), bs = coord_silent(co, b, now);
    if (as != bs)
        return !as;
    return a->hb.step > b->hb.step || (a->hb.step == b->hb.step && a->rank == 0);
}

/* Metrics of the drafter that is furthest along (rank 0 normally); "silent": the one shown has not
 * been heard from lately (its numbers are as last heard). */
static cJSON *drafter_json(struct coord *co)
{
    const struct member *best = NULL;
    uint64_t now = mono_ms();
    for (const struct member *m = co->members; m; m = m->next)
        if (m->role == PROTO_ROLE_DRAFTER && m->have_hb && !m->closing && (!best || better_drafter(co, m, best, now)))
            best = m;
    cJSON *o = cJSON_CreateObject();
    if (best) {
        cJSON_AddNumberToObject(o, "rank", best->rank);
        cJSON_AddBoolToObject(o, "silent", coord_silent(co, best, now));
        add_timings(o, PROTO_ROLE_DRAFTER, &best->hb);
    }
    double tps = 0;
    for (const struct member *m = co->members; m; m = m->next)     /* (a silent one's rate is stale) */
        if (m->role == PROTO_ROLE_TARGET && !m->closing && !coord_silent(co, m, now))
            tps += m->hb.tokens_per_s;
    cJSON_AddNumberToObject(o, "target_tokens_per_s", tps);
    return o;
}

static cJSON *error_json(const struct error_rec *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "wall_ms", (double)e->wall_ms);
    cJSON_AddStringToObject(o, "role", e->role ? proto_role_name((unsigned)e->role) : "coordinator");
    cJSON_AddNumberToObject(o, "gpu", e->device);
    cJSON_AddNumberToObject(o, "pid", e->pid);
    cJSON_AddBoolToObject(o, "fatal", e->fatal);
    cJSON_AddNumberToObject(o, "code", e->code);
    cJSON_AddStringToObject(o, "message", e->message);
    return o;
}

static cJSON *errors_json(struct coord *co, uint32_t limit)
{
    cJSON *a = cJSON_CreateArray();
    uint64_t n = co->n_errors < COORD_ERRORS_KEPT ? co->n_errors : COORD_ERRORS_KEPT;
    for (uint64_t k = 0; k < n && k < limit; k++)
        cJSON_AddItemToArray(a, error_json(&co->errors[(co->n_errors - 1 - k) % COORD_ERRORS_KEPT]));
    return a;
}

static int by_id(const void *a, const void *b)
{
    uint64_t x = (*(const struct batch *const *)a)->row.id, y = (*(const struct batch *const *)b)->row.id;
    return x < y ? -1 : x > y;
}

/* The batches in flight (LEASED, PUBLISHED, TRAINED: taken from their lists, not by a walk of
 * every batch), the first `limit` in schedule order. */
static cJSON *batches_json(struct coord *co, uint32_t limit)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "batches", counts_json(co));
    cJSON_AddItemToObject(o, "epoch", epoch_json(co));
    cJSON *a = cJSON_AddArrayToObject(o, "in_flight");
    static const int states[] = { BATCH_LEASED, BATCH_PUBLISHED, BATCH_TRAINED };
    size_t n = 0, cap = co->counts[BATCH_LEASED] + co->counts[BATCH_PUBLISHED] + co->counts[BATCH_TRAINED];
    const struct batch **v = malloc((cap ? cap : 1) * sizeof *v);
    if (!v)
        return o;   /* out of memory: no rows (the document itself is unlikely to be made) */
    for (size_t k = 0; k < sizeof states / sizeof states[0]; k++)
        for (const struct batch *b = *coord_state_list(co, states[k]); b && n < cap; b = b->lnext)
            v[n++] = b;
    qsort(v, n, sizeof *v, by_id);
    for (size_t k = 0; k < n && k < limit; k++) {
        const struct batch *b = v[k];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "id", (double)b->row.id);
        cJSON_AddNumberToObject(x, "epoch", b->row.epoch);
        cJSON_AddNumberToObject(x, "index", b->row.idx);
        cJSON_AddStringToObject(x, "state", batch_state_name(b->row.state));
        cJSON_AddNumberToObject(x, "samples", b->row.n_samples);
        cJSON_AddNumberToObject(x, "tokens", b->row.n_tokens);
        cJSON_AddNumberToObject(x, "leases", b->row.leases);
        cJSON_AddNumberToObject(x, "holder_pid", b->holder ? b->holder->pid : 0);
        cJSON_AddNumberToObject(x, "slot", b->row.slot);
        cJSON_AddNumberToObject(x, "generation", (double)b->row.gen);
        cJSON_AddNumberToObject(x, "step", (double)b->row.step);
        cJSON_AddItemToArray(a, x);
    }
    free(v);
    return o;
}

static char *finish(cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

char *coord_json_result(struct coord *co, int ok, const char *error)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "ok", ok);
    cJSON_AddStringToObject(o, "state", proto_state_name((unsigned)co->state));
    cJSON_AddStringToObject(o, "reason", co->reason);
    if (error)
        cJSON_AddStringToObject(o, "error", error);
    return finish(o);
}

static cJSON *head_json(const struct coord *co)
{
    const struct dgroup *g = &co->grp;
    if (!g->ckpt_dir[0])
        return cJSON_CreateNull();
    cJSON *h = cJSON_CreateObject();
    cJSON_AddNumberToObject(h, "generation", (double)g->ckpt_gen);
    cJSON_AddNumberToObject(h, "step", (double)g->ckpt_step);
    cJSON_AddStringToObject(h, "dir", g->ckpt_dir);
    return h;
}

static int checkpoint_row(void *arr, const struct ledger_checkpoint *c, uint64_t ms, const char *dropped)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "generation", (double)c->gen);
    cJSON_AddNumberToObject(e, "step", (double)c->step);
    cJSON_AddStringToObject(e, "dir", c->dir);
    cJSON_AddNumberToObject(e, "written_ms", (double)ms);
    /* (whether the folder is still there is dflashctl's to look: a stat here, on the event loop,
     * would hold the cluster on a storage that hangs) */
    json_add_string_or_null(e, "dropped", dropped);
    cJSON_AddItemToArray(arr, e);
    return 0;
}

/* The ledger's newest checkpoints, newest first: the lineage's and those dropped from it. */
static cJSON *checkpoints_json(struct coord *co, uint32_t limit)
{
    cJSON *a = cJSON_CreateArray();
    int r = ledger_checkpoint_foreach(co->ledger, limit, checkpoint_row, a);
    if (r < 0)
        log_error(r, "%s: reading the checkpoints: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
    return a;
}

char *coord_json(struct coord *co, int what, uint32_t limit)
{
    cJSON *o = cJSON_CreateObject();
    if (!limit)
        limit = 100;
    switch (what) {
    case PROTO_Q_STATUS:
        cJSON_AddStringToObject(o, "state", proto_state_name((unsigned)co->state));
        cJSON_AddStringToObject(o, "reason", co->reason);
        cJSON_AddStringToObject(o, "cluster", co->cfg->cluster.name);
        cJSON_AddNumberToObject(o, "pid", getpid());
        cJSON_AddNumberToObject(o, "uptime_s", (double)(mono_ms() - co->start_mono_ms) / 1000.0);
        cJSON_AddBoolToObject(o, "recovering", co->recovering);
        cJSON_AddBoolToObject(o, "ended", coord_ended(co));
        cJSON_AddStringToObject(o, "ledger", co->ledger_path);
        char run[24];
        snprintf(run, sizeof run, "%016" PRIx64, co->run_id);
        cJSON_AddStringToObject(o, "run", run);
        cJSON *ls = cJSON_AddObjectToObject(o, "listen");
        cJSON_AddStringToObject(ls, "socket", co->socket_path);
        if (co->tcp_on)
            cJSON_AddStringToObject(ls, "tcp", co->tcp_addr);
        else
            cJSON_AddNullToObject(ls, "tcp");
        cJSON_AddItemToObject(o, "epoch", epoch_json(co));
        cJSON_AddItemToObject(o, "daemons", daemons_json(co));
        cJSON_AddItemToObject(o, "ring", ring_json(co, 0));
        cJSON_AddItemToObject(o, "batches", counts_json(co));
        cJSON_AddItemToObject(o, "group", group_json(co));
        cJSON_AddItemToObject(o, "drafter", drafter_json(co));
        cJSON_AddItemToObject(o, "errors", errors_json(co, 10));
        cJSON_AddNumberToObject(o, "error_count", (double)co->n_errors);
        cJSON_AddNumberToObject(o, "fatal_count", (double)co->n_fatal);
        cJSON *tm = cJSON_AddObjectToObject(o, "coordinator");
        cJSON_AddNumberToObject(tm, "commits", (double)co->commits);
        cJSON_AddNumberToObject(tm, "commit_ms", co->commit.last_ms);
        cJSON_AddNumberToObject(tm, "commit_ms_max", co->commit.max_ms);
        cJSON_AddNumberToObject(tm, "check_ms", co->check.last_ms);
        cJSON_AddNumberToObject(tm, "check_ms_max", co->check.max_ms);
        cJSON_AddNumberToObject(tm, "stalls", (double)co->stalls);
        cJSON_AddNumberToObject(tm, "stall_ms_max", (double)co->stall_ms_max);
        cJSON *sp = cJSON_AddObjectToObject(o, "space");
        cJSON_AddNumberToObject(sp, "min_free_mb", (double)co->cfg->coordinator.min_free_mb);
        if (co->space.free_mb != UINT64_MAX && co->space.where) {
            cJSON_AddNumberToObject(sp, "free_mb", (double)co->space.free_mb);
            cJSON_AddStringToObject(sp, "where", co->space.where);
        } else {
            cJSON_AddNullToObject(sp, "free_mb");
            cJSON_AddNullToObject(sp, "where");
        }
        cJSON_AddBoolToObject(sp, "paused", co->space.paused);
        break;
    case PROTO_Q_RING:
        cJSON_Delete(o);
        o = ring_json(co, 1);
        break;
    case PROTO_Q_DAEMONS:
        cJSON_AddItemToObject(o, "daemons", daemons_json(co));
        break;
    case PROTO_Q_BATCHES:
        cJSON_Delete(o);
        o = batches_json(co, limit);
        break;
    case PROTO_Q_CHECKPOINTS:
        cJSON_AddItemToObject(o, "head", head_json(co));
        cJSON_AddItemToObject(o, "checkpoints", checkpoints_json(co, limit));
        break;
    case PROTO_Q_ERRORS:
        cJSON_AddItemToObject(o, "errors", errors_json(co, limit));
        cJSON_AddNumberToObject(o, "count", (double)co->n_errors);
        cJSON_AddNumberToObject(o, "fatal", (double)co->n_fatal);
        break;
    }
    return finish(o);
}
