/* jsonutil.c: see jsonutil.h. */
#include "common/jsonutil.h"
#include "common/cleanup.h"
#include "common/err.h"
#include "common/fileio.h"
#include <errno.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

int json_parse_object(const char *text, size_t len, const char *path, cJSON **out, char *err, size_t errlen)
{
    *out = NULL;
    const char *nul = memchr(text, 0, len);
    if (nul)
        return df_fail(err, errlen, -DF_EFORMAT, "%s: NUL byte at offset %zu: not a JSON file", path,
                       (size_t)(nul - text));
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(text, &end, 1);
    if (!j)
        return df_fail(err, errlen, -DF_EFORMAT, "%s: not valid JSON (parse error near byte %zu)", path,
                       end && end >= text ? (size_t)(end - text) : (size_t)0);
    char dup[256];
    int r = 0;
    if (!cJSON_IsObject(j))
        r = df_fail(err, errlen, -DF_EFORMAT, "%s: top level is not a JSON object", path);
    else if (json_duplicate_key(j, dup, sizeof dup))
        r = df_fail(err, errlen, -DF_EFORMAT, "%s: %s appears twice (JSON readers differ on which one counts)",
                    path, dup);
    if (r < 0) {
        cJSON_Delete(j);
        return r;
    }
    *out = j;
    return 0;
}

int json_read_object(const char *path, size_t max, cJSON **out, char *err, size_t errlen)
{
    *out = NULL;
    struct stat st;
    _cleanup_close_ int fd = fileio_open_regular(path, &st);
    if (fd == -EINVAL)
        return df_fail(err, errlen, -DF_EFORMAT, "%s: not a regular file", path);
    if (fd < 0)
        return df_fail(err, errlen, fd == -ENOENT ? -DF_EMISSING : fd, "%s: %s", path, strerror(-fd));
    if ((uint64_t)st.st_size > max)
        return df_fail(err, errlen, -DF_ERANGE, "%s: %lld bytes is too large (at most %zu)", path,
                       (long long)st.st_size, max);
    _cleanup_free_ char *text = malloc((size_t)st.st_size + 1);
    if (!text)
        return df_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
    long len = fileio_read_upto(fd, text, (size_t)st.st_size);  /* one that shrank is parsed as it is */
    if (len < 0)
        return df_fail(err, errlen, (int)len, "%s: read: %s", path, strerror((int)-len));
    text[len] = 0;
    return json_parse_object(text, (size_t)len, path, out, err, errlen);
}

void json_add_on_disk(cJSON *o, const char *dir)
{
    struct stat st;
    if (dir && stat(dir, &st) == 0)
        cJSON_AddBoolToObject(o, "on_disk", S_ISDIR(st.st_mode));
    else if (!dir || errno == ENOENT || errno == ENOTDIR)
        cJSON_AddBoolToObject(o, "on_disk", 0);
    else
        cJSON_AddNullToObject(o, "on_disk");
}

void json_add_string_or_null(cJSON *o, const char *key, const char *s)
{
    if (s)
        cJSON_AddStringToObject(o, key, s);
    else
        cJSON_AddNullToObject(o, key);
}
