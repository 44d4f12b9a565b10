/* test_rate.c: the rate over the last ~10 s that the daemons report as tokens/s (common/rate.h):
 * steady progress gives its rate, a stop brings it to 0 within the window, a counter that goes
 * back starts the window anew instead of giving a negative rate. */
#include "common/rate.h"
#include "tests/test.h"

int main(void)
{
    struct rate_window w = { 0 };
    CHECK_NEAR(rate_window_note(&w, 5000, 0), 0, 0);            /* one sample: no rate yet */
    CHECK_NEAR(rate_window_note(&w, 5500, 500), 0, 0);          /* under a second */
    double r = 0;
    uint64_t t = 5000;
    for (int i = 1; i <= 60; i++) {     /* 1000 a second, noted every 250 ms for 15 s */
        t += 250;
        r = rate_window_note(&w, t, 250.0 * i);
    }
    CHECK_NEAR(r, 1000, 1e-9);
    CHECK_INT(w.n, ==, RATE_SAMPLES);   /* samples kept at most once a second, the oldest dropped */
    double last = 15000;
    double prev = r;
    for (int i = 1; i <= 11; i++) {     /* stopped: the rate falls each second, 0 after the window */
        r = rate_window_note(&w, t + 1000 * (uint64_t)i, last);
        CHECK(r < prev || r == 0);
        prev = r;
    }
    CHECK_NEAR(r, 0, 0);
    r = rate_window_note(&w, t + 13000, 100);   /* the total went back (a reset): a new window */
    CHECK_NEAR(r, 0, 0);
    CHECK_INT(w.n, ==, 1);
    r = rate_window_note(&w, t + 15000, 300);
    CHECK_NEAR(r, 100, 1e-9);
    puts("ok");
    return 0;
}
