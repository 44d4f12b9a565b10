/* fuzz_hfconfig.c: fuzz target for the Hugging Face config.json reader (model/hfconfig.c
 * hf_config_parse): an accepted config describes a model the forward can run, and its forward
 * settings' line (hf_config_forward_text) fits and compares equal to itself. */
#include <math.h>
#include "common/text.h"
#include "model/hfconfig.h"
#include "tests/fuzz/fuzz.h"

static void hfconfig_check(const struct hf_config *c)
{
    FUZZ_ASSERT(c->arch == HF_ARCH_LLAMA || c->arch == HF_ARCH_QWEN3);
    FUZZ_ASSERT(c->arch_name[0] && strnlen(c->arch_name, sizeof c->arch_name) < sizeof c->arch_name);
    FUZZ_ASSERT(c->hidden_size > 0 && c->num_layers > 0 && c->num_heads > 0 && c->num_kv_heads > 0);
    FUZZ_ASSERT(c->intermediate_size > 0 && c->vocab_size > 0 && c->max_position_embeddings > 0);
    FUZZ_ASSERT(c->num_kv_heads <= c->num_heads && c->num_heads % c->num_kv_heads == 0);
    FUZZ_ASSERT(c->head_dim > 0 && c->head_dim % 2 == 0);
    FUZZ_ASSERT(isfinite(c->rms_eps) && c->rms_eps > 0);
    FUZZ_ASSERT(isfinite(c->rope.theta) && c->rope.theta > 0);
    FUZZ_ASSERT(c->rope.type == HF_ROPE_DEFAULT || c->rope.type == HF_ROPE_LLAMA3);
    if (c->rope.type == HF_ROPE_LLAMA3) {
        FUZZ_ASSERT(isfinite(c->rope.factor) && c->rope.factor >= 1);
        FUZZ_ASSERT(c->rope.low_freq_factor > 0 && c->rope.high_freq_factor > c->rope.low_freq_factor);
        FUZZ_ASSERT(c->rope.original_max_position_embeddings > 0);
    }
    FUZZ_ASSERT(!(c->arch == HF_ARCH_QWEN3 && c->mlp_bias));
    /* its forward settings fit the WELCOME's field, and read back as equal to themselves */
    char text[HF_CONFIG_TEXT_MAX], diff[256];
    int n = hf_config_forward_text(c, text, sizeof text);
    FUZZ_ASSERT(n > 0 && (size_t)n == strlen(text));
    FUZZ_ASSERT(!text_kv_diff(text, text, diff, sizeof diff) && !diff[0]);
}

int fuzz_hfconfig(const uint8_t *data, size_t size)
{
    char err[512];
    struct hf_config c;
    char *json = malloc(size + 1);     /* the parser takes a C string */
    if (!json)
        return 0;
    memcpy(json, data, size);
    json[size] = 0;
    err[0] = 0;
    if (hf_config_parse(json, "fuzz/config.json", &c, err, sizeof err) == 0)
        hfconfig_check(&c);
    else
        FUZZ_ASSERT(fuzz_err_ok(err, sizeof err));
    free(json);
    return 0;
}
