/* coord_bench.c: coordinator-d round trips: LEASE_REQUEST -> LEASE_GRANT (ledger commit
 * included: WAL + fsync), PUBLISHED -> ACK, and the latency of a `dflashctl status`
 * (connect + HELLO + QUERY + JSON). Usage: coord_bench [SECONDS_EACH] (TMPDIR = state dir). */
#include <sys/socket.h>
#include "daemons/coordinator/ledger.c"
#include "tests/test_coord_util.h"

static void cleanup(void)
{
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *lat, int n, double secs)
{
    qsort(lat, (size_t)n, sizeof *lat, cmp_d);
    printf("%-28s %8.0f /s   p50 %7.1f us   p99 %7.1f us   (%d in %.1f s)\n", what, n / secs, lat[n / 2],
           lat[(int)(n * 0.99)], n, secs);
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 2.0;
    atexit(cleanup);
    tc_setup(NULL, "epochs = 1000\n");
    tc_dataset(TC.data, 20000, 8, 64, 1000);
    tc_start_coord();
    struct client_opts o = { .socket_path = TC.sock, .role = PROTO_ROLE_TARGET, .device = 0 };
    struct client *c;
    char err[512];
    CHECK_OK(client_open(&c, &o, err, sizeof err));
    static double lat[1 << 20];
    int n = 0;

    /* 1. lease round trip: request one, wait for the grant, give it back. */
    uint64_t end = mono_ns() + (uint64_t)(secs * 1e9);
    while (mono_ns() < end && n < (1 << 20)) {
        uint64_t t0 = mono_ns();
        CHECK_OK(client_lease_request(c, 1));
        struct proto_msg m;
        int got;
        while ((got = client_poll(c, 1000, &m, err, sizeof err)) == 1 && m.type != PROTO_LEASE_GRANT)
            ;
        CHECK_INT(got, ==, 1);
        lat[n++] = (double)(mono_ns() - t0) / 1e3;
        client_lease_return(c, m.grant.batch_id);
    }
    report("lease request -> grant", lat, n, secs);

    /* 2. publish round trip: lease, PUBLISHED, wait for its ACK (a durable ledger write). */
    n = 0;
    end = mono_ns() + (uint64_t)(secs * 1e9);
    while (mono_ns() < end && n < (1 << 20)) {
        CHECK_OK(client_lease_request(c, 1));
        struct proto_msg m;
        while (client_poll(c, 1000, &m, err, sizeof err) == 1 && m.type != PROTO_LEASE_GRANT)
            ;
        uint64_t t0 = mono_ns();
        client_published(c, m.grant.batch_id, 0, m.grant.n_tokens);
        struct client_stats st;
        do {
            client_poll(c, 1, &m, err, sizeof err);
            client_get_stats(c, &st);
        } while (st.outbox);
        lat[n++] = (double)(mono_ns() - t0) / 1e3;
    }
    report("published -> ack", lat, n, secs);
    client_free(c);

    /* 3. dflashctl status: a fresh connection each time, as the CLI does. */
    n = 0;
    end = mono_ns() + (uint64_t)(secs * 1e9);
    while (mono_ns() < end && n < (1 << 20)) {
        uint64_t t0 = mono_ns();
        struct client *q = tc_ctl(0);
        CHECK(q);
        char *json;
        int status;
        CHECK_OK(client_query(q, PROTO_Q_STATUS, 0, &json, &status, err, sizeof err));
        free(json);
        client_free(q);
        lat[n++] = (double)(mono_ns() - t0) / 1e3;
    }
    report("status (connect+query)", lat, n, secs);

    /* References in the same run: a bare unix-socket round trip between two processes,
     * and one durable SQLite commit (WAL, synchronous=FULL) on the same file system. */
    int sv[2];
    CHECK_OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    pid_t echo = fork();
    if (echo == 0) {
        char b[64];
        close(sv[0]);
        while (read(sv[1], b, sizeof b) > 0)
            if (write(sv[1], b, 32) != 32)
                break;
        _exit(0);
    }
    close(sv[1]);
    n = 0;
    end = mono_ns() + (uint64_t)(secs * 1e9);
    char b[64] = { 0 };
    while (mono_ns() < end && n < (1 << 20)) {
        uint64_t t0 = mono_ns();
        CHECK_INT(write(sv[0], b, 32), ==, 32);
        CHECK_INT(read(sv[0], b, sizeof b), ==, 32);
        lat[n++] = (double)(mono_ns() - t0) / 1e3;
    }
    close(sv[0]);
    waitpid(echo, NULL, 0);
    report("ref: socket round trip", lat, n, secs);
    char path[512];
    snprintf(path, sizeof path, "%s/ref.db", TC.dir);
    struct ledger *l;
    CHECK_OK(ledger_open(&l, path, err, sizeof err));
    n = 0;
    end = mono_ns() + (uint64_t)(secs * 1e9);
    while (mono_ns() < end && n < (1 << 20)) {
        uint64_t t0 = mono_ns();
        CHECK_OK(ledger_meta_set_u64(l, "k", (uint64_t)n));
        CHECK_OK(ledger_commit(l, err, sizeof err));
        lat[n++] = (double)(mono_ns() - t0) / 1e3;
    }
    ledger_close(l);
    report("ref: one durable commit", lat, n, secs);
    return 0;
}
