/* test_objective.c: anchor sampling (candidates, counts, order, determinism by
 * (seed, epoch, batch id, rank), a draw of its own per sequence, uniformity, one pinned draw)
 * and block targets (same-position labels, slot 0 excluded, decay weights, loss mask, labels
 * past the sequence's end), the blocks a pass accepts. */
#include <float.h>
#include "common/err.h"
#include "tests/test_drafter_fixture.h"

static int sample(const struct obj_batch *b, int na, uint64_t seed, uint64_t epoch, uint64_t batch,
                  uint32_t rank, struct obj_block *out)
{
    int32_t work[256];
    struct obj_rng_key k = { seed, epoch, batch, rank };
    return obj_sample_anchors(b, na, &k, out, 256, work);
}

/* Each sequence draws its anchors with a stream of its own (keyed by its index too): two
 * sequences with as many candidates get different picks, not one draw repeated. One draw is
 * pinned: a change of the sampling shows here (checkpointed runs would resume on other anchors). */
static void anchors_per_sequence(void)
{
    int lens[2] = { 30, 30 }, prompt[2] = { 6, 6 };     /* 23 candidates each */
    struct fixture f;
    fixture_init(&f, 43, 2, lens, prompt);
    struct obj_block a[256];
    const int na = 4;
    int same = 0;
    for (int t = 0; t < 200; t++) {
        CHECK_INT(sample(&f.batch, na, 11 + (uint64_t)t, (uint64_t)t % 3, 1000 + (uint64_t)t, (uint32_t)t % 2, a), ==, 2 * na);
        int eq = 1;
        for (int k = 0; k < na; k++) {
            CHECK_INT(a[k].seq, ==, 0);
            CHECK_INT(a[na + k].seq, ==, 1);
            eq &= a[k].anchor - f.cu[0] == a[na + k].anchor - f.cu[1];
        }
        same += eq;
    }
    /* by chance: 1 in C(23, 4) = 8855 */
    if (same > 2)
        TEST_FAIL("%d of 200 keys gave both sequences the same anchors: the draw is not per sequence", same);

    static const int32_t golden[8] = { 10, 21, 26, 28, 39, 50, 54, 56 };
    CHECK_INT(sample(&f.batch, na, 1, 2, 3, 0, a), ==, 8);
    for (int k = 0; k < 8; k++)
        if (a[k].anchor != golden[k])
            TEST_FAIL("anchor %d of key (1, 2, 3, 0) is %d, was %d: the anchor draw changed", k, a[k].anchor, golden[k]);
    fixture_done(&f);
}

int main(void)
{
    anchors_per_sequence();
    int lens[4] = { 20, 6, 2, 30 }, prompt[4] = { 5, 0, 0, 4 };
    struct fixture f;
    fixture_init(&f, 41, 4, lens, prompt);
    f.loss_mask[f.cu[3] + 10] = 0;         /* a hole: anchors 9 and 10 of seq 3 are not candidates */
    char err[128];
    CHECK_OK(obj_batch_check(&f.batch, f.cfg.vocab_size, err, sizeof err));

    /* candidates per sequence */
    int cand[4] = { 0 };
    for (int s = 0; s < 4; s++)
        for (int p = f.cu[s]; p + 1 < f.cu[s + 1]; p++)
            cand[s] += f.loss_mask[p] && f.loss_mask[p + 1];
    CHECK_INT(cand[0], ==, 14);
    CHECK_INT(cand[1], ==, 5);
    CHECK_INT(cand[2], ==, 1);
    CHECK_INT(cand[3], ==, 23);

    struct obj_block a[256], b[256];
    const int na = 8;
    int n = sample(&f.batch, na, 1, 2, 3, 0, a);
    CHECK_INT(n, ==, 8 + 5 + 1 + 8);
    int i = 0;
    for (int s = 0; s < 4; s++) {
        int want = cand[s] < na ? cand[s] : na, prev = -1;
        for (int k = 0; k < want; k++, i++) {
            CHECK_INT(a[i].seq, ==, s);
            int p = a[i].anchor;
            CHECK(p > prev);                            /* ascending, no repeats */
            CHECK(p >= f.cu[s] && p + 1 < f.cu[s + 1]);
            CHECK(f.loss_mask[p] && f.loss_mask[p + 1]);
            prev = p;
        }
    }
    /* determinism and dependence on every key field */
    CHECK_INT(sample(&f.batch, na, 1, 2, 3, 0, b), ==, n);
    CHECK(!memcmp(a, b, (size_t)n * sizeof *a));
    uint64_t alt[4][4] = { { 9, 2, 3, 0 }, { 1, 9, 3, 0 }, { 1, 2, 9, 0 }, { 1, 2, 3, 9 } };
    for (int k = 0; k < 4; k++) {
        CHECK_INT(sample(&f.batch, na, alt[k][0], alt[k][1], alt[k][2], (uint32_t)alt[k][3], b), ==, n);
        CHECK(memcmp(a, b, (size_t)n * sizeof *a) != 0);
    }
    /* the blocks a pass accepts: sampled ones; a sequence or an anchor outside the batch is refused */
    CHECK_OK(obj_blocks_check(&f.batch, a, n));
    struct obj_block bad = a[0];
    bad.seq = 4;
    CHECK_INT(obj_blocks_check(&f.batch, &bad, 1), ==, -DF_ERANGE);
    bad.seq = -1;
    CHECK_INT(obj_blocks_check(&f.batch, &bad, 1), ==, -DF_ERANGE);
    bad = a[0];
    bad.anchor = f.cu[1];         /* the first token of the next sequence */
    CHECK_INT(obj_blocks_check(&f.batch, &bad, 1), ==, -DF_ERANGE);
    bad.anchor = f.cu[0] - 1;
    CHECK_INT(obj_blocks_check(&f.batch, &bad, 1), ==, -DF_ERANGE);
    CHECK_OK(obj_blocks_check(&f.batch, a, 0));

    /* too small an output */
    int32_t work[256];
    struct obj_rng_key key = { 1, 2, 3, 0 };
    CHECK_INT(obj_sample_anchors(&f.batch, na, &key, a, 10, work), <, 0);

    /* uniform over the candidates of sequence 3: each of 23 chosen 8/23 of the time */
    int hits[64] = { 0 };
    const int trials = 4000;
    for (int t = 0; t < trials; t++) {
        int m = sample(&f.batch, na, 7, 0, (uint64_t)t, 0, a);
        for (int k = 0; k < m; k++)
            if (a[k].seq == 3)
                hits[a[k].anchor - f.cu[3]]++;
    }
    double expect = trials * 8.0 / 23.0;
    for (int p = 0; p < 30; p++) {
        int is_cand = p >= 4 && p + 1 < 30 && p != 9 && p != 10;
        if (!is_cand)
            CHECK_INT(hits[p], ==, 0);
        else
            CHECK(fabs(hits[p] - expect) < 0.12 * expect);
    }

    /* targets: same position, slot 0 excluded, decay, loss mask, end of sequence */
    struct obj_block blk = { f.cu[3] + 8, 3 };
    int32_t label[4];
    float w[4];
    obj_block_targets(&f.batch, &blk, 4, 7.0, label, w);
    for (int k = 0; k < 4; k++)
        CHECK_INT(label[k], ==, f.tokens[blk.anchor + k]);
    CHECK(w[0] == 0.0f);
    CHECK_NEAR(w[1], 1.0, 0);
    CHECK(w[2] == 0.0f);                             /* position 10: loss mask 0 */
    CHECK_NEAR(w[3], exp(-2.0 / 7.0), 1e-7);
    struct obj_block end = { f.cu[4] - 2, 3 };
    obj_block_targets(&f.batch, &end, 4, 7.0, label, w);
    CHECK_INT(label[1], ==, f.tokens[f.cu[4] - 1]);
    CHECK_NEAR(w[1], 1.0, 0);
    CHECK(label[2] == -1 && w[2] == 0.0f && label[3] == -1 && w[3] == 0.0f);
    /* a decay that underflows float (gamma 0.01: exp(-200)) keeps the slot supervised (w > 0
     * marks the labels the accuracy counts), at the smallest normal weight; a masked one stays 0 */
    obj_block_targets(&f.batch, &blk, 4, 0.01, label, w);
    CHECK(w[0] == 0.0f && w[1] == 1.0f && w[2] == 0.0f && w[3] == FLT_MIN);
    CHECK_NEAR(obj_decay(1, 7.0), 1.0, 0);
    CHECK_NEAR(obj_decay(15, 7.0), exp(-2.0), 1e-15);
    CHECK_NEAR(obj_decay(5, 0.0), 1.0, 0);
    CHECK_NEAR(obj_decay(0, 7.0), 0.0, 0);

    /* batch checks */
    f.cu[4] = f.n_tokens + 1;
    CHECK_INT(obj_batch_check(&f.batch, f.cfg.vocab_size, err, sizeof err), <, 0);
    CHECK_CONTAINS(err, "cu_seqlens");
    f.cu[4] = f.n_tokens;
    f.tokens[3] = 500;
    CHECK_INT(obj_batch_check(&f.batch, f.cfg.vocab_size, err, sizeof err), <, 0);
    CHECK_CONTAINS(err, "vocabulary");
    fixture_done(&f);
    return 0;
}
