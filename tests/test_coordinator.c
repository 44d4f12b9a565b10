/* test_coordinator.c: a cluster of real processes (coordinator-d + fake targets and drafters
 * speaking the protocol) survives SIGKILLs: a target mid-write (leases re-queued and granted
 * again, its slot reclaimed), a drafter (group restarts from its checkpoint), the coordinator
 * (re-attaches the ring, peers reconnect). At the end every batch is trained exactly once, and
 * a checkpoint reported by rank 1 is refused. */
#include "daemons/coordinator/ledger.c"
#include "tests/test_coord_util.h"

static pid_t targets[3], drafters[2];

static void cleanup(void)
{
    for (int i = 0; i < 3; i++)
        tc_kill(targets[i]);
    for (int i = 0; i < 2; i++)
        tc_kill(drafters[i]);
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

/* CHECKPOINTED batches of each epoch in the ledger, into n[0 .. 8). */
static void ledger_done(uint64_t n[8])
{
    sqlite3 *db;
    sqlite3_stmt *st;
    CHECK(sqlite3_open_v2(TC.ledger, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT epoch, count(*) FROM batches WHERE state = %d GROUP BY epoch", BATCH_CHECKPOINTED);
    CHECK(sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK);
    memset(n, 0, 8 * sizeof *n);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        if (sqlite3_column_int(st, 0) < 8)
            n[sqlite3_column_int(st, 0)] = (uint64_t)sqlite3_column_int64(st, 1);
    CHECK_INT(rc, ==, SQLITE_DONE);
    sqlite3_finalize(st);
    sqlite3_close(db);
}

/* The status's per-epoch counts of done batches against the ledger, read before and after it (a
 * batch never leaves CHECKPOINTED, and the answer goes out after the commit of what it says);
 * the batches in flight that `dflashctl batches` lists (from their state lists) against the
 * counts of the same document. */
static void check_epoch_counts(const char *when)
{
    uint64_t before[8], after[8];
    ledger_done(before);
    cJSON *s = tc_query(PROTO_Q_STATUS);
    CHECK(s);
    ledger_done(after);
    const cJSON *per = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(s, "epoch"), "per_epoch");
    CHECK(cJSON_IsArray(per) && cJSON_GetArraySize(per) >= 1 && cJSON_GetArraySize(per) <= 8);
    double sum = 0;
    const cJSON *e;
    int i = 0;
    cJSON_ArrayForEach(e, per) {
        double done = tc_num(e, "checkpointed");
        CHECK(done >= (double)before[i] && done <= (double)after[i] && done <= tc_num(e, "batches"));
        sum += done;
        i++;
    }
    printf("%s: %.0f checkpointed over %d epoch(s), as in the ledger\n", when, sum, i);
    CHECK(sum == tc_num(s, "batches.checkpointed"));
    cJSON_Delete(s);

    cJSON *b = tc_query(PROTO_Q_BATCHES);
    CHECK(b);
    double flying = tc_num(b, "batches.leased") + tc_num(b, "batches.published") + tc_num(b, "batches.trained");
    int listed = 0, trained = 0;
    uint64_t last = 0;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(b, "in_flight")) {
        uint64_t id = (uint64_t)tc_num(e, "id");
        CHECK(!listed || id > last);                        /* in schedule order */
        last = id;
        listed++;
        trained += !strcmp(cJSON_GetObjectItemCaseSensitive(e, "state")->valuestring, "trained");
    }
    CHECK(listed == (flying < 100 ? flying : 100));
    if (flying < 100)
        CHECK(trained == tc_num(b, "batches.trained"));
    cJSON_Delete(b);
}

int main(void)
{
    atexit(cleanup);
    tc_shared_init();
    tc_setup(NULL, "epochs = 2\n[drafter]\nworld_size = 2\n");
    tc_dataset(TC.data, 600, 8, 200, 1000);
    tc_start_coord();
    double total = tc_status_num("batches.total");
    printf("epoch 0: %.0f batches\n", total);
    CHECK(total > 50);

    /* Target 0 stops itself the 4th time it claims a slot for writing: it then holds a
     * WRITING slot and its prefetched leases. */
    targets[0] = tc_fork_target(0, 20, "claimed_write:4");
    targets[1] = tc_fork_target(1, 20, NULL);
    drafters[0] = tc_fork_drafter(5, 10, 7);
    drafters[1] = tc_fork_drafter(6, 10, 7);

    int st;
    CHECK_INT(waitpid(targets[0], &st, WUNTRACED), ==, targets[0]);
    CHECK(WIFSTOPPED(st));
    cJSON *s = tc_query(PROTO_Q_STATUS);
    CHECK(s);
    double writing = tc_num(s, "ring.writing"), requeued0 = tc_num(s, "batches.requeued");
    cJSON_Delete(s);
    CHECK(writing >= 1);
    kill(targets[0], SIGKILL);
    waitpid(targets[0], NULL, 0);
    targets[0] = 0;
    printf("target 0 killed holding a WRITING slot\n");
    /* Its leases go back to the queue and its slot is reclaimed (WRITING -> FREE). */
    tc_wait_num("batches.requeued", requeued0 + 1, 5000);
    tc_wait_num("ring.reclaimed_writing", 1, 5000);
    targets[0] = tc_fork_target(0, 20, NULL);   /* "systemd" restarts it */

    tc_wait_num("batches.checkpointed", total * 0.5, 30000);
    kill(drafters[1], SIGKILL);
    waitpid(drafters[1], NULL, 0);
    printf("drafter 1 killed at %.0f checkpointed\n", tc_status_num("batches.checkpointed"));
    drafters[1] = tc_fork_drafter(6, 10, 7);
    tc_wait_num("group.generation", 2, 10000);  /* survivor + replacement form generation 2 */
    check_epoch_counts("after the rollback");

    tc_wait_num("batches.checkpointed", total * 1.1, 30000);
    check_epoch_counts("in epoch 1");
    kill(TC.coord, SIGKILL);
    waitpid(TC.coord, NULL, 0);
    printf("coordinator killed\n");
    tc_sleep_ms(300);   /* peers keep working into the ring meanwhile */
    tc_start_coord();
    CHECK(tc_status_num("ring.slots") == 6);
    check_epoch_counts("read back from the ledger");

    /* The run completes: the coordinator drains, stops every daemon and exits 0. */
    int rc = tc_exit_status(TC.coord, 60000);
    if (rc != 0) {
        if (system("tail -30 \"$TMPDIR\"/coordinator.log >&2")) {}
        TEST_FAIL("coordinator exit status %d", rc);
    }
    TC.coord = 0;
    for (int i = 0; i < 2; i++) {
        CHECK_INT(tc_exit_status(targets[i], 10000), ==, 0);
        targets[i] = 0;
        CHECK_INT(tc_exit_status(drafters[i], 10000), ==, 0);
        drafters[i] = 0;
    }

    char cmd[600];
    snprintf(cmd, sizeof cmd, "grep -E 'duplicate|trained again|lease list out of step' '%s/coordinator.log' >&2", TC.dir);
    CHECK(system(cmd) != 0);                                    /* no duplicate publication or training; the
                                                                   list of leased batches kept in step */
    snprintf(cmd, sizeof cmd, "grep -q 'stray-rank1 ignored: only rank 0' '%s/coordinator.log'", TC.dir);
    CHECK(system(cmd) == 0);                                    /* a rank-1 checkpoint is refused ... */
    snprintf(cmd, sizeof cmd, "grep 'stray-rank1 (generation' '%s/coordinator.log' >&2", TC.dir);
    CHECK(system(cmd) != 0);                                    /* ... and never durable */
    struct ledger *l;
    char err[512];
    CHECK_OK(ledger_open(&l, TC.ledger, err, sizeof err));
    struct ledger_audit a;
    CHECK_OK(ledger_audit(l, &a));
    printf("ledger: %llu batches, %llu checkpointed, %llu kept trainings, %llu rolled back, max leases %llu\n",
           (unsigned long long)a.total, (unsigned long long)a.per_state[BATCH_CHECKPOINTED],
           (unsigned long long)a.trained_rows, (unsigned long long)a.rolled_back_rows, (unsigned long long)a.max_leases);
    CHECK(a.total > total);                                     /* both epochs */
    CHECK_INT(a.per_state[BATCH_CHECKPOINTED], ==, a.total);    /* every batch done ... */
    CHECK_INT(a.checkpointed_not_once, ==, 0);                  /* ... trained exactly once in the lineage */
    CHECK_INT(a.trained_rows, ==, a.total);
    CHECK_INT(a.max_leases, >=, 2);                             /* re-queued leases were granted again */
    ledger_close(l);
    CHECK(access(TC.sock, F_OK) < 0);                           /* nothing left behind */
    char shm[128];
    snprintf(shm, sizeof shm, "/dev/shm%s", TC.ring);
    CHECK(access(shm, F_OK) < 0);

    /* Started again with fewer epochs than the ledger has scheduled: refused (78), saying how many
     * it has and what to set. */
    snprintf(cmd, sizeof cmd, "rm -f '%s.stopped'", TC.sock);
    CHECK(system(cmd) == 0);
    char log[400];
    snprintf(log, sizeof log, "%s/fewer-epochs.log", TC.dir);
    char *argv[] = { (char *)tc_bin("bin/coordinator-d"), "-c", TC.ini, "-o", "data.epochs=1", NULL };
    CHECK_INT(tc_exit_status(tc_spawn(argv, log), 30000), ==, 78);
    char grep[1400];
    snprintf(grep, sizeof grep, "grep -q '%s: the run has scheduled 2 epochs, data.epochs = 1 is fewer: set it to 2 "
             "or more, or move the ledger away' '%s'", TC.ledger, log);
    if (system(grep) != 0) {
        snprintf(cmd, sizeof cmd, "tail -3 '%s' >&2", log);
        if (system(cmd)) {}
        TEST_FAIL("no clear refusal of fewer epochs than the ledger has");
    }
    printf("coordinator cluster ok\n");
    return 0;
}
