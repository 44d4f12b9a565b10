/* checkpoint.h: drafter checkpoints. A directory SGLang and vLLM load as a DFlash drafter
 * (config.json + model.safetensors, bf16) plus optimizer.bin (fp32 master weights, AdamW moments,
 * training position) beside it. Written to a temp dir, fsync'd, renamed. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "model/drafter.h"

#define CKPT_CONFIG "config.json"
#define CKPT_WEIGHTS "model.safetensors"
#define CKPT_OPTIMIZER "optimizer.bin"

/* Where training stands; with the optimizer state it makes a resumed run continue exactly. */
struct ckpt_train_state {
    int64_t step;               /* optimizer steps done (= the drafter's) */
    uint64_t epoch;             /* the newest epoch of rank 0's batches (ckpt_epoch_seen) */
    uint64_t batch_in_epoch;    /* the group's batches trained since rank 0 first had one of that epoch
                                   (near an epoch's end two epochs' batches are trained side by side:
                                   a count of where the run is, which no resume reads) */
    uint64_t seed;              /* anchor / init seed: anchors are keyed by (seed, epoch, batch, rank) */
    uint64_t samples;           /* sequences trained so far */
    uint64_t tokens;            /* tokens trained so far */
};

/* A batch of `epoch` trained: the position moves to a newer epoch only (a batch of an earlier
 * one, queued again and trained late, does not take it back and start its count over). */
static inline void ckpt_epoch_seen(struct ckpt_train_state *ts, uint64_t epoch)
{
    if (epoch > ts->epoch) {
        ts->epoch = epoch;
        ts->batch_in_epoch = 0;
    }
}

/* Write the checkpoint of `d` as <root>/step-<step, 10 digits>: config.json, model.safetensors,
 * optimizer.bin, each fsync'd in <root>/.tmp-step-...-<pid>, the dir fsync'd, renamed into place
 * (replacing an older one of the same step), <root> fsync'd. out_dir (optional) gets the path.
 * generation: the drafter group generation the state belongs to: when a later one has raised the
 * root's fence (ckpt_fence_raise) it has ended, and the write is dropped (-DF_ESTATE, nothing
 * changed); 0: no fence (tools, tests). */
int ckpt_save(const char *root, const struct drafter *d, const struct ckpt_train_state *ts, uint64_t generation,
              char *out_dir, size_t out_len, char *err, size_t errlen);

/* Every rank of a drafter group generation, before it reads or writes root (after
 * ckpt_claim_root, and once its own write in flight is collected): raise root/CKPT_FENCE_FILE to
 * `generation`. A fence already past it is -DF_ESTATE, never lowered: a later generation formed
 * while the caller joined this one, or the coordinator's ledger went back (err says that). A write or prune of an earlier generation still in flight in
 * some process (its group ended while it wrote) then changes nothing: it would replace a
 * same-step checkpoint of the new lineage or prune its newer ones. Waits for such a write's
 * rename in progress: tick(arg) every 20 ms meanwhile (NULL: a plain blocking wait), a return < 0
 * gives up with that code ("held by a checkpoint write that does not end"). 0, or <0 with err.
 * A new claim of the folder (ckpt_claim_root) removes another run's fence. */
int ckpt_fence_raise(const char *root, uint64_t generation, int (*tick)(void *), void *arg, char *err,
                     size_t errlen);
#define CKPT_FENCE_FILE "generation"

/* Write the three files into an existing directory `dir` (no temp/rename): the building block of
 * ckpt_save, also for exporting weights elsewhere. */
int ckpt_write_files(const char *dir, const struct drafter *d, const struct ckpt_train_state *ts,
                     char *err, size_t errlen);

/* After the checkpoint of step `written` is in place, with keep > 0: remove every step-N
 * directory of root past it but `head` (left by a drafter generation that ended: the group
 * restarted from an earlier checkpoint, so they are in no lineage, and counting them would prune
 * the new one),
 * then of the rest those older than the newest `keep` and older than `head`: the step of the
 * checkpoint the lineage stands on (the newest the coordinator has accepted; a group that ends
 * restarts from it), so head and everything newer stay however many they are (-1: no head yet,
 * nothing goes by age). keep 0: nothing is removed. generation: as ckpt_save's (a later one's
 * fence: nothing is removed). Returns how many were. */
int ckpt_prune(const char *root, int keep, int64_t written, int64_t head, uint64_t generation);

/* Claim root (made if missing) for the run `run_id` before its first checkpoint: its file
 * CKPT_RUN_FILE names the run whose checkpoints it holds, because the prunes and a same-step
 * replacement would remove another run's. Refused with one line (-DF_ELAYOUT), nothing changed:
 * a folder of another run (with or without checkpoints: that run may be running); an unclaimed
 * one holding checkpoints (step-N, or .old-step: one an interrupted replacement set aside),
 * unless the run resumes from one of them (`resume_dir`, "" for none: folders written before
 * roots were claimed). 0 or <0 with err. */
int ckpt_claim_root(const char *root, uint64_t run_id, const char *resume_dir, char *err, size_t errlen);
#define CKPT_RUN_FILE "run-id"
/* The run id in root/CKPT_RUN_FILE: 1 and *id, 0 when there is none, <0 with err. */
int ckpt_read_run_id(const char *root, uint64_t *id, char *err, size_t errlen);

/* Remove the temp dirs of writes that were interrupted (a crash mid-write): every .tmp-step-* /
 * .old-step-* whose lock no writer holds, and a folder claim's written .run-id-* temp file no
 * claimant holds. Returns how many were removed. */
int ckpt_remove_stale(const char *root);

/* Newest complete checkpoint under root (highest step-N holding all three files).
 * Returns 0 and fills dir/step, -ENOENT when there is none. */
int ckpt_latest(const char *root, char *dir, size_t dir_len, int64_t *step);

/* Read <dir>/config.json into *c. Missing / mistyped fields: -DF_EMISSING / -DF_EFORMAT, one line
 * naming the file and field. */
int ckpt_read_config(const char *dir, struct drafter_config *c, char *err, size_t errlen);

/* Is a saved config usable for the drafter `want`? Differences in the target (hidden size,
 * vocabulary, target layers and ids) or in the drafter's shape give -DF_ELAYOUT and one line. */
int ckpt_check_config(const struct drafter_config *saved, const struct drafter_config *want,
                      const char *path, char *err, size_t errlen);

struct ckpt_load_opts {
    bool weights_only_ok;           /* without optimizer.bin: the bf16 weights, a fresh optimizer */
    void (*progress)(void *arg);    /* optional: called between the reads (each tensor, each optimizer
                                       array), so a daemon loading many GB keeps its heartbeat */
    void *progress_arg;
};

/* Load <dir> into `d` (made for the same config): config.json is checked against d->cfg, every
 * tensor of model.safetensors by name and shape. With optimizer.bin (layout hash and checksum
 * checked) the fp32 master weights, moments, step and *ts are restored exactly; without it
 * (o->weights_only_ok) the bf16 weights are loaded, the optimizer starts fresh and *ts is zeroed.
 * o NULL: optimizer.bin required, no progress calls. Everything is verified before `d` is touched,
 * so a refused checkpoint leaves it as it was; the load stages one array of n_params floats (the
 * bf16 weights) and reads optimizer.bin twice (verified a chunk at a time, then read into place).
 * Only a read error or a change to optimizer.bin during that second read leaves `d` half loaded
 * (the error says so). */
int ckpt_load(const char *dir, struct drafter *d, struct ckpt_train_state *ts, const struct ckpt_load_opts *o,
              char *err, size_t errlen);

/* Whether ckpt_load's error `code` for dir says the checkpoint itself is damaged or gone (a bad
 * magic, size, format, checksum or value; a dtype, shape or architecture this build never writes,
 * behind a config.json that matched; a file missing in its folder; its folder missing while
 * the folder above holds other checkpoints, so the storage is there), so that an older checkpoint of the
 * lineage may do. Not: a layout or version of another drafter (a configuration error), a read
 * error or a shortage of memory (a restart may do), a root that holds no checkpoint (storage not
 * mounted). */
int ckpt_damaged(const char *dir, int code);

/* Whether checkpoint folder `dir` sits in `root` (its parent is root, or root's inode: a link
 * counts): 1 yes, 0 no (also when its parent is not there), -errno when it cannot be told (a
 * storage error on root or the parent). */
int ckpt_in_root(const char *root, const char *dir);
