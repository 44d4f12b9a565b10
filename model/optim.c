/* optim.c: AdamW with fp32 master weights and moments, clipping helpers, LR schedule.
 * Update rule as torch.optim.AdamW (decoupled decay, bias correction in the step size). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "model/optim.h"

int optim_init(struct optim *o, size_t n, const struct optim_segment *seg, int n_seg)
{
    memset(o, 0, sizeof *o);
    o->n = n;
    o->m = calloc(n ? n : 1, sizeof *o->m);
    o->v = calloc(n ? n : 1, sizeof *o->v);
    o->seg = calloc((size_t)(n_seg ? n_seg : 1), sizeof *o->seg);
    if (!o->m || !o->v || !o->seg) {
        optim_done(o);
        return -ENOMEM;
    }
    memcpy(o->seg, seg, (size_t)n_seg * sizeof *seg);
    o->n_seg = n_seg;
    return 0;
}

void optim_done(struct optim *o)
{
    if (!o)
        return;
    free(o->m);
    free(o->v);
    free(o->seg);
    o->m = o->v = NULL;
    o->seg = NULL;
    o->n_seg = 0;
}

double optim_lr(double lr, double min_ratio, int64_t warmup, int64_t total, int64_t step)
{
    if (warmup > 0 && step < warmup)
        return lr * (double)(step + 1) / (double)warmup;
    if (total <= warmup)
        return lr;
    double t = (double)(step - warmup) / (double)(total - warmup);
    if (t > 1.0)
        t = 1.0;
    double min_lr = lr * min_ratio;
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + cos(M_PI * t));
}

double optim_sumsq(const float *g, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * g[i];
    return s;
}

void optim_scale(float *g, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        g[i] *= s;
}

void optim_adamw(struct optim *o, float *w, const float *g, double lr, double beta1, double beta2,
                 double eps, double weight_decay)
{
    o->step++;
    double bc1 = 1.0 - pow(beta1, (double)o->step);
    double bc2 = 1.0 - pow(beta2, (double)o->step);
    float b1 = (float)beta1, b2 = (float)beta2;
    float step_size = (float)(lr / bc1);
    float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    float feps = (float)eps;
    for (int s = 0; s < o->n_seg; s++) {
        size_t a = o->seg[s].offset, e = a + o->seg[s].n;
        float decay = o->seg[s].decay ? (float)(1.0 - lr * weight_decay) : 1.0f;
        for (size_t i = a; i < e; i++) {
            float gi = g[i];
            float m = b1 * o->m[i] + (1.0f - b1) * gi;
            float v = b2 * o->v[i] + (1.0f - b2) * gi * gi;
            o->m[i] = m;
            o->v[i] = v;
            float wi = w[i] * decay;
            w[i] = wi - step_size * m / (sqrtf(v) * inv_sqrt_bc2 + feps);
        }
    }
}
