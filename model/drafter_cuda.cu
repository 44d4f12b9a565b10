/* drafter_cuda.cu: the drafter's training step on one GPU: bf16 activations and weight copies,
 * fp32 master weights / gradients / moments, gpukern kernels and cuBLAS GEMMs on one compute
 * stream; the features go to the device on a copy stream, into one of two buffers, so the next
 * batch's copy overlaps the current pass. The pass mirrors drafter_cpu.c; q/k/v and gate/up are
 * adjacent in the parameter layout, so each is one GEMM (and one weight-gradient GEMM) here. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "common/err.h"
#include "gpukern/adamw.h"
#include "gpukern/cuda_check.h"
#include "gpukern/dflash_attn.h"
#include "gpukern/embed.h"
#include "gpukern/gemm.h"
#include "gpukern/gemmx.h"
#include "gpukern/lmhead_ce.h"
#include "gpukern/norm_bwd.h"
#include "gpukern/rmsnorm.h"
#include "gpukern/rope.h"
#include "gpukern/swiglu.h"
#include "gpukern/swiglu_bwd.h"
#include "model/drafter_cuda.h"
extern "C" {
#include "model/optim.h"
}

typedef uint16_t bf16_t;

#define STAGE_BYTES ((size_t)8 << 20)   /* pinned staging for fp32 -> bf16 feature conversion */
#define RES_DEPTH 4                     /* optimizer-step results in flight before one must be read */
#define PROF_MARKS 512                  /* profile marks between two drafter_cuda_profile_take */
#define DCP_IDLE DCP_N                  /* a mark that ends a phase and starts none */

static_assert(sizeof(struct drafter_metrics) == DRAFTER_METRICS_N * sizeof(double),
              "drafter_metrics is the all-reduced vector of doubles");

/* Activations of one layer kept for the backward (Q block rows, T context rows). */
struct cu_layer_act {
    bf16_t *qkv;        /* [Q, qd + 2kvd]: q, k, v projections before norm/rope */
    bf16_t *qp, *kbp;   /* normed + rotated block queries [Q, qd] and keys [Q, kvd] */
    bf16_t *kvc;        /* [T, 2kvd]: context k, v projections */
    bf16_t *kcp;        /* normed + rotated context keys [T, kvd] */
    bf16_t *o;          /* attention output [Q, qd] */
    float *lse;         /* [Q, nh] */
    bf16_t *h1;         /* X + attention [Q, H] */
    bf16_t *gu;         /* [Q, 2I] gate | up */
    bf16_t *z;          /* [Q, I] silu(gate) * up: kept rather than recomputed in the backward */
};

/* What the host builds per batch; one pinned region mirrored on the device, one H2D copy. */
struct cu_meta {
    double *mbase;      /* [DRAFTER_METRICS_N]: the metrics the host knows (weight sum, counts) */
    int32_t *cu, *tok_q, *pos_q, *label, *rows, *qlist;
    float *w;
    gk_dflash_block *blk;
    gk_dflash_ktile *tiles;
};

struct drafter_cuda {
    struct drafter_config cfg;
    int n_tensors, L;
    struct drafter_tensor *tensors;
    struct drafter_layer_off *layer;
    size_t off_fc, off_hidden_norm, off_norm, n_params;
    int max_tokens, max_blocks, max_tiles, chunk_rows;
    int H, nh, nkv, hd, qd, kvd, qkvd, I, V, LcH, bs;
    float eps;

    int device, attn_impl;
    cudaStream_t stream;        /* compute */
    cudaStream_t copy;          /* the features' copies into hs[] */
    gk_gemm *gemm;
    gk_gemmx *gx;

    void *state_mem;            /* params | grads | m | v (fp32), then the bf16 weight copy */
    float *params, *grads, *m, *v;
    bf16_t *wb;
    gk_adamw_seg *segs;
    int n_seg;
    bf16_t *embed, *lm_head;
    void *frozen_mem;           /* owned copy of embed / lm_head, or NULL */
    float *inv_freq;

    void *act_mem;              /* activations and backward scratch */
    bf16_t *hs[2], *cpre, *cx, **X, *fo, *nrm, *z, *dgu, *dxb, *dh1b, *dout, *dqkvb, *dkvc, *dcpre;
    float *row_loss, *dx, *dh1, *tmp_h, *delta, *dqf, *dkbf, *dkcf, *dcx;
    float *norm_ws;             /* the norm backwards' partial sums (one stream: shared) */
    uint8_t *hit;
    struct cu_layer_act *la;
    void *head_work;
    int32_t *pos_ctx;
    double *d_metrics, *d_block_loss, *norm_work;
    float *d_clip;
    gk_adamw_count *d_count;    /* the optimizer's step count: advanced by the update kernels when applied */

    void *meta_dev, *meta_host;
    struct cu_meta md, mh;      /* device / host views of the region */
    double *h_metrics, *h_block_loss;
    float *h_clip;
    gk_adamw_count *h_count;    /* pinned: d_count after a synchronous step */
    uint16_t *stage;            /* pinned */
    double *d_mvec;             /* [DRAFTER_METRICS_N] metric sums of the last pass (all-reduced in place) */

    /* results of asynchronous optimizer steps: pinned copies behind events, read a step later */
    struct cu_result { double metrics[DRAFTER_METRICS_N]; float clip[4]; gk_adamw_count count; } *h_res;
    struct {
        int state;              /* RES_EMPTY, RES_PENDING (event not yet seen), RES_DONE (retired, unread) */
        uint64_t seq;
        int rc;                 /* 0, -DF_ENAN (skipped, non-finite), -DF_ERANGE (nothing supervised) */
        int start;              /* its ev_start: the step's device time is from there to ev_res */
    } res[RES_DEPTH];
    cudaEvent_t ev_res[RES_DEPTH], ev_meta;
    /* The compute stream reaching a training pass, its input on the device: one per result in
     * flight and one for the pass enqueued before its optimizer step. */
    cudaEvent_t ev_start[RES_DEPTH + 1];
    int start_next, start_pending;      /* the next ev_start to record; the unpaired one, or -1 */
    cudaEvent_t ev_input;       /* copy stream: the features of the last pass are on the device (its
                                   source has been read); the compute stream waits for it */
    cudaEvent_t ev_hs_free[2];  /* compute stream: the last pass that read hs[i] is done with it */
    int hs_next;                /* the buffer the next pass's features go to */
    uint64_t res_next, res_read;    /* sequence numbers: next to enqueue, next to read */
    int n_pending;

    int profile, prof_n;        /* opts.profile; marks recorded since the last take */
    cudaEvent_t *prof_ev;       /* [PROF_MARKS] when profiling */
    uint8_t prof_phase[PROF_MARKS];     /* the phase each mark starts (DCP_IDLE: none) */

    struct grad_range { size_t off, n; } *norm_ranges;  /* the norms' gradients, adjacent ones merged */
    int n_norm_ranges;

    struct obj_block *sample_blocks;    /* host scratch of train_step */
    int32_t *sample_work;
    int64_t applied;            /* optimizer steps known to be applied: d_count's step as of the last
                                   result read (the device's count is the one the updates use) */
};

enum { RES_EMPTY = 0, RES_PENDING, RES_DONE };

#define TRY(x) do { int r_ = (x); if (r_ < 0) return r_; } while (0)
#define CU(x) do { if ((x) != cudaSuccess) return -DF_ECUDA; } while (0)

/* ---- arenas ---- */

struct carver {
    char *base;                 /* NULL on the sizing pass */
    size_t off;
};

static void *carve(struct carver *c, size_t bytes)
{
    void *p = c->base ? c->base + c->off : NULL;
    c->off += (bytes + 255) & ~(size_t)255;
    return p;
}

#define CARVE(c, ptr, n) ((ptr) = (decltype(ptr))carve((c), (size_t)(n) * sizeof(*(ptr))))

static void layout_acts(struct drafter_cuda *dc, struct carver *c)
{
    size_t T = (size_t)dc->max_tokens, Q = (size_t)dc->max_blocks * dc->bs, H = dc->H;
    size_t qd = dc->qd, kvd = dc->kvd, qkvd = dc->qkvd, I = dc->I, nh = dc->nh;
    for (int i = 0; i < 2; i++)
        dc->hs[i] = (bf16_t *)carve(c, T * dc->LcH * sizeof(bf16_t));
    CARVE(c, dc->cpre, T * H);
    CARVE(c, dc->cx, T * H);
    for (int l = 0; l <= dc->L; l++) {
        bf16_t *x;
        CARVE(c, x, Q * H);
        if (c->base) dc->X[l] = x;
    }
    for (int l = 0; l < dc->L; l++) {
        struct cu_layer_act tmp, *a = c->base ? &dc->la[l] : &tmp;
        CARVE(c, a->qkv, Q * qkvd);
        CARVE(c, a->qp, Q * qd);
        CARVE(c, a->kbp, Q * kvd);
        CARVE(c, a->kvc, T * 2 * kvd);
        CARVE(c, a->kcp, T * kvd);
        CARVE(c, a->o, Q * qd);
        CARVE(c, a->lse, Q * nh);
        CARVE(c, a->h1, Q * H);
        CARVE(c, a->gu, Q * 2 * I);
        CARVE(c, a->z, Q * I);
    }
    CARVE(c, dc->fo, Q * H);
    CARVE(c, dc->nrm, Q * H);
    CARVE(c, dc->z, Q * I);            /* dZ in the backward */
    CARVE(c, dc->dgu, Q * 2 * I);
    CARVE(c, dc->dxb, Q * H);
    CARVE(c, dc->dh1b, Q * H);
    CARVE(c, dc->dout, Q * qd);
    CARVE(c, dc->dqkvb, Q * qkvd);
    CARVE(c, dc->dkvc, T * 2 * kvd);
    CARVE(c, dc->dcpre, T * H);
    CARVE(c, dc->row_loss, Q);
    CARVE(c, dc->hit, Q);
    CARVE(c, dc->dx, Q * H);
    CARVE(c, dc->dh1, Q * H);
    CARVE(c, dc->tmp_h, Q * H);
    CARVE(c, dc->delta, Q * nh);
    CARVE(c, dc->dqf, Q * qd);
    CARVE(c, dc->dkbf, Q * kvd);
    CARVE(c, dc->dkcf, T * kvd);
    CARVE(c, dc->dcx, T * H);
    CARVE(c, dc->pos_ctx, T);
    CARVE(c, dc->d_metrics, 4);
    CARVE(c, dc->d_mvec, DRAFTER_METRICS_N);
    CARVE(c, dc->d_block_loss, dc->max_blocks);
    CARVE(c, dc->norm_work, GK_GRAD_CLIP_WORK);
    dc->norm_ws = (float *)carve(c, gk_norm_bwd_ws_bytes(dc->H > dc->hd ? dc->H : dc->hd));
    CARVE(c, dc->d_clip, 4);
    CARVE(c, dc->d_count, 1);
    CARVE(c, dc->inv_freq, dc->hd / 2);
    CARVE(c, dc->segs, dc->n_seg);
    dc->head_work = carve(c, gk_lmhead_ce_work_bytes(dc->chunk_rows, dc->H, dc->V));
}

static void layout_meta(struct cu_meta *m, struct carver *c, size_t n_cu, size_t Q, size_t B, size_t n_tiles);

/* The pinned host region: the metadata mirror, then metrics and the feature staging area. */
static void layout_host(struct drafter_cuda *dc, struct carver *c)
{
    layout_meta(&dc->mh, c, (size_t)dc->max_tokens + 1, (size_t)dc->max_blocks * dc->bs, dc->max_blocks,
                dc->max_tiles);
    CARVE(c, dc->h_metrics, DRAFTER_METRICS_N);
    CARVE(c, dc->h_clip, 4);
    CARVE(c, dc->h_count, 1);
    CARVE(c, dc->h_res, RES_DEPTH);
    CARVE(c, dc->h_block_loss, dc->max_blocks);
    CARVE(c, dc->stage, STAGE_BYTES / 2);
}

/* The batch metadata, sized for a pass's counts: packed, so one copy of the used bytes moves it
 * (the tiles last: their count is known only once they are planned). With the largest counts it
 * sizes the region; each pass lays its own counts out over the same region on both sides. */
static void layout_meta(struct cu_meta *m, struct carver *c, size_t n_cu, size_t Q, size_t B, size_t n_tiles)
{
    CARVE(c, m->mbase, DRAFTER_METRICS_N);
    CARVE(c, m->cu, n_cu);
    CARVE(c, m->tok_q, Q);
    CARVE(c, m->pos_q, Q);
    CARVE(c, m->label, Q);
    CARVE(c, m->rows, Q);
    CARVE(c, m->w, Q);
    CARVE(c, m->blk, B);
    CARVE(c, m->qlist, B);
    CARVE(c, m->tiles, n_tiles);
}

/* ---- create / free ---- */

/* What the drafter will take on the device (its state, the frozen embedding / LM head it owns, the
 * activation arena, the batch metadata, the GEMM workspace) and the two buffers of one batch's
 * features that drafter-d's slot feed keeps beside it, against the GPU's whole memory less the
 * context's allowance (gk_device_usable_bytes): more than that is the configuration's doing
 * (-DF_ERANGE), which no restart mends; a shortfall of free memory only (another process) stays
 * -DF_ECUDA at the allocation. */
static int check_fits(const struct drafter_cuda *dc, size_t state, size_t frozen, size_t acts, size_t meta,
                      char *err, size_t errlen)
{
    const size_t feed = 2 * (size_t)dc->max_tokens * dc->LcH * 2;
    const size_t need = state + frozen + acts + meta + GK_GEMM_WORKSPACE_DEFAULT + feed;
    const size_t total_b = gk_device_usable_bytes();
    if (!total_b || need <= total_b)
        return 0;       /* (unknown: the allocations tell) */
    const double gib = 1073741824.0;
    return df_fail(err, errlen, -DF_ERANGE,
                   "drafter_cuda: %d tokens and %d blocks of %d need %.1f GiB on the GPU (activations %.1f, "
                   "parameters, gradients and moments %.1f, embedding and LM head %.1f, the feed's two batches of "
                   "features %.1f, metadata and GEMM workspace %.1f), more than its %.1f GiB beside the CUDA context: "
                   "lower ring.max_tokens (or ring.max_seqs x drafter.num_anchors, the blocks of a step)", dc->max_tokens, dc->max_blocks,
                   dc->bs, need / gib, acts / gib, state / gib, frozen / gib, feed / gib,
                   (meta + GK_GEMM_WORKSPACE_DEFAULT) / gib, total_b / gib);
}

extern "C" void drafter_cuda_free(struct drafter_cuda *dc)
{
    if (!dc)
        return;
    if (dc->stream || dc->copy)
        cudaSetDevice(dc->device);
    if (dc->copy)
        cudaStreamSynchronize(dc->copy);
    if (dc->stream)
        cudaStreamSynchronize(dc->stream);
    gk_gemm_free(dc->gemm);
    gk_gemmx_free(dc->gx);
    if (dc->state_mem) cudaFree(dc->state_mem);
    if (dc->frozen_mem) cudaFree(dc->frozen_mem);
    if (dc->act_mem) cudaFree(dc->act_mem);
    if (dc->meta_dev) cudaFree(dc->meta_dev);
    if (dc->meta_host) cudaFreeHost(dc->meta_host);
    for (int i = 0; i < RES_DEPTH; i++)
        if (dc->ev_res[i]) cudaEventDestroy(dc->ev_res[i]);
    for (int i = 0; i < RES_DEPTH + 1; i++)
        if (dc->ev_start[i]) cudaEventDestroy(dc->ev_start[i]);
    if (dc->ev_meta) cudaEventDestroy(dc->ev_meta);
    if (dc->ev_input) cudaEventDestroy(dc->ev_input);
    for (int i = 0; i < 2; i++)
        if (dc->ev_hs_free[i]) cudaEventDestroy(dc->ev_hs_free[i]);
    for (int i = 0; dc->prof_ev && i < PROF_MARKS; i++)
        if (dc->prof_ev[i]) cudaEventDestroy(dc->prof_ev[i]);
    free(dc->prof_ev);
    if (dc->stream) cudaStreamDestroy(dc->stream);
    if (dc->copy) cudaStreamDestroy(dc->copy);
    free(dc->tensors);
    free(dc->layer);
    free(dc->X);
    free(dc->la);
    free(dc->sample_blocks);
    free(dc->sample_work);
    free(dc->norm_ranges);
    free(dc);
}

static bool same_layout(const struct drafter_cuda *dc, const struct drafter *d)
{
    if (d->n_params != dc->n_params || d->n_tensors != dc->n_tensors)
        return false;
    for (int i = 0; i < d->n_tensors; i++)
        if (d->tensors[i].offset != dc->tensors[i].offset || d->tensors[i].numel != dc->tensors[i].numel)
            return false;
    return true;
}

/* fp32 host array -> bf16 device array, through a temporary host buffer. */
static int upload_bf16(bf16_t *dst, const float *src, size_t n)
{
    const size_t chunk = (size_t)1 << 22;
    uint16_t *tmp = (uint16_t *)malloc((n < chunk ? n : chunk) * 2 + 2);
    if (!tmp)
        return -ENOMEM;
    for (size_t i = 0; i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        for (size_t j = 0; j < k; j++)
            tmp[j] = gk_f32_to_bf16(src[i + j]);
        if (cudaMemcpy(dst + i, tmp, k * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
            free(tmp);
            return -DF_ECUDA;
        }
    }
    free(tmp);
    return 0;
}

/* Everything enqueued on both streams is done. */
static int sync_streams(struct drafter_cuda *dc)
{
    CU(cudaSetDevice(dc->device));
    CU(cudaStreamSynchronize(dc->copy));
    CU(cudaStreamSynchronize(dc->stream));
    return 0;
}

extern "C" int drafter_cuda_load_from_host(struct drafter_cuda *dc, const struct drafter *d)
{
    if (!same_layout(dc, d))
        return -DF_ELAYOUT;
    size_t bytes = dc->n_params * sizeof(float);
    TRY(sync_streams(dc));
    /* results of steps taken from the old state no longer describe this one */
    for (int i = 0; i < RES_DEPTH; i++)
        dc->res[i].state = RES_EMPTY;
    dc->res_read = dc->res_next;
    dc->n_pending = 0;
    dc->start_pending = -1;
    CU(cudaMemcpy(dc->params, d->params, bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dc->m, d->opt->m, bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dc->v, d->opt->v, bytes, cudaMemcpyHostToDevice));
    TRY(gk_cast_f32_bf16(dc->params, dc->wb, dc->n_params, dc->stream));
    gk_adamw_count count;
    memset(&count, 0, sizeof count);
    count.step = d->opt->step;
    CU(cudaMemcpy(dc->d_count, &count, sizeof count, cudaMemcpyHostToDevice));
    /* A copy from pageable memory may return before its DMA lands, and nothing orders it with
     * the non-blocking streams the steps run on (v, the count; at create the segments and rope
     * table): all settled before the first step. */
    CU(cudaDeviceSynchronize());
    dc->applied = d->opt->step;
    return 0;
}

extern "C" int drafter_cuda_create(struct drafter_cuda **out, const struct drafter *host, int max_tokens,
                                   int max_blocks, const struct drafter_cuda_opts *opts, char *err,
                                   size_t errlen)
{
    *out = NULL;
    const struct drafter_config *k = &host->cfg;
    struct drafter_cuda_opts def;
    memset(&def, 0, sizeof def);
    if (!opts)
        opts = &def;
    int hd = k->head_dim;
    if (k->hidden_size % 8 || k->hidden_size > 16384 || k->intermediate_size % 8 ||
        (hd != 16 && hd != 32 && hd != 64 && hd != 128 && hd != 256) || k->block_size > GK_DFLASH_KEY_TILE)
        return df_fail(err, errlen, -DF_EUNSUPPORTED,
                    "drafter_cuda: hidden_size %d (<= 16384) and intermediate_size %d must be multiples of 8, "
                    "head_dim %d one of 16/32/64/128/256, block_size %d <= %d", k->hidden_size,
                    k->intermediate_size, hd, k->block_size, GK_DFLASH_KEY_TILE);
    /* the attention kernels' rows per (block, kv head) and grid (gk_dflash_attn_fwd's limits): here,
     * not as -EINVAL from inside the first step */
    const int nkv = k->num_kv_heads, grp = nkv > 0 ? k->num_heads / nkv : 0;
    const long rows = (long)k->block_size * grp;
    if (nkv < 1 || nkv > 65535 || rows + GK_DFLASH_KEY_TILE >= 65536)
        return df_fail(err, errlen, -DF_EUNSUPPORTED,
                    "drafter_cuda: %d kv heads, block_size %d x %d query heads per kv head = %ld query rows per "
                    "block and kv head: the attention kernels take 1 to 65535 kv heads and at most %d such rows",
                    nkv, k->block_size, grp, rows, 65535 - GK_DFLASH_KEY_TILE);
    if (max_tokens < 2 || max_blocks < 1)
        return df_fail(err, errlen, -DF_ERANGE, "drafter_cuda: max_tokens %d / max_blocks %d too small",
                    max_tokens, max_blocks);
    if ((!opts->embed_bf16 && !host->embed) || (!opts->lm_head_bf16 && !host->lm_head))
        return df_fail(err, errlen, -EINVAL, "drafter_cuda: the target's embedding and LM head are required");
    {
        /* the attention kernels' shared memory: a GPU with less per block fails them at the
         * first step (a restart would only repeat it): said here, as a configuration the GPU
         * cannot run */
        int optin = 0, n_gpus = 0;
        const char *why;
        cudaDeviceProp prop;
        if (!gk_device_missing(opts->device, &n_gpus, &why)) {     /* (one this host lacks: said below) */
            if (cudaSetDevice(opts->device) != cudaSuccess ||
                cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, opts->device) != cudaSuccess ||
                cudaGetDeviceProperties(&prop, opts->device) != cudaSuccess)
                return df_fail(err, errlen, -DF_ECUDA, "drafter_cuda: GPU %d: %s", opts->device,
                               cudaGetErrorString(cudaGetLastError()));
            size_t need = gk_dflash_attn_smem(hd, opts->attn_impl);
            if (need > (size_t)optin)
                return df_fail(err, errlen, -DF_EUNSUPPORTED, "drafter_cuda: GPU %d (%s) offers %d KiB of shared memory "
                               "per block; the drafter's attention kernels at head_dim %d need %zu KiB", opts->device,
                               prop.name, optin / 1024, hd, (need + 1023) / 1024);
        }
    }

    struct drafter_cuda *dc = (struct drafter_cuda *)calloc(1, sizeof *dc);
    if (!dc)
        return -ENOMEM;
    int r = -ENOMEM;
    size_t na, state, VH, frozen;       /* device bytes, found before anything large is allocated */
    bool tied;
    struct carver ca, cm, ch;           /* the arenas' sizing passes */
    dc->cfg = *k;
    dc->L = k->num_layers;
    dc->n_tensors = host->n_tensors;
    dc->n_params = host->n_params;
    dc->off_fc = host->off_fc;
    dc->off_hidden_norm = host->off_hidden_norm;
    dc->off_norm = host->off_norm;
    dc->max_tokens = max_tokens;
    dc->max_blocks = max_blocks;
    dc->max_tiles = gk_dflash_max_tiles(max_tokens, max_blocks);
    dc->chunk_rows = opts->head_chunk_rows > 0 ? opts->head_chunk_rows : 1024;
    dc->H = k->hidden_size;
    dc->nh = k->num_heads;
    dc->nkv = k->num_kv_heads;
    dc->hd = hd;
    dc->qd = dc->nh * hd;
    dc->kvd = dc->nkv * hd;
    dc->qkvd = dc->qd + 2 * dc->kvd;
    dc->I = k->intermediate_size;
    dc->V = k->vocab_size;
    dc->LcH = k->n_target_ids * k->hidden_size;
    dc->bs = k->block_size;
    dc->eps = (float)k->rms_norm_eps;
    dc->device = opts->device;
    dc->attn_impl = opts->attn_impl;
    dc->n_seg = host->n_tensors;
    dc->tensors = (struct drafter_tensor *)malloc((size_t)host->n_tensors * sizeof *dc->tensors);
    dc->layer = (struct drafter_layer_off *)malloc((size_t)dc->L * sizeof *dc->layer);
    dc->X = (bf16_t **)calloc((size_t)dc->L + 1, sizeof *dc->X);
    dc->la = (struct cu_layer_act *)calloc((size_t)dc->L, sizeof *dc->la);
    dc->sample_blocks = (struct obj_block *)malloc((size_t)max_blocks * sizeof *dc->sample_blocks);
    dc->sample_work = (int32_t *)malloc((size_t)max_tokens * sizeof *dc->sample_work);
    if (!dc->tensors || !dc->layer || !dc->X || !dc->la || !dc->sample_blocks || !dc->sample_work)
        goto fail;
    memcpy(dc->tensors, host->tensors, (size_t)host->n_tensors * sizeof *dc->tensors);
    dc->norm_ranges = (struct drafter_cuda::grad_range *)malloc((size_t)host->n_tensors * sizeof *dc->norm_ranges);
    if (!dc->norm_ranges)
        goto fail;
    for (int i = 0; i < host->n_tensors; i++) {
        const struct drafter_tensor *t = &host->tensors[i];
        if (t->ndim != 1)
            continue;       /* matrices: their first weight-gradient GEMM of a backward writes them whole */
        struct drafter_cuda::grad_range *last = dc->n_norm_ranges ? &dc->norm_ranges[dc->n_norm_ranges - 1] : NULL;
        if (last && last->off + last->n == t->offset)
            last->n += t->numel;
        else
            dc->norm_ranges[dc->n_norm_ranges++] = { t->offset, t->numel };
    }
    memcpy(dc->layer, host->layer, (size_t)dc->L * sizeof *dc->layer);
    /* q|k|v and gate|up must be adjacent for the fused GEMMs (drafter.c lays them out so) */
    for (int l = 0; l < dc->L; l++) {
        const struct drafter_layer_off *o = &dc->layer[l];
        size_t H = (size_t)dc->H;
        if (o->k != o->q + (size_t)dc->qd * H || o->v != o->k + (size_t)dc->kvd * H ||
            o->up != o->gate + (size_t)dc->I * H) {
            r = df_fail(err, errlen, -DF_ELAYOUT, "drafter_cuda: layer %d: q/k/v or gate/up not adjacent", l);
            goto fail;
        }
    }

    {
        int n_gpus = 0;
        const char *why;
        if (gk_device_missing(dc->device, &n_gpus, &why)) {
            r = df_fail(err, errlen, -ENODEV, "drafter_cuda: device %d: %d GPU%s visible to this process%s%s "
                        "(drafter-d -i picks the GPU)", dc->device, n_gpus, n_gpus == 1 ? "" : "s", *why ? ": " : "",
                        why);
            goto fail;
        }
    }
    if (cudaSetDevice(dc->device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&dc->stream, cudaStreamNonBlocking) != cudaSuccess) {
        dc->stream = NULL;
        r = df_fail(err, errlen, -DF_ECUDA, "drafter_cuda: device %d: %s", dc->device,
                 cudaGetErrorString(cudaGetLastError()));
        goto fail;
    }
    if (cudaStreamCreateWithFlags(&dc->copy, cudaStreamNonBlocking) != cudaSuccess) {
        dc->copy = NULL;
        r = df_fail(err, errlen, -DF_ECUDA, "drafter_cuda: device %d: copy stream: %s", dc->device,
                 cudaGetErrorString(cudaGetLastError()));
        goto fail;
    }
    if ((r = gk_gemm_create(&dc->gemm, 0, err, errlen)) < 0 || (r = gk_gemmx_create(&dc->gx, err, errlen)) < 0)
        goto fail;
    (void)gk_dflash_attn_has_wgmma();   /* the attention kernels' choice (one GPU round trip): here, not in step 1 */
    {
        bool ok = cudaEventCreateWithFlags(&dc->ev_meta, cudaEventDisableTiming) == cudaSuccess &&
                  cudaEventCreateWithFlags(&dc->ev_input, cudaEventDisableTiming) == cudaSuccess &&
                  cudaEventCreateWithFlags(&dc->ev_hs_free[0], cudaEventDisableTiming) == cudaSuccess &&
                  cudaEventCreateWithFlags(&dc->ev_hs_free[1], cudaEventDisableTiming) == cudaSuccess;
        for (int i = 0; ok && i < RES_DEPTH; i++)     /* timed: a step's device time ends here */
            ok = cudaEventCreate(&dc->ev_res[i]) == cudaSuccess;
        for (int i = 0; ok && i < RES_DEPTH + 1; i++)
            ok = cudaEventCreate(&dc->ev_start[i]) == cudaSuccess;
        dc->start_pending = -1;
        if (ok && opts->profile) {
            dc->profile = 1;
            dc->prof_ev = (cudaEvent_t *)calloc(PROF_MARKS, sizeof *dc->prof_ev);
            if (!dc->prof_ev) {
                r = -ENOMEM;
                goto fail;
            }
            for (int i = 0; ok && i < PROF_MARKS; i++)
                ok = cudaEventCreate(&dc->prof_ev[i]) == cudaSuccess;
        }
        if (!ok)
            goto fail_cuda;
    }

    /* each state array 256-byte aligned: gk_adamw's float4 path needs them equally placed */
    na = (dc->n_params + 63) & ~(size_t)63;
    state = 4 * na * sizeof(float) + na * 2 + 256;
    VH = (size_t)dc->V * dc->H;
    tied = host->embed == host->lm_head;
    frozen = (opts->embed_bf16 ? 0 : VH) + (opts->lm_head_bf16 || (tied && !opts->embed_bf16) ? 0 : VH);
    ca.base = cm.base = ch.base = NULL;
    ca.off = cm.off = ch.off = 0;
    layout_acts(dc, &ca);
    layout_meta(&dc->md, &cm, (size_t)max_tokens + 1, (size_t)max_blocks * dc->bs, max_blocks, dc->max_tiles);
    layout_host(dc, &ch);
    if ((r = check_fits(dc, state, frozen * 2, ca.off, cm.off, err, errlen)) < 0)
        goto fail;
    if (cudaMalloc(&dc->state_mem, state) != cudaSuccess) {
        dc->state_mem = NULL;
        r = df_fail(err, errlen, -DF_ECUDA, "drafter_cuda: cudaMalloc(%zu) for parameters, gradients and moments",
                    state);
        goto fail;
    }
    dc->params = (float *)dc->state_mem;
    dc->grads = dc->params + na;
    dc->m = dc->grads + na;
    dc->v = dc->m + na;
    dc->wb = (bf16_t *)(dc->v + na);
    if (frozen && cudaMalloc(&dc->frozen_mem, frozen * 2) != cudaSuccess) {
        dc->frozen_mem = NULL;
        r = df_fail(err, errlen, -DF_ECUDA, "drafter_cuda: cudaMalloc(%zu) for the embedding / LM head", frozen * 2);
        goto fail;
    }
    {
        bf16_t *p = (bf16_t *)dc->frozen_mem;
        if (opts->embed_bf16) {
            dc->embed = (bf16_t *)opts->embed_bf16;
        } else {
            dc->embed = p;
            p += VH;
            if ((r = upload_bf16(dc->embed, host->embed, VH)) < 0)
                goto fail_cuda;
        }
        if (opts->lm_head_bf16) {
            dc->lm_head = (bf16_t *)opts->lm_head_bf16;
        } else if (tied && !opts->embed_bf16) {
            dc->lm_head = dc->embed;
        } else {
            dc->lm_head = p;
            if ((r = upload_bf16(dc->lm_head, host->lm_head, VH)) < 0)
                goto fail_cuda;
        }
    }
    {
        if (cudaMalloc(&dc->act_mem, ca.off) != cudaSuccess) {
            dc->act_mem = NULL;
            cudaGetLastError();
            size_t free_b = 0, total_b = 0;
            if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
                cudaGetLastError();
            r = df_fail(err, errlen, -DF_ECUDA,
                        "drafter_cuda: the activations for %d tokens and %d blocks of %d need %.1f GiB, the GPU has "
                        "%.1f GiB free of %.1f", max_tokens, max_blocks, dc->cfg.block_size, ca.off / 1073741824.0,
                        free_b / 1073741824.0, total_b / 1073741824.0);
            goto fail;
        }
        struct carver c = { (char *)dc->act_mem, 0 };
        layout_acts(dc, &c);
        if (cudaMalloc(&dc->meta_dev, cm.off) != cudaSuccess) {
            dc->meta_dev = NULL;
            r = df_fail(err, errlen, -DF_ECUDA, "drafter_cuda: cudaMalloc(%zu) for batch metadata", cm.off);
            goto fail;
        }
        if (cudaMallocHost(&dc->meta_host, ch.off) != cudaSuccess) {
            dc->meta_host = NULL;
            r = df_fail(err, errlen, -DF_ECUDA, "drafter_cuda: cudaMallocHost(%zu) for batch staging", ch.off);
            goto fail;
        }
        ch = (struct carver){ (char *)dc->meta_host, 0 };
        layout_host(dc, &ch);
    }
    {
        gk_adamw_seg *seg = (gk_adamw_seg *)calloc((size_t)dc->n_seg, sizeof *seg);
        float *inv = (float *)malloc((size_t)(hd / 2) * sizeof(float));
        if (!seg || !inv) {
            free(seg);
            free(inv);
            r = -ENOMEM;
            goto fail;
        }
        for (int i = 0; i < dc->n_seg; i++)
            seg[i] = gk_adamw_seg{ dc->tensors[i].offset, dc->tensors[i].numel, dc->tensors[i].decay, 0 };
        gk_rope_inv_freq(inv, hd, k->rope_theta, NULL);
        bool ok = cudaMemcpy(dc->segs, seg, (size_t)dc->n_seg * sizeof *seg, cudaMemcpyHostToDevice) == cudaSuccess &&
                  cudaMemcpy(dc->inv_freq, inv, (size_t)(hd / 2) * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess;
        free(seg);
        free(inv);
        if (!ok)
            goto fail_cuda;
    }
    if ((r = drafter_cuda_load_from_host(dc, host)) < 0) {
        if (r != -DF_ECUDA)
            df_fail(err, errlen, r, "drafter_cuda: the host drafter's layout does not match");
        goto fail_cuda;
    }
    *out = dc;
    return 0;
fail_cuda:
    if (r >= 0 || (r == -DF_ECUDA && err && !err[0]))
        r = df_fail(err, errlen, -DF_ECUDA, "drafter_cuda: uploading the drafter: %s",
                 cudaGetErrorString(cudaGetLastError()));
fail:
    if (r == -ENOMEM && err && !err[0])
        df_fail(err, errlen, r, "drafter_cuda: out of memory");
    drafter_cuda_free(dc);
    return r;
}

/* ---- phase profile ---- */

/* Phase `p` starts here on the stream (DCP_IDLE: the previous one ends). Nothing when not profiling. */
static void mark(struct drafter_cuda *dc, int p)
{
    if (!dc->profile || dc->prof_n >= PROF_MARKS)
        return;
    if (cudaEventRecord(dc->prof_ev[dc->prof_n], dc->stream) == cudaSuccess)
        dc->prof_phase[dc->prof_n++] = (uint8_t)p;
}

extern "C" const char *drafter_cuda_phase_name(int p)
{
    static const char *const names[DCP_N] = {
        "input", "fc + embed", "fwd ctx k/v", "fwd q/k/v", "fwd attention", "fwd o-proj", "fwd MLP",
        "LM head + CE", "bwd MLP", "bwd o-proj", "bwd attention", "bwd q/k norm", "bwd q/k/v proj",
        "bwd fc", "optimizer",
    };
    return p >= 0 && p < DCP_N ? names[p] : "?";
}

extern "C" int drafter_cuda_profile_take(struct drafter_cuda *dc, double *ms)
{
    if (!dc->profile)
        return -DF_ESTATE;
    int n = dc->prof_n;
    dc->prof_n = 0;
    if (n == 0)
        return 0;
    CU(cudaSetDevice(dc->device));
    CU(cudaEventSynchronize(dc->prof_ev[n - 1]));
    for (int i = 0; i + 1 < n; i++) {
        float t;
        if (dc->prof_phase[i] == DCP_IDLE)
            continue;
        CU(cudaEventElapsedTime(&t, dc->prof_ev[i], dc->prof_ev[i + 1]));
        ms[dc->prof_phase[i]] += t;
    }
    return 0;
}

/* ---- the pass ---- */

static int gemm(struct drafter_cuda *dc, int ta, int tb, int M, int N, int K, const void *A, long lda,
                const void *B, long ldb, float beta, void *D, int d_type, long ldd)
{
    return gk_gemmx_gemm(dc->gx, dc->stream, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, D, d_type, ldd);
}

/* Labels, weights, block inputs, the attention plan: built on the host, one H2D. Also the
 * metrics the host knows (weight sum, supervised rows, blocks, tokens). Returns the number of
 * scored rows. */
static int stage_batch(struct drafter_cuda *dc, const struct obj_batch *b, const struct obj_block *blk,
                       int nb, double gamma, int *n_tiles)
{
    const int bs = dc->bs, Q = nb * bs;
    struct cu_meta *h = &dc->mh;
    CU(cudaEventSynchronize(dc->ev_meta));      /* the last pass's copy of the pinned mirror is done */
    struct carver ch = { (char *)dc->meta_host, 0 }, cd = { (char *)dc->meta_dev, 0 };
    layout_meta(h, &ch, (size_t)b->n_seqs + 1, (size_t)Q, (size_t)nb, dc->max_tiles);
    layout_meta(&dc->md, &cd, (size_t)b->n_seqs + 1, (size_t)Q, (size_t)nb, dc->max_tiles);
    memcpy(h->cu, b->cu_seqlens, (size_t)(b->n_seqs + 1) * sizeof(int32_t));
    for (int i = 0; i < nb; i++) {
        int a = blk[i].anchor, start = b->cu_seqlens[blk[i].seq];
        for (int j = 0; j < bs; j++) {
            int r = i * bs + j;
            h->tok_q[r] = j == 0 ? (int32_t)b->tokens[a] : dc->cfg.mask_token_id;
            h->pos_q[r] = a - start + j;
        }
        obj_block_targets(b, &blk[i], bs, gamma, h->label + (size_t)i * bs, h->w + (size_t)i * bs);
        h->blk[i] = gk_dflash_block{ start, a };
    }
    int R = 0;
    double wsum = 0.0;
    for (int r = 0; r < Q; r++)
        if (h->w[r] > 0.0f) {
            h->rows[R++] = r;
            wsum += h->w[r];
        }
    struct drafter_metrics base;
    memset(&base, 0, sizeof base);
    base.weight_sum = wsum;
    base.supervised = R;
    base.blocks = nb;
    base.tokens = b->n_tokens;
    memcpy(h->mbase, &base, sizeof base);
    int nt = gk_dflash_plan(h->blk, nb, bs, b->n_tokens, h->qlist, h->tiles, dc->max_tiles);
    if (nt < 0)
        return -DF_ERANGE;
    *n_tiles = nt;
    /* the used bytes only: up to the last planned tile */
    size_t used = (size_t)((char *)(h->tiles + nt) - (char *)dc->meta_host);
    CU(cudaMemcpyAsync(dc->meta_dev, dc->meta_host, used, cudaMemcpyHostToDevice, dc->stream));
    CU(cudaEventRecord(dc->ev_meta, dc->stream));
    return R;
}

/* The pass's metric vector: the host's counts with the device's loss / hit / acceptance sums. */
static __global__ void metrics_vec_kernel(const double *base, const double *dev4, double *out)
{
    int i = threadIdx.x;
    if (i >= DRAFTER_METRICS_N)
        return;
    double v = base[i];
    if (dev4) {
        if (i == 0) v = dev4[0];        /* loss_sum */
        else if (i == 2) v = dev4[1];   /* correct */
        else if (i == 4) v = dev4[2];   /* accept_sum */
        else if (i == 5) v = dev4[3];   /* accept_blocks */
    }
    out[i] = v;
}

/* The features as bf16 [T, LcH] into hs[buf], on the copy stream once the last pass that read
 * that buffer is done with it (so this copy overlaps the pass before, which reads the other one).
 * Then ev_input on the copy stream (the caller's sign that hidden_bf16 has been read) and the
 * compute stream waits for it. fp32 features are converted on the host through the pinned
 * staging area: that path waits for the device. */
static int stage_hidden(struct drafter_cuda *dc, const struct obj_batch *b, int buf)
{
    const size_t T = (size_t)b->n_tokens, LcH = (size_t)dc->LcH;
    const size_t pitch = b->hidden_pitch ? b->hidden_pitch : LcH;
    const size_t rows_per = STAGE_BYTES / 2 / LcH;
    bf16_t *hs = dc->hs[buf];
    if (!b->hidden_bf16 && rows_per < 1)
        return -DF_ERANGE;
    CU(cudaStreamWaitEvent(dc->copy, dc->ev_hs_free[buf], 0));
    if (b->hidden_bf16) {
        CU(cudaMemcpy2DAsync(hs, LcH * 2, b->hidden_bf16, pitch * 2, LcH * 2, T, cudaMemcpyDefault, dc->copy));
    } else {
        for (size_t t0 = 0; t0 < T; t0 += rows_per) {
            size_t n = T - t0 < rows_per ? T - t0 : rows_per;
            CU(cudaStreamSynchronize(dc->copy));    /* the staging area's last copy is done */
            for (size_t t = 0; t < n; t++) {
                const float *src = b->hidden_f32 + (t0 + t) * pitch;
                uint16_t *dst = dc->stage + t * LcH;
                for (size_t j = 0; j < LcH; j++)
                    dst[j] = gk_f32_to_bf16(src[j]);
            }
            CU(cudaMemcpyAsync(hs + t0 * LcH, dc->stage, n * LcH * 2, cudaMemcpyHostToDevice, dc->copy));
        }
    }
    CU(cudaEventRecord(dc->ev_input, dc->copy));
    CU(cudaStreamWaitEvent(dc->stream, dc->ev_input, 0));
    return 0;
}

static gk_dflash_attn attn_args(struct drafter_cuda *dc, const struct cu_layer_act *a, int nb)
{
    gk_dflash_attn x;
    memset(&x, 0, sizeof x);
    x.n_blocks = nb;
    x.block_size = dc->bs;
    x.n_heads = dc->nh;
    x.n_kv_heads = dc->nkv;
    x.head_dim = dc->hd;
    x.scale = 1.0f / sqrtf((float)dc->hd);
    x.blocks = dc->md.blk;
    x.q = a->qp;                    x.q_stride = dc->qd;
    x.kc = a->kcp;                  x.kc_stride = dc->kvd;
    x.vc = a->kvc + dc->kvd;        x.vc_stride = 2 * dc->kvd;
    x.kb = a->kbp;                  x.kb_stride = dc->kvd;
    x.vb = a->qkv + dc->qd + dc->kvd; x.vb_stride = dc->qkvd;
    x.o = a->o;                     x.o_stride = dc->qd;
    x.lse = a->lse;
    x.impl = dc->attn_impl;
    return x;
}

#define WB(off) (dc->wb + (off))
#define GR(off) (dc->grads + (off))

static int layer_fwd(struct drafter_cuda *dc, int l, int T, int nb)
{
    const int Q = nb * dc->bs, H = dc->H, I = dc->I, qd = dc->qd, kvd = dc->kvd, qkvd = dc->qkvd;
    const struct drafter_layer_off *o = &dc->layer[l];
    struct cu_layer_act *a = &dc->la[l];
    cudaStream_t s = dc->stream;
    /* context keys/values from hidden_norm(fc(features)) */
    mark(dc, DCP_F_CTX_KV);
    TRY(gk_linear(dc->gemm, s, T, 2 * kvd, H, dc->cx, H, WB(o->k), NULL, 0, a->kvc, 2 * kvd));
    TRY(gk_rope_to(a->kvc, 2 * kvd, a->kcp, kvd, T, dc->nkv, dc->hd, dc->pos_ctx, dc->inv_freq, WB(o->k_norm),
                   dc->eps, s));
    /* block queries / keys / values */
    mark(dc, DCP_F_QKV);
    TRY(gk_rmsnorm(dc->X[l], H, WB(o->input_norm), dc->nrm, H, Q, H, dc->eps, s));
    TRY(gk_linear(dc->gemm, s, Q, qkvd, H, dc->nrm, H, WB(o->q), NULL, 0, a->qkv, qkvd));
    /* q and k normed + rotated straight out of the fused projection (the raw q|k|v stays for the
     * backward) */
    TRY(gk_rope_to(a->qkv, qkvd, a->qp, qd, Q, dc->nh, dc->hd, dc->md.pos_q, dc->inv_freq, WB(o->q_norm),
                   dc->eps, s));
    TRY(gk_rope_to(a->qkv + qd, qkvd, a->kbp, kvd, Q, dc->nkv, dc->hd, dc->md.pos_q, dc->inv_freq,
                   WB(o->k_norm), dc->eps, s));
    gk_dflash_attn at = attn_args(dc, a, nb);
    mark(dc, DCP_F_ATTN);
    TRY(gk_dflash_attn_fwd(&at, s));
    mark(dc, DCP_F_OPROJ);
    TRY(gk_linear(dc->gemm, s, Q, H, qd, a->o, qd, WB(o->o), dc->X[l], H, a->h1, H));
    /* MLP */
    mark(dc, DCP_F_MLP);
    TRY(gk_rmsnorm(a->h1, H, WB(o->post_norm), dc->nrm, H, Q, H, dc->eps, s));
    TRY(gk_linear(dc->gemm, s, Q, 2 * I, H, dc->nrm, H, WB(o->gate), NULL, 0, a->gu, 2 * I));
    TRY(gk_swiglu(a->gu, a->gu + I, 2 * I, a->z, I, Q, I, s));
    TRY(gk_linear(dc->gemm, s, Q, H, I, a->z, I, WB(o->down), a->h1, H, dc->X[l + 1], H));
    return 0;
}

/* In: dc->dx / dc->dxb = dLoss/dX[l+1]. Out: the same for X[l]; parameter grads and dc->dcx accumulated. */
static int layer_bwd(struct drafter_cuda *dc, int l, int T, int nb, int n_tiles)
{
    const int Q = nb * dc->bs, H = dc->H, I = dc->I, qd = dc->qd, kvd = dc->kvd, qkvd = dc->qkvd;
    const struct drafter_layer_off *o = &dc->layer[l];
    struct cu_layer_act *a = &dc->la[l];
    cudaStream_t s = dc->stream;

    /* MLP: X' = H1 + down(silu(gate(Bn)) * up(Bn)); Bn recomputed, Z kept from the forward */
    mark(dc, DCP_B_MLP);
    TRY(gk_rmsnorm(a->h1, H, WB(o->post_norm), dc->nrm, H, Q, H, dc->eps, s));
    TRY(gemm(dc, 1, 0, H, I, Q, dc->dxb, H, a->z, I, 0.0f, GR(o->down), GK_F32, I));
    TRY(gemm(dc, 0, 0, Q, I, H, dc->dxb, H, WB(o->down), I, 0.0f, dc->z, GK_BF16, I));     /* dZ */
    TRY(gk_swiglu_bwd(dc->z, I, a->gu, a->gu + I, 2 * I, dc->dgu, dc->dgu + I, 2 * I, Q, I, s));
    TRY(gemm(dc, 1, 0, 2 * I, H, Q, dc->dgu, 2 * I, dc->nrm, H, 0.0f, GR(o->gate), GK_F32, H));
    TRY(gemm(dc, 0, 0, Q, H, 2 * I, dc->dgu, 2 * I, WB(o->gate), H, 0.0f, dc->tmp_h, GK_F32, H));
    TRY(gk_rmsnorm_bwd(dc->tmp_h, H, a->h1, H, WB(o->post_norm), dc->dx, H, dc->dh1, H, dc->dh1b, H,
                       GR(o->post_norm), dc->norm_ws, Q, H, dc->eps, s));

    /* attention output projection: H1 = X + O Wo^T */
    mark(dc, DCP_B_OPROJ);
    TRY(gemm(dc, 1, 0, H, qd, Q, dc->dh1b, H, a->o, qd, 0.0f, GR(o->o), GK_F32, qd));
    TRY(gemm(dc, 0, 0, Q, qd, H, dc->dh1b, H, WB(o->o), qd, 0.0f, dc->dout, GK_BF16, qd));

    gk_dflash_attn at = attn_args(dc, a, nb);
    gk_dflash_attn_grad g;
    memset(&g, 0, sizeof g);
    g.dout = dc->dout;              g.dout_stride = qd;
    g.delta = dc->delta;
    g.dq = dc->dqf;                 g.dq_stride = qd;
    g.dkc = dc->dkcf;               g.dkc_stride = kvd;
    g.dvc = dc->dkvc + kvd;         g.dvc_stride = 2 * kvd;
    g.dkb = dc->dkbf;               g.dkb_stride = kvd;
    g.dvb = dc->dqkvb + qd + kvd;   g.dvb_stride = qkvd;
    g.n_ctx = T;
    g.qlist = dc->md.qlist;
    g.tiles = dc->md.tiles;
    g.n_tiles = n_tiles;
    mark(dc, DCP_B_ATTN);
    TRY(gk_dflash_attn_bwd(&at, &g, s));

    /* back through rope and the q/k norms into the raw projections */
    mark(dc, DCP_B_QKNORM);
    TRY(gk_qknorm_rope_bwd(dc->dqf, qd, a->qkv, qkvd, dc->dqkvb, qkvd, WB(o->q_norm), GR(o->q_norm),
                           dc->norm_ws, Q, dc->nh, dc->hd, dc->md.pos_q, dc->inv_freq, dc->eps, s));
    TRY(gk_qknorm_rope_bwd(dc->dkbf, kvd, a->qkv + qd, qkvd, dc->dqkvb + qd, qkvd, WB(o->k_norm),
                           GR(o->k_norm), dc->norm_ws, Q, dc->nkv, dc->hd, dc->md.pos_q, dc->inv_freq,
                           dc->eps, s));
    TRY(gk_qknorm_rope_bwd(dc->dkcf, kvd, a->kvc, 2 * kvd, dc->dkvc, 2 * kvd, WB(o->k_norm), GR(o->k_norm),
                           dc->norm_ws, T, dc->nkv, dc->hd, dc->pos_ctx, dc->inv_freq, dc->eps, s));

    /* projections: block rows read input_layernorm(X) (recomputed), context rows read cx */
    mark(dc, DCP_B_PROJ);
    TRY(gk_rmsnorm(dc->X[l], H, WB(o->input_norm), dc->nrm, H, Q, H, dc->eps, s));
    TRY(gemm(dc, 1, 0, qkvd, H, Q, dc->dqkvb, qkvd, dc->nrm, H, 0.0f, GR(o->q), GK_F32, H));
    TRY(gemm(dc, 1, 0, 2 * kvd, H, T, dc->dkvc, 2 * kvd, dc->cx, H, 1.0f, GR(o->k), GK_F32, H));     /* adds */
    TRY(gemm(dc, 0, 0, Q, H, qkvd, dc->dqkvb, qkvd, WB(o->q), H, 0.0f, dc->tmp_h, GK_F32, H));
    TRY(gemm(dc, 0, 0, T, H, 2 * kvd, dc->dkvc, 2 * kvd, WB(o->k), H, 1.0f, dc->dcx, GK_F32, H));
    TRY(gk_rmsnorm_bwd(dc->tmp_h, H, dc->X[l], H, WB(o->input_norm), dc->dh1, H, dc->dx, H, dc->dxb, H,
                       GR(o->input_norm), dc->norm_ws, Q, H, dc->eps, s));
    return 0;
}

/* The norms' gradients are sums of kernel partials: zeroed before a backward. Every matrix's
 * gradient is written whole (beta 0) by its first weight-gradient GEMM, so nothing else is. */
static int zero_norm_grads(struct drafter_cuda *dc)
{
    for (int i = 0; i < dc->n_norm_ranges; i++)
        CU(cudaMemsetAsync(dc->grads + dc->norm_ranges[i].off, 0, dc->norm_ranges[i].n * sizeof(float), dc->stream));
    return 0;
}

/* The pass after its inputs: fc over the features in hs[buf] (the compute stream already waits
 * for their copy), the layers, the head, the backward. Records ev_hs_free[buf] after the last
 * read of hs[buf]. */
static int enqueue_compute(struct drafter_cuda *dc, const struct obj_batch *b, int nb, int R, int n_tiles,
                           int backward, int block_loss, int buf)
{
    const int T = b->n_tokens, Q = nb * dc->bs, H = dc->H;
    const bf16_t *hs = dc->hs[buf];
    cudaStream_t s = dc->stream;
    mark(dc, DCP_FC);
    TRY(gk_positions(dc->md.cu, b->n_seqs, dc->pos_ctx, T, s));

    TRY(gk_linear(dc->gemm, s, T, H, dc->LcH, hs, dc->LcH, WB(dc->off_fc), NULL, 0, dc->cpre, H));
    if (!backward)
        CU(cudaEventRecord(dc->ev_hs_free[buf], s));
    TRY(gk_rmsnorm(dc->cpre, H, WB(dc->off_hidden_norm), dc->cx, H, T, H, dc->eps, s));
    TRY(gk_embed(dc->embed, dc->V, H, dc->md.tok_q, Q, dc->X[0], H, s));
    for (int l = 0; l < dc->L; l++)
        TRY(layer_fwd(dc, l, T, nb));
    mark(dc, DCP_HEAD);
    TRY(gk_rmsnorm(dc->X[dc->L], H, WB(dc->off_norm), dc->fo, H, Q, H, dc->eps, s));
    TRY(gk_lmhead_ce(dc->gx, s, dc->fo, Q, H, dc->lm_head, dc->V, dc->md.rows, R, dc->md.label, dc->md.w,
                     dc->chunk_rows, dc->head_work, dc->row_loss, dc->hit, backward ? dc->tmp_h : NULL));
    TRY(gk_block_metrics(dc->row_loss, dc->hit, dc->md.w, nb, dc->bs, dc->d_metrics,
                         block_loss ? dc->d_block_loss : NULL, s));
    metrics_vec_kernel<<<1, 32, 0, s>>>(dc->md.mbase, dc->d_metrics, dc->d_mvec);
    CU(cudaGetLastError());

    if (backward) {
        mark(dc, DCP_B_FC);
        TRY(zero_norm_grads(dc));
        TRY(gk_rmsnorm_bwd(dc->tmp_h, H, dc->X[dc->L], H, WB(dc->off_norm), NULL, 0, dc->dx, H, dc->dxb, H,
                           GR(dc->off_norm), dc->norm_ws, Q, H, dc->eps, s));
        CU(cudaMemsetAsync(dc->dcx, 0, (size_t)T * H * sizeof(float), s));
        for (int l = dc->L - 1; l >= 0; l--)
            TRY(layer_bwd(dc, l, T, nb, n_tiles));
        TRY(gk_rmsnorm_bwd(dc->dcx, H, dc->cpre, H, WB(dc->off_hidden_norm), NULL, 0, NULL, 0, dc->dcpre, H,
                           GR(dc->off_hidden_norm), dc->norm_ws, T, H, dc->eps, s));
        mark(dc, DCP_B_FC);
        TRY(gemm(dc, 1, 0, H, dc->LcH, T, dc->dcpre, H, hs, dc->LcH, 0.0f, GR(dc->off_fc), GK_F32, dc->LcH));
        CU(cudaEventRecord(dc->ev_hs_free[buf], s));
    }
    mark(dc, DCP_IDLE);
    return 0;
}

/* The start of an asynchronous step's device time: the compute stream has its input. An event no
 * unread result holds (a pass whose step never came, left out by the group, held none). A later
 * mark replaces an unpaired one. */
static int mark_start(struct drafter_cuda *dc)
{
    int e = dc->start_next;
    for (int tries = 0; tries <= RES_DEPTH; tries++, e = (e + 1) % (RES_DEPTH + 1)) {
        bool held = false;
        for (uint64_t q = dc->res_read; q < dc->res_next && !held; q++)
            held = dc->res[q % RES_DEPTH].start == e;
        if (!held)
            break;
    }
    CU(cudaEventRecord(dc->ev_start[e], dc->stream));
    dc->start_pending = e;
    dc->start_next = (e + 1) % (RES_DEPTH + 1);
    return 0;
}

extern "C" int drafter_cuda_mark_start(struct drafter_cuda *dc)
{
    CU(cudaSetDevice(dc->device));
    return mark_start(dc);
}

/* Enqueue one pass: metrics into d_mvec, gradients (backward) into the gradient buffer. No host
 * wait except for the pinned mirror of the previous pass (long done in a loop) and the f32
 * feature conversion. */
static int enqueue_pass(struct drafter_cuda *dc, const struct obj_batch *b, const struct obj_block *blk, int nb,
                        double gamma, int backward, int block_loss, int timed)
{
    if (b->n_tokens < 1 || b->n_tokens > dc->max_tokens || nb < 0 || nb > dc->max_blocks ||
        b->n_seqs < 1 || b->n_seqs > dc->max_tokens || (!b->hidden_bf16 == !b->hidden_f32))
        return -DF_ERANGE;
    TRY(obj_blocks_check(b, blk, nb));
    CU(cudaSetDevice(dc->device));
    cudaStream_t s = dc->stream;
    int n_tiles = 0;
    mark(dc, DCP_INPUT);
    int R = stage_batch(dc, b, blk, nb, gamma, &n_tiles);
    if (R < 0)
        return R;
    if (nb == 0) {      /* nothing supervised: no feature is read, every gradient is zero */
        CU(cudaEventRecord(dc->ev_input, dc->copy));    /* complete once earlier copies are */
        if (timed)
            TRY(mark_start(dc));
        metrics_vec_kernel<<<1, 32, 0, s>>>(dc->md.mbase, NULL, dc->d_mvec);
        CU(cudaGetLastError());
        if (backward)
            CU(cudaMemsetAsync(dc->grads, 0, dc->n_params * sizeof(float), s));
        mark(dc, DCP_IDLE);
        return 0;
    }
    const int buf = dc->hs_next;
    TRY(stage_hidden(dc, b, buf));
    dc->hs_next = buf ^ 1;
    if (timed)
        TRY(mark_start(dc));
    int r = enqueue_compute(dc, b, nb, R, n_tiles, backward, block_loss, buf);
    if (r < 0)      /* a later copy into buf still waits for whatever this pass enqueued */
        cudaEventRecord(dc->ev_hs_free[buf], s);
    return r;
}

/* The pass with the host waiting for its metrics. */
static int run_pass(struct drafter_cuda *dc, const struct obj_batch *b, const struct obj_block *blk, int nb,
                    double gamma, struct drafter_metrics *m, double *block_loss, int backward)
{
    struct drafter_metrics tmp;
    if (!m)
        m = &tmp;
    memset(m, 0, sizeof *m);
    if (block_loss && nb > 0)
        memset(block_loss, 0, (size_t)nb * sizeof *block_loss);
    TRY(enqueue_pass(dc, b, blk, nb, gamma, backward, block_loss != NULL, 0));
    cudaStream_t s = dc->stream;
    CU(cudaMemcpyAsync(dc->h_metrics, dc->d_mvec, sizeof *m, cudaMemcpyDeviceToHost, s));
    if (block_loss && nb > 0)
        CU(cudaMemcpyAsync(dc->h_block_loss, dc->d_block_loss, (size_t)nb * sizeof(double),
                           cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(s));
    memcpy(m, dc->h_metrics, sizeof *m);
    if (block_loss && nb > 0)
        memcpy(block_loss, dc->h_block_loss, (size_t)nb * sizeof *block_loss);
    return 0;
}

extern "C" int drafter_cuda_forward_backward(struct drafter_cuda *dc, const struct obj_batch *b,
                                             const struct obj_block *blocks, int n_blocks, double gamma,
                                             struct drafter_metrics *m)
{
    return run_pass(dc, b, blocks, n_blocks, gamma, m, NULL, 1);
}

extern "C" int drafter_cuda_forward(struct drafter_cuda *dc, const struct obj_batch *b,
                                    const struct obj_block *blocks, int n_blocks, double gamma,
                                    struct drafter_metrics *m, double *block_loss)
{
    return run_pass(dc, b, blocks, n_blocks, gamma, m, block_loss, 0);
}

/* AdamW with gk_grad_clip's factor from d_clip, the lr and bias correction from the step count on
 * the device (d_count), which the update advances only when it is applied. */
static int enqueue_adamw(struct drafter_cuda *dc, const struct drafter_train_opts *o)
{
    const gk_adamw_sched sched = { o->lr, o->min_lr_ratio, o->warmup_steps, o->total_steps,
                                   o->beta1, o->beta2, o->eps, o->weight_decay };
    return gk_adamw_scheduled(dc->params, dc->grads, dc->m, dc->v, dc->wb, dc->n_params, dc->segs, dc->n_seg,
                              dc->d_clip, &sched, dc->d_count, dc->stream);
}

extern "C" int drafter_cuda_optimizer_step(struct drafter_cuda *dc, double global_weight_sum,
                                           const struct drafter_train_opts *o, struct drafter_step_info *info)
{
    struct drafter_step_info tmp;
    if (!info)
        info = &tmp;
    memset(info, 0, sizeof *info);
    info->step = dc->applied;
    if (dc->n_pending)
        return -DF_ESTATE;      /* asynchronous steps not yet retired: their count is not known */
    if (!(global_weight_sum > 0))
        return -DF_ERANGE;      /* nothing supervised anywhere: no step */
    CU(cudaSetDevice(dc->device));
    cudaStream_t s = dc->stream;
    mark(dc, DCP_OPT);
    TRY(gk_grad_clip(dc->grads, dc->n_params, (float)(1.0 / global_weight_sum), (float)o->grad_clip,
                     dc->norm_work, dc->d_clip, s));
    TRY(enqueue_adamw(dc, o));
    mark(dc, DCP_IDLE);
    CU(cudaMemcpyAsync(dc->h_clip, dc->d_clip, 3 * sizeof(float), cudaMemcpyDeviceToHost, s));
    CU(cudaMemcpyAsync(dc->h_count, dc->d_count, sizeof *dc->h_count, cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(s));
    info->grad_norm = dc->h_clip[0];
    if (dc->h_clip[2] == 0.0f)
        return -DF_ENAN;        /* the update kernel changed nothing, nor the count */
    info->lr = dc->h_count->lr;
    info->step = dc->applied = dc->h_count->step;
    return 0;
}

extern "C" int drafter_cuda_forward_backward_async(struct drafter_cuda *dc, const struct obj_batch *b,
                                                   const struct obj_block *blocks, int n_blocks, double gamma)
{
    return enqueue_pass(dc, b, blocks, n_blocks, gamma, 1, 0, 1);
}

extern "C" double *drafter_cuda_metrics_dev(struct drafter_cuda *dc) { return dc->d_mvec; }

extern "C" void *drafter_cuda_input_event(struct drafter_cuda *dc) { return (void *)dc->ev_input; }

extern "C" int drafter_cuda_optimizer_step_async(struct drafter_cuda *dc, const struct drafter_train_opts *o)
{
    int slot = (int)(dc->res_next % RES_DEPTH);
    if (dc->res[slot].state != RES_EMPTY)
        return -DF_ESTATE;      /* RES_DEPTH results are waiting to be read */
    CU(cudaSetDevice(dc->device));
    cudaStream_t s = dc->stream;
    if (dc->start_pending < 0)
        TRY(mark_start(dc));    /* a rank without a batch: zeros and the all-reduce, no pass */
    dc->res[slot].start = dc->start_pending;
    dc->start_pending = -1;
    mark(dc, DCP_OPT);
    TRY(gk_grad_clip_dev(dc->grads, dc->n_params, dc->d_mvec + 1, dc->d_mvec, (float)o->grad_clip,
                         dc->norm_work, dc->d_clip, s));
    TRY(enqueue_adamw(dc, o));
    mark(dc, DCP_IDLE);
    struct drafter_cuda::cu_result *hr = &dc->h_res[slot];
    CU(cudaMemcpyAsync(hr->metrics, dc->d_mvec, sizeof hr->metrics, cudaMemcpyDeviceToHost, s));
    CU(cudaMemcpyAsync(hr->clip, dc->d_clip, sizeof hr->clip, cudaMemcpyDeviceToHost, s));
    CU(cudaMemcpyAsync(&hr->count, dc->d_count, sizeof hr->count, cudaMemcpyDeviceToHost, s));
    CU(cudaEventRecord(dc->ev_res[slot], s));
    dc->res[slot].state = RES_PENDING;
    dc->res[slot].seq = dc->res_next++;
    dc->res[slot].rc = 0;
    dc->n_pending++;
    return 0;
}

/* The oldest pending result, its event complete: the device's step count after it (one more
 * than before if it was applied) is the host's from now on. */
static void retire(struct drafter_cuda *dc, int slot)
{
    const float *c = dc->h_res[slot].clip;
    dc->res[slot].rc = c[2] != 0.0f ? 0 : c[3] == 0.0f ? -DF_ERANGE : -DF_ENAN;
    dc->applied = dc->h_res[slot].count.step;
    dc->res[slot].state = RES_DONE;
    dc->n_pending--;
}

/* Retire every pending result (the stream has been synchronised). */
static void retire_all(struct drafter_cuda *dc)
{
    for (uint64_t q = dc->res_read; q < dc->res_next; q++) {
        int slot = (int)(q % RES_DEPTH);
        if (dc->res[slot].state == RES_PENDING)
            retire(dc, slot);
    }
}

extern "C" void *drafter_cuda_result_event(struct drafter_cuda *dc)
{
    return dc->res_read == dc->res_next ? NULL : (void *)dc->ev_res[dc->res_read % RES_DEPTH];
}

extern "C" int drafter_cuda_step_result(struct drafter_cuda *dc, int wait, struct drafter_metrics *m,
                                        struct drafter_step_info *info)
{
    if (dc->res_read == dc->res_next)
        return -ENOENT;
    int slot = (int)(dc->res_read % RES_DEPTH);
    if (dc->res[slot].state == RES_PENDING) {
        cudaError_t e = wait ? cudaEventSynchronize(dc->ev_res[slot]) : cudaEventQuery(dc->ev_res[slot]);
        if (e == cudaErrorNotReady)
            return -EAGAIN;
        CU(e);
        retire(dc, slot);
    }
    if (m)
        memcpy(m, dc->h_res[slot].metrics, sizeof *m);
    if (info) {
        info->lr = dc->h_res[slot].count.lr;
        info->grad_norm = dc->h_res[slot].clip[0];
        info->step = dc->h_res[slot].count.step;
        float ms = 0;     /* both events complete: no wait */
        if (cudaEventElapsedTime(&ms, dc->ev_start[dc->res[slot].start], dc->ev_res[slot]) != cudaSuccess) {
            cudaGetLastError();     /* not left for the next launch check to find */
            ms = 0;
        }
        info->device_ms = ms;
    }
    int rc = dc->res[slot].rc;
    dc->res[slot].state = RES_EMPTY;
    dc->res_read++;
    return rc;
}

extern "C" int drafter_cuda_train_step(struct drafter_cuda *dc, const struct obj_batch *b, int num_anchors,
                                       double gamma, const struct obj_rng_key *key,
                                       const struct drafter_train_opts *o, struct drafter_metrics *m,
                                       struct drafter_step_info *info)
{
    if (b->n_tokens > dc->max_tokens)
        return -DF_ERANGE;
    int n = obj_sample_anchors(b, num_anchors, key, dc->sample_blocks, dc->max_blocks, dc->sample_work);
    if (n < 0)
        return n;
    struct drafter_metrics tmp;
    if (!m)
        m = &tmp;
    TRY(drafter_cuda_forward_backward(dc, b, dc->sample_blocks, n, gamma, m));
    return drafter_cuda_optimizer_step(dc, m->weight_sum, o, info);
}

extern "C" float *drafter_cuda_grads(struct drafter_cuda *dc, size_t *n_params)
{
    if (n_params)
        *n_params = dc->n_params;
    return dc->grads;
}

extern "C" void *drafter_cuda_stream(struct drafter_cuda *dc) { return (void *)dc->stream; }

extern "C" int64_t drafter_cuda_step_count(const struct drafter_cuda *dc) { return dc->applied + dc->n_pending; }

static int download(struct drafter_cuda *dc, float *host, const float *dev)
{
    TRY(sync_streams(dc));
    CU(cudaMemcpy(host, dev, dc->n_params * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int drafter_cuda_download_grads(struct drafter_cuda *dc, float *host)
{
    return download(dc, host, dc->grads);
}

extern "C" int drafter_cuda_download_params(struct drafter_cuda *dc, float *host)
{
    return download(dc, host, dc->params);
}

extern "C" int drafter_cuda_sync_to_host(struct drafter_cuda *dc, struct drafter *d)
{
    if (!same_layout(dc, d))
        return -DF_ELAYOUT;
    TRY(sync_streams(dc));
    retire_all(dc);     /* the step count of the state written out is exact */
    TRY(download(dc, d->params, dc->params));
    TRY(download(dc, d->opt->m, dc->m));
    TRY(download(dc, d->opt->v, dc->v));
    d->opt->step = dc->applied;
    return 0;
}
