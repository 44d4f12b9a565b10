/* test_coordinator_skip.c: a drafter that took a batch from its slot but did not train it
 * (a skipped non-finite step) reports it; the coordinator queues the batch again and a
 * target publishes it anew, so the run can still train every batch exactly once. */
#include "tests/test_coord_util.h"

static pid_t target;

static void cleanup(void)
{
    tc_kill(target);
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

/* Claim the next READY slot (waiting up to 10 s) and return its batch id; the slot is freed
 * unless keep is given, which then receives the slot still READING. */
static uint64_t take_one(struct client *d, struct ring *r, unsigned *keep)
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
    uint64_t id = ring_slot_header(r, slot)->batch_id;
    if (keep)
        *keep = slot;
    else
        CHECK_OK(ring_release(r, slot));
    return id;
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
    uint64_t skipped = take_one(d, r, NULL);
    CHECK_INT(tc_status_num("batches.requeued"), ==, 0);
    CHECK_OK(client_batch_skipped(d, skipped));
    tc_wait_num("batches.requeued", 1, 5000);

    /* The target publishes it again; other batches pass by meanwhile. */
    unsigned slot = 0;
    int seen = 0;
    for (int i = 0; i < 200 && !seen; i++) {
        seen = take_one(d, r, &slot) == skipped;
        if (!seen)
            CHECK_OK(ring_release(r, slot));
    }
    CHECK(seen);
    /* While it sits in a slot (READING here), a stray report must not re-queue it. */
    CHECK_OK(client_batch_skipped(d, skipped));
    tc_sleep_ms(300);   /* nothing to wait for: the report must have no effect */
    CHECK_INT(tc_status_num("batches.requeued"), ==, 1);
    CHECK_OK(ring_release(r, slot));
    ring_detach(r);
    client_free(d);
    printf("skipped batch %llu published again\n", (unsigned long long)skipped);
    return 0;
}
