/* slot_feed.h: the CUDA drafter's input side: READY ring slots copied (H2D on a copy stream) into
 * one of two device buffers while the current step runs; a slot is released once its copy is done. */
#pragma once
#include <stdint.h>
#include "ipc/ring.h"
#include "model/objective.h"

#define FEED_DEPTH 2    /* staged batches (= device buffers) */

/* One staged batch: host copies of the small arrays, the hidden states in a device buffer. */
struct feed_batch {
    struct obj_batch b;         /* tokens / loss_mask / cu_seqlens: host copies; hidden_bf16: device */
    uint64_t batch_id;
    uint32_t lease;             /* the copy's lease number (ring_payload.lease) */
    uint32_t epoch;
    unsigned slot;
    int held;                   /* the slot is still READING by this process */
    int buf;                    /* device buffer index */
};

struct feed;

/* For `ring` on CUDA device `device` (made current): registers the ring mapping for DMA (a failure
 * leaves it pageable: *pinned = 0), a copy stream, two device buffers of one slot's hidden states. */
int feed_create(struct feed **out, struct ring *ring, int device, int *pinned, char *err, size_t errlen);
/* Waits for the copy stream, requeues slots still held, unregisters. NULL is fine. */
void feed_free(struct feed *f);

int feed_count(const struct feed *f);

/* The H2D time of the last slot whose copy was found complete (ms on the copy stream, from its
 * start to its end, not the wait before it for the buffer to be free); 0 before the first. */
double feed_last_copy_ms(const struct feed *f);

/* Claimed READY slot -> staged: copies its header arrays to host memory, enqueues the H2D of its
 * hidden states. Needs feed_count() < FEED_DEPTH. 0, or -DF_ECUDA (the slot is requeued). */
int feed_stage(struct feed *f, unsigned slot);

/* Release every staged slot whose copy has completed; wait: first wait for those copies (a few
 * ms; used where the caller would block on the GPU anyway). Returns how many staged batches were
 * lost because their slot had been reclaimed meanwhile (they are dropped later), or -DF_ECUDA. */
int feed_release_done(struct feed *f, int wait);

/* The oldest staged batch, for the step about to be enqueued: waits for its copy (normally long
 * done), releases its slot. NULL when none is staged; *lost counts the batches this call found
 * lost (their slot was reclaimed) and dropped (those feed_release_done reported are dropped
 * uncounted); *rc < 0 on a CUDA error. Valid until feed_consumed(). */
struct feed_batch *feed_front(struct feed *f, int *lost, int *rc);

/* The step reading the front batch's buffer has been enqueued; input_event (a cudaEvent_t,
 * recorded by the drafter once its copy of the buffer is done) orders the next copy into that
 * buffer after it (NULL: the buffer was not read). Pops the front. 0 or -DF_ECUDA. */
int feed_consumed(struct feed *f, void *input_event);

/* Drop every staged batch (leaving a group): slots still held go back to READY (ring_requeue) so
 * another generation trains them; for each one whose slot was already released, released(batch_id,
 * lease, arg) (may be NULL): only a report makes the coordinator publish it again. */
void feed_drop_all(struct feed *f, void (*released)(uint64_t batch_id, uint32_t lease, void *arg), void *arg);
