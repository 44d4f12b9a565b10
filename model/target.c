/* target.c: backend-independent part of the target model: config, capture ids, argument checks,
 * checked weight lookup, dispatch to the CPU or CUDA backend, and the embedding/LM-head loader. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/config.h"
#include "common/err.h"
#include "model/target_internal.h"

#define TARGET_MAX_TOKENS (1 << 24)

const char *const target_wt_suffix[TW_COUNT] = {
    [TW_IN_NORM] = "input_layernorm.weight",
    [TW_Q] = "self_attn.q_proj.weight",       [TW_K] = "self_attn.k_proj.weight",
    [TW_V] = "self_attn.v_proj.weight",       [TW_O] = "self_attn.o_proj.weight",
    [TW_Q_BIAS] = "self_attn.q_proj.bias",    [TW_K_BIAS] = "self_attn.k_proj.bias",
    [TW_V_BIAS] = "self_attn.v_proj.bias",    [TW_O_BIAS] = "self_attn.o_proj.bias",
    [TW_Q_NORM] = "self_attn.q_norm.weight",  [TW_K_NORM] = "self_attn.k_norm.weight",
    [TW_POST_NORM] = "post_attention_layernorm.weight",
    [TW_GATE] = "mlp.gate_proj.weight",       [TW_UP] = "mlp.up_proj.weight",
    [TW_DOWN] = "mlp.down_proj.weight",
    [TW_GATE_BIAS] = "mlp.gate_proj.bias",    [TW_UP_BIAS] = "mlp.up_proj.bias",
    [TW_DOWN_BIAS] = "mlp.down_proj.bias",
};

int target_default_layer_ids(int num_target_layers, int num_draft_layers, int *out)
{
    if (num_target_layers < 1 || num_draft_layers < 1)
        return -DF_ERANGE;
    if (num_draft_layers == 1) {
        out[0] = num_target_layers / 2;
        return 1;
    }
    if (num_target_layers < 4)     /* start 1, end n-3: needs end >= start */
        return -DF_ERANGE;
    const int start = 1, end = num_target_layers - 3, span = end - start;
    for (int i = 0; i < num_draft_layers; i++)
        /* Python's round(): ties to even, which is rint() in the default rounding mode */
        out[i] = (int)rint(start + (double)(i * span) / (double)(num_draft_layers - 1));
    return num_draft_layers;
}

int target_capture_ids(const struct cfg_model *m, int n_layers, int ids[TARGET_MAX_CAPTURE], const char **key,
                       char *why, size_t whylen)
{
    int n;
    *key = "capture_layers";
    if (m->capture_layers[0]) {
        if ((n = cfg_parse_int_list(m->capture_layers, ids, TARGET_MAX_CAPTURE)) <= 0)
            return df_fail(why, whylen, -DF_EFORMAT, "'%s' is not a list of layer ids", m->capture_layers);
    } else if (!n_layers) {
        return df_fail(why, whylen, -DF_EFORMAT, "empty, and there is no model.path to derive it from");
    } else {
        *key = "draft_layers";
        if (m->draft_layers > TARGET_MAX_CAPTURE ||
            (n = target_default_layer_ids(n_layers, (int)m->draft_layers, ids)) < 0)
            return df_fail(why, whylen, -DF_ERANGE, "no DFlash default capture ids for %lld drafter layers over the "
                           "%d layers of %s/config.json: set model.capture_layers", (long long)m->draft_layers,
                           n_layers, m->path);
        for (int i = 1; i < n; i++)
            if (ids[i] == ids[i - 1])   /* (the default ids never decrease) */
                return df_fail(why, whylen, -DF_ERANGE, "the DFlash default capture ids for %lld drafter layers "
                               "over the %d layers of %s/config.json take layer %d more than once: set "
                               "model.capture_layers", (long long)m->draft_layers, n_layers, m->path, ids[i]);
        return n;
    }
    for (int i = 0; n_layers && i < n; i++)
        if (ids[i] >= n_layers)
            return df_fail(why, whylen, -DF_ERANGE, "layer id %d is out of range [0, %d) of %s/config.json", ids[i],
                           n_layers, m->path);
    return n;
}

/* Each per-layer tensor's shape as config.json gives it ({rows, 0} for a vector; want false for a
 * tensor the architecture or config does not have). */
struct wt_shape { int64_t rows, cols; bool want; };
static void layer_shapes(const struct hf_config *c, struct wt_shape shape[TW_COUNT])
{
    const int64_t H = c->hidden_size, D = c->head_dim, FF = c->intermediate_size;
    const int64_t QD = (int64_t)c->num_heads * D, KD = (int64_t)c->num_kv_heads * D;
    const struct wt_shape s[TW_COUNT] = {
        [TW_IN_NORM] = { H, 0, true },          [TW_POST_NORM] = { H, 0, true },
        [TW_Q] = { QD, H, true },               [TW_K] = { KD, H, true },
        [TW_V] = { KD, H, true },               [TW_O] = { H, QD, true },
        [TW_Q_BIAS] = { QD, 0, c->attention_bias }, [TW_K_BIAS] = { KD, 0, c->attention_bias },
        [TW_V_BIAS] = { KD, 0, c->attention_bias }, [TW_O_BIAS] = { H, 0, c->attention_bias },
        [TW_Q_NORM] = { D, 0, c->arch == HF_ARCH_QWEN3 }, [TW_K_NORM] = { D, 0, c->arch == HF_ARCH_QWEN3 },
        [TW_GATE] = { FF, H, true },             [TW_UP] = { FF, H, true },
        [TW_DOWN] = { H, FF, true },
        [TW_GATE_BIAS] = { FF, 0, c->mlp_bias }, [TW_UP_BIAS] = { FF, 0, c->mlp_bias },
        [TW_DOWN_BIAS] = { H, 0, c->mlp_bias },
    };
    memcpy(shape, s, sizeof s);
}

uint64_t target_layer_numel(const struct hf_config *c)
{
    struct wt_shape shape[TW_COUNT];
    layer_shapes(c, shape);
    uint64_t n = 0;
    for (int w = 0; w < TW_COUNT; w++)
        if (shape[w].want)
            n += (uint64_t)shape[w].rows * (uint64_t)(shape[w].cols ? shape[w].cols : 1);
    return n;
}

int target_find_layer(const struct target *m, int layer, const struct st_tensor *t[TW_COUNT],
                      char *err, size_t errlen)
{
    struct wt_shape shape[TW_COUNT];
    layer_shapes(&m->cfg, shape);
    for (int w = 0; w < TW_COUNT; w++) {
        t[w] = NULL;
        if (!shape[w].want)
            continue;
        char name[256];
        snprintf(name, sizeof name, "model.layers.%d.%s", layer, target_wt_suffix[w]);
        int64_t dims[2] = { shape[w].rows, shape[w].cols };
        int r = st_expect(m->st, name, shape[w].cols ? 2 : 1, dims, &t[w], err, errlen);
        if (r < 0)
            return r;
    }
    return 0;
}

int target_find_globals(const struct target *m, bool want_norm, const struct st_tensor **embed,
                        const struct st_tensor **norm, char *err, size_t errlen)
{
    int64_t es[2] = { m->cfg.vocab_size, m->cfg.hidden_size }, ns[1] = { m->cfg.hidden_size };
    int r = st_expect(m->st, "model.embed_tokens.weight", 2, es, embed, err, errlen);
    if (r < 0)
        return r;
    *norm = NULL;
    return want_norm ? st_expect(m->st, "model.norm.weight", 1, ns, norm, err, errlen) : 0;
}

static const struct target_backend_ops *backend_ops(enum target_backend b)
{
    switch (b) {
    case TARGET_BACKEND_CPU:
        return &target_cpu_ops;
#ifdef DFLASH_HAVE_TARGET_CUDA
    case TARGET_BACKEND_CUDA:
        return &target_cuda_ops;
#endif
    default:
        return NULL;
    }
}

int target_open(struct target **out, const char *model_dir, const int *layer_ids, int n_ids,
                enum target_backend backend, int device, int max_tokens, char *err, size_t errlen)
{
    *out = NULL;
    if (n_ids < 1 || n_ids > TARGET_MAX_CAPTURE)
        return df_fail(err, errlen, -DF_ERANGE, "%s: layer_ids: %d ids, expected 1..%d", model_dir, n_ids,
                    TARGET_MAX_CAPTURE);
    if (max_tokens < 1 || max_tokens > TARGET_MAX_TOKENS)
        return df_fail(err, errlen, -DF_ERANGE, "%s: max_tokens %d is out of range [1, %d]", model_dir, max_tokens,
                    TARGET_MAX_TOKENS);
    const struct target_backend_ops *ops = backend_ops(backend);
    if (!ops)
        return df_fail(err, errlen, -DF_EUNSUPPORTED, "%s: backend %d is not built into this program", model_dir,
                    (int)backend);

    struct target *m = calloc(1, sizeof *m);
    if (!m)
        return df_fail(err, errlen, -ENOMEM, "%s: out of memory", model_dir);
    int r = hf_config_load(model_dir, &m->cfg, err, errlen);
    if (r < 0)
        goto fail_free;
    snprintf(m->dir, sizeof m->dir, "%s", model_dir);
    m->last_layer = -1;
    for (int i = 0; i < n_ids; i++) {
        if (layer_ids[i] < 0 || layer_ids[i] >= m->cfg.num_layers) {
            r = df_fail(err, errlen, -DF_ERANGE, "%s/config.json: layer_ids: id %d is out of range [0, %d)",
                     model_dir, layer_ids[i], m->cfg.num_layers);
            goto fail_free;
        }
        m->layer_ids[i] = layer_ids[i];
        if (layer_ids[i] > m->last_layer)
            m->last_layer = layer_ids[i];
    }
    m->n_ids = n_ids;
    m->max_tokens = max_tokens;
    m->device = device;
    m->backend = backend;
    if ((r = st_open_dir(&m->st, model_dir, err, errlen)) < 0)
        goto fail_free;
    m->ops = ops;
    if ((r = ops->open(m, err, errlen)) < 0)
        goto fail_close;
    *out = m;
    return 0;

fail_close:
    ops->close(m);
    st_close(m->st);
fail_free:
    free(m);
    return r;
}

uint64_t target_fingerprint(const struct target *m)
{
    return st_fingerprint(m->st);
}

void target_close(struct target *m)
{
    if (!m)
        return;
    if (m->ops)
        m->ops->close(m);
    st_close(m->st);
    free(m);
}

int target_forward(struct target *m, const uint32_t *tokens, const int32_t *cu_seqlens, int n_seqs,
                   int n_tokens, void *out, enum out_dtype dtype, size_t out_row_pitch_bytes)
{
    if (n_tokens < 0 || n_tokens > m->max_tokens || n_seqs < 0 || n_seqs > m->max_tokens)
        return -DF_ERANGE;      /* (the CUDA backend's cu_seqlens buffer holds max_tokens + 1) */
    if (dtype != OUT_F32 && dtype != OUT_BF16)
        return -DF_EUNSUPPORTED;
    size_t row = (size_t)m->n_ids * m->cfg.hidden_size * (dtype == OUT_F32 ? 4 : 2);
    if (out_row_pitch_bytes < row)
        return -DF_ERANGE;
    if (cu_seqlens[0] != 0 || cu_seqlens[n_seqs] != n_tokens)
        return -DF_EFORMAT;
    for (int s = 0; s < n_seqs; s++)
        if (cu_seqlens[s + 1] < cu_seqlens[s])
            return -DF_EFORMAT;
    for (int t = 0; t < n_tokens; t++)
        if (tokens[t] >= (uint32_t)m->cfg.vocab_size)
            return -DF_ERANGE;
    if (n_tokens == 0)
        return 0;
    return m->ops->forward(m, tokens, cu_seqlens, n_seqs, n_tokens, out, dtype, out_row_pitch_bytes);
}

void target_set_progress(struct target *m, void (*fn)(void *arg), void *arg)
{
    m->progress = fn;
    m->progress_arg = arg;
}

const struct hf_config *target_config(const struct target *m)
{
    return &m->cfg;
}

int target_num_captured(const struct target *m)
{
    return m->n_ids;
}

const int *target_layer_ids(const struct target *m)
{
    return m->layer_ids;
}

int target_max_tokens(const struct target *m)
{
    return m->max_tokens;
}

int target_load_head(const char *model_dir, float **embed, float **lm_head, int *vocab, int *hidden,
                     char *err, size_t errlen)
{
    struct target m = { 0 };
    const struct st_tensor *te, *tn, *th;
    int r;
    *embed = *lm_head = NULL;
    if ((r = hf_config_load(model_dir, &m.cfg, err, errlen)) < 0)
        return r;
    if ((r = st_open_dir(&m.st, model_dir, err, errlen)) < 0)
        return r;
    if ((r = target_find_globals(&m, false, &te, &tn, err, errlen)) < 0)
        goto out;
    th = te;
    if (!m.cfg.tie_word_embeddings) {
        int64_t hs[2] = { m.cfg.vocab_size, m.cfg.hidden_size };
        if ((r = st_expect(m.st, "lm_head.weight", 2, hs, &th, err, errlen)) < 0)
            goto out;
    }
    if ((r = st_load_f32(te, embed)) < 0 || (th != te && (r = st_load_f32(th, lm_head)) < 0)) {
        r = df_fail(err, errlen, r, "%s: loading embed_tokens / lm_head: %s", model_dir, strerror(ENOMEM));
        free(*embed);
        *embed = NULL;
        goto out;
    }
    if (th == te)
        *lm_head = *embed;
    *vocab = m.cfg.vocab_size;
    *hidden = m.cfg.hidden_size;
out:
    st_close(m.st);
    return r;
}

void target_free_head(float *embed, float *lm_head)
{
    if (lm_head != embed)
        free(lm_head);
    free(embed);
}
