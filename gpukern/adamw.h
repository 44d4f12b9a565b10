/* adamw.h: the optimizer half of a training step on the GPU: global gradient norm (deterministic),
 * clipping coefficient, AdamW on fp32 master weights with a bf16 copy for the forward, and the
 * fp32 -> bf16 cast. Everything stays on the device: no host sync is needed between the calls. */
#pragma once
#include <stddef.h>
#include "gpukern/gk.h"

/* A run of the flat parameter buffer and whether weight decay applies to it. */
typedef struct gk_adamw_seg {
    uint64_t offset, n;
    int32_t decay;
    int32_t pad;
} gk_adamw_seg;

/* Doubles of scratch gk_grad_clip needs. */
#define GK_GRAD_CLIP_WORK 1024

/* out (device, 3 floats): out[0] = norm = sqrt(sum g^2) * scale (the norm of the scaled gradient),
 * out[1] = the factor the step applies to g: scale * (clip > 0 && norm > clip ? clip / (norm + 1e-6)
 * : 1), out[2] = 1 when the norm is finite, else 0. work: GK_GRAD_CLIP_WORK doubles (device). */
GK_API int gk_grad_clip(const float *g, size_t n, float scale, float clip, double *work, float *out,
                        cudaStream_t stream);

/* As gk_grad_clip with the scale 1 / wsum[0] read on the device (e.g. the all-reduced loss weight
 * sum, so no host round trip sits between the all-reduce and the step). out gets 4 floats: out[2]
 * is 0 (no step) also when wsum[0] <= 0 or loss (optional, device) is not finite; out[3] = 1 when
 * wsum[0] > 0, else 0 (nothing supervised). */
GK_API int gk_grad_clip_dev(const float *g, size_t n, const double *wsum, const double *loss, float clip,
                            double *work, float *out, cudaStream_t stream);

/* One AdamW update (torch.optim.AdamW: decoupled decay w *= 1 - lr*wd on decay segments, then
 * w -= step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps), step_size = lr / (1 - beta1^t),
 * inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t)) with gradient g * gscale[1]; nothing at all is changed when
 * gscale[2] == 0 (non-finite norm). seg (device, n_seg, sorted, covering [0, n)). w_bf16 (optional)
 * receives bf16(w). gscale: gk_grad_clip's out. */
GK_API int gk_adamw(float *w, const float *g, float *m, float *v, void *w_bf16, size_t n,
                    const gk_adamw_seg *seg, int n_seg, const float *gscale, float lr, float beta1,
                    float beta2, float eps, float weight_decay, float step_size, float inv_sqrt_bc2,
                    cudaStream_t stream);

/* The learning-rate schedule of gk_adamw_scheduled, model/optim.c's optim_lr: linear warmup from
 * lr / warmup_steps to lr over warmup_steps, then cosine down to lr * min_lr_ratio at total_steps
 * (total_steps <= warmup_steps: constant); with AdamW's constants. */
typedef struct gk_adamw_sched {
    double lr, min_lr_ratio;
    int64_t warmup_steps, total_steps;
    double beta1, beta2, eps, weight_decay;
} gk_adamw_sched;

/* Device memory of gk_adamw_scheduled: the step count, which the caller sets (a resumed
 * optimizer's count) and reads back, and what the last call derived from it. */
typedef struct gk_adamw_count {
    int64_t step;               /* updates applied */
    double lr;                  /* the last call's lr: the schedule at `step` as it found it */
    float step_size, inv_sqrt_bc2, decay, pad;  /* the last call's update constants */
} gk_adamw_count;

/* gk_adamw with the step number t = count->step read on the device: the lr of step t, the bias
 * corrections of update t + 1, computed by a one-thread kernel before the update. count->step
 * advances only where gscale[2] != 0 (the update is applied), so several steps can be enqueued
 * before any is known to be applied and each still uses the exact count. */
GK_API int gk_adamw_scheduled(float *w, const float *g, float *m, float *v, void *w_bf16, size_t n,
                              const gk_adamw_seg *seg, int n_seg, const float *gscale,
                              const gk_adamw_sched *sched, gk_adamw_count *count, cudaStream_t stream);

/* dst[i] = bf16(src[i]) (round to nearest even). */
GK_API int gk_cast_f32_bf16(const float *src, void *dst, size_t n, cudaStream_t stream);
