/* test_recent_ids.c: the window of recent ids keeps exactly the last RECENT_IDS_CAP added, and
 * forgets one on request. */
#include "common/recent_ids.h"
#include "tests/test.h"

static struct recent_ids s;

int main(void)
{
    recent_ids_clear(&s);
    CHECK(!recent_ids_has(&s, 0));
    recent_ids_add(&s, 7);
    CHECK(recent_ids_has(&s, 7));
    CHECK(!recent_ids_has(&s, 0));
    recent_ids_clear(&s);
    CHECK(!recent_ids_has(&s, 7));
    /* 2.5 windows' worth: the last RECENT_IDS_CAP stay, the ones before are forgotten */
    uint64_t n = RECENT_IDS_CAP * 5ull / 2;
    for (uint64_t i = 1; i <= n; i++)
        recent_ids_add(&s, i * 1000003ull);
    CHECK_INT(s.n, ==, RECENT_IDS_CAP);
    for (uint64_t i = 1; i <= n; i++)
        if (recent_ids_has(&s, i * 1000003ull) != (i > n - RECENT_IDS_CAP))
            TEST_FAIL("id %llu of %llu: kept %d", (unsigned long long)i, (unsigned long long)n,
                      recent_ids_has(&s, i * 1000003ull));
    /* a forgotten id is gone, its neighbours stay */
    recent_ids_forget(&s, n * 1000003ull);
    CHECK(!recent_ids_has(&s, n * 1000003ull));
    CHECK(recent_ids_has(&s, (n - 1) * 1000003ull));
    printf("ok: the last %d of %llu ids kept; one forgotten\n", RECENT_IDS_CAP, (unsigned long long)n);
    return 0;
}
