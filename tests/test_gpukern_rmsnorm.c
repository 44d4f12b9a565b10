/* test_gpukern_rmsnorm.c: gk_rmsnorm, gk_rmsnorm_heads, gk_add_rmsnorm, gk_rmsnorm_f32 against fp64 CPU
 * references on fresh random data (strided rows, in-place, shape checks). */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include "gpukern/rmsnorm.h"

/* ref[r, c] = x[r, c] * rsqrt(mean(x[r,:]^2) + eps) * w[c] */
static void ref_norm(const float *x, long xs, const float *w, double *ref, long rs, int rows, int H, double eps)
{
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int c = 0; c < H; c++) ss += (double)x[r * xs + c] * x[r * xs + c];
        double inv = 1.0 / sqrt(ss / H + eps);
        for (int c = 0; c < H; c++) ref[r * rs + c] = x[r * xs + c] * inv * w[c];
    }
}

static void test_plain(void)
{
    const int rows = gk_rng_int(100, 900), H = 8 * gk_rng_int(1, 600);
    const long xs = H + 8 * gk_rng_int(0, 3), os = H + 8 * gk_rng_int(0, 3);
    const float eps = 0.25f;     /* near mean(x^2): a kernel that drops or misplaces eps fails */
    float *x, *w;
    uint16_t *hx = gk_rand_bf16((size_t)rows * xs, 3.0f, 0.5f, &x);
    uint16_t *hw = gk_rand_bf16(H, 1.0f, 1.0f, &w);
    void *dx = gk_dev_upload(hx, (size_t)rows * xs * 2), *dw = gk_dev_upload(hw, H * 2);
    void *dout = gk_dev_poisoned((size_t)rows * os);
    CHECK_INT(gk_rmsnorm(dx, xs, dw, dout, os, rows, H, eps, 0), ==, 0);
    float *out = gk_dev_download_f32(dout, (size_t)rows * os);
    double *ref = malloc(sizeof(double) * rows * H);
    ref_norm(x, xs, w, ref, H, rows, H, eps);
    double e = gk_rel_err(out, os, ref, H, rows, H);
    printf("rmsnorm rows %d H %d: rel err %.2e\n", rows, H, e);
    CHECK(e < 4e-3);
    /* in place */
    CHECK_INT(gk_rmsnorm(dx, xs, dw, dx, xs, rows, H, eps, 0), ==, 0);
    float *out2 = gk_dev_download_f32(dx, (size_t)rows * xs);
    CHECK(gk_rel_err(out2, xs, ref, H, rows, H) < 4e-3);
    CHECK_INT(gk_rmsnorm(dx, xs, dw, dout, os, rows, H + 4, eps, 0), ==, -EINVAL);
    CHECK_INT(gk_rmsnorm((char *)dx + 2, xs, dw, dout, os, rows, H, eps, 0), ==, -EINVAL);
    cudaFree(dx); cudaFree(dw); cudaFree(dout);
    free(hx); free(hw); free(x); free(w); free(out); free(out2); free(ref);
}

static void test_heads(void)
{
    const int T = gk_rng_int(50, 400), nh = gk_rng_int(1, 12), hd = 8 * gk_rng_int(2, 32);
    const long stride = (long)nh * hd + 8 * gk_rng_int(0, 40);
    const float eps = 0.25f;     /* near mean(x^2): a kernel that drops or misplaces eps fails */
    float *x, *w;
    uint16_t *hx = gk_rand_bf16((size_t)T * stride, 2.0f, 0.f, &x);
    uint16_t *hw = gk_rand_bf16(hd, 0.5f, 1.0f, &w);
    void *dx = gk_dev_upload(hx, (size_t)T * stride * 2), *dw = gk_dev_upload(hw, hd * 2);
    CHECK_INT(gk_rmsnorm_heads(dx, stride, T, nh, hd, dw, eps, 0), ==, 0);
    float *out = gk_dev_download_f32(dx, (size_t)T * stride);
    double *ref = malloc(sizeof(double) * T * stride);
    for (int t = 0; t < T; t++) {
        ref_norm(x + t * stride, hd, w, ref + t * stride, hd, nh, hd, eps);
        for (long c = (long)nh * hd; c < stride; c++) ref[t * stride + c] = x[t * stride + c]; /* untouched */
    }
    double e = gk_rel_err(out, stride, ref, stride, T, stride);
    printf("rmsnorm_heads T %d heads %d hd %d: rel err %.2e\n", T, nh, hd, e);
    CHECK(e < 4e-3);
    cudaFree(dx); cudaFree(dw);
    free(hx); free(hw); free(x); free(w); free(out); free(ref);
}

static void test_add(void)
{
    const int rows = gk_rng_int(100, 600), H = 8 * gk_rng_int(1, 400);
    const long s = H + 8 * gk_rng_int(0, 3), os = H;
    const float eps = 0.25f;     /* near mean(x^2): a kernel that drops or misplaces eps fails */
    float *a, *b, *w;
    uint16_t *ha = gk_rand_bf16((size_t)rows * s, 2.0f, 0.f, &a);
    uint16_t *hb = gk_rand_bf16((size_t)rows * s, 1.0f, 0.3f, &b);
    uint16_t *hw = gk_rand_bf16(H, 1.0f, 0.f, &w);
    void *da = gk_dev_upload(ha, (size_t)rows * s * 2), *db = gk_dev_upload(hb, (size_t)rows * s * 2);
    void *dw = gk_dev_upload(hw, H * 2), *dout = gk_dev_poisoned((size_t)rows * os);
    CHECK_INT(gk_add_rmsnorm(da, db, da, s, dw, dout, os, rows, H, eps, 0), ==, 0);  /* sum into a */
    float *sum = gk_dev_download_f32(da, (size_t)rows * s), *out = gk_dev_download_f32(dout, (size_t)rows * os);
    double *rsum = malloc(sizeof(double) * rows * s), *ref = malloc(sizeof(double) * rows * H);
    float *fsum = malloc(sizeof(float) * rows * s);
    for (long i = 0; i < (long)rows * s; i++) { rsum[i] = (double)a[i] + b[i]; fsum[i] = (float)rsum[i]; }
    ref_norm(fsum, s, w, ref, H, rows, H, eps);
    double es = gk_rel_err(sum, s, rsum, s, rows, H), eo = gk_rel_err(out, os, ref, H, rows, H);
    printf("add_rmsnorm rows %d H %d: sum rel err %.2e, norm rel err %.2e\n", rows, H, es, eo);
    CHECK(es < 4e-3 && eo < 4e-3);
    cudaFree(da); cudaFree(db); cudaFree(dw); cudaFree(dout);
    free(ha); free(hb); free(hw); free(a); free(b); free(w); free(sum); free(out); free(rsum); free(ref); free(fsum);
}

static void test_f32(void)
{
    const int rows = gk_rng_int(100, 700), H = 8 * gk_rng_int(1, 600);
    const long xs = H + 4 * gk_rng_int(0, 3), os = H + 8 * gk_rng_int(0, 3);
    const float eps = 0.25f;     /* near mean(x^2): a kernel that drops or misplaces eps fails */
    float *x = malloc(sizeof(float) * rows * xs), *w;
    for (long i = 0; i < (long)rows * xs; i++) x[i] = gk_rng_uniform() * 5.0f + 0.3f;
    uint16_t *hw = gk_rand_bf16(H, 1.0f, 1.0f, &w);
    float *dx = gk_dev_upload(x, sizeof(float) * rows * xs);
    void *dw = gk_dev_upload(hw, H * 2), *dout = gk_dev_poisoned((size_t)rows * os);
    CHECK_INT(gk_rmsnorm_f32(dx, xs, dw, dout, os, rows, H, eps, 0), ==, 0);
    float *out = gk_dev_download_f32(dout, (size_t)rows * os);
    double *ref = malloc(sizeof(double) * rows * H);
    ref_norm(x, xs, w, ref, H, rows, H, eps);
    double e = gk_rel_err(out, os, ref, H, rows, H);
    printf("rmsnorm_f32 rows %d H %d: rel err %.2e\n", rows, H, e);
    CHECK(e < 4e-3);
    CHECK_INT(gk_rmsnorm_f32(dx + 1, xs, dw, dout, os, rows, H, eps, 0), ==, -EINVAL);
    cudaFree(dx); cudaFree(dw); cudaFree(dout);
    free(x); free(hw); free(w); free(out); free(ref);
}

int main(void)
{
    gk_test_require_gpu();
    gk_rng_seed();
    for (int i = 0; i < 3; i++) { test_plain(); test_heads(); test_add(); test_f32(); }
    CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}
#else
int main(void) { SKIP("built without CUDA"); }
#endif
