/* drafter_cuda.h: the CUDA backend of the DFlash drafter: drafter.h's training step (forward,
 * hand-written backward, the objective, AdamW) in bf16 with fp32 accumulation. fp32 master
 * weights, gradients and AdamW moments live in flat device buffers with the CPU layout. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {    /* drafter.h and objective.h are C headers without their own guards */
#endif
#include "model/drafter.h"

struct drafter_cuda;

struct drafter_cuda_opts {
    int device;                 /* CUDA device ordinal */
    int head_chunk_rows;        /* LM head + CE rows per chunk (chunk x V bf16 logits); 0 = 1024 */
    /* Optional: the target's frozen embedding / LM head [V, H] bf16, already on `device` (not
     * owned, kept alive by the caller). NULL: converted from the host drafter's fp32 arrays. */
    const void *embed_bf16;
    const void *lm_head_bf16;
    int attn_impl;              /* enum gk_dflash_impl (gpukern/dflash_attn.h): 0 = auto (tensor cores
                                   for head_dim 64/128), 1 = CUDA-core kernels */
    int profile;                /* time the phases of each pass and step with events (benches) */
};

/* The phases drafter_cuda_profile_take reports (opts.profile): what runs on the stream between
 * one mark and the next. Forward (F_*) and backward (B_*) phases sum over the layers. */
enum drafter_cuda_phase {
    DCP_INPUT,      /* batch metadata and features to the device */
    DCP_FC,         /* fc + hidden_norm of the context, block embeddings */
    DCP_F_CTX_KV,   /* context k/v projection, k norm + RoPE */
    DCP_F_QKV,      /* input norm, block q/k/v projection, q/k norm + RoPE */
    DCP_F_ATTN,     /* attention forward */
    DCP_F_OPROJ,    /* output projection + residual */
    DCP_F_MLP,      /* post norm, gate/up, SwiGLU, down + residual */
    DCP_HEAD,       /* final norm, LM head + cross-entropy (and its input gradient), metrics */
    DCP_B_MLP,      /* MLP backward (recomputes the norm; SwiGLU output kept from the forward) */
    DCP_B_OPROJ,    /* output projection backward */
    DCP_B_ATTN,     /* attention backward */
    DCP_B_QKNORM,   /* back through RoPE and the q/k norms */
    DCP_B_PROJ,     /* q/k/v and context k/v projections backward, input norm backward */
    DCP_B_FC,       /* gradient zeroing, final norm backward; hidden_norm and fc backward */
    DCP_OPT,        /* gradient norm, clipping, AdamW */
    DCP_N
};
const char *drafter_cuda_phase_name(int phase);
/* Waits for the work enqueued since the last call and adds each phase's GPU milliseconds to
 * ms[DCP_N]; -DF_ESTATE without opts.profile. Marks beyond 512 per call are dropped. */
int drafter_cuda_profile_take(struct drafter_cuda *dc, double *ms);

/* A CUDA twin of `host` (its config, tensor layout, parameters, optimizer moments and step are
 * copied; `host` is not kept) for batches of up to max_tokens tokens and max_blocks blocks. All
 * device memory is taken here. Needs hidden_size, intermediate_size % 8 == 0, head_dim in
 * {16, 32, 64, 128, 256}, block_size <= 64 and block_size * (num_heads / num_kv_heads) + 64 <
 * 65536 (the attention kernels), else -DF_EUNSUPPORTED. opts may be NULL (device 0, defaults).
 * -DF_ERANGE when the sizes cannot be: what the drafter takes plus two buffers of max_tokens rows
 * of features (drafter-d's slot feed keeps them beside it) is more than the GPU less 1 GiB left
 * to the CUDA context, the configuration's doing; -ENODEV for a device index past the visible GPUs. -DF_ECUDA / -ENOMEM for a failure that may pass. */
int drafter_cuda_create(struct drafter_cuda **out, const struct drafter *host, int max_tokens,
                        int max_blocks, const struct drafter_cuda_opts *opts, char *err, size_t errlen);
void drafter_cuda_free(struct drafter_cuda *dc);    /* accepts NULL */

/* As drafter_forward_backward / drafter_forward: same batch (host arrays; hidden_bf16 may also
 * be device memory), same blocks, same metrics; gradients of sum(w*CE) into the device gradient
 * buffer (overwritten). Each call waits for its own GPU work before returning the metrics. */
int drafter_cuda_forward_backward(struct drafter_cuda *dc, const struct obj_batch *b,
                                  const struct obj_block *blocks, int n_blocks, double gamma,
                                  struct drafter_metrics *m);
int drafter_cuda_forward(struct drafter_cuda *dc, const struct obj_batch *b,
                         const struct obj_block *blocks, int n_blocks, double gamma,
                         struct drafter_metrics *m, double *block_loss);

/* As drafter_optimizer_step: scale by 1/global_weight_sum, clip by global norm, AdamW; the
 * clipping factor never leaves the device. A non-finite norm changes nothing and returns -DF_ENAN.
 * Waits for the device; -DF_ESTATE while asynchronous steps are in flight. */
int drafter_cuda_optimizer_step(struct drafter_cuda *dc, double global_weight_sum,
                                const struct drafter_train_opts *o, struct drafter_step_info *info);

/* As drafter_train_step (anchors from the key, forward_backward, optimizer step). */
int drafter_cuda_train_step(struct drafter_cuda *dc, const struct obj_batch *b, int num_anchors,
                            double gamma, const struct obj_rng_key *key,
                            const struct drafter_train_opts *o, struct drafter_metrics *m,
                            struct drafter_step_info *info);

/* ---- the data-parallel step without per-step host waits ----
 *
 * 1. drafter_cuda_forward_backward_async(): enqueue the pass on the drafter's stream: gradients of
 *    sum(w*CE) into the gradient buffer, the metric sums into drafter_cuda_metrics_dev()
 *    (DRAFTER_METRICS_N doubles, struct drafter_metrics order). When it returns, the batch's host
 *    arrays may be reused, except hidden_bf16, which may be reused (a ring slot released) once
 *    drafter_cuda_input_event() has completed. The features are copied on a copy stream of the
 *    drafter's own into one of two device buffers, so the copy of the next pass's features runs
 *    while this pass computes; the input event is recorded on that copy stream.
 * 2. the group sums the gradient buffer and the metric vector on the same stream, in one call
 *    (nccl_coll_allreduce_sum); alone it does nothing.
 * 3. drafter_cuda_optimizer_step_async(): scale by 1 / the (summed) weight sum read on the device,
 *    clip, AdamW; a non-finite loss or norm, or no weight at all, leaves the state untouched. The
 *    step's metrics and norm are copied to pinned memory behind an event.
 * 4. drafter_cuda_step_result(): the results of the oldest step not yet read, typically one step
 *    later: 0, -DF_ENAN (not finite: skipped, nothing changed), -DF_ERANGE (nothing supervised:
 *    skipped), -EAGAIN (wait = 0 and not done), -ENOENT (none in flight), -DF_ECUDA. Up to 4
 *    results may be in flight; a fifth optimizer_step_async returns -DF_ESTATE. info->device_ms: the
 *    step's GPU time, from its pass having its input on the device to the results' copy (events).
 * The step count that sets a step's lr and bias correction is kept on the device and advanced by
 * the update itself only when it is applied: a skipped step in flight shifts nothing for the steps
 * enqueued after it (they run as in a run resumed from the state before them). A result's lr and
 * step are the device's.
 */
int drafter_cuda_forward_backward_async(struct drafter_cuda *dc, const struct obj_batch *b,
                                        const struct obj_block *blocks, int n_blocks, double gamma);
/* A step with no pass on this rank (zeros into the group's sums): where its device time starts,
 * before what the caller enqueues for it. A pass's own start (forward_backward_async) or this one
 * replaces any earlier start left without its step. */
int drafter_cuda_mark_start(struct drafter_cuda *dc);
double *drafter_cuda_metrics_dev(struct drafter_cuda *dc);
void *drafter_cuda_input_event(struct drafter_cuda *dc);       /* cudaEvent_t */
int drafter_cuda_optimizer_step_async(struct drafter_cuda *dc, const struct drafter_train_opts *o);
int drafter_cuda_step_result(struct drafter_cuda *dc, int wait, struct drafter_metrics *m,
                             struct drafter_step_info *info);
/* The event of the oldest unread result (cudaEvent_t), or NULL: for a bounded wait such as
 * nccl_coll_wait() before drafter_cuda_step_result(dc, 0, ...). */
void *drafter_cuda_result_event(struct drafter_cuda *dc);

/* The device gradient buffer (n_params floats, drafter.h layout): what the data-parallel group
 * all-reduces between forward_backward and optimizer_step. The stream is a cudaStream_t. */
float *drafter_cuda_grads(struct drafter_cuda *dc, size_t *n_params);
void *drafter_cuda_stream(struct drafter_cuda *dc);
/* Optimizer steps applied, counting those still in flight as applied (exact once every result
 * has been read; the updates themselves use the exact count). */
int64_t drafter_cuda_step_count(const struct drafter_cuda *dc);

/* Copies for tests and checkpoints (they wait for the device). */
int drafter_cuda_download_grads(struct drafter_cuda *dc, float *host);
int drafter_cuda_download_params(struct drafter_cuda *dc, float *host);
/* Parameters, AdamW moments and step into `d` (same config) so ckpt_save can write it; waits for
 * the steps in flight (their results stay readable) so the step count is exact. */
int drafter_cuda_sync_to_host(struct drafter_cuda *dc, struct drafter *d);
/* The reverse, e.g. after ckpt_load into `d`; unread step results are dropped. */
int drafter_cuda_load_from_host(struct drafter_cuda *dc, const struct drafter *d);

#ifdef __cplusplus
}
#endif
