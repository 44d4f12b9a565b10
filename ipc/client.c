/* client.c: the blocking control-socket client: handshake, heartbeats, at-least-once
 * events with replay after reconnect, lease bookkeeping, pushed-message queue. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include "common/asan.h"
#include "common/err.h"
#include "common/log.h"
#include "common/proc.h"
#include "common/timeutil.h"
#include "ipc/client.h"
#include "ipc/net.h"
#include "ipc/stopnote.h"

#define FAIL(code, ...) do { if (err && errlen) snprintf(err, errlen, __VA_ARGS__); return (code); } while (0)
#define RETURNED_MAX 4096
#define HELD_MAX 32

struct queued {
    struct proto_msg m;
    void *owned;                /* GROUP: its copy of the batch ids (m.ids), freed after it is handed out */
};

struct outbox_ent {
    struct proto_msg m;         /* PUBLISHED / TRAINED / SKIPPED / CHECKPOINTED, seq set */
    int acked;                  /* answered; gone once every entry before it is */
};

struct client {
    struct client_opts o;
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char tcp_address[256];      /* set: connect over TCP, AUTH first */
    uint8_t auth_token[PROTO_AUTH_TOKEN_MAX];
    uint32_t auth_len;
    char where[300];            /* the socket path or "tcp host:port", for messages */
    char name[PROTO_NAME_MAX];
    int fd;
    uint64_t token, start_ticks;
    pid_t pid;
    struct proto_welcome welcome;
    client_welcome_check_fn welcome_check;
    void *welcome_check_arg;

    uint8_t *rx;
    size_t rx_len, rx_cap;

    struct queued *q;           /* pushed messages for the daemon, FIFO */
    size_t q_head, q_len, q_cap;
    char *json;                 /* last REPLY text handed out */
    void *handed;               /* the owned part of the last message handed out */
    uint32_t replies_owed;      /* QUERY/CONTROL sent on this connection and not answered yet: the
                                   answer of one that timed out comes before the next one's */

    struct client_lease *leases;
    size_t n_leases, cap_leases;
    uint32_t want;              /* leases asked for and not granted yet */
    int returning;              /* client_return_leases: grants go back as they arrive */
    uint64_t returned[RETURNED_MAX];
    size_t n_returned;

    struct outbox_ent *out;     /* out[out_head, n_out), in the order sent: a replay keeps it (a
                                   CHECKPOINTED never overtakes the TRAINED it holds) */
    size_t out_head, n_out, cap_out, n_unacked;
    struct proto_msg held[HELD_MAX];    /* errors written while disconnected */
    size_t n_held;
    uint64_t next_seq;

    struct proto_heartbeat hb;
    uint64_t last_hb_ms;

    uint64_t group_gen;         /* 0 = not in a group */
    uint32_t group_rank;
    int join_pending;           /* JOIN_GROUP sent, GROUP not yet received */
    uint64_t next_reconnect_ms;
    int ended;                  /* the stop note was found while disconnected: no more reconnects */
    char refused[PROTO_TEXT_MAX]; /* the welcome check said no: why (no more reconnects either) */
    struct client_stats st;
};

/* ---- small containers ---- */

static int q_push(struct client *c, const struct proto_msg *m)
{
    if (c->q_len == c->q_cap) {
        size_t cap = c->q_cap ? c->q_cap * 2 : 16;
        struct queued *q = malloc(cap * sizeof *q);
        if (!q)
            return -ENOMEM;
        for (size_t i = 0; i < c->q_len; i++)
            q[i] = c->q[(c->q_head + i) % c->q_cap];
        free(c->q);
        c->q = q;
        c->q_cap = cap;
        c->q_head = 0;
    }
    c->q[(c->q_head + c->q_len) % c->q_cap] = (struct queued){ *m, NULL };
    c->q_len++;
    return 0;
}

/* A GROUP goes in the queue with a copy of its batch ids: the frame's bytes are gone once the
 * receive buffer moves on (frames behind it, a reconnect). */
static int q_push_group(struct client *c, struct proto_msg *m)
{
    uint64_t *ids = NULL;
    if (m->group.n_done) {
        if (!(ids = malloc((size_t)m->group.n_done * sizeof *ids)))
            return -ENOMEM;
        memcpy(ids, m->ids, (size_t)m->group.n_done * sizeof *ids);
    }
    m->ids = ids;
    int r = q_push(c, m);
    if (r < 0) {
        free(ids);
        return r;
    }
    c->q[(c->q_head + c->q_len - 1) % c->q_cap].owned = ids;
    return 0;
}

/* Drop a queued, undelivered GRANT for batch; 1 if one was there. */
static int q_drop_grant(struct client *c, uint64_t batch)
{
    for (size_t i = 0; i < c->q_len; i++) {
        struct proto_msg *m = &c->q[(c->q_head + i) % c->q_cap].m;
        if (m->type == PROTO_LEASE_GRANT && m->grant.batch_id == batch) {
            for (size_t k = i; k + 1 < c->q_len; k++)
                c->q[(c->q_head + k) % c->q_cap] = c->q[(c->q_head + k + 1) % c->q_cap];
            c->q_len--;
            return 1;
        }
    }
    return 0;
}

static struct client_lease *lease_get(const struct client *c, uint64_t batch)
{
    for (size_t i = 0; i < c->n_leases; i++)
        if (c->leases[i].batch_id == batch)
            return &c->leases[i];
    return NULL;
}

/* The entries past n_leases keep their sample buffers: once warm, a grant allocates nothing.
 * Under ASan a kept buffer is poisoned until a grant takes it: a use of a lease's samples after
 * the lease ended trips ASan instead of reading another grant's samples. */
static void lease_drop(struct client *c, uint64_t batch)
{
    struct client_lease *l = lease_get(c, batch);
    if (!l)
        return;
    struct client_lease gone = *l;
    *l = c->leases[--c->n_leases];
    c->leases[c->n_leases] = (struct client_lease){ .samples = gone.samples, .samples_cap = gone.samples_cap };
    df_poison(gone.samples, (size_t)gone.samples_cap * sizeof *gone.samples);
}

static struct client_lease *lease_add(struct client *c, const struct proto_msg *m)
{
    if (c->n_leases == c->cap_leases) {
        size_t cap = c->cap_leases ? c->cap_leases * 2 : 8;
        struct client_lease *p = realloc(c->leases, cap * sizeof *c->leases);
        if (!p)
            return NULL;
        memset(p + c->cap_leases, 0, (cap - c->cap_leases) * sizeof *p);
        c->leases = p;
        c->cap_leases = cap;
    }
    struct client_lease *l = &c->leases[c->n_leases];
    uint32_t n = m->grant.n_samples;
    df_unpoison(l->samples, (size_t)l->samples_cap * sizeof *l->samples);
    if (l->samples_cap < n) {
        uint32_t cap = n < 256 ? 256 : n;
        uint32_t *s = realloc(l->samples, (size_t)cap * 4);
        if (!s)
            return NULL;
        l->samples = s;
        l->samples_cap = cap;
    }
    memcpy(l->samples, m->samples, (size_t)n * 4);
    *l = (struct client_lease){ m->grant.batch_id, m->grant.epoch, n, m->grant.n_tokens, m->grant.max_seq_len,
                                m->grant.lease, l->samples, l->samples_cap };
    c->n_leases++;
    return l;
}


static int send_msg(struct client *c, const struct proto_msg *m);
static int send_soft(struct client *c, const struct proto_msg *m);

/* LEASE_RETURN of a lease no longer held here, remembered so that a reconnect's re-grant of it
 * goes back too. soft: send_soft (may reconnect first); else send_msg, as a frame handler must. */
static int send_return(struct client *c, uint64_t batch, int soft)
{
    c->returned[c->n_returned++ % RETURNED_MAX] = batch;    /* the newest kept: those a break may have lost */
    struct proto_msg m = { .type = PROTO_LEASE_RETURN, .batch.batch_id = batch };
    return soft ? send_soft(c, &m) : send_msg(c, &m);
}

static int was_returned(const struct client *c, uint64_t batch)
{
    for (size_t i = 0; i < c->n_returned && i < RETURNED_MAX; i++)
        if (c->returned[i] == batch)
            return 1;
    return 0;
}

static void reverse_u64(uint64_t *a, size_t n)
{
    for (size_t i = 0; i < n / 2; i++) {
        uint64_t t = a[i];
        a[i] = a[n - 1 - i];
        a[n - 1 - i] = t;
    }
}

/* A batch granted again after it was returned: held now, so not to go back with a reconnect's
 * re-grant (the rest kept, oldest first). */
static void returned_forget(struct client *c, uint64_t batch)
{
    if (!was_returned(c, batch))
        return;
    size_t n = c->n_returned, k = 0;
    if (n > RETURNED_MAX) {     /* wrapped: rotate the oldest (at n % MAX) to the front first */
        size_t s = n % RETURNED_MAX;
        reverse_u64(c->returned, s);
        reverse_u64(c->returned + s, RETURNED_MAX - s);
        reverse_u64(c->returned, RETURNED_MAX);
        n = RETURNED_MAX;
    }
    for (size_t i = 0; i < n; i++)
        if (c->returned[i] != batch)
            c->returned[k++] = c->returned[i];
    c->n_returned = k;
}

static int outbox_has_publish(const struct client *c, uint64_t batch)
{
    for (size_t i = c->out_head; i < c->n_out; i++)
        if (!c->out[i].acked && c->out[i].m.type == PROTO_PUBLISHED && c->out[i].m.published.batch_id == batch)
            return 1;
    return 0;
}

/* ---- socket I/O ---- */

static void disconnect(struct client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->rx_len = 0;
    c->replies_owed = 0;        /* answers die with the connection */
    c->next_reconnect_ms = mono_ms() + (uint64_t)c->o.reconnect_ms;
}

static int send_msg(struct client *c, const struct proto_msg *m)
{
    if (c->fd < 0)
        return -ENOTCONN;
    uint8_t buf[1024];
    int64_t n = proto_encode(m, buf, sizeof buf, NULL, 0);
    if (n < 0)
        return (int)n;
    size_t off = 0;
    while (off < (size_t)n) {
        ssize_t k = send(c->fd, buf + off, (size_t)n - off, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            int r = -errno;
            disconnect(c);
            return r;
        }
        off += (size_t)k;
    }
    return 0;
}

/* Wait up to timeout_ms for bytes and append them to rx. 1 = got bytes, 0 = timeout,
 * <0 = connection lost (disconnected). */
static int rx_fill(struct client *c, int timeout_ms)
{
    if (c->fd < 0)
        return -ENOTCONN;
    if (timeout_ms != 0) {  /* (no wait: the recv below says as much, one syscall fewer) */
        struct pollfd p = { .fd = c->fd, .events = POLLIN };
        int r = poll(&p, 1, timeout_ms);
        if (r < 0)
            return errno == EINTR ? 0 : -errno;
        if (r == 0)
            return 0;
    }
    if (c->rx_cap - c->rx_len < 65536) {
        size_t cap = c->rx_cap ? c->rx_cap * 2 : 131072;
        if (cap > PROTO_MAX_FRAME + 65536)
            cap = PROTO_MAX_FRAME + 65536;
        if (cap > c->rx_cap) {
            void *b = realloc(c->rx, cap);
            if (!b)
                return -ENOMEM;
            c->rx = b;
            c->rx_cap = cap;
        }
    }
    ssize_t k = recv(c->fd, c->rx + c->rx_len, c->rx_cap - c->rx_len, MSG_DONTWAIT);
    if (k > 0) {
        c->rx_len += (size_t)k;
        return 1;
    }
    if (k < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    disconnect(c);
    return -EPIPE;
}

/* Decode the first complete frame in rx into *m (pointers into rx). Returns its size,
 * 0 if incomplete, <0 on a bad frame (connection dropped). Consume with rx_consume. */
static int64_t rx_peek(struct client *c, struct proto_msg *m, char *err, size_t errlen)
{
    int64_t n = proto_frame_size(c->rx, c->rx_len, err, errlen);
    if (n == 0 || (n > 0 && (size_t)n > c->rx_len))
        return 0;
    int r = n < 0 ? (int)n : proto_decode(c->rx, (size_t)n, m, err, errlen);
    if (r < 0) {
        disconnect(c);
        return r;
    }
    return n;
}

static void rx_consume(struct client *c, int64_t n)
{
    memmove(c->rx, c->rx + n, c->rx_len - (size_t)n);
    c->rx_len -= (size_t)n;
}

/* Wait for one frame (any type) until deadline; *m valid until rx_consume. */
static int64_t rx_wait(struct client *c, uint64_t deadline_ms, struct proto_msg *m, char *err, size_t errlen)
{
    for (;;) {
        int64_t n = rx_peek(c, m, err, errlen);
        if (n != 0)
            return n;
        uint64_t now = mono_ms();
        if (now >= deadline_ms)
            FAIL(-DF_ETIMEOUT, "no answer from the coordinator within %d ms", c->o.reply_timeout_ms);
        int r = rx_fill(c, (int)(deadline_ms - now));
        if (r < 0)
            FAIL(r, "connection to %s lost: %s", c->where, err_str(r));
    }
}

/* Frames the daemon never sees are handled here; others are queued. */
static int handle_frame(struct client *c, const struct proto_msg *m, char *err, size_t errlen)
{
    struct proto_msg cp = *m;
    switch (m->type) {
    case PROTO_ACK:
        for (size_t i = c->out_head; i < c->n_out; i++) {
            uint64_t seq = c->out[i].m.published.seq;   /* seq is the first field of every event */
            if (!c->out[i].acked && seq == m->ack.seq) {
                const struct proto_msg *e = &c->out[i].m;
                if (e->type == PROTO_CHECKPOINTED && !m->ack.status &&
                    (e->checkpointed.generation != c->st.ckpt_accepted_gen ||
                     (int64_t)e->checkpointed.step > c->st.ckpt_accepted_step)) {
                    c->st.ckpt_accepted_step = (int64_t)e->checkpointed.step;
                    c->st.ckpt_accepted_gen = e->checkpointed.generation;
                }
                if (e->type == PROTO_CHECKPOINTED && m->ack.status) {
                    c->st.ckpt_refusals++;
                    c->st.ckpt_refused_step = (int64_t)e->checkpointed.step;
                    c->st.ckpt_refused_gen = e->checkpointed.generation;
                }
                c->out[i].acked = 1;
                c->n_unacked--;
                while (c->out_head < c->n_out && c->out[c->out_head].acked)
                    c->out_head++;
                if (c->out_head == c->n_out)
                    c->out_head = c->n_out = 0;
                c->st.events_acked++;
                break;
            }
        }
        if (m->ack.status) {
            c->st.nacks++;
            c->st.last_nack_status = m->ack.status;
        }
        return 0;
    case PROTO_LEASE_GRANT: {
        if (lease_get(c, m->grant.batch_id))
            return 0;
        if (c->returning) {     /* leaving: straight back, without a reconnect in here */
            send_return(c, m->grant.batch_id, 0);
            return 0;
        }
        struct client_lease *l = lease_add(c, m);
        if (!l)
            return -ENOMEM;
        returned_forget(c, m->grant.batch_id);
        if (c->want)
            c->want--;
        cp.samples = l->samples;
        return q_push(c, &cp);
    }
    case PROTO_LEASE_REVOKE:
        if (!lease_get(c, m->batch.batch_id))
            return 0;
        int queued_grant = q_drop_grant(c, m->batch.batch_id);
        lease_drop(c, m->batch.batch_id);
        return queued_grant ? 0 : q_push(c, &cp);
    case PROTO_GROUP:
        c->group_gen = m->group.generation;
        c->group_rank = m->group.rank;
        c->join_pending = 0;
        return q_push_group(c, &cp);
    case PROTO_RESTART:
        c->group_gen = 0;
        c->group_rank = PROTO_NONE32;
        return q_push(c, &cp);
    case PROTO_CONTROL:
        return q_push(c, &cp);
    case PROTO_REFUSE:
        disconnect(c);
        FAIL(-DF_EPEER, "refused by the coordinator: %s", m->refuse.message);
    case PROTO_REPLY:
        if (c->replies_owed)    /* a late answer to a request that timed out */
            c->replies_owed--;
        return 0;   /* only client_request waits for these */
    default:
        disconnect(c);
        FAIL(-DF_EPEER, "unexpected %s from the coordinator", proto_type_name(m->type));
    }
}

/* connect + HELLO + WELCOME + regrants + replay. 0, or <0 (disconnected again). */
static int connect_unix(struct client *c, char *err, size_t errlen)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        FAIL(-errno, "socket: %s", strerror(errno));
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    memcpy(sa.sun_path, c->socket_path, sizeof sa.sun_path);
    /* A listener whose queue is full (one that does not accept: stalled, or not a coordinator)
     * keeps a unix connect() asleep for the send timeout: forever without one. */
    struct timeval tv = { c->o.reply_timeout_ms / 1000, (c->o.reply_timeout_ms % 1000) * 1000 };
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int r = -errno;
        close(fd);
        if (r == -EAGAIN || r == -EINPROGRESS)
            FAIL(-EAGAIN, "cannot connect to %s: no connection taken for %d ms (its queue is full: the coordinator "
                 "is stalled, or this is not a coordinator's socket)", c->socket_path, c->o.reply_timeout_ms);
        struct stat st;
        if (r == -ECONNREFUSED && stat(c->socket_path, &st) == 0 && !S_ISSOCK(st.st_mode))
            FAIL(r, "cannot connect to %s: not a socket (a %s)", c->socket_path,
                 S_ISDIR(st.st_mode) ? "folder" : S_ISREG(st.st_mode) ? "file" : "special file");
        FAIL(r, "cannot connect to %s: %s%s", c->socket_path, strerror(-r),
             r == -EACCES ? " (the socket admits the coordinator's user and the members of its cluster.group)"
             : r == -ECONNREFUSED ? " (nothing listens there: no coordinator runs on it)" : "");
    }
    return fd;
}

/* A REFUSE is final (-DF_EPEER: the daemon stops rather than spin), but for -EAGAIN: the
 * coordinator's own shortage for now (a descriptor, memory; its connections waiting for a HELLO
 * at their limit), asked again as a coordinator not there yet is. */
static int refused_code(const struct proto_refuse *rf)
{
    return rf->code == -EAGAIN ? -EAGAIN : -DF_EPEER;
}

static int handshake(struct client *c, int first, char *err, size_t errlen)
{
    int fd = c->tcp_address[0] ? net_connect(c->tcp_address, c->o.reply_timeout_ms, err, errlen)
                               : connect_unix(c, err, errlen);
    if (fd < 0)
        return fd;
    struct timeval tv = { c->o.reply_timeout_ms / 1000, (c->o.reply_timeout_ms % 1000) * 1000 };
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    c->fd = fd;
    c->rx_len = 0;

    struct proto_msg m = { .type = PROTO_HELLO };
    m.hello = (struct proto_hello){ .role = c->o.role, .device = c->o.device, .pid = (uint32_t)c->pid,
                                    .group_rank = c->group_gen ? c->group_rank : PROTO_NONE32,
                                    .start_ticks = c->start_ticks, .token = c->token,
                                    .group_generation = c->group_gen };
    proto_strset(m.hello.name, sizeof m.hello.name, c->name);
    /* Over TCP: AUTH, then HELLO, in one write. */
    uint8_t hello[2 * sizeof(struct proto_hdr) + sizeof(struct proto_auth) + sizeof(struct proto_hello)];
    size_t len = 0;
    int r = 0;
    if (c->tcp_address[0]) {
        struct proto_msg a = { .type = PROTO_AUTH, .auth.len = c->auth_len };
        memcpy(a.auth.token, c->auth_token, sizeof a.auth.token);
        r = (int)proto_encode(&a, hello, sizeof hello, err, errlen);
        explicit_bzero(&a, sizeof a);
        len = r > 0 ? (size_t)r : 0;
    }
    if (r >= 0)
        r = (int)proto_encode(&m, hello + len, sizeof hello - len, err, errlen);
    if (r < 0) {
        explicit_bzero(hello, sizeof hello);
        disconnect(c);
        return r;
    }
    len += (size_t)r;
    ssize_t sent = send(fd, hello, len, MSG_NOSIGNAL);
    explicit_bzero(hello, sizeof hello);
    if (sent != (ssize_t)len) {
        r = sent < 0 ? -errno : -EIO;   /* a short send sets no errno */
        /* Refused on accept (e.g. SO_PEERCRED): the reason is still readable. */
        uint8_t buf[1024];
        struct pollfd p = { .fd = fd, .events = POLLIN };
        ssize_t k = poll(&p, 1, 1000) > 0 ? recv(fd, buf, sizeof buf, MSG_DONTWAIT) : -1;
        struct proto_msg in;
        disconnect(c);
        if (k > 0 && proto_decode(buf, (size_t)k, &in, NULL, 0) == 0 && in.type == PROTO_REFUSE)
            FAIL(refused_code(&in.refuse), "refused by the coordinator: %s", in.refuse.message);
        FAIL(r, "cannot send HELLO to %s: %s", c->where, err_str(r));
    }
    uint64_t deadline = mono_ms() + (uint64_t)c->o.reply_timeout_ms;
    struct proto_msg in;
    int64_t n = rx_wait(c, deadline, &in, err, errlen);
    if (n < 0) {
        disconnect(c);
        return (int)n;
    }
    if (in.type == PROTO_REFUSE) {
        disconnect(c);
        FAIL(refused_code(&in.refuse), "refused by the coordinator: %s", in.refuse.message);
    }
    if (in.type != PROTO_WELCOME) {
        disconnect(c);
        FAIL(-DF_EPEER, "coordinator answered HELLO with %s", proto_type_name(in.type));
    }
    if (!first && c->welcome_check) {
        char why[PROTO_TEXT_MAX + 1];   /* (one more: a text cut to fit is seen to be) */
        snprintf(why, sizeof why, "the welcome check refused the coordinator");
        if ((r = c->welcome_check(c->welcome_check_arg, &in.welcome, why, sizeof why)) < 0) {
            /* before any replay: nothing of this connection's past goes to this coordinator */
            struct proto_msg e = { .type = PROTO_ERROR };
            e.error.code = r;
            proto_textset(e.error.message, sizeof e.error.message, why);
            send_msg(c, &e);
            /* and its last word: the daemon exits (1, to be restarted) with this connection's end */
            struct proto_msg b = { .type = PROTO_BYE };
            b.bye.exit_status = 1;
            proto_textset(b.bye.reason, sizeof b.bye.reason, why);
            send_msg(c, &b);
            disconnect(c);
            proto_textset(c->refused, sizeof c->refused, why);      /* no more reconnects */
            FAIL(-DF_EPEER, "%s", why);
        }
    }
    c->welcome = in.welcome;
    rx_consume(c, n);

    /* Re-granted leases: what the coordinator still counts as ours. The list grows with the
     * frames that really arrive: n_regrants is the peer's word and sizes nothing by itself. */
    uint64_t *kept = NULL;
    size_t cap_kept = 0;
    for (uint32_t i = 0; i < c->welcome.n_regrants; i++) {
        if ((n = rx_wait(c, deadline, &in, err, errlen)) < 0) {
            free(kept);
            disconnect(c);
            return (int)n;
        }
        if (in.type != PROTO_LEASE_GRANT) {
            free(kept);
            disconnect(c);
            FAIL(-DF_EPEER, "expected %u re-granted leases, got %s", c->welcome.n_regrants, proto_type_name(in.type));
        }
        if (i == cap_kept) {
            size_t cap = cap_kept ? 2 * cap_kept : 64;
            uint64_t *k = realloc(kept, cap * sizeof *k);
            if (!k) {
                free(kept);
                disconnect(c);
                return -ENOMEM;
            }
            kept = k;
            cap_kept = cap;
        }
        kept[i] = in.grant.batch_id;
        uint64_t b = in.grant.batch_id;
        const struct client_lease *held = lease_get(c, b);
        if (held && held->lease != in.grant.lease && !was_returned(c, b)) {
            /* Revoked and granted again while the connection was down (a rollback queued it):
             * the copy packed under the old number must not be published as the new one's. */
            struct proto_msg rv = { .type = PROTO_LEASE_REVOKE, .batch.batch_id = b };
            handle_frame(c, &rv, NULL, 0);
            held = NULL;
        }
        if (was_returned(c, b)) {
            send_return(c, b, 0);
        } else if (!held && !outbox_has_publish(c, b)) {
            /* Granted before the connection broke but never received: take it now. */
            r = handle_frame(c, &in, err, errlen);
            if (r < 0) {
                free(kept);
                disconnect(c);      /* the rest of the handshake is unread: the next one redoes it */
                return r;
            }
        }
        if (c->fd < 0) {    /* a send above lost the connection (and the received bytes with it) */
            free(kept);
            FAIL(-ENOTCONN, "connection to %s lost while its leases were re-granted", c->where);
        }
        rx_consume(c, n);
    }
    for (size_t i = 0; i < c->n_leases;) {
        uint64_t b = c->leases[i].batch_id;
        int found = 0;
        for (uint32_t k = 0; k < c->welcome.n_regrants && !found; k++)
            found = kept[k] == b;
        if (found || first) {
            i++;
            continue;
        }
        struct proto_msg rv = { .type = PROTO_LEASE_REVOKE, .batch.batch_id = b };
        handle_frame(c, &rv, NULL, 0);  /* drops the lease, tells the daemon */
    }
    free(kept);
    c->n_returned = 0;

    for (size_t i = c->out_head; i < c->n_out; i++) {
        if (c->out[i].acked)
            continue;
        if ((r = send_msg(c, &c->out[i].m)) < 0)
            FAIL(r, "replay to %s: %s", c->where, err_str(r));
        c->st.events_replayed++;
    }
    for (size_t i = 0; i < c->n_held; i++)
        if ((r = send_msg(c, &c->held[i])) < 0)
            FAIL(r, "replay to %s: %s", c->where, err_str(r));
    c->n_held = 0;
    if (c->want) {
        struct proto_msg lr = { .type = PROTO_LEASE_REQUEST, .lease_request.n = c->want };
        if ((r = send_msg(c, &lr)) < 0)
            return r;
    }
    if (c->join_pending) {
        struct proto_msg j = { .type = PROTO_JOIN_GROUP };
        if ((r = send_msg(c, &j)) < 0)
            return r;
    }
    c->last_hb_ms = 0;
    if (!first) {
        c->st.reconnects++;
        struct proto_msg w = { .type = PROTO_WELCOME, .welcome = c->welcome };
        q_push(c, &w);
    }
    return 0;
}

static int maybe_reconnect(struct client *c, char *err, size_t errlen)
{
    if (c->fd >= 0)
        return 0;
    if (c->refused[0])
        FAIL(-DF_EPEER, "%s", c->refused);
    uint64_t now = mono_ms();
    if (now < c->next_reconnect_ms)
        return -ENOTCONN;
    c->next_reconnect_ms = now + (uint64_t)c->o.reconnect_ms;  /* a caller waiting sleeps till then */
    if (c->ended)
        return -ESHUTDOWN;
    char why[256];
    int r = handshake(c, 0, why, sizeof why);
    if (r == -DF_EPEER)
        FAIL(r, "%s", why);  /* refused: the daemon must stop, not spin */
    if ((r == -ENOENT || r == -ECONNREFUSED) && c->o.stop_note && !c->tcp_address[0] &&
        stop_note_read(c->socket_path, why, sizeof why)) {
        /* The coordinator ended the cluster while we were away: what its STOP would have said. */
        struct proto_msg m = { .type = PROTO_CONTROL, .control.cmd = PROTO_CTL_STOP };
        snprintf(m.control.reason, sizeof m.control.reason, "missed while disconnected (stop note: %.*s)",
                 PROTO_TEXT_MAX - 48, why);
        if (q_push(c, &m) < 0)
            return -ENOMEM;
        c->ended = 1;
        return -ESHUTDOWN;
    }
    return r;
}

void client_heartbeat_due(struct client *c)
{
    uint64_t now = mono_ms();
    if (c->fd >= 0 && c->welcome.heartbeat_ms && now - c->last_hb_ms >= c->welcome.heartbeat_ms)
        client_heartbeat_now(c);
}

/* ---- public ---- */

int client_open(struct client **out, const struct client_opts *o, char *err, size_t errlen)
{
    *out = NULL;
    if (o->tcp_address && *o->tcp_address) {
        if (o->role != PROTO_ROLE_CTL)
            FAIL(-EINVAL, "only dflashctl (role ctl) connects over TCP: targets and drafters need the local ring");
        if (strlen(o->tcp_address) >= sizeof(((struct client *)0)->tcp_address))
            FAIL(-ENAMETOOLONG, "%s: address too long", o->tcp_address);
        if (!o->auth_token || o->auth_token_len < PROTO_AUTH_TOKEN_MIN || o->auth_token_len > PROTO_AUTH_TOKEN_MAX)
            FAIL(-EINVAL, "a TCP connection needs a token of %d to %d bytes", PROTO_AUTH_TOKEN_MIN, PROTO_AUTH_TOKEN_MAX);
    } else {
        if (!o->socket_path || !*o->socket_path)
            FAIL(-EINVAL, "no control socket path");
        if (strlen(o->socket_path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
            FAIL(-ENAMETOOLONG, "%s: socket path too long", o->socket_path);
    }
    struct client *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->st.ckpt_accepted_step = -1;
    c->st.ckpt_refused_step = -1;
    c->o = *o;
    if (!c->o.reply_timeout_ms)
        c->o.reply_timeout_ms = 5000;
    if (!c->o.reconnect_ms)
        c->o.reconnect_ms = 100;
    c->fd = -1;
    c->group_rank = PROTO_NONE32;
    c->next_seq = 1;
    if (o->tcp_address && *o->tcp_address) {
        snprintf(c->tcp_address, sizeof c->tcp_address, "%s", o->tcp_address);
        memcpy(c->auth_token, o->auth_token, o->auth_token_len);
        c->auth_len = (uint32_t)o->auth_token_len;
        snprintf(c->where, sizeof c->where, "tcp %s", o->tcp_address);
    } else {
        snprintf(c->socket_path, sizeof c->socket_path, "%s", o->socket_path);
        snprintf(c->where, sizeof c->where, "%s", o->socket_path);
    }
    /* The caller's pointers need not outlive this call. */
    c->o.socket_path = c->o.tcp_address = NULL;
    c->o.auth_token = NULL;
    if (o->name)
        snprintf(c->name, sizeof c->name, "%s", o->name);
    else
        snprintf(c->name, sizeof c->name, "%s@%d", proto_role_name(o->role), o->device);
    c->pid = getpid();
    int r = proc_start_time(c->pid, &c->start_ticks);
    if (r == 0)
        r = proc_self_token(&c->token);
    if (r < 0) {
        free(c);
        FAIL(r, "cannot read this process's start time: %s", err_str(r));
    }
    uint64_t deadline = mono_ms() + (uint64_t)(o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 0);
    for (;;) {
        r = handshake(c, 1, err, errlen);
        if (r == 0)
            break;
        int retry = (r == -ENOENT || r == -ECONNREFUSED || r == -EAGAIN) && mono_ms() < deadline;
        if (!retry) {
            client_free(c);
            return r;
        }
        usleep(20000);
    }
    *out = c;
    return 0;
}

void client_free(struct client *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    for (size_t i = 0; i < c->cap_leases; i++)
        free(c->leases[i].samples);
    free(c->leases);
    free(c->out);
    for (size_t i = 0; i < c->q_len; i++)
        free(c->q[(c->q_head + i) % c->q_cap].owned);
    free(c->q);
    free(c->rx);
    free(c->json);
    free(c->handed);
    explicit_bzero(c->auth_token, sizeof c->auth_token);
    free(c);
}

const struct proto_welcome *client_welcome(const struct client *c) { return &c->welcome; }
int client_connected(const struct client *c) { return c->fd >= 0; }
int client_ended(const struct client *c) { return c->ended; }

int client_interrupt_queued(const struct client *c)
{
    for (size_t i = 0; i < c->q_len; i++) {
        const struct proto_msg *m = &c->q[(c->q_head + i) % c->q_cap].m;
        if (m->type == PROTO_RESTART || (m->type == PROTO_CONTROL && m->control.cmd == PROTO_CTL_STOP))
            return (int)m->type;
    }
    return 0;
}
int client_fd(const struct client *c) { return c->fd; }

void client_get_stats(const struct client *c, struct client_stats *st)
{
    *st = c->st;
    st->outbox = (uint32_t)c->n_unacked;
    st->leases_held = (uint32_t)c->n_leases;
    st->leases_wanted = c->want;
}

void client_set_heartbeat(struct client *c, const struct proto_heartbeat *hb) { c->hb = *hb; }

void client_set_welcome_check(struct client *c, client_welcome_check_fn fn, void *arg)
{
    c->welcome_check = fn;
    c->welcome_check_arg = arg;
}

int client_heartbeat_now(struct client *c)
{
    struct proto_msg m = { .type = PROTO_HEARTBEAT, .heartbeat = c->hb };
    m.heartbeat.leases_held = (uint32_t)c->n_leases;
    if (m.heartbeat.state >= PROTO_STATE_MAX)
        m.heartbeat.state = PROTO_STATE_RUNNING;
    c->last_hb_ms = mono_ms();
    int r = send_msg(c, &m);
    return r == -ENOTCONN ? 0 : r;
}

/* Send now, or leave for the reconnect; never an error for a lost connection (whatever the
 * send failed with: a reset, a timeout of SO_SNDTIMEO, ... send_msg hung up on all of them). */
static int send_soft(struct client *c, const struct proto_msg *m)
{
    maybe_reconnect(c, NULL, 0);
    client_heartbeat_due(c);
    int r = send_msg(c, m);
    return r < 0 && c->fd < 0 ? 0 : r;
}

/* Send now, or hold for the next connection: errors are not events (no ACK, no seq) but must
 * not vanish with the connection (a NaN must still pause the cluster). When more than HELD_MAX
 * pile up the oldest goes. */
/* An event or report the encoder refuses (a lease number 0 read from a spoiled slot, a checkpoint
 * path with a control character) must not be kept to send again: it would stay there, and every
 * replay would stop at it (the rest of a reconnect's handshake unsent). Said once, here. */
static int encodable(const struct proto_msg *m)
{
    _Alignas(8) uint8_t probe[sizeof(struct proto_hdr) + sizeof(struct proto_msg)];
    char why[200];
    int64_t n = proto_encode(m, probe, sizeof probe, why, sizeof why);
    if (n < 0)
        log_error((int)n, "%s: not sent: %s", proto_type_name(m->type), why);
    return n < 0 ? (int)n : 0;
}

static int send_held(struct client *c, const struct proto_msg *m)
{
    int r = encodable(m);
    if (r < 0)
        return r;
    maybe_reconnect(c, NULL, 0);
    client_heartbeat_due(c);
    r = send_msg(c, m);
    if (r >= 0 || c->fd >= 0)
        return r;
    if (c->n_held == HELD_MAX) {
        memmove(c->held, c->held + 1, (HELD_MAX - 1) * sizeof c->held[0]);
        c->n_held--;
    }
    c->held[c->n_held++] = *m;
    return 0;
}

static int send_event(struct client *c, struct proto_msg *m)
{
    int r = encodable(m);
    if (r < 0)
        return r;
    if (c->n_out == c->cap_out && c->out_head > 0) {   /* the answered ones at the front make room */
        memmove(c->out, c->out + c->out_head, (c->n_out - c->out_head) * sizeof *c->out);
        c->n_out -= c->out_head;
        c->out_head = 0;
    }
    if (c->n_out == c->cap_out) {
        size_t cap = c->cap_out ? c->cap_out * 2 : 32;
        void *p = realloc(c->out, cap * sizeof *c->out);
        if (!p)
            return -ENOMEM;
        c->out = p;
        c->cap_out = cap;
    }
    m->published.seq = c->next_seq++;   /* seq is the first field of every event struct */
    c->out[c->n_out++] = (struct outbox_ent){ .m = *m };
    c->n_unacked++;
    c->st.events_sent++;
    return send_soft(c, m);
}

int client_lease_request(struct client *c, uint32_t n)
{
    if (n == 0 || n > PROTO_MAX_LEASE_REQUEST)
        return -EINVAL;
    c->want += n;
    struct proto_msg m = { .type = PROTO_LEASE_REQUEST, .lease_request.n = n };
    return send_soft(c, &m);
}

int client_lease_return(struct client *c, uint64_t batch)
{
    if (!lease_get(c, batch))
        return -ENOENT;
    lease_drop(c, batch);
    return send_return(c, batch, 1);
}

int client_return_leases(struct client *c)
{
    int n = 0;
    c->returning = 1;
    c->want = 0;
    while (c->n_leases) {
        uint64_t batch = c->leases[c->n_leases - 1].batch_id;
        q_drop_grant(c, batch);
        lease_drop(c, batch);
        send_return(c, batch, 1);
        n++;
    }
    return n;
}

int client_batch_skipped(struct client *c, uint64_t batch, uint32_t lease)
{
    struct proto_msg m = { .type = PROTO_SKIPPED };
    m.skipped = (struct proto_skipped){ 0, batch, lease, 0 };
    return send_event(c, &m);
}

int client_published(struct client *c, uint64_t batch, uint32_t slot, uint32_t n_tokens)
{
    lease_drop(c, batch);
    struct proto_msg m = { .type = PROTO_PUBLISHED };
    m.published = (struct proto_published){ 0, batch, slot, n_tokens };
    return send_event(c, &m);
}

int client_join_group(struct client *c)
{
    c->join_pending = 1;
    c->group_gen = 0;
    struct proto_msg m = { .type = PROTO_JOIN_GROUP };
    return send_soft(c, &m);
}

int client_trained(struct client *c, uint64_t batch, uint32_t lease, uint64_t step, uint32_t rank,
                   uint64_t generation)
{
    struct proto_msg m = { .type = PROTO_TRAINED };
    m.trained = (struct proto_trained){ 0, batch, step, generation, rank, lease };
    return send_event(c, &m);
}

int client_checkpointed(struct client *c, uint64_t step, uint64_t generation, const char *dir)
{
    if (!dir || !*dir || strlen(dir) >= PROTO_PATH_MAX)
        return -EINVAL;
    struct proto_msg m = { .type = PROTO_CHECKPOINTED };
    m.checkpointed.step = step;
    m.checkpointed.generation = generation;
    proto_strset(m.checkpointed.dir, sizeof m.checkpointed.dir, dir);
    return send_event(c, &m);
}

int client_ckpt_bad(struct client *c, uint64_t generation, uint64_t step, const char *dir, int code,
                    const char *reason)
{
    struct proto_msg m = { .type = PROTO_CKPT_BAD };
    m.ckpt_bad.generation = generation;
    m.ckpt_bad.step = step;
    m.ckpt_bad.code = code < 0 ? code : -DF_EFORMAT;
    proto_strset(m.ckpt_bad.dir, sizeof m.ckpt_bad.dir, dir);
    proto_textset(m.ckpt_bad.reason, sizeof m.ckpt_bad.reason, reason);
    return send_held(c, &m);
}

/* A message's text field from a printf format: cut to fit, ending in "..." when cut. */
__attribute__((format(printf, 3, 0))) static void text_set(char *dst, size_t cap, const char *fmt, va_list ap)
{
    char text[PROTO_TEXT_MAX + 1];      /* (one more: a text that does not fit is seen to be cut) */
    vsnprintf(text, sizeof text, fmt, ap);
    proto_textset(dst, cap, text);
}

int client_error(struct client *c, int fatal, int code, const char *fmt, ...)
{
    struct proto_msg m = { .type = PROTO_ERROR };
    m.error.fatal = fatal ? 1 : 0;
    m.error.code = code;
    va_list ap;
    va_start(ap, fmt);
    text_set(m.error.message, sizeof m.error.message, fmt, ap);
    va_end(ap);
    return send_held(c, &m);
}

int client_error_nan(struct client *c, uint64_t step, const char *text)
{
    struct proto_msg m = { .type = PROTO_ERROR };
    m.error.code = -DF_ENAN;
    m.error.step = step;
    proto_textset(m.error.message, sizeof m.error.message, text);
    return send_held(c, &m);
}

int client_bye(struct client *c, int exit_status, const char *fmt, ...)
{
    struct proto_msg m = { .type = PROTO_BYE };
    m.bye.exit_status = (uint32_t)exit_status & 0xff;
    va_list ap;
    va_start(ap, fmt);
    text_set(m.bye.reason, sizeof m.bye.reason, fmt, ap);
    va_end(ap);
    return send_msg(c, &m);
}

const struct client_lease *client_lease_find(const struct client *c, uint64_t batch) { return lease_get(c, batch); }
int client_lease_held(const struct client *c, uint64_t batch) { return lease_get(c, batch) != NULL; }
uint32_t client_leases_held(const struct client *c) { return (uint32_t)c->n_leases; }

/* client_poll, and with msg NULL client_idle: pushed messages then stay queued. */
static int service(struct client *c, int timeout_ms, struct proto_msg *msg, char *err, size_t errlen)
{
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : mono_ms() + (uint64_t)timeout_ms;
    int drained = 0;
    for (;;) {
        int r = maybe_reconnect(c, err, errlen);
        if (r == -DF_EPEER || r == -ENOMEM)
            return r;
        client_heartbeat_due(c);
        /* Handle every complete frame already received. */
        while (c->fd >= 0) {
            struct proto_msg in;
            int64_t n = rx_peek(c, &in, err, errlen);
            if (n == 0)
                break;
            if (n < 0)
                break;      /* bad frame: dropped the connection; reconnect later */
            r = handle_frame(c, &in, err, errlen);
            if (c->fd >= 0)
                rx_consume(c, n);
            if (r == -DF_EPEER || r == -ENOMEM)
                return r;
        }
        if (msg && c->q_len) {
            *msg = c->q[c->q_head].m;
            free(c->handed);
            c->handed = c->q[c->q_head].owned;
            c->q_head = (c->q_head + 1) % c->q_cap;
            c->q_len--;
            return 1;
        }
        uint64_t now = mono_ms();
        if (now >= deadline) {
            /* Even a zero timeout reads what has arrived (pushes, ACKs). */
            if (c->fd >= 0 && !drained) {
                drained = 1;
                if (rx_fill(c, 0) > 0)
                    continue;
            }
            return 0;
        }
        uint64_t wait = deadline - now;
        if (c->fd >= 0 && c->welcome.heartbeat_ms) {
            uint64_t next_hb = c->last_hb_ms + c->welcome.heartbeat_ms;
            wait = next_hb <= now ? 0 : (next_hb - now < wait ? next_hb - now : wait);
        }
        if (c->fd >= 0) {
            rx_fill(c, (int)(wait > 60000 ? 60000 : wait));
        } else {
            uint64_t until = c->next_reconnect_ms > now ? c->next_reconnect_ms - now : 0;
            if (until > wait)
                until = wait;
            poll(NULL, 0, (int)until);
        }
    }
}

int client_poll(struct client *c, int timeout_ms, struct proto_msg *msg, char *err, size_t errlen)
{
    return service(c, timeout_ms, msg, err, errlen);
}

int client_idle(struct client *c, int timeout_ms, char *err, size_t errlen)
{
    return service(c, timeout_ms, NULL, err, errlen);
}

static int request(struct client *c, const struct proto_msg *m, char **json, int *status, char *err, size_t errlen)
{
    *json = NULL;
    if (c->fd < 0 && maybe_reconnect(c, err, errlen) < 0)
        FAIL(-ENOTCONN, "not connected to %s", c->where);
    int r = send_msg(c, m);
    if (r < 0)
        FAIL(r, "send to %s: %s", c->where, err_str(r));
    c->replies_owed++;
    uint64_t deadline = mono_ms() + (uint64_t)c->o.reply_timeout_ms;
    for (;;) {
        struct proto_msg in;
        int64_t n = rx_wait(c, deadline, &in, err, errlen);
        if (n < 0)
            return (int)n;
        if (in.type == PROTO_REPLY && c->replies_owed > 1) {
            c->replies_owed--;  /* an earlier request's, late: the coordinator answers in order */
            rx_consume(c, n);
            continue;
        }
        if (in.type == PROTO_REPLY) {
            c->replies_owed = 0;
            char *j = malloc((size_t)in.reply.json_len + 1);
            if (!j)
                return -ENOMEM;
            memcpy(j, in.json, in.reply.json_len);
            j[in.reply.json_len] = 0;
            *json = j;
            *status = in.reply.status;
            rx_consume(c, n);
            return 0;
        }
        r = handle_frame(c, &in, err, errlen);
        if (c->fd >= 0)
            rx_consume(c, n);
        if (r < 0)
            return r;
    }
}

int client_query(struct client *c, enum proto_query_what what, uint32_t limit, char **json, int *status,
                 char *err, size_t errlen)
{
    struct proto_msg m = { .type = PROTO_QUERY, .query = { (uint32_t)what, limit } };
    return request(c, &m, json, status, err, errlen);
}

int client_control(struct client *c, enum proto_control_cmd cmd, const char *reason, char **json, int *status,
                   char *err, size_t errlen)
{
    struct proto_msg m = { .type = PROTO_CONTROL };
    m.control.cmd = (uint32_t)cmd;
    proto_strset(m.control.reason, sizeof m.control.reason, reason);
    return request(c, &m, json, status, err, errlen);
}
