/* target_internal.h: what target.c shares with the backends (target_cpu.c, target_cuda.cu):
 * the target object, the backend ops table and the checked weight lookup both backends use. */
#pragma once
#include "model/target.h"

#ifdef __cplusplus
extern "C" {
#endif

struct target;

struct target_backend_ops {
    /* Load weights of layers 0..m->last_layer from m->st (kept open by target.c until close). */
    int (*open)(struct target *m, char *err, size_t errlen);
    /* Arguments already checked by target_forward. */
    int (*forward)(struct target *m, const uint32_t *tokens, const int32_t *cu_seqlens, int n_seqs,
                   int n_tokens, void *out, enum out_dtype dtype, size_t out_row_pitch_bytes);
    void (*close)(struct target *m);    /* frees m->impl; may be called after a failed open */
};

struct target {
    struct hf_config cfg;
    char dir[4096];
    int layer_ids[TARGET_MAX_CAPTURE];
    int n_ids;
    int last_layer;             /* max(layer_ids): the forward runs layers 0..last_layer */
    int max_tokens;
    int device;
    enum target_backend backend;
    struct st_set *st;          /* the checkpoint, mapped */
    const struct target_backend_ops *ops;
    void *impl;                 /* backend state */
    void (*progress)(void *arg);    /* target_set_progress */
    void *progress_arg;
};

/* Per-layer tensors in HF naming (model.layers.N.<suffix>). Entries the architecture or config
 * does not have (biases, q/k norms) are NULL after target_find_layer. */
enum target_wt {
    TW_IN_NORM, TW_Q, TW_K, TW_V, TW_O, TW_Q_BIAS, TW_K_BIAS, TW_V_BIAS, TW_O_BIAS,
    TW_Q_NORM, TW_K_NORM, TW_POST_NORM, TW_GATE, TW_UP, TW_DOWN, TW_GATE_BIAS, TW_UP_BIAS, TW_DOWN_BIAS,
    TW_COUNT
};
extern const char *const target_wt_suffix[TW_COUNT];

/* The elements of one layer's tensors, from config.json alone (the shapes target_find_layer holds
 * the files to). */
uint64_t target_layer_numel(const struct hf_config *c);
/* Find and check (dtype, shape against config.json) every tensor of one layer. */
int target_find_layer(const struct target *m, int layer, const struct st_tensor *t[TW_COUNT],
                      char *err, size_t errlen);
/* model.embed_tokens.weight [V, H]; model.norm.weight [H] (checked only when want_norm). */
int target_find_globals(const struct target *m, bool want_norm, const struct st_tensor **embed,
                        const struct st_tensor **norm, char *err, size_t errlen);

extern const struct target_backend_ops target_cpu_ops;
#ifdef DFLASH_HAVE_TARGET_CUDA
extern const struct target_backend_ops target_cuda_ops;
#endif

#ifdef __cplusplus
}
#endif
