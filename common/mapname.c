/* mapname.c: a fixed table of named mappings for the SIGBUS report (see mapname.h). A slot's
 * name and length are written before its base is published (release) and the base is cleared
 * before a slot is reused, so a lookup sees a whole entry, or at worst the name of a mapping
 * being replaced at that instant. */
#include "mapname.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#define NAME_LEN 200

static struct {
    _Atomic uintptr_t base;         /* 0: free */
    _Atomic size_t len;
    char name[NAME_LEN];
} g_maps[MAPNAME_MAX];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

void mapname_add(const void *base, size_t len, const char *what)
{
    if (!base || !len)
        return;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < MAPNAME_MAX; i++) {
        if (atomic_load_explicit(&g_maps[i].base, memory_order_relaxed))
            continue;
        snprintf(g_maps[i].name, NAME_LEN, "%s", what);
        atomic_store_explicit(&g_maps[i].len, len, memory_order_relaxed);
        atomic_store_explicit(&g_maps[i].base, (uintptr_t)base, memory_order_release);
        break;
    }
    pthread_mutex_unlock(&g_lock);
}

void mapname_remove(const void *base)
{
    if (!base)
        return;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < MAPNAME_MAX; i++)
        if (atomic_load_explicit(&g_maps[i].base, memory_order_relaxed) == (uintptr_t)base)
            atomic_store_explicit(&g_maps[i].base, 0, memory_order_release);
    pthread_mutex_unlock(&g_lock);
}

size_t mapname_find(const void *addr, char *buf, size_t len)
{
    uintptr_t a = (uintptr_t)addr;
    size_t n = 0;
    for (int i = 0; i < MAPNAME_MAX && len; i++) {
        uintptr_t b = atomic_load_explicit(&g_maps[i].base, memory_order_acquire);
        if (!b || a < b || a - b >= atomic_load_explicit(&g_maps[i].len, memory_order_relaxed))
            continue;
        while (n + 1 < len && n < NAME_LEN && g_maps[i].name[n]) {
            buf[n] = g_maps[i].name[n];
            n++;
        }
        break;
    }
    if (len)
        buf[n] = 0;
    return n;
}
