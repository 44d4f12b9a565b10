/* test_target_revoke.c: a lease revoked while target-d (CPU) runs the forward of its batch is
 * dropped, not published. The coordinator revokes a lease when the batch was trained meanwhile
 * (here: a TRAINED of the current generation arrives for the leased batch); a copy published
 * anyway would sit READY in the ring and be trained a second time. The target is stopped right
 * after it claimed the slot for that batch (DFLASH_RING_STOP_AT), the revoke is sent, then it
 * goes on: it must read the revoke before it publishes. */
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

int main(void)
{
    atexit(cleanup);
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char model[400], extra[1024], cmd[1200], log[400];
    snprintf(model, sizeof model, "%s/model", tmp);
    snprintf(cmd, sizeof cmd, "python3 %s/tools/mkmodel.py %s --vocab 256 >/dev/null", test_srcdir(), model);
    CHECK(system(cmd) == 0);
    snprintf(extra, sizeof extra,
             "[model]\npath = %s\ndraft_layers = 1\n[coordinator]\nring_hidden = 0\n[drafter]\nworld_size = 1\n"
             "[target]\nprefetch = 1\nbackend = cpu\n", model);
    tc_setup(NULL, extra);
    tc_dataset(TC.data, 40, 8, 100, 256);
    tc_start_coord();

    struct client *d = peer_connect(PROTO_ROLE_DRAFTER, 0);
    struct proto_msg m;
    char err[512];
    uint64_t gen = 0, end = mono_ms() + 10000 * (uint64_t)test_time_scale();
    client_join_group(d);
    while (!gen && mono_ms() < end)
        if (client_poll(d, 20, &m, err, sizeof err) > 0 && m.type == PROTO_GROUP)
            gen = m.group.generation;
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
    end = mono_ms() + 10000 * (uint64_t)test_time_scale();
    while (!log_has(log, "revoked during its forward") && mono_ms() < end)
        client_poll(d, 20, &m, err, sizeof err);
    struct ring *r = peer_ring();
    struct ring_stats rs;
    struct ring_slot_stat ss[16];
    CHECK_OK(ring_stats(r, &rs, ss));
    for (uint32_t i = 0; i < rs.nslots && i < 16; i++)
        if ((ss[i].state == RING_READY || ss[i].state == RING_READING) && ss[i].batch_id == id)
            TEST_FAIL("batch %llu, revoked during its forward, was published in slot %u", (unsigned long long)id, i);
    if (!log_has(log, "revoked during its forward"))
        TEST_FAIL("target-d did not drop the revoked batch %llu (see %s)", (unsigned long long)id, log);
    CHECK_STR(tc_batch_state(id), "trained");
    printf("batch %llu, revoked during its forward, was dropped\n", (unsigned long long)id);
    ring_detach(r);
    client_free(d);
    return 0;
}
