/* gemm.h: bf16 GEMMs on the GPU through cuBLASLt (bf16 in/out, fp32 compute), row-major view.
 * One gk_gemm owns a cuBLASLt handle, a workspace and a cache of chosen algorithms. */
#pragma once
#include <stddef.h>
#include "gpukern/gk.h"

typedef struct gk_gemm gk_gemm;

#define GK_GEMM_WORKSPACE_DEFAULT ((size_t)32 << 20)

/* workspace_bytes: cuBLASLt workspace on the current device (0 = GK_GEMM_WORKSPACE_DEFAULT). */
GK_API int gk_gemm_create(gk_gemm **out, size_t workspace_bytes, char *err, size_t errlen);
/* Accepts NULL. Frees the workspace (cudaFree synchronises the device). */
GK_API void gk_gemm_free(gk_gemm *g);
/* Plans made so far (a descriptor set + an algorithm heuristic each): after the first batches of
 * a run it should stop growing, whatever the row counts of later calls. */
GK_API long gk_gemm_plans_made(const gk_gemm *g);

/* D[M,N] = alpha * op(A) op(B) + beta * C, everything row-major bf16, strides in elements.
 * op(A) is A stored [M,K] (lda >= K), or with trans_a A stored [K,M] (lda >= M);
 * op(B) is B stored [K,N] (ldb >= N), or with trans_b B stored [N,K] (ldb >= K).
 * C is ignored when beta == 0 and may equal D (then ldc == ldd). A gk_gemm serves one
 * stream at a time: its workspace is shared by every call. */
GK_API int gk_gemm_bf16(gk_gemm *g, cudaStream_t stream, int trans_a, int trans_b, int M, int N, int K,
                        float alpha, const void *A, long lda, const void *B, long ldb, float beta,
                        const void *C, long ldc, void *D, long ldd);

/* Same with C and D in fp32 when cd_f32 (A and B stay bf16): e.g. an fp32 residual stream
 * updated in place by a bf16 GEMM. */
GK_API int gk_gemm_bf16_cd(gk_gemm *g, cudaStream_t stream, int trans_a, int trans_b, int M, int N, int K,
                      float alpha, const void *A, long lda, const void *B, long ldb, float beta,
                      const void *C, long ldc, void *D, long ldd, int cd_f32);

/* Linear layer with HF weight layout: Y[T,N] = X[T,K] W[N,K]^T (+ R[T,N] when R != NULL;
 * R may equal Y, which turns the layer into an in-place residual update). */
static inline int gk_linear(gk_gemm *g, cudaStream_t stream, int T, int N, int K, const void *X, long ldx,
                            const void *W, const void *R, long ldr, void *Y, long ldy)
{
    return gk_gemm_bf16(g, stream, 0, 1, T, N, K, 1.0f, X, ldx, W, K, R ? 1.0f : 0.0f, R, ldr, Y, ldy);
}

/* Linear layer into an fp32 output: Y[T,N] (float) = X W^T (+ R, float; R may equal Y). */
static inline int gk_linear_f32out(gk_gemm *g, cudaStream_t stream, int T, int N, int K, const void *X, long ldx,
                                   const void *W, const float *R, long ldr, float *Y, long ldy)
{
    return gk_gemm_bf16_cd(g, stream, 0, 1, T, N, K, 1.0f, X, ldx, W, K, R ? 1.0f : 0.0f, R, ldr, Y, ldy, 1);
}
