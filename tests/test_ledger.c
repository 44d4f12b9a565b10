/* test_ledger.c: the SQLite ledger: committed writes survive a SIGKILL, uncommitted ones
 * vanish, reopen reads everything back, the audit counts exactly-once training. */
#include <linux/capability.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "daemons/coordinator/ledger.c"
#include "tests/test.h"

static int count_cb(void *ctx, const struct ledger_batch *b)
{
    uint64_t *n = ctx;
    if (b->state == BATCH_TRAINED && b->gen != 2)
        return -1;
    (*n)++;
    return 0;
}

/* Another program's database is refused, and left as it was (no table added, its journal mode
 * kept); a file that is no database is named. */
static void foreign_one(const char *path, const char *sql, const char *why)
{
    char err[512];
    unlink(path);
    sqlite3 *db;
    CHECK_INT(sqlite3_open(path, &db), ==, SQLITE_OK);
    CHECK_INT(sqlite3_exec(db, sql, NULL, NULL, NULL), ==, SQLITE_OK);
    sqlite3_close(db);
    struct ledger *l = (struct ledger *)1;
    CHECK_INT(ledger_open(&l, path, err, sizeof err), ==, -DF_ELAYOUT);
    CHECK(l == NULL);
    CHECK_CONTAINS(err, why);
    CHECK_CONTAINS(err, "): set coordinator.ledger to another path");
    CHECK_INT(sqlite3_open(path, &db), ==, SQLITE_OK);
    sqlite3_stmt *q;
    CHECK_INT(sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master", -1, &q, NULL), ==, SQLITE_OK);
    CHECK_INT(sqlite3_step(q), ==, SQLITE_ROW);
    CHECK_INT(sqlite3_column_int(q, 0), ==, 1);
    sqlite3_finalize(q);
    CHECK_INT(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &q, NULL), ==, SQLITE_OK);
    CHECK_INT(sqlite3_step(q), ==, SQLITE_ROW);
    CHECK_STR((const char *)sqlite3_column_text(q, 0), "delete");
    sqlite3_finalize(q);
    CHECK_INT(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &q, NULL), ==, SQLITE_OK);
    CHECK_INT(sqlite3_step(q), ==, SQLITE_ROW);
    CHECK_INT(sqlite3_column_int(q, 0), ==, 0);
    sqlite3_finalize(q);
    sqlite3_close(db);
}

static void foreign_db(const char *dir)
{
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/other.db", dir);
    sqlite3 *db;
    struct ledger *l;
    foreign_one(path, "CREATE TABLE foo(x INTEGER); INSERT INTO foo VALUES (7);",
                "other.db: not a dflash ledger (it has a table 'foo')");
    /* only names a ledger has, but not its columns: refused before anything is written */
    foreign_one(path, "CREATE TABLE meta(name TEXT, val TEXT); INSERT INTO meta VALUES ('a', 'b');",
                "other.db: not a dflash ledger (its table 'meta' has the columns (name,val), a ledger's has (key,value))");
    /* a ledger of a newer dflash, with a table this build does not know: named as newer */
    unlink(path);
    CHECK_OK(ledger_open(&l, path, err, sizeof err));
    ledger_close(l);
    CHECK_INT(sqlite3_open(path, &db), ==, SQLITE_OK);
    char sql[128];
    snprintf(sql, sizeof sql, "CREATE TABLE future(x INTEGER); PRAGMA user_version = %d;", LEDGER_SCHEMA + 1);
    CHECK_INT(sqlite3_exec(db, sql, NULL, NULL, NULL), ==, SQLITE_OK);
    sqlite3_close(db);
    CHECK_INT(ledger_open(&l, path, err, sizeof err), ==, -DF_EVERSION);
    CHECK_CONTAINS(err, "written by a newer dflash");
    unlink(path);
    FILE *f = fopen(path, "w");
    CHECK(f);
    fputs("not a database at all, but long enough to have a header of sorts............................", f);
    fclose(f);
    CHECK(ledger_open(&l, path, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "other.db: schema version: file is not a database");
    unlink(path);
}

/* A schema-1 ledger (its checkpoints without the dropped column) is migrated in place: its
 * checkpoints stay in the lineage; then the fall back of the lineage: the newest checkpoint before
 * a step that is not dropped, and dropping those after it. */
static void checkpoints_and_schema_1(const char *dir)
{
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/schema1.db", dir);
    unlink(path);
    sqlite3 *db;
    CHECK_INT(sqlite3_open(path, &db), ==, SQLITE_OK);
    CHECK_INT(sqlite3_exec(db, "CREATE TABLE checkpoints(gen INTEGER NOT NULL, step INTEGER NOT NULL, dir TEXT NOT NULL,"
                               " ms INTEGER NOT NULL); INSERT INTO checkpoints VALUES (1, 10, '/c/step-10', 0),"
                               " (1, 20, '/c/step-20', 0); PRAGMA user_version = 1;", NULL, NULL, NULL), ==, SQLITE_OK);
    sqlite3_close(db);
    struct ledger *l;
    CHECK_OK(ledger_open(&l, path, err, sizeof err));
    struct ledger_checkpoint c;
    CHECK_INT(ledger_checkpoint_before(l, 100, &c), ==, 1);
    CHECK_INT(c.step, ==, 20);
    CHECK_STR(c.dir, "/c/step-20");
    CHECK_OK(ledger_checkpoint_add(l, 2, 30, "/c/step-30"));
    CHECK_OK(ledger_checkpoint_add(l, 3, 40, "/c/step-40"));
    /* 40 does not load: back to 30; then 30 does not either: back to 20 */
    CHECK_INT(ledger_checkpoint_before(l, 40, &c), ==, 1);
    CHECK_INT(c.step, ==, 30);
    CHECK_OK(ledger_checkpoint_drop(l, 30, "step 40 does not load"));
    CHECK_INT(ledger_checkpoint_before(l, 30, &c), ==, 1);
    CHECK_OK(ledger_checkpoint_drop(l, (int64_t)c.step, "step 30 does not load"));
    CHECK_INT(c.step, ==, 20);
    CHECK_INT(c.gen, ==, 1);
    /* the new lineage from 20 writes 25: the newest before 50 is 25, not the dropped 30 or 40 */
    CHECK_OK(ledger_checkpoint_add(l, 4, 25, "/c/step-25"));
    CHECK_INT(ledger_checkpoint_before(l, 50, &c), ==, 1);
    CHECK_INT(c.step, ==, 25);
    CHECK_INT(ledger_checkpoint_before(l, 10, &c), ==, 0);
    CHECK_OK(ledger_commit(l, err, sizeof err));
    ledger_close(l);
    CHECK_INT(sqlite3_open(path, &db), ==, SQLITE_OK);
    sqlite3_stmt *q;
    CHECK_INT(sqlite3_prepare_v2(db, "SELECT step, ifnull(dropped, '-') FROM checkpoints ORDER BY rowid", -1, &q, NULL), ==,
              SQLITE_OK);
    const char *want[] = { "10 -", "20 -", "30 step 30 does not load", "40 step 40 does not load", "25 -" };
    for (int i = 0; i < 5; i++) {
        CHECK_INT(sqlite3_step(q), ==, SQLITE_ROW);
        char got[80];
        snprintf(got, sizeof got, "%lld %s", (long long)sqlite3_column_int64(q, 0), sqlite3_column_text(q, 1));
        CHECK_STR(got, want[i]);
    }
    sqlite3_finalize(q);
    CHECK_INT(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &q, NULL), ==, SQLITE_OK);
    CHECK_INT(sqlite3_step(q), ==, SQLITE_ROW);
    CHECK_INT(sqlite3_column_int(q, 0), ==, LEDGER_SCHEMA);
    sqlite3_finalize(q);
    sqlite3_close(db);
    unlink(path);
}

/* A ledger at path with one meta row, committed and closed. */
static void make_ledger(const char *path)
{
    char err[512];
    struct ledger *l;
    CHECK_OK(ledger_open(&l, path, err, sizeof err));
    CHECK_OK(ledger_meta_set(l, "k", "v"));
    CHECK_OK(ledger_commit(l, err, sizeof err));
    ledger_close(l);
}

/* Open path in a child without any capability (so root too is held to the modes): true when it
 * is refused with -EACCES, the message naming path and saying `why` (why NULL: when it opens and
 * takes a write). */
static bool open_without_caps(const char *path, const char *why)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
        struct __user_cap_data_struct none[2] = { { 0 } };
        if (syscall(SYS_capset, &h, none) < 0)
            _exit(2);
        char err[512];
        struct ledger *l;
        int r = ledger_open(&l, path, err, sizeof err);
        printf("%s: %s\n", why ? "expected error" : "expected to open", r < 0 ? err : "(opened)");
        fflush(stdout);
        if (!why)
            _exit(r == 0 && ledger_meta_set(l, "k", "w") == 0 && ledger_commit(l, err, sizeof err) == 0 ? 0 : 1);
        _exit(r == -EACCES && strstr(err, path) && strstr(err, why) ? 0 : 1);
    }
    int st;
    CHECK_INT(waitpid(pid, &st, 0), ==, pid);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* A ledger this process may not write (mode 0444) is refused at open, naming the file: SQLite
 * would open it read-only and only the first write fail, the coordinator exiting 1 into a
 * restart that fails the same. */
static void read_only_file(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/readonly.db", dir);
    unlink(path);
    make_ledger(path);
    CHECK(chmod(path, 0444) == 0);
    CHECK(open_without_caps(path, "may not write it"));
    unlink(path);
}

/* A ledger in a folder this process may not write: SQLite cannot make its journal files there
 * and failed only at the first statement ("attempt to write a readonly database", exit 1 into a
 * restart loop). Refused at open, naming the folder: an existing ledger and a new one alike. */
static void read_only_folder(const char *dir)
{
    char sub[600], path[700], fresh[700];
    snprintf(sub, sizeof sub, "%s/rofolder", dir);
    snprintf(path, sizeof path, "%s/ledger.db", sub);
    snprintf(fresh, sizeof fresh, "%s/new.db", sub);
    char link[700], target[700];
    snprintf(link, sizeof link, "%s/link.db", sub);
    snprintf(target, sizeof target, "%s/linked.db", dir);
    CHECK(mkdir(sub, 0700) == 0);
    make_ledger(path);
    make_ledger(target);
    CHECK(symlink(target, link) == 0);
    CHECK(chmod(sub, 0500) == 0);
    CHECK(open_without_caps(path, "is not writable by this process"));
    CHECK(open_without_caps(fresh, "is not writable by this process"));
    /* a link there to a ledger in a folder it may write: SQLite journals beside the target */
    CHECK(open_without_caps(link, NULL));
    CHECK(chmod(sub, 0700) == 0);
    unlink(link);
    unlink(target);
    unlink(path);
    rmdir(sub);
}

/* SQLite rolled the open transaction back under the ledger (as it may on a read's error, a full
 * disk at a cache spill): the next write is refused, not committed alone, and the commit says the
 * writes are lost; the ledger stays failed (a restart recovers from what is on disk). */
static void rolled_back_under(const char *dir)
{
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/rolled-back.db", dir);
    unlink(path);
    struct ledger *l;
    CHECK_OK(ledger_open(&l, path, err, sizeof err));
    CHECK_OK(ledger_meta_set(l, "a", "1"));
    CHECK_INT(sqlite3_exec(l->db, "ROLLBACK", NULL, NULL, NULL), ==, SQLITE_OK);
    CHECK(ledger_meta_set(l, "b", "1") < 0);
    CHECK(ledger_commit(l, err, sizeof err) < 0);
    printf("expected error: %s\n", err);
    CHECK_CONTAINS(err, "the transaction: rolled back");
    CHECK(ledger_meta_set(l, "c", "1") < 0);
    ledger_close(l);
    CHECK_OK(ledger_open(&l, path, err, sizeof err));
    char v[8];
    CHECK_INT(ledger_meta_get(l, "a", v, sizeof v), ==, 0);
    CHECK_INT(ledger_meta_get(l, "b", v, sizeof v), ==, 0);     /* (it had been committed on its own) */
    CHECK_INT(ledger_meta_get(l, "c", v, sizeof v), ==, 0);
    ledger_close(l);
    unlink(path);
}

int main(void)
{
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/ledger.db", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    foreign_db(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    checkpoints_and_schema_1(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    read_only_file(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    read_only_folder(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    rolled_back_under(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    struct ledger *l;
    CHECK_OK(ledger_open(&l, path, err, sizeof err));
    for (uint32_t i = 0; i < 100; i++) {
        struct ledger_batch b = { .id = i, .epoch = 0, .idx = i, .n_samples = 3, .n_tokens = 300, .slot = -1 };
        CHECK_OK(ledger_batch_insert(l, &b));
    }
    CHECK_OK(ledger_meta_set_u64(l, "fingerprint", 0xfeedfacecafebeefull));
    CHECK(ledger_dirty(l));
    CHECK_OK(ledger_commit(l, err, sizeof err));
    CHECK(!ledger_dirty(l));

    /* A child writes and commits some, then writes more and is SIGKILLed before committing. */
    pid_t pid = fork();
    if (pid == 0) {
        struct ledger *c;
        if (ledger_open(&c, path, err, sizeof err) < 0)
            _exit(2);
        for (uint32_t i = 0; i < 10; i++) {
            struct ledger_batch b = { .id = i, .idx = i, .n_samples = 3, .n_tokens = 300, .state = BATCH_TRAINED,
                                      .slot = -1, .gen = 2, .step = i, .leases = 1 };
            ledger_batch_update(c, &b);
            ledger_train_add(c, i, 2, i, 0, 0);
        }
        if (ledger_commit(c, err, sizeof err) < 0)
            _exit(3);
        for (uint32_t i = 10; i < 20; i++) {
            struct ledger_batch b = { .id = i, .idx = i, .state = BATCH_TRAINED, .slot = -1, .gen = 9, .step = i };
            ledger_batch_update(c, &b);
        }
        raise(SIGKILL);
        _exit(4);
    }
    int status;
    CHECK_INT(waitpid(pid, &status, 0), ==, pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    ledger_close(l);

    CHECK_OK(ledger_open(&l, path, err, sizeof err));
    uint64_t n = 0, fp = 0;
    CHECK_INT(ledger_batch_foreach(l, count_cb, &n), ==, 0);   /* no gen-9 rows: they were never committed */
    CHECK_INT(n, ==, 100);
    CHECK_INT(ledger_meta_get_u64(l, "fingerprint", &fp), ==, 1);
    CHECK_INT(fp, ==, 0xfeedfacecafebeefull);
    CHECK_INT(ledger_meta_get_u64(l, "absent", &fp), ==, 0);

    struct ledger_audit a;
    CHECK_OK(ledger_audit(l, &a));
    CHECK_INT(a.total, ==, 100);
    CHECK_INT(a.per_state[BATCH_TRAINED], ==, 10);
    CHECK_INT(a.per_state[BATCH_PENDING], ==, 90);
    CHECK_INT(a.trained_rows, ==, 10);

    /* Checkpoint 0..4, roll back the rest of generation 2, train one batch twice. */
    for (uint32_t i = 0; i < 5; i++) {
        struct ledger_batch b = { .id = i, .idx = i, .n_samples = 3, .n_tokens = 300, .state = BATCH_CHECKPOINTED,
                                  .slot = -1, .gen = 2, .step = i, .leases = 1 };
        CHECK_OK(ledger_batch_update(l, &b));
    }
    CHECK_OK(ledger_train_rollback(l, 2, 4));
    CHECK_OK(ledger_checkpoint_add(l, 2, 4, "/ck/step-4"));
    CHECK_OK(ledger_generation_set(l, 2, 4));
    CHECK_OK(ledger_error_add(l, 1, "drafter", 5, 123, 0, -DF_ENAN, "loss is nan"));
    CHECK_OK(ledger_commit(l, err, sizeof err));
    CHECK_OK(ledger_audit(l, &a));
    CHECK_INT(a.per_state[BATCH_CHECKPOINTED], ==, 5);
    CHECK_INT(a.rolled_back_rows, ==, 5);
    CHECK_INT(a.checkpointed_not_once, ==, 0);
    CHECK_OK(ledger_train_add(l, 3, 3, 7, 1, 0));
    CHECK_OK(ledger_commit(l, err, sizeof err));
    CHECK_OK(ledger_audit(l, &a));
    CHECK_INT(a.checkpointed_not_once, ==, 1);                  /* the audit sees a double training */

    /* An early hand-back, by batch and lease number; kept across a reopen, a repeat is one row. */
    CHECK_OK(ledger_untrained_add(l, 4, 2));
    CHECK_OK(ledger_untrained_add(l, 4, 2));
    CHECK_OK(ledger_commit(l, err, sizeof err));
    ledger_close(l);
    CHECK_OK(ledger_open(&l, path, err, sizeof err));
    CHECK_INT(ledger_untrained_has(l, 4, 2), ==, 1);
    CHECK_INT(ledger_untrained_has(l, 4, 3), ==, 0);
    CHECK_INT(ledger_untrained_has(l, 5, 2), ==, 0);
    ledger_close(l);

    /* A write that fails mid-batch (the disk is full: here max_page_count) spoils the whole
     * batch: later writes are refused, the commit fails naming why, and none of the batch's
     * writes reach the file, not even the ones after the failure. */
    CHECK_OK(ledger_open(&l, path, err, sizeof err));
    CHECK_OK(ledger_meta_set(l, "before", "1"));
    CHECK_OK(ledger_commit(l, err, sizeof err));
    CHECK_OK(sqlite3_exec(l->db, "PRAGMA max_page_count = 1", NULL, NULL, NULL));   /* no new page */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    int failed_at = -1;
    for (int i = 0; i < 100 && failed_at < 0; i++) {
        char key[32];
        snprintf(key, sizeof key, "k%d", i);
        if (ledger_meta_set(l, key, big) < 0)
            failed_at = i;
    }
    CHECK(failed_at >= 0);
    CHECK_OK(sqlite3_exec(l->db, "PRAGMA max_page_count = 1000000", NULL, NULL, NULL));
    CHECK(ledger_meta_set(l, "after", "1") < 0);        /* refused: the batch is spoiled */
    CHECK(ledger_dirty(l));
    CHECK(ledger_commit(l, err, sizeof err) < 0);
    printf("expected error: %s\n", err);
    CHECK_CONTAINS(err, path);
    CHECK_CONTAINS(err, "not on disk");
    ledger_close(l);
    CHECK_OK(ledger_open(&l, path, err, sizeof err));
    char v[16];
    CHECK_INT(ledger_meta_get(l, "before", v, sizeof v), ==, 1);
    CHECK_INT(ledger_meta_get(l, "k0", v, sizeof v), ==, 0);
    CHECK_INT(ledger_meta_get(l, "after", v, sizeof v), ==, 0);

    /* BEGIN refused (another process holds the write lock past the busy timeout): the batch
     * is spoiled the same way, not silently left uncommitted. */
    sqlite3 *other;
    CHECK_INT(sqlite3_open(path, &other), ==, SQLITE_OK);
    CHECK_INT(sqlite3_exec(other, "BEGIN IMMEDIATE", NULL, NULL, NULL), ==, SQLITE_OK);
    sqlite3_busy_timeout(l->db, 100);
    CHECK(ledger_meta_set(l, "busy", "1") < 0);
    CHECK(ledger_dirty(l));
    CHECK(ledger_commit(l, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "begin");
    sqlite3_exec(other, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(other);
    ledger_close(l);

    /* A ledger of a newer schema is refused, not misread. */
    CHECK_INT(sqlite3_open(path, &other), ==, SQLITE_OK);
    CHECK_INT(sqlite3_exec(other, "PRAGMA user_version = 7", NULL, NULL, NULL), ==, SQLITE_OK);
    sqlite3_close(other);
    CHECK_INT(ledger_open(&l, path, err, sizeof err), ==, -DF_EVERSION);
    CHECK_CONTAINS(err, "ledger schema 7, this build reads schema " STR(LEDGER_SCHEMA));
    CHECK_CONTAINS(err, path);

    /* A path that cannot be created is named in the error. */
    CHECK(ledger_open(&l, "/nonexistent-dir/x.db", err, sizeof err) < 0);
    CHECK_CONTAINS(err, "/nonexistent-dir/x.db");
    printf("ledger ok\n");
    return 0;
}
