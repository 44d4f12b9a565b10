/* ledger.h: the durable record of the run in SQLite (WAL, synchronous=FULL): every batch's
 * state, the training log, checkpoints, generations, errors, early hand-backs and run metadata. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* PRAGMA user_version of the ledger's tables (ledger.c); 2: checkpoints.dropped. The coordinator
 * updates an older ledger when it starts on it and refuses a newer one; dflashctl --ledger reads
 * this one only. */
#define LEDGER_SCHEMA 2

enum batch_state {
    BATCH_PENDING = 0,      /* waiting for a lease */
    BATCH_LEASED,           /* a target holds it */
    BATCH_PUBLISHED,        /* in a READY ring slot */
    BATCH_TRAINED,          /* a drafter stepped on it; not yet in a durable checkpoint */
    BATCH_CHECKPOINTED,     /* in a durable checkpoint: done */
    BATCH_NSTATES
};
const char *batch_state_name(int s);

struct ledger_batch {
    uint64_t id;
    uint32_t epoch, idx;
    uint32_t n_samples, n_tokens;
    int state;              /* enum batch_state */
    uint64_t owner;         /* LEASED: owner token of the target */
    int32_t slot;           /* PUBLISHED: ring slot, else -1 */
    uint64_t gen, step;     /* TRAINED/CHECKPOINTED: drafter generation and step */
    uint32_t leases;        /* times leased (re-leases after failures show here) */
    uint64_t updated_ms;    /* wall clock of the last change */
};

struct ledger;

/* Open or create the database at path, with its schema. Errors name the file. */
int ledger_open(struct ledger **out, const char *path, char *err, size_t errlen);
void ledger_close(struct ledger *l);        /* NULL is fine; commits nothing */
/* Why the last call failed: SQLite's message, else the text of code. */
const char *ledger_errmsg(const struct ledger *l, int code);
const char *ledger_path(const struct ledger *l);

/* Writes go into one open transaction, begun on the first write; ledger_commit makes
 * everything since durable (fsync'd WAL). Callers commit once per event batch. */
int ledger_commit(struct ledger *l, char *err, size_t errlen);
int ledger_dirty(const struct ledger *l);

int ledger_meta_get(struct ledger *l, const char *key, char *val, size_t cap);   /* 1 found, 0 absent, <0 */
int ledger_meta_set(struct ledger *l, const char *key, const char *val);
int ledger_meta_get_u64(struct ledger *l, const char *key, uint64_t *val);     /* 1 found, 0 absent, <0 */
int ledger_meta_set_u64(struct ledger *l, const char *key, uint64_t val);

int ledger_batch_insert(struct ledger *l, const struct ledger_batch *b);
int ledger_batch_update(struct ledger *l, const struct ledger_batch *b);
/* Call fn for every batch, in id order; a non-zero return stops and is returned. */
int ledger_batch_foreach(struct ledger *l, int (*fn)(void *ctx, const struct ledger_batch *b), void *ctx);

/* Training log: one row per TRAINED report; rolled_back marks steps discarded by a group restart. */
int ledger_train_add(struct ledger *l, uint64_t batch, uint64_t gen, uint64_t step, uint32_t rank, int rolled_back);
/* A copy of batch (lease number `lease`) was taken from the ring before its PUBLISHED arrived, and
 * that training does not count: the batch is queued again once the PUBLISHED comes, also after a
 * restart in between. ledger_untrained_has: 1 recorded, 0 not, <0 error. */
int ledger_untrained_add(struct ledger *l, uint64_t batch, uint32_t lease);
int ledger_untrained_has(struct ledger *l, uint64_t batch, uint32_t lease);
/* Mark the log rows of generation gen with step > after_step rolled back. */
int ledger_train_rollback(struct ledger *l, uint64_t gen, int64_t after_step);

/* Mark every log row with step > after_step rolled back, in any generation (a fall back of the
 * lineage to the checkpoint of that step). */
int ledger_train_rollback_after(struct ledger *l, int64_t after_step);

int ledger_checkpoint_add(struct ledger *l, uint64_t gen, uint64_t step, const char *dir);
/* The lineage falls back to the checkpoint of step after_step: every checkpoint after it is
 * dropped, with why (the first reason stays). */
int ledger_checkpoint_drop(struct ledger *l, int64_t after_step, const char *why);
struct ledger_checkpoint {
    uint64_t gen, step;
    char dir[256];
};
/* Call fn for each of the newest `limit` checkpoints, newest first (dropped: NULL in the lineage,
 * else why not); a non-zero return stops and is returned. */
int ledger_checkpoint_foreach(struct ledger *l, uint32_t limit,
                              int (*fn)(void *ctx, const struct ledger_checkpoint *c, uint64_t ms, const char *dropped),
                              void *ctx);
/* The newest checkpoint not dropped before step: 1 found, 0 none, <0 error. */
int ledger_checkpoint_before(struct ledger *l, uint64_t step, struct ledger_checkpoint *out);
/* Generation bookkeeping: limit = last step of gen kept in the lineage (-1: none). */
int ledger_generation_set(struct ledger *l, uint64_t gen, int64_t limit);
int ledger_generation_foreach(struct ledger *l, int (*fn)(void *ctx, uint64_t gen, int64_t limit), void *ctx);

int ledger_error_add(struct ledger *l, uint64_t wall_ms, const char *role, int device, int pid, int fatal,
                     int code, const char *message);
struct ledger_error {
    uint64_t wall_ms;
    const char *role, *message;     /* valid during the call only */
    int device, pid, fatal, code;
};
/* The run's errors: *n and *n_fatal counted, fn called for the newest `limit`, oldest first
 * (a restarted coordinator shows what was recorded before it). 0, fn's non-zero, or <0. */
int ledger_error_recent(struct ledger *l, uint32_t limit, uint64_t *n, uint64_t *n_fatal,
                        int (*fn)(void *ctx, const struct ledger_error *e), void *ctx);

/* Consistency summary: batches per state, and the exactly-once check: batches whose
 * count of kept (not rolled back) training rows differs from 1 among checkpointed ones. */
struct ledger_audit {
    uint64_t per_state[BATCH_NSTATES];
    uint64_t total;
    uint64_t trained_rows, rolled_back_rows;
    uint64_t checkpointed_not_once;     /* checkpointed batches trained 0 or >1 times in the lineage */
    uint64_t max_leases;
};
int ledger_audit(struct ledger *l, struct ledger_audit *a);
