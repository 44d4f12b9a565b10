/* test_drafter_dp.c: the data-parallel contract. Two ranks each run forward_backward on half of
 * a batch; summing their gradients and metric sums (what the all-reduce does) and stepping with
 * the global weight sum gives the step of one drafter on the whole batch. */
#include "tests/test_drafter_fixture.h"

int main(void)
{
    int lens[4] = { 14, 11, 9, 12 }, prompt[4] = { 3, 0, 4, 2 };
    struct fixture f;
    fixture_init(&f, 51, 4, lens, prompt);
    struct drafter *whole = fixture_drafter(&f, 64), *r0 = fixture_drafter(&f, 64), *r1 = fixture_drafter(&f, 64);
    fixture_randomize_params(whole, 4, 0.2);
    memcpy(r0->params, whole->params, whole->n_params * sizeof(float));
    memcpy(r1->params, whole->params, whole->n_params * sizeof(float));

    struct obj_block blk[64];
    int32_t work[64];
    struct obj_rng_key key = { 3, 1, 4, 0 };
    int nb = obj_sample_anchors(&f.batch, 3, &key, blk, 64, work);
    CHECK_INT(nb, ==, 12);

    /* rank 0 holds sequences 0-1, rank 1 sequences 2-3 (their own packed batches) */
    int split = f.cu[2];
    int32_t cu0[3] = { 0, f.cu[1], f.cu[2] }, cu1[3] = { 0, f.cu[3] - split, f.cu[4] - split };
    int LcH = f.cfg.n_target_ids * f.cfg.hidden_size;
    struct obj_batch b0 = { f.tokens, f.loss_mask, cu0, 2, split, NULL, f.hidden, 0 };
    struct obj_batch b1 = { f.tokens + split, f.loss_mask + split, cu1, 2, f.n_tokens - split, NULL,
                            f.hidden + (size_t)split * LcH, 0 };
    struct obj_block k0[64], k1[64];
    int n0 = 0, n1 = 0;
    for (int i = 0; i < nb; i++) {
        if (blk[i].seq < 2)
            k0[n0++] = blk[i];
        else
            k1[n1++] = (struct obj_block){ blk[i].anchor - split, blk[i].seq - 2 };
    }

    struct drafter_metrics mw, m0, m1;
    CHECK_OK(drafter_forward_backward(whole, &f.batch, blk, nb, 7.0, &mw));
    CHECK_OK(drafter_forward_backward(r0, &b0, k0, n0, 7.0, &m0));
    CHECK_OK(drafter_forward_backward(r1, &b1, k1, n1, 7.0, &m1));
    /* the all-reduce */
    double *a = (double *)&m0, *c = (double *)&m1;
    for (int i = 0; i < DRAFTER_METRICS_N; i++)
        a[i] += c[i];
    for (size_t i = 0; i < r0->n_params; i++)
        r0->grads[i] += r1->grads[i];
    memcpy(r1->grads, r0->grads, r0->n_params * sizeof(float));

    CHECK_NEAR(m0.loss_sum, mw.loss_sum, 1e-5 * mw.loss_sum);
    CHECK_NEAR(m0.weight_sum, mw.weight_sum, 1e-12 * mw.weight_sum);
    CHECK_NEAR(m0.correct, mw.correct, 0);
    CHECK_NEAR(m0.supervised, mw.supervised, 0);
    CHECK_NEAR(m0.accept_sum, mw.accept_sum, 0);
    CHECK_NEAR(m0.blocks, mw.blocks, 0);
    CHECK_NEAR(m0.tokens, mw.tokens, 0);

    struct drafter_train_opts o = { .lr = 1e-2, .min_lr_ratio = 0.1, .warmup_steps = 0, .total_steps = 0,
                                    .weight_decay = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                    .grad_clip = 0.0 };
    struct drafter_step_info iw, i0, i1;
    CHECK_OK(drafter_optimizer_step(whole, mw.weight_sum, &o, &iw));
    CHECK_OK(drafter_optimizer_step(r0, m0.weight_sum, &o, &i0));
    CHECK_OK(drafter_optimizer_step(r1, m0.weight_sum, &o, &i1));
    CHECK_NEAR(i0.grad_norm, iw.grad_norm, 1e-5 * iw.grad_norm);
    /* ranks stay identical; the step equals the whole-batch step (up to summation order) */
    CHECK(!memcmp(r0->params, r1->params, r0->n_params * sizeof(float)));
    double maxd = 0;
    for (size_t i = 0; i < whole->n_params; i++)
        maxd = fmax(maxd, fabs((double)r0->params[i] - whole->params[i]));
    printf("max |param difference| after one step: %.3g (lr %.0e)\n", maxd, o.lr);
    CHECK(maxd < 1e-2 * o.lr);   /* under 1% of an Adam step */
    drafter_free(whole);
    drafter_free(r0);
    drafter_free(r1);
    fixture_done(&f);
    return 0;
}
