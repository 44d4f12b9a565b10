/* coord_cluster.c: what the coordinator does with each message: leases, publications,
 * the drafter group and its generations, checkpoints, errors, control, recovery, timeouts. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "common/decimal.h"
#include "common/err.h"
#include "common/log.h"
#include "common/progress.h"
#include "common/proc.h"
#include "common/text.h"
#include "common/timeutil.h"
#include "daemons/coordinator/coord.h"
#include "ipc/ring.h"
#include "model/hfconfig.h"
#include "model/safetensors.h"

static uint32_t next_epoch(const struct coord *co)
{
    uint32_t e = 0;
    while (e < co->epochs && co->ep[e].built)
        e++;
    return e;
}

struct batch *coord_batch(struct coord *co, uint64_t id)
{
    uint32_t e = sched_batch_epoch(id), i = sched_batch_index(id);
    if (e >= co->epochs || !co->ep[e].built || i >= co->ep[e].s.n_batches)
        return NULL;
    return &co->ep[e].b[i];
}

/* ---- pending heap (min by id: requeued batches of early epochs go first) ---- */

static void heap_push(struct coord *co, uint64_t id)
{
    if (co->heap_len == co->heap_cap) {
        size_t cap = co->heap_cap ? co->heap_cap * 2 : 1024;
        uint64_t *h = realloc(co->heap, cap * sizeof *h);
        if (!h) {
            log_error(-ENOMEM, "pending queue");
            exit(DAEMON_EX_FAILURE);
        }
        co->heap = h;
        co->heap_cap = cap;
    }
    size_t i = co->heap_len++;
    while (i && co->heap[(i - 1) / 2] > id) {
        co->heap[i] = co->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    co->heap[i] = id;
}

static uint64_t heap_pop(struct coord *co)
{
    uint64_t top = co->heap[0], last = co->heap[--co->heap_len];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= co->heap_len)
            break;
        if (c + 1 < co->heap_len && co->heap[c + 1] < co->heap[c])
            c++;
        if (co->heap[c] >= last)
            break;
        co->heap[i] = co->heap[c];
        i = c;
    }
    if (co->heap_len)
        co->heap[i] = last;
    return top;
}

/* ---- batch state (memory and ledger move together) ---- */

static void batch_set(struct coord *co, struct batch *b, int state)
{
    co->counts[b->row.state]--;
    co->counts[state]++;
    if ((b->row.state == BATCH_CHECKPOINTED) != (state == BATCH_CHECKPOINTED)) {
        uint32_t *done = &co->ep[b->row.epoch].done;
        *done = state == BATCH_CHECKPOINTED ? *done + 1 : *done - 1;
    }
    struct batch **from = coord_state_list(co, b->row.state), **to = coord_state_list(co, state);
    if (from != to) {
        if (from)
            coord_list_unlink(from, b);
        if (to)
            coord_list_link(to, b);
    }
    b->row.state = state;
    b->row.updated_ms = wall_ms();
    b->orphan_since_ms = 0;
    if (state != BATCH_LEASED) {
        b->holder = NULL;
        b->detached_until_ms = 0;
    }
    if (state == BATCH_PENDING)
        b->row.owner = 0;   /* else: the lease holder, then the publisher (replays are recognised by it) */
    if (state != BATCH_PUBLISHED)
        b->row.slot = -1;
    int r = ledger_batch_update(co->ledger, &b->row);
    if (r < 0) {
        log_error(0, "%s: ledger update of batch " SCHED_BID ": %s", co->ledger_path, SCHED_BARGS(b->row.id),
                  ledger_errmsg(co->ledger, r));
        exit(DAEMON_EX_FAILURE);
    }
}

static void requeue(struct coord *co, struct batch *b, const char *why)
{
    log_info("batch " SCHED_BID " back to the queue: %s", SCHED_BARGS(b->row.id), why);
    b->consumed_early = false;
    batch_set(co, b, BATCH_PENDING);
    heap_push(co, b->row.id);
    co->requeues++;
}

static int build_epoch(struct coord *co, uint32_t e, int insert, char *err, size_t errlen)
{
    struct epoch_state *ep = &co->ep[e];
    int r = sched_build(co->lengths, (uint32_t)co->ds.n_samples, &co->sp, e, &ep->s, err, errlen);
    if (r < 0)
        return r;
    progress_tick();    /* at the start, a large epoch's schedule and rows take a while */
    ep->b = calloc(ep->s.n_batches, sizeof *ep->b);
    if (!ep->b)
        return -ENOMEM;
    for (uint32_t i = 0; i < ep->s.n_batches; i++) {
        struct ledger_batch *row = &ep->b[i].row;
        *row = (struct ledger_batch){ .id = sched_batch_id(e, i), .epoch = e, .idx = i,
                                      .n_samples = ep->s.first[i + 1] - ep->s.first[i], .n_tokens = ep->s.tokens[i],
                                      .state = BATCH_PENDING, .slot = -1, .updated_ms = wall_ms() };
        if (insert) {
            if (i % 4096 == 4095)
                progress_tick();
            if ((r = ledger_batch_insert(co->ledger, row)) < 0) {
                snprintf(err, errlen, "%s: cannot record epoch %u", co->ledger_path, e);
                return r;
            }
            heap_push(co, row->id);
            co->counts[BATCH_PENDING]++;
        }
    }
    ep->built = 1;
    co->total_batches += ep->s.n_batches;
    if (insert)
        log_notice("epoch %u of %u scheduled (batch ids %u:*): %u batches", e + 1, co->epochs, e, ep->s.n_batches);
    return 0;
}

/* Next pending batch, building the next epoch when the queue runs dry. */
static struct batch *next_pending(struct coord *co)
{
    for (;;) {
        while (co->heap_len) {
            struct batch *b = coord_batch(co, heap_pop(co));
            if (b && b->row.state == BATCH_PENDING)
                return b;
        }
        uint32_t e = next_epoch(co);
        if (e >= co->epochs)
            return NULL;
        char err[256];
        int r = build_epoch(co, e, 1, err, sizeof err);
        if (r < 0) {
            log_error(r, "schedule of epoch %u: %s", e, err);
            exit(DAEMON_EX_FAILURE);
        }
    }
}

/* ---- ring lookups ---- */

/* Every slot's state now. Never NULL: callers take "no slot holds it" as "consumed" and queue
 * the batch again, so an unknown answer would have batches trained twice. */
static struct ring_slot_stat *slot_snapshot(struct coord *co)
{
    static struct ring_slot_stat *slots;
    static uint32_t n;
    const struct ring_layout *lay = ring_layout(co->ring);
    if (n != lay->nslots) {
        free(slots);
        n = lay->nslots;
        slots = calloc(n, sizeof *slots);
    }
    struct ring_stats st;
    if (!slots || ring_stats(co->ring, &st, slots) < 0) {
        log_error(-ENOMEM, "ring %s: no memory for a snapshot of its %u slots", co->ring_name, n);
        exit(DAEMON_EX_FAILURE);    /* systemd restarts it; the ledger is consistent */
    }
    return slots;
}

/* The slot that holds batch id as a delivered payload (READY or READING), or -1. */
static int slot_holding(struct coord *co, const struct ring_slot_stat *s, uint64_t id)
{
    if (!s)
        return -1;
    uint32_t n = ring_layout(co->ring)->nslots;
    for (uint32_t i = 0; i < n; i++)
        if ((s[i].state == RING_READY || s[i].state == RING_READING) && s[i].batch_id == id)
            return (int)i;
    return -1;
}

/* A lease whose holder is gone: if the batch reached the ring anyway (READY before the
 * PUBLISHED message got out), it is published; else it goes back to the queue. */
static void lease_lost(struct coord *co, struct batch *b, const struct ring_slot_stat *s, const char *why)
{
    int slot = slot_holding(co, s, b->row.id);
    if (slot >= 0) {
        log_info("batch " SCHED_BID " found READY in slot %d after its target left: published", SCHED_BARGS(b->row.id),
                 slot);
        b->row.slot = slot;
        batch_set(co, b, BATCH_PUBLISHED);
        return;
    }
    requeue(co, b, why);
}

/* ---- sending ---- */

static void push_control(struct member *m, int cmd, const char *reason)
{
    struct proto_msg msg = { .type = PROTO_CONTROL };
    msg.control.cmd = (uint32_t)cmd;
    msg.control.resumes = m->co->resumes;
    proto_strset(msg.control.reason, sizeof msg.control.reason, reason);
    coord_send(m, &msg);
}

static void send_ack(struct member *m, uint64_t seq, int status)
{
    struct proto_msg msg = { .type = PROTO_ACK, .ack = { seq, status, 0 } };
    coord_send(m, &msg);
}

static void send_grant(struct coord *co, struct member *m, struct batch *b, int regrant)
{
    const struct sched_epoch *s = &co->ep[b->row.epoch].s;
    struct proto_msg msg = { .type = PROTO_LEASE_GRANT };
    msg.grant = (struct proto_lease_grant){ .batch_id = b->row.id, .epoch = b->row.epoch,
                                            .flags = regrant ? PROTO_GRANT_REGRANT : 0, .n_samples = b->row.n_samples,
                                            .n_tokens = b->row.n_tokens, .max_seq_len = co->sp.max_seq_len,
                                            .lease = b->row.leases };
    msg.samples = s->samples + s->first[b->row.idx];
    coord_send(m, &msg);
}

static void grant_leases(struct coord *co)
{
    if (co->state != PROTO_STATE_RUNNING || co->recovering)
        return;
    int progress = 1;
    while (progress) {
        progress = 0;
        for (struct member *m = co->members; m; m = m->next) {
            /* no more leases held than one WELCOME re-grants after a reconnect */
            if (m->closing || m->role != PROTO_ROLE_TARGET || !m->want || m->leases >= PROTO_MAX_LEASE_REQUEST)
                continue;
            struct batch *b = next_pending(co);
            if (!b)
                return;
            b->holder = m;
            b->row.owner = m->token;
            b->row.leases++;
            batch_set(co, b, BATCH_LEASED);
            m->leases++;
            m->want--;
            send_grant(co, m, b, 0);
            progress = 1;
        }
    }
}

/* ---- state ---- */

static const int state_push[PROTO_STATE_MAX] = {
    [PROTO_STATE_RUNNING] = PROTO_CTL_RESUME, [PROTO_STATE_PAUSED] = PROTO_CTL_PAUSE,
    [PROTO_STATE_DRAINING] = PROTO_CTL_DRAIN, [PROTO_STATE_STOPPED] = PROTO_CTL_STOP,
    [PROTO_STATE_FAILED] = PROTO_CTL_STOP,
};

/* The state a restarted coordinator resumes in (restore_state): a pause, a drain or a fatal
 * error on its way to FAILED outlive a crash, and so does FAILED itself until the coordinator
 * leaves (its clean exit clears failed_open); a stop does not (starting again is how a
 * stopped or failed run goes on). */
static void save_state(struct coord *co)
{
    /* A drain on a stop signal (systemd stopping the service) is not the operator's: cut short,
     * the next start goes on as before it. */
    int state = co->state == PROTO_STATE_DRAINING && co->signal_drain_from >= 0 ? co->signal_drain_from : co->state;
    ledger_meta_set(co->ledger, "state", proto_state_name((unsigned)state));
    ledger_meta_set(co->ledger, "reason", co->reason);
    ledger_meta_set_u64(co->ledger, "fatal", co->fatal);
    ledger_meta_set_u64(co->ledger, "finishing", co->finishing);
    ledger_meta_set_u64(co->ledger, "resumes", co->resumes);
    ledger_meta_set_u64(co->ledger, "nan_pending", co->nan_pending);
    ledger_meta_set_u64(co->ledger, "nan_step", co->nan_pending ? co->nan_step : 0);
    ledger_meta_set_u64(co->ledger, "space_paused", co->space.paused);
    /* FAILED until the clean exit clears it (coord_main's finalize_ledger) */
    ledger_meta_set_u64(co->ledger, "failed_open", co->state == PROTO_STATE_FAILED);
}

/* One of save_state's numbers: 0 when absent; a malformed one fails the start (a "fatal" read as
 * 0 would resume a failed run as a healthy one). */
static int state_num(struct coord *co, const char *key, uint64_t *v)
{
    *v = 0;
    int r = ledger_meta_get_u64(co->ledger, key, v);
    return r < 0 ? r : 0;
}

static int restore_state(struct coord *co)
{
    char name[32];
    uint64_t resumes, nan_pending, nan_step, failed_open, fatal, finishing, space_paused;
    int r;
    if ((r = state_num(co, "resumes", &resumes)) < 0 || (r = state_num(co, "nan_pending", &nan_pending)) < 0 ||
        (r = state_num(co, "nan_step", &nan_step)) < 0 || (r = state_num(co, "failed_open", &failed_open)) < 0 ||
        (r = state_num(co, "fatal", &fatal)) < 0 || (r = state_num(co, "finishing", &finishing)) < 0 ||
        (r = state_num(co, "space_paused", &space_paused)) < 0)
        return r;
    co->resumes = (uint32_t)resumes;
    co->nan_pending = nan_pending != 0;
    co->nan_step = co->nan_pending ? nan_step : 0;
    if ((r = ledger_meta_get(co->ledger, "state", name, sizeof name)) != 1)
        return r < 0 ? r : 0;
    if (!strcmp(name, proto_state_name(PROTO_STATE_FAILED)) && failed_open) {
        /* The run failed and its coordinator's clean exit was not recorded (it died while it
         * waited for the daemons to take the STOP, or its last commit failed): this start ends
         * the run as that one would have. */
        co->state = PROTO_STATE_FAILED;
        ledger_meta_get(co->ledger, "reason", co->reason, sizeof co->reason);
        co->fatal = true;
        co->stopped_ms = mono_ms();
        log_error(0, "the run had failed (%s) and its coordinator's clean exit was not recorded: it ends failed "
                  "again; start the coordinator once more to run on", co->reason);
        return 0;
    }
    for (int s = PROTO_STATE_PAUSED; s <= PROTO_STATE_DRAINING; s++)
        if (!strcmp(name, proto_state_name((unsigned)s))) {
            co->state = s;
            ledger_meta_get(co->ledger, "reason", co->reason, sizeof co->reason);
            co->fatal = fatal != 0;
            co->finishing = s == PROTO_STATE_DRAINING && finishing;
            co->space.paused = s == PROTO_STATE_PAUSED && space_paused;     /* resumed when there is room */
            log_notice("resuming %s%s%s%s", proto_state_name((unsigned)s), co->reason[0] ? ": " : "", co->reason,
                       co->fatal ? " (a fatal error: it ends FAILED)" : "");
            break;
        }
    return 0;
}

void coord_set_state(struct coord *co, int state, const char *reason)
{
    if (co->state == state)
        return;
    int old = co->state;
    char why[sizeof co->reason];
    reason = reason ? reason : "";
    snprintf(why, sizeof why, "%.*s", (int)text_fit(reason, sizeof why - 1), reason);  /* (may be co->reason) */
    co->state = state;
    memcpy(co->reason, why, sizeof why);
    co->space.paused = false;   /* check_space sets it after a pause of its own */
    if (state == PROTO_STATE_FAILED)
        log_error(0, "cluster %s -> %s: %s", proto_state_name(old), proto_state_name(state), co->reason);
    else
        log_notice("cluster %s -> %s%s%s", proto_state_name(old), proto_state_name(state), co->reason[0] ? ": " : "",
                   co->reason);
    if (state != PROTO_STATE_DRAINING) {
        co->finishing = false;
        co->signal_drain_from = -1;
    }
    if (state >= PROTO_STATE_STOPPED)
        co->nan_pending = false;    /* the next start's daemons are new processes */
    int cmd = state_push[state];
    if (cmd && !(old == PROTO_STATE_STARTING && state == PROTO_STATE_RUNNING))
        for (struct member *m = co->members; m; m = m->next)
            if (m->role == PROTO_ROLE_DRAFTER || (m->role == PROTO_ROLE_TARGET && !co->finishing))
                push_control(m, cmd, co->reason);
    if (state == PROTO_STATE_STOPPED || state == PROTO_STATE_FAILED)
        co->stopped_ms = mono_ms();
    save_state(co);
    daemon_notify_status(&co->d, "%s%s%s", proto_state_name(state), co->reason[0] ? ": " : "", co->reason);
    grant_leases(co);
}

/* A second cause for a cluster PAUSED already: the reason says both, the new one first. */
static void pause_again(struct coord *co, const char *reason)
{
    char both[sizeof co->reason];
    snprintf(both, sizeof both, "%.*s (paused before: %.*s)", (int)text_fit(reason, sizeof both / 2), reason,
             (int)text_fit(co->reason, sizeof both / 3), co->reason);
    memcpy(co->reason, both, sizeof both);
    log_notice("cluster paused: %s", co->reason);
    save_state(co);
}

/* STOPPED by the operator or a signal; FAILED when a fatal error is draining the run: a stop
 * cuts that drain short but must not turn the failure into a success (exit 0, a stop note
 * saying "stopped"), and the reason keeps the error. */
static void stop_cluster(struct coord *co, const char *why)
{
    if (!co->fatal) {
        coord_set_state(co, PROTO_STATE_STOPPED, why);
        return;
    }
    char r[sizeof co->reason];
    snprintf(r, sizeof r, "%.*s (its drain cut short: %.*s)", (int)text_fit(co->reason, sizeof r / 2), co->reason,
             (int)text_fit(why, sizeof r / 3), why);
    coord_set_state(co, PROTO_STATE_FAILED, r);
}

/* ---- drafter group ---- */

uint64_t coord_est_batches(const struct coord *co)
{
    uint32_t scheduled = 0;
    for (uint32_t e = 0; e < co->epochs; e++)
        scheduled += co->ep[e].built;
    return co->total_batches + (scheduled ? (uint64_t)(co->epochs - scheduled) * co->ep[0].s.n_batches : 0);
}

/* The ranks' owner tokens as "t0,t1,...": up to 20 digits and a comma each, for every world
 * size the configuration allows (drafter.world_size <= 1024). */
#define GROUP_TOKENS_MAX (1024 * 21 + 1)

static void save_group(struct coord *co)
{
    static char toks[GROUP_TOKENS_MAX];
    size_t n = 0;
    toks[0] = 0;
    for (uint32_t r = 0; r < co->grp.world && n < sizeof toks - 22; r++)
        n += (size_t)snprintf(toks + n, sizeof toks - n, "%s%" PRIu64, r ? "," : "", co->grp.rank_token[r]);
    ledger_meta_set_u64(co->ledger, "group_gen", co->grp.gen);
    ledger_meta_set_u64(co->ledger, "group_active", co->grp.active);
    ledger_meta_set(co->ledger, "group_tokens", toks);
}

/* save_group's list back into rank_token: -DF_EFORMAT unless every item is a plain decimal
 * (a hand edit or damage; the ranks it names would not be known again). Items past the world
 * size (a smaller drafter.world_size now) are dropped, missing ones stay 0. */
static int parse_rank_tokens(struct coord *co, const char *toks)
{
    const char *p = toks;
    for (uint32_t k = 0; *p; k++) {
        uint64_t v;
        size_t n = decimal_prefix(p, &v);
        const char *end = p + n;
        if (!n || (*end && *end != ',') || (*end == ',' && !end[1]))
            return -DF_EFORMAT;
        if (k < co->grp.world)
            co->grp.rank_token[k] = v;
        p = *end ? end + 1 : end;
    }
    return 0;
}

static void add_limit(struct coord *co, uint64_t gen, int64_t limit)
{
    struct dgroup *g = &co->grp;
    uint64_t *lg = realloc(g->lim_gen, (g->n_lim + 1) * sizeof *lg);
    int64_t *ls = realloc(g->lim_step, (g->n_lim + 1) * sizeof *ls);
    if (lg)
        g->lim_gen = lg;
    if (ls)
        g->lim_step = ls;
    if (!lg || !ls) {
        log_error(-ENOMEM, "generation table");
        exit(DAEMON_EX_FAILURE);
    }
    g->lim_gen[g->n_lim] = gen;
    g->lim_step[g->n_lim++] = limit;
}

/* Last step of an ended generation that is in the lineage; -1 none; -2 unknown gen. */
static int64_t gen_limit(const struct coord *co, uint64_t gen)
{
    for (size_t i = 0; i < co->grp.n_lim; i++)
        if (co->grp.lim_gen[i] == gen)
            return co->grp.lim_step[i];
    return -2;
}

/* The batches a copy of which the running generation must leave out although it never
 * trained them: checkpointed by an earlier generation after more than one lease (a target
 * cut off while its lease was given again may still publish the older copy, and the group's
 * own memory starts empty). Made once per generation (only the running generation changes
 * batches, so every rank's GROUP names the same), into co->grp.done. 0 or -ENOMEM. */
static int done_by_earlier(struct coord *co)
{
    struct dgroup *g = &co->grp;
    if (g->done_gen == g->gen)
        return 0;
    size_t n = 0, cap = 0;
    uint64_t *ids = NULL;
    for (uint32_t e = 0; e < co->epochs && co->ep[e].built; e++)
        for (uint32_t i = 0; i < co->ep[e].s.n_batches; i++) {
            const struct ledger_batch *row = &co->ep[e].b[i].row;
            if (row->state != BATCH_CHECKPOINTED || row->gen >= g->gen || row->leases < 2)
                continue;
            if (n == PROTO_MAX_GROUP_IDS) {
                log_warn(0, "more than %u batches kept from earlier generations were leased twice: the group "
                         "is told of the first %u", PROTO_MAX_GROUP_IDS, PROTO_MAX_GROUP_IDS);
                goto done;
            }
            if (n == cap) {
                cap = cap ? cap * 2 : 256;
                uint64_t *p = realloc(ids, cap * sizeof *p);
                if (!p) {
                    free(ids);
                    return -ENOMEM;
                }
                ids = p;
            }
            ids[n++] = row->id;
        }
done:
    free(g->done);
    g->done = ids;
    g->n_done = (uint32_t)n;
    g->done_gen = g->gen;
    return 0;
}

static void send_group(struct coord *co, struct member *m)
{
    struct proto_msg msg = { .type = PROTO_GROUP };
    int r = done_by_earlier(co);
    if (r < 0) {
        /* Not without it (the generation could train such a copy twice): the peers time out
         * waiting for this rank, and its JOIN_GROUP after that asks again. */
        log_error(r, "the GROUP for %s is not sent", m->name);
        return;
    }
    msg.group.n_done = co->grp.n_done;
    msg.ids = co->grp.done;
    msg.group.generation = co->grp.gen;
    msg.group.rank = (uint32_t)m->rank;
    msg.group.world_size = co->grp.world;
    msg.group.ckpt_step = co->grp.ckpt_step;
    msg.group.run_batches = co->run_batches;
    msg.group.run_id = co->run_id;
    memcpy(msg.group.group_id, co->grp.id, sizeof co->grp.id);
    proto_strset(msg.group.coll_name, sizeof msg.group.coll_name, co->grp.coll_name);
    proto_strset(msg.group.ckpt_dir, sizeof msg.group.ckpt_dir, co->grp.ckpt_dir);
    coord_send(m, &msg);
}

static int by_device(const void *a, const void *b)
{
    const struct member *x = *(struct member *const *)a, *y = *(struct member *const *)b;
    return x->device != y->device ? (x->device < y->device ? -1 : 1) : (x->id < y->id ? -1 : x->id > y->id);
}

/* The rank of the running generation that process `token` was given, or -1. */
static int token_rank(const struct dgroup *g, uint64_t token)
{
    for (uint32_t r = 0; r < g->world; r++)
        if (g->rank_token[r] == token)
            return (int)r;
    return -1;
}

/* Whether m holds a rank of the running generation: the process seated there, or the same process
 * on a connection not seated yet. */
static bool holds_rank(const struct dgroup *g, const struct member *m)
{
    bool seated = m->rank >= 0 && (uint32_t)m->rank < g->world && g->rank_member[m->rank] == m;
    return seated || token_rank(g, m->token) >= 0;
}

/* Drafter m (the same process as rank r of the running generation) takes its rank back. */
static void reseat(struct coord *co, struct member *m, uint32_t r)
{
    struct dgroup *g = &co->grp;
    g->rank_member[r] = m;
    m->rank = (int)r;
    m->joined = true;
    g->rank_deadline_ms[r] = 0;     /* (another rank still away keeps its own) */
    log_notice("%s rejoined group generation %" PRIu64 " as rank %u", m->name, g->gen, r);
}

static void retract_trained_copies(struct coord *co);

static void try_form_group(struct coord *co)
{
    struct dgroup *g = &co->grp;
    /* (stopped or failed: a drafter joining late, as the STOP reaches it, trains nothing more) */
    if (g->active || co->state >= PROTO_STATE_STOPPED)
        return;
    struct member *cand[1024];
    uint32_t n = 0;
    for (struct member *m = co->members; m && n < 1024; m = m->next)
        if (!m->closing && m->role == PROTO_ROLE_DRAFTER && m->joined && m->rank < 0)
            cand[n++] = m;
    if (n < g->world)
        return;
    qsort(cand, n, sizeof *cand, by_device);
    g->gen++;
    g->active = true;
    if (!co->run_batches) {
        /* Fixed once: every rank of every generation schedules its learning rate over the same
         * steps (the estimate moves as later epochs are scheduled). */
        co->run_batches = coord_est_batches(co);
        ledger_meta_set_u64(co->ledger, "run_batches", co->run_batches);
        ledger_meta_set_u64(co->ledger, "run_world", g->world);   /* generation 1's ranks (dflash-replay) */
    }
    /* each generation's ranks: a run restarted with fewer drafters forms smaller ones (dflash-replay) */
    char world_key[48];
    snprintf(world_key, sizeof world_key, "gen%" PRIu64 "_world", g->gen);
    ledger_meta_set_u64(co->ledger, world_key, g->world);
    memset(g->rank_deadline_ms, 0, g->world * sizeof *g->rank_deadline_ms);
    if (getrandom(g->id, sizeof g->id, 0) != (ssize_t)sizeof g->id)
        for (size_t i = 0; i < sizeof g->id; i++)
            g->id[i] = (uint8_t)(mono_ns() >> (i % 8));
    for (uint32_t r = 0; r < g->world; r++) {
        g->rank_member[r] = cand[r];
        g->rank_token[r] = cand[r]->token;
        cand[r]->rank = (int)r;
    }
    save_group(co);
    /* A new generation starts with an empty memory of what was trained (the drafter group's
     * repeat check): READY copies of trained batches (e.g. the slots a dead drafter held, put
     * back by the reclaim just now) leave the ring before any of its ranks can take one, in the
     * recovery window too (a batch the ledger holds trained is trained). */
    retract_trained_copies(co);
    log_notice("drafter group generation %" PRIu64 " formed: %u ranks, from checkpoint %s", g->gen, g->world,
               g->ckpt_dir[0] ? g->ckpt_dir : "(none: fresh start)");
    for (uint32_t r = 0; r < g->world; r++)
        send_group(co, g->rank_member[r]);
}

/* The running generation ends: what it trained up to its last checkpoint stands, anything after
 * it is rolled back (in the ledger; the caller re-queues the batches). */
static void end_generation(struct coord *co)
{
    struct dgroup *g = &co->grp;
    g->active = false;
    int64_t limit = g->ckpt_gen == g->gen && g->ckpt_dir[0] ? (int64_t)g->ckpt_step : -1;
    add_limit(co, g->gen, limit);
    ledger_generation_set(co->ledger, g->gen, limit);
    ledger_train_rollback(co->ledger, g->gen, limit);
}

/* n batches were queued again (a group lost, or the lineage fallen back): if the final drain
 * waited for them to be checkpointed, the run goes on instead (the targets were never told to
 * drain); then the next generation, and leases for the batches. */
static void run_on(struct coord *co, uint64_t n, const char *what)
{
    if (co->state == PROTO_STATE_DRAINING && co->finishing && n) {
        char again[160];
        snprintf(again, sizeof again, "%s before the final checkpoint: %" PRIu64 " batches to train again", what, n);
        coord_set_state(co, PROTO_STATE_RUNNING, again);
    }
    try_form_group(co);
    grant_leases(co);
}

/* A drafter of the running generation is gone: every rank restarts from the checkpoint. */
static void group_fail(struct coord *co, const char *why)
{
    struct dgroup *g = &co->grp;
    if (!g->active || co->state >= PROTO_STATE_STOPPED)
        return;     /* stopped: the ledger is finalized as it stands, no generation follows */
    end_generation(co);
    log_warn(0, "drafter group generation %" PRIu64 " ends (%s): restarting from %s", g->gen, why,
             g->ckpt_dir[0] ? g->ckpt_dir : "scratch");
    const struct ring_slot_stat *s = slot_snapshot(co);
    uint64_t rolled = 0, lost = 0;
    while (co->trained) {   /* requeue unlinks it */
        requeue(co, co->trained, "trained after the last checkpoint of a failed drafter group");
        rolled++;
    }
    for (struct batch *b = co->published, *next; b; b = next) {
        next = b->lnext;
        if (slot_holding(co, s, b->row.id) < 0) {
            /* consumed by a drafter of the dead generation without a TRAINED report */
            requeue(co, b, "its slot was consumed by the failed drafter group");
            lost++;
        }
    }
    struct proto_msg msg = { .type = PROTO_RESTART };
    msg.restart.generation = g->gen + 1;
    msg.restart.ckpt_step = g->ckpt_step;
    proto_strset(msg.restart.ckpt_dir, sizeof msg.restart.ckpt_dir, g->ckpt_dir);
    for (uint32_t r = 0; r < g->world; r++) {
        struct member *m = g->rank_member[r];
        g->rank_member[r] = NULL;
        if (!m)
            continue;
        m->rank = -1;
        m->joined = false;
        coord_send(m, &msg);
    }
    log_notice("rollback: %" PRIu64 " trained and %" PRIu64 " consumed batches back to the queue", rolled, lost);
    save_group(co);
    run_on(co, rolled + lost, "a drafter was lost");
}

/* The group ends with the run (a clean stop; a start that finds the run complete): its
 * generation ends and no other follows. */
void coord_group_close(struct coord *co)
{
    if (!co->grp.active)
        return;
    end_generation(co);
    ledger_meta_set_u64(co->ledger, "group_active", 0);
}

/* ---- errors ---- */

/* role 0: the coordinator's own (device -1, pid 0). */
static void record_error_of(struct coord *co, int role, int device, pid_t pid, int fatal, int code, const char *text)
{
    struct error_rec *e = &co->errors[co->n_errors % COORD_ERRORS_KEPT];
    *e = (struct error_rec){ .wall_ms = wall_ms(), .role = role, .device = role ? device : -1,
                             .fatal = fatal, .code = code, .pid = role ? pid : 0 };
    snprintf(e->message, sizeof e->message, "%.*s", (int)text_fit(text, sizeof e->message - 1), text);
    co->n_errors++;
    co->n_fatal += fatal != 0;
    ledger_error_add(co->ledger, e->wall_ms, role ? proto_role_name((unsigned)role) : "coordinator", e->device,
                     (int)e->pid, fatal, code, text);
}

static void record_error(struct coord *co, const struct member *m, int fatal, int code, const char *text)
{
    record_error_of(co, m ? m->role : 0, m ? m->device : -1, m ? m->pid : 0, fatal, code, text);
}

void coord_watch_start(struct coord *co, const struct member *m, bool hung_up, const char *reason)
{
    struct death_watch *w = &co->watch[0];
    for (size_t k = 0; k < COORD_WATCH_MAX; k++) {
        struct death_watch *o = &co->watch[k];
        if (!o->token || o->token == m->token) {
            w = o;
            break;
        }
        if (o->until_ms < w->until_ms)
            w = o;      /* full: the one watched longest goes */
    }
    *w = (struct death_watch){ .token = m->token, .until_ms = mono_ms() + COORD_DEATH_WATCH_MS, .role = m->role,
                               .device = m->device, .pid = m->pid, .hung_up = hung_up };
    snprintf(w->name, sizeof w->name, "%s", m->name);
    snprintf(w->reason, sizeof w->reason, "%.*s", (int)text_fit(reason, sizeof w->reason - 1), reason);
}

void coord_watch_end(struct coord *co, uint64_t token)
{
    for (size_t k = 0; k < COORD_WATCH_MAX; k++)
        if (co->watch[k].token == token)
            co->watch[k].token = 0;
}

void coord_watch_departed(struct coord *co)
{
    uint64_t now = mono_ms();
    for (size_t k = 0; k < COORD_WATCH_MAX; k++) {
        struct death_watch *w = &co->watch[k];
        if (!w->token)
            continue;
        int alive = proc_token_alive(w->token);
        if (alive != 0 && now < w->until_ms)
            continue;       /* still exiting, or alive and perhaps coming back */
        uint64_t token = w->token;
        w->token = 0;
        if (alive != 0)
            continue;
        char text[PROTO_TEXT_MAX];
        if (w->hung_up)
            snprintf(text, sizeof text, "%s (pid %d) died without a word (killed by a signal, crashed, or the OOM "
                     "killer: its journal says which); its connection ended: %s", w->name, (int)w->pid, w->reason);
        else
            snprintf(text, sizeof text, "%s (pid %d) is gone without a word since the coordinator closed its "
                     "connection (%s)", w->name, (int)w->pid, w->reason);
        log_warn(0, "%s", text);
        record_error_of(co, w->role, w->device, w->pid, 0, -DF_EDEAD, text);
        for (size_t i = 0; i < co->n_departed; i++)
            if (co->departed[i].token == token)
                snprintf(co->departed[i].reason, sizeof co->departed[i].reason, "%s",
                         w->hung_up ? "died without a word" : "gone without a word after the coordinator closed it");
    }
}

/* Whether this coordinator saw the process of token leave (it is among the departed, or watched
 * since its connection ended): its going is told there, or by the watch when it dies. */
static bool seen_leaving(const struct coord *co, uint64_t token)
{
    for (size_t i = 0; i < co->n_departed; i++)
        if (co->departed[i].token == token)
            return true;
    for (size_t k = 0; k < COORD_WATCH_MAX; k++)
        if (co->watch[k].token == token)
            return true;
    return false;
}

/* An owner the ledger names (a lease's holder, a rank), found dead without this coordinator
 * having seen it leave: it died while the coordinator was down (or before it came back to this
 * one), and nothing else would tell the operator. */
static void record_unseen_death(struct coord *co, int role, uint64_t token, const char *what)
{
    if (token == PROC_TOKEN_GONE || seen_leaving(co, token))
        return;     /* (gone: an owner of before the host's reboot, which the start logged) */
    char text[PROTO_TEXT_MAX];
    snprintf(text, sizeof text, "%s-d (pid %d) died while away from this coordinator (not seen to leave: killed or "
             "crashed while the coordinator was down, or before it came back; its journal says how)%s%s",
             proto_role_name((unsigned)role), (int)proc_token_pid(token), *what ? ": " : "", what);
    log_warn(0, "%s", text);
    record_error_of(co, role, -1, proc_token_pid(token), 0, -DF_EDEAD, text);
}

/* The dead holders of leases found in one pass over them, each told once. */
struct dead_holders {
    size_t n;
    struct { uint64_t token; uint32_t batches; } h[8];  /* (more in one pass: the first eight told) */
};

static void dead_holder_add(struct dead_holders *d, uint64_t token)
{
    size_t k = 0;
    while (k < d->n && d->h[k].token != token)
        k++;
    if (k < d->n) {
        d->h[k].batches++;
    } else if (d->n < sizeof d->h / sizeof d->h[0]) {
        d->h[d->n].token = token;
        d->h[d->n++].batches = 1;
    }
}

static void dead_holders_tell(struct coord *co, const struct dead_holders *d)
{
    for (size_t k = 0; k < d->n; k++) {
        char what[96];
        snprintf(what, sizeof what, "its %u leased batch%s queued again", d->h[k].batches,
                 d->h[k].batches == 1 ? "" : "es");
        record_unseen_death(co, PROTO_ROLE_TARGET, d->h[k].token, what);
    }
}

/* The errors recorded before this start (ledger_error_recent: co->n_errors counted first, then
 * the newest COORD_ERRORS_KEPT oldest first), into the kept ones where record_error puts them. */
struct error_load {
    struct coord *co;
    uint64_t next;
};

static int load_error(void *ctx, const struct ledger_error *le)
{
    struct error_load *el = ctx;
    struct coord *co = el->co;
    uint64_t first = co->n_errors > COORD_ERRORS_KEPT ? co->n_errors - COORD_ERRORS_KEPT : 0;
    struct error_rec *e = &co->errors[(first + el->next++) % COORD_ERRORS_KEPT];
    int role = 0;
    for (unsigned i = 1; i <= PROTO_ROLE_CTL; i++)
        if (!strcmp(le->role, proto_role_name(i)))
            role = (int)i;
    *e = (struct error_rec){ .wall_ms = le->wall_ms, .role = role, .device = le->device, .fatal = le->fatal,
                             .code = le->code, .pid = le->pid };
    snprintf(e->message, sizeof e->message, "%s", le->message);
    return 0;
}

/* A drafter cannot load the lineage's head checkpoint (its files damaged or gone): the lineage
 * falls back to the newest checkpoint before it that is not dropped. Every batch trained after
 * that one (checkpointed or not) is queued again, every training row after it rolled back, each
 * generation's kept limit lowered to it; the checkpoints after it are dropped in the ledger (the
 * drafters overwrite or prune their folders). With none left the run ends FAILED with the head
 * it stands on: the operator decides. */
static void on_ckpt_bad(struct coord *co, struct member *m, const struct proto_ckpt_bad *cb)
{
    struct dgroup *g = &co->grp;
    if (co->state >= PROTO_STATE_STOPPED)
        return;
    if (cb->generation != g->gen || !g->ckpt_dir[0] || cb->step != g->ckpt_step || strcmp(cb->dir, g->ckpt_dir)) {
        /* Another rank's report acted on already, or one held across a reconnect: a generation
         * formed since loads the head again (and reports it, if it still does not load). */
        log_info("%s: checkpoint %s (step %" PRIu64 ", generation %" PRIu64 ") does not load, but the lineage stands"
                 " on %s in generation %" PRIu64 " now: ignored", m->name, cb->dir, cb->step, cb->generation,
                 g->ckpt_dir[0] ? g->ckpt_dir : "no checkpoint", g->gen);
        return;
    }
    if (!holds_rank(g, m)) {
        /* A drafter waiting for a place (or one confused about its generation) loaded nothing the
         * group stands on: it would drop a good checkpoint and queue its batches again. */
        log_warn(0, "%s: CKPT_BAD of checkpoint %s refused: it holds no rank in generation %" PRIu64, m->name, cb->dir,
                 g->gen);
        return;
    }
    char why[PROTO_TEXT_MAX + PROTO_PATH_MAX + PROTO_NAME_MAX + 96];
    snprintf(why, sizeof why, "checkpoint %s (step %" PRIu64 ") does not load on %s: %s", cb->dir, cb->step, m->name,
             cb->reason);
    record_error(co, m, 0, cb->code, why);
    struct ledger_checkpoint prev;
    int r = ledger_checkpoint_before(co->ledger, g->ckpt_step, &prev);
    if (r < 0) {
        log_error(r, "%s: the checkpoints table cannot be read: exiting to restart from the durable state",
                  co->ledger_path);
        exit(DAEMON_EX_FAILURE);
    }
    if (r == 0) {
        char fail[sizeof why + 96];
        snprintf(fail, sizeof fail, "%s; no earlier checkpoint of the run is left to fall back to", why);
        log_error(0, "%s", fail);
        co->fatal = true;
        coord_set_state(co, PROTO_STATE_FAILED, fail);
        return;
    }
    log_error(0, "%s: the lineage falls back to checkpoint %s (step %" PRIu64 ")", why, prev.dir, prev.step);
    ledger_checkpoint_drop(co->ledger, (int64_t)prev.step, why);
    ledger_train_rollback_after(co->ledger, (int64_t)prev.step);
    for (size_t i = 0; i < g->n_lim; i++)
        if (g->lim_step[i] > (int64_t)prev.step) {
            g->lim_step[i] = (int64_t)prev.step;
            ledger_generation_set(co->ledger, g->lim_gen[i], g->lim_step[i]);
        }
    uint64_t undone = 0;
    for (uint32_t e = 0; e < co->epochs && co->ep[e].built; e++)
        for (uint32_t i = 0; i < co->ep[e].s.n_batches; i++) {
            struct batch *b = &co->ep[e].b[i];
            if (b->row.state == BATCH_CHECKPOINTED && b->row.step > prev.step) {
                requeue(co, b, "checkpointed in a checkpoint that does not load, or after it");
                undone++;
            }
        }
    g->ckpt_gen = prev.gen;
    g->ckpt_step = prev.step;
    snprintf(g->ckpt_dir, sizeof g->ckpt_dir, "%s", prev.dir);
    ledger_meta_set_u64(co->ledger, "ckpt_gen", g->ckpt_gen);
    ledger_meta_set_u64(co->ledger, "ckpt_step", g->ckpt_step);
    ledger_meta_set(co->ledger, "ckpt_dir", g->ckpt_dir);
    log_notice("fall back to %s: %" PRIu64 " checkpointed batches back to the queue", prev.dir, undone);
    if (g->active)
        group_fail(co, why);    /* its ranks restart from the new head; it calls run_on */
    if (!g->active)
        run_on(co, undone, "a checkpoint did not load");
}

/* ---- message handlers ---- */

static void on_hello(struct coord *co, struct member *m, const struct proto_hello *h)
{
    if (h->role != PROTO_ROLE_CTL) {
        uint64_t ticks = 0;
        int r = proc_start_time(m->pid, &ticks);
        if (r == -EPERM || r == -EACCES) {
            coord_refuse(m, -EACCES, "pid %d: its /proc entry is hidden from the coordinator (/proc mounted with "
                         "hidepid): run it as the coordinator's user", (int)m->pid);
            return;
        }
        if (r == -EMFILE || r == -ENFILE || r == -ENOMEM) {
            /* the coordinator's own shortage, not the peer's fault: it asks again (a refusal of
             * this code is not final to it) */
            coord_refuse(m, -EAGAIN, "cannot read pid %d's start time now: %s", (int)m->pid, err_str(r));
            return;
        }
        if (r < 0 || h->pid != (uint32_t)m->pid || h->start_ticks != ticks) {
            coord_refuse(m, -DF_EPEER, "HELLO says pid %u start %" PRIu64 ", the socket peer is pid %d start %" PRIu64
                         " (another pid namespace?)", h->pid, h->start_ticks, (int)m->pid, ticks);
            return;
        }
        if (h->token != proc_token_make(m->pid, ticks)) {
            coord_refuse(m, -DF_EPEER, "HELLO's owner token %016" PRIx64 " is not the one of pid %d start %" PRIu64
                         " (%016" PRIx64 ")", h->token, (int)m->pid, ticks, proc_token_make(m->pid, ticks));
            return;
        }
        for (struct member *o = co->members; o; o = o->next)
            if (o != m && !o->closing && o->role && o->token == h->token) {
                coord_refuse(m, -EBUSY, "this process is already connected as member %" PRIu64, o->id);
                return;
            }
        m->token = h->token;
        /* It is back: its earlier connection ended, not its process (whose exit this member
         * will say BYE for, or be watched for in turn). */
        coord_watch_end(co, h->token);
    } else {
        /* Each holds a descriptor: a leaky monitoring loop must not use them all up (every
         * connection after that, a daemon's reconnect included, would be dropped). */
        unsigned ctls = 0;
        for (struct member *o = co->members; o; o = o->next)
            ctls += o->role == PROTO_ROLE_CTL && !o->closing;
        if (ctls >= COORD_CTL_MAX) {
            coord_refuse(m, -EBUSY, "%u dflashctl connections are open already (at most %d; one idle for %d s is "
                         "closed)", ctls, COORD_CTL_MAX, COORD_CTL_IDLE_MS / 1000);
            return;
        }
    }
    m->role = (int)h->role;
    m->device = h->device;
    m->last_request_ms = mono_ms();
    snprintf(m->name, sizeof m->name, "%s", h->name[0] ? h->name : proto_role_name(h->role));
    if (m->role != PROTO_ROLE_CTL)
        log_notice("%s (pid %d) registered as member %" PRIu64, m->name, (int)m->pid, m->id);

    /* Leases this process held before its connection (or the coordinator) went away. */
    struct batch *regrant[PROTO_MAX_LEASE_REQUEST];
    uint32_t n_regrant = 0;
    if (m->role == PROTO_ROLE_TARGET)
        for (struct batch *b = co->leased; b && n_regrant < PROTO_MAX_LEASE_REQUEST; b = b->lnext)
            if (!b->holder && b->row.owner == m->token) {
                b->holder = m;
                b->detached_until_ms = 0;
                m->leases++;
                regrant[n_regrant++] = b;
            }
    struct proto_msg w = { .type = PROTO_WELCOME };
    w.welcome = (struct proto_welcome){ .member_id = m->id, .heartbeat_ms = (uint32_t)co->cfg->coordinator.heartbeat_ms,
                                        .dead_after_ms = (uint32_t)co->cfg->coordinator.dead_after_ms,
                                        .cluster_state = (uint32_t)co->state, .n_regrants = n_regrant,
                                        .ring_slots = (uint32_t)co->cfg->ring.slots,
                                        .world_size = (uint32_t)co->cfg->drafter.world_size,
                                        .max_seq_len = co->sp.max_seq_len, .epochs = co->epochs };
    proto_strset(w.welcome.ring_name, sizeof w.welcome.ring_name, co->ring_name);
    proto_strset(w.welcome.dataset_path, sizeof w.welcome.dataset_path, co->cfg->data.path);
    w.welcome.dataset_checksum = co->ds.checksum;
    w.welcome.model_fingerprint = co->model_fp;
    proto_strset(w.welcome.model_config, sizeof w.welcome.model_config, co->model_config);
    w.welcome.resumes = co->resumes;
    coord_send(m, &w);
    for (uint32_t i = 0; i < n_regrant; i++)
        send_grant(co, m, regrant[i], 1);
    if (n_regrant)
        log_notice("%s reconnected: %u leases kept", m->name, n_regrant);

    if (m->role == PROTO_ROLE_DRAFTER && h->group_generation) {
        struct dgroup *g = &co->grp;
        uint32_t r = h->group_rank;
        if (g->active && h->group_generation == g->gen && r < g->world && g->rank_token[r] == m->token &&
            !g->rank_member[r]) {
            reseat(co, m, r);
        } else {
            struct proto_msg msg = { .type = PROTO_RESTART };
            msg.restart.generation = g->gen + 1;
            msg.restart.ckpt_step = g->ckpt_step;
            proto_strset(msg.restart.ckpt_dir, sizeof msg.restart.ckpt_dir, g->ckpt_dir);
            coord_send(m, &msg);
        }
    }
    int cmd = state_push[co->state];
    if (m->role != PROTO_ROLE_CTL && cmd && co->state != PROTO_STATE_RUNNING &&
        !(m->role == PROTO_ROLE_TARGET && co->finishing))   /* the final drain is the drafters' */
        push_control(m, cmd, co->reason);
}

/* A copy of batch b READY in `slot` that must not be delivered leaves the ring, unless a drafter
 * has taken it meanwhile (then its training shows as a duplicate) or its lease is keep_lease (a
 * copy made under the batch's current lease stays; the copy already recorded stays too, and the
 * drafters' list of batches leased more than once keeps a generation from training both). */
static int retract_copy(struct coord *co, struct batch *b, int slot, uint32_t keep_lease, const char *why)
{
    if (slot < 0 || ring_retract(co->ring, (unsigned)slot, b->row.id, keep_lease) < 0)
        return -1;
    co->retracted++;
    log_notice("batch " SCHED_BID ": its copy in slot %d taken out of the ring: %s", SCHED_BARGS(b->row.id), slot, why);
    return 0;
}

/* A READY copy of a batch trained already is redundant however it got there (a lease revoked
 * too late; a copy queued again while the first was being trained; a target that died between
 * publishing and its PUBLISHED; a drafter's held slot put back at a group restart): it leaves the
 * ring unless a drafter takes it first (the drafter group then leaves it out of its step if it
 * trained the batch in its generation). Run on the messages that make such a copy, when a
 * drafter group forms, and every tick for the ones no message announces. */
static void retract_trained_copies(struct coord *co)
{
    const struct ring_slot_stat *s = slot_snapshot(co);
    for (uint32_t i = 0; i < ring_layout(co->ring)->nslots; i++) {
        if (s[i].state != RING_READY)
            continue;
        struct batch *b = coord_batch(co, s[i].batch_id);
        if (b && b->row.state >= BATCH_TRAINED)
            retract_copy(co, b, (int)i, 0, "the batch is trained already");
    }
}

/* A clean exit leaves the ring settled: the slots of processes that died since the last look
 * are reclaimed (a daemon killed in the run's last moments whose hang-up came while it was still
 * exiting; such an owner gets up to a second to be gone) and READY copies of trained batches
 * retracted. Slots of owners still alive stay as they are. */
void coord_ring_settle(struct coord *co)
{
    if (!co->ring)
        return;
    uint64_t end = mono_ms() + 1000;
    struct ring_reclaim rc = { 0 };
    for (;;) {
        ring_reclaim_dead(co->ring, &rc);
        struct ring_stats st;
        if (ring_stats(co->ring, &st, NULL) < 0 || !(st.count[RING_WRITING] + st.count[RING_READING]) ||
            mono_ms() >= end)
            break;
        usleep(20000);
    }
    if (rc.writing_freed || rc.reading_requeued)
        log_notice("reclaimed slots of dead processes at exit: %u WRITING freed, %u READING requeued",
                   rc.writing_freed, rc.reading_requeued);
    retract_trained_copies(co);
}

static void on_published(struct coord *co, struct member *m, const struct proto_published *p)
{
    struct batch *b = coord_batch(co, p->batch_id);
    if (!b || p->slot >= (uint32_t)co->cfg->ring.slots) {
        log_warn(0, "%s published unknown batch " SCHED_BID " / slot %u", m->name, SCHED_BARGS(p->batch_id), p->slot);
        send_ack(m, p->seq, -DF_ERANGE);
        return;
    }
    int st = b->row.state;
    if (st >= BATCH_PUBLISHED) {
        if (st >= BATCH_TRAINED)
            retract_trained_copies(co);
        else if (b->row.slot != (int32_t)p->slot)
            retract_copy(co, b, (int)p->slot, b->row.leases, "a second copy of a published batch");
        if (b->row.owner == m->token && (st != BATCH_PUBLISHED || b->row.slot == (int32_t)p->slot)) {
            /* a replay after a reconnect, or TRAINED overtook it (both came from one lease) */
            send_ack(m, p->seq, 0);
            return;
        }
        co->duplicates++;
        log_warn(0, "%s published batch " SCHED_BID " in slot %u, but it is already %s: duplicate", m->name,
                 SCHED_BARGS(b->row.id), p->slot, batch_state_name(st));
        send_ack(m, p->seq, -DF_ESTATE);
        return;
    }
    if (!(st == BATCH_LEASED && b->holder == m) && slot_holding(co, slot_snapshot(co), b->row.id) != (int)p->slot) {
        /* Not its lease any more (queued again meanwhile) and its copy is gone from the ring: a
         * drafter took it and that training does not count (rolled back, or skipped). The batch
         * waits for a new publication. */
        log_notice("%s published batch " SCHED_BID " in slot %u, but it is %s and that slot no longer holds it: "
                   "refused", m->name, SCHED_BARGS(b->row.id), p->slot, batch_state_name(st));
        send_ack(m, p->seq, -DF_ESTATE);
        return;
    }
    if (st == BATCH_LEASED && b->holder && b->holder != m) {
        struct member *other = b->holder;
        other->leases--;
        struct proto_msg rv = { .type = PROTO_LEASE_REVOKE, .batch.batch_id = b->row.id };
        coord_send(other, &rv);
    } else if (st == BATCH_LEASED && b->holder == m) {
        m->leases--;
    }
    b->row.slot = (int32_t)p->slot;
    b->row.owner = m->token;
    batch_set(co, b, BATCH_PUBLISHED);
    m->published++;
    send_ack(m, p->seq, 0);
    if (b->consumed_early) {
        b->consumed_early = false;
        if (slot_holding(co, slot_snapshot(co), b->row.id) < 0) {
            requeue(co, b, "taken by a drafter before its publication arrived, and not trained (skipped or rolled back)");
            grant_leases(co);
        }
    }
}

/* A drafter took the copy of batch b with lease number `lease` from the ring, and that training
 * does not count (a skipped step, or a generation rolled back). Only the current copy matters: a
 * report about an earlier one (the batch was queued again since) changes nothing. */
static void not_trained(struct coord *co, struct batch *b, uint32_t lease, const char *why)
{
    if (lease != b->row.leases)
        return;
    if (b->row.state == BATCH_PUBLISHED && slot_holding(co, slot_snapshot(co), b->row.id) < 0) {
        requeue(co, b, why);
        grant_leases(co);
    } else if (b->row.state == BATCH_LEASED) {
        /* read before its PUBLISHED arrived: settled in on_published (kept in the ledger: the
         * report is acknowledged, a restart in between must not forget it) */
        b->consumed_early = true;
        ledger_untrained_add(co->ledger, b->row.id, lease);
    }
}

static void on_trained(struct coord *co, struct member *m, const struct proto_trained *t)
{
    struct batch *b = coord_batch(co, t->batch_id);
    struct dgroup *g = &co->grp;
    if (!b) {
        send_ack(m, t->seq, -DF_ERANGE);
        return;
    }
    /* The ranks of the report's generation (a run restarted with fewer drafters forms smaller
     * ones: an earlier generation's reports may name ranks past the running one's) */
    uint64_t world = g->world;
    if (!g->active || t->generation != g->gen) {
        char key[48];
        snprintf(key, sizeof key, "gen%" PRIu64 "_world", t->generation);
        if (ledger_meta_get_u64(co->ledger, key, &world) != 1)
            world = UINT32_MAX;     /* (not known: not checked) */
    }
    if (t->rank >= world) {
        /* (kept in the ledger's trains, it would make the run's record refused by dflash-replay) */
        log_warn(0, "%s: TRAINED for batch " SCHED_BID " refused: rank %u, generation %" PRIu64 " has %" PRIu64,
                 m->name, SCHED_BARGS(b->row.id), t->rank, t->generation, world);
        send_ack(m, t->seq, -DF_ERANGE);
        return;
    }
    if (t->generation > g->gen || t->generation == 0) {
        /* a generation never formed trained nothing: the report is a confused peer's */
        log_warn(0, "%s: TRAINED for batch " SCHED_BID " refused: generation %" PRIu64 " was never formed (the last is %"
                 PRIu64 ")", m->name, SCHED_BARGS(b->row.id), t->generation, g->gen);
        send_ack(m, t->seq, -DF_EPEER);
        return;
    }
    int kept, ckpt;
    if (g->active && t->generation == g->gen) {
        /* Only a rank of this generation trains in it: the process seated there, or the same
         * process on a connection not seated yet. A drafter waiting for a place (or one confused
         * about its generation) would mark a batch done that nobody trained. */
        if (!holds_rank(g, m)) {
            log_warn(0, "%s: TRAINED for batch " SCHED_BID " refused: it holds no rank in generation %" PRIu64, m->name,
                     SCHED_BARGS(b->row.id), g->gen);
            send_ack(m, t->seq, -DF_EPEER);
            return;
        }
        kept = 1;
        ckpt = g->ckpt_gen == t->generation && g->ckpt_dir[0] && t->step <= g->ckpt_step;
    } else {
        int64_t lim = gen_limit(co, t->generation);
        kept = lim >= 0 && t->step <= (uint64_t)lim;
        ckpt = kept;
    }
    if (!kept) {
        ledger_train_add(co->ledger, b->row.id, t->generation, t->step, t->rank, 1);
        not_trained(co, b, t->lease, "trained by a drafter generation that was rolled back");
        send_ack(m, t->seq, 0);
        return;
    }
    if (b->row.state >= BATCH_TRAINED) {
        if (b->row.gen == t->generation && b->row.step == t->step) {
            /* a replay, or the second report of a batch (by its rank and by rank 0) */
            m->trained += (int)t->rank == m->rank;
            send_ack(m, t->seq, 0);
            return;
        }
        co->duplicates++;
        log_error(0, "batch " SCHED_BID " trained again (gen %" PRIu64 " step %" PRIu64 ", before gen %" PRIu64
                  " step %" PRIu64 ")",
                  SCHED_BARGS(b->row.id), t->generation, t->step, b->row.gen, b->row.step);
        ledger_train_add(co->ledger, b->row.id, t->generation, t->step, t->rank, 0);
        send_ack(m, t->seq, -DF_ESTATE);
        return;
    }
    if (b->row.state == BATCH_LEASED && b->holder) {
        /* Trained before it was (re-)published, e.g. a TRAINED that was in flight when a group
         * restart re-queued the batch: the target leasing it again must not publish it twice. */
        struct proto_msg rv = { .type = PROTO_LEASE_REVOKE, .batch.batch_id = b->row.id };
        b->holder->leases--;
        coord_send(b->holder, &rv);
    }
    /* an earlier copy was trained (the batch had been queued again meanwhile): the current one
     * must not be */
    int earlier = b->row.state == BATCH_PUBLISHED && t->lease != b->row.leases;
    b->row.gen = t->generation;
    b->row.step = t->step;
    batch_set(co, b, ckpt ? BATCH_CHECKPOINTED : BATCH_TRAINED);
    if (earlier)
        retract_trained_copies(co);
    ledger_train_add(co->ledger, b->row.id, t->generation, t->step, t->rank, 0);
    m->trained += (int)t->rank == m->rank;
    send_ack(m, t->seq, 0);
}

static void on_checkpointed(struct coord *co, struct member *m, const struct proto_checkpointed *c)
{
    struct dgroup *g = &co->grp;
    if (!g->active || c->generation != g->gen) {
        log_warn(0, "%s: checkpoint %s of generation %" PRIu64 " ignored: not in the lineage (generation %" PRIu64 "%s)",
                 m->name, c->dir, c->generation, g->gen, g->active ? "" : ", restarting");
        send_ack(m, c->seq, -DF_ESTATE);
        return;
    }
    if (m->rank != 0) {
        /* rank 0 writes the group's checkpoints; anything else is a confused or foreign peer */
        log_warn(0, "%s: checkpoint %s ignored: only rank 0 of generation %" PRIu64 " writes checkpoints (%s is %s)",
                 m->name, c->dir, g->gen, m->name, m->rank < 0 ? "not in the group" : "another rank");
        send_ack(m, c->seq, -DF_EPEER);
        return;
    }
    if (g->ckpt_gen == c->generation && g->ckpt_dir[0] &&
        (c->step < g->ckpt_step || (c->step == g->ckpt_step && !strcmp(c->dir, g->ckpt_dir)))) {
        send_ack(m, c->seq, 0);         /* an older one or the head, replayed (its ACK was lost) */
        return;
    }
    if (co->nan_pending && co->nan_step && c->step >= co->nan_step) {
        /* Trained on from the state that met the non-finite value (a drafter that took an
         * earlier RESUME for the answer to its report): not before the operator's resume. */
        log_warn(0, "%s: checkpoint %s of step %" PRIu64 " refused: a non-finite value at step %" PRIu64
                 " waits for the operator's resume", m->name, c->dir, c->step, co->nan_step);
        send_ack(m, c->seq, -DF_ESTATE);
        return;
    }
    if (g->ckpt_gen != c->generation && g->ckpt_dir[0] && c->step < g->ckpt_step) {
        /* A generation starts from the head: its steps come after it. One that comes before was
         * trained from other weights (a rank that did not load the head): not in the lineage. */
        log_error(0, "%s: checkpoint %s of generation %" PRIu64 " at step %" PRIu64 " refused: the generation started"
                  " from step %" PRIu64, m->name, c->dir, c->generation, c->step, g->ckpt_step);
        send_ack(m, c->seq, -DF_ESTATE);
        return;
    }
    g->ckpt_gen = c->generation;
    g->ckpt_step = c->step;
    snprintf(g->ckpt_dir, sizeof g->ckpt_dir, "%s", c->dir);
    ledger_checkpoint_add(co->ledger, c->generation, c->step, c->dir);
    ledger_meta_set_u64(co->ledger, "ckpt_gen", g->ckpt_gen);
    ledger_meta_set_u64(co->ledger, "ckpt_step", g->ckpt_step);
    ledger_meta_set(co->ledger, "ckpt_dir", g->ckpt_dir);
    uint64_t n = 0;
    for (struct batch *b = co->trained, *next; b; b = next) {
        next = b->lnext;    /* batch_set unlinks b */
        if (b->row.gen == c->generation && b->row.step <= c->step) {
            batch_set(co, b, BATCH_CHECKPOINTED);
            n++;
        }
    }
    log_notice("checkpoint %s (generation %" PRIu64 " step %" PRIu64 ") is durable: %" PRIu64 " more batches done, %"
               PRIu64 " of about %" PRIu64, c->dir, c->generation, c->step, n, co->counts[BATCH_CHECKPOINTED],
               coord_est_batches(co));
    send_ack(m, c->seq, 0);
}

/* Whether m's next ERROR is recorded (COORD_ERRORS_PER_WINDOW). */
static bool error_budget(struct member *m, bool must)
{
    uint64_t now = mono_ms();
    if (now - m->err_window_ms >= COORD_ERRORS_WINDOW_MS) {
        if (m->err_unrecorded)
            log_warn(0, "%s sent %u more errors in %d s than are recorded (%d)", m->name, m->err_unrecorded,
                     COORD_ERRORS_WINDOW_MS / 1000, COORD_ERRORS_PER_WINDOW);
        m->err_window_ms = now;
        m->err_n = m->err_unrecorded = 0;
    }
    if (++m->err_n <= COORD_ERRORS_PER_WINDOW || must)
        return true;
    m->err_unrecorded++;
    return false;
}

static void on_error(struct coord *co, struct member *m, const struct proto_error *e)
{
    /* Beyond the budget an error is not recorded, but it still acts; a fatal one that fails the
     * cluster, and a non-finite one that pauses it, are always recorded (a fatal one once the
     * cluster fails already is one more error: sent in a loop, it cannot fill the disk). */
    bool pauses = e->code == -DF_ENAN && (co->state == PROTO_STATE_RUNNING || co->state == PROTO_STATE_STARTING ||
                                          co->state == PROTO_STATE_DRAINING);
    bool fails = e->fatal && (co->state < PROTO_STATE_DRAINING || (co->state == PROTO_STATE_DRAINING && !co->fatal));
    bool rec = error_budget(m, fails || pauses);
    if (rec)
        record_error(co, m, (int)e->fatal, e->code, e->message);
    char reason[PROTO_TEXT_MAX + 80];
    size_t nl = strlen(m->name);     /* daemons often name themselves already */
    if (!strncmp(e->message, m->name, nl) && e->message[nl] == ':')
        snprintf(reason, sizeof reason, "%s", e->message);
    else
        snprintf(reason, sizeof reason, "%s: %s", m->name, e->message);
    if (e->fatal) {
        if (rec)
            log_error(0, "fatal error from %s (pid %d): %s (%s)", m->name, (int)m->pid, e->message, err_str(e->code));
        if (co->state < PROTO_STATE_DRAINING) {
            co->fatal = true;
            /* With a non-finite value waiting for the operator the poisoned drafters write no
             * checkpoint, so no drain could end: FAILED now (nothing checkpointed is lost). */
            coord_set_state(co, co->nan_pending ? PROTO_STATE_FAILED : PROTO_STATE_DRAINING, reason);
        } else if (co->state == PROTO_STATE_DRAINING && !co->fatal) {
            /* A drain on its way already (the operator's, the final one): it now ends FAILED with
             * this reason, and no lost drafter sends it back to RUNNING. */
            co->fatal = true;
            co->signal_drain_from = -1;     /* kept across a coordinator restart, as the operator's */
            snprintf(co->reason, sizeof co->reason, "%.*s", (int)text_fit(reason, sizeof co->reason - 1), reason);
            if (co->finishing) {
                co->finishing = false;
                for (struct member *t = co->members; t; t = t->next)
                    if (t->role == PROTO_ROLE_TARGET)
                        push_control(t, PROTO_CTL_DRAIN, reason);
            }
            save_state(co);
        }
    } else if (e->code == -DF_ENAN) {
        /* the first report, or one of an earlier step (the checkpoints refused start there) */
        bool first = !co->nan_pending;
        bool earlier = e->step && (first || !co->nan_step || e->step < co->nan_step);
        if (co->state < PROTO_STATE_STOPPED && (first || earlier)) {
            co->nan_pending = true;     /* (saved with the state change below, or here) */
            co->nan_step = earlier ? e->step : first ? 0 : co->nan_step;
            save_state(co);
        }
        if (rec)
            log_error(0, "%s reports a non-finite value: %s: pausing the cluster", m->name, e->message);
        if (co->state == PROTO_STATE_DRAINING) {
            /* The poisoned drafters write no final checkpoint, so the drain would never end:
             * on the way to FAILED it ends now, and a stop signal's (sent once: no operator
             * waits to resume) ends STOPPED now; the operator's pauses for the operator. */
            char again[sizeof reason + 48];
            if (co->fatal) {
                coord_set_state(co, PROTO_STATE_FAILED, co->reason);
            } else if (co->signal_drain_from >= 0) {
                snprintf(again, sizeof again, "stop signal (the drain is cut short: %s)", reason);
                coord_set_state(co, PROTO_STATE_STOPPED, again);
            } else {
                snprintf(again, sizeof again, "%s (the drain is off: resume, then drain again)", reason);
                coord_set_state(co, PROTO_STATE_PAUSED, again);
            }
        } else if (co->state == PROTO_STATE_RUNNING || co->state == PROTO_STATE_STARTING) {
            coord_set_state(co, PROTO_STATE_PAUSED, reason);
        } else if (co->state == PROTO_STATE_PAUSED && first) {
            /* Paused by the operator already: the reason now says what the resume must answer
             * (status showed the pause's note alone while a drain was refused for the value). */
            pause_again(co, reason);
        }
    } else if (rec) {
        log_warn(0, "error from %s (pid %d): %s (%s)", m->name, (int)m->pid, e->message, err_str(e->code));
    }
}

static void reply(struct member *m, int status, char *json)
{
    struct proto_msg msg = { .type = PROTO_REPLY };
    msg.reply.status = status;
    msg.reply.json_len = json ? (uint32_t)strlen(json) : 0;
    msg.json = json;
    if (coord_send(m, &msg) < 0) {
        char *small = coord_json_result(m->co, 0, "reply too large");
        msg.reply.status = -E2BIG;
        msg.reply.json_len = small ? (uint32_t)strlen(small) : 0;     /* NULL: out of memory */
        msg.json = small;
        coord_send(m, &msg);
        free(small);
    }
    free(json);
}

static void on_control(struct coord *co, struct member *m, const struct proto_control *c)
{
    char reason[PROTO_TEXT_MAX + 200], who[96];
    if (m->is_tcp)
        snprintf(who, sizeof who, "over TCP, authenticated by token");   /* m->name holds the address */
    else
        snprintf(who, sizeof who, "pid %d, uid %d", (int)m->pid, (int)m->uid);
    /* the operator's reason kept whole in the cluster's (PROTO_REASON_MAX leaves room): a long
     * name is cut instead */
    size_t rest = strlen(proto_control_name(c->cmd)) + strlen(" by  ()") + strlen(who) +
                  (c->reason[0] ? 2 + strlen(c->reason) : 0);
    size_t room = rest < sizeof co->reason - 1 ? sizeof co->reason - 1 - rest : 0;
    snprintf(reason, sizeof reason, "%s by %.*s (%s)%s%s", proto_control_name(c->cmd), (int)text_fit(m->name, room),
             m->name, who, c->reason[0] ? ": " : "", c->reason);
    const char *refused = NULL;
    char why_space[PROTO_TEXT_MAX];
    switch (c->cmd) {
    case PROTO_CTL_PAUSE:
        if (co->state == PROTO_STATE_RUNNING || co->state == PROTO_STATE_STARTING) {
            coord_set_state(co, PROTO_STATE_PAUSED, reason);
        } else if (co->state == PROTO_STATE_PAUSED && co->space.paused) {
            /* paused for want of space: now the operator's pause, which room alone does not end */
            co->space.paused = false;
            pause_again(co, reason);
        } else if (co->state != PROTO_STATE_PAUSED) {
            refused = "only a running cluster can pause";
        } else {
            log_notice("%s: already paused (%s): nothing changes", reason, co->reason);
        }
        break;
    case PROTO_CTL_RESUME:
        if (co->state == PROTO_STATE_PAUSED && co->space.thread_on && co->space.free_mb != UINT64_MAX &&
            co->space.free_mb < (uint64_t)co->cfg->coordinator.min_free_mb) {
            /* (it would pause again within seconds) */
            snprintf(why_space, sizeof why_space, "%s has %" PRIu64 " MiB free, below coordinator.min_free_mb = %" PRId64
                     ": free space first (a pause for it ends by itself at twice that), or restart the coordinator "
                     "with a lower coordinator.min_free_mb", co->space.where, co->space.free_mb,
                     co->cfg->coordinator.min_free_mb);
            refused = why_space;
        } else if (co->state == PROTO_STATE_PAUSED) {
            co->resumes++;      /* before the RESUME pushes and the saved state carry it */
            co->nan_pending = false;    /* the operator removed the cause: the drafters checkpoint again */
            log_notice("%s", reason);   /* who resumed, and why (a running cluster shows no reason) */
            coord_set_state(co, PROTO_STATE_RUNNING, "");
        }
        else if (co->state != PROTO_STATE_RUNNING)
            refused = "only a paused cluster can resume";
        else
            log_notice("%s: already running: nothing changes", reason);
        break;
    case PROTO_CTL_DRAIN:
        if (co->state == PROTO_STATE_DRAINING && co->signal_drain_from >= 0) {
            co->signal_drain_from = -1;     /* the operator's drain now: a restart resumes it */
            save_state(co);
        }
        if (co->state >= PROTO_STATE_STOPPED) {
            refused = "the cluster has ended: nothing to drain";
        } else if (co->state < PROTO_STATE_DRAINING && co->nan_pending) {
            refused = "a non-finite value paused the run and no resume came since: its drafters write no "
                      "checkpoint, so the drain could not end; remove the cause, resume, then drain";
        } else if (co->state < PROTO_STATE_DRAINING) {
            coord_set_state(co, PROTO_STATE_DRAINING, reason);
        } else if (co->finishing) {
            /* The operator's drain outranks the final one: the targets leave too, and a lost
             * drafter no longer sends the run back to RUNNING. */
            co->finishing = false;
            save_state(co);
            for (struct member *t = co->members; t; t = t->next)
                if (t->role == PROTO_ROLE_TARGET)
                    push_control(t, PROTO_CTL_DRAIN, reason);
        }
        break;
    case PROTO_CTL_STOP:
        if (co->state < PROTO_STATE_STOPPED)
            stop_cluster(co, reason);
        break;
    }
    char why[400];
    if (refused)
        snprintf(why, sizeof why, "%s (state is %s)", refused, proto_state_name((unsigned)co->state));
    reply(m, refused ? -DF_ESTATE : 0, coord_json_result(co, !refused, refused ? why : NULL));
}

void coord_handle(struct member *m, const struct proto_msg *msg)
{
    struct coord *co = m->co;
    if (msg->type == PROTO_HELLO) {
        if (m->role) {
            coord_refuse(m, -DF_EPEER, "second HELLO");
            return;
        }
        on_hello(co, m, &msg->hello);
        return;
    }
    int role = m->role;
    switch (msg->type) {
    case PROTO_HEARTBEAT:
        m->hb = msg->heartbeat;
        m->have_hb = true;
        return;
    case PROTO_LEASE_REQUEST:
        if (role != PROTO_ROLE_TARGET)
            break;
        m->want += msg->lease_request.n;
        if (m->want > 4 * PROTO_MAX_LEASE_REQUEST)
            m->want = 4 * PROTO_MAX_LEASE_REQUEST;
        grant_leases(co);
        return;
    case PROTO_LEASE_RETURN: {
        if (role != PROTO_ROLE_TARGET)
            break;
        struct batch *b = coord_batch(co, msg->batch.batch_id);
        if (b && b->row.state == BATCH_LEASED && b->holder == m) {
            m->leases--;
            requeue(co, b, "returned by its target");
            grant_leases(co);
        }
        return;
    }
    case PROTO_CKPT_BAD:
        if (role != PROTO_ROLE_DRAFTER)
            break;
        on_ckpt_bad(co, m, &msg->ckpt_bad);
        return;
    case PROTO_SKIPPED: {
        if (role != PROTO_ROLE_DRAFTER)
            break;
        /* A drafter consumed the slot but did not train it (a skipped non-finite step): the
         * batch is in no slot any more, so only a new publication can deliver it. (Any drafter's
         * report is taken: a rank of an ended generation consumes slots until it hears of the end,
         * and its place may be another's by then.) */
        struct batch *b = coord_batch(co, msg->skipped.batch_id);
        if (b)
            not_trained(co, b, msg->skipped.lease, "consumed but not trained by a drafter");
        send_ack(m, msg->skipped.seq, b ? 0 : -DF_ERANGE);
        return;
    }
    case PROTO_PUBLISHED:
        if (role != PROTO_ROLE_TARGET)
            break;
        on_published(co, m, &msg->published);
        return;
    case PROTO_JOIN_GROUP:
        if (role != PROTO_ROLE_DRAFTER)
            break;
        if (m->rank < 0 && co->grp.active) {
            /* Its GROUP was lost with the connection (it asks again, holding no rank): the
             * generation was formed with it, and its peers wait for it in the collective. */
            int r = token_rank(&co->grp, m->token);
            if (r >= 0 && !co->grp.rank_member[r])
                reseat(co, m, (uint32_t)r);
        }
        if (m->rank >= 0 && co->grp.active) {
            send_group(co, m);
            return;
        }
        m->joined = true;
        try_form_group(co);
        return;
    case PROTO_TRAINED:
        if (role != PROTO_ROLE_DRAFTER)
            break;
        on_trained(co, m, &msg->trained);
        return;
    case PROTO_CHECKPOINTED:
        if (role != PROTO_ROLE_DRAFTER)
            break;
        on_checkpointed(co, m, &msg->checkpointed);
        return;
    case PROTO_BYE:
        if (role != PROTO_ROLE_TARGET && role != PROTO_ROLE_DRAFTER)
            break;
        m->said_bye = true;
        snprintf(m->bye, sizeof m->bye, "%.*s", (int)text_fit(msg->bye.reason, sizeof m->bye - 1), msg->bye.reason);
        log_info("%s (pid %d) leaves, exit status %u: %s", m->name, (int)m->pid, msg->bye.exit_status,
                 msg->bye.reason);
        return;
    case PROTO_ERROR:
        if (role != PROTO_ROLE_TARGET && role != PROTO_ROLE_DRAFTER)
            break;      /* a ctl client reports nothing, and must not fail the cluster */
        on_error(co, m, &msg->error);
        return;
    case PROTO_CONTROL:
        if (role != PROTO_ROLE_CTL)
            break;      /* pause, resume, drain and stop are the operator's (dflashctl) */
        m->last_request_ms = mono_ms();
        on_control(co, m, &msg->control);
        return;
    case PROTO_QUERY:
        m->last_request_ms = mono_ms();
        reply(m, 0, coord_json(co, (int)msg->query.what, msg->query.limit));
        return;
    default:
        break;
    }
    coord_refuse(m, -DF_EPEER, "%s is not a message a %s may send", proto_type_name(msg->type),
                 proto_role_name((unsigned)role));
}

/* ---- departures and timeouts ---- */

void coord_member_gone(struct member *m, const char *reason)
{
    struct coord *co = m->co;
    if (m->role == PROTO_ROLE_CTL)
        return;
    int alive = proc_token_alive(m->token);   /* 1 alive, 0 dead, <0 unknown: treat as alive */
    char why[PROTO_NAME_MAX + 32 + 512];    /* (whole: a reason holds a BYE's words; cut, a character could be cut in two) */
    snprintf(why, sizeof why, "%s (pid %d) %s", m->name, (int)m->pid, alive == 0 ? "died" : reason);
    struct ring_reclaim rc = { 0 };
    if (alive == 0)
        ring_reclaim_owner(co->ring, m->token, &rc);
    if (rc.writing_freed || rc.reading_requeued)
        log_notice("reclaimed the slots of %s: %u WRITING freed, %u READING back to READY", m->name, rc.writing_freed,
                   rc.reading_requeued);
    if (m->role == PROTO_ROLE_TARGET && m->leases) {
        const struct ring_slot_stat *s = alive == 0 ? slot_snapshot(co) : NULL;
        for (struct batch *b = co->leased, *next; b; b = next) {
            next = b->lnext;    /* lease_lost takes b (only b) off the list */
            if (b->holder != m)
                continue;
            b->holder = NULL;
            if (alive == 0) {
                lease_lost(co, b, s, why);
            } else {
                /* Alive but disconnected: its leases wait for it to reconnect. */
                b->detached_until_ms = mono_ms() + (uint64_t)co->cfg->coordinator.dead_after_ms;
            }
        }
        m->leases = 0;
    }
    if (m->role == PROTO_ROLE_DRAFTER && m->rank >= 0 && co->grp.rank_member[m->rank] == m)
        co->grp.rank_member[m->rank] = NULL;    /* m is freed next, whatever the state */
    if (m->role == PROTO_ROLE_DRAFTER && m->rank >= 0 && co->grp.active && co->state < PROTO_STATE_STOPPED) {
        if (alive == 0)
            group_fail(co, why);
        else    /* each rank its own time to come back, from its own disconnect */
            co->grp.rank_deadline_ms[m->rank] = mono_ms() + (uint64_t)co->cfg->coordinator.dead_after_ms;
    }
    m->rank = -1;
    m->joined = false;
    m->want = 0;
    grant_leases(co);
}

static void end_recovery(struct coord *co)
{
    co->recovering = false;
    struct dgroup *g = &co->grp;
    uint64_t now = mono_ms();
    for (uint32_t r = 0; g->active && r < g->world; r++) {
        if (g->rank_member[r])
            continue;
        if (g->rank_token[r] && proc_token_alive(g->rank_token[r]) != 0) {
            /* Alive, not back yet: a drafter in a long step (CPU) reconnects when the step ends.
             * It has the time any rank has whose connection ended (the tick fails the group
             * after it; a death is seen there at once). */
            g->rank_deadline_ms[r] = now + (uint64_t)co->cfg->coordinator.dead_after_ms;
            log_notice("rank %u of generation %" PRIu64 " (pid %d) is alive but not back yet: waiting up to %" PRIu64
                       " ms for it", r, g->gen, (int)proc_token_pid(g->rank_token[r]),
                       (uint64_t)co->cfg->coordinator.dead_after_ms);
            continue;
        }
        /* the rollback also re-queues what its drafters took from the ring */
        group_fail(co, "a drafter did not come back after the coordinator restart");
        break;
    }
    /* A published batch no slot holds was taken by a drafter. With the whole group back, that
     * drafter reports it (TRAINED, perhaps a step late, or skipped): it stays published, and the
     * orphan sweep queues it again if no report ever comes. With no group, nobody will report
     * it: it is queued again now. */
    uint64_t lost = 0;
    if (!g->active) {
        const struct ring_slot_stat *s = slot_snapshot(co);
        for (struct batch *b = co->published, *next; b; b = next) {
            next = b->lnext;    /* requeue takes b (only b) off the list */
            if (slot_holding(co, s, b->row.id) < 0) {
                requeue(co, b, "its slot no longer holds it after the coordinator restart");
                lost++;
            }
        }
    }
    log_notice("recovery done: %" PRIu64 " publications lost while the coordinator was down", lost);
    if (co->state == PROTO_STATE_STARTING)
        coord_set_state(co, PROTO_STATE_RUNNING, "");
    grant_leases(co);
}

/* Every epoch scheduled and every batch of it in a durable checkpoint. */
static bool run_complete(const struct coord *co)
{
    return next_epoch(co) >= co->epochs && co->counts[BATCH_CHECKPOINTED] == co->total_batches;
}

static void check_done(struct coord *co)
{
    uint64_t *c = co->counts;
    bool all_built = next_epoch(co) >= co->epochs;
    if (co->state == PROTO_STATE_RUNNING && all_built && !c[BATCH_PENDING] && !c[BATCH_LEASED] && !c[BATCH_PUBLISHED]) {
        if (c[BATCH_TRAINED]) {
            /* Only the drafters drain: a drafter lost now sends the run back to RUNNING, and
             * the targets must still be there to publish the batches again. */
            co->finishing = true;
            coord_set_state(co, PROTO_STATE_DRAINING, "every batch trained: final checkpoint");
        }
        else
            coord_set_state(co, PROTO_STATE_STOPPED, "run complete: every batch checkpointed");
    }
    if (co->state == PROTO_STATE_DRAINING && !c[BATCH_LEASED] && !c[BATCH_TRAINED]) {
        if (co->fatal)
            coord_set_state(co, PROTO_STATE_FAILED, co->reason);
        else if (run_complete(co))
            coord_set_state(co, PROTO_STATE_STOPPED, "run complete: every batch checkpointed");
        else {
            /* the drain's reason kept (who asked, and why): the stop note and dflashctl say it */
            char why[sizeof co->reason];
            snprintf(why, sizeof why, "drained (%.*s)", (int)text_fit(co->reason, sizeof why - 16), co->reason);
            coord_set_state(co, PROTO_STATE_STOPPED, co->reason[0] ? why : "drained");
        }
    }
}

/* Published batches that no slot holds were taken by a drafter, whose TRAINED (or skip report)
 * follows within a step or two, or within a collective's timeout when a peer is slow. One that
 * nothing reports for longer (the report was lost with a coordinator that crashed, or its effect
 * was) would keep the run from ever ending: it is queued again. */
static void sweep_orphans(struct coord *co, uint64_t now)
{
    static uint64_t last;
    uint64_t grace = (uint64_t)co->cfg->drafter.collective_timeout_ms + 2ull * (uint64_t)co->cfg->coordinator.dead_after_ms;
    if (co->recovering || !co->counts[BATCH_PUBLISHED] || now - last < (grace / 2 < 5000 ? grace / 2 : 5000))
        return;
    last = now;
    const struct ring_slot_stat *s = slot_snapshot(co);
    for (struct batch *b = co->published, *next; b; b = next) {
        next = b->lnext;        /* requeue takes b (only b) off the list */
        if (slot_holding(co, s, b->row.id) >= 0)
            b->orphan_since_ms = 0;
        else if (!b->orphan_since_ms)
            b->orphan_since_ms = now;
        else if (now - b->orphan_since_ms > grace) {
            char why[96];
            snprintf(why, sizeof why, "taken from the ring and not reported by any drafter for %" PRIu64 " s",
                     (now - b->orphan_since_ms) / 1000);
            log_warn(0, "batch " SCHED_BID ": %s: queued again", SCHED_BARGS(b->row.id), why);
            requeue(co, b, why);
        }
    }
}

/* coordinator.min_free_mb: with less free space where the ledger or the checkpoints are written,
 * a commit or a checkpoint would fail (the coordinator then exits, and a restart fails the same
 * way). Three looks in a row (a second apart) below it pause the cluster, which writes little
 * while paused; three at twice it resume that pause, unless the operator paused it too or a
 * non-finite value did. The looks (statvfs) are space_thread's, the verdicts check_space's. */
static void *space_thread(void *arg)
{
    struct coord *co = arg;
    const char *dirs[2] = { co->space.ledger_dir, co->space.ckpt_dir };    /* set before the thread */
    for (;;) {
        for (int i = 0; i < 2; i++) {
            struct statvfs v;
            int64_t r = statvfs(dirs[i], &v) < 0 ? -errno : (int64_t)((uint64_t)v.f_bavail * v.f_frsize >> 20);
            atomic_store(&co->space.look[i], r);
        }
        atomic_fetch_add(&co->space.looks, 1);
        sleep(1);
    }
    return NULL;
}

int coord_space_start(struct coord *co)
{
    if (!co->cfg->coordinator.min_free_mb)
        return 0;
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int r = pthread_create(&t, &a, space_thread, co);
    pthread_attr_destroy(&a);
    if (r)
        return -r;
    co->space.thread_on = true;
    co->space.seen_ms = mono_ms();
    return 0;
}

static void check_space(struct coord *co, uint64_t now)
{
    if (!co->space.thread_on) {
        if (!co->cfg->coordinator.min_free_mb && co->space.paused && co->state == PROTO_STATE_PAUSED &&
            !co->nan_pending) {
            /* restarted with the watch off over a pause of its own: nothing would end it */
            log_notice("coordinator.min_free_mb = 0: the pause for want of space ends");
            coord_set_state(co, PROTO_STATE_RUNNING, "");
        }
        return;
    }
    uint64_t looks = atomic_load(&co->space.looks);
    if (looks == co->space.looks_seen) {
        if (now - co->space.seen_ms > 30000 && !co->space.hang_warned) {
            log_warn(0, "the free space of %s and %s has not been read for %" PRIu64 " s: a storage that hangs? "
                     "(coordinator.min_free_mb)", co->space.ledger_dir, co->space.ckpt_dir, (now - co->space.seen_ms) / 1000);
            co->space.hang_warned = true;
        }
        return;
    }
    co->space.looks_seen = looks;
    co->space.seen_ms = now;
    co->space.hang_warned = false;
    if (co->state >= PROTO_STATE_STOPPED)
        return;
    uint64_t min_mb = (uint64_t)co->cfg->coordinator.min_free_mb;
    const char *dirs[2] = { co->space.ledger_dir, co->space.ckpt_dir };
    co->space.free_mb = UINT64_MAX;
    for (int i = 0; i < 2; i++) {
        int64_t r = atomic_load(&co->space.look[i]);
        if (r < 0) {
            /* (the checkpoint folder comes with the first checkpoint) */
            if (r != -ENOENT && !co->space.warned) {
                log_warn((int)r, "%s: cannot read its free space (coordinator.min_free_mb)", dirs[i]);
                co->space.warned = true;
            }
        } else if ((uint64_t)r < co->space.free_mb) {
            co->space.free_mb = (uint64_t)r;
            co->space.where = dirs[i];
        }
    }
    if (co->space.free_mb == UINT64_MAX)
        return;
    co->space.low = co->space.free_mb < min_mb ? co->space.low + 1 : 0;
    co->space.high = co->space.free_mb >= 2 * min_mb ? co->space.high + 1 : 0;
    if (co->space.low >= 3 && (co->state == PROTO_STATE_RUNNING || co->state == PROTO_STATE_STARTING)) {
        char why[PROTO_TEXT_MAX];
        snprintf(why, sizeof why, "%s has %" PRIu64 " MiB free, below coordinator.min_free_mb = %" PRIu64
                 ": paused until it has %" PRIu64 " MiB", co->space.where, co->space.free_mb, min_mb, 2 * min_mb);
        log_warn(0, "%s", why);
        record_error(co, NULL, 0, -ENOSPC, why);
        coord_set_state(co, PROTO_STATE_PAUSED, why);
        co->space.paused = true;
        save_state(co);
    } else if (co->space.paused && co->space.high >= 3 && co->state == PROTO_STATE_PAUSED && !co->nan_pending) {
        log_notice("%s has %" PRIu64 " MiB free again (coordinator.min_free_mb = %" PRIu64 "): resuming",
                   co->space.where, co->space.free_mb, min_mb);
        coord_set_state(co, PROTO_STATE_RUNNING, "");
    }
}

void coord_tick(struct coord *co)
{
    uint64_t now = mono_ms();
    uint64_t dead_after = (uint64_t)co->cfg->coordinator.dead_after_ms;
    /* Once a second, before this tick changes anything: the ledger holds what the daemons were
     * told, so the restart resumes from it exactly as after a crash. */
    if (co->state < PROTO_STATE_STOPPED && now - co->ring_checked_ms >= 1000) {
        co->ring_checked_ms = now;
        char why[PROTO_TEXT_MAX];
        if (coord_ring_check(co, why, sizeof why) < 0) {
            log_error(0, "%s", why);
            record_error(co, NULL, 0, -ENOENT, why);
            char err[512];
            if (ledger_commit(co->ledger, err, sizeof err) < 0)
                log_error(0, "the error above is not in the ledger: %s", err);
            exit(DAEMON_EX_FAILURE);
        }
    }
    if (co->recovering && now >= co->recovery_until_ms)
        end_recovery(co);
    check_space(co, now);
    /* A tick that comes late (the loop stalled: a slow fsync in a commit) runs before this loop
     * iteration reads the sockets, so heartbeats sent meanwhile are still unread: it judges no
     * heartbeat. The next tick, after the reads, does (two in a row never skip). */
    uint64_t gap = co->last_tick_ms ? now - co->last_tick_ms : 0;
    bool stalled = gap > (uint64_t)co->cfg->coordinator.heartbeat_ms, late = stalled && !co->tick_skipped_hb;
    if (stalled) {
        co->stalls++;
        if (gap > co->stall_ms_max)
            co->stall_ms_max = gap;
    }
    if (late && (!co->stall_logged_ms || now - co->stall_logged_ms >= 10000)) {
        log_warn(0, "the event loop was held up for %" PRIu64 " ms (a slow ledger commit?): heartbeats are judged "
                 "on the next tick, once the sockets are read (%" PRIu64 " such stalls so far)", gap, co->stalls);
        co->stall_logged_ms = now;  /* at most one such line in 10 s */
    }
    co->last_tick_ms = now;
    co->tick_skipped_hb = late;
    for (struct member *m = co->members, *next; m && !late; m = next) {
        next = m->next;
        if (m->role && m->role != PROTO_ROLE_CTL && now - m->last_seen_ms > dead_after) {
            char why[64];
            snprintf(why, sizeof why, "no heartbeat for %" PRIu64 " ms", now - m->last_seen_ms);
            coord_close_member(m, why);
        } else if (m->role == PROTO_ROLE_CTL && !m->closing && now - m->last_request_ms > COORD_CTL_IDLE_MS) {
            log_info("%s (pid %d): dflashctl connection closed: no request for %" PRIu64 " ms", m->name, (int)m->pid,
                     now - m->last_request_ms);
            coord_close_member(m, "idle");
        }
    }
    /* Detached owners: a socket hang-up can arrive while the process is still in exit(),
     * so liveness is checked again here; a dead owner's leases go back at once. A live one
     * keeps them until it reconnects (they are re-granted) or exits: it may still publish
     * them (frozen, or cut off while its forward ran), and a batch published by two targets
     * is trained twice. A hung target is the watchdog's to kill. */
    const struct ring_slot_stat *s = NULL;
    uint64_t n_leased = 0;
    struct dead_holders dead = { 0 };
    for (struct batch *b = co->leased, *next; b; b = next) {
        next = b->lnext;        /* lease_lost takes b (only b) off the list */
        if (b->holder || proc_token_alive(b->row.owner) != 0) {
            if (!b->holder && !co->recovering && b->detached_until_ms && now >= b->detached_until_ms) {
                log_warn(0, "batch " SCHED_BID ": its target (pid %d) is alive but has not come back for %" PRIu64
                         " ms: the lease waits for it to reconnect or exit", SCHED_BARGS(b->row.id),
                         proc_token_pid(b->row.owner), now - b->detached_until_ms + dead_after);
                b->detached_until_ms = 0;   /* said once */
            }
            n_leased++;
            continue;
        }
        dead_holder_add(&dead, b->row.owner);
        struct ring_reclaim rc = { 0 };
        ring_reclaim_owner(co->ring, b->row.owner, &rc);
        s = slot_snapshot(co);
        lease_lost(co, b, s, "its target died");
    }
    dead_holders_tell(co, &dead);
    if (n_leased != co->counts[BATCH_LEASED]) {
        /* cannot happen while every state change goes through batch_set; if it does, rebuild */
        log_error(0, "lease list out of step: %" PRIu64 " linked, %" PRIu64 " LEASED: rebuilt", n_leased,
                  co->counts[BATCH_LEASED]);
        co->leased = NULL;
        for (uint32_t e = 0; e < co->epochs && co->ep[e].built; e++)
            for (uint32_t i = 0; i < co->ep[e].s.n_batches; i++)
                if (co->ep[e].b[i].row.state == BATCH_LEASED)
                    coord_list_link(&co->leased, &co->ep[e].b[i]);
    }
    struct dgroup *g = &co->grp;
    bool rank_died = false;     /* (every dead rank told and reclaimed, then the generation ends once) */
    for (uint32_t r = 0; g->active && co->state < PROTO_STATE_STOPPED && r < g->world; r++)
        if (!g->rank_member[r] && g->rank_token[r] && proc_token_alive(g->rank_token[r]) == 0) {
            char what[96];
            snprintf(what, sizeof what, "rank %u of generation %" PRIu64 ", which ends", r, g->gen);
            record_unseen_death(co, PROTO_ROLE_DRAFTER, g->rank_token[r], what);
            ring_reclaim_owner(co->ring, g->rank_token[r], NULL);
            rank_died = true;
        }
    if (rank_died)
        group_fail(co, "a drafter died");
    for (uint32_t r = 0; !co->recovering && g->active && r < g->world; r++)
        if (!g->rank_member[r] && g->rank_deadline_ms[r] && now >= g->rank_deadline_ms[r])
            group_fail(co, "a drafter stayed disconnected");
    static uint64_t last_reclaim;
    if (now - last_reclaim > 2000) {
        struct ring_reclaim rc = { 0 };
        ring_reclaim_dead(co->ring, &rc);
        if (rc.writing_freed || rc.reading_requeued)
            log_notice("reclaimed slots of dead processes: %u WRITING freed, %u READING requeued", rc.writing_freed,
                       rc.reading_requeued);
        if (rc.waiters_cleared)
            log_info("forgot %u ring waiter%s of dead processes (killed while waiting for a slot)", rc.waiters_cleared,
                     rc.waiters_cleared == 1 ? "" : "s");
        last_reclaim = now;
    }
    coord_watch_departed(co);
    sweep_orphans(co, now);
    retract_trained_copies(co);
    grant_leases(co);
    if (!co->recovering)
        check_done(co);
    if (now - co->last_status_ms > 5000) {
        co->last_status_ms = now;
        uint64_t *c = co->counts;
        daemon_notify_status(&co->d, "%s%s%s: %" PRIu64 "/%" PRIu64 " batches done, %" PRIu64 " leased, %" PRIu64
                             " published, %" PRIu64 " errors", proto_state_name((unsigned)co->state),
                             co->reason[0] ? " " : "", co->reason, c[BATCH_CHECKPOINTED], co->total_batches,
                             c[BATCH_LEASED], c[BATCH_PUBLISHED], co->n_errors);
    }
}

void coord_signal_stop(struct coord *co, int hard)
{
    if (hard || co->state >= PROTO_STATE_DRAINING || co->nan_pending || co->space.paused) {
        /* (with a non-finite value unresolved no drain could end: no checkpoint comes; paused for
         * want of space, the final checkpoint may not fit, and the drain would hang on it. The
         * next start runs on from the ledger, and pauses again if space is still short.) */
        stop_cluster(co, hard || co->state >= PROTO_STATE_DRAINING ? "stop signal"
                         : co->nan_pending ? "stop signal (no drain: a non-finite value waits for the operator's resume)"
                                           : "stop signal (no drain: paused for want of space, a final checkpoint may not fit)");
    } else {
        co->signal_drain_from = co->state == PROTO_STATE_STARTING ? PROTO_STATE_RUNNING : co->state;
        coord_set_state(co, PROTO_STATE_DRAINING, "stop signal: draining");
    }
}

/* ---- start: dataset, schedule, ledger recovery ---- */

struct load_ctx {
    struct coord *co;
    char *err;
    size_t errlen;
    uint64_t rows;
    uint32_t epochs_had;    /* rows of epochs past data.epochs: the run's count of epochs, else 0 */
};

static int load_row(void *ctx, const struct ledger_batch *row)
{
    struct load_ctx *c = ctx;
    struct coord *co = c->co;
    if (row->epoch >= co->epochs) {     /* said after the last row, with the count of epochs */
        if (row->epoch >= CFG_MAX_EPOCHS) {
            snprintf(c->err, c->errlen, "%s: batch " SCHED_BID " has epoch %" PRIu64 ", more than a run may have (%d)",
                     co->ledger_path, SCHED_BARGS(row->id), (uint64_t)row->epoch, CFG_MAX_EPOCHS);
            return -DF_EFORMAT;
        }
        if (row->epoch + 1 > c->epochs_had)
            c->epochs_had = row->epoch + 1;
        return 0;
    }
    if (!co->ep[row->epoch].built) {
        int r = build_epoch(co, row->epoch, 0, c->err, c->errlen);
        if (r < 0)
            return r;
    }
    struct epoch_state *ep = &co->ep[row->epoch];
    if (row->idx >= ep->s.n_batches || row->n_samples != ep->b[row->idx].row.n_samples ||
        row->n_tokens != ep->b[row->idx].row.n_tokens || row->id != sched_batch_id(row->epoch, row->idx)) {
        snprintf(c->err, c->errlen, "%s: batch %u:%u does not match the schedule rebuilt from the dataset",
                 co->ledger_path, row->epoch, row->idx);
        return -DF_ELAYOUT;
    }
    struct batch *b = &ep->b[row->idx];
    b->row = *row;
    if (coord_state_list(co, row->state))
        coord_list_link(coord_state_list(co, row->state), b);
    ep->done += row->state == BATCH_CHECKPOINTED;
    ep->loaded++;
    co->counts[row->state]++;
    if (row->state == BATCH_PENDING)
        heap_push(co, row->id);
    if (++c->rows % 4096 == 0)
        progress_tick();
    return 0;
}

static int load_gen(void *ctx, uint64_t gen, int64_t limit)
{
    add_limit(ctx, gen, limit);
    return 0;
}

int coord_dataset_open(struct coord *co, struct dataset *ds, unsigned flags, char *err, size_t errlen)
{
    const char *path = co->cfg->data.path;
    char why[768];
    int r = dataset_open(ds, path, flags, why, sizeof why);
    if (r < 0) {
        daemon_key_error(&co->d, "data", "path", err, errlen, "%s", why);    /* file:line: data.path: ... */
        return r;
    }
    why[0] = 0;
    /* what the samples cut to data.max_seq_len keep (the schedule and the targets cut them) */
    uint64_t masked_cut, pairs_cut;
    long long max_seq = co->cfg->data.max_seq_len;
    dataset_cut_loss(ds, (uint32_t)max_seq, &masked_cut, &pairs_cut);
    if (ds->hdr->masked_tokens == 0)
        /* a run over it would end "complete" having learned nothing, loss 0 throughout */
        snprintf(why, sizeof why, "%s: no token is in the loss (every loss mask is 0): nothing to learn", path);
    else if (ds->hdr->masked_tokens == masked_cut)
        snprintf(why, sizeof why, "%s: every token in the loss is past data.max_seq_len (%lld), where the samples are "
                 "cut: nothing to learn (raise data.max_seq_len, or shorten the prompts)", path, max_seq);
    else if (co->model_vocab > 0 && ds->vocab_size > (uint32_t)co->model_vocab)
        /* every target would refuse it at its start, after the ledger is made for it */
        snprintf(why, sizeof why, "%s: vocabulary %u is larger than the target's (%d, %s/config.json): a dataset "
                 "made for another tokenizer", path, ds->vocab_size, co->model_vocab, co->cfg->model.path);
    else if (ds->anchor_pairs == 0)
        /* a block is anchored at a loss token followed by one: with none, every step is empty */
        snprintf(why, sizeof why, "%s: no sample has two tokens in the loss in a row (a block's anchor and its "
                 "first label): nothing to learn", path);
    else if (ds->anchor_pairs == pairs_cut)
        snprintf(why, sizeof why, "%s: no sample has two tokens in the loss in a row within data.max_seq_len (%lld), "
                 "where the samples are cut: nothing to learn (raise data.max_seq_len, or shorten the prompts)", path,
                 max_seq);
    if (!why[0])
        return 0;
    dataset_close(ds);
    return daemon_key_error(&co->d, "data", "path", err, errlen, "%s", why);
}

/* What the schedule is made from (sched_fingerprint's inputs), as the ledger keeps each: a
 * ledger refused for another schedule names what changed, not only that a hash differs. */
struct sched_input {
    const char *key;
    uint64_t value;
};
#define SCHED_INPUTS 6

static void schedule_inputs(const struct coord *co, struct sched_input in[SCHED_INPUTS])
{
    in[0] = (struct sched_input){ "data.seed", co->sp.seed };
    in[1] = (struct sched_input){ "data.token_budget", co->sp.token_budget };
    in[2] = (struct sched_input){ "data.max_seq_len", co->sp.max_seq_len };
    in[3] = (struct sched_input){ "data.bucket_width", co->sp.bucket_width };
    in[4] = (struct sched_input){ "ring.max_seqs", co->sp.max_seqs };
    in[5] = (struct sched_input){ "data.path samples", co->ds.n_samples };
}

/* "; data.seed was 42, is 7" for each input the ledger recorded otherwise; "; the same settings
 * and number of samples, other sample lengths" when none differs; "" for a ledger from before
 * the inputs were kept. *settings (when not NULL): a setting differs, not only the dataset. */
static void schedule_changes(struct coord *co, char *out, size_t len, bool *settings)
{
    if (settings)
        *settings = false;
    struct sched_input in[SCHED_INPUTS];
    schedule_inputs(co, in);
    size_t n = 0;
    bool kept = false;
    out[0] = 0;
    for (size_t i = 0; i < SCHED_INPUTS; i++) {
        uint64_t was;
        if (ledger_meta_get_u64(co->ledger, in[i].key, &was) != 1)
            continue;
        kept = true;
        if (was != in[i].value && settings && strncmp(in[i].key, "data.path", 9))
            *settings = true;
        if (was != in[i].value && n < len)
            n += (size_t)snprintf(out + n, len - n, "; %s was %" PRIu64 ", is %" PRIu64, in[i].key, was,
                                  in[i].value);
    }
    if (kept && !out[0])
        snprintf(out, len, "; the same settings and number of samples, other sample lengths");
}

/* The settings of the target's config.json the forward honours (RoPE, norms' epsilon, ...): the
 * same weights under other settings give other hidden states. Kept in the ledger beside the weights'
 * fingerprint (a ledger from before is given the settings of its next start) and sent in WELCOME, so
 * a target or drafter whose config.json differs refuses itself. */
static int check_model_config(struct coord *co, char *err, size_t errlen)
{
    char was[PROTO_CONFIG_MAX], diff[400];
    int r = ledger_meta_get(co->ledger, "model_config", was, sizeof was);
    if (r < 0) {
        snprintf(err, errlen, "%s: cannot read: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
        return r;
    }
    if (r == 1 && co->model_config[0] && text_kv_diff(co->model_config, was, diff, sizeof diff)) {
        snprintf(err, errlen, "%s was written for a target whose config.json has other settings: %s/config.json: %s: "
                 "put the run's config.json back, or move the ledger away to start a new run (with the drafters' "
                 "checkpoint folder)", co->ledger_path, co->cfg->model.path, diff);
        return -DF_ELAYOUT;
    }
    if (r == 0 && co->model_config[0] && (r = ledger_meta_set(co->ledger, "model_config", co->model_config)) < 0) {
        snprintf(err, errlen, "%s: cannot write: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
        return r;
    }
    if (r == 1 && !co->model_config[0])
        snprintf(co->model_config, sizeof co->model_config, "%s", was);
    return 0;
}

/* The target's weights: the hidden states trained so far are the run's model's, and its drafters
 * took their embedding and LM head from it. A model of the same shapes with other weights
 * (another download, a fine-tune) under model.path is refused as a replaced dataset is; the
 * WELCOME carries the fingerprint, so a target or drafter on other weights refuses itself. */
static int check_model(struct coord *co, char *err, size_t errlen)
{
    const char *path = co->cfg->model.path;
    char why[512];
    int r;
    if (path[0] && (r = st_dir_fingerprint(path, &co->model_fp, why, sizeof why)) < 0) {
        co->model_fp = 0;
        /* A coordinator's host may hold config.json alone (the targets check their own weights);
         * weights that are there and do not read are damaged, and the run is not started on them
         * unchecked (a target would refuse them as well). */
        bool there = false;     /* (a *.safetensors file: the index alone is one of the small JSON files) */
        DIR *dir = opendir(path);
        for (struct dirent *e; dir && !there && (e = readdir(dir));) {
            size_t n = strlen(e->d_name);
            there = n > 12 && !strcmp(e->d_name + n - 12, ".safetensors");
        }
        if (dir)
            closedir(dir);
        if (there && r != -EACCES && r != -EPERM) {
            snprintf(err, errlen, "model.path %s: the weights do not read (%s): mend them (a target would refuse them "
                     "too), or leave config.json alone there for the targets to check theirs", path, why);
            return r;
        }
        log_warn(r, "model.path %s: cannot read the weights (%s): the coordinator does not check them", path, why);
    }
    uint64_t was;
    if ((r = ledger_meta_get_u64(co->ledger, "model_fingerprint", &was)) < 0) {
        snprintf(err, errlen, "%s: cannot read: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
        return r;
    }
    if (r == 1 && co->model_fp && was != co->model_fp) {
        snprintf(err, errlen, "%s was written for target weights of fingerprint %016" PRIx64 ", %s (model.path) has "
                 "%016" PRIx64 " (other weights): put the run's model back, or move the ledger away "
                 "to start a new run (with the drafters' checkpoint folder)", co->ledger_path, was, path, co->model_fp);
        return -DF_ELAYOUT;
    }
    if (r == 0 && co->model_fp && (r = ledger_meta_set_u64(co->ledger, "model_fingerprint", co->model_fp)) < 0) {
        snprintf(err, errlen, "%s: cannot write: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
        return r;
    }
    bool ledgers = !co->model_fp && r == 1;
    if (ledgers)
        co->model_fp = was;
    if (co->model_fp)
        log_info("target weights: fingerprint %016" PRIx64 "%s", co->model_fp, ledgers ? " (the ledger's)" : "");
    return check_model_config(co, err, errlen);
}

/* Owner tokens count their start time from the boot: after a reboot (a power loss) a new process
 * may carry the token the ledger saved for one of the last boot, and be taken for a rank of the
 * group's old generation (trained on from the head checkpoint, its steps then counted as the lost
 * ones) or for a lease's holder. A ledger last opened on another boot has the owners it names
 * replaced by PROC_TOKEN_GONE, in the transaction that records this boot. */
static int forget_other_boot(struct coord *co, char *err, size_t errlen)
{
    char now[64], was[64];
    int r = proc_boot_id(now, sizeof now);
    if (r < 0) {
        log_warn(r, "cannot read this boot's id (/proc/sys/kernel/random/boot_id): the processes %s names are "
                 "taken for this boot's", co->ledger_path);
        return 0;
    }
    if ((r = ledger_meta_get(co->ledger, "boot_id", was, sizeof was)) < 0) {
        snprintf(err, errlen, "%s: cannot read: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
        return r;
    }
    if (r == 1 && strcmp(was, now)) {
        uint32_t ranks = 0;
        uint64_t batches = 0;
        for (uint32_t k = 0; k < co->grp.world; k++)
            if (co->grp.rank_token[k]) {
                co->grp.rank_token[k] = PROC_TOKEN_GONE;
                ranks++;
            }
        static const int in_flight[] = { BATCH_LEASED, BATCH_PUBLISHED, BATCH_TRAINED };
        for (size_t i = 0; i < sizeof in_flight / sizeof in_flight[0]; i++)
            for (struct batch *b = *coord_state_list(co, in_flight[i]); b; b = b->lnext) {
                if (!b->row.owner || proc_token_is_lease(b->row.owner))
                    continue;
                b->row.owner = PROC_TOKEN_GONE;
                if ((r = ledger_batch_update(co->ledger, &b->row)) < 0) {
                    snprintf(err, errlen, "%s: cannot write: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
                    return r;
                }
                batches++;
            }
        if (ranks)
            save_group(co);
        log_notice("%s was last opened on another boot (%s, now %s): the %u drafter rank%s and the owners of %" PRIu64
                   " batch%s in flight it names are processes of that boot, taken as gone", co->ledger_path, was, now,
                   ranks, ranks == 1 ? "" : "s", batches, batches == 1 ? "" : "es");
    }
    if ((r = ledger_meta_set(co->ledger, "boot_id", now)) < 0) {
        snprintf(err, errlen, "%s: cannot write: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
        return r;
    }
    return 0;
}

int coord_cluster_init(struct coord *co, char *err, size_t errlen)
{
    const struct dflash_cfg *cfg = co->cfg;
    int r = coord_dataset_open(co, &co->ds, 0, err, errlen);
    if (r < 0)
        return r;
    if (co->ds.n_samples > UINT32_MAX) {
        snprintf(err, errlen, "%s: more than 2^32 samples", cfg->data.path);
        return -DF_ERANGE;
    }
    co->lengths = malloc(co->ds.n_samples * 4);
    if (!co->lengths)
        return -ENOMEM;
    uint64_t n_cut = 0, tokens_cut = 0;
    for (uint64_t i = 0; i < co->ds.n_samples; i++) {
        uint32_t len = dataset_sample_len(&co->ds, i);
        if (len > (uint64_t)cfg->data.max_seq_len) {
            n_cut++;
            tokens_cut += len - (uint64_t)cfg->data.max_seq_len;
        }
    }
    /* A batch of samples without an anchor alone would take no optimizer step, yet count as
     * trained at the step before: after a checkpoint of that step it could not be in it. */
    uint32_t max_seq = (uint32_t)cfg->data.max_seq_len;
    uint64_t inert = dataset_sched_lengths(&co->ds, max_seq, true, co->lengths);
    if (n_cut) {
        uint64_t masked_cut, pairs_cut, masked = co->ds.hdr->masked_tokens;
        dataset_cut_loss(&co->ds, (uint32_t)cfg->data.max_seq_len, &masked_cut, &pairs_cut);
        log_warn(0, "%s: %" PRIu64 " of %" PRIu64 " samples are longer than data.max_seq_len (%lld) and are cut to it:"
                 " %" PRIu64 " of %" PRIu64 " tokens (%.1f%%) are not trained, %" PRIu64 " of the %" PRIu64 " in the loss "
                 "(%.1f%%)", cfg->data.path, n_cut, co->ds.n_samples, (long long)cfg->data.max_seq_len, tokens_cut,
                 co->ds.n_tokens, 100.0 * (double)tokens_cut / (double)co->ds.n_tokens, masked_cut, masked,
                 100.0 * (double)masked_cut / (double)masked);
    }
    co->sp = (struct sched_params){ .seed = (uint64_t)cfg->data.seed, .token_budget = (uint32_t)cfg->data.token_budget,
                                    .max_seq_len = (uint32_t)cfg->data.max_seq_len,
                                    .bucket_width = (uint32_t)cfg->data.bucket_width,
                                    .max_seqs = (uint32_t)cfg->ring.max_seqs };
    if ((r = sched_check(&co->sp, err, errlen)) < 0)      /* (coord_main checked the keys: not met) */
        return r;
    co->epochs = (uint32_t)cfg->data.epochs;
    co->ep = calloc(co->epochs, sizeof *co->ep);
    co->grp.world = (uint32_t)cfg->drafter.world_size;
    co->grp.rank_member = calloc(co->grp.world, sizeof *co->grp.rank_member);
    co->grp.rank_token = calloc(co->grp.world, sizeof *co->grp.rank_token);
    co->grp.rank_deadline_ms = calloc(co->grp.world, sizeof *co->grp.rank_deadline_ms);
    if (!co->ep || !co->grp.rank_member || !co->grp.rank_token || !co->grp.rank_deadline_ms)
        return -ENOMEM;
    if (snprintf(co->grp.coll_name, sizeof co->grp.coll_name, "/dflash-%s-coll", cfg->cluster.name) >=
        (int)sizeof co->grp.coll_name) {
        snprintf(err, errlen, "cluster.name '%s' is too long", cfg->cluster.name);
        return -EINVAL;
    }

    if ((r = ledger_open(&co->ledger, co->ledger_path, err, errlen)) < 0)
        return r;
    struct error_load el = { co, 0 };
    if ((r = ledger_error_recent(co->ledger, COORD_ERRORS_KEPT, &co->n_errors, &co->n_fatal, load_error, &el)) < 0) {
        snprintf(err, errlen, "%s: reading the errors: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
        return r;
    }
    if (co->n_errors)
        log_notice("%s: %" PRIu64 " errors (%" PRIu64 " fatal) recorded in this run before this start: dflashctl errors",
                   co->ledger_path, co->n_errors, co->n_fatal);
    char fp[32], old[64];
    snprintf(fp, sizeof fp, "%016" PRIx64, sched_fingerprint(co->lengths, (uint32_t)co->ds.n_samples, &co->sp));
    r = ledger_meta_get(co->ledger, "fingerprint", old, sizeof old);
    if (r < 0) {
        snprintf(err, errlen, "%s: cannot read", co->ledger_path);
        return r;
    }
    bool have_fp = r > 0;
    /* Samples that train nothing are left out of the schedule (sched_inert = 1) since ledgers
     * record it; one made before schedules them all (its fingerprint says so) and keeps doing so
     * for its run, the empty steps they make as then. */
    uint64_t rule = 1;
    if ((r = ledger_meta_get_u64(co->ledger, "sched_inert", &rule)) < 0) {
        snprintf(err, errlen, "%s: cannot read: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
        return r;
    }
    bool rule_known = r > 0;
    if (have_fp && strcmp(old, fp) && inert && (!rule_known || rule == 0)) {
        dataset_sched_lengths(&co->ds, max_seq, false, co->lengths);
        char every[32];
        snprintf(every, sizeof every, "%016" PRIx64, sched_fingerprint(co->lengths, (uint32_t)co->ds.n_samples, &co->sp));
        if (!strcmp(old, every)) {
            memcpy(fp, every, sizeof fp);
            rule = 0;
            log_warn(0, "%s: a run from before samples that train nothing were left out: its schedule keeps its %"
                     PRIu64 " (a batch of them alone is a step with nothing supervised)", co->ledger_path, inert);
        } else {
            dataset_sched_lengths(&co->ds, max_seq, true, co->lengths);
        }
    }
    /* A dataset replaced is told as that first, with what it changed in the schedule: "put the
     * old file back" mends that (and the settings named, when some were changed too). The schedule only sees lengths: a file of the same lengths is
     * told by the checksum alone (the batches trained so far hold the old one's tokens). */
    uint64_t sum;
    if ((r = ledger_meta_get_u64(co->ledger, "dataset_checksum", &sum)) < 0) {
        snprintf(err, errlen, "%s: cannot read: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
        return r;
    }
    bool have_sum = r > 0;
    if (have_sum && sum != co->ds.checksum) {
        char what[400] = "";
        bool settings = false;
        if (have_fp && strcmp(old, fp))
            schedule_changes(co, what, sizeof what, &settings);
        snprintf(err, errlen, "%s was written for a dataset of checksum %016" PRIx64 ", %s now has checksum %016" PRIx64
                 " (replaced%s): put the old file back%s, or move the ledger away to start a new run (with the "
                 "drafters' checkpoint folder)", co->ledger_path, sum, cfg->data.path, co->ds.checksum, what,
                 settings ? " and the settings named as they were" : "");
        return -DF_ELAYOUT;
    }
    if (!have_fp) {
        ledger_meta_set(co->ledger, "fingerprint", fp);
        ledger_meta_set(co->ledger, "dataset", cfg->data.path);
        ledger_meta_set_u64(co->ledger, "created_ms", wall_ms());
    } else if (strcmp(old, fp)) {
        char what[400];
        schedule_changes(co, what, sizeof what, NULL);
        snprintf(err, errlen, "%s was written for another dataset or schedule (fingerprint %s, now %s%s): "
                 "move it away to start a new run (with the drafters' checkpoint folder)", co->ledger_path, old, fp,
                 what);
        return -DF_ELAYOUT;
    }
    /* (also into a ledger from before they were kept, whose fingerprint matched) */
    struct sched_input in[SCHED_INPUTS];
    schedule_inputs(co, in);
    for (size_t i = 0; i < SCHED_INPUTS; i++)
        ledger_meta_set_u64(co->ledger, in[i].key, in[i].value);
    if (!have_sum)      /* (a new ledger, or one from before the checksum was kept) */
        ledger_meta_set_u64(co->ledger, "dataset_checksum", co->ds.checksum);
    if (!rule_known || !have_fp)
        ledger_meta_set_u64(co->ledger, "sched_inert", rule);
    if (inert && rule)
        log_notice("%s: %" PRIu64 " of %" PRIu64 " samples have no two tokens in the loss in a row within "
                   "data.max_seq_len (%lld): nothing in them is trained, they are left out of the schedule",
                   cfg->data.path, inert, co->ds.n_samples, (long long)cfg->data.max_seq_len);
    if ((r = check_model(co, err, errlen)) < 0)
        return r;
    /* The run's name, made with its ledger (or when a ledger from before runs were named is
     * first opened): the drafters claim their checkpoint folders for it. */
    if ((r = ledger_meta_get_u64(co->ledger, "run_id", &co->run_id)) < 0) {
        snprintf(err, errlen, "%s: cannot read: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
        return r;
    }
    bool made = !co->run_id;
    while (!co->run_id)
        if (getrandom(&co->run_id, sizeof co->run_id, 0) != (ssize_t)sizeof co->run_id)
            co->run_id = mono_ns() ^ ((uint64_t)getpid() << 32) ^ wall_ms();
    if (made && (r = ledger_meta_set_u64(co->ledger, "run_id", co->run_id)) < 0) {
        snprintf(err, errlen, "%s: cannot write: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
        return r;
    }
    struct load_ctx lc = { co, err, errlen, 0, 0 };
    err[0] = 0;
    if ((r = ledger_batch_foreach(co->ledger, load_row, &lc)) < 0) {
        if (!err[0])    /* (a row load_row refused says why itself) */
            snprintf(err, errlen, "%s: reading the batches: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
        return r;
    }
    if (lc.epochs_had) {
        snprintf(err, errlen, "%s: the run has scheduled %u epochs, data.epochs = %u is fewer: set it to %u or more, "
                 "or move the ledger away (with the drafters' checkpoint folder) to start a new run", co->ledger_path,
                 lc.epochs_had, co->epochs, lc.epochs_had);
        return -DF_ELAYOUT;
    }
    /* the run's count of epochs, for the ledger's readers (dflashctl --ledger: the run's batches) */
    if ((r = ledger_meta_set_u64(co->ledger, "epochs", co->epochs)) < 0) {
        snprintf(err, errlen, "%s: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
        return r;
    }
    for (uint32_t e = 0; e < co->epochs; e++) {
        if (co->ep[e].built && co->ep[e].loaded != co->ep[e].s.n_batches) {
            snprintf(err, errlen, "%s: epoch %u has %u of its %u batches", co->ledger_path, e, co->ep[e].loaded,
                     co->ep[e].s.n_batches);
            return -DF_ELAYOUT;
        }
        if (co->ep[e].built && e && !co->ep[e - 1].built) {
            snprintf(err, errlen, "%s: epoch %u present but epoch %u missing", co->ledger_path, e, e - 1);
            return -DF_ELAYOUT;
        }
    }
    for (struct batch *b = co->leased; b; b = b->lnext) {
        if ((r = ledger_untrained_has(co->ledger, b->row.id, b->row.leases)) < 0) {
            snprintf(err, errlen, "%s: reading the hand-backs of batch " SCHED_BID ": %s", co->ledger_path,
                     SCHED_BARGS(b->row.id), ledger_errmsg(co->ledger, r));
            return r;
        }
        b->consumed_early = r == 1;
    }
    /* The drafter group's lineage, each key read once (a missing key leaves its default). A
     * read that fails would silently restart the lineage: the start fails instead. */
    uint64_t active = 0;
    static char toks[GROUP_TOKENS_MAX];
    toks[0] = 0;
    if ((r = ledger_generation_foreach(co->ledger, load_gen, co)) < 0 ||
        (r = ledger_meta_get_u64(co->ledger, "group_gen", &co->grp.gen)) < 0 ||
        (r = ledger_meta_get_u64(co->ledger, "run_batches", &co->run_batches)) < 0 ||
        (r = ledger_meta_get_u64(co->ledger, "group_active", &active)) < 0 ||
        (r = ledger_meta_get(co->ledger, "group_tokens", toks, sizeof toks)) < 0 ||
        (r = ledger_meta_get_u64(co->ledger, "ckpt_gen", &co->grp.ckpt_gen)) < 0 ||
        (r = ledger_meta_get_u64(co->ledger, "ckpt_step", &co->grp.ckpt_step)) < 0 ||
        (r = ledger_meta_get(co->ledger, "ckpt_dir", co->grp.ckpt_dir, sizeof co->grp.ckpt_dir)) < 0) {
        snprintf(err, errlen, "%s: reading the drafter group's lineage: %s", co->ledger_path,
                 ledger_errmsg(co->ledger, r));
        return r;
    }
    co->grp.active = active != 0;
    if ((r = parse_rank_tokens(co, toks)) < 0) {
        snprintf(err, errlen, "%s: reading the drafter group's lineage: meta group_tokens = '%.60s%s' is not a list "
                 "of decimal numbers, one per rank, comma-separated", co->ledger_path, toks,
                 strlen(toks) > 60 ? "..." : "");
        return r;
    }
    if (co->grp.active) {
        /* a generation of another size than drafter.world_size now cannot go on: its ranks past
         * the new size would be refused, its ranks' reports of them too */
        char key[48];
        uint64_t had = 0;
        snprintf(key, sizeof key, "gen%" PRIu64 "_world", co->grp.gen);
        if ((r = ledger_meta_get_u64(co->ledger, key, &had)) < 0) {
            snprintf(err, errlen, "%s: reading the drafter group's lineage: %s", co->ledger_path,
                     ledger_errmsg(co->ledger, r));
            return r;
        }
        if (r == 1 && had != co->grp.world)
            co->grp.world_was = had > UINT32_MAX ? UINT32_MAX : (uint32_t)had;
    }

    if ((r = forget_other_boot(co, err, errlen)) < 0)
        return r;
    co->state = PROTO_STATE_STARTING;
    if (!lc.rows && (r = build_epoch(co, 0, 1, err, errlen)) < 0)
        return r;
    if (lc.rows) {
        if ((r = restore_state(co)) < 0) {
            snprintf(err, errlen, "%s: reading the run's state: %s", co->ledger_path, ledger_errmsg(co->ledger, r));
            return r;
        }
        if (co->grp.active && run_complete(co)) {
            /* killed after the run completed, before its exit closed the group: nothing of the
             * group is wanted any more (its ranks are gone or leaving on the STOP) */
            log_notice("the run is complete: drafter group generation %" PRIu64 " ends with it", co->grp.gen);
            coord_group_close(co);
        }
        co->recovering = true;      /* the window opens with the socket and the ring: coord_ring_reconcile */
        log_notice("resuming from %s: %" PRIu64 " batches (%" PRIu64 " done, %" PRIu64 " leased, %" PRIu64
                   " published, %" PRIu64 " trained), group generation %" PRIu64 ", checkpoint %s", co->ledger_path,
                   lc.rows, co->counts[BATCH_CHECKPOINTED], co->counts[BATCH_LEASED], co->counts[BATCH_PUBLISHED],
                   co->counts[BATCH_TRAINED], co->grp.gen, co->grp.ckpt_dir[0] ? co->grp.ckpt_dir : "(none)");
    }
    return ledger_commit(co->ledger, err, errlen);
}

/* After the ring is open: a fresh ring lost every publication; a re-attached one may hold
 * batches whose PUBLISHED never arrived. Leases of dead owners go back now. */
void coord_ring_reconcile(struct coord *co)
{
    if (co->recovering) {
        /* The daemons' time to come back counts from here, with the socket bound and the ring
         * open, not from the ledger's reading (the ring's open may wait a second). */
        co->recovery_until_ms = mono_ms() + (uint64_t)co->cfg->coordinator.recovery_ms;
        for (uint32_t k = 0; co->grp.active && k < co->grp.world; k++)
            co->grp.rank_deadline_ms[k] = co->recovery_until_ms;
    }
    const struct ring_slot_stat *s = co->ring_created ? NULL : slot_snapshot(co);
    uint64_t adopted = 0, lost = 0, dead = 0;
    struct dead_holders dead_holders = { 0 };
    for (uint32_t e = 0; e < co->epochs && co->ep[e].built; e++)
        for (uint32_t i = 0; i < co->ep[e].s.n_batches; i++) {
            struct batch *b = &co->ep[e].b[i];
            int slot = slot_holding(co, s, b->row.id);
            if (b->row.state == BATCH_PUBLISHED && co->ring_created) {
                requeue(co, b, "the ring was recreated");
                lost++;
            } else if ((b->row.state == BATCH_PENDING || b->row.state == BATCH_LEASED) && slot >= 0) {
                b->row.slot = slot;
                b->consumed_early = false;
                batch_set(co, b, BATCH_PUBLISHED);
                adopted++;
            } else if (b->row.state == BATCH_LEASED) {
                b->detached_until_ms = co->recovery_until_ms;
                if (proc_token_alive(b->row.owner) == 0) {
                    dead_holder_add(&dead_holders, b->row.owner);
                    requeue(co, b, "its target died while the coordinator was down");
                    dead++;
                }
            }
        }
    if (adopted || lost || dead)
        log_notice("ring vs ledger: %" PRIu64 " READY batches adopted, %" PRIu64 " publications lost, %" PRIu64
                   " leases of dead targets re-queued", adopted, lost, dead);
    dead_holders_tell(co, &dead_holders);
    if (co->grp.world_was) {
        /* (its ranks, back, are told to restart; what they trained past its last checkpoint, and
         * took from the ring, is queued again as for any generation lost) */
        char why[160];
        snprintf(why, sizeof why, "drafter.world_size is %u now, the generation has %u ranks", co->grp.world,
                 co->grp.world_was);
        co->grp.world_was = 0;
        group_fail(co, why);
    }
}

void coord_cluster_done(struct coord *co)
{
    for (uint32_t e = 0; co->ep && e < co->epochs; e++) {
        sched_epoch_done(&co->ep[e].s);
        free(co->ep[e].b);
    }
    free(co->ep);
    free(co->heap);
    free(co->lengths);
    free(co->grp.rank_member);
    free(co->grp.rank_token);
    free(co->grp.rank_deadline_ms);
    free(co->grp.lim_gen);
    free(co->grp.done);
    free(co->grp.lim_step);
    dataset_close(&co->ds);
    ledger_close(co->ledger);
}
