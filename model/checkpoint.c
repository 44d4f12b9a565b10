/* checkpoint.c: drafter checkpoint directories: config.json (DFlashDraftModel, Qwen3 fields),
 * model.safetensors (bf16), optimizer.bin (fp32 master/moments + training position, checksummed). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "common/cleanup.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/jsonutil.h"
#include "model/checkpoint.h"
#include "model/cpu_ops.h"
#include "model/optim.h"
#include "model/safetensors.h"
#include "model/st_writer.h"

/* optimizer.bin: this header, then master[n], exp_avg[n], exp_avg_sq[n] (f32), then the FNV-1a
 * 64 of every byte before it. Bump OPT_VERSION when the layout changes. */
#define OPT_MAGIC "DFLOPT\0\1"
#define OPT_VERSION 1
struct opt_header {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint64_t n_params;
    uint64_t layout_hash;
    int64_t opt_step;
    int64_t step;
    uint64_t epoch;
    uint64_t batch_in_epoch;
    uint64_t seed;
    uint64_t samples;
    uint64_t tokens;
    uint64_t reserved[5];
};
_Static_assert(sizeof(struct opt_header) == 128, "optimizer.bin header layout");

#define FNV_INIT 0xcbf29ce484222325ull

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t layout_hash(const struct drafter *d)
{
    uint64_t h = FNV_INIT;
    for (int i = 0; i < d->n_tensors; i++) {
        const struct drafter_tensor *t = &d->tensors[i];
        h = fnv1a(h, t->name, strlen(t->name) + 1);
        h = fnv1a(h, t->shape, sizeof t->shape);
    }
    return h;
}

/* ---- files ---- */

/* Write and fold the bytes into the running checksum (hash may be NULL). */
static int write_hashed(int fd, const void *buf, size_t n, uint64_t *hash)
{
    if (hash)
        *hash = fnv1a(*hash, buf, n);
    return fileio_write_all(fd, buf, n);
}

static int fsync_path(const char *path, int flags)
{
    _cleanup_close_ int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0 || fsync(fd) < 0)
        return -errno;
    return 0;
}

static int write_text(const char *path, const char *text, char *err, size_t errlen)
{
    _cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int r = fd < 0 ? -errno : fileio_write_all(fd, text, strlen(text));
    if (r == 0 && fsync(fd) < 0)
        r = -errno;
    if (r < 0)
        snprintf(err, errlen, "%s: %s", path, strerror(-r));
    return r;
}

/* ---- config.json ---- */

static char *config_json(const struct drafter_config *c)
{
    cJSON *j = cJSON_CreateObject(), *a;
    if (!j)
        return NULL;
    a = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString("DFlashDraftModel"));
    cJSON_AddStringToObject(j, "model_type", "qwen3");
    cJSON_AddBoolToObject(j, "attention_bias", 0);
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    cJSON_AddNumberToObject(j, "block_size", c->block_size);
    cJSON *df = cJSON_AddObjectToObject(j, "dflash_config");
    cJSON_AddNumberToObject(df, "mask_token_id", c->mask_token_id);
    a = cJSON_AddArrayToObject(df, "target_layer_ids");
    for (int i = 0; i < c->n_target_ids; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(c->target_layer_ids[i]));
    cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(j, "initializer_range", c->initializer_range);
    cJSON_AddNumberToObject(j, "intermediate_size", c->intermediate_size);
    /* all full (non-causal, unwindowed) attention, as vLLM and SGLang read layer_types */
    a = cJSON_AddArrayToObject(j, "layer_types");
    for (int i = 0; i < c->num_layers; i++)
        cJSON_AddItemToArray(a, cJSON_CreateString("full_attention"));
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_position_embeddings);
    cJSON_AddNumberToObject(j, "max_window_layers", c->num_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->num_heads);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->num_layers);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->num_kv_heads);
    cJSON_AddNumberToObject(j, "num_target_layers", c->num_target_layers);
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->rms_norm_eps);
    cJSON_AddNullToObject(j, "rope_scaling");
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    cJSON_AddNullToObject(j, "sliding_window");
    cJSON_AddBoolToObject(j, "tie_word_embeddings", 0);
    cJSON_AddStringToObject(j, "torch_dtype", "bfloat16");
    cJSON_AddBoolToObject(j, "use_cache", 1);
    cJSON_AddBoolToObject(j, "use_sliding_window", 0);
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    return s;
}

struct jctx {
    const char *path;
    char *err;
    size_t errlen;
    const char *in;     /* the object's dotted name for messages: "" (top level), "dflash_config." */
};

static const cJSON *jitem(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A JSON number that is an int exactly (checked before any cast: out of range is UB). */
static bool json_is_int(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble >= INT_MIN && v->valuedouble <= INT_MAX &&
           v->valuedouble == floor(v->valuedouble);
}

static int jint(const struct jctx *x, const cJSON *o, const char *key, int *out, bool required)
{
    const cJSON *v = jitem(o, key);
    if (!v) {
        if (!required)
            return 0;
        snprintf(x->err, x->errlen, "%s: %s%s: missing", x->path, x->in, key);
        return -DF_EMISSING;
    }
    if (!json_is_int(v)) {
        snprintf(x->err, x->errlen, "%s: %s%s: not an integer", x->path, x->in, key);
        return -DF_EFORMAT;
    }
    *out = (int)v->valuedouble;
    return 1;
}

static int jdouble(const struct jctx *x, const cJSON *o, const char *key, double *out, bool required)
{
    const cJSON *v = jitem(o, key);
    if (!v) {
        if (!required)
            return 0;
        snprintf(x->err, x->errlen, "%s: %s%s: missing", x->path, x->in, key);
        return -DF_EMISSING;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        snprintf(x->err, x->errlen, "%s: %s%s: not a finite number", x->path, x->in, key);
        return -DF_EFORMAT;
    }
    *out = v->valuedouble;
    return 1;
}

int ckpt_read_config(const char *dir, struct drafter_config *c, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_CONFIG);
    struct jctx x = { path, err, errlen, "" }, xdf = { path, err, errlen, "dflash_config." },
                xrp = { path, err, errlen, "rope_parameters." };
    cJSON *j;
    int r = json_read_object(path, 64u << 20, &j, err, errlen);
    if (r < 0)
        return r;
    memset(c, 0, sizeof *c);
    const cJSON *arch = jitem(j, "architectures"), *e;
    bool ok = false;
    cJSON_ArrayForEach(e, arch)
        if (cJSON_IsString(e) && !strcmp(e->valuestring, "DFlashDraftModel"))
            ok = true;
    if (!ok) {
        snprintf(err, errlen, "%s: architectures: not a DFlashDraftModel checkpoint", path);
        r = -DF_EUNSUPPORTED;
        goto out;
    }
    const cJSON *df = jitem(j, "dflash_config");
    if (!df || !cJSON_IsObject(df)) {
        snprintf(err, errlen, "%s: dflash_config: %s", path, df ? "not an object" : "missing");
        r = df ? -DF_EFORMAT : -DF_EMISSING;
        goto out;
    }
    if ((r = jint(&x, j, "hidden_size", &c->hidden_size, true)) < 0 ||
        (r = jint(&x, j, "num_hidden_layers", &c->num_layers, true)) < 0 ||
        (r = jint(&x, j, "num_attention_heads", &c->num_heads, true)) < 0 ||
        (r = jint(&x, j, "num_key_value_heads", &c->num_kv_heads, true)) < 0 ||
        (r = jint(&x, j, "intermediate_size", &c->intermediate_size, true)) < 0 ||
        (r = jint(&x, j, "vocab_size", &c->vocab_size, true)) < 0 ||
        (r = jint(&x, j, "num_target_layers", &c->num_target_layers, true)) < 0 ||
        (r = jint(&x, j, "max_position_embeddings", &c->max_position_embeddings, true)) < 0 ||
        (r = jdouble(&x, j, "rms_norm_eps", &c->rms_norm_eps, true)) < 0)
        goto out;
    if (c->num_heads <= 0) {
        snprintf(err, errlen, "%s: num_attention_heads: must be positive", path);
        r = -DF_ERANGE;
        goto out;
    }
    c->head_dim = c->hidden_size / c->num_heads;
    c->initializer_range = 0.02;
    if ((r = jint(&x, j, "head_dim", &c->head_dim, false)) < 0 ||
        (r = jdouble(&x, j, "initializer_range", &c->initializer_range, false)) < 0)
        goto out;
    /* block_size: top level (current checkpoints) or inside dflash_config */
    if ((r = jint(&xdf, df, "block_size", &c->block_size, false)) < 0)
        goto out;
    if (r == 0 && (r = jint(&x, j, "block_size", &c->block_size, true)) < 0)
        goto out;
    /* rope: hub `rope_theta` or transformers-5 `rope_parameters.rope_theta` */
    const cJSON *rp = jitem(j, "rope_parameters");
    if ((r = jdouble(&x, j, "rope_theta", &c->rope_theta, false)) < 0)
        goto out;
    if (r == 0 && (!rp || (r = jdouble(&xrp, rp, "rope_theta", &c->rope_theta, true)) < 0)) {
        if (!rp) {
            snprintf(err, errlen, "%s: rope_theta: missing", path);
            r = -DF_EMISSING;
        }
        goto out;
    }
    /* A scaled RoPE (llama3, yarn, ...): this drafter trains with plain RoPE at rope_theta (the
     * config it writes says rope_scaling null); a checkpoint of another trainer that scales it
     * would go on at other angles, its loss and weights changed without a word. */
    for (int k = 0; k < 2; k++) {
        const cJSON *sc = k ? rp : jitem(j, "rope_scaling");
        const char *where = k ? "rope_parameters" : "rope_scaling";
        if (!sc || cJSON_IsNull(sc))
            continue;
        if (!cJSON_IsObject(sc)) {
            snprintf(err, errlen, "%s: %s: expected an object or null", path, where);
            r = -DF_EFORMAT;
            goto out;
        }
        const char *tkey = jitem(sc, "rope_type") ? "rope_type" : "type";    /* ("type": older configs) */
        const cJSON *t = jitem(sc, tkey);
        if (t && !(cJSON_IsString(t) && !strcmp(t->valuestring, "default"))) {
            snprintf(err, errlen, "%s: %s.%s: %s RoPE is not supported: the drafter trains with plain RoPE at "
                     "rope_theta (its own checkpoints say rope_scaling null)", path, where, tkey,
                     cJSON_IsString(t) ? t->valuestring : "a non-string");
            r = -DF_EUNSUPPORTED;
            goto out;
        }
    }
    if ((r = jint(&xdf, df, "mask_token_id", &c->mask_token_id, true)) < 0)
        goto out;
    const cJSON *ids = jitem(df, "target_layer_ids");
    int n = cJSON_GetArraySize(ids);
    if (!cJSON_IsArray(ids) || n < 1 || n > DRAFTER_MAX_CTX_LAYERS) {
        snprintf(err, errlen, "%s: dflash_config.target_layer_ids: missing or not 1..%d ids", path,
                 DRAFTER_MAX_CTX_LAYERS);
        r = -DF_EMISSING;
        goto out;
    }
    c->n_target_ids = 0;
    cJSON_ArrayForEach(e, ids) {
        if (!json_is_int(e)) {
            snprintf(err, errlen, "%s: dflash_config.target_layer_ids: not integers", path);
            r = -DF_EFORMAT;
            goto out;
        }
        c->target_layer_ids[c->n_target_ids++] = (int)e->valuedouble;
    }
    char why[256];
    r = drafter_config_validate(c, why, sizeof why);
    if (r < 0)
        snprintf(err, errlen, "%s: %s", path, why);
out:
    cJSON_Delete(j);
    return r < 0 ? r : 0;
}

int ckpt_check_config(const struct drafter_config *s, const struct drafter_config *w, const char *path,
                      char *err, size_t errlen)
{
#define SAME(field, name, what) do { if (s->field != w->field) { \
        snprintf(err, errlen, "%s: %s %d does not match %s %d", path, name, (int)s->field, what, (int)w->field); \
        return -DF_ELAYOUT; } } while (0)
    const char *tgt = "this target's", *dr = "this drafter's";
    SAME(hidden_size, "hidden_size", tgt);
    SAME(vocab_size, "vocab_size", tgt);
    SAME(num_target_layers, "num_target_layers", tgt);
    SAME(n_target_ids, "number of dflash_config.target_layer_ids", tgt);
    for (int i = 0; i < s->n_target_ids; i++)
        if (s->target_layer_ids[i] != w->target_layer_ids[i]) {
            snprintf(err, errlen, "%s: dflash_config.target_layer_ids[%d] = %d does not match the "
                     "captured layer %d (checkpoint made for another target or capture?)", path, i,
                     s->target_layer_ids[i], w->target_layer_ids[i]);
            return -DF_ELAYOUT;
        }
    SAME(num_layers, "num_hidden_layers", dr);
    SAME(num_heads, "num_attention_heads", dr);
    SAME(num_kv_heads, "num_key_value_heads", dr);
    SAME(head_dim, "head_dim", dr);
    SAME(intermediate_size, "intermediate_size", dr);
    SAME(block_size, "block_size", dr);
    SAME(mask_token_id, "dflash_config.mask_token_id", dr);
#undef SAME
    /* numerics of the step: another RoPE base or norm epsilon trains another model */
#define SAME_D(field, name) do { if (fabs(s->field - w->field) > 1e-12 * fabs(w->field)) { \
        snprintf(err, errlen, "%s: %s %.17g does not match this target's %.17g", path, name, s->field, w->field); \
        return -DF_ELAYOUT; } } while (0)
    SAME_D(rope_theta, "rope_theta");
    SAME_D(rms_norm_eps, "rms_norm_eps");
#undef SAME_D
    return 0;
}

/* ---- write ---- */

static int write_weights(const char *path, const struct drafter *d, char *err, size_t errlen)
{
    uint16_t *bf = malloc(d->n_params * sizeof *bf);
    struct st_out *t = calloc((size_t)d->n_tensors, sizeof *t);
    int r = -ENOMEM;
    if (bf && t) {
        cpu_f32_to_bf16(bf, d->params, d->n_params);
        for (int i = 0; i < d->n_tensors; i++) {
            const struct drafter_tensor *x = &d->tensors[i];
            t[i] = (struct st_out){ .name = x->name, .dtype = ST_BF16, .ndim = x->ndim,
                                    .shape = { x->shape[0], x->shape[1] }, .data = bf + x->offset };
        }
        static const char *const meta[] = { "format", "pt" };
        r = st_write_file(path, t, (size_t)d->n_tensors, meta, 1, err, errlen);
    }
    free(bf);
    free(t);
    return r;
}

static int write_optimizer(const char *path, const struct drafter *d, const struct ckpt_train_state *ts,
                           char *err, size_t errlen)
{
    struct opt_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, OPT_MAGIC, 8);
    h.version = OPT_VERSION;
    h.header_size = sizeof h;
    h.n_params = d->n_params;
    h.layout_hash = layout_hash(d);
    h.opt_step = d->opt->step;
    h.step = ts->step;
    h.epoch = ts->epoch;
    h.batch_in_epoch = ts->batch_in_epoch;
    h.seed = ts->seed;
    h.samples = ts->samples;
    h.tokens = ts->tokens;
    _cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int r = -errno;
        snprintf(err, errlen, "%s: %s", path, strerror(-r));
        return r;
    }
    uint64_t hash = FNV_INIT;
    size_t nb = d->n_params * sizeof(float);
    int r = write_hashed(fd, &h, sizeof h, &hash);
    if (r == 0)
        r = write_hashed(fd, d->params, nb, &hash);
    if (r == 0)
        r = write_hashed(fd, d->opt->m, nb, &hash);
    if (r == 0)
        r = write_hashed(fd, d->opt->v, nb, &hash);
    if (r == 0)
        r = fileio_write_all(fd, &hash, sizeof hash);
    if (r == 0 && fsync(fd) < 0)
        r = -errno;
    if (r < 0)
        snprintf(err, errlen, "%s: write: %s", path, strerror(-r));
    return r;
}

int ckpt_write_files(const char *dir, const struct drafter *d, const struct ckpt_train_state *ts,
                     char *err, size_t errlen)
{
    char path[4096];
    if (errlen)
        err[0] = 0;
    _cleanup_free_ char *json = config_json(&d->cfg);
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_CONFIG);
    int r = json ? write_text(path, json, err, errlen) : -ENOMEM;
    if (r == 0) {
        snprintf(path, sizeof path, "%s/%s", dir, CKPT_WEIGHTS);
        r = write_weights(path, d, err, errlen);
    }
    if (r == 0) {
        snprintf(path, sizeof path, "%s/%s", dir, CKPT_OPTIMIZER);
        r = write_optimizer(path, d, ts, err, errlen);
    }
    if (r < 0 && errlen && !err[0])     /* out of memory, mostly: no callee says why */
        snprintf(err, errlen, "%s: %s", path, strerror(-r));
    return r;
}

/* Remove a checkpoint directory: its regular files, then the directory. */
static int remove_dir(const char *dir)
{
    DIR *dh = opendir(dir);
    if (!dh)
        return -errno;
    struct dirent *e;
    int r = 0;
    while ((e = readdir(dh))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (unlinkat(dirfd(dh), e->d_name, 0) < 0 && r == 0)
            r = -errno;
    }
    closedir(dh);
    if (rmdir(dir) < 0 && r == 0)
        r = -errno;
    return r;
}

/* mkdir root; when this made it, its parent is synced so that the new entry survives a crash. */
static int make_root(const char *root, char *err, size_t errlen)
{
    if (mkdir(root, 0755) < 0) {
        if (errno == EEXIST)
            return 0;
        /* a file where a folder should be: no restart mends it (-DF_ELAYOUT: exit 78) */
        int r = errno == ENOTDIR ? -DF_ELAYOUT : -errno;
        snprintf(err, errlen, "%s: mkdir: %s", root, strerror(errno));
        return r;
    }
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", root);
    const char *parent = dirname(copy);     /* "a/b/" -> "a", "/b" -> "/", "b" -> "." */
    int r = fsync_path(parent, O_RDONLY | O_DIRECTORY);
    if (r < 0)
        snprintf(err, errlen, "%s: fsync: %s", parent, strerror(-r));
    return r;
}

/* ---- the generation fence ---- */

/* The text of the fence and run-id files: 16 lowercase or uppercase hex digits and a newline,
 * nothing else. 1 with *v; 0 for any other text. */
static int hex16_parse(const char *buf, ssize_t n, uint64_t *v)
{
    if (n != 17 || buf[16] != '\n')
        return 0;
    uint64_t x = 0;
    for (int i = 0; i < 16; i++) {
        int c = buf[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                            : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return 0;
        x = x << 4 | (uint64_t)d;
    }
    *v = x;
    return 1;
}

/* root/CKPT_FENCE_FILE opened (made when missing) and locked: its fd, *have the generation in it
 * (0 for none, or for text that is none: the next raise writes it whole); -errno on failure.
 * tick: NULL blocks; else the lock is tried every 20 ms and tick(arg) called between, giving up
 * with its code when it returns one < 0. */
static int fence_lock(const char *root, uint64_t *have, int (*tick)(void *), void *arg)
{
    char path[4096], buf[32];
    snprintf(path, sizeof path, "%s/%s", root, CKPT_FENCE_FILE);
    int fd = fileio_open_regular_as(path, O_RDWR | O_CREAT | O_NOFOLLOW, 0644, NULL);
    if (fd < 0)
        return fd == -EINVAL ? -DF_ELAYOUT : fd;     /* (a FIFO, a socket, a device: no fence) */
    while (flock(fd, tick ? LOCK_EX | LOCK_NB : LOCK_EX) < 0) {
        if (errno == EINTR)
            continue;
        int r = errno != EWOULDBLOCK || !tick ? -errno : tick(arg);
        if (r < 0) {
            close(fd);
            return r;
        }
        usleep(20000);
    }
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n < 0) {
        int r = -errno;
        close(fd);
        return r;
    }
    if (!hex16_parse(buf, n, have))
        *have = 0;
    return fd;
}

/* What fence_lock's failure r says. */
static const char *fence_why(int r) { return r == -DF_ELAYOUT ? "not a regular file" : strerror(-r); }

/* The refusal of a write of `generation` under a fence at `have` (> generation). */
static int fenced_out(const char *root, uint64_t generation, uint64_t have, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: generation %" PRIu64 " of the drafter group writes here now: this write of generation "
             "%" PRIu64 " (which has ended) is dropped", root, have, generation);
    return -DF_ESTATE;
}

struct fence_tick {
    int (*fn)(void *);
    void *arg;
    int gave_up;
};

static int fence_tick(void *arg)
{
    struct fence_tick *t = arg;
    int r = t->fn(t->arg);
    t->gave_up = r < 0;
    return r;
}

int ckpt_fence_raise(const char *root, uint64_t generation, int (*tick)(void *), void *arg, char *err,
                     size_t errlen)
{
    uint64_t have;
    struct fence_tick t = { tick, arg, 0 };
    _cleanup_close_ int fd = fence_lock(root, &have, tick ? fence_tick : NULL, &t);
    if (t.gave_up) {
        snprintf(err, errlen, "%s/%s: held by a checkpoint write that does not end (the storage hangs?): %s", root,
                 CKPT_FENCE_FILE, err_str(fd));
        return fd;
    }
    if (fd < 0) {
        snprintf(err, errlen, "%s/%s: %s", root, CKPT_FENCE_FILE, fence_why(fd));
        return fd == -EISDIR || fd == -ELOOP || fd == -EACCES ? -DF_ELAYOUT : fd;
    }
    if (have == generation)
        return 0;
    if (have > generation) {
        /* A later generation has formed: this one ended while the caller was on its way in, or
         * (the coordinator commits a generation before any drafter hears of it) the ledger went
         * back, restored from an older copy. The caller tells which. */
        snprintf(err, errlen, "%s/%s says drafter group generation %" PRIu64 ", the ledger's is %" PRIu64 ": the ledger "
                 "is older than the folder (restored from a copy?): put back the newest; or, to go on from its head, "
                 "move that file and the step folders past the head away (its lineage may prune or replace them)", root,
                 CKPT_FENCE_FILE, have, generation);
        return -DF_ESTATE;
    }
    char text[32];
    int n = snprintf(text, sizeof text, "%016" PRIx64 "\n", generation);
    int r = 0;
    errno = 0;
    if (pwrite(fd, text, (size_t)n, 0) != n || ftruncate(fd, n) < 0 || fsync(fd) < 0)
        r = errno ? -errno : -EIO;
    else if (!have)
        r = fsync_path(root, O_RDONLY | O_DIRECTORY);   /* (made now, perhaps) */
    if (r < 0)
        snprintf(err, errlen, "%s/%s: %s", root, CKPT_FENCE_FILE, strerror(-r));
    return r;
}

/* An open descriptor of dir holding its lock (flock, which goes with the directory when it is
 * renamed), or -errno. */
static int lock_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (flock(fd, LOCK_EX) < 0) {
        int r = -errno;
        close(fd);
        errno = -r;
        return r;
    }
    return fd;
}

int ckpt_save(const char *root, const struct drafter *d, const struct ckpt_train_state *ts, uint64_t generation,
              char *out_dir, size_t out_len, char *err, size_t errlen)
{
    char tmp[4096], final[4096], old[4096];
    int mk = make_root(root, err, errlen);
    if (mk < 0)
        return mk;
    snprintf(final, sizeof final, "%s/step-%010" PRId64, root, ts->step);
    snprintf(tmp, sizeof tmp, "%s/.tmp-step-%010" PRId64 "-%d", root, ts->step, (int)getpid());
    snprintf(old, sizeof old, "%s/.old-step-%010" PRId64 "-%d", root, ts->step, (int)getpid());
    remove_dir(tmp);    /* a leftover of an earlier crash of a process with this pid */
    if (mkdir(tmp, 0755) < 0) {
        int r = -errno;
        snprintf(err, errlen, "%s: mkdir: %s", tmp, strerror(-r));
        return r;
    }
    /* Held until the write is over: ckpt_remove_stale leaves a locked temp dir alone (and an
     * empty one for a while: it may be this one before the lock). */
    _cleanup_close_ int lock = lock_dir(tmp);
    int r = ckpt_write_files(tmp, d, ts, err, errlen);
    if (r == 0 && (r = fsync_path(tmp, O_RDONLY | O_DIRECTORY)) < 0)
        snprintf(err, errlen, "%s: fsync: %s", tmp, strerror(-r));
    if (r < 0) {
        remove_dir(tmp);
        return r;
    }
    /* From here to the root's fsync under the fence: a generation that began meanwhile (this
     * one has ended) is not overwritten, and one beginning waits until this is in place. */
    _cleanup_close_ int fence = -1;
    uint64_t have = 0;
    if (generation && (fence = fence_lock(root, &have, NULL, NULL)) < 0)
        r = df_fail(err, errlen, fence, "%s/%s: %s", root, CKPT_FENCE_FILE, fence_why(fence));
    else if (generation && have > generation)
        r = fenced_out(root, generation, have, err, errlen);
    if (r < 0) {
        remove_dir(tmp);
        return r;
    }
    bool replaced = false;
    _cleanup_close_ int aside = -1;
    if (rename(tmp, final) < 0) {
        if (errno != EEXIST && errno != ENOTEMPTY) {
            r = -errno;
            snprintf(err, errlen, "rename %s -> %s: %s", tmp, final, strerror(-r));
            remove_dir(tmp);
            return r;
        }
        /* A checkpoint of this step exists (a replay): swap the two in one step, so a crash
         * never leaves step-N missing (the coordinator may already hold it as durable). */
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
            snprintf(old, sizeof old, "%s", tmp);
        } else if ((errno != EINVAL && errno != ENOSYS) || (aside = lock_dir(final)) < 0 || rename(final, old) < 0) {
            /* (locked before it is set aside: ckpt_remove_stale of another process would put
             * it back between the two renames, and the move-in would fail) */
            r = -errno;
            snprintf(err, errlen, "replace %s: %s", final, strerror(-r));
            remove_dir(tmp);
            return r;
        } else if (rename(tmp, final) < 0) {
            /* (two renames only where the file system cannot exchange) The old one goes back:
             * a failed replay never loses the checkpoint the coordinator holds as durable. */
            r = -errno;
            if (rename(old, final) < 0)
                snprintf(err, errlen, "replace %s: %s; the previous one is left at %s", final, strerror(-r), old);
            else
                snprintf(err, errlen, "replace %s: %s", final, strerror(-r));
            fsync_path(root, O_RDONLY | O_DIRECTORY);
            remove_dir(tmp);
            return r;
        }
        replaced = true;
    }
    if ((r = fsync_path(root, O_RDONLY | O_DIRECTORY)) < 0) {
        snprintf(err, errlen, "%s: fsync: %s", root, strerror(-r));
        return r;
    }
    if (replaced)
        remove_dir(old);
    if (out_dir)
        snprintf(out_dir, out_len, "%s", final);
    return 0;
}

/* The step of a "step-<digits>" directory name, or -1 for any other name. */
static int64_t step_of_dir(const char *name)
{
    if (strncmp(name, "step-", 5) || !name[5])
        return -1;
    char *end;
    errno = 0;
    long long s = strtoll(name + 5, &end, 10);
    return *end || errno || s < 0 || name[5] < '0' || name[5] > '9' ? -1 : (int64_t)s;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int ckpt_prune(const char *root, int keep, int64_t written, int64_t head, uint64_t generation)
{
    if (keep <= 0)
        return 0;           /* keep them all */
    _cleanup_close_ int fence = -1;
    uint64_t have = 0;
    if (generation && ((fence = fence_lock(root, &have, NULL, NULL)) < 0 || have > generation))
        return 0;           /* (a later generation's checkpoints are no business of this one) */
    DIR *dir = opendir(root);
    if (!dir)
        return 0;
    enum { MAX_DIRS = 4096 };
    int64_t steps[MAX_DIRS];
    int n = 0, removed = 0;
    struct dirent *e;
    while ((e = readdir(dir)) && n < MAX_DIRS)
        if ((steps[n] = step_of_dir(e->d_name)) >= 0)
            n++;
    closedir(dir);
    qsort(steps, (size_t)n, sizeof *steps, cmp_i64);
    int upto = n;           /* steps[0 .. upto) are at or before `written` */
    while (upto > 0 && steps[upto - 1] > written)
        upto--;
    for (int i = 0; i < n; i++) {
        /* (the head is never stale: a write below it is no lineage's, and must not take it) */
        int stale = i >= upto && steps[i] != head, old = i < upto - keep && steps[i] < head;
        if (!stale && !old)
            continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/step-%010" PRId64, root, steps[i]);
        if (remove_dir(path) == 0)
            removed++;
    }
    return removed;
}

static bool dir_is_empty(const char *dir)
{
    DIR *dh = opendir(dir);
    if (!dh)
        return false;
    struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(dh)))
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(dh);
    return empty;
}

/* A claim's temp file (write_run_id) left by a crash: one that no claimant holds locked and that
 * is written, or empty for 10 minutes (a claimant writes only once it holds the lock, which it
 * takes a moment after the file's creation). */
static int remove_stale_claim(DIR *dh, const char *name)
{
    _cleanup_close_ int fd = openat(dirfd(dh), name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;     /* (O_NONBLOCK: a FIFO under the name opens without waiting, and is left) */
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
        return 0;
    if (!st.st_size && st.st_mtime > time(NULL) - 600)
        return 0;
    return unlinkat(dirfd(dh), name, 0) == 0;
}

/* A .tmp-step / .old-step directory nobody holds the lock of: an interrupted write's leftover. */
int ckpt_remove_stale(const char *root)
{
    DIR *dh = opendir(root);
    if (!dh)
        return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(dh))) {
        if (!strncmp(e->d_name, "." CKPT_RUN_FILE "-", sizeof CKPT_RUN_FILE + 1)) {
            removed += remove_stale_claim(dh, e->d_name);
            continue;
        }
        if (strncmp(e->d_name, ".tmp-step-", 10) && strncmp(e->d_name, ".old-step-", 10))
            continue;
        _cleanup_close_ int fd = openat(dirfd(dh), e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0)
            continue;   /* a write in progress (or gone already) */
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        /* A write takes its temp dir's lock a moment after making it, and writes in it only
         * once locked: an empty one is left for 10 minutes (a crash's leftover goes later). */
        struct stat made;
        if (!strncmp(e->d_name, ".tmp-step-", 10) && fstat(fd, &made) == 0 && made.st_mtime > time(NULL) - 600 &&
            dir_is_empty(path))
            continue;
        long long step;
        int end = 0;
        if (!strncmp(e->d_name, ".old-step-", 10) && sscanf(e->d_name + 10, "%lld-%*d%n", &step, &end) == 1 &&
            !e->d_name[10 + end] && step >= 0) {
            /* A replacement by two renames cut between them (a file system that cannot
             * exchange): step-N is gone and this is the checkpoint the coordinator may hold as
             * durable. Put back, not removed; with step-N there, the replacement completed. */
            char final[4096];
            snprintf(final, sizeof final, "%s/step-%010lld", root, step);
            struct stat st;
            if (lstat(final, &st) < 0 && errno == ENOENT && rename(path, final) == 0) {
                fsync_path(root, O_RDONLY | O_DIRECTORY);
                continue;
            }
        }
        if (remove_dir(path) == 0)
            removed++;
    }
    closedir(dh);
    return removed;
}

int ckpt_latest(const char *root, char *dir, size_t dir_len, int64_t *step)
{
    DIR *dh = opendir(root);
    if (!dh)
        return errno == ENOENT ? -ENOENT : -errno;
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(dh))) {
        const char *n = e->d_name;
        int64_t s = step_of_dir(n);
        if (s <= best)
            continue;
        bool complete = true;
        static const char *const files[] = { CKPT_CONFIG, CKPT_WEIGHTS, CKPT_OPTIMIZER };
        for (int i = 0; i < 3 && complete; i++) {
            char p[4096];
            struct stat st;
            snprintf(p, sizeof p, "%s/%s/%s", root, n, files[i]);
            complete = stat(p, &st) == 0 && S_ISREG(st.st_mode);
        }
        if (complete)
            best = s;
    }
    closedir(dh);
    if (best < 0)
        return -ENOENT;
    snprintf(dir, dir_len, "%s/step-%010" PRId64, root, best);
    if (step)
        *step = best;
    return 0;
}

int ckpt_read_run_id(const char *root, uint64_t *id, char *err, size_t errlen)
{
    char path[4096], buf[64];
    snprintf(path, sizeof path, "%s/%s", root, CKPT_RUN_FILE);
    _cleanup_close_ int fd = fileio_open_regular_as(path, O_RDONLY | O_NOFOLLOW, 0, NULL);
    if (fd < 0) {
        int e = -fd;
        if (e == ENOENT)
            return 0;
        if (e == ENOTDIR)
            snprintf(err, errlen, "%s: not a folder (a file is there)", root);
        else if (e == EINVAL)       /* a folder, a FIFO (not waited on for a writer), a socket, a device */
            snprintf(err, errlen, "%s: not a regular file: move the folder away", path);
        else
            snprintf(err, errlen, "%s: %s", path, strerror(e));
        /* (one a restart does not mend is -DF_ELAYOUT: exit 78) */
        return e == EACCES || e == EPERM || e == ELOOP || e == ENOTDIR || e == EINVAL ? -DF_ELAYOUT : fd;
    }
    ssize_t n = read(fd, buf, sizeof buf - 1);
    if (n < 0) {
        int r = -errno;
        snprintf(err, errlen, "%s: %s", path, strerror(-r));
        return r;
    }
    uint64_t v;
    if (!hex16_parse(buf, n, &v) || !v) {
        snprintf(err, errlen, "%s: not a run id (16 hex digits and a newline): move the folder away", path);
        return -DF_ELAYOUT;     /* no restart mends it */
    }
    *id = v;
    return 1;
}

/* A step-N folder in root, or one an interrupted replacement set aside (.old-step): 1 with its
 * name, 0 when there is none, <0 with err. An unfinished write (.tmp-step) is no checkpoint. */
static int any_checkpoint(const char *root, char *name, size_t len, char *err, size_t errlen)
{
    DIR *dh = opendir(root);
    if (!dh) {
        int r = -errno;
        snprintf(err, errlen, "%s: %s", root, strerror(-r));
        return r;
    }
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(dh)))
        if (step_of_dir(e->d_name) >= 0 || !strncmp(e->d_name, ".old-step-", 10)) {
            snprintf(name, len, "%s", e->d_name);
            found = 1;
        }
    closedir(dh);
    return found;
}

/* Whether dir (a checkpoint path) is in root: its parent is root's folder (same inode: a path
 * spelt otherwise, relative or through a link, counts). */
static bool is_in(const char *dir, const char *root)
{
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (!slash || slash == parent)
        return false;
    *slash = 0;
    struct stat a, b;
    return stat(parent, &a) == 0 && stat(root, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Put run_id into root/CKPT_RUN_FILE where there is none: written aside, then linked in
 * (-EEXIST when another claimant was first), root synced. */
static int write_run_id(const char *root, uint64_t run_id, char *err, size_t errlen)
{
    char tmp[4096], path[4096], text[32];
    snprintf(tmp, sizeof tmp, "%s/.%s-XXXXXX", root, CKPT_RUN_FILE);
    snprintf(path, sizeof path, "%s/%s", root, CKPT_RUN_FILE);
    int n = snprintf(text, sizeof text, "%016" PRIx64 "\n", run_id);
    _cleanup_close_ int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int r = -errno;
        snprintf(err, errlen, "%s: %s", tmp, strerror(-r));
        return r;
    }
    /* Locked while it exists, and written only once locked: ckpt_remove_stale takes a temp
     * file it can lock and that is not empty for one a crash left behind. */
    int r = flock(fd, LOCK_EX) < 0 ? -errno : fileio_write_all(fd, text, (size_t)n);
    if (r == 0 && (fchmod(fd, 0644) < 0 || fsync(fd) < 0))
        r = -errno;
    if (r == 0 && link(tmp, path) < 0)
        r = -errno;
    if (r < 0 && r != -EEXIST)
        snprintf(err, errlen, "%s -> %s: %s", tmp, path, strerror(-r));
    unlink(tmp);
    if (r == 0 && (r = fsync_path(root, O_RDONLY | O_DIRECTORY)) < 0)
        snprintf(err, errlen, "%s: fsync: %s", root, strerror(-r));
    return r;
}

int ckpt_claim_root(const char *root, uint64_t run_id, const char *resume_dir, char *err, size_t errlen)
{
    if (!run_id) {
        snprintf(err, errlen, "%s: the coordinator named no run (run id 0)", root);
        return -EINVAL;
    }
    /* A run-id once linked in is never replaced: after losing the race to link one, one more
     * look decides. */
    for (int pass = 0; pass < 2; pass++) {
        int r = make_root(root, err, errlen);
        if (r < 0)
            return r;
        uint64_t have = 0;
        if ((r = ckpt_read_run_id(root, &have, err, errlen)) < 0)
            return r;
        if (r == 1 && have == run_id)
            return 0;
        /* Another run's folder, even one without a checkpoint yet: that run may be running
         * (before its first checkpoint), and both would write, replace and prune there. */
        if (r == 1) {
            snprintf(err, errlen, "%s belongs to run %016" PRIx64 ", not to this run (%016" PRIx64 "): move the "
                     "folder away (with its %s and %s), or set drafter.checkpoint_dir to another folder", root, have,
                     run_id, CKPT_RUN_FILE, CKPT_FENCE_FILE);
            return -DF_ELAYOUT;
        }
        /* Unclaimed (written before folders were claimed): its checkpoints are this run's only when
         * the run resumes from one of them. Else this run's prunes or a same-step replacement
         * could remove them. */
        bool resumes_here = resume_dir && resume_dir[0] && is_in(resume_dir, root);
        char name[256];
        int found = resumes_here ? 0 : any_checkpoint(root, name, sizeof name, err, errlen);
        if (found < 0)
            return found;
        if (found) {
            snprintf(err, errlen, "%s holds checkpoints of no known run (%s ...), which this run could prune or "
                     "replace: move them away, or set drafter.checkpoint_dir to another folder", root, name);
            return -DF_ELAYOUT;
        }
        /* A fence left by another run (moved away without it) is not this run's: its generations
         * count from 1 again, and every write of theirs would be dropped under it. */
        char fence[4096];
        snprintf(fence, sizeof fence, "%s/%s", root, CKPT_FENCE_FILE);
        if (unlink(fence) < 0 && errno != ENOENT) {
            r = -errno;
            snprintf(err, errlen, "%s: %s", fence, strerror(-r));
            return r;
        }
        r = write_run_id(root, run_id, err, errlen);
        if (r != -EEXIST)
            return r;
        /* another drafter claimed it first: compare against its claim */
    }
    snprintf(err, errlen, "%s/%s: claimed and gone again", root, CKPT_RUN_FILE);
    return -EAGAIN;
}

/* ---- load ---- */

static void progress(const struct ckpt_load_opts *o)
{
    if (o && o->progress)
        o->progress(o->progress_arg);
}

/* What a failed fileio_read_all means, for a message. */
static const char *read_why(int r)
{
    return r == -DF_ETRUNC ? "file too short" : strerror(-r);
}

#define LOAD_CHUNK (4u << 20)   /* floats per read while verifying optimizer.bin (16 MiB) */

/* Whether optimizer.bin's last 8 bytes are the FNV-1a of everything before them, read with
 * pread through buf (LOAD_CHUNK floats, or n_params when fewer): 1, 0, or -errno. The header
 * is not trusted for the size here (it may be the damaged part). */
static int whole_file_sum_ok(int fd, float *buf, size_t n_params)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    if (st.st_size < 8)
        return 0;
    size_t cap = (n_params < LOAD_CHUNK ? n_params : LOAD_CHUNK) * sizeof(float);
    uint64_t h = FNV_INIT, want;
    off_t end = st.st_size - 8;
    for (off_t at = 0; at < end;) {
        size_t n = (size_t)(end - at) < cap ? (size_t)(end - at) : cap;
        ssize_t got = pread(fd, buf, n, at);
        if (got <= 0)
            return got < 0 ? -errno : 0;
        h = fnv1a(h, buf, (size_t)got);
        at += got;
    }
    if (pread(fd, &want, sizeof want, end) != (ssize_t)sizeof want)
        return 0;
    return h == want;
}

/* optimizer.bin, opened and verified without keeping its arrays: the header, then master / m / v
 * read a chunk at a time (buf: LOAD_CHUNK floats), hashed, master checked against the bf16 weights
 * w it was rounded to. On success *fd_out is left open, positioned at the arrays, for
 * apply_optimizer(), and *st_out is the file's stat. Applies nothing. */
static int verify_optimizer(const char *path, const struct drafter *d, const float *w, float *buf,
                            struct opt_header *hout, int *fd_out, struct stat *st_out,
                            const struct ckpt_load_opts *o, char *err, size_t errlen)
{
    _cleanup_close_ int fd = fileio_open_regular(path, NULL);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, fd == -EINVAL ? "not a regular file" : strerror(-fd));
        return fd == -ENOENT ? -DF_EMISSING : fd == -EINVAL ? -DF_EFORMAT : fd;
    }
    struct opt_header h;
    int r = fileio_read_all(fd, &h, sizeof h);
    if (r < 0) {
        snprintf(err, errlen, "%s: header: %s", path, read_why(r));
        return r;
    }
    if (memcmp(h.magic, OPT_MAGIC, 8)) {
        snprintf(err, errlen, "%s: not a dflash optimizer state", path);
        return -DF_EMAGIC;
    }
    /* Another version or layout is a config error (exit 78) only when the file is whole: behind
     * a config.json that matched (checked first), a flipped byte in the header is the likelier
     * story, and a damaged checkpoint makes the lineage fall back instead. */
    bool version_ok = h.version == OPT_VERSION, layout_ok = h.n_params == d->n_params && h.layout_hash == layout_hash(d);
    if ((!version_ok || !layout_ok) && (r = whole_file_sum_ok(fd, buf, d->n_params)) <= 0) {
        snprintf(err, errlen, "%s: checksum mismatch (corrupt file: its header says version %u, %" PRIu64 " params)",
                 path, h.version, h.n_params);
        return r < 0 ? r : -DF_ECHECKSUM;
    }
    if (!version_ok) {
        snprintf(err, errlen, "%s: version %u, this build reads %d", path, h.version, OPT_VERSION);
        return -DF_EVERSION;
    }
    if (h.header_size != sizeof h) {
        snprintf(err, errlen, "%s: header_size %u, version %u has %zu", path, h.header_size, h.version, sizeof h);
        return -DF_EFORMAT;
    }
    if (!layout_ok) {
        snprintf(err, errlen, "%s: parameter layout (%" PRIu64 " params) does not match this drafter (%zu)",
                 path, h.n_params, d->n_params);
        return -DF_ELAYOUT;
    }
    /* The steps: not negative, and the one its directory is named for (a step-N dir copied or
     * renamed by hand would resume the wrong step: the run's lineage is by step). */
    char dirname_[PATH_MAX];
    snprintf(dirname_, sizeof dirname_, "%s", path);
    char *slash = strrchr(dirname_, '/');
    if (slash)
        *slash = 0;
    slash = strrchr(dirname_, '/');
    int64_t named = step_of_dir(slash ? slash + 1 : dirname_);
    if (h.step < 0 || h.opt_step < 0 || (named >= 0 && h.step != named)) {
        snprintf(err, errlen, "%s: step %" PRId64 " (optimizer step %" PRId64 ") in a directory named for step %" PRId64,
                 path, h.step, h.opt_step, named);
        return -DF_EFORMAT;
    }
    if (fstat(fd, st_out) < 0) {
        r = -errno;
        snprintf(err, errlen, "%s: %s", path, strerror(-r));
        return r;
    }
    uint64_t hash = fnv1a(FNV_INIT, &h, sizeof h), want;
    size_t stray = SIZE_MAX;            /* the first master weight its bf16 weight was not rounded from */
    size_t nonfinite = SIZE_MAX;        /* the first NaN or infinity, of array nf_array */
    int nf_array = 0;
    for (int a = 0; a < 3; a++) {       /* master, m, v */
        for (size_t at = 0; at < d->n_params; at += LOAD_CHUNK) {
            size_t n = d->n_params - at < LOAD_CHUNK ? d->n_params - at : LOAD_CHUNK;
            if ((r = fileio_read_all(fd, buf, n * sizeof(float))) < 0) {
                snprintf(err, errlen, "%s: %s", path, read_why(r));
                return r;
            }
            hash = fnv1a(hash, buf, n * sizeof(float));
            /* the master weights must be the ones model.safetensors was rounded from */
            for (size_t i = 0; a == 0 && stray == SIZE_MAX && i < n; i++)
                if (cpu_bf16_to_f32_one(cpu_f32_to_bf16_one(buf[i])) != w[at + i] &&
                    !(buf[i] != buf[i] && w[at + i] != w[at + i]))
                    stray = at + i;
            if (nonfinite == SIZE_MAX) {
                float acc = 0;              /* x - x is 0 for a finite x, NaN for inf or NaN */
                for (size_t i = 0; i < n; i++)
                    acc += buf[i] - buf[i];
                for (size_t i = 0; acc != 0 && i < n && nonfinite == SIZE_MAX; i++)
                    if (!isfinite(buf[i])) {
                        nonfinite = at + i;
                        nf_array = a;
                    }
            }
            progress(o);
        }
    }
    if ((r = fileio_read_all(fd, &want, sizeof want)) < 0) {
        snprintf(err, errlen, "%s: %s", path, read_why(r));
        return r;
    }
    char extra;
    if (read(fd, &extra, 1) != 0) {
        snprintf(err, errlen, "%s: trailing bytes", path);
        return -DF_EFORMAT;
    }
    if (hash != want) {     /* a damaged file first: its master weights mismatch too */
        snprintf(err, errlen, "%s: checksum mismatch (corrupt file)", path);
        return -DF_ECHECKSUM;
    }
    if (nonfinite != SIZE_MAX) {
        static const char *const names[3] = { "master weight", "first moment", "second moment" };
        snprintf(err, errlen, "%s: %s %zu is NaN or infinite", path, names[nf_array], nonfinite);
        return -DF_ENAN;
    }
    if (stray != SIZE_MAX) {
        snprintf(err, errlen, "%s: master weights do not belong to %s (element %zu)", path, CKPT_WEIGHTS, stray);
        return -DF_ECHECKSUM;
    }
    if (lseek(fd, (off_t)sizeof h, SEEK_SET) < 0) {
        r = -errno;
        snprintf(err, errlen, "%s: %s", path, strerror(-r));
        return r;
    }
    *hout = h;
    *fd_out = fd;
    fd = -1;
    return 0;
}

/* The verified arrays, read again straight into the drafter. A checkpoint is never changed in
 * place (it is written beside and renamed): the file's size and modification time are compared
 * with the first read's, and a failure here leaves the drafter half loaded. */
static int apply_optimizer(int fd, const char *path, const struct stat *st0, struct drafter *d,
                           const struct ckpt_load_opts *o, char *err, size_t errlen)
{
    float *dst[3] = { d->params, d->opt->m, d->opt->v };
    int r = 0;
    for (int a = 0; a < 3 && r == 0; a++) {
        r = fileio_read_all(fd, dst[a], d->n_params * sizeof(float));
        progress(o);
    }
    struct stat st;
    if (r == 0 && fstat(fd, &st) < 0)
        r = -errno;
    if (r < 0) {
        snprintf(err, errlen, "%s: %s (the drafter is half loaded)", path, read_why(r));
        return r;
    }
    if (st.st_size != st0->st_size || st.st_mtim.tv_sec != st0->st_mtim.tv_sec ||
        st.st_mtim.tv_nsec != st0->st_mtim.tv_nsec) {
        snprintf(err, errlen, "%s: changed while it was loaded (the drafter is half loaded)", path);
        return -DF_ECHECKSUM;
    }
    return 0;
}

int ckpt_load(const char *dir, struct drafter *d, struct ckpt_train_state *ts, const struct ckpt_load_opts *o,
              char *err, size_t errlen)
{
    const bool require_optimizer = !o || !o->weights_only_ok;
    struct drafter_config saved;
    char path[4096];
    int r = ckpt_read_config(dir, &saved, err, errlen);
    if (r < 0)
        return r;
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_CONFIG);
    if ((r = ckpt_check_config(&saved, &d->cfg, path, err, errlen)) < 0)
        return r;

    struct st_set *st = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_WEIGHTS);
    if ((r = st_open_file(&st, path, err, errlen)) < 0)
        return r;
    /* Everything is checked before the drafter is touched: the bf16 weights are staged (one
     * array), optimizer.bin is verified a chunk at a time, then read again into place. */
    size_t chunk = d->n_params < LOAD_CHUNK ? d->n_params : LOAD_CHUNK;
    float *w = malloc(d->n_params * sizeof(float) + 1), *buf = malloc(chunk * sizeof(float) + 1);
    int fd = -1;
    if (!w || !buf) {
        r = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < d->n_tensors; i++) {
        const struct drafter_tensor *t = &d->tensors[i];
        const struct st_tensor *x;
        if ((r = st_expect(st, t->name, t->ndim, t->shape, &x, err, errlen)) < 0)
            goto out;
        if ((r = st_read_f32(x, 0, (int64_t)t->numel, w + t->offset)) < 0) {
            snprintf(err, errlen, "%s: %s: %s", path, t->name, err_str(r));
            goto out;
        }
        progress(o);
    }
    struct opt_header h;
    struct stat st0;
    memset(&h, 0, sizeof h);
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_OPTIMIZER);
    r = verify_optimizer(path, d, w, buf, &h, &fd, &st0, o, err, errlen);
    if (r == -DF_EMISSING && !require_optimizer) {
        /* weights only: bf16 values, fresh optimizer */
        memcpy(d->params, w, d->n_params * sizeof(float));
        memset(d->opt->m, 0, d->n_params * sizeof(float));
        memset(d->opt->v, 0, d->n_params * sizeof(float));
        d->opt->step = 0;
        if (ts)
            memset(ts, 0, sizeof *ts);
        r = 0;
        goto out;
    }
    if (r < 0 || (r = apply_optimizer(fd, path, &st0, d, o, err, errlen)) < 0)
        goto out;
    d->opt->step = h.opt_step;
    if (ts)
        *ts = (struct ckpt_train_state){ .step = h.step, .epoch = h.epoch,
                                         .batch_in_epoch = h.batch_in_epoch, .seed = h.seed,
                                         .samples = h.samples, .tokens = h.tokens };
out:
    if (fd >= 0)
        close(fd);
    free(w);
    free(buf);
    st_close(st);
    return r;
}

int ckpt_in_root(const char *root, const char *dir)
{
    char parent[PATH_MAX];
    if (strlen(dir) >= PATH_MAX)
        return -ENAMETOOLONG;
    fileio_parent(dir, parent, sizeof parent);
    if (!strcmp(parent, root))
        return 1;
    struct stat a, b;
    if (stat(root, &a) < 0)
        return -errno;
    if (stat(parent, &b) < 0)
        return errno == ENOENT || errno == ENOTDIR ? 0 : -errno;   /* (a folder that is not there: moved) */
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int ckpt_damaged(const char *dir, int code)
{
    switch (code) {
    case -DF_EMAGIC: case -DF_ETRUNC: case -DF_EFORMAT: case -DF_ECHECKSUM: case -DF_ENAN: case -DF_ERANGE:
    case -DF_EUNSUPPORTED: case -DF_ESHAPE:     /* (what this build never writes: a dtype, an architecture) */
        return 1;
    case -DF_EMISSING: case -ENOENT: case -ENOTDIR: {
        /* Its folder there with a file missing, or gone from a root that holds other checkpoints:
         * removed (by hand, or pruned). A root with none is storage not there (not mounted: the
         * claim before the load made an empty one). */
        struct stat st;
        if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
            return 1;
        char root[PATH_MAX];
        const char *self = fileio_parent(dir, root, sizeof root);
        DIR *d = opendir(root);
        if (!d)
            return 0;
        int others = 0;
        for (struct dirent *e; !others && (e = readdir(d));)
            others = step_of_dir(e->d_name) >= 0 && strcmp(e->d_name, self);
        closedir(d);
        return others;
    }
    default:
        return 0;
    }
}
