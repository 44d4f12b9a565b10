/* test_coordinator_schedule.c: a coordinator started on a ledger written for another schedule
 * refuses it (exit 78) naming what changed: each setting the schedule is made from with its old
 * and new value, the number of samples of data.path, or else the samples' lengths. A ledger from
 * before these were kept is given them by a start that accepts it. */
#include <sqlite3.h>
#include "tests/test_coord_util.h"

static void cleanup(void)
{
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

/* coordinator-d with the overrides (NULL-terminated "-o" values): its exit code, its log in log. */
static int start_with(char *log, size_t len, const char *o1, const char *o2)
{
    static int n;
    snprintf(log, len, "%s/coord-%d.log", TC.dir, ++n);
    char *argv[] = { (char *)tc_bin("bin/coordinator-d"), "-c", TC.ini, o1 ? "-o" : NULL, (char *)o1, o2 ? "-o" : NULL,
                     (char *)o2, NULL };
    pid_t pid = tc_spawn(argv, log);
    int rc = tc_exit_status(pid, 20000 * test_time_scale());
    if (rc < 0)
        tc_kill(pid);
    return rc;
}

static void expect_refused_as(const char *o1, const char *o2, const char *as, const char *why)
{
    char log[400], line[2048] = "";
    CHECK_INT(start_with(log, sizeof log, o1, o2), ==, 78);
    FILE *f = fopen(log, "r");
    CHECK(f);
    while (fgets(line, sizeof line, f) && !strstr(line, as))
        line[0] = 0;
    fclose(f);
    printf("  %s%s%s: %s", o1 ? o1 : "", o2 ? " " : "", o2 ? o2 : "", line);
    CHECK_CONTAINS(line, TC.ledger);
    CHECK_CONTAINS(line, why);
}

static void expect_refused(const char *o1, const char *o2, const char *why)
{
    expect_refused_as(o1, o2, "was written for another dataset or schedule", why);
}

static void first_run(void)
{
    tc_start_coord();
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

int main(void)
{
    atexit(cleanup);
    tc_setup(NULL, "seed = 42\n");
    tc_dataset(TC.data, 100, 8, 100, 500);
    first_run();
    expect_refused("data.seed=99", NULL, "; data.seed was 42, is 99):");
    expect_refused("data.token_budget=256", "ring.max_seqs=32",
                   "; data.token_budget was 512, is 256; ring.max_seqs was 64, is 32):");

    /* a ledger from before the settings were kept: the generic reason; a start that accepts it
     * records them, and the next refusal names the setting */
    sqlite3 *db;
    CHECK_INT(sqlite3_open(TC.ledger, &db), ==, SQLITE_OK);
    CHECK_INT(sqlite3_exec(db, "DELETE FROM meta WHERE key LIKE 'data.%' OR key LIKE 'ring.%'", NULL, NULL, NULL), ==,
              SQLITE_OK);
    sqlite3_close(db);
    expect_refused("data.seed=99", NULL, "): move it away");
    first_run();
    expect_refused("data.seed=99", NULL, "; data.seed was 42, is 99):");

    /* another dataset: fewer samples, or as many of other lengths: said to be replaced (the old
     * file mends it), with what that changed in the schedule */
    unlink(TC.data);
    tc_dataset(TC.data, 90, 8, 100, 500);
    static const char replaced[] = "was written for a dataset of checksum";
    expect_refused_as(NULL, NULL, replaced, "(replaced; data.path samples was 100, is 90): put the old file back");
    unlink(TC.data);
    tc_dataset(TC.data, 100, 8, 60, 500);
    expect_refused_as(NULL, NULL, replaced, "(replaced; the same settings and number of samples, other sample "
                      "lengths): put the old file back, or move");
    /* replaced, and a setting changed too: the old file alone would not do */
    expect_refused_as("data.seed=99", NULL, replaced, "(replaced; data.seed was 42, is 99): put the old file back and "
                      "the settings named as they were, or move");
    /* a ledger from before the dataset's checksum was kept: the schedule's message alone */
    CHECK_INT(sqlite3_open(TC.ledger, &db), ==, SQLITE_OK);
    CHECK_INT(sqlite3_exec(db, "DELETE FROM meta WHERE key = 'dataset_checksum'", NULL, NULL, NULL), ==, SQLITE_OK);
    sqlite3_close(db);
    expect_refused(NULL, NULL, "; the same settings and number of samples, other sample lengths):");
    printf("a ledger of another schedule names what changed\n");
    return 0;
}
