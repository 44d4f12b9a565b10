/* test_decimal.c: the decimal numbers dflash reads back from its own files and command lines
 * (common/decimal.h): digits only, below 2^64; what strtoull would also take (a sign, blanks, a
 * base prefix, a number past 2^64 made UINT64_MAX) is refused and leaves the value as it was. */
#include "common/decimal.h"
#include "tests/test.h"

static void parses(const char *s, uint64_t want)
{
    uint64_t v = 7;
    if (!decimal_parse(s, &v) || v != want)
        TEST_FAIL("'%s': want %" PRIu64 ", got %" PRIu64, s, want, v);
}

static void refused(const char *s)
{
    uint64_t v = 7;
    if (decimal_parse(s, &v) || v != 7)
        TEST_FAIL("'%s' taken as %" PRIu64, s, v);
}

int main(void)
{
    parses("0", 0);
    parses("42", 42);
    parses("007", 7);                               /* base 10, not 8 */
    parses("18446744073709551615", UINT64_MAX);
    parses("00018446744073709551615", UINT64_MAX);
    const char *bad[] = { "", " 1", "1 ", "-1", " -1", "+1", "0x10", "1e3", "1.0", "1,2",
                          "18446744073709551616", "18446744073709551620", "99999999999999999999",
                          "184467440737095516150" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refused(bad[i]);

    /* the start of a list: how far the number goes, the rest left to the caller */
    uint64_t v = 7;
    CHECK_INT(decimal_prefix("12,3", &v), ==, 2);
    CHECK_INT(v, ==, 12);
    CHECK_INT(decimal_prefix(",3", &v), ==, 0);
    CHECK_INT(decimal_prefix("18446744073709551616,1", &v), ==, 0);
    CHECK_INT(v, ==, 12);
    puts("ok");
    return 0;
}
