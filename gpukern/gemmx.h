/* gemmx.h: bf16 GEMMs with an fp32 or bf16 output through cuBLAS (cublasGemmEx, fp32 compute),
 * row-major view: fp32 logits, and weight gradients accumulated straight into fp32 buffers. */
#pragma once
#include <stddef.h>
#include "gpukern/gk.h"

typedef struct gk_gemmx gk_gemmx;

enum gk_dtype { GK_BF16 = 0, GK_F32 = 1 };

/* A cuBLAS handle on the current device. */
GK_API int gk_gemmx_create(gk_gemmx **out, char *err, size_t errlen);
GK_API void gk_gemmx_free(gk_gemmx *g);     /* accepts NULL */

/* D[M,N] = alpha * op(A) op(B) + beta * D, row-major, strides in elements. A and B are bf16;
 * op(A) is A stored [M,K] (lda >= K) or with trans_a A stored [K,M] (lda >= M); op(B) is B stored
 * [K,N] (ldb >= N) or with trans_b B stored [N,K] (ldb >= K). D is d_type (enum gk_dtype), ldd >= N;
 * beta != 0 accumulates into D (e.g. dW += dY^T X into an fp32 gradient). K == 0 with beta == 0
 * is refused (nothing would be written). */
GK_API int gk_gemmx_gemm(gk_gemmx *g, cudaStream_t stream, int trans_a, int trans_b, int M, int N, int K,
                      float alpha, const void *A, long lda, const void *B, long ldb, float beta, void *D,
                      int d_type, long ldd);
