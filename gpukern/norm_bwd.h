/* norm_bwd.h: backward of RMSNorm (rows of H) and of the Qwen3 q/k per-head RMSNorm + RoPE on
 * the GPU; fp32 gradients in, fp32 math, weight gradients accumulated into fp32 buffers.
 *
 * The weight gradients are deterministic: per-CTA partial sums go to a workspace (ws, device
 * memory of gk_norm_bwd_ws_bytes(width) bytes, 16-byte aligned, width = H or head_dim) and are
 * added to dw in a fixed order, so the same inputs give the same bits run after run (for one build
 * and GPU architecture; the grid does not depend on the GPU's size). Calls on one
 * stream may share a workspace; calls on different streams may not. */
#pragma once
#include "gpukern/gk.h"

#define GK_NORM_BWD_PARTS 512   /* at most this many partial sums per call */

GK_API size_t gk_norm_bwd_ws_bytes(int width);

/* Forward was y = x * rsqrt(mean(x^2) + eps) * w per row. Given dy (fp32 [rows, H]) and the
 * forward's input x (bf16): dx = res + d(x) (res fp32, optional, may equal dx), written to dx
 * (fp32, optional) and/or dx_bf16 (optional); dw[H] += sum over rows (fp32, accumulated).
 * H % 8 == 0, H <= 16384, 16-byte aligned rows everywhere. */
GK_API int gk_rmsnorm_bwd(const float *dy, long dy_stride, const void *x, long x_stride, const void *w,
                          const float *res, long res_stride, float *dx, long dx_stride, void *dx_bf16,
                          long dxb_stride, float *dw, float *ws, int rows, int H, float eps,
                          cudaStream_t stream);

/* Forward (gk_rope with norm_w): y = rope(rmsnorm_head(x) * w, pos) on n_heads heads of head_dim
 * per token. Given dy (fp32) and the raw x (bf16, before the norm): dx (bf16) and dw[head_dim] +=
 * (fp32). pos [n_tokens] and inv_freq [head_dim/2] are device memory, as for gk_rope.
 * head_dim % 4 == 0, <= 512; strides even, dy 8-byte and x, dx, w 4-byte aligned (pairs of
 * elements per access). */
GK_API int gk_qknorm_rope_bwd(const float *dy, long dy_stride, const void *x, long x_stride, void *dx,
                              long dx_stride, const void *w, float *dw, float *ws, int n_tokens,
                              int n_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                              float eps, cudaStream_t stream);
