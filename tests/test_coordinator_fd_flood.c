/* test_coordinator_fd_flood.c: connections that never say HELLO cannot use up the coordinator's
 * descriptors. Run under a limit of 128 open files (soft and hard, so it cannot raise it), the
 * coordinator is sent 200 connections that say nothing: at most UNIX_PENDING_MAX (64) of them
 * wait, the one waiting longest closed for each newcomer ("... waiting for their HELLO"), so
 * dflashctl and a drafter still get in at once. Before, the connections past the limit, theirs
 * among them, were closed by libuv's accept unseen, no line logged. Its start logs the limit. */
#include <sys/socket.h>
#include <sys/un.h>
#include "tests/test_coord_util.h"

#define FLOOD 200

static void cleanup(void)
{
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

static int log_has(const char *text)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "grep -qF -- '%s' '%s/coordinator.log'", text, TC.dir);
    return system(cmd) == 0;
}

int main(void)
{
    const char *prlimit = "/usr/bin/prlimit";
    if (access(prlimit, X_OK) != 0) {
        puts("SKIP: no /usr/bin/prlimit (util-linux)");
        return 77;
    }
    atexit(cleanup);
    tc_setup(NULL, NULL);
    tc_dataset(TC.data, 50, 8, 100, 500);
    char log[400];
    snprintf(log, sizeof log, "%s/coordinator.log", TC.dir);
    char *argv[] = { (char *)prlimit, "--nofile=128:128", (char *)tc_bin("bin/coordinator-d"), "-c", TC.ini, NULL };
    TC.coord = tc_spawn(argv, log);
    struct client *c = tc_ctl(20000);
    CHECK(c);
    client_free(c);
    CHECK(log_has("open files: up to 128"));

    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(TC.sock) >= sizeof sa.sun_path)
        TEST_FAIL("socket path too long: %s", TC.sock);
    memcpy(sa.sun_path, TC.sock, strlen(TC.sock) + 1);
    int fds[FLOOD];
    for (int i = 0; i < FLOOD; i++) {
        fds[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(fds[i] >= 0);
        if (connect(fds[i], (struct sockaddr *)&sa, sizeof sa) < 0)
            TEST_FAIL("connect %d: %s", i, strerror(errno));
    }
    tc_sleep_ms(200);
    c = tc_ctl(3000);
    if (!c)
        TEST_FAIL("dflashctl's connection was not taken after %d silent ones", FLOOD);
    client_free(c);
    cJSON *s = tc_query(PROTO_Q_STATUS);
    CHECK(s);
    cJSON_Delete(s);
    struct client_opts o = { .socket_path = TC.sock, .role = PROTO_ROLE_DRAFTER, .device = 3 };
    char err[512];
    struct client *d = NULL;
    if (client_open(&d, &o, err, sizeof err) < 0)
        TEST_FAIL("a drafter was not taken after %d silent connections: %s", FLOOD, err);
    client_free(d);
    CHECK(log_has("64 connections waiting for their HELLO: the one waiting longest is closed"));
    /* the oldest ones were closed (what they read: a REFUSE, then the end) */
    int closed = 0;
    for (int i = 0; i < FLOOD; i++) {
        char buf[4096];
        ssize_t n;
        while ((n = recv(fds[i], buf, sizeof buf, MSG_DONTWAIT)) > 0)
            ;
        closed += n == 0;
        close(fds[i]);
    }
    if (closed < FLOOD - 64)
        TEST_FAIL("%d of the %d silent connections closed, wanted at least %d", closed, FLOOD, FLOOD - 64);
    printf("ok: %d silent connections, %d closed; dflashctl and a drafter taken at once\n", FLOOD, closed);
    return 0;
}
