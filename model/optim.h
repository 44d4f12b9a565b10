/* optim.h: AdamW over one flat fp32 buffer (fp32 master weights, moments), global-norm
 * clipping and the warmup + cosine learning-rate schedule. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A run of the buffer and whether weight decay applies to it. */
struct optim_segment {
    size_t offset, n;
    bool decay;
};

struct optim {
    size_t n;
    float *m;                   /* first moment */
    float *v;                   /* second moment */
    int64_t step;               /* updates applied */
    struct optim_segment *seg;
    int n_seg;
};

/* Moments zeroed, step 0. The segments are copied. */
int optim_init(struct optim *o, size_t n, const struct optim_segment *seg, int n_seg);
void optim_done(struct optim *o);   /* accepts a zeroed or half-built struct */

/* lr at `step` (0-based: the step about to be taken): linear warmup from lr/warmup to lr over
 * `warmup` steps, then cosine from lr down to lr*min_ratio at `total`; total <= warmup: constant. */
double optim_lr(double lr, double min_ratio, int64_t warmup, int64_t total, int64_t step);

/* Sum of squares of g[0..n) in double, in a fixed order (deterministic). */
double optim_sumsq(const float *g, size_t n);
/* g *= s */
void optim_scale(float *g, size_t n, float s);

/* One AdamW update of w with gradient g (bias-corrected moments, decoupled decay
 * w -= lr*wd*w on decay segments). Increments o->step. */
void optim_adamw(struct optim *o, float *w, const float *g, double lr, double beta1, double beta2,
                 double eps, double weight_decay);
