/* ckpt_writer.h: drafter checkpoints written by a background thread. The training loop pays for
 * the snapshot only (a copy of the fp32 state, or on CUDA the download into the host twin); the
 * bf16 conversion, the writes, the fsyncs, the rename and the pruning of old checkpoints happen
 * while it trains on. One write at a time: collect the finished one before starting the next. */
#pragma once
#include <stdint.h>
#include "model/checkpoint.h"

struct ckpt_writer;

/* A finished write, handed to the owner's thread by ckpt_writer_collect. */
struct ckpt_result {
    int rc;                     /* 0, or -errno / -DF_E* (err says what) */
    int64_t step;
    uint64_t tag;               /* the group generation the state belongs to (ckpt_save's) */
    char why[32];
    char dir[1024];             /* the checkpoint written (rc == 0) */
    char err[2048];
    double write_ms;            /* in the background, from start to rename + prune */
    int pruned;                 /* older checkpoints removed (keep) */
    int stale;                  /* leftovers of interrupted writes removed */
};

/* keep: step-N directories kept under the root after each write (0 = all), besides the head
 * and those newer (ckpt_prune). */
int ckpt_writer_create(struct ckpt_writer **out, int keep);
/* The step of the checkpoint the lineage stands on, for the prunes from now on (-1 at create:
 * none, nothing goes by age). Any thread. */
void ckpt_writer_set_head(struct ckpt_writer *w, int64_t step);
/* Waits for a write in flight (its result is dropped: collect first to report it). */
void ckpt_writer_free(struct ckpt_writer *w);

/* Allocate (and touch) the copy-mode snapshot for a drafter of n_params now, so that the first
 * checkpoint pauses no longer than the next ones; ckpt_writer_start does it when not done. */
int ckpt_writer_reserve(struct ckpt_writer *w, size_t n_params);

/* Start writing <root>/step-<ts->step> from `d`. copy: the fp32 weights and moments are copied
 * into the writer's own buffers first and `d` may change at once (the CPU backend trains on it);
 * otherwise `d` must stay unchanged until the write is collected (the CUDA backend's host twin,
 * which only a checkpoint or a load touches). Either way `d` itself (config, tensor table) must
 * outlive the write. tag: the generation for ckpt_save and ckpt_prune (0: none); a write a later
 * generation fenced out ends with rc -DF_ESTATE. -EBUSY while a write is not collected yet; -ENOMEM / -errno when the
 * snapshot or the thread cannot be made (nothing is written then). */
int ckpt_writer_start(struct ckpt_writer *w, const char *root, const struct drafter *d, int copy,
                      const struct ckpt_train_state *ts, uint64_t tag, const char *why);

/* 1 and *res when a write has finished (it is then joined), 0 when none is waiting. wait: block
 * until a write in flight finishes. Owner's thread only. */
int ckpt_writer_collect(struct ckpt_writer *w, int wait, struct ckpt_result *res);

/* Debug: every write waits ms before it starts (a window for tests that kill mid-write). */
void ckpt_writer_debug_delay(struct ckpt_writer *w, int ms);

/* A write started and not yet collected. */
int ckpt_writer_busy(const struct ckpt_writer *w);
