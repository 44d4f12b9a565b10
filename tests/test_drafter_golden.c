/* test_drafter_golden.c: CPU drafter vs the PyTorch reference (tools/golden_drafter.py, float64):
 * loss within 1e-5 relative, every gradient within 1e-4 (max abs error / max abs value per tensor),
 * accuracy, accepted length, weight sum and per-block losses, on fixed anchors of a packed batch. */
#include "model/cpu_ops.h"
#include "model/safetensors.h"
#include "tests/test_drafter_fixture.h"

static const struct st_tensor *need(const struct st_set *s, const char *name, enum st_dtype dt)
{
    const struct st_tensor *t = st_find(s, name);
    if (!t)
        TEST_FAIL("golden file has no tensor %s", name);
    if (t->dtype != dt)
        TEST_FAIL("golden %s: dtype %s", name, st_dtype_name(t->dtype));
    return t;
}

static double f64_at(const struct st_tensor *t, int64_t i)
{
    double v;
    memcpy(&v, (const char *)t->data + i * 8, 8);
    return v;
}

static int32_t i32_at(const struct st_tensor *t, int64_t i)
{
    int32_t v;
    memcpy(&v, (const char *)t->data + i * 4, 4);
    return v;
}

int main(void)
{
    char dir[1024], path[1100], err[512] = "";
    const char *env = getenv("DFLASH_GOLDEN_DRAFTER");
    snprintf(dir, sizeof dir, "%s", env ? env : "");
    if (!env)
        snprintf(dir, sizeof dir, "%s/tests/data/golden_drafter", test_srcdir());
    struct st_set *in = NULL, *gold = NULL;
    snprintf(path, sizeof path, "%s/inputs.safetensors", dir);
    if (st_open_file(&in, path, err, sizeof err) < 0)
        TEST_FAIL("%s", err);
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    if (st_open_file(&gold, path, err, sizeof err) < 0)
        TEST_FAIL("%s", err);

    struct drafter_config cfg;
    fixture_config(&cfg);     /* the script's CFG */
    cfg.rms_norm_eps = 1e-3;     /* the golden's (tools/golden_drafter.py: large, so that it shows) */
    const double gamma = 7.0;

    const struct st_tensor *tt = need(in, "tokens", ST_I32), *tm = need(in, "loss_mask", ST_U8);
    const struct st_tensor *tc = need(in, "cu_seqlens", ST_I32), *ta = need(in, "anchors", ST_I32);
    const struct st_tensor *tas = need(in, "anchor_seq", ST_I32);
    int T = (int)tt->numel, n_seqs = (int)tc->numel - 1, nb = (int)ta->numel;
    uint32_t *tokens = malloc((size_t)T * sizeof *tokens);
    uint8_t *lmask = malloc((size_t)T);
    int32_t *cu = malloc((size_t)(n_seqs + 1) * sizeof *cu);
    struct obj_block *blk = malloc((size_t)nb * sizeof *blk);
    for (int i = 0; i < T; i++)
        tokens[i] = (uint32_t)i32_at(tt, i);
    memcpy(lmask, tm->data, (size_t)T);
    for (int i = 0; i <= n_seqs; i++)
        cu[i] = i32_at(tc, i);
    for (int i = 0; i < nb; i++)
        blk[i] = (struct obj_block){ i32_at(ta, i), i32_at(tas, i) };

    int64_t hshape[2] = { T, (int64_t)cfg.n_target_ids * cfg.hidden_size };
    int64_t vshape[2] = { cfg.vocab_size, cfg.hidden_size };
    const struct st_tensor *th, *te, *tl;
    CHECK_OK(st_expect(in, "hidden", 2, hshape, &th, err, sizeof err));
    CHECK_OK(st_expect(in, "embed", 2, vshape, &te, err, sizeof err));
    CHECK_OK(st_expect(in, "lm_head", 2, vshape, &tl, err, sizeof err));
    float *hidden, *embed, *lm_head;
    CHECK_OK(st_load_f32(th, &hidden));
    CHECK_OK(st_load_f32(te, &embed));
    CHECK_OK(st_load_f32(tl, &lm_head));

    struct drafter *d = NULL;
    if (drafter_create(&d, &cfg, embed, lm_head, T, nb, 1, err, sizeof err) < 0)
        TEST_FAIL("drafter_create: %s", err);
    for (int i = 0; i < d->n_tensors; i++) {
        const struct drafter_tensor *t = &d->tensors[i];
        const struct st_tensor *st;
        if (st_expect(in, t->name, t->ndim, t->shape, &st, err, sizeof err) < 0)
            TEST_FAIL("%s", err);
        CHECK_OK(st_read_f32(st, 0, (int64_t)t->numel, d->params + t->offset));
    }

    struct obj_batch b = { .tokens = tokens, .loss_mask = lmask, .cu_seqlens = cu, .n_seqs = n_seqs,
                           .n_tokens = T, .hidden_f32 = hidden };
    CHECK_OK(obj_batch_check(&b, cfg.vocab_size, err, sizeof err));
    struct drafter_metrics m;
    CHECK_OK(drafter_forward_backward(d, &b, blk, nb, gamma, &m));

    double g_loss = f64_at(need(gold, "loss", ST_F64), 0);
    double g_acc = f64_at(need(gold, "accuracy", ST_F64), 0);
    double g_acc_len = f64_at(need(gold, "accept_len", ST_F64), 0);
    double g_wsum = f64_at(need(gold, "weight_sum", ST_F64), 0);
    double g_sup = f64_at(need(gold, "supervised", ST_F64), 0);
    double loss = drafter_metrics_loss(&m);
    printf("loss %.9f (golden %.9f, rel %.2e) acc %.4f (%.4f) accept %.4f (%.4f) wsum %.6f (%.6f)\n",
           loss, g_loss, fabs(loss - g_loss) / fabs(g_loss), drafter_metrics_accuracy(&m), g_acc,
           drafter_metrics_accept_len(&m), g_acc_len, m.weight_sum, g_wsum);
    CHECK(fabs(loss - g_loss) <= 1e-5 * fabs(g_loss));
    CHECK_NEAR(m.weight_sum, g_wsum, 1e-5 * g_wsum);
    CHECK_NEAR(m.supervised, g_sup, 0);
    CHECK_NEAR(drafter_metrics_accuracy(&m), g_acc, 1e-12);
    CHECK_NEAR(drafter_metrics_accept_len(&m), g_acc_len, 1e-12);
    CHECK_INT(m.blocks, ==, nb);

    double worst = 0;
    const char *worst_name = "-";
    for (int i = 0; i < d->n_tensors; i++) {
        const struct drafter_tensor *t = &d->tensors[i];
        char name[DRAFTER_NAME_MAX + 8];
        snprintf(name, sizeof name, "grad.%s", t->name);
        const struct st_tensor *gt = need(gold, name, ST_F64);
        CHECK_INT(gt->numel, ==, (int64_t)t->numel);
        double maxref = 0, maxdiff = 0;
        for (size_t j = 0; j < t->numel; j++) {
            double ref = f64_at(gt, (int64_t)j);
            double got = d->grads[t->offset + j] / m.weight_sum;
            maxref = fmax(maxref, fabs(ref));
            maxdiff = fmax(maxdiff, fabs(got - ref));
        }
        CHECK(maxref > 0);
        double rel = maxdiff / maxref;
        if (rel > worst) {
            worst = rel;
            worst_name = t->name;
        }
        if (rel > 1e-4)
            TEST_FAIL("gradient of %s: max error %.3g of max %.3g (rel %.3g)", t->name, maxdiff, maxref, rel);
    }
    printf("gradients of %d tensors: worst relative error %.3g (%s)\n", d->n_tensors, worst, worst_name);

    /* per-block losses of the forward-only pass */
    double *bl = calloc((size_t)nb, sizeof *bl);
    struct drafter_metrics m2;
    CHECK_OK(drafter_forward(d, &b, blk, nb, gamma, &m2, bl));
    CHECK_NEAR(m2.loss_sum, m.loss_sum, 0);
    const struct st_tensor *gbl = need(gold, "block_loss", ST_F64);
    CHECK_INT(gbl->numel, ==, nb);
    for (int i = 0; i < nb; i++)
        CHECK_NEAR(bl[i], f64_at(gbl, i), 1e-5 * (fabs(f64_at(gbl, i)) + 1e-3));

    /* bf16 features (the ring's dtype) give nearly the same loss */
    uint16_t *hb = malloc((size_t)hshape[0] * hshape[1] * sizeof *hb);
    cpu_f32_to_bf16(hb, hidden, (size_t)(hshape[0] * hshape[1]));
    struct obj_batch b16 = b;
    b16.hidden_f32 = NULL;
    b16.hidden_bf16 = hb;
    struct drafter_metrics m3;
    CHECK_OK(drafter_forward(d, &b16, blk, nb, gamma, &m3, NULL));
    CHECK_NEAR(drafter_metrics_loss(&m3), loss, 2e-2 * loss);

    free(hb);
    free(bl);
    drafter_free(d);
    free(hidden);
    free(embed);
    free(lm_head);
    free(tokens);
    free(lmask);
    free(cu);
    free(blk);
    st_close(in);
    st_close(gold);
    return 0;
}
