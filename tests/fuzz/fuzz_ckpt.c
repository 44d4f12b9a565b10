/* fuzz_ckpt.c: fuzz target for the drafter checkpoint reader (model/checkpoint.c ckpt_read_config,
 * ckpt_load). Byte 0 picks the file the rest of the input replaces in a valid checkpoint of a tiny
 * drafter: 0 config.json, 1 optimizer.bin, 2 model.safetensors. */
#include <limits.h>
#include <math.h>
#include <sys/stat.h>
#include "model/checkpoint.h"
#include "model/optim.h"
#include "tests/fuzz/fuzz.h"

static const char *const ckpt_fuzz_files[] = { CKPT_CONFIG, CKPT_OPTIMIZER, CKPT_WEIGHTS };

static struct {
    int ready;                  /* 1 set up, -1 failed */
    char dir[PATH_MAX];
    struct drafter *d;
    float *embed;
    uint8_t *good[3];           /* the valid files' bytes */
    size_t good_len[3];
    float *params, *m, *v;      /* d's state, to see that a failed load leaves it alone */
    int64_t step;
} ckpt_fuzz;

static void ckpt_fuzz_cleanup(void)
{
    char p[PATH_MAX + 32];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", ckpt_fuzz.dir, ckpt_fuzz_files[i]);
        unlink(p);
    }
    rmdir(ckpt_fuzz.dir);
}

static int ckpt_fuzz_put(int which, const uint8_t *data, size_t len)
{
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/%s", ckpt_fuzz.dir, ckpt_fuzz_files[which]);
    FILE *f = fopen(p, "wb");
    if (!f)
        return -1;
    size_t put = fwrite(data, 1, len, f);
    return fclose(f) == 0 && put == len ? 0 : -1;
}

/* A tiny drafter with a trained-looking state and its checkpoint in a private dir. */
static int ckpt_fuzz_setup(void)
{
    if (ckpt_fuzz.ready)
        return ckpt_fuzz.ready > 0 ? 0 : -1;
    ckpt_fuzz.ready = -1;
    struct drafter_config c = {
        .hidden_size = 8, .num_layers = 1, .num_heads = 2, .num_kv_heads = 1, .head_dim = 4,
        .intermediate_size = 8, .vocab_size = 8, .num_target_layers = 3, .n_target_ids = 2,
        .target_layer_ids = { 0, 2 }, .block_size = 2, .mask_token_id = 7, .max_position_embeddings = 64,
        .rms_norm_eps = 1e-6, .rope_theta = 10000.0, .initializer_range = 0.02,
    };
    char err[256];
    ckpt_fuzz.embed = calloc((size_t)c.vocab_size * c.hidden_size, sizeof(float));
    if (!ckpt_fuzz.embed || drafter_create(&ckpt_fuzz.d, &c, ckpt_fuzz.embed, ckpt_fuzz.embed, 8, 4, 3, err,
                                           sizeof err) < 0)
        return -1;
    struct drafter *d = ckpt_fuzz.d;
    for (size_t i = 0; i < d->n_params; i++) {
        d->opt->m[i] = (float)i * 1e-3f;
        d->opt->v[i] = (float)i * 1e-6f;
    }
    d->opt->step = 5;
    const char *tmp = getenv("TMPDIR");
    snprintf(ckpt_fuzz.dir, sizeof ckpt_fuzz.dir, "%s/dflash-fuzz-ckpt-%d", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    if (mkdir(ckpt_fuzz.dir, 0700) < 0 && errno != EEXIST)
        return -1;
    atexit(ckpt_fuzz_cleanup);
    struct ckpt_train_state ts = { .step = 5, .epoch = 1, .batch_in_epoch = 2, .seed = 9, .samples = 40, .tokens = 800 };
    if (ckpt_write_files(ckpt_fuzz.dir, d, &ts, err, sizeof err) < 0)
        return -1;
    for (int i = 0; i < 3; i++) {
        char p[PATH_MAX + 32];
        snprintf(p, sizeof p, "%s/%s", ckpt_fuzz.dir, ckpt_fuzz_files[i]);
        FILE *f = fopen(p, "rb");
        if (!f)
            return -1;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        rewind(f);
        ckpt_fuzz.good[i] = malloc(n > 0 ? (size_t)n : 1);
        ckpt_fuzz.good_len[i] = fread(ckpt_fuzz.good[i], 1, (size_t)n, f);
        fclose(f);
    }
    size_t nb = d->n_params * sizeof(float);
    ckpt_fuzz.params = malloc(nb);
    ckpt_fuzz.m = malloc(nb);
    ckpt_fuzz.v = malloc(nb);
    memcpy(ckpt_fuzz.params, d->params, nb);
    memcpy(ckpt_fuzz.m, d->opt->m, nb);
    memcpy(ckpt_fuzz.v, d->opt->v, nb);
    ckpt_fuzz.step = d->opt->step;
    ckpt_fuzz.ready = 1;
    return 0;
}

static void ckpt_fuzz_restore_state(void)
{
    struct drafter *d = ckpt_fuzz.d;
    size_t nb = d->n_params * sizeof(float);
    memcpy(d->params, ckpt_fuzz.params, nb);
    memcpy(d->opt->m, ckpt_fuzz.m, nb);
    memcpy(d->opt->v, ckpt_fuzz.v, nb);
    d->opt->step = ckpt_fuzz.step;
}

static bool ckpt_fuzz_state_same(void)
{
    const struct drafter *d = ckpt_fuzz.d;
    size_t nb = d->n_params * sizeof(float);
    return !memcmp(d->params, ckpt_fuzz.params, nb) && !memcmp(d->opt->m, ckpt_fuzz.m, nb) &&
           !memcmp(d->opt->v, ckpt_fuzz.v, nb) && d->opt->step == ckpt_fuzz.step;
}

int fuzz_ckpt(const uint8_t *data, size_t size)
{
    char err[512];
    if (size < 1 || ckpt_fuzz_setup() < 0)
        return 0;
    int which = data[0] % 3;
    for (int i = 0; i < 3; i++) {
        int r = i == which ? ckpt_fuzz_put(i, data + 1, size - 1)
                           : ckpt_fuzz_put(i, ckpt_fuzz.good[i], ckpt_fuzz.good_len[i]);
        if (r < 0)
            return 0;
    }
    if (which == 0) {
        struct drafter_config c;
        err[0] = 0;
        if (ckpt_read_config(ckpt_fuzz.dir, &c, err, sizeof err) == 0) {
            char why[256];
            FUZZ_ASSERT(drafter_config_validate(&c, why, sizeof why) == 0);
            /* a model the forward can run: no infinite or NaN constants */
            FUZZ_ASSERT(isfinite(c.rms_norm_eps));
            FUZZ_ASSERT(isfinite(c.rope_theta));
            FUZZ_ASSERT(isfinite(c.initializer_range));
        } else {
            FUZZ_ASSERT(fuzz_err_ok(err, sizeof err));
        }
    }
    struct ckpt_train_state ts;
    err[0] = 0;
    int r = ckpt_load(ckpt_fuzz.dir, ckpt_fuzz.d, &ts, NULL, err, sizeof err);
    if (r < 0) {
        FUZZ_ASSERT(fuzz_err_ok(err, sizeof err));
        FUZZ_ASSERT(ckpt_fuzz_state_same());   /* a refused checkpoint leaves the drafter alone */
    } else {
        ckpt_fuzz_restore_state();
    }
    return 0;
}
