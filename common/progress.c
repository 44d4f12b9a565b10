/* progress.c: the start-up progress hook (see progress.h). */
#include <stdbool.h>
#include "common/progress.h"

static progress_fn g_fn;
static void *g_arg;
static _Thread_local bool tl_owner;

void progress_set(progress_fn fn, void *arg)
{
    g_fn = fn;
    g_arg = arg;
    tl_owner = fn != NULL;
}

void progress_tick(void)
{
    if (tl_owner && g_fn)
        g_fn(g_arg);
}
