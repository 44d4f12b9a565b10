/* test_gpukern_adamw.c: gradient norm / clip factor (host or device scale), AdamW (against model/optim.c, the CPU
 * optimizer) with decay and no-decay segments over several steps, the NaN guard, the bf16 cast, the step count
 * and lr schedule kept on the device (a skipped update in between moves nothing); the norm and
 * one step on buffers at odd element offsets (a scalar head before the vector body, or the scalar kernel) with
 * segments a few elements long. */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include "gpukern/adamw.h"
#include "model/optim.h"

/* One step on views w + ow, g + og, m + om, v + ov, bf16 copy + ob of n elements, next to
 * untouched guard elements; segments 1-9 elements long first (boundaries inside a group of four). */
/* The GPU's weights and moments against the CPU optimizer's: the largest |w| difference, and the
 * moments' relative to their largest value (a first moment that cancels to ~0 over the steps has
 * no meaningful relative error of its own). */
static void diff_vs_cpu(const float *hw, const float *hm, const float *hv, const float *w, const struct optim *o,
                        size_t n, double *ew, double *em, double *ev)
{
    double mmax = 0, vmax = 0;
    *ew = *em = *ev = 0;
    for (size_t i = 0; i < n; i++) {
        *ew = fmax(*ew, fabs(hw[i] - w[i]));
        *em = fmax(*em, fabs(hm[i] - o->m[i]));
        *ev = fmax(*ev, fabs(hv[i] - o->v[i]));
        mmax = fmax(mmax, fabs(o->m[i]));
        vmax = fmax(vmax, fabs(o->v[i]));
    }
    *em /= mmax;
    *ev /= vmax;
}

static void offsets_case(int ow, int og, int om, int ov, int ob)
{
    const size_t n = 100003, pad = 8;
    float *w = malloc(n * 4), *g = malloc(n * 4), *hw = malloc((n + pad) * 4), *hm = malloc((n + pad) * 4);
    float *hv = malloc((n + pad) * 4), *sentinel = malloc((n + pad) * 4);
    uint16_t *hb = malloc((n + pad) * 2);
    CHECK(w && g && hw && hm && hv && sentinel && hb);
    for (size_t i = 0; i < n; i++) {
        w[i] = gk_rng_uniform();
        g[i] = gk_rng_uniform() * 1e-2f;
    }
    for (size_t i = 0; i < n + pad; i++) sentinel[i] = 1234.5f;
    struct optim_segment seg[64];
    gk_adamw_seg gseg[64];
    int ns = 0;
    for (size_t off = 0; off < n; ns++) {
        size_t len = ns == 63 ? n - off : ns < 40 ? (size_t)gk_rng_int(1, 9) : (size_t)gk_rng_int(1, 9000);
        if (len > n - off) len = n - off;
        seg[ns] = (struct optim_segment){ off, len, gk_rng_int(0, 1) };
        gseg[ns] = (gk_adamw_seg){ off, len, seg[ns].decay, 0 };
        off += len;
    }
    struct optim o;
    CHECK_OK(optim_init(&o, n, seg, ns));
    float *dw_, *dg, *dm, *dv, *dclip;
    double *work;
    uint16_t *dwb;
    CUDA_CHECK(cudaMalloc((void **)&dw_, (n + pad) * 4));
    CUDA_CHECK(cudaMalloc((void **)&dg, (n + pad) * 4));
    CUDA_CHECK(cudaMalloc((void **)&dm, (n + pad) * 4));
    CUDA_CHECK(cudaMalloc((void **)&dv, (n + pad) * 4));
    CUDA_CHECK(cudaMalloc((void **)&dwb, (n + pad) * 2));
    CUDA_CHECK(cudaMalloc((void **)&dclip, 16));
    CUDA_CHECK(cudaMalloc((void **)&work, GK_GRAD_CLIP_WORK * sizeof(double)));
    void *dseg = gk_dev_upload(gseg, sizeof(gk_adamw_seg) * ns);
    CUDA_CHECK(cudaMemcpy(dw_, sentinel, (n + pad) * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dm, sentinel, (n + pad) * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dv, sentinel, (n + pad) * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dwb, 0x5a, (n + pad) * 2));
    CUDA_CHECK(cudaMemcpy(dw_ + ow, w, n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dm + om, 0, n * 4));
    CUDA_CHECK(cudaMemset(dv + ov, 0, n * 4));
    CUDA_CHECK(cudaMemcpy(dg + og, g, n * 4, cudaMemcpyHostToDevice));

    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    float c3[3];
    CHECK_INT(gk_grad_clip(dg + og, n, 1.0f, 0.0f, work, dclip, 0), ==, 0);
    CUDA_CHECK(cudaMemcpy(c3, dclip, 12, cudaMemcpyDeviceToHost));
    CHECK_NEAR(c3[0], sqrt(ss), 1e-6 * sqrt(ss));
    CHECK(c3[1] == 1.f && c3[2] == 1.f);

    const double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    CHECK_INT(gk_adamw(dw_ + ow, dg + og, dm + om, dv + ov, dwb + ob, n, dseg, ns, dclip, (float)lr, (float)b1,
                       (float)b2, (float)eps, (float)wd, (float)(lr / (1 - b1)), (float)(1 / sqrt(1 - b2)), 0), ==, 0);
    optim_adamw(&o, w, g, lr, b1, b2, eps, wd);
    CUDA_CHECK(cudaMemcpy(hw, dw_, (n + pad) * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hm, dm, (n + pad) * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hv, dv, (n + pad) * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hb, dwb, (n + pad) * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n + pad; i++) {
        if ((i < (size_t)ow || i >= ow + n) && hw[i] != 1234.5f) TEST_FAIL("w guard at %zu", i);
        if ((i < (size_t)om || i >= om + n) && hm[i] != 1234.5f) TEST_FAIL("m guard at %zu", i);
        if ((i < (size_t)ov || i >= ov + n) && hv[i] != 1234.5f) TEST_FAIL("v guard at %zu", i);
        if ((i < (size_t)ob || i >= ob + n) && hb[i] != 0x5a5a) TEST_FAIL("bf16 guard at %zu", i);
    }
    double ew = 0, em = 0, ev = 0, mmax = 0, vmax = 0;
    for (size_t i = 0; i < n; i++) {
        ew = fmax(ew, fabs(hw[ow + i] - w[i]));
        em = fmax(em, fabs(hm[om + i] - o.m[i]));
        ev = fmax(ev, fabs(hv[ov + i] - o.v[i]));
        mmax = fmax(mmax, fabs(o.m[i]));
        vmax = fmax(vmax, fabs(o.v[i]));
        if (hb[ob + i] != gk_f32_to_bf16(hw[ow + i])) TEST_FAIL("bf16 copy at %zu (offsets %d %d)", i, ow, ob);
    }
    em /= mmax;
    ev /= vmax;
    printf("offsets w %d g %d m %d v %d bf16 %d, %d segments: max |w diff| %.2e, m %.2e, v %.2e\n", ow, og, om, ov,
           ob, ns, ew, em, ev);
    CHECK(ew < 1e-6 && em < 1e-5 && ev < 1e-5);
    optim_done(&o);
    cudaFree(dw_); cudaFree(dg); cudaFree(dm); cudaFree(dv); cudaFree(dwb); cudaFree(dclip); cudaFree(work);
    cudaFree(dseg);
    free(w); free(g); free(hw); free(hm); free(hv); free(sentinel); free(hb);
}

/* gk_adamw_scheduled: three updates enqueued back to back, the middle one skipped (a NaN gradient),
 * against the CPU optimizer given the first and the last: the step count (and with it the warmup lr
 * and the bias correction) moves only with the applied updates. */
static void scheduled_case(void)
{
    const size_t n = 100003;
    const int ns = 2;
    struct optim_segment seg[2] = { { 0, 40000, true }, { 40000, n - 40000, false } };
    gk_adamw_seg gseg[2] = { { 0, 40000, 1, 0 }, { 40000, n - 40000, 0, 0 } };
    const gk_adamw_sched sc = { .lr = 1e-3, .min_lr_ratio = 0.1, .warmup_steps = 4, .total_steps = 20,
                                .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1 };
    float *w = malloc(n * 4), *g[3], *hw = malloc(n * 4), *hm = malloc(n * 4), *hv = malloc(n * 4);
    CHECK(w && hw && hm && hv);
    for (size_t i = 0; i < n; i++) w[i] = gk_rng_uniform();
    struct optim o;
    CHECK_OK(optim_init(&o, n, seg, ns));
    o.step = 5;     /* a resumed optimizer: the count starts where it left off */
    float *dw_, *dm, *dv, *dg[3], *dclip[3];
    double *work;
    gk_adamw_count *dcount, count = { .step = 5 };
    CUDA_CHECK(cudaMalloc((void **)&dw_, n * 4));
    CUDA_CHECK(cudaMalloc((void **)&dm, n * 4));
    CUDA_CHECK(cudaMalloc((void **)&dv, n * 4));
    CUDA_CHECK(cudaMalloc((void **)&work, GK_GRAD_CLIP_WORK * sizeof(double)));
    CUDA_CHECK(cudaMemcpy(dw_, w, n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dm, 0, n * 4));
    CUDA_CHECK(cudaMemset(dv, 0, n * 4));
    dcount = gk_dev_upload(&count, sizeof count);
    void *dseg = gk_dev_upload(gseg, sizeof gseg);
    for (int k = 0; k < 3; k++) {
        g[k] = malloc(n * 4);
        CHECK(g[k]);
        for (size_t i = 0; i < n; i++) g[k][i] = gk_rng_uniform() * 1e-2f;
        if (k == 1) g[k][77] = NAN;
        dg[k] = gk_dev_upload(g[k], n * 4);
        CUDA_CHECK(cudaMalloc((void **)&dclip[k], 16));
    }
    for (int k = 0; k < 3; k++) {   /* no host wait in between */
        CHECK_INT(gk_grad_clip(dg[k], n, 1.0f, 0.0f, work, dclip[k], 0), ==, 0);
        CHECK_INT(gk_adamw_scheduled(dw_, dg[k], dm, dv, NULL, n, dseg, ns, dclip[k], &sc, dcount, 0), ==, 0);
    }
    CUDA_CHECK(cudaMemcpy(&count, dcount, sizeof count, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hw, dw_, n * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hm, dm, n * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hv, dv, n * 4, cudaMemcpyDeviceToHost));
    double lr5 = optim_lr(sc.lr, sc.min_lr_ratio, sc.warmup_steps, sc.total_steps, 5);
    double lr6 = optim_lr(sc.lr, sc.min_lr_ratio, sc.warmup_steps, sc.total_steps, 6);
    optim_adamw(&o, w, g[0], lr5, sc.beta1, sc.beta2, sc.eps, sc.weight_decay);
    optim_adamw(&o, w, g[2], lr6, sc.beta1, sc.beta2, sc.eps, sc.weight_decay);
    double ew, em, ev;
    diff_vs_cpu(hw, hm, hv, w, &o, n, &ew, &em, &ev);
    printf("scheduled: applied, skipped, applied from step 5: count %lld lr %.9g (cpu %.9g), max |w diff| %.2e, "
           "m %.2e, v %.2e\n", (long long)count.step, count.lr, lr6, ew, em, ev);
    CHECK_INT(count.step, ==, 7);
    CHECK_NEAR(count.lr, lr6, 1e-12 * lr6);
    CHECK(fabs(lr6 - lr5) > 1e-2 * lr5);    /* a count one off would be seen */
    CHECK(ew < 1e-6 && em < 1e-5 && ev < 1e-5);
    optim_done(&o);
    for (int k = 0; k < 3; k++) {
        cudaFree(dg[k]);
        cudaFree(dclip[k]);
        free(g[k]);
    }
    cudaFree(dw_); cudaFree(dm); cudaFree(dv); cudaFree(work); cudaFree(dcount); cudaFree(dseg);
    free(w); free(hw); free(hm); free(hv);
}

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
    double ew, em, ev;
    diff_vs_cpu(hw, hm, hv, w, &o, n, &ew, &em, &ev);
    for (size_t i = 0; i < n; i++)
        if (hb[i] != gk_f32_to_bf16(hw[i])) TEST_FAIL("bf16 copy at %zu", i);
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

    scheduled_case();
    offsets_case(0, 0, 0, 0, 0);    /* all aligned: the float4 body and a scalar tail */
    offsets_case(1, 1, 1, 1, 1);    /* a 3-element head, then aligned */
    offsets_case(2, 2, 2, 2, 2);
    offsets_case(3, 3, 3, 3, 3);
    offsets_case(1, 1, 1, 1, 0);    /* bf16 copy not 8-byte aligned after the head: scalar kernel */
    offsets_case(0, 1, 0, 0, 0);    /* g placed differently: scalar kernel */
    return 0;
}
#else
int main(void) { SKIP("built without CUDA"); }
#endif
