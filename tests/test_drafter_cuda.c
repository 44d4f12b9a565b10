/* test_drafter_cuda.c: the CUDA drafter against the CPU reference: loss (1e-2 relative) and every
 * gradient (cosine >= 0.999) on the golden batch, a longer random batch (many key tiles) and a
 * head_dim 128 drafter; the optimizer step on identical gradients; a few training steps side by
 * side, and the asynchronous step API (results read a step later) against the synchronous one, also
 * with four steps in flight on pinned bf16 features (copies overlapping compute) and with a skipped
 * step (nothing supervised) in flight before a real one; parameters and moments round-tripped
 * through the host drafter. */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include "gpukern/dflash_attn.h"
#include "model/drafter_cuda.h"
#include "model/optim.h"
#include "model/safetensors.h"
#include "tests/test_drafter_fixture.h"

static const double GAMMA = 7.0;

/* Two CUDA drafters given the same steps (the synchronous one and its asynchronous twin) agree to
 * the bit: no kernel of the step adds with float atomics (the norm weights' gradients are summed in
 * a fixed order) and cuBLAS is deterministic for one device and shape. Any difference means a pass
 * read other data, e.g. features not yet copied (X for -X moves the loss by ~1%). */
#define TWIN_LOSS_REL 0.0
#define TWIN_NORM_REL 0.0
#define TWIN_PARAM_ABS 0.0

static double cosine(const float *a, const float *b, size_t n)
{
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) TEST_FAIL("non-finite CUDA value at %zu", i);
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
}

/* The largest |difference| between two CUDA drafters' parameters (twins: 0). */
static double twin_param_diff(struct drafter_cuda *a, struct drafter_cuda *b, size_t np)
{
    float *pa = malloc(np * sizeof *pa), *pb = malloc(np * sizeof *pb);
    CHECK(pa && pb);
    CHECK_OK(drafter_cuda_download_params(a, pa));
    CHECK_OK(drafter_cuda_download_params(b, pb));
    double dmax = 0;
    for (size_t i = 0; i < np; i++)
        dmax = fmax(dmax, fabs((double)pa[i] - pb[i]));
    free(pa);
    free(pb);
    return dmax;
}

static struct drafter_cuda *make_cuda(struct drafter *d, int max_tokens, int max_blocks, int chunk)
{
    struct drafter_cuda *dc = NULL;
    struct drafter_cuda_opts o = { .device = 0, .head_chunk_rows = chunk };
    char err[256] = "";
    if (drafter_cuda_create(&dc, d, max_tokens, max_blocks, &o, err, sizeof err) < 0)
        TEST_FAIL("drafter_cuda_create: %s", err);
    return dc;
}

/* CPU and CUDA forward_backward of one batch; prints one table row, checks the bounds. */
static void compare_step(const char *name, struct drafter *d, struct drafter_cuda *dc,
                         const struct obj_batch *b, const struct obj_block *blk, int nb)
{
    struct drafter_metrics mc, mg, mf;
    CHECK_OK(drafter_forward_backward(d, b, blk, nb, GAMMA, &mc));
    CHECK_OK(drafter_cuda_forward_backward(dc, b, blk, nb, GAMMA, &mg));
    float *g = malloc(d->n_params * sizeof *g);
    CHECK(g);
    CHECK_OK(drafter_cuda_download_grads(dc, g));
    double lc = drafter_metrics_loss(&mc), lg = drafter_metrics_loss(&mg);
    double worst = 2;
    const char *worst_name = "-";
    for (int i = 0; i < d->n_tensors; i++) {
        const struct drafter_tensor *t = &d->tensors[i];
        double c = cosine(g + t->offset, d->grads + t->offset, t->numel);
        if (c < worst) {
            worst = c;
            worst_name = t->name;
        }
        if (c < 0.999)
            TEST_FAIL("%s: gradient of %s: cosine %.6f", name, t->name, c);
    }
    double all = cosine(g, d->grads, d->n_params);
    printf("%-10s blocks %4d tokens %5d | loss cpu %.6f cuda %.6f rel %.1e | acc %.3f/%.3f accept %.3f/%.3f"
           " | grad cos all %.6f worst %.6f (%s)\n", name, nb, b->n_tokens, lc, lg, fabs(lg - lc) / fabs(lc),
           drafter_metrics_accuracy(&mc), drafter_metrics_accuracy(&mg), drafter_metrics_accept_len(&mc),
           drafter_metrics_accept_len(&mg), all, worst, worst_name);
    CHECK(fabs(lg - lc) <= 1e-2 * fabs(lc));
    CHECK_NEAR(mg.weight_sum, mc.weight_sum, 1e-9 * mc.weight_sum);
    CHECK_NEAR(mg.supervised, mc.supervised, 0);
    CHECK_NEAR(mg.blocks, mc.blocks, 0);
    CHECK_NEAR(mg.tokens, mc.tokens, 0);
    CHECK_NEAR(mg.accept_blocks, mc.accept_blocks, 0);
    CHECK(fabs(mg.correct - mc.correct) <= fmax(2.0, 0.05 * mc.supervised));   /* bf16 near-ties */

    /* forward only: the same loss as the pass with backward, per-block losses near the CPU's */
    double *blc = calloc((size_t)nb, sizeof *blc), *blg = calloc((size_t)nb, sizeof *blg);
    CHECK(blc && blg);
    CHECK_OK(drafter_forward(d, b, blk, nb, GAMMA, NULL, blc));
    CHECK_OK(drafter_cuda_forward(dc, b, blk, nb, GAMMA, &mf, blg));
    CHECK_NEAR(mf.loss_sum, mg.loss_sum, 1e-6 * fabs(mg.loss_sum));
    double num = 0, den = 0, sum = 0;
    for (int i = 0; i < nb; i++) {
        num += fabs(blg[i] - blc[i]);
        den += fabs(blc[i]);
        sum += blg[i];
    }
    CHECK(num <= 2e-2 * den);
    CHECK_NEAR(sum, mg.loss_sum, 1e-9 * fabs(mg.loss_sum) + 1e-9);
    free(blc);
    free(blg);
    free(g);
}

/* ---- the golden batch (tools/golden_drafter.py) ---- */

static int32_t i32_at(const struct st_tensor *t, int64_t i)
{
    int32_t v;
    memcpy(&v, (const char *)t->data + i * 4, 4);
    return v;
}

static void golden_case(void)
{
    char path[1100], err[512] = "";
    struct st_set *in = NULL;
    snprintf(path, sizeof path, "%s/tests/data/golden_drafter/inputs.safetensors", test_srcdir());
    if (st_open_file(&in, path, err, sizeof err) < 0)
        TEST_FAIL("%s", err);
    struct drafter_config cfg;
    fixture_config(&cfg);
    cfg.rms_norm_eps = 1e-3;     /* the golden's (tools/golden_drafter.py: large, so that it shows) */
    const struct st_tensor *tt = st_find(in, "tokens"), *tm = st_find(in, "loss_mask");
    const struct st_tensor *tc = st_find(in, "cu_seqlens"), *ta = st_find(in, "anchors");
    const struct st_tensor *tas = st_find(in, "anchor_seq");
    CHECK(tt && tm && tc && ta && tas);
    int T = (int)tt->numel, n_seqs = (int)tc->numel - 1, nb = (int)ta->numel;
    uint32_t *tokens = malloc((size_t)T * sizeof *tokens);
    uint8_t *lmask = malloc((size_t)T);
    int32_t *cu = malloc((size_t)(n_seqs + 1) * sizeof *cu);
    struct obj_block *blk = malloc((size_t)nb * sizeof *blk);
    CHECK(tokens && lmask && cu && blk);
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
    /* buffers for more blocks than the GPU can hold: -DF_ERANGE (drafter-d exits 78 on it), naming
     * what to lower; the device stays usable */
    struct drafter_cuda *big = NULL;
    struct drafter_cuda_opts bo = { .device = 0 };
    CHECK_INT(drafter_cuda_create(&big, d, T, 1 << 26, &bo, err, sizeof err), ==, -DF_ERANGE);
    CHECK(!big);
    CHECK_CONTAINS(err, "lower ring.max_tokens");
    printf("too big: %s\n", err);
    /* more query rows per (block, kv head) than the attention kernels take: refused at create with
     * -DF_EUNSUPPORTED (drafter-d exits 78 on it), not with -EINVAL from inside the first step. The
     * check reads the configuration only, so a shallow copy with other head counts shows it. */
    struct drafter wide = *d;
    wide.cfg.block_size = GK_DFLASH_KEY_TILE;
    wide.cfg.num_heads = 1024;
    wide.cfg.num_kv_heads = 1;
    CHECK((long)wide.cfg.block_size * 1024 + GK_DFLASH_KEY_TILE >= 65536);
    CHECK_INT(drafter_cuda_create(&big, &wide, T, nb, &bo, err, sizeof err), ==, -DF_EUNSUPPORTED);
    CHECK(!big);
    CHECK_CONTAINS(err, "query rows");
    printf("too wide: %s\n", err);
    for (int i = 0; i < d->n_tensors; i++) {
        const struct drafter_tensor *t = &d->tensors[i];
        const struct st_tensor *st;
        if (st_expect(in, t->name, t->ndim, t->shape, &st, err, sizeof err) < 0)
            TEST_FAIL("%s", err);
        CHECK_OK(st_read_f32(st, 0, (int64_t)t->numel, d->params + t->offset));
    }
    struct obj_batch b = { .tokens = tokens, .loss_mask = lmask, .cu_seqlens = cu, .n_seqs = n_seqs,
                           .n_tokens = T, .hidden_f32 = hidden };
    struct drafter_cuda *dc = make_cuda(d, T, nb, 0);
    compare_step("golden", d, dc, &b, blk, nb);

    /* bf16 features straight from a host bf16 array give the same result as the converted f32 */
    uint16_t *hb = malloc((size_t)hshape[0] * hshape[1] * sizeof *hb);
    CHECK(hb);
    for (int64_t i = 0; i < hshape[0] * hshape[1]; i++)
        hb[i] = gk_f32_to_bf16(hidden[i]);
    struct obj_batch b16 = b;
    b16.hidden_f32 = NULL;
    b16.hidden_bf16 = hb;
    struct drafter_metrics m1, m2;
    CHECK_OK(drafter_cuda_forward(dc, &b, blk, nb, GAMMA, &m1, NULL));
    CHECK_OK(drafter_cuda_forward(dc, &b16, blk, nb, GAMMA, &m2, NULL));
    CHECK_NEAR(m1.loss_sum, m2.loss_sum, 1e-6 * fabs(m1.loss_sum));

    /* the optimizer step on identical gradients: the CPU's copied into the device buffer */
    struct drafter_metrics mc;
    CHECK_OK(drafter_forward_backward(d, &b, blk, nb, GAMMA, &mc));
    size_t n;
    float *dg = drafter_cuda_grads(dc, &n);
    CHECK_INT(n, ==, d->n_params);
    CUDA_CHECK(cudaMemcpy(dg, d->grads, n * sizeof(float), cudaMemcpyHostToDevice));
    struct drafter_train_opts o = { .lr = 3e-3, .min_lr_ratio = 0.1, .warmup_steps = 0, .total_steps = 100,
                                    .weight_decay = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8 };
    o.grad_clip = sqrt(optim_sumsq(d->grads, n)) / mc.weight_sum / 2;     /* so that clipping happens */
    struct drafter_step_info ic, ig;
    CHECK_OK(drafter_optimizer_step(d, mc.weight_sum, &o, &ic));
    CHECK_OK(drafter_cuda_optimizer_step(dc, mc.weight_sum, &o, &ig));
    printf("optimizer: grad norm cpu %.9g cuda %.9g, lr %.3g/%.3g, step %lld/%lld\n", ic.grad_norm, ig.grad_norm,
           ic.lr, ig.lr, (long long)ic.step, (long long)ig.step);
    CHECK(ic.grad_norm > o.grad_clip);    /* the clip path ran */
    CHECK_NEAR(ig.grad_norm, ic.grad_norm, 1e-5 * ic.grad_norm);
    CHECK_NEAR(ig.lr, ic.lr, 1e-12);
    CHECK_INT(ig.step, ==, ic.step);
    struct drafter *d2 = NULL;
    if (drafter_create(&d2, &cfg, embed, lm_head, T, nb, 99, err, sizeof err) < 0)
        TEST_FAIL("drafter_create: %s", err);
    CHECK_OK(drafter_cuda_sync_to_host(dc, d2));
    double pmax = 0, mmax = 0, vmax = 0;
    for (size_t i = 0; i < n; i++) {
        pmax = fmax(pmax, fabs(d2->params[i] - d->params[i]));
        mmax = fmax(mmax, fabs(d2->opt->m[i] - d->opt->m[i]) / (fabs(d->opt->m[i]) + 1e-12));
        vmax = fmax(vmax, fabs(d2->opt->v[i] - d->opt->v[i]) / (fabs(d->opt->v[i]) + 1e-20));
    }
    printf("optimizer: max |param diff| %.3g, max rel m diff %.3g, v diff %.3g\n", pmax, mmax, vmax);
    CHECK(pmax <= 1e-6);
    CHECK(mmax <= 1e-4 && vmax <= 1e-4);
    CHECK_INT(drafter_step_count(d2), ==, 1);

    /* a non-finite gradient: no update, -DF_ENAN */
    float nanv = NAN;
    CUDA_CHECK(cudaMemcpy(dg + 5, &nanv, sizeof nanv, cudaMemcpyHostToDevice));
    float *before = malloc(n * sizeof *before), *after = malloc(n * sizeof *after);
    CHECK(before && after);
    CHECK_OK(drafter_cuda_download_params(dc, before));
    CHECK_INT(drafter_cuda_optimizer_step(dc, mc.weight_sum, &o, &ig), ==, -DF_ENAN);
    CHECK_OK(drafter_cuda_download_params(dc, after));
    CHECK(!memcmp(before, after, n * sizeof *before));
    CHECK_INT(drafter_cuda_step_count(dc), ==, 1);

    /* a drafter loaded back from the host copy computes exactly the same */
    struct drafter_cuda *dc2 = make_cuda(d2, T, nb, 0);
    struct drafter_metrics ma, mb;
    CHECK_OK(drafter_cuda_forward(dc, &b, blk, nb, GAMMA, &ma, NULL));
    CHECK_OK(drafter_cuda_forward(dc2, &b, blk, nb, GAMMA, &mb, NULL));
    CHECK_NEAR(ma.loss_sum, mb.loss_sum, 1e-9 * fabs(ma.loss_sum));
    CHECK_INT(drafter_cuda_step_count(dc2), ==, 1);

    drafter_cuda_free(dc2);
    drafter_cuda_free(dc);
    drafter_free(d2);
    drafter_free(d);
    free(before);
    free(after);
    free(hb);
    free(hidden);
    free(embed);
    free(lm_head);
    free(tokens);
    free(lmask);
    free(cu);
    free(blk);
    st_close(in);
}

/* ---- random batches ---- */

static void random_case(const char *name, const struct drafter_config *cfg, int n_seqs, const int *lens,
                        const int *prompt, int num_anchors, int chunk, int train_steps)
{
    struct fixture f;
    fixture_init(&f, 11, n_seqs, lens, prompt);
    if (cfg) {      /* another shape: new frozen arrays and features for it */
        f.cfg = *cfg;
        int V = cfg->vocab_size, H = cfg->hidden_size, LcH = cfg->n_target_ids * H;
        struct obj_rng r;
        obj_rng_seed(&r, 5, 6, 7, 8);
        free(f.embed);
        free(f.lm_head);
        free(f.hidden);
        f.embed = malloc((size_t)V * H * sizeof(float));
        f.lm_head = malloc((size_t)V * H * sizeof(float));
        f.hidden = malloc((size_t)f.n_tokens * LcH * sizeof(float));
        CHECK(f.embed && f.lm_head && f.hidden);
        for (size_t i = 0; i < (size_t)V * H; i++) {
            f.embed[i] = (float)obj_rng_normal(&r);
            f.lm_head[i] = (float)(obj_rng_normal(&r) * 0.1);
        }
        for (size_t i = 0; i < (size_t)f.n_tokens * LcH; i++)
            f.hidden[i] = (float)obj_rng_normal(&r);
        for (int t = 0; t < f.n_tokens; t++)
            f.tokens[t] %= (uint32_t)(V - 1);
        f.batch.hidden_f32 = f.hidden;
    }
    int max_blocks = n_seqs * num_anchors;
    struct drafter *d = fixture_drafter(&f, max_blocks);
    fixture_randomize_params(d, 3, 0.08);
    struct obj_block *blk = malloc((size_t)max_blocks * sizeof *blk);
    int32_t *work = malloc((size_t)f.n_tokens * sizeof *work);
    CHECK(blk && work);
    struct obj_rng_key key = { .seed = 1, .epoch = 2, .batch_id = 3, .rank = 0 };
    int nb = obj_sample_anchors(&f.batch, num_anchors, &key, blk, max_blocks, work);
    CHECK(nb > 0);
    struct drafter_cuda *dc = make_cuda(d, f.n_tokens + 8, max_blocks, chunk);
    struct drafter_cuda *da = make_cuda(d, f.n_tokens + 8, max_blocks, chunk);  /* the asynchronous twin */
    compare_step(name, d, dc, &f.batch, blk, nb);

    /* train side by side on this batch: the losses follow each other and fall */
    struct drafter_train_opts o = { .lr = 2e-3, .min_lr_ratio = 0.1, .warmup_steps = 2, .total_steps = 50,
                                    .weight_decay = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                    .grad_clip = 1.0 };
    double first = 0, last = 0;
    struct drafter_metrics prev_m = { 0 };
    struct drafter_step_info prev_i = { 0 };
    for (int s = 0; s < train_steps; s++) {
        struct drafter_metrics mc, mg, ma;
        struct drafter_step_info ic, ig, ia;
        CHECK_OK(drafter_train_step(d, &f.batch, num_anchors, GAMMA, &key, &o, &mc, &ic));
        CHECK_OK(drafter_cuda_train_step(dc, &f.batch, num_anchors, GAMMA, &key, &o, &mg, &ig));
        /* the same step enqueued without waiting; its results read one step later */
        int na = obj_sample_anchors(&f.batch, num_anchors, &key, blk, max_blocks, work);
        CHECK(na == nb);
        CHECK_OK(drafter_cuda_forward_backward_async(da, &f.batch, blk, na, GAMMA));
        CHECK_OK(drafter_cuda_optimizer_step_async(da, &o));
        CHECK_INT(drafter_cuda_step_count(da), ==, s + 1);
        if (s > 0) {
            CHECK(drafter_cuda_result_event(da) != NULL);
            CHECK_OK(drafter_cuda_step_result(da, 1, &ma, &ia));
            CHECK_NEAR(ma.loss_sum, prev_m.loss_sum, TWIN_LOSS_REL * fabs(prev_m.loss_sum));
            CHECK_NEAR(ma.weight_sum, prev_m.weight_sum, 0);
            CHECK_NEAR(ma.tokens, prev_m.tokens, 0);
            CHECK_NEAR(ia.grad_norm, prev_i.grad_norm, TWIN_NORM_REL * prev_i.grad_norm);
            CHECK_NEAR(ia.lr, prev_i.lr, 1e-12);
            CHECK_INT(ia.step, ==, prev_i.step);
        }
        prev_m = mg;
        prev_i = ig;
        double lc = drafter_metrics_loss(&mc), lg = drafter_metrics_loss(&mg);
        printf("  %s train step %d: loss cpu %.5f cuda %.5f, grad norm %.4g / %.4g\n", name, s, lc, lg,
               ic.grad_norm, ig.grad_norm);
        CHECK(isfinite(lg));
        CHECK(fabs(lg - lc) <= 3e-2 * fabs(lc));
        if (s == 0)
            first = lg;
        last = lg;
    }
    if (train_steps > 1)
        CHECK(last < first);
    if (train_steps > 0) {
        struct drafter_metrics ma;
        struct drafter_step_info ia;
        CHECK_OK(drafter_cuda_step_result(da, 1, &ma, &ia));
        CHECK_INT(ia.step, ==, prev_i.step);
        CHECK_NEAR(ma.loss_sum, prev_m.loss_sum, TWIN_LOSS_REL * fabs(prev_m.loss_sum));
        CHECK_INT(drafter_cuda_step_result(da, 0, NULL, NULL), ==, -ENOENT);
        size_t np = d->n_params;
        double dmax = twin_param_diff(dc, da, np);
        printf("  %s async twin after %d steps: max |param diff| %.3g\n", name, train_steps, dmax);
        CHECK(dmax <= TWIN_PARAM_ABS);

        /* bf16 features from pinned memory (pitched rows), four steps enqueued at once on the twin,
         * so each copy runs while the step before computes. Features X, X, -X, -X: a copy landing
         * in a buffer that an earlier step still reads would change that step. The twin must match
         * the synchronous drafter step for step. Both start from one state (the synchronous one's,
         * through the host drafter, which is not used after this), so the first step's loss must
         * be bitwise the same: the forward has no atomics, and the third step's copy (-X) racing
         * into the buffer the first step reads would change it. */
        CHECK_OK(drafter_cuda_sync_to_host(dc, d));
        CHECK_OK(drafter_cuda_load_from_host(da, d));
        const size_t LcH = (size_t)f.cfg.n_target_ids * f.cfg.hidden_size, pitch = LcH + 8;
        const size_t nrow = (size_t)f.n_tokens;
        uint16_t *hx = NULL;
        CUDA_CHECK(cudaMallocHost((void **)&hx, 2 * nrow * pitch * sizeof *hx));
        for (size_t t = 0; t < nrow; t++)
            for (size_t j = 0; j < pitch; j++) {
                float x = j < LcH ? f.hidden[t * LcH + j] : NAN;    /* the row padding is never read */
                hx[t * pitch + j] = gk_f32_to_bf16(x);
                hx[(nrow + t) * pitch + j] = gk_f32_to_bf16(-x);
            }
        struct obj_batch bx[2] = { f.batch, f.batch };
        for (int k = 0; k < 2; k++) {
            bx[k].hidden_f32 = NULL;
            bx[k].hidden_bf16 = hx + (size_t)k * nrow * pitch;
            bx[k].hidden_pitch = pitch;
        }
        enum { K = 4 };
        const int pick[K] = { 0, 0, 1, 1 };
        struct drafter_metrics ms[K];
        struct drafter_step_info is[K];
        for (int s = 0; s < K; s++) {
            CHECK_OK(drafter_cuda_forward_backward(dc, &bx[pick[s]], blk, nb, GAMMA, &ms[s]));
            CHECK_OK(drafter_cuda_optimizer_step(dc, ms[s].weight_sum, &o, &is[s]));
        }
        for (int s = 0; s < K; s++) {
            CHECK_OK(drafter_cuda_forward_backward_async(da, &bx[pick[s]], blk, nb, GAMMA));
            CHECK_OK(drafter_cuda_optimizer_step_async(da, &o));
        }
        for (int s = 0; s < K; s++) {
            CHECK_OK(drafter_cuda_step_result(da, 1, &ma, &ia));
            CHECK_NEAR(ma.loss_sum, ms[s].loss_sum, TWIN_LOSS_REL * fabs(ms[s].loss_sum));
            CHECK_NEAR(ia.grad_norm, is[s].grad_norm, TWIN_NORM_REL * is[s].grad_norm);
            CHECK_INT(ia.step, ==, is[s].step);
            CHECK(ia.device_ms > 0 && ia.device_ms < 60e3);     /* each its own GPU time */
        }
        /* -X is another batch: a step that read it in place of X would be seen */
        CHECK(fabs(ms[2].loss_sum - ms[1].loss_sum) > 1e-3 * fabs(ms[1].loss_sum));
        dmax = twin_param_diff(dc, da, np);
        printf("  %s %d steps in flight on pinned bf16 features X, X, -X, -X: loss %.5f %.5f %.5f %.5f,"
               " max |param diff| %.3g\n", name, (int)K, drafter_metrics_loss(&ms[0]), drafter_metrics_loss(&ms[1]),
               drafter_metrics_loss(&ms[2]), drafter_metrics_loss(&ms[3]), dmax);
        CHECK(dmax <= TWIN_PARAM_ABS);
        cudaFreeHost(hx);
    }
    /* A pass whose step never came (its batch left out by the group) leaves its start behind; a
     * step with no pass on this rank (zeros into the sums) starts its device time itself and is not
     * charged the host's 300 ms since that pass. The step is skipped (nothing supervised), the
     * state untouched. */
    {
        CHECK_OK(drafter_cuda_forward_backward_async(da, &f.batch, blk, nb, GAMMA));
        cudaStream_t s = (cudaStream_t)drafter_cuda_stream(da);
        CHECK(cudaStreamSynchronize(s) == cudaSuccess);
        usleep(300000);
        size_t n;
        float *g = drafter_cuda_grads(da, &n);
        CHECK_OK(drafter_cuda_mark_start(da));
        CHECK(cudaMemsetAsync(g, 0, n * sizeof *g, s) == cudaSuccess &&
              cudaMemsetAsync(drafter_cuda_metrics_dev(da), 0, DRAFTER_METRICS_N * sizeof(double), s) == cudaSuccess);
        CHECK_OK(drafter_cuda_optimizer_step_async(da, &o));
        struct drafter_metrics mz;
        struct drafter_step_info iz;
        CHECK_INT(drafter_cuda_step_result(da, 1, &mz, &iz), ==, -DF_ERANGE);
        printf("  %s step without a pass, 300 ms after an unpaired one: device time %.3f ms\n", name, iz.device_ms);
        CHECK(iz.device_ms > 0 && iz.device_ms < 150);
    }
    /* nothing supervised: the asynchronous step is skipped and says so; a step enqueued behind it
     * before its result is read takes the exact step count: twice over, it gives the weights the
     * synchronous drafter's steps give from the same state without the skipped one (bitwise), and
     * the lr and step the CPU reference's step from that state reports. The schedule moves at every
     * step here, so a count one off would show. */
    {
        CHECK_OK(drafter_cuda_sync_to_host(da, d));
        CHECK_OK(drafter_cuda_load_from_host(dc, d));
        const int64_t before = drafter_cuda_step_count(da);
        CHECK_INT(before, ==, drafter_step_count(d));
        CHECK(optim_lr(o.lr, o.min_lr_ratio, o.warmup_steps, o.total_steps, before) !=
              optim_lr(o.lr, o.min_lr_ratio, o.warmup_steps, o.total_steps, before + 1));
        struct drafter_metrics ma, mg, mc;
        struct drafter_step_info ia, ig, ic;
        CHECK_OK(drafter_cuda_forward_backward_async(da, &f.batch, blk, 0, GAMMA));
        CHECK_OK(drafter_cuda_optimizer_step_async(da, &o));
        CHECK_OK(drafter_cuda_forward_backward_async(da, &f.batch, blk, nb, GAMMA));
        CHECK_OK(drafter_cuda_optimizer_step_async(da, &o));
        CHECK_INT(drafter_cuda_step_count(da), ==, before + 2);     /* in flight: counted as applied */
        CHECK_INT(drafter_cuda_step_result(da, 1, &ma, &ia), ==, -DF_ERANGE);
        CHECK_INT(ia.step, ==, before);
        CHECK_NEAR(ma.tokens, f.n_tokens, 0);
        CHECK_NEAR(ma.weight_sum, 0, 0);
        CHECK_OK(drafter_cuda_step_result(da, 1, &ma, &ia));
        CHECK_INT(drafter_cuda_step_count(da), ==, before + 1);
        CHECK_OK(drafter_cuda_forward_backward(dc, &f.batch, blk, nb, GAMMA, &mg));
        CHECK_OK(drafter_cuda_optimizer_step(dc, mg.weight_sum, &o, &ig));
        CHECK_OK(drafter_forward_backward(d, &f.batch, blk, nb, GAMMA, &mc));
        CHECK_OK(drafter_optimizer_step(d, mc.weight_sum, &o, &ic));
        printf("  %s skipped step in flight: step %lld lr %.9g; alone: step %lld lr %.9g; cpu: step %lld lr %.9g\n",
               name, (long long)ia.step, ia.lr, (long long)ig.step, ig.lr, (long long)ic.step, ic.lr);
        CHECK_INT(ia.step, ==, before + 1);
        CHECK_INT(ig.step, ==, before + 1);
        CHECK_INT(ic.step, ==, before + 1);
        CHECK_NEAR(ia.lr, ig.lr, 0);
        CHECK_NEAR(ia.lr, ic.lr, 1e-12 * ic.lr);
        CHECK_NEAR(ma.loss_sum, mg.loss_sum, TWIN_LOSS_REL * fabs(mg.loss_sum));
        CHECK_NEAR(ia.grad_norm, ig.grad_norm, TWIN_NORM_REL * ig.grad_norm);
        /* one more step each: the moments the skipped step left alone agree too */
        CHECK_OK(drafter_cuda_forward_backward_async(da, &f.batch, blk, nb, GAMMA));
        CHECK_OK(drafter_cuda_optimizer_step_async(da, &o));
        CHECK_OK(drafter_cuda_step_result(da, 1, &ma, &ia));
        CHECK_OK(drafter_cuda_forward_backward(dc, &f.batch, blk, nb, GAMMA, &mg));
        CHECK_OK(drafter_cuda_optimizer_step(dc, mg.weight_sum, &o, &ig));
        CHECK_INT(ia.step, ==, before + 2);
        CHECK_INT(ig.step, ==, before + 2);
        CHECK_NEAR(ia.lr, ig.lr, 0);
        double dmax = twin_param_diff(dc, da, d->n_params);
        printf("  %s after a skipped step in flight and two steps: max |param diff| from the steps alone %.3g\n",
               name, dmax);
        CHECK(dmax <= TWIN_PARAM_ABS);
    }
    drafter_cuda_free(da);
    drafter_cuda_free(dc);
    drafter_free(d);
    free(blk);
    free(work);
    fixture_done(&f);
}

int main(void)
{
    gk_test_require_gpu();
    golden_case();

    /* the tiny shape, longer sequences: contexts of several key tiles, many blocks a tile */
    const int lens[3] = { 150, 260, 90 }, prompt[3] = { 10, 40, 5 };
    random_case("long", NULL, 3, lens, prompt, 48, 37, 6);

    /* head_dim 128, 4 query heads on one kv head (64 query rows a block), odd vocabulary */
    struct drafter_config c;
    fixture_config(&c);
    c.hidden_size = 256;
    c.num_heads = 4;
    c.num_kv_heads = 1;
    c.head_dim = 128;
    c.intermediate_size = 384;
    c.vocab_size = 1003;
    c.mask_token_id = 1002;
    c.n_target_ids = 2;
    c.block_size = 16;
    const int lens2[2] = { 333, 200 }, prompt2[2] = { 20, 0 };
    random_case("hd128", &c, 2, lens2, prompt2, 40, 0, 4);
    CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}
#else
int main(void) { SKIP("built without CUDA"); }
#endif
