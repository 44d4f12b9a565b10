/* test_drafter_init.c: fresh drafter parameters. The same seed gives the same bits whatever the
 * thread count; another seed, another tensor or another chunk gives other values; matrices are
 * N(0, initializer_range^2) (moments, tail mass, no correlation within Box-Muller pairs); norm
 * weights are 1. `test_drafter_init --bench [hidden layers intermediate n_ctx]` times the
 * initialisation of a big drafter instead. */
#include <time.h>
#include "model/drafter.h"
#include "tests/test.h"

static const double RANGE = 0.037;

static void config(struct drafter_config *c, int hidden, int layers, int heads, int kv_heads,
                   int head_dim, int intermediate, int n_ctx)
{
    memset(c, 0, sizeof *c);
    c->hidden_size = hidden;
    c->num_layers = layers;
    c->num_heads = heads;
    c->num_kv_heads = kv_heads;
    c->head_dim = head_dim;
    c->intermediate_size = intermediate;
    c->vocab_size = 64;
    c->num_target_layers = 36;
    c->n_target_ids = n_ctx;
    for (int i = 0; i < n_ctx; i++)
        c->target_layer_ids[i] = 1 + 8 * i;
    c->block_size = 16;
    c->mask_token_id = 63;
    c->max_position_embeddings = 32768;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 1e6;
    c->initializer_range = RANGE;
}

static struct drafter *create(const struct drafter_config *c, const float *embed, uint64_t seed)
{
    struct drafter *d = NULL;
    char err[256] = "";
    if (drafter_create(&d, c, embed, embed, 16, 4, seed, err, sizeof err) < 0)
        TEST_FAIL("drafter_create: %s", err);
    return d;
}

/* Overwrite everything, re-initialise with `threads`, compare bitwise with `want`. */
static void same_with_threads(struct drafter *d, uint64_t seed, int threads, const float *want)
{
    for (size_t i = 0; i < d->n_params; i++)
        d->params[i] = -3.0f;
    drafter_init_params(d, seed, threads);
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < d->n_params; i++)
        if (memcmp(&d->params[i], &want[i], sizeof(float)) && diff++ == 0)
            first = i;
    if (diff)
        TEST_FAIL("seed %llu, %d threads: %zu of %zu values differ, first at %zu (%.9g vs %.9g)",
                  (unsigned long long)seed, threads, diff, d->n_params, first, d->params[first],
                  want[first]);
}

static void check_norms_one(const struct drafter *d)
{
    for (int i = 0; i < d->n_tensors; i++) {
        const struct drafter_tensor *t = &d->tensors[i];
        if (t->ndim != 1)
            continue;
        for (size_t j = 0; j < t->numel; j++)
            if (d->params[t->offset + j] != 1.0f)
                TEST_FAIL("%s[%zu] = %.9g, not 1", t->name, j, d->params[t->offset + j]);
    }
}

static bool windows_equal(const float *a, const float *b, size_t n)
{
    return !memcmp(a, b, n * sizeof *a);
}

static void check_distribution(const struct drafter *d)
{
    double n = 0, s1 = 0, s2 = 0, s4 = 0, tail = 0, pair = 0, across = 0;
    double n_pair = 0, n_across = 0;
    for (int i = 0; i < d->n_tensors; i++) {
        const struct drafter_tensor *t = &d->tensors[i];
        if (t->ndim != 2)
            continue;
        const float *p = d->params + t->offset;
        double ts2 = 0;
        for (size_t j = 0; j < t->numel; j++) {
            double z = p[j] / RANGE;
            s1 += z;
            s2 += z * z;
            ts2 += z * z;
            s4 += z * z * z * z;
            tail += fabs(z) > 2.0;
            if (j % 2 == 0 && j + 1 < t->numel) {
                pair += z * (p[j + 1] / RANGE);     /* cosine and sine of one pair */
                n_pair++;
            } else if (j % 2 == 1 && j + 1 < t->numel) {
                across += z * (p[j + 1] / RANGE);   /* neighbouring pairs */
                n_across++;
            }
        }
        n += (double)t->numel;
        double tstd = sqrt(ts2 / (double)t->numel);
        printf("%-32s %9zu values, std/range %.5f\n", t->name, t->numel, tstd);
        CHECK_NEAR(tstd, 1.0, 6.0 / sqrt(2.0 * (double)t->numel) + 1e-4);
    }
    double mean = s1 / n, var = s2 / n - mean * mean, std = sqrt(var);
    double kurt = (s4 / n) / (var * var), tail_frac = tail / n;
    pair /= n_pair;
    across /= n_across;
    printf("%.0f values / range: mean %.3g, std %.6f, kurtosis %.4f, P(|z|>2) %.5f, "
           "corr within pairs %.3g, across pairs %.3g\n", n, mean, std, kurt, tail_frac, pair, across);
    /* ~6 standard errors each */
    CHECK_NEAR(mean, 0.0, 6.0 / sqrt(n));
    CHECK_NEAR(std, 1.0, 6.0 / sqrt(2.0 * n));
    CHECK_NEAR(kurt, 3.0, 6.0 * sqrt(96.0 / n));
    CHECK_NEAR(tail_frac, 0.0455003, 6.0 * sqrt(0.0455 * 0.9545 / n));
    CHECK_NEAR(pair, 0.0, 6.0 / sqrt(n_pair));
    CHECK_NEAR(across, 0.0, 6.0 / sqrt(n_across));
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Qwen3-8B-shaped layers (32 x 128 query heads, 8 KV heads). */
static int bench(int argc, char **argv)
{
    int hidden = argc > 2 ? atoi(argv[2]) : 4096, layers = argc > 3 ? atoi(argv[3]) : 1;
    int inter = argc > 4 ? atoi(argv[4]) : 12288, n_ctx = argc > 5 ? atoi(argv[5]) : 5;
    struct drafter_config c;
    config(&c, hidden, layers, 32, 8, 128, inter, n_ctx);
    c.initializer_range = 0.02;
    float *embed = calloc((size_t)c.vocab_size * (size_t)hidden, sizeof *embed);
    CHECK(embed);
    double t0 = now();
    struct drafter *d = create(&c, embed, 1);
    double t_create = now() - t0;
    printf("hidden %d, %d layers, intermediate %d, %d captured layers: %zu parameters\n", hidden,
           layers, inter, n_ctx, d->n_params);
    printf("drafter_create (default threads): %.2f s\n", t_create);
    int threads[] = { 1, 2, 4, 0 };
    for (size_t i = 0; i < sizeof threads / sizeof *threads; i++) {
        t0 = now();
        drafter_init_params(d, 1, threads[i]);
        double t = now() - t0;
        printf("drafter_init_params, threads %d%s: %.2f s (%.1f ns/value)\n", threads[i],
               threads[i] ? "" : " (default)", t, t * 1e9 / (double)d->n_params);
    }
    drafter_free(d);
    free(embed);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--bench"))
        return bench(argc, argv);

    /* gate/up/down hold 1.25 Mi values: more than one chunk of the generator each */
    struct drafter_config c;
    config(&c, 512, 1, 8, 4, 64, 2560, 3);
    float *embed = calloc((size_t)c.vocab_size * 512, sizeof *embed);
    CHECK(embed);
    struct drafter *d = create(&c, embed, 7);
    float *want = malloc(d->n_params * sizeof *want);
    CHECK(want);
    memcpy(want, d->params, d->n_params * sizeof *want);
    check_norms_one(d);
    check_distribution(d);

    int threads[] = { 1, 4, 3, 2, 16, 0 };
    for (size_t i = 0; i < sizeof threads / sizeof *threads; i++)
        same_with_threads(d, 7, threads[i], want);
    printf("seed 7: identical with 1, 4, 3, 2, 16 and the default number of threads\n");

    /* another seed: other matrices, the same norms */
    struct drafter *e = create(&c, embed, 8);
    check_norms_one(e);
    for (int i = 0; i < e->n_tensors; i++) {
        const struct drafter_tensor *t = &e->tensors[i];
        if (t->ndim != 2)
            continue;
        size_t same = 0;
        for (size_t j = 0; j < t->numel; j++)
            same += e->params[t->offset + j] == want[t->offset + j];
        if (same > t->numel / 1000)
            TEST_FAIL("%s: %zu of %zu values equal under seeds 7 and 8", t->name, same, t->numel);
    }
    drafter_free(e);

    /* every tensor and every stretch of a tensor draws from its own stream */
    const struct drafter_tensor *gate = drafter_find_tensor(d, "layers.0.mlp.gate_proj.weight");
    const struct drafter_tensor *up = drafter_find_tensor(d, "layers.0.mlp.up_proj.weight");
    CHECK(gate && up && gate->numel == up->numel && gate->numel > ((size_t)1 << 20) + 64);
    const float *g = d->params + gate->offset, *u = d->params + up->offset;
    CHECK(!windows_equal(g, u, 64));
    size_t offs[] = { 0, (size_t)1 << 18, (size_t)1 << 19, (size_t)1 << 20 };
    for (size_t a = 0; a < 4; a++)
        for (size_t b = a + 1; b < 4; b++)
            if (windows_equal(g + offs[a], g + offs[b], 64))
                TEST_FAIL("gate_proj: the 64 values at %zu and at %zu are equal", offs[a], offs[b]);
    printf("seed 8, other tensors and other stretches of one tensor: other values\n");
    drafter_free(d);
    free(want);
    free(embed);

    /* odd-sized matrices (fc 63 x 189, gate/up 81 x 63): the last value of each is drawn too */
    config(&c, 63, 2, 2, 1, 16, 81, 3);
    embed = calloc((size_t)c.vocab_size * 63, sizeof *embed);
    CHECK(embed);
    d = create(&c, embed, 11);
    want = malloc(d->n_params * sizeof *want);
    CHECK(want);
    memcpy(want, d->params, d->n_params * sizeof *want);
    check_norms_one(d);
    for (int i = 0; i < d->n_tensors; i++) {
        const struct drafter_tensor *t = &d->tensors[i];
        float last = d->params[t->offset + t->numel - 1];
        if (t->ndim == 2 && (!isfinite(last) || last == 0.0f || fabsf(last) > 10 * RANGE))
            TEST_FAIL("%s (%zu values): last value %.9g", t->name, t->numel, last);
    }
    same_with_threads(d, 11, 1, want);
    same_with_threads(d, 11, 5, want);
    printf("odd-sized matrices: drawn to the last value, identical with 1 and 5 threads\n");
    drafter_free(d);
    free(want);
    free(embed);
    return 0;
}
