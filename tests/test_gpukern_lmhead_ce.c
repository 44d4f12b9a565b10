/* test_gpukern_lmhead_ce.c: the chunked LM head + weighted cross entropy (loss, argmax hit,
 * d(hidden)) and the block metrics against fp64 CPU references (logits rounded to bf16, as the
 * kernel has them) on fresh random data. */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include "gpukern/lmhead_ce.h"

static void ce_case(gk_gemmx *gx, int Q, int H, int V, int bs, int chunk)
{
    float *hid, *lm;
    uint16_t *hh = gk_rand_bf16((size_t)Q * H, 2.0f, 0.f, &hid), *hl = gk_rand_bf16((size_t)V * H, 0.3f, 0.f, &lm);
    int32_t *rows = malloc(sizeof(int32_t) * Q), *labels = malloc(sizeof(int32_t) * Q);
    float *w = malloc(sizeof(float) * Q);
    int R = 0;
    for (int r = 0; r < Q; r++) {
        int sup = r % bs != 0 && gk_rng_int(0, 5) != 0;
        w[r] = sup ? (float)exp(-(r % bs - 1) / 7.0) : 0.f;
        labels[r] = sup ? gk_rng_int(0, V - 1) : -1;
        if (sup) rows[R++] = r;
    }
    void *dh = gk_dev_upload(hh, (size_t)Q * H * 2), *dl = gk_dev_upload(hl, (size_t)V * H * 2);
    void *drows = gk_dev_upload(rows, sizeof(int32_t) * (R ? R : 1)), *dlab = gk_dev_upload(labels, sizeof(int32_t) * Q);
    void *dw = gk_dev_upload(w, sizeof(float) * Q);
    size_t wb = gk_lmhead_ce_work_bytes(chunk, H, V);
    void *work;
    float *dloss, *ddh;
    uint8_t *dhit;
    double *dmet, *dbl;
    int nb = Q / bs;
    CUDA_CHECK(cudaMalloc(&work, wb));
    CUDA_CHECK(cudaMalloc((void **)&dloss, sizeof(float) * Q));
    CUDA_CHECK(cudaMalloc((void **)&ddh, sizeof(float) * Q * H));
    CUDA_CHECK(cudaMalloc((void **)&dhit, Q));
    CUDA_CHECK(cudaMalloc((void **)&dmet, sizeof(double) * 4));
    CUDA_CHECK(cudaMalloc((void **)&dbl, sizeof(double) * nb));
    CUDA_CHECK(cudaMemset(ddh, 0xff, sizeof(float) * Q * H));     /* NaN: every row must be written */
    double t0 = gk_now();
    CHECK_INT(gk_lmhead_ce(gx, 0, dh, Q, H, dl, V, drows, R, dlab, dw, chunk, work, dloss, dhit, ddh), ==, 0);
    CHECK_INT(gk_block_metrics(dloss, dhit, dw, nb, bs, dmet, dbl, 0), ==, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    double t1 = gk_now();
    float *loss = malloc(sizeof(float) * Q), *gdh = malloc(sizeof(float) * Q * H);
    uint8_t *hit = malloc(Q);
    double met[4], *bl = malloc(sizeof(double) * nb);
    CUDA_CHECK(cudaMemcpy(loss, dloss, sizeof(float) * Q, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(gdh, ddh, sizeof(float) * Q * H, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hit, dhit, Q, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(met, dmet, sizeof met, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(bl, dbl, sizeof(double) * nb, cudaMemcpyDeviceToHost));

    double *lg = malloc(sizeof(double) * V), *rdh = calloc((size_t)Q * H, sizeof(double));
    double lnum = 0, lden = 0;
    int hit_checked = 0;
    for (int r = 0; r < Q; r++) {
        if (!(w[r] > 0)) {
            CHECK(loss[r] == 0.f && hit[r] == 0);
            continue;
        }
        double mx = -INFINITY, second = -INFINITY, sum = 0;
        int arg = 0;
        for (int j = 0; j < V; j++) {
            double s = 0;
            for (int e = 0; e < H; e++) s += (double)hid[(size_t)r * H + e] * lm[(size_t)j * H + e];
            s = gk_bf16_to_f32(gk_f32_to_bf16((float)s));     /* the kernel's logits are bf16 */
            lg[j] = s;
            if (s > mx) { second = mx; mx = s; arg = j; }
            else if (s > second) second = s;
        }
        for (int j = 0; j < V; j++) sum += exp(lg[j] - mx);
        double lse = mx + log(sum), ref = w[r] * (lse - lg[labels[r]]);
        lnum += fabs(loss[r] - ref);
        lden += fabs(ref);
        if (mx - second > fabs(mx) / 64) {     /* apart by more than the rounding of either */
            CHECK_INT(hit[r], ==, arg == labels[r]);
            hit_checked++;
        }
        for (int j = 0; j < V; j++) {
            double d = w[r] * (exp(lg[j] - lse) - (j == labels[r]));
            for (int e = 0; e < H; e++) rdh[(size_t)r * H + e] += d * lm[(size_t)j * H + e];
        }
    }
    double edh = gk_rel_err(gdh, H, rdh, H, Q, H);
    /* metrics from the GPU's own row losses and hits, recomputed on the host */
    double ls = 0, corr = 0, acc = 0, accn = 0;
    for (int b = 0; b < nb; b++) {
        double s = 0;
        int any = 0, run = 0, alive = 1;
        for (int k = 0; k < bs; k++) {
            int r = b * bs + k, sup = w[r] > 0, ok = sup && hit[r];
            s += loss[r];
            corr += ok;
            if (k == 0) continue;
            any |= sup;
            if (alive && ok) run++;
            else alive = 0;
        }
        CHECK_NEAR(bl[b], s, 1e-9 * (fabs(s) + 1));
        ls += s;
        if (any) { acc += 1 + run; accn++; }
    }
    printf("Q %d H %d V %d chunk %d rows %d: loss rel err %.1e, dhidden rel err %.1e, hits checked %d, %.2f ms\n",
           Q, H, V, chunk, R, lnum / lden, edh, hit_checked, (t1 - t0) * 1e3);
    CHECK(lnum <= 1e-4 * lden);
    CHECK(edh < 1e-2);
    CHECK_NEAR(met[0], ls, 1e-9 * fabs(ls));
    CHECK_NEAR(met[1], corr, 0);
    CHECK_NEAR(met[2], acc, 0);
    CHECK_NEAR(met[3], accn, 0);

    cudaFree(dh); cudaFree(dl); cudaFree(drows); cudaFree(dlab); cudaFree(dw); cudaFree(work); cudaFree(dloss);
    cudaFree(ddh); cudaFree(dhit); cudaFree(dmet); cudaFree(dbl);
    free(hh); free(hl); free(hid); free(lm); free(rows); free(labels); free(w); free(loss); free(gdh); free(hit);
    free(bl); free(lg); free(rdh);
}

int main(void)
{
    gk_test_require_gpu();
    gk_rng_seed();
    gk_gemmx *gx = NULL;
    char err[256] = "";
    if (gk_gemmx_create(&gx, err, sizeof err) < 0) TEST_FAIL("%s", err);
    ce_case(gx, 64, 48, 97, 4, 7);
    ce_case(gx, 256, 256, 1003, 16, 64);
    ce_case(gx, 512, 128, 4096, 16, 1000);
    gk_gemmx_free(gx);
    return 0;
}
#else
int main(void) { SKIP("built without CUDA"); }
#endif
