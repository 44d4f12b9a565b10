/* jsonutil.c: see jsonutil.h. */
#include "common/jsonutil.h"
#include <stdio.h>
#include <string.h>

/* path[at..] = ".key" (no dot at the start); the new end, kept inside pathlen. */
static size_t append(char *path, size_t pathlen, size_t at, const char *key)
{
    int n = snprintf(path + at, pathlen - at, "%s%s", at ? "." : "", key);
    if (n < 0)
        return at;
    return at + (size_t)n < pathlen ? at + (size_t)n : pathlen - 1;
}

static int dup_in(const cJSON *node, char *path, size_t pathlen, size_t at)
{
    int obj = cJSON_IsObject(node);
    if (!obj && !cJSON_IsArray(node))
        return 0;
    for (const cJSON *c = node->child; c; c = c->next) {
        size_t next = at;       /* array items: the path stays at the array */
        if (obj) {
            for (const cJSON *p = node->child; p != c; p = p->next)
                if (!strcmp(p->string, c->string)) {
                    append(path, pathlen, at, c->string);
                    return 1;
                }
            next = append(path, pathlen, at, c->string);
        }
        if (dup_in(c, path, pathlen, next))
            return 1;
        path[at] = 0;
    }
    return 0;
}

int json_duplicate_key(const cJSON *node, char *path, size_t pathlen)
{
    if (!pathlen)
        return 0;
    path[0] = 0;
    return dup_in(node, path, pathlen, 0);
}
