/* id_set.c: see id_set.h. */
#include "common/id_set.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static size_t slot_of(uint64_t id, size_t cap)
{
    id ^= id >> 30;     /* splitmix64's finaliser: batch ids differ in their low bits */
    id *= 0xbf58476d1ce4e5b9ull;
    id ^= id >> 27;
    id *= 0x94d049bb133111ebull;
    id ^= id >> 31;
    return (size_t)id & (cap - 1);
}

static void put(uint64_t *key, size_t cap, uint64_t id)
{
    size_t i = slot_of(id, cap);
    while (key[i] != ID_SET_EMPTY)
        i = (i + 1) & (cap - 1);
    key[i] = id;
}

/* A table of cap slots holding the set's ids (tombstones dropped). */
static int rehash(struct id_set *s, size_t cap)
{
    uint64_t *key = malloc(cap * sizeof *key);
    if (!key)
        return -ENOMEM;
    memset(key, 0xff, cap * sizeof *key);
    for (size_t i = 0; i < s->cap; i++)
        if (s->key[i] < ID_SET_GONE)
            put(key, cap, s->key[i]);
    free(s->key);
    s->key = key;
    s->cap = cap;
    s->used = s->n;
    return 0;
}

int id_set_reserve(struct id_set *s, size_t n)
{
    size_t cap = 16;
    while (cap / 2 < n) {
        if (cap > SIZE_MAX / 2 / sizeof(uint64_t))
            return -ENOMEM;
        cap *= 2;
    }
    return cap > s->cap ? rehash(s, cap) : 0;
}

int id_set_add(struct id_set *s, uint64_t id)
{
    if (id >= ID_SET_GONE)
        return -EINVAL;
    if (id_set_has(s, id))
        return 0;
    if (s->used + 1 > s->cap / 2) {
        /* full of tombstones: the same size again; else twice the size */
        int r = rehash(s, s->cap && s->n + 1 <= s->cap / 4 ? s->cap : (s->cap ? s->cap * 2 : 16));
        if (r < 0)
            return r;
    }
    size_t i = slot_of(id, s->cap);
    while (s->key[i] < ID_SET_GONE)
        i = (i + 1) & (s->cap - 1);
    s->used += s->key[i] == ID_SET_EMPTY;
    s->key[i] = id;
    s->n++;
    return 0;
}

static size_t find(const struct id_set *s, uint64_t id)
{
    if (!s->cap || id >= ID_SET_GONE)
        return SIZE_MAX;
    for (size_t i = slot_of(id, s->cap);; i = (i + 1) & (s->cap - 1)) {
        if (s->key[i] == id)
            return i;
        if (s->key[i] == ID_SET_EMPTY)
            return SIZE_MAX;
    }
}

int id_set_has(const struct id_set *s, uint64_t id) { return find(s, id) != SIZE_MAX; }

void id_set_forget(struct id_set *s, uint64_t id)
{
    size_t i = find(s, id);
    if (i == SIZE_MAX)
        return;
    s->key[i] = ID_SET_GONE;
    s->n--;
}

void id_set_clear(struct id_set *s)
{
    if (s->cap)
        memset(s->key, 0xff, s->cap * sizeof *s->key);
    s->n = s->used = 0;
}

void id_set_free(struct id_set *s)
{
    free(s->key);
    *s = (struct id_set){ 0 };
}
