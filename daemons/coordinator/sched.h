/* sched.h: the deterministic batch schedule of one epoch: samples shuffled from
 * (seed, epoch), bucketed by length, packed up to a token budget, batch order shuffled. */
#pragma once
#include <stddef.h>
#include <inttypes.h>
#include <stdint.h>

struct sched_params {
    uint64_t seed;
    uint32_t token_budget;      /* tokens per batch, after truncation */
    uint32_t max_seq_len;       /* samples are truncated to this */
    uint32_t bucket_width;      /* tokens per length bucket */
    uint32_t max_seqs;          /* sequences per batch (ring slot capacity) */
};

struct sched_epoch {
    uint32_t epoch;
    uint32_t n_batches;
    uint32_t *first;            /* [n_batches + 1]: batch b = samples[first[b] .. first[b+1]) */
    uint32_t *samples;          /* dataset sample indices, each of length > 0 exactly once */
    uint32_t *tokens;           /* [n_batches]: tokens of batch b after truncation */
};

/* Batch ids are global: epoch in the high half, index in the schedule in the low half. */
static inline uint64_t sched_batch_id(uint32_t epoch, uint32_t index) { return ((uint64_t)epoch << 32) | index; }
static inline uint32_t sched_batch_epoch(uint64_t id) { return (uint32_t)(id >> 32); }
static inline uint32_t sched_batch_index(uint64_t id) { return (uint32_t)id; }
/* A batch id as people see it (dflashctl, logs, errors): "epoch:index". */
#define SCHED_BID "%" PRIu32 ":%" PRIu32
#define SCHED_BARGS(id) sched_batch_epoch(id), sched_batch_index(id)

/* Check parameters against each other (budget >= max_seq_len, ...). */
int sched_check(const struct sched_params *p, char *err, size_t errlen);
/* Build epoch `epoch` over n samples with the given lengths (before truncation); a sample of
 * length 0 is left out (dataset_sched_lengths: one that would train nothing). Same inputs give
 * the same schedule. 0 or <0 (-ENOMEM, -EINVAL with err: none of length > 0). */
int sched_build(const uint32_t *lengths, uint32_t n, const struct sched_params *p, uint32_t epoch,
                struct sched_epoch *out, char *err, size_t errlen);
void sched_epoch_done(struct sched_epoch *e);
/* Fingerprint of everything the schedule depends on (parameters + lengths), so a ledger
 * written for another dataset or setting is recognised. */
uint64_t sched_fingerprint(const uint32_t *lengths, uint32_t n, const struct sched_params *p);
