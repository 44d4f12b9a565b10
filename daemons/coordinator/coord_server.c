/* coord_server.c: the control socket on libuv: accept + SO_PEERCRED check, the optional TCP
 * listener (token AUTH, dflashctl only), framing, per-member output held until the ledger
 * commit, member close and free (close cb only). */
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include "common/err.h"
#include "common/log.h"
#include "common/text.h"
#include "common/timeutil.h"
#include "daemons/coordinator/coord.h"
#include "ipc/net.h"

/* A peer has this long to say HELLO (over TCP: AUTH and HELLO); unauthenticated TCP peers at
 * most this many. */
#define HELLO_TIMEOUT_MS 5000
#define TCP_PENDING_MAX 16
#define TCP_PENDING_PER_HOST 4
#define UNIX_PENDING_MAX 64         /* connections on the socket waiting for their HELLO, at most */
#define FD_LOW_MARGIN 32            /* descriptors left under the limit that make it "nearly all in use" */
#define REFUSALS_LOGGED 20          /* refused peers logged per REFUSALS_WINDOW_MS, then counted */
#define REFUSALS_WINDOW_MS 10000

#define COORD_TX_KEEP (256u << 10)     /* a member's send buffer kept between flushes, at most */

struct write_req {
    uv_write_t req;
    uint8_t *buf;
};

static void on_write(uv_write_t *req, int status)
{
    struct write_req *w = (struct write_req *)req;
    struct member *m = req->handle->data;
    free(w->buf);
    free(w);
    if (status < 0 && status != UV_ECANCELED && m && !m->closing)
        coord_close_member(m, "write failed");
}

/* Hand buf (malloc'd, len bytes) to libuv; it is freed when written. */
static int write_now(struct member *m, uint8_t *buf, size_t len)
{
    struct write_req *w = malloc(sizeof *w);
    if (!w) {
        free(buf);
        return -ENOMEM;
    }
    w->buf = buf;
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    int r = uv_write(&w->req, &m->stream, &b, 1, on_write);
    if (r < 0) {
        free(buf);
        free(w);
    }
    return r;
}

int coord_send(struct member *m, const struct proto_msg *msg)
{
    if (m->closing || m->tx_closed)
        return 0;
    int64_t n = proto_encoded_size(msg);
    if (n < 0)
        return (int)n;
    if (m->stream.write_queue_size + m->tx_len + (size_t)n > COORD_TX_MAX) {
        /* A peer that does not read: closed at the flush (not here, inside some handler). */
        log_warn(0, "%s (pid %d, member %llu) does not read what it is sent (%zu bytes waiting): closing it", m->name,
                 (int)m->pid, (unsigned long long)m->id, m->stream.write_queue_size + m->tx_len);
        m->tx_closed = "does not read what it is sent";
        return -ENOBUFS;
    }
    if (m->tx_cap - m->tx_len < (size_t)n) {
        size_t cap = m->tx_cap ? m->tx_cap : 4096;
        while (cap - m->tx_len < (size_t)n)
            cap *= 2;
        uint8_t *p = realloc(m->tx, cap);
        if (!p) {
            /* A frame left out would leave the peer's view behind (a lease granted that it never
             * hears of): the peer is closed at the flush, and its leases go back. */
            log_error(-ENOMEM, "a %s frame for %s: closing it", proto_type_name(msg->type), m->name);
            m->tx_closed = "a frame for it could not be queued (out of memory)";
            return -ENOMEM;
        }
        m->tx = p;
        m->tx_cap = cap;
    }
    char err[256];
    n = proto_encode(msg, m->tx + m->tx_len, m->tx_cap - m->tx_len, err, sizeof err);
    if (n < 0) {
        log_error((int)n, "encode %s for %s: %s", proto_type_name(msg->type), m->name, err);
        return (int)n;
    }
    m->tx_len += (size_t)n;
    return 0;
}

void coord_flush(struct coord *co)
{
    char err[512];
    /* Closes first: a member gone writes the ledger and queues frames for others (grants,
     * GROUPs), which must not leave before the commit that records them. */
    for (struct member *m = co->members, *next; m; m = next) {
        next = m->next;     /* a close takes m (only m) off the list */
        if (m->tx_closed)
            coord_close_member(m, m->tx_closed);
        else if (m->write_failed)
            coord_close_member(m, "write failed");
    }
    if (ledger_dirty(co->ledger)) {
        uint64_t t0 = mono_ns();
        int r = ledger_commit(co->ledger, err, sizeof err);
        co->commits++;
        coord_timer_note(&co->commit, t0);
        if (r < 0) {
            /* Memory and disk now disagree: only a restart from the ledger is safe. */
            log_error(r, "ledger commit failed, exiting to restart from the durable state: %s", err);
            exit(DAEMON_EX_FAILURE);
        }
    }
    for (struct member *m = co->members; m; m = m->next) {
        if (!m->tx_len || m->closing || m->tx_closed)
            continue;
        /* Written at once where the socket takes it all (the usual case): the buffer stays the
         * member's, no request is made. uv_try_write refuses (EAGAIN) while writes are queued. */
        uv_buf_t b = uv_buf_init((char *)m->tx, (unsigned)m->tx_len);
        int k = uv_try_write((uv_stream_t *)&m->stream, &b, 1);
        if (k == (int)m->tx_len) {
            m->tx_len = 0;
            if (m->tx_cap > COORD_TX_KEEP) {    /* (a large reply once: not held for the connection's life) */
                free(m->tx);
                m->tx = NULL;
                m->tx_cap = 0;
            }
            continue;
        }
        if (k < 0 && k != UV_EAGAIN) {
            m->write_failed = true;     /* closed by the next flush, before its commit */
            continue;
        }
        /* The rest is queued: the buffer goes to libuv (freed when written) */
        size_t done = k > 0 ? (size_t)k : 0;
        uint8_t *buf = m->tx;
        size_t len = m->tx_len - done;
        memmove(buf, buf + done, len);
        m->tx = NULL;
        m->tx_len = m->tx_cap = 0;
        if (write_now(m, buf, len) < 0)
            m->write_failed = true;
    }
}

static void on_closed(uv_handle_t *h)
{
    struct member *m = (struct member *)h;
    if (m->closing) {       /* off the closing list */
        if (m->prev)
            m->prev->next = m->next;
        else if (m->co->closing == m)
            m->co->closing = m->next;
        if (m->next)
            m->next->prev = m->prev;
    }
    free(m->rx);
    free(m->tx);
    free(m);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    /* Cancelled (UV_ECANCELED) when the exit path closed the handle first. */
    if (!uv_is_closing((uv_handle_t *)req->handle))
        uv_close((uv_handle_t *)req->handle, on_closed);
    free(req);
}

void coord_close_handle(uv_handle_t *h)
{
    if (uv_is_closing(h))
        return;
    /* A member's handle is its first field and points at itself: free the member with it. */
    uv_close(h, h->data == (void *)h ? on_closed : NULL);
}

static void remember_departed(struct coord *co, const struct member *m, const char *reason)
{
    if (!m->role || m->role == PROTO_ROLE_CTL)
        return;
    struct departed *d = &co->departed[co->departed_next];
    co->departed_next = (co->departed_next + 1) % COORD_DEPARTED_MAX;
    if (co->n_departed < COORD_DEPARTED_MAX)
        co->n_departed++;
    *d = (struct departed){ .role = m->role, .device = m->device, .pid = m->pid, .left_wall_ms = wall_ms(), .hb = m->hb,
                            .token = m->token };
    snprintf(d->name, sizeof d->name, "%s", m->name);
    snprintf(d->reason, sizeof d->reason, "%.*s", (int)text_fit(reason, sizeof d->reason - 1), reason);  /* (cut to fit) */
}

/* A target or drafter closed by the coordinator (a failed write, a heartbeat timeout, its own
 * shutdown) may have said BYE just before, still unread in the socket: read what is there now,
 * looking for it (nothing else is acted on any more). */
static void read_last_words(struct member *m)
{
    uv_os_fd_t fd;
    if (m->said_bye || m->is_tcp || !m->rx || (m->role != PROTO_ROLE_TARGET && m->role != PROTO_ROLE_DRAFTER) ||
        uv_fileno(&m->handle, &fd) < 0)
        return;
    size_t total = 0;
    for (;;) {
        size_t off = 0;
        for (;;) {      /* the whole frames in rx; those handled already are looked at again: harmless */
            int64_t n = proto_frame_size(m->rx + off, m->rx_len - off, NULL, 0);
            struct proto_msg msg;
            if (n <= 0 || (size_t)n > m->rx_len - off)
                break;
            if (proto_decode(m->rx + off, (size_t)n, &msg, NULL, 0) == 0 && msg.type == PROTO_BYE) {
                m->said_bye = true;
                snprintf(m->bye, sizeof m->bye, "%.*s", (int)text_fit(msg.bye.reason, sizeof m->bye - 1), msg.bye.reason);
                log_info("%s (pid %d) leaves, exit status %u: %s (read as it was closed)", m->name, (int)m->pid,
                         msg.bye.exit_status, msg.bye.reason);
                return;
            }
            off += (size_t)n;
        }
        if (off == 0 && m->rx_len == m->rx_cap)
            return;     /* no frame fits: a peer the reader would have refused */
        memmove(m->rx, m->rx + off, m->rx_len - off);
        m->rx_len -= off;
        ssize_t k;
        do
            k = recv(fd, m->rx + m->rx_len, m->rx_cap - m->rx_len, MSG_DONTWAIT);
        while (k < 0 && errno == EINTR);
        if (k <= 0 || (total += (size_t)k) > PROTO_MAX_FRAME)
            return;
        m->rx_len += (size_t)k;
    }
}

void coord_close_member(struct member *m, const char *reason)
{
    if (m->closing)
        return;
    struct coord *co = m->co;
    read_last_words(m);
    char why[sizeof m->bye + 160];
    if (m->said_bye) {      /* what it said on leaving, rather than (or with) the close that followed */
        if (!m->hung_up) {
            snprintf(why, sizeof why, "%s (after its BYE: %s)", reason, m->bye);
            reason = why;
        } else {
            reason = m->bye;
        }
    } else if ((m->role == PROTO_ROLE_TARGET || m->role == PROTO_ROLE_DRAFTER) && !co->server_closing) {
        coord_watch_start(co, m, m->hung_up, reason);
    }
    if (m->role && m->role != PROTO_ROLE_CTL)
        log_notice("%s (pid %d, member %llu) left: %s", m->name, (int)m->pid, (unsigned long long)m->id, reason);
    else if (m->is_tcp)
        log_debug("TCP peer %llu (%s) closed: %s", (unsigned long long)m->id, m->peer, reason);
    else
        log_debug("peer %llu (pid %d) closed: %s", (unsigned long long)m->id, (int)m->pid, reason);
    m->closing = true;
    uv_read_stop(&m->stream);
    if (m->role)
        coord_member_gone(m, reason);
    remember_departed(co, m, reason);
    coord_watch_departed(co);
    if (m->prev)
        m->prev->next = m->next;
    else
        co->members = m->next;
    if (m->next)
        m->next->prev = m->prev;
    m->prev = NULL;
    m->next = co->closing;
    if (co->closing)
        co->closing->prev = m;
    co->closing = m;
    m->close_deadline_ms = mono_ms() + COORD_CLOSE_GRACE_MS;
    /* Frames not yet committed are dropped; a REFUSE already handed to libuv goes out
     * before the shutdown completes, if the peer reads it (else coord_server_tick closes). */
    uv_shutdown_t *req = malloc(sizeof *req);
    if (!req || uv_shutdown(req, &m->stream, on_shutdown) < 0) {
        free(req);
        uv_close(&m->handle, on_closed);
    }
}

void coord_refuse(struct member *m, int code, const char *fmt, ...)
{
    struct proto_msg msg = { .type = PROTO_REFUSE };
    char text[PROTO_TEXT_MAX + 1];      /* (one more: a text cut to fit is seen to be) */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    msg.refuse.code = code;
    msg.refuse.server_version = PROTO_VERSION;
    proto_textset(msg.refuse.message, sizeof msg.refuse.message, text);
    /* A flood of bad peers (token guessing over TCP) must not flood the journal, whose rate
     * limit would then drop the coordinator's own lines: REFUSALS_LOGGED per window, then a count. */
    struct coord *co = m->co;
    uint64_t now = mono_ms();
    if (now - co->refusals_window_ms >= REFUSALS_WINDOW_MS) {
        if (co->refusals_unlogged)
            log_warn(0, "%" PRIu64 " more peers refused in the last %d s (not logged one by one)",
                     co->refusals_unlogged, REFUSALS_WINDOW_MS / 1000);
        co->refusals_window_ms = now;
        co->refusals_logged = 0;
        co->refusals_unlogged = 0;
    }
    if (co->refusals_logged >= REFUSALS_LOGGED)
        co->refusals_unlogged++;
    else if (++co->refusals_logged, m->is_tcp)
        log_warn(0, "refused TCP peer %s: %s", m->peer, text);
    else
        log_warn(0, "refused peer (pid %d uid %d gid %d): %s", (int)m->pid, (int)m->uid, (int)m->gid, text);
    size_t n = sizeof(struct proto_hdr) + sizeof(struct proto_refuse);
    uint8_t *buf = malloc(n);
    if (buf && proto_encode(&msg, buf, n, NULL, 0) > 0)
        write_now(m, buf, n);
    else
        free(buf);
    char why[PROTO_TEXT_MAX + 16];
    snprintf(why, sizeof why, "refused: %s", text);
    coord_close_member(m, why);
}

/* What a peer sends the coordinator is small (the largest, an ERROR or a CONTROL, under 1 KiB):
 * one buffer of this size per member holds any frame whole, and a larger one is refused from
 * its header (the variable-length types, up to PROTO_MAX_FRAME, go only the other way). */
#define COORD_RX_BYTES 65536

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct member *m = (struct member *)h;
    (void)suggested;
    if (!m->rx && (m->rx = malloc(COORD_RX_BYTES)))
        m->rx_cap = COORD_RX_BYTES;
    *buf = uv_buf_init((char *)m->rx + m->rx_len, (unsigned)(m->rx_cap - m->rx_len));
}

/* Before AUTH a TCP peer gets no buffer for anything but an AUTH frame. */
static bool auth_header_ok(const uint8_t *p)
{
    struct proto_hdr h;
    memcpy(&h, p, sizeof h);
    return h.type == PROTO_AUTH && h.len == sizeof(struct proto_auth);
}

/* AUTH: true when m may go on. */
static bool on_auth(struct member *m, const struct proto_auth *a)
{
    struct coord *co = m->co;
    if (!m->is_tcp) {
        coord_refuse(m, -DF_EPEER, "AUTH is for TCP peers; the unix socket checks the peer's credentials");
        return false;
    }
    if (m->authed) {
        coord_refuse(m, -DF_EPEER, "second AUTH");
        return false;
    }
    /* Every byte of the padded field is compared, whatever the lengths: no early exit. */
    bool same = net_token_equal(a->token, co->tcp_token, sizeof co->tcp_token) & (a->len == co->tcp_token_len);
    if (!same) {
        coord_refuse(m, -EACCES, "wrong token (cluster.tcp_token_file)");
        return false;
    }
    m->authed = true;
    log_debug("TCP peer %s authenticated", m->peer);
    return true;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct member *m = (struct member *)s;
    (void)buf;
    if (nread < 0) {
        m->hung_up = true;
        coord_close_member(m, nread == UV_EOF ? "hung up" : uv_strerror((int)nread));
        return;
    }
    m->rx_len += (size_t)nread;
    m->last_seen_ms = mono_ms();
    size_t off = 0;
    while (!m->closing && !m->tx_closed) {  /* (tx_closed: closed at the flush; nothing more is read) */
        char err[256];
        int64_t n = proto_frame_size(m->rx + off, m->rx_len - off, err, sizeof err);
        if (n > 0 && m->is_tcp && !m->authed && !auth_header_ok(m->rx + off)) {
            coord_refuse(m, -EACCES, "the first message over TCP must be AUTH with the cluster token");
            return;
        }
        if (n > COORD_RX_BYTES) {
            struct proto_hdr h;
            memcpy(&h, m->rx + off, sizeof h);
            coord_refuse(m, -E2BIG, "a frame of %lld bytes (type %u): no message to the coordinator is over %d KiB",
                         (long long)n, (unsigned)h.type, COORD_RX_BYTES >> 10);
            return;
        }
        if (n == 0 || (n > 0 && (size_t)n > m->rx_len - off))
            break;
        struct proto_msg msg;
        int r = n < 0 ? (int)n : proto_decode(m->rx + off, (size_t)n, &msg, err, sizeof err);
        if (r < 0) {
            if (r == -DF_EVERSION)
                coord_refuse(m, r, "%s; this coordinator speaks protocol version %u", err, PROTO_VERSION);
            else
                coord_refuse(m, r, "bad frame: %s", err);
            return;
        }
        if (msg.type == PROTO_AUTH) {
            if (!on_auth(m, &msg.auth))
                return;
            off += (size_t)n;
            continue;
        }
        if (!m->role && msg.type != PROTO_HELLO) {
            coord_refuse(m, -DF_EPEER, "first message must be HELLO, got %s", proto_type_name(msg.type));
            return;
        }
        bool tcp_hello = m->is_tcp && msg.type == PROTO_HELLO && !m->role;
        if (tcp_hello && msg.hello.role != PROTO_ROLE_CTL) {
            coord_refuse(m, -EACCES, "a %s may not connect over TCP: it needs the local ring, use the unix socket",
                         proto_role_name(msg.hello.role));
            return;
        }
        coord_handle(m, &msg);
        if (tcp_hello && m->role && !m->closing) {
            /* Shown wherever the coordinator names this peer (control reasons, logs). */
            char name[PROTO_NAME_MAX];      /* the address always kept whole: the name cut to fit */
            size_t pl = strnlen(m->peer, sizeof name - 2), nl = text_fit(m->name, sizeof name - 2 - pl);
            memcpy(name, m->name, nl);
            name[nl] = '@';
            memcpy(name + nl + 1, m->peer, pl);
            name[nl + 1 + pl] = 0;
            memcpy(m->name, name, sizeof name);
            log_info("TCP peer %s registered as %s", m->peer, m->name);
        }
        off += (size_t)n;
    }
    if (m->closing)
        return;
    memmove(m->rx, m->rx + off, m->rx_len - off);
    m->rx_len -= off;
    if (m->rx_len == m->rx_cap) /* cannot happen: frames are refused above past the buffer's size */
        coord_refuse(m, -E2BIG, "frame larger than the buffer");
}

/* Did the peer belong to the allowed group (primary or supplementary) when it connected? The
 * kernel keeps the groups of that moment with the socket (SO_PEERGROUPS), so a process that hands
 * the socket on and exits, its pid reused, is still judged by its own groups. */
static bool in_group(int fd, gid_t gid, gid_t allowed)
{
    if (gid == allowed)
        return true;
    gid_t some[64], *groups = some;
    socklen_t len = sizeof some;
    bool found = false;
    int r = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len);
    if (r < 0 && errno == ERANGE && (groups = malloc(len)))     /* len now says how much */
        r = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len);
    if (r < 0)
        log_warn(-errno, "cannot read a peer's supplementary groups (SO_PEERGROUPS: Linux 4.13 or later): "
                 "only its primary group counts");
    for (size_t i = 0; r == 0 && i < len / sizeof *groups && !found; i++)
        found = groups[i] == allowed;
    if (groups != some)
        free(groups);
    return found;
}

/* The host part of a TCP peer's "a.b.c.d:port" / "[v6]:port". */
static size_t host_len(const char *peer)
{
    const char *colon = strrchr(peer, ':');
    return colon ? (size_t)(colon - peer) : strlen(peer);
}

/* Whether a connected before b (a tie of the millisecond clock: by member id, given in order). */
static bool earlier(const struct member *a, const struct member *b)
{
    return a->connected_ms != b->connected_ms ? a->connected_ms < b->connected_ms : a->id < b->id;
}

/* A TCP peer: no credentials to check; AUTH, then HELLO as CTL, within the timeout. */
static void tcp_accepted(struct coord *co, struct member *m)
{
    m->is_tcp = true;
    m->uid = (uid_t)-1;
    m->gid = (gid_t)-1;
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getpeername(&m->tcp, (struct sockaddr *)&ss, &len) == 0)
        net_addr_format((struct sockaddr *)&ss, m->peer, sizeof m->peer);
    else
        snprintf(m->peer, sizeof m->peer, "(unknown address)");
    /* Waiting to authenticate: at most TCP_PENDING_PER_HOST from one address and TCP_PENDING_MAX
     * in all. A newcomer is always taken; the one closed for it is the one waiting longest of its
     * own address, else of the address with the most waiting (a tie: of all of them). A peer with
     * the token authenticates at once, so only idle ones are there long, and idle peers from fewer
     * than TCP_PENDING_MAX addresses, however often renewed, cannot keep dflashctl out. */
    unsigned pending = 0, same_host = 0, most = 0;
    struct member *oldest_here = NULL, *victim = NULL;
    size_t hl = host_len(m->peer);
    for (struct member *o = co->members; o; o = o->next) {
        if (o == m || !o->is_tcp || o->role || o->closing)
            continue;
        pending++;
        size_t ol = host_len(o->peer);
        if (ol == hl && !memcmp(o->peer, m->peer, hl)) {
            same_host++;
            if (!oldest_here || earlier(o, oldest_here))
                oldest_here = o;
        }
        unsigned n = 0;         /* waiting from o's address, the newcomer included */
        for (struct member *q = co->members; q; q = q->next)
            n += q->is_tcp && !q->role && !q->closing && host_len(q->peer) == ol && !memcmp(q->peer, o->peer, ol);
        if (n > most || (n == most && earlier(o, victim))) {
            most = n;
            victim = o;
        }
    }
    if (same_host >= TCP_PENDING_PER_HOST)
        coord_refuse(oldest_here, -EBUSY, "%d TCP connections from one address waiting to authenticate: the one "
                     "waiting longest is closed", TCP_PENDING_PER_HOST);
    else if (pending >= TCP_PENDING_MAX)
        coord_refuse(victim, -EBUSY, "%d TCP connections waiting to authenticate: the one waiting longest of the "
                     "address with the most is closed", TCP_PENDING_MAX);
    log_debug("TCP connection from %s (peer %llu)", m->peer, (unsigned long long)m->id);
    uv_tcp_nodelay(&m->tcp, 1);
    uv_tcp_keepalive(&m->tcp, 1, 60);
    uv_read_start(&m->stream, on_alloc, on_read);
}

/* Peers without a HELLO past the timeout. Run after the loop's reads (check phase), so a HELLO
 * that waited in the socket through a stall of the loop is read first. */
static void hello_timeouts(struct coord *co)
{
    uint64_t now = mono_ms();
    for (struct member *m = co->members, *next; m; m = next) {
        next = m->next;
        if (!m->role && !m->closing && now - m->connected_ms > HELLO_TIMEOUT_MS)
            coord_refuse(m, -DF_ETIMEOUT, "no %sHELLO within %d ms", m->is_tcp ? "AUTH and " : "", HELLO_TIMEOUT_MS);
    }
}

static void on_connection(uv_stream_t *server, int status);

/* A connection's descriptor near the limit: said (every 10 s at most), for the connections past
 * it are closed as they are accepted and never seen (libuv's answer to EMFILE). */
static void fd_low_check(struct coord *co, int fd)
{
    uint64_t now = mono_ms();
    if ((uint64_t)fd + FD_LOW_MARGIN < co->fd_limit || (co->fd_warned_ms && now - co->fd_warned_ms < 10000))
        return;
    co->fd_warned_ms = now;
    log_warn(-EMFILE, "open files nearly all in use (descriptor %d, limit %" PRIu64 "): connections past the limit "
             "are closed unseen; raise LimitNOFILE= or find who holds them (dflashctl daemons)", fd, co->fd_limit);
}

void coord_server_tick(struct coord *co)
{
    uint64_t now = mono_ms();
    /* Closed peers that do not take their last writes (a REFUSE, a reply): closed hard. */
    for (struct member *m = co->closing; m; m = m->next)
        if (now >= m->close_deadline_ms && !uv_is_closing(&m->handle))
            uv_close(&m->handle, on_closed);
    for (int i = 0; i < 2; i++)
        if (co->accept_held[i])
            on_connection(i ? (uv_stream_t *)&co->tcp_server : (uv_stream_t *)&co->server, 0);
}

static void on_connection(uv_stream_t *server, int status)
{
    struct coord *co = server->data;
    bool tcp = server == (uv_stream_t *)&co->tcp_server;
    if (status < 0) {
        log_warn(status == UV_EMFILE ? -EMFILE : 0, "accept%s: %s", tcp ? " (TCP)" : "", uv_strerror(status));
        return;
    }
    struct member *m = calloc(1, sizeof *m);
    if (!m) {
        /* Left unaccepted, the listener waits (libuv polls it again only after an accept): the
         * tick tries again, so a shortage delays connections and never ends them for good. */
        if (!co->accept_held[tcp])
            log_error(-ENOMEM, "accept%s: no memory for the connection: held until there is", tcp ? " (TCP)" : "");
        co->accept_held[tcp] = true;
        return;
    }
    if (co->accept_held[tcp])
        log_notice("accept%s: memory again: the connection held is taken", tcp ? " (TCP)" : "");
    co->accept_held[tcp] = false;
    m->co = co;
    m->rank = -1;
    m->device = -1;
    if (tcp)
        uv_tcp_init(co->loop, &m->tcp);
    else
        uv_pipe_init(co->loop, &m->pipe, 0);
    m->handle.data = m;
    if (uv_accept(server, &m->stream) < 0) {
        uv_close(&m->handle, on_closed);
        return;
    }
    m->id = co->next_member_id++;
    m->connected_ms = m->last_seen_ms = mono_ms();
    snprintf(m->name, sizeof m->name, "peer-%llu", (unsigned long long)m->id);
    m->next = co->members;
    if (co->members)
        co->members->prev = m;
    co->members = m;
    uv_os_fd_t afd;
    if (uv_fileno(&m->handle, &afd) == 0)
        fd_low_check(co, afd);
    if (tcp) {
        tcp_accepted(co, m);
        return;
    }

    uv_os_fd_t fd;
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (uv_fileno(&m->handle, &fd) < 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
        coord_refuse(m, -DF_EPEER, "cannot read the peer's credentials");
        return;
    }
    m->pid = cred.pid;
    m->uid = cred.uid;
    m->gid = cred.gid;
    bool ok = cred.uid == 0 || cred.uid == co->self_uid ||
              (co->allowed_gid != (gid_t)-1 && in_group(fd, cred.gid, co->allowed_gid));
    if (!ok) {
        coord_refuse(m, -EACCES, "uid %d gid %d is not allowed on %s (allowed: root, uid %d%s%s)", (int)cred.uid,
                     (int)cred.gid, co->socket_path, (int)co->self_uid, co->cfg->cluster.group[0] ? ", group " : "",
                     co->cfg->cluster.group);
        return;
    }
    /* Waiting for their HELLO (a daemon or dflashctl says it at once): at most UNIX_PENDING_MAX;
     * the one waiting longest is closed for a newcomer. A program that opens connections and
     * says nothing cannot use up the descriptors: past the limit a connection is closed by the
     * kernel's accept unseen, a daemon coming back among them. */
    unsigned pending = 0;
    struct member *oldest = NULL;
    for (struct member *o = co->members; o; o = o->next)
        if (o != m && !o->is_tcp && !o->role && !o->closing) {
            pending++;
            if (!oldest || earlier(o, oldest))
                oldest = o;
        }
    if (pending >= UNIX_PENDING_MAX)
        coord_refuse(oldest, -EAGAIN, "%d connections waiting for their HELLO: the one waiting longest is closed",
                     UNIX_PENDING_MAX);
    uv_read_start(&m->stream, on_alloc, on_read);
}

static void on_check(uv_check_t *h)
{
    hello_timeouts(h->data);
    coord_flush(h->data);
}

/* Bind exactly the configured address (an IPv6 one without its IPv4 twin). */
static int tcp_listen_start(struct coord *co, char *err, size_t errlen)
{
    int r = uv_tcp_init(co->loop, &co->tcp_server);
    if (r < 0)
        goto fail;
    co->tcp_server.data = co;
    r = uv_tcp_bind(&co->tcp_server, (const struct sockaddr *)&co->tcp_sa,
                    co->tcp_sa.ss_family == AF_INET6 ? UV_TCP_IPV6ONLY : 0);
    if (r == 0)
        r = uv_listen((uv_stream_t *)&co->tcp_server, TCP_PENDING_MAX, on_connection);
    if (r < 0)
        goto fail;
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if ((r = uv_tcp_getsockname(&co->tcp_server, (struct sockaddr *)&ss, &len)) < 0)
        goto fail;
    net_addr_format((struct sockaddr *)&ss, co->tcp_addr, sizeof co->tcp_addr);
    log_notice("TCP listener on %s (cluster.tcp_listen = %s): dflashctl only, token from %s", co->tcp_addr,
               co->cfg->cluster.tcp_listen, co->cfg->cluster.tcp_token_file);
    return 0;
fail:
    snprintf(err, errlen, "cluster.tcp_listen %s: %s", co->cfg->cluster.tcp_listen, uv_strerror(r));
    return r;
}

/* 0 when a listener takes a connection on the unix socket at path (or has its backlog full),
 * else the connect's -errno (-ECONNREFUSED: nobody listens, the file is stale). */
static int socket_answers(const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof sa.sun_path)
        return -ENAMETOOLONG;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    int r = connect(fd, (const struct sockaddr *)&sa, sizeof sa) == 0 || errno == EAGAIN ? 0 : -errno;
    close(fd);
    return r;
}

int coord_server_start(struct coord *co, char *err, size_t errlen)
{
    co->self_uid = getuid();     /* (co->allowed_gid: cluster.group, looked up with the config's checks) */
    /* The lock (daemon_lock) says no other coordinator runs: a socket file left here is stale.
     * Anything else there is not ours to remove. */
    struct stat st;
    if (lstat(co->socket_path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "control socket %s: a %s is there, not a socket: move it away, or set cluster.socket "
                 "to another path", co->socket_path, S_ISDIR(st.st_mode) ? "folder" : S_ISREG(st.st_mode) ? "file" : "non-socket");
        return -EEXIST;
    }
    char parent[sizeof co->socket_path];
    snprintf(parent, sizeof parent, "%s", co->socket_path);
    bool gone = stat(dirname(parent), &st) < 0;
    if (gone || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "control socket %s: its folder %s: %s", co->socket_path, parent,
                 gone ? strerror(errno) : "not a folder");
        return -ENOENT;
    }
    /* Stale only if nobody answers: a coordinator of another cluster (its own runtime_dir, so
     * its own lock) may listen there; removing its socket would cut it off from its daemons. */
    if (socket_answers(co->socket_path) == 0) {
        snprintf(err, errlen, "control socket %s: a process listens there (the coordinator of another cluster, or "
                 "another program): left alone; set cluster.socket to another path", co->socket_path);
        return -EADDRINUSE;
    }
    unlink(co->socket_path);
    int r = uv_pipe_init(co->loop, &co->server, 0);
    if (r < 0)
        goto fail;
    co->server.data = co;
    mode_t old = umask(0117);   /* the socket is born 0660, never briefly wider */
    r = uv_pipe_bind(&co->server, co->socket_path);
    umask(old);
    if (r < 0)
        goto fail;
    co->socket_bound = true;
    if (chmod(co->socket_path, 0660) < 0) {
        r = uv_translate_sys_error(errno);
        goto fail;
    }
    if (co->allowed_gid != (gid_t)-1 && chown(co->socket_path, (uid_t)-1, co->allowed_gid) < 0) {
        r = -errno;
        snprintf(err, errlen, "control socket %s: cannot give it to group '%s' (cluster.group): %s%s",
                 co->socket_path, co->cfg->cluster.group, strerror(-r), r == -EPERM ?
                 " (this user is not in that group and may not chown: add it to the group, as the unit's User= "
                 "in docs/operations.md is)" : "");
        return r;
    }
    r = uv_listen((uv_stream_t *)&co->server, 128, on_connection);
    if (r < 0)
        goto fail;
    uv_check_init(co->loop, &co->flush_check);
    co->flush_check.data = co;
    uv_check_start(&co->flush_check, on_check);
    if (co->tcp_on)
        return tcp_listen_start(co, err, errlen);
    return 0;
fail:
    snprintf(err, errlen, "control socket %s: %s", co->socket_path, uv_strerror(r));
    return r;       /* (libuv's codes are -errno here) */
}

void coord_server_close(struct coord *co)
{
    co->server_closing = true;      /* the daemons leaving now are not watched: nobody would look */
    while (co->members)
        coord_close_member(co->members, "coordinator stopping");
    /* A handle's loop is set by its init: a start that failed early left the rest untouched. */
    if (co->server.loop && !uv_is_closing((uv_handle_t *)&co->server))
        uv_close((uv_handle_t *)&co->server, NULL);
    if (co->tcp_server.loop && !uv_is_closing((uv_handle_t *)&co->tcp_server))
        uv_close((uv_handle_t *)&co->tcp_server, NULL);
    if (co->flush_check.loop) {
        uv_check_stop(&co->flush_check);
        uv_close((uv_handle_t *)&co->flush_check, NULL);
    }
    if (co->socket_bound)
        unlink(co->socket_path);
}
