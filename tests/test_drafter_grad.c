/* test_drafter_grad.c: the hand-written backward agrees with finite differences of the loss
 * for sampled entries of every tensor type (Richardson-extrapolated central differences). */
#include "tests/test_drafter_fixture.h"

static double loss_sum(struct drafter *d, struct fixture *f, const struct obj_block *blk, int nb)
{
    struct drafter_metrics m;
    CHECK_OK(drafter_forward(d, &f->batch, blk, nb, 7.0, &m, NULL));
    return m.loss_sum;
}

static double central(struct drafter *d, struct fixture *f, const struct obj_block *blk, int nb,
                      size_t i, double h)
{
    float keep = d->params[i];
    d->params[i] = (float)(keep + h);
    double hp = (double)d->params[i] - keep;
    double fp = loss_sum(d, f, blk, nb);
    d->params[i] = (float)(keep - h);
    double hm = keep - (double)d->params[i];
    double fm = loss_sum(d, f, blk, nb);
    d->params[i] = keep;
    return (fp - fm) / (hp + hm);
}

int main(void)
{
    int lens[3] = { 14, 11, 9 }, prompt[3] = { 3, 0, 4 };
    struct fixture f;
    fixture_init(&f, 11, 3, lens, prompt);
    struct drafter *d = fixture_drafter(&f, 64);
    fixture_randomize_params(d, 5, 0.25);

    struct obj_block blk[64];
    int32_t work[64];
    struct obj_rng_key key = { 1, 0, 0, 0 };
    int nb = obj_sample_anchors(&f.batch, 3, &key, blk, 64, work);
    CHECK_INT(nb, ==, 9);

    struct drafter_metrics m;
    CHECK_OK(drafter_forward_backward(d, &f.batch, blk, nb, 7.0, &m));
    CHECK(m.weight_sum > 0);
    float *grad = malloc(d->n_params * sizeof(float));
    memcpy(grad, d->grads, d->n_params * sizeof(float));

    /* The forward must be unchanged by computing the backward. */
    CHECK_NEAR(loss_sum(d, &f, blk, nb), m.loss_sum, 0.0);

    struct obj_rng r;
    obj_rng_seed(&r, 3, 3, 3, 3);
    int checked = 0, worst_t = -1;
    double worst = 0;
    for (int t = 0; t < d->n_tensors; t++) {
        const struct drafter_tensor *ten = &d->tensors[t];
        /* a few entries per tensor, always including its largest gradient */
        size_t big = 0;
        for (size_t j = 1; j < ten->numel; j++)
            if (fabsf(grad[ten->offset + j]) > fabsf(grad[ten->offset + big]))
                big = j;
        double gmax = fabsf(grad[ten->offset + big]);
        CHECK(gmax > 0);
        for (int s = 0; s < 4; s++) {
            size_t j = s == 0 ? big : (size_t)obj_rng_below(&r, ten->numel);
            size_t i = ten->offset + j;
            double h = 4e-2 * (fabs(d->params[i]) > 0.1 ? fabs(d->params[i]) : 0.1);
            double d1 = central(d, &f, blk, nb, i, h);
            double d2 = central(d, &f, blk, nb, i, h / 2);
            double fd = (4 * d2 - d1) / 3;
            double err = fabs(fd - grad[i]) / (gmax + 1e-3);
            if (err > worst) {
                worst = err;
                worst_t = t;
            }
            if (getenv("FD_VERBOSE")) printf("%-45s %8zu g=%12.6g fd=%12.6g rel=%.2e\n", ten->name, j, grad[i], fd, err);
            if (err > 2e-3 && !getenv("FD_VERBOSE"))
                TEST_FAIL("%s[%zu]: backward %.7g, finite difference %.7g (max |g| %.4g)", ten->name,
                          j, grad[i], fd, gmax);
            checked++;
        }
    }
    printf("checked %d entries of %d tensors; worst relative error %.3g (%s)\n", checked,
           d->n_tensors, worst, worst_t >= 0 ? d->tensors[worst_t].name : "-");
    free(grad);
    drafter_free(d);
    fixture_done(&f);
    return 0;
}
