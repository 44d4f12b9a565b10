/* id_set.h: an exact set of 64-bit ids (open addressing, linear probing). Sized up front with
 * id_set_reserve(); an add past that grows it (the only allocation), a forget leaves a
 * tombstone. Ids UINT64_MAX and UINT64_MAX - 1 are reserved (empty and forgotten). */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct id_set {
    uint64_t *key;      /* [cap] */
    size_t cap;         /* a power of two, or 0 */
    size_t n;           /* ids in the set */
    size_t used;        /* n + tombstones: kept at most cap / 2 */
};

#define ID_SET_EMPTY UINT64_MAX
#define ID_SET_GONE  (UINT64_MAX - 1)

/* Room for n ids without another allocation. 0 or -ENOMEM (the set is unchanged). */
int id_set_reserve(struct id_set *s, size_t n);
/* Adds id (a no-op when it is in already). 0, -EINVAL for a reserved id, -ENOMEM. */
int id_set_add(struct id_set *s, uint64_t id);
/* 1 when id is in the set, else 0. */
int id_set_has(const struct id_set *s, uint64_t id);
/* Takes id out (a no-op when it is not in). */
void id_set_forget(struct id_set *s, uint64_t id);
/* Empties the set, keeping its memory. */
void id_set_clear(struct id_set *s);
void id_set_free(struct id_set *s);
