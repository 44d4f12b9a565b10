/* recent_ids.c: see recent_ids.h. */
#include "common/recent_ids.h"

void recent_ids_add(struct recent_ids *s, uint64_t id)
{
    s->id[s->next] = id;
    s->next = (s->next + 1) % RECENT_IDS_CAP;
    if (s->n < RECENT_IDS_CAP)
        s->n++;
}

int recent_ids_has(const struct recent_ids *s, uint64_t id)
{
    for (unsigned i = 0; i < s->n; i++)
        if (s->id[i] == id)
            return 1;
    return 0;
}

void recent_ids_forget(struct recent_ids *s, uint64_t id)
{
    for (unsigned i = 0; i < s->n; i++)
        if (s->id[i] == id)
            s->id[i] = UINT64_MAX;
}
