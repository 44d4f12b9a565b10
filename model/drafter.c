/* drafter.c: the drafter's config, parameter layout (one fp32 buffer), initialisation,
 * and the optimizer half of the training step. Forward/backward live in drafter_cpu.c. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/config.h"
#include "common/err.h"
#include "model/drafter.h"
#include "model/hfconfig.h"
#include "model/optim.h"
#include "model/safetensors.h"

/* drafter_cpu.c */
int drafter_cpu_scratch_alloc(struct drafter *d);
void drafter_cpu_scratch_free(struct drafter_scratch *ws);
struct obj_block *drafter_cpu_block_buf(struct drafter *d, int32_t **work);

int drafter_config_validate(const struct drafter_config *c, char *err, size_t errlen)
{
#define NEED(cond, ...) do { if (!(cond)) { snprintf(err, errlen, __VA_ARGS__); return -DF_ERANGE; } } while (0)
    NEED(c->hidden_size > 0, "drafter config: hidden_size %d must be positive", c->hidden_size);
    NEED(c->num_layers > 0, "drafter config: num_hidden_layers %d must be positive", c->num_layers);
    NEED(c->num_heads > 0 && c->num_kv_heads > 0 && c->num_heads % c->num_kv_heads == 0,
         "drafter config: num_attention_heads %d must be a positive multiple of num_key_value_heads %d",
         c->num_heads, c->num_kv_heads);
    NEED(c->head_dim > 0 && c->head_dim % 2 == 0, "drafter config: head_dim %d must be positive and even",
         c->head_dim);
    NEED(c->intermediate_size > 0, "drafter config: intermediate_size %d must be positive",
         c->intermediate_size);
    NEED(c->vocab_size > 1, "drafter config: vocab_size %d must be > 1", c->vocab_size);
    NEED(c->block_size >= 2, "drafter config: block_size %d must be >= 2", c->block_size);
    NEED(c->mask_token_id >= 0 && c->mask_token_id < c->vocab_size,
         "drafter config: mask_token_id %d outside the vocabulary (%d)", c->mask_token_id, c->vocab_size);
    NEED(c->n_target_ids >= 1 && c->n_target_ids <= DRAFTER_MAX_CTX_LAYERS,
         "drafter config: %d target_layer_ids (1..%d allowed)", c->n_target_ids, DRAFTER_MAX_CTX_LAYERS);
    NEED(c->num_target_layers > 0, "drafter config: num_target_layers %d must be positive",
         c->num_target_layers);
    for (int i = 0; i < c->n_target_ids; i++)
        NEED(c->target_layer_ids[i] >= 0 && c->target_layer_ids[i] < c->num_target_layers,
             "drafter config: target_layer_ids[%d] = %d outside the target's %d layers", i,
             c->target_layer_ids[i], c->num_target_layers);
    NEED(c->rms_norm_eps > 0 && c->rms_norm_eps < 1, "drafter config: rms_norm_eps %g out of range",
         c->rms_norm_eps);
    NEED(c->rope_theta > 1, "drafter config: rope_theta %g must be > 1", c->rope_theta);
    NEED(c->max_position_embeddings > 0, "drafter config: max_position_embeddings %d must be positive",
         c->max_position_embeddings);
    NEED(c->initializer_range >= 0, "drafter config: initializer_range %g must be >= 0",
         c->initializer_range);
#undef NEED
    return 0;
}

int drafter_config_from_target(struct drafter_config *c, const struct hf_config *t, int num_layers,
                               const int *target_layer_ids, int n_target_ids, int block_size,
                               int mask_token_id, int num_heads, int num_kv_heads, int head_dim,
                               int intermediate_size, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->hidden_size = t->hidden_size;
    c->num_layers = num_layers;
    c->num_heads = num_heads > 0 ? num_heads : t->num_heads;
    c->num_kv_heads = num_kv_heads > 0 ? num_kv_heads : t->num_kv_heads;
    c->head_dim = head_dim > 0 ? head_dim : t->head_dim;
    c->intermediate_size = intermediate_size > 0 ? intermediate_size : t->intermediate_size;
    c->vocab_size = t->vocab_size;
    c->num_target_layers = t->num_layers;
    if (n_target_ids < 1 || n_target_ids > DRAFTER_MAX_CTX_LAYERS) {
        snprintf(err, errlen, "drafter config: %d target layer ids", n_target_ids);
        return -DF_ERANGE;
    }
    c->n_target_ids = n_target_ids;
    memcpy(c->target_layer_ids, target_layer_ids, (size_t)n_target_ids * sizeof(int));
    c->block_size = block_size;
    c->mask_token_id = mask_token_id >= 0 ? mask_token_id : t->vocab_size - 1;
    c->max_position_embeddings = t->max_position_embeddings;
    c->rms_norm_eps = t->rms_eps;
    c->rope_theta = t->rope.theta;
    c->initializer_range = 0.02;
    return drafter_config_validate(c, err, errlen);
}

int drafter_config_from_cfg(struct drafter_config *c, const struct hf_config *t, const struct dflash_cfg *cfg,
                            const int *target_layer_ids, int n_target_ids, char *err, size_t errlen)
{
    const struct cfg_drafter *k = &cfg->drafter;
    return drafter_config_from_target(c, t, (int)cfg->model.draft_layers, target_layer_ids, n_target_ids,
                                      (int)k->block_size, (int)k->mask_token_id, (int)k->num_heads,
                                      (int)k->num_kv_heads, (int)k->head_dim, (int)k->intermediate_size, err, errlen);
}

struct drafter_train_opts drafter_train_opts_from_cfg(const struct dflash_cfg *cfg)
{
    const struct cfg_drafter *k = &cfg->drafter;
    return (struct drafter_train_opts){ .lr = k->lr, .min_lr_ratio = k->min_lr_ratio, .warmup_steps = k->warmup_steps,
                                        .total_steps = k->total_steps, .weight_decay = k->weight_decay,
                                        .beta1 = k->beta1, .beta2 = k->beta2, .eps = k->adam_eps,
                                        .grad_clip = k->grad_clip };
}

int drafter_max_blocks_for(int max_tokens, int max_seqs, int num_anchors)
{
    /* An anchor needs two supervised tokens of its sequence: at most n-1 per sequence. */
    long by_anchor = (long)max_seqs * num_anchors;
    long n = by_anchor < max_tokens ? by_anchor : max_tokens;
    return n < 1 ? 1 : (int)n;
}

static void add_tensor(struct drafter *d, size_t *off, const char *name, int ndim, int64_t r,
                       int64_t c)
{
    struct drafter_tensor *t = &d->tensors[d->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = r;
    t->shape[1] = ndim == 2 ? c : 0;
    t->numel = (size_t)r * (size_t)(ndim == 2 ? c : 1);
    t->offset = *off;
    t->decay = ndim == 2;
    *off += t->numel;
}

static int build_layout(struct drafter *d)
{
    const struct drafter_config *c = &d->cfg;
    int64_t H = c->hidden_size, qd = (int64_t)c->num_heads * c->head_dim;
    int64_t kvd = (int64_t)c->num_kv_heads * c->head_dim, I = c->intermediate_size;
    d->tensors = calloc((size_t)(3 + 11 * c->num_layers), sizeof *d->tensors);
    d->layer = calloc((size_t)c->num_layers, sizeof *d->layer);
    if (!d->tensors || !d->layer)
        return -ENOMEM;
    size_t off = 0;
    char nm[DRAFTER_NAME_MAX];
    d->off_fc = off;
    add_tensor(d, &off, "fc.weight", 2, H, (int64_t)c->n_target_ids * H);
    d->off_hidden_norm = off;
    add_tensor(d, &off, "hidden_norm.weight", 1, H, 0);
    for (int l = 0; l < c->num_layers; l++) {
        struct drafter_layer_off *L = &d->layer[l];
#define T(field, suffix, nd, r, cc) do { \
        snprintf(nm, sizeof nm, "layers.%d.%s", l, suffix); \
        L->field = off; add_tensor(d, &off, nm, nd, r, cc); } while (0)
        T(input_norm, "input_layernorm.weight", 1, H, 0);
        T(q, "self_attn.q_proj.weight", 2, qd, H);
        T(k, "self_attn.k_proj.weight", 2, kvd, H);
        T(v, "self_attn.v_proj.weight", 2, kvd, H);
        T(q_norm, "self_attn.q_norm.weight", 1, c->head_dim, 0);
        T(k_norm, "self_attn.k_norm.weight", 1, c->head_dim, 0);
        T(o, "self_attn.o_proj.weight", 2, H, qd);
        T(post_norm, "post_attention_layernorm.weight", 1, H, 0);
        T(gate, "mlp.gate_proj.weight", 2, I, H);
        T(up, "mlp.up_proj.weight", 2, I, H);
        T(down, "mlp.down_proj.weight", 2, H, I);
#undef T
    }
    d->off_norm = off;
    add_tensor(d, &off, "norm.weight", 1, H, 0);
    d->n_params = off;
    return 0;
}

const struct drafter_tensor *drafter_find_tensor(const struct drafter *d, const char *name)
{
    for (int i = 0; i < d->n_tensors; i++)
        if (!strcmp(d->tensors[i].name, name))
            return &d->tensors[i];
    return NULL;
}

/* Each matrix is drawn in chunks of INIT_CHUNK values, chunk c of tensor i from its own stream
 * keyed (seed, "init", i, c): a value depends only on (seed, tensor, position), so any number of
 * threads, taking chunks in any order, writes the same parameters. Even, so that no Box-Muller
 * pair straddles two chunks. */
#define INIT_CHUNK ((size_t)1 << 20)
#define INIT_MAX_THREADS 16
#define INIT_STREAM 0x696e6974ull       /* "init" */

struct init_job {
    struct drafter *d;
    uint64_t seed;
    size_t n_chunks;                    /* over every matrix, in tensor order */
    atomic_size_t next;                 /* the next chunk to take */
};

static size_t init_chunks_of(const struct drafter_tensor *t)
{
    return t->ndim == 2 ? (t->numel + INIT_CHUNK - 1) / INIT_CHUNK : 0;
}

static void init_chunk(const struct init_job *job, size_t chunk)
{
    struct drafter *d = job->d;
    int i = 0;
    while (chunk >= init_chunks_of(&d->tensors[i]))
        chunk -= init_chunks_of(&d->tensors[i++]);
    const struct drafter_tensor *t = &d->tensors[i];
    size_t begin = chunk * INIT_CHUNK;
    size_t n = t->numel - begin < INIT_CHUNK ? t->numel - begin : INIT_CHUNK;
    struct obj_rng r;
    obj_rng_seed(&r, job->seed, INIT_STREAM, (uint64_t)i, (uint64_t)chunk);
    obj_rng_fill_normal(&r, d->params + t->offset + begin, n, d->cfg.initializer_range);
}

static void *init_worker(void *arg)
{
    struct init_job *job = arg;
    for (;;) {
        size_t c = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (c >= job->n_chunks)
            return NULL;
        init_chunk(job, c);
    }
}

/* CPUs this process may run on (its affinity mask, else the online ones), capped. */
static int init_default_threads(void)
{
    cpu_set_t set;
    long n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    if (n < 1)
        n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > INIT_MAX_THREADS ? INIT_MAX_THREADS : (int)n;
}

void drafter_init_params(struct drafter *d, uint64_t seed, int threads)
{
    struct init_job job = { .d = d, .seed = seed };
    atomic_init(&job.next, 0);
    size_t n_drawn = 0;
    for (int i = 0; i < d->n_tensors; i++) {
        const struct drafter_tensor *t = &d->tensors[i];
        if (t->ndim == 1)
            for (size_t j = 0; j < t->numel; j++)
                d->params[t->offset + j] = 1.0f;
        else
            n_drawn += t->numel;
        job.n_chunks += init_chunks_of(t);
    }
    /* never more threads than chunks; by default one per full chunk at most (a small drafter is
     * not worth starting threads for) */
    size_t cap = threads > 0 ? job.n_chunks : n_drawn / INIT_CHUNK;
    if (threads <= 0)
        threads = init_default_threads();
    if ((size_t)threads > cap)
        threads = cap > 0 ? (int)cap : 1;
    if (threads > INIT_MAX_THREADS)
        threads = INIT_MAX_THREADS;
    /* The calling thread works too; should a thread fail to start, the others take its chunks. */
    pthread_t tid[INIT_MAX_THREADS - 1];
    int started = 0;
    while (started < threads - 1 && pthread_create(&tid[started], NULL, init_worker, &job) == 0)
        started++;
    init_worker(&job);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
}

int drafter_create(struct drafter **out, const struct drafter_config *cfg, const float *embed,
                   const float *lm_head, int max_tokens, int max_blocks, uint64_t seed,
                   char *err, size_t errlen)
{
    *out = NULL;
    int r = drafter_config_validate(cfg, err, errlen);
    if (r < 0)
        return r;
    if (!embed || !lm_head) {
        snprintf(err, errlen, "drafter: the target's embedding and LM head are required");
        return -EINVAL;
    }
    if (max_tokens < 2 || max_blocks < 1) {
        snprintf(err, errlen, "drafter: max_tokens %d / max_blocks %d too small", max_tokens, max_blocks);
        return -DF_ERANGE;
    }
    struct drafter *d = calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    d->cfg = *cfg;
    d->embed = embed;
    d->lm_head = lm_head;
    d->max_tokens = max_tokens;
    d->max_blocks = max_blocks;
    d->head_chunk_rows = 128;
    r = build_layout(d);
    if (r < 0)
        goto fail;
    d->params = calloc(d->n_params, sizeof(float));
    d->grads = calloc(d->n_params, sizeof(float));
    d->opt = calloc(1, sizeof *d->opt);
    if (!d->params || !d->grads || !d->opt) {
        r = -ENOMEM;
        goto fail;
    }
    struct optim_segment *seg = calloc((size_t)d->n_tensors, sizeof *seg);
    if (!seg) {
        r = -ENOMEM;
        goto fail;
    }
    for (int i = 0; i < d->n_tensors; i++)
        seg[i] = (struct optim_segment){ d->tensors[i].offset, d->tensors[i].numel, d->tensors[i].decay };
    r = optim_init(d->opt, d->n_params, seg, d->n_tensors);
    free(seg);
    if (r < 0)
        goto fail;
    drafter_init_params(d, seed, 0);
    r = drafter_cpu_scratch_alloc(d);
    if (r < 0) {
        snprintf(err, errlen, "drafter: scratch for %d tokens / %d blocks: %s", max_tokens,
                 max_blocks, err_str(r));
        goto fail;
    }
    *out = d;
    return 0;
fail:
    if (r == -ENOMEM && err && !err[0])
        snprintf(err, errlen, "drafter: out of memory");
    drafter_free(d);
    return r;
}

void drafter_free(struct drafter *d)
{
    if (!d)
        return;
    drafter_cpu_scratch_free(d->ws);
    if (d->opt) {
        optim_done(d->opt);
        free(d->opt);
    }
    free(d->params);
    free(d->grads);
    free(d->tensors);
    free(d->layer);
    free(d);
}

int drafter_init_layer_from(struct drafter *d, int layer, const struct st_set *src,
                            const char *src_prefix, char *err, size_t errlen)
{
    static const char *const suffix[] = {
        "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
        "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
        "mlp.up_proj.weight", "mlp.down_proj.weight",
    };
    if (layer < 0 || layer >= d->cfg.num_layers) {
        snprintf(err, errlen, "drafter: no layer %d", layer);
        return -DF_ERANGE;
    }
    for (size_t i = 0; i < sizeof suffix / sizeof *suffix; i++) {
        char dst[DRAFTER_NAME_MAX], name[256];
        snprintf(dst, sizeof dst, "layers.%d.%s", layer, suffix[i]);
        snprintf(name, sizeof name, "%s%s", src_prefix, suffix[i]);
        const struct drafter_tensor *t = drafter_find_tensor(d, dst);
        const struct st_tensor *st;
        int r = st_expect(src, name, t->ndim, t->shape, &st, err, errlen);
        if (r < 0)
            return r;
        r = st_read_f32(st, 0, (int64_t)t->numel, d->params + t->offset);
        if (r < 0) {
            snprintf(err, errlen, "%s: %s: %s", st->file, name, err_str(r));
            return r;
        }
    }
    return 0;
}

void drafter_set_progress(struct drafter *d, void (*fn)(void *arg), void *arg)
{
    d->progress = fn;
    d->progress_arg = arg;
}

int64_t drafter_step_count(const struct drafter *d)
{
    return d->opt->step;
}

int drafter_optimizer_step(struct drafter *d, double global_weight_sum,
                           const struct drafter_train_opts *o, struct drafter_step_info *info)
{
    struct drafter_step_info tmp;
    if (!info)
        info = &tmp;
    memset(info, 0, sizeof *info);
    info->step = d->opt->step;
    if (!(global_weight_sum > 0))
        return -DF_ERANGE;      /* nothing supervised anywhere: no step */
    optim_scale(d->grads, d->n_params, (float)(1.0 / global_weight_sum));
    double norm = sqrt(optim_sumsq(d->grads, d->n_params));
    info->grad_norm = norm;
    if (!isfinite(norm))
        return -DF_ENAN;
    if (o->grad_clip > 0 && norm > o->grad_clip)
        optim_scale(d->grads, d->n_params, (float)(o->grad_clip / (norm + 1e-6)));
    info->lr = optim_lr(o->lr, o->min_lr_ratio, o->warmup_steps, o->total_steps, d->opt->step);
    optim_adamw(d->opt, d->params, d->grads, info->lr, o->beta1, o->beta2, o->eps, o->weight_decay);
    info->step = d->opt->step;
    return 0;
}

int drafter_train_step(struct drafter *d, const struct obj_batch *b, int num_anchors, double gamma,
                       const struct obj_rng_key *key, const struct drafter_train_opts *o,
                       struct drafter_metrics *m, struct drafter_step_info *info)
{
    int32_t *work;
    struct obj_block *blocks = drafter_cpu_block_buf(d, &work);
    if (b->n_tokens > d->max_tokens)
        return -DF_ERANGE;
    int n = obj_sample_anchors(b, num_anchors, key, blocks, d->max_blocks, work);
    if (n < 0)
        return n;
    int r = drafter_forward_backward(d, b, blocks, n, gamma, m);
    if (r < 0)
        return r;
    return drafter_optimizer_step(d, m->weight_sum, o, info);
}
