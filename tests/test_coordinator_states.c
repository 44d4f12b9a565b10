/* test_coordinator_states.c: the cluster state and the drafter group around a stop and a
 * coordinator restart.
 *  1. Two drafters form a group and hang up while alive, one before `stop`, one after, while
 *     a target stays connected: the rank deadline passes in the STOPPED state and the
 *     coordinator still exits 0 (it once rolled the group back through a freed member).
 *  2. A paused cluster is still paused after the coordinator is SIGKILLed and restarted: no
 *     lease is granted until `resume` (it came back running).
 *  3. A non-finite loss reported during a drain pauses the cluster (the poisoned drafters write
 *     no final checkpoint, so the drain would never end); a drain is refused until the operator's
 *     resume (also after a coordinator restart); resume, then drain again.
 *  4. A drafter whose GROUP was lost with its connection (it reconnects holding no rank and asks
 *     to join again) gets its rank in the running generation back, not silence.
 *  5. After a coordinator restart the drafter (back in its group) takes a published batch from
 *     the ring just before the recovery window ends and reports it a step later: the batch
 *     stays published meanwhile (it was queued again, then trained twice).
 *  6. A target that leased a batch and lost its connection keeps the lease while it lives, far
 *     past dead_after_ms (it may still publish it: re-leasing it had two targets publish one
 *     batch); once it is dead the batch is queued again at once.
 *  7. A target's PUBLISHED that arrives after its batch was trained and rolled back (the drafter
 *     took the slot, reported TRAINED and died before a checkpoint) is refused: that copy is
 *     gone from the ring, and the batch is queued again, not left published in no slot.
 *  8. The same when the rollback comes first: the drafter took the copy, its generation ended
 *     (a peer died), and only then did its TRAINED and the target's PUBLISHED arrive, while the
 *     batch was still that target's lease.
 *  9. A published batch taken from the ring by a drafter that never reports it (its report lost
 *     with a crashed coordinator, say) is queued again once the reports' grace is over
 *     (drafter.collective_timeout_ms + 2 x coordinator.dead_after_ms), and not before.
 * 10. A drain started by a stop signal (systemd stopping the service) and cut short by a kill
 *     is not resumed: the next start runs (it drained at once, wrote the stop note, and every
 *     daemon started then found nothing to do).
 * 11-14. READY copies of trained batches leave the ring: when the batch is trained meanwhile, with
 *     no PUBLISHED to announce them, and before a new generation's GROUP goes out (also in a
 *     restarted coordinator's recovery window).
 * 15-16. The run's end: a slot of a target that died as the cluster stopped is freed before the
 *     coordinator leaves; a coordinator killed after the run completed finds it complete.
 * 17. A batch leased twice (its first target died) and checkpointed by generation 1 is named in
 *     generation 2's GROUP: a copy of it from an older lease must be left out by the new group,
 *     which has trained nothing yet. The GROUP carries the run's batch count.
 * 18. A fatal error during the operator's drain still ends the run FAILED (exit 78). Part 3 also
 *     checks that no drain is taken while a non-finite loss waits for the operator's resume.
 * 19. A stop signal then stops at once (a drain could not end), and the run started again drains.
 * 20. A coordinator killed after the run failed, while it waited for a daemon to take the STOP,
 *     ends the run failed again when restarted (exit 78, not running on as if nothing failed);
 *     once it left cleanly, the next start runs.
 * 21. A stop signal during the checks at start (a new ledger held by another connection here) is
 *     taken once they are done: the coordinator stops cleanly (exit 0, the stop note), not by the
 *     signal's default action.
 * 22. A stop (dflashctl's or a signal) while a fatal error drains the run ends it FAILED, the
 *     error kept in the reason (exit 78).
 * 23. A non-finite value reported while the operator's pause holds is in the reason shown.
 * 24. A second copy of a published batch (from a lease given back before its PUBLISHED came) is
 *     taken out of the ring when that PUBLISHED comes; the published copy stays.
 * 25. A checkpoint of a new generation at a step before the head it started from is refused: the
 *     head stays.
 * 26. Each detached rank has its own dead_after_ms to come back, from its own disconnect: rank 0
 *     hangs up, rank 1 later, rank 0 comes back; the group lives past rank 0's deadline and ends
 *     at rank 1's (one deadline, the first rank's, once failed it while rank 1 had most of its
 *     time left).
 * 27. A drafter that joined and waits for the group's other ranks is counted in the status
 *     (group.drafters_waiting; the group's "0/2 ranks" alone read as if none were there).
 * 28. A drafter that asks to join after the stop (the coordinator still waits for a deaf target
 *     to take it) forms no generation: none is sent, none recorded in the ledger. */
#include <sqlite3.h>
#include "tests/test_coord_util.h"

static pid_t kids[4];

/* A fresh cluster dir with `extra` config lines, a 200-sample dataset, the coordinator up. */
static void start_coord(const char *extra)
{
    tc_setup(NULL, extra);
    tc_dataset(TC.data, 200, 16, 64, 1000);
    tc_start_coord();
}

static char *status_str(const char *key)
{
    static char v[512];
    snprintf(v, sizeof v, "(down)");
    cJSON *s = tc_query(PROTO_Q_STATUS);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(s, key);
    if (cJSON_IsString(o))
        snprintf(v, sizeof v, "%s", o->valuestring);
    cJSON_Delete(s);
    return v;
}

/* Wait (up to ms, scaled) for the batch's state to be `want`, polling `keep` meanwhile (a client
 * whose heartbeat must go on; NULL: none), then check it. */
static void expect_batch(uint64_t id, const char *want, struct client *keep, int ms)
{
    uint64_t end = mono_ms() + (uint64_t)ms * (uint64_t)test_time_scale();
    struct proto_msg m;
    char err[256];
    while (strcmp(tc_batch_state(id), want) && mono_ms() < end) {
        if (keep)
            client_poll(keep, 20, &m, err, sizeof err);
        else
            tc_sleep_ms(20);
    }
    CHECK_STR(tc_batch_state(id), want);
}

/* The same for the cluster's state. */
static void expect_state(const char *want, int ms)
{
    uint64_t end = mono_ms() + (uint64_t)ms * (uint64_t)test_time_scale();
    while (strcmp(status_str("state"), want) && mono_ms() < end)
        tc_sleep_ms(20);
    CHECK_STR(status_str("state"), want);
}

/* cmd from dflashctl: its answer's status, the answer's text in json (a static copy). */
static int control_answer(enum proto_control_cmd cmd, char *json_out, size_t cap)
{
    struct client *c = tc_ctl(5000);
    CHECK(c);
    char *json = NULL, err[256];
    int status = -1;
    CHECK_OK(client_control(c, cmd, "test", &json, &status, err, sizeof err));
    if (json_out)
        snprintf(json_out, cap, "%s", json ? json : "");
    free(json);
    client_free(c);
    return status;
}

static void control(enum proto_control_cmd cmd) { CHECK_INT(control_answer(cmd, NULL, 0), ==, 0); }

/* A drafter that joins, waits for its GROUP, says so on `ready`, and on a byte from `go`
 * closes its connection and stays alive without a word. */
static pid_t fork_quiet_drafter(int device, int ready, int go)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid)
        return pid;
    struct client *c = peer_connect(PROTO_ROLE_DRAFTER, device);
    client_join_group(c);
    struct proto_msg m;
    char err[256], b;
    uint64_t end = mono_ms() + 20000;
    int got = 0;
    while (!got && mono_ms() < end)
        got = client_poll(c, 50, &m, err, sizeof err) > 0 && m.type == PROTO_GROUP;
    if (!got || write(ready, "r", 1) != 1)
        _exit(5);
    while (read(go, &b, 1) != 1) {
        if (client_poll(c, 20, &m, err, sizeof err) < 0)
            _exit(6);
    }
    client_free(c);
    for (;;)
        pause();
}

/* A target that stays connected (heartbeats) and ignores everything, STOP included. */
static pid_t fork_deaf_target(void)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid)
        return pid;
    struct client *c = peer_connect(PROTO_ROLE_TARGET, 0);
    struct proto_msg m;
    char err[256];
    for (;;)
        client_poll(c, 20, &m, err, sizeof err);
}

static void group_hangs_up_around_stop(void)
{
    start_coord("[drafter]\nworld_size = 2\n[coordinator]\ndead_after_ms = 1000\n");
    int ready[2], go[2][2];
    CHECK(pipe(ready) == 0 && pipe(go[0]) == 0 && pipe(go[1]) == 0);
    kids[0] = fork_quiet_drafter(0, ready[1], go[0][0]);
    kids[1] = fork_quiet_drafter(1, ready[1], go[1][0]);
    kids[2] = fork_deaf_target();
    char b;
    CHECK(read(ready[0], &b, 1) == 1 && read(ready[0], &b, 1) == 1);
    CHECK(write(go[1][1], "g", 1) == 1);        /* rank 1 hangs up: the rank deadline starts */
    tc_sleep_ms(300);
    control(PROTO_CTL_STOP);
    CHECK(write(go[0][1], "g", 1) == 1);        /* rank 0 hangs up in STOPPED: its member is freed */
    /* the coordinator waits dead_after_ms for the deaf target; the rank deadline passes first */
    int rc = tc_exit_status(TC.coord, 10000 * test_time_scale());
    CHECK_INT(rc, ==, 0);
    TC.coord = 0;
    printf("ok: group hung up around a stop, coordinator exit %d\n", rc);
}

static void pause_survives_restart(void)
{
    start_coord("[drafter]\nworld_size = 1\n");
    control(PROTO_CTL_PAUSE);
    CHECK_STR(status_str("state"), "paused");
    tc_kill(TC.coord);
    tc_start_coord();
    /* after the recovery window (recovery_ms 600) it is still paused: no lease for a target */
    struct client *t = peer_connect(PROTO_ROLE_TARGET, 0);
    CHECK_INT(client_welcome(t)->cluster_state, ==, PROTO_STATE_PAUSED);
    CHECK_OK(client_lease_request(t, 1));
    struct proto_msg m;
    char err[256];
    int granted = 0;
    uint64_t end = mono_ms() + 1500 * (uint64_t)test_time_scale();
    while (mono_ms() < end)
        granted |= client_poll(t, 50, &m, err, sizeof err) > 0 && m.type == PROTO_LEASE_GRANT;
    CHECK(!granted);
    CHECK_STR(status_str("state"), "paused");
    control(PROTO_CTL_RESUME);
    end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    while (!granted && mono_ms() < end)
        granted = client_poll(t, 50, &m, err, sizeof err) > 0 && m.type == PROTO_LEASE_GRANT;
    CHECK(granted);
    client_free(t);
    printf("ok: paused across a coordinator restart, leases after resume\n");
}

/* More config for the next start_as_drafter (e.g. a slower tick); NULL: none. */
static const char *drafter_extra;

/* A coordinator for a group of one drafter, this process being that drafter: its generation. */
static uint64_t start_as_drafter(struct client **d, struct ring **r)
{
    char extra[256];
    snprintf(extra, sizeof extra, "[drafter]\nworld_size = 1\n%s", drafter_extra ? drafter_extra : "");
    start_coord(extra);
    *d = peer_connect(PROTO_ROLE_DRAFTER, 0);
    *r = peer_ring();
    uint64_t gen = tc_join_group(*d, 10000).generation;
    CHECK(gen);
    return gen;
}

/* A target (kids[0]) publishes; drafter d takes the first copy from r and reports it TRAINED in
 * generation gen, not checkpointed (a drain waits for it). */
static void train_one(struct client *d, struct ring *r, uint64_t gen)
{
    kids[0] = tc_fork_target(0, 0, NULL);
    struct proto_msg m;
    char err[256];
    uint64_t end = mono_ms() + 10000 * (uint64_t)test_time_scale();
    unsigned slot;
    int rr;
    while ((rr = ring_claim_read(r, NULL, 50, &slot)) == -DF_ETIMEOUT && mono_ms() < end)
        client_poll(d, 0, &m, err, sizeof err);
    CHECK_OK(rr);
    uint64_t id = ring_slot_header(r, slot)->batch_id;
    uint32_t lease = ring_slot_header(r, slot)->lease;
    CHECK_OK(ring_release(r, slot));
    CHECK_OK(client_trained(d, id, lease, 1, 0, gen));
    tc_wait_num("batches.trained", 1, 5000);
}

/* Drafter d reports a non-finite loss; wait (5 s, scaled, polling d) until the status's `key`
 * holds `needle`. */
static void nan_report(struct client *d, const char *key, const char *needle)
{
    struct proto_msg m;
    char err[256];
    CHECK_OK(client_error(d, 0, -DF_ENAN, "loss is nan at step 2"));
    uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    while (!strstr(status_str(key), needle) && mono_ms() < end)
        client_poll(d, 20, &m, err, sizeof err);
}

/* Drafter d reports a non-finite loss; the cluster pauses. */
static void nan_pause(struct client *d)
{
    nan_report(d, "state", "paused");
    CHECK_STR(status_str("state"), "paused");
}

static void nan_during_drain(void)
{
    struct client *d;
    struct ring *r;
    uint64_t gen = start_as_drafter(&d, &r);
    train_one(d, r, gen);
    control(PROTO_CTL_DRAIN);
    CHECK_STR(status_str("state"), "draining");
    nan_pause(d);
    /* no drain until the operator's resume (the poisoned drafter writes no checkpoint: a drain
     * would never end), also after a coordinator restart */
    char answer[1024];
    CHECK_INT(control_answer(PROTO_CTL_DRAIN, answer, sizeof answer), ==, -DF_ESTATE);
    CHECK_CONTAINS(answer, "non-finite");
    tc_kill(TC.coord);
    tc_start_coord();
    expect_state("paused", 5000);
    CHECK_INT(control_answer(PROTO_CTL_DRAIN, answer, sizeof answer), ==, -DF_ESTATE);
    control(PROTO_CTL_RESUME);
    CHECK_STR(status_str("state"), "running");
    control(PROTO_CTL_DRAIN);
    CHECK_STR(status_str("state"), "draining");
    client_free(d);
    ring_detach(r);
    printf("ok: a non-finite loss during a drain pauses the cluster; no drain before the resume\n");
}

static void group_lost_in_transit(void)
{
    start_coord("[drafter]\nworld_size = 2\n");
    int ready[2], go[2];
    CHECK(pipe(ready) == 0 && pipe(go) == 0);
    kids[0] = fork_quiet_drafter(0, ready[1], go[0]);
    struct client *d = peer_connect(PROTO_ROLE_DRAFTER, 1);
    client_join_group(d);
    char b;
    CHECK(read(ready[0], &b, 1) == 1);      /* rank 0 has its GROUP: the generation is formed */
    client_free(d);                         /* rank 1's GROUP is unread: lost with the connection */
    d = peer_connect(PROTO_ROLE_DRAFTER, 1);
    struct proto_group g = tc_join_group(d, 3000);
    CHECK(g.generation);
    CHECK_INT(g.rank, ==, 1);
    client_free(d);
    printf("ok: a GROUP lost with the connection is sent again on the next JOIN_GROUP\n");
}

/* Poll c (every poll_ms) until the coordinator has answered every event it sent, or for at
 * most ms (scaled; 0: no limit): c's stats then. */
static struct client_stats await_answers(struct client *c, int poll_ms, int ms)
{
    struct client_stats st;
    struct proto_msg m;
    char err[256];
    uint64_t end = ms ? mono_ms() + (uint64_t)ms * (uint64_t)test_time_scale() : UINT64_MAX;
    do {
        client_poll(c, poll_ms, &m, err, sizeof err);
        client_get_stats(c, &st);
    } while (st.outbox && mono_ms() < end);
    return st;
}

/* A NaN report names the step the drafter skipped: until the operator's resume a checkpoint of
 * that step or later is refused (a drafter that trained on after taking an earlier RESUME for the
 * answer), one before it is taken; also after a coordinator restart; after the resume, taken. */
static void nan_checkpoint_after_step_refused(void)
{
    struct client *d;
    struct ring *r;
    uint64_t gen = start_as_drafter(&d, &r);
    train_one(d, r, gen);
    struct proto_msg m;
    char err[256];
    CHECK_OK(client_error_nan(d, 2, "loss is nan at step 2"));
    uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    while (strcmp(status_str("state"), "paused") && mono_ms() < end)
        client_poll(d, 20, &m, err, sizeof err);
    CHECK_STR(status_str("state"), "paused");
    struct client_stats st0, st;
    client_get_stats(d, &st0);
    CHECK_OK(client_checkpointed(d, 2, gen, "/nonexistent/step-2"));
    st = await_answers(d, 10, 5000);
    CHECK_INT(st.nacks, ==, st0.nacks + 1);
    CHECK_INT(tc_status_num("batches.checkpointed"), ==, 0);
    tc_kill(TC.coord);
    tc_start_coord();
    expect_state("paused", 5000);
    CHECK_OK(client_checkpointed(d, 3, gen, "/nonexistent/step-3"));
    st = await_answers(d, 10, 5000);
    CHECK_INT(st.nacks, ==, st0.nacks + 2);
    CHECK_OK(client_checkpointed(d, 1, gen, "/nonexistent/step-1"));
    st = await_answers(d, 10, 5000);
    CHECK_INT(st.nacks, ==, st0.nacks + 2);
    tc_wait_num("batches.checkpointed", 1, 5000);
    control(PROTO_CTL_RESUME);
    CHECK_OK(client_checkpointed(d, 2, gen, "/nonexistent/step-2"));
    st = await_answers(d, 10, 5000);
    CHECK_INT(st.nacks, ==, st0.nacks + 2);
    client_free(d);
    ring_detach(r);
    printf("ok: with a NaN at step 2 waiting for the resume, checkpoints of step 2 and 3 are refused (also after"
           " a restart), step 1 is taken; after the resume step 2 is\n");
}

/* Set before fork_publisher: its copy must be out of the ring by the time its PUBLISHED is
 * answered (exit 6 when that slot is still READY with its batch). */
static int publisher_expects_retract;

/* Set before fork_publisher: it returns its lease once its copy is READY in the ring, before its
 * PUBLISHED (the batch is queued again while that copy waits there). */
static int publisher_returns_lease;

/* A target: leases one batch, writes it into the ring and its id to id_fd; with go_fd >= 0 it
 * reports PUBLISHED only once a byte comes on go_fd. It exits when the report is answered:
 * 0 accepted, 1 refused with -DF_ESTATE, more: trouble. */
static pid_t fork_publisher(int id_fd, int go_fd)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid)
        return pid;
    struct client *c = peer_connect(PROTO_ROLE_TARGET, 0);
    struct ring *r = peer_ring();
    struct dataset ds;
    char err[512], b;
    struct proto_msg m;
    if (dataset_open(&ds, TC.data, DATASET_OPEN_NO_CHECKSUM, err, sizeof err) < 0 || client_lease_request(c, 1) < 0)
        _exit(2);
    while (client_poll(c, 50, &m, err, sizeof err) >= 0 && m.type != PROTO_LEASE_GRANT)
        ;
    uint64_t id = m.grant.batch_id;
    unsigned slot;
    int n;
    if (ring_claim_write(r, 1000, &slot) < 0 || (n = tc_fill_publish(c, r, &ds, id, m.grant.epoch, m.grant.n_tokens, slot)) <= 0)
        _exit(3);
    if ((publisher_returns_lease && client_lease_return(c, id) < 0) || write(id_fd, &id, sizeof id) != sizeof id)
        _exit(4);
    while (go_fd >= 0 && read(go_fd, &b, 1) != 1)
        client_poll(c, 10, &m, err, sizeof err);
    client_published(c, id, slot, (uint32_t)n);
    struct client_stats st = await_answers(c, 10, 0);
    struct ring_stats rs;
    struct ring_slot_stat ss[16];
    if (publisher_expects_retract && ring_stats(r, &rs, ss) == 0 && slot < 16 && ss[slot].state == RING_READY &&
        ss[slot].batch_id == id)
        _exit(6);
    _exit(!st.nacks ? 0 : st.last_nack_status == -DF_ESTATE ? 1 : 5);
}

/* A drafter (device 0): joins, takes the copy of batch id from the ring ("c" on done_fd), with
 * after_restart waits for its generation to end, then reports TRAINED of that generation
 * ("t" on done_fd once acknowledged), and stays connected. */
static pid_t fork_taker(uint64_t id, int done_fd, int after_restart)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid)
        return pid;
    struct client *c = peer_connect(PROTO_ROLE_DRAFTER, 0);
    struct ring *r = peer_ring();
    struct proto_msg m;
    char err[256];
    uint64_t gen = 0;
    client_join_group(c);
    while (!gen && client_poll(c, 50, &m, err, sizeof err) >= 0)
        if (m.type == PROTO_GROUP)
            gen = m.group.generation;
    unsigned slot;
    if (ring_claim_read(r, NULL, 5000, &slot) < 0 || ring_slot_header(r, slot)->batch_id != id)
        _exit(2);
    uint32_t lease = ring_slot_header(r, slot)->lease;
    if (ring_release(r, slot) < 0 || write(done_fd, "c", 1) != 1)
        _exit(2);
    while (after_restart && client_poll(c, 50, &m, err, sizeof err) >= 0 && m.type != PROTO_RESTART)
        ;
    client_trained(c, id, lease, 1, 0, gen);
    await_answers(c, 10, 0);
    if (write(done_fd, "t", 1) != 1)
        _exit(3);
    for (;;)
        client_poll(c, 10, &m, err, sizeof err);
}

static uint64_t read_id(int fd)
{
    uint64_t id = 0;
    CHECK(read(fd, &id, sizeof id) == sizeof id);
    return id;
}

/* A target publishes one batch and exits once its PUBLISHED is acknowledged: the batch id. */
static uint64_t publish_one(void)
{
    int fd[2];
    CHECK(pipe(fd) == 0);
    pid_t t = fork_publisher(fd[1], -1);
    uint64_t id = read_id(fd[0]);
    CHECK_INT(tc_exit_status(t, 10000 * test_time_scale()), ==, 0);
    close(fd[0]);
    close(fd[1]);
    return id;
}

static void poll_for(struct client *c, int ms)
{
    struct proto_msg m;
    char err[256];
    uint64_t end = mono_ms() + (uint64_t)ms;
    do
        client_poll(c, 10, &m, err, sizeof err);
    while (mono_ms() < end);
}

/* Poll c (its heartbeat goes on) until the coordinator's recovery window is over. */
static void await_recovered(struct client *c)
{
    uint64_t end = mono_ms() + 10000 * (uint64_t)test_time_scale();
    for (;;) {
        cJSON *st = tc_query(PROTO_Q_STATUS);
        int over = st && cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(st, "recovering"));
        cJSON_Delete(st);
        if (over || mono_ms() >= end)
            break;
        poll_for(c, 50);
    }
    CHECK_STR(status_str("state"), "running");
}

static void late_trained_after_restart(void)
{
    struct client *d;
    struct ring *r;
    char extra[64];     /* the window scaled: the drafter must be back before it ends */
    snprintf(extra, sizeof extra, "[coordinator]\nrecovery_ms = %d\n", 600 * test_time_scale());
    drafter_extra = extra;
    uint64_t gen = start_as_drafter(&d, &r);
    drafter_extra = NULL;
    uint64_t id = publish_one();
    CHECK_STR(tc_batch_state(id), "published");

    tc_kill(TC.coord);
    tc_start_coord();                               /* the recovery window starts here */
    uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    while (!client_connected(d) && mono_ms() < end)
        poll_for(d, 20);
    CHECK(client_connected(d));
    unsigned slot;
    CHECK_OK(ring_claim_read(r, NULL, 1000, &slot));
    CHECK_INT(ring_slot_header(r, slot)->batch_id, ==, id);
    uint32_t lease = ring_slot_header(r, slot)->lease;
    CHECK_OK(ring_release(r, slot));                /* taken; its TRAINED comes after the window */
    await_recovered(d);
    CHECK_STR(tc_batch_state(id), "published");
    CHECK_OK(client_trained(d, id, lease, 1, 0, gen));
    expect_batch(id, "trained", d, 5000);
    client_free(d);
    ring_detach(r);
    printf("ok: a batch taken just before the recovery window ended stays published until its TRAINED\n");
}

static void detached_target_keeps_lease(void)
{
    start_coord("[drafter]\nworld_size = 1\n[coordinator]\ndead_after_ms = 300\n");
    int fd[2];
    CHECK(pipe(fd) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (!pid) {
        struct client *t = peer_connect(PROTO_ROLE_TARGET, 0);
        struct proto_msg m;
        char err[256];
        if (client_lease_request(t, 1) < 0)
            _exit(2);
        while (client_poll(t, 50, &m, err, sizeof err) >= 0 && m.type != PROTO_LEASE_GRANT)
            ;
        uint64_t id = m.grant.batch_id;
        client_free(t);                     /* cut off, alive, holding the lease */
        if (write(fd[1], &id, sizeof id) != sizeof id)
            _exit(3);
        for (;;)
            pause();
    }
    kids[0] = pid;
    uint64_t id = 0;
    CHECK(read(fd[0], &id, sizeof id) == sizeof id);
    tc_sleep_ms(1500 * test_time_scale()); /* five times dead_after_ms, or more */
    CHECK_STR(tc_batch_state(id), "leased");
    tc_kill(pid);
    kids[0] = 0;
    expect_batch(id, "queued", NULL, 3000);
    close(fd[0]);
    close(fd[1]);
    printf("ok: a live target cut off keeps its lease; dead, the batch is queued again\n");
}

static void late_published_after_rollback(void)
{
    start_coord("[drafter]\nworld_size = 1\n");
    int tp[2], tgo[2], dp[2];
    CHECK(pipe(tp) == 0 && pipe(tgo) == 0 && pipe(dp) == 0);
    pid_t t = fork_publisher(tp[1], tgo[0]);    /* reports PUBLISHED only on `tgo` */
    kids[0] = t;
    uint64_t id = read_id(tp[0]);
    pid_t d = fork_taker(id, dp[1], 0);        /* takes the copy, reports TRAINED */
    kids[1] = d;
    char b;
    CHECK(read(dp[0], &b, 1) == 1 && read(dp[0], &b, 1) == 1);
    CHECK_STR(tc_batch_state(id), "trained");
    tc_kill(d);                             /* no checkpoint: the generation is rolled back */
    kids[1] = 0;
    expect_batch(id, "queued", NULL, 5000);
    CHECK(write(tgo[1], "g", 1) == 1);      /* now the target's PUBLISHED arrives */
    CHECK_INT(tc_exit_status(t, 5000 * test_time_scale()), ==, 1);     /* refused with -DF_ESTATE */
    kids[0] = 0;
    CHECK_STR(tc_batch_state(id), "queued");
    printf("ok: a PUBLISHED arriving after its copy was trained and rolled back is refused\n");
}

static void late_trained_then_published(void)
{
    start_coord("[drafter]\nworld_size = 2\n");
    int tp[2], tgo[2], dp[2], dgo[2], ready[2], qgo[2];
    CHECK(pipe(tp) == 0 && pipe(tgo) == 0 && pipe(dp) == 0 && pipe(dgo) == 0 && pipe(ready) == 0 && pipe(qgo) == 0);
    pid_t t = fork_publisher(tp[1], tgo[0]);    /* reports PUBLISHED only on `tgo` */
    kids[0] = t;
    uint64_t id = read_id(tp[0]);
    kids[1] = fork_quiet_drafter(1, ready[1], qgo[0]);
    pid_t d = fork_taker(id, dp[1], 1);        /* rank 0: takes the copy, reports it after the RESTART */
    kids[2] = d;
    char b;
    CHECK(read(ready[0], &b, 1) == 1);      /* the generation is formed */
    CHECK(read(dp[0], &b, 1) == 1);         /* rank 0 took the copy */
    tc_kill(kids[1]);                       /* rank 1 dies: the generation ends */
    kids[1] = 0;
    CHECK(read(dp[0], &b, 1) == 1);         /* rank 0's TRAINED of the ended generation is in */
    CHECK_STR(tc_batch_state(id), "leased");
    CHECK(write(tgo[1], "g", 1) == 1);      /* now the target's PUBLISHED */
    CHECK_INT(tc_exit_status(t, 5000 * test_time_scale()), ==, 0);     /* its lease: accepted */
    kids[0] = 0;
    expect_batch(id, "queued", NULL, 5000);
    printf("ok: a copy trained by an ended generation before its PUBLISHED came is queued again\n");
}

/* A drafter of a one-rank group (*d, *r, *gen), and a target (kids[0]) whose copy of one batch is
 * READY in the ring with its PUBLISHED withheld until a byte arrives on tgo[0]. The batch id. */
static uint64_t withheld_copy(struct client **d, struct ring **r, uint64_t *gen, int tp[2], int tgo[2])
{
    *gen = start_as_drafter(d, r);
    CHECK(pipe(tp) == 0 && pipe(tgo) == 0);
    kids[0] = fork_publisher(tp[1], tgo[0]);
    return read_id(tp[0]);
}

/* A copy READY in the ring of a batch that has been trained meanwhile (its lease revoked too
 * late: the target had published already) is taken out of the ring, not trained a second time.
 * Its PUBLISHED, sent the moment the TRAINED is acknowledged, takes it out before its answer:
 * with the coordinator's tick slowed to 250 ms, the tick's sweep of the ring rarely comes in
 * between (and when it does, the copy is out all the same). */
static void trained_copy_retracted(void)
{
    struct client *d;
    struct ring *r;
    uint64_t gen;
    int tp[2], tgo[2];
    publisher_expects_retract = 1;
    drafter_extra = "[coordinator]\nheartbeat_ms = 500\n";
    uint64_t id = withheld_copy(&d, &r, &gen, tp, tgo);
    publisher_expects_retract = 0;
    drafter_extra = NULL;
    pid_t t = kids[0];
    CHECK_OK(client_trained(d, id, 1, 1, 0, gen));     /* trained meanwhile (the lease is revoked) */
    CHECK_INT(await_answers(d, 1, 5000).outbox, ==, 0);
    CHECK(write(tgo[1], "g", 1) == 1);
    CHECK_INT(tc_exit_status(t, 5000 * test_time_scale()), ==, 0);
    kids[0] = 0;
    expect_batch(id, "trained", d, 5000);
    struct ring_stats rs;
    struct ring_slot_stat ss[16];
    CHECK_OK(ring_stats(r, &rs, ss));
    for (uint32_t i = 0; i < rs.nslots && i < 16; i++)
        if ((ss[i].state == RING_READY || ss[i].state == RING_READING) && ss[i].batch_id == id)
            TEST_FAIL("trained batch %llu is still in slot %u (%s)", (unsigned long long)id, i,
                      ring_state_name(ss[i].state));
    CHECK_INT(rs.retracted, ==, 1);
    CHECK_INT(tc_status_num("batches.retracted"), ==, 1);
    CHECK_STR(tc_batch_state(id), "trained");
    close(tp[0]);
    close(tp[1]);
    close(tgo[0]);
    close(tgo[1]);
    client_free(d);
    ring_detach(r);
    printf("ok: a READY copy of a batch trained meanwhile is taken out of the ring\n");
}

/* The same copy, but its target dies before its PUBLISHED: no message about it comes, and the
 * coordinator's sweep of the ring takes it out. */
static void trained_copy_of_dead_target_retracted(void)
{
    struct client *d;
    struct ring *r;
    uint64_t gen;
    int tp[2], tgo[2];
    uint64_t id = withheld_copy(&d, &r, &gen, tp, tgo);
    tc_kill(kids[0]);                           /* dies with its PUBLISHED unsent */
    kids[0] = 0;
    CHECK_OK(client_trained(d, id, 1, 1, 0, gen));     /* trained from another copy */
    expect_batch(id, "trained", d, 5000);
    struct ring_stats rs;
    struct ring_slot_stat ss[16];
    int held = 1;
    uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    rs.retracted = 0;
    /* (the slot turns FREE a moment before the ring's count of retracts moves) */
    while ((held || rs.retracted != 1) && mono_ms() < end) {
        client_poll(d, 20, &(struct proto_msg){ 0 }, (char[256]){ 0 }, 256);
        CHECK_OK(ring_stats(r, &rs, ss));
        held = 0;
        for (uint32_t i = 0; i < rs.nslots && i < 16; i++)
            held |= (ss[i].state == RING_READY || ss[i].state == RING_READING) && ss[i].batch_id == id;
    }
    if (held)
        TEST_FAIL("trained batch %llu is still READY in the ring 5 s after it was trained", (unsigned long long)id);
    CHECK_INT(rs.retracted, ==, 1);
    CHECK_INT(tc_status_num("batches.retracted"), ==, 1);
    CHECK_STR(tc_batch_state(id), "trained");
    for (int i = 0; i < 2; i++) {
        close(tp[i]);
        close(tgo[i]);
    }
    client_free(d);
    ring_detach(r);
    printf("ok: a READY copy of a trained batch that no PUBLISHED announces is taken out of the ring\n");
}

/* The first slot that holds batch id READY in r (-1: none). */
static int ready_slot(struct ring *r, uint64_t id)
{
    struct ring_stats rs;
    struct ring_slot_stat ss[16];
    CHECK_OK(ring_stats(r, &rs, ss));
    for (uint32_t i = 0; i < rs.nslots && i < 16; i++)
        if (ss[i].state == RING_READY && ss[i].batch_id == id)
            return (int)i;
    return -1;
}

/* A second copy of a published batch is taken out of the ring when its PUBLISHED comes: target A
 * wrote batch X into the ring under lease 1 and returned the lease before its PUBLISHED; target
 * B leased X again (lease 2) and published it in another slot. A's PUBLISHED, late, is refused
 * as a duplicate and its copy (lease 1) leaves the ring; B's (the lease to keep) stays. */
static void second_copy_retracted(void)
{
    start_coord("[drafter]\nworld_size = 1\n");
    int tp[2], tgo[2];
    CHECK(pipe(tp) == 0 && pipe(tgo) == 0);
    publisher_returns_lease = 1;
    publisher_expects_retract = 1;
    pid_t a = fork_publisher(tp[1], tgo[0]);        /* A, device 0: PUBLISHED only on `tgo` */
    publisher_returns_lease = 0;
    publisher_expects_retract = 0;
    kids[0] = a;
    uint64_t id = read_id(tp[0]);
    expect_batch(id, "queued", NULL, 5000);         /* the lease returned */
    struct ring *r = peer_ring();
    int slot_a = ready_slot(r, id);
    CHECK(slot_a >= 0);                             /* A's copy waits in the ring */

    struct client *b = peer_connect(PROTO_ROLE_TARGET, 1);     /* B */
    struct dataset ds;
    char err[512];
    CHECK_OK(dataset_open(&ds, TC.data, DATASET_OPEN_NO_CHECKSUM, err, sizeof err));
    CHECK_OK(client_lease_request(b, 1));
    struct proto_msg m = { 0 };
    uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    while (m.type != PROTO_LEASE_GRANT && mono_ms() < end)
        if (client_poll(b, 20, &m, err, sizeof err) <= 0)
            m.type = 0;
    CHECK_INT(m.type, ==, PROTO_LEASE_GRANT);
    CHECK_INT(m.grant.batch_id, ==, id);            /* the lowest pending id goes first */
    CHECK_INT(m.grant.lease, ==, 2);
    unsigned slot_b;
    CHECK_OK(ring_claim_write(r, 1000, &slot_b));
    CHECK_INT(slot_b, !=, slot_a);
    int n = tc_fill_publish(b, r, &ds, id, m.grant.epoch, m.grant.n_tokens, slot_b);
    CHECK(n > 0);
    CHECK_OK(client_published(b, id, slot_b, (uint32_t)n));
    struct client_stats st = await_answers(b, 10, 5000);
    CHECK_INT(st.outbox, ==, 0);
    CHECK_INT(st.nacks, ==, 0);
    CHECK_STR(tc_batch_state(id), "published");
    CHECK_INT(tc_status_num("ring.retracted"), ==, 0);
    CHECK_INT(tc_status_num("batches.retracted"), ==, 0);

    CHECK(write(tgo[1], "g", 1) == 1);              /* now A's PUBLISHED of its copy, slot_a */
    CHECK_INT(tc_exit_status(a, 5000 * test_time_scale()), ==, 1);     /* a duplicate (6: its copy still READY) */
    kids[0] = 0;
    struct ring_stats rs;
    struct ring_slot_stat ss[16];
    CHECK_OK(ring_stats(r, &rs, ss));
    CHECK_STR(ring_state_name(ss[slot_a].state), ring_state_name(RING_FREE));
    CHECK_INT(ready_slot(r, id), ==, (int)slot_b);  /* B's copy stays */
    CHECK_INT(rs.retracted, ==, 1);
    CHECK_INT(tc_status_num("ring.retracted"), ==, 1);
    CHECK_INT(tc_status_num("batches.retracted"), ==, 1);
    CHECK_INT(tc_status_num("batches.duplicates"), ==, 1);
    CHECK_STR(tc_batch_state(id), "published");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "grep -q 'its copy in slot %d taken out of the ring: a second copy of a published batch' "
             "'%s/coordinator.log'", slot_a, TC.dir);
    CHECK_INT(system(cmd), ==, 0);
    for (int i = 0; i < 2; i++) {
        close(tp[i]);
        close(tgo[i]);
    }
    dataset_close(&ds);
    client_free(b);
    ring_detach(r);
    printf("ok: a second copy of a published batch leaves the ring when its late PUBLISHED comes\n");
}

/* A drafter (device 0) of a one-rank group: takes the copy of the next batch in the ring, reports
 * it TRAINED and checkpointed at step 1 (its id on done_fd once both are acknowledged) and keeps
 * the slot claimed until it is killed. */
static pid_t fork_holder(int ready_fd, int done_fd)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid)
        return pid;
    struct client *c = peer_connect(PROTO_ROLE_DRAFTER, 0);
    struct ring *r = peer_ring();
    struct proto_msg m;
    char err[256];
    uint64_t gen = tc_join_group(c, 10000).generation;
    unsigned slot;
    if (!gen || write(ready_fd, "g", 1) != 1 || ring_claim_read(r, NULL, 10000, &slot) < 0)
        _exit(2);
    uint64_t id = ring_slot_header(r, slot)->batch_id;
    client_trained(c, id, ring_slot_header(r, slot)->lease, 1, 0, gen);
    client_checkpointed(c, 1, gen, "/nonexistent/ckpt-step1");
    if (await_answers(c, 10, 0).nacks || write(done_fd, &id, sizeof id) != sizeof id)
        _exit(3);
    for (;;)
        client_poll(c, 10, &m, err, sizeof err);
}

/* A drafter dies holding a slot whose batch is checkpointed (e.g. a second copy it had staged):
 * the reclaim puts the copy back to READY and a standby drafter forms the next generation in the
 * same breath. The new group remembers nothing it trained, so the copy must be out of the ring
 * before its GROUP goes out. recovery 0: the coordinator is stopped while the holder dies, so that
 * the hang-up, the reclaim and the new group come in one callback, ahead of any tick's sweep.
 * recovery 1: the coordinator was restarted just before and is in its recovery window when the
 * holder dies and the standby forms generation 2 (the retract waited for the window's end, so the
 * new generation could take the copy and train the batch again). */
static void trained_copy_out_before_group(int recovery)
{
    char extra[128];
    int window_ms = 8000 * test_time_scale();
    snprintf(extra, sizeof extra, "[drafter]\nworld_size = 1\n[coordinator]\nrecovery_ms = %d\n",
             recovery ? window_ms : 600);
    start_coord(extra);
    int rp[2], dp[2];
    CHECK(pipe(rp) == 0 && pipe(dp) == 0);
    kids[1] = fork_holder(rp[1], dp[1]);
    char g;
    CHECK(read(rp[0], &g, 1) == 1);                 /* generation 1 formed with the holder */
    uint64_t pub = publish_one();
    uint64_t id = read_id(dp[0]);
    CHECK_INT(id, ==, pub);
    struct client *d = peer_connect(PROTO_ROLE_DRAFTER, 1);
    struct ring *r = peer_ring();
    tc_wait_num("batches.checkpointed", 1, 5000);
    client_join_group(d);                           /* standby: the group has its one rank */
    poll_for(d, 300);
    uint64_t t0 = mono_ms();
    if (recovery) {
        tc_kill(TC.coord);
        t0 = mono_ms();
        tc_start_coord();                           /* recovering for window_ms from here */
        poll_for(d, 300);                           /* both drafters back: the holder in its rank */
        tc_kill(kids[1]);
    } else {
        kill(TC.coord, SIGSTOP);
        tc_kill(kids[1]);
        kill(TC.coord, SIGCONT);
    }
    kids[1] = 0;
    struct proto_msg m;
    char err[256];
    uint64_t gen = 0, end = mono_ms() + 10000 * (uint64_t)test_time_scale();
    while (gen < 2 && mono_ms() < end)
        if (client_poll(d, 5, &m, err, sizeof err) > 0 && m.type == PROTO_GROUP)
            gen = m.group.generation;
    CHECK_INT(gen, ==, 2);
    if (recovery)
        CHECK(mono_ms() - t0 < (uint64_t)window_ms);    /* it formed within the window */
    struct ring_stats rs;
    struct ring_slot_stat ss[16];
    CHECK_OK(ring_stats(r, &rs, ss));
    for (uint32_t i = 0; i < rs.nslots && i < 16; i++)
        if (ss[i].state == RING_READY && ss[i].batch_id == id)
            TEST_FAIL("checkpointed batch %llu is READY in slot %u when generation 2 starts%s", (unsigned long long)id,
                      i, recovery ? " in the recovery window" : "");
    CHECK_INT(rs.retracted, ==, 1);
    CHECK_INT(tc_status_num("batches.checkpointed"), ==, 1);
    CHECK_STR(tc_batch_state(id), "queued");        /* (not in flight: done) */
    for (int i = 0; i < 2; i++) {
        close(rp[i]);
        close(dp[i]);
    }
    client_free(d);
    ring_detach(r);
    printf("ok: a READY copy of a checkpointed batch is out of the ring before the next generation starts%s\n",
           recovery ? " (formed in the recovery window)" : "");
}

/* A drafter (device 0) of a one-rank group: joins, reports a checkpoint of its generation at
 * `step` (a byte on done_fd once it is acknowledged) and stays connected until it is killed. */
static pid_t fork_checkpointer(uint64_t step, int done_fd)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid)
        return pid;
    struct client *c = peer_connect(PROTO_ROLE_DRAFTER, 0);
    struct proto_msg m;
    char err[256], dir[64];
    uint64_t gen = tc_join_group(c, 10000).generation;
    snprintf(dir, sizeof dir, "/nonexistent/ckpt-step%llu", (unsigned long long)step);
    if (!gen || client_checkpointed(c, step, gen, dir) < 0 || await_answers(c, 10, 0).nacks ||
        write(done_fd, "c", 1) != 1)
        _exit(2);
    for (;;)
        client_poll(c, 10, &m, err, sizeof err);
}

/* Drafter d's checkpoint of generation gen at step: 0 acknowledged, else the refusal's status. */
static int checkpoint_answer(struct client *d, uint64_t gen, uint64_t step, const char *dir)
{
    struct client_stats st0, st;
    client_get_stats(d, &st0);
    CHECK_OK(client_checkpointed(d, step, gen, dir));
    st = await_answers(d, 10, 5000);
    CHECK_INT(st.outbox, ==, 0);
    return st.nacks == st0.nacks ? 0 : st.last_nack_status;
}

/* The lineage's head in the checkpoints query (read from the ledger with it): its generation and
 * step, and how many checkpoints the ledger lists. */
static void expect_head(uint64_t gen, uint64_t step, int listed)
{
    cJSON *ck = tc_query(PROTO_Q_CHECKPOINTS);
    CHECK(ck);
    const cJSON *head = cJSON_GetObjectItemCaseSensitive(ck, "head");
    CHECK_INT(tc_num(head, "generation"), ==, gen);
    CHECK_INT(tc_num(head, "step"), ==, step);
    CHECK_INT(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(ck, "checkpoints")), ==, listed);
    cJSON_Delete(ck);
    CHECK_INT(tc_status_num("group.checkpoint.generation"), ==, gen);
    CHECK_INT(tc_status_num("group.checkpoint.step"), ==, step);
}

/* A standby drafter joins, the group's only rank (*kid) is killed: returns the standby, *m the
 * GROUP of generation 2 it is given. */
static struct client *standby_takes_over(pid_t *kid, struct proto_msg *m)
{
    struct client *d = peer_connect(PROTO_ROLE_DRAFTER, 1);
    client_join_group(d);
    poll_for(d, 300);
    tc_kill(*kid);
    *kid = 0;
    char err[256];
    uint64_t end = mono_ms() + 10000 * (uint64_t)test_time_scale();
    m->type = 0;
    while (mono_ms() < end && !(m->type == PROTO_GROUP && m->group.generation == 2))
        if (client_poll(d, 5, m, err, sizeof err) <= 0)
            m->type = 0;
    CHECK_INT(m->type, ==, PROTO_GROUP);
    return d;
}

/* A generation starts from the lineage's head: a checkpoint of it at a step before the head's
 * was trained from other weights (a rank that did not load the head) and is refused; the head
 * stays. Generation 1 checkpoints step 5 and ends (its drafter dies); generation 2, formed from
 * that head, reports step 3: refused. Its step 6 is taken. */
static void checkpoint_before_generation_start_refused(void)
{
    start_coord("[drafter]\nworld_size = 1\n");
    int dp[2];
    CHECK(pipe(dp) == 0);
    kids[1] = fork_checkpointer(5, dp[1]);
    char c;
    CHECK(read(dp[0], &c, 1) == 1);                 /* generation 1's checkpoint of step 5: the head */
    expect_head(1, 5, 1);
    struct proto_msg m;
    struct client *d = standby_takes_over(&kids[1], &m);     /* generation 1 ends, 2 forms */
    CHECK_INT(m.group.generation, ==, 2);
    CHECK_INT(m.group.rank, ==, 0);
    CHECK_INT(m.group.ckpt_step, ==, 5);            /* it starts from the head */
    CHECK_INT(checkpoint_answer(d, 2, 3, "/nonexistent/gen2-step3"), ==, -DF_ESTATE);
    expect_head(1, 5, 1);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "grep -q 'checkpoint /nonexistent/gen2-step3 of generation 2 at step 3 refused: the "
             "generation started from step 5' '%s/coordinator.log'", TC.dir);
    CHECK_INT(system(cmd), ==, 0);
    CHECK_INT(checkpoint_answer(d, 2, 6, "/nonexistent/gen2-step6"), ==, 0);
    expect_head(2, 6, 2);
    close(dp[0]);
    close(dp[1]);
    client_free(d);
    printf("ok: a checkpoint of a new generation before the step it started from is refused\n");
}

static void released_batch_named_in_group(void)
{
    start_coord("[drafter]\nworld_size = 1\n");
    int lp[2], rp[2], dp[2];
    CHECK(pipe(lp) == 0 && pipe(rp) == 0 && pipe(dp) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (!pid) {                                     /* a target that takes one lease and dies */
        struct client *t = peer_connect(PROTO_ROLE_TARGET, 0);
        struct proto_msg m;
        char err[256];
        if (client_lease_request(t, 1) < 0)
            _exit(2);
        while (client_poll(t, 50, &m, err, sizeof err) >= 0 && m.type != PROTO_LEASE_GRANT)
            ;
        if (write(lp[1], &m.grant.batch_id, 8) != 8)
            _exit(3);
        for (;;)
            pause();
    }
    kids[0] = pid;
    uint64_t id = read_id(lp[0]);
    tc_kill(pid);
    kids[0] = 0;
    expect_batch(id, "queued", NULL, 3000);
    kids[1] = fork_holder(rp[1], dp[1]);
    char g;
    CHECK(read(rp[0], &g, 1) == 1);                 /* generation 1 formed with the holder */
    CHECK_INT(publish_one(), ==, id);               /* its second lease (the lowest id goes first) */
    CHECK_INT(read_id(dp[0]), ==, id);              /* trained and checkpointed by generation 1 */
    struct proto_msg m;
    struct client *d = standby_takes_over(&kids[1], &m);     /* generation 1 ends, 2 forms */
    CHECK_INT(m.group.n_done, ==, 1);
    CHECK_INT(proto_group_id(&m, 0), ==, id);
    CHECK_INT(m.group.run_batches, ==, tc_status_num("epoch.total_batches"));  /* one epoch: exact */
    for (int i = 0; i < 2; i++) {
        close(lp[i]);
        close(rp[i]);
        close(dp[i]);
    }
    client_free(d);
    printf("ok: a batch checkpointed after two leases is named in the next generation's GROUP\n");
}

/* A fatal error that comes while the operator's drain is on its way still ends the run FAILED
 * (exit 78): it was logged and forgotten, and the drain ended "stopped", exit 0. */
static uint64_t lease_one(struct client *t)
{
    struct proto_msg m;
    char err[256];
    CHECK_OK(client_lease_request(t, 1));
    uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    m.type = 0;
    while (m.type != PROTO_LEASE_GRANT && mono_ms() < end)
        if (client_poll(t, 20, &m, err, sizeof err) <= 0)
            m.type = 0;
    CHECK_INT(m.type, ==, PROTO_LEASE_GRANT);
    return m.grant.batch_id;
}

static void fatal_during_drain(void)
{
    start_coord("[drafter]\nworld_size = 1\n");
    struct client *t = peer_connect(PROTO_ROLE_TARGET, 0);
    uint64_t id = lease_one(t);
    control(PROTO_CTL_DRAIN);                       /* waits for the lease */
    CHECK_OK(client_error(t, 1, -EIO, "GPU 0 fell off the bus"));
    poll_for(t, 300);
    CHECK_STR(status_str("state"), "draining");
    CHECK_OK(client_lease_return(t, id));
    poll_for(t, 300);
    CHECK_INT(tc_exit_status(TC.coord, 5000 * test_time_scale()), ==, 78);
    TC.coord = 0;
    client_free(t);
    printf("ok: a fatal error during a drain ends the run FAILED\n");
}

/* A stop while a fatal error drains the run (the operator's `dflashctl stop`, or a signal) cuts
 * the drain short but ends the run FAILED with the error in its reason (exit 78): it ended
 * "stopped by dflashctl", exit 0, as if nothing had failed. */
static void fatal_then_stop(int by_signal)
{
    start_coord("[drafter]\nworld_size = 1\n");
    struct client *t = peer_connect(PROTO_ROLE_TARGET, 0);
    lease_one(t);                                   /* the drain waits for it */
    CHECK_OK(client_error(t, 1, -EIO, "GPU 0 fell off the bus"));
    poll_for(t, 300);
    CHECK_STR(status_str("state"), "draining");
    if (by_signal) {
        kill(TC.coord, SIGTERM);
        expect_state("failed", 5000);
    } else {
        control(PROTO_CTL_STOP);
        CHECK_STR(status_str("state"), "failed");
    }
    char why[512];
    snprintf(why, sizeof why, "%s", status_str("reason"));
    CHECK_CONTAINS(why, "GPU 0 fell off the bus");
    CHECK_CONTAINS(why, by_signal ? "stop signal" : "stop by");
    CHECK_INT(control_answer(PROTO_CTL_DRAIN, NULL, 0), ==, -DF_ESTATE);     /* ended: not "drain: failed", 0 */
    client_free(t);
    CHECK_INT(tc_exit_status(TC.coord, 5000 * test_time_scale()), ==, 78);
    TC.coord = 0;
    printf("ok: a %s during a fatal error's drain ends the run FAILED: %s\n", by_signal ? "stop signal" : "stop", why);
}
static void fatal_then_ctl_stop(void) { fatal_then_stop(0); }
static void fatal_then_stop_signal(void) { fatal_then_stop(1); }

/* A stop signal while a non-finite value waits for the operator's resume stops at once (a drain
 * could not end: the poisoned drafter writes no checkpoint); the run started again is not held
 * by that value any more (a drain is taken). */
static void nan_then_stop_signal(void)
{
    struct client *d;
    struct ring *r;
    uint64_t gen = start_as_drafter(&d, &r);
    train_one(d, r, gen);
    nan_pause(d);
    struct proto_msg m;
    char err[256];
    kill(TC.coord, SIGTERM);
    uint64_t end = mono_ms() + 3000 * (uint64_t)test_time_scale();
    const char *st = "paused";
    while (mono_ms() < end && strcmp(st = status_str("state"), "stopped") && strcmp(st, "(down)"))
        client_poll(d, 20, &m, err, sizeof err);
    if (strcmp(st, "stopped") && strcmp(st, "(down)"))
        TEST_FAIL("a stop signal with a non-finite value pending left the cluster %s", st);
    client_free(d);
    ring_detach(r);
    CHECK_INT(tc_exit_status(TC.coord, 10000 * test_time_scale()), ==, 0);
    tc_start_coord();
    expect_state("running", 5000);
    control(PROTO_CTL_DRAIN);      /* not refused: nothing is pending any more */
    /* (with no daemon left the drain ends as soon as the recovery window does: seen draining,
     * stopped, or already gone) */
    const char *now = status_str("state");
    if (strcmp(now, "draining") && strcmp(now, "stopped") && strcmp(now, "(down)"))
        TEST_FAIL("after the drain the cluster is %s", now);
    CHECK_INT(tc_exit_status(TC.coord, 10000 * test_time_scale()), ==, 0);
    TC.coord = 0;
    printf("ok: a stop signal with a non-finite value pending stops at once; the next start drains\n");
}

/* A non-finite value reported while the operator's pause holds: the reason shown says so (it
 * kept the pause's note alone, while a drain was refused for the value and the operator's next
 * resume answered a report never shown). */
static void nan_while_paused(void)
{
    struct client *d;
    struct ring *r;
    uint64_t gen = start_as_drafter(&d, &r);
    train_one(d, r, gen);
    control(PROTO_CTL_PAUSE);
    expect_state("paused", 5000);
    nan_report(d, "reason", "loss is nan");
    char why[512];
    snprintf(why, sizeof why, "%s", status_str("reason"));
    CHECK_CONTAINS(why, "loss is nan at step 2");
    CHECK_CONTAINS(why, "paused before: pause by test");
    CHECK_STR(status_str("state"), "paused");
    CHECK_INT(control_answer(PROTO_CTL_DRAIN, NULL, 0), ==, -DF_ESTATE);
    client_free(d);
    ring_detach(r);
    printf("ok: a non-finite value while paused is in the reason: %s\n", why);
}

/* A fatal error while a non-finite value waits for the operator's resume ends the run FAILED at
 * once: the drain it would start could never end (the poisoned drafter writes no checkpoint). */
static void nan_then_fatal(void)
{
    struct client *d;
    struct ring *r;
    uint64_t gen = start_as_drafter(&d, &r);
    train_one(d, r, gen);
    nan_pause(d);
    CHECK_OK(client_error(d, 1, -EIO, "GPU 5 fell off the bus"));
    poll_for(d, 300);
    CHECK_INT(tc_exit_status(TC.coord, 5000 * test_time_scale()), ==, 78);
    TC.coord = 0;
    client_free(d);
    ring_detach(r);
    printf("ok: a fatal error while a non-finite value is pending ends the run FAILED at once\n");
}

/* A non-finite value during a stop signal's drain ends it STOPPED (the signal comes once: paused,
 * the coordinator would wait for a resume until systemd kills it). */
static void nan_during_signal_drain(void)
{
    struct client *d;
    struct ring *r;
    uint64_t gen = start_as_drafter(&d, &r);
    train_one(d, r, gen);
    kill(TC.coord, SIGTERM);                        /* the trained batch is never checkpointed */
    expect_state("draining", 5000);
    CHECK_OK(client_error(d, 0, -DF_ENAN, "loss is nan at step 2"));
    poll_for(d, 300);
    CHECK_INT(tc_exit_status(TC.coord, 5000 * test_time_scale()), ==, 0);
    TC.coord = 0;
    client_free(d);
    ring_detach(r);
    printf("ok: a non-finite value during a stop signal's drain stops the cluster\n");
}

static void trained_copy_retracted_at_group_start(void) { trained_copy_out_before_group(0); }
static void trained_copy_retracted_in_recovery(void) { trained_copy_out_before_group(1); }

static void silent_taker(void)
{
    start_coord("[drafter]\nworld_size = 1\ncollective_timeout_ms = 400\n[coordinator]\ndead_after_ms = 300\n");
    uint64_t id = publish_one();   /* first: d, joined, would miss heartbeats while it runs */
    struct client *d = peer_connect(PROTO_ROLE_DRAFTER, 0);
    struct ring *r = peer_ring();
    client_join_group(d);
    unsigned slot;
    CHECK_OK(ring_claim_read(r, NULL, 1000, &slot));
    CHECK_INT(ring_slot_header(r, slot)->batch_id, ==, id);
    CHECK_OK(ring_release(r, slot));                /* taken; no TRAINED, no skip report */
    poll_for(d, 500);                               /* within the grace (1000 ms) */
    CHECK_STR(tc_batch_state(id), "published");
    expect_batch(id, "queued", d, 5000);
    client_free(d);
    ring_detach(r);
    printf("ok: a published batch taken and never reported is queued again after the grace\n");
}

/* A target that leases a batch and then neither publishes nor returns it (nor reads a DRAIN). */
static pid_t fork_holding_target(void)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid)
        return pid;
    struct client *c = peer_connect(PROTO_ROLE_TARGET, 0);
    char err[256];
    if (client_lease_request(c, 1) < 0)
        _exit(2);
    for (;;)
        client_idle(c, 50, err, sizeof err);
}

static void signal_drain_not_resumed(void)
{
    start_coord("[drafter]\nworld_size = 1\n");
    kids[0] = fork_holding_target();
    tc_wait_num("batches.leased", 1, 5000);
    kill(TC.coord, SIGTERM);                        /* a drain that cannot finish: a lease is held */
    expect_state("draining", 5000);
    tc_kill(TC.coord);
    tc_start_coord();
    expect_state("running", 5000);
    char note[500];
    snprintf(note, sizeof note, "%s.stopped", TC.sock);
    CHECK(access(note, F_OK) != 0);
    printf("ok: a drain on a stop signal, cut short, is not resumed: the next start runs\n");
}

/* A target hangs up holding a WRITING slot and dies a moment later (the coordinator saw it
 * alive at the hang-up: a process killed shows EOF before it is gone), just as the cluster
 * stops: the coordinator frees the slot before it leaves (it left the slot WRITING in the ring
 * it unlinked, the "ring at the end" a kill in a run's last moments left to the soak). */
static void dead_owner_slot_freed_at_exit(void)
{
    start_coord("[drafter]\nworld_size = 1\n");
    int fd[2];
    CHECK(pipe(fd) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (!pid) {
        struct client *c = peer_connect(PROTO_ROLE_TARGET, 0);
        struct ring *tr = peer_ring();
        unsigned slot;
        if (ring_claim_write(tr, 1000, &slot) < 0)
            _exit(2);
        client_free(c);                             /* hung up, alive, the slot WRITING */
        if (write(fd[1], "w", 1) != 1)
            _exit(3);
        usleep(300000);
        _exit(0);
    }
    kids[0] = pid;
    char w;
    CHECK(read(fd[0], &w, 1) == 1);
    close(fd[0]);
    close(fd[1]);
    struct ring *r = peer_ring();
    control(PROTO_CTL_STOP);
    CHECK_INT(tc_exit_status(TC.coord, 10000 * test_time_scale()), ==, 0);
    TC.coord = 0;
    struct ring_stats rs;
    CHECK_OK(ring_stats(r, &rs, NULL));
    CHECK_INT(rs.count[RING_WRITING], ==, 0);
    CHECK_INT(rs.count[RING_FREE], ==, rs.nslots);
    ring_detach(r);
    printf("ok: a slot of a target that died as the cluster stopped is freed before the coordinator leaves\n");
}

/* The run completes (its one batch checkpointed) and the coordinator is killed while it waits
 * for the daemons to leave, before its exit closes the group in the ledger; its drafter dies
 * meanwhile. Started again, the coordinator finds the run complete: the group ends with it (no
 * rollback, no "a drafter died", no RESTART) and it stops at once, exit 0. */
static void complete_run_killed_before_exit(void)
{
    tc_setup(NULL, "[drafter]\nworld_size = 1\n");
    tc_dataset(TC.data, 1, 16, 64, 1000);
    tc_start_coord();
    CHECK_INT(tc_status_num("batches.total"), ==, 1);
    int rp[2], dp[2];
    CHECK(pipe(rp) == 0 && pipe(dp) == 0);
    kids[1] = fork_holder(rp[1], dp[1]);
    char g;
    CHECK(read(rp[0], &g, 1) == 1);
    uint64_t pub = publish_one();
    CHECK_INT(read_id(dp[0]), ==, pub);
    expect_state("stopped", 5000);                  /* the holder stays: the coordinator waits for it */
    tc_kill(TC.coord);
    tc_kill(kids[1]);
    kids[1] = 0;
    char log[400], cmd[600];
    struct stat st;
    snprintf(log, sizeof log, "%s/coordinator.log", TC.dir);
    CHECK(stat(log, &st) == 0);                     /* the log is shared by the parts: read past here */
    tc_start_coord();
    CHECK_INT(tc_exit_status(TC.coord, 10000 * test_time_scale()), ==, 0);
    TC.coord = 0;
    snprintf(cmd, sizeof cmd, "tail -c +%lld %s | grep -q 'generation 1 ends ('", (long long)st.st_size + 1, log);
    if (system(cmd) == 0)
        TEST_FAIL("the restarted coordinator ended generation 1 of a complete run as a failed group");
    snprintf(cmd, sizeof cmd, "tail -c +%lld %s | grep -q 'stopped: run complete'", (long long)st.st_size + 1, log);
    CHECK(system(cmd) == 0);
    for (int i = 0; i < 2; i++) {
        close(rp[i]);
        close(dp[i]);
    }
    printf("ok: a coordinator killed after the run completed finds it complete when started again\n");
}

static void failed_run_killed_before_exit(void)
{
    start_coord("[coordinator]\ndead_after_ms = 20000\n");    /* the deaf target keeps it waiting */
    kids[0] = fork_deaf_target();
    uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    int n = 0;
    while (!n && mono_ms() < end) {
        cJSON *s = tc_query(PROTO_Q_DAEMONS);
        n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(s, "daemons"));
        cJSON_Delete(s);
        if (!n)
            tc_sleep_ms(20);
    }
    CHECK_INT(n, ==, 1);
    struct client *d = peer_connect(PROTO_ROLE_DRAFTER, 3);
    CHECK_OK(client_error(d, 1, -EIO, "GPU 3 fell off the bus"));
    poll_for(d, 300);
    expect_state("failed", 5000);
    client_free(d);
    tc_kill(TC.coord);                              /* still waiting for the deaf target */
    tc_kill(kids[0]);
    kids[0] = 0;
    char log[400], cmd[700];
    struct stat st;
    snprintf(log, sizeof log, "%s/coordinator.log", TC.dir);
    CHECK(stat(log, &st) == 0);
    char *argv[] = { (char *)tc_bin("bin/coordinator-d"), "-c", TC.ini, NULL };
    TC.coord = tc_spawn(argv, log);
    CHECK_INT(tc_exit_status(TC.coord, 10000 * test_time_scale()), ==, 78);
    TC.coord = 0;
    snprintf(cmd, sizeof cmd, "tail -c +%lld %s | grep -q 'the run had failed (.*GPU 3 fell off the bus.*) and its "
             "coordinator.s clean exit was not recorded'", (long long)st.st_size + 1, log);
    CHECK(system(cmd) == 0);
    tc_start_coord();                               /* it left cleanly: this one runs on */
    expect_state("running", 5000);
    /* A ledger whose FAILED run left cleanly under a coordinator that did not record its exit
     * (state "failed", no failed_open, as before the marker existed) runs on too. */
    tc_kill(TC.coord);
    sqlite3 *db;
    CHECK_INT(sqlite3_open(TC.ledger, &db), ==, SQLITE_OK);
    CHECK_INT(sqlite3_exec(db, "UPDATE meta SET value = 'failed' WHERE key = 'state';"
                               "DELETE FROM meta WHERE key = 'failed_open'", NULL, NULL, NULL), ==, SQLITE_OK);
    CHECK_INT(sqlite3_changes(db), ==, 1);
    sqlite3_close(db);
    tc_start_coord();
    expect_state("running", 5000);
    printf("ok: a run that failed stays failed across a coordinator killed before it left\n");
}

/* 1 when pid has a handler for SIGTERM now (its SigCgt line in /proc). */
static int catches_sigterm(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    unsigned long long mask = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "SigCgt: %llx", &mask) == 1)
            break;
    if (f)
        fclose(f);
    return (int)((mask >> (SIGTERM - 1)) & 1);
}

static void stop_signal_during_start(void)
{
    tc_setup(NULL, NULL);
    tc_dataset(TC.data, 200, 16, 64, 1000);
    char note[sizeof TC.sock + 16];
    snprintf(note, sizeof note, "%s.stopped", TC.sock);
    sqlite3 *db;            /* a new ledger, locked: the start waits in SQLite's busy handler */
    CHECK_INT(sqlite3_open(TC.ledger, &db), ==, SQLITE_OK);
    CHECK_INT(sqlite3_exec(db, "PRAGMA journal_mode=WAL; BEGIN EXCLUSIVE", NULL, NULL, NULL), ==, SQLITE_OK);
    char log[400];
    snprintf(log, sizeof log, "%s/coordinator.log", TC.dir);
    char *argv[] = { (char *)tc_bin("bin/coordinator-d"), "-c", TC.ini, NULL };
    TC.coord = tc_spawn(argv, log);
    uint64_t end = mono_ms() + 3000;
    while (!catches_sigterm(TC.coord) && mono_ms() < end)
        tc_sleep_ms(5);
    CHECK(catches_sigterm(TC.coord));
    CHECK(!tc_ctl(0));                                      /* still starting: no socket yet */
    CHECK_INT(kill(TC.coord, SIGTERM), ==, 0);
    tc_sleep_ms(300);
    char tail[500];
    snprintf(tail, sizeof tail, "tail -n 4 %s >&2", log);
    if (waitpid(TC.coord, NULL, WNOHANG) != 0) {            /* not killed by it */
        if (system(tail)) {}
        TEST_FAIL("the coordinator ended within 300 ms of a SIGTERM sent during its start");
    }
    CHECK_INT(sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL), ==, SQLITE_OK);
    sqlite3_close(db);
    CHECK_INT(tc_exit_status(TC.coord, 10000 * test_time_scale()), ==, 0);
    TC.coord = 0;
    CHECK(access(note, F_OK) == 0);                         /* the daemons started later leave */
    printf("ok: a stop signal during the checks at start stops the coordinator cleanly once they are done\n");
}

/* Between parts: every child, the coordinator, the ring and the ledger go. */
/* A drafter of device 0 that joins, says so on `ready` once it has its GROUP, then takes
 * commands from `cmd` while its heartbeats go on: 'h' hangs up (and stays silent), 'r' connects
 * and joins again (its rank back, this process being the one that held it). */
static pid_t fork_commanded_drafter(int ready, int cmd)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid)
        return pid;
    struct client *c = peer_connect(PROTO_ROLE_DRAFTER, 0);
    if (!tc_join_group(c, 20000).generation || write(ready, "r", 1) != 1)
        _exit(5);
    CHECK_OK(fcntl(cmd, F_SETFL, O_NONBLOCK));
    for (;;) {
        struct proto_msg m;
        char err[256], b;
        if (read(cmd, &b, 1) == 1 && b == 'h') {
            client_free(c);
            c = NULL;
        } else if (b == 'r' && !c) {
            c = peer_connect(PROTO_ROLE_DRAFTER, 0);
            client_join_group(c);
        }
        b = 0;
        if (c)
            client_poll(c, 20, &m, err, sizeof err);
        else
            tc_sleep_ms(20);
    }
}

static bool group_active(uint64_t *gen)
{
    cJSON *s = tc_query(PROTO_Q_STATUS);
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(s, "group");
    bool active = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(g, "active"));
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(g, "generation");
    *gen = cJSON_IsNumber(n) ? (uint64_t)n->valuedouble : 0;
    cJSON_Delete(s);
    return active;
}

static void rank_deadlines_are_per_rank(void)
{
    const int k = test_time_scale(), dead = 3000 * k;     /* (the test's own timing: 1.7 s of slack per k) */
    char extra[128];
    snprintf(extra, sizeof extra, "[drafter]\nworld_size = 2\n[coordinator]\ndead_after_ms = %d\n", dead);
    char log[600];
    struct stat st;
    snprintf(log, sizeof log, "%s/coordinator.log", TC.dir);
    off_t log_from = stat(log, &st) == 0 ? st.st_size : 0;     /* (the parts' coordinators share it) */
    start_coord(extra);
    int ready[2], cmd[2];
    CHECK(pipe(ready) == 0 && pipe(cmd) == 0);
    kids[0] = fork_commanded_drafter(ready[1], cmd[0]);
    struct client *b = peer_connect(PROTO_ROLE_DRAFTER, 1);
    CHECK(tc_join_group(b, 20000).generation == 1);
    char c;
    CHECK(read(ready[0], &c, 1) == 1);
    uint64_t gen;
    CHECK(group_active(&gen) && gen == 1);
    CHECK(write(cmd[1], "h", 1) == 1);              /* rank 0 hangs up: its deadline is t0 + dead */
    uint64_t t0 = mono_ms();
    struct proto_msg m;
    char err[256];
    while (mono_ms() < t0 + (uint64_t)dead * 2 / 3)
        client_poll(b, 20, &m, err, sizeof err);
    client_free(b);                                 /* rank 1 hangs up: its own, t1 + dead */
    uint64_t t1 = mono_ms();
    tc_sleep_ms(100 * k);
    CHECK(write(cmd[1], "r", 1) == 1);              /* rank 0 comes back */
    while (mono_ms() < t0 + (uint64_t)dead + 300 * (uint64_t)k)
        tc_sleep_ms(20);
    CHECK(mono_ms() < t1 + (uint64_t)dead);         /* (the test's own timing held) */
    if (!group_active(&gen) || gen != 1)
        TEST_FAIL("the group ended at rank 0's deadline, rank 1 still in its time (generation %" PRIu64 ")", gen);
    uint64_t end = t1 + (uint64_t)dead + 3000 * (uint64_t)k;
    while (group_active(&gen) && mono_ms() < end)
        tc_sleep_ms(50);
    CHECK(!group_active(&gen));
    FILE *f = fopen(log, "r");                      /* what this part's coordinator logged */
    CHECK(f && fseek(f, log_from, SEEK_SET) == 0);
    static char text[1 << 16];
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    CHECK_CONTAINS(text, "generation 1 ends (a drafter stayed disconnected)");
    printf("ok: each detached rank has its own time to come back\n");
}

static void waiting_drafter_counted(void)
{
    start_coord("[drafter]\nworld_size = 2\n");
    struct client *d = peer_connect(PROTO_ROLE_DRAFTER, 0);
    client_join_group(d);
    int waiting = -1;
    uint64_t end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    struct proto_msg m;
    char err[256];
    while (waiting != 1 && mono_ms() < end) {
        client_poll(d, 50, &m, err, sizeof err);
        cJSON *s = tc_query(PROTO_Q_STATUS);
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(s, "group"),
                                                          "drafters_waiting");
        waiting = cJSON_IsNumber(w) ? (int)w->valuedouble : -1;
        cJSON_Delete(s);
    }
    CHECK_INT(waiting, ==, 1);
    client_free(d);
    printf("ok: a drafter waiting for the group is counted\n");
}

static void no_group_after_stop(void)
{
    start_coord("[drafter]\nworld_size = 1\n[coordinator]\ndead_after_ms = 3000\n");
    kids[0] = fork_deaf_target();
    tc_sleep_ms(200);
    control(PROTO_CTL_STOP);
    CHECK_STR(status_str("state"), "stopped");
    struct client *d = peer_connect(PROTO_ROLE_DRAFTER, 0);
    client_join_group(d);
    struct proto_msg m;
    char err[256];
    int group = 0;
    uint64_t end = mono_ms() + 1000 * (uint64_t)test_time_scale();
    while (!group && mono_ms() < end)
        group = client_poll(d, 50, &m, err, sizeof err) > 0 && m.type == PROTO_GROUP;
    CHECK(!group);
    client_free(d);
    int rc = tc_exit_status(TC.coord, 10000 * test_time_scale());
    CHECK_INT(rc, ==, 0);
    TC.coord = 0;
    sqlite3 *db;
    CHECK_INT(sqlite3_open_v2(TC.ledger, &db, SQLITE_OPEN_READONLY, NULL), ==, SQLITE_OK);
    sqlite3_stmt *q;
    CHECK_INT(sqlite3_prepare_v2(db, "SELECT count(*) FROM meta WHERE key LIKE 'gen%_world'", -1, &q, NULL), ==,
              SQLITE_OK);
    CHECK_INT(sqlite3_step(q), ==, SQLITE_ROW);
    CHECK_INT(sqlite3_column_int(q, 0), ==, 0);
    sqlite3_finalize(q);
    sqlite3_close(db);
    printf("ok: a drafter joining after the stop forms no generation\n");
}

static void reset(void)
{
    for (int i = 0; i < 4; i++) {
        tc_kill(kids[i]);
        kids[i] = 0;
    }
    tc_kill(TC.coord);
    TC.coord = 0;
    ring_unlink(TC.ring);
    unlink(TC.ledger);
}

int main(void)
{
    void (*part[])(void) = { group_hangs_up_around_stop, pause_survives_restart, nan_during_drain,
                             group_lost_in_transit, late_trained_after_restart, detached_target_keeps_lease,
                             late_published_after_rollback, late_trained_then_published, silent_taker,
                             signal_drain_not_resumed, trained_copy_retracted, trained_copy_of_dead_target_retracted,
                             trained_copy_retracted_at_group_start, trained_copy_retracted_in_recovery,
                             dead_owner_slot_freed_at_exit, complete_run_killed_before_exit,
                             released_batch_named_in_group, fatal_during_drain, nan_then_stop_signal,
                             failed_run_killed_before_exit, stop_signal_during_start, nan_then_fatal,
                             nan_during_signal_drain, nan_checkpoint_after_step_refused, fatal_then_ctl_stop,
                             fatal_then_stop_signal, nan_while_paused, second_copy_retracted,
                             checkpoint_before_generation_start_refused, rank_deadlines_are_per_rank,
                             waiting_drafter_counted, no_group_after_stop };
    atexit(reset);
    tc_shared_init();
    for (size_t i = 0; i < sizeof part / sizeof part[0]; i++) {
        reset();
        part[i]();
    }
    return 0;
}
