/* test_gpukern_rope.c: gk_rope_inv_freq (default, linear, Llama-3 scaling), gk_positions over a
 * packed batch, and gk_rope with and without the per-head norm, against fp64 CPU references;
 * gk_rope_to (strided source, another destination) bit-equal to gk_rope, the source untouched. */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include "gpukern/rope.h"

static void test_inv_freq(void)
{
    float f[256];
    CHECK_INT(gk_rope_inv_freq(f, 128, 1e6, NULL), ==, 0);
    for (int i = 0; i < 64; i++) CHECK_NEAR(f[i], pow(1e6, -2.0 * i / 128), 2e-6 * pow(1e6, -2.0 * i / 128));
    gk_rope_scaling lin = { .type = GK_ROPE_LINEAR, .factor = 4 };
    float g[256];
    CHECK_INT(gk_rope_inv_freq(g, 64, 1e4, &lin), ==, 0);
    for (int i = 0; i < 32; i++) CHECK_NEAR(g[i], pow(1e4, -2.0 * i / 64) / 4, 1e-6 * g[i]);
    /* Llama 3.1: factor 8, low 1, high 4, original 8192, theta 500000. */
    gk_rope_scaling l3 = { .type = GK_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 1,
                           .high_freq_factor = 4, .original_max_pos = 8192 };
    CHECK_INT(gk_rope_inv_freq(g, 128, 500000, &l3), ==, 0);
    int n_hi = 0, n_lo = 0, n_mid = 0;
    for (int i = 0; i < 64; i++) {
        double base = pow(500000, -2.0 * i / 128), wl = 2 * M_PI / base, want;
        if (wl < 8192 / 4.0) { want = base; n_hi++; }
        else if (wl > 8192 / 1.0) { want = base / 8; n_lo++; }
        else {
            double sm = (8192 / wl - 1) / (4 - 1);
            want = (1 - sm) * base / 8 + sm * base;
            n_mid++;
        }
        CHECK_NEAR(g[i], want, 2e-5 * want);
    }
    CHECK(n_hi > 0 && n_lo > 0 && n_mid > 0);  /* all three bands were exercised */
    gk_rope_scaling bad = { .type = GK_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 4,
                            .high_freq_factor = 1, .original_max_pos = 8192 };
    CHECK_INT(gk_rope_inv_freq(g, 128, 500000, &bad), ==, -EINVAL);
    CHECK_INT(gk_rope_inv_freq(g, 127, 500000, NULL), ==, -EINVAL);
    printf("inv_freq ok (llama3 bands %d/%d/%d)\n", n_hi, n_mid, n_lo);
}

static void test_rope(int with_norm)
{
    const int n_seqs = gk_rng_int(1, 6);
    int cu[8] = {0};
    for (int s = 0; s < n_seqs; s++) cu[s + 1] = cu[s] + gk_rng_int(1, 300);
    const int T = cu[n_seqs];
    const int nh = gk_rng_int(1, 36);       /* a warp takes up to 8 heads: several groups, partial ones */
    const int hds[] = {16, 64, 128, 256, 512};
    const int hd = hds[gk_rng_int(0, 4)];
    const long stride = (long)nh * hd + 8 * gk_rng_int(0, 3);
    const double theta = with_norm ? 1e6 : 5e5;
    const float eps = 1e-6f;
    float inv[256];
    gk_rope_scaling l3 = { .type = GK_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 1,
                           .high_freq_factor = 4, .original_max_pos = 64 };
    CHECK_INT(gk_rope_inv_freq(inv, hd, theta, with_norm ? NULL : &l3), ==, 0);
    float *x, *w;
    uint16_t *hx = gk_rand_bf16((size_t)T * stride, 2.0f, 0.f, &x);
    uint16_t *hw = gk_rand_bf16(hd, 0.5f, 1.0f, &w);
    void *dx = gk_dev_upload(hx, (size_t)T * stride * 2), *dw = gk_dev_upload(hw, hd * 2);
    int32_t *dcu = gk_dev_upload(cu, sizeof(int32_t) * (n_seqs + 1));
    float *dinv = gk_dev_upload(inv, sizeof(float) * hd / 2);
    int32_t *dpos = NULL;
    CUDA_CHECK(cudaMalloc((void **)&dpos, sizeof(int32_t) * T));
    CUDA_CHECK(cudaMemset(dpos, 0xff, sizeof(int32_t) * T));
    CHECK_INT(gk_positions(dcu, n_seqs, dpos, T, 0), ==, 0);
    CHECK_INT(gk_rope(dx, stride, T, nh, hd, dpos, dinv, with_norm ? dw : NULL, eps, 0), ==, 0);
    int32_t *pos = malloc(sizeof(int32_t) * T);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(pos, dpos, sizeof(int32_t) * T, cudaMemcpyDeviceToHost));
    for (int s = 0; s < n_seqs; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++) CHECK_INT(pos[t], ==, t - cu[s]);
    float *out = gk_dev_download_f32(dx, (size_t)T * stride);
    double *ref = malloc(sizeof(double) * T * stride), y[512];
    const int half = hd / 2;
    for (int t = 0; t < T; t++) {
        for (long c = (long)nh * hd; c < stride; c++) ref[t * stride + c] = x[t * stride + c];
        for (int h = 0; h < nh; h++) {
            const float *xh = x + t * stride + (long)h * hd;
            double inv_rms = 1;
            if (with_norm) {
                double ss = 0;
                for (int d = 0; d < hd; d++) ss += (double)xh[d] * xh[d];
                inv_rms = 1 / sqrt(ss / hd + eps);
            }
            for (int d = 0; d < hd; d++) y[d] = xh[d] * inv_rms * (with_norm ? w[d] : 1.0);
            for (int i = 0; i < half; i++) {
                double a = (double)pos[t] * inv[i], c = cos(a), sn = sin(a);
                ref[t * stride + (long)h * hd + i] = y[i] * c - y[i + half] * sn;
                ref[t * stride + (long)h * hd + i + half] = y[i + half] * c + y[i] * sn;
            }
        }
    }
    double e = gk_rel_err(out, stride, ref, stride, T, stride);
    printf("rope%s seqs %d T %d heads %d hd %d: rel err %.2e\n", with_norm ? "+norm" : "", n_seqs, T, nh, hd, e);
    CHECK(e < 4e-3);
    CHECK_INT(gk_rope(dx, stride, T, nh, 12, dpos, dinv, NULL, eps, 0), ==, -EINVAL);

    /* out of place: the heads read from the original rows (columns after them untouched), written
     * compactly with another stride; the same bits as in place */
    const long dstride = (long)nh * hd + 8 * gk_rng_int(0, 2);
    void *dsrc = gk_dev_upload(hx, (size_t)T * stride * 2), *ddst = gk_dev_poisoned((size_t)T * dstride);
    CHECK_INT(gk_rope_to(dsrc, stride, ddst, dstride, T, nh, hd, dpos, dinv, with_norm ? dw : NULL, eps, 0), ==, 0);
    uint16_t *hsrc = malloc((size_t)T * stride * 2), *hdst = malloc((size_t)T * dstride * 2);
    uint16_t *hin = malloc((size_t)T * stride * 2);
    CHECK(hsrc && hdst && hin);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(hsrc, dsrc, (size_t)T * stride * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hdst, ddst, (size_t)T * dstride * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hin, dx, (size_t)T * stride * 2, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(hsrc, hx, (size_t)T * stride * 2));
    for (int t = 0; t < T; t++) {
        if (memcmp(hdst + (size_t)t * dstride, hin + (size_t)t * stride, (size_t)nh * hd * 2))
            TEST_FAIL("gk_rope_to row %d differs from gk_rope", t);
        for (long c = (long)nh * hd; c < dstride; c++)
            if (hdst[(size_t)t * dstride + c] != 0xffff) TEST_FAIL("gk_rope_to wrote past the heads of row %d", t);
    }
    CHECK_INT(gk_rope_to(dsrc, stride, ddst, (long)nh * hd - 8, T, nh, hd, dpos, dinv, NULL, eps, 0), ==, -EINVAL);
    CHECK_INT(gk_rope_to(dsrc, stride, dsrc, stride + 8, T, nh, hd, dpos, dinv, NULL, eps, 0), ==, -EINVAL);
    printf("rope_to%s (dst stride %ld): bit-equal to in place\n", with_norm ? "+norm" : "", dstride);
    cudaFree(dsrc); cudaFree(ddst);
    free(hsrc); free(hdst); free(hin);

    cudaFree(dx); cudaFree(dw); cudaFree(dcu); cudaFree(dinv); cudaFree(dpos);
    free(hx); free(hw); free(x); free(w); free(pos); free(out); free(ref);
}

int main(void)
{
    gk_test_require_gpu();
    gk_rng_seed();
    test_inv_freq();
    for (int i = 0; i < 6; i++) { test_rope(0); test_rope(1); }
    CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}
#else
int main(void) { SKIP("built without CUDA"); }
#endif
