/* test_drafter_mask.c: the attention mask of the objective. A block's loss does not change when
 * a token of another sequence, a context position at or after its anchor, another sequence's
 * context, or another block's input token changes; it does change with a context position before
 * its anchor (and with its own labels). */
#include "tests/test_drafter_fixture.h"

static void block_losses(struct drafter *d, struct fixture *f, const struct obj_block *blk, int nb,
                         double *out)
{
    struct drafter_metrics m;
    CHECK_OK(drafter_forward(d, &f->batch, blk, nb, 7.0, &m, out));
}

int main(void)
{
    int lens[3] = { 14, 12, 9 }, prompt[3] = { 2, 0, 1 };
    struct fixture f;
    fixture_init(&f, 31, 3, lens, prompt);
    struct drafter *d = fixture_drafter(&f, 16);
    fixture_randomize_params(d, 8, 0.25);
    int LcH = f.cfg.n_target_ids * f.cfg.hidden_size;

    /* blocks: seq 0 anchors 4, 8; seq 1 anchors 2, 6; seq 2 anchor 3 */
    int s1 = f.cu[1];
    struct obj_block blk[5] = { { 4, 0 }, { 8, 0 }, { s1 + 2, 1 }, { s1 + 6, 1 }, { f.cu[2] + 3, 2 } };
    const int nb = 5, target = 3;           /* the block under test: seq 1, anchor 6 */
    const int anchor = s1 + 6;
    double base[5], now[5];
    block_losses(d, &f, blk, nb, base);
    CHECK(base[target] > 0);

#define UNCHANGED(what) do { block_losses(d, &f, blk, nb, now); \
    if (now[target] != base[target]) TEST_FAIL("%s changed the block's loss: %.17g -> %.17g", what, \
                                               base[target], now[target]); \
    printf("unchanged: %s\n", what); } while (0)
#define CHANGED(what) do { block_losses(d, &f, blk, nb, now); \
    if (!(fabs(now[target] - base[target]) > 1e-6 * base[target])) \
        TEST_FAIL("%s did not change the block's loss (%.17g)", what, base[target]); \
    printf("changed:   %s (%.6g -> %.6g)\n", what, base[target], now[target]); } while (0)

    uint32_t keep_tok;
    float keep_h[512];
    CHECK(LcH <= 512);

    /* a token of another sequence: seq 0's anchor token and one of its labels */
    keep_tok = f.tokens[4];
    f.tokens[4] = (keep_tok + 5) % 90;
    UNCHANGED("anchor token of a block of another sequence");
    f.tokens[4] = keep_tok;
    keep_tok = f.tokens[10];
    f.tokens[10] = (keep_tok + 7) % 90;
    UNCHANGED("label token of another sequence");
    f.tokens[10] = keep_tok;

    /* another block of the same sequence: its input token (position anchor 2, before ours) */
    keep_tok = f.tokens[s1 + 2];
    f.tokens[s1 + 2] = (keep_tok + 3) % 90;
    UNCHANGED("input token of another block of the same sequence");
    f.tokens[s1 + 2] = keep_tok;

    /* context at and after the anchor */
    for (int pos = anchor; pos < f.cu[2]; pos++) {
        memcpy(keep_h, f.hidden + (size_t)pos * LcH, LcH * sizeof(float));
        for (int j = 0; j < LcH; j++)
            f.hidden[(size_t)pos * LcH + j] += 1.5f;
        char what[96];
        snprintf(what, sizeof what, "context at anchor%+d", pos - anchor);
        UNCHANGED(what);
        memcpy(f.hidden + (size_t)pos * LcH, keep_h, LcH * sizeof(float));
    }
    /* another sequence's context (the tokens just before ours, and the next sequence) */
    for (int pos = s1 - 3; pos < s1; pos++)
        for (int j = 0; j < LcH; j++)
            f.hidden[(size_t)pos * LcH + j] += 1.0f;
    for (int pos = f.cu[2]; pos < f.cu[3]; pos++)
        for (int j = 0; j < LcH; j++)
            f.hidden[(size_t)pos * LcH + j] -= 1.0f;
    UNCHANGED("context of other sequences");
    for (int pos = s1 - 3; pos < s1; pos++)
        for (int j = 0; j < LcH; j++)
            f.hidden[(size_t)pos * LcH + j] -= 1.0f;
    for (int pos = f.cu[2]; pos < f.cu[3]; pos++)
        for (int j = 0; j < LcH; j++)
            f.hidden[(size_t)pos * LcH + j] += 1.0f;
    block_losses(d, &f, blk, nb, now);
    for (int i = 0; i < nb; i++)
        CHECK_NEAR(now[i], base[i], 1e-5 * base[i]);   /* restored (up to rounding of +-1) */
    memcpy(base, now, sizeof base);

    /* every context position strictly before the anchor matters */
    for (int pos = s1; pos < anchor; pos++) {
        memcpy(keep_h, f.hidden + (size_t)pos * LcH, LcH * sizeof(float));
        for (int j = 0; j < LcH; j++)
            f.hidden[(size_t)pos * LcH + j] += 1.5f;
        char what[96];
        snprintf(what, sizeof what, "context at anchor%+d", pos - anchor);
        CHANGED(what);
        memcpy(f.hidden + (size_t)pos * LcH, keep_h, LcH * sizeof(float));
    }
    /* its own anchor token and labels */
    keep_tok = f.tokens[anchor];
    f.tokens[anchor] = (keep_tok + 11) % 90;
    CHANGED("its own anchor token");
    f.tokens[anchor] = keep_tok;
    keep_tok = f.tokens[anchor + 2];
    f.tokens[anchor + 2] = (keep_tok + 13) % 90;
    CHANGED("its own label at slot 2");
    f.tokens[anchor + 2] = keep_tok;
    /* a label masked out by the loss mask does not count */
    f.loss_mask[anchor + 1] = 0;
    keep_tok = f.tokens[anchor + 1];
    f.tokens[anchor + 1] = (keep_tok + 13) % 90;
    block_losses(d, &f, blk, nb, now);
    double masked = now[target];
    f.tokens[anchor + 1] = keep_tok;
    block_losses(d, &f, blk, nb, now);
    CHECK(now[target] == masked);
    printf("unchanged: a label with loss mask 0\n");

    drafter_free(d);
    fixture_done(&f);
    return 0;
}
