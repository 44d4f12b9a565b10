/* ledger.c: SQLite persistence of the run (schema, prepared statements, one open
 * transaction per event batch). WAL + synchronous=FULL: a commit survives a power cut. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/decimal.h"
#include "common/err.h"
#include "common/progress.h"
#include "daemons/coordinator/ledger.h"
#include "daemons/coordinator/sched.h"

enum {
    ST_META_GET, ST_META_SET, ST_BATCH_INS, ST_BATCH_UPD, ST_BATCH_ALL, ST_TRAIN_ADD, ST_TRAIN_RB,
    ST_TRAIN_RB_AFTER, ST_CKPT_ADD, ST_CKPT_DROP, ST_CKPT_BEFORE, ST_GEN_SET, ST_GEN_ALL, ST_ERR_ADD,
    ST_UNTRAINED_ADD, ST_UNTRAINED_HAS, ST_CKPT_LIST, ST_BEGIN, ST_COMMIT, ST_N
};

static const char *const sql_text[ST_N] = {
    [ST_META_GET] = "SELECT value FROM meta WHERE key = ?1",
    [ST_META_SET] = "INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
    [ST_BATCH_INS] = "INSERT INTO batches(id, epoch, idx, n_samples, n_tokens, state, owner, slot, gen, step, leases, updated_ms)"
                     " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    [ST_BATCH_UPD] = "UPDATE batches SET state = ?2, owner = ?3, slot = ?4, gen = ?5, step = ?6, leases = ?7, updated_ms = ?8"
                     " WHERE id = ?1",
    [ST_BATCH_ALL] = "SELECT id, epoch, idx, n_samples, n_tokens, state, owner, slot, gen, step, leases, updated_ms"
                     " FROM batches ORDER BY id",
    [ST_TRAIN_ADD] = "INSERT INTO trains(batch, gen, step, rank, rolled_back, ms) VALUES (?1, ?2, ?3, ?4, ?5,"
                     " CAST(strftime('%s','now') AS INTEGER) * 1000)",
    [ST_TRAIN_RB] = "UPDATE trains SET rolled_back = 1 WHERE gen = ?1 AND step > ?2",
    [ST_TRAIN_RB_AFTER] = "UPDATE trains SET rolled_back = 1 WHERE step > ?1 AND rolled_back = 0",
    [ST_CKPT_ADD] = "INSERT INTO checkpoints(gen, step, dir, ms) VALUES (?1, ?2, ?3, CAST(strftime('%s','now') AS INTEGER) * 1000)",
    [ST_CKPT_DROP] = "UPDATE checkpoints SET dropped = ?2 WHERE step > ?1 AND dropped IS NULL",
    [ST_CKPT_BEFORE] = "SELECT gen, step, dir FROM checkpoints WHERE dropped IS NULL AND step < ?1"
                       " ORDER BY step DESC, rowid DESC LIMIT 1",
    [ST_GEN_SET] = "INSERT INTO generations(gen, keep_limit) VALUES (?1, ?2)"
                   " ON CONFLICT(gen) DO UPDATE SET keep_limit = excluded.keep_limit",
    [ST_GEN_ALL] = "SELECT gen, keep_limit FROM generations ORDER BY gen",
    [ST_ERR_ADD] = "INSERT INTO errors(ms, role, device, pid, fatal, code, message) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    [ST_UNTRAINED_ADD] = "INSERT OR IGNORE INTO untrained(batch, lease, ms) VALUES (?1, ?2,"
                         " CAST(strftime('%s','now') AS INTEGER) * 1000)",
    [ST_UNTRAINED_HAS] = "SELECT 1 FROM untrained WHERE batch = ?1 AND lease = ?2",
    [ST_CKPT_LIST] = "SELECT gen, step, dir, ms, dropped FROM checkpoints ORDER BY rowid DESC LIMIT ?1",
    /* (prepared once too: a transaction a batch, not a parse a batch) */
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
};

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS batches(id INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, idx INTEGER NOT NULL,"
    "  n_samples INTEGER NOT NULL, n_tokens INTEGER NOT NULL, state INTEGER NOT NULL, owner INTEGER NOT NULL,"
    "  slot INTEGER NOT NULL, gen INTEGER NOT NULL, step INTEGER NOT NULL, leases INTEGER NOT NULL,"
    "  updated_ms INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS trains(batch INTEGER NOT NULL, gen INTEGER NOT NULL, step INTEGER NOT NULL,"
    "  rank INTEGER NOT NULL, rolled_back INTEGER NOT NULL, ms INTEGER NOT NULL);"
    "CREATE INDEX IF NOT EXISTS trains_gen ON trains(gen, step);"
    "CREATE TABLE IF NOT EXISTS checkpoints(gen INTEGER NOT NULL, step INTEGER NOT NULL, dir TEXT NOT NULL, ms INTEGER NOT NULL,"
    "  dropped TEXT);"       /* NULL: in the lineage; else why not (it did not load, or came after one that did not) */
    "CREATE TABLE IF NOT EXISTS generations(gen INTEGER PRIMARY KEY, keep_limit INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS errors(ms INTEGER NOT NULL, role TEXT NOT NULL, device INTEGER NOT NULL,"
    "  pid INTEGER NOT NULL, fatal INTEGER NOT NULL, code INTEGER NOT NULL, message TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS untrained(batch INTEGER NOT NULL, lease INTEGER NOT NULL, ms INTEGER NOT NULL,"
    "  PRIMARY KEY(batch, lease));";

/* How long a write waits for another process's lock on the file before it fails. */
#define LEDGER_BUSY_MS 5000
#define STR_(x) #x
#define STR(x) STR_(x)

struct ledger {
    sqlite3 *db;
    sqlite3_stmt *st[ST_N];
    int in_tx;
    /* A write of this event batch failed (or SQLite rolled the transaction back under it): from
     * then on writes are refused and the commit fails, so nothing is answered on state that is
     * not on disk; the coordinator restarts from the last commit. */
    int failed;
    char fail_msg[256];
    char why[160];                  /* a read that found the file wrong (ledger_errmsg) */
    char path[512];
};

static const char *const state_names[BATCH_NSTATES] = { "pending", "leased", "published", "trained", "checkpointed" };
const char *batch_state_name(int s) { return s >= 0 && s < BATCH_NSTATES ? state_names[s] : "?"; }

const char *ledger_path(const struct ledger *l) { return l->path; }

const char *ledger_errmsg(const struct ledger *l, int code)
{
    if (l->why[0])
        return l->why;
    if (l->failed)
        return l->fail_msg;
    int rc = sqlite3_errcode(l->db);
    return rc != SQLITE_OK && rc != SQLITE_ROW && rc != SQLITE_DONE ? sqlite3_errmsg(l->db) : err_str(code);
}
int ledger_dirty(const struct ledger *l) { return l->in_tx || l->failed; }

static int sql_err(struct ledger *l, int rc)
{
    (void)l;
    switch (rc & 0xff) {    /* the primary code of an extended one */
    case SQLITE_FULL: return -ENOSPC;
    case SQLITE_IOERR: return -EIO;
    case SQLITE_BUSY: case SQLITE_LOCKED: return -EBUSY;
    case SQLITE_READONLY: return -EROFS;
    case SQLITE_NOMEM: return -ENOMEM;
    case SQLITE_CANTOPEN: case SQLITE_PERM: return -EACCES;
    default: return -DF_EFORMAT;
    }
}

/* A write failed with rc: remembered (the first one) and every later write refused. */
static int write_failed(struct ledger *l, int rc, const char *what)
{
    if (!l->failed) {
        l->failed = rc ? rc : SQLITE_ERROR;
        /* A lock held past the busy timeout is another process's (a sqlite3 shell left in a
         * transaction): said, or "database is locked" points nowhere. */
        int busy = (rc & 0xff) == SQLITE_BUSY;
        snprintf(l->fail_msg, sizeof l->fail_msg, "%s: %s%s", what, rc ? sqlite3_errmsg(l->db) : "rolled back",
                 busy ? " (another process has held it locked for " STR(LEDGER_BUSY_MS) " ms: a sqlite3 shell with a "
                        "transaction open?)" : "");
    }
    return sql_err(l, l->failed);
}

void ledger_close(struct ledger *l)
{
    if (!l)
        return;
    for (int i = 0; i < ST_N; i++)
        sqlite3_finalize(l->st[i]);
    if (l->in_tx)
        sqlite3_exec(l->db, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(l->db);
    free(l);
}

static const char *const ledger_tables[] = { "meta", "batches", "trains", "checkpoints", "generations", "errors",
                                             "untrained" };

/* The columns of table t in db, in order ("a,b,c"), into buf ("" for no such table). */
static int table_columns(sqlite3 *db, const char *t, char *buf, size_t len)
{
    sqlite3_stmt *q = NULL;
    int rc = sqlite3_prepare_v2(db, "SELECT name FROM pragma_table_info(?1) ORDER BY cid", -1, &q, NULL);
    size_t n = 0;
    buf[0] = 0;
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(q, 1, t, -1, SQLITE_STATIC);
    while (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *c = (const char *)sqlite3_column_text(q, 0);
        int k = snprintf(buf + n, len - n, "%s%s", n ? "," : "", c ? c : "");
        n = k < 0 || (size_t)k >= len - n ? len - 1 : n + (size_t)k;
        rc = SQLITE_OK;
    }
    sqlite3_finalize(q);
    return rc == SQLITE_DONE || rc == SQLITE_OK ? SQLITE_OK : rc;
}

/* Every table of the file is one of a ledger's, with this schema's columns (the checkpoints'
 * `dropped` may be missing: schema 1, added below). The columns expected are read from the
 * schema made in memory, so there is one description of it. 0; -DF_ELAYOUT with the reason in
 * err; or another error with its SQLite code in *rc. */
static int check_tables(struct ledger *l, int *rc, char *err, size_t errlen)
{
    sqlite3 *ref = NULL;
    sqlite3_stmt *tq = NULL;
    int r = 0;
    *rc = sqlite3_open_v2(":memory:", &ref, SQLITE_OPEN_READWRITE, NULL);
    if (*rc == SQLITE_OK)
        *rc = sqlite3_exec(ref, schema, NULL, NULL, NULL);
    if (*rc == SQLITE_OK)
        *rc = sqlite3_prepare_v2(l->db, "SELECT name FROM sqlite_master WHERE type = 'table' AND "
                                 "substr(name, 1, 7) <> 'sqlite_' ORDER BY name", -1, &tq, NULL);
    while (*rc == SQLITE_OK && (*rc = sqlite3_step(tq)) == SQLITE_ROW) {
        *rc = SQLITE_OK;
        const char *t = (const char *)sqlite3_column_text(tq, 0);
        size_t i = 0;
        while (t && i < sizeof ledger_tables / sizeof ledger_tables[0] && strcmp(t, ledger_tables[i]))
            i++;
        if (!t || i == sizeof ledger_tables / sizeof ledger_tables[0]) {
            snprintf(err, errlen, "%s: not a dflash ledger (it has a table '%s'): set coordinator.ledger to another "
                     "path", l->path, t ? t : "");
            r = -DF_ELAYOUT;
            break;
        }
        char have[512], want[512];
        if ((*rc = table_columns(l->db, t, have, sizeof have)) != SQLITE_OK ||
            (*rc = table_columns(ref, t, want, sizeof want)) != SQLITE_OK)
            break;
        size_t wl = strlen(want), dl = strlen(",dropped");
        bool schema1 = !strcmp(t, "checkpoints") && wl > dl && !strcmp(want + wl - dl, ",dropped") &&
                       strlen(have) == wl - dl && !strncmp(have, want, wl - dl);
        if (strcmp(have, want) && !schema1) {
            snprintf(err, errlen, "%s: not a dflash ledger (its table '%s' has the columns (%.150s), a ledger's has "
                     "(%.150s)): set coordinator.ledger to another path", l->path, t, have, want);
            r = -DF_ELAYOUT;
            break;
        }
    }
    if (!r && *rc != SQLITE_DONE && *rc != SQLITE_OK)
        r = -1;
    sqlite3_finalize(tq);
    sqlite3_close(ref);
    return r;
}

/* sqlite3_progress_handler: the start is alive (progress.h); 0 goes on */
static int quick_check_tick(void *arg)
{
    (void)arg;
    progress_tick();
    return 0;
}

int ledger_open(struct ledger **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    struct ledger *l = calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    snprintf(l->path, sizeof l->path, "%s", path);
    /* SQLite makes its journal files (path-wal, path-shm) beside the ledger: in a folder this
     * process may not write, it fails at the first statement with "attempt to write a readonly
     * database" whatever the file's own mode, and every restart the same. */
    char dir[PATH_MAX], real[PATH_MAX];
    const char *at = realpath(path, real) ? real : path;    /* a link: the journal goes beside its target */
    const char *slash = strrchr(at, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (slash == at ? 1 : (int)(slash - at)) : 1, slash ? at : ".");
    if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) < 0 && (errno == EACCES || errno == EROFS)) {
        int e = errno;
        snprintf(err, errlen, "%s: its folder %s is not writable by this process (%s): the ledger's journal "
                 "files are made beside it", path, dir, strerror(e));
        ledger_close(l);
        return -e;
    }
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: %s, not a ledger file (coordinator.ledger names the file)", path,
                 S_ISDIR(st.st_mode) ? "a folder" : "not a regular file");
        ledger_close(l);
        return S_ISDIR(st.st_mode) ? -EISDIR : -DF_EFORMAT;
    }
    int rc = sqlite3_open_v2(path, &l->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    const char *what = "open";
    if (rc != SQLITE_OK)
        goto fail;
    /* A file this process may not write (another user's, mode 0444) is opened read-only without
     * a word: the start would pass and the first write fail, exiting 1 into a restart that fails
     * the same way, batch after batch. It is the operator's to mend: said now, once. */
    if (sqlite3_db_readonly(l->db, "main") == 1) {
        snprintf(err, errlen, "%s: opened read-only, this process may not write it (its owner, mode or file "
                 "system): the coordinator records every batch in it", path);
        ledger_close(l);
        return -EACCES;
    }
    sqlite3_busy_timeout(l->db, LEDGER_BUSY_MS);
    /* The schema's version: 0 (a new file, or one from before it was kept) is this one. A
     * newer one is refused rather than misread (before the table check below: a newer schema
     * may have tables this build does not know). */
    sqlite3_stmt *uv = NULL;
    int version = -1;
    what = "schema version";
    if ((rc = sqlite3_prepare_v2(l->db, "PRAGMA user_version", -1, &uv, NULL)) != SQLITE_OK)
        goto fail;
    if ((rc = sqlite3_step(uv)) == SQLITE_ROW)
        version = sqlite3_column_int(uv, 0);
    sqlite3_finalize(uv);
    if (rc != SQLITE_ROW)
        goto fail;
    if (version > LEDGER_SCHEMA) {
        snprintf(err, errlen, "%s: ledger schema %d, this build reads schema %d (written by a newer dflash)", path,
                 version, LEDGER_SCHEMA);
        ledger_close(l);
        return -DF_EVERSION;
    }
    /* A damaged file (a page overwritten, a disk's bad sector) reads fine until the first write
     * that meets the page: the coordinator would then exit 1 at that commit, and at every restart.
     * SQLite's quick check (every page and index entry, not the cross-checks of integrity_check;
     * well under a second for a long run's ledger) refuses it here, naming what it found. */
    what = "quick check";
    sqlite3_stmt *qc = NULL;
    if ((rc = sqlite3_prepare_v2(l->db, "PRAGMA quick_check(1)", -1, &qc, NULL)) != SQLITE_OK)
        goto fail;
    sqlite3_progress_handler(l->db, 1 << 16, quick_check_tick, NULL);  /* a large ledger takes a while */
    rc = sqlite3_step(qc);
    sqlite3_progress_handler(l->db, 0, NULL, NULL);
    const char *verdict = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(qc, 0) : NULL;
    if (rc == SQLITE_ROW && verdict && strcmp(verdict, "ok")) {
        /* one line: "*** in database main ***\nPage 6: ..." */
        const char *prefix = "*** in database main ***";
        char found[200];
        snprintf(found, sizeof found, "%s", strncmp(verdict, prefix, strlen(prefix)) ? verdict : verdict + strlen(prefix));
        for (char *c = found; *c; c++)
            if (*c == '\n' || *c == '\r' || *c == '\t')
                *c = c == found ? ' ' : ';';
        snprintf(err, errlen, "%s: a damaged database (SQLite's quick check:%s%s): restore it from a copy, or move it "
                 "away with the drafters' checkpoint folder to start a new run", path, found[0] == ' ' ? "" : " ", found);
        sqlite3_finalize(qc);
        ledger_close(l);
        return -DF_EFORMAT;
    }
    sqlite3_finalize(qc);
    if (rc != SQLITE_ROW) {
        if ((rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB) {
            snprintf(err, errlen, "%s: a damaged database (SQLite's quick check: %s): restore it from a copy, or "
                     "move it away with the drafters' checkpoint folder to start a new run", path, sqlite3_errmsg(l->db));
            ledger_close(l);
            return -DF_EFORMAT;
        }
        goto fail;
    }
    /* Another program's database (coordinator.ledger pointing at the wrong file) is left as it
     * is: a table that no dflash ledger has, or one of a ledger's names with other columns, says
     * so before anything is written to the file. */
    what = "tables";
    int foreign = check_tables(l, &rc, err, errlen);
    if (foreign == -DF_ELAYOUT) {
        ledger_close(l);
        return foreign;
    }
    if (foreign < 0)
        goto fail;
    what = "setup";
    /* WAL: readers (sqlite3 CLI, tests) never block the coordinator; FULL: fsync per commit. */
    rc = sqlite3_exec(l->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        goto fail;
    char *msg = NULL;
    rc = sqlite3_exec(l->db, schema, NULL, NULL, &msg);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "%s: schema: %s", path, msg ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        int r = sql_err(l, rc);
        ledger_close(l);
        return r;
    }
    /* Schema 1 to 2: the checkpoints' dropped column (every checkpoint so far is in the lineage).
     * The version is raised after it: a crash in between leaves a file that migrates again. */
    what = "schema 2";
    sqlite3_stmt *col = NULL;
    if (sqlite3_prepare_v2(l->db, "SELECT dropped FROM checkpoints LIMIT 0", -1, &col, NULL) != SQLITE_OK &&
        (rc = sqlite3_exec(l->db, "ALTER TABLE checkpoints ADD COLUMN dropped TEXT", NULL, NULL, NULL)) != SQLITE_OK) {
        sqlite3_finalize(col);
        goto fail;
    }
    sqlite3_finalize(col);
    what = "schema version";
    if (version < LEDGER_SCHEMA &&
        (rc = sqlite3_exec(l->db, "PRAGMA user_version = " STR(LEDGER_SCHEMA), NULL, NULL, NULL)) != SQLITE_OK)
        goto fail;
    what = "prepare";
    for (int i = 0; i < ST_N; i++)
        if ((rc = sqlite3_prepare_v3(l->db, sql_text[i], -1, SQLITE_PREPARE_PERSISTENT, &l->st[i], NULL)) != SQLITE_OK)
            goto fail;
    *out = l;
    return 0;
fail:
    snprintf(err, errlen, "%s: %s: %s", path, what, l->db ? sqlite3_errmsg(l->db) : sqlite3_errstr(rc));
    {
        int r = sql_err(l, rc);
        ledger_close(l);
        return r;
    }
}

static int begin(struct ledger *l)
{
    if (l->failed)
        return sql_err(l, l->failed);
    /* SQLite may roll the whole transaction back on an error of any statement, a read's too (a
     * full disk at a cache spill): a write now would commit alone, the event batch's earlier
     * writes lost. */
    if (l->in_tx)
        return sqlite3_get_autocommit(l->db) ? write_failed(l, 0, "the transaction") : 0;
    int rc = sqlite3_step(l->st[ST_BEGIN]);
    if (rc != SQLITE_DONE) {
        int r = write_failed(l, rc, "begin");
        sqlite3_reset(l->st[ST_BEGIN]);
        return r;
    }
    sqlite3_reset(l->st[ST_BEGIN]);
    l->in_tx = 1;
    return 0;
}

int ledger_commit(struct ledger *l, char *err, size_t errlen)
{
    if (l->failed) {
        snprintf(err, errlen, "%s: %s: the writes since the last commit are not on disk", l->path, l->fail_msg);
        if (!sqlite3_get_autocommit(l->db))
            sqlite3_exec(l->db, "ROLLBACK", NULL, NULL, NULL);
        l->in_tx = 0;
        return sql_err(l, l->failed);   /* it stays failed: a restart is the way on */
    }
    if (!l->in_tx)
        return 0;
    if (sqlite3_get_autocommit(l->db)) {    /* rolled back under us (begin) */
        write_failed(l, 0, "the transaction");
        return ledger_commit(l, err, errlen);
    }
    int rc = sqlite3_step(l->st[ST_COMMIT]);
    rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
    if (rc != SQLITE_OK)
        snprintf(err, errlen, "%s: commit: %s", l->path, sqlite3_errmsg(l->db));
    sqlite3_reset(l->st[ST_COMMIT]);
    if (rc != SQLITE_OK) {
        /* A failed COMMIT may leave the transaction open: roll it back so state is known. */
        if (!sqlite3_get_autocommit(l->db))
            sqlite3_exec(l->db, "ROLLBACK", NULL, NULL, NULL);
        l->in_tx = 0;
        return sql_err(l, rc);
    }
    l->in_tx = 0;
    return 0;
}

/* Run a prepared write statement inside the open transaction. */
static int run(struct ledger *l, sqlite3_stmt *s)
{
    int r = begin(l);
    if (r < 0) {
        sqlite3_reset(s);
        return r;
    }
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    if (rc != SQLITE_DONE) {
        char what[48];      /* "INSERT INTO meta", "UPDATE batches", ... */
        const char *q = sqlite3_sql(s);
        size_t n = strcspn(q, "(");
        const char *set = strstr(q, " SET ");
        if (set && (size_t)(set - q) < n)
            n = (size_t)(set - q);
        snprintf(what, sizeof what, "%.*s", (int)(n < sizeof what ? n : sizeof what - 1), q);
        return write_failed(l, rc, what);
    }
    if (sqlite3_get_autocommit(l->db))
        return write_failed(l, 0, "the transaction");     /* rolled back by SQLite under us */
    return 0;
}

int ledger_meta_get(struct ledger *l, const char *key, char *val, size_t cap)
{
    l->why[0] = 0;      /* a read's own reason only, never an earlier one's */
    sqlite3_stmt *s = l->st[ST_META_GET];
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s), found = 0;
    if (rc == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(s, 0);     /* (NULL for a NULL value) */
        snprintf(val, cap, "%s", t ? t : "");
        found = 1;
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? found : sql_err(l, rc);
}

int ledger_meta_set(struct ledger *l, const char *key, const char *val)
{
    sqlite3_stmt *s = l->st[ST_META_SET];
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, val, -1, SQLITE_STATIC);
    return run(l, s);
}

int ledger_meta_get_u64(struct ledger *l, const char *key, uint64_t *val)
{
    char buf[64];
    int r = ledger_meta_get(l, key, buf, sizeof buf);
    if (r != 1)
        return r;
    /* Only this file writes these, in decimal: anything else was put there by hand or damage,
     * and a number made of it would quietly change the run (its lineage, its position). */
    if (!decimal_parse(buf, val)) {
        snprintf(l->why, sizeof l->why, "meta %.40s = '%.40s' is not a decimal number below 2^64", key, buf);
        return -DF_EFORMAT;
    }
    return 1;
}

int ledger_meta_set_u64(struct ledger *l, const char *key, uint64_t val)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)val);
    return ledger_meta_set(l, key, buf);
}

int ledger_batch_insert(struct ledger *l, const struct ledger_batch *b)
{
    sqlite3_stmt *s = l->st[ST_BATCH_INS];
    sqlite3_bind_int64(s, 1, (sqlite3_int64)b->id);
    sqlite3_bind_int64(s, 2, b->epoch);
    sqlite3_bind_int64(s, 3, b->idx);
    sqlite3_bind_int64(s, 4, b->n_samples);
    sqlite3_bind_int64(s, 5, b->n_tokens);
    sqlite3_bind_int(s, 6, b->state);
    sqlite3_bind_int64(s, 7, (sqlite3_int64)b->owner);
    sqlite3_bind_int(s, 8, b->slot);
    sqlite3_bind_int64(s, 9, (sqlite3_int64)b->gen);
    sqlite3_bind_int64(s, 10, (sqlite3_int64)b->step);
    sqlite3_bind_int64(s, 11, b->leases);
    sqlite3_bind_int64(s, 12, (sqlite3_int64)b->updated_ms);
    return run(l, s);
}

int ledger_batch_update(struct ledger *l, const struct ledger_batch *b)
{
    sqlite3_stmt *s = l->st[ST_BATCH_UPD];
    sqlite3_bind_int64(s, 1, (sqlite3_int64)b->id);
    sqlite3_bind_int(s, 2, b->state);
    sqlite3_bind_int64(s, 3, (sqlite3_int64)b->owner);
    sqlite3_bind_int(s, 4, b->slot);
    sqlite3_bind_int64(s, 5, (sqlite3_int64)b->gen);
    sqlite3_bind_int64(s, 6, (sqlite3_int64)b->step);
    sqlite3_bind_int64(s, 7, b->leases);
    sqlite3_bind_int64(s, 8, (sqlite3_int64)b->updated_ms);
    return run(l, s);
}

int ledger_batch_foreach(struct ledger *l, int (*fn)(void *ctx, const struct ledger_batch *b), void *ctx)
{
    l->why[0] = 0;
    sqlite3_stmt *s = l->st[ST_BATCH_ALL];
    int rc, r = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct ledger_batch b = {
            .id = (uint64_t)sqlite3_column_int64(s, 0),
            .epoch = (uint32_t)sqlite3_column_int64(s, 1),
            .idx = (uint32_t)sqlite3_column_int64(s, 2),
            .n_samples = (uint32_t)sqlite3_column_int64(s, 3),
            .n_tokens = (uint32_t)sqlite3_column_int64(s, 4),
            .state = sqlite3_column_int(s, 5),
            .owner = (uint64_t)sqlite3_column_int64(s, 6),
            .slot = sqlite3_column_int(s, 7),
            .gen = (uint64_t)sqlite3_column_int64(s, 8),
            .step = (uint64_t)sqlite3_column_int64(s, 9),
            .leases = (uint32_t)sqlite3_column_int64(s, 10),
            .updated_ms = (uint64_t)sqlite3_column_int64(s, 11),
        };
        if (b.state < 0 || b.state >= BATCH_NSTATES) {
            snprintf(l->why, sizeof l->why, "batch " SCHED_BID " has state %d, not one of 0..%d", SCHED_BARGS(b.id),
                     b.state, BATCH_NSTATES - 1);
            r = -DF_EFORMAT;
            break;
        }
        if ((r = fn(ctx, &b)) != 0)
            break;
    }
    sqlite3_reset(s);
    if (r == 0 && rc != SQLITE_DONE)
        r = sql_err(l, rc);
    return r;
}

int ledger_train_add(struct ledger *l, uint64_t batch, uint64_t gen, uint64_t step, uint32_t rank, int rolled_back)
{
    sqlite3_stmt *s = l->st[ST_TRAIN_ADD];
    sqlite3_bind_int64(s, 1, (sqlite3_int64)batch);
    sqlite3_bind_int64(s, 2, (sqlite3_int64)gen);
    sqlite3_bind_int64(s, 3, (sqlite3_int64)step);
    sqlite3_bind_int64(s, 4, rank);
    sqlite3_bind_int(s, 5, rolled_back);
    return run(l, s);
}

int ledger_untrained_add(struct ledger *l, uint64_t batch, uint32_t lease)
{
    sqlite3_stmt *s = l->st[ST_UNTRAINED_ADD];
    sqlite3_bind_int64(s, 1, (sqlite3_int64)batch);
    sqlite3_bind_int64(s, 2, lease);
    return run(l, s);
}

int ledger_untrained_has(struct ledger *l, uint64_t batch, uint32_t lease)
{
    sqlite3_stmt *s = l->st[ST_UNTRAINED_HAS];
    sqlite3_bind_int64(s, 1, (sqlite3_int64)batch);
    sqlite3_bind_int64(s, 2, lease);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : sql_err(l, rc);
}

int ledger_train_rollback(struct ledger *l, uint64_t gen, int64_t after_step)
{
    sqlite3_stmt *s = l->st[ST_TRAIN_RB];
    sqlite3_bind_int64(s, 1, (sqlite3_int64)gen);
    sqlite3_bind_int64(s, 2, after_step);
    return run(l, s);
}

int ledger_checkpoint_add(struct ledger *l, uint64_t gen, uint64_t step, const char *dir)
{
    sqlite3_stmt *s = l->st[ST_CKPT_ADD];
    sqlite3_bind_int64(s, 1, (sqlite3_int64)gen);
    sqlite3_bind_int64(s, 2, (sqlite3_int64)step);
    sqlite3_bind_text(s, 3, dir, -1, SQLITE_STATIC);
    return run(l, s);
}

int ledger_train_rollback_after(struct ledger *l, int64_t after_step)
{
    sqlite3_stmt *s = l->st[ST_TRAIN_RB_AFTER];
    sqlite3_bind_int64(s, 1, after_step);
    return run(l, s);
}

int ledger_checkpoint_drop(struct ledger *l, int64_t after_step, const char *why)
{
    sqlite3_stmt *s = l->st[ST_CKPT_DROP];
    sqlite3_bind_int64(s, 1, after_step);
    sqlite3_bind_text(s, 2, why, -1, SQLITE_STATIC);
    return run(l, s);
}

int ledger_checkpoint_foreach(struct ledger *l, uint32_t limit,
                              int (*fn)(void *ctx, const struct ledger_checkpoint *c, uint64_t ms, const char *dropped),
                              void *ctx)
{
    sqlite3_stmt *s = l->st[ST_CKPT_LIST];
    sqlite3_bind_int64(s, 1, limit);
    int rc, r = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct ledger_checkpoint c = { .gen = (uint64_t)sqlite3_column_int64(s, 0),
                                       .step = (uint64_t)sqlite3_column_int64(s, 1) };
        const char *dir = (const char *)sqlite3_column_text(s, 2);
        snprintf(c.dir, sizeof c.dir, "%s", dir ? dir : "");
        if ((r = fn(ctx, &c, (uint64_t)sqlite3_column_int64(s, 3), (const char *)sqlite3_column_text(s, 4))) != 0)
            break;
    }
    if (!r && rc != SQLITE_DONE)
        r = sql_err(l, rc);
    sqlite3_reset(s);
    return r;
}

int ledger_checkpoint_before(struct ledger *l, uint64_t step, struct ledger_checkpoint *out)
{
    sqlite3_stmt *s = l->st[ST_CKPT_BEFORE];
    sqlite3_bind_int64(s, 1, (sqlite3_int64)step);
    int rc = sqlite3_step(s), r = 0;
    if (rc == SQLITE_ROW) {
        const char *dir = (const char *)sqlite3_column_text(s, 2);
        out->gen = (uint64_t)sqlite3_column_int64(s, 0);
        out->step = (uint64_t)sqlite3_column_int64(s, 1);
        snprintf(out->dir, sizeof out->dir, "%s", dir ? dir : "");
        r = 1;
    } else if (rc != SQLITE_DONE) {
        r = sql_err(l, rc);
    }
    sqlite3_reset(s);
    return r;
}

int ledger_generation_set(struct ledger *l, uint64_t gen, int64_t limit)
{
    sqlite3_stmt *s = l->st[ST_GEN_SET];
    sqlite3_bind_int64(s, 1, (sqlite3_int64)gen);
    sqlite3_bind_int64(s, 2, limit);
    return run(l, s);
}

int ledger_generation_foreach(struct ledger *l, int (*fn)(void *ctx, uint64_t gen, int64_t limit), void *ctx)
{
    sqlite3_stmt *s = l->st[ST_GEN_ALL];
    int rc, r = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
        if ((r = fn(ctx, (uint64_t)sqlite3_column_int64(s, 0), sqlite3_column_int64(s, 1))) != 0)
            break;
    sqlite3_reset(s);
    if (r == 0 && rc != SQLITE_DONE)
        r = sql_err(l, rc);
    return r;
}

int ledger_error_add(struct ledger *l, uint64_t wall_ms, const char *role, int device, int pid, int fatal,
                     int code, const char *message)
{
    sqlite3_stmt *s = l->st[ST_ERR_ADD];
    sqlite3_bind_int64(s, 1, (sqlite3_int64)wall_ms);
    sqlite3_bind_text(s, 2, role, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 3, device);
    sqlite3_bind_int(s, 4, pid);
    sqlite3_bind_int(s, 5, fatal);
    sqlite3_bind_int(s, 6, code);
    sqlite3_bind_text(s, 7, message, -1, SQLITE_STATIC);
    return run(l, s);
}

static int query_u64(struct ledger *l, const char *sql, uint64_t *out)
{
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(l->db, sql, -1, &s, NULL);
    if (rc != SQLITE_OK)
        return sql_err(l, rc);
    rc = sqlite3_step(s);
    *out = rc == SQLITE_ROW ? (uint64_t)sqlite3_column_int64(s, 0) : 0;
    sqlite3_finalize(s);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : sql_err(l, rc);
}

int ledger_error_recent(struct ledger *l, uint32_t limit, uint64_t *n, uint64_t *n_fatal,
                        int (*fn)(void *ctx, const struct ledger_error *e), void *ctx)
{
    int r = query_u64(l, "SELECT count(*) FROM errors", n);
    if (!r)
        r = query_u64(l, "SELECT count(*) FROM errors WHERE fatal != 0", n_fatal);
    if (r)
        return r;
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(l->db, "SELECT ms, role, device, pid, fatal, code, message FROM (SELECT rowid AS k, * "
                                "FROM errors ORDER BY rowid DESC LIMIT ?1) ORDER BY k", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return sql_err(l, rc);
    sqlite3_bind_int64(s, 1, limit);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        const char *role = (const char *)sqlite3_column_text(s, 1), *msg = (const char *)sqlite3_column_text(s, 6);
        struct ledger_error e = { .wall_ms = (uint64_t)sqlite3_column_int64(s, 0), .role = role ? role : "",
                                  .message = msg ? msg : "", .device = sqlite3_column_int(s, 2),
                                  .pid = sqlite3_column_int(s, 3), .fatal = sqlite3_column_int(s, 4),
                                  .code = sqlite3_column_int(s, 5) };
        if ((r = fn(ctx, &e)) != 0)
            break;
    }
    if (!r && rc != SQLITE_DONE)
        r = sql_err(l, rc);
    sqlite3_finalize(s);
    return r;
}

int ledger_audit(struct ledger *l, struct ledger_audit *a)
{
    memset(a, 0, sizeof *a);
    int r = 0;
    char sql[200];
    for (int i = 0; i < BATCH_NSTATES && !r; i++) {
        snprintf(sql, sizeof sql, "SELECT count(*) FROM batches WHERE state = %d", i);
        r = query_u64(l, sql, &a->per_state[i]);
        a->total += a->per_state[i];
    }
    if (!r)
        r = query_u64(l, "SELECT count(*) FROM trains WHERE rolled_back = 0", &a->trained_rows);
    if (!r)
        r = query_u64(l, "SELECT count(*) FROM trains WHERE rolled_back = 1", &a->rolled_back_rows);
    if (!r)
        r = query_u64(l, "SELECT count(*) FROM batches b WHERE b.state = 4 AND"
                         " (SELECT count(*) FROM trains t WHERE t.batch = b.id AND t.rolled_back = 0) != 1",
                      &a->checkpointed_not_once);
    if (!r)
        r = query_u64(l, "SELECT coalesce(max(leases), 0) FROM batches", &a->max_leases);
    return r;
}
