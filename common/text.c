/* text.c: see text.h. */
#include "common/text.h"
#include <stdio.h>
#include <string.h>

static int is_cont(unsigned char c) { return (c & 0xc0) == 0x80; }

size_t text_fit(const char *s, size_t max)
{
    size_t n = strnlen(s, max + 1);
    if (n <= max)
        return n;
    n = max;
    while (n > 0 && is_cont((unsigned char)s[n]))
        n--;        /* (s[n] begins the character that would be cut) */
    return n;
}

void text_cut(char *s, size_t max)
{
    s[text_fit(s, max)] = '\0';
}

/* The length of the well-formed character at s (1-4), or 0 (RFC 3629: no overlong form, no
 * surrogate, nothing past U+10FFFF). */
static size_t char_len(const unsigned char *s)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else {
        return 0;
    }
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (!is_cont(s[i]))
            return 0;
    return n;
}

static int is_plain(const unsigned char *p, size_t n)
{
    int control = n == 1 ? *p < 0x20 || *p == 0x7f : n == 2 && p[0] == 0xc2 && p[1] < 0xa0;
    return n && !control;
}

size_t text_plain_len(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n;
    while (*p && is_plain(p, n = char_len(p)))
        p += n;
    return (size_t)(p - (const unsigned char *)s);
}

void text_clean(char *s)
{
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        size_t n = char_len(p);
        if (!is_plain(p, n)) {
            memset(p, '?', n ? n : 1);
            p += n ? n : 1;
        } else {
            p += n;
        }
    }
}

/* The value of key in a line of "key=value" words ("" when it has none), into val. */
static void text_value(const char *text, const char *key, size_t klen, char *val, size_t vlen)
{
    val[0] = 0;
    for (const char *p = text; p && *p; p = strchr(p, ' '), p = p ? p + 1 : NULL) {
        if (!strncmp(p, key, klen) && p[klen] == '=') {
            size_t m = strcspn(p + klen + 1, " ");
            snprintf(val, vlen, "%.*s", (int)m, p + klen + 1);
            return;
        }
    }
}

int text_kv_diff(const char *mine, const char *theirs, char *out, size_t n)
{
    const char *texts[2] = { mine, theirs };
    for (int s = 0; s < 2; s++)
        for (const char *p = texts[s]; p && *p; p = strchr(p, ' '), p = p ? p + 1 : NULL) {
            size_t klen = strcspn(p, "= ");
            char a[128], b[128], key[64];
            snprintf(key, sizeof key, "%.*s", (int)klen, p);
            text_value(mine, p, klen, a, sizeof a);
            text_value(theirs, p, klen, b, sizeof b);
            if (strcmp(a, b)) {
                snprintf(out, n, "%s is %s here, %s in the run", key, a[0] ? a : "none", b[0] ? b : "none");
                return 1;
            }
        }
    if (strcmp(mine, theirs)) {
        snprintf(out, n, "the settings differ");
        return 1;
    }
    out[0] = 0;
    return 0;
}
