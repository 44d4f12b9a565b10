/* progress.h: a "still working" hook for the long loops of a daemon's start.
 *
 * Hashing a large dataset and reading a model's weights take minutes. Those loops call
 * progress_tick() after every few MiB; a daemon points the hook at its watchdog, so systemd
 * grants more start time while they move and stops a start that hangs (a page fault on a dead
 * network filesystem, say) a couple of minutes after the last tick, not after a fixed half hour.
 *
 * Only the thread that called progress_set() reports: a tick from a helper thread is ignored,
 * so the hook is never entered twice at once and a hung main thread is not hidden. */
#pragma once
#include <stddef.h>

#define PROGRESS_CHUNK_BYTES ((size_t)8 << 20)   /* work between two ticks in the loops that tick */

typedef void (*progress_fn)(void *arg);

/* Install fn(arg) for the calling thread (NULL removes it). */
void progress_set(progress_fn fn, void *arg);
/* Call the hook when one is installed and this is its thread; otherwise nothing. Cheap. */
void progress_tick(void);
