/* test_coordinator_access.c: the control socket refuses what it must and keeps serving:
 * garbage, truncated, oversized, wrong-version frames, a non-HELLO first message, no HELLO at
 * all, a peer that never reads its replies, a peer with a disallowed uid/gid (dropped
 * privileges in a child), more dflashctl connections than COORD_CTL_MAX, a dflashctl connection
 * idle past COORD_CTL_IDLE_MS; an allowed group gets in. */
#include <dirent.h>
#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include "common/proc.h"
#include "daemons/coordinator/coord.h"
#include "tests/test_coord_util.h"

static void cleanup(void)
{
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

static int raw_connect(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    CHECK(strlen(TC.sock) < sizeof sa.sun_path);
    memcpy(sa.sun_path, TC.sock, strlen(TC.sock) + 1);
    CHECK_OK(connect(fd, (struct sockaddr *)&sa, sizeof sa));
    struct timeval tv = { 5, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Send bytes, expect a REFUSE whose message contains needle, then EOF. */
static void expect_refused(const void *bytes, size_t len, int close_after, const char *needle)
{
    int fd = raw_connect();
    CHECK_INT(send(fd, bytes, len, MSG_NOSIGNAL), ==, (long long)len);
    if (close_after)
        shutdown(fd, SHUT_WR);
    uint8_t buf[4096];
    size_t n = 0;
    ssize_t k;
    while ((k = recv(fd, buf + n, sizeof buf - n, 0)) > 0)
        n += (size_t)k;
    close(fd);
    if (!needle) {
        CHECK_INT(n, ==, 0);        /* closed without an answer (truncated frame, then EOF) */
        return;
    }
    struct proto_msg m;
    char err[256];
    CHECK_OK(proto_decode(buf, n, &m, err, sizeof err));
    CHECK_INT(m.type, ==, PROTO_REFUSE);
    CHECK_CONTAINS(m.refuse.message, needle);
    printf("  refused: %s\n", m.refuse.message);
}

/* A healthy client still gets answers. */
static void still_serving(struct client *c)
{
    char *json = NULL, err[256];
    int status = -1;
    CHECK_OK(client_query(c, PROTO_Q_STATUS, 0, &json, &status, err, sizeof err));
    CHECK_INT(status, ==, 0);
    CHECK_CONTAINS(json, "\"state\":\"running\"");
    free(json);
}

/* Open descriptors of the coordinator process. */
static int coord_fds(void)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)TC.coord);
    DIR *d = opendir(path);
    CHECK(d);
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* A peer that never says HELLO is refused after the HELLO timeout (5 s). */
static void silent_peer_refused(void)
{
    int fd = raw_connect();
    struct timeval tv = { 15, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t buf[4096];
    size_t n = 0;
    ssize_t k;
    uint64_t t0 = mono_ms();
    while ((k = recv(fd, buf + n, sizeof buf - n, 0)) > 0)
        n += (size_t)k;
    close(fd);
    CHECK(mono_ms() - t0 >= 4000);
    struct proto_msg m;
    char err[256];
    CHECK_OK(proto_decode(buf, n, &m, err, sizeof err));
    CHECK_INT(m.type, ==, PROTO_REFUSE);
    CHECK_CONTAINS(m.refuse.message, "no HELLO within 5000 ms");
    printf("  refused: %s\n", m.refuse.message);
}

/* A ctl peer that sends queries and never reads the replies: closed once 32 MiB wait for it,
 * its descriptor gone within the close grace although it still reads nothing; meanwhile the
 * coordinator serves the others. */
static void deaf_peer_closed(struct client *c)
{
    int base = coord_fds(), prev = -1;
    for (int i = 0; i < 50 && base != prev; i++) {      /* a peer closed just before may still be going */
        tc_sleep_ms(100);
        prev = base;
        base = coord_fds();
    }
    int fd = raw_connect();
    uint8_t frame[512] __attribute__((aligned(8)));
    struct proto_msg h = { .type = PROTO_HELLO };
    h.hello.role = PROTO_ROLE_CTL;
    h.hello.device = -1;
    h.hello.pid = (uint32_t)getpid();
    h.hello.group_rank = PROTO_NONE32;
    int64_t n = proto_encode(&h, frame, sizeof frame, NULL, 0);
    CHECK(n > 0 && send(fd, frame, (size_t)n, MSG_NOSIGNAL) == n);
    struct proto_msg q = { .type = PROTO_QUERY, .query = { PROTO_Q_STATUS, 0 } };
    n = proto_encode(&q, frame, sizeof frame, NULL, 0);
    CHECK(n > 0);
    /* Queries until a send fails: the coordinator reads them until 32 MiB of replies wait, then
     * closes us and reads no more (a send blocked that long: a stall of the coordinator would
     * be far shorter). */
    struct timeval tv = { 3 * test_time_scale(), 0 };
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int sent = 0;
    uint64_t end = mono_ms() + 60000 * (uint64_t)test_time_scale();
    while (mono_ms() < end && send(fd, frame, (size_t)n, MSG_NOSIGNAL) == n)
        sent++;
    still_serving(c);
    int fds = coord_fds();
    end = mono_ms() + 20000 * (uint64_t)test_time_scale();
    while (fds > base && mono_ms() < end) {
        tc_sleep_ms(100);
        fds = coord_fds();
    }
    CHECK_INT(fds, ==, base);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "grep -q 'does not read what it is sent' '%s/coordinator.log'", TC.dir);
    CHECK_INT(system(cmd), ==, 0);
    close(fd);
    still_serving(c);
    printf("  a peer that does not read: closed after %d queries\n", sent);
}

/* dflashctl connections left open (a leaky monitoring loop) stop at COORD_CTL_MAX: the next is
 * refused with the reason, not left to use up the coordinator's descriptors, after which every
 * connection (a daemon's reconnect too) was dropped without a word. One closed makes room. */
static void ctl_cap(struct client *c)
{
    struct client *open_ctl[COORD_CTL_MAX];
    struct client_opts o = { .socket_path = TC.sock, .role = PROTO_ROLE_CTL, .device = -1, .name = "leaky" };
    char err[512];
    int n = 0;
    for (; n < COORD_CTL_MAX - 2; n++)      /* c and the idle one are two */
        CHECK_OK(client_open(&open_ctl[n], &o, err, sizeof err));
    struct client *more = NULL;
    CHECK_INT(client_open(&more, &o, err, sizeof err), <, 0);
    CHECK_CONTAINS(err, "dflashctl connections are open already (at most 64");
    still_serving(c);
    client_free(open_ctl[--n]);
    uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    int r;
    while ((r = client_open(&more, &o, err, sizeof err)) < 0 && mono_ms() < end)
        tc_sleep_ms(20);        /* (the close is seen on the coordinator's next loop turn) */
    CHECK_OK(r);
    client_free(more);
    while (n)
        client_free(open_ctl[--n]);
    printf("  ctl connections: the %dth refused: %s\n", COORD_CTL_MAX + 1, err);
}

/* A dflashctl connection that asks nothing for COORD_CTL_IDLE_MS is closed, its heartbeats
 * notwithstanding (each holds a descriptor of the coordinator's); one that asks stays open.
 * `idle` was opened at opened_ms and has sent nothing but heartbeats since. */
static void ctl_idle_closed(struct client *c, struct client *idle, uint64_t opened_ms)
{
    char err[256], cmd[600];
    snprintf(cmd, sizeof cmd, "grep -q 'idle-ctl (pid %d): dflashctl connection closed: no request for' "
             "'%s/coordinator.log'", (int)getpid(), TC.dir);
    uint64_t early = opened_ms + COORD_CTL_IDLE_MS - 5000;
    uint64_t end = opened_ms + COORD_CTL_IDLE_MS + 10000 * (uint64_t)test_time_scale();
    int closed = 0, polls = 0;
    while (!closed && mono_ms() < end) {
        CHECK_OK(client_idle(idle, 0, err, sizeof err));       /* its heartbeats, if due */
        still_serving(c);                                       /* a request every 2 s */
        closed = system(cmd) == 0;
        if (closed && mono_ms() < early)
            TEST_FAIL("the idle dflashctl connection was closed after %" PRIu64 " ms, before %d",
                      mono_ms() - opened_ms, COORD_CTL_IDLE_MS);
        if (!closed)
            tc_sleep_ms(2000);
        polls++;
    }
    if (!closed)
        TEST_FAIL("the idle dflashctl connection is still open %" PRIu64 " ms after it was opened",
                  mono_ms() - opened_ms);
    snprintf(cmd, sizeof cmd, "grep -q 'test (pid %d): dflashctl connection closed' '%s/coordinator.log'",
             (int)getpid(), TC.dir);
    CHECK_INT(system(cmd), !=, 0);                              /* the one asking was not */
    still_serving(c);
    printf("  an idle dflashctl connection closed after %" PRIu64 " ms (%d polls)\n", mono_ms() - opened_ms,
           polls);
}

/* In a child: become uid/gid (with supplementary group `extra` unless it is -1), then try to
 * talk; returns the child's exit code: 0 = served, 2 = refused by the coordinator, 3 = connect
 * failed (kernel said no). */
static int as_user(uid_t uid, gid_t gid, gid_t extra)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (setgroups(extra == (gid_t)-1 ? 0 : 1, &extra) < 0 || setgid(gid) < 0 || setuid(uid) < 0)
            _exit(9);
        struct client_opts o = { .socket_path = TC.sock, .role = PROTO_ROLE_CTL, .device = -1 };
        struct client *c;
        char err[512];
        int r = client_open(&c, &o, err, sizeof err);
        fprintf(stderr, "  uid %d gid %d: %s\n", (int)uid, (int)gid, r < 0 ? err : "served");
        if (r == -DF_EPEER) {
            if (!strstr(err, "is not allowed"))
                _exit(8);
            _exit(2);
        }
        if (r == -EACCES && !strstr(err, "the socket admits the coordinator's user and the members of its cluster.group"))
            _exit(7);   /* a bare "Permission denied" says nothing of what to do */
        _exit(r < 0 ? 3 : 0);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void)
{
    atexit(cleanup);
    struct group *ng = getgrnam("nogroup");
    struct passwd *nobody = getpwnam("nobody");
    char grp_line[96] = "";
    if (ng)
        snprintf(grp_line, sizeof grp_line, "group = nogroup\n");
    tc_setup(grp_line, NULL);
    tc_dataset(TC.data, 100, 8, 100, 500);
    tc_start_coord();
    struct client *c = tc_ctl(1000);
    CHECK(c);
    still_serving(c);
    /* Left idle through the checks below, then expected closed. */
    struct client_opts io = { .socket_path = TC.sock, .role = PROTO_ROLE_CTL, .device = -1, .name = "idle-ctl" };
    struct client *idle = NULL;
    char ierr[512];
    uint64_t idle_opened = mono_ms();
    CHECK_OK(client_open(&idle, &io, ierr, sizeof ierr));

    const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    expect_refused(garbage, sizeof garbage - 1, 0, "bad frame magic");
    still_serving(c);

    /* A frame header announcing more than the maximum. */
    struct proto_hdr h = { PROTO_MAGIC, PROTO_MAX_FRAME, PROTO_VERSION, PROTO_HELLO };
    expect_refused(&h, sizeof h, 0, "exceeds");
    /* A type only the coordinator sends (its length may be up to PROTO_MAX_FRAME) announcing 1 MiB:
     * refused from the header, nothing buffered. */
    struct proto_hdr big = { PROTO_MAGIC, 1u << 20, PROTO_VERSION, PROTO_GROUP };
    expect_refused(&big, sizeof big, 0, "no message to the coordinator is over 64 KiB");

    /* Wrong version: a clear answer naming both versions. */
    uint8_t frame[512] __attribute__((aligned(8)));
    struct proto_msg m = { .type = PROTO_HELLO };
    m.hello.role = PROTO_ROLE_TARGET;
    m.hello.pid = (uint32_t)getpid();
    int64_t n = proto_encode(&m, frame, sizeof frame, NULL, 0);
    CHECK(n > 0);
    ((struct proto_hdr *)frame)->version = PROTO_VERSION + 7;
    char speaks[64];
    snprintf(speaks, sizeof speaks, "this coordinator speaks protocol version %u", PROTO_VERSION);
    expect_refused(frame, (size_t)n, 0, speaks);
    ((struct proto_hdr *)frame)->version = PROTO_VERSION;

    /* A HELLO whose pid/start time do not match the socket peer. */
    expect_refused(frame, (size_t)n, 0, "the socket peer is pid");
    /* Its pid and start time right, its owner token not: the token is named. */
    uint64_t ticks = 0;
    CHECK_OK(proc_start_time(getpid(), &ticks));
    m.hello.start_ticks = ticks;
    m.hello.token = proc_token_make(getpid(), ticks) ^ 1;
    CHECK_INT(proto_encode(&m, frame, sizeof frame, NULL, 0), ==, n);
    expect_refused(frame, (size_t)n, 0, "owner token");

    /* Truncated frame, then the peer goes away: dropped without harm. */
    expect_refused(frame, (size_t)n - 10, 1, NULL);

    /* First message not HELLO. */
    struct proto_msg q = { .type = PROTO_QUERY, .query = { PROTO_Q_STATUS, 0 } };
    n = proto_encode(&q, frame, sizeof frame, NULL, 0);
    expect_refused(frame, (size_t)n, 0, "first message must be HELLO");
    still_serving(c);

    silent_peer_refused();
    deaf_peer_closed(c);
    still_serving(c);
    ctl_cap(c);
    still_serving(c);
    ctl_idle_closed(c, idle, idle_opened);
    client_free(idle);

    /* The socket itself is 0660. */
    struct stat st;
    CHECK_OK(stat(TC.sock, &st));
    CHECK_INT(st.st_mode & 0777, ==, 0660);

    if (getuid() != 0 || !nobody || !ng) {
        client_free(c);
        printf("access ok (uid checks skipped: not root or no nobody/nogroup)\n");
        return 0;
    }
    /* nobody can reach the socket (dir and socket opened up as a careless admin might)
     * but is not allowed by SO_PEERCRED unless in cluster.group. */
    CHECK_OK(chmod(TC.dir, 0755));
    CHECK_OK(chmod(TC.sock, 0666));
    gid_t other = ng->gr_gid == 65533 ? 65532 : 65533;
    CHECK_INT(as_user(nobody->pw_uid, other, (gid_t)-1), ==, 2);
    CHECK_INT(as_user(nobody->pw_uid, ng->gr_gid, (gid_t)-1), ==, 0);   /* cluster.group = nogroup */
    CHECK_INT(as_user(nobody->pw_uid, other, ng->gr_gid), ==, 0);       /* ... as a supplementary group */
    /* With the intended mode the kernel already says no. */
    CHECK_OK(chmod(TC.sock, 0660));
    CHECK_INT(as_user(nobody->pw_uid, other, (gid_t)-1), ==, 3);
    still_serving(c);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "grep -q 'refused peer .*uid %d gid %d' '%s/coordinator.log'", (int)nobody->pw_uid,
             (int)other, TC.dir);
    CHECK_INT(system(cmd), ==, 0);                           /* and it was logged */
    client_free(c);
    printf("access ok\n");
    return 0;
}
