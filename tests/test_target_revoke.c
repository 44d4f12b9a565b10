/* test_target_revoke.c: a lease revoked while target-d runs the forward of its batch is
 * dropped, not published. The coordinator revokes a lease when the batch was trained meanwhile
 * (here: a TRAINED of the current generation arrives for the leased batch); a copy published
 * anyway would sit READY in the ring and be trained a second time. The target is stopped right
 * after it claimed the slot for that batch (DFLASH_RING_STOP_AT), the revoke is sent, then it
 * goes on: it must read the revoke before it publishes. On the CPU backend, then (a CUDA build
 * with a GPU; argument "cuda") on the CUDA backend, where the publication is in the callback of
 * the slot's copies (the revoke is read by whichever comes first, the main loop or that callback;
 * here usually the main loop). Then (CPU) a revoke followed by a new grant of the same batch: the
 * batch, trained meanwhile, is queued again when that training is rolled back (its drafter
 * died) and granted to the same target, still stopped; the copy in its slot is of the old lease
 * and must be dropped, the batch published by the new grant's forward (not the stale copy under
 * a lease the target holds again). Each phase is a child process (`test_target_revoke
 * cpu|cuda|regrant`). */
#include "daemons/coordinator/sched.h"
#include "tests/test_coord_util.h"

static pid_t target;

static pid_t phase_pid;     /* cleanup is the phase's, not a forked helper's */

static void cleanup(void)
{
    if (getpid() != phase_pid)
        return;
    if (target > 0)
        kill(target, SIGCONT);
    tc_kill(target);
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

/* The one batch in state "leased", or UINT64_MAX. */
static uint64_t leased_batch(void)
{
    uint64_t id = UINT64_MAX;
    cJSON *doc = tc_query(PROTO_Q_BATCHES);
    const cJSON *b;
    cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(doc, "in_flight")) {
        const cJSON *bid = cJSON_GetObjectItemCaseSensitive(b, "id"), *s = cJSON_GetObjectItemCaseSensitive(b, "state");
        if (cJSON_IsNumber(bid) && cJSON_IsString(s) && !strcmp(s->valuestring, "leased"))
            id = (uint64_t)bid->valuedouble;
    }
    cJSON_Delete(doc);
    return id;
}

static int log_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

static char g_log[400];

/* The phase's cluster (in a directory of its own: logs, model, ring and socket names) with its
 * coordinator, when d is set a drafter joined to the group (*d, its generation *gen), and target-d
 * stopped (SIGSTOP) right after claiming the slot for its first batch. 0, or 77: skipped (no CUDA
 * target here). */
static int start(const char *name, const char *backend, int prefetch, int samples, struct client **d, uint64_t *gen)
{
    phase_pid = getpid();
    atexit(cleanup);
    static char tmp[300];
    snprintf(tmp, sizeof tmp, "%s/%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", name);
    CHECK(mkdir(tmp, 0700) == 0 || errno == EEXIST);
    setenv("TMPDIR", tmp, 1);
    char model[400], extra[1024], cmd[1200];
    snprintf(model, sizeof model, "%s/model", tmp);
    /* a shape the CUDA kernels take (head dim 64) */
    snprintf(cmd, sizeof cmd, "python3 %s/tools/mkmodel.py %s --vocab 256 --hidden 256 --heads 4 --kv-heads 2 "
             "--head-dim 64 --intermediate 512 --layers 4 >/dev/null", test_srcdir(), model);
    CHECK(system(cmd) == 0);
    /* the target is stopped for a while: not taken for dead meanwhile */
    snprintf(extra, sizeof extra,
             "[model]\npath = %s\ndraft_layers = 1\n[coordinator]\nring_hidden = 0\ndead_after_ms = 60000\n"
             "[drafter]\nworld_size = 1\n[target]\nprefetch = %d\nbackend = %s\n", model, prefetch, backend);
    tc_setup(NULL, extra);
    if (!strcmp(backend, "cuda")) {
        snprintf(cmd, sizeof cmd, "nvidia-smi -L 2>/dev/null | grep -q '^GPU' && %s -c %s -i 0 -t >/dev/null 2>&1",
                 tc_bin("bin/target-d"), TC.ini);
        if (system(cmd) != 0)
            return 77;
    }
    tc_dataset(TC.data, samples, 8, 100, 256);
    tc_start_coord();

    if (d) {
        *d = peer_connect(PROTO_ROLE_DRAFTER, 0);
        *gen = tc_join_group(*d, 10000).generation;
        CHECK(*gen);
    }

    snprintf(g_log, sizeof g_log, "%s/target0.log", TC.dir);
    setenv("DFLASH_RING_STOP_AT", "claimed_write", 1);
    char *argv[] = { (char *)tc_bin("bin/target-d"), "-c", TC.ini, "-i", "0", NULL };
    target = tc_spawn(argv, g_log);
    unsetenv("DFLASH_RING_STOP_AT");
    int st = 0;
    CHECK(waitpid(target, &st, WUNTRACED) == target);
    if (!WIFSTOPPED(st)) {
        snprintf(cmd, sizeof cmd, "tail -20 %s >&2", g_log);
        if (system(cmd)) {}
        target = 0;
        TEST_FAIL("target-d did not stop at its first slot claim (status 0x%x)", st);
    }
    return 0;
}

/* The slot holding batch id READY (or being read), or -1. */
static int slot_of(struct ring *r, uint64_t id)
{
    struct ring_stats rs;
    struct ring_slot_stat ss[16];
    CHECK_OK(ring_stats(r, &rs, ss));
    for (uint32_t i = 0; i < rs.nslots && i < 16; i++)
        if ((ss[i].state == RING_READY || ss[i].state == RING_READING) && ss[i].batch_id == id)
            return (int)i;
    return -1;
}

static int phase(const char *backend)
{
    struct proto_msg m;
    char err[512], line[96];
    uint64_t gen, end;
    struct client *d = NULL;
    if (start(backend, backend, 1, 40, &d, &gen) == 77)
        SKIP("no CUDA target backend here (a CPU-only build, or no GPU)\n");
    uint64_t id = leased_batch();
    CHECK(id != UINT64_MAX);

    /* The batch is trained meanwhile (its first lease): the coordinator revokes the lease. */
    CHECK_OK(client_trained(d, id, 1, 1, 0, gen));
    end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    while (strcmp(tc_batch_state(id), "trained") && mono_ms() < end)
        client_poll(d, 20, &m, err, sizeof err);
    CHECK_STR(tc_batch_state(id), "trained");

    CHECK(kill(target, SIGCONT) == 0);
    snprintf(line, sizeof line, "batch " SCHED_BID " was revoked during its forward", SCHED_BARGS(id));
    end = mono_ms() + 10000 * (uint64_t)test_time_scale();
    while (!log_has(g_log, line) && mono_ms() < end)
        client_poll(d, 20, &m, err, sizeof err);
    struct ring *r = peer_ring();
    int slot = slot_of(r, id);
    if (slot >= 0)
        TEST_FAIL("batch %llu, revoked during its forward, was published in slot %d", (unsigned long long)id, slot);
    if (!log_has(g_log, line))
        TEST_FAIL("target-d did not drop the revoked batch %llu (see %s)", (unsigned long long)id, g_log);
    CHECK_STR(tc_batch_state(id), "trained");
    printf("%s: batch %llu, revoked during its forward, was dropped\n", backend, (unsigned long long)id);
    ring_detach(r);
    client_free(d);
    return 0;
}

/* Batch id's lease number (grants so far), or -1. */
static int batch_leases(uint64_t id)
{
    int n = -1;
    cJSON *doc = tc_query(PROTO_Q_BATCHES);
    const cJSON *b;
    cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(doc, "in_flight"))
        if ((uint64_t)tc_num(b, "id") == id)
            n = (int)tc_num(b, "leases");
    cJSON_Delete(doc);
    return n;
}

static int phase_regrant(void)
{
    char line[96];
    uint64_t end;
    /* one batch in all; the target asks for two leases, so it still wants one */
    start("regrant", "cpu", 2, 1, NULL, NULL);
    uint64_t id = leased_batch();
    CHECK(id != UINT64_MAX);
    CHECK_INT(batch_leases(id), ==, 1);

    /* A drafter (a child) trains it under its first lease: the target's lease is revoked (the
     * REVOKE waits in its socket) ... */
    pid_t drafter = fork();
    CHECK(drafter >= 0);
    if (!drafter) {
        struct client *d = peer_connect(PROTO_ROLE_DRAFTER, 0);
        uint64_t gen = tc_join_group(d, 10000).generation;
        struct proto_msg m;
        char err[512];
        CHECK_OK(client_trained(d, id, 1, 1, 0, gen));
        end = mono_ms() + 5000 * (uint64_t)test_time_scale();
        while (strcmp(tc_batch_state(id), "trained") && mono_ms() < end)
            client_poll(d, 20, &m, err, sizeof err);
        CHECK_STR(tc_batch_state(id), "trained");
        _exit(0);
    }
    /* ... then it dies: its generation is rolled back (no checkpoint), the batch queued again
     * and granted to the target that still wants a lease: REVOKE, then GRANT (lease 2). */
    CHECK_INT(tc_exit_status(drafter, 20000 * test_time_scale()), ==, 0);
    end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    while ((strcmp(tc_batch_state(id), "leased") || batch_leases(id) != 2) && mono_ms() < end)
        tc_sleep_ms(20);
    CHECK_STR(tc_batch_state(id), "leased");
    CHECK_INT(batch_leases(id), ==, 2);

    CHECK(kill(target, SIGCONT) == 0);
    struct ring *r = peer_ring();
    int slot = -1;
    end = mono_ms() + 10000 * (uint64_t)test_time_scale();
    while ((slot = slot_of(r, id)) < 0 && mono_ms() < end)
        tc_sleep_ms(20);
    if (slot < 0)
        TEST_FAIL("batch %llu was not published again (see %s)", (unsigned long long)id, g_log);
    uint32_t lease = ((const volatile struct ring_payload *)ring_slot_header(r, (unsigned)slot))->lease;
    if (lease != 2)
        TEST_FAIL("batch %llu is in slot %d under lease %u, an earlier lease's copy (the current one is 2)",
                  (unsigned long long)id, slot, lease);
    snprintf(line, sizeof line, "batch " SCHED_BID " was revoked during its forward", SCHED_BARGS(id));
    CHECK(log_has(g_log, line));
    printf("regrant: the old lease's copy of batch %llu was dropped, the new one published (slot %d, lease 2)\n",
           (unsigned long long)id, slot);
    ring_detach(r);
    return 0;
}

/* Run `self backend` to its end: its exit status (0, 77 skipped, else failed). */
static int run_phase(const char *self, const char *backend)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        execl(self, self, backend, (char *)NULL);
        _exit(127);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        return strcmp(argv[1], "regrant") ? phase(argv[1]) : phase_regrant();
    int rc = run_phase(argv[0], "cpu");
    if (rc == 0)
        rc = run_phase(argv[0], "regrant");
    if (rc != 0)
        return rc;
    rc = run_phase(argv[0], "cuda");
    if (rc == 77)
        printf("(the CUDA phase was not run)\n");
    return rc == 77 ? 0 : rc;
}
