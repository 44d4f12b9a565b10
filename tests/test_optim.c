/* test_optim.c: AdamW update against a double-precision reference (bias correction, decoupled
 * decay only where asked), the warmup + cosine schedule, and clipping in drafter_optimizer_step. */
#include "model/optim.h"
#include "tests/test_drafter_fixture.h"

int main(void)
{
    /* schedule */
    CHECK_NEAR(optim_lr(1.0, 0.1, 10, 110, 0), 0.1, 1e-15);
    CHECK_NEAR(optim_lr(1.0, 0.1, 10, 110, 9), 1.0, 1e-15);
    CHECK_NEAR(optim_lr(1.0, 0.1, 10, 110, 10), 1.0, 1e-15);
    CHECK_NEAR(optim_lr(1.0, 0.1, 10, 110, 60), 0.55, 1e-12);
    CHECK_NEAR(optim_lr(1.0, 0.1, 10, 110, 110), 0.1, 1e-12);
    CHECK_NEAR(optim_lr(1.0, 0.1, 10, 110, 500), 0.1, 1e-12);
    CHECK_NEAR(optim_lr(2.0, 0.1, 0, 0, 7), 2.0, 0);
    for (int s = 11; s < 110; s++)
        CHECK(optim_lr(1.0, 0.1, 10, 110, s) <= optim_lr(1.0, 0.1, 10, 110, s - 1));

    /* AdamW: 3 steps vs a double reference; segment 1 has no weight decay */
    struct optim_segment seg[2] = { { 0, 3, true }, { 3, 2, false } };
    struct optim o;
    CHECK_OK(optim_init(&o, 5, seg, 2));
    float w[5] = { 0.5f, -1.0f, 2.0f, 0.25f, -0.75f };
    double rw[5], rm[5] = { 0 }, rv[5] = { 0 };
    for (int i = 0; i < 5; i++)
        rw[i] = w[i];
    const double lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    for (int step = 1; step <= 3; step++) {
        float g[5];
        for (int i = 0; i < 5; i++)
            g[i] = (float)(0.3 * (i + 1) * (step % 2 ? 1 : -1) + 0.05 * step);
        optim_adamw(&o, w, g, lr, b1, b2, eps, wd);
        for (int i = 0; i < 5; i++) {
            rm[i] = b1 * rm[i] + (1 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1 - b2) * (double)g[i] * g[i];
            if (i < 3)
                rw[i] *= 1 - lr * wd;
            double mh = rm[i] / (1 - pow(b1, step)), vh = rv[i] / (1 - pow(b2, step));
            rw[i] -= lr * mh / (sqrt(vh) + eps);
        }
        for (int i = 0; i < 5; i++)
            CHECK_NEAR(w[i], rw[i], 2e-6);
    }
    CHECK_INT(o.step, ==, 3);
    optim_done(&o);

    /* drafter_optimizer_step: scale by 1/weight_sum, clip to the global norm, skip on nothing */
    int lens[2] = { 10, 8 }, prompt[2] = { 0, 0 };
    struct fixture f;
    fixture_init(&f, 3, 2, lens, prompt);
    struct drafter *d = fixture_drafter(&f, 16);
    struct drafter_train_opts opt = { .lr = 1e-3, .min_lr_ratio = 0.1, .warmup_steps = 0,
                                      .total_steps = 0, .weight_decay = 0, .beta1 = 0.9,
                                      .beta2 = 0.95, .eps = 1e-8, .grad_clip = 0.5 };
    for (size_t i = 0; i < d->n_params; i++)
        d->grads[i] = (i % 7) - 3.0f;
    double ss = 0;
    for (size_t i = 0; i < d->n_params; i++)
        ss += (double)d->grads[i] * d->grads[i];
    struct drafter_step_info info;
    CHECK_OK(drafter_optimizer_step(d, 4.0, &opt, &info));
    CHECK_NEAR(info.grad_norm, sqrt(ss) / 4.0, 1e-6 * sqrt(ss));
    CHECK_NEAR(sqrt(optim_sumsq(d->grads, d->n_params)), 0.5, 1e-5);
    CHECK_INT(info.step, ==, 1);
    CHECK_NEAR(info.lr, 1e-3, 0);
    CHECK_INT(drafter_optimizer_step(d, 0.0, &opt, &info), <, 0);
    CHECK_INT(drafter_step_count(d), ==, 1);
    d->grads[5] = NAN;
    CHECK_INT(drafter_optimizer_step(d, 1.0, &opt, &info), <, 0);
    CHECK_INT(drafter_step_count(d), ==, 1);
    drafter_free(d);
    fixture_done(&f);
    return 0;
}
