/* recent_ids.h: the last RECENT_IDS_CAP ids added, for "have we seen this one lately?" — a fixed
 * array scanned linearly (a few microseconds at full size), no allocation after it is declared. */
#pragma once
#include <stdint.h>

#define RECENT_IDS_CAP 4096

struct recent_ids {
    uint64_t id[RECENT_IDS_CAP];
    unsigned n;         /* filled entries, up to RECENT_IDS_CAP */
    unsigned next;      /* where the next id goes (the oldest once full) */
};

static inline void recent_ids_clear(struct recent_ids *s) { s->n = s->next = 0; }

/* Adds id; once full, the oldest id is forgotten. */
void recent_ids_add(struct recent_ids *s, uint64_t id);

/* 1 when id is among the ids kept, else 0. */
int recent_ids_has(const struct recent_ids *s, uint64_t id);

/* Forgets every entry of id (it keeps its place, as no id). id must not be UINT64_MAX. */
void recent_ids_forget(struct recent_ids *s, uint64_t id);
