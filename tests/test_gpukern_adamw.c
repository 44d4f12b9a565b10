/* test_gpukern_adamw.c: gradient norm / clip factor (host or device scale), AdamW (against model/optim.c, the CPU
 * optimizer) with decay and no-decay segments over several steps, the NaN guard, the bf16 cast. */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include "gpukern/adamw.h"
#include "model/optim.h"

int main(void)
{
    gk_test_require_gpu();
    gk_rng_seed();
    const size_t n = 1000003;
    float *w = malloc(n * 4), *g = malloc(n * 4), *hw = malloc(n * 4), *hm = malloc(n * 4), *hv = malloc(n * 4);
    uint16_t *hb = malloc(n * 2);
    CHECK(w && g && hw && hm && hv && hb);
    for (size_t i = 0; i < n; i++) {
        w[i] = gk_rng_uniform();
        g[i] = gk_rng_uniform() * 1e-2f;
    }
    /* segments of random lengths, alternating decay */
    struct optim_segment seg[64];
    gk_adamw_seg gseg[64];
    int ns = 0;
    for (size_t off = 0; off < n; ns++) {
        size_t len = ns == 63 ? n - off : (size_t)gk_rng_int(1, 60000);
        if (len > n - off) len = n - off;
        seg[ns] = (struct optim_segment){ off, len, ns % 2 == 0 };
        gseg[ns] = (gk_adamw_seg){ off, len, ns % 2 == 0, 0 };
        off += len;
    }
    struct optim o;
    CHECK_OK(optim_init(&o, n, seg, ns));
    float *dw_, *dg, *dm, *dv, *dclip;
    double *work;
    void *dwb = gk_dev_poisoned(n);
    CUDA_CHECK(cudaMalloc((void **)&dw_, n * 4));
    CUDA_CHECK(cudaMalloc((void **)&dg, n * 4));
    CUDA_CHECK(cudaMalloc((void **)&dm, n * 4));
    CUDA_CHECK(cudaMalloc((void **)&dv, n * 4));
    CUDA_CHECK(cudaMalloc((void **)&dclip, 16));
    CUDA_CHECK(cudaMalloc((void **)&work, GK_GRAD_CLIP_WORK * sizeof(double)));
    void *dseg = gk_dev_upload(gseg, sizeof(gk_adamw_seg) * ns);
    CUDA_CHECK(cudaMemcpy(dw_, w, n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dm, 0, n * 4));
    CUDA_CHECK(cudaMemset(dv, 0, n * 4));

    /* the norm and the clip factor */
    CUDA_CHECK(cudaMemcpy(dg, g, n * 4, cudaMemcpyHostToDevice));
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    float clip_out[3];
    const float scale = 0.37f;
    double norm = sqrt(ss) * scale;
    CHECK_INT(gk_grad_clip(dg, n, scale, (float)(norm / 2), work, dclip, 0), ==, 0);
    CUDA_CHECK(cudaMemcpy(clip_out, dclip, 12, cudaMemcpyDeviceToHost));
    printf("norm %.9g (ref %.9g), factor %.9g (ref %.9g)\n", clip_out[0], norm, clip_out[1],
           scale * (norm / 2) / (norm + 1e-6));
    CHECK_NEAR(clip_out[0], norm, 1e-6 * norm);
    CHECK_NEAR(clip_out[1], scale * (norm / 2) / (norm + 1e-6), 1e-6 * scale);
    CHECK(clip_out[2] == 1.f);
    CHECK_INT(gk_grad_clip(dg, n, scale, (float)(norm * 2), work, dclip, 0), ==, 0);
    CUDA_CHECK(cudaMemcpy(clip_out, dclip, 12, cudaMemcpyDeviceToHost));
    CHECK_NEAR(clip_out[1], scale, 1e-7);

    /* the same with the scale from a device weight sum; a non-finite loss or no weight: no step */
    {
        double hd[2] = { 1.0 / scale, 2.5 }, *dd;
        float c4[4];
        CUDA_CHECK(cudaMalloc((void **)&dd, sizeof hd));
        CUDA_CHECK(cudaMemcpy(dd, hd, sizeof hd, cudaMemcpyHostToDevice));
        CHECK_INT(gk_grad_clip_dev(dg, n, dd, dd + 1, (float)(norm / 2), work, dclip, 0), ==, 0);
        CUDA_CHECK(cudaMemcpy(c4, dclip, 16, cudaMemcpyDeviceToHost));
        CHECK_NEAR(c4[0], norm, 1e-6 * norm);
        CHECK_NEAR(c4[1], scale * (norm / 2) / (norm + 1e-6), 1e-6 * scale);
        CHECK(c4[2] == 1.f && c4[3] == 1.f);
        hd[1] = NAN;
        CUDA_CHECK(cudaMemcpy(dd, hd, sizeof hd, cudaMemcpyHostToDevice));
        CHECK_INT(gk_grad_clip_dev(dg, n, dd, dd + 1, 0.0f, work, dclip, 0), ==, 0);
        CUDA_CHECK(cudaMemcpy(c4, dclip, 16, cudaMemcpyDeviceToHost));
        CHECK(c4[2] == 0.f && c4[3] == 1.f);
        hd[0] = 0.0;
        hd[1] = 0.0;
        CUDA_CHECK(cudaMemcpy(dd, hd, sizeof hd, cudaMemcpyHostToDevice));
        CHECK_INT(gk_grad_clip_dev(dg, n, dd, NULL, 0.0f, work, dclip, 0), ==, 0);
        CUDA_CHECK(cudaMemcpy(c4, dclip, 16, cudaMemcpyDeviceToHost));
        CHECK(c4[2] == 0.f && c4[3] == 0.f);
        cudaFree(dd);
    }

    /* AdamW steps with unscaled gradients (scale 1, no clip), as optim_adamw takes them */
    const double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    for (int step = 1; step <= 3; step++) {
        for (size_t i = 0; i < n; i++) g[i] = gk_rng_uniform() * 1e-2f;
        CUDA_CHECK(cudaMemcpy(dg, g, n * 4, cudaMemcpyHostToDevice));
        CHECK_INT(gk_grad_clip(dg, n, 1.0f, 0.0f, work, dclip, 0), ==, 0);
        double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
        CHECK_INT(gk_adamw(dw_, dg, dm, dv, dwb, n, dseg, ns, dclip, (float)lr, (float)b1, (float)b2, (float)eps,
                           (float)wd, (float)(lr / bc1), (float)(1 / sqrt(bc2)), 0), ==, 0);
        optim_adamw(&o, w, g, lr, b1, b2, eps, wd);
    }
    CUDA_CHECK(cudaMemcpy(hw, dw_, n * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hm, dm, n * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hv, dv, n * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hb, dwb, n * 2, cudaMemcpyDeviceToHost));
    /* moments relative to their largest value: a first moment that cancels to ~0 over the steps
     * has no meaningful relative error of its own */
    double ew = 0, em = 0, ev = 0, mmax = 0, vmax = 0;
    for (size_t i = 0; i < n; i++) {
        ew = fmax(ew, fabs(hw[i] - w[i]));
        em = fmax(em, fabs(hm[i] - o.m[i]));
        ev = fmax(ev, fabs(hv[i] - o.v[i]));
        mmax = fmax(mmax, fabs(o.m[i]));
        vmax = fmax(vmax, fabs(o.v[i]));
        if (hb[i] != gk_f32_to_bf16(hw[i])) TEST_FAIL("bf16 copy at %zu", i);
    }
    em /= mmax;
    ev /= vmax;
    printf("adamw 3 steps, %d segments: max |w diff| %.2e, max m diff %.2e, v diff %.2e (of the largest)\n",
           ns, ew, em, ev);
    CHECK(ew < 1e-6 && em < 1e-5 && ev < 1e-5);

    /* a NaN gradient: nothing changes */
    float nanv = NAN;
    CUDA_CHECK(cudaMemcpy(dg + 17, &nanv, 4, cudaMemcpyHostToDevice));
    CHECK_INT(gk_grad_clip(dg, n, 1.0f, 1.0f, work, dclip, 0), ==, 0);
    CHECK_INT(gk_adamw(dw_, dg, dm, dv, dwb, n, dseg, ns, dclip, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1e-3f, 1.f, 0), ==, 0);
    CUDA_CHECK(cudaMemcpy(clip_out, dclip, 12, cudaMemcpyDeviceToHost));
    CHECK(clip_out[2] == 0.f);
    CUDA_CHECK(cudaMemcpy(g, dw_, n * 4, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(g, hw, n * 4));

    /* the cast */
    CHECK_INT(gk_cast_f32_bf16(dw_, dwb, n, 0), ==, 0);
    CUDA_CHECK(cudaMemcpy(hb, dwb, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        if (hb[i] != gk_f32_to_bf16(hw[i])) TEST_FAIL("cast at %zu", i);

    optim_done(&o);
    cudaFree(dw_); cudaFree(dg); cudaFree(dm); cudaFree(dv); cudaFree(dclip); cudaFree(work); cudaFree(dwb); cudaFree(dseg);
    free(w); free(g); free(hw); free(hm); free(hv); free(hb);
    return 0;
}
#else
int main(void) { SKIP("built without CUDA"); }
#endif
