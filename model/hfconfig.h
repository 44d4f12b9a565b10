/* hfconfig.h: the target's Hugging Face config.json (Qwen3ForCausalLM, LlamaForCausalLM).
 * Reads both rope forms: hub `rope_theta`/`rope_scaling` and transformers-5 `rope_parameters`. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum hf_arch {
    HF_ARCH_LLAMA = 1,          /* LlamaForCausalLM */
    HF_ARCH_QWEN3,              /* Qwen3ForCausalLM: adds per-head q_norm / k_norm */
};

enum hf_rope_type {
    HF_ROPE_DEFAULT = 0,        /* plain inv_freq = theta^(-2i/d) */
    HF_ROPE_LLAMA3,             /* Llama-3 frequency-dependent scaling */
};

struct hf_rope {
    double theta;
    enum hf_rope_type type;
    /* HF_ROPE_LLAMA3 only */
    double factor;
    double low_freq_factor;
    double high_freq_factor;
    int original_max_position_embeddings;
};

struct hf_config {
    enum hf_arch arch;
    char arch_name[64];         /* "Qwen3ForCausalLM" / "LlamaForCausalLM" */
    int hidden_size;
    int num_layers;             /* num_hidden_layers */
    int num_heads;              /* num_attention_heads */
    int num_kv_heads;           /* num_key_value_heads (GQA); = num_heads when absent */
    int head_dim;               /* explicit, else hidden_size / num_heads */
    int intermediate_size;
    int vocab_size;
    int max_position_embeddings;
    double rms_eps;             /* rms_norm_eps */
    struct hf_rope rope;
    bool tie_word_embeddings;   /* no lm_head.weight: the LM head is embed_tokens */
    bool attention_bias;        /* q/k/v/o projections carry biases */
    bool mlp_bias;              /* Llama only: gate/up/down carry biases */
};

/* Parse <dir>/config.json. Unknown architecture, unsupported feature (other rope types,
 * sliding window, activation other than silu, partial rotary) or a bad/missing field:
 * negative code and a one-line err "<path>: <field>: <reason>". */
int hf_config_load(const char *dir, struct hf_config *c, char *err, size_t errlen);

/* Same, from config.json text already in memory; `path` only names it in errors. */
int hf_config_parse(const char *json, const char *path, struct hf_config *c, char *err, size_t errlen);

/* The settings of config.json that the forward honours, as one line of "key=value" words
 * (config.json's names, doubles as the shortest text that reads back the same): two targets whose
 * lines differ compute other hidden states from the same weights (text_kv_diff names the first setting that
 * differs). Its length, or -ENAMETOOLONG
 * when it does not fit in n bytes. */
#define HF_CONFIG_TEXT_MAX 512
int hf_config_forward_text(const struct hf_config *c, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
