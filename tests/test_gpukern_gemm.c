/* test_gpukern_gemm.c: gk_gemm_bf16 (all transpose combinations, strides, unaligned operands,
 * beta with C == D and C != D), gk_linear and gk_linear_f32out (fp32 C/D) against an fp64 CPU
 * product on fresh random data. */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include "gpukern/gemm.h"

/* fixed_lda > 0: that lda and no random padding anywhere (calls differing in M only share a plan
 * key); 0: random padding. */
static void one_ld(gk_gemm *g, int ta, int tb, int M, int N, int K, int with_c, int c_is_d, int offset, long fixed_lda)
{
    const int fixed = fixed_lda > 0;
    const long lda = fixed ? fixed_lda : ((ta ? M : K) + 7) / 8 * 8 + 8 * gk_rng_int(0, 2) + offset;
    const long ldb = (tb ? K : N) + (fixed ? 0 : 8 * gk_rng_int(0, 2));
    const long ldd = N + (fixed ? 0 : 8 * gk_rng_int(0, 2)), ldc = c_is_d ? ldd : N + (fixed ? 0 : 8 * gk_rng_int(0, 2));
    const long arows = ta ? K : M, brows = tb ? N : K;
    float *a, *b, *c;
    uint16_t *ha = gk_rand_bf16((size_t)arows * lda + offset, 1.0f, 0.f, &a);
    uint16_t *hb = gk_rand_bf16((size_t)brows * ldb, 1.0f, 0.f, &b);
    uint16_t *hc = gk_rand_bf16((size_t)M * ldc, 4.0f, 0.f, &c);
    void *da = gk_dev_upload(ha, ((size_t)arows * lda + offset) * 2), *db = gk_dev_upload(hb, (size_t)brows * ldb * 2);
    void *dc = gk_dev_upload(hc, (size_t)M * ldc * 2);
    void *dd = c_is_d ? dc : gk_dev_poisoned((size_t)M * ldd);
    const float alpha = 0.5f + gk_rng_uniform() * 0.25f, beta = with_c ? 1.0f : 0.0f;
    CHECK_INT(gk_gemm_bf16(g, 0, ta, tb, M, N, K, alpha, (uint16_t *)da + offset, lda, db, ldb, beta,
                           with_c ? dc : NULL, ldc, dd, ldd), ==, 0);
    float *out = gk_dev_download_f32(dd, (size_t)M * ldd);
    double *ref = malloc(sizeof(double) * M * N);
    const float *a0 = a + offset;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)(ta ? a0[(long)k * lda + i] : a0[(long)i * lda + k]) *
                     (tb ? b[(long)j * ldb + k] : b[(long)k * ldb + j]);
            ref[(long)i * N + j] = alpha * s + (with_c ? beta * c[(long)i * ldc + j] : 0);
        }
    double e = gk_rel_err(out, ldd, ref, N, M, N);
    printf("gemm ta %d tb %d M %d N %d K %d c %d c==d %d off %d: rel err %.2e\n", ta, tb, M, N, K, with_c,
           c_is_d, offset, e);
    CHECK(e < 5e-3);
    cudaFree(da); cudaFree(db); cudaFree(dc);
    if (!c_is_d) cudaFree(dd);
    free(ha); free(hb); free(hc); free(a); free(b); free(c); free(out); free(ref);
}

static void one(gk_gemm *g, int ta, int tb, int M, int N, int K, int with_c, int c_is_d, int offset)
{
    one_ld(g, ta, tb, M, N, K, with_c, c_is_d, offset, 0);
}

int main(void)
{
    gk_test_require_gpu();
    gk_rng_seed();
    gk_gemm *g = NULL;
    char err[256] = "";
    int r = gk_gemm_create(&g, 0, err, sizeof(err));
    if (r) TEST_FAIL("gk_gemm_create: %s", err);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            one(g, ta, tb, gk_rng_int(1, 300), 8 * gk_rng_int(1, 40), 8 * gk_rng_int(1, 40), 0, 0, 0);
            one(g, ta, tb, 8 * gk_rng_int(1, 40), 8 * gk_rng_int(1, 40), 8 * gk_rng_int(1, 40), 1, 0, 8);
            one(g, ta, tb, 8 * gk_rng_int(1, 40), 8 * gk_rng_int(1, 40), 8 * gk_rng_int(1, 40), 1, 1, 0);
        }
    /* linear layer shapes of a target (T x K) . (N x K)^T, with the residual fused in place */
    one(g, 0, 1, gk_rng_int(500, 1100), 1024, 1024, 1, 1, 0);
    one(g, 0, 1, gk_rng_int(500, 1100), 3072, 1024, 0, 0, 0);
    /* fp32 C/D (an fp32 residual stream updated in place) */
    {
        const int T = gk_rng_int(100, 600), N = 8 * gk_rng_int(8, 64), K = 8 * gk_rng_int(8, 64);
        float *x, *w;
        uint16_t *hx = gk_rand_bf16((size_t)T * K, 1.0f, 0.f, &x), *hw = gk_rand_bf16((size_t)N * K, 1.0f, 0.f, &w);
        float *rr = malloc(sizeof(float) * T * N);
        for (long i = 0; i < (long)T * N; i++) rr[i] = gk_rng_uniform() * 8.0f;
        void *dx = gk_dev_upload(hx, (size_t)T * K * 2), *dw = gk_dev_upload(hw, (size_t)N * K * 2);
        float *dr = gk_dev_upload(rr, sizeof(float) * T * N);
        CHECK_INT(gk_linear_f32out(g, 0, T, N, K, dx, K, dw, dr, N, dr, N), ==, 0);
        float *o = malloc(sizeof(float) * T * N);
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(o, dr, sizeof(float) * T * N, cudaMemcpyDeviceToHost));
        double *ref = malloc(sizeof(double) * T * N);
        for (int i = 0; i < T; i++)
            for (int j = 0; j < N; j++) {
                double s = rr[(long)i * N + j];
                for (int k = 0; k < K; k++) s += (double)x[(long)i * K + k] * w[(long)j * K + k];
                ref[(long)i * N + j] = s;
            }
        double e = gk_rel_err(o, N, ref, N, T, N);
        printf("gemm fp32 C/D in place T %d N %d K %d: rel err %.2e\n", T, N, K, e);
        CHECK(e < 1e-5);  /* no bf16 rounding of the output: fp32 accumulation only */
        cudaFree(dx); cudaFree(dw); cudaFree(dr);
        free(hx); free(hw); free(x); free(w); free(rr); free(o); free(ref);
    }
    /* repeated shape: served from the plan cache */
    one(g, 0, 1, 256, 512, 256, 0, 0, 0);
    one(g, 0, 1, 256, 512, 256, 0, 0, 0);
    /* Row counts of packed batches change every call: every M of a bucket shares its plan, the
     * layouts set to the real M (a wrong row count shows as a wrong product). */
    for (int ta = 0; ta < 2; ta++) {
        const int ms[] = { 1100, 2048, 1025, 1537, 2047, 1300 };
        long before = 0;
        for (int i = 0; i < 6; i++) {
            one_ld(g, ta, 1, ms[i], 384, 256, 0, 0, 0, ta ? 2048 : 256);
            if (i == 0)
                before = gk_gemm_plans_made(g);
        }
        CHECK_INT(gk_gemm_plans_made(g), ==, before);   /* one plan for M in (1024, 2048] */
    }
    /* A process's worth of shapes (8 (N, K) x the 83 row buckets up to 16K rows: every count up to
     * 64, powers of two to 2048, multiples of 1024) stays cached: a second pass over them makes no
     * plan (a cache smaller than that kept evicting and making plans in the loop). */
    {
        enum { MAXM = 16384 };
        int ms[96], nm = 0;
        for (int m = 1; m <= 64; m++) ms[nm++] = m;
        for (int m = 128; m <= 2048; m *= 2) ms[nm++] = m;
        for (int m = 3072; m <= MAXM; m += 1024) ms[nm++] = m;
        void *a, *b, *d;
        CUDA_CHECK(cudaMalloc(&a, (size_t)MAXM * 128 * 2));
        CUDA_CHECK(cudaMalloc(&b, 512 * 128 * 2));
        CUDA_CHECK(cudaMalloc(&d, (size_t)MAXM * 512 * 2));
        CUDA_CHECK(cudaMemset(a, 0, (size_t)MAXM * 128 * 2));
        CUDA_CHECK(cudaMemset(b, 0, 512 * 128 * 2));
        long made[2];
        for (int pass = 0; pass < 2; pass++) {
            long before = gk_gemm_plans_made(g);
            for (int sh = 0; sh < 8; sh++)
                for (int i = 0; i < nm; i++)
                    CHECK_OK(gk_gemm_bf16(g, 0, 0, 1, ms[i], 64 + 48 * sh, 128, 1.f, a, 128, b, 128, 0.f, NULL, 0, d,
                                          512));
            made[pass] = gk_gemm_plans_made(g) - before;
        }
        printf("plan cache: %ld plans made for %d shapes, %ld on the second pass\n", made[0], 8 * nm, made[1]);
        CHECK_INT(nm, ==, 83);
        CHECK_INT(made[0], ==, 8 * nm);
        CHECK_INT(made[1], ==, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        cudaFree(a); cudaFree(b); cudaFree(d);
    }
    CHECK_INT(gk_gemm_bf16(g, 0, 0, 1, 16, 16, 16, 1.f, (void *)16, 8, (void *)16, 16, 0.f, NULL, 0, (void *)16, 16),
              ==, -EINVAL);  /* lda < K */
    CUDA_CHECK(cudaDeviceSynchronize());
    gk_gemm_free(g);
    return 0;
}
#else
int main(void) { SKIP("built without CUDA"); }
#endif
