/* target_cpu.c: the CPU backend of the target model: fp32 weights (bf16/f16 upcast at load),
 * OpenBLAS GEMMs, one scratch arena sized at open so the forward never allocates. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/err.h"
#include "model/cpu_ops.h"
#include "model/target_internal.h"

static int cpu_threads = 1;

void target_cpu_set_threads(int threads)
{
    cpu_threads = threads > 0 ? threads : 1;
    openblas_set_num_threads(cpu_threads);
}

struct cpu_layer {
    float *w[TW_COUNT];         /* fp32 copies; NULL where the layer has no such tensor */
};

struct cpu_model {
    struct cpu_layer *layers;   /* 0..last_layer */
    int n_layers;
    const struct st_tensor *embed;  /* rows converted on demand from the mapping */
    float *final_norm;          /* only when the model's last layer is captured */

    /* scratch arena, [max_tokens, ...] each */
    float *arena;
    float *x, *h, *q, *k, *v, *attn, *gate, *up, *attn_scratch, *rope_cos, *rope_sin;
    int32_t *pos;
};

static void cpu_close(struct target *m)
{
    struct cpu_model *c = m->impl;
    if (!c)
        return;
    for (int l = 0; c->layers && l < c->n_layers; l++)
        for (int w = 0; w < TW_COUNT; w++)
            free(c->layers[l].w[w]);
    free(c->layers);
    free(c->final_norm);
    free(c->arena);
    free(c);
    m->impl = NULL;
}

static int load(const struct st_tensor *t, float **out, char *err, size_t errlen)
{
    int r = st_load_f32(t, out);
    if (r < 0)
        snprintf(err, errlen, "%s: tensor '%s': %s", t->file, t->name, r == -ENOMEM ? "out of memory" : err_str(r));
    return r;
}

/* The layers' weights in fp32 and the scratch for ring.max_tokens against the host's whole
 * memory: more than that is the configuration's doing (-DF_ERANGE: target-d exits 78 rather than
 * be restarted, each time reading the model again, into the same shortage). A shortfall of free
 * memory only stays -ENOMEM at the allocation. */
static int check_fits(const struct target *m, size_t scratch, char *err, size_t errlen)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return 0;       /* (unknown: the allocations tell) */
    /* (from config.json: the files are read once, by the load; their shapes are held to it there) */
    const size_t weights = (size_t)(m->last_layer + 1) * target_layer_numel(&m->cfg) * sizeof(float);
    const size_t have = (size_t)pages * (size_t)page;
    if (weights + scratch <= have)
        return 0;
    const double gib = 1073741824.0;
    return df_fail(err, errlen, -DF_ERANGE,
                   "%s: the weights of %d layers in fp32 (%.2f GiB) and the scratch for %d tokens (%.2f GiB) need "
                   "%.2f GiB, more than this host's %.2f GiB: lower ring.max_tokens or use target.backend = cuda",
                   m->dir, m->last_layer + 1, weights / gib, m->max_tokens, scratch / gib,
                   (weights + scratch) / gib, have / gib);
}

static int cpu_open(struct target *m, char *err, size_t errlen)
{
    const struct hf_config *cf = &m->cfg;
    struct cpu_model *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    m->impl = c;
    openblas_set_num_threads(cpu_threads);

    const struct st_tensor *norm;
    bool want_norm = m->last_layer == cf->num_layers - 1;   /* HF's last hidden state is post-norm */
    int r = target_find_globals(m, want_norm, &c->embed, &norm, err, errlen);
    if (r < 0)
        return r;
    if (want_norm && (r = load(norm, &c->final_norm, err, errlen)) < 0)
        return r;

    c->n_layers = m->last_layer + 1;
    const size_t T = (size_t)m->max_tokens, H = cf->hidden_size, D = cf->head_dim;
    const size_t QD = (size_t)cf->num_heads * D, KD = (size_t)cf->num_kv_heads * D, FF = cf->intermediate_size;
    const size_t sizes[] = { T * H, T * H, T * QD, T * KD, T * KD, T * QD, T * FF, T * FF,
                             cpu_attention_scratch_floats(m->max_tokens), T * (D / 2), T * (D / 2), T };
    float *pos_slice;
    float **ptrs[] = { &c->x, &c->h, &c->q, &c->k, &c->v, &c->attn, &c->gate, &c->up,
                       &c->attn_scratch, &c->rope_cos, &c->rope_sin, &pos_slice };
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        total += (sizes[i] + 15) & ~(size_t)15;     /* 64-byte aligned slices */
    if ((r = check_fits(m, total * sizeof(float), err, errlen)) < 0)
        return r;

    if (!(c->layers = calloc(c->n_layers, sizeof *c->layers)))
        return -ENOMEM;
    for (int l = 0; l < c->n_layers; l++) {
        const struct st_tensor *t[TW_COUNT];
        if ((r = target_find_layer(m, l, t, err, errlen)) < 0)
            return r;
        for (int w = 0; w < TW_COUNT; w++)
            if (t[w] && (r = load(t[w], &c->layers[l].w[w], err, errlen)) < 0)
                return r;
    }

    if (!(c->arena = aligned_alloc(64, total * sizeof(float)))) {
        snprintf(err, errlen, "%s: scratch for %d tokens (%zu MiB): out of memory", m->dir, m->max_tokens,
                 total * sizeof(float) >> 20);
        return -ENOMEM;
    }
    float *p = c->arena;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        *ptrs[i] = p;
        p += (sizes[i] + 15) & ~(size_t)15;
    }
    c->pos = (int32_t *)pos_slice;     /* int32 and float have the same size */

    /* positions restart per sequence, so max_tokens bounds every position */
    float *inv_freq = malloc(D / 2 * sizeof *inv_freq);
    if (!inv_freq)
        return -ENOMEM;
    cpu_rope_inv_freq(inv_freq, (int)D, &cf->rope);
    cpu_rope_table(c->rope_cos, c->rope_sin, m->max_tokens, (int)D, inv_freq);
    free(inv_freq);
    return 0;
}

static void write_capture(const float *src, int n_tokens, int hidden, int slot, void *out, enum out_dtype dtype,
                          size_t pitch)
{
    for (int t = 0; t < n_tokens; t++) {
        unsigned char *row = (unsigned char *)out + (size_t)t * pitch;
        const float *s = src + (size_t)t * hidden;
        if (dtype == OUT_F32)
            memcpy(row + (size_t)slot * hidden * 4, s, (size_t)hidden * 4);
        else
            cpu_f32_to_bf16((uint16_t *)(row + (size_t)slot * hidden * 2), s, (size_t)hidden);
    }
}

static int cpu_forward(struct target *m, const uint32_t *tokens, const int32_t *cu_seqlens, int n_seqs,
                       int n_tokens, void *out, enum out_dtype dtype, size_t pitch)
{
    const struct hf_config *cf = &m->cfg;
    struct cpu_model *c = m->impl;
    const int T = n_tokens, H = cf->hidden_size, D = cf->head_dim, FF = cf->intermediate_size;
    const int NH = cf->num_heads, NKV = cf->num_kv_heads;
    const float eps = (float)cf->rms_eps, scale = (float)(1.0 / sqrt((double)D));

    cpu_positions(c->pos, cu_seqlens, n_seqs);
    for (int t = 0; t < T; t++)
        st_read_f32(c->embed, (int64_t)tokens[t] * H, H, c->x + (size_t)t * H);

    for (int l = 0; l < c->n_layers; l++) {
        float *const *w = c->layers[l].w;
        cpu_rmsnorm(c->h, c->x, w[TW_IN_NORM], T, H, eps);
        cpu_linear(c->q, c->h, w[TW_Q], w[TW_Q_BIAS], T, H, NH * D, 0.0f);
        cpu_linear(c->k, c->h, w[TW_K], w[TW_K_BIAS], T, H, NKV * D, 0.0f);
        cpu_linear(c->v, c->h, w[TW_V], w[TW_V_BIAS], T, H, NKV * D, 0.0f);
        if (w[TW_Q_NORM]) {     /* Qwen3: RMSNorm over each head before rotary */
            cpu_rmsnorm(c->q, c->q, w[TW_Q_NORM], T * NH, D, eps);
            cpu_rmsnorm(c->k, c->k, w[TW_K_NORM], T * NKV, D, eps);
        }
        cpu_rope_apply(c->q, T, NH, D, c->pos, c->rope_cos, c->rope_sin);
        cpu_rope_apply(c->k, T, NKV, D, c->pos, c->rope_cos, c->rope_sin);
        cpu_attention_varlen(c->attn, c->q, c->k, c->v, cu_seqlens, n_seqs, NH, NKV, D, scale, c->attn_scratch);
        cpu_linear(c->x, c->attn, w[TW_O], w[TW_O_BIAS], T, NH * D, H, 1.0f);      /* x += o_proj(attn) */
        if (m->progress)
            m->progress(m->progress_arg);

        cpu_rmsnorm(c->h, c->x, w[TW_POST_NORM], T, H, eps);
        cpu_linear(c->gate, c->h, w[TW_GATE], w[TW_GATE_BIAS], T, H, FF, 0.0f);
        cpu_linear(c->up, c->h, w[TW_UP], w[TW_UP_BIAS], T, H, FF, 0.0f);
        cpu_swiglu(c->gate, c->gate, c->up, (size_t)T * FF);
        cpu_linear(c->x, c->gate, w[TW_DOWN], w[TW_DOWN_BIAS], T, FF, H, 1.0f);     /* x += down(mlp) */

        const float *state = c->x;
        if (l == cf->num_layers - 1) {
            cpu_rmsnorm(c->h, c->x, c->final_norm, T, H, eps);
            state = c->h;
        }
        for (int k = 0; k < m->n_ids; k++)
            if (m->layer_ids[k] == l)
                write_capture(state, T, H, k, out, dtype, pitch);
        if (m->progress)
            m->progress(m->progress_arg);
    }
    return 0;
}

const struct target_backend_ops target_cpu_ops = {
    .open = cpu_open,
    .forward = cpu_forward,
    .close = cpu_close,
};
