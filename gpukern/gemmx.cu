/* gemmx.cu: row-major bf16 x bf16 -> fp32/bf16 GEMM mapped onto cublasGemmEx's column-major
 * matmul (D^T = op(B)^T op(A)^T), fp32 compute. */
#include <cublas_v2.h>
#include <stdlib.h>
#include "gpukern/gemmx.h"
#include "gpukern/gk_impl.cuh"

struct gk_gemmx {
    cublasHandle_t h;
};

extern "C" int gk_gemmx_create(gk_gemmx **out, char *err, size_t errlen)
{
    *out = NULL;
    gk_gemmx *g = (gk_gemmx *)calloc(1, sizeof(*g));
    if (!g) return -ENOMEM;
    cublasStatus_t s = cublasCreate(&g->h);
    if (s != CUBLAS_STATUS_SUCCESS) {
        if (err) snprintf(err, errlen, "cublasCreate: %s", cublasGetStatusString(s));
        free(g);
        return -DF_ECUDA;
    }
    *out = g;
    return 0;
}

extern "C" void gk_gemmx_free(gk_gemmx *g)
{
    if (!g) return;
    if (g->h) cublasDestroy(g->h);
    free(g);
}

extern "C" int gk_gemmx_gemm(gk_gemmx *g, cudaStream_t stream, int trans_a, int trans_b, int M, int N,
                          int K, float alpha, const void *A, long lda, const void *B, long ldb,
                          float beta, void *D, int d_type, long ldd)
{
    if (!g || M < 0 || N < 0 || K < 0 || !A || !B || !D) return -EINVAL;
    if (d_type != GK_BF16 && d_type != GK_F32) return -EINVAL;
    if (lda < (trans_a ? M : K) || ldb < (trans_b ? K : N) || ldd < N || lda < 1 || ldb < 1) return -EINVAL;
    if (M == 0 || N == 0) return 0;
    if (K == 0) return beta == 0.0f ? -EINVAL : 0;
    if (cublasSetStream(g->h, stream) != CUBLAS_STATUS_SUCCESS) return -DF_ECUDA;
    cublasOperation_t opb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;    /* cuBLAS's first operand: our B */
    cublasOperation_t opa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s = cublasGemmEx(g->h, opb, opa, N, M, K, &alpha, B, CUDA_R_16BF, (int)ldb, A,
                                    CUDA_R_16BF, (int)lda, &beta, D,
                                    d_type == GK_F32 ? CUDA_R_32F : CUDA_R_16BF, (int)ldd,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : -DF_ECUDA;
}
