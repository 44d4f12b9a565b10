/* test_coordinator_skip.c: a drafter that took a batch from its slot but did not train it
 * (a skipped non-finite step) reports it; the coordinator queues the batch again and a
 * target publishes it anew, so the run can still train every batch exactly once. A late report
 * about an earlier copy (lease number) changes nothing; a report that arrives before the
 * target's PUBLISHED (the drafter read the slot first) still counts. */
#include <poll.h>
#include "tests/test_coord_util.h"

static pid_t target, publisher;

static void cleanup(void)
{
    tc_kill(publisher);
    tc_kill(target);
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

struct copy {
    uint64_t id;
    uint32_t lease;
};

/* Claim the next READY slot (waiting up to 10 s) and return the batch copy it holds; the slot
 * is freed unless keep is given, which then receives the slot still READING. */
static struct copy take_one(struct client *d, struct ring *r, unsigned *keep)
{
    struct ring_pick pick = { .policy = RING_PICK_OLDEST, .min_ready = 1 };
    char err[512];
    struct proto_msg m;
    uint64_t end = mono_ms() + 10000 * (uint64_t)test_time_scale();
    unsigned slot;
    int rr;
    while ((rr = ring_claim_read(r, &pick, 50, &slot)) == -DF_ETIMEOUT && mono_ms() < end)
        client_poll(d, 0, &m, err, sizeof err);     /* keep heartbeating */
    CHECK_OK(rr);
    struct copy c = { ring_slot_header(r, slot)->batch_id, ring_slot_header(r, slot)->lease };
    if (keep)
        *keep = slot;
    else
        CHECK_OK(ring_release(r, slot));
    return c;
}

/* Wait (up to 5 s, scaled) until the batch is queued again (nobody leases it meanwhile); d
 * (may be NULL) keeps its connection meanwhile. */
static void wait_queued(uint64_t id, struct client *d)
{
    char err[256];
    uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    while (strcmp(tc_batch_state(id), "queued") && mono_ms() < end)
        if (d)
            client_poll(d, 50, &(struct proto_msg){ 0 }, err, sizeof err);
        else
            tc_sleep_ms(50);
    if (strcmp(tc_batch_state(id), "queued"))
        TEST_FAIL("batch %llu stayed %s, not queued again", (unsigned long long)id, tc_batch_state(id));
}

/* The report before the publication: a target (a child) publishes into the ring and tells us;
 * the drafter reads and skips the batch; only then does the target send PUBLISHED. With restart
 * the coordinator restarts between the two. */
static void skip_before_published(struct client *d, struct ring *r, int restart)
{
    int ready[2], go[2];
    CHECK(pipe(ready) == 0 && pipe(go) == 0);
    pid_t pub = publisher = fork();
    CHECK(pub >= 0);
    if (pub == 0) {
        publisher = 0;      /* its own exit kills nothing */
        struct client *t = peer_connect(PROTO_ROLE_TARGET, 1);
        struct ring *tr = peer_ring();
        struct dataset ds;
        char err[512];
        struct proto_msg m;
        if (dataset_open(&ds, TC.data, DATASET_OPEN_NO_CHECKSUM, err, sizeof err) < 0 || client_lease_request(t, 1) < 0)
            _exit(5);
        int got = 0;
        uint64_t until = mono_ms() + 10000 * (uint64_t)test_time_scale();
        while (!(got == 1 && m.type == PROTO_LEASE_GRANT))
            if ((got = client_poll(t, 50, &m, err, sizeof err)) < 0 || mono_ms() > until)
                _exit(6);
        unsigned ws;
        if (ring_claim_write(tr, 5000, &ws) < 0)
            _exit(7);
        int n = tc_fill_publish(t, tr, &ds, m.grant.batch_id, m.grant.epoch, m.grant.n_tokens, ws);
        uint64_t id = m.grant.batch_id;
        if (n < 0 || write(ready[1], &id, sizeof id) != sizeof id)
            _exit(8);
        char c;
        struct pollfd pf = { .fd = go[0], .events = POLLIN };
        while (poll(&pf, 1, 0) == 0)
            if (client_poll(t, 20, &m, err, sizeof err) < 0)      /* heartbeats meanwhile */
                _exit(9);
        if (read(go[0], &c, 1) != 1 || client_published(t, id, ws, (uint32_t)n) < 0)
            _exit(10);
        for (;;)
            if (client_poll(t, 50, &m, err, sizeof err) < 0)
                _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    char err[512];
    struct pollfd pf = { .fd = ready[0], .events = POLLIN };
    while (poll(&pf, 1, 20) == 0)
        client_poll(d, 0, &(struct proto_msg){ 0 }, err, sizeof err);     /* heartbeats meanwhile */
    uint64_t id = 0;
    if (read(ready[0], &id, sizeof id) != sizeof id) {
        int st = 0;
        waitpid(pub, &st, 0);
        publisher = 0;
        TEST_FAIL("the publishing target exited (status %d) before it published", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    struct copy early = take_one(d, r, NULL);
    CHECK_INT(early.id, ==, id);
    CHECK_OK(client_batch_skipped(d, early.id, early.lease));
    tc_wait_acked(d, 5000);     /* the report first: the batch is still LEASED for the coordinator */
    CHECK_STR(tc_batch_state(id), "leased");
    if (restart) {
        /* The report is acknowledged (it will not be sent again); then the coordinator restarts
         * before the PUBLISHED: what the report said must have been kept. */
        struct client_stats st;
        uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
        do {
            client_poll(d, 10, &(struct proto_msg){ 0 }, err, sizeof err);
            client_get_stats(d, &st);
        } while (st.outbox && mono_ms() < end);
        CHECK_INT(st.outbox, ==, 0);
        tc_kill(TC.coord);
        tc_start_coord();
        /* the drafter back in its group, past the recovery window (600 ms): the group holds */
        end = mono_ms() + 1500 * (uint64_t)test_time_scale();
        while (mono_ms() < end)
            client_poll(d, 50, &(struct proto_msg){ 0 }, err, sizeof err);
        CHECK(client_connected(d));
        CHECK_STR(tc_batch_state(id), "leased");
    }
    CHECK(write(go[1], "g", 1) == 1);
    wait_queued(id, d);    /* without the fix it stays "published" in no slot: never trained */
    printf("batch %llu, skipped before its PUBLISHED arrived%s, queued again\n", (unsigned long long)id,
           restart ? " (the coordinator restarted in between)" : "");
    tc_kill(pub);
    publisher = 0;
    close(ready[0]);
    close(go[1]);
}

int main(void)
{
    atexit(cleanup);
    tc_setup(NULL, NULL);
    tc_dataset(TC.data, 60, 8, 100, 500);
    tc_start_coord();
    tc_shared_init();
    target = tc_fork_target(0, 0, NULL);

    struct client *d = peer_connect(PROTO_ROLE_DRAFTER, 0);
    struct ring *r = peer_ring();
    /* In a group (of one): a restarted coordinator then leaves published batches alone at the
     * end of its recovery window (the group may still report them). */
    CHECK(tc_join_group(d, 10000).generation);
    struct copy skipped = take_one(d, r, NULL);
    CHECK_INT(skipped.lease, ==, 1);
    CHECK_INT(tc_status_num("batches.requeued"), ==, 0);
    CHECK_OK(client_batch_skipped(d, skipped.id, skipped.lease));
    tc_wait_num("batches.requeued", 1, 5000);

    /* The target publishes it again (its second lease); other batches pass by meanwhile. */
    unsigned slot = 0;
    int seen = 0, n_passed = 0;
    struct copy passed[200], again = { 0 };
    for (int i = 0; i < 200 && !seen; i++) {
        struct copy c = take_one(d, r, &slot);
        seen = c.id == skipped.id;
        if (seen) {
            again = c;
        } else {
            CHECK_OK(ring_release(r, slot));
            passed[n_passed++] = c;
        }
    }
    CHECK(seen);
    CHECK_INT(again.lease, ==, 2);
    /* While it sits in a slot (READING here), a stray report must not re-queue it. */
    CHECK_OK(client_batch_skipped(d, again.id, again.lease));
    tc_wait_acked(d, 5000);     /* handled: it must have had no effect */
    CHECK_INT(tc_status_num("batches.requeued"), ==, 1);
    CHECK_STR(tc_batch_state(skipped.id), "published");
    CHECK_OK(ring_release(r, slot));
    /* Taken from the ring now (its training report on its way, say): a late report about the
     * first copy must not queue it a third time; it would then be trained twice. */
    CHECK_OK(client_batch_skipped(d, skipped.id, skipped.lease));
    tc_wait_acked(d, 5000);
    CHECK_INT(tc_status_num("batches.requeued"), ==, 1);
    CHECK_STR(tc_batch_state(skipped.id), "published");
    CHECK_OK(client_batch_skipped(d, again.id, again.lease));
    tc_wait_num("batches.requeued", 2, 5000);
    for (int i = 0; i < n_passed; i++)     /* they were taken without training too */
        CHECK_OK(client_batch_skipped(d, passed[i].id, passed[i].lease));
    printf("skipped batch %llu published again; a late report of its first copy ignored\n",
           (unsigned long long)skipped.id);

    /* A TRAINED of a generation never formed (a confused peer's) changes nothing: rank 0 has
     * taken a batch from its slot, its training in flight; taken as a rolled-back training, the
     * report queued it again to be trained twice. */
    struct copy x = take_one(d, r, NULL);
    uint64_t requeued = (uint64_t)tc_status_num("batches.requeued");
    pid_t stray = publisher = fork();     /* (another process: one connects once) */
    CHECK(stray >= 0);
    if (stray == 0) {
        publisher = 0;
        struct client *c = peer_connect(PROTO_ROLE_DRAFTER, 1);
        struct client_stats sst;
        if (client_trained(c, x.id, x.lease, 1, 0, 99) < 0)
            _exit(3);
        tc_wait_acked(c, 5000);
        client_get_stats(c, &sst);
        _exit(sst.nacks == 1 ? 0 : 4);
    }
    char serr[256];
    int sst = -1;
    while (waitpid(stray, &sst, WNOHANG) == 0)
        client_poll(d, 20, &(struct proto_msg){ 0 }, serr, sizeof serr);     /* heartbeats meanwhile */
    publisher = 0;
    CHECK_INT(WIFEXITED(sst) ? WEXITSTATUS(sst) : -1, ==, 0);
    CHECK_STR(tc_batch_state(x.id), "published");
    CHECK_INT(tc_status_num("batches.requeued"), ==, requeued);
    CHECK_OK(client_batch_skipped(d, x.id, x.lease));      /* its rank's own report counts */
    tc_wait_num("batches.requeued", (double)requeued + 1, 5000);
    printf("a TRAINED of generation 99, never formed, for batch %llu refused\n",
           (unsigned long long)x.id);

    /* The report before the publication: a target (a child; the forked one is stopped and the
     * ring emptied, its batches reported skipped so they are queued again) publishes into the
     * ring and tells us; the drafter reads and skips the batch; only then does the target send
     * PUBLISHED. */
    tc_kill(target);
    target = 0;
    unsigned s2;
    struct ring_pick any = { .policy = RING_PICK_OLDEST, .min_ready = 1 };
    while (ring_claim_read(r, &any, 300, &s2) == 0) {
        uint64_t b = ring_slot_header(r, s2)->batch_id;
        uint32_t lease = ring_slot_header(r, s2)->lease;
        CHECK_OK(ring_release(r, s2));
        CHECK_OK(client_batch_skipped(d, b, lease));
    }
    skip_before_published(d, r, 0);
    skip_before_published(d, r, 1);
    ring_detach(r);
    client_free(d);
    return 0;
}
