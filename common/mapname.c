/* mapname.c: a fixed table of named mappings for the SIGBUS report (see mapname.h). Each slot is
 * a sequence lock: its count is odd while add or remove rewrites it, and a lookup keeps what it
 * copied only when the count was even and unchanged around the copy, so it never pairs one
 * mapping's range with another's name. */
#include "mapname.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "common/log.h"

#define NAME_LEN 200

static struct {
    _Atomic unsigned seq;
    _Atomic uintptr_t base;         /* 0: free */
    _Atomic size_t len;
    char name[NAME_LEN];
} g_maps[MAPNAME_MAX];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_full_warned;

/* "kind name" into dst; a name too long for it keeps its end (the file's own name) after "..." */
static void put_name(char *dst, const char *kind, const char *name)
{
    int k = snprintf(dst, NAME_LEN, "%.40s ", kind);
    size_t room = NAME_LEN - 1 - (size_t)k, n = strlen(name);
    if (n <= room)
        memcpy(dst + k, name, n + 1);
    else
        snprintf(dst + k, room + 1, "...%s", name + n - (room - 3));
}

void mapname_add(const void *base, size_t len, const char *kind, const char *name)
{
    if (!base || !len)
        return;
    pthread_mutex_lock(&g_lock);
    int i = 0;
    while (i < MAPNAME_MAX && atomic_load_explicit(&g_maps[i].base, memory_order_relaxed))
        i++;
    if (i == MAPNAME_MAX) {
        if (!g_full_warned++)
            log_warn(0, "more than %d mappings at once: a SIGBUS in %s %s and later ones will not name them",
                     MAPNAME_MAX, kind, name);
    } else {
        atomic_fetch_add_explicit(&g_maps[i].seq, 1, memory_order_relaxed);       /* odd: being written */
        atomic_thread_fence(memory_order_release);
        put_name(g_maps[i].name, kind, name);
        atomic_store_explicit(&g_maps[i].len, len, memory_order_relaxed);
        atomic_store_explicit(&g_maps[i].base, (uintptr_t)base, memory_order_relaxed);
        atomic_fetch_add_explicit(&g_maps[i].seq, 1, memory_order_release);       /* even: whole */
    }
    pthread_mutex_unlock(&g_lock);
}

void mapname_remove(const void *base)
{
    if (!base)
        return;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < MAPNAME_MAX; i++)
        if (atomic_load_explicit(&g_maps[i].base, memory_order_relaxed) == (uintptr_t)base) {
            atomic_fetch_add_explicit(&g_maps[i].seq, 1, memory_order_relaxed);
            atomic_thread_fence(memory_order_release);
            atomic_store_explicit(&g_maps[i].base, 0, memory_order_relaxed);
            atomic_fetch_add_explicit(&g_maps[i].seq, 1, memory_order_release);
        }
    pthread_mutex_unlock(&g_lock);
}

size_t mapname_find(const void *addr, char *buf, size_t len)
{
    if (!len)
        return 0;
    uintptr_t a = (uintptr_t)addr;
    for (int i = 0; i < MAPNAME_MAX; i++) {
        unsigned s1 = atomic_load_explicit(&g_maps[i].seq, memory_order_acquire);
        if (s1 & 1)
            continue;       /* being rewritten: not the mapping that faulted (it is in use) */
        uintptr_t b = atomic_load_explicit(&g_maps[i].base, memory_order_relaxed);
        size_t l = atomic_load_explicit(&g_maps[i].len, memory_order_relaxed), n = 0;
        if (!b || a < b || a - b >= l)
            continue;
        while (n + 1 < len && n < NAME_LEN && g_maps[i].name[n]) {
            buf[n] = g_maps[i].name[n];
            n++;
        }
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&g_maps[i].seq, memory_order_relaxed) != s1)
            continue;
        buf[n] = 0;
        return n;
    }
    buf[0] = 0;
    return 0;
}
