/* test_ring_hold.c: ring_hold gives the ring's object to one process at a time; a coordinator holds
 * its ring, so a second cluster of the same name (its own runtime_dir, so their locks never meet)
 * neither takes over nor replaces the first one's ring: it exits 78 naming cluster.name. */
#include "tests/test_coord_util.h"

static pid_t g_other;

static void cleanup(void)
{
    tc_kill(g_other);
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

static void test_hold(void)
{
    char name[64], err[512];
    snprintf(name, sizeof name, "/dflash-test-hold-%d", (int)getpid());
    CHECK_INT(ring_hold(name, err, sizeof err), ==, -ENOENT);
    CHECK_CONTAINS(err, name);
    struct ring_layout l = { .nslots = 2, .hidden = 8, .n_layers = 1, .dtype = RING_DTYPE_BF16,
                             .max_tokens = 16, .max_seqs = 2 };
    struct ring *r = NULL;
    CHECK_OK(ring_create(&r, name, &l, NULL, err, sizeof err));
    int fd = ring_hold(name, err, sizeof err);
    CHECK_OK(fd);
    CHECK_INT(ring_hold(name, err, sizeof err), ==, -EBUSY);
    CHECK_CONTAINS(err, "held by another process");
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        _exit(ring_hold(name, err, sizeof err) == -EBUSY ? 0 : 1);
    CHECK_INT(tc_exit_status(pid, 10000), ==, 0);
    close(fd);
    fd = ring_hold(name, err, sizeof err);
    CHECK_OK(fd);
    close(fd);
    ring_detach(r);
    CHECK_OK(ring_unlink(name));
}

int main(void)
{
    atexit(cleanup);
    test_hold();

    tc_setup(NULL, NULL);
    tc_dataset(TC.data, 50, 8, 100, 500);
    tc_start_coord();
    struct ring *r = NULL;
    char err[512];
    CHECK_OK(ring_attach(&r, TC.ring, NULL, RING_ATTACH_ANY | RING_ATTACH_RDONLY, err, sizeof err));

    /* The same config in another runtime_dir and state_dir: another cluster of the same name. */
    char dir[300], ini[400], log[400], line[600];
    snprintf(dir, sizeof dir, "%s/other", TC.dir);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(ini, sizeof ini, "%s/dflash.ini", dir);
    snprintf(log, sizeof log, "%s/coordinator.log", dir);
    FILE *in = fopen(TC.ini, "r"), *out = fopen(ini, "w");
    CHECK(in && out);
    while (fgets(line, sizeof line, in)) {
        if (!strncmp(line, "runtime_dir", 11) || !strncmp(line, "state_dir", 9))
            fprintf(out, "%.*s= %s\n", (int)strcspn(line, "="), line, dir);
        else
            fputs(line, out);
    }
    fclose(in);
    fclose(out);
    char *argv[] = { (char *)tc_bin("bin/coordinator-d"), "-c", ini, NULL };
    g_other = tc_spawn(argv, log);
    int rc = tc_exit_status(g_other, 10000 * test_time_scale());
    char cmd[1000];
    snprintf(cmd, sizeof cmd, "tail -3 '%s' >&2", log);
    if (system(cmd)) {}
    if (rc < 0)
        TEST_FAIL("a second coordinator of cluster %s runs on the first one's ring", TC.name);
    g_other = 0;
    CHECK_INT(rc, ==, 78);
    snprintf(cmd, sizeof cmd, "grep -q 'cluster.name: ring %s is held by another coordinator' '%s'", TC.ring, log);
    CHECK(system(cmd) == 0);

    /* The first one runs on, on its ring. */
    CHECK_INT(kill(TC.coord, 0), ==, 0);
    CHECK_INT(ring_same_object(r, TC.ring), ==, 1);
    struct ring_stats st;
    CHECK_OK(ring_stats(r, &st, NULL));
    CHECK_INT(st.creator_pid, ==, TC.coord);
    ring_detach(r);
    return 0;
}
