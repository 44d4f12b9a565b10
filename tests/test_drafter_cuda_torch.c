/* test_drafter_cuda_torch.c: the CUDA drafter step against a PyTorch implementation of the same step
 * at a realistic shape (tools/parity_drafter_torch.py: hidden 1024, block 16, 512 anchors a sequence,
 * sequences up to 3072 tokens). The script's drafter checkpoint is loaded with ckpt_load, its batch
 * and explicit anchors are run through drafter_cuda_forward_backward, and the loss (<= 1e-2 relative)
 * and every gradient (cosine >= 0.999) are checked against the PyTorch bf16 step; the PyTorch fp32
 * step is printed beside it for context.
 *
 * Needs a GPU and DFLASH_DRAFTER_PARITY_DIR naming the directory the script wrote; else exit 77
 * (the script needs PyTorch on a GPU: bench/drafter_parity_gpu.sh runs both). */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include <sys/stat.h>
#include "model/checkpoint.h"
#include "model/drafter_cuda.h"
#include "model/safetensors.h"

struct row {
    const char *name;
    double cos_bf16, cos_fp32, ref_cos;     /* CUDA vs torch bf16, CUDA vs torch fp32, torch bf16 vs fp32 */
    size_t numel;
};

static double cosine(const float *a, const float *b, size_t n)
{
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            TEST_FAIL("non-finite gradient value at %zu", i);
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
}

static int by_cos(const void *a, const void *b)
{
    double x = ((const struct row *)a)->cos_bf16, y = ((const struct row *)b)->cos_bf16;
    return (x > y) - (x < y);
}

static const struct st_tensor *need(const struct st_set *s, const char *name, int dtype)
{
    const struct st_tensor *t = st_find(s, name);
    if (!t)
        TEST_FAIL("%s: no tensor %s", st_source(s), name);
    if (dtype >= 0 && (int)t->dtype != dtype)
        TEST_FAIL("%s: %s is %s", st_source(s), name, st_dtype_name(t->dtype));
    return t;
}

static int32_t i32_at(const struct st_tensor *t, int64_t i)
{
    int32_t v;
    memcpy(&v, (const char *)t->data + i * 4, 4);
    return v;
}

static double f64_at(const struct st_tensor *t, int64_t i)
{
    double v;
    memcpy(&v, (const char *)t->data + i * 8, 8);
    return v;
}

int main(void)
{
    const char *dir = getenv("DFLASH_DRAFTER_PARITY_DIR");
    char path[4096], ckdir[4096], err[512] = "";
    struct stat sb;
    if (!dir || !*dir)
        SKIP("DFLASH_DRAFTER_PARITY_DIR not set (tools/parity_drafter_torch.py --out DIR writes it)");
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    if (stat(path, &sb) < 0)
        SKIP("%s: not there (run tools/parity_drafter_torch.py --out %s first)", path, dir);
    gk_test_require_gpu();

    /* the drafter: config + bf16 weights from the script's checkpoint */
    struct drafter_config cfg;
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", dir);
    if (ckpt_read_config(ckdir, &cfg, err, sizeof err) < 0)
        TEST_FAIL("%s", err);

    struct st_set *in = NULL, *ref = NULL;
    snprintf(path, sizeof path, "%s/inputs.safetensors", dir);
    if (st_open_file(&in, path, err, sizeof err) < 0)
        TEST_FAIL("%s", err);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    if (st_open_file(&ref, path, err, sizeof err) < 0)
        TEST_FAIL("%s", err);

    const struct st_tensor *tt = need(in, "tokens", ST_I32), *tm = need(in, "loss_mask", ST_U8);
    const struct st_tensor *tc = need(in, "cu_seqlens", ST_I32), *ta = need(in, "anchors", ST_I32);
    const struct st_tensor *tas = need(in, "anchor_seq", ST_I32), *tg = need(in, "gamma", ST_F64);
    int T = (int)tt->numel, n_seqs = (int)tc->numel - 1, nb = (int)ta->numel;
    CHECK_INT(tm->numel, ==, T);
    CHECK_INT(tas->numel, ==, nb);
    double gamma = f64_at(tg, 0);
    uint32_t *tokens = malloc((size_t)T * sizeof *tokens);
    uint8_t *lmask = malloc((size_t)T);
    int32_t *cu = malloc((size_t)(n_seqs + 1) * sizeof *cu);
    struct obj_block *blk = malloc((size_t)nb * sizeof *blk);
    CHECK(tokens && lmask && cu && blk);
    for (int i = 0; i < T; i++)
        tokens[i] = (uint32_t)i32_at(tt, i);
    memcpy(lmask, tm->data, (size_t)T);
    int max_len = 0;
    for (int i = 0; i <= n_seqs; i++) {
        cu[i] = i32_at(tc, i);
        if (i > 0 && cu[i] - cu[i - 1] > max_len)
            max_len = cu[i] - cu[i - 1];
    }
    for (int i = 0; i < nb; i++)
        blk[i] = (struct obj_block){ i32_at(ta, i), i32_at(tas, i) };

    int64_t hshape[2] = { T, (int64_t)cfg.n_target_ids * cfg.hidden_size };
    int64_t vshape[2] = { cfg.vocab_size, cfg.hidden_size };
    const struct st_tensor *th, *te, *tl;
    CHECK_OK(st_expect(in, "hidden", 2, hshape, &th, err, sizeof err));
    CHECK_OK(st_expect(in, "embed", 2, vshape, &te, err, sizeof err));
    CHECK_OK(st_expect(in, "lm_head", 2, vshape, &tl, err, sizeof err));
    CHECK(th->dtype == ST_BF16);
    uint16_t *hidden = malloc((size_t)th->numel * sizeof *hidden);
    CHECK(hidden);
    CHECK_OK(st_read_bf16(th, 0, th->numel, hidden));
    float *embed, *lm_head;
    CHECK_OK(st_load_f32(te, &embed));
    CHECK_OK(st_load_f32(tl, &lm_head));

    struct drafter *d = NULL;
    if (drafter_create(&d, &cfg, embed, lm_head, T, nb, 1, err, sizeof err) < 0)
        TEST_FAIL("drafter_create: %s", err);
    if (ckpt_load(ckdir, d, NULL, &(struct ckpt_load_opts){ .weights_only_ok = true }, err, sizeof err) < 0)
        TEST_FAIL("ckpt_load: %s", err);
    printf("drafter: hidden %d, %d layers, %d/%d heads x %d, intermediate %d, vocab %d, %d captured layers, "
           "%.1f M parameters\n", cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
           cfg.intermediate_size, cfg.vocab_size, cfg.n_target_ids, d->n_params / 1e6);
    printf("batch: %d sequences (longest %d), %d tokens, %d blocks of %d, gamma %g\n", n_seqs, max_len, T, nb,
           cfg.block_size, gamma);

    struct obj_batch b = { .tokens = tokens, .loss_mask = lmask, .cu_seqlens = cu, .n_seqs = n_seqs,
                           .n_tokens = T, .hidden_bf16 = hidden };
    if (obj_batch_check(&b, cfg.vocab_size, err, sizeof err) < 0)
        TEST_FAIL("%s", err);
    struct drafter_cuda *dc = NULL;
    struct drafter_cuda_opts o = { .device = 0 };
    if (drafter_cuda_create(&dc, d, T, nb, &o, err, sizeof err) < 0)
        TEST_FAIL("drafter_cuda_create: %s", err);
    struct drafter_metrics m;
    CHECK_OK(drafter_cuda_forward_backward(dc, &b, blk, nb, gamma, &m));    /* warm-up, same result */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_OK(drafter_cuda_forward_backward(dc, &b, blk, nb, gamma, &m));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    float *g = malloc(d->n_params * sizeof *g);
    CHECK(g);
    CHECK_OK(drafter_cuda_download_grads(dc, g));

    double l16 = f64_at(need(ref, "loss_bf16", ST_F64), 0), l32 = f64_at(need(ref, "loss_fp32", ST_F64), 0);
    double wsum = f64_at(need(ref, "weight_sum", ST_F64), 0), lc = drafter_metrics_loss(&m);
    double rel16 = fabs(lc - l16) / fabs(l16), rel32 = fabs(lc - l32) / fabs(l32);
    printf("forward_backward: %.2f ms\n", ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6));
    printf("loss: cuda %.6f | torch bf16 %.6f (rel %.2e) | torch fp32 %.6f (rel %.2e) | torch bf16 vs fp32 rel %.2e\n",
           lc, l16, rel16, l32, rel32, fabs(l16 - l32) / fabs(l32));
    printf("weight sum: cuda %.6f torch %.6f; supervised %.0f, blocks %.0f, accuracy %.4f, accept %.3f\n",
           m.weight_sum, wsum, m.supervised, m.blocks, drafter_metrics_accuracy(&m), drafter_metrics_accept_len(&m));

    /* gradients, tensor by tensor (cosine is blind to the 1/weight_sum scale) */
    struct row *rows = calloc((size_t)d->n_tensors, sizeof *rows);
    float *r16 = malloc(d->n_params * sizeof *r16), *r32 = malloc(d->n_params * sizeof *r32);
    CHECK(rows && r16 && r32);
    for (int i = 0; i < d->n_tensors; i++) {
        const struct drafter_tensor *t = &d->tensors[i];
        char n16[DRAFTER_NAME_MAX + 16], n32[DRAFTER_NAME_MAX + 16];
        snprintf(n16, sizeof n16, "grad_bf16.%s", t->name);
        snprintf(n32, sizeof n32, "grad_fp32.%s", t->name);
        const struct st_tensor *a, *c;
        CHECK_OK(st_expect(ref, n16, t->ndim, t->shape, &a, err, sizeof err));
        CHECK_OK(st_expect(ref, n32, t->ndim, t->shape, &c, err, sizeof err));
        CHECK_OK(st_read_f32(a, 0, (int64_t)t->numel, r16 + t->offset));
        CHECK_OK(st_read_f32(c, 0, (int64_t)t->numel, r32 + t->offset));
        rows[i] = (struct row){ t->name, cosine(g + t->offset, r16 + t->offset, t->numel),
                                cosine(g + t->offset, r32 + t->offset, t->numel),
                                cosine(r16 + t->offset, r32 + t->offset, t->numel), t->numel };
    }
    qsort(rows, (size_t)d->n_tensors, sizeof *rows, by_cos);
    printf("gradient cosine, worst first:   %-44s %10s %10s %10s %10s\n", "tensor", "numel", "vs bf16", "vs fp32",
           "bf16/fp32");
    int bad = 0;
    for (int i = 0; i < d->n_tensors; i++) {
        const struct row *r = &rows[i];
        bad += r->cos_bf16 < 0.999;
        printf("  %-62s %10zu %10.6f %10.6f %10.6f%s\n", r->name, r->numel, r->cos_bf16, r->cos_fp32, r->ref_cos,
               r->cos_bf16 < 0.999 ? "  < 0.999" : "");
    }
    printf("all gradients: cosine vs bf16 %.6f, vs fp32 %.6f; worst %.6f (%s)\n", cosine(g, r16, d->n_params),
           cosine(g, r32, d->n_params), rows[0].cos_bf16, rows[0].name);

    CHECK_NEAR(m.weight_sum, wsum, 1e-6 * wsum);
    CHECK_INT((int)m.blocks, ==, nb);
    CHECK(isfinite(lc));
    if (rel16 > 1e-2)
        TEST_FAIL("loss %.6f vs torch bf16 %.6f: relative error %.2e > 1e-2", lc, l16, rel16);
    if (bad)
        TEST_FAIL("%d gradients below cosine 0.999 against torch bf16 (worst %s %.6f)", bad, rows[0].name,
                  rows[0].cos_bf16);
    printf("PASS: loss rel %.2e <= 1e-2, every gradient cosine >= 0.999 (worst %.6f)\n", rel16, rows[0].cos_bf16);

    drafter_cuda_free(dc);
    drafter_free(d);
    free(rows);
    free(r16);
    free(r32);
    free(g);
    free(hidden);
    free(embed);
    free(lm_head);
    free(tokens);
    free(lmask);
    free(cu);
    free(blk);
    st_close(in);
    st_close(ref);
    return 0;
}
#else
int main(void) { SKIP("built without CUDA"); }
#endif
