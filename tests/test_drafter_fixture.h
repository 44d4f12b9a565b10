/* test_drafter_fixture.h: a tiny drafter, a frozen random embedding / LM head and a random
 * packed batch, shared by the drafter, objective and checkpoint tests. */
#pragma once
#include <stdlib.h>
#include <string.h>
#include "model/drafter.h"
#include "model/objective.h"
#include "tests/test.h"

struct fixture {
    struct drafter_config cfg;
    float *embed, *lm_head;
    /* batch */
    int n_seqs, n_tokens;
    uint32_t *tokens;
    uint8_t *loss_mask;
    int32_t cu[16];
    float *hidden;
    struct obj_batch batch;
};

static inline void fixture_config(struct drafter_config *c)
{
    memset(c, 0, sizeof *c);
    c->hidden_size = 48;
    c->num_layers = 2;
    c->num_heads = 4;
    c->num_kv_heads = 2;
    c->head_dim = 16;
    c->intermediate_size = 80;
    c->vocab_size = 97;
    c->num_target_layers = 8;
    c->n_target_ids = 3;
    c->target_layer_ids[0] = 1;
    c->target_layer_ids[1] = 3;
    c->target_layer_ids[2] = 5;
    c->block_size = 4;
    c->mask_token_id = 96;
    c->max_position_embeddings = 4096;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->initializer_range = 0.02;
}

static inline float fx_uniform(struct obj_rng *r)
{
    return (float)((obj_rng_next(r) >> 11) * 0x1.0p-53);
}

/* lens: sequence lengths; masked prompt prefix of each sequence: prompt[s] tokens. */
static inline void fixture_init(struct fixture *f, uint64_t seed, int n_seqs, const int *lens,
                                const int *prompt)
{
    memset(f, 0, sizeof *f);
    fixture_config(&f->cfg);
    struct obj_rng r;
    obj_rng_seed(&r, seed, 1, 2, 3);
    int V = f->cfg.vocab_size, H = f->cfg.hidden_size, LcH = f->cfg.n_target_ids * H;
    f->embed = malloc((size_t)V * H * sizeof(float));
    f->lm_head = malloc((size_t)V * H * sizeof(float));
    for (int i = 0; i < V * H; i++) {
        f->embed[i] = (float)obj_rng_normal(&r);
        f->lm_head[i] = (float)(obj_rng_normal(&r) * 0.3);
    }
    f->n_seqs = n_seqs;
    f->cu[0] = 0;
    for (int s = 0; s < n_seqs; s++)
        f->cu[s + 1] = f->cu[s] + lens[s];
    f->n_tokens = f->cu[n_seqs];
    f->tokens = malloc((size_t)f->n_tokens * sizeof *f->tokens);
    f->loss_mask = malloc((size_t)f->n_tokens);
    f->hidden = malloc((size_t)f->n_tokens * LcH * sizeof(float));
    for (int s = 0; s < n_seqs; s++)
        for (int t = f->cu[s]; t < f->cu[s + 1]; t++) {
            f->tokens[t] = (uint32_t)obj_rng_below(&r, (uint64_t)(V - 1));
            f->loss_mask[t] = t - f->cu[s] >= prompt[s];
        }
    for (int i = 0; i < f->n_tokens * LcH; i++)
        f->hidden[i] = (float)obj_rng_normal(&r);
    f->batch = (struct obj_batch){
        .tokens = f->tokens, .loss_mask = f->loss_mask, .cu_seqlens = f->cu,
        .n_seqs = n_seqs, .n_tokens = f->n_tokens, .hidden_f32 = f->hidden,
    };
}

static inline void fixture_done(struct fixture *f)
{
    free(f->embed);
    free(f->lm_head);
    free(f->tokens);
    free(f->loss_mask);
    free(f->hidden);
}

/* Parameters with more spread than the init so every path carries gradient. */
static inline void fixture_randomize_params(struct drafter *d, uint64_t seed, double std)
{
    struct obj_rng r;
    obj_rng_seed(&r, seed, 9, 9, 9);
    for (int i = 0; i < d->n_tensors; i++) {
        const struct drafter_tensor *t = &d->tensors[i];
        for (size_t j = 0; j < t->numel; j++)
            d->params[t->offset + j] = t->ndim == 1 ? (float)(1.0 + 0.2 * obj_rng_normal(&r))
                                                    : (float)(std * obj_rng_normal(&r));
    }
}

static inline struct drafter *fixture_drafter(struct fixture *f, int max_blocks)
{
    struct drafter *d = NULL;
    char err[256] = "";
    int r = drafter_create(&d, &f->cfg, f->embed, f->lm_head, f->n_tokens + 8, max_blocks, 7, err,
                           sizeof err);
    if (r < 0)
        TEST_FAIL("drafter_create: %s", err);
    return d;
}
