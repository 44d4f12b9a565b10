/* hfconfig.c: config.json -> struct hf_config for Qwen3ForCausalLM / LlamaForCausalLM.
 * Every field is type- and range-checked; anything the forward would not honour is an error. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "common/cleanup.h"
#include "common/err.h"
#include "common/jsonutil.h"
#include "model/hfconfig.h"

#define CONFIG_MAX_BYTES (16 << 20)

struct ctx {
    const char *path;
    char *err;
    size_t errlen;
};

__attribute__((format(printf, 4, 5)))
static int fail(const struct ctx *c, int code, const char *field, const char *fmt, ...)
{
    if (c->err && c->errlen) {
        int n = snprintf(c->err, c->errlen, "%s: %s: ", c->path, field);
        if (n >= 0 && (size_t)n < c->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(c->err + n, c->errlen - n, fmt, ap);
            va_end(ap);
        }
    }
    return code;
}

static const cJSON *item(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return (v && !cJSON_IsNull(v)) ? v : NULL;   /* null means "not given", as in transformers */
}

/* Integer field: absent/null -> def (or error when required). */
static int get_int(const struct ctx *c, const cJSON *obj, const char *prefix, const char *key, bool required,
                   long long def, long long lo, long long hi, int *out)
{
    char field[128];
    snprintf(field, sizeof field, "%s%s", prefix, key);
    const cJSON *v = item(obj, key);
    if (!v) {
        if (required)
            return fail(c, -DF_EMISSING, field, "missing");
        *out = (int)def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return fail(c, -DF_EFORMAT, field, "expected an integer");
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return fail(c, -DF_ERANGE, field, "%.17g is out of range [%lld, %lld]", v->valuedouble, lo, hi);
    *out = (int)v->valuedouble;
    return 0;
}

static int get_double(const struct ctx *c, const cJSON *obj, const char *prefix, const char *key, bool required,
                      double def, double lo, double hi, double *out)
{
    char field[128];
    snprintf(field, sizeof field, "%s%s", prefix, key);
    const cJSON *v = item(obj, key);
    if (!v) {
        if (required)
            return fail(c, -DF_EMISSING, field, "missing");
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return fail(c, -DF_EFORMAT, field, "expected a number");
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return fail(c, -DF_ERANGE, field, "%.17g is out of range [%g, %g]", v->valuedouble, lo, hi);
    *out = v->valuedouble;
    return 0;
}

static int get_bool(const struct ctx *c, const cJSON *obj, const char *key, bool def, bool *out)
{
    const cJSON *v = item(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v))
        return fail(c, -DF_EFORMAT, key, "expected true or false");
    *out = cJSON_IsTrue(v);
    return 0;
}

/* rope: from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (hub form). */
static int parse_rope(const struct ctx *c, const cJSON *root, struct hf_rope *rope)
{
    const cJSON *params = item(root, "rope_parameters");
    const cJSON *scaling;
    const char *prefix;
    int r;
    memset(rope, 0, sizeof *rope);
    if (params) {
        if (!cJSON_IsObject(params))
            return fail(c, -DF_EFORMAT, "rope_parameters", "expected an object");
        /* Readers differ on which of the two a model uses (transformers 5 takes rope_scaling over
         * rope_parameters); a file that has both is ambiguous, never guessed at. */
        const cJSON *legacy = item(root, "rope_scaling");
        if (legacy && !cJSON_IsNull(legacy))
            return fail(c, -DF_EFORMAT, "rope_scaling", "given beside rope_parameters: which one the model was "
                        "trained with is ambiguous; keep one of them");
        prefix = "rope_parameters.";
        if ((r = get_double(c, params, prefix, "rope_theta", true, 0, 1e-6, 1e12, &rope->theta)) < 0)
            return r;
        scaling = params;
    } else {
        prefix = "rope_scaling.";
        if ((r = get_double(c, root, "", "rope_theta", false, 10000.0, 1e-6, 1e12, &rope->theta)) < 0)
            return r;
        scaling = item(root, "rope_scaling");
        if (scaling && !cJSON_IsObject(scaling))
            return fail(c, -DF_EFORMAT, "rope_scaling", "expected an object or null");
    }
    /* theta <= 1 makes every rotation frequency >= 1 per position: no model is trained so, and the
     * drafter made from this target refuses it */
    if (!(rope->theta > 1))
        return fail(c, -DF_ERANGE, params ? "rope_parameters.rope_theta" : "rope_theta",
                    "%.17g must be greater than 1", rope->theta);
    if (!scaling)
        return 0;

    const char *tkey = item(scaling, "rope_type") ? "rope_type" : "type";   /* "type": older hub configs */
    const cJSON *t = item(scaling, tkey);
    char field[64];
    snprintf(field, sizeof field, "%s%s", prefix, tkey);
    if (!t) {
        if (params)
            return 0;           /* rope_parameters without a type: default rope */
        return fail(c, -DF_EMISSING, field, "missing");
    }
    if (!cJSON_IsString(t))
        return fail(c, -DF_EFORMAT, field, "expected a string");
    if (!strcmp(t->valuestring, "default"))
        return 0;
    if (strcmp(t->valuestring, "llama3"))
        return fail(c, -DF_EUNSUPPORTED, field, "'%s' is not supported (default, llama3)", t->valuestring);

    rope->type = HF_ROPE_LLAMA3;
    if ((r = get_double(c, scaling, prefix, "factor", true, 0, 1.0, 1e6, &rope->factor)) < 0 ||
        (r = get_double(c, scaling, prefix, "low_freq_factor", true, 0, 1e-6, 1e6, &rope->low_freq_factor)) < 0 ||
        (r = get_double(c, scaling, prefix, "high_freq_factor", true, 0, 1e-6, 1e6, &rope->high_freq_factor)) < 0 ||
        (r = get_int(c, scaling, prefix, "original_max_position_embeddings", true, 0, 1, 1 << 30,
                     &rope->original_max_position_embeddings)) < 0)
        return r;
    if (!(rope->high_freq_factor > rope->low_freq_factor)) {
        snprintf(field, sizeof field, "%shigh_freq_factor", prefix);
        return fail(c, -DF_ERANGE, field, "must be greater than low_freq_factor");
    }
    return 0;
}

/* The fields of a parsed config.json (an object with no key twice) into cfg. */
static int parse_root(const cJSON *root, const char *path, struct hf_config *cfg, char *err, size_t errlen)
{
    const struct ctx c = { path, err, errlen };
    int r;
    const cJSON *arch = item(root, "architectures");
    const cJSON *a0 = arch && cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    if (!arch) {
        r = fail(&c, -DF_EMISSING, "architectures", "missing");
        goto out;
    }
    if (!a0 || !cJSON_IsString(a0) || cJSON_GetArraySize(arch) != 1) {
        r = fail(&c, -DF_EFORMAT, "architectures", "expected a list of one name");
        goto out;
    }
    if (!strcmp(a0->valuestring, "LlamaForCausalLM")) {
        cfg->arch = HF_ARCH_LLAMA;
    } else if (!strcmp(a0->valuestring, "Qwen3ForCausalLM")) {
        cfg->arch = HF_ARCH_QWEN3;
    } else {
        r = fail(&c, -DF_EUNSUPPORTED, "architectures", "'%.64s' is not supported (LlamaForCausalLM, Qwen3ForCausalLM)",
                 a0->valuestring);
        goto out;
    }
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", a0->valuestring);
    const bool qwen = cfg->arch == HF_ARCH_QWEN3;

    if ((r = get_int(&c, root, "", "hidden_size", true, 0, 1, 1 << 20, &cfg->hidden_size)) < 0 ||
        (r = get_int(&c, root, "", "num_hidden_layers", true, 0, 1, 4096, &cfg->num_layers)) < 0 ||
        (r = get_int(&c, root, "", "num_attention_heads", true, 0, 1, 4096, &cfg->num_heads)) < 0 ||
        (r = get_int(&c, root, "", "num_key_value_heads", false, cfg->num_heads, 1, cfg->num_heads,
                     &cfg->num_kv_heads)) < 0 ||
        (r = get_int(&c, root, "", "intermediate_size", true, 0, 1, 1 << 22, &cfg->intermediate_size)) < 0 ||
        (r = get_int(&c, root, "", "vocab_size", true, 0, 1, 1 << 26, &cfg->vocab_size)) < 0 ||
        (r = get_int(&c, root, "", "max_position_embeddings", false, qwen ? 32768 : 2048, 1, 1 << 30,
                     &cfg->max_position_embeddings)) < 0 ||
        (r = get_double(&c, root, "", "rms_norm_eps", false, 1e-6, 1e-30, 1.0, &cfg->rms_eps)) < 0 ||
        (r = get_bool(&c, root, "tie_word_embeddings", false, &cfg->tie_word_embeddings)) < 0 ||
        (r = get_bool(&c, root, "attention_bias", false, &cfg->attention_bias)) < 0 ||
        (r = get_bool(&c, root, "mlp_bias", false, &cfg->mlp_bias)) < 0)
        goto out;
    if (cfg->num_heads % cfg->num_kv_heads) {
        r = fail(&c, -DF_ERANGE, "num_key_value_heads", "%d does not divide num_attention_heads %d",
                 cfg->num_kv_heads, cfg->num_heads);
        goto out;
    }
    if (item(root, "head_dim")) {
        if ((r = get_int(&c, root, "", "head_dim", true, 0, 2, 4096, &cfg->head_dim)) < 0)
            goto out;
    } else if (qwen) {
        cfg->head_dim = 128;    /* Qwen3Config's default, whatever hidden_size / num_attention_heads is */
    } else if (cfg->hidden_size % cfg->num_heads) {
        r = fail(&c, -DF_EMISSING, "head_dim", "missing and hidden_size %d is not a multiple of num_attention_heads %d",
                 cfg->hidden_size, cfg->num_heads);
        goto out;
    } else if (cfg->hidden_size / cfg->num_heads > 4096) {
        r = fail(&c, -DF_ERANGE, "head_dim", "hidden_size %d / num_attention_heads %d = %d is out of range [2, 4096]",
                 cfg->hidden_size, cfg->num_heads, cfg->hidden_size / cfg->num_heads);
        goto out;
    } else {
        cfg->head_dim = cfg->hidden_size / cfg->num_heads;
    }
    if (cfg->head_dim % 2) {
        r = fail(&c, -DF_ERANGE, "head_dim", "%d is odd (rotary needs pairs)", cfg->head_dim);
        goto out;
    }
    if (qwen && cfg->mlp_bias) {
        r = fail(&c, -DF_EUNSUPPORTED, "mlp_bias", "Qwen3 has no MLP biases");
        goto out;
    }

    const cJSON *act = item(root, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu"))) {
        r = fail(&c, -DF_EUNSUPPORTED, "hidden_act", "only \"silu\" is supported");
        goto out;
    }
    double prf = 1.0;
    if ((r = get_double(&c, root, "", "partial_rotary_factor", false, 1.0, 0.0, 1.0, &prf)) < 0)
        goto out;
    if (prf != 1.0) {
        r = fail(&c, -DF_EUNSUPPORTED, "partial_rotary_factor", "only 1.0 is supported");
        goto out;
    }
    bool sliding = false;
    if ((r = get_bool(&c, root, "use_sliding_window", false, &sliding)) < 0)
        goto out;
    if (sliding) {
        r = fail(&c, -DF_EUNSUPPORTED, "use_sliding_window", "sliding-window attention is not supported");
        goto out;
    }
    const cJSON *types = item(root, "layer_types");
    if (types) {
        const cJSON *t;
        if (!cJSON_IsArray(types)) {
            r = fail(&c, -DF_EFORMAT, "layer_types", "expected a list");
            goto out;
        }
        cJSON_ArrayForEach(t, types)
            if (!cJSON_IsString(t) || strcmp(t->valuestring, "full_attention")) {
                r = fail(&c, -DF_EUNSUPPORTED, "layer_types", "only \"full_attention\" layers are supported");
                goto out;
            }
    }
    r = parse_rope(&c, root, &cfg->rope);
out:
    return r;
}

int hf_config_parse(const char *json, const char *path, struct hf_config *cfg, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    cJSON *root;
    int r = json_parse_object(json, strlen(json), path, &root, err, errlen);
    if (r < 0)
        return r;
    r = parse_root(root, path, cfg, err, errlen);
    cJSON_Delete(root);
    return r;
}

int hf_config_load(const char *dir, struct hf_config *cfg, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    memset(cfg, 0, sizeof *cfg);
    cJSON *root;
    int r = json_read_object(path, CONFIG_MAX_BYTES, &root, err, errlen);
    if (r < 0)
        return r;
    r = parse_root(root, path, cfg, err, errlen);
    cJSON_Delete(root);
    return r;
}

static void put_text(char *buf, size_t n, size_t *at, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void put_text(char *buf, size_t n, size_t *at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + (*at < n ? *at : n), *at < n ? n - *at : 0, fmt, ap);
    va_end(ap);
    *at += k > 0 ? (size_t)k : 0;
}

/* " key=value" of a double, its value the shortest text that reads back as the same number. */
static void put_double(char *buf, size_t n, size_t *at, const char *key, double v)
{
    char t[40];
    if (fabs(v) < 1e15 && v == floor(v)) {     /* (a whole number as one: 1000000, not 1e+06) */
        snprintf(t, sizeof t, "%.0f", v);
    } else {
        for (int p = 1; p <= 17; p++) {
            snprintf(t, sizeof t, "%.*g", p, v);
            if (strtod(t, NULL) == v)
                break;
        }
    }
    put_text(buf, n, at, " %s=%s", key, t);
}

int hf_config_forward_text(const struct hf_config *c, char *buf, size_t n)
{
    size_t at = 0;
    put_text(buf, n, &at, "architectures=%s hidden_size=%d num_hidden_layers=%d num_attention_heads=%d "
             "num_key_value_heads=%d head_dim=%d intermediate_size=%d vocab_size=%d", c->arch_name, c->hidden_size,
             c->num_layers, c->num_heads, c->num_kv_heads, c->head_dim, c->intermediate_size, c->vocab_size);
    put_double(buf, n, &at, "rms_norm_eps", c->rms_eps);
    put_double(buf, n, &at, "rope_theta", c->rope.theta);
    put_text(buf, n, &at, " rope_type=%s", c->rope.type == HF_ROPE_LLAMA3 ? "llama3" : "default");
    if (c->rope.type == HF_ROPE_LLAMA3) {
        put_double(buf, n, &at, "factor", c->rope.factor);
        put_double(buf, n, &at, "low_freq_factor", c->rope.low_freq_factor);
        put_double(buf, n, &at, "high_freq_factor", c->rope.high_freq_factor);
        put_text(buf, n, &at, " original_max_position_embeddings=%d", c->rope.original_max_position_embeddings);
    }
    put_text(buf, n, &at, " tie_word_embeddings=%s attention_bias=%s mlp_bias=%s",
             c->tie_word_embeddings ? "true" : "false", c->attention_bias ? "true" : "false",
             c->mlp_bias ? "true" : "false");
    return at < n ? (int)at : -ENAMETOOLONG;
}
