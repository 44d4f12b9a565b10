/* rmsnorm.h: RMSNorm on the GPU, bf16 in/out, fp32 statistics.
 * out = x * rsqrt(mean(x^2) + eps) * w, per row of H; also per head (q/k norm) and fused with a residual add. */
#pragma once
#include "gpukern/gk.h"

/* x, out [rows, H] with row strides; w [H]. out may equal x. H % 8 == 0, 16-byte aligned rows. */
GK_API int gk_rmsnorm(const void *x, long x_stride, const void *w, void *out, long out_stride,
                      int rows, int H, float eps, cudaStream_t stream);

/* Per-head norm in place: row t holds n_heads heads of head_dim at x + t*stride + h*head_dim;
 * each head is normalised with the shared weight w [head_dim] (Qwen3 q_norm / k_norm). */
GK_API int gk_rmsnorm_heads(void *x, long stride, int n_tokens, int n_heads, int head_dim,
                            const void *w, float eps, cudaStream_t stream);

/* sum = a + b (written to sum, which may alias a), out = rmsnorm(sum) * w; all [rows, H]
 * with one row stride for a, b, sum and another for out. */
GK_API int gk_add_rmsnorm(const void *a, const void *b, void *sum, long stride, const void *w,
                          void *out, long out_stride, int rows, int H, float eps, cudaStream_t stream);

/* fp32 rows in (an fp32 residual stream; x_stride % 4 == 0, 16-byte aligned), bf16 rows out. */
GK_API int gk_rmsnorm_f32(const float *x, long x_stride, const void *w, void *out, long out_stride,
                          int rows, int H, float eps, cudaStream_t stream);
