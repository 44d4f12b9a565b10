/* test_hfconfig.c: config.json reader: the golden transformers-5 and hub-form configs, defaults,
 * both rope forms, and a one-line error naming file and field for everything unsupported or malformed. */
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "common/err.h"
#include "common/jsonutil.h"
#include "common/text.h"
#include "model/hfconfig.h"
#include "tests/test.h"

static const char *golden(const char *name)
{
    static char p[1024];
    snprintf(p, sizeof p, "%s/tests/data/golden/%s", test_srcdir(), name);
    return p;
}

/* A small valid Llama config plus `extra` fields (only keys the base does not already have). */
static char *llama_json(const char *extra)
{
    static char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":4,"
             "\"num_attention_heads\":8,\"intermediate_size\":128,\"vocab_size\":512%s%s}",
             extra && *extra ? "," : "", extra ? extra : "");
    return buf;
}

static void expect_err(const char *json, int code, const char *field, const char *reason)
{
    struct hf_config c;
    char err[512] = "";
    int r = hf_config_parse(json, "/x/config.json", &c, err, sizeof err);
    if (r != code)
        TEST_FAIL("%s: got %d (%s), want %d; err: %s", json, r, err_str(r), code, err);
    char want[256];
    snprintf(want, sizeof want, "/x/config.json: %s%s", field ? field : "", field ? ": " : "");  /* NULL: the file as a whole */
    CHECK_CONTAINS(err, want);
    CHECK_CONTAINS(err, reason);
    CHECK(!strchr(err, '\n'));
}

static struct hf_config parse_ok(const char *json)
{
    struct hf_config c;
    char err[512] = "";
    if (hf_config_parse(json, "/x/config.json", &c, err, sizeof err) < 0)
        TEST_FAIL("%s: %s", json, err);
    return c;
}

static void test_golden(void)
{
    struct hf_config q, l, h;
    char err[512] = "";
    CHECK_OK(hf_config_load(golden("qwen3"), &q, err, sizeof err));
    CHECK_INT(q.arch, ==, HF_ARCH_QWEN3);
    CHECK_STR(q.arch_name, "Qwen3ForCausalLM");
    CHECK(q.hidden_size == 64 && q.num_layers == 4 && q.num_heads == 4 && q.num_kv_heads == 2);
    CHECK_INT(q.head_dim, ==, 32);                  /* explicit, != hidden / heads */
    CHECK(q.intermediate_size == 128 && q.vocab_size == 512 && q.max_position_embeddings == 512);
    CHECK(q.tie_word_embeddings && !q.attention_bias && !q.mlp_bias);
    CHECK(q.rms_eps == 1e-6 && q.rope.theta == 10000.0 && q.rope.type == HF_ROPE_DEFAULT);

    CHECK_OK(hf_config_load(golden("llama"), &l, err, sizeof err));   /* rope_parameters form */
    CHECK_OK(hf_config_load(golden("llama-hub"), &h, err, sizeof err)); /* rope_theta + rope_scaling */
    struct hf_config *both[2] = { &l, &h };
    for (int i = 0; i < 2; i++) {
        struct hf_config *c = both[i];
        CHECK_INT(c->arch, ==, HF_ARCH_LLAMA);
        CHECK(c->hidden_size == 64 && c->num_heads == 8 && c->num_kv_heads == 2 && c->head_dim == 8);
        CHECK(!c->tie_word_embeddings && c->attention_bias && c->mlp_bias && c->rms_eps == 1e-5);
        CHECK(c->rope.type == HF_ROPE_LLAMA3 && c->rope.theta == 10000.0 && c->rope.factor == 4.0);
        CHECK(c->rope.low_freq_factor == 1.0 && c->rope.high_freq_factor == 4.0);
        CHECK_INT(c->rope.original_max_position_embeddings, ==, 64);
    }

    char empty[1024];
    snprintf(empty, sizeof empty, "%s/cfg-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    CHECK(mkdir(empty, 0700) == 0);
    CHECK_INT(hf_config_load(empty, &h, err, sizeof err), ==, -DF_EMISSING);
    CHECK_CONTAINS(err, empty);
    CHECK_CONTAINS(err, "config.json");
    /* a valid object, then a NUL and more (a zero-filled tail): the parser would stop at the NUL */
    char cj[1100];
    snprintf(cj, sizeof cj, "%s/config.json", empty);
    FILE *f = fopen(cj, "wb");
    CHECK(f);
    const char *obj = llama_json(NULL);
    fwrite(obj, 1, strlen(obj), f);
    fwrite("\0\0\0junk", 1, 7, f);
    fclose(f);
    CHECK_INT(hf_config_load(empty, &h, err, sizeof err), ==, -DF_EFORMAT);
    CHECK_CONTAINS(err, "config.json: NUL byte at offset");
    unlink(cj);
    /* a FIFO in its place is refused, not waited on for a writer */
    CHECK(mkfifo(cj, 0600) == 0);
    CHECK_INT(hf_config_load(empty, &h, err, sizeof err), ==, -DF_EFORMAT);
    CHECK_CONTAINS(err, "config.json: not a regular file");
    unlink(cj);
    rmdir(empty);
}

static void test_defaults_and_forms(void)
{
    struct hf_config c = parse_ok(llama_json(NULL));
    CHECK_INT(c.num_kv_heads, ==, 8);               /* absent -> MHA */
    CHECK_INT(c.head_dim, ==, 8);                   /* absent -> hidden / heads */
    CHECK(c.rope.theta == 10000.0 && c.rope.type == HF_ROPE_DEFAULT);
    CHECK(!c.tie_word_embeddings && !c.attention_bias && c.rms_eps == 1e-6);

    c = parse_ok(llama_json("\"num_key_value_heads\":null,\"head_dim\":null,\"rope_scaling\":null,\"rope_theta\":5e5"));
    CHECK(c.num_kv_heads == 8 && c.head_dim == 8 && c.rope.theta == 5e5);

    /* legacy "type" key in rope_scaling */
    c = parse_ok(llama_json("\"rope_theta\":500000.0,\"rope_scaling\":{\"type\":\"llama3\",\"factor\":8.0,"
                            "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}"));
    CHECK(c.rope.type == HF_ROPE_LLAMA3 && c.rope.factor == 8.0 && c.rope.original_max_position_embeddings == 8192);

    /* rope_parameters wins over stray top-level keys; no type = default */
    c = parse_ok(llama_json("\"rope_parameters\":{\"rope_theta\":1e6},\"rope_theta\":3"));
    CHECK(c.rope.theta == 1e6 && c.rope.type == HF_ROPE_DEFAULT);
    c = parse_ok(llama_json("\"rope_scaling\":{\"rope_type\":\"default\"}"));
    CHECK(c.rope.type == HF_ROPE_DEFAULT);

    c = parse_ok("{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":32,\"num_hidden_layers\":2,"
                 "\"num_attention_heads\":4,\"num_key_value_heads\":1,\"head_dim\":16,\"intermediate_size\":64,"
                 "\"vocab_size\":100,\"use_sliding_window\":false,\"sliding_window\":null,"
                 "\"layer_types\":[\"full_attention\",\"full_attention\"],\"partial_rotary_factor\":1.0}");
    CHECK(c.arch == HF_ARCH_QWEN3 && c.num_kv_heads == 1 && c.head_dim == 16);
}

/* The forward's settings as one line: what two targets must agree on; text_kv_diff names the first
 * that differs. */
static void test_forward_text(void)
{
    char a[HF_CONFIG_TEXT_MAX], b[HF_CONFIG_TEXT_MAX], diff[256];
    struct hf_config c = parse_ok(llama_json("\"rms_norm_eps\":1e-5"));
    CHECK(hf_config_forward_text(&c, a, sizeof a) > 0);
    CHECK_STR(a, "architectures=LlamaForCausalLM hidden_size=64 num_hidden_layers=4 num_attention_heads=8 "
                 "num_key_value_heads=8 head_dim=8 intermediate_size=128 vocab_size=512 rms_norm_eps=1e-05 "
                 "rope_theta=10000 rope_type=default tie_word_embeddings=false attention_bias=false mlp_bias=false");
    CHECK_INT(text_kv_diff(a, a, diff, sizeof diff), ==, 0);
    CHECK_STR(diff, "");
    /* the same sizes, another epsilon (a value that needs all 17 digits reads back the same) */
    c.rms_eps = 0.1 + 0.2;
    CHECK(hf_config_forward_text(&c, b, sizeof b) > 0);
    CHECK_CONTAINS(b, " rms_norm_eps=0.30000000000000004 ");
    CHECK_INT(text_kv_diff(b, a, diff, sizeof diff), ==, 1);
    CHECK_STR(diff, "rms_norm_eps is 0.30000000000000004 here, 1e-05 in the run");
    /* Llama-3 scaling: its four fields, absent from a default rope */
    c = parse_ok(llama_json("\"rope_theta\":500000.0,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
                            "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}"));
    CHECK(hf_config_forward_text(&c, b, sizeof b) > 0);
    CHECK_CONTAINS(b, " rope_theta=500000 rope_type=llama3 factor=8 low_freq_factor=1 high_freq_factor=4 "
                      "original_max_position_embeddings=8192 ");
    CHECK_INT(text_kv_diff(b, a, diff, sizeof diff), ==, 1);
    CHECK_STR(diff, "rms_norm_eps is 1e-06 here, 1e-05 in the run");
    c.rms_eps = 1e-5;
    CHECK(hf_config_forward_text(&c, b, sizeof b) > 0);
    CHECK_INT(text_kv_diff(b, a, diff, sizeof diff), ==, 1);
    CHECK_STR(diff, "rope_theta is 500000 here, 10000 in the run");
    c.rope.theta = 10000;
    CHECK(hf_config_forward_text(&c, b, sizeof b) > 0);
    CHECK_INT(text_kv_diff(b, a, diff, sizeof diff), ==, 1);
    CHECK_STR(diff, "rope_type is llama3 here, default in the run");
    CHECK_INT(text_kv_diff(a, b, diff, sizeof diff), ==, 1);
    CHECK_STR(diff, "rope_type is default here, llama3 in the run");
    /* a key only the other line has */
    CHECK_INT(text_kv_diff("x=1", "x=1 factor=8", diff, sizeof diff), ==, 1);
    CHECK_STR(diff, "factor is none here, 8 in the run");
    /* too small a buffer: refused, not cut */
    CHECK_INT(hf_config_forward_text(&c, b, 40), ==, -ENAMETOOLONG);
}

static void test_errors(void)
{
    expect_err("{\"architectures\":[\"MistralForCausalLM\"]}", -DF_EUNSUPPORTED, "architectures",
               "'MistralForCausalLM' is not supported");
    expect_err("{\"hidden_size\":4}", -DF_EMISSING, "architectures", "missing");
    /* bytes after the object (a damaged or concatenated file): refused; whitespace is fine */
    char *tail = llama_json(NULL);
    char glued[4096 + 16];
    snprintf(glued, sizeof glued, "%s \n\t", tail);
    parse_ok(glued);
    snprintf(glued, sizeof glued, "%s}", tail);
    expect_err(glued, -DF_EFORMAT, NULL, "parse error near byte");
    snprintf(glued, sizeof glued, "%s{\"a\":1}", tail);
    expect_err(glued, -DF_EFORMAT, NULL, "parse error near byte");
    expect_err("{\"architectures\":\"LlamaForCausalLM\"}", -DF_EFORMAT, "architectures", "expected a list");
    expect_err("{\"architectures\":[]}", -DF_EFORMAT, "architectures", "expected a list");
    expect_err("{\"architectures\":[\"LlamaForCausalLM\",\"X\"]}", -DF_EFORMAT, "architectures", "list of one");
    expect_err("{\"architectures\":[\"LlamaForCausalLM\"]", -DF_EFORMAT, NULL, "not valid JSON");
    expect_err("[1]", -DF_EFORMAT, NULL, "top level is not a JSON object");
    expect_err("{\"architectures\":[\"LlamaForCausalLM\"],\"num_hidden_layers\":4}", -DF_EMISSING,
               "hidden_size", "missing");
    /* a key twice: Python's json takes the last, cJSON finds the first: refused, at any depth */
    expect_err(llama_json("\"hidden_size\":128"), -DF_EFORMAT, NULL, "hidden_size appears twice");
    expect_err(llama_json("\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2.0,\"factor\":4.0}"), -DF_EFORMAT,
               NULL, "rope_scaling.factor appears twice");
    expect_err(llama_json("\"num_key_value_heads\":3"), -DF_ERANGE, "num_key_value_heads", "does not divide");
    expect_err(llama_json("\"num_key_value_heads\":16"), -DF_ERANGE, "num_key_value_heads", "out of range");
    expect_err(llama_json("\"head_dim\":7"), -DF_ERANGE, "head_dim", "odd");
    expect_err(llama_json("\"head_dim\":\"8\""), -DF_EFORMAT, "head_dim", "expected an integer");
    expect_err(llama_json("\"rms_norm_eps\":\"x\""), -DF_EFORMAT, "rms_norm_eps", "expected a number");
    expect_err(llama_json("\"rms_norm_eps\":-1"), -DF_ERANGE, "rms_norm_eps", "out of range");
    expect_err(llama_json("\"tie_word_embeddings\":1"), -DF_EFORMAT, "tie_word_embeddings", "true or false");
    expect_err(llama_json("\"hidden_act\":\"gelu\""), -DF_EUNSUPPORTED, "hidden_act", "silu");
    expect_err(llama_json("\"partial_rotary_factor\":0.5"), -DF_EUNSUPPORTED, "partial_rotary_factor", "1.0");
    expect_err(llama_json("\"use_sliding_window\":true"), -DF_EUNSUPPORTED, "use_sliding_window", "not supported");
    expect_err(llama_json("\"layer_types\":[\"full_attention\",\"sliding_attention\"]"), -DF_EUNSUPPORTED,
               "layer_types", "full_attention");
    expect_err(llama_json("\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0}"), -DF_EUNSUPPORTED,
               "rope_scaling.rope_type", "'yarn' is not supported");
    expect_err(llama_json("\"rope_parameters\":{\"rope_type\":\"linear\",\"rope_theta\":1e4,\"factor\":2.0}"),
               -DF_EUNSUPPORTED, "rope_parameters.rope_type", "'linear' is not supported");
    expect_err(llama_json("\"rope_parameters\":{\"rope_type\":\"default\"}"), -DF_EMISSING,
               "rope_parameters.rope_theta", "missing");
    expect_err(llama_json("\"rope_theta\":0.5"), -DF_ERANGE, "rope_theta", "0.5 must be greater than 1");
    expect_err(llama_json("\"rope_parameters\":{\"rope_theta\":1}"), -DF_ERANGE, "rope_parameters.rope_theta",
               "1 must be greater than 1");
    expect_err(llama_json("\"rope_parameters\":{\"rope_theta\":5e5},\"rope_scaling\":{\"rope_type\":\"llama3\","
                          "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                          "\"original_max_position_embeddings\":8192}"),
               -DF_EFORMAT, "rope_scaling", "given beside rope_parameters");
    parse_ok(llama_json("\"rope_parameters\":{\"rope_theta\":5e5},\"rope_scaling\":null"));
    /* a head size derived from hidden_size / heads is held to the bound a given head_dim is */
    expect_err("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":1048576,\"num_hidden_layers\":4,"
               "\"num_attention_heads\":1,\"intermediate_size\":128,\"vocab_size\":512}",
               -DF_ERANGE, "head_dim", "1048576 / num_attention_heads 1 = 1048576 is out of range [2, 4096]");
    expect_err(llama_json("\"rope_parameters\":[1]"), -DF_EFORMAT, "rope_parameters", "expected an object");
    expect_err(llama_json("\"rope_scaling\":{\"factor\":2.0}"), -DF_EMISSING, "rope_scaling.type", "missing");
    expect_err(llama_json("\"rope_scaling\":{\"rope_type\":\"llama3\",\"low_freq_factor\":1.0,"
                          "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}"),
               -DF_EMISSING, "rope_scaling.factor", "missing");
    expect_err(llama_json("\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":4.0,"
                          "\"high_freq_factor\":1.0,\"original_max_position_embeddings\":8192}"),
               -DF_ERANGE, "rope_scaling.high_freq_factor", "greater than low_freq_factor");
    expect_err(llama_json("\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                          "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":81.5}"),
               -DF_EFORMAT, "rope_scaling.original_max_position_embeddings", "expected an integer");
    expect_err("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":30,\"num_hidden_layers\":2,"
               "\"num_attention_heads\":4,\"intermediate_size\":64,\"vocab_size\":100}",
               -DF_EMISSING, "head_dim", "not a multiple");
    /* Qwen3Config's head_dim defaults to 128, not hidden_size / num_attention_heads */
    struct hf_config q = parse_ok("{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":30,\"num_hidden_layers\":2,"
                 "\"num_attention_heads\":4,\"intermediate_size\":64,\"vocab_size\":100}");
    CHECK_INT(q.head_dim, ==, 128);
    expect_err("{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":32,\"num_hidden_layers\":2,"
               "\"num_attention_heads\":4,\"intermediate_size\":64,\"vocab_size\":100,\"mlp_bias\":true}",
               -DF_EUNSUPPORTED, "mlp_bias", "Qwen3");
    expect_err("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":4,"
               "\"num_attention_heads\":8,\"intermediate_size\":128,\"vocab_size\":0}",
               -DF_ERANGE, "vocab_size", "out of range");
}

/* json_duplicate_key on objects of many keys (sorted, not pairwise), nested in an array. */
static void test_duplicate_keys(void)
{
    char json[8192], path[64];
    int n = snprintf(json, sizeof json, "{\"a\":[{\"x\":1}, {");
    for (int i = 0; i < 200; i++)
        n += snprintf(json + n, sizeof json - (size_t)n, "%s\"k%03d\":%d", i ? "," : "", i, i);
    snprintf(json + n, sizeof json - (size_t)n, "}]}");
    cJSON *j = cJSON_Parse(json);
    CHECK(j);
    CHECK_INT(json_duplicate_key(j, path, sizeof path), ==, 0);
    cJSON_Delete(j);
    snprintf(json + n, sizeof json - (size_t)n, ",\"k117\":0}]}");
    CHECK((j = cJSON_Parse(json)) != NULL);
    CHECK_INT(json_duplicate_key(j, path, sizeof path), ==, 1);
    CHECK_STR(path, "a.k117");
    cJSON_Delete(j);
}

int main(void)
{
    test_golden();
    test_defaults_and_forms();
    test_forward_text();
    test_errors();
    test_duplicate_keys();
    printf("ok\n");
    return 0;
}
