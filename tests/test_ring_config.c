/* test_ring_config.c: a [ring] the coordinator cannot make (more sequences per slot than tokens)
 * is a configuration error: exit 78 naming ring.max_seqs, not exit 1 and a restart every second
 * into the same refusal. */
#include "tests/test_coord_util.h"

static void cleanup(void)
{
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

int main(void)
{
    atexit(cleanup);
    tc_setup(NULL, "[ring]\nslots = 4\nmax_tokens = 64\nmax_seqs = 65\n[data]\ntoken_budget = 64\nmax_seq_len = 64\n");
    tc_dataset(TC.data, 50, 8, 60, 500);
    char log[600], cmd[1400];
    snprintf(log, sizeof log, "%s/coordinator.log", TC.dir);
    char *argv[] = { (char *)tc_bin("bin/coordinator-d"), "-c", TC.ini, NULL };
    TC.coord = tc_spawn(argv, log);
    int st = 0;
    pid_t w = 0;
    for (uint64_t end = mono_ms() + 10000ull * (uint64_t)test_time_scale(); !w && mono_ms() < end;) {
        w = waitpid(TC.coord, &st, WNOHANG);
        if (!w)
            tc_sleep_ms(20);
    }
    if (!w)
        TEST_FAIL("coordinator came up on max_seqs 65 > max_tokens 64");
    TC.coord = 0;
    snprintf(cmd, sizeof cmd, "tail -3 '%s' >&2", log);
    if (system(cmd)) {}
    CHECK(WIFEXITED(st));
    CHECK_INT(WEXITSTATUS(st), ==, 78);
    snprintf(cmd, sizeof cmd, "grep -q 'ring.max_seqs: 65 is more than ring.max_tokens 64' '%s'", log);
    CHECK(system(cmd) == 0);
    CHECK_INT(shm_open(TC.ring, O_RDONLY, 0), <, 0);
    return 0;
}
