/* test_drafter_learn.c: training works. On synthetic sequences with structure (each token
 * follows from the previous one through a fixed permutation, with some noise; the target's
 * features encode the tokens), the loss falls well below its starting value within a few
 * hundred steps and the accepted length grows. */
#include <time.h>
#include "tests/test_drafter_fixture.h"

#define V 48
#define H 64
#define NSEQ 32
#define LEN 48
#define PER_BATCH 4

int main(void)
{
    struct drafter_config c;
    fixture_config(&c);
    c.hidden_size = H;
    c.vocab_size = V;
    c.mask_token_id = V - 1;
    c.num_layers = 1;
    c.intermediate_size = 128;
    c.n_target_ids = 2;
    c.num_target_layers = 4;
    c.target_layer_ids[0] = 1;
    c.target_layer_ids[1] = 2;
    c.block_size = 4;

    struct obj_rng r;
    obj_rng_seed(&r, 5, 5, 5, 5);
    float *embed = malloc(sizeof(float) * V * H), *head = malloc(sizeof(float) * V * H);
    float *feat = malloc(sizeof(float) * V * 2 * H);
    for (int i = 0; i < V * H; i++) {
        embed[i] = (float)obj_rng_normal(&r);
        head[i] = (float)(obj_rng_normal(&r) / 8.0);
    }
    for (int i = 0; i < V * 2 * H; i++)
        feat[i] = (float)obj_rng_normal(&r);
    int perm[V - 1];
    for (int i = 0; i < V - 1; i++)
        perm[i] = i;
    for (int i = V - 2; i > 0; i--) {
        int j = (int)obj_rng_below(&r, (uint64_t)i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    /* dataset: NSEQ sequences; 10% of the steps jump to a random token */
    static uint32_t tok[NSEQ][LEN];
    for (int s = 0; s < NSEQ; s++) {
        tok[s][0] = (uint32_t)obj_rng_below(&r, V - 1);
        for (int t = 1; t < LEN; t++)
            tok[s][t] = obj_rng_below(&r, 10) == 0 ? (uint32_t)obj_rng_below(&r, V - 1)
                                                   : (uint32_t)perm[tok[s][t - 1]];
    }
    const int T = PER_BATCH * LEN;
    uint32_t *bt = malloc(sizeof *bt * T);
    uint8_t *bm = malloc((size_t)T);
    float *bh = malloc(sizeof(float) * T * 2 * H);
    int32_t cu[PER_BATCH + 1];
    for (int s = 0; s <= PER_BATCH; s++)
        cu[s] = s * LEN;
    struct obj_batch b = { .tokens = bt, .loss_mask = bm, .cu_seqlens = cu, .n_seqs = PER_BATCH,
                           .n_tokens = T, .hidden_f32 = bh };

    struct drafter *d = NULL;
    char err[256];
    if (drafter_create(&d, &c, embed, head, T, PER_BATCH * 16, 1, err, sizeof err) < 0)
        TEST_FAIL("%s", err);
    struct drafter_train_opts o = { .lr = 5e-3, .min_lr_ratio = 0.1, .warmup_steps = 20,
                                    .total_steps = 500, .weight_decay = 0.01, .beta1 = 0.9,
                                    .beta2 = 0.95, .eps = 1e-8, .grad_clip = 1.0 };
    double first = 0, last = 0, acc_last = 0, accept_first = 0, accept_last = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int steps = 500, batches = NSEQ / PER_BATCH;
    for (int step = 0; step < steps; step++) {
        int bi = step % batches;
        for (int s = 0; s < PER_BATCH; s++)
            for (int t = 0; t < LEN; t++) {
                int i = s * LEN + t;
                bt[i] = tok[bi * PER_BATCH + s][t];
                bm[i] = t >= 3;     /* a short unsupervised prompt */
                memcpy(bh + (size_t)i * 2 * H, feat + (size_t)bt[i] * 2 * H, sizeof(float) * 2 * H);
            }
        struct obj_rng_key key = { 9, (uint64_t)(step / batches), (uint64_t)bi, 0 };
        struct drafter_metrics m;
        struct drafter_step_info info;
        CHECK_OK(drafter_train_step(d, &b, 16, 7.0, &key, &o, &m, &info));
        double loss = drafter_metrics_loss(&m);
        CHECK(isfinite(loss));
        if (step < 5) {
            first += loss / 5;
            accept_first += drafter_metrics_accept_len(&m) / 5;
        }
        if (step >= steps - 20) {
            last += loss / 20;
            acc_last += drafter_metrics_accuracy(&m) / 20;
            accept_last += drafter_metrics_accept_len(&m) / 20;
        }
        if (step % 50 == 0 || step == steps - 1)
            printf("step %3d loss %.4f acc %.3f accept %.3f lr %.2e |g| %.3f\n", step, loss,
                   drafter_metrics_accuracy(&m), drafter_metrics_accept_len(&m), info.lr, info.grad_norm);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("first %.4f last %.4f (%.1f%%), accuracy %.3f, accepted length %.2f -> %.2f, %.2f s\n",
           first, last, 100 * last / first, acc_last, accept_first, accept_last,
           (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
    CHECK(first > 3.0);                 /* about ln(47) at the start */
    CHECK(last < 0.25 * first);
    CHECK(acc_last > 0.75);
    CHECK(accept_last > accept_first + 1.5);
    drafter_free(d);
    free(embed);
    free(head);
    free(feat);
    free(bt);
    free(bm);
    free(bh);
    return 0;
}
