/* test_coordinator_stall.c: the coordinator's event loop held up (a ledger write waiting on the
 * disk) must not cost its daemons their connections. The test takes the ledger's write lock from
 * a second SQLite connection, so the coordinator's next write (a lease grant, inside its socket
 * handling) waits in SQLite's busy handler: the loop is stuck for several times dead_after_ms
 * while two targets keep sending heartbeats it cannot read. When the lock goes, the periodic
 * check runs before the sockets are read: it must judge no heartbeat then (it would find every
 * daemon silent), count the stall and log it; the next check, after the reads, finds all alive. */
#include <sqlite3.h>
#include "tests/test_coord_util.h"

/* The stall is not scaled: it must stay well under the coordinator's SQLite busy timeout (5 s: a
 * lock held longer fails the write, and the coordinator exits to restart). dead_after_ms is 4x
 * longer under the sanitizers (heartbeats come later there), still under the stall. */
enum { STALL_MS = 3000 };
#define DEAD_AFTER_MS (test_time_scale() > 1 ? 2000 : 500)

static pid_t other;

/* Poll c for ms (it sends its heartbeat when due); the first grant's time goes to *granted_ms.
 * Fails when c loses its connection. */
static void poll_for(struct client *c, int ms, uint64_t *granted_ms)
{
    uint64_t end = mono_ms() + (uint64_t)ms;
    struct proto_msg m;
    char err[256];
    while (mono_ms() < end) {
        int got = client_poll(c, 5, &m, err, sizeof err);
        if (got < 0)
            TEST_FAIL("target 0: %s", err);
        if (got > 0 && m.type == PROTO_LEASE_GRANT && !*granted_ms)
            *granted_ms = mono_ms();
    }
}

/* The second target (a process is one member): heartbeats only, for ms; its exit status says
 * whether it kept its connection all along (0) or not. */
static pid_t fork_heartbeater(int ms)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid)
        return pid;
    struct client *c = peer_connect(PROTO_ROLE_TARGET, 1);
    uint64_t end = mono_ms() + (uint64_t)ms;
    struct proto_msg m;
    char err[256];
    while (mono_ms() < end)
        if (client_poll(c, 10, &m, err, sizeof err) < 0)
            _exit(6);
    struct client_stats st;
    client_get_stats(c, &st);
    _exit(st.reconnects ? 9 : 0);
}

static int log_has(const char *what)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "grep -q -- '%s' '%s/coordinator.log'", what, TC.dir);
    return system(cmd) == 0;
}

static void cleanup(void)
{
    tc_kill(other);
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

int main(void)
{
    atexit(cleanup);
    char extra[200];
    snprintf(extra, sizeof extra, "[coordinator]\ndead_after_ms = %d\n", DEAD_AFTER_MS);
    tc_setup(NULL, extra);
    tc_dataset(TC.data, 200, 16, 64, 1000);
    tc_start_coord();

    int scale = test_time_scale(), stall = STALL_MS, after = 3 * DEAD_AFTER_MS;
    other = fork_heartbeater(300 + stall + after + 1000 * scale);
    struct client *c = peer_connect(PROTO_ROLE_TARGET, 0);
    uint64_t granted = 0;
    poll_for(c, 300, &granted);         /* both known and heartbeating */
    double stalls0 = tc_status_num("coordinator.stalls");
    CHECK(stalls0 >= 0);

    sqlite3 *db;
    CHECK_INT(sqlite3_open(TC.ledger, &db), ==, SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    CHECK_INT(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), ==, SQLITE_OK);
    uint64_t asked = mono_ms();
    CHECK_OK(client_lease_request(c, 1));
    poll_for(c, stall, &granted);
    CHECK(!granted);                    /* the grant waits for the ledger */
    CHECK_INT(sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL), ==, SQLITE_OK);
    sqlite3_close(db);

    poll_for(c, after, &granted);
    CHECK(granted);
    printf("lease granted %llu ms after it was asked for (the loop held up meanwhile)\n",
           (unsigned long long)(granted - asked));
    CHECK_INT(granted - asked, >=, (uint64_t)stall);

    cJSON *s = tc_query(PROTO_Q_STATUS);
    CHECK(s);
    double stalls = tc_num(s, "coordinator.stalls"), longest = tc_num(s, "coordinator.stall_ms_max");
    printf("coordinator: %g stalls, longest %g ms\n", stalls, longest);
    CHECK(stalls > stalls0);
    CHECK(longest >= stall);
    int alive = 0, left = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(s, "daemons")) {
        alive += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "alive"));
        left += cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(d, "alive"));
    }
    cJSON_Delete(s);
    CHECK(log_has("event loop was held up"));
    CHECK(!log_has("no heartbeat for"));
    CHECK_INT(left, ==, 0);             /* no daemon was taken for dead ... */
    CHECK_INT(alive, ==, 2);
    struct client_stats st;
    client_get_stats(c, &st);
    CHECK_INT(st.reconnects, ==, 0);
    client_free(c);
    CHECK_INT(tc_exit_status(other, 5000 * scale), ==, 0);     /* it kept its connection too */
    other = 0;
    printf("coordinator stall ok\n");
    return 0;
}
