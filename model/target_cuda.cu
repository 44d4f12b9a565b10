/* target_cuda.cu: the CUDA backend of the target model (bf16 weights and activations, fp32 accumulation
 * and residual stream, gpukern kernels, cuBLASLt GEMMs) and the double-buffered capture pipeline of target_cuda.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "common/err.h"
#include "gpukern/attention.h"
#include "gpukern/cuda_check.h"
#include "gpukern/embed.h"
#include "gpukern/gemm.h"
#include "gpukern/residual.h"
#include "gpukern/rmsnorm.h"
#include "gpukern/rope.h"
#include "gpukern/swiglu.h"
#include "model/target_cuda.h"
#include "model/target_internal.h"

typedef uint16_t bf16_t;

/* One decoder layer on the GPU. q/k/v and gate/up are fused into one weight each
 * (rows [q; k; v] and [gate; up]) so each is one GEMM. Biases are NULL when absent. */
struct cuda_layer {
    bf16_t *in_norm, *post_norm, *q_norm, *k_norm;
    bf16_t *wqkv, *bqkv, *wo, *bo, *wgu, *bgu, *wdown, *bdown;
};

struct cuda_model {
    int device;
    cudaStream_t compute, copy;
    gk_gemm *gemm;
    void *weights;              /* one allocation for every weight */
    bf16_t *embed, *final_norm;
    float *inv_freq;
    struct cuda_layer *layers;
    int n_layers;

    /* scratch, [max_tokens, ...] */
    int32_t *tokens, *cu, *pos;
    float *x;                   /* the residual stream, kept in fp32 (see forward_enqueue) */
    bf16_t *xn, *qkv, *attn, *gu, *act;
    bf16_t *cap[2];             /* capture sets: [n_ids][max_tokens][H] each; set 1 made by the pipeline */
    float *f32_out;             /* [max_tokens, H], made by the first OUT_F32 forward */
    cudaEvent_t set_free[2];    /* recorded after the last copy that read a capture set */
    struct target_pipe *pipe;
};

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* ---- loading ------------------------------------------------------------------------------ */

/* A piece of the weight allocation: up to three tensors copied back to back (fused weights). */
struct piece {
    bf16_t **dst;
    const struct st_tensor *t[3];
    size_t elems;
    size_t off;                 /* bytes into the allocation */
};

struct loader {
    struct piece *p;
    int n, cap;
    size_t bytes;
};

static int add_piece(struct loader *L, bf16_t **dst, const struct st_tensor *a, const struct st_tensor *b,
                     const struct st_tensor *c)
{
    if (!a) {                   /* optional tensor absent (bias, q/k norm) */
        *dst = NULL;
        return 0;
    }
    if (L->n == L->cap) {
        int nc = L->cap ? 2 * L->cap : 64;
        struct piece *np = (struct piece *)realloc(L->p, nc * sizeof *np);
        if (!np)
            return -ENOMEM;
        L->p = np;
        L->cap = nc;
    }
    struct piece *p = &L->p[L->n++];
    p->dst = dst;
    p->t[0] = a;
    p->t[1] = b;
    p->t[2] = c;
    p->elems = (size_t)a->numel + (b ? (size_t)b->numel : 0) + (c ? (size_t)c->numel : 0);
    p->off = L->bytes;
    L->bytes = align_up(L->bytes + p->elems * 2, 256);   /* cuBLASLt likes 256-byte operands */
    return 0;
}

/* Convert every piece to bf16 through two pinned staging buffers, copies overlapping conversion. */
static int upload_pieces(struct cuda_model *c, const struct loader *L, char *err, size_t errlen)
{
    const size_t chunk = 32u << 20;     /* elements per staging buffer (64 MiB) */
    bf16_t *stage[2] = { NULL, NULL };
    cudaEvent_t ev[2] = { NULL, NULL };
    int r = 0, b = 0;
    for (int i = 0; i < 2; i++) {
        if (cudaHostAlloc((void **)&stage[i], chunk * 2, cudaHostAllocDefault) != cudaSuccess ||
            cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming) != cudaSuccess) {
            r = df_fail(err, errlen, -DF_ECUDA, "pinned staging for the weights: %s",
                     cudaGetErrorString(cudaGetLastError()));
            goto out;
        }
    }
    for (int i = 0; i < L->n; i++) {
        const struct piece *p = &L->p[i];
        char *dev = (char *)c->weights + p->off;
        *p->dst = (bf16_t *)dev;
        for (int j = 0; j < 3 && p->t[j]; j++) {
            const struct st_tensor *t = p->t[j];
            for (int64_t first = 0; first < t->numel; first += (int64_t)chunk) {
                int64_t n = t->numel - first < (int64_t)chunk ? t->numel - first : (int64_t)chunk;
                if (cudaEventSynchronize(ev[b]) != cudaSuccess) {
                    r = df_fail(err, errlen, -DF_ECUDA, "weight upload: %s", cudaGetErrorString(cudaGetLastError()));
                    goto out;
                }
                if ((r = st_read_bf16(t, first, n, stage[b])) < 0) {
                    r = df_fail(err, errlen, r, "%s: tensor '%s': dtype %s cannot be converted to bf16", t->file,
                             t->name, st_dtype_name(t->dtype));
                    goto out;
                }
                if (cudaMemcpyAsync(dev, stage[b], (size_t)n * 2, cudaMemcpyHostToDevice, c->compute) != cudaSuccess ||
                    cudaEventRecord(ev[b], c->compute) != cudaSuccess) {
                    r = df_fail(err, errlen, -DF_ECUDA, "weight upload of '%s': %s", t->name,
                             cudaGetErrorString(cudaGetLastError()));
                    goto out;
                }
                dev += (size_t)n * 2;
                b ^= 1;
            }
        }
    }
    if (cudaStreamSynchronize(c->compute) != cudaSuccess)
        r = df_fail(err, errlen, -DF_ECUDA, "weight upload: %s", cudaGetErrorString(cudaGetLastError()));
out:
    cudaStreamSynchronize(c->compute);
    for (int i = 0; i < 2; i++) {
        if (stage[i])
            cudaFreeHost(stage[i]);
        if (ev[i])
            cudaEventDestroy(ev[i]);
    }
    return r;
}

static void cuda_close(struct target *m)
{
    struct cuda_model *c = (struct cuda_model *)m->impl;
    if (!c)
        return;
    cudaSetDevice(c->device);
    if (c->pipe)
        target_pipe_free(c->pipe);
    if (c->compute)
        cudaStreamSynchronize(c->compute);
    if (c->copy)
        cudaStreamSynchronize(c->copy);
    gk_gemm_free(c->gemm);
    void *bufs[] = { c->weights, c->inv_freq, c->tokens, c->cu, c->pos, c->x, c->xn, c->qkv, c->attn,
                     c->gu, c->act, c->cap[0], c->cap[1], c->f32_out };
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i])
            cudaFree(bufs[i]);
    for (int i = 0; i < 2; i++)
        if (c->set_free[i])
            cudaEventDestroy(c->set_free[i]);
    if (c->compute)
        cudaStreamDestroy(c->compute);
    if (c->copy)
        cudaStreamDestroy(c->copy);
    free(c->layers);
    free(c);
    m->impl = NULL;
}

static int dev_alloc(void **p, size_t bytes, const char *what, const struct target *m, char *err, size_t errlen)
{
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        *p = NULL;
        return df_fail(err, errlen, -DF_ECUDA, "%s: cudaMalloc of %zu MiB for %s on device %d: %s", m->dir,
                    bytes >> 20, what, m->device, cudaGetErrorString(e));
    }
    return 0;
}

/* Device bytes per token of max_tokens that cuda_open and the pipeline take: token ids, cu_seqlens,
 * positions, the fp32 residual stream, the normed stream, q/k/v, the attention output, gate/up,
 * the MLP activation (its allocations below) and the two capture sets. */
static size_t scratch_per_token(const struct target *m)
{
    const struct hf_config *cf = &m->cfg;
    const size_t H = (size_t)cf->hidden_size, D = (size_t)cf->head_dim, FF = (size_t)cf->intermediate_size;
    const size_t NH = (size_t)cf->num_heads, NKV = (size_t)cf->num_kv_heads;
    return 3 * 4 + H * 4 + H * 2 + (NH + 2 * NKV) * D * 2 + NH * D * 2 + 2 * FF * 2 + FF * 2 +
           2 * (size_t)m->n_ids * H * 2;
}

/* What the model will take on the device, weights_bytes and the pipeline's second capture set
 * included (target-d always makes one), against the GPU's whole memory less the context's
 * allowance (gk_device_usable_bytes): more than that is the configuration's doing (-DF_ERANGE),
 * which a restart would only repeat; a shortfall of free memory only (another process) stays
 * -DF_ECUDA at the allocation. */
static int check_fits(const struct target *m, size_t weights_bytes, char *err, size_t errlen)
{
    const size_t T = (size_t)m->max_tokens, H = (size_t)m->cfg.hidden_size;
    const size_t scratch = scratch_per_token(m) * (T + 1), cap = 2 * (size_t)m->n_ids * T * H * 2;
    const size_t need = weights_bytes + scratch + GK_GEMM_WORKSPACE_DEFAULT + (size_t)m->cfg.head_dim * 2;
    const size_t total_b = gk_device_usable_bytes();
    if (!total_b || need <= total_b)
        return 0;       /* (unknown: the allocations tell) */
    const double gib = 1073741824.0;
    return df_fail(err, errlen, -DF_ERANGE,
                   "%s: the weights (%.2f GiB) and the buffers for %zu tokens (%.2f GiB, of which %.2f GiB the two "
                   "capture sets of %d layers x hidden %zu; intermediate_size %d) need %.2f GiB, more than the %.2f GiB "
                   "of device %d beside the CUDA context: lower ring.max_tokens", m->dir, weights_bytes / gib, T, scratch / gib, cap / gib,
                   m->n_ids, H, m->cfg.intermediate_size, need / gib, total_b / gib, m->device);
}

static int cuda_open(struct target *m, char *err, size_t errlen)
{
    const struct hf_config *cf = &m->cfg;
    const int H = cf->hidden_size, D = cf->head_dim, NH = cf->num_heads, NKV = cf->num_kv_heads;
    const int FF = cf->intermediate_size;
    const size_t QKVD = (size_t)(NH + 2 * NKV) * D, T = (size_t)m->max_tokens;
    int r;
    if (H % 8 || D % 8 || FF % 8 || D > 256)
        return df_fail(err, errlen, -DF_EUNSUPPORTED,
                    "%s/config.json: the CUDA backend needs hidden_size, head_dim, intermediate_size "
                    "divisible by 8 and head_dim <= 256 (got %d, %d, %d)", m->dir, H, D, FF);
    struct cuda_model *c = (struct cuda_model *)calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    m->impl = c;
    c->device = m->device;
    int n_gpus = 0;
    const char *why;
    if (gk_device_missing(m->device, &n_gpus, &why))
        return df_fail(err, errlen, -ENODEV, "%s: device %d: %d GPU%s visible to this process%s%s (target-d -i picks "
                       "the GPU)", m->dir, m->device, n_gpus, n_gpus == 1 ? "" : "s", *why ? ": " : "", why);
    cudaError_t e = cudaSetDevice(m->device);
    if (e != cudaSuccess)
        return df_fail(err, errlen, -DF_ECUDA, "%s: cudaSetDevice(%d): %s", m->dir, m->device, cudaGetErrorString(e));
    if (cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->set_free[0], cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->set_free[1], cudaEventDisableTiming) != cudaSuccess)
        return df_fail(err, errlen, -DF_ECUDA, "%s: CUDA streams/events on device %d: %s", m->dir, m->device,
                    cudaGetErrorString(cudaGetLastError()));
    if ((r = gk_gemm_create(&c->gemm, 0, err, errlen)) < 0)
        return r;

    /* weights: find and check every tensor first, then one allocation, then upload */
    struct loader L = { NULL, 0, 0, 0 };
    const struct st_tensor *embed, *norm;
    bool want_norm = m->last_layer == cf->num_layers - 1;   /* HF's last hidden state is post-norm */
    c->n_layers = m->last_layer + 1;
    if (!(c->layers = (struct cuda_layer *)calloc(c->n_layers, sizeof *c->layers))) {
        r = -ENOMEM;
        goto done;
    }
    if ((r = target_find_globals(m, want_norm, &embed, &norm, err, errlen)) < 0)
        goto done;
    if ((r = add_piece(&L, &c->embed, embed, NULL, NULL)) < 0 ||
        (r = add_piece(&L, &c->final_norm, norm, NULL, NULL)) < 0)
        goto done;
    for (int l = 0; l < c->n_layers; l++) {
        const struct st_tensor *t[TW_COUNT];
        struct cuda_layer *y = &c->layers[l];
        if ((r = target_find_layer(m, l, t, err, errlen)) < 0)
            goto done;
        if ((r = add_piece(&L, &y->in_norm, t[TW_IN_NORM], NULL, NULL)) < 0 ||
            (r = add_piece(&L, &y->post_norm, t[TW_POST_NORM], NULL, NULL)) < 0 ||
            (r = add_piece(&L, &y->q_norm, t[TW_Q_NORM], NULL, NULL)) < 0 ||
            (r = add_piece(&L, &y->k_norm, t[TW_K_NORM], NULL, NULL)) < 0 ||
            (r = add_piece(&L, &y->wqkv, t[TW_Q], t[TW_K], t[TW_V])) < 0 ||
            (r = add_piece(&L, &y->bqkv, t[TW_Q_BIAS], t[TW_K_BIAS], t[TW_V_BIAS])) < 0 ||
            (r = add_piece(&L, &y->wo, t[TW_O], NULL, NULL)) < 0 ||
            (r = add_piece(&L, &y->bo, t[TW_O_BIAS], NULL, NULL)) < 0 ||
            (r = add_piece(&L, &y->wgu, t[TW_GATE], t[TW_UP], NULL)) < 0 ||
            (r = add_piece(&L, &y->bgu, t[TW_GATE_BIAS], t[TW_UP_BIAS], NULL)) < 0 ||
            (r = add_piece(&L, &y->wdown, t[TW_DOWN], NULL, NULL)) < 0 ||
            (r = add_piece(&L, &y->bdown, t[TW_DOWN_BIAS], NULL, NULL)) < 0)
            goto done;
    }
    if ((r = check_fits(m, L.bytes, err, errlen)) < 0)
        goto done;
    if ((r = dev_alloc(&c->weights, L.bytes, "the weights", m, err, errlen)) < 0 ||
        (r = upload_pieces(c, &L, err, errlen)) < 0)
        goto done;

    {
        float inv[256];
        gk_rope_scaling sc = { GK_ROPE_DEFAULT, 1, 1, 1, 1 };
        if (cf->rope.type == HF_ROPE_LLAMA3) {
            sc.type = GK_ROPE_LLAMA3;
            sc.factor = cf->rope.factor;
            sc.low_freq_factor = cf->rope.low_freq_factor;
            sc.high_freq_factor = cf->rope.high_freq_factor;
            sc.original_max_pos = cf->rope.original_max_position_embeddings;
        }
        if ((r = gk_rope_inv_freq(inv, D, cf->rope.theta, &sc)) < 0) {
            r = df_fail(err, errlen, -DF_EFORMAT, "%s/config.json: rope parameters rejected", m->dir);
            goto done;
        }
        if ((r = dev_alloc((void **)&c->inv_freq, D / 2 * sizeof(float), "rope", m, err, errlen)) < 0)
            goto done;
        if (cudaMemcpy(c->inv_freq, inv, D / 2 * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
            r = df_fail(err, errlen, -DF_ECUDA, "%s: rope table upload failed", m->dir);
            goto done;
        }
    }

    if ((r = dev_alloc((void **)&c->tokens, T * 4, "token ids", m, err, errlen)) < 0 ||
        (r = dev_alloc((void **)&c->cu, (T + 1) * 4, "cu_seqlens", m, err, errlen)) < 0 ||
        (r = dev_alloc((void **)&c->pos, T * 4, "positions", m, err, errlen)) < 0 ||
        (r = dev_alloc((void **)&c->x, T * H * 4, "the residual stream", m, err, errlen)) < 0 ||
        (r = dev_alloc((void **)&c->xn, T * H * 2, "the normed stream", m, err, errlen)) < 0 ||
        (r = dev_alloc((void **)&c->qkv, T * QKVD * 2, "q/k/v", m, err, errlen)) < 0 ||
        (r = dev_alloc((void **)&c->attn, T * NH * D * 2, "attention output", m, err, errlen)) < 0 ||
        (r = dev_alloc((void **)&c->gu, T * 2 * FF * 2, "gate/up", m, err, errlen)) < 0 ||
        (r = dev_alloc((void **)&c->act, T * FF * 2, "the MLP activation", m, err, errlen)) < 0 ||
        (r = dev_alloc((void **)&c->cap[0], (size_t)m->n_ids * T * H * 2, "the capture buffers", m, err,
                       errlen)) < 0)
        goto done;
    /* A copy from pageable memory may return before its DMA lands, and nothing orders it with
     * the non-blocking streams the forward runs on (the rope table above): settled here. */
    r = cudaDeviceSynchronize() == cudaSuccess ? 0 : df_fail(err, errlen, -DF_ECUDA, "%s: uploading the model: %s", m->dir,
                                                              cudaGetErrorString(cudaGetLastError()));
done:
    free(L.p);
    return r;
}

/* ---- forward ------------------------------------------------------------------------------ */

#define TRY(x) do { int r_ = (x); if (r_ < 0) return r_; } while (0)

/* Index of the first capture of layer l, or -1. */
static int capture_index(const struct target *m, int l)
{
    for (int k = 0; k < m->n_ids; k++)
        if (m->layer_ids[k] == l)
            return k;
    return -1;
}

/* The forward of one batch on c->compute into capture set `set`; c->tokens and c->cu already
 * hold the batch (enqueued earlier on the same stream). Only launches, never synchronises.
 * Weights, GEMM inputs and every activation are bf16; the residual stream is fp32: the o_proj and
 * down GEMMs add into it in place (fp32 C = D), so the residual adds never round to bf16. On the
 * tiny fp32 golden Llama this halves the error against transformers' fp32 forward; a captured
 * layer costs one fp32 -> bf16 pass into its capture buffer (the final norm writes there directly). */
static int forward_enqueue(struct target *m, int set, int n_seqs, int T)
{
    struct cuda_model *c = (struct cuda_model *)m->impl;
    const struct hf_config *cf = &m->cfg;
    const int H = cf->hidden_size, D = cf->head_dim, NH = cf->num_heads, NKV = cf->num_kv_heads;
    const int FF = cf->intermediate_size, QD = NH * D, QKVD = (NH + 2 * NKV) * D;
    const float eps = (float)cf->rms_eps, scale = (float)(1.0 / sqrt((double)D));
    const size_t plane = (size_t)m->max_tokens * H;
    cudaStream_t s = c->compute;
    bf16_t *cap = c->cap[set];

    TRY(gk_positions(c->cu, n_seqs, c->pos, T, s));
    TRY(gk_embed_f32(c->embed, cf->vocab_size, H, c->tokens, T, c->x, H, s));
    for (int l = 0; l < c->n_layers; l++) {
        const struct cuda_layer *y = &c->layers[l];
        TRY(gk_rmsnorm_f32(c->x, H, y->in_norm, c->xn, H, T, H, eps, s));
        TRY(gk_linear(c->gemm, s, T, QKVD, H, c->xn, H, y->wqkv, NULL, 0, c->qkv, QKVD));
        if (y->bqkv)
            TRY(gk_add_bias(c->qkv, QKVD, y->bqkv, T, QKVD, s));
        TRY(gk_rope(c->qkv, QKVD, T, NH, D, c->pos, c->inv_freq, y->q_norm, eps, s));
        TRY(gk_rope(c->qkv + QD, QKVD, T, NKV, D, c->pos, c->inv_freq, y->k_norm, eps, s));
        TRY(gk_attention_prefill(c->qkv, QKVD, c->qkv + QD, QKVD, c->qkv + QD + NKV * D, QKVD, c->attn, QD,
                                 c->cu, n_seqs, T, NH, NKV, D, scale, GK_ATTN_AUTO, s));
        TRY(gk_linear_f32out(c->gemm, s, T, H, QD, c->attn, QD, y->wo, c->x, H, c->x, H));   /* x += o_proj */
        if (y->bo)
            TRY(gk_add_bias_f32(c->x, H, y->bo, T, H, s));
        TRY(gk_rmsnorm_f32(c->x, H, y->post_norm, c->xn, H, T, H, eps, s));
        TRY(gk_linear(c->gemm, s, T, 2 * FF, H, c->xn, H, y->wgu, NULL, 0, c->gu, 2 * FF));
        if (y->bgu)
            TRY(gk_add_bias(c->gu, 2 * FF, y->bgu, T, 2 * FF, s));
        TRY(gk_swiglu(c->gu, c->gu + FF, 2 * FF, c->act, FF, T, FF, s));
        TRY(gk_linear_f32out(c->gemm, s, T, H, FF, c->act, FF, y->wdown, c->x, H, c->x, H));  /* x += mlp */
        if (y->bdown)
            TRY(gk_add_bias_f32(c->x, H, y->bdown, T, H, s));
        int k = capture_index(m, l);
        if (k < 0)
            continue;
        bf16_t *dst = cap + (size_t)k * plane;
        if (l == cf->num_layers - 1)    /* HF's last hidden state is after the final norm */
            TRY(gk_rmsnorm_f32(c->x, H, c->final_norm, dst, H, T, H, eps, s));
        else
            TRY(gk_convert_f32_bf16(c->x, H, dst, H, T, H, s));
        for (int k2 = k + 1; k2 < m->n_ids; k2++)    /* the same layer captured twice */
            if (m->layer_ids[k2] == l &&
                cudaMemcpyAsync(cap + (size_t)k2 * plane, dst, (size_t)T * H * 2, cudaMemcpyDeviceToDevice, s) !=
                    cudaSuccess)
                return -DF_ECUDA;
    }
    return 0;
}

__global__ void bf16_to_f32_kernel(const bf16_t *src, float *dst, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t u = (uint32_t)src[i] << 16;
        dst[i] = __uint_as_float(u);
    }
}

/* Synchronous forward (target_forward): capture set 0, out in host or device memory. */
static int cuda_forward(struct target *m, const uint32_t *tokens, const int32_t *cu_seqlens, int n_seqs,
                        int n_tokens, void *out, enum out_dtype dtype, size_t pitch)
{
    struct cuda_model *c = (struct cuda_model *)m->impl;
    const int H = m->cfg.hidden_size, T = n_tokens;
    const size_t plane = (size_t)m->max_tokens * H;
    cudaStream_t s = c->compute;
    if (cudaSetDevice(c->device) != cudaSuccess)
        return -DF_ECUDA;
    if (dtype == OUT_F32 && !c->f32_out && cudaMalloc((void **)&c->f32_out, plane * 4) != cudaSuccess)
        return -DF_ECUDA;
    /* set 0 may still be read by a pipeline copy */
    if (cudaStreamWaitEvent(s, c->set_free[0], 0) != cudaSuccess ||
        cudaMemcpyAsync(c->tokens, tokens, (size_t)T * 4, cudaMemcpyHostToDevice, s) != cudaSuccess ||
        cudaMemcpyAsync(c->cu, cu_seqlens, (size_t)(n_seqs + 1) * 4, cudaMemcpyHostToDevice, s) != cudaSuccess)
        return -DF_ECUDA;
    TRY(forward_enqueue(m, 0, n_seqs, T));
    for (int k = 0; k < m->n_ids; k++) {
        const bf16_t *src = c->cap[0] + (size_t)k * plane;
        if (dtype == OUT_BF16) {
            if (cudaMemcpy2DAsync((char *)out + (size_t)k * H * 2, pitch, src, (size_t)H * 2, (size_t)H * 2, T,
                                  cudaMemcpyDefault, s) != cudaSuccess)
                return -DF_ECUDA;
        } else {
            bf16_to_f32_kernel<<<264, 256, 0, s>>>(src, c->f32_out, (size_t)T * H);
            if (cudaGetLastError() != cudaSuccess ||
                cudaMemcpy2DAsync((char *)out + (size_t)k * H * 4, pitch, c->f32_out, (size_t)H * 4, (size_t)H * 4,
                                  T, cudaMemcpyDefault, s) != cudaSuccess)
                return -DF_ECUDA;
        }
    }
    if (cudaStreamSynchronize(s) != cudaSuccess)
        return -DF_ECUDA;
    return 0;
}

extern "C" const struct target_backend_ops target_cuda_ops = {
    cuda_open,
    cuda_forward,
    cuda_close,
};

/* ---- host registration -------------------------------------------------------------------- */

int target_cuda_host_register(void *p, size_t bytes, char *err, size_t errlen)
{
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        /* Not sticky, but kept as the last error, which the next kernel launch's check would
         * take for its own: cleared, since pageable copies still work. */
        (void)cudaGetLastError();
        return df_fail(err, errlen, -DF_ECUDA, "cudaHostRegister(%p, %zu MiB): %s", p, bytes >> 20,
                    cudaGetErrorString(e));
    }
    return 0;
}

int target_cuda_host_unregister(void *p)
{
    return cudaHostUnregister(p) == cudaSuccess ? 0 : -DF_ECUDA;
}

/* ---- pipeline ----------------------------------------------------------------------------- */

struct pipe_entry {
    cudaEvent_t fwd_start, fwd_end, copy_start, done;
    size_t copy_bytes;
    target_pipe_done_fn fn;
    void *ctx;
};

struct target_pipe {
    struct target *m;
    uint32_t *stage_tokens[2];  /* pinned */
    int32_t *stage_cu[2];
    cudaEvent_t staged[2];      /* the upload out of stage k has completed */
    struct pipe_entry q[TARGET_PIPE_DEPTH];
    int head, count;            /* pending entries: q[head], q[head+1], ... */
    uint64_t submitted;
    double last_fwd_ms, last_copy_ms;
    struct target_pipe_stats stats;
    int error;                  /* sticky */
};

int target_pipe_create(struct target_pipe **out, struct target *m, char *err, size_t errlen)
{
    *out = NULL;
    if (m->backend != TARGET_BACKEND_CUDA)
        return df_fail(err, errlen, -DF_EUNSUPPORTED, "%s: the capture pipeline needs the CUDA backend", m->dir);
    struct cuda_model *c = (struct cuda_model *)m->impl;
    if (c->pipe)
        return df_fail(err, errlen, -DF_ESTATE, "%s: this target already has a pipeline", m->dir);
    struct target_pipe *p = (struct target_pipe *)calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->m = m;
    p->last_fwd_ms = -1;
    const size_t T = (size_t)m->max_tokens;
    int r = 0;
    if (cudaSetDevice(c->device) != cudaSuccess) {
        r = df_fail(err, errlen, -DF_ECUDA, "cudaSetDevice(%d) failed", c->device);
        goto fail_free;
    }
    if (!c->cap[1] && (r = dev_alloc((void **)&c->cap[1], (size_t)m->n_ids * T * m->cfg.hidden_size * 2,
                                     "the second capture set", m, err, errlen)) < 0)
        goto fail_free;
    for (int i = 0; i < 2; i++)
        if (cudaHostAlloc((void **)&p->stage_tokens[i], T * 4, cudaHostAllocDefault) != cudaSuccess ||
            cudaHostAlloc((void **)&p->stage_cu[i], (T + 1) * 4, cudaHostAllocDefault) != cudaSuccess ||
            cudaEventCreateWithFlags(&p->staged[i], cudaEventDisableTiming) != cudaSuccess) {
            r = df_fail(err, errlen, -DF_ECUDA, "pipeline staging: %s", cudaGetErrorString(cudaGetLastError()));
            goto fail_free;
        }
    for (int i = 0; i < TARGET_PIPE_DEPTH; i++)
        if (cudaEventCreate(&p->q[i].fwd_start) != cudaSuccess || cudaEventCreate(&p->q[i].fwd_end) != cudaSuccess ||
            cudaEventCreate(&p->q[i].copy_start) != cudaSuccess || cudaEventCreate(&p->q[i].done) != cudaSuccess) {
            r = df_fail(err, errlen, -DF_ECUDA, "pipeline events: %s", cudaGetErrorString(cudaGetLastError()));
            goto fail_free;
        }
    c->pipe = p;
    *out = p;
    return 0;
fail_free:
    p->m = NULL;
    target_pipe_free(p);
    return r;
}

/* Completes the oldest entry: blocking waits for it, else only if it is done. 1 done, 0 not yet. */
static int complete_oldest(struct target_pipe *p, bool block)
{
    struct pipe_entry *e = &p->q[p->head];
    cudaError_t st = block ? cudaEventSynchronize(e->done) : cudaEventQuery(e->done);
    if (st == cudaErrorNotReady)
        return 0;
    int status = st == cudaSuccess ? 0 : -DF_ECUDA;
    if (status < 0) {
        p->error = status;
        /* The error may be an earlier call's (an event reports those too), with this entry's
         * copies into its slot still queued: the caller gives the slot back on it, so they end
         * first (at once when the error is sticky), as target_pipe_submit's failure does. */
        struct cuda_model *c = (struct cuda_model *)p->m->impl;
        cudaStreamSynchronize(c->compute);
        cudaStreamSynchronize(c->copy);
        cudaGetLastError();
    }
    float ms = -1, cms = 0;
    if (status == 0 && cudaEventElapsedTime(&ms, e->fwd_start, e->fwd_end) == cudaSuccess) {
        p->last_fwd_ms = ms;
        p->stats.forward_ms += ms;
        if (e->copy_bytes && cudaEventElapsedTime(&cms, e->copy_start, e->done) == cudaSuccess) {
            p->last_copy_ms = cms;
            p->stats.copy_ms += cms;
            p->stats.copy_bytes += e->copy_bytes;
        }
        p->stats.batches++;
    }
    p->head = (p->head + 1) % TARGET_PIPE_DEPTH;
    p->count--;
    if (e->fn)
        e->fn(e->ctx, status);
    return 1;
}

int target_pipe_poll(struct target_pipe *p)
{
    int n = 0;
    while (p->count > 0 && complete_oldest(p, false))
        n++;
    return p->error ? p->error : n;
}

int target_pipe_drain(struct target_pipe *p)
{
    if (p->m)
        cudaSetDevice(((struct cuda_model *)p->m->impl)->device);
    while (p->count > 0)
        complete_oldest(p, true);
    return p->error;
}

int target_pipe_pending(const struct target_pipe *p)
{
    return p->count;
}

int target_pipe_ready(const struct target_pipe *p)
{
    if (p->error)
        return 1;
    if (p->count == TARGET_PIPE_DEPTH)
        return 0;
    return cudaEventQuery(p->staged[p->submitted & 1]) != cudaErrorNotReady;
}

double target_pipe_last_forward_ms(const struct target_pipe *p)
{
    return p->last_fwd_ms;
}

double target_pipe_last_copy_ms(const struct target_pipe *p)
{
    return p->last_copy_ms;
}

void target_pipe_get_stats(const struct target_pipe *p, struct target_pipe_stats *st)
{
    *st = p->stats;
}

/* Spins until *never (device memory, 0) changes: it never does. */
__global__ void stall_kernel(const volatile int *never)
{
    while (!*never) {
    }
}

int target_pipe_debug_stall(struct target_pipe *p)
{
    struct cuda_model *c = (struct cuda_model *)p->m->impl;
    int *never = NULL;      /* (kept: the kernel reads it for as long as the process lives) */
    if (cudaSetDevice(c->device) != cudaSuccess || cudaMalloc((void **)&never, sizeof *never) != cudaSuccess ||
        cudaMemset(never, 0, sizeof *never) != cudaSuccess)
        return -DF_ECUDA;
    stall_kernel<<<1, 1, 0, c->compute>>>(never);
    return cudaGetLastError() == cudaSuccess ? 0 : -DF_ECUDA;
}

void target_pipe_free(struct target_pipe *p)
{
    if (!p)
        return;
    if (p->m) {
        target_pipe_drain(p);
        ((struct cuda_model *)p->m->impl)->pipe = NULL;
    }
    for (int i = 0; i < 2; i++) {
        if (p->stage_tokens[i])
            cudaFreeHost(p->stage_tokens[i]);
        if (p->stage_cu[i])
            cudaFreeHost(p->stage_cu[i]);
        if (p->staged[i])
            cudaEventDestroy(p->staged[i]);
    }
    for (int i = 0; i < TARGET_PIPE_DEPTH; i++) {
        if (p->q[i].fwd_start)
            cudaEventDestroy(p->q[i].fwd_start);
        if (p->q[i].fwd_end)
            cudaEventDestroy(p->q[i].fwd_end);
        if (p->q[i].copy_start)
            cudaEventDestroy(p->q[i].copy_start);
        if (p->q[i].done)
            cudaEventDestroy(p->q[i].done);
    }
    free(p);
}

#define PIPE_CUDA(call) do { if ((call) != cudaSuccess) { p->error = -DF_ECUDA; return p->error; } } while (0)

static int submit_enqueue(struct target_pipe *p, const uint32_t *tokens, const int32_t *cu_seqlens, int n_seqs,
                          int n_tokens, void *dst, size_t dst_pitch, target_pipe_done_fn done, void *ctx);

int target_pipe_submit(struct target_pipe *p, const uint32_t *tokens, const int32_t *cu_seqlens, int n_seqs,
                       int n_tokens, void *dst, size_t dst_pitch, target_pipe_done_fn done, void *ctx)
{
    int r = submit_enqueue(p, tokens, cu_seqlens, n_seqs, n_tokens, dst, dst_pitch, done, ctx);
    if (r == -DF_ECUDA) {
        /* Copies into dst queued before the failing call may still run: the caller gives dst (a
         * ring slot) back on this error, so they end first (at once when the error is sticky). */
        struct cuda_model *c = (struct cuda_model *)p->m->impl;
        cudaStreamSynchronize(c->compute);
        cudaStreamSynchronize(c->copy);
        cudaGetLastError();
    }
    return r;
}

static int submit_enqueue(struct target_pipe *p, const uint32_t *tokens, const int32_t *cu_seqlens, int n_seqs,
                          int n_tokens, void *dst, size_t dst_pitch, target_pipe_done_fn done, void *ctx)
{
    struct target *m = p->m;
    struct cuda_model *c = (struct cuda_model *)m->impl;
    const int H = m->cfg.hidden_size, T = n_tokens;
    if (p->error)
        return p->error;
    if (n_tokens < 1 || n_tokens > m->max_tokens || n_seqs < 1 || n_seqs > n_tokens ||
        (dst && dst_pitch < (size_t)m->n_ids * H * 2))
        return -DF_ERANGE;
    if (cu_seqlens[0] != 0 || cu_seqlens[n_seqs] != n_tokens)
        return -DF_EFORMAT;
    for (int s = 0; s < n_seqs; s++)
        if (cu_seqlens[s + 1] < cu_seqlens[s])
            return -DF_EFORMAT;
    for (int t = 0; t < n_tokens; t++)
        if (tokens[t] >= (uint32_t)m->cfg.vocab_size)
            return -DF_ERANGE;
    PIPE_CUDA(cudaSetDevice(c->device));
    if (p->count == TARGET_PIPE_DEPTH)
        complete_oldest(p, true);
    if (p->error)
        return p->error;

    const int set = (int)(p->submitted & 1);
    /* the staging area of this set was last uploaded two batches ago: normally long done */
    if (cudaEventQuery(p->staged[set]) != cudaSuccess)
        PIPE_CUDA(cudaEventSynchronize(p->staged[set]));
    memcpy(p->stage_tokens[set], tokens, (size_t)T * 4);
    memcpy(p->stage_cu[set], cu_seqlens, (size_t)(n_seqs + 1) * 4);

    struct pipe_entry *e = &p->q[(p->head + p->count) % TARGET_PIPE_DEPTH];
    cudaStream_t s = c->compute;
    PIPE_CUDA(cudaMemcpyAsync(c->tokens, p->stage_tokens[set], (size_t)T * 4, cudaMemcpyHostToDevice, s));
    PIPE_CUDA(cudaMemcpyAsync(c->cu, p->stage_cu[set], (size_t)(n_seqs + 1) * 4, cudaMemcpyHostToDevice, s));
    PIPE_CUDA(cudaEventRecord(p->staged[set], s));
    /* the copy that last read this capture set must be over before the forward rewrites it */
    PIPE_CUDA(cudaStreamWaitEvent(s, c->set_free[set], 0));
    PIPE_CUDA(cudaEventRecord(e->fwd_start, s));
    int r = forward_enqueue(m, set, n_seqs, T);
    if (r < 0) {
        p->error = r == -EINVAL ? -DF_ECUDA : r;
        return p->error;
    }
    PIPE_CUDA(cudaEventRecord(e->fwd_end, s));

    /* copy stream: after the forward, one pitched copy per captured layer into its column block */
    PIPE_CUDA(cudaStreamWaitEvent(c->copy, e->fwd_end, 0));
    PIPE_CUDA(cudaEventRecord(e->copy_start, c->copy));
    const size_t plane = (size_t)m->max_tokens * H;
    for (int k = 0; dst && k < m->n_ids; k++)
        PIPE_CUDA(cudaMemcpy2DAsync((char *)dst + (size_t)k * H * 2, dst_pitch, c->cap[set] + (size_t)k * plane,
                                    (size_t)H * 2, (size_t)H * 2, T, cudaMemcpyDeviceToHost, c->copy));
    e->copy_bytes = dst ? (size_t)m->n_ids * H * 2 * T : 0;
    PIPE_CUDA(cudaEventRecord(c->set_free[set], c->copy));
    PIPE_CUDA(cudaEventRecord(e->done, c->copy));
    e->fn = done;
    e->ctx = ctx;
    p->count++;
    p->submitted++;
    return 0;
}
