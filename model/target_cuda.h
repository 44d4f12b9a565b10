/* target_cuda.h: what the CUDA backend of the target adds to target.h: the double-buffered
 * capture pipeline target-d uses to forward batch k+1 while batch k is DMA'd into a ring slot.
 * target_open with this backend returns -DF_ERANGE, before allocating, when the weights and the
 * buffers for max_tokens tokens (the pipeline's second capture set counted) need more than the
 * GPU's memory less 1 GiB left to the CUDA context (GK_DEVICE_RESERVE_BYTES): the configuration's
 * doing, which a restart would only repeat; -ENODEV for a device index past the visible GPUs. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "model/target.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Pin host memory (e.g. the whole ring mapping) for DMA on the target's device, so copies into
 * it run asynchronously at PCIe speed. bytes and p should be page-aligned. Unregister before
 * unmapping. err names the call and CUDA's reason. */
int target_cuda_host_register(void *p, size_t bytes, char *err, size_t errlen);
int target_cuda_host_unregister(void *p);

/* The pipeline: two capture buffer sets on the GPU; batch k uses set k % 2.
 *  - submit(k): tokens/cu_seqlens go through a pinned staging area into the forward on the
 *    compute stream; before writing set k % 2 the compute stream waits (on the GPU, not the
 *    host) for the event of the copy that last read that set; after the forward, the copy stream
 *    waits for it and issues one cudaMemcpy2DAsync per captured layer into dst at column
 *    offset l*H (row pitch dst_pitch), then records the batch's completion event.
 *  - poll(): runs `done` of every batch whose completion event has fired, in submission order;
 *    never blocks. The caller publishes the ring slot there.
 * No call synchronises the device in the steady state: submit waits on the host only while the
 * GPU has not yet started the batch submitted two calls earlier (its staging area is reused), or
 * when TARGET_PIPE_DEPTH batches are pending (then it completes the oldest).
 * One pipeline per target; it and target_forward share the first buffer set, ordered by events.
 * All calls from one thread. */
#define TARGET_PIPE_DEPTH 8

struct target_pipe;

/* status: 0, or a negative code when the batch failed on the GPU (dst content undefined). */
typedef void (*target_pipe_done_fn)(void *ctx, int status);

int target_pipe_create(struct target_pipe **out, struct target *m, char *err, size_t errlen);
/* Waits for what is pending (callbacks run), then frees. Accepts NULL. */
void target_pipe_free(struct target_pipe *p);

/* Enqueue one packed batch (same argument rules as target_forward). dst: [n_tokens, n_ids*H] bf16
 * rows at dst + t*dst_pitch, host memory registered with target_cuda_host_register (pageable
 * memory works but makes the copy synchronous); dst NULL runs the forward only (benchmarks). 0, -DF_ERANGE / -DF_EFORMAT (bad arguments,
 * nothing enqueued), -DF_ECUDA (sticky: every later call fails too; what this call queued has
 * ended when it returns, so dst may be reused). */
int target_pipe_submit(struct target_pipe *p, const uint32_t *tokens, const int32_t *cu_seqlens, int n_seqs,
                       int n_tokens, void *dst, size_t dst_pitch, target_pipe_done_fn done, void *ctx);
/* Number of batches completed by this call (their callbacks ran), or -DF_ECUDA. */
int target_pipe_poll(struct target_pipe *p);
/* Block until every submitted batch has completed; callbacks run. 0 or -DF_ECUDA. */
int target_pipe_drain(struct target_pipe *p);
int target_pipe_pending(const struct target_pipe *p);
/* 1 when target_pipe_submit would not wait for the GPU (a place in the pipeline is free and the
 * staging area it reuses has been uploaded), else 0; never blocks. After an error: 1 (the submit
 * reports it). A caller with other work polls this instead of blocking in the submit. */
int target_pipe_ready(const struct target_pipe *p);

/* GPU time of the most recent completed batch's forward (ms, from events), or -1. */
double target_pipe_last_forward_ms(const struct target_pipe *p);
/* ... and of its copies into the slot (ms, from the copy stream's events), 0 before any. */
double target_pipe_last_copy_ms(const struct target_pipe *p);

/* Totals over the completed batches: forward time (upload to last kernel) and copy time (the
 * copy stream's D2H, from its start after the forward to its end), from CUDA events. */
struct target_pipe_stats {
    uint64_t batches;
    double forward_ms, copy_ms;
    uint64_t copy_bytes;
};
void target_pipe_get_stats(const struct target_pipe *p, struct target_pipe_stats *st);
/* Debug (target.debug_stall_batch): a kernel that never ends on the forward's stream, so the
 * next batch submitted never completes, as on a hung GPU. 0 or -DF_ECUDA. */
int target_pipe_debug_stall(struct target_pipe *p);

#ifdef __cplusplus
}
#endif
