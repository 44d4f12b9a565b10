/* test_proto_client.c: the client library against a scripted coordinator (a forked child that
 * speaks the protocol frame by frame), for answers a real coordinator never gives, for
 * client_idle (heartbeats go on, a message pushed meanwhile waits for client_poll), and for
 * reports written while disconnected (held, then sent on the next connection). */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/asan.h"
#include "common/err.h"
#include "common/timeutil.h"
#include "ipc/client.h"
#include "tests/test.h"

static char g_sock[108];

static int listen_at(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    unlink(path);
    CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK(listen(fd, 4) == 0);
    return fd;
}

static void send_frame(int fd, const struct proto_msg *m)
{
    static uint8_t buf[1 << 20];
    char err[256];
    int64_t n = proto_encode(m, buf, sizeof buf, err, sizeof err);
    if (n < 0) {
        fprintf(stderr, "server: encode: %s\n", err);
        _exit(3);
    }
    for (int64_t off = 0, w; off < n; off += w)
        if ((w = write(fd, buf + off, (size_t)(n - off))) <= 0)
            _exit(4);
}

/* Read the client's HELLO (one frame of a known size). */
static void read_hello(int fd)
{
    uint8_t buf[sizeof(struct proto_hdr) + sizeof(struct proto_hello)];
    size_t got = 0;
    while (got < sizeof buf) {
        ssize_t k = read(fd, buf + got, sizeof buf - got);
        if (k <= 0)
            _exit(5);
        got += (size_t)k;
    }
    struct proto_msg m;
    if (proto_decode(buf, sizeof buf, &m, NULL, 0) < 0 || m.type != PROTO_HELLO)
        _exit(6);
}

/* Every frame the client sends until it closes the connection, handed to fn(fd, frame, arg) as
 * it arrives (fn may answer on fd). */
static void read_frames(int fd, void (*fn)(int fd, const struct proto_msg *m, void *arg), void *arg)
{
    static uint8_t buf[1 << 16];
    size_t have = 0;
    ssize_t k;
    while (have < sizeof buf && (k = read(fd, buf + have, sizeof buf - have)) > 0) {
        have += (size_t)k;
        size_t off = 0;
        while (have - off >= sizeof(struct proto_hdr)) {
            const struct proto_hdr *hd = (const struct proto_hdr *)(buf + off);
            size_t n = sizeof *hd + hd->len;
            struct proto_msg m;
            if (n > have - off)
                break;      /* the rest of it comes with the next read */
            if (proto_decode(buf + off, n, &m, NULL, 0) < 0)
                _exit(7);
            fn(fd, &m, arg);
            off += n;
        }
        memmove(buf, buf + off, have - off);
        have -= off;
    }
    if (have)
        _exit(7);   /* a frame cut short */
}

static void send_welcome(int fd, uint32_t heartbeat_ms, uint32_t n_regrants)
{
    struct proto_msg w = { .type = PROTO_WELCOME };
    w.welcome.member_id = 1;
    w.welcome.heartbeat_ms = heartbeat_ms;
    w.welcome.dead_after_ms = 60000;
    w.welcome.cluster_state = PROTO_STATE_RUNNING;
    w.welcome.n_regrants = n_regrants;
    send_frame(fd, &w);
}

/* The next connection on lfd, its HELLO read and WELCOME sent (the server child's). */
static int accept_welcomed(int lfd, uint32_t heartbeat_ms, uint32_t n_regrants)
{
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        _exit(2);
    read_hello(fd);
    send_welcome(fd, heartbeat_ms, n_regrants);
    return fd;
}

/* Serve one connection: WELCOME claiming `announced` re-grants, then `sent` grants, then
 * either close (hang_up) or wait for the client to close. */
static pid_t serve(int lfd, uint32_t announced, uint32_t sent, int hang_up)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid)
        return pid;
    int fd = accept_welcomed(lfd, 10000, announced);
    for (uint32_t i = 0; i < sent; i++) {
        uint32_t sample = i;
        struct proto_msg g = { .type = PROTO_LEASE_GRANT, .samples = &sample };
        g.grant = (struct proto_lease_grant){ .batch_id = 100 + i, .flags = PROTO_GRANT_REGRANT, .n_samples = 1,
                                              .n_tokens = 5, .max_seq_len = 64, .lease = 1 };
        send_frame(fd, &g);
    }
    if (!hang_up) {
        char c;
        while (read(fd, &c, 1) > 0)
            ;
    }
    close(fd);
    _exit(0);
}

static int reap(pid_t pid)
{
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static struct client_opts opts(void)
{
    return (struct client_opts){ .socket_path = g_sock, .role = PROTO_ROLE_TARGET, .device = 0,
                                 .reply_timeout_ms = 3000, .reconnect_ms = 50 };
}

/* A client with the default options, connected. */
static struct client *open_client(void)
{
    struct client *c = NULL;
    struct client_opts o = opts();
    char err[512] = "";
    if (client_open(&c, &o, err, sizeof err) < 0)
        TEST_FAIL("client_open: %s", err);
    return c;
}

/* A WELCOME announcing more re-grants than ever arrive (here: 2^32-1, the count a 32-bit
 * "+1" wraps to 0) must not size anything: the client takes what arrives, then fails cleanly
 * when the connection ends short. */
static void test_regrant_count_is_not_trusted(int lfd)
{
    pid_t srv = serve(lfd, UINT32_MAX, 64, 1);
    struct client *c = (struct client *)1;
    struct client_opts o = opts();
    char err[512] = "";
    int r = client_open(&c, &o, err, sizeof err);
    CHECK_INT(r, <, 0);
    CHECK(c == NULL);
    CHECK(!strchr(err, '\n'));
    printf("huge n_regrants: %d (%s): %s\n", r, err_str(r), err);
    CHECK_INT(reap(srv), ==, 0);
}

/* The regular case: announced re-grants arrive and are handed to the daemon as grants. */
static void test_regrants_delivered(int lfd)
{
    pid_t srv = serve(lfd, 3, 3, 0);
    struct client *c = open_client();
    char err[512] = "";
    CHECK_INT(client_leases_held(c), ==, 3);
    struct proto_msg m;
    for (int i = 0; i < 3; i++) {
        CHECK_INT(client_poll(c, 1000, &m, err, sizeof err), ==, 1);
        CHECK_INT(m.type, ==, PROTO_LEASE_GRANT);
        CHECK_INT(m.grant.batch_id, ==, 100 + i);
        CHECK_INT(proto_grant_sample(&m, 0), ==, i);
    }
    CHECK(client_lease_held(c, 102));
    client_free(c);
    CHECK_INT(reap(srv), ==, 0);
}

/* A lease revoked and granted again (a new lease number) while the connection was down comes
 * back in the next WELCOME's re-grants: the client drops the old one (a REVOKE to the daemon,
 * whose copy packed under the old number must not be published) and takes the new. It kept
 * the old number, so the copy went out stamped with a lease the coordinator had ended. */
static void test_regrant_new_lease_number(int lfd)
{
    pid_t srv = fork();
    CHECK(srv >= 0);
    if (!srv) {
        uint32_t sample = 3;
        struct proto_msg g = { .type = PROTO_LEASE_GRANT, .samples = &sample };
        g.grant = (struct proto_lease_grant){ .batch_id = 100, .n_samples = 1, .n_tokens = 5, .max_seq_len = 64,
                                              .lease = 1 };
        int fd = accept_welcomed(lfd, 10000, 0);
        send_frame(fd, &g);
        usleep(200000);
        close(fd);                                  /* the REVOKE and GRANT of lease 2: lost */
        fd = accept_welcomed(lfd, 10000, 1);
        g.grant.lease = 2;
        g.grant.flags = PROTO_GRANT_REGRANT;
        send_frame(fd, &g);
        char c;
        while (read(fd, &c, 1) > 0)
            ;
        close(fd);
        _exit(0);
    }
    struct client *c = open_client();
    char err[512] = "";
    struct proto_msg m;
    CHECK_INT(client_poll(c, 2000, &m, err, sizeof err), ==, 1);
    CHECK(m.type == PROTO_LEASE_GRANT && m.grant.lease == 1);
    int revoked = 0, granted = 0;
    uint64_t end = mono_ms() + 5000;
    while (!granted && mono_ms() < end)
        if (client_poll(c, 50, &m, err, sizeof err) == 1) {
            if (m.type == PROTO_LEASE_REVOKE && m.batch.batch_id == 100)
                revoked = !granted;
            granted |= m.type == PROTO_LEASE_GRANT && m.grant.batch_id == 100 && m.grant.lease == 2;
        }
    CHECK(revoked && granted);
    CHECK(client_lease_find(c, 100) && client_lease_find(c, 100)->lease == 2);
    client_free(c);
    CHECK_INT(reap(srv), ==, 0);
}

static void count_heartbeat(int fd, const struct proto_msg *m, void *arg)
{
    *(int *)arg += m->type == PROTO_HEARTBEAT;
}

/* client_idle (a daemon waiting for its checkpoint write): the heartbeat keeps going and a
 * CONTROL pushed meanwhile is kept for the next client_poll. The server counts heartbeats. */
static void test_idle_keeps_heartbeat(int lfd)
{
    pid_t srv = fork();
    CHECK(srv >= 0);
    if (!srv) {
        int fd = accept_welcomed(lfd, 50, 0);
        usleep(100000);
        struct proto_msg ctl = { .type = PROTO_CONTROL };
        ctl.control.cmd = PROTO_CTL_PAUSE;
        proto_strset(ctl.control.reason, sizeof ctl.control.reason, "pushed while idle");
        send_frame(fd, &ctl);
        int beats = 0;
        read_frames(fd, count_heartbeat, &beats);
        _exit(beats >= 4 ? 0 : 10 + beats);
    }
    struct client *c = open_client();
    char err[512] = "";
    CHECK_INT(client_idle(c, 600, err, sizeof err), ==, 0);
    struct proto_msg m;
    CHECK_INT(client_poll(c, 0, &m, err, sizeof err), ==, 1);
    CHECK_INT(m.type, ==, PROTO_CONTROL);
    CHECK_INT(m.control.cmd, ==, PROTO_CTL_PAUSE);
    CHECK_STR(m.control.reason, "pushed while idle");
    client_free(c);
    CHECK_INT(reap(srv), ==, 0);
}

static void count_held(int fd, const struct proto_msg *m, void *arg)
{
    int *seen = arg;
    seen[0] += m->type == PROTO_SKIPPED && m->skipped.batch_id == 7 && m->skipped.lease == 3;
    seen[1] += m->type == PROTO_ERROR && m->error.code == -DF_ENAN;
}

/* A drafter's skip report (an event, kept until ACKed) and its error (held: not an event, but a
 * NaN must still pause the cluster) written while the coordinator is away are sent on the next
 * connection; one the encoder refuses is neither kept nor in their way. */
static void test_held_until_reconnect(int lfd)
{
    pid_t srv = fork();
    CHECK(srv >= 0);
    if (!srv) {
        int fd = accept_welcomed(lfd, 10000, 0);   /* the first connection: hung up at once */
        close(fd);
        fd = accept_welcomed(lfd, 10000, 0);
        int seen[2] = { 0, 0 };     /* skip reports of batch 7, NaN errors */
        read_frames(fd, count_held, seen);
        _exit(seen[0] == 1 && seen[1] == 1 ? 0 : 10 + 2 * seen[0] + seen[1]);
    }
    struct client *c = NULL;
    struct client_opts o = opts();
    o.role = PROTO_ROLE_DRAFTER;
    o.reconnect_ms = 300;           /* the two reports are written while disconnected */
    char err[512] = "";
    CHECK_OK(client_open(&c, &o, err, sizeof err));
    struct proto_msg m;
    for (int i = 0; i < 100 && client_connected(c); i++)
        client_poll(c, 10, &m, err, sizeof err);
    CHECK(!client_connected(c));
    /* An event the encoder refuses (no lease number: a spoiled slot) is refused here, not kept
     * in the outbox where it would stop every replay. */
    CHECK_INT(client_trained(c, 7, 0, 1, 0, 1), ==, -DF_ERANGE);
    CHECK_INT(client_batch_skipped(c, 7, 0), ==, -DF_ERANGE);
    struct client_stats cs;
    client_get_stats(c, &cs);
    CHECK_INT(cs.outbox, ==, 0);
    /* So is a report it refuses (a checkpoint path with a control character): held, it stopped
     * every later handshake before the reports below were sent again. */
    CHECK_INT(client_ckpt_bad(c, 1, 8, "/ckpt/step-8\x01", -DF_EFORMAT, "unreadable"), <, 0);
    CHECK_OK(client_batch_skipped(c, 7, 3));
    CHECK_OK(client_error(c, 0, -DF_ENAN, "loss is nan"));
    for (int i = 0; i < 200 && !client_connected(c); i++)
        client_poll(c, 10, &m, err, sizeof err);
    CHECK(client_connected(c));
    client_idle(c, 100, err, sizeof err);
    client_free(c);
    CHECK_INT(reap(srv), ==, 0);
}

static void count_marked(int fd, const struct proto_msg *m, void *arg)
{
    struct { char text[64]; int seen; } *want = arg;
    want->seen += m->type == PROTO_ERROR && !strcmp(m->error.message, want->text);
}

/* An error whose send times out (a coordinator that stopped reading: SO_SNDTIMEO ends the send
 * with EAGAIN, and the client hangs up) is held for the next connection like one written while
 * disconnected, not dropped. */
static void test_held_after_send_timeout(int lfd)
{
    int last_fd[2];
    CHECK(pipe(last_fd) == 0);
    pid_t srv = fork();
    CHECK(srv >= 0);
    if (!srv) {
        int fd = accept_welcomed(lfd, 10000, 0);   /* the first connection: never read */
        struct pollfd p = { .fd = fd, .events = POLLRDHUP };
        if (poll(&p, 1, 20000) != 1)        /* until the client gives up on it */
            _exit(3);
        close(fd);
        fd = accept_welcomed(lfd, 10000, 0);
        struct { char text[64]; int seen; } want = { "", 0 };
        int last;
        if (read(last_fd[0], &last, sizeof last) != sizeof last)
            _exit(4);
        snprintf(want.text, sizeof want.text, "filler %d", last);
        read_frames(fd, count_marked, &want);
        _exit(want.seen == 1 ? 0 : 10 + want.seen);
    }
    struct client *c = NULL;
    struct client_opts o = opts();
    o.role = PROTO_ROLE_DRAFTER;
    o.reply_timeout_ms = 300;       /* also the send timeout */
    o.reconnect_ms = 100;
    char err[512] = "";
    CHECK_OK(client_open(&c, &o, err, sizeof err));
    int k;
    for (k = 0; k < 100000 && client_connected(c); k++)
        client_error(c, 0, -EIO, "filler %d", k);
    CHECK(!client_connected(c));
    int last = k - 1;               /* the one whose send timed out */
    CHECK_INT(write(last_fd[1], &last, sizeof last), ==, sizeof last);
    struct proto_msg m;
    for (int i = 0; i < 300 && !client_connected(c); i++)
        client_poll(c, 10, &m, err, sizeof err);
    CHECK(client_connected(c));
    client_idle(c, 100, err, sizeof err);
    client_free(c);
    CHECK_INT(reap(srv), ==, 0);
    close(last_fd[0]);
    close(last_fd[1]);
}

/* The server's answer to a CHECKPOINTED: step 7 refused, any other accepted. */
static void ack_checkpointed(int fd, const struct proto_msg *m, void *arg)
{
    if (m->type != PROTO_CHECKPOINTED)
        return;
    struct proto_msg a = { .type = PROTO_ACK };
    a.ack.seq = m->checkpointed.seq;
    a.ack.status = m->checkpointed.step == 7 ? -DF_ESTATE : 0;
    send_frame(fd, &a);
}

/* The coordinator's ACKs of CHECKPOINTED: the newest one accepted (status 0) is in the stats, a
 * refused one (here: step 7) is not, an older step of the same generation does not move it back,
 * and a new generation's replaces it (drafter-d never prunes the checkpoint a restart loads). */
static void test_checkpoint_accepted(int lfd)
{
    pid_t srv = fork();
    CHECK(srv >= 0);
    if (!srv) {
        int fd = accept_welcomed(lfd, 10000, 0);
        read_frames(fd, ack_checkpointed, NULL);
        _exit(0);
    }
    struct client *c = NULL;
    struct client_opts o = opts();
    o.role = PROTO_ROLE_DRAFTER;
    char err[512] = "";
    CHECK_OK(client_open(&c, &o, err, sizeof err));
    struct client_stats st;
    client_get_stats(c, &st);
    CHECK_INT(st.ckpt_accepted_step, ==, -1);
    static const struct { uint64_t step, gen; int64_t want_step; uint64_t want_gen; } seq[] = {
        { 5, 2, 5, 2 }, { 7, 2, 5, 2 }, { 3, 2, 5, 2 }, { 2, 3, 2, 3 },
    };
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        CHECK_OK(client_checkpointed(c, seq[i].step, seq[i].gen, "/nonexistent/ckpt"));
        struct proto_msg m;
        for (int k = 0; k < 300; k++) {
            client_poll(c, 10, &m, err, sizeof err);
            client_get_stats(c, &st);
            if (!st.outbox)
                break;
        }
        CHECK_INT(st.outbox, ==, 0);
        CHECK_INT(st.ckpt_accepted_step, ==, seq[i].want_step);
        CHECK_INT(st.ckpt_accepted_gen, ==, seq[i].want_gen);
        /* the refusal is counted with its step and generation (drafter-d writes that one again) */
        CHECK_INT(st.ckpt_refusals, ==, i >= 1);
        CHECK_INT(st.ckpt_refused_step, ==, i >= 1 ? 7 : -1);
    }
    CHECK_INT(st.ckpt_refused_gen, ==, 2);
    client_free(c);
    CHECK_INT(reap(srv), ==, 0);
}

/* The first connection's answers: ACK the reports of batches 101 and 103, hang up at the
 * CHECKPOINTED; the second's: note each report's batch (the checkpoint as 0) until it is there. */
struct replay_seen { int conn, n; uint64_t batch[8]; };

static void ack_some_then_note(int fd, const struct proto_msg *m, void *arg)
{
    struct replay_seen *rs = arg;
    if (m->type != PROTO_TRAINED && m->type != PROTO_CHECKPOINTED)
        return;
    uint64_t batch = m->type == PROTO_TRAINED ? m->trained.batch_id : 0;
    if (rs->conn == 1) {
        if (batch == 101 || batch == 103) {
            struct proto_msg a = { .type = PROTO_ACK };
            a.ack.seq = m->trained.seq;
            send_frame(fd, &a);
        }
        if (!batch)
            shutdown(fd, SHUT_RDWR);    /* read_frames returns: the next connection */
    } else if (rs->n < 8) {
        rs->batch[rs->n++] = batch;
        if (!batch)
            _exit(rs->n == 2 && rs->batch[0] == 102 ? 0 : 10 + rs->n);
    }
}

/* A replay sends the unanswered reports in the order they were written: rank 0's CHECKPOINTED
 * never overtakes the TRAINED of a batch it holds (answering one in the middle of the outbox
 * moved the newest entry into its place). */
static void test_replay_keeps_order(int lfd)
{
    pid_t srv = fork();
    CHECK(srv >= 0);
    if (!srv) {
        struct replay_seen rs = { .conn = 1 };
        int fd = accept_welcomed(lfd, 10000, 0);
        read_frames(fd, ack_some_then_note, &rs);
        close(fd);
        rs.conn = 2;
        fd = accept_welcomed(lfd, 10000, 0);
        read_frames(fd, ack_some_then_note, &rs);
        _exit(20);              /* (the second connection ends in ack_some_then_note) */
    }
    struct client *c = NULL;
    struct client_opts o = opts();
    o.role = PROTO_ROLE_DRAFTER;
    char err[512] = "";
    CHECK_OK(client_open(&c, &o, err, sizeof err));
    for (uint64_t b = 101; b <= 103; b++)
        CHECK_OK(client_trained(c, b, 1, 10, 0, 2));
    CHECK_OK(client_checkpointed(c, 10, 2, "/nonexistent/step-10"));
    struct proto_msg m;
    int reconnected = 0;
    for (int i = 0; i < 500 && !(reconnected && !client_connected(c)); i++) {
        client_poll(c, 10, &m, err, sizeof err);
        struct client_stats st;
        client_get_stats(c, &st);
        reconnected |= st.events_replayed > 0;
    }
    client_free(c);
    CHECK_INT(reap(srv), ==, 0);
}

static void grant_flags(int fd, uint64_t batch, uint32_t n, uint32_t first, uint32_t flags)
{
    static uint32_t sm[PROTO_MAX_SAMPLES];
    for (uint32_t i = 0; i < n; i++)
        sm[i] = first + i;
    struct proto_msg g = { .type = PROTO_LEASE_GRANT, .samples = sm };
    g.grant = (struct proto_lease_grant){ .batch_id = batch, .flags = flags, .n_samples = n, .n_tokens = n,
                                          .max_seq_len = 64, .lease = 1 };
    send_frame(fd, &g);
}

static void grant(int fd, uint64_t batch, uint32_t n, uint32_t first) { grant_flags(fd, batch, n, first, 0); }

static void check_lease(struct client *c, uint64_t batch, uint32_t n, uint32_t first)
{
    const struct client_lease *l = client_lease_find(c, batch);
    CHECK(l != NULL);
    CHECK_INT(l->n_samples, ==, n);
    for (uint32_t i = 0; i < n; i++)
        CHECK_INT(l->samples[i], ==, first + i);
}

/* A server that welcomes one client, sends what `frames` writes, then reads until it hangs up. */
static pid_t serve_frames(int lfd, void (*frames)(int fd))
{
    pid_t srv = fork();
    CHECK(srv >= 0);
    if (!srv) {
        int fd = accept_welcomed(lfd, 10000, 0);
        frames(fd);
        char ch;
        while (read(fd, &ch, 1) > 0)
            ;
        _exit(0);
    }
    return srv;
}

/* Leases come and go: a dropped lease's sample buffer serves the next grant (no allocation once
 * warm), a bigger grant grows it, and the leases still held keep their own samples. */
static void churn_frames(int fd)
{
    grant(fd, 100, 3, 1);
    grant(fd, 101, 5, 10);
    struct proto_msg rv = { .type = PROTO_LEASE_REVOKE, .batch.batch_id = 100 };
    send_frame(fd, &rv);
    grant(fd, 102, 7, 20);
    grant(fd, 103, 300, 1000);
}

static void test_lease_churn(int lfd)
{
    pid_t srv = serve_frames(lfd, churn_frames);
    struct client *c = open_client();
    char err[512] = "";
    struct proto_msg m;
    const uint32_t *buf100 = NULL;  /* 100's samples, when its grant is handed out before the revoke */
    for (;;) {
        int held = client_lease_held(c, 103);
        int r = client_poll(c, held ? 0 : 2000, &m, err, sizeof err);
        CHECK_INT(r, >=, 0);
        if (r == 0) {
            CHECK(held);
            break;
        }
        if (m.type == PROTO_LEASE_GRANT && m.grant.batch_id == 100) {
            check_lease(c, 100, 3, 1);
            buf100 = client_lease_find(c, 100)->samples;
        }
    }
    CHECK(!client_lease_held(c, 100));
    CHECK_INT(client_leases_held(c), ==, 3);
    check_lease(c, 101, 5, 10);
    check_lease(c, 102, 7, 20);
    check_lease(c, 103, 300, 1000);
    if (buf100)
        CHECK(client_lease_find(c, 102)->samples == buf100);
    printf("lease churn: grant 100 %s\n", buf100 ? "handed out, its buffer serves 102" : "revoked while queued");
    client_free(c);
    CHECK_INT(reap(srv), ==, 0);
}

/* A lease that ends (published, returned) leaves its sample buffer to the next grant; until then,
 * under ASan, the buffer is poisoned: a daemon reading a lease's samples after the lease ended is
 * caught. */
static void two_grants(int fd)
{
    grant(fd, 200, 4, 1);
    grant(fd, 201, 4, 5);
}

static void test_ended_lease_poisoned(int lfd)
{
    pid_t srv = serve_frames(lfd, two_grants);
    struct client *c = open_client();
    char err[512] = "";
    struct proto_msg m;
    const uint32_t *buf[2] = { NULL, NULL };
    while (!buf[0] || !buf[1]) {
        CHECK_INT(client_poll(c, 2000, &m, err, sizeof err), >, 0);
        if (m.type == PROTO_LEASE_GRANT && (m.grant.batch_id == 200 || m.grant.batch_id == 201)) {
            check_lease(c, m.grant.batch_id, 4, m.grant.batch_id == 200 ? 1 : 5);
            buf[m.grant.batch_id - 200] = m.samples;
        }
    }
    CHECK(!df_poisoned(buf[0]) && !df_poisoned(buf[1]));
    CHECK_OK(client_lease_return(c, 200));
    CHECK_OK(client_published(c, 201, 0, 4));
    CHECK_INT(client_leases_held(c), ==, 0);
#ifdef DF_ASAN
    for (int i = 0; i < 2; i++)
        CHECK(df_poisoned(buf[i]) && df_poisoned(buf[i] + 3));
    printf("ended leases: their sample buffers are poisoned until the next grant\n");
#else
    printf("ended leases: not an ASan build (the poisoning is checked under SAN=address)\n");
#endif
    client_free(c);
    CHECK_INT(reap(srv), ==, 0);
}

/* A target leaving: client_return_leases hands back a lease whose grant was read and one still
 * queued, then a grant that arrives afterwards (a late answer to a request) goes back at once. */
static int g_returned_fd = -1;     /* the server child says here when all three came back */

static void count_returns(int fd, const struct proto_msg *m, void *arg)
{
    int *seen = arg;    /* bit b - 300 per batch returned */
    if (m->type != PROTO_LEASE_RETURN)
        return;
    if (m->batch.batch_id < 300 || m->batch.batch_id > 302 || (*seen & (1 << (m->batch.batch_id - 300))))
        _exit(10);      /* not one of them, or twice */
    *seen |= 1 << (m->batch.batch_id - 300);
    if (*seen == 3)
        grant(fd, 302, 2, 7);   /* after both came back */
    if (*seen == 7 && write(g_returned_fd, "r", 1) != 1)
        _exit(11);
}

static void test_leaving_returns_leases(int lfd)
{
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    pid_t srv = fork();
    CHECK(srv >= 0);
    if (!srv) {
        close(pfd[0]);
        g_returned_fd = pfd[1];
        int fd = accept_welcomed(lfd, 10000, 0);
        grant(fd, 300, 2, 1);
        grant(fd, 301, 2, 3);
        int seen = 0;
        read_frames(fd, count_returns, &seen);      /* until the client hangs up */
        _exit(seen == 7 ? 0 : 20 + seen);
    }
    close(pfd[1]);
    struct client *c = open_client();
    char err[512] = "";
    struct proto_msg m;
    CHECK_INT(client_poll(c, 5000, &m, err, sizeof err), ==, 1);
    CHECK_INT(m.type, ==, PROTO_LEASE_GRANT);
    CHECK_INT(m.grant.batch_id, ==, 300);
    for (int i = 0; !client_lease_held(c, 301); i++) {     /* its grant read and queued, not handed out */
        CHECK_INT(i, <, 100 * test_time_scale());
        CHECK_INT(client_idle(c, 100, err, sizeof err), ==, 0);
    }
    CHECK_INT(client_return_leases(c), ==, 2);
    CHECK_INT(client_leases_held(c), ==, 0);
    struct pollfd p = { .fd = pfd[0], .events = POLLIN };
    for (int i = 0; i < 100 * test_time_scale() && poll(&p, 1, 0) == 0; i++)
        CHECK_INT(client_idle(c, 50, err, sizeof err), ==, 0);
    CHECK(p.revents & POLLIN);
    CHECK_INT(client_leases_held(c), ==, 0);
    CHECK_INT(client_poll(c, 0, &m, err, sizeof err), ==, 0);      /* 301 and 302 never handed out */
    printf("leaving: a read grant, a queued one and a late one all returned\n");
    client_free(c);
    close(pfd[0]);
    CHECK_INT(reap(srv), ==, 0);
}

/* A GROUP's batch ids outlive the frame: the frames behind it (and a grant big enough to grow the
 * receive buffer) are read in the same poll, and the ids handed out are still the GROUP's. */
static void group_then_more(int fd)
{
    static uint64_t ids[64];
    for (int i = 0; i < 64; i++)
        ids[i] = ((uint64_t)1 << 32) | (uint64_t)(i * 3 + 1);
    struct proto_msg g = { .type = PROTO_GROUP, .ids = ids };
    g.group = (struct proto_group){ .generation = 2, .rank = 0, .world_size = 1, .run_batches = 500, .n_done = 64 };
    send_frame(fd, &g);
    for (int i = 0; i < 3; i++) {
        struct proto_msg ctl = { .type = PROTO_CONTROL };
        ctl.control.cmd = PROTO_CTL_PAUSE;
        send_frame(fd, &ctl);
    }
    grant(fd, 300, 60000, 7);
}

static void test_group_ids_kept(int lfd)
{
    pid_t srv = serve_frames(lfd, group_then_more);
    struct client *c = open_client();
    char err[512] = "";
    struct proto_msg m;
    usleep(300 * 1000 * (useconds_t)test_time_scale());   /* every frame is there: the first poll reads them all */
    CHECK_INT(client_poll(c, 2000, &m, err, sizeof err), >, 0);
    CHECK_INT(m.type, ==, PROTO_GROUP);
    CHECK_INT(m.group.n_done, ==, 64);
    CHECK_INT(m.group.run_batches, ==, 500);
    for (uint32_t i = 0; i < 64; i++)
        CHECK_INT(proto_group_id(&m, i), ==, ((uint64_t)1 << 32) | (i * 3 + 1));
    int more = 0;
    while (client_poll(c, 500, &m, err, sizeof err) > 0)
        more++;
    CHECK_INT(more, ==, 4);
    check_lease(c, 300, 60000, 7);
    printf("group: its 64 batch ids intact behind 4 more frames\n");
    client_free(c);
    CHECK_INT(reap(srv), ==, 0);
}

/* A server that answers the first QUERY late (after the client gave up on it), then the second. */
static void answer_late(int fd, const struct proto_msg *m, void *arg)
{
    int *n = arg;
    if (m->type != PROTO_QUERY)
        return;
    char text[32];
    snprintf(text, sizeof text, "{\"answer\":%d}", ++*n);
    if (*n == 1)
        usleep(400 * 1000 * (unsigned)test_time_scale());
    struct proto_msg r = { .type = PROTO_REPLY, .json = text };
    r.reply.status = *n;
    r.reply.json_len = (uint32_t)strlen(text);
    send_frame(fd, &r);
}

/* The late answer to a request that timed out is not taken for the next request's. */
static void test_late_reply_skipped(int lfd)
{
    pid_t srv = fork();
    CHECK(srv >= 0);
    if (!srv) {
        int fd = accept_welcomed(lfd, 10000, 0), n = 0;
        read_frames(fd, answer_late, &n);
        _exit(n == 2 ? 0 : 8);
    }
    struct client *c = NULL;
    struct client_opts o = opts();
    o.reply_timeout_ms = 150 * test_time_scale();     /* the answers' times scale alike */
    char err[512] = "", *json = NULL;
    int status = 0;
    CHECK_OK(client_open(&c, &o, err, sizeof err));
    CHECK(client_query(c, PROTO_Q_STATUS, 0, &json, &status, err, sizeof err) < 0);     /* gave up */
    CHECK(!json);
    usleep(500 * 1000 * (unsigned)test_time_scale());       /* the late answer is there now */
    CHECK_OK(client_query(c, PROTO_Q_STATUS, 0, &json, &status, err, sizeof err));
    CHECK_INT(status, ==, 2);
    CHECK_STR(json, "{\"answer\":2}");
    free(json);
    printf("late reply: the timed-out request's answer skipped, the next one gets its own\n");
    client_free(c);
    CHECK_INT(reap(srv), ==, 0);
}

/* Leaving, the client reconnects and the coordinator re-grants a lease it never saw: it goes
 * back from inside the handshake. Here that send fails (the server shut its reading side), which
 * drops the connection and the bytes received with it: the handshake must stop there rather than
 * consume a frame of a buffer that is gone (ASan reports that consume: a negative size). The
 * server: on the return of 400, hang up, take the reconnect, re-grant 401 to a client that can no
 * longer write. */
static void regrant_then_deaf(int fd, const struct proto_msg *m, void *arg)
{
    if (m->type != PROTO_LEASE_RETURN || m->batch.batch_id != 400)
        return;
    int lfd = *(int *)arg;
    close(fd);              /* the client reconnects */
    fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        _exit(14);
    read_hello(fd);
    shutdown(fd, SHUT_RD);  /* the client's next send fails */
    send_welcome(fd, 10000, 1);
    grant_flags(fd, 401, 1, 5, PROTO_GRANT_REGRANT);
    _exit(0);
}

#define MANY_RETURNS 4100
struct returns_of { uint64_t batch; int n; };
static void count_returns_of(int fd, const struct proto_msg *m, void *arg)
{
    (void)fd;
    struct returns_of *r = arg;
    r->n += m->type == PROTO_LEASE_RETURN && m->batch.batch_id == r->batch;
}

static void grant_numbered(int fd, uint64_t batch, uint32_t lease, uint32_t flags)
{
    uint32_t sample = 3;
    struct proto_msg g = { .type = PROTO_LEASE_GRANT, .samples = &sample };
    g.grant = (struct proto_lease_grant){ .batch_id = batch, .flags = flags, .n_samples = 1, .n_tokens = 1,
                                          .max_seq_len = 64, .lease = lease };
    send_frame(fd, &g);
}

/* The server child's next connection (fd, the one before, hung up): the client's reconnect
 * taken, `batch` re-granted under lease number `lease`; exits 0 when the client hangs up having
 * sent `want` LEASE_RETURNs of it, else `code`. */
static void reconnect_regrant(int fd, int lfd, uint64_t batch, uint32_t lease, int want, int code)
{
    close(fd);
    if ((fd = accept(lfd, NULL, NULL)) < 0)
        _exit(code + 1);
    read_hello(fd);
    send_welcome(fd, 10000, 1);
    grant_numbered(fd, batch, lease, PROTO_GRANT_REGRANT);
    struct returns_of back = { batch, 0 };
    read_frames(fd, count_returns_of, &back);       /* until the client hangs up */
    _exit(back.n == want ? 0 : code);
}

static void grant_many(int fd)
{
    for (int i = 0; i < MANY_RETURNS; i++)
        grant(fd, 5000 + (uint64_t)i, 1, 1);
}

/* A client that took grant_many's grants, then returned them all (taken first: the server writes
 * them all before it reads, and returning each at once would have both sides blocked writing). */
static struct client *take_and_return_many(void)
{
    struct client *c = open_client();
    char err[512] = "";
    struct proto_msg m;
    for (int got = 0; got < MANY_RETURNS;) {
        int r = client_poll(c, 5000, &m, err, sizeof err);
        if (r != 1)
            TEST_FAIL("after %d grants: client_poll %d (%s)", got, r, err);
        got += m.type == PROTO_LEASE_GRANT;
    }
    for (int i = 0; i < MANY_RETURNS; i++)
        CHECK_OK(client_lease_return(c, 5000 + (uint64_t)i));
    return c;
}

/* Keep c alive until it has reconnected once (the server hung up). */
static void await_reconnect(struct client *c)
{
    char err[512];
    struct client_stats cs = { 0 };
    for (int i = 0; i < 200 * test_time_scale() && !cs.reconnects; i++) {
        CHECK_INT(client_idle(c, 50, err, sizeof err), ==, 0);
        client_get_stats(c, &cs);
    }
    CHECK_INT(cs.reconnects, ==, 1);
}

/* A long connection returns more leases than the client remembers (4096): the newest are the
 * ones a broken connection may have lost, so a reconnect's re-grant of the last one returned
 * goes back too (the first 4096 were kept before, and the re-grant of a later one was taken).
 * The server: 4100 grants; on the last return, hang up, take the reconnect, re-grant that batch,
 * and wait for it to come back. */
static void regrant_last_returned(int fd, const struct proto_msg *m, void *arg)
{
    if (m->type == PROTO_LEASE_RETURN && m->batch.batch_id == 5000 + MANY_RETURNS - 1)
        reconnect_regrant(fd, *(int *)arg, 5000 + MANY_RETURNS - 1, 1, 1, 14);
}

static void test_newest_returns_kept(int lfd)
{
    pid_t srv = fork();
    CHECK(srv >= 0);
    if (!srv) {
        int fd = accept_welcomed(lfd, 10000, 0);
        grant_many(fd);
        read_frames(fd, regrant_last_returned, &lfd);
        _exit(13);
    }
    struct client *c = take_and_return_many();
    await_reconnect(c);                     /* the re-grant was handled in that handshake */
    CHECK_INT(client_leases_held(c), ==, 0);
    client_free(c);                         /* hang up: the server counts what came back */
    int st = 0;
    pid_t done = 0;
    for (int i = 0; i < 200 * test_time_scale() && !done; i++) {
        done = waitpid(srv, &st, WNOHANG);
        if (!done)
            usleep(20000);
    }
    CHECK(done == srv);
    CHECK_INT(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), ==, 0);
    printf("%d leases returned on one connection: the re-grant of the last one went back\n", MANY_RETURNS);
}

/* A lease returned and then granted again on the same connection is held, not returned: a
 * reconnect's re-grant of it (under its new number) is kept, and no LEASE_RETURN goes back for
 * it (the daemon would go on with a batch the coordinator took back). The server: grant 7000
 * (lease 1), take its return, grant it again (lease 2), hang up once the client has it; then
 * re-grant it on the reconnect and count the returns of 7000 until the client hangs up. */
/* A server child with a pipe from the client (the child reads sync[0], the client writes
 * sync[1]): 0 in the child, its pid in the client. */
static pid_t fork_synced(int sync[2])
{
    CHECK_OK(pipe(sync));
    pid_t pid = fork();
    CHECK(pid >= 0);
    close(sync[pid ? 0 : 1]);
    return pid;
}

struct regrant_after { int lfd, sync; };
static void return_answered(int fd, const struct proto_msg *m, void *arg)
{
    const struct regrant_after *a = arg;
    char ch;
    if (m->type != PROTO_LEASE_RETURN || m->batch.batch_id != 7000)
        return;
    grant_numbered(fd, 7000, 2, 0);
    if (read(a->sync, &ch, 1) != 1)     /* the client has it */
        _exit(18);
    reconnect_regrant(fd, a->lfd, 7000, 2, 0, 20);
}

static void test_returned_then_granted(int lfd)
{
    int sync[2];
    pid_t srv = fork_synced(sync);
    if (!srv) {
        int fd = accept_welcomed(lfd, 10000, 0);
        grant_numbered(fd, 7000, 1, 0);
        struct regrant_after a = { lfd, sync[0] };
        read_frames(fd, return_answered, &a);
        _exit(17);
    }
    struct client *c = open_client();
    char err[512] = "";
    struct proto_msg m;
    CHECK_INT(client_poll(c, 5000, &m, err, sizeof err), ==, 1);
    CHECK(m.type == PROTO_LEASE_GRANT && m.grant.batch_id == 7000 && m.grant.lease == 1);
    CHECK_OK(client_lease_return(c, 7000));
    CHECK_INT(client_poll(c, 5000, &m, err, sizeof err), ==, 1);
    CHECK(m.type == PROTO_LEASE_GRANT && m.grant.batch_id == 7000 && m.grant.lease == 2);
    CHECK_INT(write(sync[1], "g", 1), ==, 1);
    await_reconnect(c);
    const struct client_lease *l = client_lease_find(c, 7000);
    CHECK(l != NULL);
    CHECK_INT(l->lease, ==, 2);
    client_free(c);                         /* hang up: the server counts the returns */
    close(sync[1]);
    CHECK_INT(reap(srv), ==, 0);
    printf("a lease returned, granted again, re-granted on a reconnect: kept, not returned\n");
}

/* The same once the client's list of returned leases has wrapped (4100 returns, 4096 kept): a
 * lease returned and granted again is taken out of it, the others stay. The server: 4100 grants;
 * on the last return, grant the one before it again (lease 2); once the client has it, hang up
 * and re-grant three on the reconnect: the last returned and the third last go back, the one
 * granted again is kept. */
struct wrapped { int lfd, sync; };
static void count_wrapped(int fd, const struct proto_msg *m, void *arg)
{
    (void)fd;
    int *back = arg;
    for (int k = 1; k <= 3; k++)
        back[k] += m->type == PROTO_LEASE_RETURN && m->batch.batch_id == 5000 + MANY_RETURNS - (uint64_t)k;
}

static void forget_when_wrapped(int fd, const struct proto_msg *m, void *arg)
{
    const struct wrapped *w = arg;
    char ch;
    if (m->type != PROTO_LEASE_RETURN || m->batch.batch_id != 5000 + MANY_RETURNS - 1)
        return;
    grant_numbered(fd, 5000 + MANY_RETURNS - 2, 2, 0);
    if (read(w->sync, &ch, 1) != 1)
        _exit(21);
    close(fd);
    if ((fd = accept(w->lfd, NULL, NULL)) < 0)
        _exit(22);
    read_hello(fd);
    send_welcome(fd, 10000, 3);
    grant_numbered(fd, 5000 + MANY_RETURNS - 1, 1, PROTO_GRANT_REGRANT);
    grant_numbered(fd, 5000 + MANY_RETURNS - 2, 2, PROTO_GRANT_REGRANT);
    grant_numbered(fd, 5000 + MANY_RETURNS - 3, 1, PROTO_GRANT_REGRANT);
    int back[4] = { 0 };
    read_frames(fd, count_wrapped, back);
    _exit(back[1] == 1 && back[2] == 0 && back[3] == 1 ? 0 : 23);
}

static void test_wrapped_returns_forget(int lfd)
{
    int sync[2];
    pid_t srv = fork_synced(sync);
    if (!srv) {
        int fd = accept_welcomed(lfd, 10000, 0);
        grant_many(fd);
        struct wrapped w = { lfd, sync[0] };
        read_frames(fd, forget_when_wrapped, &w);
        _exit(24);
    }
    struct client *c = take_and_return_many();
    char err[512] = "";
    struct proto_msg m;
    int again = 0;
    for (int i = 0; i < 200 * test_time_scale() && !again; i++)
        again = client_poll(c, 50, &m, err, sizeof err) == 1 && m.type == PROTO_LEASE_GRANT &&
                m.grant.batch_id == 5000 + MANY_RETURNS - 2 && m.grant.lease == 2;
    CHECK(again);
    CHECK_INT(write(sync[1], "g", 1), ==, 1);
    await_reconnect(c);
    CHECK_INT(client_leases_held(c), ==, 1);
    const struct client_lease *l = client_lease_find(c, 5000 + MANY_RETURNS - 2);
    CHECK(l && l->lease == 2);
    client_free(c);
    close(sync[1]);
    CHECK_INT(reap(srv), ==, 0);
    printf("%d returns (the list wrapped), one granted again: kept on the reconnect, the others went back\n",
           MANY_RETURNS);
}

/* Last: the client's later reconnects are left in the listening queue. */
static void test_leaving_regrant_send_fails(int lfd)
{
    pid_t srv = fork();
    CHECK(srv >= 0);
    if (!srv) {
        int fd = accept_welcomed(lfd, 10000, 0);
        grant(fd, 400, 1, 1);
        read_frames(fd, regrant_then_deaf, &lfd);
        _exit(13);          /* hung up before returning 400 */
    }
    struct client *c = open_client();
    char err[512] = "";
    struct proto_msg m;
    CHECK_INT(client_poll(c, 5000, &m, err, sizeof err), ==, 1);
    CHECK_INT(m.grant.batch_id, ==, 400);
    CHECK_INT(client_return_leases(c), ==, 1);
    int st = 0;
    pid_t done = 0;
    for (int i = 0; i < 200 * test_time_scale() && !done; i++) {
        CHECK_INT(client_idle(c, 50, err, sizeof err), ==, 0);
        done = waitpid(srv, &st, WNOHANG);
    }
    CHECK(done == srv);
    CHECK_INT(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), ==, 0);
    CHECK_INT(client_leases_held(c), ==, 0);
    printf("leaving: a re-grant whose return cannot be sent ends that handshake cleanly\n");
    client_free(c);
}

/* A socket whose listener takes no connection (a stalled coordinator, another program's socket):
 * once its queue is full a connect is answered within the reply timeout, not slept in for ever
 * (client_open and every reconnect in client_poll hung there). */
static void test_listener_not_accepting(void)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    char *path = sa.sun_path;
    CHECK(snprintf(path, sizeof sa.sun_path, "%s.full", g_sock) < (int)sizeof sa.sun_path);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    unlink(path);
    CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK(listen(lfd, 0) == 0);
    int held[64], n = 0;
    for (; n < 64; n++) {       /* fill its queue (a backlog of 0 takes one or two) */
        held[n] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct timeval tv = { 0, 100000 };
        setsockopt(held[n], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(held[n], (struct sockaddr *)&sa, sizeof sa) < 0) {
            CHECK_INT(errno, ==, EAGAIN);
            close(held[n]);
            break;
        }
    }
    CHECK(n < 64);
    struct client_opts o = { .socket_path = path, .role = PROTO_ROLE_TARGET, .device = 0,
                             .connect_timeout_ms = 300, .reply_timeout_ms = 200 };
    struct client *c = NULL;
    char err[512];
    alarm(30);                  /* (the old code: never back) */
    uint64_t t0 = mono_ms();
    int r = client_open(&c, &o, err, sizeof err);
    uint64_t took = mono_ms() - t0;
    alarm(0);
    CHECK_INT(r, ==, -EAGAIN);
    CHECK_CONTAINS(err, "no connection taken for 200 ms (its queue is full");
    CHECK_CONTAINS(err, path);
    CHECK(took < 5000 * (uint64_t)test_time_scale());
    printf("  a listener that takes nothing: %s (%" PRIu64 " ms, %d queued)\n", err, took, n);
    while (n)
        close(held[--n]);
    close(lfd);
    unlink(path);
}

int main(void)
{
    const char *t = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_sock, sizeof g_sock, "%s/pc-%d.sock", t, (int)getpid());
    signal(SIGPIPE, SIG_IGN);
    int lfd = listen_at(g_sock);
    test_regrants_delivered(lfd);
    test_regrant_new_lease_number(lfd);
    test_regrant_count_is_not_trusted(lfd);
    test_idle_keeps_heartbeat(lfd);
    test_held_until_reconnect(lfd);
    test_held_after_send_timeout(lfd);
    test_checkpoint_accepted(lfd);
    test_replay_keeps_order(lfd);
    test_lease_churn(lfd);
    test_ended_lease_poisoned(lfd);
    test_leaving_returns_leases(lfd);
    test_newest_returns_kept(lfd);
    test_group_ids_kept(lfd);
    test_late_reply_skipped(lfd);
    test_returned_then_granted(lfd);
    test_wrapped_returns_forget(lfd);
    test_leaving_regrant_send_fails(lfd);
    test_listener_not_accepting();
    close(lfd);
    unlink(g_sock);
    printf("ok\n");
    return 0;
}
