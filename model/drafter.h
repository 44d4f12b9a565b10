/* drafter.h: the DFlash drafter (Qwen3-style layers over the target's captured features),
 * its parameter layout (one fp32 buffer, one gradient buffer), and the CPU training step. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "model/objective.h"

#define DRAFTER_MAX_CTX_LAYERS 64
#define DRAFTER_NAME_MAX 64

/* Everything config.json of a drafter checkpoint says, plus the target facts it must match. */
struct drafter_config {
    int hidden_size;            /* H: the target's hidden size */
    int num_layers;             /* drafter layers (num_hidden_layers) */
    int num_heads;
    int num_kv_heads;
    int head_dim;
    int intermediate_size;
    int vocab_size;             /* the target's vocabulary (embedding and LM head rows) */
    int num_target_layers;      /* layers of the target the features come from */
    int n_target_ids;           /* captured layers: fc maps n_target_ids*H -> H */
    int target_layer_ids[DRAFTER_MAX_CTX_LAYERS];
    int block_size;
    int mask_token_id;
    int max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;          /* plain RoPE (rotate_half), inv_freq = theta^(-2i/d) */
    double initializer_range;   /* std of the normal init of every matrix */
};

struct drafter_tensor {
    char name[DRAFTER_NAME_MAX];    /* checkpoint name, e.g. "layers.0.self_attn.q_proj.weight" */
    int ndim;                       /* 1 (norm weight) or 2 (matrix [out, in]) */
    int64_t shape[2];
    size_t offset;                  /* into params / grads, in floats */
    size_t numel;
    bool decay;                     /* AdamW weight decay applies (matrices only, not norms) */
};

/* Offsets (in floats) of one layer's tensors in the parameter buffer. */
struct drafter_layer_off {
    size_t input_norm, q, k, v, q_norm, k_norm, o, post_norm, gate, up, down;
};

struct drafter_scratch;
struct optim;
struct st_set;
struct hf_config;

struct drafter {
    struct drafter_config cfg;
    /* Trainable parameters and their gradients: one contiguous fp32 buffer each, same layout
     * (see `tensors`), so the data-parallel all-reduce of `grads` is one call. */
    float *params;
    float *grads;
    size_t n_params;
    struct drafter_tensor *tensors;
    int n_tensors;
    size_t off_fc, off_hidden_norm, off_norm;
    struct drafter_layer_off *layer;
    /* Frozen, not owned: the target's embedding [V, H] and LM head [V, H] (may be the same array). */
    const float *embed;
    const float *lm_head;
    struct optim *opt;
    struct drafter_scratch *ws;
    int max_tokens;             /* largest n_tokens of a batch */
    int max_blocks;             /* largest number of anchors (blocks) in a batch */
    int head_chunk_rows;        /* LM head + CE rows per chunk */
    void (*progress)(void *arg);    /* drafter_set_progress */
    void *progress_arg;
};

/* Metric sums of one forward. All fields are additive: all-reduce them (sum) across the
 * data-parallel group, then read them through the drafter_metrics_* helpers. */
struct drafter_metrics {
    double loss_sum;            /* sum over supervised slots of w * CE */
    double weight_sum;          /* sum of w (the loss denominator) */
    double correct;             /* supervised slots whose argmax equals the label */
    double supervised;          /* slots with label loss mask set (k >= 1, label inside its sequence) */
    double accept_sum;          /* per block with a supervised slot: 1 + leading run of correct,
                                   supervised slots (the anchor's token counts as accepted, as the
                                   reference trainer and serving report it) */
    double accept_blocks;       /* blocks counted in accept_sum */
    double blocks;              /* blocks in the batch */
    double tokens;              /* tokens in the batch */
};
#define DRAFTER_METRICS_N 8     /* doubles in struct drafter_metrics, for the all-reduce */

static inline double drafter_metrics_loss(const struct drafter_metrics *m)
{ return m->weight_sum > 0 ? m->loss_sum / m->weight_sum : 0.0; }
static inline double drafter_metrics_accuracy(const struct drafter_metrics *m)
{ return m->supervised > 0 ? m->correct / m->supervised : 0.0; }
static inline double drafter_metrics_accept_len(const struct drafter_metrics *m)
{ return m->accept_blocks > 0 ? m->accept_sum / m->accept_blocks : 0.0; }

/* The metrics as the group's all-reduce sums them (floats), and back: the one conversion drafter-d
 * and dflash-replay share, since the replay's sums must be the group's bit for bit. */
static inline void drafter_metrics_to_floats(const struct drafter_metrics *m, float *out)
{
    const double *v = (const double *)m;
    for (int i = 0; i < DRAFTER_METRICS_N; i++)
        out[i] = (float)v[i];
}
static inline void drafter_metrics_from_floats(const float *in, struct drafter_metrics *m)
{
    double *v = (double *)m;
    for (int i = 0; i < DRAFTER_METRICS_N; i++)
        v[i] = in[i];
}

/* Optimizer settings (from [drafter] of the config). */
struct drafter_train_opts {
    double lr;                  /* peak */
    double min_lr_ratio;        /* cosine floor */
    int64_t warmup_steps;
    int64_t total_steps;        /* cosine horizon; 0 = constant after warmup */
    double weight_decay;
    double beta1, beta2, eps;
    double grad_clip;           /* global norm; 0 = off */
};

/* Fill the drafter-side fields of a config from the target's hf facts and the [drafter] keys.
 * num_heads/num_kv_heads/head_dim/intermediate_size: 0 = the target's. mask_token_id < 0 = vocab-1. */
int drafter_config_from_target(struct drafter_config *c, const struct hf_config *target,
                               int num_layers, const int *target_layer_ids, int n_target_ids,
                               int block_size, int mask_token_id, int num_heads, int num_kv_heads,
                               int head_dim, int intermediate_size, char *err, size_t errlen);
struct dflash_cfg;
/* drafter_config_from_target with the [model] and [drafter] keys of the cluster config, as
 * drafter-d reads them; ids: the captured layers (model.capture_layers or the default ones). */
int drafter_config_from_cfg(struct drafter_config *c, const struct hf_config *target, const struct dflash_cfg *cfg,
                            const int *target_layer_ids, int n_target_ids, char *err, size_t errlen);
/* The optimizer options of the [drafter] keys; total_steps as set (0: the caller derives it). */
struct drafter_train_opts drafter_train_opts_from_cfg(const struct dflash_cfg *cfg);
/* Shape checks of a config (positive sizes, heads divide, ids in range, ...). */
int drafter_config_validate(const struct drafter_config *c, char *err, size_t errlen);

/* Allocate a drafter for `cfg`: parameters (initialised by drafter_init_params(d, seed, 0)),
 * gradients, optimizer state and the scratch arena sized for batches of up to max_tokens tokens
 * and max_blocks anchors. embed / lm_head: the target's frozen [V, H] arrays, kept by pointer (the
 * caller keeps them alive). No allocation happens after this. */
int drafter_create(struct drafter **out, const struct drafter_config *cfg, const float *embed,
                   const float *lm_head, int max_tokens, int max_blocks, uint64_t seed,
                   char *err, size_t errlen);
void drafter_free(struct drafter *d);   /* accepts NULL */

/* Fresh parameters: matrices ~ N(0, initializer_range^2), norm weights 1. Each value depends only
 * on (seed, tensor, position), never on `threads`: the number of threads drawing them, <= 0 for
 * the CPUs this process may run on (at most 16, and fewer for a small drafter). Gradients and
 * optimizer state are left alone. */
void drafter_init_params(struct drafter *d, uint64_t seed, int threads);

/* The tensor called `name`, or NULL. */
const struct drafter_tensor *drafter_find_tensor(const struct drafter *d, const char *name);

/* Copy a drafter layer's tensors from a safetensors set (e.g. the target's own layer
 * `src_layer`, names "model.layers.{src}.*"): q/k/v/o, q_norm/k_norm, gate/up/down and both
 * layernorms. Shapes must match; errors name the tensor. */
int drafter_init_layer_from(struct drafter *d, int layer, const struct st_set *src,
                            const char *src_prefix, char *err, size_t errlen);

/* Largest number of blocks a batch of these sizes can produce (sizes the scratch). */
int drafter_max_blocks_for(int max_tokens, int max_seqs, int num_anchors);

/* ---- training step, split for data parallelism ----
 *
 * 1. drafter_forward_backward(): gradients of the UNNORMALISED loss sum(w * CE) of this rank's
 *    batch into d->grads (overwritten), and the metric sums.
 * 2. the caller all-reduces (sums) d->grads (d->n_params floats) and the metrics
 *    (DRAFTER_METRICS_N doubles) across the group; alone it does nothing.
 * 3. drafter_optimizer_step(d, global_weight_sum, ...): scales the gradients by
 *    1/global_weight_sum (so the step is that of the loss sum(w*CE)/sum(w) over the combined
 *    batch of every rank), clips by global norm, AdamW.
 */
int drafter_forward_backward(struct drafter *d, const struct obj_batch *b,
                             const struct obj_block *blocks, int n_blocks, double gamma,
                             struct drafter_metrics *m);
/* Forward only; block_loss (optional, n_blocks doubles) gets sum(w*CE) of each block. */
int drafter_forward(struct drafter *d, const struct obj_batch *b, const struct obj_block *blocks,
                    int n_blocks, double gamma, struct drafter_metrics *m, double *block_loss);

struct drafter_step_info {
    double lr;
    double grad_norm;           /* after scaling, before clipping */
    int64_t step;               /* optimizer steps done, this one included */
    double device_ms;           /* CUDA asynchronous steps: the step's time on the GPU, its input there
                                   to its results copied back (all-reduce included); else 0 */
};
int drafter_optimizer_step(struct drafter *d, double global_weight_sum,
                           const struct drafter_train_opts *o, struct drafter_step_info *info);

/* One whole single-rank step: anchors from (seed, epoch, batch_id, rank), forward_backward,
 * optimizer step. */
int drafter_train_step(struct drafter *d, const struct obj_batch *b, int num_anchors, double gamma,
                       const struct obj_rng_key *key, const struct drafter_train_opts *o,
                       struct drafter_metrics *m, struct drafter_step_info *info);

/* A step on the host runs for seconds at realistic sizes: drafter_forward_backward and
 * drafter_forward call fn(arg) on their own thread after the attention and the MLP of every layer
 * (forward and backward) and every LM-head chunk, for the caller's heartbeat and watchdog. NULL =
 * none. */
void drafter_set_progress(struct drafter *d, void (*fn)(void *arg), void *arg);

/* Optimizer steps done so far (restored by checkpoint load). */
int64_t drafter_step_count(const struct drafter *d);
