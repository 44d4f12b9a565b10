/* test_coordinator_ring_run.c: a ring in /dev/shm is its run's. A coordinator SIGKILLed with a
 * batch READY in the ring re-attaches it when restarted on the same ledger and keeps that batch
 * published; a new run (the ledger moved away, another data.seed: the same batch ids, other
 * samples) replaces it instead of taking the old run's copy for its own batch of that id. */
#include "tests/test_coord_util.h"

static void cleanup(void)
{
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

static int log_has(const char *pattern)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "grep -qE '%s' '%s/coordinator.log'", pattern, TC.dir);
    return system(cmd) == 0;
}

int main(void)
{
    atexit(cleanup);
    tc_setup(NULL, "seed = 1\n");
    tc_dataset(TC.data, 200, 20, 200, 1000);
    tc_start_coord();

    /* run 1: a target publishes one batch */
    struct client *t = peer_connect(PROTO_ROLE_TARGET, 0);
    struct ring *r = peer_ring();
    struct dataset ds;
    char err[512];
    CHECK_OK(dataset_open(&ds, TC.data, DATASET_OPEN_NO_CHECKSUM, err, sizeof err));
    CHECK_OK(client_lease_request(t, 1));
    struct proto_msg m;
    uint64_t id = 0;
    uint32_t epoch = 0, tokens = 0;
    for (int i = 0; i < 500 * test_time_scale() && !tokens; i++)
        if (client_poll(t, 10, &m, err, sizeof err) > 0 && m.type == PROTO_LEASE_GRANT) {
            id = m.grant.batch_id;
            epoch = m.grant.epoch;
            tokens = m.grant.n_tokens;
        }
    CHECK(tokens > 0);
    unsigned slot;
    CHECK_OK(ring_claim_write(r, 1000, &slot));
    int n = tc_fill_publish(t, r, &ds, id, epoch, tokens, slot);
    CHECK_INT(n, >, 0);
    CHECK_OK(client_published(t, id, slot, (uint32_t)n));
    tc_wait_acked(t, 3000);
    CHECK_STR(tc_batch_state(id), "published");

    /* the same run: its coordinator SIGKILLed and started again finds its batch in the ring */
    tc_kill(TC.coord);
    tc_start_coord();
    CHECK(log_has("re-attached ring"));
    CHECK_STR(tc_batch_state(id), "published");
    printf("same run: batch %016" PRIx64 " READY in slot %u re-attached and kept\n", id, slot);
    client_free(t);
    ring_detach(r);

    /* a new run: the ledger moved away, another seed; the old ring still there */
    tc_kill(TC.coord);
    char moved[600];
    snprintf(moved, sizeof moved, "%s.run1", TC.ledger);
    CHECK_OK(rename(TC.ledger, moved));
    tc_setup(NULL, "seed = 2\n");
    tc_start_coord();
    CHECK(log_has("replacing ring /dflash-[^ ]+ is of another run \\([0-9a-f]{16}, this one is [0-9a-f]{16}\\): "
                  "its 1 READY or READING batches are not this run"));
    CHECK(strcmp(tc_batch_state(id), "published"));
    cJSON *st = tc_query(PROTO_Q_STATUS);
    const cJSON *ring = cJSON_GetObjectItemCaseSensitive(st, "ring");
    const cJSON *ready = cJSON_GetObjectItemCaseSensitive(ring, "ready");
    CHECK(cJSON_IsNumber(ready));
    CHECK_INT(ready->valuedouble, ==, 0);
    cJSON_Delete(st);
    printf("new run: the old run's ring replaced, batch %016" PRIx64 " is %s\n", id, tc_batch_state(id));
    dataset_close(&ds);
    return 0;
}
