/* target.h: the frozen target model (Llama / Qwen3, Hugging Face layout) shared by the CPU and CUDA
 * backends: load, packed varlen forward, capture of hidden states [T, L*H] into a caller buffer. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "model/hfconfig.h"
#include "model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TARGET_MAX_CAPTURE 64

enum target_backend {
    TARGET_BACKEND_CPU = 0,     /* fp32 reference (bf16/f16 weights upcast), OpenBLAS GEMMs */
    TARGET_BACKEND_CUDA,        /* bf16, fp32 accumulation (model/target_cuda.cu) */
};

enum out_dtype {
    OUT_F32 = 0,
    OUT_BF16,                   /* round to nearest even */
};

struct target;

/* DFlash build_target_layer_ids: n_draft == 1 -> [n_target/2]; else
 * round(1 + i*(n_target-4)/(n_draft-1)) with Python's round (ties to even), i = 0..n_draft-1.
 * 36 target and 5 draft layers -> [1,9,17,25,33]. Returns n_draft, or -DF_ERANGE. */
int target_default_layer_ids(int num_target_layers, int num_draft_layers, int *out);

struct cfg_model;
/* The target layers captured for the drafter, as every daemon and tool must agree on them:
 * model.capture_layers when set, else the DFlash default for model.draft_layers over the target's
 * n_layers (its config.json; 0: not known, then capture_layers must be set). Each id below
 * n_layers, none twice (a default that repeats a layer, as a target too shallow for draft_layers
 * gives, is refused: set capture_layers). Returns n (> 0) with ids[0..n), at most
 * TARGET_MAX_CAPTURE; else -DF_ERANGE or -DF_EFORMAT with *key ("capture_layers" or
 * "draft_layers") and one line in why. */
int target_capture_ids(const struct cfg_model *m, int n_layers, int ids[TARGET_MAX_CAPTURE], const char **key,
                       char *why, size_t whylen);

/* Load config.json + weights of layers 0..max(layer_ids) from model_dir.
 * layer_ids: captured layers in output order, HF convention: id i = output_hidden_states[i+1],
 * and id num_layers-1 is taken after the final norm (as HF does). 1 <= n_ids <= TARGET_MAX_CAPTURE.
 * max_tokens: the largest n_tokens a forward will get; the scratch arena is sized for it (no
 * allocation in target_forward). device: CUDA ordinal, ignored by the CPU backend.
 * Errors (bad config, missing tensor, shape not matching config.json, ...): negative code and one
 * line in err naming the file and tensor/field. */
int target_open(struct target **m, const char *model_dir, const int *layer_ids, int n_ids,
                enum target_backend backend, int device, int max_tokens, char *err, size_t errlen);
void target_close(struct target *m);   /* accepts NULL */
/* The fingerprint of the weights it opened (st_fingerprint). */
uint64_t target_fingerprint(const struct target *m);

/* Forward a packed batch: tokens[n_tokens], cu_seqlens[n_seqs+1] (cu[0]=0, non-decreasing,
 * cu[n_seqs]=n_tokens). Positions restart at 0 for each sequence; no attention across sequences.
 * Writes row t of the output at out + t*out_row_pitch_bytes: n_ids*hidden values, captured layer k
 * at column k*hidden. Runs layers only up to the last captured one; no LM head.
 * Returns 0, -DF_ERANGE (n_tokens > max_tokens, token id >= vocab, pitch too small),
 * -DF_EFORMAT (bad cu_seqlens). The CPU backend is synchronous. */
int target_forward(struct target *m, const uint32_t *tokens, const int32_t *cu_seqlens, int n_seqs,
                   int n_tokens, void *out, enum out_dtype dtype, size_t out_row_pitch_bytes);

/* A host forward (the CPU backend) runs for seconds on a large batch: it calls fn(arg) on its own
 * thread after the attention and the MLP of every layer, for the caller's heartbeat and watchdog (cheap, never re-entering the
 * model). A hang inside a layer still starves them. NULL = none; the CUDA backend never calls it. */
void target_set_progress(struct target *m, void (*fn)(void *arg), void *arg);

const struct hf_config *target_config(const struct target *m);
int target_num_captured(const struct target *m);
const int *target_layer_ids(const struct target *m);
int target_max_tokens(const struct target *m);

/* OpenBLAS thread count for the CPU backend (process-wide; config target.threads). Default 1. */
void target_cpu_set_threads(int threads);

/* The target's embedding [vocab, hidden] and LM head [vocab, hidden] (HF layout: logits = h @ lm_head^T)
 * as new fp32 arrays, for the drafter. Tied embeddings: *lm_head == *embed (one array).
 * Free with target_free_head(). */
int target_load_head(const char *model_dir, float **embed, float **lm_head, int *vocab, int *hidden,
                     char *err, size_t errlen);
void target_free_head(float *embed, float *lm_head);

#ifdef __cplusplus
}
#endif
