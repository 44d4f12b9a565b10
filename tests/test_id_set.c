/* test_id_set.c: the exact id set against a plain array, through adds, forgets (tombstones),
 * growth past the reserved size and clears; reserved ids are refused. */
#include "common/id_set.h"
#include "tests/test.h"

#include <errno.h>
#include <stdlib.h>

#define UNIVERSE 20000u

static uint64_t id_of(uint32_t i) { return ((uint64_t)(i % 7) << 32) | (i / 7); }  /* batch-id shaped */

int main(void)
{
    struct id_set s = { 0 };
    CHECK(!id_set_has(&s, 1));              /* an empty, never sized set */
    id_set_forget(&s, 1);
    CHECK_INT(id_set_add(&s, ID_SET_EMPTY), ==, -EINVAL);
    CHECK_INT(id_set_add(&s, ID_SET_GONE), ==, -EINVAL);
    CHECK(!id_set_has(&s, ID_SET_EMPTY));
    CHECK_INT(id_set_reserve(&s, 100), ==, 0);
    size_t cap = s.cap;
    CHECK(cap >= 200);

    static uint8_t in[UNIVERSE];
    uint64_t rng = 12345;
    for (int round = 0; round < 200000; round++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t i = (uint32_t)(rng >> 33) % UNIVERSE;
        if ((rng >> 20) % 3) {
            CHECK_INT(id_set_add(&s, id_of(i)), ==, 0);
            in[i] = 1;
        } else {
            id_set_forget(&s, id_of(i));
            in[i] = 0;
        }
        if (round == 100000) {             /* a clear keeps the memory */
            size_t before = s.cap;
            id_set_clear(&s);
            memset(in, 0, sizeof in);
            CHECK_INT(s.cap, ==, before);
            CHECK_INT(s.n, ==, 0);
        }
    }
    size_t n = 0;
    for (uint32_t i = 0; i < UNIVERSE; i++) {
        n += in[i];
        if (id_set_has(&s, id_of(i)) != in[i])
            TEST_FAIL("id %u: in the set %d, should be %d", i, id_set_has(&s, id_of(i)), in[i]);
    }
    CHECK_INT(s.n, ==, n);
    CHECK(s.cap > cap);                     /* it grew past the reserve */
    CHECK(s.used <= s.cap / 2);
    /* adding what is in already changes nothing */
    size_t before = s.n;
    for (uint32_t i = 0; i < UNIVERSE; i++)
        if (in[i])
            CHECK_INT(id_set_add(&s, id_of(i)), ==, 0);
    CHECK_INT(s.n, ==, before);
    printf("ok: %zu of %u ids in the set after 200000 adds and forgets, table of %zu\n", n, UNIVERSE, s.cap);
    id_set_free(&s);
    return 0;
}
