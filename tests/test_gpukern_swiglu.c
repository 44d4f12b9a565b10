/* test_gpukern_swiglu.c: gk_swiglu (fused gate_up layout), gk_add (residual), gk_add_bias(_f32) and
 * gk_convert_f32_bf16 against fp64
 * CPU references on fresh random data. */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include "gpukern/swiglu.h"
#include "gpukern/residual.h"

static void test_swiglu(void)
{
    const int rows = gk_rng_int(50, 700), I = 8 * gk_rng_int(1, 500);
    const long is = 2L * I + 8 * gk_rng_int(0, 2), os = I + 8 * gk_rng_int(0, 2);
    float *gu;
    uint16_t *h = gk_rand_bf16((size_t)rows * is, 6.0f, 0.f, &gu);
    void *d = gk_dev_upload(h, (size_t)rows * is * 2), *dout = gk_dev_poisoned((size_t)rows * os);
    CHECK_INT(gk_swiglu(d, (uint16_t *)d + I, is, dout, os, rows, I, 0), ==, 0);
    float *out = gk_dev_download_f32(dout, (size_t)rows * os);
    double *ref = malloc(sizeof(double) * rows * I);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < I; c++) {
            double g = gu[r * is + c], u = gu[r * is + I + c];
            ref[(long)r * I + c] = g / (1 + exp(-g)) * u;
        }
    double e = gk_rel_err(out, os, ref, I, rows, I);
    printf("swiglu rows %d I %d: rel err %.2e\n", rows, I, e);
    CHECK(e < 4e-3);
    CHECK_INT(gk_swiglu(d, (uint16_t *)d + 1, is, dout, os, rows, I, 0), ==, -EINVAL);
    cudaFree(d); cudaFree(dout);
    free(h); free(gu); free(out); free(ref);
}

static void test_add(void)
{
    const int rows = gk_rng_int(50, 700), H = 8 * gk_rng_int(1, 500);
    const long s = H + 8 * gk_rng_int(0, 2);
    float *a, *b;
    uint16_t *ha = gk_rand_bf16((size_t)rows * s, 4.0f, 0.f, &a), *hb = gk_rand_bf16((size_t)rows * s, 1.0f, 0.f, &b);
    void *da = gk_dev_upload(ha, (size_t)rows * s * 2), *db = gk_dev_upload(hb, (size_t)rows * s * 2);
    void *dout = gk_dev_poisoned((size_t)rows * s);
    CHECK_INT(gk_add(da, db, dout, s, rows, H, 0), ==, 0);
    CHECK_INT(gk_add(da, db, db, s, rows, H, 0), ==, 0);  /* in place into b */
    float *out = gk_dev_download_f32(dout, (size_t)rows * s), *out2 = gk_dev_download_f32(db, (size_t)rows * s);
    double *ref = malloc(sizeof(double) * rows * s);
    for (long i = 0; i < (long)rows * s; i++) ref[i] = (double)a[i] + b[i];
    double e = gk_rel_err(out, s, ref, s, rows, H), e2 = gk_rel_err(out2, s, ref, s, rows, H);
    printf("add rows %d H %d: rel err %.2e / in place %.2e\n", rows, H, e, e2);
    CHECK(e < 4e-3 && e2 < 4e-3);
    cudaFree(da); cudaFree(db); cudaFree(dout);
    free(ha); free(hb); free(a); free(b); free(out); free(out2); free(ref);
}

static void test_bias(void)
{
    const int rows = gk_rng_int(50, 500), cols = 8 * gk_rng_int(1, 300);
    const long s = cols + 8 * gk_rng_int(0, 2);
    float *x, *b;
    uint16_t *hx = gk_rand_bf16((size_t)rows * s, 3.0f, 0.f, &x), *hb = gk_rand_bf16(cols, 1.0f, 0.5f, &b);
    void *dx = gk_dev_upload(hx, (size_t)rows * s * 2), *db = gk_dev_upload(hb, cols * 2);
    CHECK_INT(gk_add_bias(dx, s, db, rows, cols, 0), ==, 0);
    float *out = gk_dev_download_f32(dx, (size_t)rows * s);
    double *ref = malloc(sizeof(double) * rows * s);
    for (long r = 0; r < rows; r++)
        for (long c = 0; c < s; c++) ref[r * s + c] = x[r * s + c] + (c < cols ? b[c] : 0);
    double e = gk_rel_err(out, s, ref, s, rows, s);  /* the padding columns stay untouched */
    printf("add_bias rows %d cols %d: rel err %.2e\n", rows, cols, e);
    CHECK(e < 4e-3);
    cudaFree(dx); cudaFree(db);
    free(hx); free(hb); free(x); free(b); free(out); free(ref);
}

/* gk_add_bias_f32 on fp32 rows, then gk_convert_f32_bf16 of the result into a strided bf16 block */
static void test_f32_stream(void)
{
    const int rows = gk_rng_int(50, 500), cols = 8 * gk_rng_int(1, 300);
    const long s = cols + 4 * gk_rng_int(0, 3), ds = cols + 8 * gk_rng_int(0, 2);
    float *x = malloc(sizeof(float) * rows * s), *b;
    for (long i = 0; i < (long)rows * s; i++) x[i] = gk_rng_uniform() * 3.0f;
    uint16_t *hb = gk_rand_bf16(cols, 1.0f, 0.5f, &b);
    float *dx = gk_dev_upload(x, sizeof(float) * rows * s);
    void *db = gk_dev_upload(hb, cols * 2), *dd = gk_dev_poisoned((size_t)rows * ds);
    CHECK_INT(gk_add_bias_f32(dx, s, db, rows, cols, 0), ==, 0);
    CHECK_INT(gk_convert_f32_bf16(dx, s, dd, ds, rows, cols, 0), ==, 0);
    float *xo = malloc(sizeof(float) * rows * s);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(xo, dx, sizeof(float) * rows * s, cudaMemcpyDeviceToHost));
    float *out = gk_dev_download_f32(dd, (size_t)rows * ds);
    double *ref = malloc(sizeof(double) * rows * s);
    for (long r = 0; r < rows; r++)
        for (long c = 0; c < s; c++) ref[r * s + c] = (double)x[r * s + c] + (c < cols ? b[c] : 0);
    double e1 = gk_rel_err(xo, s, ref, s, rows, s), e2 = gk_rel_err(out, ds, ref, s, rows, cols);
    printf("add_bias_f32 rows %d cols %d: rel err %.2e; to bf16 %.2e\n", rows, cols, e1, e2);
    CHECK(e1 < 1e-6 && e2 < 4e-3);
    cudaFree(dx); cudaFree(db); cudaFree(dd);
    free(x); free(hb); free(b); free(xo); free(out); free(ref);
}

int main(void)
{
    gk_test_require_gpu();
    gk_rng_seed();
    for (int i = 0; i < 3; i++) { test_swiglu(); test_add(); test_bias(); test_f32_stream(); }
    CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}
#else
int main(void) { SKIP("built without CUDA"); }
#endif
