/* test_ring_view.c: `dflashctl ring` against a live coordinator-d shows each slot's batch as the
 * ring knows it: the one a READY slot holds, none for a slot being written (the ring learns a
 * payload's batch only when it is published: until then the slot's record is the previous one's). */
#include "tests/test_coord_util.h"

static void cleanup(void)
{
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

static void publish(struct ring *r, unsigned s, uint64_t batch)
{
    struct ring_payload *p = ring_slot_header(r, s);
    p->batch_id = batch;
    p->n_seqs = 1;
    p->n_tokens = 8;
    ring_slot_cu_seqlens(r, s)[0] = 0;
    ring_slot_cu_seqlens(r, s)[1] = 8;
    CHECK_OK(ring_publish(r, s));
}

/* The columns of slot s's row in `dflashctl ring`: state, owner, seq, batch, tokens. */
struct row { char state[16], owner[16], seq[24], batch[32], tokens[16]; };

static struct row ctl_row(unsigned s)
{
    char cmd[1200], line[256];
    snprintf(cmd, sizeof cmd, "%s -s '%s' ring", tc_bin("bin/dflashctl"), TC.sock);
    FILE *f = popen(cmd, "r");
    CHECK(f);
    struct row row = { .state = "" }, x;
    while (fgets(line, sizeof line, f)) {
        unsigned slot;
        if (sscanf(line, "%u %15s %15s %23s %31s %15s", &slot, x.state, x.owner, x.seq, x.batch, x.tokens) == 6 &&
            slot == s) {
            row = x;
            fprintf(stderr, "%s", line);
        }
    }
    CHECK_INT(pclose(f), ==, 0);
    if (!row.state[0])
        TEST_FAIL("dflashctl ring shows no row for slot %u", s);
    return row;
}

int main(void)
{
    atexit(cleanup);
    tc_setup(NULL, NULL);
    tc_dataset(TC.data, 50, 8, 100, 500);
    tc_start_coord();
    struct ring *r = NULL;
    char err[512];
    CHECK_OK(ring_attach(&r, TC.ring, NULL, RING_ATTACH_ANY, err, sizeof err));
    uint32_t n = ring_layout(r)->nslots;

    /* Every slot carries a published batch 7:(100 + slot), then is consumed ... */
    for (uint32_t i = 0; i < n; i++) {
        unsigned s;
        CHECK_OK(ring_claim_write(r, 0, &s));
        publish(r, s, (7ull << 32) | (100 + s));
    }
    for (uint32_t i = 0; i < n; i++) {
        unsigned s;
        CHECK_OK(ring_claim_read(r, NULL, 0, &s));
        CHECK_OK(ring_release(r, s));
    }
    /* ... and one is written again: its new batch is not known yet, the old one is not in it. */
    unsigned w, ready;
    CHECK_OK(ring_claim_write(r, 0, &w));
    CHECK_OK(ring_claim_write(r, 0, &ready));
    publish(r, ready, (8ull << 32) | 5);
    struct row row = ctl_row(w);
    CHECK_STR(row.state, "WRITING");
    CHECK_INT(atoi(row.owner), ==, getpid());
    CHECK_STR(row.batch, "-");
    CHECK_STR(row.seq, "-");
    CHECK_STR(row.tokens, "-");
    row = ctl_row(ready);
    CHECK_STR(row.state, "READY");
    CHECK_STR(row.batch, "8:5");
    CHECK_INT(atoi(row.seq), ==, n + 1);
    CHECK_STR(row.tokens, "8");
    CHECK_OK(ring_abort_write(r, w));
    ring_detach(r);
    return 0;
}
