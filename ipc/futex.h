/* futex.h: shared (non-private) futex wait/wake on 32-bit words in a MAP_SHARED mapping.
 * Waits take an absolute CLOCK_MONOTONIC deadline so retries never stretch a timeout. */
#pragma once
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Sleep while *word == expect, until woken or `deadline` (NULL = no limit).
 * Returns 0 (woken or spurious), -EAGAIN (word already differs), -ETIMEDOUT, -EINTR. */
static inline int futex_wait_until(uint32_t *word, uint32_t expect, const struct timespec *deadline)
{
    long r = syscall(SYS_futex, word, FUTEX_WAIT_BITSET, expect, deadline, NULL, FUTEX_BITSET_MATCH_ANY);
    return r < 0 ? -errno : 0;
}

/* Wake up to n waiters (INT_MAX = all). */
static inline void futex_wake(uint32_t *word, int n)
{
    syscall(SYS_futex, word, FUTEX_WAKE, n, NULL, NULL, 0);
}
