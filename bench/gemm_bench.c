/* gemm_bench.c: the GEMMs of one drafter training step at the drafter bench's shape (5-layer
 * drafter of Qwen3-8B shape, 512 anchors of block 16 on a 3072-token sequence, LM head chunks of
 * 1024 rows), each timed alone on the GPU with both GEMM paths: cuBLASLt (gk_gemm, 32 MiB
 * workspace, algorithm from the heuristic) and cublasGemmEx (gk_gemmx). TFLOP/s per shape and
 * the step's GEMM time per path, weighted by how often the step runs each shape.
 * Usage: gemm_bench [-d device] [-i iters] */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include "common/err.h"
#ifdef DFLASH_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "gpukern/gemm.h"
#include "gpukern/gemmx.h"

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "gemm_bench: %s: %s\n", #call, cudaGetErrorString(e_)); exit(1); } } while (0)

enum { H = 4096, QD = 4096, KVD = 1024, I = 12288, V = 151936, L = 5, LCH = 5 * 4096, T = 3072, Q = 8192,
       CH = 1024, HEAD_CHUNKS = 8 };

struct shape {
    const char *name;
    int ta, tb, M, N, K, f32, beta, count;    /* count: times per step */
};

static const struct shape shapes[] = {
    /* forward: X W^T */
    { "fwd fc          T x H x LcH", 0, 1, T, H, LCH, 0, 0, 1 },
    { "fwd ctx k/v     T x 2kvd x H", 0, 1, T, 2 * KVD, H, 0, 0, L },
    { "fwd q/k/v       Q x qkvd x H", 0, 1, Q, QD + 2 * KVD, H, 0, 0, L },
    { "fwd o + res     Q x H x qd", 0, 1, Q, H, QD, 0, 1, L },
    { "fwd gate/up     Q x 2I x H", 0, 1, Q, 2 * I, H, 0, 0, L },
    { "fwd down + res  Q x H x I", 0, 1, Q, H, I, 0, 1, L },
    { "head logits     C x V x H", 0, 1, CH, V, H, 0, 0, HEAD_CHUNKS },
    { "head dX f32     C x H x V", 0, 0, CH, H, V, 1, 0, HEAD_CHUNKS },
    /* backward: weight gradients accumulate into fp32, input gradients */
    { "bwd dW down     H x I x Q", 1, 0, H, I, Q, 1, 1, L },
    { "bwd dZ          Q x I x H", 0, 0, Q, I, H, 0, 0, L },
    { "bwd dW gate/up  2I x H x Q", 1, 0, 2 * I, H, Q, 1, 1, L },
    { "bwd dX gate/up  Q x H x 2I f32", 0, 0, Q, H, 2 * I, 1, 0, L },
    { "bwd dW o        H x qd x Q", 1, 0, H, QD, Q, 1, 1, L },
    { "bwd dO          Q x qd x H", 0, 0, Q, QD, H, 0, 0, L },
    { "bwd dW q/k/v    qkvd x H x Q", 1, 0, QD + 2 * KVD, H, Q, 1, 1, L },
    { "bwd dW ctx k/v  2kvd x H x T", 1, 0, 2 * KVD, H, T, 1, 1, L },
    { "bwd dX q/k/v    Q x H x qkvd f32", 0, 0, Q, H, QD + 2 * KVD, 1, 0, L },
    { "bwd dcx         T x H x 2kvd f32", 0, 0, T, H, 2 * KVD, 1, 1, L },
    { "bwd dW fc       H x LcH x T", 1, 0, H, LCH, T, 1, 1, 1 },
};

/* One path on one shape: ms per call (-1 when the path refuses it). */
static double time_one(gk_gemm *lt, gk_gemmx *gx, int use_lt, const struct shape *s, void *A, void *B, void *D,
                       int iters)
{
    long lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N, ldd = s->N;
    float beta = s->beta ? 1.0f : 0.0f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double ms = -1;
    for (int rep = 0; rep < 2; rep++) {     /* the first pass picks and warms the algorithm */
        int n = rep ? iters : 2, r = 0;
        CK(cudaEventRecord(e0, 0));
        for (int i = 0; i < n && r == 0; i++)
            r = use_lt ? gk_gemm_bf16_cd(lt, 0, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, beta, D, ldd,
                                         D, ldd, s->f32)
                       : gk_gemmx_gemm(gx, 0, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, beta, D,
                                       s->f32 ? GK_F32 : GK_BF16, ldd);
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        if (r < 0) break;
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (rep) ms = t / n;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms;
}

int main(int argc, char **argv)
{
    int device = 0, iters = 10, opt;
    while ((opt = getopt(argc, argv, "d:i:")) != -1) {
        if (opt == 'd') device = atoi(optarg);
        else if (opt == 'i') iters = atoi(optarg);
        else {
            fprintf(stderr, "usage: %s [-d device] [-i iters]\n", argv[0]);
            return 2;
        }
    }
    CK(cudaSetDevice(device));
    size_t maxa = 0, maxb = 0, maxd = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const struct shape *s = &shapes[i];
        size_t a = (size_t)s->M * s->K * 2, b = (size_t)s->K * s->N * 2, d = (size_t)s->M * s->N * 4;
        maxa = a > maxa ? a : maxa;
        maxb = b > maxb ? b : maxb;
        maxd = d > maxd ? d : maxd;
    }
    void *A, *B, *D;
    CK(cudaMalloc(&A, maxa));
    CK(cudaMalloc(&B, maxb));
    CK(cudaMalloc(&D, maxd));
    /* random bf16 operands: tensor-core power, and so the clock, depends on the data (a constant
     * fill runs faster than training does) */
    size_t nmax = (maxa > maxb ? maxa : maxb) / 2;
    uint16_t *h = malloc(nmax * 2);
    if (!h) {
        fprintf(stderr, "gemm_bench: out of memory\n");
        return 1;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < nmax; i++) {
        x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
        uint32_t r = (uint32_t)((x * 0x2545F4914F6CDD1Dull) >> 40);     /* 24 random bits */
        h[i] = (uint16_t)(0x3c00 | (r & 0x7f) | ((r >> 7 & 1) << 15) | ((r >> 8 & 3) << 7));  /* +-[0.008, 0.125) */
    }
    CK(cudaMemcpy(A, h, maxa, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, h, maxb, cudaMemcpyHostToDevice));
    free(h);
    CK(cudaMemset(D, 0, maxd));
    gk_gemm *lt = NULL;
    gk_gemmx *gx = NULL;
    char err[256] = "";
    if (gk_gemm_create(&lt, 0, err, sizeof err) < 0 || gk_gemmx_create(&gx, err, sizeof err) < 0) {
        fprintf(stderr, "gemm_bench: %s\n", err);
        return 1;
    }
    printf("%-34s %5s %9s %9s %9s %9s\n", "shape (M x N x K)", "n", "Lt ms", "Lt TF/s", "Ex ms", "Ex TF/s");
    double step_lt = 0, step_ex = 0, step_best = 0, flops = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const struct shape *s = &shapes[i];
        double f = 2.0 * s->M * s->N * s->K;
        double lt_ms = time_one(lt, gx, 1, s, A, B, D, iters), ex_ms = time_one(lt, gx, 0, s, A, B, D, iters);
        printf("%-34s %5d %9.3f %9.0f %9.3f %9.0f\n", s->name, s->count, lt_ms, lt_ms > 0 ? f / lt_ms / 1e9 : 0,
               ex_ms, ex_ms > 0 ? f / ex_ms / 1e9 : 0);
        step_lt += s->count * (lt_ms > 0 ? lt_ms : ex_ms);
        step_ex += s->count * ex_ms;
        step_best += s->count * (lt_ms > 0 && lt_ms < ex_ms ? lt_ms : ex_ms);
        flops += s->count * f;
    }
    printf("RESULT gemm_step_ms_lt %.2f\nRESULT gemm_step_ms_ex %.2f\nRESULT gemm_step_ms_best %.2f\n"
           "RESULT gemm_step_tflop %.2f\nRESULT gemm_best_tflops %.0f\n", step_lt, step_ex, step_best,
           flops / 1e12, flops / step_best / 1e9);
    gk_gemm_free(lt);
    gk_gemmx_free(gx);
    cudaFree(A);
    cudaFree(B);
    cudaFree(D);
    return 0;
}
#else
int main(void)
{
    fprintf(stderr, "gemm_bench: built without CUDA\n");
    return 77;
}
#endif
