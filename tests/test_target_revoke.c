/* test_target_revoke.c: a lease revoked while target-d runs the forward of its batch is
 * dropped, not published. The coordinator revokes a lease when the batch was trained meanwhile
 * (here: a TRAINED of the current generation arrives for the leased batch); a copy published
 * anyway would sit READY in the ring and be trained a second time. The target is stopped right
 * after it claimed the slot for that batch (DFLASH_RING_STOP_AT), the revoke is sent, then it
 * goes on: it must read the revoke before it publishes. On the CPU backend, then (a CUDA build
 * with a GPU; argument "cuda") on the CUDA backend, where the publication is in the callback of
 * the slot's copies (the revoke is read by whichever comes first, the main loop or that callback;
 * here usually the main loop). Each phase is a child process (`test_target_revoke cpu|cuda`). */
#include "tests/test_coord_util.h"

static pid_t target;

static void cleanup(void)
{
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

static int phase(const char *backend)
{
    atexit(cleanup);
    /* each phase in a directory of its own: logs, model, ring and socket names */
    static char tmp[300];
    snprintf(tmp, sizeof tmp, "%s/%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", backend);
    CHECK(mkdir(tmp, 0700) == 0 || errno == EEXIST);
    setenv("TMPDIR", tmp, 1);
    char model[400], extra[1024], cmd[1200], log[400], line[96];
    snprintf(model, sizeof model, "%s/model", tmp);
    /* a shape the CUDA kernels take (head dim 64) */
    snprintf(cmd, sizeof cmd, "python3 %s/tools/mkmodel.py %s --vocab 256 --hidden 256 --heads 4 --kv-heads 2 "
             "--head-dim 64 --intermediate 512 --layers 4 >/dev/null", test_srcdir(), model);
    CHECK(system(cmd) == 0);
    snprintf(extra, sizeof extra,
             "[model]\npath = %s\ndraft_layers = 1\n[coordinator]\nring_hidden = 0\n[drafter]\nworld_size = 1\n"
             "[target]\nprefetch = 1\nbackend = %s\n", model, backend);
    tc_setup(NULL, extra);
    if (!strcmp(backend, "cuda")) {
        snprintf(cmd, sizeof cmd, "nvidia-smi -L 2>/dev/null | grep -q '^GPU' && %s -c %s -i 0 -t >/dev/null 2>&1",
                 tc_bin("bin/target-d"), TC.ini);
        if (system(cmd) != 0)
            SKIP("no CUDA target backend here (a CPU-only build, or no GPU)\n");
    }
    tc_dataset(TC.data, 40, 8, 100, 256);
    tc_start_coord();

    struct client *d = peer_connect(PROTO_ROLE_DRAFTER, 0);
    struct proto_msg m;
    char err[512];
    uint64_t gen = tc_join_group(d, 10000).generation, end;
    CHECK(gen);

    /* target-d stops (SIGSTOP) right after claiming the slot for its first batch */
    snprintf(log, sizeof log, "%s/target0.log", TC.dir);
    setenv("DFLASH_RING_STOP_AT", "claimed_write", 1);
    char *argv[] = { (char *)tc_bin("bin/target-d"), "-c", TC.ini, "-i", "0", NULL };
    target = tc_spawn(argv, log);
    unsetenv("DFLASH_RING_STOP_AT");
    int st = 0;
    CHECK(waitpid(target, &st, WUNTRACED) == target);
    if (!WIFSTOPPED(st)) {
        snprintf(cmd, sizeof cmd, "tail -20 %s >&2", log);
        if (system(cmd)) {}
        target = 0;
        TEST_FAIL("target-d did not stop at its first slot claim (status 0x%x)", st);
    }
    uint64_t id = leased_batch();
    CHECK(id != UINT64_MAX);

    /* The batch is trained meanwhile (its first lease): the coordinator revokes the lease. */
    CHECK_OK(client_trained(d, id, 1, 1, 0, gen));
    end = mono_ms() + 5000 * (uint64_t)test_time_scale();
    while (strcmp(tc_batch_state(id), "trained") && mono_ms() < end)
        client_poll(d, 20, &m, err, sizeof err);
    CHECK_STR(tc_batch_state(id), "trained");

    CHECK(kill(target, SIGCONT) == 0);
    snprintf(line, sizeof line, "batch %llu was revoked during its forward", (unsigned long long)id);
    end = mono_ms() + 10000 * (uint64_t)test_time_scale();
    while (!log_has(log, line) && mono_ms() < end)
        client_poll(d, 20, &m, err, sizeof err);
    struct ring *r = peer_ring();
    struct ring_stats rs;
    struct ring_slot_stat ss[16];
    CHECK_OK(ring_stats(r, &rs, ss));
    for (uint32_t i = 0; i < rs.nslots && i < 16; i++)
        if ((ss[i].state == RING_READY || ss[i].state == RING_READING) && ss[i].batch_id == id)
            TEST_FAIL("batch %llu, revoked during its forward, was published in slot %u", (unsigned long long)id, i);
    if (!log_has(log, line))
        TEST_FAIL("target-d did not drop the revoked batch %llu (see %s)", (unsigned long long)id, log);
    CHECK_STR(tc_batch_state(id), "trained");
    printf("%s: batch %llu, revoked during its forward, was dropped\n", backend, (unsigned long long)id);
    ring_detach(r);
    client_free(d);
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
        return phase(argv[1]);
    int rc = run_phase(argv[0], "cpu");
    if (rc != 0)
        return rc;
    rc = run_phase(argv[0], "cuda");
    if (rc == 77)
        printf("(the CUDA phase was not run)\n");
    return rc == 77 ? 0 : rc;
}
