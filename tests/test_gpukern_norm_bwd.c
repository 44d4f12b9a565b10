/* test_gpukern_norm_bwd.c: RMSNorm backward (with residual, fp32 and bf16 outputs), the q/k
 * per-head norm + RoPE backward, and the SwiGLU backward against fp64 CPU references; the norms'
 * weight gradients the same to the bit when run twice. */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include "gpukern/norm_bwd.h"
#include "gpukern/rope.h"
#include "gpukern/swiglu_bwd.h"

static float *rand_f32(size_t n, float scale)
{
    float *f = malloc(n * 4);
    CHECK(f);
    for (size_t i = 0; i < n; i++) f[i] = gk_rng_uniform() * scale;
    return f;
}

static float *dl_f32(const float *d, size_t n)
{
    float *h = malloc(n * 4);
    CHECK(h);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}

/* A workspace full of NaN: a partial the kernels forget to write poisons dw. */
static float *ws_alloc(int width)
{
    float *ws;
    CUDA_CHECK(cudaMalloc((void **)&ws, gk_norm_bwd_ws_bytes(width)));
    CUDA_CHECK(cudaMemset(ws, 0xff, gk_norm_bwd_ws_bytes(width)));
    return ws;
}

/* dw from zero twice with the same inputs: the two results must be equal bit for bit. */
static void check_same_bits(const float *d1, const float *d2, int n, const char *what)
{
    float *a = dl_f32(d1, n), *b = dl_f32(d2, n);
    int diff = memcmp(a, b, (size_t)n * 4) != 0;
    if (diff) printf("%s: weight gradient differs between two identical runs\n", what);
    CHECK(!diff);
    free(a);
    free(b);
}

static void rms_case(int rows, int H)
{
    const float eps = 0.25f;     /* near mean(x^2): a kernel that drops or misplaces eps fails */
    float *x, *w;
    uint16_t *hx = gk_rand_bf16((size_t)rows * H, 2.0f, 0.3f, &x), *hw = gk_rand_bf16(H, 0.5f, 1.0f, &w);
    float *dy = rand_f32((size_t)rows * H, 1.0f), *res = rand_f32((size_t)rows * H, 1.0f);
    float *dw0 = rand_f32(H, 1.0f);
    void *dx_ = gk_dev_upload(hx, (size_t)rows * H * 2), *dw_ = gk_dev_upload(hw, H * 2);
    float *ddy = gk_dev_upload(dy, (size_t)rows * H * 4), *dres = gk_dev_upload(res, (size_t)rows * H * 4);
    float *ddw = gk_dev_upload(dw0, H * 4), *ddx;
    CUDA_CHECK(cudaMalloc((void **)&ddx, (size_t)rows * H * 4));
    void *ddxb = gk_dev_poisoned((size_t)rows * H);
    float *ws = ws_alloc(H);
    CHECK_INT(gk_rmsnorm_bwd(ddy, H, dx_, H, dw_, dres, H, ddx, H, ddxb, H, ddw, ws, rows, H, eps, 0), ==, 0);
    float *gdx = dl_f32(ddx, (size_t)rows * H), *gdw = dl_f32(ddw, H), *gdxb = gk_dev_download_f32(ddxb, (size_t)rows * H);
    double *rdx = malloc(8 * (size_t)rows * H), *rdw = malloc(8 * (size_t)H);
    for (int i = 0; i < H; i++) rdw[i] = dw0[i];
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * H, *gr = dy + (size_t)r * H;
        double ss = 0, c = 0;
        for (int i = 0; i < H; i++) ss += (double)xr[i] * xr[i];
        double ri = 1 / sqrt(ss / H + eps);
        for (int i = 0; i < H; i++) {
            c += (double)gr[i] * w[i] * xr[i] * ri;
            rdw[i] += (double)gr[i] * xr[i] * ri;
        }
        c /= H;
        for (int i = 0; i < H; i++)
            rdx[(size_t)r * H + i] = res[(size_t)r * H + i] + ri * (gr[i] * w[i] - xr[i] * ri * c);
    }
    double e = gk_rel_err(gdx, H, rdx, H, rows, H), eb = gk_rel_err(gdxb, H, rdx, H, rows, H);
    double ew = gk_rel_err(gdw, H, rdw, H, 1, H);
    printf("rmsnorm_bwd rows %d H %d: dx rel err %.1e (bf16 %.1e), dw %.1e\n", rows, H, e, eb, ew);
    CHECK(e < 1e-4 && eb < 1e-2 && ew < 1e-5);
    /* without residual, bf16 output only; twice from dw = 0 */
    float *ddw2;
    CUDA_CHECK(cudaMalloc((void **)&ddw2, H * 4));
    CUDA_CHECK(cudaMemset(ddw, 0, H * 4));
    CUDA_CHECK(cudaMemset(ddw2, 0, H * 4));
    CHECK_INT(gk_rmsnorm_bwd(ddy, H, dx_, H, dw_, NULL, 0, NULL, 0, ddxb, H, ddw, ws, rows, H, eps, 0), ==, 0);
    CHECK_INT(gk_rmsnorm_bwd(ddy, H, dx_, H, dw_, NULL, 0, NULL, 0, ddxb, H, ddw2, ws, rows, H, eps, 0), ==, 0);
    CHECK_INT(gk_rmsnorm_bwd(ddy, H, dx_, H, dw_, NULL, 0, NULL, 0, ddxb, H, ddw, ws, rows, H + 4, eps, 0), ==, -EINVAL);
    CHECK_INT(gk_rmsnorm_bwd(ddy, H, dx_, H, dw_, NULL, 0, NULL, 0, ddxb, H, ddw, NULL, rows, H, eps, 0), ==, -EINVAL);
    check_same_bits(ddw, ddw2, H, "rmsnorm_bwd");
    float *gdw0 = dl_f32(ddw, H);
    for (int i = 0; i < H; i++) rdw[i] -= dw0[i];
    CHECK(gk_rel_err(gdw0, H, rdw, H, 1, H) < 1e-5);
    free(gdw0);
    float *gdxb2 = gk_dev_download_f32(ddxb, (size_t)rows * H);
    for (size_t i = 0; i < (size_t)rows * H; i++) rdx[i] -= res[i];
    CHECK(gk_rel_err(gdxb2, H, rdx, H, rows, H) < 1e-2);
    cudaFree(dx_); cudaFree(dw_); cudaFree(ddy); cudaFree(dres); cudaFree(ddw); cudaFree(ddw2); cudaFree(ddx);
    cudaFree(ddxb); cudaFree(ws);
    free(hx); free(hw); free(x); free(w); free(dy); free(res); free(dw0); free(gdx); free(gdw); free(gdxb);
    free(gdxb2); free(rdx); free(rdw);
}

static void qk_case(int T, int nh, int hd)
{
    const long xs = (long)nh * hd + 8 * gk_rng_int(0, 3), ys = (long)nh * hd + 4 * gk_rng_int(0, 3);
    const float eps = 0.25f;     /* near mean(x^2): a kernel that drops or misplaces eps fails */
    float *x, *w, inv[256];
    uint16_t *hx = gk_rand_bf16((size_t)T * xs, 2.0f, 0.f, &x), *hw = gk_rand_bf16(hd, 0.5f, 1.0f, &w);
    float *dy = rand_f32((size_t)T * ys, 1.0f);
    int32_t *pos = malloc(4 * (size_t)T);
    for (int t = 0; t < T; t++) pos[t] = gk_rng_int(0, 4000);
    CHECK_OK(gk_rope_inv_freq(inv, hd, 1e6, NULL));
    void *dx_ = gk_dev_upload(hx, (size_t)T * xs * 2), *dw_ = gk_dev_upload(hw, hd * 2);
    float *ddy = gk_dev_upload(dy, (size_t)T * ys * 4), *dinv = gk_dev_upload(inv, hd / 2 * 4), *ddw;
    int32_t *dpos = gk_dev_upload(pos, 4 * (size_t)T);
    CUDA_CHECK(cudaMalloc((void **)&ddw, hd * 4));
    CUDA_CHECK(cudaMemset(ddw, 0, hd * 4));
    void *ddx = gk_dev_poisoned((size_t)T * xs);
    float *ws = ws_alloc(hd), *ddw2;
    CUDA_CHECK(cudaMalloc((void **)&ddw2, hd * 4));
    CUDA_CHECK(cudaMemset(ddw2, 0, hd * 4));
    CHECK_INT(gk_qknorm_rope_bwd(ddy, ys, dx_, xs, ddx, xs, dw_, ddw, ws, T, nh, hd, dpos, dinv, eps, 0), ==, 0);
    CHECK_INT(gk_qknorm_rope_bwd(ddy, ys, dx_, xs, ddx, xs, dw_, ddw2, ws, T, nh, hd, dpos, dinv, eps, 0), ==, 0);
    check_same_bits(ddw, ddw2, hd, "qknorm_rope_bwd");
    float *gdx = gk_dev_download_f32(ddx, (size_t)T * xs), *gdw = dl_f32(ddw, hd);
    double *rdx = malloc(8 * (size_t)T * xs), *rdw = calloc(hd, 8), g[512];
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *xh = x + (size_t)t * xs + h * hd, *dyh = dy + (size_t)t * ys + h * hd;
            double ss = 0, c = 0;
            for (int i = 0; i < hd; i++) ss += (double)xh[i] * xh[i];
            double ri = 1 / sqrt(ss / hd + eps);
            for (int i = 0; i < half; i++) {
                double a = (double)(float)((float)pos[t] * inv[i]), cs = cos(a), sn = sin(a);
                g[i] = dyh[i] * cs + dyh[i + half] * sn;
                g[i + half] = dyh[i + half] * cs - dyh[i] * sn;
            }
            for (int i = 0; i < hd; i++) {
                c += g[i] * w[i] * xh[i] * ri;
                rdw[i] += g[i] * xh[i] * ri;
            }
            c /= hd;
            for (int i = 0; i < hd; i++) rdx[(size_t)t * xs + h * hd + i] = ri * (g[i] * w[i] - xh[i] * ri * c);
        }
    double e = gk_rel_err(gdx, xs, rdx, xs, T, (long)nh * hd), ew = gk_rel_err(gdw, hd, rdw, hd, 1, hd);
    printf("qknorm_rope_bwd T %d heads %d hd %d: dx rel err %.1e, dw %.1e\n", T, nh, hd, e, ew);
    CHECK(e < 1e-2 && ew < 1e-5);
    for (int t = 0; t < T; t++)     /* the columns past the heads stay as they were (poisoned: NaN) */
        for (long c = (long)nh * hd; c < xs; c++)
            if (!isnan(gdx[(size_t)t * xs + c])) TEST_FAIL("qknorm_rope_bwd wrote past the heads of row %d", t);
    cudaFree(dx_); cudaFree(dw_); cudaFree(ddy); cudaFree(dinv); cudaFree(ddw); cudaFree(ddw2); cudaFree(dpos);
    cudaFree(ddx); cudaFree(ws);
    free(hx); free(hw); free(x); free(w); free(dy); free(pos); free(gdx); free(gdw); free(rdx); free(rdw);
}

static void swiglu_case(void)
{
    const int rows = gk_rng_int(1, 500), I = 8 * gk_rng_int(1, 300);
    float *dz, *gu;
    uint16_t *hdz = gk_rand_bf16((size_t)rows * I, 1.0f, 0.f, &dz), *hgu = gk_rand_bf16((size_t)rows * 2 * I, 4.0f, 0.f, &gu);
    void *ddz = gk_dev_upload(hdz, (size_t)rows * I * 2), *dgu = gk_dev_upload(hgu, (size_t)rows * 2 * I * 2);
    void *dout = gk_dev_poisoned((size_t)rows * 2 * I);
    CHECK_INT(gk_swiglu_bwd(ddz, I, dgu, (uint16_t *)dgu + I, 2 * I, dout, (uint16_t *)dout + I, 2 * I, rows, I, 0), ==, 0);
    float *out = gk_dev_download_f32(dout, (size_t)rows * 2 * I);
    double *ref = malloc(8 * (size_t)rows * 2 * I);
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < I; i++) {
            double gg = gu[(size_t)r * 2 * I + i], u = gu[(size_t)r * 2 * I + I + i], d = dz[(size_t)r * I + i];
            double s = 1 / (1 + exp(-gg));
            ref[(size_t)r * 2 * I + i] = d * u * s * (1 + gg * (1 - s));
            ref[(size_t)r * 2 * I + I + i] = d * gg * s;
        }
    double e = gk_rel_err(out, 2 * I, ref, 2 * I, rows, 2 * I);
    printf("swiglu_bwd rows %d I %d: rel err %.1e\n", rows, I, e);
    CHECK(e < 1e-2);
    cudaFree(ddz); cudaFree(dgu); cudaFree(dout);
    free(hdz); free(hgu); free(dz); free(gu); free(out); free(ref);
}

int main(void)
{
    gk_test_require_gpu();
    gk_rng_seed();
    rms_case(gk_rng_int(600, 1200), 12288);     /* 4 vectors of 8 a thread, 384 threads */
    rms_case(8192, 4096);                       /* the drafter's shape: 16 rows per CTA */
    qk_case(3000, 32, 128);                     /* more items than the grid: several a warp */
    qk_case(gk_rng_int(1, 300), 30, 128);       /* a partial group of heads */
    qk_case(gk_rng_int(1, 300), 7, 20);         /* head_dim a multiple of 4, not of 8 */
    qk_case(gk_rng_int(1, 300), 5, 96);
    qk_case(gk_rng_int(1, 700), gk_rng_int(1, 8), 256);     /* two and four pairs a lane */
    qk_case(gk_rng_int(1, 700), gk_rng_int(1, 8), 512);
    for (int i = 0; i < 3; i++) {
        rms_case(gk_rng_int(1, 3000), 8 * gk_rng_int(1, 520));
        qk_case(gk_rng_int(1, 700), gk_rng_int(1, 8), 16);
        qk_case(gk_rng_int(1, 700), gk_rng_int(1, 8), 128);
        swiglu_case();
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}
#else
int main(void) { SKIP("built without CUDA"); }
#endif
