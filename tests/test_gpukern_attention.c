/* test_gpukern_attention.c: gk_attention_prefill (tensor-core and simple kernels) against an
 * fp64 CPU reference on fresh random packed batches: GQA, sequence lengths around the 64-token
 * tiles, q/k/v as views into one fused QKV buffer, and a skewed batch at the configuration's
 * limits (65535 sequences, one of 65538 tokens) checked on a sample of rows. `--bench` times a
 * 16K-token batch; GK_TEST_QUICK=1 runs a few small cases only (for compute-sanitizer). */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include <limits.h>
#include "gpukern/attention.h"

/* Token t of the sequence starting at row start, every head: out[nh * hd]. p: scratch of t - start + 1. */
static void ref_row(const float *qkv, long stride, int start, int t, int nh, int nkv, int hd, double scale,
                    double *p, double *out)
{
    const int group = nh / nkv;
    for (int h = 0; h < nh; h++) {
        const float *q = qkv + (long)t * stride + (long)h * hd;
        int kvh = h / group;
        double mx = -INFINITY, sum = 0;
        for (int j = start; j <= t; j++) {
            const float *k = qkv + (long)j * stride + (long)(nh + kvh) * hd;
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)q[i] * k[i];
            p[j - start] = d * scale;
            if (p[j - start] > mx) mx = p[j - start];
        }
        for (int j = start; j <= t; j++) { p[j - start] = exp(p[j - start] - mx); sum += p[j - start]; }
        double *o = out + (long)h * hd;
        for (int i = 0; i < hd; i++) o[i] = 0;
        for (int j = start; j <= t; j++) {
            const float *v = qkv + (long)j * stride + (long)(nh + nkv + kvh) * hd;
            for (int i = 0; i < hd; i++) o[i] += p[j - start] / sum * v[i];
        }
    }
}

static void ref_attention(const float *qkv, long stride, const int *cu, int n_seqs, int nh, int nkv, int hd,
                          double scale, double *ref)
{
    int maxlen = 0;
    for (int s = 0; s < n_seqs; s++) if (cu[s + 1] - cu[s] > maxlen) maxlen = cu[s + 1] - cu[s];
    double *p = malloc(sizeof(double) * (maxlen + 1));
    for (int s = 0; s < n_seqs; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++)
            ref_row(qkv, stride, cu[s], t, nh, nkv, hd, scale, p, ref + (long)t * nh * hd);
    free(p);
}

static void one(int hd, int nh, int nkv, int impl, const int *lens, int n_seqs)
{
    int cu[64] = {0};
    for (int s = 0; s < n_seqs; s++)
        cu[s + 1] = cu[s] + lens[s];
    const int T = cu[n_seqs];
    const long stride = (long)(nh + 2 * nkv) * hd, os = (long)nh * hd + 8 * gk_rng_int(0, 2);
    float *qkv;
    uint16_t *h = gk_rand_bf16((size_t)T * stride, 2.0f, 0.f, &qkv);
    uint16_t *d = gk_dev_upload(h, (size_t)T * stride * 2);
    int32_t *dcu = gk_dev_upload(cu, sizeof(int32_t) * (n_seqs + 1));
    void *dout = gk_dev_poisoned((size_t)T * os);
    const double scale = 1.0 / sqrt(hd);
    CHECK_INT(gk_attention_prefill(d, stride, d + (long)nh * hd, stride, d + (long)(nh + nkv) * hd, stride, dout, os,
                                   dcu, n_seqs, T, nh, nkv, hd, (float)scale, impl, 0), ==, 0);
    float *out = gk_dev_download_f32(dout, (size_t)T * os);
    double *ref = malloc(sizeof(double) * T * nh * hd);
    ref_attention(qkv, stride, cu, n_seqs, nh, nkv, hd, scale, ref);
    double e = gk_rel_err(out, os, ref, (long)nh * hd, T, (long)nh * hd);
    /* per-row check too: a wrong mask on a few rows must not hide in the global norm */
    double worst = 0;
    for (int t = 0; t < T; t++) {
        double er = gk_rel_err(out + (long)t * os, os, ref + (long)t * nh * hd, nh * hd, 1, (long)nh * hd);
        if (er > worst) worst = er;
    }
    printf("attention impl %d hd %d heads %d/%d seqs %d T %d: rel err %.2e, worst row %.2e\n", impl, hd, nh, nkv,
           n_seqs, T, e, worst);
    CHECK(e < 1e-2);
    CHECK(worst < 3e-2);
    cudaFree(d); cudaFree(dcu); cudaFree(dout);
    free(h); free(qkv); free(out); free(ref);
}

/* A skewed batch at the configuration's limits: 65534 sequences of 1 to 3 tokens around one of
 * 65538 (ring.max_seqs = 65535), so n_seqs * max_seqlen passes 2^31 and a grid over (sequence,
 * query tile) or over n_seqs * max_seqlen rows would pass CUDA's limits or leave rows unwritten.
 * Checked on a sample against the reference: the long sequence's first 70 and last 80 rows (its
 * first and last query tiles, the last one of 2 rows) and 300 tokens of short sequences on both
 * sides of it, with the first and last token of the batch. */
static void skewed(int hd, int nh, int nkv, int impl)
{
    enum { N_SHORT = 65534, LONG = 65538, N_RAND = 300 };
    const int n_seqs = N_SHORT + 1, at = N_SHORT / 2;   /* the long sequence's index */
    int *cu = malloc(sizeof(int) * (n_seqs + 1));
    CHECK(cu);
    cu[0] = 0;
    for (int s = 0; s < n_seqs; s++)
        cu[s + 1] = cu[s] + (s == at ? LONG : gk_rng_int(1, 3));
    const int T = cu[n_seqs], L0 = cu[at], L1 = cu[at + 1];
    CHECK((long)n_seqs * LONG > INT_MAX);
    const long stride = (long)(nh + 2 * nkv) * hd, os = (long)nh * hd;
    float *qkv;
    uint16_t *h = gk_rand_bf16((size_t)T * stride, 2.0f, 0.f, &qkv);
    uint16_t *d = gk_dev_upload(h, (size_t)T * stride * 2);
    int32_t *dcu = gk_dev_upload(cu, sizeof(int32_t) * (n_seqs + 1));
    void *dout = gk_dev_poisoned((size_t)T * os);
    const double scale = 1.0 / sqrt(hd);
    double t0 = gk_now();
    CHECK_INT(gk_attention_prefill(d, stride, d + (long)nh * hd, stride, d + (long)(nh + nkv) * hd, stride, dout, os,
                                   dcu, n_seqs, T, nh, nkv, hd, (float)scale, impl, 0), ==, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    double t1 = gk_now();
    float *out = gk_dev_download_f32(dout, (size_t)T * os);

    /* the sample: (sequence, token) pairs */
    int n = 0, cap = 70 + 80 + N_RAND + 2;
    int *seq = malloc(sizeof(int) * cap), *tok = malloc(sizeof(int) * cap);
    CHECK(seq && tok);
    for (int t = L0; t < L0 + 70; t++) { seq[n] = at; tok[n++] = t; }
    for (int t = L1 - 80; t < L1; t++) { seq[n] = at; tok[n++] = t; }
    seq[n] = 0; tok[n++] = 0;
    seq[n] = n_seqs - 1; tok[n++] = T - 1;
    for (int i = 0; i < N_RAND; i++) {
        int s = gk_rng_int(0, n_seqs - 2);
        if (s >= at) s++;
        seq[n] = s;
        tok[n++] = gk_rng_int(cu[s], cu[s + 1] - 1);
    }
    double *p = malloc(sizeof(double) * (LONG + 1));
    float *got = malloc(sizeof(float) * (size_t)n * os);
    double *want = malloc(sizeof(double) * (size_t)n * os);
    CHECK(p && got && want);
    double worst = 0;
    int worst_tok = -1;
    for (int i = 0; i < n; i++) {
        ref_row(qkv, stride, cu[seq[i]], tok[i], nh, nkv, hd, scale, p, want + (long)i * os);
        memcpy(got + (long)i * os, out + (long)tok[i] * os, sizeof(float) * os);
        double er = gk_rel_err(got + (long)i * os, os, want + (long)i * os, os, 1, os);
        if (er > worst) { worst = er; worst_tok = tok[i]; }
    }
    double e = gk_rel_err(got, os, want, os, n, os);
    printf("attention skewed impl %d hd %d heads %d/%d: %d seqs, T %d, long sequence [%d, %d): %.1f ms; "
           "%d rows checked: rel err %.2e, worst row %.2e (token %d)\n", impl, hd, nh, nkv, n_seqs, T, L0, L1,
           (t1 - t0) * 1e3, n, e, worst, worst_tok);
    CHECK(e < 1e-2);
    CHECK(worst < 3e-2);
    cudaFree(d); cudaFree(dcu); cudaFree(dout);
    free(h); free(qkv); free(out); free(cu); free(seq); free(tok); free(p); free(got); free(want);
}

static void bench(void)
{
    const int nh = 32, nkv = 8, hd = 128;
    int lens[64], n = 0, T = 0, cu[65] = {0};
    while (T < 16384 - 512 && n < 64) {
        int l = gk_rng_int(512, 3072);
        if (T + l > 16384) l = 16384 - T;
        lens[n] = l; T += l; cu[n + 1] = T; n++;
    }
    const long stride = (long)(nh + 2 * nkv) * hd, os = (long)nh * hd;
    uint16_t *h = gk_rand_bf16((size_t)T * stride, 2.0f, 0.f, NULL);
    uint16_t *d = gk_dev_upload(h, (size_t)T * stride * 2);
    int32_t *dcu = gk_dev_upload(cu, sizeof(int32_t) * (n + 1));
    void *dout = gk_dev_poisoned((size_t)T * os);
    double flops = 0;
    for (int s = 0; s < n; s++) flops += 4.0 * hd * nh * (double)lens[s] * (lens[s] + 1) / 2;
    for (int impl = GK_ATTN_MMA; impl >= GK_ATTN_SIMPLE; impl--) {
        cudaEvent_t e0, e1;
        CUDA_CHECK(cudaEventCreate(&e0));
        CUDA_CHECK(cudaEventCreate(&e1));
        int reps = impl == GK_ATTN_MMA ? 20 : 1;
        CHECK_INT(gk_attention_prefill(d, stride, d + nh * hd, stride, d + (nh + nkv) * hd, stride, dout, os, dcu, n,
                                       T, nh, nkv, hd, 0.088f, impl, 0), ==, 0);
        CUDA_CHECK(cudaEventRecord(e0, 0));
        for (int i = 0; i < reps; i++)
            gk_attention_prefill(d, stride, d + nh * hd, stride, d + (nh + nkv) * hd, stride, dout, os, dcu, n,
                                 T, nh, nkv, hd, 0.088f, impl, 0);
        CUDA_CHECK(cudaEventRecord(e1, 0));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= reps;
        printf("BENCH attention impl %s T %d seqs %d heads 32/8 hd 128: %.3f ms, %.1f TFLOP/s\n",
               impl == GK_ATTN_MMA ? "mma" : "simple", T, n, ms, flops / (ms * 1e-3) / 1e12);
        cudaEventDestroy(e0); cudaEventDestroy(e1);
    }
    cudaFree(d); cudaFree(dcu); cudaFree(dout);
    free(h);
}

int main(int argc, char **argv)
{
    gk_test_require_gpu();
    gk_rng_seed();
    if (argc > 1 && !strcmp(argv[1], "--bench")) { bench(); return 0; }
    const int edge[] = {1, 63, 64, 65, 127, 128, 129, 2, 200};
    const int ne = sizeof(edge) / sizeof(edge[0]);
    int lens[16];
    if (getenv("GK_TEST_QUICK")) {  /* small cases, for compute-sanitizer runs */
        one(128, 4, 2, GK_ATTN_MMA, edge, ne);
        one(64, 2, 1, GK_ATTN_MMA, edge, 6);
        one(128, 2, 1, GK_ATTN_SIMPLE, edge, 6);
        CUDA_CHECK(cudaDeviceSynchronize());
        return 0;
    }
    for (int impl = GK_ATTN_SIMPLE; impl <= GK_ATTN_MMA; impl++) {
        one(128, 8, 2, impl, edge, ne);
        one(64, 4, 4, impl, edge, ne);
        for (int rep = 0; rep < 2; rep++) {
            int n = gk_rng_int(1, 6);
            for (int s = 0; s < n; s++) lens[s] = gk_rng_int(1, 600);
            one(rep ? 64 : 128, 8, rep ? 8 : 1, impl, lens, n);
        }
    }
    skewed(96, 2, 1, GK_ATTN_AUTO);             /* the simple kernel (no tensor-core one for 96) */
    skewed(128, 2, 1, GK_ATTN_MMA);
    one(32, 4, 2, GK_ATTN_AUTO, edge, ne);     /* head_dim with no tensor-core kernel */
    one(16, 2, 1, GK_ATTN_AUTO, edge, 4);
    one(256, 2, 1, GK_ATTN_SIMPLE, edge, 5);
    /* empty sequences inside a batch */
    int withzero[] = {70, 0, 5, 0, 130};
    one(128, 4, 2, GK_ATTN_MMA, withzero, 5);
    one(128, 4, 2, GK_ATTN_SIMPLE, withzero, 5);
    int cu1[2] = {0, 8};
    CHECK_INT(gk_attention_prefill((void *)256, 96, (void *)256, 96, (void *)256, 96, (void *)256, 96, cu1, 1, 8, 6,
                                   4, 16, 0.25f, GK_ATTN_AUTO, 0), ==, -EINVAL);  /* 6 % 4 != 0 */
    CHECK_INT(gk_attention_prefill((void *)256, 96, (void *)256, 96, (void *)256, 96, (void *)256, 96, cu1, 1, 8, 6,
                                   3, 16, 0.25f, GK_ATTN_MMA, 0), ==, -EINVAL);   /* no mma kernel for 16 */
    CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}
#else
int main(int argc, char **argv) { (void)argc; (void)argv; SKIP("built without CUDA"); }
#endif
