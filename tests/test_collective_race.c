/* test_collective_race.c: one barrier ends the same way for every rank, even when a rank's
 * deadline passes in the instant its last peer arrives. White-box: collective.c is compiled
 * in with its clock interposed, so rank 0 is "preempted" right after it found rank 1 missing
 * and before it acts on its expired deadline; rank 1 arrives and finishes meanwhile. Rank 0
 * once returned -DF_ETIMEOUT while rank 1 returned 0 from the same barrier. Then the abort
 * rank 0 raised holds for the next call on both ranks. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include "common/timeutil.h"
static uint64_t race_clock(void);
#define mono_ns race_clock
#include "ipc/collective.c"
#undef mono_ns
#include "tests/test.h"

static _Thread_local int armed;         /* rank 0's thread, during the raced barrier */
static uint64_t raced;                  /* that barrier's number */
static struct coll *c0, *c1;
static atomic_int go1;
static int rc0, rc1, next0, next1;

static uint64_t race_clock(void)
{
    uint64_t t = mono_ns();
    static uint64_t first;
    if (armed && c0->bar_seq == raced) {
        if (!first)
            first = t;
        if (t >= first + 1000000ull) {  /* rank 0's 1 ms deadline has passed, just after its scan */
            atomic_store(&go1, 1);      /* rank 1 runs its barrier now */
            while (atomic_load(&c0->h->arrived[1].n) < 2)
                ;
            usleep(20000);              /* ... and finishes it */
            armed = 0;
        }
    }
    return t;
}

static void *rank0(void *name)
{
    char err[256];
    struct coll_opts o = { .generation = 7, .chunk_floats = 16 };
    CHECK_OK(coll_open(&c0, name, 0, 2, 5000, &o, err, sizeof err));
    CHECK_OK(coll_barrier(c0));
    c0->timeout_ms = 1;
    raced = c0->bar_seq + 1;
    armed = 1;
    rc0 = coll_barrier(c0);
    armed = 0;
    next0 = coll_barrier(c0);
    return NULL;
}

static void *rank1(void *name)
{
    char err[256];
    struct coll_opts o = { .generation = 7, .chunk_floats = 16 };
    CHECK_OK(coll_open(&c1, name, 1, 2, 5000, &o, err, sizeof err));
    CHECK_OK(coll_barrier(c1));
    for (int i = 0; i < 100000 && !atomic_load(&go1); i++)
        usleep(100);
    CHECK(atomic_load(&go1));
    rc1 = coll_barrier(c1);
    next1 = coll_barrier(c1);
    return NULL;
}

int main(void)
{
    char name[64];
    snprintf(name, sizeof name, "/dflash-test-collrace-%d", (int)getpid());
    pthread_t a, b;
    CHECK(pthread_create(&a, NULL, rank0, name) == 0);
    CHECK(pthread_create(&b, NULL, rank1, name) == 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("same barrier: rank 0 %d (%s), rank 1 %d (%s); next call: %d, %d\n", rc0, rc0 ? err_str(rc0) : "ok", rc1,
           rc1 ? err_str(rc1) : "ok", next0, next1);
    CHECK_INT(rc0, ==, rc1);
    CHECK_INT(next0, ==, -DF_ETIMEOUT);
    CHECK_INT(next1, ==, -DF_ETIMEOUT);
    coll_close(c0);
    coll_close(c1);
    shm_unlink(name);
    printf("ok\n");
    return 0;
}
