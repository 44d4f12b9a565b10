/* test_sched.c: the batch schedule: same seed -> same batches, every sample exactly once
 * per epoch, no batch over the token budget or the sequence cap, epochs differ, the batch
 * order is shuffled (not short batches first); samples of length 0 (nothing to train) are left
 * out and the others keep the schedule they had before samples were left out. */
#include "daemons/coordinator/sched.c"
#include "tests/test.h"

static uint64_t hash_epoch(const struct sched_epoch *e, uint32_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint32_t b = 0; b <= e->n_batches; b++)
        h = (h ^ e->first[b]) * 1099511628211ull;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ e->samples[i]) * 1099511628211ull;
    return h;
}

static void check_epoch(const struct sched_epoch *e, const uint32_t *len, uint32_t n, const struct sched_params *p)
{
    uint8_t *seen = calloc(n, 1);
    uint32_t kept = 0;
    for (uint32_t i = 0; i < n; i++)
        kept += len[i] > 0;
    CHECK_INT(e->first[0], ==, 0);
    CHECK_INT(e->first[e->n_batches], ==, kept);
    uint64_t small = 0;
    for (uint32_t b = 0; b < e->n_batches; b++) {
        uint32_t tok = 0, k = e->first[b + 1] - e->first[b];
        CHECK(k >= 1);
        CHECK_INT(k, <=, p->max_seqs);
        for (uint32_t i = e->first[b]; i < e->first[b + 1]; i++) {
            uint32_t s = e->samples[i];
            CHECK_INT(s, <, n);
            if (!len[s])
                TEST_FAIL("sample %u of length 0 in epoch %u", s, e->epoch);
            if (seen[s])
                TEST_FAIL("sample %u twice in epoch %u", s, e->epoch);
            seen[s] = 1;
            tok += len[s] < p->max_seq_len ? len[s] : p->max_seq_len;
        }
        CHECK_INT(tok, ==, e->tokens[b]);
        CHECK_INT(tok, <=, p->token_budget);
        if (tok < p->token_budget / 2 && k < p->max_seqs)
            small++;
    }
    for (uint32_t i = 0; i < n; i++)
        if (!seen[i] && len[i])
            TEST_FAIL("sample %u missing from epoch %u", i, e->epoch);
    /* Packing is greedy: few half-empty batches (at most one per bucket boundary). */
    CHECK_INT(small, <=, p->max_seq_len / p->bucket_width + 2);
    free(seen);
}

/* Pearson correlation of batch position and the batch's mean (truncated) length: about 0 when
 * the batch order is shuffled, near 1 when the batches come in bucket order. */
static double order_vs_length(const struct sched_epoch *e, const uint32_t *len, const struct sched_params *p)
{
    double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0, nb = e->n_batches;
    for (uint32_t b = 0; b < e->n_batches; b++) {
        double sum = 0;
        for (uint32_t i = e->first[b]; i < e->first[b + 1]; i++)
            sum += len[e->samples[i]] < p->max_seq_len ? len[e->samples[i]] : p->max_seq_len;
        double x = b, y = sum / (e->first[b + 1] - e->first[b]);
        sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y;
    }
    return (nb * sxy - sx * sy) / sqrt((nb * sxx - sx * sx) * (nb * syy - sy * sy));
}

/* n lengths in [1, max] from a fixed LCG seeded with `seed`. */
static void random_lengths(uint32_t *len, uint32_t n, uint64_t seed, uint32_t max)
{
    uint64_t x = seed;
    for (uint32_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        len[i] = 1 + (uint32_t)((x >> 33) % max);
    }
}

/* The batch order of each epoch is shuffled: batch position says nothing of the batch's length
 * (without the shuffle every epoch trains the short batches first). */
static void batch_order_shuffled(void)
{
    enum { N = 2000 };
    static uint32_t len[N];
    random_lengths(len, N, 777, 2500);
    struct sched_params p = { .seed = 1234, .token_budget = 8192, .max_seq_len = 2048, .bucket_width = 256, .max_seqs = 64 };
    char err[256];
    for (uint32_t ep = 0; ep < 3; ep++) {
        struct sched_epoch e;
        CHECK_OK(sched_build(len, N, &p, ep, &e, err, sizeof err));
        CHECK_INT(e.n_batches, >=, 100);
        double rho = order_vs_length(&e, len, &p);
        printf("epoch %u: %u batches, correlation of position and mean length %.3f\n", ep, e.n_batches, rho);
        if (!(fabs(rho) < 0.3))
            TEST_FAIL("epoch %u: batch position and mean length correlate (%.3f): the batch order is not shuffled", ep, rho);
        sched_epoch_done(&e);
    }
}

int main(void)
{
    batch_order_shuffled();
    enum { N = 20000 };
    static uint32_t len[N];
    random_lengths(len, N, 12345, 3000);
    struct sched_params p = { .seed = 1234, .token_budget = 8192, .max_seq_len = 2048, .bucket_width = 256, .max_seqs = 64 };
    char err[256];
    struct sched_epoch a, b, c, d;
    CHECK_OK(sched_build(len, N, &p, 0, &a, err, sizeof err));
    CHECK_OK(sched_build(len, N, &p, 0, &b, err, sizeof err));
    CHECK_OK(sched_build(len, N, &p, 1, &c, err, sizeof err));
    check_epoch(&a, len, N, &p);
    check_epoch(&c, len, N, &p);
    CHECK_INT(a.n_batches, ==, b.n_batches);
    CHECK_INT(hash_epoch(&a, N), ==, hash_epoch(&b, N));        /* deterministic */
    CHECK(hash_epoch(&a, N) != hash_epoch(&c, N));              /* reshuffled per epoch */
    /* the schedules of these lengths as made before samples of length 0 were left out: a run's
     * ledger (its fingerprint, its batches) stays valid when none of its samples is left out */
    CHECK_INT(hash_epoch(&a, N), ==, 0x48757d72d1b38387ull);
    CHECK_INT(hash_epoch(&c, N), ==, 0x7f49c856ab951ff5ull);
    struct sched_params q = p;
    q.seed = 99;
    CHECK_OK(sched_build(len, N, &q, 0, &d, err, sizeof err));
    check_epoch(&d, len, N, &q);
    CHECK(hash_epoch(&a, N) != hash_epoch(&d, N));              /* seed matters */
    printf("epoch 0: %u batches, epoch 1: %u batches\n", a.n_batches, c.n_batches);

    /* Bucketing: inside a batch lengths are close (one bucket, or two at a boundary). */
    uint32_t spread_ok = 0;
    for (uint32_t bi = 0; bi < a.n_batches; bi++) {
        uint32_t lo = UINT32_MAX, hi = 0;
        for (uint32_t i = a.first[bi]; i < a.first[bi + 1]; i++) {
            uint32_t l = len[a.samples[i]] < p.max_seq_len ? len[a.samples[i]] : p.max_seq_len;
            lo = l < lo ? l : lo;
            hi = l > hi ? l : hi;
        }
        spread_ok += hi - lo < 2 * p.bucket_width;
    }
    CHECK_INT(spread_ok, >=, a.n_batches - 8);

    /* The fingerprint changes with any input. */
    uint64_t f = sched_fingerprint(len, N, &p);
    CHECK_INT(f, ==, sched_fingerprint(len, N, &p));
    CHECK(f != sched_fingerprint(len, N, &q));
    len[7]++;
    CHECK(f != sched_fingerprint(len, N, &p));
    CHECK(f != sched_fingerprint(len, N - 1, &p));

    /* Sequence cap: tiny samples stop at max_seqs, not at the budget. */
    static uint32_t ones[1000];
    for (int i = 0; i < 1000; i++)
        ones[i] = 1;
    struct sched_params r = { .seed = 1, .token_budget = 512, .max_seq_len = 16, .bucket_width = 4, .max_seqs = 10 };
    sched_epoch_done(&d);
    CHECK_OK(sched_build(ones, 1000, &r, 0, &d, err, sizeof err));
    CHECK_INT(d.n_batches, ==, 100);
    check_epoch(&d, ones, 1000, &r);

    /* Samples of length 0 (dataset_sched_lengths: nothing in them trains) are left out, the
     * others each once; with none left, the schedule is refused. */
    static uint32_t some[3000];
    random_lengths(some, 3000, 99, 300);
    for (int i = 0; i < 3000; i += 3)
        some[i] = 0;
    struct sched_params t = { .seed = 5, .token_budget = 1024, .max_seq_len = 256, .bucket_width = 32, .max_seqs = 16 };
    sched_epoch_done(&d);
    CHECK_OK(sched_build(some, 3000, &t, 0, &d, err, sizeof err));
    check_epoch(&d, some, 3000, &t);
    CHECK_INT(d.first[d.n_batches], ==, 2000);
    sched_epoch_done(&d);
    static uint32_t none[5];
    CHECK(sched_build(none, 5, &t, 0, &d, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "no samples that train anything");

    /* A sample could not fit a batch: refused with the reason. */
    sched_epoch_done(&d);
    struct sched_params bad = p;
    bad.max_seq_len = 10000;
    CHECK(sched_build(len, N, &bad, 0, &d, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "data.max_seq_len (10000) is larger than data.token_budget (8192)");
    sched_epoch_done(&a);
    sched_epoch_done(&b);
    sched_epoch_done(&c);
    sched_epoch_done(&d);
    printf("sched ok\n");
    return 0;
}
