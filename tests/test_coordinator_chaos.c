/* test_coordinator_chaos.c: a real coordinator-d under concurrent, randomized but plausible
 * traffic for a bounded time (10 s x DFLASH_TEST_TIME_SCALE). Forked peers speak the protocol
 * through proto_encode: targets lease, publish (in the ring too), return; drafters join, train
 * (from the ring too), skip, checkpoint, report bad checkpoints; both report errors, with batch
 * ids that are real, stale or random, out-of-range slots, steps, ranks and generations,
 * duplicate and out-of-order events, hang-ups, silences, deaths and reconnects. A ctl peer
 * queries, pauses and resumes; an abuser sends raw frames over a plain socket (a type its role
 * may not send, truncated, corrupted, wrong version, ...). No peer asks for a fatal end. The PRNG
 * seed is DFLASH_CHAOS_SEED, else the clock (printed). Checked: the coordinator never dies; its
 * status is JSON whose batch counts add up (each batch in one state: counts, in-flight list,
 * per-epoch counts), every frame it sends decodes, what must be refused is closed; once the
 * chaos is gone its ticks take back leases, slots and orphans and it stays up; SIGTERM ends it
 * with exit 0 and its ledger holds what the last status said. On a failure the tail of what each
 * peer sent is printed (chaos-*.log). */
#include <poll.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/un.h>
#include "common/proc.h"
#include "daemons/coordinator/ledger.c"
#include "daemons/coordinator/sched.h"
#include "tests/test_coord_util.h"

#define N_TARGETS 3
#define N_DRAFTERS 3
#define N_SLOTS (N_TARGETS + N_DRAFTERS + 2)   /* + one ctl, one abuser */
#define SLOT_CTL (N_TARGETS + N_DRAFTERS)
#define SLOT_ABUSER (SLOT_CTL + 1)
#define RING_SLOTS 6
#define DEAD_AFTER_MS 1000
#define POOL 512
#define BASE_DIR "base-checkpoint"

/* Shared by every chaos process (MAP_SHARED). */
struct chaos_shared {
    _Atomic uint64_t pool_id[POOL];     /* batch ids granted to any target: real, later stale */
    _Atomic uint32_t pool_lease[POOL];
    _Atomic uint64_t pool_n;
    _Atomic uint64_t step[64];          /* per generation: the group's step (lockstep stand-in) */
    _Atomic int stop;                   /* the parent ends the chaos */
    /* what must never happen */
    _Atomic uint64_t bad_frames;        /* frames from the coordinator that do not decode */
    _Atomic uint64_t bad_json;          /* REPLYs that are not JSON */
    _Atomic uint64_t not_closed;        /* abuses the coordinator left open */
    _Atomic uint64_t not_answered;      /* a slow but valid ctl got no answer */
    _Atomic uint64_t stops;             /* CONTROL STOP pushed (nobody asked for one) */
    /* what happened */
    _Atomic uint64_t sent, conns, refused, nacks, grants, groups, restarts, published, trained;
    _Atomic uint64_t abuses, silences;
};
static struct chaos_shared *SH;

static uint64_t seed0, t0_ms;
static pid_t parent_pid, kids[N_SLOTS];
static int kid_inc[N_SLOTS];
static int passed;

/* ---- PRNG (splitmix64 seeding, xorshift64* stream) ---- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
static uint64_t below(uint64_t n) { return n ? rnd() % n : 0; }
static int chance(int pct) { return (int)below(100) < pct; }

/* ---- per-process action log ---- */

static FILE *LOG;
static __attribute__((format(printf, 1, 2))) void plog(const char *fmt, ...)
{
    if (!LOG)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(LOG, "%8.3f %d ", (double)(mono_ms() - t0_ms) / 1000.0, (int)getpid());
    vfprintf(LOG, fmt, ap);
    fputc('\n', LOG);
    va_end(ap);
}

static const char *bid(uint64_t id)
{
    static char b[4][48];
    static int k;
    k = (k + 1) % 4;
    if (sched_batch_epoch(id) < 1000000)
        snprintf(b[k], sizeof b[k], "%u:%u", sched_batch_epoch(id), sched_batch_index(id));
    else
        snprintf(b[k], sizeof b[k], "0x%" PRIx64, id);
    return b[k];
}

static void msg_str(const struct proto_msg *m, char *b, size_t n)
{
    const char *t = proto_type_name(m->type);
    switch (m->type) {
    case PROTO_HELLO:
        snprintf(b, n, "%s role=%u dev=%d rank=%u gen=%" PRIu64, t, m->hello.role, m->hello.device,
                 m->hello.group_rank, m->hello.group_generation);
        break;
    case PROTO_LEASE_REQUEST:
        snprintf(b, n, "%s n=%u", t, m->lease_request.n);
        break;
    case PROTO_LEASE_RETURN:
        snprintf(b, n, "%s %s", t, bid(m->batch.batch_id));
        break;
    case PROTO_PUBLISHED:
        snprintf(b, n, "%s seq=%" PRIu64 " %s slot=%u tokens=%u", t, m->published.seq, bid(m->published.batch_id),
                 m->published.slot, m->published.n_tokens);
        break;
    case PROTO_TRAINED:
        snprintf(b, n, "%s seq=%" PRIu64 " %s lease=%u step=%" PRIu64 " gen=%" PRIu64 " rank=%u", t, m->trained.seq,
                 bid(m->trained.batch_id), m->trained.lease, m->trained.step, m->trained.generation, m->trained.rank);
        break;
    case PROTO_SKIPPED:
        snprintf(b, n, "%s seq=%" PRIu64 " %s lease=%u", t, m->skipped.seq, bid(m->skipped.batch_id),
                 m->skipped.lease);
        break;
    case PROTO_CHECKPOINTED:
        snprintf(b, n, "%s seq=%" PRIu64 " step=%" PRIu64 " gen=%" PRIu64 " dir=%.40s", t, m->checkpointed.seq,
                 m->checkpointed.step, m->checkpointed.generation, m->checkpointed.dir);
        break;
    case PROTO_CKPT_BAD:
        snprintf(b, n, "%s gen=%" PRIu64 " step=%" PRIu64 " dir=%.40s", t, m->ckpt_bad.generation, m->ckpt_bad.step,
                 m->ckpt_bad.dir);
        break;
    case PROTO_ERROR:
        snprintf(b, n, "%s fatal=%u code=%d step=%" PRIu64, t, m->error.fatal, m->error.code, m->error.step);
        break;
    case PROTO_CONTROL:
        snprintf(b, n, "%s %s", t, proto_control_name(m->control.cmd));
        break;
    case PROTO_QUERY:
        snprintf(b, n, "%s %s limit=%u", t, proto_query_name(m->query.what), m->query.limit);
        break;
    default:
        snprintf(b, n, "%s", t);
    }
}

/* ---- a protocol peer on a plain socket (frames from proto_encode) ---- */

struct held { uint64_t id; uint32_t lease, epoch, n_tokens; };

struct cpeer {
    int fd, role, device;
    uint8_t *rx;
    size_t rx_len, rx_cap;
    uint64_t seq, last_hb_ms;
    int paused, welcomed, replies;
    struct held held[64];               /* granted on this connection, not published or returned */
    int n_held;
    struct held seen[64];               /* every grant this process saw (stale ones stay) */
    int n_seen;
    struct proto_msg ev[16];            /* events sent: replayed as duplicates */
    int n_ev;
    uint64_t gen;                       /* drafters: the last GROUP (kept after a RESTART) */
    uint32_t rank;
    int in_group;
    uint64_t ckpt_step;
    char ckpt_dir[PROTO_PATH_MAX];
    int ckpts;
    struct ring *ring;
    uint64_t die_at_ms;                 /* holding a slot: this process dies soon */
};

static int sock_connect(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    size_t len = strlen(TC.sock);
    if (len >= sizeof sa.sun_path)
        _exit(21);
    memcpy(sa.sun_path, TC.sock, len + 1);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = { 2, 0 };
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return fd;
}

static int send_all(int fd, const void *buf, size_t n)
{
    size_t off = 0;
    while (off < n) {
        ssize_t k = send(fd, (const uint8_t *)buf + off, n - off, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        off += (size_t)k;
    }
    return 0;
}

static int64_t encode(const struct proto_msg *m, uint8_t *buf, size_t cap)
{
    char err[256];
    int64_t n = proto_encode(m, buf, cap, err, sizeof err);
    if (n < 0)
        plog("encode %s refused: %s", proto_type_name(m->type), err);
    return n;
}

static void cp_close(struct cpeer *p, const char *why)
{
    if (p->fd < 0)
        return;
    plog("close (%s)", why);
    close(p->fd);
    p->fd = -1;
    p->rx_len = 0;
    p->n_held = 0;
}

static int cp_send(struct cpeer *p, const struct proto_msg *m)
{
    if (p->fd < 0)
        return -1;
    uint8_t buf[1024] __attribute__((aligned(8)));
    int64_t n = encode(m, buf, sizeof buf);
    if (n < 0)
        return -1;
    char d[200];
    msg_str(m, d, sizeof d);
    plog("> %s", d);
    if (send_all(p->fd, buf, (size_t)n) < 0) {
        cp_close(p, "send failed");
        return -1;
    }
    atomic_fetch_add(&SH->sent, 1);
    return 0;
}

static void remember(struct held *v, int *n, int cap, struct held h)
{
    for (int i = 0; i < *n; i++)
        if (v[i].id == h.id) {
            v[i] = h;
            return;
        }
    if (*n == cap) {
        memmove(v, v + 1, (size_t)(cap - 1) * sizeof *v);
        (*n)--;
    }
    v[(*n)++] = h;
}

static void forget(struct held *v, int *n, uint64_t id)
{
    for (int i = 0; i < *n; i++)
        if (v[i].id == id) {
            v[i] = v[--*n];
            return;
        }
}

static void handle(struct cpeer *p, const struct proto_msg *m)
{
    switch (m->type) {
    case PROTO_WELCOME:
        p->welcomed = 1;
        p->paused = m->welcome.cluster_state == PROTO_STATE_PAUSED;
        plog("< WELCOME member=%" PRIu64 " state=%s regrants=%u", m->welcome.member_id,
             proto_state_name(m->welcome.cluster_state), m->welcome.n_regrants);
        break;
    case PROTO_LEASE_GRANT: {
        struct held h = { m->grant.batch_id, m->grant.lease, m->grant.epoch, m->grant.n_tokens };
        remember(p->held, &p->n_held, 64, h);
        remember(p->seen, &p->n_seen, 64, h);
        uint64_t k = atomic_fetch_add(&SH->pool_n, 1) % POOL;
        atomic_store(&SH->pool_id[k], h.id);
        atomic_store(&SH->pool_lease[k], h.lease);
        atomic_fetch_add(&SH->grants, 1);
        plog("< GRANT %s lease=%u tokens=%u%s", bid(h.id), h.lease, h.n_tokens,
             m->grant.flags & PROTO_GRANT_REGRANT ? " regrant" : "");
        break;
    }
    case PROTO_LEASE_REVOKE:
        forget(p->held, &p->n_held, m->batch.batch_id);
        plog("< REVOKE %s", bid(m->batch.batch_id));
        break;
    case PROTO_GROUP: {
        p->gen = m->group.generation;
        p->rank = m->group.rank;
        p->in_group = 1;
        p->ckpt_step = m->group.ckpt_step;
        snprintf(p->ckpt_dir, sizeof p->ckpt_dir, "%s", m->group.ckpt_dir);
        uint64_t zero = 0;
        atomic_compare_exchange_strong(&SH->step[p->gen % 64], &zero, m->group.ckpt_step);
        atomic_fetch_add(&SH->groups, 1);
        plog("< GROUP gen=%" PRIu64 " rank=%u/%u ckpt=%s@%" PRIu64 " done_ids=%u", p->gen, p->rank,
             m->group.world_size, p->ckpt_dir, p->ckpt_step, m->group.n_done);
        break;
    }
    case PROTO_RESTART:
        p->in_group = 0;
        atomic_fetch_add(&SH->restarts, 1);
        plog("< RESTART gen=%" PRIu64 " ckpt=%s@%" PRIu64, m->restart.generation, m->restart.ckpt_dir,
             m->restart.ckpt_step);
        break;
    case PROTO_CONTROL:
        if (m->control.cmd == PROTO_CTL_PAUSE || m->control.cmd == PROTO_CTL_RESUME)
            p->paused = m->control.cmd == PROTO_CTL_PAUSE;
        if (m->control.cmd == PROTO_CTL_STOP || m->control.cmd == PROTO_CTL_DRAIN)
            atomic_fetch_add(&SH->stops, 1);
        plog("< CONTROL %s (%s)", proto_control_name(m->control.cmd), m->control.reason);
        break;
    case PROTO_ACK:
        if (m->ack.status) {
            atomic_fetch_add(&SH->nacks, 1);
            plog("< ACK seq=%" PRIu64 " status=%d", m->ack.seq, m->ack.status);
        }
        break;
    case PROTO_REFUSE:
        atomic_fetch_add(&SH->refused, 1);
        plog("< REFUSE %d: %s", m->refuse.code, m->refuse.message);
        break;
    case PROTO_REPLY: {
        p->replies++;
        cJSON *doc = cJSON_ParseWithLength(m->json, m->reply.json_len);
        if (!doc) {
            atomic_fetch_add(&SH->bad_json, 1);
            plog("< REPLY of %u bytes is not JSON", m->reply.json_len);
        }
        cJSON_Delete(doc);
        break;
    }
    default:
        plog("< %s", proto_type_name(m->type));
    }
}

/* Read what has come within timeout_ms; handle every whole frame. -1 when the connection ended. */
static int cp_pump(struct cpeer *p, int timeout_ms)
{
    if (p->fd < 0)
        return -1;
    struct pollfd pf = { p->fd, POLLIN, 0 };
    if (poll(&pf, 1, timeout_ms) <= 0)
        return 0;
    for (;;) {
        if (p->rx_cap - p->rx_len < 65536) {
            size_t cap = p->rx_cap ? p->rx_cap * 2 : 1 << 17;
            if (cap > PROTO_MAX_FRAME * 2u)
                cap = PROTO_MAX_FRAME * 2u;
            uint8_t *nb = realloc(p->rx, cap);
            if (!nb)
                _exit(20);
            p->rx = nb;
            p->rx_cap = cap;
        }
        ssize_t k = recv(p->fd, p->rx + p->rx_len, p->rx_cap - p->rx_len, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
            cp_close(p, k == 0 ? "EOF from the coordinator" : "recv failed");
            return -1;
        }
        if (k < 0)
            break;
        p->rx_len += (size_t)k;
        size_t off = 0;
        for (;;) {
            char err[256];
            int64_t n = proto_frame_size(p->rx + off, p->rx_len - off, err, sizeof err);
            if (n == 0 || (n > 0 && (size_t)n > p->rx_len - off))
                break;
            struct proto_msg m;
            int r = n < 0 ? (int)n : proto_decode(p->rx + off, (size_t)n, &m, err, sizeof err);
            if (r < 0) {
                atomic_fetch_add(&SH->bad_frames, 1);
                plog("BAD FRAME from the coordinator: %s", err);
                cp_close(p, "bad frame");
                return -1;
            }
            handle(p, &m);
            off += (size_t)n;
        }
        memmove(p->rx, p->rx + off, p->rx_len - off);
        p->rx_len -= off;
    }
    return 0;
}

static struct proto_msg hello_msg(int role, int device, uint32_t rank, uint64_t gen)
{
    struct proto_msg h = { .type = PROTO_HELLO };
    uint64_t ticks = 0, token = 0;
    proc_start_time(getpid(), &ticks);
    proc_self_token(&token);
    h.hello.role = (uint32_t)role;
    h.hello.device = device;
    h.hello.pid = (uint32_t)getpid();
    h.hello.start_ticks = ticks;
    h.hello.token = token;
    h.hello.group_rank = rank;
    h.hello.group_generation = gen;
    char name[PROTO_NAME_MAX];
    if (chance(5))
        snprintf(name, sizeof name, "chaos\n\x1b[31mforged line %d", device);     /* made plain by the decoder */
    else
        snprintf(name, sizeof name, "chaos-%s@%d", proto_role_name((unsigned)role), device);
    proto_strset(h.hello.name, sizeof h.hello.name, name);
    return h;
}

/* Connect and HELLO; 0 once WELCOME came. */
static int cp_connect(struct cpeer *p)
{
    p->fd = sock_connect();
    if (p->fd < 0) {
        plog("connect: %s", strerror(errno));
        return -1;
    }
    uint32_t rank = PROTO_NONE32;
    uint64_t gen = 0;
    if (p->role == PROTO_ROLE_DRAFTER) {
        int r = (int)below(10);
        if (r < 6 && p->in_group) {
            rank = p->rank;                         /* the place held */
            gen = p->gen;
        } else if (r < 8) {
            rank = (uint32_t)below(4);              /* a place it does not hold */
            gen = p->gen + below(3);
        } else if (r < 9) {
            rank = UINT32_MAX - 1;
            gen = rnd();
        }
    }
    struct proto_msg h = hello_msg(p->role, p->device, rank, gen);
    p->n_held = 0;
    p->welcomed = 0;
    p->paused = 0;
    if (cp_send(p, &h) < 0)
        return -1;
    atomic_fetch_add(&SH->conns, 1);
    uint64_t end = mono_ms() + 3000 * (uint64_t)test_time_scale();
    while (p->fd >= 0 && !p->welcomed && mono_ms() < end)
        cp_pump(p, 20);
    if (p->fd >= 0 && !p->welcomed)
        cp_close(p, "no WELCOME");
    p->last_hb_ms = 0;
    return p->fd >= 0 ? 0 : -1;
}

static void heartbeat(struct cpeer *p)
{
    uint64_t now = mono_ms();
    if (p->fd < 0 || now - p->last_hb_ms < 50)
        return;
    p->last_hb_ms = now;
    struct proto_msg m = { .type = PROTO_HEARTBEAT };
    struct proto_heartbeat *hb = &m.heartbeat;
    hb->state = (uint32_t)below(PROTO_STATE_MAX);
    hb->leases_held = (uint32_t)p->n_held;
    hb->batches_done = below(1000);
    hb->step = chance(5) ? rnd() : below(1000);
    hb->forward_ms = (double)below(100);
    hb->tokens_per_s = chance(5) ? NAN : (double)below(100000);
    hb->loss = chance(5) ? INFINITY : (double)below(100) / 10.0;
    hb->grad_norm = chance(5) ? -1e308 : 1.0;
    hb->lr = 1e-4;
    hb->idle_frac = (double)below(100) / 100.0;
    cp_send(p, &m);
}

/* A batch to talk about: one this process holds or saw (real, maybe stale), one granted to
 * anyone (maybe stale), one that may exist, or any id at all. */
static uint64_t pick_batch(struct cpeer *p, uint32_t *lease)
{
    int r = (int)below(100);
    *lease = 1 + (uint32_t)below(3);
    if (r < 30 && p->n_seen) {      /* (every lease held was seen) */
        const struct held *h = p->n_held && chance(60) ? &p->held[below((uint64_t)p->n_held)]
                                                       : &p->seen[below((uint64_t)p->n_seen)];
        *lease = h->lease ? h->lease : 1;
        return h->id;
    }
    uint64_t n = atomic_load(&SH->pool_n);
    if (r < 65 && n) {
        uint64_t k = (n - 1 - below(n < POOL ? n : POOL)) % POOL;
        *lease = atomic_load(&SH->pool_lease[k]);
        if (!*lease || chance(10))
            *lease = 1 + (uint32_t)below(4);
        return atomic_load(&SH->pool_id[k]);
    }
    if (r < 90)
        return sched_batch_id((uint32_t)below(4), (uint32_t)below(60));
    if (chance(30))
        *lease = chance(50) ? UINT32_MAX : (uint32_t)rnd() | 1;
    return chance(50) ? rnd() : (uint64_t) sched_batch_id((uint32_t)below(1u << 20), (uint32_t)rnd());
}

static uint64_t next_seq(struct cpeer *p)
{
    p->seq += 1 + (chance(10) ? below(5) : 0);      /* gaps: some seqs never come */
    return p->seq;
}

/* An event (seq set here), kept for duplicate replays. */
static void send_event(struct cpeer *p, struct proto_msg *m)
{
    uint64_t seq = next_seq(p);
    if (chance(5) && p->seq > 3)
        seq = p->seq - 1 - below(3);        /* out of order: an older seq again */
    m->published.seq = seq;                 /* (seq is the first field of every event) */
    if (p->n_ev == 16) {
        memmove(p->ev, p->ev + 1, 15 * sizeof *p->ev);
        p->n_ev--;
    }
    p->ev[p->n_ev++] = *m;
    cp_send(p, m);
}

static void replay_event(struct cpeer *p)
{
    if (!p->n_ev)
        return;
    plog("replay:");
    cp_send(p, &p->ev[below((uint64_t)p->n_ev)]);
}

static void send_error(struct cpeer *p)
{
    struct proto_msg m = { .type = PROTO_ERROR };
    m.error.fatal = 0;                          /* never a fatal end */
    if (chance(8)) {
        m.error.code = -DF_ENAN;                /* pauses the cluster until the ctl resumes */
        m.error.step = chance(50) ? below(100) : 0;
    } else {
        m.error.code = chance(50) ? -(int)below(200) - 1 : -DF_EBASE - (int)below(20);
    }
    proto_strset(m.error.message, sizeof m.error.message,
                 chance(20) ? "chaos error with\na forged\x1b[2J line" : "chaos error");
    cp_send(p, &m);
}

static void send_query(struct cpeer *p)
{
    struct proto_msg m = { .type = PROTO_QUERY };
    m.query.what = 1 + (uint32_t)below(PROTO_Q_MAX - 1);
    static const uint32_t limits[] = { 0, 1, 7, 100, 1u << 20, UINT32_MAX };
    m.query.limit = limits[below(6)];
    cp_send(p, &m);
}

/* A frame the role may not send (encoded properly): the coordinator refuses and closes. */
static void send_wrong_role(struct cpeer *p)
{
    struct proto_msg m = { 0 };
    int r = (int)below(6);
    if (p->role == PROTO_ROLE_TARGET) {
        static const int t[] = { PROTO_TRAINED, PROTO_JOIN_GROUP, PROTO_CHECKPOINTED, PROTO_SKIPPED, PROTO_CONTROL,
                                 PROTO_ACK };
        m.type = (uint16_t)t[r];
    } else if (p->role == PROTO_ROLE_DRAFTER) {
        static const int t[] = { PROTO_LEASE_REQUEST, PROTO_LEASE_RETURN, PROTO_PUBLISHED, PROTO_CONTROL,
                                 PROTO_RESTART, PROTO_LEASE_REVOKE };
        m.type = (uint16_t)t[r];
    } else {
        static const int t[] = { PROTO_LEASE_REQUEST, PROTO_ERROR, PROTO_PUBLISHED, PROTO_TRAINED, PROTO_JOIN_GROUP,
                                 PROTO_CKPT_BAD };
        m.type = (uint16_t)t[r];
    }
    uint32_t lease;
    uint64_t id = pick_batch(p, &lease);
    switch (m.type) {
    case PROTO_TRAINED:
        m.trained = (struct proto_trained){ 1, id, 1, p->gen, 0, lease };
        break;
    case PROTO_CHECKPOINTED:
        m.checkpointed.step = 1000;
        m.checkpointed.generation = p->gen;
        proto_strset(m.checkpointed.dir, sizeof m.checkpointed.dir, "wrong-role");
        break;
    case PROTO_SKIPPED:
        m.skipped = (struct proto_skipped){ 1, id, lease, 0 };
        break;
    case PROTO_CONTROL:
        m.control.cmd = chance(50) ? PROTO_CTL_PAUSE : PROTO_CTL_RESUME;
        break;
    case PROTO_LEASE_REQUEST:
        m.lease_request.n = 1;
        break;
    case PROTO_LEASE_RETURN:
    case PROTO_LEASE_REVOKE:
        m.batch.batch_id = id;
        break;
    case PROTO_PUBLISHED:
        m.published = (struct proto_published){ 1, id, 0, 10 };
        break;
    case PROTO_ERROR:                           /* from a ctl: refused, even a fatal one */
        m.error.fatal = (uint32_t)below(2);
        m.error.code = -DF_EPEER;
        break;
    case PROTO_CKPT_BAD:
        m.ckpt_bad.code = -DF_EFORMAT;
        proto_strset(m.ckpt_bad.dir, sizeof m.ckpt_bad.dir, "wrong-role");
        break;
    case PROTO_RESTART:
        m.restart.generation = p->gen + 1;
        break;
    default:
        break;
    }
    plog("wrong role:");
    cp_send(p, &m);
    cp_pump(p, 50);
}

/* ---- targets ---- */

static void target_produce(struct cpeer *p)
{
    if (!p->n_held || p->die_at_ms)
        return;
    struct held h = p->held[below((uint64_t)p->n_held)];
    unsigned slot;
    if (ring_claim_write(p->ring, 0, &slot) < 0)
        return;
    uint32_t max = ring_layout(p->ring)->max_tokens, n = h.n_tokens ? h.n_tokens : 1;
    if (n > max)
        n = max;
    struct ring_payload *hd = ring_slot_header(p->ring, slot);
    int32_t *cu = ring_slot_cu_seqlens(p->ring, slot);
    hd->batch_id = h.id;
    hd->epoch = h.epoch;
    hd->lease = h.lease;
    hd->n_seqs = 1;
    hd->n_tokens = n;
    cu[0] = 0;
    cu[1] = (int32_t)n;
    int r = (int)below(100);
    if (r < 8) {
        plog("ring: slot %u WRITING %s kept; dying soon", slot, bid(h.id));
        p->die_at_ms = mono_ms() + below(400);
        return;
    }
    if (r < 15) {
        ring_abort_write(p->ring, slot);
        plog("ring: slot %u aborted", slot);
        return;
    }
    if (ring_publish(p->ring, slot) < 0) {
        plog("ring: publish of slot %u refused", slot);
        return;
    }
    plog("ring: slot %u READY with %s lease %u", slot, bid(h.id), h.lease);
    forget(p->held, &p->n_held, h.id);
    atomic_fetch_add(&SH->published, 1);
    if (r < 25) {
        plog("its PUBLISHED is never sent");
        if (chance(30))
            p->die_at_ms = mono_ms() + below(200);
        return;
    }
    struct proto_msg m = { .type = PROTO_PUBLISHED };
    m.published = (struct proto_published){ 0, h.id, slot, chance(90) ? n : (uint32_t)below(1000) };
    send_event(p, &m);
}

static void target_bogus_publish(struct cpeer *p)
{
    struct proto_msg m = { .type = PROTO_PUBLISHED };
    uint32_t lease;
    m.published.batch_id = pick_batch(p, &lease);
    int r = (int)below(10);
    m.published.slot = r < 6 ? (uint32_t)below(RING_SLOTS) : r < 8 ? RING_SLOTS + (uint32_t)below(10)
                     : r < 9 ? UINT32_MAX : (uint32_t)rnd();
    m.published.n_tokens = chance(80) ? (uint32_t)below(600) : (uint32_t)rnd();
    forget(p->held, &p->n_held, m.published.batch_id);
    send_event(p, &m);
}

static void target_step(struct cpeer *p)
{
    int r = (int)below(100);
    if (r < 16) {
        struct proto_msg m = { .type = PROTO_LEASE_REQUEST };
        m.lease_request.n = chance(2) ? 64 + (uint32_t)below(PROTO_MAX_LEASE_REQUEST - 63) : 1 + (uint32_t)below(3);
        cp_send(p, &m);
    } else if (r < 42) {
        target_produce(p);
    } else if (r < 54) {
        target_bogus_publish(p);
    } else if (r < 64) {
        struct proto_msg m = { .type = PROTO_LEASE_RETURN };
        uint32_t lease;
        m.batch.batch_id = p->n_held && chance(60) ? p->held[below((uint64_t)p->n_held)].id : pick_batch(p, &lease);
        forget(p->held, &p->n_held, m.batch.batch_id);
        cp_send(p, &m);
    } else if (r < 72) {
        replay_event(p);
    } else if (r < 75) {
        send_error(p);
    } else if (r < 77) {
        send_query(p);
    }
    /* else: nothing this time */
}

/* ---- drafters ---- */

static uint64_t pick_gen(struct cpeer *p)
{
    int r = (int)below(100);
    if (r < 60)
        return p->gen;
    if (r < 75)
        return p->gen ? p->gen - 1 : 0;
    if (r < 85)
        return p->gen + 1;
    if (r < 95)
        return below(p->gen + 3);
    return rnd();
}

static uint64_t pick_step(struct cpeer *p, uint64_t gen)
{
    int r = (int)below(100);
    _Atomic uint64_t *s = &SH->step[gen % 64];
    if (r < 50)
        return atomic_fetch_add(s, 1) + 1;
    if (r < 75)
        return below(atomic_load(s) + 10);
    if (r < 85)
        return atomic_load(s);
    if (r < 92)
        return 0;
    return chance(50) ? (1ull << 40) + below(1000) : UINT64_MAX - below(2);
}

static uint32_t pick_rank(struct cpeer *p)
{
    int r = (int)below(100);
    return r < 65 ? p->rank : r < 92 ? (uint32_t)below(4) : r < 96 ? PROTO_NONE32 : (uint32_t)rnd();
}

static void send_trained(struct cpeer *p, uint64_t id, uint32_t lease, int honest)
{
    struct proto_msg m = { .type = PROTO_TRAINED };
    uint64_t gen = honest ? p->gen : pick_gen(p);
    m.trained.batch_id = id;
    m.trained.lease = lease ? lease : 1;
    m.trained.generation = gen;
    m.trained.step = honest ? atomic_fetch_add(&SH->step[gen % 64], 1) + 1 : pick_step(p, gen);
    m.trained.rank = honest ? p->rank : pick_rank(p);
    send_event(p, &m);
    atomic_fetch_add(&SH->trained, 1);
}

static void send_checkpointed(struct cpeer *p)
{
    struct proto_msg m = { .type = PROTO_CHECKPOINTED };
    int r = (int)below(100);
    uint64_t gen = r < 85 ? p->gen : pick_gen(p);
    uint64_t now = atomic_load(&SH->step[gen % 64]);
    m.checkpointed.generation = gen;
    /* (UINT64_MAX: past 2^63 - 1, refused by proto_encode as by the coordinator's decoder: not sent) */
    m.checkpointed.step = r < 70 ? now : r < 90 ? below(now + 5) : r < 99 || chance(70) ? (1ull << 40) + below(10)
                        : UINT64_MAX;
    char dir[PROTO_PATH_MAX];
    if (chance(10) && p->ckpt_dir[0] && strcmp(p->ckpt_dir, BASE_DIR))
        snprintf(dir, sizeof dir, "%s", p->ckpt_dir);                  /* a head again */
    else if (chance(5))
        snprintf(dir, sizeof dir, "%0255d", (int)getpid());             /* the longest path */
    else
        snprintf(dir, sizeof dir, "%s/ck-%d-%d", TC.dir, (int)getpid(), p->ckpts++);
    proto_strset(m.checkpointed.dir, sizeof m.checkpointed.dir, dir);
    send_event(p, &m);
}

/* CKPT_BAD: about the head the GROUP named when that is at a step in [2, 2^62) (the lineage falls
 * back: the base checkpoint at step 1, or one after it, is always there, so this never ends the
 * run), else about a folder no checkpoint has (ignored, whatever its generation and step). */
static void send_ckpt_bad(struct cpeer *p)
{
    struct proto_msg m = { .type = PROTO_CKPT_BAD };
    m.ckpt_bad.code = -(int)below(100) - 1;
    int head = p->ckpt_dir[0] && p->ckpt_step >= 2 && p->ckpt_step < (1ull << 62) && chance(50);
    if (head) {
        m.ckpt_bad.generation = p->gen;
        m.ckpt_bad.step = p->ckpt_step;
        proto_strset(m.ckpt_bad.dir, sizeof m.ckpt_bad.dir, p->ckpt_dir);
    } else {
        m.ckpt_bad.generation = pick_gen(p);
        m.ckpt_bad.step = chance(50) ? p->ckpt_step : below(100);
        proto_strset(m.ckpt_bad.dir, sizeof m.ckpt_bad.dir, chance(50) ? "stale-checkpoint" : "/no/such/checkpoint");
    }
    proto_strset(m.ckpt_bad.reason, sizeof m.ckpt_bad.reason, "chaos: does not load");
    plog("%s", head ? "ckpt_bad of the head:" : "ckpt_bad (no such checkpoint):");
    cp_send(p, &m);
}

static void drafter_consume(struct cpeer *p)
{
    unsigned slot;
    if (p->die_at_ms || ring_claim_read(p->ring, NULL, 0, &slot) < 0)
        return;
    struct ring_payload *hd = ring_slot_header(p->ring, slot);
    uint64_t id = hd->batch_id;
    uint32_t lease = hd->lease;
    int r = (int)below(100);
    if (r < 8) {
        plog("ring: slot %u READING %s kept; dying soon", slot, bid(id));
        p->die_at_ms = mono_ms() + below(400);
        return;
    }
    if (r < 16) {
        ring_requeue(p->ring, slot);
        plog("ring: slot %u requeued", slot);
        return;
    }
    if (ring_release(p->ring, slot) < 0) {
        plog("ring: slot %u taken back", slot);
        return;
    }
    plog("ring: slot %u consumed %s lease %u", slot, bid(id), lease);
    if (r < 22) {
        plog("its report is lost");         /* the orphan sweep queues it again */
        return;
    }
    if (r < 32) {
        struct proto_msg m = { .type = PROTO_SKIPPED };
        m.skipped = (struct proto_skipped){ 0, id, lease ? lease : 1, 0 };
        send_event(p, &m);
        return;
    }
    send_trained(p, id, lease, p->in_group && chance(85));
    if (p->in_group && p->rank == 0 && chance(25))
        send_checkpointed(p);
}

static void drafter_step(struct cpeer *p)
{
    int r = (int)below(100);
    if (r < (p->in_group ? 4 : 14)) {
        struct proto_msg m = { .type = PROTO_JOIN_GROUP };
        cp_send(p, &m);
    } else if (r < 40) {
        drafter_consume(p);
    } else if (r < 55) {
        uint32_t lease;
        uint64_t id = pick_batch(p, &lease);
        send_trained(p, id, lease, 0);
    } else if (r < 61) {
        send_checkpointed(p);
    } else if (r < 67) {
        struct proto_msg m = { .type = PROTO_SKIPPED };
        uint32_t lease;
        m.skipped.batch_id = pick_batch(p, &lease);
        m.skipped.lease = lease;
        send_event(p, &m);
    } else if (r < 69) {
        send_ckpt_bad(p);
    } else if (r < 76) {
        replay_event(p);
    } else if (r < 79) {
        send_error(p);
    } else if (r < 81) {
        send_query(p);
    }
}

/* ---- ctl ---- */

static void ctl_step(struct cpeer *p)
{
    int r = (int)below(100);
    if (r < 60) {
        send_query(p);
    } else if (r < 62 || (r < 80 && !p->paused)) {
        struct proto_msg m = { .type = PROTO_CONTROL };
        m.control.cmd = r < 62 ? PROTO_CTL_PAUSE : PROTO_CTL_RESUME;
        proto_strset(m.control.reason, sizeof m.control.reason, "chaos\noperator");
        cp_send(p, &m);
        if (r < 62)
            p->paused = 1;
    } else if (r < 90) {
        struct proto_msg m = { .type = PROTO_CONTROL };
        m.control.cmd = PROTO_CTL_RESUME;       /* a paused cluster does not stay paused for long */
        cp_send(p, &m);
        p->paused = 0;
    }
}

/* ---- one chaos process: sessions until the stop ---- */

static void die_now(struct cpeer *p, const char *how)
{
    plog("dies (%s)", how);
    fflush(LOG);
    if (!strcmp(how, "SIGKILL"))
        raise(SIGKILL);
    _exit(0);
}

static void end_session(struct cpeer *p)
{
    int r = (int)below(100);
    if (r < 35) {
        cp_close(p, "hang-up");
    } else if (r < 55) {
        /* a frame cut short, then the hang-up */
        struct proto_msg m = { .type = PROTO_HEARTBEAT };
        uint8_t buf[512] __attribute__((aligned(8)));
        int64_t n = encode(&m, buf, sizeof buf);
        size_t cut = n > 0 ? (size_t)below((uint64_t)n - 1) + 1 : 0;
        plog("> %zu of the %lld bytes of a HEARTBEAT", cut, (long long)n);
        if (p->fd >= 0)
            send_all(p->fd, buf, cut);
        cp_close(p, "hang-up mid-frame");
    } else if (r < 70) {
        /* silent past dead_after: the coordinator closes it */
        plog("silent for %d ms", DEAD_AFTER_MS + 400);
        atomic_fetch_add(&SH->silences, 1);
        tc_sleep_ms(DEAD_AFTER_MS + 400);
        cp_pump(p, 0);
        cp_close(p, "after the silence");
    } else if (r < 85) {
        send_wrong_role(p);
        cp_close(p, "after the wrong frame");
    } else {
        die_now(p, chance(50) ? "SIGKILL" : "exit");
    }
}

static void chaos_main(int role, int device)
{
    struct cpeer *p = calloc(1, sizeof *p);
    p->fd = -1;
    p->role = role;
    p->device = device;
    if (role != PROTO_ROLE_CTL)
        p->ring = peer_ring();
    while (!atomic_load(&SH->stop)) {
        if (p->fd < 0 && cp_connect(p) < 0) {
            tc_sleep_ms(20 + (int)below(100));
            continue;
        }
        uint64_t session_end = mono_ms() + 50 + below(chance(30) ? 3000 : 800);
        while (p->fd >= 0 && !atomic_load(&SH->stop) && mono_ms() < session_end) {
            heartbeat(p);
            if (role == PROTO_ROLE_TARGET)
                target_step(p);
            else if (role == PROTO_ROLE_DRAFTER)
                drafter_step(p);
            else
                ctl_step(p);
            cp_pump(p, (int)below(12));
            if (p->die_at_ms && mono_ms() >= p->die_at_ms)
                die_now(p, chance(70) ? "SIGKILL" : "exit");
        }
        if (p->fd >= 0 && !atomic_load(&SH->stop))
            end_session(p);
        if (chance(3))
            die_now(p, "exit");
    }
    cp_close(p, "chaos over");
    _exit(0);
}

/* ---- the abuser: raw frames over a plain socket ---- */

/* Read until the coordinator closes (a REFUSE first, maybe): 1 closed, 0 still open. A peer that
 * said HELLO heartbeats meanwhile (keepalive), so only the refusal can close it, and waits 3 s
 * (scaled); one that did not waits 3 s flat, short of the coordinator's 5 s HELLO timeout. */
static int closed_within(int fd, int keepalive)
{
    uint64_t end = mono_ms() + 3000 * (uint64_t)(keepalive ? test_time_scale() : 1), hb_ms = 0;
    uint8_t buf[4096] __attribute__((aligned(8)));
    struct proto_msg hb = { .type = PROTO_HEARTBEAT };
    int64_t hb_len = encode(&hb, buf, sizeof buf);
    uint8_t hb_frame[512];
    memcpy(hb_frame, buf, hb_len > 0 ? (size_t)hb_len : 0);
    while (mono_ms() < end) {
        if (keepalive && hb_len > 0 && mono_ms() - hb_ms >= 50) {
            hb_ms = mono_ms();
            send(fd, hb_frame, (size_t)hb_len, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        struct pollfd pf = { fd, POLLIN, 0 };
        if (poll(&pf, 1, 20) <= 0)
            continue;
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN))
            return 1;
    }
    return 0;
}

static size_t put(uint8_t *buf, size_t off, const struct proto_msg *m)
{
    int64_t n = encode(m, buf + off, 4096 - off);
    return n > 0 ? off + (size_t)n : off;
}

static void abuse_once(void)
{
    uint8_t buf[4096] __attribute__((aligned(8)));
    size_t n = 0;
    int role = chance(50) ? PROTO_ROLE_TARGET : PROTO_ROLE_DRAFTER, expect_close = 1, said_hello = 1;
    int kind = (int)below(16);
    struct proto_msg hello = hello_msg(role, 40 + (int)below(4), PROTO_NONE32, 0);
    int fd = sock_connect();
    if (fd < 0)
        return;
    const char *what = "?";
    switch (kind) {
    case 0: {       /* a type the role may not send, after a good HELLO */
        what = "wrong type for the role";
        n = put(buf, 0, &hello);
        struct proto_msg m = { .type = role == PROTO_ROLE_TARGET ? PROTO_TRAINED : PROTO_PUBLISHED };
        if (role == PROTO_ROLE_TARGET)
            m.trained = (struct proto_trained){ 7, sched_batch_id(0, (uint32_t)below(40)), 1, 1, 0, 1 };
        else
            m.published = (struct proto_published){ 7, sched_batch_id(0, (uint32_t)below(40)), 0, 10 };
        n = put(buf, n, &m);
        break;
    }
    case 1: {       /* a frame only the coordinator sends */
        what = "a coordinator's frame";
        n = put(buf, 0, &hello);
        struct proto_msg m = { .type = chance(50) ? PROTO_ACK : PROTO_LEASE_REVOKE };
        n = put(buf, n, &m);
        break;
    }
    case 2: {       /* truncated frame, then close */
        what = "truncated frame";
        n = put(buf, 0, &hello);
        struct proto_msg m = { .type = PROTO_LEASE_REQUEST, .lease_request.n = 1 };
        size_t full = put(buf, n, &m);
        n += (size_t)below(full - n - 1) + 1;
        expect_close = 0;
        break;
    }
    case 3:         /* truncated HELLO, then close */
        what = "truncated HELLO";
        n = put(buf, 0, &hello);
        n = (size_t)below(n - 1) + 1;
        expect_close = 0;
        break;
    case 4: {       /* bad magic */
        what = "bad magic";
        said_hello = 0;
        n = put(buf, 0, &hello);
        buf[below(4)] ^= (uint8_t)(1 + below(255));
        break;
    }
    case 5: {       /* another protocol version */
        what = "wrong version";
        n = put(buf, 0, &hello);
        struct proto_hdr h;
        memcpy(&h, buf, sizeof h);
        h.version = chance(50) ? PROTO_VERSION - 1 : PROTO_VERSION + 1;
        memcpy(buf, &h, sizeof h);
        break;
    }
    case 6: {       /* a header announcing a huge frame */
        what = "oversized";
        said_hello = 0;
        struct proto_hdr h = { PROTO_MAGIC, chance(50) ? PROTO_MAX_FRAME : 200000, PROTO_VERSION, PROTO_REPLY };
        memcpy(buf, &h, sizeof h);
        n = sizeof h;
        break;
    }
    case 7: {       /* no HELLO first */
        what = "QUERY before HELLO";
        said_hello = 0;
        struct proto_msg m = { .type = PROTO_QUERY, .query.what = PROTO_Q_STATUS };
        n = put(buf, 0, &m);
        break;
    }
    case 8:         /* two HELLOs */
        what = "second HELLO";
        n = put(buf, 0, &hello);
        n = put(buf, n, &hello);
        break;
    case 9:         /* someone else's pid and token */
        what = "HELLO of another process";
        hello.hello.pid = (uint32_t)getppid();
        if (chance(50))
            hello.hello.token ^= 1u << 3;
        n = put(buf, 0, &hello);
        break;
    case 10: {      /* payloads the decoder refuses: patched after encoding */
        what = "malformed payload";
        n = put(buf, 0, &hello);
        size_t at = n;
        if (role == PROTO_ROLE_TARGET) {
            struct proto_msg m = { .type = PROTO_LEASE_REQUEST, .lease_request.n = 1 };
            n = put(buf, n, &m);
            if (chance(50))
                buf[at + sizeof(struct proto_hdr) + 4] = 1;                /* pad */
            else
                memset(buf + at + sizeof(struct proto_hdr), 0, 4);        /* n = 0 */
        } else {
            struct proto_msg m = { .type = PROTO_CHECKPOINTED };
            m.checkpointed.step = 5;
            proto_strset(m.checkpointed.dir, sizeof m.checkpointed.dir, "dir");
            n = put(buf, n, &m);
            if (chance(50))
                buf[at + sizeof(struct proto_hdr) + 24 + 1] = '\n';           /* a control character */
            else        /* a step past 2^63 - 1 (step: after the 8-byte seq) */
                memset(buf + at + sizeof(struct proto_hdr) + 8, 0xff, 8);
        }
        break;
    }
    case 11:        /* noise */
        what = "random bytes";
        said_hello = 0;
        n = 16 + below(200);
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint8_t)rnd();
        break;
    case 12: {      /* a frame of an unknown type */
        what = "unknown type";
        n = put(buf, 0, &hello);
        struct proto_hdr h = { PROTO_MAGIC, 0, PROTO_VERSION, (uint16_t)(PROTO_TYPE_MAX + below(100)) };
        memcpy(buf + n, &h, sizeof h);
        n += sizeof h;
        break;
    }
    case 13: {      /* bits flipped in the payload of a harmless frame: whatever it becomes */
        what = "flipped bits";
        n = put(buf, 0, &hello);
        size_t at = n;
        struct proto_msg m = { 0 };
        int t = (int)below(5);
        m.type = t == 0 ? PROTO_HEARTBEAT : t == 1 ? PROTO_QUERY : t == 2 ? PROTO_SKIPPED
               : t == 3 ? (role == PROTO_ROLE_TARGET ? PROTO_PUBLISHED : PROTO_TRAINED) : PROTO_LEASE_RETURN;
        if (m.type == PROTO_QUERY)
            m.query.what = PROTO_Q_STATUS;
        if (m.type == PROTO_SKIPPED)
            m.skipped.lease = 1;
        if (m.type == PROTO_TRAINED)
            m.trained.lease = 1;
        n = put(buf, n, &m);
        size_t plen = n - at - sizeof(struct proto_hdr);
        for (int i = 0, k = 1 + (int)below(3); i < k && plen; i++)
            buf[at + sizeof(struct proto_hdr) + below(plen)] ^= (uint8_t)(1u << below(8));
        expect_close = 0;
        break;
    }
    case 14:        /* AUTH on the unix socket */
        what = "AUTH over the unix socket";
        said_hello = 0;
        {
            struct proto_msg m = { .type = PROTO_AUTH };
            m.auth.len = PROTO_AUTH_TOKEN_MIN;
            memset(m.auth.token, 'x', PROTO_AUTH_TOKEN_MIN);
            n = put(buf, 0, &m);
        }
        break;
    default: {      /* a valid ctl, a byte at a time: it must get its answer */
        what = "slow ctl";
        struct proto_msg h = hello_msg(PROTO_ROLE_CTL, -1, PROTO_NONE32, 0);
        n = put(buf, 0, &h);
        struct proto_msg q = { .type = PROTO_QUERY, .query.what = 1 + (uint32_t)below(PROTO_Q_MAX - 1) };
        n = put(buf, n, &q);
        plog("abuse: %s", what);
        for (size_t i = 0; i < n; i++)
            if (send_all(fd, buf + i, 1) < 0)
                break;
        struct cpeer pp = { .fd = fd, .role = PROTO_ROLE_CTL };
        uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
        while (pp.fd >= 0 && !pp.replies && mono_ms() < end)
            cp_pump(&pp, 50);
        if (!pp.welcomed || !pp.replies) {
            atomic_fetch_add(&SH->not_answered, 1);
            plog("NOT ANSWERED: %s", what);
        }
        free(pp.rx);
        if (pp.fd >= 0)
            close(fd);
        atomic_fetch_add(&SH->abuses, 1);
        return;
    }
    }
    plog("abuse: %s (%zu bytes)%s", what, n, expect_close ? "" : ", then hang up");
    atomic_fetch_add(&SH->abuses, 1);
    if (n && send_all(fd, buf, n) < 0 && !expect_close) {
        close(fd);
        return;
    }
    if (!expect_close) {
        if (chance(50))
            tc_sleep_ms((int)below(30));
        close(fd);
        return;
    }
    if (!closed_within(fd, said_hello)) {
        atomic_fetch_add(&SH->not_closed, 1);
        plog("NOT CLOSED after: %s", what);
    }
    close(fd);
}

static void abuser_main(void)
{
    while (!atomic_load(&SH->stop)) {
        abuse_once();
        tc_sleep_ms(5 + (int)below(50));
    }
    _exit(0);
}

/* ---- the parent: setup, monitoring, checks ---- */

static void dump_logs(void)
{
    fprintf(stderr, "chaos seed %" PRIu64 ": rerun with DFLASH_CHAOS_SEED=%" PRIu64 "\n", seed0, seed0);
    if (SH)
        fprintf(stderr, "bad frames %" PRIu64 ", bad JSON %" PRIu64 ", abuses not closed %" PRIu64
                ", slow ctl not answered %" PRIu64 ", STOP/DRAIN pushed %" PRIu64 "\n",
                atomic_load(&SH->bad_frames), atomic_load(&SH->bad_json), atomic_load(&SH->not_closed),
                atomic_load(&SH->not_answered), atomic_load(&SH->stops));
    char cmd[1200];
    for (int k = 0; k < N_SLOTS; k++) {
        snprintf(cmd, sizeof cmd, "f='%s/chaos-%d.log'; [ -f \"$f\" ] && { echo \"--- $f (last lines)\"; "
                 "tail -n 15 \"$f\"; } >&2", TC.dir, k);
        if (system(cmd)) {}
    }
    snprintf(cmd, sizeof cmd, "echo '--- coordinator.log (last lines)' >&2; tail -n 40 '%s/coordinator.log' >&2", TC.dir);
    if (system(cmd)) {}
}

static void cleanup(void)
{
    if (getpid() != parent_pid)
        return;                 /* (a forked peer that got here by exit()) */
    if (!passed)
        dump_logs();
    for (int k = 0; k < N_SLOTS; k++)
        tc_kill(kids[k]);
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

/* Fails the test when the coordinator has ended: every end of it here is unexpected. */
static void coord_alive(const char *when)
{
    int st;
    if (TC.coord > 0 && waitpid(TC.coord, &st, WNOHANG) == TC.coord) {
        TC.coord = 0;
        if (WIFSIGNALED(st))
            TEST_FAIL("%s: the coordinator was killed by signal %d (%s)", when, WTERMSIG(st), strsignal(WTERMSIG(st)));
        TEST_FAIL("%s: the coordinator exited with %d", when, WEXITSTATUS(st));
    }
}

static cJSON *query(enum proto_query_what what, uint32_t limit, const char *when)
{
    char err[256];
    for (int attempt = 0; attempt < 5; attempt++) {
        coord_alive(when);
        struct client *c = tc_ctl(1000);
        char *json = NULL;
        int status = -1, r = c ? client_query(c, what, limit, &json, &status, err, sizeof err) : -1;
        client_free(c);
        if (r == 0) {
            cJSON *doc = cJSON_Parse(json);
            if (!doc)
                TEST_FAIL("%s: the %s answer is not JSON: %.300s", when, proto_query_name(what), json);
            free(json);
            CHECK_INT(status, ==, 0);
            return doc;
        }
        free(json);
        tc_sleep_ms(200);
    }
    TEST_FAIL("%s: the coordinator does not answer a %s query", when, proto_query_name(what));
}

struct snap {
    double total, n[BATCH_NSTATES];
    char state[32];
    double ready, writing, reading, ranks, alive_daemons;
    int group_active;
};

/* Counts of a "batches" object: each batch in exactly one state. */
static void check_counts(const cJSON *b, struct snap *sn, const char *when)
{
    CHECK(cJSON_IsObject(b));
    sn->total = tc_num(b, "total");
    double sum = 0;
    for (int s = 0; s < BATCH_NSTATES; s++) {
        sn->n[s] = tc_num(b, batch_state_name(s));
        if (sn->n[s] < 0)
            TEST_FAIL("%s: batches.%s is %g", when, batch_state_name(s), sn->n[s]);
        sum += sn->n[s];
    }
    if (sn->total <= 0 || sum != sn->total)
        TEST_FAIL("%s: batch counts add up to %.0f, total %.0f (pending %.0f leased %.0f published %.0f trained %.0f "
                  "checkpointed %.0f)", when, sum, sn->total, sn->n[0], sn->n[1], sn->n[2], sn->n[3], sn->n[4]);
}

/* Per-epoch counts against the totals of the same document. */
static void check_epochs(const cJSON *doc, const struct snap *sn, const char *when)
{
    const cJSON *per = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "epoch"), "per_epoch");
    CHECK(cJSON_IsArray(per));
    double done = 0, batches = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, per) {
        double d = tc_num(e, "checkpointed"), b = tc_num(e, "batches");
        if (d < 0 || d > b)
            TEST_FAIL("%s: epoch %.0f: %.0f of %.0f batches checkpointed", when, tc_num(e, "epoch"), d, b);
        done += d;
        batches += b;
    }
    if (done != sn->n[BATCH_CHECKPOINTED] || batches != sn->total)
        TEST_FAIL("%s: the epochs hold %.0f batches, %.0f checkpointed; the counts say %.0f, %.0f", when, batches, done,
                  sn->total, sn->n[BATCH_CHECKPOINTED]);
}

/* Status and batches documents: valid JSON, counts that add up, the in-flight list in step with
 * them (each batch once, in one state), the per-epoch counts too; no fatal end, none on its way. */
static struct snap check_invariants(const char *when)
{
    struct snap sn = { 0 };
    cJSON *s = query(PROTO_Q_STATUS, 0, when);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(s, "state");
    CHECK(cJSON_IsString(st));
    snprintf(sn.state, sizeof sn.state, "%s", st->valuestring);
    if (strcmp(sn.state, "running") && strcmp(sn.state, "paused"))
        TEST_FAIL("%s: cluster state %s (%s): nothing here asks for an end", when, sn.state,
                  cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "reason")));
    CHECK_INT(tc_num(s, "fatal_count"), ==, 0);
    check_counts(cJSON_GetObjectItemCaseSensitive(s, "batches"), &sn, when);
    check_epochs(s, &sn, when);
    sn.ready = tc_num(s, "ring.ready");
    sn.writing = tc_num(s, "ring.writing");
    sn.reading = tc_num(s, "ring.reading");
    CHECK(sn.ready >= 0 && sn.writing >= 0 && sn.reading >= 0);
    CHECK_INT(sn.ready + sn.writing + sn.reading + tc_num(s, "ring.free"), ==, RING_SLOTS);
    sn.ranks = tc_num(s, "group.ranks_connected");
    sn.group_active = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(s, "group"), "active"));
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(s, "daemons"))
        sn.alive_daemons += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "alive"));
    cJSON_Delete(s);

    cJSON *b = query(PROTO_Q_BATCHES, 1u << 24, when);
    struct snap bs = { 0 };
    check_counts(cJSON_GetObjectItemCaseSensitive(b, "batches"), &bs, when);
    check_epochs(b, &bs, when);
    double listed[BATCH_NSTATES] = { 0 };
    uint64_t last = 0;
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(b, "in_flight")) {
        uint64_t id = (uint64_t)tc_num(e, "id");
        if (n++ && id <= last)
            TEST_FAIL("%s: batch %s listed twice or out of order", when, bid(id));
        last = id;
        const char *state = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "state"));
        int k = -1;
        for (int q = BATCH_LEASED; q <= BATCH_TRAINED; q++)
            if (state && !strcmp(state, batch_state_name(q)))
                k = q;
        if (k < 0)
            TEST_FAIL("%s: batch %s in flight in state %s", when, bid(id), state ? state : "(none)");
        listed[k]++;
    }
    for (int q = BATCH_LEASED; q <= BATCH_TRAINED; q++)
        if (listed[q] != bs.n[q])
            TEST_FAIL("%s: %.0f batches listed %s, counted %.0f", when, listed[q], batch_state_name(q), bs.n[q]);
    cJSON_Delete(b);
    return sn;
}

static void base_drafter(int device)
{
    struct client *c = peer_connect(PROTO_ROLE_DRAFTER, device);
    struct proto_group g = tc_join_group(c, 10000);
    char err[256];
    if (!g.generation)
        _exit(10);
    if (g.rank == 0) {
        client_checkpointed(c, 1, g.generation, BASE_DIR);
        struct client_stats st;
        uint64_t end = mono_ms() + 10000 * (uint64_t)test_time_scale();
        do {
            client_idle(c, 20, err, sizeof err);
            client_get_stats(c, &st);
        } while (st.outbox && mono_ms() < end);
        _exit(st.ckpt_accepted_step == 1 ? 0 : 11);
    }
    for (;;)
        client_idle(c, 100, err, sizeof err);
}

/* The lineage starts with a checkpoint at step 1: a CKPT_BAD about any later head falls back
 * to it (or one after it) and never ends the run. */
static void make_base_checkpoint(void)
{
    pid_t d[2];
    fflush(stdout);
    for (int i = 0; i < 2; i++) {
        d[i] = fork();
        CHECK(d[i] >= 0);
        if (d[i] == 0)
            base_drafter(90 + i);
    }
    uint64_t end = mono_ms() + 20000 * (uint64_t)test_time_scale();
    int done = -1, st = 0;
    while (done < 0 && mono_ms() < end) {
        for (int i = 0; i < 2 && done < 0; i++)
            if (waitpid(d[i], &st, WNOHANG) == d[i])
                done = i;
        tc_sleep_ms(20);
    }
    for (int i = 0; i < 2; i++)
        if (i != done)
            tc_kill(d[i]);
    CHECK(done >= 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    cJSON *s = query(PROTO_Q_STATUS, 0, "base checkpoint");
    CHECK_INT(tc_num(s, "group.checkpoint.step"), ==, 1);
    cJSON_Delete(s);
}

static void spawn(int slot)
{
    kid_inc[slot]++;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid) {
        kids[slot] = pid;
        return;
    }
    rng_state = mix64(seed0 ^ mix64(((uint64_t)slot << 32) | (uint64_t)kid_inc[slot])) | 1;
    char path[512];
    snprintf(path, sizeof path, "%s/chaos-%d.log", TC.dir, slot);
    LOG = fopen(path, "a");
    if (LOG)
        setvbuf(LOG, NULL, _IOLBF, 0);
    plog("start: slot %d, incarnation %d", slot, kid_inc[slot]);
    if (slot < N_TARGETS)
        chaos_main(PROTO_ROLE_TARGET, slot);
    else if (slot < SLOT_CTL)
        chaos_main(PROTO_ROLE_DRAFTER, 10 + slot);
    else if (slot == SLOT_CTL)
        chaos_main(PROTO_ROLE_CTL, -1);
    abuser_main();
}

/* A chaos process that ended: by its own exit or a SIGKILL (its own or the parent's), else the
 * test itself went wrong. 1 when it had ended. */
static int reaped(int slot, int wait_ms)
{
    if (kids[slot] <= 0)
        return 1;
    int st;
    pid_t r = waitpid(kids[slot], &st, WNOHANG);
    for (uint64_t end = mono_ms() + (uint64_t)wait_ms; r == 0 && mono_ms() < end; r = waitpid(kids[slot], &st, WNOHANG))
        tc_sleep_ms(10);
    if (r != kids[slot])
        return 0;
    kids[slot] = 0;
    if (WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL)
        TEST_FAIL("chaos process %d (slot %d) died of signal %d", (int)r, slot, WTERMSIG(st));
    if (WIFEXITED(st) && WEXITSTATUS(st))
        TEST_FAIL("chaos process %d (slot %d) exited with %d", (int)r, slot, WEXITSTATUS(st));
    return 1;
}

static int grep_log(const char *pattern)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "grep -E '%s' '%s/coordinator.log' >&2", pattern, TC.dir);
    return system(cmd) == 0;
}

int main(void)
{
    parent_pid = getpid();
    atexit(cleanup);
    const char *env = getenv("DFLASH_CHAOS_SEED");
    seed0 = env && *env ? strtoull(env, NULL, 0) : mix64((uint64_t)time(NULL) ^ mono_ns() ^ ((uint64_t)getpid() << 40));
    printf("chaos seed %" PRIu64 " (DFLASH_CHAOS_SEED=%" PRIu64 " repeats its choices; the timing is the machine's)\n",
           seed0, seed0);
    fflush(stdout);
    rng_state = mix64(seed0) | 1;
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(SH != MAP_FAILED);
    memset(SH, 0, sizeof *SH);
    const int scale = test_time_scale();

    /* Many epochs (the chaos cannot finish the run, so no final drain); dead_after and the
     * collective timeout short, so the ticks' timeouts (silent peers, detached ranks, orphaned
     * publications) happen within the run. */
    tc_setup(NULL, "epochs = 1000\n[drafter]\nworld_size = 2\ncollective_timeout_ms = 100\n"
                   "[coordinator]\ndead_after_ms = 1000\n");
    tc_dataset(TC.data, 400, 8, 100, 500);
    tc_start_coord();
    t0_ms = mono_ms();
    make_base_checkpoint();
    struct snap sn = check_invariants("at the start");
    printf("epoch 0: %.0f batches; base checkpoint at step 1\n", sn.total);

    for (int k = 0; k < N_SLOTS; k++)
        spawn(k);
    uint64_t start = mono_ms(), end = start + 10000ull * (uint64_t)scale, next_check = start + 500;
    int checks = 0, kills = 0, respawns = 0, paused_seen = 0;
    while (mono_ms() < end) {
        coord_alive("during the chaos");
        for (int k = 0; k < N_SLOTS; k++)
            if (reaped(k, 0)) {
                spawn(k);
                respawns++;
            }
        if (mono_ms() >= next_check) {
            sn = check_invariants("during the chaos");
            paused_seen += !strcmp(sn.state, "paused");
            checks++;
            next_check = mono_ms() + 700;
        }
        if (!below(40)) {
            int k = (int)below(N_SLOTS);
            if (kids[k] > 0 && kill(kids[k], SIGKILL) == 0)
                kills++;
        }
        tc_sleep_ms(50);
    }
    atomic_store(&SH->stop, 1);
    for (int k = 0; k < N_SLOTS; k++)
        if (!reaped(k, 5000 * scale)) {
            kill(kids[k], SIGKILL);
            reaped(k, 5000);
        }
    printf("chaos over after %.1f s: %" PRIu64 " frames sent on %" PRIu64 " connections, %" PRIu64 " refusals, %" PRIu64
           " NACKs, %" PRIu64 " grants, %" PRIu64 " GROUPs, %" PRIu64 " RESTARTs, %" PRIu64 " ring publications, %" PRIu64
           " TRAINED, %" PRIu64 " raw abuses, %" PRIu64 " silences; %d respawns, %d kills, %d checks (%d paused)\n",
           (double)(mono_ms() - start) / 1000.0, atomic_load(&SH->sent), atomic_load(&SH->conns),
           atomic_load(&SH->refused), atomic_load(&SH->nacks), atomic_load(&SH->grants), atomic_load(&SH->groups),
           atomic_load(&SH->restarts), atomic_load(&SH->published), atomic_load(&SH->trained),
           atomic_load(&SH->abuses), atomic_load(&SH->silences), respawns, kills, checks, paused_seen);
    coord_alive("after the chaos");
    CHECK_INT(atomic_load(&SH->bad_frames), ==, 0);    /* every frame the coordinator sent decodes */
    CHECK_INT(atomic_load(&SH->bad_json), ==, 0);      /* every REPLY is JSON */
    CHECK_INT(atomic_load(&SH->not_closed), ==, 0);    /* what must be refused was closed */
    CHECK_INT(atomic_load(&SH->not_answered), ==, 0);  /* a slow, valid ctl was answered */
    CHECK_INT(atomic_load(&SH->stops), ==, 0);         /* nobody asked for a drain or a stop */
    CHECK(checks >= 3);
    sn = check_invariants("after the chaos");

    /* Everyone is gone: the ticks take back the dead targets' leases, the slots of dead owners,
     * the group; a publication no slot holds is queued again after its grace. */
    uint64_t settle = mono_ms() + 15000ull * (uint64_t)scale;
    for (;;) {
        sn = check_invariants("settling");
        int quiet = sn.n[BATCH_LEASED] == 0 && sn.writing == 0 && sn.reading == 0 && !sn.group_active &&
                    sn.ranks == 0 && sn.alive_daemons == 0 && sn.n[BATCH_PUBLISHED] <= sn.ready;
        if (quiet)
            break;
        if (mono_ms() > settle)
            TEST_FAIL("not settled: leased %.0f, ring writing %.0f reading %.0f ready %.0f, published %.0f, group %s "
                      "(%.0f ranks), %.0f daemons alive", sn.n[BATCH_LEASED], sn.writing, sn.reading, sn.ready,
                      sn.n[BATCH_PUBLISHED], sn.group_active ? "active" : "ended", sn.ranks, sn.alive_daemons);
        tc_sleep_ms(200);
    }
    printf("settled after %.1f s: %.0f batches (pending %.0f, published %.0f, trained %.0f, checkpointed %.0f), "
           "state %s\n", (double)(mono_ms() - start) / 1000.0, sn.total, sn.n[BATCH_PENDING], sn.n[BATCH_PUBLISHED],
           sn.n[BATCH_TRAINED], sn.n[BATCH_CHECKPOINTED], sn.state);
    tc_sleep_ms(2000 * scale);      /* its ticks run on an idle cluster */
    struct snap last = check_invariants("idle");
    CHECK(last.n[BATCH_CHECKPOINTED] == sn.n[BATCH_CHECKPOINTED]);
    CHECK(!grep_log("lease list out of step|cannot happen"));

    /* SIGTERM drains; with batches trained but not checkpointed and no drafter left to write the
     * final checkpoint the drain waits, and a second SIGTERM stops it (exit 0 either way). */
    CHECK_OK(kill(TC.coord, SIGTERM));
    int rc = tc_exit_status(TC.coord, 3000 * scale), signals = 1;
    if (rc == -1) {
        cJSON *s = query(PROTO_Q_STATUS, 0, "after SIGTERM");
        const char *state = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "state"));
        double trained = tc_num(s, "batches.trained"), leased = tc_num(s, "batches.leased");
        if (!state || strcmp(state, "draining") || trained <= 0)
            TEST_FAIL("still running 3 s after SIGTERM: state %s, %.0f trained, %.0f leased", state ? state : "?",
                      trained, leased);
        cJSON_Delete(s);
        CHECK_OK(kill(TC.coord, SIGTERM));
        signals = 2;
        rc = tc_exit_status(TC.coord, 10000 * scale);
    }
    if (rc != 0) {
        if (rc > 128)
            TEST_FAIL("the coordinator was killed by signal %d at its stop", rc - 128);
        TEST_FAIL("the coordinator exited with %d at its stop (%d SIGTERM)", rc, signals);
    }
    TC.coord = 0;
    printf("stopped by %d SIGTERM: exit 0\n", signals);
    CHECK(access(TC.sock, F_OK) < 0);
    char shm[128];
    snprintf(shm, sizeof shm, "/dev/shm%s", TC.ring);
    CHECK(access(shm, F_OK) < 0);

    /* The ledger holds what the last status said; the batches in flight went back to pending. */
    struct ledger *l;
    char err[512];
    CHECK_OK(ledger_open(&l, TC.ledger, err, sizeof err));
    struct ledger_audit a;
    CHECK_OK(ledger_audit(l, &a));
    ledger_close(l);
    printf("ledger: %" PRIu64 " batches, %" PRIu64 " checkpointed, %" PRIu64 " pending, %" PRIu64 " training rows (%"
           PRIu64 " rolled back)\n", a.total, a.per_state[BATCH_CHECKPOINTED], a.per_state[BATCH_PENDING],
           a.trained_rows, a.rolled_back_rows);
    CHECK_INT(a.total, ==, last.total);
    CHECK_INT(a.per_state[BATCH_CHECKPOINTED], ==, last.n[BATCH_CHECKPOINTED]);
    CHECK_INT(a.per_state[BATCH_PENDING], ==, a.total - a.per_state[BATCH_CHECKPOINTED]);
    passed = 1;
    printf("coordinator chaos ok (seed %" PRIu64 ")\n", seed0);
    return 0;
}
