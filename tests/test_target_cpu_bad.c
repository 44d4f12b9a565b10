/* test_target_cpu_bad.c: target_open on damaged copies of the golden checkpoints: each damage gives
 * a negative code and one line naming the file and the tensor or field, never a crash (run under ASan). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/err.h"
#include "model/target.h"
#include "tests/test.h"

static char tmp[512];

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        TEST_FAIL("open %s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*len + 1);
    CHECK(fread(b, 1, *len, f) == *len);
    b[*len] = 0;
    fclose(f);
    return b;
}

static void write_all(const char *path, const void *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f);
    CHECK(fwrite(b, 1, len, f) == len);
    fclose(f);
}

/* Fresh copy of a golden model dir under tmp/<name>; returns its path. */
static const char *copy_model(const char *src_name, const char *name)
{
    static char dst[8][1024];
    static int slot;
    char *d = dst[slot++ % 8];
    snprintf(d, 1024, "%s/%s", tmp, name);
    CHECK(mkdir(d, 0700) == 0);
    const char *files[] = { "config.json", "model.safetensors", "model.safetensors.index.json",
                            "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                            "model-00003-of-00003.safetensors" };
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char s[1200], t[1200];
        snprintf(s, sizeof s, "%s/tests/data/golden/%s/%s", test_srcdir(), src_name, files[i]);
        if (access(s, F_OK) != 0)
            continue;
        snprintf(t, sizeof t, "%s/%s", d, files[i]);
        size_t len;
        char *b = read_all(s, &len);
        write_all(t, b, len);
        free(b);
    }
    return d;
}

static void edit_config(const char *dir, const char *key, const char *json_value)
{
    char p[1200];
    size_t len;
    snprintf(p, sizeof p, "%s/config.json", dir);
    char *text = read_all(p, &len);
    cJSON *root = cJSON_Parse(text);
    CHECK(root);
    cJSON_DeleteItemFromObjectCaseSensitive(root, key);
    cJSON_AddItemToObject(root, key, cJSON_Parse(json_value));
    char *out = cJSON_Print(root);
    write_all(p, out, strlen(out));
    free(out);
    cJSON_Delete(root);
    free(text);
}

/* Rewrite the JSON header of a safetensors file through `fn`, keeping the data block. */
static void edit_header(const char *path, void (*fn)(cJSON *root, uint64_t data_len))
{
    size_t len;
    unsigned char *b = (unsigned char *)read_all(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | b[i];
    cJSON *root = cJSON_ParseWithLength((char *)b + 8, hlen);
    CHECK(root);
    fn(root, len - 8 - hlen);
    char *hdr = cJSON_PrintUnformatted(root);
    size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
    unsigned char *nb = malloc(8 + padded + (len - 8 - hlen));
    for (int i = 0; i < 8; i++)
        nb[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(nb + 8, hdr, hl);
    memset(nb + 8 + hl, ' ', padded - hl);
    memcpy(nb + 8 + padded, b + 8 + hlen, len - 8 - hlen);
    write_all(path, nb, 8 + padded + (len - 8 - hlen));
    free(nb);
    free(hdr);
    cJSON_Delete(root);
    free(b);
}

static void expect_open_fail(const char *dir, const int *ids, int n, int code, const char *n1, const char *n2)
{
    struct target *m = (struct target *)1;
    char err[512] = "";
    int r = target_open(&m, dir, ids, n, TARGET_BACKEND_CPU, 0, 64, err, sizeof err);
    if (r != code)
        TEST_FAIL("%s: got %d (%s), want %d (%s); err: %s", dir, r, err_str(r), code, err_str(code), err);
    CHECK(m == NULL);
    printf("%-24s -> %s\n", strrchr(dir, '/') + 1, err);
    CHECK_CONTAINS(err, dir);
    CHECK_CONTAINS(err, n1);
    if (n2)
        CHECK_CONTAINS(err, n2);
    CHECK(!strchr(err, '\n'));
}

static void set_dtype_i16(cJSON *root, uint64_t data_len)
{
    cJSON *t = cJSON_GetObjectItem(root, "model.layers.1.mlp.up_proj.weight");
    cJSON_ReplaceItemInObject(t, "dtype", cJSON_CreateString("I16"));
}

static void offsets_past_end(cJSON *root, uint64_t data_len)
{
    cJSON *t = cJSON_GetObjectItem(root, "model.layers.2.input_layernorm.weight");   /* [64] bf16 */
    double b = (double)data_len + 4096;
    double o[2] = { b, b + 128 };
    cJSON_ReplaceItemInObject(t, "data_offsets", cJSON_CreateDoubleArray(o, 2));
}

static void overlap(cJSON *root, uint64_t data_len)
{
    cJSON *a = cJSON_GetObjectItem(root, "model.layers.0.input_layernorm.weight");
    cJSON *b = cJSON_GetObjectItem(root, "model.layers.0.post_attention_layernorm.weight");
    cJSON_ReplaceItemInObject(b, "data_offsets", cJSON_Duplicate(cJSON_GetObjectItem(a, "data_offsets"), 1));
}

/* The final norm's bytes under another name: a valid file without model.norm.weight (deleting
 * the entry would leave its bytes to no tensor, which the reader refuses first). */
static void drop_norm(cJSON *root, uint64_t data_len)
{
    cJSON *t = cJSON_DetachItemFromObject(root, "model.norm.weight");
    cJSON_AddItemToObject(root, "model.norm.weight_renamed", t);
}

static void transpose_q(cJSON *root, uint64_t data_len)
{
    cJSON *t = cJSON_GetObjectItem(root, "model.layers.0.self_attn.q_proj.weight");   /* [128, 64] */
    int s[2] = { 64, 128 };
    cJSON_ReplaceItemInObject(t, "shape", cJSON_CreateIntArray(s, 2));
}

int main(void)
{
    snprintf(tmp, sizeof tmp, "%s/bad-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    CHECK(mkdir(tmp, 0700) == 0);
    int ids[2] = { 0, 3 }, early[2] = { 0, 1 };
    char st[1200];
    const char *d;

    d = copy_model("qwen3", "shape-config");
    edit_config(d, "intermediate_size", "96");
    expect_open_fail(d, ids, 2, -DF_ESHAPE, "'model.layers.0.mlp.gate_proj.weight': shape [128, 64] does not match "
                     "config.json (expected [96, 64])", "model.safetensors");

    d = copy_model("qwen3", "shape-header");
    snprintf(st, sizeof st, "%s/model.safetensors", d);
    edit_header(st, transpose_q);
    expect_open_fail(d, ids, 2, -DF_ESHAPE, "'model.layers.0.self_attn.q_proj.weight': shape [64, 128]", st);

    d = copy_model("qwen3", "missing-layer");
    edit_config(d, "num_hidden_layers", "5");
    edit_config(d, "layer_types", "[\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\","
                                  "\"full_attention\"]");
    int last5[1] = { 4 };
    expect_open_fail(d, last5, 1, -DF_EMISSING, "tensor 'model.layers.4.input_layernorm.weight' not found", NULL);

    d = copy_model("qwen3", "missing-norm");
    snprintf(st, sizeof st, "%s/model.safetensors", d);
    edit_header(st, drop_norm);
    expect_open_fail(d, ids, 2, -DF_EMISSING, "tensor 'model.norm.weight' not found", st);
    struct target *m;
    char err[512];
    CHECK(target_open(&m, d, early, 2, TARGET_BACKEND_CPU, 0, 16, err, sizeof err) == 0);  /* norm not needed */
    target_close(m);

    d = copy_model("qwen3", "arch");
    edit_config(d, "architectures", "[\"MistralForCausalLM\"]");
    expect_open_fail(d, ids, 2, -DF_EUNSUPPORTED, "config.json: architectures: 'MistralForCausalLM' is not supported",
                     NULL);
    float *e, *h;
    int v, hd;
    CHECK_INT(target_load_head(d, &e, &h, &v, &hd, err, sizeof err), ==, -DF_EUNSUPPORTED);
    CHECK_CONTAINS(err, "architectures");

    d = copy_model("qwen3", "dtype");
    snprintf(st, sizeof st, "%s/model.safetensors", d);
    edit_header(st, set_dtype_i16);
    expect_open_fail(d, ids, 2, -DF_EUNSUPPORTED, "'model.layers.1.mlp.up_proj.weight': dtype I16 is not supported", st);

    d = copy_model("qwen3", "truncated");
    snprintf(st, sizeof st, "%s/model.safetensors", d);
    CHECK(truncate(st, 400000) == 0);
    expect_open_fail(d, ids, 2, -DF_ETRUNC, "run past the end of the data block", st);
    CHECK(truncate(st, 5) == 0);
    expect_open_fail(d, ids, 2, -DF_ETRUNC, "shorter than the 8-byte header length", st);
    CHECK(truncate(st, 0) == 0);
    expect_open_fail(d, ids, 2, -DF_ETRUNC, "shorter than the 8-byte header length", st);

    d = copy_model("qwen3", "past-end");
    snprintf(st, sizeof st, "%s/model.safetensors", d);
    edit_header(st, offsets_past_end);
    expect_open_fail(d, ids, 2, -DF_ETRUNC, "'model.layers.2.input_layernorm.weight': data_offsets", st);

    d = copy_model("qwen3", "overlap");
    snprintf(st, sizeof st, "%s/model.safetensors", d);
    edit_header(st, overlap);
    expect_open_fail(d, ids, 2, -DF_EFORMAT, "'model.layers.0.input_layernorm.weight'", "overlap");

    d = copy_model("qwen3", "untied");
    edit_config(d, "tie_word_embeddings", "false");
    CHECK_INT(target_load_head(d, &e, &h, &v, &hd, err, sizeof err), ==, -DF_EMISSING);
    CHECK_CONTAINS(err, "tensor 'lm_head.weight' not found");
    CHECK_CONTAINS(err, d);

    d = copy_model("llama", "shard-gone");
    snprintf(st, sizeof st, "%s/model-00002-of-00003.safetensors", d);
    CHECK(unlink(st) == 0);
    expect_open_fail(d, ids, 2, -DF_EMISSING, "shard model-00002-of-00003.safetensors does not exist", NULL);

    d = copy_model("llama", "shard-truncated");
    snprintf(st, sizeof st, "%s/model-00003-of-00003.safetensors", d);
    CHECK(truncate(st, 100000) == 0);
    expect_open_fail(d, ids, 2, -DF_ETRUNC, "model-00003-of-00003.safetensors", "run past the end");

    d = copy_model("llama", "gqa-config");
    edit_config(d, "num_key_value_heads", "4");
    expect_open_fail(d, ids, 2, -DF_ESHAPE, "'model.layers.0.self_attn.k_proj.weight': shape [16, 64] does not "
                     "match config.json (expected [32, 64])", "model-0000");

    printf("ok\n");
    return 0;
}
