/* progress.h: a "still working" hook for the long loops of a daemon's start.
 *
 * Hashing a large dataset, reading a model's weights and loading a large ledger take minutes.
 * Those loops report what they have done; a daemon points the hook at its watchdog, so systemd
 * grants more start time while they move and stops a start that hangs (a page fault on a dead
 * network filesystem, say) a couple of minutes after the last sign of progress, not after a
 * fixed half hour.
 *
 * Only the thread that called progress_set() reports: from any other thread the calls do
 * nothing, so the hook is never entered twice at once and a hung main thread is not hidden. */
#pragma once
#include <stddef.h>

#define PROGRESS_CHUNK_BYTES ((size_t)8 << 20)   /* bytes read between two ticks */

typedef void (*progress_fn)(void *arg);

/* Install fn(arg) for the calling thread (NULL removes it); the byte count starts again. */
void progress_set(progress_fn fn, void *arg);
/* Call the hook (when installed, on its thread). Cheap: for loops that count their own steps. */
void progress_tick(void);
/* `bytes` more read: a tick each time the running count passes PROGRESS_CHUNK_BYTES, so many
 * small reads add up as one large one does. */
void progress_add(size_t bytes);
