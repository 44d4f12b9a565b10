/* test_coordinator_errors.c: error reports are recorded, shown and acted on: non-fatal is
 * counted, NaN pauses the cluster (PAUSE pushed, reason in status) until resumed, fatal
 * drains and stops the cluster with the reason (state failed, exit 78). Reports from the wrong
 * peer are refused: an ERROR from a ctl client, a CONTROL from a daemon, a TRAINED for the
 * running generation from a drafter that holds no rank in it, as is its CKPT_BAD of the lineage's
 * head, and a TRAINED naming a rank past the group's. A batch trained twice (a second
 * TRAINED at another step) is refused, counted and logged; the same report again is a replay, and
 * so is a CHECKPOINTED of the lineage's head sent again (acknowledged, no second ledger row).
 * A daemon sending errors in a loop has at most COORD_ERRORS_PER_WINDOW of them recorded per
 * window; a fatal error it sends once that budget is spent is recorded all the same (the errors
 * query, the ledger) and is the failed cluster's reason. */
#include <limits.h>
#include <poll.h>
#include <sqlite3.h>
#include "tests/test_coord_util.h"

static pid_t ranked;

static void cleanup(void)
{
    tc_kill(ranked);
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

/* In a child: until c's events are all answered (5 s, scaled); 0 with its stats in st, or -1. */
static int settle(struct client *c, struct client_stats *st)
{
    char err[256];
    uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    do {
        if (client_idle(c, 20, err, sizeof err) < 0)
            return -1;
        client_get_stats(c, st);
    } while (st->outbox && mono_ms() < end);
    return st->outbox ? -1 : 0;
}

static int control(enum proto_control_cmd cmd)
{
    struct client *c = tc_ctl(1000);
    CHECK(c);
    char *json = NULL, err[256];
    int status = -1;
    CHECK_OK(client_control(c, cmd, "test", &json, &status, err, sizeof err));
    free(json);
    client_free(c);
    return status;
}

static char *state(void)
{
    static char s[64];
    cJSON *doc = tc_query(PROTO_Q_STATUS);
    snprintf(s, sizeof s, "%s", doc ? cJSON_GetObjectItem(doc, "state")->valuestring : "down");
    cJSON_Delete(doc);
    return s;
}

/* Next CONTROL pushed to this daemon (other pushes skipped; 5 s, scaled). */
static int next_control(struct client *c)
{
    struct proto_msg m;
    char err[256];
    uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    while (mono_ms() < end)
        if (client_poll(c, 100, &m, err, sizeof err) == 1 && m.type == PROTO_CONTROL)
            return (int)m.control.cmd;
    return -1;
}

/* Keep c's connection alive (heartbeats; pushed messages stay queued) for ms, scaled. */
static void idle_for(struct client *c, int ms)
{
    char err[256];
    uint64_t end = mono_ms() + (uint64_t)ms * (uint64_t)test_time_scale();
    while (mono_ms() < end)
        client_idle(c, 20, err, sizeof err);
}

/* Whether a byte waits to be read on fd (0 when it has not come yet). */
static int byte_came(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    return poll(&p, 1, 0) == 1;
}

int main(void)
{
    atexit(cleanup);
    tc_setup(NULL, NULL);
    tc_dataset(TC.data, 100, 8, 100, 500);
    tc_start_coord();
    struct client_opts o = { .socket_path = TC.sock, .role = PROTO_ROLE_DRAFTER, .device = 3 };
    struct client *d;
    char err[512];
    CHECK_OK(client_open(&d, &o, err, sizeof err));

    CHECK_OK(client_error(d, 0, -EIO, "checkpoint dir slow"));
    tc_wait_num("error_count", 1, 3000);
    CHECK_STR(state(), "running");

    CHECK_OK(client_error(d, 0, -DF_ENAN, "loss is nan at step 12"));
    CHECK_INT(next_control(d), ==, PROTO_CTL_PAUSE);
    CHECK_STR(state(), "paused");
    cJSON *s = tc_query(PROTO_Q_STATUS);
    CHECK_CONTAINS(cJSON_GetObjectItem(s, "reason")->valuestring, "loss is nan at step 12");
    cJSON_Delete(s);
    s = tc_query(PROTO_Q_ERRORS);
    CHECK_INT(tc_num(s, "count"), ==, 2);
    char *text = cJSON_PrintUnformatted(s);
    CHECK_CONTAINS(text, "checkpoint dir slow");
    free(text);
    cJSON_Delete(s);

    CHECK_INT(control(PROTO_CTL_RESUME), ==, 0);
    CHECK_INT(next_control(d), ==, PROTO_CTL_RESUME);
    CHECK_STR(state(), "running");
    /* A code with no meaning (INT_MIN has no positive twin) is recorded as it is. */
    CHECK_OK(client_error(d, 0, INT_MIN, "code out of every table"));
    tc_wait_num("error_count", 3, 3000);
    CHECK_STR(state(), "running");

    /* A ctl client reports nothing: its ERROR (even "fatal") is refused, the cluster runs on. */
    struct client *ctl = tc_ctl(5000);
    CHECK(ctl);
    client_error(ctl, 1, -DF_ELAYOUT, "a ctl client pretending to be a daemon");
    struct proto_msg pm;
    for (int i = 0; i < 50 * test_time_scale() && client_connected(ctl); i++)
        client_poll(ctl, 20, &pm, err, sizeof err);
    CHECK(!client_connected(ctl));
    client_free(ctl);
    CHECK_STR(state(), "running");
    CHECK_INT(tc_status_num("error_count"), ==, 3);

    /* Pause, resume, drain and stop are the operator's: a daemon's CONTROL is refused. */
    pid_t kid = fork();
    CHECK(kid >= 0);
    if (!kid) {
        struct client *t = peer_connect(PROTO_ROLE_TARGET, 1);
        char *json = NULL;
        int status = 0;
        client_control(t, PROTO_CTL_STOP, "a target pretending to be the operator", &json, &status, err, sizeof err);
        _exit(0);
    }
    CHECK_INT(tc_exit_status(kid, 10000 * test_time_scale()), ==, 0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "grep -q 'CONTROL is not a message a target may send' '%s/coordinator.log'", TC.dir);
    CHECK_INT(system(cmd), ==, 0);
    CHECK_STR(state(), "running");
    /* Its connection closed by the refusal, it could not say BYE before it exited: its end is
     * recorded (a non-fatal error naming it and the refusal). Every other process here says BYE
     * before it exits, as the daemons do, and is not. */
    tc_wait_num("error_count", 4, 5000);
    {
        cJSON *e = tc_query(PROTO_Q_ERRORS);
        const cJSON *dead = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(e, "errors"), 0);
        CHECK(dead);
        char want[256];
        snprintf(want, sizeof want, "target@1 (pid %d) is gone without a word since the coordinator closed its "
                 "connection (refused: CONTROL is not a message a target may send)", (int)kid);
        CHECK_STR(cJSON_GetObjectItemCaseSensitive(dead, "message")->valuestring, want);
        CHECK(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(dead, "fatal")));
        CHECK_INT(tc_num(dead, "code"), ==, -DF_EDEAD);
        cJSON_Delete(e);
    }

    /* A TRAINED for generation 1 from d, which never joined (generation 1 is another process's,
     * world_size 1): refused, and batch 0 stays untrained. */
    int ready[2], go[2];
    CHECK_INT(pipe(ready), ==, 0);
    CHECK_INT(pipe(go), ==, 0);
    ranked = fork();
    CHECK(ranked >= 0);
    if (!ranked) {
        struct client *r = peer_connect(PROTO_ROLE_DRAFTER, 4);
        struct proto_group g = tc_join_group(r, 5000);
        char gb;
        if (g.generation != 1 || write(ready[1], "r", 1) != 1 || read(go[0], &gb, 1) != 1)
            _exit(5);
        /* rank 0 of generation 1: batch 0 trained at step 1, the same report again (a replay),
         * then batch 0 trained at step 2 (a second training): only the last is refused */
        const uint64_t steps[3] = { 1, 1, 2 };
        struct client_stats rs;
        for (int i = 0; i < 3; i++)
            if (client_trained(r, 0, 1, steps[i], 0, 1) < 0 || settle(r, &rs) < 0 || rs.nacks != (i == 2))
                _exit(10 + i);
        if (rs.last_nack_status != -DF_ESTATE)
            _exit(9);
        /* its checkpoint of step 1, then the same again (an ACK lost with a connection): both
         * acknowledged, one checkpoint in the ledger */
        for (int i = 0; i < 2; i++)
            if (client_checkpointed(r, 1, 1, "/nowhere/step-0000000001") < 0 || settle(r, &rs) < 0 || rs.nacks != 1)
                _exit(20 + i);
        /* a rank past the group's (world_size 1): refused, nothing kept of it */
        if (client_trained(r, 1, 1, 2, 7, 1) < 0 || settle(r, &rs) < 0 || rs.nacks != 2 ||
            rs.last_nack_status != -DF_ERANGE)
            _exit(30);
        /* held (alive, rank 0) while d, which holds no rank, says its checkpoint does not load */
        if (write(ready[1], "r", 1) != 1 || read(go[0], &gb, 1) != 1)
            _exit(31);
        client_bye(r, 0, "done");
        _exit(0);
    }
    char rb;
    CHECK_INT(read(ready[0], &rb, 1), ==, 1);
    CHECK_OK(client_trained(d, 0, 1, 1, 0, 1));
    tc_wait_acked(d, 5000);
    struct client_stats cs;
    client_get_stats(d, &cs);
    CHECK_INT(cs.last_nack_status, ==, -DF_EPEER);
    CHECK_INT(tc_status_num("batches.trained"), ==, 0);
    CHECK_INT(tc_status_num("batches.checkpointed"), ==, 0);
    CHECK_STR(tc_batch_state(0), "queued");
    snprintf(cmd, sizeof cmd, "grep -q 'TRAINED for batch 0:0 refused: it holds no rank in generation 1' '%s/coordinator.log'",
             TC.dir);
    CHECK_INT(system(cmd), ==, 0);
    CHECK_INT(write(go[1], "g", 1), ==, 1);
    /* A CKPT_BAD of the lineage's head from d, which holds no rank in the generation that loaded
     * it: refused, the head stands (it would be dropped and its batches queued again) */
    CHECK_INT(read(ready[0], &rb, 1), ==, 1);
    CHECK_OK(client_ckpt_bad(d, 1, 1, "/nowhere/step-0000000001", -EIO, "not mine to say"));
    snprintf(cmd, sizeof cmd, "grep -q 'CKPT_BAD of checkpoint /nowhere/step-0000000001 refused: it holds no rank in "
             "generation 1' '%s/coordinator.log'", TC.dir);
    for (int i = 0; i < 100 && system(cmd) != 0; i++)
        tc_sleep_ms(50);
    CHECK_INT(system(cmd), ==, 0);
    CHECK_INT(tc_status_num("group.checkpoint.step"), ==, 1);
    cJSON *heads = tc_query(PROTO_Q_CHECKPOINTS);
    CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(heads, "checkpoints"), 0), "dropped")));
    cJSON_Delete(heads);
    snprintf(cmd, sizeof cmd, "grep -q 'TRAINED for batch 0:1 refused: rank 7, generation 1 has 1' '%s/coordinator.log'",
             TC.dir);
    CHECK_INT(system(cmd), ==, 0);
    CHECK_STR(tc_batch_state(1), "queued");
    CHECK_INT(write(go[1], "g", 1), ==, 1);
    CHECK_INT(tc_exit_status(ranked, 10000 * test_time_scale()), ==, 0);
    ranked = 0;
    CHECK_INT(tc_status_num("batches.duplicates"), ==, 1);
    cJSON *ck = tc_query(PROTO_Q_CHECKPOINTS);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(ck, "checkpoints");
    CHECK_INT(cJSON_GetArraySize(list), ==, 1);     /* the replay wrote no second row */
    /* no stat of the folder on the coordinator's event loop (a storage that hangs would hold the
     * cluster): whether it is on disk is dflashctl's to look */
    CHECK(!cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(list, 0), "on_disk"));
    cJSON_Delete(ck);
    snprintf(cmd, sizeof cmd, "grep -q 'batch 0:0 trained again (gen 1 step 2, before gen 1 step 1)' '%s/coordinator.log'",
             TC.dir);
    CHECK_INT(system(cmd), ==, 0);
    for (int i = 0; i < 2; i++) {
        close(ready[i]);
        close(go[i]);
    }

    /* A daemon sending errors in a loop (a fresh member: its window starts with them): at most
     * COORD_ERRORS_PER_WINDOW (50) recorded per 10 s window; 300 sent in well under 10 s (a
     * window that turned meanwhile would record up to 50 more). Then, its budget spent, the same
     * member's fatal error: recorded all the same, and it fails the cluster; 300 fatal ones after
     * it, which change nothing, are not recorded (each had been). */
    int flooded[2], fatal_go[2];
    CHECK_INT(pipe(flooded), ==, 0);
    CHECK_INT(pipe(fatal_go), ==, 0);
    kid = fork();
    CHECK(kid >= 0);
    if (!kid) {         /* another process: the coordinator takes one connection per process */
        struct client_opts o2 = o;
        o2.device = 2;
        struct client *flood;
        if (client_open(&flood, &o2, err, sizeof err) < 0)
            _exit(3);
        uint64_t t0 = mono_ms();
        for (int i = 0; i < 300; i++)
            if (client_error(flood, 0, -EIO, "flood %d", i) < 0)
                _exit(4);
        char b;
        if (write(flooded[1], mono_ms() - t0 < 9000 ? "1" : "2", 1) != 1)     /* in one window, or maybe two */
            _exit(4);
        while (!byte_came(fatal_go[0]))
            client_idle(flood, 20, err, sizeof err);
        if (read(fatal_go[0], &b, 1) != 1 || client_error(flood, 1, -EIO, "GPU 2 fell off the bus after its flood") < 0)
            _exit(4);
        /* (errors are not acknowledged: the DRAIN it brings says the fatal one was taken) */
        if (next_control(flood) != PROTO_CTL_DRAIN)
            _exit(5);
        for (int i = 0; i < 300; i++)   /* fatal ones in a loop: the cluster fails already, none recorded */
            if (client_error(flood, 1, -EIO, "fatal again %d", i) < 0)
                _exit(4);
        int code = mono_ms() - t0 < 9000 ? 0 : 1;
        client_bye(flood, code, "flood done");
        _exit(code);
    }
    char fb;
    int kst = 0;
    pid_t w = 0;
    while (!byte_came(flooded[0]) && (w = waitpid(kid, &kst, WNOHANG)) == 0)
        client_idle(d, 20, err, sizeof err);    /* d's heartbeat goes on; its pushes stay queued */
    if (w)
        TEST_FAIL("the flooding daemon ended before its flood was sent (wait status %d)", kst);
    CHECK_INT(read(flooded[0], &fb, 1), ==, 1);
    tc_wait_num("error_count", 4 + 50, 5000);
    idle_for(d, 300);
    CHECK(tc_status_num("error_count") <= 4 + 50 + (fb == '1' ? 0 : 50));
    CHECK_STR(state(), "running");
    CHECK_INT(write(fatal_go[1], "g", 1), ==, 1);
    while ((w = waitpid(kid, &kst, WNOHANG)) == 0)
        client_idle(d, 20, err, sizeof err);
    CHECK_INT(w, ==, kid);
    CHECK(WIFEXITED(kst) && WEXITSTATUS(kst) <= 1);
    bool one_window = WEXITSTATUS(kst) == 0;
    for (int i = 0; i < 2; i++) {
        close(flooded[i]);
        close(fatal_go[i]);
    }
    /* The fatal error was taken (its DRAIN came), and it was the flooding member's last word:
     * the count is final. (Once failed, the coordinator waits at most dead_after_ms, 3 s, for d
     * to take the STOP and leave: the checks up to d's hang-up are quick.) */
    double n_err = tc_status_num("error_count");
    if (n_err < 4 + 50 + 1 || n_err > 4 + 50 + 1 + (one_window ? 0 : 50))
        TEST_FAIL("error_count %g after the flood and its member's fatal error: wanted %d%s", n_err, 4 + 50 + 1,
                  one_window ? "" : " to 104");
    s = tc_query(PROTO_Q_ERRORS);
    CHECK_INT(tc_num(s, "fatal"), ==, 1);
    const cJSON *newest = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(s, "errors"), 0);
    CHECK(newest);
    CHECK_STR(cJSON_GetObjectItemCaseSensitive(newest, "message")->valuestring,
              "GPU 2 fell off the bus after its flood");
    CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(newest, "fatal")));
    CHECK_INT(tc_num(newest, "gpu"), ==, 2);
    cJSON_Delete(s);
    uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    while (strcmp(state(), "failed") && mono_ms() < end)
        client_idle(d, 20, err, sizeof err);
    CHECK_STR(state(), "failed");
    s = tc_query(PROTO_Q_STATUS);
    CHECK_CONTAINS(cJSON_GetObjectItem(s, "reason")->valuestring, "drafter@2: GPU 2 fell off the bus after its flood");
    cJSON_Delete(s);

    CHECK_INT(next_control(d), ==, PROTO_CTL_DRAIN);
    CHECK_INT(next_control(d), ==, PROTO_CTL_STOP);
    client_free(d);
    int st;
    CHECK_INT(waitpid(TC.coord, &st, 0), ==, TC.coord);
    TC.coord = 0;
    CHECK(WIFEXITED(st));
    CHECK_INT(WEXITSTATUS(st), ==, 78);
    snprintf(cmd, sizeof cmd, "grep -q 'cluster draining -> failed: drafter@2: GPU 2 fell off the bus after its flood' "
             "'%s/coordinator.log'", TC.dir);
    CHECK_INT(system(cmd), ==, 0);
    /* and in the ledger, where a restarted coordinator reads it from */
    sqlite3 *db;
    sqlite3_stmt *q;
    CHECK_INT(sqlite3_open(TC.ledger, &db), ==, SQLITE_OK);
    CHECK_INT(sqlite3_prepare_v2(db, "SELECT count(*) FROM errors WHERE fatal = 1 AND device = 2 AND message = "
                                     "'GPU 2 fell off the bus after its flood'", -1, &q, NULL), ==, SQLITE_OK);
    CHECK_INT(sqlite3_step(q), ==, SQLITE_ROW);
    CHECK_INT(sqlite3_column_int(q, 0), ==, 1);
    sqlite3_finalize(q);
    sqlite3_close(db);
    printf("errors ok\n");
    return 0;
}
