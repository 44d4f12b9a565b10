/* dflash-replay: re-trains a generation of a CPU run (from a fresh drafter, or the checkpoint a
 * later generation started from) on what its ledger records (which batch each rank trained at
 * each step) and checks the weights against one of that generation's checkpoints. */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "common/daemon.h"
#include "common/dataset.h"
#include "common/decimal.h"
#include "common/err.h"
#include "common/sqlite_ro.h"
#include "common/text.h"
#include "daemons/coordinator/sched.h"
#include "model/cpu_ops.h"
#include "model/checkpoint.h"
#include "model/drafter.h"
#include "model/hfconfig.h"
#include "model/objective.h"
#include "model/optim.h"
#include "model/target.h"

#define EX_MATCH 0
#define EX_MISMATCH 1           /* also: the replay could not be completed (out of memory, I/O) */
#define EX_BAD_INPUT DAEMON_EX_CONFIG

/* One kept training row of the ledger: rank `rank` trained batch `batch` in step `step`. */
struct train_row {
    int64_t step;
    uint32_t rank;
    uint64_t batch;
};

struct replay {
    struct daemon d;                /* the config as the daemons load it, and file:line in errors */
    const struct dflash_cfg *cfg;
    const char *want_dir;           /* --checkpoint; NULL: the newest in the lineage */
    char ledger_path[CFG_STR_MAX + 80];
    sqlite3 *db;
    int immutable;                  /* read as a file alone (sqlite_ro.h): no -wal file was there */
    uint64_t run_id, run_batches;

    struct dataset ds;
    uint32_t *lengths;              /* the samples' lengths, as the coordinator schedules them */
    struct sched_params sp;
    struct sched_epoch *ep;         /* [data.epochs], built for the epochs the rows name */

    struct hf_config hf;
    int ids[DRAFTER_MAX_CTX_LAYERS], n_ids;
    struct drafter_config dc;
    struct drafter_train_opts topt;
    int world;

    char ckpt_dir[PATH_MAX];
    int64_t ckpt_step;
    int64_t gen;                    /* the generation that wrote it */
    char start_dir[PATH_MAX];       /* the checkpoint that generation started from ("" fresh) */
    int64_t start_step;
    struct train_row *rows;         /* by step, then rank */
    size_t n_rows;

    float *embed, *lm_head;
    struct target *tgt;
    struct drafter *dr;             /* the replay */
    struct drafter *ref;            /* the checkpoint */
    struct ckpt_train_state ref_ts, ts;

    uint32_t *tokens;               /* one batch as a ring slot holds it */
    uint8_t *mask;
    int32_t *cu;
    uint16_t *hidden;
    float *sum;                     /* the group's gradients */
    struct obj_block *blocks;
    int32_t *work;
    int max_blocks;
};

static int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("dflash-replay: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

/* A bad value of section.key, blamed on its line in the config file. */
static int key_fail(const struct replay *rp, const char *section, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int key_fail(const struct replay *rp, const char *section, const char *key, const char *fmt, ...)
{
    char why[1024], err[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    daemon_key_error(&rp->d, section, key, err, sizeof err, "%s", why);
    return fail(EX_BAD_INPUT, "%s", err);
}

/* A load that failed for want of memory or on a read error is not the input's fault. */
static int load_code(int r)
{
    return r == -ENOMEM || r == -EIO ? EX_MISMATCH : EX_BAD_INPUT;
}

/* ---- config: what drafter-d and target-d derive from it ------------------------------------ */

static int setup_config(struct replay *rp)
{
    char err[1024];
    if (daemon_load_config(&rp->d, err, sizeof err) < 0)
        return fail(EX_BAD_INPUT, "%s", err);
    const struct dflash_cfg *c = rp->cfg = &rp->d.cfg;
    /* The CUDA backends compute in other precisions: only a CPU run is replayed bit for bit. */
    if (strcmp(c->target.backend, "cpu"))
        return key_fail(rp, "target", "backend", "%s: the replay recomputes the hidden states on the CPU, so only a"
                        " run with target.backend = cpu can be checked", c->target.backend);
    if (strcmp(c->drafter.backend, "cpu"))
        return key_fail(rp, "drafter", "backend", "%s: the replay trains on the CPU, so only a run with"
                        " drafter.backend = cpu can be checked", c->drafter.backend);
    if (c->data.token_budget > c->ring.max_tokens)
        return key_fail(rp, "data", "token_budget", "%lld is larger than ring.max_tokens (%lld)",
                        (long long)c->data.token_budget, (long long)c->ring.max_tokens);
    if (!c->model.path[0])
        return key_fail(rp, "model", "path", "empty: the target model dir is required");
    if (hf_config_load(c->model.path, &rp->hf, err, sizeof err) < 0)
        return key_fail(rp, "model", "path", "%s", err);
    /* the capture ids and the drafter's shape, as drafter-d's check_config makes them */
    const char *key;
    int n = target_capture_ids(&c->model, rp->hf.num_layers, rp->ids, &key, err, sizeof err);
    if (n < 0)
        return key_fail(rp, "model", key, "%s", err);
    rp->n_ids = n;
    if (drafter_config_from_cfg(&rp->dc, &rp->hf, c, rp->ids, n, err, sizeof err) < 0)
        return key_fail(rp, "model", "path", "%s/config.json: drafter shape: %s", c->model.path, err);
    rp->world = (int)c->drafter.world_size;
    rp->topt = drafter_train_opts_from_cfg(c);
    if (cfg_ledger_path(c, rp->ledger_path, sizeof rp->ledger_path) < 0)
        return key_fail(rp, "cluster", "state_dir", "the ledger's path is too long");
    return 0;
}

/* ---- the ledger ---------------------------------------------------------------------------- */

static int sql_fail(const struct replay *rp, const char *what)
{
    return fail(EX_BAD_INPUT, "%s: %s: %s (not a dflash ledger?)", rp->ledger_path, what, sqlite3_errmsg(rp->db));
}

/* meta.value of key as a number: 1 and *v when there, else 0; *code: 0, or the exit code of a
 * ledger that cannot be read (its line said). */
/* meta.key's text into out (cut to fit): 1 found, 0 absent; *code non-zero on an error (said). */
static int meta_text(struct replay *rp, const char *key, char *out, size_t n, int *code)
{
    sqlite3_stmt *q = NULL;
    *code = 0;
    out[0] = 0;
    if (sqlite3_prepare_v2(rp->db, "SELECT value FROM meta WHERE key = ?1", -1, &q, NULL) != SQLITE_OK) {
        *code = sql_fail(rp, "meta");
        return 0;
    }
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q), found = 0;
    if (rc == SQLITE_ROW) {
        const char *s = (const char *)sqlite3_column_text(q, 0);
        snprintf(out, n, "%s", s ? s : "");
        found = 1;
    } else if (rc != SQLITE_DONE) {
        *code = sql_fail(rp, "meta");
    }
    sqlite3_finalize(q);
    return found;
}

static int meta_u64(struct replay *rp, const char *key, uint64_t *v, int *code)
{
    char s[32];
    *v = 0;
    int found = meta_text(rp, key, s, sizeof s, code);
    if (found && !*code && !decimal_parse(s, v))
        *code = fail(EX_BAD_INPUT, "%s: meta.%s: '%s' is not a number", rp->ledger_path, key, s);
    return found;
}

static int open_ledger(struct replay *rp)
{
    struct stat st;
    if (stat(rp->ledger_path, &st) < 0)
        return key_fail(rp, rp->cfg->coordinator.ledger[0] ? "coordinator" : "cluster",
                        rp->cfg->coordinator.ledger[0] ? "ledger" : "state_dir", "ledger %s: %s", rp->ledger_path,
                        strerror(errno));
    /* read-only, leaving nothing beside it (also where its folder is not writable to this user),
     * every read of it in one transaction: the ledger of one moment, a coordinator running or not */
    int wal = 0;
    char why[256], uri[3 * PATH_MAX + 64];
    if (sqlite_ro_check(rp->ledger_path, &wal, why, sizeof why) < 0)
        return fail(EX_BAD_INPUT, "ledger %s: %s", rp->ledger_path, why);
    rp->immutable = wal && !sqlite_ro_wal_present(rp->ledger_path);
    if (sqlite_ro_uri(uri, sizeof uri, rp->ledger_path, rp->immutable) < 0)
        return fail(EX_BAD_INPUT, "ledger %s: the path is too long", rp->ledger_path);
    if (sqlite3_open_v2(uri, &rp->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL) != SQLITE_OK)
        return sql_fail(rp, "open");
    sqlite3_busy_timeout(rp->db, 5000);
    if (sqlite3_exec(rp->db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK)
        return sql_fail(rp, "begin");
    int code;
    if (!meta_u64(rp, "run_id", &rp->run_id, &code) || code)
        return code ? code : fail(EX_BAD_INPUT, "%s: meta.run_id: missing (a ledger of an older dflash?)",
                                  rp->ledger_path);
    /* The learning-rate horizon drafter-d takes from GROUP: the run's batches over the group. */
    if (!meta_u64(rp, "run_batches", &rp->run_batches, &code) || code)
        return code ? code : fail(EX_BAD_INPUT, "%s: meta.run_batches: missing (no drafter group formed: nothing was"
                                  " trained)", rp->ledger_path);
    if (!rp->run_batches)
        return fail(EX_BAD_INPUT, "%s: meta.run_batches: 0 (a run schedules at least one batch)", rp->ledger_path);
    return 0;
}

/* The replayed generation's size: as the coordinator recorded it at its forming (meta
 * gen<N>_world), or for generation 1 of an older ledger run_world, or (older still) while
 * generation 1 is the last formed, one owner token a rank. drafter.world_size must say the same
 * (the run's config: a run restarted with fewer drafters is replayed a generation at a time, each
 * with its size); the learning-rate horizon is drafter-d's: the run's batches over it. */
static int check_world(struct replay *rp)
{
    const char *cfg = rp->d.config_path ? rp->d.config_path : "(defaults)";
    char key[48];
    snprintf(key, sizeof key, "gen%" PRId64 "_world", rp->gen);
    int code;
    uint64_t world = 0, gen = 0;
    int have = meta_u64(rp, key, &world, &code);
    if (code)
        return code;
    if (!have && rp->gen == 1 && (have = meta_u64(rp, "run_world", &world, &code), code))
        return code;
    if (!have && rp->gen != 1)
        return fail(EX_BAD_INPUT, "%s: meta.%s: missing (a ledger of an older dflash): the size of generation %" PRId64
                    " is not known, only generation 1 can be replayed", rp->ledger_path, key, rp->gen);
    if (!have) {
        if (!meta_u64(rp, "group_gen", &gen, &code) && code)
            return code;
        sqlite3_stmt *q = NULL;
        if (gen == 1 && sqlite3_prepare_v2(rp->db, "SELECT value FROM meta WHERE key = 'group_tokens'", -1, &q,
                                           NULL) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW &&
            sqlite3_column_text(q, 0)) {
            const char *toks = (const char *)sqlite3_column_text(q, 0);
            world = *toks ? 1 : 0;
            for (const char *c = toks; *c; c++)
                world += *c == ',';
            have = 1;
        }
        sqlite3_finalize(q);
    }
    if (have && world != (uint64_t)rp->world)
        return fail(EX_BAD_INPUT, "%s: drafter.world_size is %d, the run's drafter group had %" PRIu64 " ranks in "
                    "generation %" PRId64 " (%s)", cfg, rp->world, world, rp->gen, rp->ledger_path);
    if (!rp->topt.total_steps)
        rp->topt.total_steps = (int64_t)((rp->run_batches + (uint64_t)rp->world - 1) / (uint64_t)rp->world);
    return 0;
}

/* The checkpoint to check: the ledger's newest row for that folder (a folder a later generation
 * wrote again holds that generation's weights) must be in the lineage; its generation is the one
 * replayed. */
static int pick_checkpoint(struct replay *rp)
{
    sqlite3_stmt *q = NULL;
    char want[PATH_MAX];
    if (rp->want_dir) {
        snprintf(want, sizeof want, "%s", rp->want_dir);
    } else {
        if (sqlite3_prepare_v2(rp->db, "SELECT dir FROM checkpoints WHERE dropped IS NULL ORDER BY rowid DESC LIMIT 1",
                               -1, &q, NULL) != SQLITE_OK)
            return sql_fail(rp, "checkpoints");
        int rc = sqlite3_step(q);
        const char *dir = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(q, 0) : NULL;
        snprintf(want, sizeof want, "%s", dir ? dir : "");
        sqlite3_finalize(q);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE)
            return sql_fail(rp, "checkpoints");
        if (!want[0])
            return fail(EX_BAD_INPUT, "%s: no checkpoint in the lineage", rp->ledger_path);
    }
    struct stat ws;
    if (stat(want, &ws) < 0)
        return fail(EX_BAD_INPUT, "checkpoint %s: %s", want, strerror(errno));
    if (!S_ISDIR(ws.st_mode))
        return fail(EX_BAD_INPUT, "checkpoint %s: not a folder", want);
    if (!realpath(want, rp->ckpt_dir))
        return fail(EX_BAD_INPUT, "checkpoint %s: %s", want, strerror(errno));
    if (sqlite3_prepare_v2(rp->db, "SELECT gen, step, dir, dropped FROM checkpoints ORDER BY rowid DESC", -1, &q,
                           NULL) != SQLITE_OK)
        return sql_fail(rp, "checkpoints");
    int rc = SQLITE_DONE, found = 0, code = 0;
    while (!found && (rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *dir = (const char *)sqlite3_column_text(q, 2), *dropped = (const char *)sqlite3_column_text(q, 3);
        struct stat st;
        if (!dir || stat(dir, &st) < 0 || st.st_dev != ws.st_dev || st.st_ino != ws.st_ino)
            continue;
        found = 1;
        rp->gen = sqlite3_column_int64(q, 0);
        rp->ckpt_step = sqlite3_column_int64(q, 1);
        if (rp->gen < 1)
            code = fail(EX_BAD_INPUT, "checkpoint %s: generation %" PRId64 " in the ledger", rp->ckpt_dir, rp->gen);
        else if (dropped)
            code = fail(EX_BAD_INPUT, "checkpoint %s: dropped from the run's lineage (%s)", rp->ckpt_dir, dropped);
        else if (rp->ckpt_step < 1)
            code = fail(EX_BAD_INPUT, "checkpoint %s: step %" PRId64 " in the ledger", rp->ckpt_dir, rp->ckpt_step);
    }
    if (!found && rc != SQLITE_DONE)
        code = sql_fail(rp, "checkpoints");
    sqlite3_finalize(q);
    if (code)
        return code;
    if (!found)
        return fail(EX_BAD_INPUT, "checkpoint %s: not one the ledger %s records (another run's, or never"
                    " acknowledged)", rp->ckpt_dir, rp->ledger_path);
    /* The folder's claim names the run that wrote it: a ledger moved away and a new run started
     * with the same config would otherwise be replayed against the old run's checkpoints. */
    char root[PATH_MAX], err[512];
    snprintf(root, sizeof root, "%s", rp->ckpt_dir);
    char *slash = strrchr(root, '/');
    if (slash && slash != root)
        *slash = 0;
    uint64_t id = 0;
    int r = ckpt_read_run_id(root, &id, err, sizeof err);
    if (r < 0)
        return fail(load_code(r), "%s", err);
    if (r == 0)
        return fail(EX_BAD_INPUT, "%s/%s: missing: the folder does not say which run wrote it", root, CKPT_RUN_FILE);
    if (id != rp->run_id)
        return fail(EX_BAD_INPUT, "%s/%s: run %016" PRIx64 ", the ledger %s is of run %016" PRIx64, root,
                    CKPT_RUN_FILE, id, rp->ledger_path, rp->run_id);
    return 0;
}

/* Where the generation started: a fresh drafter (generation 1, or a later one formed before any
 * checkpoint), or the checkpoint the coordinator's lineage stood on when it formed, the newest an
 * earlier generation wrote that was not dropped (one that did not load was dropped, and the
 * generation that met it ended untrained). read_rows checks that its steps follow on. */
static int find_start(struct replay *rp)
{
    rp->start_dir[0] = 0;
    rp->start_step = 0;
    if (rp->gen == 1)
        return 0;
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(rp->db, "SELECT dir, step FROM checkpoints WHERE gen < ?1 AND dropped IS NULL"
                           " ORDER BY rowid DESC LIMIT 1", -1, &q, NULL) != SQLITE_OK)
        return sql_fail(rp, "checkpoints");
    sqlite3_bind_int64(q, 1, rp->gen);
    int rc = sqlite3_step(q), code = 0;
    if (rc == SQLITE_ROW) {
        const char *dir = (const char *)sqlite3_column_text(q, 0);
        snprintf(rp->start_dir, sizeof rp->start_dir, "%s", dir ? dir : "");
        rp->start_step = sqlite3_column_int64(q, 1);
    } else if (rc != SQLITE_DONE) {
        code = sql_fail(rp, "checkpoints");
    }
    sqlite3_finalize(q);
    if (code || !rp->start_dir[0])
        return code;
    struct stat st;
    if (stat(rp->start_dir, &st) < 0)
        return fail(EX_BAD_INPUT, "checkpoint %s, which generation %" PRId64 " started from: %s (removed as old? "
                    "drafter.keep_checkpoints = 0 keeps every one)", rp->start_dir, rp->gen, strerror(errno));
    return 0;
}

/* The kept training rows of the generation's steps past its start up to ckpt_step: at most one
 * batch per rank and step (rank 0 reports its peers' batches too, hence DISTINCT), every step
 * there. */
static int read_rows(struct replay *rp)
{
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(rp->db, "SELECT count(*) FROM trains WHERE gen = ?2 AND step >= ?3 AND step <= ?1"
                           " AND rolled_back != 0", -1, &q, NULL) != SQLITE_OK)
        return sql_fail(rp, "trains");
    sqlite3_bind_int64(q, 1, rp->ckpt_step);
    sqlite3_bind_int64(q, 2, rp->gen);
    sqlite3_bind_int64(q, 3, rp->start_step);
    int64_t rolled = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
    sqlite3_finalize(q);
    if (rolled < 0)
        return sql_fail(rp, "trains");
    if (rolled)
        return fail(EX_BAD_INPUT, "%s: %" PRId64 " training rows of generation %" PRId64 " up to step %" PRId64
                    " were rolled back: a run rolled back there is not replayed", rp->ledger_path, rolled, rp->gen,
                    rp->ckpt_step);
    if (sqlite3_prepare_v2(rp->db, "SELECT DISTINCT step, rank, batch FROM trains WHERE gen = ?2 AND rolled_back = 0"
                           " AND step >= ?3 AND step <= ?1 ORDER BY step, rank, batch", -1, &q, NULL) != SQLITE_OK)
        return sql_fail(rp, "trains");
    sqlite3_bind_int64(q, 1, rp->ckpt_step);
    sqlite3_bind_int64(q, 2, rp->gen);
    sqlite3_bind_int64(q, 3, rp->start_step);
    size_t cap = 0;
    int rc = SQLITE_DONE, code = 0;
    while (!code && (rc = sqlite3_step(q)) == SQLITE_ROW) {
        int64_t rank = sqlite3_column_int64(q, 1);     /* checked whole, before it is narrowed */
        struct train_row t = { sqlite3_column_int64(q, 0), (uint32_t)rank, (uint64_t)sqlite3_column_int64(q, 2) };
        const struct train_row *prev = rp->n_rows ? &rp->rows[rp->n_rows - 1] : NULL;
        if (t.step <= rp->start_step)   /* a first step with nothing supervised keeps the count */
            code = fail(EX_BAD_INPUT, "%s: trains: batch %" PRIu64 " at step %" PRId64 ": a step with nothing "
                        "supervised, not replayable", rp->ledger_path, t.batch, t.step);
        else if (rank < 0 || rank >= rp->world)
            code = fail(EX_BAD_INPUT, "%s: trains: batch %" PRIu64 " at step %" PRId64 " by rank %" PRId64 ", the"
                        " group has %d ranks (drafter.world_size)", rp->ledger_path, t.batch, t.step,
                        (int64_t)sqlite3_column_int64(q, 1), rp->world);
        else if (prev && prev->step == t.step && prev->rank == t.rank)
            /* a step in which nothing was supervised anywhere moves no step count: its batches carry
             * the number of the step before them, and the two cannot be told apart */
            code = fail(EX_BAD_INPUT, "%s: trains: step %" PRId64 " has two batches of rank %u (%" PRIu64 " and %"
                        PRIu64 "): a step with nothing supervised, not replayable", rp->ledger_path, t.step, t.rank,
                        prev->batch, t.batch);
        else if (prev ? t.step != prev->step && t.step != prev->step + 1 : t.step != rp->start_step + 1)
            code = fail(EX_BAD_INPUT, "%s: trains: no batch of generation %" PRId64 " at step %" PRId64, rp->ledger_path,
                        rp->gen, (prev ? prev->step : rp->start_step) + 1);
        if (code)
            break;
        if (rp->n_rows == cap) {
            cap = cap ? 2 * cap : 1024;
            struct train_row *n = realloc(rp->rows, cap * sizeof *n);
            if (!n) {
                code = fail(EX_MISMATCH, "out of memory for %zu training rows", cap);
                break;
            }
            rp->rows = n;
        }
        rp->rows[rp->n_rows++] = t;
    }
    if (!code && rc != SQLITE_DONE)
        code = sql_fail(rp, "trains");
    sqlite3_finalize(q);
    if (!code && (!rp->n_rows || rp->rows[rp->n_rows - 1].step != rp->ckpt_step))
        code = fail(EX_BAD_INPUT, "%s: trains: no batch of generation %" PRId64 " at step %" PRId64 " (the "
                    "checkpoint's)", rp->ledger_path, rp->gen,
                    rp->n_rows ? rp->rows[rp->n_rows - 1].step + 1 : rp->start_step + 1);
    return code;
}

/* ---- the data: the dataset and the coordinator's schedule ---------------------------------- */

static int open_data(struct replay *rp)
{
    const struct dflash_cfg *c = rp->cfg;
    char err[768];
    int r = dataset_open(&rp->ds, c->data.path, 0, err, sizeof err);
    if (r < 0)
        return r == -ENOMEM ? fail(EX_MISMATCH, "%s", err) : key_fail(rp, "data", "path", "%s", err);
    int code;
    uint64_t sum;
    if (!meta_u64(rp, "dataset_checksum", &sum, &code) || code)
        return code ? code : fail(EX_BAD_INPUT, "%s: meta.dataset_checksum: missing", rp->ledger_path);
    if (sum != rp->ds.checksum)
        return key_fail(rp, "data", "path", "%s has checksum %016" PRIx64 ", the run of %s trained on a dataset of"
                        " checksum %016" PRIx64, c->data.path, rp->ds.checksum, rp->ledger_path, sum);
    if (rp->ds.n_samples > UINT32_MAX)
        return key_fail(rp, "data", "path", "%s: more than 2^32 samples", c->data.path);
    if (!(rp->lengths = malloc(rp->ds.n_samples * sizeof *rp->lengths)) ||
        !(rp->ep = calloc((size_t)c->data.epochs, sizeof *rp->ep)))
        return fail(EX_MISMATCH, "out of memory for %" PRIu64 " samples", rp->ds.n_samples);
    /* as the coordinator: samples that train nothing left out, unless the run is from before */
    uint64_t rule = 1;
    int rule_known = meta_u64(rp, "sched_inert", &rule, &code);
    if (code)
        return code;
    uint32_t max_seq = (uint32_t)c->data.max_seq_len;
    dataset_sched_lengths(&rp->ds, max_seq, rule != 0, rp->lengths);
    rp->sp = (struct sched_params){ .seed = (uint64_t)c->data.seed, .token_budget = (uint32_t)c->data.token_budget,
                                    .max_seq_len = (uint32_t)c->data.max_seq_len,
                                    .bucket_width = (uint32_t)c->data.bucket_width,
                                    .max_seqs = (uint32_t)c->ring.max_seqs };
    if ((r = sched_check(&rp->sp, err, sizeof err)) < 0)
        return fail(EX_BAD_INPUT, "%s: %s", rp->d.config_path, err);
    /* the schedule's inputs as the coordinator recorded them: data.* and ring.max_seqs of the run */
    sqlite3_stmt *q = NULL;
    char fp[32];
    snprintf(fp, sizeof fp, "%016" PRIx64, sched_fingerprint(rp->lengths, (uint32_t)rp->ds.n_samples, &rp->sp));
    if (sqlite3_prepare_v2(rp->db, "SELECT value FROM meta WHERE key = 'fingerprint'", -1, &q, NULL) != SQLITE_OK)
        return sql_fail(rp, "meta");
    const char *old = sqlite3_step(q) == SQLITE_ROW ? (const char *)sqlite3_column_text(q, 0) : NULL;
    if (old && strcmp(old, fp) && !rule_known) {
        /* a run the coordinator has not started since samples that train nothing are left out */
        dataset_sched_lengths(&rp->ds, max_seq, false, rp->lengths);
        char every[32];
        snprintf(every, sizeof every, "%016" PRIx64, sched_fingerprint(rp->lengths, (uint32_t)rp->ds.n_samples, &rp->sp));
        if (!strcmp(old, every))
            memcpy(fp, every, sizeof fp);
        else
            dataset_sched_lengths(&rp->ds, max_seq, true, rp->lengths);
    }
    code = !old || strcmp(old, fp)
               ? fail(EX_BAD_INPUT, "%s: meta.fingerprint %s, the config %s schedules %s: data.seed, token_budget,"
                      " max_seq_len, bucket_width or ring.max_seqs differ from the run's", rp->ledger_path,
                      old ? old : "(none)", rp->d.config_path, fp)
               : 0;
    sqlite3_finalize(q);
    return code;
}

/* Every row's batch: in an epoch of the run, recorded in the ledger as the schedule has it. */
static int check_batches(struct replay *rp)
{
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(rp->db, "SELECT epoch, idx, n_samples, n_tokens FROM batches WHERE id = ?1", -1, &q,
                           NULL) != SQLITE_OK)
        return sql_fail(rp, "batches");
    int code = 0;
    char err[512] = "";
    for (size_t k = 0; k < rp->n_rows && !code; k++) {
        uint64_t id = rp->rows[k].batch;
        uint32_t e = sched_batch_epoch(id), i = sched_batch_index(id);
        if (e >= (uint64_t)rp->cfg->data.epochs) {
            code = key_fail(rp, "data", "epochs", "%lld, and the ledger's batch %" PRIu64 " is of epoch %u",
                            (long long)rp->cfg->data.epochs, id, e);
            break;
        }
        struct sched_epoch *s = &rp->ep[e];
        if (!s->first && sched_build(rp->lengths, (uint32_t)rp->ds.n_samples, &rp->sp, e, s, err, sizeof err) < 0) {
            code = fail(EX_MISMATCH, "schedule of epoch %u: %s", e, err[0] ? err : "out of memory");
            break;
        }
        sqlite3_reset(q);
        sqlite3_bind_int64(q, 1, (sqlite3_int64)id);
        if (sqlite3_step(q) != SQLITE_ROW) {
            code = fail(EX_BAD_INPUT, "%s: batches: no batch %" PRIu64 " (trained at step %" PRId64 ")",
                        rp->ledger_path, id, rp->rows[k].step);
            break;
        }
        if (i >= s->n_batches || sqlite3_column_int64(q, 0) != e || sqlite3_column_int64(q, 1) != i ||
            sqlite3_column_int64(q, 2) != s->first[i + 1] - s->first[i] || sqlite3_column_int64(q, 3) != s->tokens[i])
            code = fail(EX_BAD_INPUT, "%s: batches: batch %" PRIu64 " is not the schedule's (epoch %u has %u"
                        " batches)", rp->ledger_path, id, e, s->n_batches);
    }
    sqlite3_finalize(q);
    return code;
}

/* ---- models -------------------------------------------------------------------------------- */

static int open_models(struct replay *rp)
{
    const struct dflash_cfg *c = rp->cfg;
    char err[1024];
    int vocab = 0, hidden = 0, r;
    if ((r = target_load_head(c->model.path, &rp->embed, &rp->lm_head, &vocab, &hidden, err, sizeof err)) < 0)
        return fail(load_code(r), "%s", err);
    target_cpu_set_threads((int)c->target.threads);
    if ((r = target_open(&rp->tgt, c->model.path, rp->ids, rp->n_ids, TARGET_BACKEND_CPU, 0, (int)c->ring.max_tokens,
                         err, sizeof err)) < 0)
        return fail(load_code(r), "%s", err);
    uint64_t fp;
    int code;
    if (meta_u64(rp, "model_fingerprint", &fp, &code) && !code && fp != target_fingerprint(rp->tgt))
        return key_fail(rp, "model", "path", "%s has weights of fingerprint %016" PRIx64 ", the run of %s trained on "
                        "%016" PRIx64 " (other weights)", c->model.path, target_fingerprint(rp->tgt), rp->ledger_path,
                        fp);
    if (code)
        return code;
    char was[HF_CONFIG_TEXT_MAX], mine[HF_CONFIG_TEXT_MAX], diff[400];
    if (meta_text(rp, "model_config", was, sizeof was, &code) && !code &&
        hf_config_forward_text(target_config(rp->tgt), mine, sizeof mine) > 0 && text_kv_diff(mine, was, diff, sizeof diff))
        return key_fail(rp, "model", "path", "%s/config.json: %s of %s (other settings)", c->model.path, diff,
                        rp->ledger_path);
    if (code)
        return code;
    /* sized as drafter-d sizes it from the ring's layout; a fresh drafter is initialised from
     * drafter.seed here, as drafter-d's is (a later generation's then loads its start below) */
    rp->max_blocks = drafter_max_blocks_for((int)c->ring.max_tokens, (int)c->ring.max_seqs,
                                            (int)c->drafter.num_anchors);
    if ((r = drafter_create(&rp->dr, &rp->dc, rp->embed, rp->lm_head, (int)c->ring.max_tokens, rp->max_blocks,
                            (uint64_t)c->drafter.seed, err, sizeof err)) < 0 ||
        (r = drafter_create(&rp->ref, &rp->dc, rp->embed, rp->lm_head, 2, 1, (uint64_t)c->drafter.seed, err,
                            sizeof err)) < 0)
        return fail(load_code(r), "%s", err);
    if ((r = ckpt_load(rp->ckpt_dir, rp->ref, &rp->ref_ts, NULL, err, sizeof err)) < 0)
        return fail(load_code(r), "%s", err);
    if (rp->start_dir[0]) {     /* a later generation: from the checkpoint it started from */
        if ((r = ckpt_load(rp->start_dir, rp->dr, &rp->ts, NULL, err, sizeof err)) < 0)
            return fail(load_code(r), "%s", err);
        if (rp->ts.step != rp->start_step)
            return fail(EX_BAD_INPUT, "%s/%s: step %" PRId64 ", the ledger %s records the checkpoint at step %" PRId64,
                        rp->start_dir, CKPT_OPTIMIZER, rp->ts.step, rp->ledger_path, rp->start_step);
    } else {
        rp->ts.seed = (uint64_t)c->drafter.seed;
    }
    if (rp->ref_ts.step != rp->ckpt_step)
        return fail(EX_BAD_INPUT, "%s/%s: step %" PRId64 ", the ledger %s records the checkpoint at step %" PRId64,
                    rp->ckpt_dir, CKPT_OPTIMIZER, rp->ref_ts.step, rp->ledger_path, rp->ckpt_step);
    if (rp->ref_ts.seed != (uint64_t)c->drafter.seed)
        return key_fail(rp, "drafter", "seed", "%lld, the run's checkpoint %s was trained with seed %" PRIu64,
                        (long long)c->drafter.seed, rp->ckpt_dir, rp->ref_ts.seed);
    size_t T = (size_t)c->ring.max_tokens, row = (size_t)rp->n_ids * (size_t)rp->hf.hidden_size;
    rp->tokens = malloc(T * sizeof *rp->tokens);
    rp->mask = malloc(T);
    rp->cu = malloc(((size_t)c->ring.max_seqs + 1) * sizeof *rp->cu);
    rp->hidden = malloc(T * row * sizeof *rp->hidden);
    rp->sum = malloc(rp->dr->n_params * sizeof *rp->sum);
    rp->blocks = malloc((size_t)rp->max_blocks * sizeof *rp->blocks);
    rp->work = malloc(T * sizeof *rp->work);
    if (!rp->tokens || !rp->mask || !rp->cu || !rp->hidden || !rp->sum || !rp->blocks || !rp->work)
        return fail(EX_MISMATCH, "out of memory for batches of %zu tokens", T);
    return 0;
}

/* ---- the replay ---------------------------------------------------------------------------- */

/* Rank `rank`'s share of a step on batch `id`: the batch packed from the dataset as target-d
 * packs a lease, its captured states from the CPU target (bf16, as the ring holds them), then
 * anchors, gradients (into dr->grads) and metric sums as drafter-d's consume_slot makes them.
 * 0, or <0 with why. */
static int rank_share(struct replay *rp, uint64_t id, uint32_t rank, struct drafter_metrics *m, uint32_t *n_seqs,
                      char *why, size_t len)
{
    const struct dflash_cfg *c = rp->cfg;
    uint32_t e = sched_batch_epoch(id), i = sched_batch_index(id);
    const struct sched_epoch *s = &rp->ep[e];
    uint32_t first = s->first[i], ns = s->first[i + 1] - first, n = 0;
    rp->cu[0] = 0;
    for (uint32_t k = 0; k < ns; k++) {
        uint32_t sample = s->samples[first + k], l = dataset_sample_len(&rp->ds, sample);
        if (l > rp->sp.max_seq_len)
            l = rp->sp.max_seq_len;
        memcpy(rp->tokens + n, dataset_sample_tokens(&rp->ds, sample), (size_t)l * sizeof *rp->tokens);
        memcpy(rp->mask + n, dataset_sample_mask(&rp->ds, sample), l);
        n += l;
        rp->cu[k + 1] = (int32_t)n;
    }
    size_t row = (size_t)rp->n_ids * (size_t)rp->hf.hidden_size;
    target_cpu_set_threads((int)c->target.threads);     /* (OpenBLAS's count is per process) */
    int r = target_forward(rp->tgt, rp->tokens, rp->cu, (int)ns, (int)n, rp->hidden, OUT_BF16,
                           row * sizeof *rp->hidden);
    openblas_set_num_threads((int)c->drafter.threads);
    if (r < 0)
        return df_fail(why, len, r, "target forward of batch %" PRIu64 ": %s", id, err_str(r));
    struct obj_batch b = { .tokens = rp->tokens, .loss_mask = rp->mask, .cu_seqlens = rp->cu, .n_seqs = (int)ns,
                           .n_tokens = (int)n, .hidden_bf16 = rp->hidden, .hidden_pitch = row };
    if ((r = obj_batch_check(&b, rp->dc.vocab_size, why, len)) < 0)
        return r;
    struct obj_rng_key key = { .seed = (uint64_t)c->drafter.seed, .epoch = e, .batch_id = id, .rank = rank };
    int nb = obj_sample_anchors(&b, (int)c->drafter.num_anchors, &key, rp->blocks, rp->max_blocks, rp->work);
    if (nb < 0)
        return df_fail(why, len, nb, "anchors of batch %" PRIu64 ": %s", id, err_str(nb));
    if (nb > 0) {
        if ((r = drafter_forward_backward(rp->dr, &b, rp->blocks, nb, c->drafter.gamma, m)) < 0)
            return df_fail(why, len, r, "forward/backward of batch %" PRIu64 ": %s", id, err_str(r));
    } else {
        memset(rp->dr->grads, 0, rp->dr->n_params * sizeof(float));
        memset(m, 0, sizeof *m);
        m->tokens = n;
    }
    *n_seqs = ns;
    return 0;
}

/* One step of the group: rows[0..n) are its batches by rank. The sums are those of
 * ipc/collective.c's all-reduce: in float, rank 0's share copied, the others' added in rank
 * order, a rank without a batch adding zeros; the metric sums go through it as floats. Then
 * drafter-d's optimizer step, and rank 0's training position (the one its checkpoints hold).
 * 0, or <0 with why. */
static int replay_step(struct replay *rp, const struct train_row *rows, size_t n, char *why, size_t len)
{
    struct drafter *dr = rp->dr;
    float msum[DRAFTER_METRICS_N] = { 0 }, seqs = 0;
    uint32_t epoch0 = 0;
    size_t next = 0;
    for (uint32_t rank = 0; rank < (uint32_t)rp->world; rank++) {
        struct drafter_metrics m = { 0 };
        uint32_t ns = 0;
        bool have = next < n && rows[next].rank == rank;
        if (have) {
            int r = rank_share(rp, rows[next].batch, rank, &m, &ns, why, len);
            if (r < 0)
                return r;
            if (!(isfinite(m.loss_sum) && isfinite(m.weight_sum)))
                return df_fail(why, len, -DF_ENAN, "batch %" PRIu64 " of rank %u: the loss is not finite (the run"
                               " would have skipped the step)", rows[next].batch, rank);
            if (rank == 0)
                epoch0 = sched_batch_epoch(rows[next].batch);
            next++;
        } else {
            memset(dr->grads, 0, dr->n_params * sizeof(float));
        }
        if (rank == 0)
            memcpy(rp->sum, dr->grads, dr->n_params * sizeof(float));
        else
            for (size_t i = 0; i < dr->n_params; i++)
                rp->sum[i] += dr->grads[i];
        float mf[DRAFTER_METRICS_N];
        drafter_metrics_to_floats(&m, mf);
        for (int k = 0; k < DRAFTER_METRICS_N; k++)
            msum[k] = rank == 0 ? mf[k] : msum[k] + mf[k];
        seqs = rank == 0 ? (float)ns : seqs + (float)ns;
    }
    struct drafter_metrics gm;
    drafter_metrics_from_floats(msum, &gm);
    memcpy(dr->grads, rp->sum, dr->n_params * sizeof(float));
    struct drafter_step_info info;
    int r = drafter_optimizer_step(dr, gm.weight_sum, &rp->topt, &info);
    if (r == -DF_ERANGE)
        return df_fail(why, len, r, "nothing supervised in the step, yet the run took it");
    if (r < 0)
        return df_fail(why, len, r, "optimizer step (gradient norm %g): %s", info.grad_norm, err_str(r));
    if (rows[0].rank == 0)      /* the epoch moves with rank 0's own batch only */
        ckpt_epoch_seen(&rp->ts, epoch0);
    rp->ts.batch_in_epoch += n;
    rp->ts.samples += (uint64_t)seqs;
    rp->ts.tokens += (uint64_t)gm.tokens;
    rp->ts.step = drafter_step_count(dr);
    return 0;
}

/* Largest |a-b| and |a-b| / max(|a|, |b|) over n values; *at: where the absolute one is. */
static void diff(const float *a, const float *b, size_t n, double *max_abs, double *max_rel, size_t *at)
{
    *max_abs = *max_rel = 0;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]), scale = fmax(fabs((double)a[i]), fabs((double)b[i]));
        if (d > *max_abs || isnan(d)) {
            *max_abs = d;
            *at = i;
        }
        if (scale > 0 && d / scale > *max_rel)
            *max_rel = d / scale;
    }
}

/* Compare with the checkpoint, print the verdict line; the exit code. */
static int verdict(struct replay *rp, int64_t steps)
{
    const struct drafter *a = rp->dr, *b = rp->ref;
    double w_abs, w_rel, m_abs, m_rel, v_abs, v_rel;
    size_t at, at_m, at_v;
    diff(a->params, b->params, a->n_params, &w_abs, &w_rel, &at);
    diff(a->opt->m, b->opt->m, a->n_params, &m_abs, &m_rel, &at_m);
    diff(a->opt->v, b->opt->v, a->n_params, &v_abs, &v_rel, &at_v);
    char more[512] = "";
    size_t k = 0;
    if (w_abs != 0) {
        const struct drafter_tensor *t = &a->tensors[0];
        for (int i = 0; i < a->n_tensors; i++)
            if (at >= a->tensors[i].offset && at < a->tensors[i].offset + a->tensors[i].numel)
                t = &a->tensors[i];
        k += (size_t)snprintf(more + k, sizeof more - k, "; largest at %s[%zu]: %.9g, checkpoint %.9g", t->name,
                              at - t->offset, a->params[at], b->params[at]);
    }
    if (m_abs != 0 || v_abs != 0)
        k += (size_t)snprintf(more + k, sizeof more - k, "; AdamW moments differ (max abs %g / %g)", m_abs, v_abs);
    /* (epoch and batch in epoch are shown, not compared: a count of where the run is that no resume
     * reads, which drafters before ckpt_epoch_seen took back with a late batch of an earlier epoch) */
    const struct ckpt_train_state *x = &rp->ts, *y = &rp->ref_ts;
    if (k < sizeof more && (x->step != y->step || x->samples != y->samples || x->tokens != y->tokens))
        snprintf(more + k, sizeof more - k, "; training position (step, epoch, batch in epoch, sequences, tokens)"
                 " %" PRId64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 ", checkpoint %" PRId64 " %" PRIu64
                 " %" PRIu64 " %" PRIu64 " %" PRIu64, x->step, x->epoch, x->batch_in_epoch, x->samples, x->tokens,
                 y->step, y->epoch, y->batch_in_epoch, y->samples, y->tokens);
    /* AdamW's own count (optimizer.bin's opt_step): a resume takes its learning rate and bias
     * correction from it, so a checkpoint whose count is off would resume another schedule */
    k = strlen(more);
    if (k < sizeof more && drafter_step_count(b) != drafter_step_count(a))
        snprintf(more + k, sizeof more - k, "; AdamW step count %" PRId64 ", checkpoint %" PRId64,
                 drafter_step_count(a), drafter_step_count(b));
    /* No tolerance: with the run's thread counts (drafter.threads, target.threads) on a host of
     * the same CPU, the replay does the run's float operations in the run's order, so every
     * difference is one in what was trained (tests/test_replay.sh finds 0 on every run; one
     * step's stale gradients of a rank without a batch show as 1e-6 and more). */
    bool pass = !more[0];
    printf("dflash-replay: %" PRId64 " steps of generation %" PRId64 " replayed%s%s to %s: master weights max abs"
           " diff %g, max rel diff %g (%zu values)%s: %s\n", steps, rp->gen, rp->start_dir[0] ? " from " : "",
           rp->start_dir, rp->ckpt_dir, w_abs, w_rel, a->n_params, more, pass ? "PASS" : "FAIL");
    return pass ? EX_MATCH : EX_MISMATCH;
}

/* Everything the replay needs from the ledger is read: the read transaction ends (a running
 * coordinator's WAL is not held up by it). Read as a file alone, the reading is only whole if no
 * coordinator started on the ledger meanwhile. */
static int ledger_read_done(struct replay *rp)
{
    sqlite3_exec(rp->db, "ROLLBACK", NULL, NULL, NULL);     /* (a read transaction: nothing to undo) */
    if (rp->immutable && sqlite_ro_wal_present(rp->ledger_path))
        return fail(EX_MISMATCH, "ledger %s: a coordinator started on it while it was read: run again once that "
                    "coordinator has stopped", rp->ledger_path);
    return 0;
}

static int run(struct replay *rp)
{
    int code;
    if ((code = setup_config(rp)) || (code = open_ledger(rp)) || (code = pick_checkpoint(rp)) ||
        (code = check_world(rp)) || (code = find_start(rp)) || (code = open_data(rp)) || (code = read_rows(rp)) ||
        (code = check_batches(rp)) ||
        (code = ledger_read_done(rp)) || (code = open_models(rp)))
        return code;
    char why[1024];
    for (size_t k = 0; k < rp->n_rows;) {
        size_t n = 1;
        while (k + n < rp->n_rows && rp->rows[k + n].step == rp->rows[k].step)
            n++;
        if (replay_step(rp, rp->rows + k, n, why, sizeof why) < 0) {
            printf("dflash-replay: step %" PRId64 " of generation %" PRId64 " (to %s): %s: FAIL\n", rp->rows[k].step,
                   rp->gen, rp->ckpt_dir, why);
            return EX_MISMATCH;
        }
        k += n;
    }
    return verdict(rp, rp->ckpt_step - rp->start_step);
}

static void replay_done(struct replay *rp)
{
    free(rp->tokens);
    free(rp->mask);
    free(rp->cu);
    free(rp->hidden);
    free(rp->sum);
    free(rp->blocks);
    free(rp->work);
    drafter_free(rp->dr);
    drafter_free(rp->ref);
    target_close(rp->tgt);
    if (rp->embed)
        target_free_head(rp->embed, rp->lm_head);
    for (int64_t e = 0; rp->ep && e < rp->cfg->data.epochs; e++)
        sched_epoch_done(&rp->ep[e]);
    free(rp->ep);
    free(rp->lengths);
    if (rp->ds.map)     /* (a closed one is zeroed: its fd 0 is not its own) */
        dataset_close(&rp->ds);
    free(rp->rows);
    sqlite3_close(rp->db);
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: dflash-replay -c CONFIG [--checkpoint DIR] [-o section.key=value]...\n"
        "Re-trains the drafter on the CPU through every step of the generation that wrote a checkpoint,\n"
        "from where that generation started (a fresh drafter, or the checkpoint it loaded), on the\n"
        "batches the ledger records for each rank and step, and compares the fp32 master weights (and\n"
        "AdamW moments, training position) with that checkpoint's.\n"
        "  -c CONFIG         the cluster's INI file, as the run had it\n"
        "  --checkpoint DIR  the checkpoint to check (default: the newest in the ledger's lineage)\n"
        "  -o S.K=V          override one key after the file is read (as the daemons were given)\n"
        "Exit 0: equal (PASS); 1: they differ (FAIL), or the replay could not run; %d: bad input;\n"
        "64: a usage error.\n",
        EX_BAD_INPUT);
}

int main(int argc, char **argv)
{
    cpu_blas_pick_kernels(argv);     /* (an exec, once, before anything else: as drafter-d does; its
                                      * one line of output says nothing of it) */
    static struct replay rp;
    rp.d = (struct daemon){ .prog = "dflash-replay", .role = "replay", .index = -1, .lock_fd = -1 };
    static const struct option opts[] = {
        { "checkpoint", required_argument, 0, 1 }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
    };
    int c;
    opterr = 0;     /* one line of ours instead of getopt's and the usage */
    while ((c = getopt_long(argc, argv, "c:o:h", opts, NULL)) != -1) {
        long at = c == 'c' || c == 'o' || c == 1 ? cfg_control_char(optarg) : -1;
        if (at >= 0)
            return fail(DAEMON_EX_USAGE, "%s: its value has a control character (0x%02x) at byte %ld",
                        c == 'c' ? "-c" : c == 'o' ? "-o" : "--checkpoint", (unsigned char)optarg[at], at);
        switch (c) {
        case 'c': rp.d.config_path = optarg; break;
        case 1: rp.want_dir = optarg; break;
        case 'o':
            if (rp.d.n_overrides == DAEMON_MAX_OVERRIDES)
                return fail(DAEMON_EX_USAGE, "more than %d -o overrides", DAEMON_MAX_OVERRIDES);
            if (!strchr(optarg, '=') || !strchr(optarg, '.') || strchr(optarg, '.') > strchr(optarg, '='))
                return fail(DAEMON_EX_USAGE, "-o '%s': expected section.key=value", optarg);
            rp.d.overrides[rp.d.n_overrides++] = optarg;
            break;
        case 'h': usage(stdout); return 0;
        default:
            if (optopt == 'c' || optopt == 'o' || optopt == 1)
                return fail(DAEMON_EX_USAGE, "%s needs a value (try -h)", argv[optind - 1]);
            return fail(DAEMON_EX_USAGE, "unknown option '%s' (try -h)", argv[optind - 1]);
        }
    }
    if (!rp.d.config_path)
        return fail(DAEMON_EX_USAGE, "-c CONFIG is needed: the run's configuration (try -h)");
    if (optind != argc)
        return fail(DAEMON_EX_USAGE, "unexpected argument '%s' (try -h)", argv[optind]);
    int code = run(&rp);
    replay_done(&rp);
    return code;
}
