/* drafter_cpu.c: fp32 CPU forward and hand-written backward of the DFlash drafter, with the
 * block attention mask, the objective's chunked LM head + cross entropy, and the scratch arena. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "common/err.h"
#include "model/cpu_ops.h"
#include "model/drafter.h"

int drafter_cpu_scratch_alloc(struct drafter *d);
void drafter_cpu_scratch_free(struct drafter_scratch *ws);
struct obj_block *drafter_cpu_block_buf(struct drafter *d, int32_t **work);

/* Activations of one layer kept for the backward pass (rows: Q block slots, T context tokens). */
struct layer_act {
    float *A, *arinv;               /* input_layernorm(X) [Q,H], 1/rms [Q] */
    float *Qr, *qrinv, *Qp;         /* q_proj out [Q,qd], 1/rms per head, normed + rotated */
    float *Kcr, *kcrinv, *Kcp;      /* context keys [T,kvd]: raw, 1/rms, normed + rotated */
    float *Kbr, *kbrinv, *Kbp;      /* block keys [Q,kvd] */
    float *Vc, *Vb;                 /* values [T,kvd], [Q,kvd] */
    float *O, *lse;                 /* attention out [Q,qd], log-sum-exp [Q,nh] */
    float *H1, *brinv, *Bn;         /* X + attn [Q,H], 1/rms, post_attention_layernorm(H1) */
    float *G, *U;                   /* gate / up [Q,I] */
};

struct drafter_scratch {
    void *mem;
    float *hs;                      /* hidden states as f32 [T, Lc*H] */
    float *cpre, *crinv, *cx;       /* fc(hs) [T,H], 1/rms, hidden_norm(fc(hs)) */
    float **X;                      /* layer inputs [Q,H], L+1 of them */
    struct layer_act *la;
    float *frinv, *fo;              /* final norm */
    int32_t *pos_ctx, *pos_q, *tok_q, *label, *rows, *work;
    float *w;
    uint8_t *hit;
    struct obj_block *blocks;
    float *cos_t, *sin_t;
    int rope_max;
    float *hc, *logits, *dhc;       /* LM head chunk */
    /* backward */
    float *dfo, *dX, *dH1, *dA, *dBn, *tI1, *tI2, *dO, *dQ, *dKb, *dVb, *dKc, *dVc, *dcx, *dcpre;
    float *S, *dP;                  /* attention scores of one (block, head): [bs, T+bs] */
    double *dwacc;                  /* norm weight gradient accumulator [max(H, hd)] */
};

/* ---- arena ---- */

struct carver {
    char *base;                     /* NULL on the sizing pass */
    size_t off;
};

static void *carve(struct carver *c, size_t bytes)
{
    void *p = c->base ? c->base + c->off : NULL;
    c->off += (bytes + 63) & ~(size_t)63;
    return p;
}

static void layout_scratch(struct drafter_scratch *ws, struct carver *c, const struct drafter *d)
{
    const struct drafter_config *k = &d->cfg;
    size_t T = (size_t)d->max_tokens, bs = (size_t)k->block_size, Q = (size_t)d->max_blocks * bs;
    size_t H = (size_t)k->hidden_size, hd = (size_t)k->head_dim, nh = (size_t)k->num_heads;
    size_t nkv = (size_t)k->num_kv_heads, qd = nh * hd, kvd = nkv * hd, FF = (size_t)k->intermediate_size;
    size_t V = (size_t)k->vocab_size, LcH = (size_t)k->n_target_ids * H;
    size_t C = (size_t)d->head_chunk_rows < Q ? (size_t)d->head_chunk_rows : Q;
    size_t F = sizeof(float);
    int L = k->num_layers;

    ws->hs = carve(c, T * LcH * F);
    ws->cpre = carve(c, T * H * F);
    ws->crinv = carve(c, T * F);
    ws->cx = carve(c, T * H * F);
    for (int l = 0; l <= L; l++) {
        float *x = carve(c, Q * H * F);
        if (c->base)
            ws->X[l] = x;
    }
    for (int l = 0; l < L; l++) {
        struct layer_act tmp, *a = c->base ? &ws->la[l] : &tmp;
        a->A = carve(c, Q * H * F);
        a->arinv = carve(c, Q * F);
        a->Qr = carve(c, Q * qd * F);
        a->qrinv = carve(c, Q * nh * F);
        a->Qp = carve(c, Q * qd * F);
        a->Kcr = carve(c, T * kvd * F);
        a->kcrinv = carve(c, T * nkv * F);
        a->Kcp = carve(c, T * kvd * F);
        a->Kbr = carve(c, Q * kvd * F);
        a->kbrinv = carve(c, Q * nkv * F);
        a->Kbp = carve(c, Q * kvd * F);
        a->Vc = carve(c, T * kvd * F);
        a->Vb = carve(c, Q * kvd * F);
        a->O = carve(c, Q * qd * F);
        a->lse = carve(c, Q * nh * F);
        a->H1 = carve(c, Q * H * F);
        a->brinv = carve(c, Q * F);
        a->Bn = carve(c, Q * H * F);
        a->G = carve(c, Q * FF * F);
        a->U = carve(c, Q * FF * F);
    }
    ws->frinv = carve(c, Q * F);
    ws->fo = carve(c, Q * H * F);
    ws->pos_ctx = carve(c, T * sizeof(int32_t));
    ws->pos_q = carve(c, Q * sizeof(int32_t));
    ws->tok_q = carve(c, Q * sizeof(int32_t));
    ws->label = carve(c, Q * sizeof(int32_t));
    ws->rows = carve(c, Q * sizeof(int32_t));
    ws->work = carve(c, T * sizeof(int32_t));
    ws->w = carve(c, Q * F);
    ws->hit = carve(c, Q);
    ws->blocks = carve(c, (size_t)d->max_blocks * sizeof(struct obj_block));
    ws->rope_max = (int)(T + bs);
    ws->cos_t = carve(c, (T + bs) * (hd / 2) * F);
    ws->sin_t = carve(c, (T + bs) * (hd / 2) * F);
    ws->hc = carve(c, C * H * F);
    ws->logits = carve(c, C * V * F);
    ws->dhc = carve(c, C * H * F);
    ws->dfo = carve(c, Q * H * F);
    ws->dX = carve(c, Q * H * F);
    ws->dH1 = carve(c, Q * H * F);
    ws->dA = carve(c, Q * H * F);
    ws->dBn = carve(c, Q * H * F);
    ws->tI1 = carve(c, Q * FF * F);
    ws->tI2 = carve(c, Q * FF * F);
    ws->dO = carve(c, Q * qd * F);
    ws->dQ = carve(c, Q * qd * F);
    ws->dKb = carve(c, Q * kvd * F);
    ws->dVb = carve(c, Q * kvd * F);
    ws->dKc = carve(c, T * kvd * F);
    ws->dVc = carve(c, T * kvd * F);
    ws->dcx = carve(c, T * H * F);
    ws->dcpre = carve(c, T * H * F);
    ws->S = carve(c, bs * (T + bs) * F);
    ws->dP = carve(c, bs * (T + bs) * F);
    ws->dwacc = carve(c, (H > hd ? H : hd) * sizeof(double));
}

static void rope_tables(struct drafter_scratch *ws, const struct drafter_config *k)
{
    /* As transformers computes them in fp32: inv_freq = 1 / theta^(2i/d), angle = pos * inv_freq. */
    int half = k->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)k->head_dim;
        float inv = 1.0f / powf((float)k->rope_theta, e);
        for (int p = 0; p < ws->rope_max; p++) {
            float ang = (float)p * inv;
            ws->cos_t[(size_t)p * half + i] = (float)cos((double)ang);
            ws->sin_t[(size_t)p * half + i] = (float)sin((double)ang);
        }
    }
}

int drafter_cpu_scratch_alloc(struct drafter *d)
{
    struct drafter_scratch *ws = calloc(1, sizeof *ws);
    if (!ws)
        return -ENOMEM;
    int L = d->cfg.num_layers;
    ws->X = calloc((size_t)L + 1, sizeof *ws->X);
    ws->la = calloc((size_t)L, sizeof *ws->la);
    struct carver c = { NULL, 0 };
    layout_scratch(ws, &c, d);
    ws->mem = c.off ? aligned_alloc(64, c.off) : NULL;
    if (!ws->X || !ws->la || !ws->mem) {
        drafter_cpu_scratch_free(ws);
        return -ENOMEM;
    }
    c = (struct carver){ ws->mem, 0 };
    layout_scratch(ws, &c, d);
    rope_tables(ws, &d->cfg);
    d->ws = ws;
    return 0;
}

void drafter_cpu_scratch_free(struct drafter_scratch *ws)
{
    if (!ws)
        return;
    free(ws->mem);
    free(ws->X);
    free(ws->la);
    free(ws);
}

struct obj_block *drafter_cpu_block_buf(struct drafter *d, int32_t **work)
{
    *work = d->ws->work;
    return d->ws->blocks;
}

/* ---- building blocks ---- */

/* Row-major C[M,N] = alpha * op(A) @ op(B) + beta * C. K == 0 adds nothing: C is zeroed when
 * beta == 0 and left as it is otherwise (BLAS does not take K == 0 everywhere). */
static void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        if (beta == 0.0f)
            for (int i = 0; i < M; i++)
                memset(C + (size_t)i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
/* C[M,N] = alpha * A[M,K] @ B[N,K]^T + beta * C */
#define gemm_nt(...) gemm(CblasNoTrans, CblasTrans, __VA_ARGS__)
/* C[M,N] = alpha * A[M,K] @ B[K,N] + beta * C */
#define gemm_nn(...) gemm(CblasNoTrans, CblasNoTrans, __VA_ARGS__)
/* C[M,N] = alpha * A[K,M]^T @ B[K,N] + beta * C (weight gradients: dW += dY^T @ X) */
#define gemm_tn(...) gemm(CblasTrans, CblasNoTrans, __VA_ARGS__)

/* y = x / rms(x) * w per row (HF Qwen3RMSNorm order); keeps 1/rms for the backward. */
static void rms_fwd(float *y, float *rinv, const float *x, const float *w, size_t rows, int width,
                    float eps)
{
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * width;
        float *yr = y + r * width;
        double ss = 0.0;
        for (int i = 0; i < width; i++)
            ss += (double)xr[i] * xr[i];
        float ri = (float)(1.0 / sqrt(ss / width + eps));
        rinv[r] = ri;
        for (int i = 0; i < width; i++)
            yr[i] = w[i] * (xr[i] * ri);
    }
}

/* dx (= or +=, by acc) from dy of y = w * x * rinv; dw += sum over rows. dx may equal dy when !acc. */
static void rms_bwd(float *dx, const float *dy, const float *x, const float *rinv, const float *w,
                    float *dw, double *dwacc, size_t rows, int width, int acc)
{
    memset(dwacc, 0, (size_t)width * sizeof *dwacc);
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * width, *dyr = dy + r * width;
        float *dxr = dx + r * width;
        float ri = rinv[r];
        double c = 0.0;
        for (int i = 0; i < width; i++) {
            double xhat = (double)xr[i] * ri;
            c += (double)dyr[i] * w[i] * xhat;
            dwacc[i] += (double)dyr[i] * xhat;
        }
        c /= width;
        for (int i = 0; i < width; i++) {
            float xhat = xr[i] * ri;
            float v = ri * (dyr[i] * w[i] - xhat * (float)c);
            dxr[i] = acc ? dxr[i] + v : v;
        }
    }
    for (int i = 0; i < width; i++)
        dw[i] += (float)dwacc[i];
}

/* HF rotate_half RoPE in place on x[rows, nheads*hd]; inverse = the transpose (backward). */
static void rope(float *x, size_t rows, int nheads, int hd, const int32_t *pos, const float *cos_t,
                 const float *sin_t, int inverse)
{
    int half = hd / 2;
    for (size_t r = 0; r < rows; r++) {
        const float *c = cos_t + (size_t)pos[r] * half, *s = sin_t + (size_t)pos[r] * half;
        for (int h = 0; h < nheads; h++) {
            float *v = x + (r * nheads + h) * hd;
            for (int i = 0; i < half; i++) {
                float x1 = v[i], x2 = v[i + half];
                if (!inverse) {
                    v[i] = x1 * c[i] - x2 * s[i];
                    v[i + half] = x2 * c[i] + x1 * s[i];
                } else {
                    v[i] = x1 * c[i] + x2 * s[i];
                    v[i + half] = x2 * c[i] - x1 * s[i];
                }
            }
        }
    }
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ---- attention with the DFlash block mask ----
 * Block b (query rows r0 = b*bs ..) sees context tokens [seq start, anchor) and its own bs slots. */

struct attn_dims {
    int bs, nh, nkv, hd, qd, kvd;
    float scale;
};

static void attn_fwd(const struct attn_dims *a, const struct obj_block *blk, int nb,
                     const int32_t *cu, const struct layer_act *la, float *S)
{
    int grp = a->nh / a->nkv;
    for (int b = 0; b < nb; b++) {
        int s0 = cu[blk[b].seq], nctx = blk[b].anchor - s0, r0 = b * a->bs, ld = nctx + a->bs;
        for (int h = 0; h < a->nh; h++) {
            int g = h / grp;
            const float *q = la->Qp + (size_t)r0 * a->qd + h * a->hd;
            const float *kc = la->Kcp + (size_t)s0 * a->kvd + g * a->hd;
            const float *kb = la->Kbp + (size_t)r0 * a->kvd + g * a->hd;
            const float *vc = la->Vc + (size_t)s0 * a->kvd + g * a->hd;
            const float *vb = la->Vb + (size_t)r0 * a->kvd + g * a->hd;
            float *o = la->O + (size_t)r0 * a->qd + h * a->hd;
            gemm_nt(a->bs, nctx, a->hd, a->scale, q, a->qd, kc, a->kvd, 0.0f, S, ld);
            gemm_nt(a->bs, a->bs, a->hd, a->scale, q, a->qd, kb, a->kvd, 0.0f, S + nctx, ld);
            for (int i = 0; i < a->bs; i++) {
                float *row = S + (size_t)i * ld;
                float mx = row[0];
                for (int j = 1; j < ld; j++)
                    if (row[j] > mx)
                        mx = row[j];
                double sum = 0.0;
                for (int j = 0; j < ld; j++) {
                    float e = expf(row[j] - mx);
                    row[j] = e;
                    sum += e;
                }
                float inv = (float)(1.0 / sum);
                for (int j = 0; j < ld; j++)
                    row[j] *= inv;
                la->lse[(size_t)(r0 + i) * a->nh + h] = mx + (float)log(sum);
            }
            gemm_nn(a->bs, a->hd, nctx, 1.0f, S, ld, vc, a->kvd, 0.0f, o, a->qd);
            gemm_nn(a->bs, a->hd, a->bs, 1.0f, S + nctx, ld, vb, a->kvd, nctx > 0 ? 1.0f : 0.0f, o, a->qd);
        }
    }
}

/* dO -> dQ (rotated space), dKc, dKb, dVc, dVb (all accumulated; zero them first). */
static void attn_bwd(const struct attn_dims *a, const struct obj_block *blk, int nb,
                     const int32_t *cu, const struct layer_act *la, const float *dO, float *dQ,
                     float *dKc, float *dKb, float *dVc, float *dVb, float *S, float *dP)
{
    int grp = a->nh / a->nkv;
    for (int b = 0; b < nb; b++) {
        int s0 = cu[blk[b].seq], nctx = blk[b].anchor - s0, r0 = b * a->bs, ld = nctx + a->bs;
        for (int h = 0; h < a->nh; h++) {
            int g = h / grp;
            const float *q = la->Qp + (size_t)r0 * a->qd + h * a->hd;
            const float *kc = la->Kcp + (size_t)s0 * a->kvd + g * a->hd;
            const float *kb = la->Kbp + (size_t)r0 * a->kvd + g * a->hd;
            const float *vc = la->Vc + (size_t)s0 * a->kvd + g * a->hd;
            const float *vb = la->Vb + (size_t)r0 * a->kvd + g * a->hd;
            const float *o = la->O + (size_t)r0 * a->qd + h * a->hd;
            const float *dOh = dO + (size_t)r0 * a->qd + h * a->hd;
            /* P from the saved log-sum-exp */
            gemm_nt(a->bs, nctx, a->hd, a->scale, q, a->qd, kc, a->kvd, 0.0f, S, ld);
            gemm_nt(a->bs, a->bs, a->hd, a->scale, q, a->qd, kb, a->kvd, 0.0f, S + nctx, ld);
            gemm_nt(a->bs, nctx, a->hd, 1.0f, dOh, a->qd, vc, a->kvd, 0.0f, dP, ld);
            gemm_nt(a->bs, a->bs, a->hd, 1.0f, dOh, a->qd, vb, a->kvd, 0.0f, dP + nctx, ld);
            for (int i = 0; i < a->bs; i++) {
                float lse = la->lse[(size_t)(r0 + i) * a->nh + h];
                const float *oi = o + (size_t)i * a->qd, *gi = dOh + (size_t)i * a->qd;
                double di = 0.0;
                for (int e = 0; e < a->hd; e++)
                    di += (double)oi[e] * gi[e];
                float *ps = S + (size_t)i * ld, *pd = dP + (size_t)i * ld;
                for (int j = 0; j < ld; j++) {
                    float p = expf(ps[j] - lse);
                    ps[j] = p;
                    pd[j] = p * (pd[j] - (float)di);
                }
            }
            float *dq = dQ + (size_t)r0 * a->qd + h * a->hd;
            gemm_nn(a->bs, a->hd, nctx, a->scale, dP, ld, kc, a->kvd, 1.0f, dq, a->qd);
            gemm_nn(a->bs, a->hd, a->bs, a->scale, dP + nctx, ld, kb, a->kvd, 1.0f, dq, a->qd);
            gemm_tn(nctx, a->hd, a->bs, a->scale, dP, ld, q, a->qd, 1.0f,
                    dKc + (size_t)s0 * a->kvd + g * a->hd, a->kvd);
            gemm_tn(a->bs, a->hd, a->bs, a->scale, dP + nctx, ld, q, a->qd, 1.0f,
                    dKb + (size_t)r0 * a->kvd + g * a->hd, a->kvd);
            gemm_tn(nctx, a->hd, a->bs, 1.0f, S, ld, dOh, a->qd, 1.0f,
                    dVc + (size_t)s0 * a->kvd + g * a->hd, a->kvd);
            gemm_tn(a->bs, a->hd, a->bs, 1.0f, S + nctx, ld, dOh, a->qd, 1.0f,
                    dVb + (size_t)r0 * a->kvd + g * a->hd, a->kvd);
        }
    }
}

/* ---- the pass ---- */

struct dims {
    int T, Q, nb, bs, H, nh, nkv, hd, qd, kvd, F, V, LcH, L;
    float eps;
};

static void progress(const struct drafter *d)
{
    if (d->progress)
        d->progress(d->progress_arg);
}

static void layer_fwd(struct drafter *d, const struct dims *z, int l, const struct obj_batch *b,
                      const struct obj_block *blk)
{
    struct drafter_scratch *ws = d->ws;
    struct layer_act *a = &ws->la[l];
    const struct drafter_layer_off *o = &d->layer[l];
    const float *P = d->params;
    const float *X = ws->X[l];
    float *Xn = ws->X[l + 1];
    size_t Q = (size_t)z->Q, T = (size_t)z->T;

    rms_fwd(a->A, a->arinv, X, P + o->input_norm, Q, z->H, z->eps);
    gemm_nt(z->Q, z->qd, z->H, 1.0f, a->A, z->H, P + o->q, z->H, 0.0f, a->Qr, z->qd);
    rms_fwd(a->Qp, a->qrinv, a->Qr, P + o->q_norm, Q * z->nh, z->hd, z->eps);
    rope(a->Qp, Q, z->nh, z->hd, ws->pos_q, ws->cos_t, ws->sin_t, 0);

    gemm_nt(z->T, z->kvd, z->H, 1.0f, ws->cx, z->H, P + o->k, z->H, 0.0f, a->Kcr, z->kvd);
    rms_fwd(a->Kcp, a->kcrinv, a->Kcr, P + o->k_norm, T * z->nkv, z->hd, z->eps);
    rope(a->Kcp, T, z->nkv, z->hd, ws->pos_ctx, ws->cos_t, ws->sin_t, 0);
    gemm_nt(z->Q, z->kvd, z->H, 1.0f, a->A, z->H, P + o->k, z->H, 0.0f, a->Kbr, z->kvd);
    rms_fwd(a->Kbp, a->kbrinv, a->Kbr, P + o->k_norm, Q * z->nkv, z->hd, z->eps);
    rope(a->Kbp, Q, z->nkv, z->hd, ws->pos_q, ws->cos_t, ws->sin_t, 0);
    gemm_nt(z->T, z->kvd, z->H, 1.0f, ws->cx, z->H, P + o->v, z->H, 0.0f, a->Vc, z->kvd);
    gemm_nt(z->Q, z->kvd, z->H, 1.0f, a->A, z->H, P + o->v, z->H, 0.0f, a->Vb, z->kvd);

    struct attn_dims ad = { z->bs, z->nh, z->nkv, z->hd, z->qd, z->kvd, 1.0f / sqrtf((float)z->hd) };
    attn_fwd(&ad, blk, z->nb, b->cu_seqlens, a, ws->S);
    progress(d);

    memcpy(a->H1, X, Q * z->H * sizeof(float));
    gemm_nt(z->Q, z->H, z->qd, 1.0f, a->O, z->qd, P + o->o, z->qd, 1.0f, a->H1, z->H);
    rms_fwd(a->Bn, a->brinv, a->H1, P + o->post_norm, Q, z->H, z->eps);
    gemm_nt(z->Q, z->F, z->H, 1.0f, a->Bn, z->H, P + o->gate, z->H, 0.0f, a->G, z->F);
    gemm_nt(z->Q, z->F, z->H, 1.0f, a->Bn, z->H, P + o->up, z->H, 0.0f, a->U, z->F);
    size_t nI = Q * z->F;
    for (size_t i = 0; i < nI; i++)
        ws->tI1[i] = a->G[i] * sigmoidf(a->G[i]) * a->U[i];
    memcpy(Xn, a->H1, Q * z->H * sizeof(float));
    gemm_nt(z->Q, z->H, z->F, 1.0f, ws->tI1, z->F, P + o->down, z->F, 1.0f, Xn, z->H);
}

/* In: ws->dX = dLoss/dX[l+1]. Out: ws->dX = dLoss/dX[l]; parameter grads and ws->dcx accumulated. */
static void layer_bwd(struct drafter *d, const struct dims *z, int l, const struct obj_batch *b,
                      const struct obj_block *blk)
{
    struct drafter_scratch *ws = d->ws;
    struct layer_act *a = &ws->la[l];
    const struct drafter_layer_off *o = &d->layer[l];
    const float *P = d->params;
    float *G = d->grads;
    size_t Q = (size_t)z->Q, T = (size_t)z->T, nI = Q * z->F;

    /* MLP: X' = H1 + down(silu(gate(Bn)) * up(Bn)) */
    for (size_t i = 0; i < nI; i++)
        ws->tI1[i] = a->G[i] * sigmoidf(a->G[i]) * a->U[i];
    gemm_tn(z->H, z->F, z->Q, 1.0f, ws->dX, z->H, ws->tI1, z->F, 1.0f, G + o->down, z->F);
    gemm_nn(z->Q, z->F, z->H, 1.0f, ws->dX, z->H, P + o->down, z->F, 0.0f, ws->tI1, z->F);
    for (size_t i = 0; i < nI; i++) {
        float g = a->G[i], s = sigmoidf(g), dz = ws->tI1[i];
        ws->tI2[i] = dz * a->U[i] * s * (1.0f + g * (1.0f - s));   /* d gate */
        ws->tI1[i] = dz * g * s;                                  /* d up */
    }
    gemm_tn(z->F, z->H, z->Q, 1.0f, ws->tI2, z->F, a->Bn, z->H, 1.0f, G + o->gate, z->H);
    gemm_tn(z->F, z->H, z->Q, 1.0f, ws->tI1, z->F, a->Bn, z->H, 1.0f, G + o->up, z->H);
    gemm_nn(z->Q, z->H, z->F, 1.0f, ws->tI2, z->F, P + o->gate, z->H, 0.0f, ws->dBn, z->H);
    gemm_nn(z->Q, z->H, z->F, 1.0f, ws->tI1, z->F, P + o->up, z->H, 1.0f, ws->dBn, z->H);
    memcpy(ws->dH1, ws->dX, Q * z->H * sizeof(float));
    rms_bwd(ws->dH1, ws->dBn, a->H1, a->brinv, P + o->post_norm, G + o->post_norm, ws->dwacc, Q,
            z->H, 1);
    progress(d);

    /* attention output projection: H1 = X + O @ Wo^T */
    gemm_tn(z->H, z->qd, z->Q, 1.0f, ws->dH1, z->H, a->O, z->qd, 1.0f, G + o->o, z->qd);
    gemm_nn(z->Q, z->qd, z->H, 1.0f, ws->dH1, z->H, P + o->o, z->qd, 0.0f, ws->dO, z->qd);

    memset(ws->dQ, 0, Q * z->qd * sizeof(float));
    memset(ws->dKb, 0, Q * z->kvd * sizeof(float));
    memset(ws->dVb, 0, Q * z->kvd * sizeof(float));
    memset(ws->dKc, 0, T * z->kvd * sizeof(float));
    memset(ws->dVc, 0, T * z->kvd * sizeof(float));
    struct attn_dims ad = { z->bs, z->nh, z->nkv, z->hd, z->qd, z->kvd, 1.0f / sqrtf((float)z->hd) };
    attn_bwd(&ad, blk, z->nb, b->cu_seqlens, a, ws->dO, ws->dQ, ws->dKc, ws->dKb, ws->dVc, ws->dVb,
             ws->S, ws->dP);
    progress(d);

    rope(ws->dQ, Q, z->nh, z->hd, ws->pos_q, ws->cos_t, ws->sin_t, 1);
    rope(ws->dKc, T, z->nkv, z->hd, ws->pos_ctx, ws->cos_t, ws->sin_t, 1);
    rope(ws->dKb, Q, z->nkv, z->hd, ws->pos_q, ws->cos_t, ws->sin_t, 1);
    rms_bwd(ws->dQ, ws->dQ, a->Qr, a->qrinv, P + o->q_norm, G + o->q_norm, ws->dwacc, Q * z->nh,
            z->hd, 0);
    rms_bwd(ws->dKc, ws->dKc, a->Kcr, a->kcrinv, P + o->k_norm, G + o->k_norm, ws->dwacc,
            T * z->nkv, z->hd, 0);
    rms_bwd(ws->dKb, ws->dKb, a->Kbr, a->kbrinv, P + o->k_norm, G + o->k_norm, ws->dwacc,
            Q * z->nkv, z->hd, 0);

    gemm_tn(z->qd, z->H, z->Q, 1.0f, ws->dQ, z->qd, a->A, z->H, 1.0f, G + o->q, z->H);
    gemm_tn(z->kvd, z->H, z->T, 1.0f, ws->dKc, z->kvd, ws->cx, z->H, 1.0f, G + o->k, z->H);
    gemm_tn(z->kvd, z->H, z->Q, 1.0f, ws->dKb, z->kvd, a->A, z->H, 1.0f, G + o->k, z->H);
    gemm_tn(z->kvd, z->H, z->T, 1.0f, ws->dVc, z->kvd, ws->cx, z->H, 1.0f, G + o->v, z->H);
    gemm_tn(z->kvd, z->H, z->Q, 1.0f, ws->dVb, z->kvd, a->A, z->H, 1.0f, G + o->v, z->H);

    gemm_nn(z->Q, z->H, z->qd, 1.0f, ws->dQ, z->qd, P + o->q, z->H, 0.0f, ws->dA, z->H);
    gemm_nn(z->Q, z->H, z->kvd, 1.0f, ws->dKb, z->kvd, P + o->k, z->H, 1.0f, ws->dA, z->H);
    gemm_nn(z->Q, z->H, z->kvd, 1.0f, ws->dVb, z->kvd, P + o->v, z->H, 1.0f, ws->dA, z->H);
    gemm_nn(z->T, z->H, z->kvd, 1.0f, ws->dKc, z->kvd, P + o->k, z->H, 1.0f, ws->dcx, z->H);
    gemm_nn(z->T, z->H, z->kvd, 1.0f, ws->dVc, z->kvd, P + o->v, z->H, 1.0f, ws->dcx, z->H);

    memcpy(ws->dX, ws->dH1, Q * z->H * sizeof(float));
    rms_bwd(ws->dX, ws->dA, ws->X[l], a->arinv, P + o->input_norm, G + o->input_norm, ws->dwacc, Q,
            z->H, 1);
}

/* LM head + cross entropy over the supervised rows, `head_chunk_rows` at a time: logits of one
 * chunk only, metrics, and (backward) d(final hidden) of those rows. */
static void head_ce(struct drafter *d, const struct dims *z, struct drafter_metrics *m,
                    double *block_loss, int backward)
{
    struct drafter_scratch *ws = d->ws;
    int R = 0;
    double wsum = 0.0;
    for (int r = 0; r < z->Q; r++) {
        ws->hit[r] = 0;
        if (ws->w[r] > 0.0f) {
            ws->rows[R++] = r;
            wsum += ws->w[r];
        }
    }
    m->weight_sum = wsum;
    m->supervised = R;
    if (backward)
        memset(ws->dfo, 0, (size_t)z->Q * z->H * sizeof(float));
    int C = d->head_chunk_rows;
    for (int c0 = 0; c0 < R; c0 += C) {
        int n = R - c0 < C ? R - c0 : C;
        for (int i = 0; i < n; i++)
            memcpy(ws->hc + (size_t)i * z->H, ws->fo + (size_t)ws->rows[c0 + i] * z->H,
                   (size_t)z->H * sizeof(float));
        gemm_nt(n, z->V, z->H, 1.0f, ws->hc, z->H, d->lm_head, z->H, 0.0f, ws->logits, z->V);
        for (int i = 0; i < n; i++) {
            int row = ws->rows[c0 + i], lab = ws->label[row];
            float *lg = ws->logits + (size_t)i * z->V;
            float mx = lg[0];
            int arg = 0;
            for (int j = 1; j < z->V; j++)
                if (lg[j] > mx) {
                    mx = lg[j];
                    arg = j;
                }
            float lab_logit = lg[lab];
            double sum = 0.0;
            for (int j = 0; j < z->V; j++) {
                float e = expf(lg[j] - mx);
                lg[j] = e;
                sum += e;
            }
            double lse = mx + log(sum);
            double wi = ws->w[row];
            double ce = lse - lab_logit;
            m->loss_sum += wi * ce;
            if (block_loss)
                block_loss[row / z->bs] += wi * ce;
            ws->hit[row] = arg == lab;
            m->correct += arg == lab;
            if (backward) {
                /* d(w * CE)/d logits = w * (softmax - onehot) */
                float scale = (float)(wi / sum);
                for (int j = 0; j < z->V; j++)
                    lg[j] *= scale;
                lg[lab] -= (float)wi;
            }
        }
        if (backward) {
            gemm_nn(n, z->H, z->V, 1.0f, ws->logits, z->V, d->lm_head, z->H, 0.0f, ws->dhc, z->H);
            for (int i = 0; i < n; i++)
                memcpy(ws->dfo + (size_t)ws->rows[c0 + i] * z->H, ws->dhc + (size_t)i * z->H,
                       (size_t)z->H * sizeof(float));
        }
        progress(d);
    }
    /* accepted length: the anchor, then the leading run of supervised, correct slots */
    for (int b = 0; b < z->nb; b++) {
        int any = 0, run = 0, alive = 1;
        for (int k = 1; k < z->bs; k++) {
            int r = b * z->bs + k, sup = ws->w[r] > 0.0f;
            any |= sup;
            if (alive && sup && ws->hit[r])
                run++;
            else
                alive = 0;
        }
        if (any) {
            m->accept_blocks += 1;
            m->accept_sum += 1 + run;
        }
    }
}

static int run_pass(struct drafter *d, const struct obj_batch *b, const struct obj_block *blk, int nb,
                    double gamma, struct drafter_metrics *m, double *block_loss, int backward)
{
    const struct drafter_config *k = &d->cfg;
    struct drafter_scratch *ws = d->ws;
    struct drafter_metrics tmp;
    if (!m)
        m = &tmp;
    memset(m, 0, sizeof *m);
    if (b->n_tokens < 1 || b->n_tokens > d->max_tokens || nb < 0 || nb > d->max_blocks ||
        b->n_seqs < 1 || (!b->hidden_bf16 == !b->hidden_f32))
        return -DF_ERANGE;
    int rb = obj_blocks_check(b, blk, nb);
    if (rb < 0)
        return rb;
    struct dims z = {
        .T = b->n_tokens, .nb = nb, .bs = k->block_size, .Q = nb * k->block_size,
        .H = k->hidden_size, .nh = k->num_heads, .nkv = k->num_kv_heads, .hd = k->head_dim,
        .qd = k->num_heads * k->head_dim, .kvd = k->num_kv_heads * k->head_dim,
        .F = k->intermediate_size, .V = k->vocab_size, .LcH = k->n_target_ids * k->hidden_size,
        .L = k->num_layers, .eps = (float)k->rms_norm_eps,
    };
    if (z.T + z.bs > ws->rope_max)
        return -DF_ERANGE;
    m->blocks = nb;
    m->tokens = z.T;
    if (block_loss)
        memset(block_loss, 0, (size_t)nb * sizeof *block_loss);

    /* the target's features, f32 */
    size_t pitch = b->hidden_pitch ? b->hidden_pitch : (size_t)z.LcH;
    const float *hs;
    if (b->hidden_f32 && pitch == (size_t)z.LcH) {
        hs = b->hidden_f32;
    } else {
        for (size_t t = 0; t < (size_t)z.T; t++) {
            float *dst = ws->hs + t * z.LcH;
            if (b->hidden_f32)
                memcpy(dst, b->hidden_f32 + t * pitch, (size_t)z.LcH * sizeof(float));
            else
                for (int j = 0; j < z.LcH; j++)
                    dst[j] = cpu_bf16_to_f32_one(b->hidden_bf16[t * pitch + j]);
        }
        hs = ws->hs;
    }
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->cu_seqlens[s]; t < b->cu_seqlens[s + 1]; t++)
            ws->pos_ctx[t] = t - b->cu_seqlens[s];

    /* context keys/values come from hidden_norm(fc(features)), shared by every layer */
    gemm_nt(z.T, z.H, z.LcH, 1.0f, hs, z.LcH, d->params + d->off_fc, z.LcH, 0.0f, ws->cpre, z.H);
    rms_fwd(ws->cx, ws->crinv, ws->cpre, d->params + d->off_hidden_norm, (size_t)z.T, z.H, z.eps);

    /* blocks: [anchor token, MASK x (bs-1)] at positions anchor..anchor+bs-1 of its sequence */
    for (int i = 0; i < nb; i++) {
        int a = blk[i].anchor, start = b->cu_seqlens[blk[i].seq];
        for (int j = 0; j < z.bs; j++) {
            int r = i * z.bs + j;
            ws->tok_q[r] = j == 0 ? (int32_t)b->tokens[a] : k->mask_token_id;
            ws->pos_q[r] = a - start + j;
        }
        obj_block_targets(b, &blk[i], z.bs, gamma, ws->label + (size_t)i * z.bs, ws->w + (size_t)i * z.bs);
    }
    for (int r = 0; r < z.Q; r++)
        memcpy(ws->X[0] + (size_t)r * z.H, d->embed + (size_t)ws->tok_q[r] * z.H,
               (size_t)z.H * sizeof(float));

    for (int l = 0; l < z.L; l++) {
        layer_fwd(d, &z, l, b, blk);
        progress(d);
    }
    rms_fwd(ws->fo, ws->frinv, ws->X[z.L], d->params + d->off_norm, (size_t)z.Q, z.H, z.eps);
    head_ce(d, &z, m, block_loss, backward);
    if (!backward)
        return 0;

    memset(d->grads, 0, d->n_params * sizeof(float));
    rms_bwd(ws->dX, ws->dfo, ws->X[z.L], ws->frinv, d->params + d->off_norm, d->grads + d->off_norm,
            ws->dwacc, (size_t)z.Q, z.H, 0);
    memset(ws->dcx, 0, (size_t)z.T * z.H * sizeof(float));
    for (int l = z.L - 1; l >= 0; l--) {
        layer_bwd(d, &z, l, b, blk);
        progress(d);
    }
    rms_bwd(ws->dcpre, ws->dcx, ws->cpre, ws->crinv, d->params + d->off_hidden_norm,
            d->grads + d->off_hidden_norm, ws->dwacc, (size_t)z.T, z.H, 0);
    gemm_tn(z.H, z.LcH, z.T, 1.0f, ws->dcpre, z.H, hs, z.LcH, 1.0f, d->grads + d->off_fc, z.LcH);
    return 0;
}

int drafter_forward_backward(struct drafter *d, const struct obj_batch *b,
                             const struct obj_block *blocks, int n_blocks, double gamma,
                             struct drafter_metrics *m)
{
    return run_pass(d, b, blocks, n_blocks, gamma, m, NULL, 1);
}

int drafter_forward(struct drafter *d, const struct obj_batch *b, const struct obj_block *blocks,
                    int n_blocks, double gamma, struct drafter_metrics *m, double *block_loss)
{
    return run_pass(d, b, blocks, n_blocks, gamma, m, block_loss, 0);
}
