/* rope.h: rotary position embedding on the GPU (HF rotate_half convention), with an
 * optional per-head RMSNorm before it (Qwen3 q_norm / k_norm), and packed-batch positions. */
#pragma once
#include "gpukern/gk.h"

enum gk_rope_type { GK_ROPE_DEFAULT = 0, GK_ROPE_LINEAR = 1, GK_ROPE_LLAMA3 = 2 };

typedef struct gk_rope_scaling {
    int type;                 /* enum gk_rope_type */
    double factor;            /* linear, llama3 */
    double low_freq_factor;   /* llama3 */
    double high_freq_factor;  /* llama3 */
    double original_max_pos;  /* llama3: original_max_position_embeddings */
} gk_rope_scaling;

/* Host: inv_freq[i] for i < head_dim/2, as transformers computes it in fp32
 * (1 / theta^(2i/d), then the scaling rule). sc may be NULL (default). Returns 0 or -EINVAL. */
GK_API int gk_rope_inv_freq(float *inv_freq, int head_dim, double theta, const gk_rope_scaling *sc);

/* pos[t] = t - cu_seqlens[s] for cu_seqlens[s] <= t < cu_seqlens[s+1]: positions restart per
 * sequence of a packed batch. cu_seqlens [n_seqs+1] and pos [n_tokens] are device memory. */
GK_API int gk_positions(const int32_t *cu_seqlens, int n_seqs, int32_t *pos, int n_tokens,
                        cudaStream_t stream);

/* In place on n_heads heads of head_dim per token (head h of token t at x + t*stride + h*head_dim):
 * if norm_w != NULL, x = rmsnorm(x) * norm_w per head (eps); then x = x*cos + rotate_half(x)*sin
 * with angle pos[t] * inv_freq[i]. inv_freq [head_dim/2] fp32 and pos are device memory.
 * Needs head_dim % 8 == 0, head_dim <= 512, 16-byte aligned rows. */
GK_API int gk_rope(void *x, long stride, int n_tokens, int n_heads, int head_dim,
                   const int32_t *pos, const float *inv_freq, const void *norm_w, float eps,
                   cudaStream_t stream);

/* As gk_rope, out of place: head h of token t read at src + t*src_stride + h*head_dim, the result
 * written at dst + t*dst_stride + h*head_dim (e.g. the q or k columns of a fused q|k|v projection
 * into a compact array, with no copy first). src and dst must not overlap unless they are equal
 * (then with equal strides: gk_rope). Same requirements for both as gk_rope. */
GK_API int gk_rope_to(const void *src, long src_stride, void *dst, long dst_stride, int n_tokens,
                      int n_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                      const void *norm_w, float eps, cudaStream_t stream);
