/* rate.h: a running total's rate over the last ~10 seconds, from samples kept at most once a
 * second. What the daemons report as tokens/s: one that stops working shows its rate fall to 0
 * within the window, not its last batch's rate for as long as it lives. */
#pragma once
#include <stdint.h>

#define RATE_SAMPLES 11

struct rate_window {
    uint64_t ms[RATE_SAMPLES];  /* mono ms of each sample, oldest at head */
    double v[RATE_SAMPLES];
    int n, head;
};

/* Note the total `v` at `now_ms`; the rate per second from the oldest sample kept to now (0
 * before a second has passed). A total that went back (a counter reset) starts the window anew. */
static inline double rate_window_note(struct rate_window *w, uint64_t now_ms, double v)
{
    int last = (w->head + w->n + RATE_SAMPLES - 1) % RATE_SAMPLES;
    if (w->n && (v < w->v[last] || now_ms < w->ms[last]))
        w->n = 0;
    if (!w->n || now_ms >= w->ms[last] + 1000) {
        if (w->n == RATE_SAMPLES) {
            w->head = (w->head + 1) % RATE_SAMPLES;
            w->n--;
        }
        int at = (w->head + w->n) % RATE_SAMPLES;
        w->ms[at] = now_ms;
        w->v[at] = v;
        w->n++;
    }
    uint64_t dt = now_ms - w->ms[w->head];
    return dt >= 1000 ? (v - w->v[w->head]) * 1000.0 / (double)dt : 0.0;
}
