/* test_coordinator_lease.c: a batch a drafter reports TRAINED while a target still holds its
 * lease (a TRAINED that was in flight across a group restart) is taken back from the target
 * with LEASE_REVOKE, so it is not published and trained a second time. */
#include "tests/test_coord_util.h"

static pid_t drafter;

static void cleanup(void)
{
    tc_kill(drafter);
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

/* Drafter (forked): join, wait for GROUP, report the batch read from `in` as trained at step 1,
 * exit 0 once the coordinator acknowledged it without complaint. */
static void drafter_main(int in)
{
    struct client *c = peer_connect(PROTO_ROLE_DRAFTER, 5);
    char err[512];
    struct proto_msg m;
    CHECK_OK(client_join_group(c));
    uint64_t gen = 0, end = mono_ms() + 10000;
    while (!gen && mono_ms() < end)
        if (client_poll(c, 100, &m, err, sizeof err) == 1 && m.type == PROTO_GROUP)
            gen = m.group.generation;
    if (!gen)
        _exit(10);
    uint64_t batch;
    if (read(in, &batch, sizeof batch) != sizeof batch)
        _exit(11);
    CHECK_OK(client_trained(c, batch, 1 /* its first lease */, 1, 0, gen));
    struct client_stats st;
    end = mono_ms() + 10000;
    do {
        client_poll(c, 50, &m, err, sizeof err);
        client_get_stats(c, &st);
    } while (st.outbox && mono_ms() < end);
    _exit(st.outbox ? 12 : st.nacks ? 13 : 0);
}

int main(void)
{
    atexit(cleanup);
    tc_setup(NULL, NULL);
    tc_dataset(TC.data, 100, 8, 100, 500);
    tc_start_coord();

    int fds[2];
    CHECK(pipe(fds) == 0);
    drafter = fork();
    CHECK(drafter >= 0);
    if (drafter == 0) {
        close(fds[1]);
        drafter_main(fds[0]);
    }
    close(fds[0]);

    struct client_opts o = { .socket_path = TC.sock, .role = PROTO_ROLE_TARGET, .device = 0 };
    struct client *t;
    char err[512];
    CHECK_OK(client_open(&t, &o, err, sizeof err));
    CHECK_OK(client_lease_request(t, 1));
    struct proto_msg m;
    uint64_t batch = UINT64_MAX, end = mono_ms() + 5000;
    while (batch == UINT64_MAX && mono_ms() < end)
        if (client_poll(t, 100, &m, err, sizeof err) == 1 && m.type == PROTO_LEASE_GRANT)
            batch = m.grant.batch_id;
    CHECK(batch != UINT64_MAX);
    CHECK(client_lease_held(t, batch));

    /* the drafter trains it before this target published it */
    CHECK(write(fds[1], &batch, sizeof batch) == sizeof batch);
    /* Wait for the drafter and for the REVOKE, polling all along (heartbeats). */
    int st = 0, revoked = 0;
    end = mono_ms() + 15000;
    while ((drafter || !revoked) && mono_ms() < end) {
        m.type = 0;
        if (client_poll(t, 50, &m, err, sizeof err) == 1 && m.type == PROTO_LEASE_REVOKE)
            revoked |= m.batch.batch_id == batch;
        if (drafter && waitpid(drafter, &st, WNOHANG) == drafter) {
            drafter = 0;
            CHECK(WIFEXITED(st));
            CHECK_INT(WEXITSTATUS(st), ==, 0);
        }
        if (!drafter && !revoked && end > mono_ms() + 3000)
            end = mono_ms() + 3000;     /* trained and acknowledged: the REVOKE follows at once */
    }
    CHECK(!drafter);
    CHECK(revoked);
    CHECK(!client_lease_held(t, batch));
    CHECK_INT(tc_status_num("batches.leased"), ==, 0);
    client_free(t);
    printf("lease of a trained batch revoked\n");
    return 0;
}
