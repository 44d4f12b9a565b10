/* timeutil.h: monotonic and wall clock helpers.
 * Durations and timeouts always use CLOCK_MONOTONIC; wall time only for logs. */
#pragma once
#include <stdint.h>
#include <time.h>

static inline uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t mono_ms(void) { return mono_ns() / 1000000ull; }

static inline uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

/* Absolute CLOCK_MONOTONIC deadline `ms` from now, as a timespec. */
static inline struct timespec mono_deadline(uint64_t ms)
{
    uint64_t t = mono_ns() + ms * 1000000ull;
    return (struct timespec){ .tv_sec = (time_t)(t / 1000000000ull), .tv_nsec = (long)(t % 1000000000ull) };
}
