/* test_gpukern_dflash_attn.c: DFlash block attention forward and backward against an fp64 CPU
 * reference on fresh random data (several sequences, unsorted blocks, contexts of many key tiles,
 * GQA, head_dim 16/32/64/128/256; 70000 short sequences: more key tiles than a grid's y dimension
 * holds), the CUDA-core and the tensor-core kernels; the backward's key-tile plan checked on the
 * host (runs without a GPU). --bench: speed of both at the drafter bench's shape. */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include "gpukern/dflash_attn.h"

struct problem {
    int n_seqs, T, nb, bs, nh, nkv, hd;
    int32_t cu[9];
    gk_dflash_block *blk;
};

/* Random sequences and anchors (blocks shuffled, so the plan must group them itself). */
static void make_problem(struct problem *p, int n_seqs, int max_len, int bs)
{
    p->n_seqs = n_seqs;
    p->bs = bs;
    p->cu[0] = 0;
    for (int s = 0; s < n_seqs; s++)
        p->cu[s + 1] = p->cu[s] + gk_rng_int(1, max_len);
    p->T = p->cu[n_seqs];
    p->blk = malloc(sizeof *p->blk * (size_t)p->T);
    p->nb = 0;
    for (int s = 0; s < n_seqs; s++) {
        int len = p->cu[s + 1] - p->cu[s], k = gk_rng_int(0, len < 12 ? len : 12);
        for (int i = 0; i < k; i++)
            p->blk[p->nb++] = (gk_dflash_block){ p->cu[s], p->cu[s] + gk_rng_int(0, len - 1) };
    }
    for (int i = p->nb - 1; i > 0; i--) {
        int j = gk_rng_int(0, i);
        gk_dflash_block t = p->blk[i]; p->blk[i] = p->blk[j]; p->blk[j] = t;
    }
}

/* Every (block, context key it sees) pair lies in exactly one tile listing that block; every
 * block's own keys in exactly one tile. */
static void check_plan(const struct problem *p, const int32_t *qlist, const gk_dflash_ktile *tiles, int nt)
{
    int *seen = calloc((size_t)p->nb * (p->T + 1), sizeof *seen);
    CHECK(seen);
    for (int t = 0; t < nt; t++) {
        const gk_dflash_ktile *k = &tiles[t];
        if (k->key0 < 0) {
            int b = -1 - k->key0;
            CHECK(b < p->nb && k->n_keys == p->bs && k->q0 == b && k->q1 == b + 1);
            seen[(size_t)b * (p->T + 1) + p->T]++;
            continue;
        }
        CHECK(k->n_keys >= 1 && k->n_keys <= GK_DFLASH_KEY_TILE && k->q0 <= k->q1 && k->q1 <= p->nb);
        for (int q = k->q0; q < k->q1; q++) {
            int b = qlist[q];
            CHECK(k->key0 >= p->blk[b].ctx0);
            for (int j = k->key0; j < k->key0 + k->n_keys; j++)
                if (j < p->blk[b].ctx_end)
                    seen[(size_t)b * (p->T + 1) + j]++;
        }
    }
    for (int b = 0; b < p->nb; b++) {
        CHECK_INT(seen[(size_t)b * (p->T + 1) + p->T], ==, 1);
        for (int j = 0; j < p->T; j++) {
            int want = j >= p->blk[b].ctx0 && j < p->blk[b].ctx_end;
            if (seen[(size_t)b * (p->T + 1) + j] != want)
                TEST_FAIL("block %d key %d covered %d times (want %d)", b, j, seen[(size_t)b * (p->T + 1) + j], want);
        }
    }
    free(seen);
}

static void plan_tests(void)
{
    for (int it = 0; it < 50; it++) {
        struct problem p;
        make_problem(&p, gk_rng_int(1, 8), gk_rng_int(1, 400), gk_rng_int(1, 16));
        int max = gk_dflash_max_tiles(p.T, p.nb);
        int32_t *ql = malloc(sizeof *ql * (size_t)(p.nb + 1));
        gk_dflash_ktile *tiles = malloc(sizeof *tiles * (size_t)max);
        int nt = gk_dflash_plan(p.blk, p.nb, p.bs, p.T, ql, tiles, max);
        CHECK(nt >= p.nb);
        check_plan(&p, ql, tiles, nt);
        free(ql);
        free(tiles);
        free(p.blk);
    }
    /* overlapping sequences are refused */
    gk_dflash_block bad[2] = { { 0, 10 }, { 5, 12 } };
    int32_t ql[2];
    gk_dflash_ktile tl[16];
    CHECK_INT(gk_dflash_plan(bad, 2, 4, 20, ql, tl, 16), ==, -EINVAL);
    printf("plan: 50 random batches covered exactly once\n");
}

/* fp64 reference of one block/head: scores over [context keys, own keys] */
static void reference(const struct problem *p, const float *q, long qs, const float *kc, const float *vc,
                      const float *kb, const float *vb, long kvs, const float *dout, long ds, double *o,
                      double *lse, double *dq, double *dkc, double *dvc, double *dkb, double *dvb)
{
    int grp = p->nh / p->nkv, hd = p->hd, qd = p->nh * hd, kvd = p->nkv * hd;
    double scale = 1.0 / sqrt((double)hd);
    memset(dkc, 0, sizeof(double) * p->T * kvd);
    memset(dvc, 0, sizeof(double) * p->T * kvd);
    memset(dkb, 0, sizeof(double) * p->nb * p->bs * kvd);
    memset(dvb, 0, sizeof(double) * p->nb * p->bs * kvd);
    int maxk = p->T + p->bs;
    double *pr = malloc(sizeof(double) * maxk), *dp = malloc(sizeof(double) * maxk);
    for (int b = 0; b < p->nb; b++)
        for (int i = 0; i < p->bs; i++)
            for (int h = 0; h < p->nh; h++) {
                int g = h / grp, r = b * p->bs + i, c0 = p->blk[b].ctx0, nc = p->blk[b].ctx_end - c0, nk = nc + p->bs;
                const float *qr = q + (long)r * qs + h * hd, *dor = dout + (long)r * ds + h * hd;
#define KROW(j) ((j) < nc ? kc + (long)(c0 + (j)) * kvs + g * hd : kb + (long)(b * p->bs + (j) - nc) * kvs + g * hd)
#define VROW(j) ((j) < nc ? vc + (long)(c0 + (j)) * kvs + g * hd : vb + (long)(b * p->bs + (j) - nc) * kvs + g * hd)
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < nk; j++) {
                    const float *kr = KROW(j);
                    double s = 0;
                    for (int e = 0; e < hd; e++) s += (double)qr[e] * kr[e];
                    pr[j] = s * scale;
                    mx = fmax(mx, pr[j]);
                }
                for (int j = 0; j < nk; j++) sum += exp(pr[j] - mx);
                lse[(long)r * p->nh + h] = mx + log(sum);
                double *orow = o + (long)r * qd + h * hd;
                for (int e = 0; e < hd; e++) orow[e] = 0;
                for (int j = 0; j < nk; j++) {
                    pr[j] = exp(pr[j] - mx) / sum;
                    const float *vr = VROW(j);
                    for (int e = 0; e < hd; e++) orow[e] += pr[j] * vr[e];
                }
                /* the kernel's delta reads the bf16 output it wrote: so does the reference, else the
                 * output's rounding (2^-9) would show up in every gradient */
                double delta = 0;
                for (int e = 0; e < hd; e++) delta += (double)gk_bf16_to_f32(gk_f32_to_bf16((float)orow[e])) * dor[e];
                double *dqr = dq + (long)r * qd + h * hd;
                for (int e = 0; e < hd; e++) dqr[e] = 0;
                for (int j = 0; j < nk; j++) {
                    const float *vr = VROW(j), *kr = KROW(j);
                    double d = 0;
                    for (int e = 0; e < hd; e++) d += (double)dor[e] * vr[e];
                    double dsj = pr[j] * (d - delta);
                    double *dkr = j < nc ? dkc + (long)(c0 + j) * kvd + g * hd : dkb + (long)(b * p->bs + j - nc) * kvd + g * hd;
                    double *dvr = j < nc ? dvc + (long)(c0 + j) * kvd + g * hd : dvb + (long)(b * p->bs + j - nc) * kvd + g * hd;
                    for (int e = 0; e < hd; e++) {
                        dqr[e] += dsj * kr[e] * scale;
                        dkr[e] += dsj * qr[e] * scale;
                        dvr[e] += pr[j] * dor[e];
                    }
                }
            }
    free(pr);
    free(dp);
}

static float *download_f32_raw(const float *d, size_t n)
{
    float *h = malloc(n * sizeof *h);
    CHECK(h);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost));
    return h;
}

/* Forward and backward of p (heads and blocks set) on fresh random data against the reference.
 * tail_rows > 0: also the context gradients of the last tail_rows rows alone (the last key tiles). */
static void run_case(const struct problem *pp, int impl, int tail_rows)
{
    const struct problem p = *pp;
    const int hd = p.hd, nh = p.nh, nkv = p.nkv, bs = p.bs;
    int Q = p.nb * bs, qd = nh * hd, kvd = nkv * hd;
    long qs = qd + 8 * gk_rng_int(0, 2), kvs = kvd + 8 * gk_rng_int(0, 2);
    float *q, *kc, *vc, *kb, *vb, *dout;
    uint16_t *hq = gk_rand_bf16((size_t)Q * qs, 2.0f, 0.f, &q);
    uint16_t *hkc = gk_rand_bf16((size_t)p.T * kvs, 2.0f, 0.f, &kc), *hvc = gk_rand_bf16((size_t)p.T * kvs, 1.0f, 0.f, &vc);
    uint16_t *hkb = gk_rand_bf16((size_t)Q * kvs, 2.0f, 0.f, &kb), *hvb = gk_rand_bf16((size_t)Q * kvs, 1.0f, 0.f, &vb);
    uint16_t *hdo = gk_rand_bf16((size_t)Q * qs, 1.0f, 0.f, &dout);
    void *dq_ = gk_dev_upload(hq, (size_t)Q * qs * 2), *dkc_ = gk_dev_upload(hkc, (size_t)p.T * kvs * 2);
    void *dvc_ = gk_dev_upload(hvc, (size_t)p.T * kvs * 2), *dkb_ = gk_dev_upload(hkb, (size_t)Q * kvs * 2);
    void *dvb_ = gk_dev_upload(hvb, (size_t)Q * kvs * 2), *ddo = gk_dev_upload(hdo, (size_t)Q * qs * 2);
    void *dblk = gk_dev_upload(p.blk, sizeof *p.blk * (size_t)p.nb);
    void *dout_o = gk_dev_poisoned((size_t)Q * qd);
    float *dlse, *ddelta, *gdq, *gdkc, *gdkb;
    CUDA_CHECK(cudaMalloc((void **)&dlse, sizeof(float) * Q * nh));
    CUDA_CHECK(cudaMalloc((void **)&ddelta, sizeof(float) * Q * nh));
    CUDA_CHECK(cudaMalloc((void **)&gdq, sizeof(float) * Q * qd));
    CUDA_CHECK(cudaMalloc((void **)&gdkc, sizeof(float) * p.T * kvd));
    CUDA_CHECK(cudaMalloc((void **)&gdkb, sizeof(float) * Q * kvd));
    CUDA_CHECK(cudaMemset(gdkc, 0xff, sizeof(float) * p.T * kvd));     /* NaN: unwritten rows show */
    void *gdvc = gk_dev_poisoned((size_t)p.T * kvd), *gdvb = gk_dev_poisoned((size_t)Q * kvd);

    gk_dflash_attn a = { .n_blocks = p.nb, .block_size = bs, .n_heads = nh, .n_kv_heads = nkv, .head_dim = hd,
                         .scale = 1.0f / sqrtf((float)hd), .blocks = dblk, .q = dq_, .q_stride = qs,
                         .kc = dkc_, .kc_stride = kvs, .vc = dvc_, .vc_stride = kvs, .kb = dkb_, .kb_stride = kvs,
                         .vb = dvb_, .vb_stride = kvs, .o = dout_o, .o_stride = qd, .lse = dlse, .impl = impl };
    double t0 = gk_now();
    CHECK_INT(gk_dflash_attn_fwd(&a, 0), ==, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    double t1 = gk_now();

    int max = gk_dflash_max_tiles(p.T, p.nb);
    int32_t *ql = malloc(sizeof *ql * (size_t)p.nb);
    gk_dflash_ktile *tiles = malloc(sizeof *tiles * (size_t)max);
    int nt = gk_dflash_plan(p.blk, p.nb, bs, p.T, ql, tiles, max);
    CHECK(nt > 0);
    void *dql = gk_dev_upload(ql, sizeof *ql * (size_t)p.nb), *dtl = gk_dev_upload(tiles, sizeof *tiles * (size_t)nt);
    gk_dflash_attn_grad g = { .dout = ddo, .dout_stride = qs, .delta = ddelta, .dq = gdq, .dq_stride = qd,
                              .dkc = gdkc, .dkc_stride = kvd, .dvc = gdvc, .dvc_stride = kvd, .dkb = gdkb,
                              .dkb_stride = kvd, .dvb = gdvb, .dvb_stride = kvd, .n_ctx = p.T, .qlist = dql,
                              .tiles = dtl, .n_tiles = nt };
    CHECK_INT(gk_dflash_attn_bwd(&a, &g, 0), ==, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    double t2 = gk_now();

    size_t nq = (size_t)Q * qd, nkc = (size_t)p.T * kvd, nkb = (size_t)Q * kvd;
    double *ro = malloc(8 * nq), *rl = malloc(8 * (size_t)Q * nh), *rdq = malloc(8 * nq);
    double *rdkc = malloc(8 * nkc), *rdvc = malloc(8 * nkc), *rdkb = malloc(8 * nkb), *rdvb = malloc(8 * nkb);
    reference(&p, q, qs, kc, vc, kb, vb, kvs, dout, qs, ro, rl, rdq, rdkc, rdvc, rdkb, rdvb);
    float *o = gk_dev_download_f32(dout_o, nq), *lse = download_f32_raw(dlse, (size_t)Q * nh);
    float *gq = download_f32_raw(gdq, nq), *gkc = download_f32_raw(gdkc, nkc), *gkb = download_f32_raw(gdkb, nkb);
    float *gvc = gk_dev_download_f32(gdvc, nkc), *gvb = gk_dev_download_f32(gdvb, nkb);
    double eo = gk_rel_err(o, qd, ro, qd, Q, qd), el = gk_rel_err(lse, nh, rl, nh, Q, nh);
    double eq = gk_rel_err(gq, qd, rdq, qd, Q, qd), ekc = gk_rel_err(gkc, kvd, rdkc, kvd, p.T, kvd);
    double evc = gk_rel_err(gvc, kvd, rdvc, kvd, p.T, kvd), ekb = gk_rel_err(gkb, kvd, rdkb, kvd, Q, kvd);
    double evb = gk_rel_err(gvb, kvd, rdvb, kvd, Q, kvd);
    int mma = impl == GK_DFLASH_MMA || impl == GK_DFLASH_WGMMA || (impl == GK_DFLASH_AUTO && (hd == 64 || hd == 128));
    const char *kind = impl == GK_DFLASH_WGMMA ? "wgmma " : mma ? "mma   " : "simple";
    printf("%s hd %3d heads %d/%d bs %2d blocks %3d T %4d tiles %4d | rel err o %.1e lse %.1e dq %.1e dkc %.1e "
           "dvc %.1e dkb %.1e dvb %.1e | fwd %.2f ms bwd %.2f ms\n", kind, hd, nh, nkv, bs, p.nb,
           p.T, nt, eo, el, eq, ekc, evc, ekb, evb, (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    /* the tensor-core kernels round P and dS to bf16 as mma operands (2^-9 relative each) */
    double eg = mma ? 1e-2 : 5e-3;
    CHECK(eo < 1e-2 && el < 1e-4 && eq < eg && ekc < eg && ekb < eg && evc < 1e-2 && evb < 1e-2);
    if (tail_rows > 0) {
        const long r0 = p.T - tail_rows;
        double tkc = gk_rel_err(gkc + r0 * kvd, kvd, rdkc + r0 * kvd, kvd, tail_rows, kvd);
        double tvc = gk_rel_err(gvc + r0 * kvd, kvd, rdvc + r0 * kvd, kvd, tail_rows, kvd);
        printf("%s context rows [%ld, %d): rel err dkc %.1e dvc %.1e\n", kind, r0, p.T, tkc, tvc);
        CHECK(tkc < eg && tvc < 1e-2);
    }

    cudaFree(dq_); cudaFree(dkc_); cudaFree(dvc_); cudaFree(dkb_); cudaFree(dvb_); cudaFree(ddo); cudaFree(dblk);
    cudaFree(dout_o); cudaFree(dlse); cudaFree(ddelta); cudaFree(gdq); cudaFree(gdkc); cudaFree(gdkb);
    cudaFree(gdvc); cudaFree(gdvb); cudaFree(dql); cudaFree(dtl);
    free(hq); free(hkc); free(hvc); free(hkb); free(hvb); free(hdo);
    free(q); free(kc); free(vc); free(kb); free(vb); free(dout);
    free(ro); free(rl); free(rdq); free(rdkc); free(rdvc); free(rdkb); free(rdvb);
    free(o); free(lse); free(gq); free(gkc); free(gkb); free(gvc); free(gvb);
    free(ql); free(tiles);
}

static void attn_case(int hd, int nh, int nkv, int bs, int impl)
{
    struct problem p;
    make_problem(&p, gk_rng_int(1, 5), gk_rng_int(20, 300), bs);
    p.nh = nh;
    p.nkv = nkv;
    p.hd = hd;
    if (p.nb == 0) p.blk[p.nb++] = (gk_dflash_block){ 0, p.cu[1] - 1 };
    run_case(&p, impl, 0);
    free(p.blk);
}

/* More context key tiles than a grid's y dimension holds (65535): 70000 sequences of 2 to 4
 * tokens, one block each with a context of at least one key, so each sequence is one context tile
 * of the key pass. Small heads keep the reference to a second or two. */
static void many_tiles_case(int hd, int impl)
{
    enum { N_SEQS = 70000 };
    struct problem p = { .n_seqs = N_SEQS, .bs = 4, .nh = 2, .nkv = 1, .hd = hd };
    p.blk = malloc(sizeof *p.blk * N_SEQS);
    CHECK(p.blk);
    int start = 0;
    for (int s = 0; s < N_SEQS; s++) {
        int len = gk_rng_int(2, 4);
        p.blk[p.nb++] = (gk_dflash_block){ start, start + gk_rng_int(1, len - 1) };
        start += len;
    }
    p.T = start;
    for (int i = p.nb - 1; i > 0; i--) {    /* unsorted, as in the other cases */
        int j = gk_rng_int(0, i);
        gk_dflash_block t = p.blk[i]; p.blk[i] = p.blk[j]; p.blk[j] = t;
    }
    int max = gk_dflash_max_tiles(p.T, p.nb);
    int32_t *ql = malloc(sizeof *ql * (size_t)p.nb);
    gk_dflash_ktile *tiles = malloc(sizeof *tiles * (size_t)max);
    CHECK(ql && tiles);
    int nt = gk_dflash_plan(p.blk, p.nb, p.bs, p.T, ql, tiles, max);
    CHECK_INT(nt - p.nb, ==, N_SEQS);      /* the context tiles */
    CHECK(nt - p.nb > 65535);
    free(ql);
    free(tiles);
    run_case(&p, impl, 4000);
    free(p.blk);
}

/* Speed at the drafter bench's shape: one 3072-token sequence, 512 blocks of 16 anchored in its
 * last 7/8, 32/8 heads of 128. TFLOP/s count QK^T and PV of the visible keys (x 2.5 for the
 * backward, FlashAttention's convention: its recomputation of S is not counted). */
static int cmp_end(const void *x, const void *y)
{
    const gk_dflash_block *a = x, *b = y;
    return (a->ctx_end > b->ctx_end) - (a->ctx_end < b->ctx_end);
}

static void bench(int impl, int sorted)
{
    const int T = 3072, nb = 512, bs = 16, nh = 32, nkv = 8, hd = 128, Q = nb * bs, qd = nh * hd, kvd = nkv * hd;
    gk_dflash_block *blk = malloc(sizeof *blk * nb);
    double keys = 0;
    CHECK(blk);
    for (int i = 0; i < nb; i++) {
        blk[i] = (gk_dflash_block){ 0, gk_rng_int(T / 8, T - 2) };
        keys += blk[i].ctx_end + bs;
    }
    if (sorted)     /* as the drafter samples them: ascending anchors */
        qsort(blk, (size_t)nb, sizeof *blk, cmp_end);
    uint16_t *hq = gk_rand_bf16((size_t)Q * qd, 1.0f, 0.f, NULL), *hk = gk_rand_bf16((size_t)(T + Q) * kvd, 1.0f, 0.f, NULL);
    void *dq_ = gk_dev_upload(hq, (size_t)Q * qd * 2), *dk_ = gk_dev_upload(hk, (size_t)(T + Q) * kvd * 2);
    void *dv_ = gk_dev_upload(hk, (size_t)(T + Q) * kvd * 2), *ddo = gk_dev_upload(hq, (size_t)Q * qd * 2);
    void *dblk = gk_dev_upload(blk, sizeof *blk * nb), *dout = gk_dev_poisoned((size_t)Q * qd);
    float *dlse, *ddelta, *gdq, *gdk;
    void *gdv = gk_dev_poisoned((size_t)(T + Q) * kvd);
    CUDA_CHECK(cudaMalloc((void **)&dlse, sizeof(float) * Q * nh));
    CUDA_CHECK(cudaMalloc((void **)&ddelta, sizeof(float) * Q * nh));
    CUDA_CHECK(cudaMalloc((void **)&gdq, sizeof(float) * Q * qd));
    CUDA_CHECK(cudaMalloc((void **)&gdk, sizeof(float) * (T + Q) * kvd));
    const uint16_t *kb = (const uint16_t *)dk_ + (size_t)T * kvd, *vb = (const uint16_t *)dv_ + (size_t)T * kvd;
    gk_dflash_attn a = { .n_blocks = nb, .block_size = bs, .n_heads = nh, .n_kv_heads = nkv, .head_dim = hd,
                         .scale = 1.0f / sqrtf((float)hd), .blocks = dblk, .q = dq_, .q_stride = qd, .kc = dk_,
                         .kc_stride = kvd, .vc = dv_, .vc_stride = kvd, .kb = kb, .kb_stride = kvd, .vb = vb,
                         .vb_stride = kvd, .o = dout, .o_stride = qd, .lse = dlse, .impl = impl };
    int max = gk_dflash_max_tiles(T, nb);
    int32_t *ql = malloc(sizeof *ql * nb);
    gk_dflash_ktile *tiles = malloc(sizeof *tiles * (size_t)max);
    CHECK(ql && tiles);
    int nt = gk_dflash_plan(blk, nb, bs, T, ql, tiles, max);
    CHECK(nt > 0);
    void *dql = gk_dev_upload(ql, sizeof *ql * nb), *dtl = gk_dev_upload(tiles, sizeof *tiles * (size_t)nt);
    gk_dflash_attn_grad g = { .dout = ddo, .dout_stride = qd, .delta = ddelta, .dq = gdq, .dq_stride = qd,
                              .dkc = gdk, .dkc_stride = kvd, .dvc = gdv, .dvc_stride = kvd,
                              .dkb = gdk + (size_t)T * kvd, .dkb_stride = kvd,
                              .dvb = (uint16_t *)gdv + (size_t)T * kvd, .dvb_stride = kvd, .n_ctx = T,
                              .qlist = dql, .tiles = dtl, .n_tiles = nt };
    cudaEvent_t e0, e1, e2;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventCreate(&e2));
    float tf = 0, tb = 0;
    for (int rep = 0; rep < 4; rep++) {     /* the first is a warm-up */
        CUDA_CHECK(cudaEventRecord(e0, 0));
        CHECK_INT(gk_dflash_attn_fwd(&a, 0), ==, 0);
        CUDA_CHECK(cudaEventRecord(e1, 0));
        CHECK_INT(gk_dflash_attn_bwd(&a, &g, 0), ==, 0);
        CUDA_CHECK(cudaEventRecord(e2, 0));
        CUDA_CHECK(cudaEventSynchronize(e2));
        float f, b;
        CUDA_CHECK(cudaEventElapsedTime(&f, e0, e1));
        CUDA_CHECK(cudaEventElapsedTime(&b, e1, e2));
        if (rep) { tf += f / 3; tb += b / 3; }
    }
    /* the query pass alone (no key tiles: dk/dv untouched), for the split of the backward */
    float tq = 0;
    gk_dflash_attn_grad gq_only = g;
    gq_only.n_tiles = 0;
    for (int rep = 0; rep < 4; rep++) {
        CUDA_CHECK(cudaEventRecord(e1, 0));
        CHECK_INT(gk_dflash_attn_bwd(&a, &gq_only, 0), ==, 0);
        CUDA_CHECK(cudaEventRecord(e2, 0));
        CUDA_CHECK(cudaEventSynchronize(e2));
        float q;
        CUDA_CHECK(cudaEventElapsedTime(&q, e1, e2));
        if (rep) tq += q / 3;
    }
    double flop = 4.0 * bs * nh * hd * keys;
    const char *name = impl == GK_DFLASH_WGMMA ? "wgmma" : impl == GK_DFLASH_MMA ? "mma" : "simple";
    const char *order = sorted ? "sorted" : "random";
    printf("BENCH dflash_attn %s: %d blocks (%s anchors), T %d, 32/8 heads x 128: fwd %.3f ms (%.0f TFLOP/s), "
           "bwd %.3f ms (%.0f TFLOP/s)\n", name, nb, order, T, tf, flop / tf / 1e9, tb, 2.5 * flop / tb / 1e9);
    printf("BENCH dflash_attn %s: %s anchors: bwd split: query pass %.3f ms, key pass %.3f ms\n", name, order,
           tq, tb - tq);
    cudaFree(dq_); cudaFree(dk_); cudaFree(dv_); cudaFree(ddo); cudaFree(dblk); cudaFree(dout); cudaFree(gdv);
    cudaFree(dlse); cudaFree(ddelta); cudaFree(gdq); cudaFree(gdk); cudaFree(dql); cudaFree(dtl);
    free(hq); free(hk); free(blk); free(ql); free(tiles);
}

int main(int argc, char **argv)
{
    gk_rng_seed();
    plan_tests();
    gk_test_require_gpu();
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        bench(GK_DFLASH_SIMPLE, 0);
        bench(GK_DFLASH_MMA, 0);
        bench(GK_DFLASH_MMA, 1);
        if (gk_dflash_attn_has_wgmma()) {
            bench(GK_DFLASH_WGMMA, 0);
            bench(GK_DFLASH_WGMMA, 1);
        }
        return 0;
    }
    attn_case(16, 4, 2, 4, GK_DFLASH_AUTO);
    attn_case(16, 2, 2, 16, GK_DFLASH_AUTO);
    attn_case(32, 6, 3, 7, GK_DFLASH_AUTO);
    attn_case(256, 2, 1, 8, GK_DFLASH_AUTO);
    const int last = gk_dflash_attn_has_wgmma() ? GK_DFLASH_WGMMA : GK_DFLASH_MMA;
    printf("warpgroup MMA kernels: %s\n", last == GK_DFLASH_WGMMA ? "tested" : "not on this device or build");
    for (int impl = GK_DFLASH_SIMPLE; impl <= last; impl++) {
        if (impl != GK_DFLASH_WGMMA) {      /* (head_dim 128 only) */
            attn_case(64, 8, 2, 16, impl);
            attn_case(64, 2, 2, 5, impl);   /* 5 query rows per CTA: padding rows */
        }
        attn_case(128, 4, 1, 16, impl);
        attn_case(128, 2, 2, 5, impl);
        if (!getenv("GK_TEST_QUICK")) {     /* (quick: the small cases, for compute-sanitizer) */
            attn_case(128, 32, 8, 16, impl);
            attn_case(128, 16, 2, 16, impl);    /* 128 rows per (block, kv head): two row tiles */
            attn_case(128, 6, 2, 16, impl);     /* 3 heads a group: 48 rows, rows not 8 apart */
            attn_case(128, 12, 1, 16, impl);    /* 192 rows: a tile starts inside a block row */
        }
    }
    if (!getenv("GK_TEST_QUICK")) {     /* the mma.sync key pass (the warpgroup one had a 1-D grid) */
        many_tiles_case(64, GK_DFLASH_MMA);
        many_tiles_case(128, GK_DFLASH_MMA);
    }
    /* The shared memory they asked for, as drafter_cuda_create compares it with the GPU's: within
     * it here (they all ran), and past the 48 KiB default for the tensor-core kernels at 128. */
    int optin = 0, dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    static const int hds[] = { 16, 32, 64, 128, 256 };
    for (int i = 0; i < 5; i++)
        for (int impl = GK_DFLASH_AUTO; impl <= GK_DFLASH_MMA; impl++) {
            size_t need = gk_dflash_attn_smem(hds[i], impl);
            printf("shared memory, head_dim %d, impl %d: %zu of %d bytes\n", hds[i], impl, need, optin);
            CHECK(need > 0 && need <= (size_t)optin);
        }
    CHECK(gk_dflash_attn_smem(128, GK_DFLASH_MMA) > 48 * 1024);
    gk_dflash_attn bad = { .n_blocks = 1, .block_size = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 48 };
    CHECK_INT(gk_dflash_attn_fwd(&bad, 0), ==, -EINVAL);
    gk_dflash_attn bad2 = { .n_blocks = 1, .block_size = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
                            .impl = GK_DFLASH_MMA };
    CHECK_INT(gk_dflash_attn_fwd(&bad2, 0), ==, -EINVAL);
    gk_dflash_attn bad3 = bad2;         /* the warpgroup kernels: head_dim 128 only */
    bad3.head_dim = 64;
    bad3.impl = GK_DFLASH_WGMMA;
    CHECK_INT(gk_dflash_attn_fwd(&bad3, 0), ==, -EINVAL);
    return 0;
}
#else
int main(void) { SKIP("built without CUDA"); }
#endif
