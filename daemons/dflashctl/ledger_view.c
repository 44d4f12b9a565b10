/* ledger_view.c: dflashctl --ledger: a coordinator's ledger read with SQLite read-only, into the
 * JSON documents dflashctl prints (errors and checkpoints in the coordinator's own shape). */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/cleanup.h"
#include "common/decimal.h"
#include "common/err.h"
#include "common/jsonutil.h"
#include "common/sqlite_ro.h"
#include "daemons/coordinator/ledger.h"
#include "daemons/dflashctl/ledger_view.h"

/* The schema this view reads: the one the coordinator writes. */
#define VIEW_SCHEMA LEDGER_SCHEMA

/* ledger.c's batch_state_name, which dflashctl does not link: the states by ledger.h's numbers. */
static const char *const state_names[BATCH_NSTATES] = {
    [BATCH_PENDING] = "pending", [BATCH_LEASED] = "leased", [BATCH_PUBLISHED] = "published",
    [BATCH_TRAINED] = "trained", [BATCH_CHECKPOINTED] = "checkpointed",
};
_Static_assert(BATCH_NSTATES == 5, "a batch state added to ledger.h: name it here too");

struct view {
    sqlite3 *db;
    char *err;
    size_t errlen;
};

/* ---- opening ---- */

/* SQLite's failure rc in `what` as a reason an operator can act on. */
static int sql_fail(struct view *v, int rc, const char *what)
{
    const char *msg = v->db ? sqlite3_errmsg(v->db) : sqlite3_errstr(rc);
    switch (rc & 0xff) {    /* the primary code of an extended one */
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return df_fail(v->err, v->errlen, -EBUSY, "locked by another process (SQLite, %s: %s)", what, msg);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
        return df_fail(v->err, v->errlen, -DF_EFORMAT, "a damaged database (SQLite, %s: %s)", what, msg);
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:   /* (a WAL index it may not make or map) */
        return df_fail(v->err, v->errlen, -EACCES, "cannot read it (SQLite, %s: %s)", what, msg);
    case SQLITE_NOMEM:
        return df_fail(v->err, v->errlen, -ENOMEM, "out of memory (SQLite, %s)", what);
    default:
        return df_fail(v->err, v->errlen, -EIO, "SQLite, %s: %s", what, msg);
    }
}

static int prepare(struct view *v, sqlite3_stmt **s, const char *sql, const char *what)
{
    int rc = sqlite3_prepare_v2(v->db, sql, -1, s, NULL);
    return rc == SQLITE_OK ? 0 : sql_fail(v, rc, what);
}

/* The first row's two integer columns of sql (0 where there is no row). */
static int scalar2(struct view *v, const char *sql, const char *what, int64_t *a, int64_t *b)
{
    sqlite3_stmt *s;
    int r = prepare(v, &s, sql, what);
    if (r < 0)
        return r;
    int rc = sqlite3_step(s);
    *a = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
    if (b)
        *b = rc == SQLITE_ROW ? sqlite3_column_int64(s, 1) : 0;
    r = rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : sql_fail(v, rc, what);
    sqlite3_finalize(s);
    return r;
}

/* A key of the meta table: 1 found (its text in val), 0 absent, <0 error. */
static int meta_get(struct view *v, const char *key, char *val, size_t cap)
{
    sqlite3_stmt *s;
    int r = prepare(v, &s, "SELECT value FROM meta WHERE key = ?1", "meta");
    if (r < 0)
        return r;
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(s, 0);
        snprintf(val, cap, "%s", t ? t : "");
        r = 1;
    } else {
        r = rc == SQLITE_DONE ? 0 : sql_fail(v, rc, "meta");
    }
    sqlite3_finalize(s);
    return r;
}

/* A number the coordinator keeps in meta (decimal, as ledger_meta_set_u64 writes it). */
static int meta_u64(struct view *v, const char *key, uint64_t *val)
{
    char buf[64];
    int r = meta_get(v, key, buf, sizeof buf);
    if (r != 1)
        return r;
    if (!decimal_parse(buf, val))
        return df_fail(v->err, v->errlen, -DF_EFORMAT, "meta %.40s = '%.40s' is not a decimal number below 2^64 (no "
                       "coordinator writes that)", key, buf);
    return 1;
}

/* A file of a ledger's tables, of the schema this build reads. Before the tables: a newer
 * schema may have others. */
static int check_ledger(struct view *v)
{
    int64_t version = 0, have = 0;
    int r = scalar2(v, "PRAGMA user_version", "schema version", &version, NULL);
    if (r < 0)
        return r;
    if (version > VIEW_SCHEMA)
        return df_fail(v->err, v->errlen, -DF_EVERSION, "ledger schema %" PRId64 ", this dflashctl reads schema %d "
                       "(written by a newer dflash)", version, VIEW_SCHEMA);
    static const char *const tables[] = { "meta", "batches", "trains", "checkpoints", "errors" };
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        char sql[128];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '%s'", tables[i]);
        if ((r = scalar2(v, sql, "tables", &have, NULL)) < 0)
            return r;
        if (!have)
            return df_fail(v->err, v->errlen, -DF_ELAYOUT, "an SQLite database but not a dflash ledger (it has no "
                           "table '%s')", tables[i]);
    }
    if (version < VIEW_SCHEMA)
        return df_fail(v->err, v->errlen, -DF_EVERSION, "ledger schema %" PRId64 ", this dflashctl reads schema %d "
                       "(written by an older dflash: a coordinator of this one updates it when it next starts on it)",
                       version, VIEW_SCHEMA);
    return 0;
}

/* ---- the documents ---- */

static void add_u64(cJSON *o, const char *k, uint64_t x) { cJSON_AddNumberToObject(o, k, (double)x); }

/* "total" and one count per state, as the coordinator's "batches" object names them (without its
 * counts since its start: re-queued, duplicates, retracted are not kept in the ledger). */
static int counts_json(struct view *v, cJSON *o, uint64_t *checkpointed)
{
    sqlite3_stmt *s;
    int r = prepare(v, &s, "SELECT state, count(*) FROM batches GROUP BY state", "batches");
    if (r < 0)
        return r;
    uint64_t n[BATCH_NSTATES] = { 0 }, other = 0, total = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t st = sqlite3_column_int64(s, 0);
        uint64_t c = (uint64_t)sqlite3_column_int64(s, 1);
        if (st >= 0 && st < BATCH_NSTATES)
            n[st] += c;
        else
            other += c;     /* (a row no coordinator writes: counted, not hidden) */
        total += c;
    }
    r = rc == SQLITE_DONE ? 0 : sql_fail(v, rc, "batches");
    sqlite3_finalize(s);
    add_u64(o, "total", total);
    for (int k = 0; k < BATCH_NSTATES; k++)
        add_u64(o, state_names[k], n[k]);
    if (other)
        add_u64(o, "other", other);
    *checkpointed = n[BATCH_CHECKPOINTED];
    return r;
}

/* Per scheduled epoch: its batches and how many are checkpointed (the coordinator's "per_epoch");
 * *batches (optional): the scheduled epochs' batches, *first: epoch 0's. */
static int per_epoch_json(struct view *v, cJSON *a, uint64_t *scheduled, uint64_t *batches, uint64_t *first)
{
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT epoch, count(*), sum(state = %d) FROM batches GROUP BY epoch ORDER BY epoch",
             BATCH_CHECKPOINTED);
    sqlite3_stmt *s;
    int r = prepare(v, &s, sql, "batches");
    if (r < 0)
        return r;
    int rc;
    uint64_t sum = 0, e0 = 0;
    *scheduled = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "epoch", (double)sqlite3_column_int64(s, 0));
        cJSON_AddNumberToObject(x, "batches", (double)sqlite3_column_int64(s, 1));
        sum += (uint64_t)sqlite3_column_int64(s, 1);
        if (sqlite3_column_int64(s, 0) == 0)
            e0 = (uint64_t)sqlite3_column_int64(s, 1);
        cJSON_AddNumberToObject(x, "checkpointed", (double)sqlite3_column_int64(s, 2));
        cJSON_AddItemToArray(a, x);
        ++*scheduled;
    }
    r = rc == SQLITE_DONE ? 0 : sql_fail(v, rc, "batches");
    sqlite3_finalize(s);
    if (batches)
        *batches = sum;
    if (first)
        *first = e0;
    return r;
}

/* The newest `limit` errors, newest first, each as the coordinator's error_json makes it. */
static int errors_json(struct view *v, cJSON *a, uint32_t limit)
{
    sqlite3_stmt *s;
    int r = prepare(v, &s, "SELECT ms, role, device, pid, fatal, code, message FROM errors ORDER BY rowid DESC LIMIT ?1",
                    "errors");
    if (r < 0)
        return r;
    sqlite3_bind_int64(s, 1, limit);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        const char *role = (const char *)sqlite3_column_text(s, 1), *msg = (const char *)sqlite3_column_text(s, 6);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "wall_ms", (double)sqlite3_column_int64(s, 0));
        cJSON_AddStringToObject(o, "role", role ? role : "");
        cJSON_AddNumberToObject(o, "gpu", sqlite3_column_int(s, 2));
        cJSON_AddNumberToObject(o, "pid", sqlite3_column_int(s, 3));
        cJSON_AddBoolToObject(o, "fatal", sqlite3_column_int(s, 4) != 0);
        cJSON_AddNumberToObject(o, "code", sqlite3_column_int(s, 5));
        cJSON_AddStringToObject(o, "message", msg ? msg : "");
        cJSON_AddItemToArray(a, o);
    }
    r = rc == SQLITE_DONE ? 0 : sql_fail(v, rc, "errors");
    sqlite3_finalize(s);
    return r;
}

static int error_counts(struct view *v, cJSON *o, const char *count_key, const char *fatal_key)
{
    int64_t n, fatal;
    int r = scalar2(v, "SELECT count(*), coalesce(sum(fatal != 0), 0) FROM errors", "errors", &n, &fatal);
    if (r < 0)
        return r;
    cJSON_AddNumberToObject(o, count_key, (double)n);
    cJSON_AddNumberToObject(o, fatal_key, (double)fatal);
    return 0;
}

/* The lineage head as the coordinator keeps it (meta ckpt_*): the checkpoint a group starts from. */
static int head_read(struct view *v, uint64_t *gen, uint64_t *step, char *dir, size_t cap)
{
    int r;
    *gen = *step = 0;
    dir[0] = 0;
    if ((r = meta_u64(v, "ckpt_gen", gen)) < 0 || (r = meta_u64(v, "ckpt_step", step)) < 0 ||
        (r = meta_get(v, "ckpt_dir", dir, cap)) < 0)
        return r;
    return 0;
}

static cJSON *head_json(uint64_t gen, uint64_t step, const char *dir)
{
    cJSON *h = cJSON_CreateObject();
    add_u64(h, "generation", gen);
    add_u64(h, "step", step);
    cJSON_AddStringToObject(h, "dir", dir);
    return h;
}

/* The coordinator's `checkpoints` document: the head (null: none), the newest `limit` rows. */
static int checkpoints_doc(struct view *v, cJSON *o, uint32_t limit)
{
    uint64_t gen, step;
    char dir[4096];
    int r = head_read(v, &gen, &step, dir, sizeof dir);
    if (r < 0)
        return r;
    cJSON_AddItemToObject(o, "head", dir[0] ? head_json(gen, step, dir) : cJSON_CreateNull());
    cJSON *a = cJSON_AddArrayToObject(o, "checkpoints");
    sqlite3_stmt *s;
    if ((r = prepare(v, &s, "SELECT gen, step, dir, ms, dropped FROM checkpoints ORDER BY rowid DESC LIMIT ?1",
                     "checkpoints")) < 0)
        return r;
    sqlite3_bind_int64(s, 1, limit);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        const char *d = (const char *)sqlite3_column_text(s, 2), *dropped = (const char *)sqlite3_column_text(s, 4);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "generation", (double)sqlite3_column_int64(s, 0));
        cJSON_AddNumberToObject(e, "step", (double)sqlite3_column_int64(s, 1));
        cJSON_AddStringToObject(e, "dir", d ? d : "");
        cJSON_AddNumberToObject(e, "written_ms", (double)sqlite3_column_int64(s, 3));
        json_add_on_disk(e, d);     /* as this process sees the folder now (pruned, removed) */
        json_add_string_or_null(e, "dropped", dropped);
        cJSON_AddItemToArray(a, e);
    }
    r = rc == SQLITE_DONE ? 0 : sql_fail(v, rc, "checkpoints");
    sqlite3_finalize(s);
    return r;
}

static int errors_doc(struct view *v, cJSON *o, uint32_t limit)
{
    int r = errors_json(v, cJSON_AddArrayToObject(o, "errors"), limit);
    return r < 0 ? r : error_counts(v, o, "count", "fatal");
}

/* Counts, epochs, and the `limit` batches changed last (newest first), each with how often it
 * was trained in the lineage (its trains rows not rolled back). */
static int batches_doc(struct view *v, cJSON *o, uint32_t limit)
{
    uint64_t done, scheduled;
    int r = counts_json(v, cJSON_AddObjectToObject(o, "batches"), &done);
    cJSON *ep = cJSON_AddObjectToObject(o, "epoch");
    if (r < 0 || (r = per_epoch_json(v, cJSON_AddArrayToObject(ep, "per_epoch"), &scheduled, NULL, NULL)) < 0)
        return r;
    add_u64(ep, "scheduled", scheduled);
    cJSON *a = cJSON_AddArrayToObject(o, "recent");
    sqlite3_stmt *s;
    /* (one grouping of the trains, not a scan of them per row: trains has no index on batch) */
    if ((r = prepare(v, &s, "SELECT b.id, b.epoch, b.idx, b.state, b.n_samples, b.n_tokens, b.leases, b.slot, b.gen, "
                     "b.step, b.updated_ms, coalesce(t.n, 0) FROM batches b LEFT JOIN (SELECT batch, count(*) AS n "
                     "FROM trains WHERE rolled_back = 0 GROUP BY batch) t ON t.batch = b.id "
                     "ORDER BY b.updated_ms DESC, b.id DESC LIMIT ?1", "batches")) < 0)
        return r;
    sqlite3_bind_int64(s, 1, limit);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t st = sqlite3_column_int64(s, 3);
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "id", (double)sqlite3_column_int64(s, 0));
        cJSON_AddNumberToObject(x, "epoch", (double)sqlite3_column_int64(s, 1));
        cJSON_AddNumberToObject(x, "index", (double)sqlite3_column_int64(s, 2));
        cJSON_AddStringToObject(x, "state", st >= 0 && st < BATCH_NSTATES ? state_names[st] : "?");
        cJSON_AddNumberToObject(x, "samples", (double)sqlite3_column_int64(s, 4));
        cJSON_AddNumberToObject(x, "tokens", (double)sqlite3_column_int64(s, 5));
        cJSON_AddNumberToObject(x, "leases", (double)sqlite3_column_int64(s, 6));
        cJSON_AddNumberToObject(x, "slot", (double)sqlite3_column_int64(s, 7));
        cJSON_AddNumberToObject(x, "generation", (double)sqlite3_column_int64(s, 8));
        cJSON_AddNumberToObject(x, "step", (double)sqlite3_column_int64(s, 9));
        cJSON_AddNumberToObject(x, "updated_ms", (double)sqlite3_column_int64(s, 10));
        cJSON_AddNumberToObject(x, "trains", (double)sqlite3_column_int64(s, 11));
        cJSON_AddItemToArray(a, x);
    }
    r = rc == SQLITE_DONE ? 0 : sql_fail(v, rc, "batches");
    sqlite3_finalize(s);
    return r;
}

/* A meta number into o as k when the ledger has it; *got says whether it did. */
static int meta_num_json(struct view *v, cJSON *o, const char *key, const char *k, uint64_t *val)
{
    uint64_t x = 0;
    int r = meta_u64(v, key, &x);
    if (r < 0)
        return r;
    if (r)
        add_u64(o, k, x);
    else
        cJSON_AddNullToObject(o, k);
    if (val)
        *val = x;
    return 0;
}

static int status_doc(struct view *v, const char *path, cJSON *o)
{
    char text[4096];
    uint64_t x = 0;
    int r;
    cJSON_AddStringToObject(o, "ledger", path);
    cJSON_AddNumberToObject(o, "schema", VIEW_SCHEMA);
    if ((r = meta_u64(v, "run_id", &x)) < 0)
        return r;
    snprintf(text, sizeof text, "%016" PRIx64, x);
    cJSON_AddStringToObject(o, "run", r ? text : "");
    if ((r = meta_num_json(v, o, "created_ms", "created_ms", NULL)) < 0 || (r = meta_get(v, "dataset", text, sizeof text)) < 0)
        return r;
    cJSON_AddStringToObject(o, "dataset", r ? text : "");
    /* the cluster's state as its coordinator last saved it (coord_cluster.c save_state) */
    if ((r = meta_get(v, "state", text, sizeof text)) < 0)
        return r;
    cJSON_AddStringToObject(o, "state", r ? text : "");
    if ((r = meta_get(v, "reason", text, sizeof text)) < 0)
        return r;
    cJSON_AddStringToObject(o, "reason", r ? text : "");
    cJSON *fl = cJSON_AddObjectToObject(o, "flags");
    static const char *const flags[] = { "fatal", "space_paused", "nan_pending", "failed_open" };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if ((r = meta_u64(v, flags[i], &x)) < 0)
            return r;
        cJSON_AddBoolToObject(fl, flags[i], r && x);
    }
    if ((r = meta_num_json(v, fl, "nan_step", "nan_step", NULL)) < 0)
        return r;

    uint64_t done, scheduled, sum, first, epochs = 0;
    cJSON *ep = cJSON_AddObjectToObject(o, "epoch");
    cJSON *b = cJSON_AddObjectToObject(o, "batches");
    if ((r = counts_json(v, b, &done)) < 0 ||
        (r = per_epoch_json(v, cJSON_AddArrayToObject(ep, "per_epoch"), &scheduled, &sum, &first)) < 0)
        return r;
    add_u64(ep, "scheduled", scheduled);
    add_u64(ep, "done_batches", done);
    /* the run's batches as estimated when its first drafter group formed (the lr horizon) */
    if ((r = meta_num_json(v, ep, "run_batches", "run_batches", NULL)) < 0 ||
        (r = meta_num_json(v, ep, "epochs", "epochs", &epochs)) < 0)
        return r;
    /* the run's batches as its coordinator counts them: the scheduled epochs', and epoch 0's for
     * each epoch not scheduled yet (null from a ledger that does not say its epochs) */
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(ep, "epochs")) && epochs >= scheduled)
        add_u64(ep, "total_batches", sum + (scheduled ? (epochs - scheduled) * first : 0));
    else
        cJSON_AddNullToObject(ep, "total_batches");
    int64_t last, have;
    if ((r = scalar2(v, "SELECT coalesce(max(updated_ms), 0), count(*) FROM batches", "batches", &last, &have)) < 0)
        return r;
    if (have)
        cJSON_AddNumberToObject(o, "last_change_ms", (double)last);
    else
        cJSON_AddNullToObject(o, "last_change_ms");

    cJSON *g = cJSON_AddObjectToObject(o, "group");
    uint64_t gen = 0, active = 0;
    if ((r = meta_num_json(v, g, "group_gen", "generation", &gen)) < 0 || (r = meta_u64(v, "group_active", &active)) < 0)
        return r;
    cJSON_AddBoolToObject(g, "active", active != 0);
    char key[48];
    snprintf(key, sizeof key, "gen%" PRIu64 "_world", gen);     /* the ranks of that generation */
    if ((r = meta_num_json(v, g, key, "world_size", NULL)) < 0)
        return r;
    uint64_t hgen, hstep;
    if ((r = head_read(v, &hgen, &hstep, text, sizeof text)) < 0)
        return r;
    cJSON_AddItemToObject(g, "checkpoint", head_json(hgen, hstep, text));   /* (dir "": none, as online) */

    int64_t n, dropped;
    cJSON *ck = cJSON_AddObjectToObject(o, "checkpoints");
    if ((r = scalar2(v, "SELECT count(*), count(dropped) FROM checkpoints", "checkpoints", &n, &dropped)) < 0)
        return r;
    cJSON_AddNumberToObject(ck, "count", (double)n);
    cJSON_AddNumberToObject(ck, "dropped", (double)dropped);

    /* the exactly-once check: a batch with more than one training kept in the lineage, a
     * checkpointed one with other than one (grouped once: trains has no index on batch) */
    cJSON *tr = cJSON_AddObjectToObject(o, "trains");
    int64_t twice, not_once;
    char sql[400];
    int64_t rolled;
    if ((r = scalar2(v, "SELECT count(*), coalesce(sum(rolled_back != 0), 0) FROM trains", "trains", &n, &rolled)) < 0 ||
        (r = scalar2(v, "SELECT count(*) FROM (SELECT batch FROM trains WHERE rolled_back = 0 GROUP BY batch "
                     "HAVING count(*) > 1)", "trains", &twice, NULL)) < 0)
        return r;
    snprintf(sql, sizeof sql, "SELECT count(*) FROM batches b LEFT JOIN (SELECT batch, count(*) AS n FROM trains WHERE "
             "rolled_back = 0 GROUP BY batch) t ON t.batch = b.id WHERE b.state = %d AND coalesce(t.n, 0) != 1",
             BATCH_CHECKPOINTED);
    if ((r = scalar2(v, sql, "trains", &not_once, NULL)) < 0)
        return r;
    cJSON_AddNumberToObject(tr, "rows", (double)n);
    cJSON_AddNumberToObject(tr, "rolled_back", (double)rolled);
    cJSON_AddNumberToObject(tr, "trained_twice", (double)twice);
    cJSON_AddNumberToObject(tr, "checkpointed_not_once", (double)not_once);

    /* as the coordinator's status: the newest 10 errors and the counts */
    if ((r = errors_json(v, cJSON_AddArrayToObject(o, "errors"), 10)) < 0)
        return r;
    return error_counts(v, o, "error_count", "fatal_count");
}

/* One reading in one read transaction (every number of a document from the same commit). */
static int read_once(const char *path, int immutable, enum ledger_view_what what, uint32_t limit, cJSON **out,
                     char *err, size_t errlen)
{
    struct view v = { .err = err, .errlen = errlen };
    char uri[3 * PATH_MAX + 64];
    int r = sqlite_ro_uri(uri, sizeof uri, path, immutable);
    if (r < 0)
        return df_fail(err, errlen, r, "the path is too long");
    int rc = sqlite3_open_v2(uri, &v.db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        r = sql_fail(&v, rc, "open");
        sqlite3_close(v.db);
        return r;
    }
    sqlite3_busy_timeout(v.db, 5000);     /* a commit or checkpoint of a running coordinator */
    cJSON *o = cJSON_CreateObject();
    if ((rc = sqlite3_exec(v.db, "BEGIN", NULL, NULL, NULL)) != SQLITE_OK)
        r = sql_fail(&v, rc, "begin");
    if (!r && !o)
        r = df_fail(err, errlen, -ENOMEM, "out of memory");
    if (!r)
        r = check_ledger(&v);
    if (!r) {
        switch (what) {
        case LEDGER_VIEW_STATUS: r = status_doc(&v, path, o); break;
        case LEDGER_VIEW_BATCHES: r = batches_doc(&v, o, limit); break;
        case LEDGER_VIEW_ERRORS: r = errors_doc(&v, o, limit); break;
        case LEDGER_VIEW_CHECKPOINTS: r = checkpoints_doc(&v, o, limit); break;
        default: r = df_fail(err, errlen, -EINVAL, "not kept in the ledger"); break;
        }
    }
    sqlite3_exec(v.db, "ROLLBACK", NULL, NULL, NULL);   /* (a read transaction: nothing to undo) */
    sqlite3_close(v.db);
    if (r < 0) {
        cJSON_Delete(o);
        return r;
    }
    *out = o;
    return 0;
}

int ledger_view_read(const char *path, enum ledger_view_what what, uint32_t limit, cJSON **out, char *err,
                     size_t errlen)
{
    *out = NULL;
    int wal = 0, r = sqlite_ro_check(path, &wal, err, errlen);
    if (r < 0)
        return r;
    /* A WAL ledger with no -wal file beside it was closed by its last coordinator: everything is
     * in the file. SQLite opening it read-only would make the -wal and -shm files beside it (and
     * leave them); immutable=1 reads the file alone. If a -wal file appears meanwhile (a
     * coordinator started on it, which may checkpoint into the file as it is read), the reading
     * is done again the shared way, with the coordinator's WAL index. */
    for (int attempt = 0;; attempt++) {
        int immutable = wal && !sqlite_ro_wal_present(path) && attempt == 0;
        r = read_once(path, immutable, what, limit, out, err, errlen);
        if (!immutable || !sqlite_ro_wal_present(path))
            return r;
        /* (a read that failed that way too: the file changed under it, e.g. "malformed") */
        cJSON_Delete(*out);
        *out = NULL;
    }
}
