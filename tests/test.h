/* test.h: assertions for dflash tests; on in every build, they print the values.
 * A failing CHECK exits 1; a test that cannot run here exits 77 via SKIP(). */
#pragma once
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_FAIL(...) do { \
    fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

#define CHECK(cond) do { if (!(cond)) TEST_FAIL("%s", #cond); } while (0)

#define CHECK_INT(a, op, b) do { \
    long long _a = (long long)(a), _b = (long long)(b); \
    if (!(_a op _b)) TEST_FAIL("%s %s %s (%lld vs %lld)", #a, #op, #b, _a, _b); } while (0)

#define CHECK_OK(expr) do { \
    long long _r = (long long)(expr); \
    if (_r < 0) TEST_FAIL("%s returned %lld", #expr, _r); } while (0)

#define CHECK_STR(a, b) do { \
    const char *_a = (a), *_b = (b); \
    if (strcmp(_a, _b)) TEST_FAIL("%s == %s (\"%s\" vs \"%s\")", #a, #b, _a, _b); } while (0)

#define CHECK_CONTAINS(hay, needle) do { \
    const char *_h = (hay), *_n = (needle); \
    if (!strstr(_h, _n)) TEST_FAIL("\"%s\" does not contain \"%s\"", _h, _n); } while (0)

#define CHECK_NEAR(a, b, tol) do { \
    double _a = (double)(a), _b = (double)(b); \
    if (!(fabs(_a - _b) <= (tol))) TEST_FAIL("%s ~ %s (%.9g vs %.9g, tol %g)", #a, #b, _a, _b, (double)(tol)); } while (0)

#define SKIP(...) do { fprintf(stderr, "SKIP: "); fprintf(stderr, __VA_ARGS__); \
    fputc('\n', stderr); exit(77); } while (0)

/* Directory holding tests/ (data files), from $DFLASH_SRC or the cwd. */
static inline const char *test_srcdir(void)
{
    const char *s = getenv("DFLASH_SRC");
    return s ? s : ".";
}

/* Sanitizer builds run several times slower: tests stretch their timeouts by
 * $DFLASH_TEST_TIME_SCALE (tools/check.sh sets it for the sanitizer phases). */
static inline int test_time_scale(void)
{
    const char *s = getenv("DFLASH_TEST_TIME_SCALE");
    int v = s ? atoi(s) : 1;
    return v >= 1 ? v : 1;
}
