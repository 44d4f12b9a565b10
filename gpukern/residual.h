/* residual.h: residual-stream helpers on the GPU: add (bf16), bias add (bf16 or fp32 rows),
 * fp32 -> bf16 conversion of a strided block (capturing an fp32 residual stream). */
#pragma once
#include "gpukern/gk.h"

/* a, b, out: [rows, H] with one row stride; out may alias a or b. H % 8 == 0, 16-byte aligned rows. */
GK_API int gk_add(const void *a, const void *b, void *out, long stride, int rows, int H,
                  cudaStream_t stream);

/* x[r, :] += bias for rows [0, rows) of x [rows, cols] (row stride); bias [cols].
 * cols % 8 == 0, 16-byte aligned rows and bias. */
GK_API int gk_add_bias(void *x, long stride, const void *bias, int rows, int cols, cudaStream_t stream);

/* x[r, :] += bias on fp32 rows (stride % 4 == 0, 16-byte aligned); bias bf16 [cols], cols % 8 == 0. */
GK_API int gk_add_bias_f32(float *x, long stride, const void *bias, int rows, int cols, cudaStream_t stream);

/* dst[r, c] = bf16(src[r, c]) for [rows, cols]; cols % 8 == 0, src stride % 4 == 0, 16-byte aligned rows. */
GK_API int gk_convert_f32_bf16(const float *src, long src_stride, void *dst, long dst_stride, int rows, int cols,
                          cudaStream_t stream);
