/* progress.c: the start-up progress hook (see progress.h). */
#include <stdbool.h>
#include "common/progress.h"

static progress_fn g_fn;
static void *g_arg;
static _Thread_local bool tl_owner;
static _Thread_local size_t tl_bytes;

void progress_set(progress_fn fn, void *arg)
{
    g_fn = fn;
    g_arg = arg;
    tl_owner = fn != NULL;
    tl_bytes = 0;
}

void progress_tick(void)
{
    if (tl_owner && g_fn)
        g_fn(g_arg);
}

void progress_add(size_t bytes)
{
    if (!tl_owner)
        return;
    tl_bytes += bytes;
    if (tl_bytes >= PROGRESS_CHUNK_BYTES) {
        tl_bytes %= PROGRESS_CHUNK_BYTES;
        progress_tick();
    }
}
