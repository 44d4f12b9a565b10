/* decimal.h: the plain decimal numbers dflash writes into its own files (ledger meta values,
 * rank lists) and takes on command lines: digits only, below 2^64. No sign, blank or base
 * prefix, which strtoull would take (" -1" is 2^64 - 1 to it): such text was put there by hand
 * or by damage, and a number made of it would quietly change what it counts. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* The number at the start of s: how many characters it takes (> 0) and *v, or 0 when s does
 * not start with a digit or the digits make 2^64 or more (*v then unchanged). */
static inline size_t decimal_prefix(const char *s, uint64_t *v)
{
    uint64_t x = 0;
    size_t n = 0;
    for (; s[n] >= '0' && s[n] <= '9'; n++) {
        unsigned d = (unsigned)(s[n] - '0');
        if (x > (UINT64_MAX - d) / 10)
            return 0;
        x = x * 10 + d;
    }
    if (n)
        *v = x;
    return n;
}

/* s wholly such a number: 1 with *v, else 0. */
static inline int decimal_parse(const char *s, uint64_t *v)
{
    uint64_t x;
    size_t n = decimal_prefix(s, &x);
    if (!n || s[n])
        return 0;
    *v = x;
    return 1;
}
