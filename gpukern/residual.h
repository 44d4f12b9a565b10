/* residual.h: residual add on the GPU: out = a + b, bf16 in/out, fp32 add. */
#pragma once
#include "gpukern/gk.h"

/* a, b, out: [rows, H] with one row stride; out may alias a or b. H % 8 == 0, 16-byte aligned rows. */
GK_API int gk_add(const void *a, const void *b, void *out, long stride, int rows, int H,
                  cudaStream_t stream);

/* x[r, :] += bias for rows [0, rows) of x [rows, cols] (row stride); bias [cols].
 * cols % 8 == 0, 16-byte aligned rows and bias. */
GK_API int gk_add_bias(void *x, long stride, const void *bias, int rows, int cols, cudaStream_t stream);
