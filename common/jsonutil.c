/* jsonutil.c: see jsonutil.h. */
#include "common/jsonutil.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* path[at..] = ".key" (no dot at the start); the new end, kept inside pathlen. */
static size_t append(char *path, size_t pathlen, size_t at, const char *key)
{
    int n = snprintf(path + at, pathlen - at, "%s%s", at ? "." : "", key);
    if (n < 0)
        return at;
    return at + (size_t)n < pathlen ? at + (size_t)n : pathlen - 1;
}

static int cmp_key(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* The first key (in sorted order) of object node seen twice, or NULL. */
static const char *dup_here(const cJSON *node)
{
    size_t n = 0;
    for (const cJSON *c = node->child; c; c = c->next)
        n++;
    if (n < 2)
        return NULL;
    const cJSON **v = malloc(n * sizeof *v);
    if (!v)
        return NULL;    /* out of memory: the check is skipped, not failed */
    size_t i = 0;
    for (const cJSON *c = node->child; c; c = c->next)
        v[i++] = c;
    qsort(v, n, sizeof *v, cmp_key);
    const char *dup = NULL;
    for (i = 1; i < n && !dup; i++)
        if (!strcmp(v[i - 1]->string, v[i]->string))
            dup = v[i]->string;
    free(v);
    return dup;
}

static int dup_in(const cJSON *node, char *path, size_t pathlen, size_t at)
{
    int obj = cJSON_IsObject(node);
    if (!obj && !cJSON_IsArray(node))
        return 0;
    const char *dup = obj ? dup_here(node) : NULL;
    if (dup) {
        append(path, pathlen, at, dup);
        return 1;
    }
    for (const cJSON *c = node->child; c; c = c->next) {
        size_t next = at;       /* array items: the path stays at the array */
        if (obj)
            next = append(path, pathlen, at, c->string);
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
